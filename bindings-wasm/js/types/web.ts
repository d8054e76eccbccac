// Type test of the web build, as a page's module uses it: the module must be initialised with
// `await init()` (it fetches the .wasm beside the script) before anything else is called. Checked with
// the DOM library (tsconfig.web.json), as in a browser project.
import init, { MemoryStore, TIMER_FIRED, isMiniflowError, type Delivery } from "../../pkg/web/miniflow.js";

await init();
const store = new MemoryStore();
store.appendWithCommands("trip-001", 0, { kind: "trip_requested", payload: { city: "成都" } }, [{ kind: "lock_budget" }]);
const claimed: Delivery[] = store.claim({ worker: "page", limit: 10, leaseTtlMs: 30_000 });
try {
  store.complete(claimed[0].command_id, claimed[0].token + 1);
} catch (e) {
  if (isMiniflowError(e) && e.code === "STALE_LEASE") console.log(e.message);
}
const kind: "timer_fired" = TIMER_FIRED;
// @ts-expect-error claim requests name their fields in camelCase
store.claim({ worker: "page", lease_ttl_ms: 30_000 });
void kind;
