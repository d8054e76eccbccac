//! The shapes of values crossing the boundary: inputs read from JS, and their TypeScript types.
//!
//! Field names are the same snake_case as in miniflow's JSON everywhere (snapshots, stored rows, the
//! Rust API); method names are camelCase.

use std::time::Duration;

use miniflow_core::{
    ClaimOrder, ClaimRequest, Command, CommandId, Decision, Event, Missed, RetryPolicy, Schedule,
    Timer, Timestamp,
};
use serde::Deserialize;
use serde_json::Value;
use wasm_bindgen::prelude::*;

#[wasm_bindgen(typescript_custom_section)]
const TYPES: &str = r#"
/** Any JSON value: what payloads and results are made of. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** Something that happened to a workflow, before it is recorded. */
export interface EventInput { kind: string; payload?: Json }
/** A request to the outside world, decided by a workflow. With `report_result`, its result comes back
 * into the workflow as a `command_completed` event. Claims take a higher `priority` first (default 0). */
export interface CommandInput { kind: string; payload?: Json; report_result?: boolean; priority?: number }
/** A durable timer: fires `after_ms` after its commit, or `at` (ms since the epoch). */
export interface TimerInput { name: string; after_ms?: number; at?: number; payload?: Json }
/** What happens to the occurrences of a schedule missed while no firer ran: one event for the
 * latest (`"fire_once"`, the default), or one each for the latest `max` (1 to 1000). */
export type Missed = "fire_once" | { fire_all: { max: number } };
/** A recurring schedule: every `every_ms` milliseconds (1000 or more) from the commit that starts
 * it, or whenever the `cron` expression matches, in UTC; one `schedule_fired` event per occurrence.
 * Exactly one of `every_ms` and `cron`. Starting a name that runs replaces it. */
export interface ScheduleInput { name: string; every_ms?: number; cron?: string; payload?: Json; on_missed?: Missed }
/** What a workflow decides: commands, timers and schedules to start or cancel, or a rejection of
 * the event. */
export interface DecisionObject {
  commands?: CommandInput[];
  timers?: TimerInput[];
  cancel_timers?: string[];
  schedules?: ScheduleInput[];
  /** Names of schedules to stop (schedules share their names with timers). */
  cancel_schedules?: string[];
  /** IDs of earlier commands of this workflow to withdraw. */
  cancel_commands?: string[];
  /** Kinds whose unfinished commands in this workflow are withdrawn. */
  cancel_kinds?: string[];
  reject?: string;
}
/** A decision: a list of commands, or a full decision object. */
export type DecisionInput = CommandInput[] | DecisionObject;

/** The shape of an event kind with its payload: the members of a workflow's event union. */
export interface EventShape { kind: string; payload?: unknown }
/** Any event: a kind and a JSON payload. */
export interface AnyEvent { kind: string; payload: Json }
/** An event as recorded. `E` narrows kind and payload: with `E = MyEvent | BuiltInEvent`, testing
 * `event.kind === "command_completed"` makes `event.payload` a `CommandCompleted`. */
export type EventRecord<E extends EventShape = AnyEvent> = E & { workflow_id: string; seq: number; recorded_at: number };

export type CommandStatus = "pending" | "leased" | "done" | "dead" | "cancelled";
/** Who holds a command, until when, with which fencing token. */
export interface Lease { owner: string; expires_at: number; token: number }
/** One command in the outbox. */
export interface OutboxRow {
  command_id: string;
  kind: string;
  payload: Json;
  /** Claims take a higher priority first. */
  priority: number;
  status: CommandStatus;
  attempts: number;
  last_error: string | null;
  available_at: number;
  lease: Lease | null;
  created_at: number;
  processed_at: number | null;
  manual_retries: number;
  resolution: string | null;
  /** Its result goes back into the workflow as `command_completed`. */
  report_result: boolean;
  /** What it was completed with. */
  result: Json | null;
  /** Its workflow cancelled it while it was being delivered. */
  cancel_requested: boolean;
  /** The W3C trace context of the commit that created it (absent when it had none). */
  trace_context?: TraceContext;
}
/** A W3C trace context: the `traceparent` and `tracestate` header values. */
export interface TraceContext { traceparent: string; tracestate?: string }
/** What a heartbeat (`extend`) tells the holder of a lease. */
export interface Extended { expires_at: number; cancel_requested: boolean }
/** A claimed command: deliver it with `command_id` as the idempotency key, settle it with `token`. */
export interface Delivery { command_id: string; kind: string; payload: Json; attempt: number; token: number; lease_expires_at: number; due_at: number; trace_context?: TraceContext }
/** What a worker asks for when it claims. */
export interface ClaimRequest {
  worker: string;
  limit?: number;
  lease_ttl_ms?: number;
  order?: "due_first" | "strict_per_workflow";
  max_attempts?: number;
}
/** Why a delivery failed. */
export interface FailureInput { error: string; retryable: boolean }
/** Exponential backoff with a cap and deterministic jitter. */
export interface RetryPolicyInput {
  initial_delay_ms?: number;
  multiplier?: number;
  max_delay_ms?: number;
  max_attempts?: number;
  jitter?: number;
}
/** Where a failed command went. */
export type Settled =
  | { outcome: "retry_at"; at: number; backoff: number }
  | { outcome: "dead" }
  | { outcome: "cancelled" };

/** The payload of a `timer_fired` event. */
export interface TimerFired { timer_id: string; name: string; payload: Json }
/** The payload of a `schedule_fired` event: one occurrence of a schedule, standing also for the
 * `missed` earlier ones its policy folded into it; `next_at` is the occurrence armed with it (null:
 * the schedule ends). Times are milliseconds since the epoch. */
export interface ScheduleFired {
  timer_id: string;
  name: string;
  payload: Json;
  scheduled_at: number;
  missed: number;
  next_at: number | null;
  recurrence: { every_ms: number } | { cron: string };
  on_missed: Missed;
}
/** The payload of a `command_completed` event: a command's result, back in its workflow. */
export interface CommandCompleted { command_id: string; kind: string; result: Json; attempts: number }
/** The payload of a `command_failed` event: a command became dead. */
export interface CommandFailed { command_id: string; kind: string; error: string | null; attempts: number }
/** The payload of a `command_resolved` event: a person resolved a dead command. */
export interface CommandResolved { command_id: string; kind: string; note: string | null }
/** The events miniflow itself writes into a workflow, by kind. */
export type BuiltInEvent =
  | { kind: "timer_fired"; payload: TimerFired }
  | { kind: "schedule_fired"; payload: ScheduleFired }
  | { kind: "command_completed"; payload: CommandCompleted }
  | { kind: "command_failed"; payload: CommandFailed }
  | { kind: "command_resolved"; payload: CommandResolved };
/** The kinds of the events miniflow writes. */
export type BuiltInEventKind = BuiltInEvent["kind"];

export type TimerStatus = "scheduled" | "fired" | "cancelled" | "rejected";
/** A stored timer and the event it commits when it fires. */
export interface TimerRow {
  timer_id: string;
  name: string;
  event_kind: string;
  event_payload: Json;
  fire_at: number;
  available_at: number;
  status: TimerStatus;
  created_at: number;
  processed_at: number | null;
  /** Why its workflow refused it (rejected timers). */
  last_error: string | null;
}

/** What a commit wrote. */
export interface Handled { seq: number; command_ids: string[]; timer_ids: string[]; conflicts: number }
/** A workflow's state rebuilt from its events. */
export interface Replayed<S> { state: S; last_seq: number }
/** A workflow written in JS: `evolve` folds events into state, `decide` answers an incoming event.
 * Both are deterministic, and `decide` leaves `state` as it is: the engine keeps each workflow's state
 * between calls and folds only newer events into it.
 * `E` is the union of the events it sees, its own and miniflow's (`BuiltInEvent`), so that a test of
 * `event.kind` narrows `event.payload`; by default any kind with a JSON payload. */
export interface Workflow<S, E extends EventShape = AnyEvent> {
  init?: () => S;
  evolve(state: S, event: EventRecord<E>): S;
  decide(state: S, event: EventRecord<E>): DecisionInput;
}
/** The parts of a command ID. */
export interface ParsedCommandId { workflow_id: string; event_seq: number; index: number }

/** The receiver's answer for an idempotency key. */
export type Begin =
  | { outcome: "fresh"; token: number }
  | { outcome: "completed"; result: Json }
  | { outcome: "conflict"; key: string; stored_digest: string; new_digest: string }
  | { outcome: "in_progress"; since: number };
/** How long a receiver remembers keys, and when a reservation counts as abandoned. */
export interface IdempotencyPolicyInput { retention_ms?: number; reservation_timeout_ms?: number }
/** What a receiver remembers of a key. */
export type IdempotencyRecord =
  | { key: string; digest: string; reserved_at: number; token: number; state: "reserved" | "abandoned" }
  | { key: string; digest: string; reserved_at: number; token: number; state: "completed"; result: Json; completed_at: number };
/** The error every failing call throws: `code` is stable (CONFLICT, STALE_LEASE, INVALID_INPUT, …). */
export interface MiniflowError extends Error { code: string }
"#;

/// `EventInput`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventInput {
    kind: String,
    #[serde(default)]
    payload: Value,
}

impl From<EventInput> for Event {
    fn from(e: EventInput) -> Self {
        Event::new(e.kind, e.payload)
    }
}

/// `CommandInput`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandInput {
    kind: String,
    #[serde(default)]
    payload: Value,
    #[serde(default)]
    report_result: bool,
    #[serde(default)]
    priority: i32,
}

/// `TimerInput`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimerInput {
    name: String,
    after_ms: Option<u64>,
    at: Option<u64>,
    #[serde(default)]
    payload: Value,
}

/// `ScheduleInput`: exactly one of `every_ms` and `cron`.
#[derive(Deserialize)]
#[serde(try_from = "ScheduleFields")]
pub struct ScheduleInput(Schedule);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduleFields {
    name: String,
    every_ms: Option<u64>,
    cron: Option<String>,
    #[serde(default)]
    payload: Value,
    #[serde(default)]
    on_missed: Missed,
}

impl TryFrom<ScheduleFields> for ScheduleInput {
    type Error = String;

    fn try_from(fields: ScheduleFields) -> Result<Self, String> {
        let schedule = match (fields.every_ms, fields.cron) {
            (Some(ms), None) => Schedule::every(fields.name, Duration::from_millis(ms)),
            (None, Some(expression)) => Schedule::cron(fields.name, expression),
            _ => {
                return Err(format!(
                    "schedule {:?} needs exactly one of every_ms and cron",
                    fields.name
                ))
            }
        };
        Ok(Self(
            schedule.payload(fields.payload).on_missed(fields.on_missed),
        ))
    }
}

/// `DecisionInput`.
pub enum DecisionInput {
    Commands(Vec<CommandInput>),
    Full(DecisionObject),
}

/// An array is a list of commands, anything else a decision object: read as the one it is, so a
/// malformed decision is reported by what is wrong in it (an untagged enum would only say that no
/// shape matched).
impl<'de> Deserialize<'de> for DecisionInput {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(DecisionVisitor)
    }
}

struct DecisionVisitor;

impl<'de> serde::de::Visitor<'de> for DecisionVisitor {
    type Value = DecisionInput;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a list of commands or a decision object")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<DecisionInput, A::Error> {
        let commands = Deserialize::deserialize(serde::de::value::SeqAccessDeserializer::new(seq));
        commands.map(DecisionInput::Commands)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<DecisionInput, A::Error> {
        let full = Deserialize::deserialize(serde::de::value::MapAccessDeserializer::new(map));
        full.map(DecisionInput::Full)
    }
}

/// `DecisionObject`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct DecisionObject {
    commands: Vec<CommandInput>,
    timers: Vec<TimerInput>,
    cancel_timers: Vec<String>,
    schedules: Vec<ScheduleInput>,
    cancel_schedules: Vec<String>,
    cancel_commands: Vec<CommandId>,
    cancel_kinds: Vec<String>,
    reject: Option<String>,
}

impl From<DecisionInput> for Decision {
    fn from(input: DecisionInput) -> Self {
        let full = match input {
            DecisionInput::Commands(commands) => DecisionObject {
                commands,
                ..DecisionObject::default()
            },
            DecisionInput::Full(full) => full,
        };
        if let Some(reason) = full.reject {
            return Decision::reject(reason);
        }
        let mut decision = Decision::new();
        for c in full.commands {
            let command = Command::new(c.kind, c.payload).priority(c.priority);
            decision = decision.command(if c.report_result {
                command.report_result()
            } else {
                command
            });
        }
        for t in full.timers {
            decision = decision.timer(match t.at {
                Some(at) => Timer::at(t.name, Timestamp::from_millis(at), t.payload),
                None => Timer::after(
                    t.name,
                    Duration::from_millis(t.after_ms.unwrap_or(0)),
                    t.payload,
                ),
            });
        }
        for name in full.cancel_timers {
            decision = decision.cancel_timer(name);
        }
        for schedule in full.schedules {
            decision = decision.schedule(schedule.0);
        }
        for name in full.cancel_schedules {
            decision = decision.cancel_schedule(name);
        }
        for id in full.cancel_commands {
            decision = decision.cancel_command(id);
        }
        for kind in full.cancel_kinds {
            decision = decision.cancel_commands_of_kind(kind);
        }
        decision
    }
}

/// `ClaimRequest`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimInput {
    worker: String,
    limit: Option<usize>,
    lease_ttl_ms: Option<u64>,
    order: Option<ClaimOrder>,
    max_attempts: Option<u32>,
}

impl From<ClaimInput> for ClaimRequest {
    fn from(c: ClaimInput) -> Self {
        let mut request = ClaimRequest::new(c.worker);
        if let Some(limit) = c.limit {
            request = request.limit(limit);
        }
        if let Some(ttl) = c.lease_ttl_ms {
            request = request.lease_ttl(Duration::from_millis(ttl));
        }
        if let Some(order) = c.order {
            request = request.order(order);
        }
        if let Some(max) = c.max_attempts {
            request = request.retry_policy(&RetryPolicy::default().max_attempts(max));
        }
        request
    }
}

/// `RetryPolicyInput`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicyInput {
    initial_delay_ms: Option<u64>,
    multiplier: Option<f64>,
    max_delay_ms: Option<u64>,
    max_attempts: Option<u32>,
    jitter: Option<f64>,
}

impl From<RetryPolicyInput> for RetryPolicy {
    fn from(p: RetryPolicyInput) -> Self {
        let mut policy = RetryPolicy::default();
        if let Some(ms) = p.initial_delay_ms {
            policy = policy.initial_delay(Duration::from_millis(ms));
        }
        if let Some(m) = p.multiplier {
            policy = policy.multiplier(m);
        }
        if let Some(ms) = p.max_delay_ms {
            policy = policy.max_delay(Duration::from_millis(ms));
        }
        if let Some(n) = p.max_attempts {
            policy = policy.max_attempts(n);
        }
        if let Some(j) = p.jitter {
            policy = policy.jitter(j);
        }
        policy
    }
}

/// `FailureInput`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailureInput {
    pub error: String,
    pub retryable: bool,
}

/// `IdempotencyPolicyInput`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct IdempotencyPolicyInput {
    pub retention_ms: Option<u64>,
    pub reservation_timeout_ms: Option<u64>,
}

/// `Handled`, for JS.
#[derive(serde::Serialize)]
pub struct HandledOutput {
    pub seq: u64,
    pub command_ids: Vec<String>,
    pub timer_ids: Vec<String>,
    pub conflicts: u32,
}

impl From<miniflow_core::Handled> for HandledOutput {
    fn from(h: miniflow_core::Handled) -> Self {
        Self {
            seq: h.seq.get(),
            command_ids: h.command_ids.iter().map(ToString::to_string).collect(),
            timer_ids: h.timer_ids.iter().map(ToString::to_string).collect(),
            conflicts: h.conflicts,
        }
    }
}
