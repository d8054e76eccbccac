// The best plain-JS in-memory outbox written by hand, for the benchmark: what a careful JS developer
// would write instead of miniflow's wasm store, doing the same work — events per workflow with the seq
// check, one row per command with its derived ID, claims in due order then command order with leases
// and fencing tokens, token-checked acks. A Map of rows plus a binary heap of due keys (stale heap
// entries are skipped when popped), so neither appends nor claims scan. No validation, no retries,
// no timers, no snapshots: the raw core of the job, to measure what the library costs beside it.
export class PlainStore {
  events = new Map();
  rows = new Map();
  heap = [];

  appendWithCommands(workflowId, expectedSeq, event, commands, now) {
    const events = this.events.get(workflowId) ?? [];
    if (events.length !== expectedSeq) throw new Error(`conflict: expected ${expectedSeq}, found ${events.length}`);
    const seq = expectedSeq + 1;
    events.push({ workflow_id: workflowId, seq, kind: event.kind, payload: event.payload ?? null, recorded_at: now });
    this.events.set(workflowId, events);
    const commandIds = commands.map((command, index) => {
      const row = { workflowId, seq, index, command_id: `${workflowId}:${seq}:${index}`, kind: command.kind,
        payload: command.payload ?? null, status: "pending", attempts: 0, available_at: now, token: 0 };
      this.rows.set(row.command_id, row);
      this.push(now, row);
      return row.command_id;
    });
    return { seq, command_ids: commandIds };
  }

  claim({ worker, limit = 1, leaseTtlMs = 30_000 }, now) {
    const deliveries = [];
    while (deliveries.length < limit && this.heap.length > 0 && this.heap[0].at <= now) {
      const { at, row } = this.pop();
      if (row.available_at !== at || (row.status !== "pending" && row.status !== "leased")) continue;
      Object.assign(row, { status: "leased", attempts: row.attempts + 1, available_at: now + leaseTtlMs, token: row.token + 1, owner: worker });
      this.push(row.available_at, row);
      deliveries.push({ command_id: row.command_id, kind: row.kind, payload: row.payload, attempt: row.attempts, token: row.token, lease_expires_at: row.available_at });
    }
    return deliveries;
  }

  complete(commandId, token, now) {
    const row = this.rows.get(commandId);
    if (row === undefined) throw new Error(`unknown command ${commandId}`);
    if (row.status !== "leased" || row.token !== token) throw new Error(`stale lease on ${commandId}`);
    Object.assign(row, { status: "done", processed_at: now });
  }

  // A binary min-heap of { at, row } by (at, workflow ID, seq, index).
  static before(a, b) {
    if (a.at !== b.at) return a.at < b.at;
    if (a.row.workflowId !== b.row.workflowId) return a.row.workflowId < b.row.workflowId;
    return a.row.seq !== b.row.seq ? a.row.seq < b.row.seq : a.row.index < b.row.index;
  }

  push(at, row) {
    const heap = this.heap;
    let i = heap.push({ at, row }) - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (!PlainStore.before(heap[i], heap[parent])) break;
      [heap[i], heap[parent]] = [heap[parent], heap[i]];
      i = parent;
    }
  }

  pop() {
    const heap = this.heap;
    const top = heap[0];
    const last = heap.pop();
    if (heap.length > 0) {
      heap[0] = last;
      for (let i = 0; ; ) {
        const [l, r] = [2 * i + 1, 2 * i + 2];
        let min = i;
        if (l < heap.length && PlainStore.before(heap[l], heap[min])) min = l;
        if (r < heap.length && PlainStore.before(heap[r], heap[min])) min = r;
        if (min === i) break;
        [heap[i], heap[min]] = [heap[min], heap[i]];
        i = min;
      }
    }
    return top;
  }
}
