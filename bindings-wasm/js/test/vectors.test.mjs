import test from "node:test";
import assert from "node:assert/strict";
import { miniflow, vectors, throwsCode } from "./miniflow.mjs";

const { MemoryStore, commandId, parseCommandId, timerWorkflowId } = miniflow;

test("every valid command ID vector derives and parses", () => {
  for (const c of vectors.valid) {
    assert.equal(commandId(c.workflow_id, c.event_seq, c.index), c.command_id);
    assert.deepEqual(parseCommandId(c.command_id), { workflow_id: c.workflow_id, event_seq: c.event_seq, index: c.index });
  }
});

test("invalid workflow and command IDs are refused with INVALID_INPUT naming the value", () => {
  for (const c of vectors.invalid_workflow_ids) {
    throwsCode(assert, () => commandId(c.workflow_id, 1, 0), "INVALID_INPUT", "workflow_id");
    throwsCode(assert, () => new MemoryStore().load(c.workflow_id), "INVALID_INPUT");
  }
  for (const c of vectors.invalid_command_ids) {
    throwsCode(assert, () => parseCommandId(c.command_id), "INVALID_INPUT", c.command_id);
  }
});

test("pending order matches the ordering vector", () => {
  const store = new MemoryStore();
  const w = vectors.ordering.workflow_id;
  store.appendWithCommands(w, 0, { kind: "e" }, Array.from({ length: 12 }, () => ({ kind: "c" })), 0);
  store.appendWithCommands(w, 1, { kind: "e" }, [{ kind: "c" }], 0);
  assert.deepEqual(store.pending().map((r) => r.command_id), vectors.ordering.expected_pending_order);
});

test("timer ID vectors name their workflow; invalid ones are refused", () => {
  for (const c of vectors.timer_ids.valid) assert.equal(timerWorkflowId(c.timer_id), c.workflow_id);
  for (const c of vectors.timer_ids.invalid) throwsCode(assert, () => timerWorkflowId(c.timer_id), "INVALID_INPUT", c.timer_id);
});
