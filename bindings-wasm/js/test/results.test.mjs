// Results flow back (DESIGN rule 15) and decisions withdraw earlier commands (rule 16), through the
// JS API: report_result, completeWith, the command_completed event, cancel_commands and cancel_kinds.
import test from "node:test";
import assert from "node:assert/strict";
import { miniflow, throwsCode } from "./miniflow.mjs";

const { MemoryStore, Engine } = miniflow;

/** A trip that wants its flight reference back, and withdraws commands when it is cancelled. */
const tripWorkflow = {
  init: () => ({ reference: null, completed: [] }),
  evolve(trip, event) {
    if (event.kind !== "command_completed") return trip;
    const { command_id, kind, result } = event.payload;
    return {
      reference: kind === "book_flight" ? result.reference : trip.reference,
      completed: [...trip.completed, command_id],
    };
  },
  decide(trip, event) {
    switch (event.kind) {
      case "trip_requested":
        return {
          commands: [
            { kind: "book_flight", payload: { flight: "CA1405" }, reportResult: true },
            { kind: "book_hotel", payload: { city: "成都" } },
            { kind: "send_notice" },
          ],
        };
      case "trip_cancelled":
        return { cancelCommands: event.payload.ids ?? [], cancelKinds: event.payload.kinds ?? [] };
      default:
        return [];
    }
  },
};

/** Fires every due timer (the feedback of completions among them) at `now`; returns their IDs. */
function fireAll(store, engine, now) {
  return store
    .claimTimers(100, 1_000, now)
    .filter((timer) => engine.fire(store, timer, now) !== null)
    .map((timer) => timer.timer_id);
}

const worker = (name, limit = 10, leaseTtlMs = 100) => ({ worker: name, limit, leaseTtlMs });
const statuses = (store, workflow) => store.commands(workflow).map((row) => `${row.command_id} ${row.status}`);

test("completeWith on a command that asked for its result feeds exactly one command_completed event back", () => {
  const store = new MemoryStore();
  const engine = new Engine(tripWorkflow);
  engine.handle(store, "trip-001", { kind: "trip_requested" }, 0);
  assert.equal(store.command("trip-001:1:0").report_result, true);
  assert.equal(store.command("trip-001:1:1").report_result, false);
  const [flight, hotel, notice] = store.claim(worker("one"), 0);

  // The first lease runs out; a second worker delivers the flight and acks with the reference.
  const [again] = store.claim(worker("two", 1), 100);
  assert.equal(again.command_id, "trip-001:1:0");
  let before = store.exportSnapshot();
  throwsCode(assert, () => store.completeWith(flight.command_id, flight.token, { reference: "late" }, 101), "STALE_LEASE", "trip-001:1:0");
  assert.equal(store.exportSnapshot(), before, "a stale completion records nothing");
  store.completeWith(again.command_id, again.token, { reference: "CA1405-7Q" }, 150);
  before = store.exportSnapshot();
  throwsCode(assert, () => store.completeWith(again.command_id, again.token, { reference: "twice" }, 160), "STALE_LEASE", "done, not leased");
  assert.equal(store.exportSnapshot(), before, "a repeated completion records nothing");

  // Plain commands keep what they were completed with, and feed nothing back.
  store.completeWith(hotel.command_id, hotel.token, { room: 7 }, 180);
  store.complete(notice.command_id, notice.token, 180);
  assert.deepEqual(
    store.commands("trip-001").map((row) => [row.command_id, row.status, row.result]),
    [["trip-001:1:0", "done", { reference: "CA1405-7Q" }], ["trip-001:1:1", "done", { room: 7 }], ["trip-001:1:2", "done", null]],
  );
  assert.deepEqual(
    store.timers("trip-001").map((t) => `${t.timer_id} ${t.event_kind} ${t.status}`),
    ["trip-001:1:0:completed command_completed scheduled"],
  );

  assert.deepEqual(fireAll(store, engine, 200), ["trip-001:1:0:completed"]);
  assert.deepEqual(fireAll(store, engine, 300), [], "exactly once");
  const events = store.load("trip-001");
  assert.equal(events.length, 2);
  assert.equal(events[1].kind, "command_completed");
  assert.deepEqual(events[1].payload, { command_id: "trip-001:1:0", kind: "book_flight", result: { reference: "CA1405-7Q" }, attempts: 2 });
  assert.deepEqual(engine.replay(store, "trip-001"), { state: { reference: "CA1405-7Q", completed: ["trip-001:1:0"] }, last_seq: 2 });
});

test("complete without a result still reports a command that asked for it, with result null", () => {
  const store = new MemoryStore();
  const engine = new Engine(tripWorkflow);
  engine.handle(store, "trip-001", { kind: "trip_requested" }, 0);
  const [flight] = store.claim(worker("one", 1), 0);
  store.complete(flight.command_id, flight.token, 10);
  assert.deepEqual(fireAll(store, engine, 10), ["trip-001:1:0:completed"]);
  assert.deepEqual(store.load("trip-001")[1].payload, { command_id: "trip-001:1:0", kind: "book_flight", result: null, attempts: 1 });
});

test("a result past the JSON limits is INVALID_INPUT; the command stays leased and nothing is fed back", () => {
  const nest = (levels) => { let v = 1; for (let i = 0; i < levels; i++) v = [v]; return v; };
  const store = new MemoryStore();
  new Engine(tripWorkflow).handle(store, "trip-001", { kind: "trip_requested" }, 0);
  const [flight] = store.claim(worker("one", 1, 1_000), 0);
  const before = store.exportSnapshot();
  throwsCode(assert, () => store.completeWith(flight.command_id, flight.token, nest(65), 1), "INVALID_INPUT", "result");
  throwsCode(assert, () => store.completeWith(flight.command_id, flight.token, 10n, 1), "INVALID_INPUT", "result");
  assert.equal(store.exportSnapshot(), before);
  assert.equal(store.command(flight.command_id).status, "leased");
});

test("a decision withdraws unstarted commands by ID and by kind: they are cancelled and never claimed", () => {
  const store = new MemoryStore();
  const engine = new Engine(tripWorkflow);
  engine.handle(store, "trip-001", { kind: "trip_requested" }, 0);
  const handled = engine.handle(store, "trip-001", { kind: "trip_cancelled", payload: { ids: ["trip-001:1:2"], kinds: ["book_hotel"] } }, 10);
  assert.deepEqual(handled, { seq: 2, command_ids: [], timer_ids: [], conflicts: 0 });
  assert.deepEqual(statuses(store, "trip-001"), ["trip-001:1:0 pending", "trip-001:1:1 cancelled", "trip-001:1:2 cancelled"]);
  assert.equal(store.command("trip-001:1:1").processed_at, 10);
  assert.equal(store.command("trip-001:1:1").attempts, 0);
  assert.deepEqual(store.pending().map((row) => row.command_id), ["trip-001:1:0"]);
  assert.deepEqual(store.claim(worker("one"), 1_000_000).map((d) => d.command_id), ["trip-001:1:0"], "never delivered");
  throwsCode(assert, () => store.markDone("trip-001:1:1", 20), "INVALID_STATE", "trip-001:1:1");
  throwsCode(assert, () => store.retry("trip-001:1:1", 20), "INVALID_STATE", "trip-001:1:1");
  // Cancelling a finished command changes nothing.
  engine.handle(store, "trip-001", { kind: "trip_cancelled", payload: { ids: ["trip-001:1:1"] } }, 30);
  assert.equal(store.command("trip-001:1:1").processed_at, 10);
});

test("a leased command is told through extend, is not delivered again, and its real outcome is recorded", () => {
  const store = new MemoryStore();
  const engine = new Engine(tripWorkflow);
  engine.handle(store, "trip-001", { kind: "trip_requested" }, 0);
  const [flight, hotel, notice] = store.claim(worker("one", 10, 1_000), 0);
  engine.handle(store, "trip-001", { kind: "trip_cancelled", payload: { kinds: ["book_hotel", "send_notice"] } }, 10);

  const row = store.command(hotel.command_id);
  assert.equal(row.status, "leased");
  assert.equal(row.cancel_requested, true);
  assert.deepEqual(store.extend(hotel.command_id, hotel.token, 1_000, 20), { expires_at: 1_020, cancel_requested: true });
  assert.deepEqual(store.extend(flight.command_id, flight.token, 1_000, 20), { expires_at: 1_020, cancel_requested: false });

  // The hotel was booked anyway: the completion is recorded and fed back, though it did not ask.
  store.completeWith(hotel.command_id, hotel.token, { room: 7 }, 30);
  assert.equal(store.command(hotel.command_id).status, "done");
  // A retryable failure of a withdrawn command settles it cancelled instead of retrying it.
  assert.deepEqual(store.fail(notice.command_id, notice.token, { error: "503", retryable: true }, undefined, 30), { outcome: "cancelled" });
  store.completeWith(flight.command_id, flight.token, { reference: "CA1405-7Q" }, 40);
  assert.deepEqual(statuses(store, "trip-001"), ["trip-001:1:0 done", "trip-001:1:1 done", "trip-001:1:2 cancelled"]);

  assert.deepEqual(fireAll(store, engine, 50), ["trip-001:1:1:completed", "trip-001:1:0:completed"], "in the order they completed");
  const fedBack = store.load("trip-001").filter((e) => e.kind === "command_completed").map((e) => e.payload);
  assert.deepEqual(fedBack, [
    { command_id: "trip-001:1:1", kind: "book_hotel", result: { room: 7 }, attempts: 1 },
    { command_id: "trip-001:1:0", kind: "book_flight", result: { reference: "CA1405-7Q" }, attempts: 1 },
  ]);
  assert.deepEqual(store.claim(worker("two"), 1_000_000), [], "nothing is delivered again");
});

test("a withdrawn command whose lease runs out is cancelled, not redelivered", () => {
  const store = new MemoryStore();
  const engine = new Engine(tripWorkflow);
  engine.handle(store, "trip-001", { kind: "trip_requested" }, 0);
  store.claim(worker("one", 10, 100), 0);
  engine.handle(store, "trip-001", { kind: "trip_cancelled", payload: { kinds: ["book_hotel"] } }, 10);
  assert.deepEqual(store.claim(worker("two", 10, 100), 500).map((d) => d.command_id), ["trip-001:1:0", "trip-001:1:2"]);
  assert.equal(store.command("trip-001:1:1").status, "cancelled");
});

test("a decision that cancels another workflow's command, or names no command, is INVALID_INPUT and writes nothing", () => {
  const store = new MemoryStore();
  const engine = new Engine(tripWorkflow);
  engine.handle(store, "trip-001", { kind: "trip_requested" }, 0);
  engine.handle(store, "trip-002", { kind: "trip_requested" }, 0);
  const before = store.exportSnapshot();
  const cancel = (payload) => () => engine.handle(store, "trip-002", { kind: "trip_cancelled", payload }, 10);
  throwsCode(assert, cancel({ ids: ["trip-001:1:1"] }), "INVALID_INPUT", "belongs to workflow trip-001");
  throwsCode(assert, cancel({ ids: ["not a command id"] }), "INVALID_INPUT", "not a command id");
  throwsCode(assert, cancel({ kinds: [""] }), "INVALID_INPUT", "cancel_commands_of_kind");
  assert.equal(store.exportSnapshot(), before, "nothing was written");
  assert.equal(store.command("trip-001:1:1").status, "pending");
});

test("snapshots keep results, report_result, cancel_requested and the cancelled status", () => {
  const store = new MemoryStore();
  const engine = new Engine(tripWorkflow);
  engine.handle(store, "trip-001", { kind: "trip_requested" }, 0);
  engine.handle(store, "trip-002", { kind: "trip_requested" }, 0);
  const [flight, hotel] = store.claim(worker("one", 2, 1_000), 0);
  store.completeWith(flight.command_id, flight.token, { reference: "CA1405-7Q" }, 10);
  engine.handle(store, "trip-001", { kind: "trip_cancelled", payload: { kinds: ["book_hotel", "send_notice"] } }, 20);

  const copy = MemoryStore.fromSnapshot(store.exportSnapshot());
  assert.equal(copy.exportSnapshot(), store.exportSnapshot());
  for (const trip of ["trip-001", "trip-002"]) {
    assert.deepEqual(copy.commands(trip), store.commands(trip));
    assert.deepEqual(copy.timers(trip), store.timers(trip));
    assert.deepEqual(copy.load(trip), store.load(trip));
  }
  const rows = copy.commands("trip-001");
  assert.deepEqual(rows.map((r) => [r.status, r.report_result, r.result, r.cancel_requested]), [
    ["done", true, { reference: "CA1405-7Q" }, false],
    ["leased", false, null, true],
    ["cancelled", false, null, false],
  ]);
  // The restored store carries on: the holder learns of the cancel, the feedback fires once.
  assert.equal(copy.extend(hotel.command_id, hotel.token, 1_000, 30).cancel_requested, true);
  assert.deepEqual(fireAll(copy, engine, 40), ["trip-001:1:0:completed"]);
  assert.equal(engine.replay(copy, "trip-001").state.reference, "CA1405-7Q");
});

test("the README's example: the flight reference comes back and cancel_flight carries it; the hotel is withdrawn", () => {
  const saga = {
    init: () => ({ flight: null }),
    evolve: (state, event) =>
      event.kind === "command_completed" && event.payload.kind === "book_flight" ? { flight: event.payload.result.reference } : state,
    decide: (state, event) => {
      switch (event.kind) {
        case "trip_requested":
          return [
            { kind: "book_flight", payload: { city: event.payload.city }, reportResult: true },
            { kind: "book_hotel", payload: { city: event.payload.city } },
          ];
        case "trip_cancelled":
          return {
            cancelKinds: ["book_hotel"],
            commands: state.flight ? [{ kind: "cancel_flight", payload: { reference: state.flight } }] : [],
          };
        default:
          return [];
      }
    },
  };
  const store = new MemoryStore();
  const engine = new Engine(saga);
  engine.handle(store, "trip-001", { kind: "trip_requested", payload: { city: "成都" } });
  const [flight] = store.claim({ worker: "w1", limit: 1, leaseTtlMs: 30_000 });
  store.completeWith(flight.command_id, flight.token, { reference: "CA1405-7Q" });
  for (const timer of store.claimTimers(10, 30_000)) engine.fire(store, timer);
  engine.handle(store, "trip-001", { kind: "trip_cancelled", payload: null });
  assert.equal(store.command("trip-001:1:1").status, "cancelled");
  assert.deepEqual(store.commands("trip-001").map((row) => [row.kind, row.status, row.payload]), [
    ["book_flight", "done", { city: "成都" }],
    ["book_hotel", "cancelled", { city: "成都" }],
    ["cancel_flight", "pending", { reference: "CA1405-7Q" }],
  ]);
});
