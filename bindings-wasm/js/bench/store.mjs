// One side of the JS package's benchmark: `node --expose-gc bench/store.mjs <side> <workload> [size]`
// with side `wasm` (miniflow's MemoryStore, the Node build) or `plain` (bench/plain-store.mjs, the best
// plain-JS store written by hand). The same workload code drives both, and benches/memory.rs does the
// same work natively. Prints one JSON line: operations per second (best of 5 timed rounds after a
// warm-up) and CPU time per operation; for `memory`, the resident memory a store of `size` workflows
// holds. bench/report.mjs runs every side and prints the table.
import { createRequire } from "node:module";
import { PlainStore } from "./plain-store.mjs";

const [side, workload, sizeArg] = process.argv.slice(2);
const { MemoryStore } = createRequire(import.meta.url)("../../pkg/nodejs/miniflow.js");
const stores = { wasm: () => new MemoryStore(), plain: () => new PlainStore() };
if (!stores[side]) throw new Error(`side must be wasm or plain, not ${side}`);

const NOW = 1;
const event = { kind: "trip_requested", payload: { city: "成都", travellers: 2 } };
const commands = [
  { kind: "lock_budget", payload: { trip_id: "t", amount: 1200 } },
  { kind: "book_flight", payload: { to: "成都", class: "economy" } },
];

function fill(store, workflows) {
  for (let n = 0; n < workflows; n += 1) store.appendWithCommands(`trip-${n}`, 0, event, commands, NOW);
}

function drop(store) {
  if (typeof store.free === "function") store.free();
}

/** Claims batches of `limit` in `order` and completes each delivery until nothing is due. */
function drain(store, order, limit) {
  let done = 0;
  for (;;) {
    const batch = store.claim({ worker: "w1", limit, lease_ttl_ms: 30_000, order }, NOW);
    if (batch.length === 0) return done;
    for (const delivery of batch) store.complete(delivery.command_id, delivery.token, NOW);
    done += batch.length;
  }
}

/** Each workload: builds what it needs (untimed), then `timed()` does `ops` operations. */
const workloads = {
  append: (size = 200_000) => {
    let store;
    return {
      ops: size,
      before: () => (store = stores[side]()),
      timed: () => fill(store, size),
      after: () => drop(store),
    };
  },
  drain: (size = 100_000, order = "due_first") => {
    let store;
    return {
      ops: size,
      before: () => fill((store = stores[side]()), size / 2),
      timed: () => {
        const done = drain(store, order, 100);
        if (done !== size) throw new Error(`drained ${done} of ${size}`);
      },
      after: () => drop(store),
    };
  },
  "drain-strict": (size = 100_000) => workloads.drain(size, "strict_per_workflow"),
  claim: (size = 50_000) => {
    let store;
    const claims = 50;
    return {
      ops: claims,
      before: () => fill((store = stores[side]()), size / 2),
      timed: () => {
        for (let n = 0; n < claims; n += 1) {
          const batch = store.claim({ worker: "w1", limit: 100, lease_ttl_ms: 30_000 }, NOW);
          if (batch.length !== 100) throw new Error(`claimed ${batch.length}`);
        }
      },
      after: () => drop(store),
    };
  },
};

function measure(make, size) {
  const run = make(size);
  run.before();
  run.timed();
  run.after(); // warm-up: let V8 tier the code up
  let best = { seconds: Infinity };
  for (let round = 0; round < 5; round += 1) {
    run.before();
    const cpu = process.cpuUsage();
    const start = process.hrtime.bigint();
    run.timed();
    const seconds = Number(process.hrtime.bigint() - start) / 1e9;
    const used = process.cpuUsage(cpu);
    run.after();
    if (seconds < best.seconds) best = { seconds, cpuSeconds: (used.user + used.system) / 1e6 };
  }
  return {
    workload,
    side,
    ops: run.ops,
    perSecond: run.ops / best.seconds,
    cpuMicrosPerOp: (best.cpuSeconds * 1e6) / run.ops,
  };
}

/** Resident memory held by a store of `size` workflows (1 event + 2 commands each), in bytes. */
function memory(size = 100_000) {
  const settle = () => {
    for (let i = 0; i < 3; i += 1) globalThis.gc?.();
    return process.memoryUsage().rss;
  };
  const before = settle();
  const store = stores[side]();
  fill(store, size);
  const bytes = settle() - before;
  if (store.pending === undefined ? store.rows.size !== 2 * size : store.pending(1).length !== 1) throw new Error("lost commands");
  return { workload, side, workflows: size, bytes };
}

const size = sizeArg === undefined ? undefined : Number(sizeArg);
if (workload === "memory") console.log(JSON.stringify(memory(size)));
else if (workloads[workload]) console.log(JSON.stringify(measure(workloads[workload], size)));
else throw new Error(`unknown workload ${workload}: append, drain, drain-strict, claim or memory`);
