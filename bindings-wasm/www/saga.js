// The trip booking saga of examples/trip_saga.rs, in the browser, carried further: durable timers,
// compensation, results that flow back and commands that are withdrawn. Bookings ask for their result
// (`reportResult`): the supplier's reference comes back as a `command_completed` event, the trip keeps
// it, and `cancel_flight` carries it. trip-001's hotel refuses for good, so its dead booking feeds
// `command_failed` back and the trip is compensated; trip-002's hotel keeps answering 503, so its
// 30-minute deadline fires while the booking is still retrying, and the trip withdraws it
// (`cancelKinds`) instead of letting it be booked later; trip-003's hotel books on its second attempt,
// in time. Time is a virtual clock. `runSaga` returns each trip's timeline: what was committed, when,
// and what came back.
import { Store, Workflow, parseCommandId, timerWorkflowId } from "./miniflow-api.js";

const HOTEL_DEADLINE = "hotel_deadline";
/** The bookings whose references come back, and the commands that undo them. */
const UNDO = { book_flight: "cancel_flight", book_hotel: "cancel_hotel" };
const REFERENCE = { book_flight: "flight", book_hotel: "hotel" };
const UNDOES = new Set(Object.values(UNDO));
/** The events miniflow commits to bring a command's outcome back into its workflow. */
const FEEDBACK = new Set(["command_completed", "command_failed"]);

/** Undo what was booked (with its reference), withdraw the bookings still under way, stop the clock. */
function compensate(trip, failed, reason, tripId) {
  const underWay = Object.keys(UNDO).filter((kind) => !failed.includes(kind) && trip[REFERENCE[kind]] === null);
  const undo = Object.entries(UNDO)
    .filter(([kind]) => trip[REFERENCE[kind]] !== null)
    .map(([kind, undoKind]) => ({ kind: undoKind, payload: { trip_id: tripId, reference: trip[REFERENCE[kind]], reason } }));
  return {
    cancelTimers: [HOTEL_DEADLINE],
    // A pending booking is never sent; one being delivered still reports how it ended (below).
    cancelKinds: underWay,
    commands: [...(failed.includes("lock_budget") ? [] : [{ kind: "release_budget", payload: { trip_id: tripId, reason } }]), ...undo],
  };
}

export const sagaWorkflow = {
  init: () => ({ requested: false, flight: null, hotel: null, cancelled: null, failed: [] }),
  evolve(trip, event) {
    switch (event.kind) {
      case "trip_requested":
        return { ...trip, requested: true };
      case "command_completed": {
        const { kind, result } = event.payload;
        return kind in REFERENCE ? { ...trip, [REFERENCE[kind]]: result.reference } : trip;
      }
      case "command_failed": {
        const { kind, error } = event.payload;
        return { ...trip, failed: [...trip.failed, kind], cancelled: trip.cancelled ?? `${kind} failed: ${error}` };
      }
      case "timer_fired":
        if (event.payload.name === HOTEL_DEADLINE && trip.hotel === null) {
          return { ...trip, cancelled: trip.cancelled ?? "the hotel did not confirm within 30 minutes" };
        }
        return trip;
      default:
        return trip;
    }
  },
  decide(trip, event) {
    const tripId = event.workflowId;
    switch (event.kind) {
      case "trip_requested": {
        if (trip.requested) return [];
        const booking = { trip_id: tripId, city: event.payload.city };
        return {
          commands: [
            { kind: "lock_budget", payload: { trip_id: tripId, amount: 3000 } },
            { kind: "book_flight", payload: booking, reportResult: true },
            { kind: "book_hotel", payload: booking, reportResult: true },
          ],
          timers: [{ name: HOTEL_DEADLINE, afterMs: 30 * 60_000, payload: { trip_id: tripId } }],
        };
      }
      case "command_completed": {
        const { kind, result } = event.payload;
        if (trip.cancelled !== null && kind in UNDO) {
          // Booked while the trip was being cancelled: undo it too.
          return [{ kind: UNDO[kind], payload: { trip_id: tripId, reference: result.reference, reason: "booked after the trip was cancelled" } }];
        }
        return kind === "book_hotel" ? { cancelTimers: [HOTEL_DEADLINE] } : [];
      }
      case "command_failed":
        return trip.cancelled === null ? compensate(trip, [...trip.failed, event.payload.kind], "a booking failed", tripId) : [];
      case "timer_fired":
        return event.payload.name === HOTEL_DEADLINE && trip.cancelled === null && trip.hotel === null
          ? compensate(trip, trip.failed, "the hotel did not confirm in time", tripId)
          : [];
      default:
        return [];
    }
  },
};

/**
 * The suppliers. Bookings answer with a reference; trip-001's hotel answers 503, then refuses for good;
 * trip-002's hotel always answers 503; trip-003's hotel answers 503 once. A cancellation needs the
 * reference of what it cancels.
 */
function supplier(delivery) {
  const { kind, payload, attempt } = delivery;
  const trip = payload.trip_id;
  if (kind === "book_hotel") {
    if (trip === "trip-001" && attempt > 1) return { error: "422 hotel fully booked", retryable: false };
    if (trip === "trip-002" || attempt === 1) return { error: "503 hotel busy", retryable: true };
  }
  if (kind in UNDO) return { result: { reference: `${kind === "book_flight" ? "FL" : "HT"}-${trip.slice(-3)}` } };
  if (UNDOES.has(kind) && !payload.reference) return { error: `400 ${kind} without a booking reference`, retryable: false };
  return { result: null };
}

export const SAGA_TRIPS = [
  ["trip-001", "成都"],
  ["trip-002", "西安"],
  ["trip-003", "杭州"],
];

/**
 * Runs the saga to the end on a virtual clock. Returns `{ trips, totals }`: for each trip its timeline
 * (entries in time order, `at` in ms from the start), its final commands and timers, and its state.
 *
 * Timeline entries:
 * - `{ type: "commit", event, commands, timers, withdrawn, stoppedTimers, via? }`: one transaction, the
 *   event and everything its decision wrote together (new commands and timers, withdrawn commands,
 *   cancelled timers); `via` is the timer that fed a command's outcome back;
 * - `{ type: "attempt", delivery, outcome, result?, error?, retryAt? }`: a delivery and how it ended;
 * - `{ type: "timer", timer }`: one of the trip's own timers fired (its `timer_fired` commit follows).
 */
export function runSaga() {
  const start = Date.UTC(2026, 0, 1, 9, 0, 0);
  let clock = start;
  const store = new Store();
  const engine = new Workflow(sagaWorkflow);
  const policy = { initialDelayMs: 60_000, multiplier: 2, maxDelayMs: 10 * 60_000, maxAttempts: 20, jitter: 0 };
  const timelines = new Map(SAGA_TRIPS.map(([trip]) => [trip, []]));
  const seen = new Map(SAGA_TRIPS.map(([trip]) => [trip, { events: 0, commands: new Map(), timers: new Map() }]));

  /**
   * Adds to `trip`'s timeline what the store gained since the last look: commits and what they did.
   * `via` names the feedback timer that carried a result back.
   */
  const observe = (trip, via) => {
    const before = seen.get(trip);
    const timeline = timelines.get(trip);
    const events = store.events(trip);
    const commands = store.commands(trip);
    const timers = store.timers(trip);
    let last = null;
    for (const event of events.slice(before.events)) {
      last = {
        type: "commit",
        at: clock - start,
        event,
        commands: commands.filter((c) => parseCommandId(c.commandId).eventSeq === event.seq),
        timers: timers.filter((t) => t.timerId.startsWith(`${trip}:${event.seq}:t`)),
        withdrawn: [],
        stoppedTimers: [],
        via,
      };
      timeline.push(last);
    }
    for (const c of commands) {
      if (c.status === "cancelled" && before.commands.get(c.commandId) !== "cancelled") last?.withdrawn.push(c);
    }
    for (const t of timers) {
      if (t.status === "cancelled" && before.timers.get(t.timerId) !== "cancelled") last?.stoppedTimers.push(t);
    }
    seen.set(trip, {
      events: events.length,
      commands: new Map(commands.map((c) => [c.commandId, c.status])),
      timers: new Map(timers.map((t) => [t.timerId, t.status])),
    });
  };

  for (const [trip, city] of SAGA_TRIPS) {
    engine.handle(store, trip, { kind: "trip_requested", payload: { city } }, clock);
    observe(trip);
  }
  for (let step = 0; step < 1_000; step += 1) {
    const timers = store.claimTimers(50, 30_000, clock);
    for (const timer of timers) {
      const trip = timerWorkflowId(timer.timerId);
      if (!engine.fire(store, timer, clock)) continue;
      if (FEEDBACK.has(timer.eventKind)) {
        // A command's result or failure, fed back into its workflow: the commit shows it.
        observe(trip, timer.timerId);
      } else {
        timelines.get(trip).push({ type: "timer", at: clock - start, timer });
        observe(trip);
      }
    }
    const due = store.claim({ worker: "saga", limit: 50, leaseTtlMs: 30_000 }, clock);
    for (const d of due) {
      const trip = parseCommandId(d.commandId).workflowId;
      const answer = supplier(d);
      const entry = { type: "attempt", at: clock - start, delivery: d };
      timelines.get(trip).push(entry);
      if (answer.error) {
        const settled = store.fail(d, answer, policy, clock);
        Object.assign(entry, { outcome: settled.outcome, error: answer.error, retryAt: settled.at === undefined ? undefined : settled.at - start });
      } else {
        // The result is kept on the command and, as the bookings asked, fed back to the trip.
        store.completeWith(d, answer.result, clock);
        Object.assign(entry, { outcome: "done", result: answer.result });
      }
      observe(trip);
    }
    if (timers.length || due.length) continue;
    const next = [
      ...store.pending().map((row) => row.availableAt),
      ...SAGA_TRIPS.flatMap(([trip]) => store.timers(trip).filter((t) => t.status === "scheduled").map((t) => t.fireAt)),
    ];
    if (next.length === 0) break;
    clock = Math.max(clock, Math.min(...next));
  }

  const trips = SAGA_TRIPS.map(([trip, city]) => {
    const commands = store.commands(trip);
    const done = (kind) => commands.some((row) => row.kind === kind && row.status === "done");
    return {
      trip,
      city,
      timeline: timelines.get(trip),
      commands,
      timers: store.timers(trip),
      state: engine.state(store, trip),
      budgetReleased: done("release_budget"),
      flightCancelled: done("cancel_flight"),
    };
  });
  const dead = store.deadLetters();
  const explained = dead.filter((row) =>
    store.events(parseCommandId(row.commandId).workflowId).some((e) => e.kind === "command_failed" && e.payload.commandId === row.commandId),
  );
  const totals = {
    start,
    pending: store.pending().length,
    dead: dead.length,
    unexplained: dead.length - explained.length,
    withdrawn: trips.reduce((n, t) => n + t.commands.filter((c) => c.status === "cancelled").length, 0),
    minutes: (clock - start) / 60_000,
  };
  store.free();
  return { trips, totals };
}
