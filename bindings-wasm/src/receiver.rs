//! The receiver's side for JS: `IdempotencyStore` and `digest`.

use std::time::Duration;

use js_sys::Function;
use miniflow_core::{
    Begin, Digest, IdempotencyKey, IdempotencyPolicy, IdempotencyStore, MemoryIdempotencyStore,
};
use serde_json::Value;
use wasm_bindgen::prelude::*;

use crate::convert::{count, from_js, now, string, to_js, whole};
use crate::error::{from_core, invalid, js_error, IntoJs};
use crate::types::IdempotencyPolicyInput;
use wasm_bindgen::JsCast;

fn key(value: &JsValue) -> Result<IdempotencyKey, JsValue> {
    IdempotencyKey::new(string("key", value)?).map_err(from_core)
}

fn parse_digest(value: &JsValue) -> Result<Digest, JsValue> {
    string("digest", value)?.parse().map_err(from_core)
}

/// SHA-256 (hex) of the canonical JSON of `request`, or of only its `fields` (top-level keys or JSON
/// Pointers) when given: the business intent, without timestamps or trace fields.
#[wasm_bindgen]
pub fn digest(
    #[wasm_bindgen(unchecked_param_type = "Json")] request: JsValue,
    #[wasm_bindgen(unchecked_optional_param_type = "string[]")] fields: JsValue,
) -> Result<String, JsValue> {
    let request: Value = from_js("request", &request)?;
    let fields: Option<Vec<String>> = if fields.is_undefined() || fields.is_null() {
        None
    } else {
        Some(from_js("fields", &fields)?)
    };
    Ok(match fields {
        Some(fields) => {
            let fields: Vec<&str> = fields.iter().map(String::as_str).collect();
            Digest::of_intent(&request, &fields)
        }
        None => Digest::of(&request),
    }
    .to_string())
}

/// A receiver's memory of idempotency keys, in memory.
#[wasm_bindgen(js_name = IdempotencyStore)]
pub struct JsIdempotencyStore {
    inner: MemoryIdempotencyStore,
}

#[wasm_bindgen(js_class = IdempotencyStore)]
impl JsIdempotencyStore {
    /// An empty store; `policy` defaults to 7 days of retention and 60 s reservations.
    #[wasm_bindgen(constructor)]
    pub fn new(
        #[wasm_bindgen(unchecked_param_type = "IdempotencyPolicyInput | undefined")]
        policy: JsValue,
    ) -> Result<JsIdempotencyStore, JsValue> {
        let input: IdempotencyPolicyInput = if policy.is_undefined() || policy.is_null() {
            IdempotencyPolicyInput::default()
        } else {
            from_js("policy", &policy)?
        };
        let defaults = IdempotencyPolicy::default();
        let policy = IdempotencyPolicy {
            retention: input
                .retention_ms
                .map_or(defaults.retention, Duration::from_millis),
            reservation_timeout: input
                .reservation_timeout_ms
                .map_or(defaults.reservation_timeout, Duration::from_millis),
        };
        Ok(Self {
            inner: MemoryIdempotencyStore::new(policy).js()?,
        })
    }

    /// Fresh, completed (with the stored result), conflict (other parameters) or in progress.
    #[wasm_bindgen(unchecked_return_type = "Begin")]
    pub fn begin(
        &mut self,
        #[wasm_bindgen(js_name = key, unchecked_param_type = "string")] key_value: JsValue,
        #[wasm_bindgen(unchecked_param_type = "string")] digest: JsValue,
        #[wasm_bindgen(js_name = now, unchecked_optional_param_type = "number")] now_ms: JsValue,
    ) -> Result<JsValue, JsValue> {
        to_js(
            &self
                .inner
                .begin(&key(&key_value)?, parse_digest(&digest)?, now(&now_ms)?)
                .js()?,
        )
    }

    /// Stores the effect's result under the reservation `token` that `begin` answered `fresh` with.
    /// Throws `STALE_RESERVATION` (changing nothing) when another caller took the key over.
    pub fn finish(
        &mut self,
        #[wasm_bindgen(js_name = key, unchecked_param_type = "string")] key_value: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number")] token: JsValue,
        #[wasm_bindgen(unchecked_param_type = "Json")] result: JsValue,
        #[wasm_bindgen(js_name = now, unchecked_optional_param_type = "number")] now_ms: JsValue,
    ) -> Result<(), JsValue> {
        let result: Value = from_js("result", &result)?;
        self.inner
            .finish(
                &key(&key_value)?,
                whole("token", &token)?,
                &result,
                now(&now_ms)?,
            )
            .js()
    }

    /// Releases the reservation `token` of a key whose effect did not happen. Throws
    /// `STALE_RESERVATION` (changing nothing) when another caller took the key over.
    pub fn abandon(
        &mut self,
        #[wasm_bindgen(js_name = key, unchecked_param_type = "string")] key_value: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number")] token: JsValue,
    ) -> Result<(), JsValue> {
        self.inner
            .abandon(&key(&key_value)?, whole("token", &token)?)
            .js()
    }

    /// What the store remembers of a key, or `null`.
    #[wasm_bindgen(unchecked_return_type = "IdempotencyRecord | null")]
    pub fn record(
        &self,
        #[wasm_bindgen(js_name = key, unchecked_param_type = "string")] key_value: JsValue,
    ) -> Result<JsValue, JsValue> {
        to_js(&self.inner.record(&key(&key_value)?).js()?)
    }

    /// Forgets up to `batch` records past their retention; returns how many.
    #[wasm_bindgen(unchecked_return_type = "number")]
    pub fn purge(
        &mut self,
        #[wasm_bindgen(js_name = now, unchecked_optional_param_type = "number")] now_ms: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "number")] batch: JsValue,
    ) -> Result<JsValue, JsValue> {
        let purged = self
            .inner
            .purge(now(&now_ms)?, count("batch", &batch, 1_000)?)
            .js()?;
        Ok(JsValue::from(purged as f64))
    }

    /// The whole receiver protocol around `effect`: on a fresh key runs `effect()` and stores its
    /// result; on a repeat returns the stored result without running it. Throws
    /// `IDEMPOTENCY_CONFLICT` when the key comes back with other parameters, `IN_PROGRESS` while
    /// another caller holds it; if `effect` throws, the reservation is released and the exception
    /// rethrown.
    #[wasm_bindgen(unchecked_return_type = "Json")]
    pub fn run(
        &mut self,
        #[wasm_bindgen(js_name = key, unchecked_param_type = "string")] key_value: JsValue,
        #[wasm_bindgen(unchecked_param_type = "string")] digest: JsValue,
        #[wasm_bindgen(unchecked_param_type = "() => Json")] effect: JsValue,
        #[wasm_bindgen(js_name = now, unchecked_optional_param_type = "number")] now_ms: JsValue,
    ) -> Result<JsValue, JsValue> {
        let key = key(&key_value)?;
        let now = now(&now_ms)?;
        let effect: Function = effect
            .dyn_into()
            .map_err(|_| invalid("effect", "is not a function"))?;
        let token = match self.inner.begin(&key, parse_digest(&digest)?, now).js()? {
            Begin::Fresh { token } => token,
            Begin::Completed { result } => return to_js(&result),
            Begin::InProgress { since } => {
                return Err(js_error("IN_PROGRESS", &format!("key {key} is held by another caller since {since}")))
            }
            Begin::Conflict { stored_digest, new_digest, .. } => {
                return Err(js_error(
                    "IDEMPOTENCY_CONFLICT",
                    &format!("key {key} was used with other parameters (digest {stored_digest}, now {new_digest})"),
                ))
            }
        };
        let outcome = effect.call0(&JsValue::UNDEFINED).and_then(|result| {
            let stored: Value = from_js("effect result", &result)?;
            Ok((result, stored))
        });
        match outcome {
            Ok((result, stored)) => {
                self.inner.finish(&key, token, &stored, now).js()?;
                Ok(result)
            }
            Err(thrown) => {
                self.inner.abandon(&key, token).js()?;
                Err(thrown)
            }
        }
    }
}
