// Strings that are not well-formed UTF-16 (a lone surrogate such as "\uD800") are refused, naming
// where they were, as every other bad input is: stored as U+FFFD they would make two different
// IDs or payloads one.
import test from "node:test";
import assert from "node:assert/strict";
import { miniflow, throwsCode } from "./miniflow.mjs";

const { MemoryStore, Engine, IdempotencyStore, digest } = miniflow;

const echo = (decision) => ({ init: () => null, evolve: (s) => s, decide: () => decision });

test("a lone surrogate in an ID, a kind, a payload or a key is INVALID_INPUT naming its path", () => {
  const store = new MemoryStore();
  store.appendWithCommands("w", 0, { kind: "e", payload: { n: 1 } }, [{ kind: "a" }], 0);
  const [d] = store.claim({ worker: "w", leaseTtlMs: 1_000 }, 0);
  const before = store.exportSnapshot();
  const receiver = new IdempotencyStore();
  const engine = new Engine(echo([]));
  const cases = [
    [() => store.appendWithCommands("probe:\uDC00", 0, { kind: "e" }, [], 0), "workflowId"],
    [() => engine.handle(store, "probe:\uD800", { kind: "e" }, 0), "workflowId"],
    [() => store.load("probe:\uDC00"), "workflowId"],
    [() => store.appendWithCommands("w", 1, { kind: "e\uD800" }, [], 0), "event.kind"],
    [() => store.appendWithCommands("w", 1, { kind: "e", payload: { items: [{}, {}, { name: "x\uDFFFy" }] } }, [], 0), "event.payload.items[2].name"],
    [() => store.appendWithCommands("w", 1, { kind: "e", payload: { ["k\uD800"]: 1 } }, [], 0), "event.payload"],
    [() => store.appendWithCommands("w", 1, { kind: "e" }, [{ kind: "a", payload: ["\uDBFF"] }], 0), "commands[0].payload[0]"],
    [() => store.completeWith(d.command_id, d.token, { note: "\uD83D" }, 0), "result.note"],
    [() => store.claim({ worker: "w\uDC00" }, 0), "request.worker"],
    [() => new Engine(echo([{ kind: "a", payload: { x: "\uD800" } }])).handle(store, "w", { kind: "e" }, 0), "decision[0].payload.x"],
    [() => digest({ name: "\uDC00" }), "request.name"],
    [() => receiver.begin("key\uD800", digest({}), 0), "key"],
  ];
  for (const [call, mentions] of cases) throwsCode(assert, call, "INVALID_INPUT", mentions);
  assert.equal(store.exportSnapshot(), before, "no refused call changed the store");
  // Well-formed text passes: U+FFFD itself, and a surrogate pair.
  store.appendWithCommands("probe:\uFFFD", 0, { kind: "e", payload: { emoji: "\uD83D\uDE00", r: "\uFFFD" } }, [], 0);
  assert.deepEqual(store.load("probe:\uFFFD")[0].payload, { emoji: "😀", r: "\uFFFD" });
});

test("a lone surrogate and U+FFFD no longer name one workflow or digest alike", () => {
  const store = new MemoryStore();
  store.appendWithCommands("probe:\uFFFD", 0, { kind: "e" }, [], 0);
  throwsCode(assert, () => store.load("probe:\uDC00"), "INVALID_INPUT", "workflowId");
  throwsCode(assert, () => digest({ a: "\uDC00" }), "INVALID_INPUT", "request.a");
  assert.equal(typeof digest({ a: "\uFFFD" }), "string");
});

test("a megabyte workflow ID is refused with a short message that names it", () => {
  const store = new MemoryStore();
  throwsCode(assert, () => store.appendWithCommands("x".repeat(1 << 20), 0, { kind: "e" }, [], 0), "INVALID_INPUT", "workflow_id");
  try {
    store.appendWithCommands("x".repeat(1 << 20), 0, { kind: "e" }, [], 0);
  } catch (error) {
    assert.ok(error.message.length < 400, `${error.message.length} characters`);
    assert.ok(error.message.includes("… (1048576 bytes)"), error.message.slice(0, 300));
  }
});
