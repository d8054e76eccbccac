// The JS package's benchmark table: every workload on the wasm MemoryStore in Node, the plain-JS store
// (bench/plain-store.mjs) and the native MemoryStore (benches/memory.rs), each side in a process of its
// own, the sides taking turns three times and each keeping its best run, so a noisy moment of a shared
// machine does not decide a ratio. Run by scripts/bench-js after scripts/build-js; `--quick` for
// smaller sizes.
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";

const quick = process.argv.includes("--quick");
const root = fileURLToPath(new URL("../../..", import.meta.url));
const bench = fileURLToPath(new URL("./store.mjs", import.meta.url));
const sizes = quick
  ? { append: 20_000, drain: 20_000, "drain-strict": 20_000, claim: 50_000, memory: 20_000 }
  : { append: 200_000, drain: 100_000, "drain-strict": 100_000, claim: 50_000, memory: 100_000 };
const what = {
  append: "appends (1 event + 2 commands, new workflow each)",
  drain: `drain a backlog of ${sizes.drain.toLocaleString("en")} commands (claim 100, complete each)`,
  "drain-strict": "the same drain in strict per-workflow order",
  claim: `one claim of 100 from a backlog of ${sizes.claim.toLocaleString("en")}`,
};

function run(side, workload) {
  if (side === "native") {
    const args = ["bench", "-q", "--bench", "memory", "--", "--json", workload, ...(quick ? ["--quick"] : [])];
    return JSON.parse(execFileSync("cargo", args, { cwd: root, encoding: "utf8" }).trim().split("\n").pop());
  }
  const out = execFileSync(process.execPath, ["--expose-gc", bench, side, workload, String(sizes[workload])], { encoding: "utf8" });
  return JSON.parse(out.trim());
}

const sides = { append: ["wasm", "plain", "native"], drain: ["wasm", "plain", "native"], "drain-strict": ["wasm", "native"], claim: ["wasm", "plain", "native"] };
const best = {};
for (let round = 0; round < 3; round += 1) {
  for (const [workload, list] of Object.entries(sides)) {
    for (const side of list) {
      const result = run(side, workload);
      const key = `${workload}/${side}`;
      if (!best[key] || result.perSecond > best[key].perSecond) best[key] = result;
    }
  }
}
const memory = Object.fromEntries(["wasm", "plain", "native"].map((side) => [side, run(side, "memory")]));

const fmt = (n) => Math.round(n).toLocaleString("en");
const time = (r) => (r.workload === "claim" ? `${(1000 / r.perSecond).toFixed(2)} ms` : `${(1e6 / r.perSecond).toFixed(2)} µs`);
const cell = (r) => (r ? `${fmt(r.perSecond)}/s (${time(r)}, CPU ${r.cpuMicrosPerOp.toFixed(2)} µs)` : "—");
const ratio = (a, b) => (a && b ? `${(a.perSecond / b.perSecond).toFixed(2)}×` : "—");

console.log(`## miniflow's MemoryStore: wasm in Node (${process.version}) vs plain JS vs native\n`);
console.log("Each cell: operations per second of the best of 3 turns (each the best of 5 timed rounds after a warm-up), the time per operation, and the CPU time per operation.\n");
console.log("| workload | wasm in Node | plain JS | native | wasm / plain JS | wasm / native |");
console.log("|---|---:|---:|---:|---:|---:|");
for (const workload of Object.keys(sides)) {
  const [w, p, n] = ["wasm", "plain", "native"].map((side) => best[`${workload}/${side}`]);
  console.log(`| ${what[workload]} | ${cell(w)} | ${cell(p)} | ${cell(n)} | ${ratio(w, p)} | ${ratio(w, n)} |`);
}
const mb = (side) => (memory[side].bytes / 1e6) * (100_000 / memory[side].workflows);
console.log(
  `| resident memory per 100,000 workflows (1 event + 2 commands each) | ${mb("wasm").toFixed(0)} MB | ${mb("plain").toFixed(0)} MB | ${mb("native").toFixed(0)} MB | ${(mb("wasm") / mb("plain")).toFixed(2)}× | ${(mb("wasm") / mb("native")).toFixed(2)}× |`,
);
