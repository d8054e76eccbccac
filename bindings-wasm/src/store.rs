//! `MemoryStore` for JS: the core's in-memory store, every method converting and nothing more.

use std::cell::{Ref, RefCell, RefMut};

use miniflow_core::prelude::*;
use miniflow_core::{Commit, MemoryStore, Seq};
use wasm_bindgen::prelude::*;

use crate::convert::{command_id, count, json, millis, now, string, to_js, whole, workflow_id};
use crate::error::{reentrant, IntoJs};
use crate::types::{self, HandledOutput};

/// The outbox and event log in memory. Every method applies completely or not at all; after an error
/// the store is unchanged and still usable. `now` (ms since the epoch) defaults to `Date.now()`.
#[wasm_bindgen(js_name = MemoryStore)]
#[derive(Default)]
pub struct JsMemoryStore {
    inner: RefCell<MemoryStore>,
}

impl JsMemoryStore {
    /// The store, to read; `REENTRANT_CALL` while a call that changes it is running.
    pub(crate) fn read(&self) -> Result<Ref<'_, MemoryStore>, JsValue> {
        self.inner
            .try_borrow()
            .map_err(|_| reentrant("MemoryStore"))
    }

    /// The store, to change; `REENTRANT_CALL` while another call on it is running.
    pub(crate) fn write(&self) -> Result<RefMut<'_, MemoryStore>, JsValue> {
        self.inner
            .try_borrow_mut()
            .map_err(|_| reentrant("MemoryStore"))
    }
}

#[wasm_bindgen(js_class = MemoryStore)]
impl JsMemoryStore {
    /// An empty store.
    #[wasm_bindgen(constructor)]
    pub fn new() -> Self {
        Self::default()
    }

    /// A store from `exportSnapshot()`'s text. Throws `INVALID_INPUT` for text that is not a snapshot,
    /// or comes from a newer version.
    #[wasm_bindgen(js_name = fromSnapshot)]
    pub fn from_snapshot(
        #[wasm_bindgen(unchecked_param_type = "string")] json: JsValue,
    ) -> Result<JsMemoryStore, JsValue> {
        let json = string("json", &json)?;
        Ok(Self {
            inner: RefCell::new(MemoryStore::from_snapshot(&json).js()?),
        })
    }

    /// The whole store as versioned JSON text, e.g. for `localStorage`.
    #[wasm_bindgen(js_name = exportSnapshot)]
    pub fn export_snapshot(&self) -> Result<String, JsValue> {
        Ok(self.read()?.export_snapshot())
    }

    /// Commits `event` at `expectedSeq + 1` with `commands` (IDs `workflow:seq:index`), atomically;
    /// throws `CONFLICT` when the workflow moved on.
    #[wasm_bindgen(js_name = appendWithCommands, unchecked_return_type = "Handled")]
    pub fn append_with_commands(
        &self,
        #[wasm_bindgen(js_name = workflowId, unchecked_param_type = "string")] workflow: JsValue,
        #[wasm_bindgen(js_name = expectedSeq, unchecked_param_type = "number")]
        expected_seq: JsValue,
        #[wasm_bindgen(unchecked_param_type = "EventInput")] event: JsValue,
        #[wasm_bindgen(unchecked_param_type = "CommandInput[]")] commands: JsValue,
        #[wasm_bindgen(js_name = now, unchecked_optional_param_type = "number")] now_ms: JsValue,
    ) -> Result<JsValue, JsValue> {
        let workflow = workflow_id(&workflow)?;
        let expected = Seq::new(whole("expectedSeq", &expected_seq)?).js()?;
        let event = types::event("event", &event)?;
        let decision = types::commands("commands", &commands)?;
        let commit = Commit::new(workflow, expected, event, decision, now(&now_ms)?).js()?;
        self.write()?.append_with_commands(&commit).js()?;
        to_js(&HandledOutput::from(miniflow_core::Handled {
            seq: commit.last_seq(),
            command_ids: commit
                .commands()
                .iter()
                .map(|r| r.command_id.clone())
                .collect(),
            timer_ids: Vec::new(),
            conflicts: 0,
        }))
    }

    /// The events of a workflow, in seq order.
    #[wasm_bindgen(unchecked_return_type = "EventRecord[]")]
    pub fn load(
        &self,
        #[wasm_bindgen(js_name = workflowId, unchecked_param_type = "string")] workflow: JsValue,
    ) -> Result<JsValue, JsValue> {
        to_js(&self.read()?.load(&workflow_id(&workflow)?).js()?)
    }

    /// Up to `limit` unfinished commands, by `(workflow_id, event_seq, index)`.
    #[wasm_bindgen(unchecked_return_type = "OutboxRow[]")]
    pub fn pending(
        &self,
        #[wasm_bindgen(unchecked_optional_param_type = "number")] limit: JsValue,
    ) -> Result<JsValue, JsValue> {
        to_js(
            &self
                .read()?
                .pending(count("limit", &limit, usize::MAX)?)
                .js()?,
        )
    }

    /// One outbox row, or `null`.
    #[wasm_bindgen(unchecked_return_type = "OutboxRow | null")]
    pub fn command(
        &self,
        #[wasm_bindgen(js_name = commandId, unchecked_param_type = "string")] id: JsValue,
    ) -> Result<JsValue, JsValue> {
        to_js(&self.read()?.command(&command_id(&id)?).js()?)
    }

    /// Every outbox row of a workflow.
    #[wasm_bindgen(unchecked_return_type = "OutboxRow[]")]
    pub fn commands(
        &self,
        #[wasm_bindgen(js_name = workflowId, unchecked_param_type = "string")] workflow: JsValue,
    ) -> Result<JsValue, JsValue> {
        to_js(&self.read()?.commands(&workflow_id(&workflow)?).js()?)
    }

    /// Marks a command done without a lease; harmless when repeated. Throws `INVALID_STATE` when dead.
    #[wasm_bindgen(js_name = markDone)]
    pub fn mark_done(
        &self,
        #[wasm_bindgen(js_name = commandId, unchecked_param_type = "string")] id: JsValue,
        #[wasm_bindgen(js_name = now, unchecked_optional_param_type = "number")] now_ms: JsValue,
    ) -> Result<(), JsValue> {
        self.write()?
            .mark_done(&command_id(&id)?, now(&now_ms)?)
            .js()
    }

    /// Leases up to `request.limit` due commands, each with a fresh fencing token.
    #[wasm_bindgen(unchecked_return_type = "Delivery[]")]
    pub fn claim(
        &self,
        #[wasm_bindgen(unchecked_param_type = "ClaimRequest")] request: JsValue,
        #[wasm_bindgen(js_name = now, unchecked_optional_param_type = "number")] now_ms: JsValue,
    ) -> Result<JsValue, JsValue> {
        let request = types::claim_request(&request)?;
        let now = now(&now_ms)?;
        let claimed = self.write()?.claim(&request, now).js()?;
        to_js(&claimed)
    }

    /// Extends the lease of `token` (never shortening it); returns the new expiry and whether the
    /// workflow cancelled the command meanwhile. Throws `STALE_LEASE` after a takeover.
    #[wasm_bindgen(unchecked_return_type = "Extended")]
    pub fn extend(
        &self,
        #[wasm_bindgen(js_name = commandId, unchecked_param_type = "string")] id: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number")] token: JsValue,
        #[wasm_bindgen(js_name = leaseTtlMs, unchecked_param_type = "number")]
        lease_ttl_ms: JsValue,
        #[wasm_bindgen(js_name = now, unchecked_optional_param_type = "number")] now_ms: JsValue,
    ) -> Result<JsValue, JsValue> {
        let (id, token) = (command_id(&id)?, whole("token", &token)?);
        let until = self
            .write()?
            .extend(
                &id,
                token,
                millis("leaseTtlMs", &lease_ttl_ms)?,
                now(&now_ms)?,
            )
            .js()?;
        to_js(&until)
    }

    /// Marks the delivery under `token` done. Throws `STALE_LEASE` after a takeover (nothing changes).
    pub fn complete(
        &self,
        #[wasm_bindgen(js_name = commandId, unchecked_param_type = "string")] id: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number")] token: JsValue,
        #[wasm_bindgen(js_name = now, unchecked_optional_param_type = "number")] now_ms: JsValue,
    ) -> Result<(), JsValue> {
        let (id, token, now) = (command_id(&id)?, whole("token", &token)?, now(&now_ms)?);
        self.write()?.complete(&id, token, None, now).js()
    }

    /// Marks the delivery under `token` done with the receiver's `result` (kept on the command, and
    /// carried back into the workflow as a `command_completed` event when the command asked for it).
    /// Throws `STALE_LEASE` after a takeover, `INVALID_INPUT` for a result past the JSON limits
    /// (nothing changes).
    #[wasm_bindgen(js_name = completeWith)]
    pub fn complete_with(
        &self,
        #[wasm_bindgen(js_name = commandId, unchecked_param_type = "string")] id: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number")] token: JsValue,
        #[wasm_bindgen(unchecked_param_type = "Json")] result: JsValue,
        #[wasm_bindgen(js_name = now, unchecked_optional_param_type = "number")] now_ms: JsValue,
    ) -> Result<(), JsValue> {
        let (id, token) = (command_id(&id)?, whole("token", &token)?);
        let (result, now) = (json("result", &result)?, now(&now_ms)?);
        self.write()?.complete(&id, token, Some(&result), now).js()
    }

    /// Settles a failed delivery: back to pending after the policy's backoff, or dead.
    #[wasm_bindgen(unchecked_return_type = "Settled")]
    pub fn fail(
        &self,
        #[wasm_bindgen(js_name = commandId, unchecked_param_type = "string")] id: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number")] token: JsValue,
        #[wasm_bindgen(unchecked_param_type = "FailureInput")] failure: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "RetryPolicyInput")] policy: JsValue,
        #[wasm_bindgen(js_name = now, unchecked_optional_param_type = "number")] now_ms: JsValue,
    ) -> Result<JsValue, JsValue> {
        let (id, token) = (command_id(&id)?, whole("token", &token)?);
        let (failure, policy) = (types::failure(&failure)?, types::retry_policy(&policy)?);
        let now = now(&now_ms)?;
        let settled = self
            .write()?
            .fail(&id, token, &failure, &policy, now)
            .js()?;
        to_js(&settled)
    }

    /// Gives back a claimed command whose delivery was not started.
    pub fn release(
        &self,
        #[wasm_bindgen(js_name = commandId, unchecked_param_type = "string")] id: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number")] token: JsValue,
        #[wasm_bindgen(js_name = now, unchecked_optional_param_type = "number")] now_ms: JsValue,
    ) -> Result<(), JsValue> {
        let (id, token, now) = (command_id(&id)?, whole("token", &token)?, now(&now_ms)?);
        self.write()?.release(&id, token, now).js()
    }

    /// Up to `limit` dead commands.
    #[wasm_bindgen(js_name = deadLetters, unchecked_return_type = "OutboxRow[]")]
    pub fn dead_letters(
        &self,
        #[wasm_bindgen(unchecked_optional_param_type = "number")] limit: JsValue,
    ) -> Result<JsValue, JsValue> {
        to_js(
            &self
                .read()?
                .dead_letters(count("limit", &limit, usize::MAX)?)
                .js()?,
        )
    }

    /// Puts a dead command back to pending. Throws `INVALID_STATE` for a live command.
    pub fn retry(
        &self,
        #[wasm_bindgen(js_name = commandId, unchecked_param_type = "string")] id: JsValue,
        #[wasm_bindgen(js_name = now, unchecked_optional_param_type = "number")] now_ms: JsValue,
    ) -> Result<(), JsValue> {
        let (id, now) = (command_id(&id)?, now(&now_ms)?);
        self.write()?.retry(&id, now).js()
    }

    /// Closes a dead command by hand with a note. Throws `INVALID_STATE` for a live command.
    pub fn resolve(
        &self,
        #[wasm_bindgen(js_name = commandId, unchecked_param_type = "string")] id: JsValue,
        #[wasm_bindgen(unchecked_param_type = "string")] note: JsValue,
        #[wasm_bindgen(js_name = now, unchecked_optional_param_type = "number")] now_ms: JsValue,
    ) -> Result<(), JsValue> {
        let (id, note, now) = (command_id(&id)?, string("note", &note)?, now(&now_ms)?);
        self.write()?.resolve(&id, &note, now).js()
    }

    /// Deletes up to `batch` (default 1,000) done commands processed at least `olderThanMs` ago;
    /// returns how many.
    #[wasm_bindgen(js_name = purgeDone, unchecked_return_type = "number")]
    pub fn purge_done(
        &self,
        #[wasm_bindgen(js_name = olderThanMs, unchecked_param_type = "number")]
        older_than_ms: JsValue,
        #[wasm_bindgen(js_name = now, unchecked_optional_param_type = "number")] now_ms: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "number")] batch: JsValue,
    ) -> Result<JsValue, JsValue> {
        let older_than = millis("olderThanMs", &older_than_ms)?;
        let (now, batch) = (now(&now_ms)?, count("batch", &batch, 1_000)?);
        let purged = self.write()?.purge_done(older_than, now, batch).js()?;
        Ok(JsValue::from(purged as f64))
    }

    /// Takes up to `limit` due timers for `leaseTtlMs`.
    #[wasm_bindgen(js_name = claimTimers, unchecked_return_type = "TimerRow[]")]
    pub fn claim_timers(
        &self,
        #[wasm_bindgen(unchecked_param_type = "number")] limit: JsValue,
        #[wasm_bindgen(js_name = leaseTtlMs, unchecked_param_type = "number")]
        lease_ttl_ms: JsValue,
        #[wasm_bindgen(js_name = now, unchecked_optional_param_type = "number")] now_ms: JsValue,
    ) -> Result<JsValue, JsValue> {
        let limit = count("limit", &limit, 1)?;
        let (ttl, now) = (millis("leaseTtlMs", &lease_ttl_ms)?, now(&now_ms)?);
        let taken = self.write()?.claim_timers(limit, ttl, now).js()?;
        to_js(&taken)
    }

    /// Every timer of a workflow.
    #[wasm_bindgen(unchecked_return_type = "TimerRow[]")]
    pub fn timers(
        &self,
        #[wasm_bindgen(js_name = workflowId, unchecked_param_type = "string")] workflow: JsValue,
    ) -> Result<JsValue, JsValue> {
        to_js(&self.read()?.timers(&workflow_id(&workflow)?).js()?)
    }
}
