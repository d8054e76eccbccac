//! Outbox rows and the rules that move them: claim, extend, complete, fail, retry, resolve
//! (DESIGN rules 5–9).
//!
//! These functions are the single statement of the lease rules. [`crate::MemoryStore`] applies them to
//! its rows directly; SQL stores express the same conditions in their statements and call
//! [`OutboxRow::fail`] for the retry arithmetic, and the conformance suite proves they agree. A change
//! also says which feedback timer it schedules or withdraws ([`feedback`], [`withdrawn_feedback`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::builtin::{
    to_payload, CommandCompleted, CommandFailed, CommandResolved, COMMAND_COMPLETED,
    COMMAND_FAILED, COMMAND_RESOLVED,
};
use crate::error::Error;
use crate::id::CommandId;
use crate::limits::{bounded_error, JsonLimits};
use crate::model::Command;
use crate::retry::RetryPolicy;
use crate::status::Status;
use crate::time::{Shown, Timestamp};
use crate::timer::{TimerId, TimerRow};
use crate::trace::TraceContext;

/// Who holds a command, until when, with which fencing token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The worker that claimed it.
    pub owner: String,
    /// When the lease runs out and another worker may take the command over.
    pub expires_at: Timestamp,
    /// The fencing token: only the holder of the current token may settle the command.
    pub token: u64,
}

/// One command in the outbox, with every column of DESIGN rule 5.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutboxRow {
    /// `"{workflow_id}:{event_seq}:{index}"`.
    pub command_id: CommandId,
    /// What to do.
    pub kind: String,
    /// With which parameters.
    pub payload: Value,
    /// Claims take commands of a higher priority first ([`OutboxRow::claim_order`]).
    #[serde(default)]
    pub priority: i32,
    /// Where it is in its life.
    pub status: Status,
    /// Deliveries so far (claims), since creation or the last retry by hand.
    pub attempts: u32,
    /// The error of the last failed attempt.
    pub last_error: Option<String>,
    /// The earliest time the command may be claimed: when it is due, or for a leased command when its
    /// lease expires.
    pub available_at: Timestamp,
    /// The current or last lease; `token` keeps counting up across leases.
    pub lease: Option<Lease>,
    /// When the command was committed.
    pub created_at: Timestamp,
    /// When it became done or dead.
    pub processed_at: Option<Timestamp>,
    /// How often a person put it back with `retry`.
    pub manual_retries: u32,
    /// The note of a person who closed it with `resolve`.
    pub resolution: Option<String>,
    /// Whether its decision asked for its result: completing it then feeds a `command_completed`
    /// event back into its workflow.
    #[serde(default)]
    pub report_result: bool,
    /// What the handler completed it with, if anything.
    #[serde(default)]
    pub result: Option<Value>,
    /// A decision cancelled it while it was leased: it is not delivered again, and its real outcome
    /// is still recorded and fed back.
    #[serde(default)]
    pub cancel_requested: bool,
    /// The W3C trace context of the commit that created it ([`crate::Commit::traced`]), handed to
    /// every delivery so the trace goes on at the receiver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_context: Option<TraceContext>,
}

/// A command handed to a worker by a claim: what to deliver and the token to settle it with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    /// The command's ID: send it to the receiver as the idempotency key.
    pub command_id: CommandId,
    /// What to do.
    pub kind: String,
    /// With which parameters.
    pub payload: Value,
    /// Which delivery this is, from 1.
    pub attempt: u32,
    /// The fencing token to pass to `complete`, `fail` and `extend`.
    pub token: u64,
    /// When the lease runs out.
    pub lease_expires_at: Timestamp,
    /// When the command became claimable: its due time (after a failure, its retry time), or the
    /// expiry of the lease this claim took over. The claim's `now` minus this is how long it waited.
    pub due_at: Timestamp,
    /// The W3C trace context of the commit that created the command, if it had one: continue the
    /// trace from it (e.g. send [`TraceContext::child`]'s `traceparent` to the receiver).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_context: Option<TraceContext>,
    /// Whether the command asked for its result ([`crate::Command::report_result`]): then a
    /// completion with a result feeds it back into the workflow as `command_completed`. (Not
    /// serialized: a delivery's JSON is what it was.)
    #[serde(skip)]
    pub reports_result: bool,
}

/// Which commands a claim hands out first (DESIGN rule 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClaimOrder {
    /// Any due command, the longest-due first, then by command ID.
    #[default]
    DueFirst,
    /// As `DueFirst`, but a command is not handed out while an earlier command of its workflow is
    /// pending or leased (done and dead ones do not block).
    StrictPerWorkflow,
}

/// What a worker asks for when it claims.
///
/// ```
/// use std::time::Duration;
/// use miniflow_core::{ClaimOrder, ClaimRequest};
///
/// let request = ClaimRequest::new("worker-1")
///     .limit(32)
///     .lease_ttl(Duration::from_secs(30))
///     .order(ClaimOrder::StrictPerWorkflow);
/// assert_eq!(request.limit, 32);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClaimRequest {
    /// The claiming worker's name, recorded as the lease owner.
    pub worker: String,
    /// The most commands to take.
    pub limit: usize,
    /// How long the lease lasts before another worker may take the command over.
    pub lease_ttl: Duration,
    /// Which commands come first.
    pub order: ClaimOrder,
    /// A command whose lease expired after this many attempts becomes dead instead of being claimed again
    /// (a worker that keeps crashing on it must not loop forever).
    pub max_attempts: u32,
}

impl ClaimRequest {
    /// The longest lease a claim may ask for: 24 hours. A holder of long work extends its lease (a
    /// heartbeat) instead; a longer lease only makes the commands of a crashed worker wait longer.
    pub const MAX_LEASE_TTL: Duration = Duration::from_secs(24 * 60 * 60);

    /// The shortest lease a claim may ask for: 1 ms, the resolution of [`Timestamp`].
    pub const MIN_LEASE_TTL: Duration = Duration::from_millis(1);

    /// The most commands one claim may take: 1,000, so a claim stays one short transaction.
    pub const MAX_LIMIT: usize = 1_000;

    /// Up to 1 command for `worker`, leased for 30 s, `DueFirst`, at most 10 attempts.
    pub fn new(worker: impl Into<String>) -> Self {
        Self {
            worker: worker.into(),
            limit: 1,
            lease_ttl: Duration::from_secs(30),
            order: ClaimOrder::DueFirst,
            max_attempts: RetryPolicy::default().attempts_allowed(),
        }
    }

    /// Takes up to `limit` commands (1 to [`ClaimRequest::MAX_LIMIT`]).
    #[must_use]
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// Leases them for `ttl` ([`ClaimRequest::MIN_LEASE_TTL`] to [`ClaimRequest::MAX_LEASE_TTL`]).
    #[must_use]
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// Hands them out in `order`.
    #[must_use]
    pub fn order(mut self, order: ClaimOrder) -> Self {
        self.order = order;
        self
    }

    /// Takes the attempt limit from `policy`.
    #[must_use]
    pub fn retry_policy(mut self, policy: &RetryPolicy) -> Self {
        self.max_attempts = policy.attempts_allowed();
        self
    }

    /// Checks the request. Every store calls it before it claims, so a request out of bounds fails the
    /// same way on every backend and writes nothing.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming the field and its value for a worker name that is empty, longer
    /// than 128 bytes or holds a control character; a limit of 0 or above [`ClaimRequest::MAX_LIMIT`]
    /// (1,000); a lease TTL shorter than [`ClaimRequest::MIN_LEASE_TTL`] (1 ms) or longer than
    /// [`ClaimRequest::MAX_LEASE_TTL`] (24 h); `max_attempts` of 0.
    pub fn validate(&self) -> Result<(), Error> {
        if self.worker.is_empty() || self.worker.len() > 128 {
            return Err(Error::invalid(
                "worker",
                &self.worker,
                "must be 1 to 128 bytes",
            ));
        }
        if self.worker.chars().any(char::is_control) {
            return Err(Error::invalid(
                "worker",
                &self.worker,
                "must not contain control characters",
            ));
        }
        if !(1..=Self::MAX_LIMIT).contains(&self.limit) {
            return Err(Error::invalid(
                "limit",
                self.limit,
                format!("must be 1 to {}", Self::MAX_LIMIT),
            ));
        }
        if !(Self::MIN_LEASE_TTL..=Self::MAX_LEASE_TTL).contains(&self.lease_ttl) {
            return Err(Error::invalid(
                "lease_ttl",
                Shown(self.lease_ttl).to_string(),
                format!(
                    "must be {} to {} (24 h); extend the lease for longer work",
                    Shown(Self::MIN_LEASE_TTL),
                    Shown(Self::MAX_LEASE_TTL)
                ),
            ));
        }
        if self.max_attempts == 0 {
            return Err(Error::invalid(
                "max_attempts",
                self.max_attempts,
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

/// Why a delivery failed, as the worker reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// What went wrong, kept as the row's `last_error`.
    pub error: String,
    /// Whether trying again may help (a timeout, a 503) or not (a 422, a refused booking).
    pub retryable: bool,
}

impl Failure {
    /// A failure that may pass if tried again later.
    pub fn retryable(error: impl Into<String>) -> Self {
        Self {
            error: error.into(),
            retryable: true,
        }
    }

    /// A failure that will not pass however often it is tried: the command becomes dead at once.
    pub fn permanent(error: impl Into<String>) -> Self {
        Self {
            error: error.into(),
            retryable: false,
        }
    }
}

/// Where a failed command went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum Settled {
    /// Back to pending, due again at `at` (after `backoff`).
    RetryAt {
        /// When it is due again.
        at: Timestamp,
        /// The backoff that was applied.
        #[serde(with = "crate::time::duration_millis")]
        backoff: Duration,
    },
    /// Dead: out of attempts, or the failure was permanent.
    Dead,
    /// Cancelled: its workflow withdrew it while it was being delivered, so it is not tried again.
    Cancelled,
}

/// What an `extend` (a heartbeat) tells the holder of a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extended {
    /// When the lease now runs out.
    pub expires_at: Timestamp,
    /// The command's workflow cancelled it: a long handler may stop. Whatever it reports is still
    /// recorded (a completion is fed back to the workflow), but it is not delivered again.
    pub cancel_requested: bool,
}

/// What a decision's cancellation did to one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    /// It was not being delivered: now `cancelled`, never delivered.
    Withdrawn,
    /// It is being delivered: marked, and its holder is told at its next heartbeat.
    Requested,
    /// It had already finished (done, dead, cancelled) or was already marked: nothing changed.
    Unchanged,
}

/// The reason recorded when a lease ran out on the last allowed attempt.
pub(crate) fn lease_expired_error(attempts: u32) -> String {
    format!("lease expired on attempt {attempts} with no result")
}

/// A row change the core computed ([`OutboxRow::change`]): what the rule answered, the row after it,
/// the feedback timer the change schedules, and the one it withdraws. A store writes the row and the
/// feedback together, in one transaction, so no store can forget the feedback (DESIGN rules 12 and
/// 15).
#[derive(Debug, Clone, PartialEq)]
pub struct Changed<T> {
    /// What the rule answered (a delivery, a settlement, …).
    pub value: T,
    /// The row after the change.
    pub row: OutboxRow,
    /// The `command_completed` / `command_failed` / `command_resolved` timer to insert with it.
    pub feedback: Option<TimerRow>,
    /// The feedback timer to cancel with it, at [`Self::at`], if it is still scheduled
    /// ([`TimerRow::cancel`]): the `command_failed` of a dead command put back to pending, not fed
    /// back yet ([`crate::backend::withdrawn_feedback`]).
    pub withdrawn: Option<TimerId>,
    /// When the change was made.
    pub at: Timestamp,
}

impl OutboxRow {
    /// Applies a rule (`change`, one of this type's methods) to a copy of the row at `now`: the row
    /// after it and the feedback it schedules (see [`crate::backend::feedback`]). On an error nothing changed.
    ///
    /// ```
    /// use miniflow_core::{json, ClaimRequest, Command, CommandId, OutboxRow, Status, Timestamp};
    ///
    /// let id: CommandId = "trip-001:1:0".parse()?;
    /// let row = OutboxRow::pending(id, Command::new("book", json!({})).report_result(), Timestamp::from_millis(0));
    /// let claimed = row.change(Timestamp::from_millis(1), |r| Ok(r.claim(&ClaimRequest::new("w"), Timestamp::from_millis(1))))?;
    /// let token = claimed.value.expect("claimable").token;
    /// let done = claimed.row.change(Timestamp::from_millis(2), |r| r.complete(token, Some(&json!("REF-1")), Timestamp::from_millis(2)))?;
    /// assert_eq!(done.row.status, Status::Done);
    /// assert_eq!(done.feedback.expect("its result goes back").timer_id.to_string(), "trip-001:1:0:completed");
    /// # Ok::<(), miniflow_core::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// What `change` returns.
    pub fn change<T>(
        &self,
        now: Timestamp,
        change: impl FnOnce(&mut OutboxRow) -> Result<T, Error>,
    ) -> Result<Changed<T>, Error> {
        self.clone().into_change(now, change)
    }

    /// As [`OutboxRow::change`], applied to the row itself instead of a copy: for a store that read
    /// the row only to change it (a claim, an ack). On an error the row is dropped, and the store
    /// writes nothing.
    ///
    /// # Errors
    ///
    /// What `change` returns.
    pub fn into_change<T>(
        mut self,
        now: Timestamp,
        change: impl FnOnce(&mut OutboxRow) -> Result<T, Error>,
    ) -> Result<Changed<T>, Error> {
        let before = self.status;
        let value = change(&mut self)?;
        let feedback = feedback(before, &self, now);
        let withdrawn = withdrawn_feedback(before, &self);
        Ok(Changed {
            value,
            row: self,
            feedback,
            withdrawn,
            at: now,
        })
    }

    /// Buries a row a store cannot read whole (DESIGN rule 13): dead, with `reason` as its last
    /// error, processed at `now`, so that it stops no other delivery and its workflow hears of it.
    pub fn bury(&mut self, reason: String, now: Timestamp) {
        self.last_error = Some(bounded_error(&reason));
        self.finish(Status::Dead, now);
    }

    /// A new command's row, pending and due at `now` (what a commit writes).
    pub fn pending(command_id: CommandId, command: Command, now: Timestamp) -> Self {
        Self {
            command_id,
            kind: command.kind,
            payload: command.payload,
            priority: command.priority,
            status: Status::Pending,
            attempts: 0,
            last_error: None,
            available_at: now,
            lease: None,
            created_at: now,
            processed_at: None,
            manual_retries: 0,
            resolution: None,
            report_result: command.report_result,
            result: None,
            cancel_requested: false,
            trace_context: None,
        }
    }

    /// Whether a claim at `now` may take this row: pending and due, or leased with an expired lease.
    /// The operators' controls may still hold it back ([`crate::backend::Admission`]).
    pub fn is_claimable(&self, now: Timestamp) -> bool {
        self.status.is_unfinished() && self.available_at <= now
    }

    /// Whether the row holds an unexpired lease at `now`: what a kind's concurrency limit counts
    /// ([`crate::backend::Admission`]). A SQL store counts `status = 'leased' AND available_at > now`.
    pub fn holds_lease(&self, now: Timestamp) -> bool {
        self.status == Status::Leased && self.available_at > now
    }

    /// The current fencing token (0 before the first claim).
    pub fn token(&self) -> u64 {
        self.lease.as_ref().map_or(0, |lease| lease.token)
    }

    /// Claims the row for `request.worker` at `now`: a new lease with the next token, one more attempt.
    /// Returns `None`, and makes the row dead instead, when its lease expired on the last allowed attempt.
    /// The caller has checked [`Self::is_claimable`].
    pub fn claim(&mut self, request: &ClaimRequest, now: Timestamp) -> Option<Delivery> {
        if self.cancel_requested {
            // Its lease ran out with no outcome; the workflow withdrew it, so it is not sent again.
            self.finish(Status::Cancelled, now);
            return None;
        }
        if self.status == Status::Leased && self.attempts >= request.max_attempts {
            self.status = Status::Dead;
            self.last_error = Some(lease_expired_error(self.attempts));
            self.processed_at = Some(now);
            return None;
        }
        let due_at = self.available_at;
        let expires_at = now + request.lease_ttl;
        let token = self.token() + 1;
        self.status = Status::Leased;
        self.attempts += 1;
        self.available_at = expires_at;
        self.lease = Some(Lease {
            owner: request.worker.clone(),
            expires_at,
            token,
        });
        Some(Delivery {
            command_id: self.command_id.clone(),
            kind: self.kind.clone(),
            payload: self.payload.clone(),
            attempt: self.attempts,
            token,
            lease_expires_at: expires_at,
            due_at,
            trace_context: self.trace_context.clone(),
            reports_result: self.report_result,
        })
    }

    /// Checks that `token` is the current lease (expired or not: a late ack while nobody took over is
    /// still the holder's).
    ///
    /// # Errors
    ///
    /// [`Error::StaleLease`] naming what holds the command now.
    pub fn check_lease(&self, token: u64) -> Result<(), Error> {
        if self.status == Status::Leased && self.token() == token {
            return Ok(());
        }
        let current = match (&self.status, &self.lease) {
            (Status::Leased, Some(lease)) => {
                format!("leased by {} with token {}", lease.owner, lease.token)
            }
            (status, _) => format!("{status}, not leased"),
        };
        Err(Error::StaleLease {
            command_id: self.command_id.clone(),
            token,
            current,
        })
    }

    /// Extends the holder's lease to `now + ttl`, never shortening it: a heartbeat from a clock that
    /// lags behind the one that set the lease keeps the later expiry.
    /// The lease stays the holder's; the answer says whether the workflow cancelled the command
    /// meanwhile ([`Extended::cancel_requested`]).
    pub fn extend(&mut self, token: u64, ttl: Duration, now: Timestamp) -> Result<Extended, Error> {
        self.check_lease(token)?;
        let current = self.lease.as_ref().map_or(now, |lease| lease.expires_at);
        let expires_at = (now + ttl).max(current);
        self.available_at = expires_at;
        if let Some(lease) = &mut self.lease {
            lease.expires_at = expires_at;
        }
        Ok(Extended {
            expires_at,
            cancel_requested: self.cancel_requested,
        })
    }

    /// Gives the command back without an attempt (a worker shutting down before it started the
    /// delivery): pending again, due at `now`, the attempt not counted — or `cancelled` if its
    /// workflow withdrew it meanwhile.
    pub fn release(&mut self, token: u64, now: Timestamp) -> Result<(), Error> {
        self.check_lease(token)?;
        self.attempts = self.attempts.saturating_sub(1);
        if self.cancel_requested {
            self.finish(Status::Cancelled, now);
            return Ok(());
        }
        self.status = Status::Pending;
        self.available_at = now;
        Ok(())
    }

    /// Marks the holder's delivery done, with the handler's `result` if it gave one, checked against
    /// the limits of a value fed back ([`crate::JsonLimits::fed_back`]): its `command_completed`
    /// event must fit in the limits too.
    ///
    /// # Errors
    ///
    /// [`Error::StaleLease`]; [`Error::InvalidInput`] for a result over the limits (nothing changes).
    pub fn complete(
        &mut self,
        token: u64,
        result: Option<&Value>,
        now: Timestamp,
    ) -> Result<(), Error> {
        self.check_lease(token)?;
        if let Some(result) = result {
            JsonLimits::fed_back().check("result", result)?;
        }
        self.result = result.cloned();
        self.finish(Status::Done, now);
        Ok(())
    }

    /// Whether completing this command must feed a `command_completed` event back into its
    /// workflow: its decision asked for the result, or the workflow cancelled it and must learn that
    /// it happened anyway.
    pub fn reports_completion(&self) -> bool {
        self.report_result || self.cancel_requested
    }

    /// Applies a decision's cancellation at `now`: a command not being delivered becomes `cancelled`
    /// (never delivered); one being delivered is marked, its holder told at its next heartbeat, and
    /// it is not delivered again; a finished one is left alone.
    pub fn cancel(&mut self, now: Timestamp) -> Cancelled {
        match self.status {
            Status::Pending => {
                self.finish(Status::Cancelled, now);
                Cancelled::Withdrawn
            }
            Status::Leased if !self.cancel_requested => {
                self.cancel_requested = true;
                Cancelled::Requested
            }
            _ => Cancelled::Unchanged,
        }
    }

    /// Settles the holder's failed delivery: back to pending after a backoff, or dead. A retryable
    /// failure of a command its workflow withdrew meanwhile ([`Self::cancel`]) ends it `cancelled`,
    /// on its last allowed attempt too: it would not have been tried again, so it did not run out
    /// of attempts, and nothing is fed back. A permanent failure is dead all the same, and fed back
    /// as `command_failed`: it is what the delivery did.
    pub fn fail(
        &mut self,
        token: u64,
        failure: &Failure,
        policy: &RetryPolicy,
        now: Timestamp,
    ) -> Result<Settled, Error> {
        self.check_lease(token)?;
        self.last_error = Some(bounded_error(&failure.error));
        if failure.retryable && self.cancel_requested {
            self.finish(Status::Cancelled, now);
            return Ok(Settled::Cancelled);
        }
        if !failure.retryable || self.attempts >= policy.attempts_allowed() {
            self.finish(Status::Dead, now);
            return Ok(Settled::Dead);
        }
        let backoff = policy.backoff(&self.command_id, self.attempts);
        let at = now + backoff;
        self.status = Status::Pending;
        self.available_at = at;
        Ok(Settled::RetryAt { at, backoff })
    }

    /// Marks the command done without a lease (the lease-free API of simple workers).
    /// Harmless on a done command.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidState`] on a dead or cancelled command: neither is ever reported as success.
    pub fn mark_done(&mut self, now: Timestamp) -> Result<(), Error> {
        match self.status {
            Status::Done => Ok(()),
            Status::Dead | Status::Cancelled => Err(self.invalid_state("mark done")),
            Status::Pending | Status::Leased => {
                self.finish(Status::Done, now);
                Ok(())
            }
        }
    }

    /// Puts a dead command back to pending, due at `now`, with a fresh set of attempts. The
    /// `command_failed` of its death is withdrawn if it has not been fed back yet
    /// ([`crate::backend::withdrawn_feedback`]): the workflow does not compensate a failure that was retried.
    pub fn retry(&mut self, now: Timestamp) -> Result<(), Error> {
        if self.status != Status::Dead {
            return Err(self.invalid_state("retry"));
        }
        self.status = Status::Pending;
        self.attempts = 0;
        self.available_at = now;
        self.processed_at = None;
        self.manual_retries += 1;
        Ok(())
    }

    /// Closes a dead command by hand with a `note`; it becomes done and keeps its last error. The
    /// note is fed back in the `command_resolved` event, so it keeps the limits of a value fed back
    /// ([`crate::JsonLimits::fed_back`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidState`] unless the command is dead; [`Error::InvalidInput`] for a note over
    /// the limits (nothing changes).
    pub fn resolve(&mut self, note: &str, now: Timestamp) -> Result<(), Error> {
        if self.status != Status::Dead {
            return Err(self.invalid_state("resolve"));
        }
        JsonLimits::fed_back().check("note", &Value::String(note.to_owned()))?;
        self.resolution = Some(note.to_owned());
        self.finish(Status::Done, now);
        Ok(())
    }

    /// The order claims hand rows out in (DESIGN rules 6–7): the highest priority first, then the
    /// longest due, then by command ID (numbers compared as numbers). A SQL store says
    /// `ORDER BY priority DESC, available_at, workflow_id, event_seq, idx` over the rows
    /// [`Self::is_claimable`] admits (`processed_at IS NULL AND available_at <= now`) and the
    /// operators' controls let through ([`crate::backend::Admission`]); it may read one priority at a time
    /// (`priority = p … ORDER BY available_at, …`, then the next lower priority present), so that
    /// commands not yet due at a higher priority are never walked. In strict order only the first
    /// unfinished command of each workflow is claimable, whatever its priority: a command of a high
    /// priority waits for the earlier commands of its workflow.
    pub fn claim_order(&self) -> (std::cmp::Reverse<i32>, Timestamp, &CommandId) {
        (
            std::cmp::Reverse(self.priority),
            self.available_at,
            &self.command_id,
        )
    }

    fn finish(&mut self, status: Status, now: Timestamp) {
        self.status = status;
        self.processed_at = Some(now);
    }

    fn invalid_state(&self, operation: &'static str) -> Error {
        Error::InvalidState {
            command_id: self.command_id.clone(),
            status: self.status,
            operation,
        }
    }
}

/// The feedback timer a store must cancel, in the same transaction, if it is still scheduled, when a
/// change took an outbox row from status `before` to `after`: a dead command put back to pending
/// ([`OutboxRow::retry`]) withdraws the `command_failed` of the death it is retried from. Not yet
/// fired, that event would tell the workflow of a failure that is being tried again, and its
/// decision would compensate an effect the retry may still make. Fired already, it is left as it
/// is: the workflow knew.
pub fn withdrawn_feedback(before: Status, after: &OutboxRow) -> Option<TimerId> {
    match (before, after.status) {
        (Status::Dead, Status::Pending) => Some(TimerId::failure(
            after.command_id.clone(),
            after.manual_retries,
        )),
        _ => None,
    }
}

/// The feedback a store must schedule, in the same transaction, when a change took an outbox row from
/// status `before` to `after` at `now`: `command_failed` when it became dead, `command_resolved` when a
/// dead command was resolved by hand (DESIGN rule 12), `command_completed` when a command that reports
/// its completion ([`OutboxRow::reports_completion`]) was completed (DESIGN rule 15).
pub fn feedback(before: Status, after: &OutboxRow, now: Timestamp) -> Option<TimerRow> {
    let id = &after.command_id;
    let (timer_id, kind, payload) = match (before, after.status) {
        (Status::Pending | Status::Leased, Status::Done) if after.reports_completion() => (
            TimerId::completion(id.clone()),
            COMMAND_COMPLETED,
            to_payload(&CommandCompleted {
                command_id: id.clone(),
                kind: after.kind.clone(),
                result: after.result.clone().unwrap_or(Value::Null),
                attempts: after.attempts,
            }),
        ),
        (from, Status::Dead) if from != Status::Dead => (
            TimerId::failure(id.clone(), after.manual_retries + 1),
            COMMAND_FAILED,
            to_payload(&CommandFailed {
                command_id: id.clone(),
                kind: after.kind.clone(),
                error: after.last_error.clone(),
                attempts: after.attempts,
            }),
        ),
        (Status::Dead, Status::Done) => (
            TimerId::resolution(id.clone()),
            COMMAND_RESOLVED,
            to_payload(&CommandResolved {
                command_id: id.clone(),
                kind: after.kind.clone(),
                note: after.resolution.clone(),
            }),
        ),
        _ => return None,
    };
    Some(TimerRow::new(
        timer_id,
        kind.to_owned(),
        kind,
        payload,
        now,
        now,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused_field(request: &ClaimRequest) -> Option<&'static str> {
        match request.validate() {
            Ok(()) => None,
            Err(Error::InvalidInput { field, .. }) => Some(field),
            Err(other) => panic!("not InvalidInput: {other}"),
        }
    }

    #[test]
    fn claim_requests_out_of_bounds_are_refused_naming_the_field() {
        let ok = ClaimRequest::new("worker-1");
        assert_eq!(refused_field(&ok), None);
        let edges = ok
            .clone()
            .limit(ClaimRequest::MAX_LIMIT)
            .lease_ttl(ClaimRequest::MAX_LEASE_TTL);
        assert_eq!(refused_field(&edges), None);
        assert_eq!(
            refused_field(&ok.clone().lease_ttl(ClaimRequest::MIN_LEASE_TTL)),
            None
        );
        let mut no_attempts = ok.clone();
        no_attempts.max_attempts = 0;
        let cases = [
            (ClaimRequest::new(""), "worker"),
            (ClaimRequest::new("w".repeat(129)), "worker"),
            (ClaimRequest::new("worker\n1"), "worker"),
            (ClaimRequest::new("worker\u{7f}"), "worker"),
            (ok.clone().limit(0), "limit"),
            (ok.clone().limit(ClaimRequest::MAX_LIMIT + 1), "limit"),
            (ok.clone().lease_ttl(Duration::ZERO), "lease_ttl"),
            (
                ok.clone().lease_ttl(Duration::from_micros(999)),
                "lease_ttl",
            ),
            (ok.clone().lease_ttl(Duration::MAX), "lease_ttl"),
            (
                ok.clone()
                    .lease_ttl(ClaimRequest::MAX_LEASE_TTL + Duration::from_millis(1)),
                "lease_ttl",
            ),
            (no_attempts, "max_attempts"),
        ];
        for (request, field) in cases {
            assert_eq!(refused_field(&request), Some(field), "{request:?}");
        }
        let message = ok
            .lease_ttl(Duration::MAX)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("lease_ttl") && message.contains("86400s"),
            "{message}"
        );
    }
}
