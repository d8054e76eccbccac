// Type tests of the generated declarations: what a TypeScript user writes must check, and what is
// wrong must not (each `@ts-expect-error` fails the check if its line compiles).
import {
  COMMAND_COMPLETED,
  COMMAND_FAILED,
  COMMAND_RESOLVED,
  Engine,
  IdempotencyStore,
  MemoryStore,
  TIMER_FIRED,
  commandId,
  digest,
  errorCodes,
  isMiniflowError,
  parseCommandId,
  type Begin,
  type BuiltInEvent,
  type BuiltInEventKind,
  type CommandCompleted,
  type CommandInput,
  type DecisionObject,
  type Delivery,
  type EventRecord,
  type Extended,
  type Handled,
  type Json,
  type MiniflowError,
  type MiniflowErrorCode,
  type OutboxRow,
  type Replayed,
  type ScheduleFired,
  type ScheduleInput,
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
const started: Handled = engine.start(store, "trip-002", { kind: "trip_requested", payload: { city: "成都" } });
const ids: string[] = [...handled.command_ids, ...started.command_ids];

const rows: OutboxRow[] = store.pending(10);
const first: OutboxRow | null = store.command(ids[0]);
expectType<Equal<typeof first, OutboxRow | null>>();
expectType<Equal<OutboxRow["status"], "pending" | "leased" | "done" | "dead" | "cancelled">>();
expectType<Equal<OutboxRow["result"], Json | null>>();
expectType<Equal<OutboxRow["report_result"] | OutboxRow["cancel_requested"], boolean>>();
expectType<Equal<OutboxRow["payload"], Json>>();
expectType<Equal<OutboxRow["lease"], { owner: string; expires_at: number; token: number } | null>>();
const events: EventRecord[] = store.load("trip-001");
expectType<Equal<EventRecord["seq"], number>>();
expectType<Equal<EventRecord["kind"], string>>();
expectType<Equal<EventRecord["payload"], Json>>();

const claimed: Delivery[] = store.claim({ worker: "w1", limit: 8, leaseTtlMs: 30_000, order: "strict_per_workflow" });
const settled: Settled = store.fail(claimed[0].command_id, claimed[0].token, { error: "503", retryable: true }, { maxAttempts: 5 });
if (settled.outcome === "retry_at") {
  const at: number = settled.at;
  void at;
}
expectType<Equal<Settled["outcome"], "retry_at" | "dead" | "cancelled">>();
const beat: Extended = store.extend(claimed[0].command_id, claimed[0].token, 30_000);
expectType<Equal<typeof beat, Extended>>();
if (!beat.cancel_requested) {
  const until: number = beat.expires_at;
  void until;
}
store.complete(claimed[0].command_id, claimed[0].token);
store.completeWith(claimed[1].command_id, claimed[1].token, { reference: "CA1405-7Q" }, Date.now());
const timers: TimerRow[] = store.claimTimers(10, 1_000);
const fired: Handled | null = engine.fire(store, timers[0]);

const receiver = new IdempotencyStore({ retentionMs: 7 * 86_400_000 });
const withDefaults = new IdempotencyStore();
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

// A workflow typed by its events: testing `event.kind` narrows `event.payload`, miniflow's own events
// included. The flight reference comes back through `command_completed`; a cancel withdraws the hotel.
type SagaEvent = { kind: "trip_requested"; payload: { city: string } } | { kind: "trip_cancelled"; payload: null } | BuiltInEvent;
interface Saga {
  flight: string | null;
}
const withdraw: DecisionObject = { cancelCommands: ["trip-001:1:1"], cancelKinds: ["book_hotel"] };
const saga: Workflow<Saga, SagaEvent> = {
  init: () => ({ flight: null }),
  evolve(state, event) {
    if (event.kind === "command_completed") {
      expectType<Equal<typeof event.payload, CommandCompleted>>();
      const { kind, result } = event.payload;
      if (kind === "book_flight" && typeof result === "object" && result !== null && !Array.isArray(result)) {
        return { flight: String(result.reference) };
      }
    } else if (event.kind === "command_failed") {
      expectType<Equal<typeof event.payload.error, string | null>>();
    } else if (event.kind === "timer_fired") {
      const name: string = event.payload.name;
      void name;
    } else if (event.kind === "schedule_fired") {
      expectType<Equal<typeof event.payload, ScheduleFired>>();
      expectType<Equal<typeof event.payload.next_at, number | null>>();
    }
    return state;
  },
  decide(state, event) {
    switch (event.kind) {
      case "trip_requested": {
        const book: CommandInput = { kind: "book_flight", payload: { city: event.payload.city }, reportResult: true };
        return [book, { kind: "book_hotel", payload: { city: event.payload.city } }];
      }
      case "trip_cancelled":
        return { ...withdraw, commands: state.flight === null ? [] : [{ kind: "cancel_flight", payload: { reference: state.flight } }] };
      default:
        return [];
    }
  },
};
const sagaEngine = new Engine(saga);
// handle and start take the workflow's own events, typed by kind.
sagaEngine.handle(store, "trip-001", { kind: "trip_requested", payload: { city: "成都" } });
sagaEngine.start(store, "trip-009", { kind: "trip_cancelled", payload: null });
// @ts-expect-error a kind the workflow does not have
sagaEngine.handle(store, "trip-001", { kind: "trip_requestd", payload: { city: "成都" } });
// @ts-expect-error the payload of its kind
sagaEngine.handle(store, "trip-001", { kind: "trip_requested", payload: { city: 5 } });
// @ts-expect-error miniflow's own events come from timers and feedback, not from handle
sagaEngine.handle(store, "trip-001", { kind: "timer_fired", payload: { timer_id: "t", name: "n", payload: null } });
const sagaEvents: EventRecord<SagaEvent>[] = store.load("trip-001") as EventRecord<SagaEvent>[];
expectType<Equal<BuiltInEventKind, "timer_fired" | "schedule_fired" | "command_completed" | "command_failed" | "command_resolved">>();

// Recurring schedules: every N milliseconds or a cron expression, stopped by name.
const everyMinute: ScheduleInput = { name: "reading", everyMs: 60_000, onMissed: { fire_all: { max: 5 } } };
const schedules: DecisionObject = { schedules: [everyMinute, { name: "invoice", cron: "0 9 1 * *" }], cancelSchedules: ["old"] };
void schedules;
// @ts-expect-error the missed-occurrence policies are named
const badPolicy: ScheduleInput = { name: "x", everyMs: 1_000, onMissed: "fire_twice" };
void badPolicy;
// @ts-expect-error schedules run everyMs, not every_ms
const oldSchedule: ScheduleInput = { name: "x", every_ms: 1_000 };
void oldSchedule;
// Claims take a higher priority first.
const urgent: DecisionObject = { commands: [{ kind: "page_on_call", priority: 10 }] };
void urgent;

// The engine is generic over its workflow: replay's state is the workflow's state type.
const replayed = engine.replay(store, "trip-001");
expectType<Equal<typeof replayed, Replayed<Trip>>>();
expectType<Equal<typeof replayed.state, Trip>>();
const sagaState = sagaEngine.replay(store, "trip-001").state;
expectType<Equal<typeof sagaState, Saga>>();
// @ts-expect-error init and evolve must agree on the state
const disagreeing = new Engine({ init: () => ({ count: 0 }), evolve: (state: { total: string }) => state, decide: () => [] });
// @ts-expect-error decide sees the state init and evolve give
new Engine({ init: () => 0, evolve: (n) => n + 1, decide: (state: string) => (state.length ? [] : []) });

// Errors: a union of codes and a guard that narrows `unknown`.
try {
  store.complete("trip-001:1:0", 99);
} catch (e) {
  // @ts-expect-error a caught value is unknown until narrowed
  void e.code;
  if (isMiniflowError(e)) {
    expectType<Equal<typeof e, MiniflowError>>();
    expectType<Equal<typeof e.code, MiniflowErrorCode>>();
    if (e.code === "STALE_LEASE" || e.code === "USED_AFTER_FREE" || e.code === "REENTRANT_CALL") void e.message;
    // @ts-expect-error codes are the documented ones
    if (e.code === "STALE") void e;
  }
}
const codes: MiniflowErrorCode[] = errorCodes();

// The built-in event kinds as constants of their literal types, usable to narrow events.
expectType<Equal<typeof TIMER_FIRED, "timer_fired">>();
expectType<Equal<typeof COMMAND_COMPLETED | typeof COMMAND_FAILED | typeof COMMAND_RESOLVED, "command_completed" | "command_failed" | "command_resolved">>();
const onBuiltIn = (event: EventRecord<BuiltInEvent>) => (event.kind === COMMAND_FAILED ? event.payload.error : event.kind === TIMER_FIRED ? event.payload.name : null);

// @ts-expect-error inputs are camelCase: lease_ttl_ms is leaseTtlMs
store.claim({ worker: "w", lease_ttl_ms: 1_000 });
// @ts-expect-error timers fire afterMs, not after_ms
const oldTimer: DecisionObject = { timers: [{ name: "t", after_ms: 5 }] };
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
// @ts-expect-error extend answers an object, not the new expiry
const expiry: number = store.extend("w:1:0", 1, 30_000);
// @ts-expect-error completeWith needs the result
store.completeWith("w:1:0", 1);
// @ts-expect-error report_result is a boolean
const asks: CommandInput = { kind: "book_flight", reportResult: "yes" };
// @ts-expect-error cancel_commands lists command IDs
const cancelsNumbers: DecisionObject = { cancelCommands: [1] };
const narrowed = (event: EventRecord<SagaEvent>) =>
  // @ts-expect-error a command_completed payload has a result, not an error
  event.kind === "command_completed" ? event.payload.error : null;

void [events, fired, wrong, broken, sagaEngine, sagaEvents, expiry, asks, cancelsNumbers, narrowed];
void [withDefaults, disagreeing, codes, onBuiltIn, oldTimer];
