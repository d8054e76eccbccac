import test from "node:test";
import assert from "node:assert/strict";
import { miniflow } from "./miniflow.mjs";

const { MemoryStore, Engine } = miniflow;

/** A workflow that counts its events, and how often its `evolve` ran. */
function counting() {
  const calls = { evolve: 0, failEvolve: false };
  const workflow = {
    init: () => ({ seen: 0 }),
    evolve: (state, _event) => {
      calls.evolve += 1;
      if (calls.failEvolve) throw new Error("evolve broke");
      return { seen: state.seen + 1 };
    },
    decide: (state, _event) => [{ kind: "count", payload: { seen: state.seen } }],
  };
  return { calls, workflow };
}

test("the engine keeps each workflow's state: n events cost about n evolves, not n²/2", () => {
  const { calls, workflow } = counting();
  const store = new MemoryStore();
  const engine = new Engine(workflow);
  const n = 300;
  for (let i = 0; i < n; i += 1) engine.handle(store, "long", { kind: "tick", payload: { i } });
  assert.ok(calls.evolve < 2 * n, `${calls.evolve} evolves for ${n} events`);
  // Every decision was made on the state replay from the first event gives.
  const commands = store.commands("long");
  assert.equal(commands.length, n);
  commands.forEach((row, i) => assert.deepEqual(row.payload, { seen: i }));
  assert.deepEqual(engine.replay(store, "long"), { state: { seen: n }, last_seq: n });
});

test("a state folded while a callback threw is not kept; a new store starts from its own events", () => {
  const { calls, workflow } = counting();
  const store = new MemoryStore();
  const engine = new Engine(workflow);
  for (let i = 0; i < 3; i += 1) engine.handle(store, "w", { kind: "tick", payload: {} });
  calls.failEvolve = true;
  assert.throws(() => engine.handle(store, "w", { kind: "tick", payload: {} }), /evolve broke/);
  calls.failEvolve = false;
  engine.handle(store, "w", { kind: "tick", payload: {} });
  assert.deepEqual(store.commands("w").map((row) => row.payload.seen), [0, 1, 2, 3]);

  // The same workflow ID in another store: its own history, not the first store's state.
  const other = new MemoryStore();
  engine.handle(other, "w", { kind: "tick", payload: {} });
  engine.handle(other, "w", { kind: "tick", payload: {} });
  assert.deepEqual(other.commands("w").map((row) => row.payload.seen), [0, 1]);
});
