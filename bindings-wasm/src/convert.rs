//! Values across the boundary: JSON-shaped JS values in and out, numbers checked, time from JS.

use std::time::Duration;

use miniflow_core::{CommandId, Timestamp, WorkflowId};
use serde::de::DeserializeOwned;
use serde::Serialize;
use wasm_bindgen::{JsCast, JsValue};

use crate::error::{from_core, invalid, js_error};

/// The largest integer JavaScript represents exactly: 2^53 − 1.
const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_991.0;

/// A JSON-shaped JS value as `T`.
pub fn from_js<T: DeserializeOwned>(field: &str, value: &JsValue) -> Result<T, JsValue> {
    let text = js_sys::JSON::stringify(value)
        .map_err(|e| invalid(field, format!("is not JSON ({})", describe(&e))))?;
    let text = text
        .as_string()
        .ok_or_else(|| invalid(field, "is not JSON (undefined or a function)"))?;
    serde_json::from_str(&text).map_err(|e| invalid(field, format!("{e} in {}", abbreviate(&text))))
}

/// `value` as a plain JS value (objects, arrays, numbers, strings).
pub fn to_js<T: Serialize>(value: &T) -> Result<JsValue, JsValue> {
    let text = serde_json::to_string(value)
        .map_err(|e| js_error("INTERNAL", &format!("cannot serialize a result: {e}")))?;
    js_sys::JSON::parse(&text)
}

fn describe(error: &JsValue) -> String {
    error
        .dyn_ref::<js_sys::Error>()
        .map(|e| String::from(e.message()))
        .unwrap_or_else(|| format!("{error:?}"))
}

fn abbreviate(text: &str) -> String {
    match text.char_indices().nth(80) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// What kind of JS value `value` is, for error messages.
fn type_of(value: &JsValue) -> String {
    value
        .js_typeof()
        .as_string()
        .unwrap_or_else(|| "unknown".into())
}

/// A string argument.
pub fn string(field: &str, value: &JsValue) -> Result<String, JsValue> {
    value
        .as_string()
        .ok_or_else(|| invalid(field, format!("expected a string, got {}", type_of(value))))
}

/// A non-negative integer argument that JS represents exactly.
pub fn whole(field: &str, value: &JsValue) -> Result<u64, JsValue> {
    let number = value
        .as_f64()
        .ok_or_else(|| invalid(field, format!("expected a number, got {}", type_of(value))))?;
    if !number.is_finite() || number.fract() != 0.0 || number < 0.0 {
        return Err(invalid(
            field,
            format!("{number} is not a whole number ≥ 0"),
        ));
    }
    if number > MAX_SAFE_INTEGER {
        return Err(invalid(
            field,
            format!("{number} is past 2^53 − 1, the largest exact integer"),
        ));
    }
    Ok(number as u64)
}

/// An optional integer argument: `undefined` or `null` is `None`.
pub fn optional_whole(field: &str, value: &JsValue) -> Result<Option<u64>, JsValue> {
    if value.is_undefined() || value.is_null() {
        return Ok(None);
    }
    whole(field, value).map(Some)
}

/// An optional count argument, defaulting to `default`.
pub fn count(field: &str, value: &JsValue, default: usize) -> Result<usize, JsValue> {
    Ok(optional_whole(field, value)?.map_or(default, |n| usize::try_from(n).unwrap_or(usize::MAX)))
}

/// Milliseconds as a duration.
pub fn millis(field: &str, value: &JsValue) -> Result<Duration, JsValue> {
    whole(field, value).map(Duration::from_millis)
}

/// The caller's `now` (ms since the epoch), or `Date.now()`: time comes from JS, never from Rust.
pub fn now(value: &JsValue) -> Result<Timestamp, JsValue> {
    let millis = match optional_whole("now", value)? {
        Some(millis) => millis,
        None => js_sys::Date::now().floor() as u64,
    };
    Ok(Timestamp::from_millis(millis))
}

/// A workflow ID argument.
pub fn workflow_id(value: &JsValue) -> Result<WorkflowId, JsValue> {
    WorkflowId::new(string("workflowId", value)?).map_err(from_core)
}

/// A command ID argument.
pub fn command_id(value: &JsValue) -> Result<CommandId, JsValue> {
    string("commandId", value)?.parse().map_err(from_core)
}
