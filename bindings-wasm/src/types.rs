//! The shapes of values crossing the boundary: inputs read from JS, and their TypeScript types.
//!
//! What a caller writes is camelCase: method names, arguments and the fields of input and option
//! objects (`{ leaseTtlMs }`, `{ reportResult }`). What miniflow hands back (rows, events, deliveries,
//! the built-in events' payloads) is its stored JSON, snake_case, the same as in snapshots, the CLI
//! and every other host. Snake_case input fields are refused with their camelCase name.

use std::time::Duration;

use miniflow_core::{
    ClaimOrder, ClaimRequest, Command, Decision, Event, Missed, RetryPolicy, Schedule, Timer,
    Timestamp,
};
use wasm_bindgen::prelude::*;

use crate::convert::{items, Fields};
use crate::error::{invalid, IntoJs};

#[wasm_bindgen(typescript_custom_section)]
const TYPES: &str = r#"
/** Any JSON value: what payloads and results are made of. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** Something that happened to a workflow, before it is recorded. */
export interface EventInput { kind: string; payload?: Json }
/** A request to the outside world, decided by a workflow. With `reportResult`, its result comes back
 * into the workflow as a `command_completed` event. Claims take a higher `priority` first (an
 * integer, default 0). */
export interface CommandInput { kind: string; payload?: Json; reportResult?: boolean; priority?: number }
/** A durable timer: fires `afterMs` after its commit (0 when neither is given), or `at` (ms since the
 * epoch). */
export interface TimerInput { name: string; afterMs?: number; at?: number; payload?: Json }
/** What happens to the occurrences of a schedule missed while no firer ran: one event for the
 * latest (`"fire_once"`, the default), or one each for the latest `max` (1 to 1000). */
export type Missed = "fire_once" | { fire_all: { max: number } };
/** A recurring schedule: every `everyMs` milliseconds (1000 or more) from the commit that starts
 * it, or whenever the `cron` expression matches, in UTC; one `schedule_fired` event per occurrence.
 * Exactly one of `everyMs` and `cron`. Starting a name that runs replaces it. (The web build has no
 * cron: a `cron` schedule there throws `INVALID_INPUT`; the Node.js build has it.) */
export interface ScheduleInput { name: string; everyMs?: number; cron?: string; payload?: Json; onMissed?: Missed }
/** What a workflow decides: commands, timers and schedules to start or cancel, or a rejection of
 * the event. */
export interface DecisionObject {
  commands?: CommandInput[];
  timers?: TimerInput[];
  /** Names of this workflow's scheduled timers to cancel. */
  cancelTimers?: string[];
  schedules?: ScheduleInput[];
  /** Names of schedules to stop (schedules share their names with timers). */
  cancelSchedules?: string[];
  /** IDs of earlier commands of this workflow to withdraw. */
  cancelCommands?: string[];
  /** Kinds whose unfinished commands in this workflow are withdrawn. */
  cancelKinds?: string[];
  /** Refuses the event: nothing is written, and the call throws `REJECTED` with this reason. */
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
  /** The current lease while `leased`; after it, the last one (kept for the record), `null` if never leased. */
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
  /** The lease owner's name. */
  worker: string;
  /** The most commands to take, 1 to 1,000 (default 1). */
  limit?: number;
  /** How long each lease lasts, 1 ms to 24 h (default 30,000). */
  leaseTtlMs?: number;
  /** `"due_first"` (default), or `"strict_per_workflow"`: a command waits while an earlier one of its
   * workflow is unfinished. */
  order?: "due_first" | "strict_per_workflow";
  /** A command whose lease ran out after this many attempts becomes dead (default 10). */
  maxAttempts?: number;
}
/** Why a delivery failed. */
export interface FailureInput { error: string; retryable: boolean }
/** Exponential backoff with a cap and deterministic jitter. */
export interface RetryPolicyInput {
  initialDelayMs?: number;
  multiplier?: number;
  maxDelayMs?: number;
  maxAttempts?: number;
  jitter?: number;
}
/** Where a failed command went. */
export type Settled =
  | { outcome: "retry_at"; at: number; backoff: number }
  | { outcome: "dead" }
  | { outcome: "cancelled" };

/** The kind of the event a timer commits when it fires. */
export declare const TIMER_FIRED: "timer_fired";
/** The kind of the event that carries a command's result back into its workflow. */
export declare const COMMAND_COMPLETED: "command_completed";
/** The kind of the event committed when a command becomes dead. */
export declare const COMMAND_FAILED: "command_failed";
/** The kind of the event committed when a dead command is resolved by hand. */
export declare const COMMAND_RESOLVED: "command_resolved";
/** The kind of the event an occurrence of a recurring schedule commits. */
export declare const SCHEDULE_FIRED: "schedule_fired";
/** The payload of a `timer_fired` event. */
export interface TimerFired { timer_id: string; name: string; payload: Json }
/** The payload of a `schedule_fired` event: one occurrence of a schedule, standing also for the
 * `missed` earlier ones its policy folded into it; `next_at` is the occurrence armed with it (null:
 * the schedule ends). Times are milliseconds since the epoch. `missed` is exact for an interval
 * schedule; a cron schedule counts at most 100,000 matches, and past that `missed_at_least` is
 * `true` (`missed` is a lower bound) — the field is present only then. */
export interface ScheduleFired {
  timer_id: string;
  name: string;
  payload: Json;
  scheduled_at: number;
  missed: number;
  missed_at_least?: true;
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
/**
 * What `handle` and `start` take for a workflow of events `E`: one of its own events (miniflow's
 * built-in ones come from timers and feedback, and are refused), or any `EventInput` when the
 * workflow's events are not typed.
 */
export type EventInputOf<E extends EventShape> = AnyEvent extends E ? EventInput : Exclude<E, BuiltInEvent>;

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
/** A workflow written in JS: `init` gives the state before any event, `evolve` folds events into
 * state, `decide` answers an incoming event. `S` is its state, the same type for all three (so they
 * must agree); `E` is the union of the events it sees, its own and miniflow's (`BuiltInEvent`), so
 * that a test of `event.kind` narrows `event.payload`; by default any kind with a JSON payload. All
 * three are deterministic, and `decide` leaves `state` as it is: the engine keeps each workflow's
 * state between calls and folds only newer events into it. */
export interface Workflow<S, E extends EventShape = AnyEvent> {
  init(): S;
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
/** How long a receiver remembers keys (default 7 days), and when a reservation counts as abandoned
 * (default 60 s; keep it above the slowest effect). */
export interface IdempotencyPolicyInput { retentionMs?: number; reservationTimeoutMs?: number }
/** What a receiver remembers of a key. */
export type IdempotencyRecord =
  | { key: string; digest: string; reserved_at: number; token: number; state: "reserved" | "abandoned" }
  | { key: string; digest: string; reserved_at: number; token: number; state: "completed"; result: Json; completed_at: number };
"#;

/// An event argument (`EventInput`).
pub fn event(path: &str, value: &JsValue) -> Result<Event, JsValue> {
    let fields = Fields::of(path, value, &["kind", "payload"])?;
    Ok(Event::new(fields.string("kind")?, fields.json("payload")?))
}

/// A command (`CommandInput`).
fn command(path: &str, value: &JsValue) -> Result<Command, JsValue> {
    let fields = Fields::of(
        path,
        value,
        &["kind", "payload", "reportResult", "priority"],
    )?;
    let mut command = Command::new(fields.string("kind")?, fields.json("payload")?);
    if let Some(priority) = fields.optional_i32("priority")? {
        command = command.priority(priority);
    }
    Ok(if fields.boolean("reportResult", Some(false))? {
        command.report_result()
    } else {
        command
    })
}

/// A list of commands (`CommandInput[]`), as a decision.
pub fn commands(path: &str, value: &JsValue) -> Result<Decision, JsValue> {
    let mut decision = Decision::new();
    for (path, item) in items(path, value)? {
        decision = decision.command(command(&path, &item)?);
    }
    Ok(decision)
}

/// A timer (`TimerInput`).
fn timer(path: &str, value: &JsValue) -> Result<Timer, JsValue> {
    let fields = Fields::of(path, value, &["name", "afterMs", "at", "payload"])?;
    let (name, payload) = (fields.string("name")?, fields.json("payload")?);
    match (
        fields.optional_whole("afterMs")?,
        fields.optional_whole("at")?,
    ) {
        (Some(_), Some(_)) => Err(invalid(path, "has both afterMs and at: give one")),
        (None, Some(at)) => Ok(Timer::at(name, Timestamp::from_millis(at), payload)),
        (after, None) => Ok(Timer::after(
            name,
            Duration::from_millis(after.unwrap_or(0)),
            payload,
        )),
    }
}

/// A recurring schedule (`ScheduleInput`): exactly one of `everyMs` and `cron`.
fn schedule(path: &str, value: &JsValue) -> Result<Schedule, JsValue> {
    let fields = Fields::of(
        path,
        value,
        &["name", "everyMs", "cron", "payload", "onMissed"],
    )?;
    let name = fields.string("name")?;
    let schedule = match (
        fields.optional_whole("everyMs")?,
        fields.optional_string("cron")?,
    ) {
        (Some(ms), None) => Schedule::every(name, Duration::from_millis(ms)),
        (None, Some(expression)) => Schedule::cron(name, expression),
        _ => {
            return Err(invalid(
                path,
                format!("schedule {name:?} needs exactly one of everyMs and cron"),
            ))
        }
    };
    let on_missed = match fields.get("onMissed") {
        value if value.is_undefined() => Missed::default(),
        value => missed(&fields.path("onMissed"), &value)?,
    };
    Ok(schedule
        .payload(fields.json("payload")?)
        .on_missed(on_missed))
}

/// A missed-occurrence policy (`Missed`): `"fire_once"` or `{ fire_all: { max } }`.
fn missed(path: &str, value: &JsValue) -> Result<Missed, JsValue> {
    const EXPECTED: &str = "expected \"fire_once\" or { fire_all: { max } }";
    if let Some(text) = value.as_string() {
        return match text.as_str() {
            "fire_once" => Ok(Missed::FireOnce),
            other => Err(invalid(path, format!("is {other:?}: {EXPECTED}"))),
        };
    }
    let fields = Fields::of(path, value, &["fire_all"])?;
    let fire_all = fields.get("fire_all");
    if fire_all.is_undefined() {
        return Err(invalid(path, EXPECTED));
    }
    let all_path = fields.path("fire_all");
    let max = Fields::of(&all_path, &fire_all, &["max"])?.whole("max")?;
    Ok(Missed::FireAll {
        max: u32::try_from(max).unwrap_or(u32::MAX),
    })
}

/// A workflow's decision (`DecisionInput`): a list of commands or a decision object.
pub fn decision(value: &JsValue) -> Result<Decision, JsValue> {
    const PATH: &str = "decision";
    if crate::convert::is_array(value).map_err(|why| invalid(PATH, why))? {
        return commands(PATH, value);
    }
    let fields = Fields::of(
        PATH,
        value,
        &[
            "commands",
            "timers",
            "cancelTimers",
            "schedules",
            "cancelSchedules",
            "cancelCommands",
            "cancelKinds",
            "reject",
        ],
    )?;
    if let Some(reason) = fields.optional_string("reject")? {
        return Ok(Decision::reject(reason));
    }
    let mut decision = match fields.get("commands") {
        commands_value if commands_value.is_undefined() => Decision::new(),
        commands_value => commands(&fields.path("commands"), &commands_value)?,
    };
    for (path, item) in fields.array("timers")? {
        decision = decision.timer(timer(&path, &item)?);
    }
    for (path, item) in fields.array("cancelTimers")? {
        decision = decision.cancel_timer(crate::convert::string(&path, &item)?);
    }
    for (path, item) in fields.array("schedules")? {
        decision = decision.schedule(schedule(&path, &item)?);
    }
    for (path, item) in fields.array("cancelSchedules")? {
        decision = decision.cancel_schedule(crate::convert::string(&path, &item)?);
    }
    for (path, item) in fields.array("cancelCommands")? {
        let id = crate::convert::string(&path, &item)?
            .parse()
            .map_err(|e: miniflow_core::InvalidInput| invalid(&path, e))?;
        decision = decision.cancel_command(id);
    }
    for (path, item) in fields.array("cancelKinds")? {
        decision = decision.cancel_commands_of_kind(crate::convert::string(&path, &item)?);
    }
    Ok(decision)
}

/// A claim request (`ClaimRequest`).
pub fn claim_request(value: &JsValue) -> Result<ClaimRequest, JsValue> {
    let fields = Fields::of(
        "request",
        value,
        &["worker", "limit", "leaseTtlMs", "order", "maxAttempts"],
    )?;
    let mut request = ClaimRequest::new(fields.string("worker")?);
    if let Some(limit) = fields.optional_whole("limit")? {
        request = request.limit(usize::try_from(limit).unwrap_or(usize::MAX));
    }
    if let Some(ttl) = fields.optional_whole("leaseTtlMs")? {
        request = request.lease_ttl(Duration::from_millis(ttl));
    }
    match fields.optional_string("order")?.as_deref() {
        None | Some("due_first") => {}
        Some("strict_per_workflow") => request = request.order(ClaimOrder::StrictPerWorkflow),
        Some(other) => {
            return Err(invalid(
                &fields.path("order"),
                format!("is {other:?}: expected \"due_first\" or \"strict_per_workflow\""),
            ))
        }
    }
    if let Some(max) = fields.optional_whole("maxAttempts")? {
        let max = u32::try_from(max).unwrap_or(u32::MAX);
        request = request.retry_policy(&RetryPolicy::default().max_attempts(max));
    }
    Ok(request)
}

/// A retry policy argument (`RetryPolicyInput`); `undefined` is the default policy.
pub fn retry_policy(value: &JsValue) -> Result<RetryPolicy, JsValue> {
    let mut policy = RetryPolicy::default();
    if value.is_undefined() {
        return Ok(policy);
    }
    let fields = Fields::of(
        "policy",
        value,
        &[
            "initialDelayMs",
            "multiplier",
            "maxDelayMs",
            "maxAttempts",
            "jitter",
        ],
    )?;
    if let Some(ms) = fields.optional_whole("initialDelayMs")? {
        policy = policy.initial_delay(Duration::from_millis(ms));
    }
    if let Some(m) = fields.optional_number("multiplier")? {
        policy = policy.multiplier(m);
    }
    if let Some(ms) = fields.optional_whole("maxDelayMs")? {
        policy = policy.max_delay(Duration::from_millis(ms));
    }
    if let Some(n) = fields.optional_whole("maxAttempts")? {
        policy = policy.max_attempts(u32::try_from(n).unwrap_or(u32::MAX));
    }
    if let Some(j) = fields.optional_number("jitter")? {
        policy = policy.jitter(j);
    }
    policy.validate().js()?;
    Ok(policy)
}

/// A failure (`FailureInput`).
pub fn failure(value: &JsValue) -> Result<miniflow_core::Failure, JsValue> {
    let fields = Fields::of("failure", value, &["error", "retryable"])?;
    Ok(miniflow_core::Failure {
        error: fields.string("error")?,
        retryable: fields.boolean("retryable", None)?,
    })
}

/// A receiver's policy (`IdempotencyPolicyInput`); `undefined` is the default.
#[cfg(feature = "receiver")]
pub fn idempotency_policy(value: &JsValue) -> Result<miniflow_core::IdempotencyPolicy, JsValue> {
    let defaults = miniflow_core::IdempotencyPolicy::default();
    if value.is_undefined() {
        return Ok(defaults);
    }
    let fields = Fields::of("policy", value, &["retentionMs", "reservationTimeoutMs"])?;
    let ms = |name| -> Result<Option<Duration>, JsValue> {
        Ok(fields.optional_whole(name)?.map(Duration::from_millis))
    };
    Ok(miniflow_core::IdempotencyPolicy {
        retention: ms("retentionMs")?.unwrap_or(defaults.retention),
        reservation_timeout: ms("reservationTimeoutMs")?.unwrap_or(defaults.reservation_timeout),
    })
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
