//! `Engine` for JS: workflows written in JS, run by the core's engine (replay → decide → commit).

use std::cell::{Cell, RefCell};

use js_sys::Function;
use miniflow_core::backend::HistoryId;
use miniflow_core::AppendedAfter;
use miniflow_core::{
    Commit, Decision, Engine, Error, Event, EventLog, EventRecord, Handled, MemoryStore, Seq,
    TimerId, TimerRow, Timers, Timestamp, Workflow, WorkflowId,
};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

use crate::convert::{now, string, to_js, workflow_id};
use crate::error::{invalid, reentrant, IntoJs};
use crate::store::JsMemoryStore;
use crate::types::{self, HandledOutput};

/// A JS workflow definition: `{ init?, evolve, decide }`.
struct JsWorkflow {
    this: JsValue,
    init: Option<Function>,
    evolve: Function,
    decide: Function,
    /// The first exception a callback threw during the current call; rethrown to the caller.
    thrown: RefCell<Option<JsValue>>,
}

/// A JS state; `None` until the first `evolve` (or `init`).
#[derive(Default)]
struct JsState(Option<JsValue>);

impl JsWorkflow {
    fn state(&self, state: &JsState) -> JsValue {
        match (&state.0, &self.init) {
            (Some(value), _) => value.clone(),
            (None, Some(init)) => init.call0(&self.this).unwrap_or_else(|e| self.remember(e)),
            (None, None) => JsValue::UNDEFINED,
        }
    }

    fn remember(&self, thrown: JsValue) -> JsValue {
        self.thrown.borrow_mut().get_or_insert(thrown);
        JsValue::UNDEFINED
    }

    fn failed(&self) -> bool {
        self.thrown.borrow().is_some()
    }
}

impl Workflow for JsWorkflow {
    type State = JsState;

    fn evolve(&self, state: &mut JsState, event: &EventRecord) {
        if self.failed() {
            return;
        }
        let current = self.state(state);
        let next = to_js(event).and_then(|event| self.evolve.call2(&self.this, &current, &event));
        state.0 = Some(next.unwrap_or_else(|e| self.remember(e)));
    }

    fn decide(&self, state: &JsState, event: &EventRecord) -> Decision {
        if self.failed() {
            return Decision::reject("the workflow threw");
        }
        let current = self.state(state);
        let decided = to_js(event)
            .and_then(|event| self.decide.call2(&self.this, &current, &event))
            .and_then(|decision| types::decision(&decision));
        match decided {
            Ok(decision) => decision,
            Err(e) => {
                self.remember(e);
                Decision::reject("the workflow threw")
            }
        }
    }
}

/// The store the engine records events and fires timers into: the store itself, except that a
/// timer is not rejected when the rejection stands for a callback's exception. The workflow threw: nothing is written, the
/// exception is rethrown, and the timer stays as it was, to be fired again once its lease runs out
/// (as a panic leaves it in Rust). Only a decision's own `reject` rejects a timer.
struct Firing<'a> {
    store: &'a mut MemoryStore,
    workflow: &'a JsWorkflow,
}

impl EventLog for Firing<'_> {
    fn load(&self, workflow_id: &WorkflowId) -> Result<Vec<EventRecord>, Error> {
        self.store.load(workflow_id)
    }
    fn load_after(&self, workflow_id: &WorkflowId, after: Seq) -> Result<Vec<EventRecord>, Error> {
        self.store.load_after(workflow_id, after)
    }
    fn history_id(&self) -> Option<HistoryId> {
        self.store.history_id()
    }
    fn append_with_commands(&mut self, commit: &Commit) -> Result<(), Error> {
        self.store.append_with_commands(commit)
    }
    fn append_after(
        &mut self,
        last: &EventRecord,
        commit: &Commit,
    ) -> Result<AppendedAfter, Error> {
        self.store.append_after(last, commit)
    }
}

impl Timers for Firing<'_> {
    fn claim_timers(
        &mut self,
        limit: usize,
        lease_ttl: std::time::Duration,
        now: Timestamp,
    ) -> Result<Vec<TimerRow>, Error> {
        self.store.claim_timers(limit, lease_ttl, now)
    }
    fn reject_timer(
        &mut self,
        timer_id: &TimerId,
        reason: &str,
        now: Timestamp,
    ) -> Result<(), Error> {
        if self.workflow.failed() {
            return Ok(());
        }
        self.store.reject_timer(timer_id, reason, now)
    }
    fn timers(&self, workflow_id: &WorkflowId) -> Result<Vec<TimerRow>, Error> {
        self.store.timers(workflow_id)
    }
}

/// Runs a JS workflow against a `MemoryStore`: replay → decide → commit, retrying conflicts. An
/// exception thrown by `init`, `evolve` or `decide` is rethrown as it is, and nothing is written.
#[wasm_bindgen(js_name = Engine)]
pub struct JsEngine {
    engine: Engine<JsWorkflow>,
    /// A call is running (its callbacks may call back into JS, and JS back into the engine).
    busy: Cell<bool>,
}

impl JsEngine {
    /// Runs `call`, then rethrows a callback's exception if one was thrown. A state folded while a
    /// callback threw is not the workflow's state: the engine's cached states are dropped then. A
    /// call from inside one of the workflow's callbacks is `REENTRANT_CALL`.
    fn guarded<T>(
        &self,
        call: impl FnOnce(&Engine<JsWorkflow>) -> Result<T, JsValue>,
    ) -> Result<T, JsValue> {
        if self.busy.replace(true) {
            return Err(reentrant("Engine"));
        }
        self.engine.workflow().thrown.borrow_mut().take();
        let result = call(&self.engine);
        self.busy.set(false);
        let thrown = self.engine.workflow().thrown.borrow_mut().take();
        match thrown {
            Some(thrown) => {
                self.engine.clear_state_cache();
                Err(thrown)
            }
            None => result,
        }
    }
}

impl JsEngine {
    /// Reads the arguments `handle` and `start` share, runs `commit` (one of the engine's calls that
    /// record an event) on the store, guarded, and returns what it handled.
    fn record(
        &self,
        store: &JsMemoryStore,
        workflow: &JsValue,
        event: &JsValue,
        now_ms: &JsValue,
        commit: impl FnOnce(
            &Engine<JsWorkflow>,
            &mut Firing<'_>,
            &WorkflowId,
            Event,
            Timestamp,
        ) -> Result<Handled, Error>,
    ) -> Result<JsValue, JsValue> {
        let workflow = workflow_id(workflow)?;
        let event = types::event("event", event)?;
        let now = now(now_ms)?;
        self.guarded(|engine| {
            // Through the same store type as `fire`, so that the engine's code is in the module once.
            let mut store = Firing {
                store: &mut *store.write()?,
                workflow: engine.workflow(),
            };
            let handled = commit(engine, &mut store, &workflow, event, now).js()?;
            to_js(&HandledOutput::from(handled))
        })
    }
}

#[wasm_bindgen(js_class = Engine)]
impl JsEngine {
    /// An engine for `workflow` (`{ init?, evolve, decide }`).
    #[wasm_bindgen(constructor)]
    pub fn new(
        #[wasm_bindgen(unchecked_param_type = "Workflow<S, E>")] workflow: JsValue,
    ) -> Result<JsEngine, JsValue> {
        let function = |name: &str| -> Result<Option<Function>, JsValue> {
            let value = js_sys::Reflect::get(&workflow, &name.into()).unwrap_or(JsValue::UNDEFINED);
            if value.is_undefined() {
                return Ok(None);
            }
            value
                .dyn_into::<Function>()
                .map(Some)
                .map_err(|_| invalid(&format!("workflow.{name}"), "is not a function"))
        };
        if !workflow.is_object() {
            return Err(invalid(
                "workflow",
                "expected an object with evolve and decide functions",
            ));
        }
        let evolve = function("evolve")?.ok_or_else(|| invalid("workflow.evolve", "is missing"))?;
        let decide = function("decide")?.ok_or_else(|| invalid("workflow.decide", "is missing"))?;
        let workflow = JsWorkflow {
            init: function("init")?,
            this: workflow,
            evolve,
            decide,
            thrown: RefCell::new(None),
        };
        Ok(Self {
            engine: Engine::new(workflow),
            busy: Cell::new(false),
        })
    }

    /// The state of a workflow rebuilt from its events, with its last seq (0 for a new workflow).
    #[wasm_bindgen(unchecked_return_type = "Replayed<S>")]
    pub fn replay(
        &self,
        store: &JsMemoryStore,
        #[wasm_bindgen(js_name = workflowId, unchecked_param_type = "string")] workflow: JsValue,
    ) -> Result<JsValue, JsValue> {
        let workflow = workflow_id(&workflow)?;
        self.guarded(|engine| {
            let replayed = engine.replay(&*store.read()?, &workflow).js()?;
            let result = js_sys::Object::new();
            let state = engine.workflow().state(&replayed.state);
            js_sys::Reflect::set(&result, &"state".into(), &state)?;
            js_sys::Reflect::set(
                &result,
                &"last_seq".into(),
                &(replayed.last_seq.get() as f64).into(),
            )?;
            Ok(result.into())
        })
    }

    /// Records `event` in a workflow with the commands and timers its `decide` returns, in one commit.
    #[wasm_bindgen(unchecked_return_type = "Handled")]
    pub fn handle(
        &self,
        store: &JsMemoryStore,
        #[wasm_bindgen(js_name = workflowId, unchecked_param_type = "string")] workflow: JsValue,
        #[wasm_bindgen(unchecked_param_type = "EventInput")] event: JsValue,
        #[wasm_bindgen(js_name = now, unchecked_optional_param_type = "number")] now_ms: JsValue,
    ) -> Result<JsValue, JsValue> {
        self.record(
            store,
            &workflow,
            &event,
            &now_ms,
            |engine, store, id, event, now| engine.handle(store, id, event, now),
        )
    }

    /// Starts a workflow with `event` as its first event, without reading the store first: its
    /// `decide` sees `init()`'s state, and the commit is refused (`CONFLICT`) if the workflow
    /// already has events, so a repeated create request cannot start it twice.
    #[wasm_bindgen(unchecked_return_type = "Handled")]
    pub fn start(
        &self,
        store: &JsMemoryStore,
        #[wasm_bindgen(js_name = workflowId, unchecked_param_type = "string")] workflow: JsValue,
        #[wasm_bindgen(unchecked_param_type = "EventInput")] event: JsValue,
        #[wasm_bindgen(js_name = now, unchecked_optional_param_type = "number")] now_ms: JsValue,
    ) -> Result<JsValue, JsValue> {
        self.record(
            store,
            &workflow,
            &event,
            &now_ms,
            |engine, store, id, event, now| engine.start(store, id, event, now),
        )
    }

    /// Fires a due timer from `claimTimers` (the store's row of its `timer_id`): commits its event
    /// through decide, once. Returns `null` when another firer won or it was cancelled.
    #[wasm_bindgen(unchecked_return_type = "Handled | null")]
    pub fn fire(
        &self,
        store: &JsMemoryStore,
        #[wasm_bindgen(unchecked_param_type = "TimerRow")] timer: JsValue,
        #[wasm_bindgen(js_name = now, unchecked_optional_param_type = "number")] now_ms: JsValue,
    ) -> Result<JsValue, JsValue> {
        let id = js_sys::Reflect::get(&timer, &"timer_id".into()).unwrap_or(JsValue::UNDEFINED);
        let id: TimerId = string("timer.timer_id", &id)?
            .parse()
            .map_err(|e| invalid("timer.timer_id", e))?;
        let now = now(&now_ms)?;
        self.guarded(|engine| {
            let mut store = store.write()?;
            let Some(timer) = store.timer(&id).cloned() else {
                return Err(invalid(
                    "timer",
                    format!("{id} is not a timer of this store"),
                ));
            };
            let mut firing = Firing {
                store: &mut store,
                workflow: engine.workflow(),
            };
            match engine.fire(&mut firing, &timer, now).js()? {
                Some(handled) => to_js(&HandledOutput::from(handled)),
                None => Ok(JsValue::NULL),
            }
        })
    }
}
