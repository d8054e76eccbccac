import test from "node:test";
import assert from "node:assert/strict";
import { miniflow, throwsCode } from "./miniflow.mjs";

const { MemoryStore, Engine, IdempotencyStore, digest, checkRetention } = miniflow;

function seeded() {
  const store = new MemoryStore();
  store.appendWithCommands("w", 0, { kind: "e", payload: { n: 1 } }, [{ kind: "a" }, { kind: "b" }], 0);
  return store;
}

test("every failure is an Error with a stable code, and the store is unchanged and usable after it", () => {
  const store = seeded();
  const before = store.exportSnapshot();
  throwsCode(assert, () => store.appendWithCommands("w", 0, { kind: "late" }, [], 0), "CONFLICT", "expected last seq 0, found 1");
  throwsCode(assert, () => store.markDone("w:9:0"), "NOT_FOUND", "w:9:0");
  const [d] = store.claim({ worker: "a", leaseTtlMs: 100 }, 0);
  const taken = store.claim({ worker: "b", limit: 2, leaseTtlMs: 100 }, 100).find((t) => t.command_id === d.command_id);
  assert.ok(taken.token > d.token, "the expired lease was taken over");
  throwsCode(assert, () => store.complete(d.command_id, d.token, 101), "STALE_LEASE", d.command_id);
  throwsCode(assert, () => store.resolve("w:1:1", "oops", 0), "INVALID_STATE", "it is leased");
  store.complete(taken.command_id, taken.token, 102);
  assert.notEqual(store.exportSnapshot(), before, "still usable");
});

test("bad arguments are INVALID_INPUT errors, never a crash of the module", () => {
  const store = seeded();
  const before = store.exportSnapshot();
  const cases = [
    [() => store.load(42), "workflowId"],
    [() => store.load(undefined), "workflowId"],
    [() => store.appendWithCommands("w", "1", { kind: "e" }, [], 0), "expectedSeq"],
    [() => store.appendWithCommands("w", 1.5, { kind: "e" }, [], 0), "expectedSeq"],
    [() => store.appendWithCommands("w", 2 ** 53, { kind: "e" }, [], 0), "past 2^53"],
    [() => store.appendWithCommands("w", 1, { kind: "e" }, [], -5), "now"],
    [() => store.appendWithCommands("w", 1, { payload: {} }, [], 0), "event.kind: is missing"],
    [() => store.appendWithCommands("w", 1, { kind: "e", payload: 10n }, [], 0), "event.payload: is bigint, not JSON"],
    [() => store.appendWithCommands("w", 1, { kind: "e", extra: 1 }, [], 0), "unknown field `extra`"],
    [() => store.appendWithCommands("w", 1, { kind: "" }, [], 0), "event.kind"],
    [() => store.appendWithCommands("w", 1, () => 1, [], 0), "event: expected an object, got function"],
    [() => store.claim({ worker: "x", limit: -1 }, 0), "request.limit"],
    [() => store.claim({}, 0), "request.worker: is missing"],
    [() => store.complete("w:1:0", Number.NaN, 0), "token"],
    [() => store.fail("w:1:0", 1, { error: "x" }, undefined, 0), "retryable"],
    [() => store.fail("w:1:0", 1, { error: "x", retryable: true }, { maxDelayMs: 1, initialDelayMs: 5 }, 0), "initial_delay"],
    [() => MemoryStore.fromSnapshot("{}"), "snapshot"],
    [() => MemoryStore.fromSnapshot(17), "json"],
    [() => new Engine({ evolve: (s) => s }), "workflow.decide"],
    [() => new Engine(null), "workflow"],
    [() => digest({ a: 1 }, "a"), "fields"],
    [() => digest({ a: 1 }, []), "fields: select nothing of the request"],
    [() => digest({ traveller: "Li Lei" }, ["travellr"]), "fields: select nothing of the request"],
    [() => digest("a scalar", ["traveller"]), "fields: select nothing of the request"],
    [() => new IdempotencyStore().begin("k", "not-a-digest", 0), "digest"],
  ];
  for (const [call, mentions] of cases) throwsCode(assert, call, "INVALID_INPUT", mentions);
  const cycle = {};
  cycle.self = cycle;
  throwsCode(assert, () => store.appendWithCommands("w", 1, { kind: "e", payload: cycle }, [], 0), "INVALID_INPUT", "contains itself");
  assert.equal(store.exportSnapshot(), before, "no failed call changed the store");
  assert.equal(store.pending().length, 2);
});

test("snapshots round-trip and refuse newer or malformed versions", () => {
  const store = seeded();
  store.claim({ worker: "a", limit: 1 }, 5);
  const copy = MemoryStore.fromSnapshot(store.exportSnapshot());
  assert.deepEqual(copy.pending(), store.pending());
  assert.deepEqual(copy.load("w"), store.load("w"));
  const newer = JSON.stringify({ ...JSON.parse(store.exportSnapshot()), version: 99 });
  throwsCode(assert, () => MemoryStore.fromSnapshot(newer), "INVALID_INPUT", "newer than this miniflow reads");
  throwsCode(assert, () => MemoryStore.fromSnapshot("not json"), "INVALID_INPUT", "not a miniflow snapshot");
});

test("receivers fold repeats, refuse changed parameters, and check retention against the retry horizon", () => {
  const receiver = new IdempotencyStore({ retentionMs: 10_000, reservationTimeoutMs: 1_000 });
  const intent = ["traveller", "flight"];
  const d1 = digest({ traveller: "Li Lei", flight: "CA1405", sent_at: 1 }, intent);
  assert.equal(d1, digest({ flight: "CA1405", traveller: "Li Lei", sent_at: 2 }, intent));
  let effects = 0;
  const book = () => ({ reference: `BK-${++effects}` });
  assert.deepEqual(receiver.run("trip-001:1:0", d1, book, 0), { reference: "BK-1" });
  assert.deepEqual(receiver.run("trip-001:1:0", d1, book, 1), { reference: "BK-1" });
  assert.equal(effects, 1);
  const d2 = digest({ traveller: "Han Meimei", flight: "CA1405" }, intent);
  throwsCode(assert, () => receiver.run("trip-001:1:0", d2, book, 2), "IDEMPOTENCY_CONFLICT", "other parameters");
  assert.deepEqual(receiver.begin("k", d1, 0), { outcome: "fresh", token: 1 });
  assert.equal(receiver.begin("k", d1, 10).outcome, "in_progress");
  throwsCode(assert, () => receiver.run("k", d1, book, 10), "IN_PROGRESS");
  assert.equal(receiver.begin("k", d2, 10).outcome, "conflict");
  assert.throws(() => receiver.run("x", d1, () => { throw new RangeError("no seat"); }, 0), RangeError);
  assert.deepEqual(receiver.begin("x", d1, 0), { outcome: "fresh", token: 2 }, "a failed effect released its key");
  // An effect that ran but whose result cannot be stored (NaN, an async effect's Promise, past the
  // limits) is refused, and its key completed with null: a repeat does not run it again.
  for (const [n, result] of [[1, { total: NaN }], [2, Promise.resolve(1)], [3, "x".repeat(1 << 20)]]) {
    let effects = 0;
    const charge = () => { effects += 1; return result; };
    throwsCode(assert, () => receiver.run(`charge-${n}`, d1, charge, 0), "INVALID_INPUT", "result");
    assert.equal(receiver.run(`charge-${n}`, d1, charge, 1), null);
    assert.equal(effects, 1, `charge-${n} ran once`);
  }
  // A reservation taken over after its timeout fences the first holder off.
  const taken = receiver.begin("k", d1, 60_000);
  assert.equal(taken.outcome, "fresh");
  throwsCode(assert, () => receiver.finish("k", 1, { reference: "late" }, 60_001), "STALE_RESERVATION");
  throwsCode(assert, () => receiver.abandon("k", 1), "STALE_RESERVATION");
  assert.equal(receiver.begin("k", d1, 60_002).outcome, "in_progress", "the stale abandon released nothing");
  receiver.finish("k", taken.token, { reference: "BK-9" }, 60_003);
  assert.deepEqual(receiver.begin("k", d1, 60_004), { outcome: "completed", result: { reference: "BK-9" } });
  throwsCode(assert, () => new IdempotencyStore({ retentionMs: 10_000, reservationTimeoutMs: 60_000 }), "INVALID_INPUT");
  throwsCode(assert, () => checkRetention(60_000, { maxAttempts: 10 }, 30_000, 0), "RETENTION_TOO_SHORT");
  checkRetention(7 * 24 * 3600 * 1000, { maxAttempts: 10 }, 30_000, 24 * 3600 * 1000);
});

test("payloads past the nesting and size limits are INVALID_INPUT naming their path; the store is unchanged", () => {
  const nest = (levels) => { let v = 1; for (let i = 0; i < levels; i++) v = [v]; return v; };
  const store = seeded();
  const before = store.exportSnapshot();
  const cases = [
    [() => store.appendWithCommands("x", 0, { kind: "e", payload: nest(65) }, [], 0), "event.payload"],
    [() => store.appendWithCommands("x", 0, { kind: "e" }, [{ kind: "a" }, { kind: "b", payload: nest(65) }], 0), "commands[1].payload"],
    [() => store.appendWithCommands("x", 0, { kind: "e", payload: "x".repeat(1 << 20) }, [], 0), "event.payload"],
    [() => store.appendWithCommands("x", 0, { kind: "e", payload: nest(200) }, [], 0), "event"],
    [() => store.appendWithCommands("x", 0, { kind: "e", payload: nest(100_000) }, [], 0), "event"],
  ];
  for (const [call, path] of cases) throwsCode(assert, call, "INVALID_INPUT", path);
  assert.equal(store.exportSnapshot(), before);
  store.appendWithCommands("x", 0, { kind: "e", payload: nest(64) }, [{ kind: "a", payload: nest(64) }], 0);
  assert.deepEqual(MemoryStore.fromSnapshot(store.exportSnapshot()).load("x")[0].payload, nest(64));
});

test("a value that throws when read, or is no plain object, is INVALID_INPUT naming its path; the store and engine go on", () => {
  const store = seeded();
  const before = store.exportSnapshot();
  const revoked = Proxy.revocable({}, {});
  revoked.revoke();
  const throwingItem = [1, 2];
  Object.defineProperty(throwingItem, 1, { get() { throw new Error("item boom"); } });
  class Money { constructor() { this.amount = 5; } }
  const cases = [
    [{ get amount() { throw new Error("getter boom"); } }, "event.payload.amount: threw when read: getter boom"],
    [throwingItem, "event.payload[1]: threw when read: item boom"],
    [revoked.proxy, "event.payload: threw when read"],
    [new Proxy({}, { ownKeys() { throw new Error("keys boom"); } }), "event.payload: threw when read: keys boom"],
    [Promise.resolve(1), "event.payload: is no plain object"],
    [new Map([["a", 1]]), "event.payload: is no plain object"],
    [new Money(), "event.payload: is no plain object"],
    [{ nested: [new Set()] }, "event.payload.nested[0]: is no plain object"],
  ];
  for (const [payload, says] of cases) {
    throwsCode(assert, () => store.appendWithCommands("w", 1, { kind: "e", payload }, [], 0), "INVALID_INPUT", says);
  }
  assert.equal(store.exportSnapshot(), before, "nothing written");
  // Plain objects without a prototype, and objects with toJSON (dates), are JSON.
  store.appendWithCommands("w", 1, { kind: "e", payload: Object.assign(Object.create(null), { a: 1 }) }, [], 0);
  store.appendWithCommands("w", 2, { kind: "e", payload: { at: new Date(0) } }, [], 0);
  assert.equal(store.load("w")[2].payload.at, "1970-01-01T00:00:00.000Z");

  // An async decide fails the call and nothing else.
  const engine = new Engine({
    evolve: (s) => s,
    decide: (_s, event) =>
      event.kind === "async" ? Promise.resolve([{ kind: "lost" }])
        : [{ kind: "ok" }],
  });
  throwsCode(assert, () => engine.handle(store, "x", { kind: "async" }, 0), "INVALID_INPUT", "decision: is no plain object");
  assert.deepEqual(store.load("x"), [], "nothing written");
  assert.equal(engine.handle(store, "x", { kind: "fine" }, 1).command_ids[0], "x:1:0", "the engine and store go on");
  assert.ok(store.exportSnapshot().length > 0);
});

test("a workflow that throws while a timer fires leaves the timer to fire again; only its own reject rejects it", () => {
  const store = new MemoryStore();
  let broken = true;
  const engine = new Engine({
    evolve: (s) => s,
    decide: (_s, event) => {
      if (event.kind === "timer_fired" && broken) throw new Error("not deployed yet");
      return event.kind === "start" ? { timers: [{ name: "remind", afterMs: 0 }] } : [{ kind: "remind" }];
    },
  });
  engine.handle(store, "w", { kind: "start" }, 0);
  const [timer] = store.claimTimers(10, 1_000, 0);
  assert.throws(() => engine.fire(store, timer, 0), /not deployed yet/);
  assert.equal(store.timers("w")[0].status, "scheduled", "not rejected");
  assert.deepEqual(store.claimTimers(10, 1_000, 500), [], "leased until its lease runs out");
  broken = false;
  const [again] = store.claimTimers(10, 1_000, 1_000);
  assert.equal(engine.fire(store, again, 1_000).command_ids[0], "w:2:0");
  assert.equal(store.timers("w")[0].status, "fired");
});
