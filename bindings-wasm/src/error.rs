//! The one place core errors become JS errors: a thrown `Error` with a stable `code`.

use miniflow_core::Error;
use wasm_bindgen::prelude::*;

/// Every code a miniflow error carries in JS: the core's kinds, then the bindings' own. The
/// `MiniflowErrorCode` union in the TypeScript types lists the same (a Node test compares them).
pub const CODES: [&str; 18] = [
    "INVALID_INPUT",
    "CONFLICT",
    "REJECTED",
    "NOT_FOUND",
    "RETENTION_TOO_SHORT",
    "STALE_LEASE",
    "STALE_RESERVATION",
    "INVALID_STATE",
    "TIMER_NOT_SCHEDULED",
    "BUSY",
    "UNSUPPORTED_SCHEMA",
    "CORRUPT",
    "STORAGE",
    "IN_PROGRESS",
    "IDEMPOTENCY_CONFLICT",
    "REENTRANT_CALL",
    "USED_AFTER_FREE",
    "INTERNAL",
];

#[wasm_bindgen(typescript_custom_section)]
const TYPES: &str = r#"
/** The `code` of every error miniflow throws. */
export type MiniflowErrorCode =
  | "INVALID_INPUT" | "CONFLICT" | "REJECTED" | "NOT_FOUND" | "RETENTION_TOO_SHORT"
  | "STALE_LEASE" | "STALE_RESERVATION" | "INVALID_STATE" | "TIMER_NOT_SCHEDULED" | "BUSY"
  | "UNSUPPORTED_SCHEMA" | "CORRUPT" | "STORAGE" | "IN_PROGRESS" | "IDEMPOTENCY_CONFLICT"
  | "REENTRANT_CALL" | "USED_AFTER_FREE" | "INTERNAL";
/** The error every failing call throws: `code` says what went wrong, stable across versions;
 * `message` says it for a person, naming the field and the value. */
export interface MiniflowError extends Error { code: MiniflowErrorCode }
/** Whether `error` is an error miniflow threw (an `Error` with one of the codes above). In a
 * `catch (e)`, it narrows `e` so that `e.code` is a `MiniflowErrorCode`. */
export function isMiniflowError(error: unknown): error is MiniflowError;
/** Every `MiniflowErrorCode`, for switches and tests. */
export function errorCodes(): MiniflowErrorCode[];
"#;

/// Whether `error` is an `Error` carrying one of [`CODES`].
#[wasm_bindgen(js_name = isMiniflowError, skip_typescript)]
pub fn is_miniflow_error(error: JsValue) -> bool {
    if !error.is_instance_of::<js_sys::Error>() {
        return false;
    }
    js_sys::Reflect::get(&error, &"code".into())
        .ok()
        .and_then(|code| code.as_string())
        .is_some_and(|code| CODES.contains(&code.as_str()))
}

/// Every code, in [`CODES`] order.
#[wasm_bindgen(js_name = errorCodes, skip_typescript)]
pub fn error_codes() -> js_sys::Array {
    CODES.iter().map(|code| JsValue::from_str(code)).collect()
}

/// A JS `Error` with `message` and a stable `code` property (`CONFLICT`, `STALE_LEASE`, …).
pub fn js_error(code: &str, message: &str) -> JsValue {
    let error = js_sys::Error::new(message);
    // Setting a property on a fresh Error object cannot fail.
    let _ = js_sys::Reflect::set(&error, &"code".into(), &code.into());
    error.into()
}

/// A core error as a JS error with its [`Error::code`].
pub fn from_core(error: impl Into<Error>) -> JsValue {
    let error = error.into();
    js_error(error.code(), &error.to_string())
}

/// An `INVALID_INPUT` error naming the argument and what was wrong with it.
pub fn invalid(field: &str, reason: impl std::fmt::Display) -> JsValue {
    js_error("INVALID_INPUT", &format!("invalid {field}: {reason}"))
}

/// A `REENTRANT_CALL` error: `object` (`MemoryStore`, …) was called while a call on it was still
/// running and had called back into JS.
pub fn reentrant(object: &str) -> JsValue {
    js_error(
        "REENTRANT_CALL",
        &format!(
            "this {object} is in use by a call that has not returned yet (a workflow's init, evolve \
             or decide called back into it): call it after that call returns"
        ),
    )
}

/// Core results as JS results.
pub trait IntoJs<T> {
    /// Maps the error to a JS error.
    fn js(self) -> Result<T, JsValue>;
}

impl<T, E: Into<Error>> IntoJs<T> for Result<T, E> {
    fn js(self) -> Result<T, JsValue> {
        self.map_err(from_core)
    }
}
