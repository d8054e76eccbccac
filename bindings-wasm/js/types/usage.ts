// Type tests of the generated declarations: what a TypeScript user writes must check, and what is
// wrong must not (each `@ts-expect-error` fails the check if its line compiles).
import {
  Engine,
  IdempotencyStore,
  MemoryStore,
  commandId,
  digest,
  parseCommandId,
  type Begin,
  type Delivery,
  type EventRecord,
  type Handled,
  type Json,
  type OutboxRow,
  type Settled,
  type TimerRow,
  type Workflow,
} from "../../pkg/nodejs/miniflow.js";

/** Fails to compile unless `A` and `B` are the same type (and neither is `any`). */
type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
function expectType<T extends true>(): void {}

interface Trip {
  city: string | null;
}

const trip: Workflow<Trip> = {
  init: () => ({ city: null }),
  evolve: (state, event) => (event.kind === "trip_requested" ? { city: String(event.payload) } : state),
  decide: (state, event) =>
    state.city === null ? [{ kind: "lock_budget", payload: { trip_id: event.workflow_id } }] : { commands: [] },
};

const store = new MemoryStore();
const engine = new Engine(trip);
const handled: Handled = engine.handle(store, "trip-001", { kind: "trip_requested", payload: { city: "成都" } }, Date.now());
const ids: string[] = handled.command_ids;

const rows: OutboxRow[] = store.pending(10);
const first: OutboxRow | null = store.command(ids[0]);
expectType<Equal<typeof first, OutboxRow | null>>();
expectType<Equal<OutboxRow["status"], "pending" | "leased" | "done" | "dead">>();
expectType<Equal<OutboxRow["payload"], Json>>();
expectType<Equal<OutboxRow["lease"], { owner: string; expires_at: number; token: number } | null>>();
const events: EventRecord[] = store.load("trip-001");
expectType<Equal<EventRecord["seq"], number>>();

const claimed: Delivery[] = store.claim({ worker: "w1", limit: 8, lease_ttl_ms: 30_000, order: "strict_per_workflow" });
const settled: Settled = store.fail(claimed[0].command_id, claimed[0].token, { error: "503", retryable: true }, { max_attempts: 5 });
if (settled.outcome === "retry_at") {
  const at: number = settled.at;
  void at;
}
store.complete(claimed[0].command_id, claimed[0].token);
const timers: TimerRow[] = store.claimTimers(10, 1_000);
const fired: Handled | null = engine.fire(store, timers[0]);

const receiver = new IdempotencyStore({ retention_ms: 7 * 86_400_000 });
const answer: Begin = receiver.begin("trip-001:1:0", digest({ flight: "CA1405" }, ["flight"]));
if (answer.outcome === "completed") {
  const result: Json = answer.result;
  void result;
} else if (answer.outcome === "fresh") {
  const token: number = answer.token;
  receiver.finish("trip-001:1:0", token, { reference: "BK-1" });
}
const parts = parseCommandId(commandId("trip-001", 1, 0));
expectType<Equal<typeof parts.event_seq, number>>();

// @ts-expect-error a workflow ID is a string
store.load(42);
// @ts-expect-error the event needs a kind
store.appendWithCommands("w", 0, { payload: {} }, []);
// @ts-expect-error claim orders are named
store.claim({ worker: "w", order: "random" });
// @ts-expect-error rows are not `any`: status is not a number
const wrong: number = rows[0].status;
// @ts-expect-error a failure says whether it is retryable
store.fail("w:1:0", 1, { error: "x" });
// @ts-expect-error decide must return a decision
const broken: Workflow<Trip> = { evolve: (s) => s, decide: () => 42 };

void [events, fired, wrong, broken];
