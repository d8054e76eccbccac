// What the JS package takes in and how it refuses: numbers JSON cannot hold or JS does not hold
// exactly, camelCase names, defaults, the error codes and their type guard, calls back into a busy
// object, calls after free(), and the built-in event kinds.
import test from "node:test";
import assert from "node:assert/strict";
import { miniflow, throwsCode } from "./miniflow.mjs";

const { MemoryStore, Engine, IdempotencyStore, digest, isMiniflowError, errorCodes } = miniflow;
const { TIMER_FIRED, COMMAND_COMPLETED, COMMAND_FAILED, COMMAND_RESOLVED, SCHEDULE_FIRED } = miniflow;

function seeded() {
  const store = new MemoryStore();
  store.appendWithCommands("w", 0, { kind: "e", payload: { n: 1 } }, [{ kind: "a", reportResult: true }, { kind: "b" }], 0);
  return store;
}

const echo = (decision) => ({ init: () => null, evolve: (s) => s, decide: () => decision });

test("NaN, ±Infinity and numbers past 2^53 − 1 are INVALID_INPUT naming their field, in payloads and options alike", () => {
  const store = seeded();
  const [d] = store.claim({ worker: "w", leaseTtlMs: 1_000 }, 0);
  const before = store.exportSnapshot();
  const receiver = new IdempotencyStore();
  const cases = [
    [() => store.appendWithCommands("w", 1, { kind: "e", payload: { amount: NaN } }, [], 0), "event.payload.amount: is NaN"],
    [() => store.appendWithCommands("w", 1, { kind: "e" }, [{ kind: "a" }, { kind: "b", payload: { items: [1, 2, Infinity] } }], 0), "commands[1].payload.items[2]: is Infinity"],
    [() => store.appendWithCommands("w", 1, { kind: "e", payload: { id: 2 ** 53 } }, [], 0), "event.payload.id: is 9007199254740992, past ±(2^53 − 1)"],
    [() => store.appendWithCommands("w", 1, { kind: "e", payload: [-(2 ** 60)] }, [], 0), "event.payload[0]"],
    [() => store.appendWithCommands("w", 1, { kind: "e", payload: { "a b": -Infinity } }, [], 0), 'event.payload["a b"]: is -Infinity'],
    [() => store.claim({ worker: "w", leaseTtlMs: NaN }, 0), "request.leaseTtlMs: is NaN"],
    [() => store.claim({ worker: "w", leaseTtlMs: Infinity }, 0), "request.leaseTtlMs: is Infinity"],
    [() => store.claim({ worker: "w", limit: 2 ** 53 }, 0), "request.limit: 9007199254740992 is past 2^53 − 1"],
    [() => store.claim({ worker: "w", maxAttempts: 1.5 }, 0), "request.maxAttempts"],
    [() => store.fail(d.command_id, d.token, { error: "x", retryable: true }, { multiplier: NaN }, 0), "policy.multiplier: is NaN"],
    [() => store.fail(d.command_id, d.token, { error: "x", retryable: true }, { initialDelayMs: 2 ** 53 }, 0), "policy.initialDelayMs"],
    [() => store.completeWith(d.command_id, d.token, { total: NaN }, 0), "result.total: is NaN"],
    [() => store.extend(d.command_id, d.token, Infinity, 0), "leaseTtlMs"],
    [() => store.complete(d.command_id, d.token, NaN), "now"],
    [() => new Engine(echo({ timers: [{ name: "t", afterMs: NaN }] })).handle(store, "w", { kind: "e" }, 0), "decision.timers[0].afterMs: is NaN"],
    [() => new Engine(echo([{ kind: "a", payload: { x: Infinity } }])).handle(store, "w", { kind: "e" }, 0), "decision[0].payload.x: is Infinity"],
    [() => new IdempotencyStore({ retentionMs: NaN }), "policy.retentionMs: is NaN"],
    [() => digest({ amount: NaN }), "request.amount: is NaN"],
    [() => receiver.finish("k", 1, { at: Infinity }, 0), "result.at: is Infinity"],
  ];
  for (const [call, mentions] of cases) throwsCode(assert, call, "INVALID_INPUT", mentions);
  assert.equal(store.exportSnapshot(), before, "no refused call changed the store");
  store.appendWithCommands("w", 1, { kind: "e", payload: { max: 2 ** 53 - 1, min: -(2 ** 53 - 1), half: 0.5, zero: -0 } }, [], 0);
  assert.deepEqual(store.load("w")[1].payload, { max: 2 ** 53 - 1, min: -(2 ** 53 - 1), half: 0.5, zero: 0 });
});

test("inputs are camelCase; a snake_case field is refused with its camelCase name; absent fields take their defaults", () => {
  const store = seeded();
  throwsCode(assert, () => store.claim({ worker: "w", lease_ttl_ms: 5 }, 0), "INVALID_INPUT", "unknown field `lease_ttl_ms`; its name is `leaseTtlMs`");
  throwsCode(assert, () => store.appendWithCommands("x", 0, { kind: "e" }, [{ kind: "a", report_result: true }], 0), "INVALID_INPUT", "commands[0]: has an unknown field `report_result`; its name is `reportResult`");
  throwsCode(assert, () => new IdempotencyStore({ retention_ms: 1 }), "INVALID_INPUT", "`retentionMs`");
  throwsCode(assert, () => store.claim({ worker: "w", order: "random" }, 0), "INVALID_INPUT", 'request.order: is "random"');
  const [d] = store.claim({ worker: "w" }, 0);
  assert.equal(d.lease_expires_at, 30_000, "a 30 s lease by default");
  assert.equal(store.command("w:1:0").report_result, true, "reportResult was taken");
  const receiver = new IdempotencyStore();
  assert.deepEqual(receiver.begin("k", digest({ a: 1 }), 0), { outcome: "fresh", token: 1 });
  assert.equal(receiver.begin("k", digest({ a: 1 }), 59_999).outcome, "in_progress", "60 s reservations by default");
  assert.equal(receiver.begin("k", digest({ a: 1 }), 60_000).outcome, "fresh");
});

test("every error has a code from errorCodes(), and isMiniflowError tells miniflow's errors from others", () => {
  const store = seeded();
  const caught = [];
  const attempt = (fn) => {
    try {
      fn();
    } catch (e) {
      caught.push(e);
    }
  };
  attempt(() => store.appendWithCommands("w", 0, { kind: "late" }, [], 0));
  attempt(() => store.markDone("w:9:0"));
  attempt(() => store.load(42));
  attempt(() => store.resolve("w:1:0", "note", 0));
  assert.deepEqual(caught.map((e) => e.code), ["CONFLICT", "NOT_FOUND", "INVALID_INPUT", "INVALID_STATE"]);
  const codes = errorCodes();
  for (const error of caught) {
    assert.ok(isMiniflowError(error), error.message);
    assert.ok(codes.includes(error.code), error.code);
  }
  for (const code of ["REENTRANT_CALL", "USED_AFTER_FREE", "IN_PROGRESS", "IDEMPOTENCY_CONFLICT", "STALE_LEASE", "REJECTED"]) {
    assert.ok(codes.includes(code), code);
  }
  const foreign = Object.assign(new Error("x"), { code: "ENOENT" });
  for (const other of [new Error("plain"), foreign, { code: "CONFLICT", message: "not an Error" }, "CONFLICT", null, undefined]) {
    assert.equal(isMiniflowError(other), false, String(other));
  }
});

test("a call back into a store or engine from its workflow's callbacks is REENTRANT_CALL, and nothing is written", () => {
  const store = seeded();
  const other = new MemoryStore();
  const before = store.exportSnapshot();
  const peeking = new Engine({ init: () => 0, evolve: (n) => n + 1, decide: () => (store.pending(), []) });
  throwsCode(assert, () => peeking.handle(store, "w", { kind: "e" }, 0), "REENTRANT_CALL", "call it after that call returns");
  let engine;
  engine = new Engine({ init: () => 0, evolve: (n) => n + 1, decide: () => (engine.replay(other, "x"), []) });
  throwsCode(assert, () => engine.handle(store, "w", { kind: "e" }, 0), "REENTRANT_CALL", "this Engine is in use");
  assert.equal(store.exportSnapshot(), before);
  assert.equal(peeking.handle(other, "w", { kind: "e" }, 0).seq, 1, "both still work afterwards");
});

test("a call after free() is USED_AFTER_FREE, with a message in JS terms", () => {
  const store = seeded();
  store.free();
  throwsCode(assert, () => store.pending(), "USED_AFTER_FREE", "used after its free()");
  const engine = new Engine(echo([]));
  engine.free();
  throwsCode(assert, () => engine.handle(new MemoryStore(), "w", { kind: "e" }, 0), "USED_AFTER_FREE");
  const freed = new MemoryStore();
  freed.free();
  throwsCode(assert, () => new Engine(echo([])).handle(freed, "w", { kind: "e" }, 0), "USED_AFTER_FREE");
  // Refused before the call enters the module: however many times, nothing of the module is spent.
  const live = seeded();
  for (let i = 0; i < 50_000; i += 1) {
    throwsCode(assert, () => store.pending(), "USED_AFTER_FREE");
  }
  assert.equal(live.pending().length, 2, "other objects go on");
  assert.ok(live.exportSnapshot().length > 0);
});

test("an argument of the wrong class is INVALID_INPUT; free() from a callback frees the object once the call returns", () => {
  const engine = new Engine(echo([]));
  throwsCode(assert, () => engine.handle(undefined, "w", { kind: "e" }, 0), "INVALID_INPUT", "expected a MemoryStore here, got undefined");
  throwsCode(assert, () => engine.handle("w", new MemoryStore(), { kind: "e" }, 0), "INVALID_INPUT", "expected a MemoryStore here, got string");
  throwsCode(assert, () => engine.handle(new Engine(echo([])), "w", { kind: "e" }, 0), "INVALID_INPUT", "got Engine");
  const store = seeded();
  const freeing = new Engine({ evolve: (s) => s, decide: () => (store.free(), [{ kind: "a" }]) });
  assert.equal(freeing.handle(store, "x", { kind: "e" }, 0).command_ids[0], "x:1:0", "the call ran to its end");
  throwsCode(assert, () => store.pending(), "USED_AFTER_FREE");
  const other = seeded();
  assert.equal(other.pending().length, 2, "the module goes on");
});

test("the built-in event kinds are exported, and are the kinds of the events miniflow writes", () => {
  assert.deepEqual(
    [TIMER_FIRED, COMMAND_COMPLETED, COMMAND_FAILED, COMMAND_RESOLVED, SCHEDULE_FIRED],
    ["timer_fired", "command_completed", "command_failed", "command_resolved", "schedule_fired"],
  );
  const store = new MemoryStore();
  let step = 0;
  const engine = new Engine({
    init: () => null,
    evolve: (s) => s,
    decide: (_, event) =>
      event.kind === "start"
        ? { commands: [{ kind: "pay", reportResult: true }, { kind: "ship" }], timers: [{ name: "remind", afterMs: 10 }] }
        : [],
  });
  engine.handle(store, "w", { kind: "start" }, 0);
  const [pay, ship] = store.claim({ worker: "w", limit: 2 }, 0);
  store.completeWith(pay.command_id, pay.token, { paid: true }, 1);
  store.fail(ship.command_id, ship.token, { error: "no", retryable: false }, undefined, 1);
  store.resolve(ship.command_id, "shipped by hand", 2);
  for (const timer of store.claimTimers(10, 1_000, 20)) engine.fire(store, timer, 20 + step++);
  const kinds = store.load("w").map((e) => e.kind).slice(1).sort();
  assert.deepEqual(kinds, [COMMAND_COMPLETED, COMMAND_FAILED, COMMAND_RESOLVED, TIMER_FIRED].sort());
  throwsCode(assert, () => engine.fire(store, { timer_id: "w:1:t9" }, 30), "INVALID_INPUT", "not a timer of this store");
});

test("a snapshot with every kind of row reads back to the same text, and a damaged one names the field", () => {
  const store = new MemoryStore();
  const engine = new Engine({
    init: () => null,
    evolve: (s) => s,
    decide: (_, event) =>
      event.kind === "start"
        ? {
            commands: [{ kind: "pay", payload: { amount: 12.5, items: [1, { deep: [null, true, "文"] }] }, reportResult: true }, { kind: "ship" }, { kind: "mail" }, { kind: "undo" }],
            timers: [{ name: "remind", afterMs: 10 }, { name: "expire", at: 50_000, payload: { why: "late" } }, { name: "nudge", afterMs: 5 }],
            schedules: [{ name: "tick", everyMs: 60_000, payload: { n: 1 }, onMissed: { fire_all: { max: 3 } } }],
          }
        : event.kind === "stop"
          ? { cancelTimers: ["expire"], cancelKinds: ["undo"] }
          : event.kind === "timer_fired" && event.payload.name === "nudge"
            ? { reject: "not now" }
            : [],
  });
  engine.handle(store, "w:1", { kind: "start", payload: { at: new Date(0) } }, 0);
  const [pay, ship, mail] = store.claim({ worker: "w", limit: 3, leaseTtlMs: 100 }, 0);
  store.completeWith(pay.command_id, pay.token, { ok: 1 }, 1);
  store.fail(ship.command_id, ship.token, { error: "refused", retryable: false }, undefined, 1);
  store.resolve(ship.command_id, "by hand", 2);
  store.fail(mail.command_id, mail.token, { error: "503", retryable: true }, { initialDelayMs: 1_000 }, 2);
  engine.handle(store, "w:1", { kind: "stop" }, 3);
  for (const timer of store.claimTimers(10, 1_000, 20)) {
    try {
      engine.fire(store, timer, 20);
    } catch (e) {
      assert.equal(e.code, "REJECTED");
    }
  }
  const [again] = store.claim({ worker: "w2", leaseTtlMs: 100 }, 2_000);
  assert.equal(again.command_id, mail.command_id);
  const text = store.exportSnapshot();
  const statuses = store.commands("w:1").map((r) => r.status).sort();
  assert.deepEqual(statuses, ["cancelled", "done", "done", "leased"]);
  const timerStatuses = new Set(JSON.parse(text).timers.map((t) => t.status));
  for (const status of ["fired", "cancelled", "rejected"]) assert.ok(timerStatuses.has(status), `${status} in ${[...timerStatuses]}`);
  const copy = MemoryStore.fromSnapshot(text);
  assert.equal(copy.exportSnapshot(), text);
  assert.deepEqual(copy.load("w:1"), store.load("w:1"));
  const damaged = JSON.parse(text);
  damaged.outbox[1].status = "lost";
  throwsCode(assert, () => MemoryStore.fromSnapshot(JSON.stringify(damaged)), "INVALID_INPUT", "status");
  damaged.outbox[1].status = "done";
  damaged.outbox[1].attempts = -1;
  throwsCode(assert, () => MemoryStore.fromSnapshot(JSON.stringify(damaged)), "INVALID_INPUT", "snapshot.outbox[1].attempts");
  const gap = JSON.parse(text);
  gap.events[0].seq = 2;
  throwsCode(assert, () => MemoryStore.fromSnapshot(JSON.stringify(gap)), "INVALID_INPUT", "out of order");
});

test("snapshots keep priorities, trace contexts and the operators' controls (version 2); version 1 still reads", () => {
  const store = new MemoryStore();
  store.appendWithCommands("w", 0, { kind: "e" }, [{ kind: "mail" }, { kind: "page", priority: 7 }, { kind: "sms", priority: -2 }], 0);
  const text = JSON.parse(store.exportSnapshot());
  assert.equal(text.version, 2);
  assert.deepEqual(text.outbox.map((row) => row.priority), [0, 7, -2]);
  // What another host may have written: a trace context on a row, a paused kind, a limited kind.
  text.outbox[0].trace_context = { traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", tracestate: "k=v" };
  text.controls = [
    { kind: "page", paused: true, concurrency_limit: null, changed_by: "ops", changed_at: 1 },
    { kind: "sms", paused: false, concurrency_limit: 1, changed_by: "ops", changed_at: 2 },
  ];
  const written = JSON.stringify(text);
  const copy = MemoryStore.fromSnapshot(written);
  assert.equal(copy.exportSnapshot(), written);
  assert.deepEqual(copy.pending()[0].trace_context, text.outbox[0].trace_context);
  // The paused kind waits; the rest go by priority, the highest first.
  assert.deepEqual(copy.claim({ worker: "w", limit: 10 }, 5).map((d) => d.kind), ["mail", "sms"]);
  assert.deepEqual(store.claim({ worker: "w", limit: 10 }, 5).map((d) => d.kind), ["page", "mail", "sms"]);

  const bad = JSON.parse(written);
  bad.outbox[1].priority = 1.5;
  throwsCode(assert, () => MemoryStore.fromSnapshot(JSON.stringify(bad)), "INVALID_INPUT", "snapshot.outbox[1].priority");
  bad.outbox[1].priority = 7;
  bad.outbox[0].trace_context.traceparent = "00-nonsense";
  throwsCode(assert, () => MemoryStore.fromSnapshot(JSON.stringify(bad)), "INVALID_INPUT", "00-nonsense");

  const version1 = JSON.parse(store.exportSnapshot());
  version1.version = 1;
  delete version1.controls;
  for (const row of version1.outbox) delete row.priority;
  const old = MemoryStore.fromSnapshot(JSON.stringify(version1));
  assert.deepEqual(old.pending().map((row) => row.priority), [0, 0, 0]);
});

test("a command's priority is a whole number that fits 32 bits", () => {
  const store = new MemoryStore();
  for (const [priority, text] of [[1.5, "1.5"], [2 ** 31, "2147483648"], [NaN, "NaN"], ["high", "expected a number"]]) {
    throwsCode(assert, () => store.appendWithCommands("w", 0, { kind: "e" }, [{ kind: "a", priority }], 0), "INVALID_INPUT", text);
  }
  store.appendWithCommands("w", 0, { kind: "e" }, [{ kind: "a", priority: -(2 ** 31) }, { kind: "b", priority: 2 ** 31 - 1 }], 0);
  assert.deepEqual(store.claim({ worker: "w", limit: 2 }, 0).map((d) => d.kind), ["b", "a"]);
});
