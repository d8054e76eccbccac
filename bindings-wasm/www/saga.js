// The trip booking saga of examples/trip_saga.rs, in the browser, carried further: durable timers,
// compensation, results that flow back and commands that are withdrawn. Bookings ask for their result
// (`reportResult`): the supplier's reference comes back as a `command_completed` event, the trip keeps
// it, and `cancel_flight` carries it. trip-001's hotel refuses for good, so its dead booking feeds
// `command_failed` back and the trip is compensated; trip-002's hotel keeps answering 503, so its
// 30-minute deadline fires while the booking is still retrying, and the trip withdraws it
// (`cancelKinds`) instead of letting it be booked later; trip-003's hotel books on its second attempt,
// in time. Time is a virtual clock.
import { Engine, MemoryStore, parseCommandId, timerWorkflowId } from "./pkg/miniflow.js";

const HOTEL_DEADLINE = "hotel_deadline";
/** The bookings whose references come back, and the commands that undo them. */
const UNDO = { book_flight: "cancel_flight", book_hotel: "cancel_hotel" };
const REFERENCE = { book_flight: "flight", book_hotel: "hotel" };
const UNDOES = new Set(Object.values(UNDO));

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
    const tripId = event.workflow_id;
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

/** Runs the saga to the end on a virtual clock; returns the report lines. */
export function runSaga() {
  const start = Date.UTC(2026, 0, 1, 9, 0, 0);
  let clock = start;
  const store = new MemoryStore();
  const engine = new Engine(sagaWorkflow);
  const trips = [["trip-001", "成都"], ["trip-002", "西安"], ["trip-003", "杭州"]];
  const policy = { initialDelayMs: 60_000, multiplier: 2, maxDelayMs: 10 * 60_000, maxAttempts: 20, jitter: 0 };
  const lines = [];
  const minutes = () => `${((clock - start) / 60_000).toFixed(1).padStart(5)} min`;
  const reference = (payload) => (payload?.reference ? ` ${payload.reference}` : "");
  const atMinutes = (ms) => `${((ms - start) / 60_000).toFixed(1)} min`;
  const withdrawn = new Set();
  /** Reports the commands of `trip` its last decision withdrew. */
  const reportWithdrawn = (trip) => {
    for (const row of store.commands(trip)) {
      if (row.status === "cancelled" && !withdrawn.has(row.command_id)) {
        withdrawn.add(row.command_id);
        lines.push(`[${minutes()}] ${row.command_id} ${row.kind} withdrawn → cancelled (its next attempt was due at ${atMinutes(row.available_at)})`);
      }
    }
  };
  for (const [trip, city] of trips) engine.handle(store, trip, { kind: "trip_requested", payload: { city } }, clock);
  for (let step = 0; step < 1_000; step += 1) {
    const timers = store.claimTimers(50, 30_000, clock);
    for (const timer of timers) {
      if (engine.fire(store, timer, clock)) {
        lines.push(`[${minutes()}] ${timer.timer_id} fired: ${timer.event_kind}`);
        reportWithdrawn(timerWorkflowId(timer.timer_id));
      }
    }
    const due = store.claim({ worker: "saga", limit: 50, leaseTtlMs: 30_000 }, clock);
    for (const d of due) {
      const answer = supplier(d);
      const what = `${d.command_id} ${d.kind}${reference(d.payload)} attempt ${d.attempt}`;
      if (answer.error) {
        const settled = store.fail(d.command_id, d.token, answer, policy, clock);
        lines.push(`[${minutes()}] ${what}: ${answer.error} → ${settled.outcome}`);
      } else {
        // The result is kept on the command and, as the bookings asked, fed back to the trip.
        store.completeWith(d.command_id, d.token, answer.result, clock);
        lines.push(`[${minutes()}] ${what}: done${answer.result ? ` → ${JSON.stringify(answer.result)}` : ""}`);
      }
    }
    if (timers.length || due.length) continue;
    const next = [
      ...store.pending().map((row) => row.available_at),
      ...trips.flatMap(([trip]) => store.timers(trip).filter((t) => t.status === "scheduled").map((t) => t.fire_at)),
    ];
    if (next.length === 0) break;
    clock = Math.max(clock, Math.min(...next));
  }
  let cancelled = 0;
  for (const [trip] of trips) {
    lines.push("", `== ${trip} ==`, "events:");
    for (const e of store.load(trip)) lines.push(`  ${e.seq} ${e.kind} ${JSON.stringify(e.payload)}`);
    lines.push("outbox:");
    const rows = store.commands(trip);
    for (const row of rows) {
      const result = row.result === null ? "" : ` → ${JSON.stringify(row.result)}`;
      lines.push(`  ${row.command_id} ${row.kind}${reference(row.payload)} ${row.status} attempts=${row.attempts}${row.last_error ? ` (${row.last_error})` : ""}${result}`);
    }
    lines.push("timers:");
    for (const t of store.timers(trip)) lines.push(`  ${t.timer_id} ${t.name} ${t.status}`);
    const state = engine.replay(store, trip).state;
    const done = (kind) => rows.some((row) => row.kind === kind && row.status === "done");
    lines.push(`state: ${state.cancelled ? `cancelled (${state.cancelled})` : "booked"}; budget released: ${done("release_budget")}; flight cancelled: ${done("cancel_flight")}`);
    lines.push(`references: flight ${state.flight ?? "–"}, hotel ${state.hotel ?? "–"}`);
    for (const row of rows.filter((r) => r.status === "cancelled")) {
      cancelled += 1;
      lines.push(`withdrawn: ${row.command_id} ${row.kind} after ${row.attempts} attempts, never delivered again`);
    }
  }
  const dead = store.deadLetters();
  const explained = dead.filter((row) =>
    store.load(parseCommandId(row.command_id).workflow_id).some((e) => e.kind === "command_failed" && e.payload.command_id === row.command_id),
  );
  lines.push("", `pending: ${store.pending().length}`, `dead: ${dead.length} (unexplained: ${dead.length - explained.length})`, `cancelled: ${cancelled}`);
  store.free();
  return lines;
}
