// Appends per second into the WebAssembly MemoryStore from Node: one event with two commands per
// commit, each on a new workflow — the same work as benches/memory.rs does natively. Prints one table
// row; scripts/bench-js prints it beside the native row with the ratio. Best of 5 runs after a warm-up.
import { createRequire } from "node:module";

const { MemoryStore } = createRequire(import.meta.url)("../../pkg/nodejs/miniflow.js");
const commits = Number(process.argv[2] ?? 200_000);
const event = { kind: "trip_requested", payload: { city: "成都", travellers: 2 } };
const commands = [
  { kind: "lock_budget", payload: { trip_id: "t", amount: 1200 } },
  { kind: "book_flight", payload: { to: "成都", class: "economy" } },
];

function run(count) {
  const store = new MemoryStore();
  const start = process.hrtime.bigint();
  for (let n = 0; n < count; n += 1) store.appendWithCommands(`trip-${n}`, 0, event, commands, 1);
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  if (store.pending().length !== 2 * count) throw new Error("lost commands");
  store.free();
  return seconds;
}

run(20_000); // warm-up: let V8 tier the module up from its baseline compiler
let best = Infinity;
for (let round = 0; round < 5; round += 1) best = Math.min(best, run(commits));
console.log(`| wasm MemoryStore (Node ${process.version}) | ${commits} | ${Math.round(commits / best)} |`);
