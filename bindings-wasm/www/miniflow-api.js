// The playground's one door to miniflow's JS package: every call into ./pkg/miniflow.js and every
// field name of what crosses it lives here. The rest of the playground speaks camelCase objects of its
// own (below), so a change in the package's names is a change in this file only. The package takes
// camelCase inputs (`{ leaseTtlMs }`, `{ reportResult }`) and hands back miniflow's stored JSON,
// snake_case (`command_id`, `lease_expires_at`): only the way back is translated.
//
// Playground shapes:
//   Event    { workflowId, seq, kind, payload, recordedAt }   built-in payloads: { commandId, kind,
//            result, error, attempts } (command_completed / command_failed), { timerId, name, payload }
//            (timer_fired)
//   Row      { commandId, kind, payload, status, attempts, lastError, availableAt, result,
//            lease: { owner, expiresAt, token } | null }
//   Delivery { commandId, kind, payload, attempt, token, leaseExpiresAt }
//   Timer    { timerId, name, eventKind, fireAt, status }  (claimed timers keep the package's row for fire)
//   Decision { commands: [{ kind, payload, reportResult }], timers: [{ name, afterMs, payload }],
//            cancelTimers: [name], cancelKinds: [kind] }  or a list of commands
import init, { Engine, MemoryStore, parseCommandId as parse, timerWorkflowId } from "./pkg/miniflow.js";

/** Loads the WebAssembly module; call once before anything else. */
export const ready = () => init();

/** `object` without its `undefined` members: the package reads a missing field as its default. */
const defined = (object) => Object.fromEntries(Object.entries(object).filter(([, value]) => value !== undefined));

const event = (e) => ({
  workflowId: e.workflow_id,
  seq: e.seq,
  kind: e.kind,
  recordedAt: e.recorded_at,
  payload: builtInPayload(e.kind, e.payload),
});

function builtInPayload(kind, p) {
  switch (kind) {
    case "command_completed":
    case "command_failed":
    case "command_resolved":
      return { commandId: p.command_id, kind: p.kind, result: p.result, error: p.error, note: p.note, attempts: p.attempts };
    case "timer_fired":
      return { timerId: p.timer_id, name: p.name, payload: p.payload };
    default:
      return p;
  }
}

const row = (r) => ({
  commandId: r.command_id,
  kind: r.kind,
  payload: r.payload,
  status: r.status,
  attempts: r.attempts,
  lastError: r.last_error,
  availableAt: r.available_at,
  result: r.result,
  lease: r.lease && { owner: r.lease.owner, expiresAt: r.lease.expires_at, token: r.lease.token },
});

const delivery = (d) => ({
  commandId: d.command_id,
  kind: d.kind,
  payload: d.payload,
  attempt: d.attempt,
  token: d.token,
  leaseExpiresAt: d.lease_expires_at,
});

const timer = (t) => ({ timerId: t.timer_id, name: t.name, eventKind: t.event_kind, fireAt: t.fire_at, status: t.status });

function decision(d) {
  if (Array.isArray(d)) return d.map(command);
  return defined({
    commands: d.commands?.map(command),
    timers: d.timers?.map((t) => defined({ name: t.name, afterMs: t.afterMs, payload: t.payload })),
    cancelTimers: d.cancelTimers,
    cancelKinds: d.cancelKinds,
  });
}

const command = (c) => defined({ kind: c.kind, payload: c.payload, reportResult: c.reportResult });

const handled = (h) => h && { seq: h.seq, commandIds: h.command_ids, timerIds: h.timer_ids };

/** The parts of a command ID: `{ workflowId, eventSeq, index }`. */
export function parseCommandId(id) {
  const p = parse(id);
  return { workflowId: p.workflow_id, eventSeq: p.event_seq, index: p.index };
}

export { timerWorkflowId };

/** A MemoryStore behind playground names. `free()` releases its WebAssembly memory. */
export class Store {
  #inner;

  constructor(inner = new MemoryStore()) {
    this.#inner = inner;
  }

  /** A store from `snapshot()`'s text. */
  static fromSnapshot(text) {
    return new Store(MemoryStore.fromSnapshot(text));
  }

  snapshot() {
    return this.#inner.exportSnapshot();
  }

  free() {
    this.#inner.free();
  }

  events(workflowId) {
    return this.#inner.load(workflowId).map(event);
  }

  commands(workflowId) {
    return this.#inner.commands(workflowId).map(row);
  }

  timers(workflowId) {
    return this.#inner.timers(workflowId).map(timer);
  }

  pending() {
    return this.#inner.pending().map(row);
  }

  deadLetters() {
    return this.#inner.deadLetters().map(row);
  }

  /** Leases up to `limit` due commands to `worker` for `leaseTtlMs`. */
  claim({ worker, limit, leaseTtlMs }, now) {
    return this.#inner.claim(defined({ worker, limit, leaseTtlMs }), now).map(delivery);
  }

  complete(d, now) {
    this.#inner.complete(d.commandId, d.token, now);
  }

  /** Completes with a result that goes back to the workflow when the command asked for it. */
  completeWith(d, result, now) {
    this.#inner.completeWith(d.commandId, d.token, result, now);
  }

  /** Settles a failed delivery; returns `{ outcome: "retry_at", at } | { outcome: "dead" | "cancelled" }`. */
  fail(d, { error, retryable }, policy, now) {
    const p = policy && defined({
      initialDelayMs: policy.initialDelayMs,
      multiplier: policy.multiplier,
      maxDelayMs: policy.maxDelayMs,
      maxAttempts: policy.maxAttempts,
      jitter: policy.jitter,
    });
    return this.#inner.fail(d.commandId, d.token, { error, retryable }, p, now);
  }

  retry(commandId, now) {
    this.#inner.retry(commandId, now);
  }

  /** Takes up to `limit` due timers; pass each to `Workflow.fire`. */
  claimTimers(limit, leaseTtlMs, now) {
    return this.#inner.claimTimers(limit, leaseTtlMs, now).map((t) => ({ ...timer(t), raw: t }));
  }

  /** The package's store, for the engine. */
  get inner() {
    return this.#inner;
  }
}

/** A workflow `{ init, evolve, decide }` written against playground shapes, run by miniflow's engine. */
export class Workflow {
  #definition;
  #made;

  /** May be called before `ready()`: the engine is made on first use. */
  constructor({ init, evolve, decide }) {
    this.#definition = {
      init,
      evolve: (state, e) => evolve(state, event(e)),
      decide: (state, e) => decision(decide(state, event(e))),
    };
  }

  get #engine() {
    this.#made ??= new Engine(this.#definition);
    return this.#made;
  }

  /** Records `e` in `workflowId` with what `decide` answers, in one transaction. */
  handle(store, workflowId, e, now) {
    return handled(this.#engine.handle(store.inner, workflowId, e, now));
  }

  /** Fires a claimed timer; `null` when it was cancelled or fired elsewhere. */
  fire(store, claimed, now) {
    return handled(this.#engine.fire(store.inner, claimed.raw, now));
  }

  /** The workflow's state rebuilt from its events. */
  state(store, workflowId) {
    return this.#engine.replay(store.inner, workflowId).state;
  }
}
