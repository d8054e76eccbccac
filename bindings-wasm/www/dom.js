// A few DOM helpers for the playground's views: no framework, every view is rebuilt from state.

/**
 * An element: `h("li", { class: "x", "data-cmd": id, onclick }, "text", child, [more])`. `null`,
 * `undefined` and `false` children are skipped; strings become text nodes.
 */
export function h(tag, props = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(props ?? {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) element.addEventListener(name.slice(2), value);
    else if (name === "style" && typeof value === "object") {
      for (const [property, v] of Object.entries(value)) element.style.setProperty(property, String(v));
    }
    else element.setAttribute(name, value === true ? "" : String(value));
  }
  element.append(...flatten(children));
  return element;
}

function flatten(children) {
  return children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false).map((c) => (c instanceof Node ? c : String(c)));
}

/** Replaces the children of the element with `id`. */
export function fill(id, ...children) {
  document.getElementById(id).replaceChildren(...flatten(children));
}

/** `09:00:30` for ms since the epoch (UTC, as the virtual clock starts at 09:00:00 UTC). */
export const clockTime = (ms) => new Date(ms).toISOString().slice(11, 19);

const COMMAND_ID = /^(.+):(\d+):(\d+)$/;

/**
 * A command ID drawn as its three parts, `workflow : event seq : index`, so that `trip-001:1:0` is seen
 * to come from event #1 of trip-001. Hovering it lights up the same ID everywhere on the page.
 */
export function cid(id) {
  const match = COMMAND_ID.exec(id);
  if (!match) return h("code", { class: "cid", "data-cmd": id }, id);
  const [, workflow, seq, index] = match;
  return h(
    "code",
    { class: "cid", "data-cmd": id, title: `command ${index} of ${workflow}'s event #${seq}` },
    h("span", { class: "cid-wf" }, workflow),
    ":",
    h("span", { class: "cid-seq" }, seq),
    ":",
    h("span", { class: "cid-idx" }, index),
  );
}

/** Text with every command ID in it drawn by `cid`. */
export function withIds(text) {
  const parts = String(text).split(/(trip-\d+:\d+:\d+)(?![:\d])/);
  return parts.map((part, i) => (i % 2 === 1 ? cid(part) : part)).filter((part) => part !== "");
}

/** A status word styled like the outbox's (pending, leased, done, dead, cancelled, …). */
export const chip = (status, testid) => h("span", { class: `status ${status}`, "data-testid": testid }, status);

/** A panel's text for when it has nothing to show yet, saying what will fill it. */
export const empty = (...text) => h("p", { class: "empty" }, ...text);

/** Lights up every element showing the same command ID as the one under the pointer or focus. */
export function linkCommandIds(root = document) {
  const light = (id, on) => {
    for (const element of root.querySelectorAll(`[data-cmd="${CSS.escape(id)}"]`)) element.classList.toggle("lit", on);
  };
  for (const [enter, leave] of [["mouseover", "mouseout"], ["focusin", "focusout"]]) {
    root.addEventListener(enter, (e) => {
      const id = e.target.closest?.("[data-cmd]")?.dataset.cmd;
      if (id) light(id, true);
    });
    root.addEventListener(leave, (e) => {
      const id = e.target.closest?.("[data-cmd]")?.dataset.cmd;
      if (id) light(id, false);
    });
  }
}
