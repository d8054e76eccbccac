// The trip booking saga of examples/trip_saga.rs, in the browser: durable timers and compensation.
// trip-001's hotel refuses for good, so its dead booking feeds `command_failed` back and the trip is
// compensated; trip-002's hotel never confirms, so its 30-minute deadline fires and the trip is
// compensated. Time is a virtual clock.
import { Engine, MemoryStore } from "./pkg/miniflow.js";

const HOTEL_DEADLINE = "hotel_deadline";
const UNDO = [["lock_budget", "release_budget"], ["book_flight", "cancel_flight"], ["book_hotel", "cancel_hotel"]];

function compensate(failed, reason, tripId) {
  return {
    cancel_timers: [HOTEL_DEADLINE],
    commands: UNDO.filter(([booking]) => !failed.includes(booking)).map(([, undo]) => ({ kind: undo, payload: { trip_id: tripId, reason } })),
  };
}

export const sagaWorkflow = {
  init: () => ({ requested: false, hotelConfirmed: false, cancelled: null, failed: [] }),
  evolve(trip, event) {
    switch (event.kind) {
      case "trip_requested":
        return { ...trip, requested: true };
      case "hotel_confirmed":
        return { ...trip, hotelConfirmed: true };
      case "command_failed": {
        const { kind, error } = event.payload;
        return { ...trip, failed: [...trip.failed, kind], cancelled: trip.cancelled ?? `${kind} failed: ${error}` };
      }
      case "timer_fired":
        if (event.payload.name === HOTEL_DEADLINE && !trip.hotelConfirmed) {
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
            { kind: "book_flight", payload: booking },
            { kind: "book_hotel", payload: booking },
          ],
          timers: [{ name: HOTEL_DEADLINE, after_ms: 30 * 60_000, payload: { trip_id: tripId } }],
        };
      }
      case "hotel_confirmed":
        return { cancel_timers: [HOTEL_DEADLINE] };
      case "command_failed":
        return trip.cancelled === null ? compensate([...trip.failed, event.payload.kind], "a booking failed", tripId) : [];
      case "timer_fired":
        return event.payload.name === HOTEL_DEADLINE && trip.cancelled === null && !trip.hotelConfirmed
          ? compensate(trip.failed, "the hotel did not confirm in time", tripId)
          : [];
      default:
        return [];
    }
  },
};

/** The suppliers: trip-001's hotel answers 503, then refuses for good; everything else succeeds. */
function supplier(delivery) {
  if (delivery.kind === "book_hotel" && delivery.payload.trip_id === "trip-001") {
    return delivery.attempt === 1 ? { error: "503 hotel busy", retryable: true } : { error: "422 hotel fully booked", retryable: false };
  }
  return null;
}

/** Runs the saga to the end on a virtual clock; returns the report lines. */
export function runSaga() {
  const start = Date.UTC(2026, 0, 1, 9, 0, 0);
  let clock = start;
  const store = new MemoryStore();
  const engine = new Engine(sagaWorkflow);
  const trips = [["trip-001", "成都"], ["trip-002", "西安"]];
  const policy = { initial_delay_ms: 60_000, jitter: 0 };
  const lines = [];
  const minutes = () => `${((clock - start) / 60_000).toFixed(1).padStart(5)} min`;
  for (const [trip, city] of trips) engine.handle(store, trip, { kind: "trip_requested", payload: { city } }, clock);
  for (let step = 0; step < 1_000; step += 1) {
    const timers = store.claimTimers(50, 30_000, clock);
    for (const timer of timers) {
      if (engine.fire(store, timer, clock)) lines.push(`[${minutes()}] ${timer.timer_id} fired: ${timer.event_kind}`);
    }
    const due = store.claim({ worker: "saga", limit: 50, lease_ttl_ms: 30_000 }, clock);
    for (const d of due) {
      const failure = supplier(d);
      if (failure) {
        const settled = store.fail(d.command_id, d.token, failure, policy, clock);
        lines.push(`[${minutes()}] ${d.command_id} ${d.kind} attempt ${d.attempt}: ${failure.error} → ${settled.outcome}`);
      } else {
        store.complete(d.command_id, d.token, clock);
        lines.push(`[${minutes()}] ${d.command_id} ${d.kind} attempt ${d.attempt}: done`);
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
  for (const [trip] of trips) {
    lines.push("", `== ${trip} ==`, "events:");
    for (const e of store.load(trip)) lines.push(`  ${e.seq} ${e.kind} ${JSON.stringify(e.payload)}`);
    lines.push("outbox:");
    for (const row of store.commands(trip)) lines.push(`  ${row.command_id} ${row.kind} ${row.status} attempts=${row.attempts}${row.last_error ? ` (${row.last_error})` : ""}`);
    lines.push("timers:");
    for (const t of store.timers(trip)) lines.push(`  ${t.timer_id} ${t.name} ${t.status}`);
    const state = engine.replay(store, trip).state;
    const done = (kind) => store.commands(trip).some((row) => row.kind === kind && row.status === "done");
    lines.push(`state: ${state.cancelled ? `cancelled (${state.cancelled})` : "booked"}; budget released: ${done("release_budget")}; flight cancelled: ${done("cancel_flight")}`);
  }
  const dead = store.deadLetters();
  const explained = dead.filter((row) =>
    store.load(parseWorkflow(row.command_id)).some((e) => e.kind === "command_failed" && e.payload.command_id === row.command_id),
  );
  lines.push("", `pending: ${store.pending().length}`, `dead: ${dead.length} (unexplained: ${dead.length - explained.length})`);
  store.free();
  return lines;
}

function parseWorkflow(commandId) {
  return commandId.split(":").slice(0, -2).join(":");
}
