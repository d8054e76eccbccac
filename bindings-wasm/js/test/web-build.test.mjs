// The web build, loaded in Node from its files: it has no cron schedules and no receiver's side
// (built without the `cron` and `receiver` features, to stay small), so a cron schedule throws
// INVALID_INPUT naming the feature and nothing is written, while everyMs schedules fire as in the
// Node.js build; `IdempotencyStore` and `digest` throw INVALID_INPUT naming theirs.
import test from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

const pkg = new URL("../../pkg/web/", import.meta.url);
const web = await import(new URL("miniflow.js", pkg));
web.initSync({ module: readFileSync(new URL("miniflow_bg.wasm", pkg)) });

const T0 = 1_700_000_000_000;
const workflow = {
  init: () => null,
  evolve: (state) => state,
  decide: (_, event) => (event.kind === "start" ? { schedules: [{ name: "tick", ...event.payload }] } : []),
};

test("the web build refuses a cron schedule naming the missing feature; everyMs schedules fire", () => {
  const store = new web.MemoryStore();
  const engine = new web.Engine(workflow);
  assert.throws(
    () => engine.handle(store, "daily", { kind: "start", payload: { cron: "0 9 * * *" } }, T0),
    (error) => {
      assert.ok(web.isMiniflowError(error), String(error));
      assert.equal(error.code, "INVALID_INPUT");
      assert.match(error.message, /`cron` feature/);
      return true;
    },
  );
  assert.deepEqual(store.load("daily"), []);

  engine.handle(store, "meter", { kind: "start", payload: { everyMs: 60_000 } }, T0);
  const [due] = store.claimTimers(10, 100, T0 + 60_000);
  engine.fire(store, due, T0 + 60_000);
  const fired = store.load("meter").filter((event) => event.kind === "schedule_fired");
  assert.deepEqual(fired.map((event) => event.payload.next_at), [T0 + 120_000]);
});

test("the web build refuses the receiver's side naming the missing feature", () => {
  const refusesNaming = (name) => (error) => {
    assert.ok(web.isMiniflowError(error), String(error));
    assert.equal(error.code, "INVALID_INPUT");
    assert.match(error.message, new RegExp(`invalid ${name}: .*\`receiver\` feature`));
    return true;
  };
  assert.throws(() => new web.IdempotencyStore(), refusesNaming("IdempotencyStore"));
  assert.throws(() => new web.IdempotencyStore({ retentionMs: 60_000 }), refusesNaming("IdempotencyStore"));
  assert.throws(() => web.digest({ flight: "CA1405" }), refusesNaming("digest"));
  assert.throws(() => web.digest({ flight: "CA1405" }, ["flight"]), refusesNaming("digest"));
  // The rest of the web build is whole: a store and an engine work after the refusals.
  const store = new web.MemoryStore();
  new web.Engine(workflow).handle(store, "meter", { kind: "start", payload: { everyMs: 60_000 } }, T0);
  assert.equal(store.load("meter").length, 1);
});
