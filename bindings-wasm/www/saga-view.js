// The saga drawn as one timeline per trip: each commit with what it wrote together, each delivery
// attempt, results flowing back as command_completed / command_failed, timers firing, withdrawals.
import { h, cid, chip } from "./dom.js";
import { runSaga } from "./saga.js";

const minutes = (ms) => `${(ms / 60_000).toFixed(1)} min`;
const reference = (payload) => (payload?.reference ? ` ${payload.reference}` : "");

/** What each kind of commit is, on the timeline. */
const COMMIT = {
  trip_requested: { entry: "commit", icon: "●" },
  command_completed: { entry: "result", icon: "↩" },
  command_failed: { entry: "failure", icon: "↩" },
  timer_fired: { entry: "deadline", icon: "◷" },
};

function commitTitle(event, city) {
  const p = event.payload;
  switch (event.kind) {
    case "command_completed":
      return [`#${event.seq} command_completed: `, cid(p.commandId), ` ${p.kind} → ${p.result?.reference ?? JSON.stringify(p.result)}`];
    case "command_failed":
      return [`#${event.seq} command_failed: `, cid(p.commandId), ` ${p.kind} — ${p.error}`];
    case "timer_fired":
      return [`#${event.seq} timer_fired: ${p.name}`];
    default:
      return [`#${event.seq} ${event.kind} · ${city}`];
  }
}

function commitEntry(entry, city, start) {
  const { event } = entry;
  const { entry: kind, icon } = COMMIT[event.kind] ?? { entry: "commit", icon: "●" };
  const wrote = [
    ...entry.commands.map((c) =>
      h("li", { class: "wrote-command" }, "+ command ", cid(c.commandId), ` ${c.kind}${reference(c.payload)}`, c.kind.startsWith("book_") ? h("span", { class: "hint" }, " (reports its result)") : null),
    ),
    ...entry.timers.map((t) => h("li", { class: "wrote-timer" }, `+ timer ${t.name}, fires at ${minutes(t.fireAt - start)}`)),
    ...entry.withdrawn.map((c) =>
      h(
        "li",
        { class: "wrote-withdrawn", "data-entry": "withdrawn" },
        "⊘ ",
        cid(c.commandId),
        ` ${c.kind} withdrawn → `,
        chip("cancelled"),
        ` (its next attempt was due at ${minutes(c.availableAt - start)})`,
      ),
    ),
    ...entry.stoppedTimers.map((t) => h("li", { class: "wrote-stopped" }, `⊘ timer ${t.name} `, chip("cancelled"))),
  ];
  return h(
    "li",
    { class: `tl tl-${kind}`, "data-entry": kind },
    h("time", {}, minutes(entry.at)),
    h("span", { class: "tl-dot", "aria-hidden": "true" }, icon),
    h(
      "div",
      { class: "tl-body" },
      h("div", { class: "tl-title" }, commitTitle(event, city)),
      entry.via ? h("div", { class: "tl-via" }, "fed back to the trip by ", h("code", {}, entry.via)) : null,
      wrote.length ? h("ul", { class: "tl-wrote", "aria-label": "committed with it" }, wrote) : null,
    ),
  );
}

function attemptEntry(entry) {
  const d = entry.delivery;
  const ending = {
    done: () => (entry.result?.reference ? `done → ${entry.result.reference}` : "done"),
    retry_at: () => `${entry.error} → retry at ${minutes(entry.retryAt)}`,
    dead: () => `${entry.error} → dead`,
    cancelled: () => `${entry.error} → cancelled`,
  }[entry.outcome]();
  return h(
    "li",
    { class: `tl tl-attempt outcome-${entry.outcome}`, "data-entry": "attempt" },
    h("time", {}, minutes(entry.at)),
    h("span", { class: "tl-dot", "aria-hidden": "true" }, "→"),
    h("div", { class: "tl-body" }, cid(d.commandId), ` ${d.kind}${reference(d.payload)} attempt ${d.attempt}: `, h("b", {}, ending)),
  );
}

function timerEntry(entry) {
  return h(
    "li",
    { class: "tl tl-timer", "data-entry": "timer" },
    h("time", {}, minutes(entry.at)),
    h("span", { class: "tl-dot", "aria-hidden": "true" }, "◷"),
    h("div", { class: "tl-body" }, h("code", {}, entry.timer.timerId), ` ${entry.timer.name} fired`),
  );
}

function tripCard(trip, start) {
  const { state } = trip;
  const booked = !state.cancelled;
  return h(
    "article",
    { class: "trip", "data-testid": `saga-${trip.trip}` },
    h(
      "header",
      {},
      h("h3", {}, trip.trip, " ", h("span", { class: "city" }, trip.city)),
      h("span", { class: `outcome ${booked ? "booked" : "cancelled"}`, "data-testid": "saga-outcome" }, booked ? "booked" : "cancelled"),
    ),
    h("p", { class: "trip-why" }, booked ? "Flight and hotel booked in time." : `Cancelled: ${state.cancelled}.`),
    h(
      "ol",
      { class: "timeline" },
      trip.timeline.map((entry) => (entry.type === "commit" ? commitEntry(entry, trip.city, start) : entry.type === "attempt" ? attemptEntry(entry) : timerEntry(entry))),
    ),
    h(
      "footer",
      {},
      h(
        "dl",
        {},
        h("dt", {}, "references"),
        h("dd", {}, `flight ${state.flight ?? "–"}, hotel ${state.hotel ?? "–"}`),
        h("dt", {}, "budget released"),
        h("dd", {}, trip.budgetReleased ? "yes" : "no"),
        h("dt", {}, "flight cancelled"),
        h("dd", {}, trip.flightCancelled ? "yes" : "no"),
      ),
      h("div", { class: "final-rows" }, h("span", { class: "final-label" }, "outbox at the end"), trip.commands.map((c) => h("span", { class: "final-row" }, cid(c.commandId), ` ${c.kind} `, chip(c.status), ` ${c.attempts} attempt${c.attempts === 1 ? "" : "s"}`))),
      h("div", { class: "final-rows" }, h("span", { class: "final-label" }, "timers at the end"), trip.timers.filter((t) => t.eventKind === "timer_fired").map((t) => h("span", { class: "final-row" }, h("code", {}, t.timerId), ` ${t.name} `, chip(t.status)))),
    ),
  );
}

/** Runs the saga and draws it into `root`. */
export function renderSaga(root) {
  const { trips, totals } = runSaga();
  root.replaceChildren(
    h(
      "p",
      { class: "saga-totals", "data-testid": "saga-totals" },
      h("span", {}, "pending ", h("b", {}, totals.pending)),
      h("span", {}, "dead ", h("b", {}, totals.dead), ` (without their command_failed: ${totals.unexplained})`),
      h("span", {}, "withdrawn ", h("b", {}, totals.withdrawn)),
      h("span", {}, `finished at ${minutes(totals.minutes * 60_000)}`),
    ),
    h("div", { class: "trips" }, trips.map((trip) => tripCard(trip, totals.start))),
  );
}
