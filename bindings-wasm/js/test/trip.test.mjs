import test from "node:test";
import assert from "node:assert/strict";
import { miniflow, tripWorkflow } from "./miniflow.mjs";

const { MemoryStore, Engine } = miniflow;

test("the article's trip demo prints the same four lines as examples/trip.rs", () => {
  const store = new MemoryStore();
  const engine = new Engine(tripWorkflow);
  const supplier = { results: new Map(), sideEffects: 0 };
  const execute = (commandId) => {
    if (!supplier.results.has(commandId)) {
      supplier.sideEffects += 1;
      supplier.results.set(commandId, `REF-${supplier.sideEffects}`);
    }
    return supplier.results.get(commandId);
  };
  const lines = [];

  engine.handle(store, "trip-001", { kind: "trip_requested", payload: { city: "成都" } });
  const first = store.pending(1)[0];
  lines.push(`first delivery: ${execute(first.command_id)}`);
  // The process "crashes" before markDone; the state survives in a snapshot.
  const restarted = MemoryStore.fromSnapshot(store.exportSnapshot());
  const again = restarted.pending(1)[0];
  lines.push(`retry delivery: ${execute(again.command_id)}`);
  restarted.markDone(again.command_id);
  lines.push(`real side effects: ${supplier.sideEffects}`);
  lines.push(`pending: ${restarted.pending().length}`);

  assert.equal(lines.join("\n"), "first delivery: REF-1\nretry delivery: REF-1\nreal side effects: 1\npending: 0");
  assert.equal(first.command_id, "trip-001:1:0");
  assert.deepEqual(engine.replay(restarted, "trip-001"), { state: { city: "成都" }, last_seq: 1 });
});

test("a JS workflow decides commands, timers and rejections; a throwing workflow writes nothing", () => {
  const store = new MemoryStore();
  const engine = new Engine({
    init: () => 0,
    evolve: (seen) => seen + 1,
    decide: (seen, event) => {
      if (event.kind === "boom") throw new TypeError("decide exploded");
      if (event.kind === "timer_fired") return [{ kind: "remind", payload: event.payload }];
      if (seen >= 2) return { reject: "at most two events" };
      return {
        commands: [{ kind: "a", payload: { seen } }],
        timers: [{ name: "remind", afterMs: 1000, payload: { seen } }],
      };
    },
  });
  const handled = engine.handle(store, "w", { kind: "e" }, 0);
  assert.deepEqual(handled, { seq: 1, command_ids: ["w:1:0"], timer_ids: ["w:1:t0"], conflicts: 0 });
  assert.throws(() => engine.handle(store, "w", { kind: "boom" }, 0), (e) => e instanceof TypeError && e.message === "decide exploded");
  engine.handle(store, "w", { kind: "e" }, 0);
  assert.throws(() => engine.handle(store, "w", { kind: "e" }, 0), (e) => e.code === "REJECTED" && /at most two/.test(e.message));
  assert.equal(store.load("w").length, 2, "nothing of the thrown or rejected events was written");

  const due = store.claimTimers(10, 100, 1000);
  assert.deepEqual(due.map((t) => t.timer_id), ["w:1:t0", "w:2:t0"]);
  const fired = engine.fire(store, due[0], 1000);
  assert.equal(fired.seq, 3);
  assert.equal(engine.fire(store, due[0], 1001), null, "a timer fires once");
  assert.equal(store.load("w")[2].kind, "timer_fired");
});

test("start records a first event without reading, and refuses to start a workflow twice", () => {
  const store = new MemoryStore();
  const engine = new Engine({
    init: () => 0,
    evolve: (seen) => seen + 1,
    decide: (seen, event) => [{ kind: "reserve", payload: { seen, sku: event.payload.sku } }],
  });
  const started = engine.start(store, "order-7", { kind: "order_placed", payload: { sku: "A-1" } }, 5);
  assert.deepEqual(started, { seq: 1, command_ids: ["order-7:1:0"], timer_ids: [], conflicts: 0 });
  assert.throws(
    () => engine.start(store, "order-7", { kind: "order_placed", payload: { sku: "A-1" } }, 6),
    (e) => e instanceof Error && e.code === "CONFLICT" && /expected last seq 0, found 1/.test(e.message),
  );
  engine.handle(store, "order-7", { kind: "order_paid", payload: { sku: "A-1" } }, 7);
  assert.deepEqual(store.load("order-7").map((e) => e.kind), ["order_placed", "order_paid"]);
  assert.deepEqual(store.pending().map((row) => row.payload.seen), [0, 1], "the start decided from init()'s state");
});

