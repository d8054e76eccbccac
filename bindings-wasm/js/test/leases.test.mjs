import test from "node:test";
import assert from "node:assert/strict";
import { miniflow, throwsCode } from "./miniflow.mjs";

const { MemoryStore, backoff, retryHorizon } = miniflow;
const policy = { initialDelayMs: 1000, multiplier: 2, maxDelayMs: 5000, maxAttempts: 3, jitter: 0 };

test("leases and retries follow the caller's clock", () => {
  const store = new MemoryStore();
  store.appendWithCommands("w", 0, { kind: "e" }, [{ kind: "flaky" }], 10_000);
  assert.equal(store.claim({ worker: "a" }, 9_999).length, 0, "not due before its commit time");
  let [d] = store.claim({ worker: "a", leaseTtlMs: 500 }, 10_000);
  assert.equal(d.attempt, 1);
  assert.deepEqual(store.extend(d.command_id, d.token, 2_000, 10_400), { expires_at: 12_400, cancel_requested: false });
  assert.deepEqual(store.extend(d.command_id, d.token, 100, 10_450), { expires_at: 12_400, cancel_requested: false }, "never shortened");
  assert.equal(store.claim({ worker: "b" }, 12_399).length, 0, "the extended lease holds");
  assert.deepEqual(store.fail(d.command_id, d.token, { error: "503", retryable: true }, policy, 10_500), {
    outcome: "retry_at",
    at: 11_500,
    backoff: 1_000,
  });
  assert.equal(store.claim({ worker: "a" }, 11_499).length, 0, "waits for its backoff");
  [d] = store.claim({ worker: "a" }, 11_500);
  assert.equal(store.fail(d.command_id, d.token, { error: "503", retryable: true }, policy, 11_600).backoff, 2_000);
  [d] = store.claim({ worker: "a" }, 13_600);
  assert.deepEqual(store.fail(d.command_id, d.token, { error: "still 503", retryable: true }, policy, 13_700), { outcome: "dead" });
  const [dead] = store.deadLetters();
  assert.equal(dead.status, "dead");
  assert.equal(dead.last_error, "still 503");
  assert.equal(dead.attempts, 3);
  const feedback = store.timers("w").find((t) => t.event_kind === "command_failed");
  assert.equal(feedback.timer_id, "w:1:0:failed1");
  store.retry(d.command_id, 20_000);
  assert.equal(store.command(d.command_id).manual_retries, 1);
  assert.equal(backoff(policy, "w:1:0", 2), 2_000);
  assert.equal(retryHorizon(policy, 500), 3 * 500 + 1_000 + 2_000);
});

test("a late ack after a takeover is STALE_LEASE; without a takeover it completes", () => {
  const store = new MemoryStore();
  store.appendWithCommands("w", 0, { kind: "e" }, [{ kind: "a" }, { kind: "b" }], 0);
  const [a, b] = store.claim({ worker: "one", limit: 2, leaseTtlMs: 100 }, 0);
  store.complete(a.command_id, a.token, 5_000);
  assert.equal(store.command(a.command_id).status, "done", "nobody took it over: the late ack counts");
  const [taken] = store.claim({ worker: "two", leaseTtlMs: 100 }, 200);
  assert.equal(taken.command_id, b.command_id);
  assert.ok(taken.token > b.token);
  throwsCode(assert, () => store.complete(b.command_id, b.token, 201), "STALE_LEASE");
  throwsCode(assert, () => store.extend(b.command_id, b.token, 100, 201), "STALE_LEASE");
  assert.equal(store.command(b.command_id).lease.owner, "two");
  store.complete(taken.command_id, taken.token, 202);
  assert.equal(store.pending().length, 0);
  assert.equal(store.purgeDone(1_000, 10_000), 2);
});
