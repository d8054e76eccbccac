// Recurring schedules through the JS API: everyMs and cron schedules in a decision, one
// schedule_fired event per occurrence, the next armed in the same commit, the missed-occurrence
// policy (onMissed), cancelSchedules, and bad schedules thrown as INVALID_INPUT before anything is written.
import test from "node:test";
import assert from "node:assert/strict";
import { miniflow, throwsCode } from "./miniflow.mjs";

const { MemoryStore, Engine } = miniflow;

const T0 = 1_700_000_000_000;

/** A meter read on the schedule `start` gives it, until `stop`. */
const meterWorkflow = {
  decide(_state, event) {
    switch (event.kind) {
      case "start":
        return { schedules: [{ name: "reading", payload: { unit: "kWh" }, ...event.payload }] };
      case "stop":
        return { cancelSchedules: ["reading"] };
      case "schedule_fired": {
        const { scheduled_at, missed } = event.payload;
        return [{ kind: "read", payload: { scheduled_at, missed } }];
      }
      default:
        return [];
    }
  },
  evolve: (state) => state,
};

/** Fires every due timer at `now`, again until none is due; returns how many fired. */
function fireDue(store, engine, now) {
  let fired = 0;
  for (;;) {
    const due = store.claimTimers(10, 100, now);
    if (due.length === 0) return fired;
    fired += due.filter((timer) => engine.fire(store, timer, now) !== null).length;
  }
}

const occurrences = (store, workflow) =>
  store
    .load(workflow)
    .filter((event) => event.kind === "schedule_fired")
    .map(({ payload }) => [payload.scheduled_at - T0, payload.missed, payload.next_at === null ? null : payload.next_at - T0]);

test("an everyMs schedule fires each occurrence once and arms the next in the same commit", () => {
  const store = new MemoryStore();
  const engine = new Engine(meterWorkflow);
  const started = engine.handle(store, "meter-7", { kind: "start", payload: { everyMs: 60_000 } }, T0);
  assert.deepEqual(started.timer_ids, [`meter-7:1:s0@${T0 + 60_000}`]);
  assert.equal(fireDue(store, engine, T0 + 59_999), 0);
  const [due] = store.claimTimers(10, 100, T0 + 60_000);
  const fired = engine.fire(store, due, T0 + 60_000);
  assert.deepEqual(fired.timer_ids, [`meter-7:1:s0@${T0 + 120_000}`]);
  assert.equal(engine.fire(store, due, T0 + 60_001), null, "an occurrence fires once");
  assert.deepEqual(store.load("meter-7")[1].payload, {
    timer_id: `meter-7:1:s0@${T0 + 60_000}`,
    name: "reading",
    payload: { unit: "kWh" },
    scheduled_at: T0 + 60_000,
    missed: 0,
    next_at: T0 + 120_000,
    recurrence: { every_ms: 60_000 },
    on_missed: "fire_once",
  });
  // Down for ten minutes: one event for the latest occurrence, counting the nine before it.
  assert.equal(fireDue(store, engine, T0 + 690_000), 1);
  assert.deepEqual(occurrences(store, "meter-7"), [[60_000, 0, 120_000], [660_000, 9, 720_000]]);
  assert.deepEqual(store.pending(10).map((row) => row.kind), ["read", "read"]);

  engine.handle(store, "meter-7", { kind: "stop" }, T0 + 700_000);
  assert.equal(fireDue(store, engine, T0 + 3_600_000), 0, "stopped");
  assert.deepEqual(
    store.timers("meter-7").map((t) => t.status),
    ["fired", "fired", "cancelled"],
  );
});

test("a cron schedule fires at its matches in UTC; fire_all catches up one event per occurrence", () => {
  const store = new MemoryStore();
  const engine = new Engine(meterWorkflow);
  // T0 is 2023-11-14T22:13:20Z; every day at 09:00 UTC, catching up at most 2 missed days.
  const nineOClock = Date.UTC(2023, 10, 15, 9, 0, 0);
  const day = 86_400_000;
  const payload = { cron: "0 9 * * *", onMissed: { fire_all: { max: 2 } } };
  const started = engine.handle(store, "daily", { kind: "start", payload }, T0);
  assert.deepEqual(started.timer_ids, [`daily:1:s0@${nineOClock}`]);
  assert.equal(fireDue(store, engine, nineOClock + 3 * day + 1), 2);
  assert.deepEqual(occurrences(store, "daily"), [
    [nineOClock + 2 * day - T0, 2, nineOClock + 3 * day - T0],
    [nineOClock + 3 * day - T0, 0, nineOClock + 4 * day - T0],
  ]);
});

test("bad schedules throw INVALID_INPUT naming the value, and nothing is written", () => {
  const store = new MemoryStore();
  const engine = new Engine(meterWorkflow);
  const start = (payload) => () => engine.handle(store, "bad", { kind: "start", payload }, T0);
  throwsCode(assert, start({ everyMs: 0 }), "INVALID_INPUT", "0ns");
  throwsCode(assert, start({ everyMs: 999 }), "INVALID_INPUT", "999ms");
  throwsCode(assert, start({ cron: "61 * * * *" }), "INVALID_INPUT", "61 * * * *");
  throwsCode(assert, start({ everyMs: 1_000, onMissed: { fire_all: { max: 0 } } }), "INVALID_INPUT", "max: 0");
  throwsCode(assert, start({ everyMs: 1_000, cron: "@daily" }), "INVALID_INPUT", "exactly one of everyMs and cron");
  throwsCode(assert, start({}), "INVALID_INPUT", "exactly one of everyMs and cron");
  throwsCode(assert, start({ every_ms: 1_000 }), "INVALID_INPUT", "its name is `everyMs`");
  throwsCode(assert, start({ everyMs: 1_000, on_missed: "fire_once" }), "INVALID_INPUT", "its name is `onMissed`");
  throwsCode(assert, start({ everyMs: 1_000, onMissed: "fire_twice" }), "INVALID_INPUT", '"fire_twice"');
  throwsCode(assert, start({ everyMs: 1_000, onMissed: { fire_all: {} } }), "INVALID_INPUT", "fire_all.max");
  throwsCode(assert, start({ everyMs: 1.5 }), "INVALID_INPUT", "everyMs");
  assert.deepEqual(store.load("bad"), []);
  assert.deepEqual(store.timers("bad"), []);
});
