//! The one place core errors become JS errors: a thrown `Error` with a stable `code`.

use miniflow_core::Error;
use wasm_bindgen::JsValue;

/// A JS `Error` with `message` and a stable `code` property (`CONFLICT`, `STALE_LEASE`, …).
pub fn js_error(code: &str, message: &str) -> JsValue {
    let error = js_sys::Error::new(message);
    // Setting a property on a fresh Error object cannot fail.
    let _ = js_sys::Reflect::set(&error, &"code".into(), &code.into());
    error.into()
}

/// A core error as a JS error with its [`Error::code`].
pub fn from_core(error: Error) -> JsValue {
    js_error(error.code(), &error.to_string())
}

/// An `INVALID_INPUT` error naming the argument and what was wrong with it.
pub fn invalid(field: &str, reason: impl std::fmt::Display) -> JsValue {
    js_error("INVALID_INPUT", &format!("invalid {field}: {reason}"))
}

/// Core results as JS results.
pub trait IntoJs<T> {
    /// Maps the error to a JS error.
    fn js(self) -> Result<T, JsValue>;
}

impl<T> IntoJs<T> for Result<T, Error> {
    fn js(self) -> Result<T, JsValue> {
        self.map_err(from_core)
    }
}
