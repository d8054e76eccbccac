// The miniflow playground: the trip workflow of the design article, in WebAssembly, in the browser.
// A trip request commits an event and its command in one transaction; a worker delivers the command
// under a lease; a crash before the ack makes the outbox deliver it again with the same command ID,
// and the supplier, idempotent on that key, drops the duplicate. Every action is drawn as a sequence
// of messages, kept in a history the slider travels through, and saved in localStorage.
import { ready, Store, Workflow } from "./miniflow-api.js";
import { h, fill, clockTime, cid, withIds, chip, empty, linkCommandIds } from "./dom.js";
import { renderSaga } from "./saga-view.js";

const STORAGE_KEY = "miniflow-playground-v2";
const LEASE_MS = 30_000;
const START = Date.UTC(2026, 0, 1, 9, 0, 0);
const CITIES = ["成都", "西安", "杭州", "大理", "青岛"];
const HISTORY_LIMIT = 60;
/** The four parties of the sequence view, left to right. */
const LANES = ["workflow", "outbox", "worker", "supplier"];

/** The trip workflow: a requested trip locks a budget, once. */
const tripWorkflow = new Workflow({
  init: () => ({ requested: false }),
  evolve: (trip, event) => (event.kind === "trip_requested" ? { ...trip, requested: true } : trip),
  decide: (trip, event) =>
    event.kind === "trip_requested" && !trip.requested
      ? [{ kind: "lock_budget", payload: { trip_id: event.workflowId, city: event.payload.city } }]
      : [],
});

/** The page's state besides the store: plain data, saved as JSON with the store's snapshot. */
function freshState() {
  return {
    clock: START,
    trips: 0,
    failNext: false,
    /** The supplier ignores the idempotency key: every delivery is a new effect. */
    noIdempotency: false,
    /** Every call the supplier received, and every side effect it made (append-only, like `trace`). */
    calls: [],
    effects: [],
    /** The sequence view: one group of messages per action. */
    trace: [],
    /** Milestones of the guided first run. */
    tour: { requested: false, crashed: false, nothingDue: false, leaseExpired: false, duplicateDropped: false, contrast: false },
    explain: { text: "Start with ① Request a trip.", tone: "info" },
    label: "start",
  };
}

let state;
/** @type {Store} */
let store;
/** Every state after each action, as saved text; the slider travels through them. */
let history = [];
let cursor = 0;

const tripId = (n) => `trip-${String(n).padStart(3, "0")}`;
const allTrips = () => Array.from({ length: state.trips }, (_, i) => tripId(i + 1));
const allRows = () => allTrips().flatMap((trip) => store.commands(trip));
const liveLease = (row) => row.status === "leased" && row.lease.expiresAt > state.clock;

// ---------------------------------------------------------------------------------------------
// Saving, restoring, time travel

/** The parts of the state that only grow: the sequence view, the supplier's calls and effects. */
const LOGS = ["trace", "calls", "effects"];
/**
 * The logs of the latest state. History is linear (acting in the past drops the later states), so
 * every state's logs are prefixes of these: a saved state keeps only their lengths.
 */
let logs = { trace: [], calls: [], effects: [] };

function serialize() {
  const saved = { ...state, lengths: {}, snapshot: store.snapshot() };
  for (const log of LOGS) {
    saved.lengths[log] = state[log].length;
    delete saved[log];
  }
  return JSON.stringify(saved);
}

function restore(text) {
  const { snapshot, lengths, ...rest } = JSON.parse(text);
  const fresh = freshState();
  if (!isObject(lengths) || !LOGS.every((log) => Number.isInteger(lengths[log]))) throw new Error("a saved state without its log lengths");
  const next = Store.fromSnapshot(snapshot);
  store?.free();
  store = next;
  state = { ...fresh, ...rest };
  // A damaged entry must not leave the page half drawn: the parts the views read keep their shape.
  state.tour = { ...fresh.tour, ...(isObject(rest.tour) ? rest.tour : {}) };
  if (!isObject(rest.explain) || typeof rest.explain.text !== "string") state.explain = fresh.explain;
  for (const log of LOGS) state[log] = logs[log].slice(0, lengths[log]);
}

const isObject = (value) => typeof value === "object" && value !== null && !Array.isArray(value);

/** `localStorage`, or `null` where the browser refuses it (site data blocked): the page then runs unsaved. */
function storage() {
  try {
    return window.localStorage;
  } catch {
    return null;
  }
}

let saving = null;

/** Saves soon (the page stays quick however long the history), and at the latest when it is left. */
function persist() {
  clearTimeout(saving);
  saving = setTimeout(save, 250);
}

function save() {
  clearTimeout(saving);
  saving = null;
  const local = storage();
  if (!local) return;
  // Over the browser's quota: save the start and fewer of the latest steps. The page keeps them all.
  let kept = history;
  for (;;) {
    try {
      const dropped = history.length - kept.length;
      const savedCursor = cursor === 0 ? 0 : Math.max(1, cursor - dropped);
      local.setItem(STORAGE_KEY, JSON.stringify({ history: kept, cursor: savedCursor, logs }));
      return;
    } catch (error) {
      if (kept.length <= 2) return console.warn("the playground's state is not saved:", error);
      kept = [history[0], ...history.slice(history.length - Math.floor(kept.length / 2))];
    }
  }
}

/** Whether `saved` is a whole saved playground: every point of its history readable. */
function readable(saved) {
  if (!isObject(saved) || !Array.isArray(saved.history) || !Number.isInteger(saved.cursor)) return false;
  if (!saved.history[saved.cursor] || !LOGS.every((log) => Array.isArray(saved.logs?.[log]))) return false;
  return saved.history.every((point) => {
    if (!isObject(point) || typeof point.label !== "string" || typeof point.state !== "string") return false;
    const { snapshot, lengths } = JSON.parse(point.state);
    return typeof snapshot === "string" && isObject(lengths);
  });
}

function loadSaved() {
  const local = storage();
  try {
    local?.removeItem("miniflow-playground-v1");
    const saved = JSON.parse(local?.getItem(STORAGE_KEY) ?? "null");
    if (saved !== null && readable(saved)) {
      ({ history, cursor, logs } = saved);
      restore(history[cursor].state);
      return;
    }
    if (saved !== null) console.warn("discarding a saved playground that is not whole");
  } catch (error) {
    console.warn("discarding an unreadable saved playground:", error);
  }
  startOver();
}

function startOver() {
  store?.free();
  store = new Store();
  state = freshState();
  logs = { trace: [], calls: [], effects: [] };
  history = [{ label: "start", clock: state.clock, state: serialize() }];
  cursor = 0;
}

/** Records the state after an action; acting in the past drops the later states first. */
function remember(label) {
  state.label = label;
  logs = Object.fromEntries(LOGS.map((log) => [log, state[log].slice()]));
  history = history.slice(0, cursor + 1);
  history.push({ label, clock: state.clock, state: serialize() });
  if (history.length > HISTORY_LIMIT) history.splice(1, history.length - HISTORY_LIMIT);
  cursor = history.length - 1;
}

function travel(to) {
  const target = Math.max(0, Math.min(history.length - 1, to));
  try {
    restore(history[target].state);
    cursor = target;
  } catch (error) {
    console.warn("this point of the history cannot be read:", error);
  }
  persist();
  render();
}

// ---------------------------------------------------------------------------------------------
// The supplier and the worker

/**
 * The supplier: remembers results by idempotency key (the command ID), so a repeat gets the first
 * answer back and changes nothing. Without idempotency, every call is a new effect.
 */
function supply(delivery) {
  const known = state.effects.find((e) => e.commandId === delivery.commandId)?.reference;
  if (known && !state.noIdempotency) return { reference: known, outcome: "duplicate" };
  const reference = `REF-${state.effects.length + 1}`;
  state.effects.push({ reference, commandId: delivery.commandId, at: state.clock });
  return { reference, outcome: known ? "second" : "effect" };
}

/** One delivery through the worker to the supplier; `crash` loses the ack. Returns what it tells. */
function deliverOne(d, group, crash) {
  const n = state.calls.length + 1;
  const id = d.commandId;
  const again = d.attempt > 1 || state.calls.some((c) => c.commandId === d.commandId);
  group.title += `${group.deliveries ? "," : " ·"} delivery ${n}${again ? " (redelivery)" : ""}`;
  group.deliveries = (group.deliveries ?? 0) + 1;
  group.rows.push({ from: "outbox", to: "worker", text: `claim ${id} · attempt ${d.attempt} · leased until ${clockTime(d.leaseExpiresAt)}` });
  group.rows.push({ from: "worker", to: "supplier", text: `${d.kind} with key ${id}` });
  const call = { n, commandId: id, kind: d.kind, attempt: d.attempt, at: state.clock };
  if (state.failNext) {
    state.failNext = false;
    const error = "422 refused by the supplier";
    state.calls.push({ ...call, outcome: "refused", error });
    group.rows.push({ from: "supplier", to: "worker", text: error, tone: "bad" });
    const settled = store.fail(d, { error, retryable: false }, undefined, state.clock);
    group.rows.push({ from: "worker", to: "outbox", text: `fail: refused for good → ${settled.outcome}`, tone: "bad" });
    return `${id} was refused for good and is now ${settled.outcome}: no retry will help, a person decides (Retry dead commands).`;
  }
  const { reference, outcome } = supply(d);
  state.calls.push({ ...call, reference, outcome });
  if (outcome === "duplicate") {
    if (!crash) state.tour.duplicateDropped = true;
    group.rows.push({ from: "supplier", to: "worker", text: `same key ${id} → ${reference}, duplicate dropped`, tone: "dup", testid: "duplicate" });
  } else if (outcome === "second") {
    if (state.tour.duplicateDropped) state.tour.contrast = true;
    group.rows.push({ from: "supplier", to: "worker", text: `key ignored → ${reference}, a second side effect for ${id}`, tone: "bad", testid: "second-effect" });
  } else {
    group.rows.push({ from: "supplier", to: "worker", text: `${reference} · new side effect`, tone: "ok" });
  }
  if (crash) {
    state.tour.crashed = true;
    group.rows.push({ from: "worker", to: "outbox", text: "ack lost: the worker crashed", tone: "lost", lost: true });
    const made = outcome === "duplicate" ? `The supplier knew the key and answered ${reference} again, without a new effect` : `The supplier made ${reference}`;
    return `${made}, then the worker crashed before its ack reached the outbox. ${id} stays leased until ${clockTime(d.leaseExpiresAt)}.`;
  }
  store.complete(d, state.clock);
  group.rows.push({ from: "worker", to: "outbox", text: `ack: ${id} done`, tone: "ok" });
  if (outcome === "duplicate") {
    return `Redelivered ${id} (attempt ${d.attempt}) with the same key. The supplier already had ${id} → ${reference}: duplicate dropped, still one side effect.`;
  }
  if (outcome === "second") {
    return `Redelivered ${id} (attempt ${d.attempt}). This supplier ignores the key and locked the budget again: ${reference}. Two side effects for one command.`;
  }
  return `Delivered ${id}: ${reference}, acked, done.`;
}

/** Why a claim found nothing: the earliest thing that will become due, in words. */
function whyNothingIsDue() {
  const rows = allRows();
  const leased = rows.filter(liveLease).sort((a, b) => a.lease.expiresAt - b.lease.expiresAt)[0];
  if (leased) {
    return {
      leased: true,
      short: `nothing due: ${leased.commandId} is leased until ${clockTime(leased.lease.expiresAt)}`,
      long: `Nothing is due: ${leased.commandId} is leased until ${clockTime(leased.lease.expiresAt)} (it is ${clockTime(state.clock)}). The outbox cannot tell a crashed worker from a slow one, so it waits for the lease to run out.`,
    };
  }
  const later = rows.filter((r) => r.status === "pending").sort((a, b) => a.availableAt - b.availableAt)[0];
  if (later) {
    const at = clockTime(later.availableAt);
    return { short: `nothing due: ${later.commandId} waits until ${at}`, long: `Nothing is due: ${later.commandId} waits for its next attempt at ${at}.` };
  }
  const dead = rows.filter((r) => r.status === "dead").length;
  if (dead) return { short: "nothing due: only dead commands", long: `Nothing is due: ${dead} dead command${dead > 1 ? "s wait" : " waits"} for a person (Retry dead commands).` };
  return { short: "nothing due: the outbox is empty", long: "Nothing is due: the outbox is empty. Request a trip first." };
}

function nothingDue(group) {
  const why = whyNothingIsDue();
  if (why.leased) state.tour.nothingDue = true;
  group.rows.push({ lane: "outbox", text: why.short, tone: "wait", testid: "nothing-due" });
  return why.long;
}

// ---------------------------------------------------------------------------------------------
// Actions: each changes the state, adds a group to the sequence view and says what happened.

const actions = {
  request(group) {
    state.trips += 1;
    state.tour.requested = true;
    const trip = tripId(state.trips);
    const city = CITIES[(state.trips - 1) % CITIES.length];
    const handled = tripWorkflow.handle(store, trip, { kind: "trip_requested", payload: { city } }, state.clock);
    const [command] = handled.commandIds;
    group.title = `Request ${trip} (${city})`;
    group.rows.push({ from: "workflow", to: "outbox", text: `commit event ${trip} #${handled.seq} trip_requested + command ${command}, in one transaction`, tone: "commit" });
    return `Committed event #${handled.seq} trip_requested and command ${command} in one transaction: both exist, or neither. The command's ID is the event's: ${trip}, event #${handled.seq}, command 0.`;
  },
  crash(group) {
    group.title = "Crash before ack";
    const [delivery] = store.claim({ worker: "worker", limit: 1, leaseTtlMs: LEASE_MS }, state.clock);
    return delivery ? deliverOne(delivery, group, true) : nothingDue(group);
  },
  deliver(group) {
    group.title = "Deliver";
    const due = store.claim({ worker: "worker", limit: 20, leaseTtlMs: LEASE_MS }, state.clock);
    if (due.length === 0) return nothingDue(group);
    return due.map((d) => deliverOne(d, group, false)).join(" ");
  },
  advance(group) {
    const before = state.clock;
    state.clock += 30_000;
    group.title = `Clock +30 s → ${clockTime(state.clock)}`;
    const expired = allRows().filter((r) => r.status === "leased" && r.lease.expiresAt > before && r.lease.expiresAt <= state.clock);
    for (const row of expired) {
      state.tour.leaseExpired = true;
      group.rows.push({ lane: "outbox", text: `the lease of ${row.commandId} ran out at ${clockTime(row.lease.expiresAt)}: due again`, tone: "wait" });
    }
    return expired.length
      ? `It is ${clockTime(state.clock)}: the lease of ${expired.map((r) => r.commandId).join(", ")} ran out, so the command is due again.`
      : `It is ${clockTime(state.clock)}.`;
  },
  failNext(group) {
    state.failNext = !state.failNext;
    group.title = state.failNext ? "Arm: fail the next delivery" : "Disarm: the next delivery succeeds";
    return state.failNext ? "The supplier will refuse the next delivery for good (a 422): it ends dead." : "The next delivery will succeed.";
  },
  retry(group) {
    group.title = "Retry dead commands";
    const dead = store.deadLetters();
    for (const row of dead) {
      store.retry(row.commandId, state.clock);
      group.rows.push({ lane: "outbox", text: `${row.commandId} put back to pending by hand`, tone: "wait" });
    }
    return dead.length ? `Put ${dead.map((r) => r.commandId).join(", ")} back to pending: deliver it again.` : "No dead command to retry.";
  },
  idempotency(group) {
    state.noIdempotency = !state.noIdempotency;
    group.title = state.noIdempotency ? "Supplier without idempotency" : "Supplier with idempotency";
    const note = state.noIdempotency ? "ignores idempotency keys from now on" : "remembers results by idempotency key again";
    group.rows.push({ lane: "supplier", text: note, tone: state.noIdempotency ? "bad" : "info" });
    return state.noIdempotency
      ? "The supplier now ignores the idempotency key: a redelivery will make a second side effect. Request a trip, crash, advance, deliver."
      : "The supplier remembers results by idempotency key again: a redelivery is dropped.";
  },
};

/** Labels of the actions in the history. */
const LABELS = {
  request: "① Request a trip",
  crash: "② Crash before ack",
  deliver: "Deliver",
  advance: "Advance clock +30 s",
  failNext: "Fail next delivery",
  retry: "Retry dead commands",
  idempotency: "Toggle idempotency",
};

function act(name) {
  const group = { time: state.clock, action: name, title: "", rows: [] };
  try {
    state.explain = { text: actions[name](group), tone: "info" };
  } catch (error) {
    const text = `error ${error.code ?? ""}: ${error.message}`;
    state.explain = { text, tone: "bad" };
    group.rows.push({ lane: "outbox", text, tone: "bad" });
  }
  state.trace.push(group);
  remember(group.title || LABELS[name]);
  persist();
  render();
}

function reset() {
  startOver();
  persist();
  render();
}

// ---------------------------------------------------------------------------------------------
// The guided first run

const STEPS = [
  { key: "requested", action: "request", text: "Request a trip", why: "its event and its command are committed in one transaction" },
  { key: "crashed", action: "crash", text: "Crash before ack", why: "the supplier does the work, the worker dies before the outbox hears of it" },
  { key: "nothingDue", action: "deliver", text: "Deliver", why: "the command is still leased, so nothing is due yet — see why" },
  { key: "leaseExpired", action: "advance", text: "Advance the clock +30 s", why: "the lease runs out" },
  { key: "duplicateDropped", action: "deliver", text: "Deliver again", why: "the same command ID goes out; the supplier drops the duplicate" },
  { key: "contrast", action: "idempotency", text: "Switch the supplier to no idempotency and repeat", why: "the same redelivery makes two side effects" },
];

/** The step to suggest now, from the state: `{ step, action }`, or `null` once the tour is done. */
function nextStep(rows) {
  const { tour } = state;
  if (tour.contrast) return null;
  const contrast = tour.duplicateDropped;
  if (contrast && !state.noIdempotency) return { step: 5, base: 5, action: "idempotency" };
  // The duplicate is dropped by an idempotent supplier: switched off, the tour first asks it back.
  if (!contrast && state.noIdempotency) return { step: 4, base: 4, action: "idempotency", back: true };
  const pick = (step, action) => ({ step: contrast ? 5 : step, base: step, action });
  if (rows.some((r) => r.status === "leased" && !liveLease(r))) return pick(4, "deliver");
  if (rows.some((r) => r.status === "pending" && r.availableAt <= state.clock)) return pick(1, "crash");
  if (rows.some(liveLease)) return tour.nothingDue ? pick(3, "advance") : pick(2, "deliver");
  if (rows.some((r) => r.status === "pending")) return pick(3, "advance");
  return pick(0, "request");
}

const HINTS = {
  request: "Request a trip: the event and its command are committed in one transaction.",
  crash: "Crash before ack: the supplier does the work, then the worker dies before its ack reaches the outbox.",
  deliver: "Deliver due commands.",
  advance: "Advance the clock +30 s: the lease runs out.",
  idempotency: "Switch on “supplier without idempotency”, then request, crash, advance and deliver again.",
};

function renderTour(rows) {
  const next = nextStep(rows);
  fill(
    "tour",
    STEPS.map((s, i) => {
      const status = state.tour[s.key] ? "done" : next?.step === i ? "current" : "todo";
      const current = status === "current" ? { "aria-current": "step" } : {};
      return h("li", { "data-state": status, "data-testid": `tour-${i + 1}`, ...current }, h("b", {}, s.text), h("span", {}, ` — ${s.why}`));
    }),
  );
  let hint = "Tour complete. Drag the time-travel slider back through what happened, fail a delivery for good, or run the saga below.";
  const skipped = STEPS.filter((s) => !state.tour[s.key]);
  if (!next && skipped.length) {
    hint = `Tour complete, but you skipped ${skipped.map((s) => `“${s.text}” (${s.why})`).join(" and ")}: Reset to walk through it.`;
  }
  if (next) {
    hint = HINTS[next.action];
    if (next.back) hint = "Switch “supplier without idempotency” off first: the tour shows the duplicate dropped, then the contrast.";
    if (next.action === "deliver") {
      hint = next.base === 2 ? "Deliver: the command is still leased — see why nothing is due." : "Deliver: the outbox hands out the same command, with the same ID, again.";
    }
    if (next.step === 5 && next.action !== "idempotency") hint = `Without idempotency now — ${hint}`;
  }
  fill("next", h("span", { class: "next-tag" }, next ? "Next" : "Done"), " ", hint);
  for (const element of document.querySelectorAll("[data-action]")) {
    element.classList.toggle("next", element.dataset.action === next?.action);
  }
}

// ---------------------------------------------------------------------------------------------
// Views

function renderCounters() {
  const { calls, effects } = state;
  const set = (id, value) => (document.querySelector(`[data-testid=${id}]`).textContent = String(value));
  set("deliveries", calls.length);
  set("side-effects", effects.length);
  set("duplicates", calls.filter((c) => c.outcome === "duplicate").length);
  set("clock", clockTime(state.clock));
  set("pending", store.pending().length);
  set("dead", store.deadLetters().length);
  document.getElementById("counter-effects").classList.toggle("alarm", new Set(effects.map((e) => e.commandId)).size < effects.length);
}

function renderControls() {
  document.getElementById("fail-next").classList.toggle("armed", state.failNext);
  document.getElementById("fail-next").setAttribute("aria-pressed", String(state.failNext));
  const toggle = document.getElementById("no-idempotency");
  toggle.checked = state.noIdempotency;
  toggle.closest(".switch").classList.toggle("on", state.noIdempotency);
  const explain = document.getElementById("explain");
  explain.replaceChildren(...withIds(state.explain.text));
  explain.dataset.tone = state.explain.tone;
}

function renderTimeTravel() {
  const slider = document.getElementById("time-travel");
  slider.max = String(history.length - 1);
  slider.value = String(cursor);
  slider.disabled = history.length < 2;
  const entry = history[cursor];
  slider.setAttribute("aria-valuetext", entry.label === "start" ? "start" : `after ${entry.label}`);
  if (history.length < 2) {
    fill("time-travel-label", `Every action adds a point here (the last ${HISTORY_LIMIT - 1} are kept): drag back to see the state right after any of them.`);
  } else {
    fill("time-travel-label", h("b", {}, `${cursor} / ${history.length - 1}`), ` · ${clockTime(entry.clock)} · after `, entry.label === "start" ? "nothing yet (start)" : entry.label);
  }
  const past = cursor < history.length - 1;
  const banner = document.getElementById("time-travel-past");
  banner.hidden = !past;
  if (past) {
    const later = history.length - 1 - cursor;
    fill("time-travel-past-text", `You are looking at the past. The next action continues from here and drops the ${later} later step${later > 1 ? "s" : ""}.`);
  }
}

function sequenceRow(row) {
  if (row.lane) {
    return h(
      "div",
      { class: `seq-note tone-${row.tone ?? "info"}`, "data-testid": row.testid, "data-lane": row.lane, style: { "--lane": LANES.indexOf(row.lane) } },
      h("span", { class: `seq-note-lane lane-${row.lane}` }, row.lane),
      " ",
      withIds(row.text),
    );
  }
  const from = LANES.indexOf(row.from);
  const to = LANES.indexOf(row.to);
  const [lo, hi] = [Math.min(from, to), Math.max(from, to)];
  const span = hi - lo + 1;
  return h(
    "div",
    {
      class: `seq-msg tone-${row.tone ?? "plain"}${row.lost ? " lost" : ""}`,
      "data-testid": row.testid,
      "data-from": row.from,
      "data-to": row.to,
      style: { "--lo": lo + 1, "--hi": hi + 2, "--span": span },
    },
    h("div", { class: "seq-label" }, withIds(row.text)),
    h(
      "div",
      { class: `seq-arrow ${from < to ? "right" : "left"}` },
      h("span", { class: "seq-line" }),
      row.lost ? h("span", { class: "seq-cross", "data-testid": "lost-ack", title: "the ack never arrived" }, "✕") : h("span", { class: "seq-head" }),
    ),
  );
}

const sequenceGroup = (g) =>
  h(
    "section",
    { class: `seq-group action-${g.action}`, "data-testid": "seq-group" },
    h("div", { class: "seq-step" }, h("time", {}, clockTime(g.time)), " ", h("b", {}, g.title)),
    g.rows.map(sequenceRow),
  );

function renderSequence() {
  const groups = state.trace;
  const body = document.getElementById("sequence");
  if (groups.length === 0) {
    body.replaceChildren(empty("Nothing has happened yet. Press ", h("b", {}, "① Request a trip"), ": the workflow commits its event and command to the outbox, drawn here as an arrow."));
    return;
  }
  // History is linear: one group more than shown is the next one, appended; anything else is redrawn.
  const shown = body.querySelectorAll(":scope > .seq-group").length;
  if (shown > 0 && shown === groups.length - 1) {
    body.append(sequenceGroup(groups[shown]));
    return;
  }
  if (shown === groups.length && shown > 0) return;
  body.replaceChildren(...LANES.map((lane, i) => h("div", { class: `seq-lifeline lane-${lane}`, style: { "--lane": i } })), ...groups.map(sequenceGroup));
}

function renderTransactions(rows) {
  const events = allTrips().flatMap((trip) => store.events(trip));
  if (events.length === 0) {
    fill("transactions", empty("No transaction yet. Each one will show an event and the commands committed with it, in one box."));
    return;
  }
  const byEvent = new Map();
  for (const row of rows) {
    const [, workflow, seq] = /^(.+):(\d+):\d+$/.exec(row.commandId);
    const key = `${workflow}#${seq}`;
    byEvent.set(key, [...(byEvent.get(key) ?? []), row]);
  }
  events.sort((a, b) => a.recordedAt - b.recordedAt || a.workflowId.localeCompare(b.workflowId) || a.seq - b.seq);
  fill(
    "transactions",
    events.map((e, i) =>
      h(
        "article",
        { class: "tx", "data-testid": `tx-${e.workflowId}-${e.seq}` },
        h("header", {}, h("span", {}, `Transaction ${i + 1} · all or nothing`), h("time", {}, clockTime(e.recordedAt))),
        h(
          "div",
          { class: "tx-event" },
          h("span", { class: "tx-what" }, "event"),
          h("span", { class: "tx-body" }, h("code", { class: "tx-wf" }, e.workflowId), " ", h("span", { class: "seq-badge" }, `#${e.seq}`), " ", h("b", {}, e.kind), " ", payloadText(e.payload)),
        ),
        (byEvent.get(`${e.workflowId}#${e.seq}`) ?? []).map((row) =>
          h(
            "div",
            { class: "tx-command" },
            h("span", { class: "tx-what" }, "+ command"),
            h("span", { class: "tx-body" }, cid(row.commandId), " ", h("b", {}, row.kind), " ", chip(row.status)),
          ),
        ),
      ),
    ),
  );
}

/** A payload as `city 成都`, `key value` pairs. */
function payloadText(payload) {
  if (payload === null || typeof payload !== "object") return payload === null ? "" : JSON.stringify(payload);
  return h("span", { class: "payload" }, Object.entries(payload).map(([k, v]) => h("span", {}, h("i", {}, k), " ", typeof v === "string" ? v : JSON.stringify(v))));
}

function renderSupplier() {
  const { calls, effects } = state;
  fill(
    "calls",
    calls.length === 0
      ? empty("No call yet. Every delivery the worker makes shows up here with its idempotency key — redeliveries too.")
      : h(
          "ol",
          { class: "calls" },
          calls.map((c) =>
            h(
              "li",
              { "data-outcome": c.outcome, "data-testid": "call" },
              h("span", { class: "call-n" }, `delivery ${c.n}`),
              h("span", {}, "key ", cid(c.commandId), ` attempt ${c.attempt}`),
              h("span", { class: "call-result" }, c.outcome === "refused" ? c.error : `→ ${c.reference}`),
              h("span", { class: `badge ${c.outcome}` }, { effect: "new effect", duplicate: "duplicate dropped", second: "second effect!", refused: "refused" }[c.outcome]),
            ),
          ),
        ),
  );
  const perCommand = new Map();
  for (const e of effects) perCommand.set(e.commandId, (perCommand.get(e.commandId) ?? 0) + 1);
  fill(
    "effects",
    effects.length === 0
      ? empty("No side effect yet: no budget has been locked.")
      : h(
          "ul",
          { class: "effects" },
          effects.map((e) =>
            h(
              "li",
              { "data-testid": "effect", class: perCommand.get(e.commandId) > 1 ? "twice" : "" },
              h("b", {}, e.reference),
              " budget locked for ",
              cid(e.commandId),
              ` at ${clockTime(e.at)}`,
              perCommand.get(e.commandId) > 1 ? [" ", h("span", { class: "badge second" }, `${perCommand.get(e.commandId)} effects for one command`)] : null,
            ),
          ),
        ),
  );
}

function renderOutbox(rows) {
  const table = document.getElementById("outbox-table");
  table.hidden = rows.length === 0;
  document.getElementById("outbox-empty").hidden = rows.length > 0;
  const td = (label, ...content) => h("td", { "data-label": label }, ...content);
  fill(
    "outbox",
    rows.map((row) => {
      const expired = row.status === "leased" && !liveLease(row);
      const lease = row.status === "leased" ? `${row.lease.owner}, token ${row.lease.token}, until ${clockTime(row.lease.expiresAt)}${expired ? " (ran out)" : ""}` : "–";
      const next = row.status === "pending" || row.status === "leased" ? clockTime(row.availableAt) : "–";
      return h(
        "tr",
        {},
        td("command ID", cid(row.commandId)),
        td("kind", row.kind),
        td("state", chip(row.status)),
        td("attempts", String(row.attempts)),
        td("lease", lease),
        td("next attempt", next),
        td("last error", row.lastError ?? "–"),
      );
    }),
  );
}

function render() {
  const rows = allRows();
  renderTour(rows);
  renderControls();
  renderCounters();
  renderTimeTravel();
  renderSequence();
  renderTransactions(rows);
  renderSupplier();
  renderOutbox(rows);
}

// ---------------------------------------------------------------------------------------------
// Start

await ready();
loadSaved();
try {
  render();
} catch (error) {
  console.warn("discarding a saved playground that cannot be drawn:", error);
  startOver();
}
for (const element of document.querySelectorAll("button[data-action]")) {
  element.addEventListener("click", () => act(element.dataset.action));
}
document.getElementById("no-idempotency").addEventListener("change", () => act("idempotency"));
document.getElementById("reset").addEventListener("click", reset);
document.getElementById("time-travel").addEventListener("input", (e) => travel(Number(e.target.value)));
document.getElementById("time-travel-latest").addEventListener("click", () => {
  travel(history.length - 1);
  document.getElementById("time-travel").focus(); // the button hides itself: focus stays on the slider
});
document.getElementById("run-saga").addEventListener("click", () => renderSaga(document.getElementById("saga")));
linkCommandIds();
addEventListener("pagehide", () => saving !== null && save());
render();
const status = document.getElementById("status");
status.textContent = "ready";
status.dataset.ready = "true";
