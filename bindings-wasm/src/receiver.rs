//! The receiver's side for JS: `IdempotencyStore` and `digest`. Without the `receiver` feature (the
//! web build) both keep their place in the API and throw `INVALID_INPUT` naming the feature; nothing
//! of the receiver's store or digests is then in the module.
// Without the feature, each method of `IdempotencyStore` ends on its first line (no store exists).
#![cfg_attr(not(feature = "receiver"), allow(unused))]

use std::cell::{RefCell, RefMut};

use js_sys::Function;
use miniflow_core::{Begin, Digest, IdempotencyKey, IdempotencyStore, MemoryIdempotencyStore};
use serde_json::Value;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

use crate::convert::{count, items, json, now, string, to_js, whole};
use crate::error::{from_core, invalid, js_error, reentrant, IntoJs};

fn key(value: &JsValue) -> Result<IdempotencyKey, JsValue> {
    IdempotencyKey::new(string("key", value)?).map_err(from_core)
}

fn parse_digest(value: &JsValue) -> Result<Digest, JsValue> {
    string("digest", value)?.parse().map_err(from_core)
}

/// SHA-256 (hex) of the canonical JSON of `request`, or of only its `fields` (top-level keys or JSON
/// Pointers) when given: the business intent, without timestamps or trace fields. (Not in the web
/// build: there it throws `INVALID_INPUT`.)
#[wasm_bindgen]
pub fn digest(
    #[wasm_bindgen(unchecked_param_type = "Json")] request: JsValue,
    #[wasm_bindgen(unchecked_optional_param_type = "string[]")] fields: JsValue,
) -> Result<String, JsValue> {
    #[cfg(not(feature = "receiver"))]
    {
        let _ = (request, fields);
        Err(missing("digest"))
    }
    #[cfg(feature = "receiver")]
    digest_of(&request, &fields)
}

/// The error of the receiver's API in a build without the `receiver` feature.
#[cfg(not(feature = "receiver"))]
fn missing(what: &str) -> JsValue {
    invalid(
        what,
        "needs the `receiver` feature of miniflow-wasm: the web build leaves it out, the Node.js \
         build has it",
    )
}

#[cfg(feature = "receiver")]
fn digest_of(request: &JsValue, fields: &JsValue) -> Result<String, JsValue> {
    let request = json("request", request)?;
    let fields: Option<Vec<String>> = if fields.is_undefined() {
        None
    } else {
        let mut names = Vec::new();
        for (path, name) in items("fields", fields)? {
            names.push(string(&path, &name)?);
        }
        Some(names)
    };
    Ok(match fields {
        Some(fields) => {
            let fields: Vec<&str> = fields.iter().map(String::as_str).collect();
            // A list that selects nothing of the request gives every request the same digest, so
            // a receiver would answer one request with another's result: refused.
            let present = |field: &&str| match field.strip_prefix('/') {
                Some(_) => request.pointer(field).is_some(),
                None => request.get(field).is_some(),
            };
            if !fields.iter().any(present) {
                return Err(invalid(
                    "fields",
                    "select nothing of the request (none of them is in it): every request would \
                     have the same digest; name the fields that define its intent",
                ));
            }
            Digest::of_intent(&request, &fields)
        }
        None => Digest::of(&request),
    }
    .to_string())
}

/// A receiver's memory of idempotency keys, in memory. (The web build has no receiver's side: there
/// the constructor throws `INVALID_INPUT`; the Node.js build has it.)
#[wasm_bindgen(js_name = IdempotencyStore)]
pub struct JsIdempotencyStore {
    #[cfg(feature = "receiver")]
    inner: RefCell<MemoryIdempotencyStore>,
    /// Without the feature no store is ever made (the constructor throws), so no method runs: each
    /// one ends on its first line, and the module keeps none of their work.
    #[cfg(not(feature = "receiver"))]
    inner: std::convert::Infallible,
}

impl JsIdempotencyStore {
    fn write(&self) -> Result<RefMut<'_, MemoryIdempotencyStore>, JsValue> {
        #[cfg(feature = "receiver")]
        return self
            .inner
            .try_borrow_mut()
            .map_err(|_| reentrant("IdempotencyStore"));
        #[cfg(not(feature = "receiver"))]
        match self.inner {}
    }
}

#[wasm_bindgen(js_class = IdempotencyStore)]
impl JsIdempotencyStore {
    /// An empty store; `policy` defaults to 7 days of retention and 60 s reservations.
    #[wasm_bindgen(constructor)]
    pub fn new(
        #[wasm_bindgen(unchecked_optional_param_type = "IdempotencyPolicyInput")] policy: JsValue,
    ) -> Result<JsIdempotencyStore, JsValue> {
        #[cfg(not(feature = "receiver"))]
        {
            let _ = policy;
            Err(missing("IdempotencyStore"))
        }
        #[cfg(feature = "receiver")]
        {
            let policy = crate::types::idempotency_policy(&policy)?;
            Ok(Self {
                inner: RefCell::new(MemoryIdempotencyStore::new(policy).js()?),
            })
        }
    }

    /// Fresh, completed (with the stored result), conflict (other parameters) or in progress.
    #[wasm_bindgen(unchecked_return_type = "Begin")]
    pub fn begin(
        &self,
        #[wasm_bindgen(js_name = key, unchecked_param_type = "string")] key_value: JsValue,
        #[wasm_bindgen(unchecked_param_type = "string")] digest: JsValue,
        #[wasm_bindgen(js_name = now, unchecked_optional_param_type = "number")] now_ms: JsValue,
    ) -> Result<JsValue, JsValue> {
        #[cfg(not(feature = "receiver"))]
        match self.inner {}
        let (key, digest, now) = (key(&key_value)?, parse_digest(&digest)?, now(&now_ms)?);
        let begun = self.write()?.begin(&key, digest, now).js()?;
        to_js(&begun)
    }

    /// Stores the effect's result under the reservation `token` that `begin` answered `fresh` with.
    /// Throws `STALE_RESERVATION` (changing nothing) when another caller took the key over.
    pub fn finish(
        &self,
        #[wasm_bindgen(js_name = key, unchecked_param_type = "string")] key_value: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number")] token: JsValue,
        #[wasm_bindgen(unchecked_param_type = "Json")] result: JsValue,
        #[wasm_bindgen(js_name = now, unchecked_optional_param_type = "number")] now_ms: JsValue,
    ) -> Result<(), JsValue> {
        #[cfg(not(feature = "receiver"))]
        match self.inner {}
        let (key, token) = (key(&key_value)?, whole("token", &token)?);
        let (result, now) = (json("result", &result)?, now(&now_ms)?);
        self.write()?.finish(&key, token, &result, now).js()
    }

    /// Releases the reservation `token` of a key whose effect did not happen. Throws
    /// `STALE_RESERVATION` (changing nothing) when another caller took the key over.
    pub fn abandon(
        &self,
        #[wasm_bindgen(js_name = key, unchecked_param_type = "string")] key_value: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number")] token: JsValue,
    ) -> Result<(), JsValue> {
        #[cfg(not(feature = "receiver"))]
        match self.inner {}
        let (key, token) = (key(&key_value)?, whole("token", &token)?);
        self.write()?.abandon(&key, token).js()
    }

    /// What the store remembers of a key, or `null`.
    #[wasm_bindgen(unchecked_return_type = "IdempotencyRecord | null")]
    pub fn record(
        &self,
        #[wasm_bindgen(js_name = key, unchecked_param_type = "string")] key_value: JsValue,
    ) -> Result<JsValue, JsValue> {
        #[cfg(not(feature = "receiver"))]
        match self.inner {}
        let key = key(&key_value)?;
        let record = self.write()?.record(&key).js()?;
        to_js(&record)
    }

    /// Forgets up to `batch` records past their retention; returns how many.
    #[wasm_bindgen(unchecked_return_type = "number")]
    pub fn purge(
        &self,
        #[wasm_bindgen(js_name = now, unchecked_optional_param_type = "number")] now_ms: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "number")] batch: JsValue,
    ) -> Result<JsValue, JsValue> {
        #[cfg(not(feature = "receiver"))]
        match self.inner {}
        let (now, batch) = (now(&now_ms)?, count("batch", &batch, 1_000)?);
        let purged = self.write()?.purge(now, batch).js()?;
        Ok(JsValue::from(purged as f64))
    }

    /// The whole receiver protocol around `effect`: on a fresh key runs `effect()` and stores its
    /// result; on a repeat returns the stored result without running it. Throws
    /// `IDEMPOTENCY_CONFLICT` when the key comes back with other parameters, `IN_PROGRESS` while
    /// another caller holds it; if `effect` throws, the reservation is released and the exception
    /// rethrown. `effect` must be synchronous. A result that cannot be stored (not JSON, past the
    /// limits, a Promise) is `INVALID_INPUT`, and the key keeps `null`: the effect ran, and a
    /// repeat must not run it again.
    #[wasm_bindgen(unchecked_return_type = "Json")]
    pub fn run(
        &self,
        #[wasm_bindgen(js_name = key, unchecked_param_type = "string")] key_value: JsValue,
        #[wasm_bindgen(unchecked_param_type = "string")] digest: JsValue,
        #[wasm_bindgen(unchecked_param_type = "() => Json")] effect: JsValue,
        #[wasm_bindgen(js_name = now, unchecked_optional_param_type = "number")] now_ms: JsValue,
    ) -> Result<JsValue, JsValue> {
        #[cfg(not(feature = "receiver"))]
        match self.inner {}
        let key = key(&key_value)?;
        let now = now(&now_ms)?;
        let effect: Function = effect
            .dyn_into()
            .map_err(|_| invalid("effect", "is not a function"))?;
        let digest = parse_digest(&digest)?;
        let begun = self.write()?.begin(&key, digest, now).js()?;
        let token = match begun {
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
        let result = match effect.call0(&JsValue::UNDEFINED) {
            Ok(result) => result,
            Err(thrown) => {
                self.write()?.abandon(&key, token).js()?;
                return Err(thrown);
            }
        };
        // The effect ran: its key is completed whatever becomes of its result. One that cannot be
        // stored (not JSON, past the limits, a Promise of an async effect) is refused, and the key
        // keeps `null` instead, so that no repeat runs the effect again.
        let kept = json("effect result", &result)
            .and_then(|stored| self.write()?.finish(&key, token, &stored, now).js());
        match kept {
            Ok(()) => Ok(result),
            Err(refused) => {
                self.write()?.finish(&key, token, &Value::Null, now).js()?;
                Err(refused)
            }
        }
    }
}
