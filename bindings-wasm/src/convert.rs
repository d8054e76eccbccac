//! Values across the boundary. In: JSON-shaped JS values read directly (no `JSON.stringify`, which
//! turns `NaN` into `null` and drops what it cannot write), every number checked, option objects read
//! field by field with their camelCase names. Out: miniflow's JSON, parsed by `JSON.parse`. Time from
//! JS.

use std::time::Duration;

use js_sys::{Array, Function, Reflect};
use miniflow_core::{CommandId, Timestamp, WorkflowId};
use serde::Serialize;
use serde_json::{Map, Number, Value};
use wasm_bindgen::{JsCast, JsValue};

use crate::error::{from_core, invalid, js_error};

thread_local! {
    /// JS strings of the field names the bindings read, made once: making a JS string from Rust
    /// text on every read would cost more than the read.
    static NAMES: std::cell::RefCell<Vec<(&'static str, JsValue)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `name` as a JS string, made once per name.
pub fn name(name: &'static str) -> JsValue {
    NAMES.with(|names| {
        let mut names = names.borrow_mut();
        if let Some((_, value)) = names.iter().find(|(known, _)| std::ptr::eq(*known, name)) {
            return value.clone();
        }
        let value = JsValue::from_str(name);
        names.push((name, value.clone()));
        value
    })
}

/// Why a string with a lone surrogate is refused.
const LONE_SURROGATE: &str = "has a lone surrogate (\\uD800 to \\uDFFF unpaired): not text";

/// `value` as Rust text when it is a JS string; `Some(Err(..))` when it is not well-formed UTF-16 (a
/// lone surrogate), which the conversion would silently turn into U+FFFD, making two different
/// strings one. Asked of JS (`String.prototype.isWellFormed`, one call per string).
fn text(value: &JsValue) -> Option<Result<String, &'static str>> {
    let text = value.as_string()?;
    let lossy = !value.unchecked_ref::<js_sys::JsString>().is_well_formed();
    Some(if lossy { Err(LONE_SURROGATE) } else { Ok(text) })
}

/// Field `name` of `object` (`undefined` when absent), or why reading it threw (a getter, a
/// `Proxy`'s trap).
pub fn field(object: &JsValue, name: &'static str) -> Result<JsValue, String> {
    Reflect::get(object, &self::name(name)).map_err(|e| threw(&e))
}

#[wasm_bindgen::prelude::wasm_bindgen]
extern "C" {
    // The reads of a value that may run the caller's code (a getter, a `Proxy`'s trap, a revoked
    // `Proxy`), each catching what it throws: an exception that crossed the module unwinding would
    // leave its stack and borrows behind.
    #[wasm_bindgen(catch, js_namespace = Array, js_name = isArray)]
    fn js_is_array(value: &JsValue) -> Result<bool, JsValue>;
    #[wasm_bindgen(catch, js_namespace = Object, js_name = keys)]
    fn js_keys(value: &JsValue) -> Result<Array, JsValue>;
}

/// Why reading a value threw.
fn threw(error: &JsValue) -> String {
    format!("threw when read: {}", describe(error))
}

/// Whether `value` is an array (`Array.isArray`), or why asking threw.
pub fn is_array(value: &JsValue) -> Result<bool, String> {
    js_is_array(value).map_err(|e| threw(&e))
}

/// The length of the array `value`, or why reading it threw.
fn length(value: &JsValue) -> Result<u32, String> {
    Ok(field(value, "length")?.as_f64().unwrap_or(0.0) as u32)
}

/// Item `i` of the array `value`, or why reading it threw (a getter may).
fn item(value: &JsValue, i: u32) -> Result<JsValue, String> {
    Reflect::get_u32(value, i).map_err(|e| threw(&e))
}

/// Whether `value` (an object) is a plain object, whose prototype is `Object.prototype` (of any
/// realm: the prototype at the root of its chain) or `null`: what JSON holds. A class instance, a
/// `Map`, a `Promise` would read as `{}`.
fn is_plain(value: &JsValue) -> Result<bool, String> {
    let mut prototype: JsValue = value.clone();
    for _ in 0..2 {
        prototype = Reflect::get_prototype_of(&prototype)
            .map_err(|e| threw(&e))?
            .into();
        if prototype.is_null() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The largest integer JavaScript represents exactly: 2^53 − 1.
const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_991.0;

/// How deep a JS value may nest before it is refused outright (the stored limit, 64 levels by
/// default, is checked by the core; this bound only keeps a self-referencing object from running on).
const MAX_WALK_DEPTH: usize = 128;

/// `value` as a plain JS value (objects, arrays, numbers, strings).
pub fn to_js<T: Serialize>(value: &T) -> Result<JsValue, JsValue> {
    // miniflow's rows and JSON values always serialize (string keys, finite numbers, into memory),
    // so serde_json's own wording of a failure is not worth its messages in the module.
    let text = serde_json::to_string(value)
        .map_err(|_| js_error("INTERNAL", "cannot serialize a result as JSON"))?;
    js_sys::JSON::parse(&text)
}

/// What kind of JS value `value` is, for error messages.
fn type_of(value: &JsValue) -> String {
    if value.is_null() {
        return "null".into();
    }
    if is_array(value) == Ok(true) {
        return "an array".into();
    }
    value
        .js_typeof()
        .as_string()
        .unwrap_or_else(|| "unknown".into())
}

/// A JS number as a JSON number: finite, and within ±(2^53 − 1), where JS numbers are exact.
fn json_number(number: f64) -> Result<Number, String> {
    if !number.is_finite() {
        return Err(format!(
            "is {}, which JSON cannot hold (NaN and ±Infinity are not numbers there)",
            js_number(number)
        ));
    }
    if number.abs() > MAX_SAFE_INTEGER {
        return Err(format!(
            "is {}, past ±(2^53 − 1): JavaScript does not hold such numbers exactly; send it as a string",
            show(number)
        ));
    }
    if number.fract() == 0.0 {
        // Whole and within ±2^53: exact as an integer, written without a fraction, like JSON.stringify.
        return Ok(Number::from(number as i64));
    }
    Number::from_f64(number).ok_or_else(|| format!("is {}, not a JSON number", show(number)))
}

/// A number as JS writes it, whole numbers without a fraction (and without `core::fmt`'s float
/// formatting, which is a tenth of the module).
fn show(number: f64) -> String {
    if !number.is_finite() {
        return js_number(number).to_owned();
    }
    if number.fract() == 0.0 && number.abs() < 9e18 {
        return format!("{}", number as i64);
    }
    Number::from_f64(number).map_or_else(String::new, |n| n.to_string())
}

/// A non-finite number as JS writes it.
fn js_number(number: f64) -> &'static str {
    if number.is_nan() {
        "NaN"
    } else if number > 0.0 {
        "Infinity"
    } else {
        "-Infinity"
    }
}

/// Where a value went wrong: the path below the field (built while unwinding), and why.
struct Fault {
    path: Vec<String>,
    reason: String,
}

impl Fault {
    fn new(reason: impl Into<String>) -> Self {
        Self {
            path: Vec::new(),
            reason: reason.into(),
        }
    }

    fn at(mut self, segment: String) -> Self {
        self.path.push(segment);
        self
    }

    fn into_error(self, field: &str) -> JsValue {
        let path: String = self.path.into_iter().rev().collect();
        invalid(&format!("{field}{path}"), self.reason)
    }
}

/// A JSON-shaped JS value (`null`, booleans, finite numbers, strings, arrays, plain objects, and
/// objects with `toJSON` such as dates) as JSON. `undefined` object members are left out, as
/// `JSON.stringify` does; anything JSON cannot hold is refused naming its path (`event.payload.items[2]`).
pub fn json(field: &str, value: &JsValue) -> Result<Value, JsValue> {
    walk(value, 0, false).map_err(|fault| fault.into_error(field))
}

/// A stored JSON value read back (a snapshot's payload): as [`json`], but a number past ±(2^53 − 1)
/// that an older version wrote is kept as it reads, since reads never refuse what writes accepted.
pub fn stored_json(field: &str, value: &JsValue) -> Result<Value, JsValue> {
    walk(value, 0, true).map_err(|fault| fault.into_error(field))
}

fn walk(value: &JsValue, depth: usize, stored: bool) -> Result<Value, Fault> {
    // Numbers and strings first: most leaves are one of them, and each test is a call into JS.
    if let Some(number) = value.as_f64() {
        if stored && number.is_finite() {
            if let Some(large) =
                Number::from_f64(number).filter(|_| number.abs() > MAX_SAFE_INTEGER)
            {
                return Ok(Value::Number(large));
            }
        }
        return json_number(number).map(Value::Number).map_err(Fault::new);
    }
    if let Some(text) = text(value) {
        return text.map(Value::String).map_err(Fault::new);
    }
    if !value.is_object() {
        if let Some(flag) = value.as_bool() {
            return Ok(Value::Bool(flag));
        }
        if value.is_null() {
            return Ok(Value::Null);
        }
        return Err(Fault::new(format!("is {}, not JSON", type_of(value))));
    }
    if depth >= MAX_WALK_DEPTH {
        return Err(Fault::new(format!(
            "nests deeper than {MAX_WALK_DEPTH} levels (or contains itself)"
        )));
    }
    if is_array(value).map_err(Fault::new)? {
        let mut items = Vec::new();
        for i in 0..length(value).map_err(Fault::new)? {
            let item = self::item(value, i).map_err(|why| Fault::new(why).at(format!("[{i}]")))?;
            if item.is_undefined() {
                return Err(Fault::new("is undefined, not JSON").at(format!("[{i}]")));
            }
            items.push(walk(&item, depth + 1, stored).map_err(|f| f.at(format!("[{i}]")))?);
        }
        return Ok(Value::Array(items));
    }
    {
        let to_json = field(value, "toJSON").map_err(Fault::new)?;
        if let Some(to_json) = to_json.dyn_ref::<Function>() {
            let converted = to_json
                .call0(value)
                .map_err(|e| Fault::new(format!("threw in toJSON: {}", describe(&e))))?;
            return walk(&converted, depth + 1, stored);
        }
    }
    if !is_plain(value).map_err(Fault::new)? {
        return Err(Fault::new(NOT_PLAIN));
    }
    let mut map = Map::new();
    for key in js_keys(value).map_err(|e| Fault::new(threw(&e)))?.iter() {
        let name = text(&key)
            .unwrap_or(Ok(String::new()))
            .map_err(Fault::new)?;
        let member =
            Reflect::get(value, &key).map_err(|e| Fault::new(threw(&e)).at(member_path(&name)))?;
        if member.is_undefined() {
            continue;
        }
        let item = walk(&member, depth + 1, stored).map_err(|f| f.at(member_path(&name)))?;
        map.insert(name, item);
    }
    Ok(Value::Object(map))
}

/// Why an object that is not a plain one is refused.
const NOT_PLAIN: &str = "is no plain object (a Promise, a Map, a class instance), not JSON";

/// `.name`, or `["name"]` for a name that is not an identifier.
fn member_path(name: &str) -> String {
    let identifier = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$');
    if identifier {
        format!(".{name}")
    } else {
        format!("[{name:?}]")
    }
}

/// A thrown JS value as text.
pub fn describe(error: &JsValue) -> String {
    match error.dyn_ref::<js_sys::Error>() {
        Some(e) => String::from(e.message()),
        None => error.as_string().unwrap_or_else(|| type_of(error)),
    }
}

/// A string argument.
pub fn string(field: &str, value: &JsValue) -> Result<String, JsValue> {
    match text(value) {
        Some(text) => text.map_err(|why| invalid(field, why)),
        None => Err(invalid(
            field,
            format!("expected a string, got {}", type_of(value)),
        )),
    }
}

/// A non-negative integer argument that JS represents exactly.
pub fn whole(field: &str, value: &JsValue) -> Result<u64, JsValue> {
    let number = value
        .as_f64()
        .ok_or_else(|| invalid(field, format!("expected a number, got {}", type_of(value))))?;
    if !number.is_finite() {
        return Err(invalid(
            field,
            format!("is {}: expected a whole number ≥ 0", js_number(number)),
        ));
    }
    if number.fract() != 0.0 || number < 0.0 {
        return Err(invalid(
            field,
            format!("{} is not a whole number ≥ 0", show(number)),
        ));
    }
    if number > MAX_SAFE_INTEGER {
        return Err(invalid(
            field,
            format!(
                "{} is past 2^53 − 1, the largest exact integer",
                show(number)
            ),
        ));
    }
    Ok(number as u64)
}

/// An optional integer argument: `undefined` is `None`.
pub fn optional_whole(field: &str, value: &JsValue) -> Result<Option<u64>, JsValue> {
    if value.is_undefined() {
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

/// An options or input object, read field by field: each field is named by its path in errors
/// (`request.leaseTtlMs`), and a field the object may not have is refused, with the camelCase name
/// when it was written in snake_case.
pub struct Fields<'a> {
    object: &'a JsValue,
    path: &'a str,
}

impl<'a> Fields<'a> {
    /// `value` as an object with fields among `allowed`.
    pub fn of(
        path: &'a str,
        value: &'a JsValue,
        allowed: &[&'static str],
    ) -> Result<Self, JsValue> {
        let fields = Self::any(path, value)?;
        // Fast path: as many own keys as allowed fields present means no other key.
        let keys = js_keys(value).map_err(|e| invalid(path, threw(&e)))?;
        let present = allowed
            .iter()
            .filter(|name| Reflect::has(value, &self::name(name)).unwrap_or(false))
            .count();
        if keys.length() as usize == present {
            return Ok(fields);
        }
        for key in keys.iter() {
            let key = key.as_string().unwrap_or_default();
            if allowed.contains(&key.as_str()) {
                continue;
            }
            let camel = camel_case(&key);
            let hint = if allowed.contains(&camel.as_str()) {
                format!("; its name is `{camel}`")
            } else {
                // Joined by hand: `join` would add a routine of its own to the module.
                let mut hint = String::from("; expected ");
                for (i, name) in allowed.iter().enumerate() {
                    if i > 0 {
                        hint.push_str(", ");
                    }
                    hint.push_str(name);
                }
                hint
            };
            return Err(invalid(path, format!("has an unknown field `{key}`{hint}")));
        }
        Ok(fields)
    }

    /// `value` as an object whose other fields are ignored (stored rows read back).
    pub fn any(path: &'a str, value: &'a JsValue) -> Result<Self, JsValue> {
        if !value.is_object() || is_array(value).map_err(|why| invalid(path, why))? {
            return Err(invalid(
                path,
                format!("expected an object, got {}", type_of(value)),
            ));
        }
        if !is_plain(value).map_err(|why| invalid(path, why))? {
            return Err(invalid(path, NOT_PLAIN));
        }
        Ok(Self {
            object: value,
            path,
        })
    }

    /// A required whole number field.
    pub fn whole(&self, name: &'static str) -> Result<u64, JsValue> {
        let value = self.get(name);
        whole_or_none(&value).ok_or_else(|| whole(&self.path(name), &value).unwrap_err())
    }

    /// A field that may be `null` or absent, read by `read` otherwise.
    pub fn nullable<T>(
        &self,
        name: &'static str,
        read: impl FnOnce(&str, &JsValue) -> Result<T, JsValue>,
    ) -> Result<Option<T>, JsValue> {
        match self.get(name) {
            value if value.is_undefined() || value.is_null() => Ok(None),
            value => read(&self.path(name), &value).map(Some),
        }
    }

    /// Field `name` (it may be absent), read by `read` with its path.
    pub fn read<T>(
        &self,
        name: &'static str,
        read: fn(&str, &JsValue) -> Result<T, JsValue>,
    ) -> Result<T, JsValue> {
        read(&self.path(name), &self.get(name))
    }

    /// The path of field `name`, for errors.
    pub fn path(&self, name: &str) -> String {
        format!("{}.{name}", self.path)
    }

    /// Field `name`, `undefined` when absent (or when reading it threw: an option object's getter).
    pub fn get(&self, name: &'static str) -> JsValue {
        field(self.object, name).unwrap_or(JsValue::UNDEFINED)
    }

    /// A required string field.
    pub fn string(&self, name: &'static str) -> Result<String, JsValue> {
        let value = self.get(name);
        if value.is_undefined() {
            return Err(invalid(&self.path(name), "is missing"));
        }
        string(&self.path(name), &value)
    }

    /// An optional string field.
    pub fn optional_string(&self, name: &'static str) -> Result<Option<String>, JsValue> {
        let value = self.get(name);
        if value.is_undefined() {
            return Ok(None);
        }
        string(&self.path(name), &value).map(Some)
    }

    /// An optional whole number field (≥ 0, exact in JS).
    pub fn optional_whole(&self, name: &'static str) -> Result<Option<u64>, JsValue> {
        let value = self.get(name);
        if value.is_undefined() {
            return Ok(None);
        }
        match whole_or_none(&value) {
            Some(number) => Ok(Some(number)),
            None => whole(&self.path(name), &value).map(Some),
        }
    }

    /// An optional field that must be a number when present, with its path for errors.
    fn optional_f64(&self, name: &'static str) -> Result<Option<(String, f64)>, JsValue> {
        let value = self.get(name);
        if value.is_undefined() {
            return Ok(None);
        }
        let field = self.path(name);
        match value.as_f64() {
            Some(number) => Ok(Some((field, number))),
            None => Err(invalid(
                &field,
                format!("expected a number, got {}", type_of(&value)),
            )),
        }
    }

    /// An optional integer field that fits an `i32` (a priority: negative too).
    pub fn optional_i32(&self, name: &'static str) -> Result<Option<i32>, JsValue> {
        let Some((field, number)) = self.optional_f64(name)? else {
            return Ok(None);
        };
        if number.fract() == 0.0 && number >= f64::from(i32::MIN) && number <= f64::from(i32::MAX) {
            return Ok(Some(number as i32));
        }
        Err(invalid(
            &field,
            format!(
                "is {}: expected a whole number from -2147483648 to 2147483647",
                show(number)
            ),
        ))
    }

    /// An optional finite number field.
    pub fn optional_number(&self, name: &'static str) -> Result<Option<f64>, JsValue> {
        let Some((field, number)) = self.optional_f64(name)? else {
            return Ok(None);
        };
        json_number(number)
            .map(|_| Some(number))
            .map_err(|reason| invalid(&field, reason))
    }

    /// A boolean field, `default` when absent.
    pub fn boolean(&self, name: &'static str, default: Option<bool>) -> Result<bool, JsValue> {
        let value = self.get(name);
        match (value.as_bool(), default) {
            (Some(flag), _) => Ok(flag),
            (None, Some(default)) if value.is_undefined() => Ok(default),
            (None, None) if value.is_undefined() => Err(invalid(&self.path(name), "is missing")),
            (None, _) => Err(invalid(
                &self.path(name),
                format!("expected a boolean, got {}", type_of(&value)),
            )),
        }
    }

    /// A JSON field (`payload`), `null` when absent.
    pub fn json(&self, name: &'static str) -> Result<Value, JsValue> {
        match self.get(name) {
            value if value.is_undefined() => Ok(Value::Null),
            value => walk(&value, 0, false).map_err(|fault| fault.into_error(&self.path(name))),
        }
    }

    /// An optional array field, its items with their paths (`decision.timers[1]`).
    pub fn array(&self, name: &'static str) -> Result<Vec<(String, JsValue)>, JsValue> {
        let value = self.get(name);
        if value.is_undefined() {
            return Ok(Vec::new());
        }
        items(&self.path(name), &value)
    }
}

/// `value` as a whole number ≥ 0 that JS represents exactly, or `None`.
fn whole_or_none(value: &JsValue) -> Option<u64> {
    value
        .as_f64()
        .filter(|n| n.fract() == 0.0 && *n >= 0.0 && *n <= MAX_SAFE_INTEGER)
        .map(|n| n as u64)
}

/// The items of an array argument with their paths (`commands[1]`).
#[inline(never)]
pub fn items(path: &str, value: &JsValue) -> Result<Vec<(String, JsValue)>, JsValue> {
    if !is_array(value).map_err(|why| invalid(path, why))? {
        return Err(invalid(
            path,
            format!("expected an array, got {}", type_of(value)),
        ));
    }
    let mut items = Vec::new();
    for i in 0..length(value).map_err(|why| invalid(path, why))? {
        let path = format!("{path}[{i}]");
        let item = item(value, i).map_err(|why| invalid(&path, why))?;
        items.push((path, item));
    }
    Ok(items)
}

/// `lease_ttl_ms` → `leaseTtlMs`.
fn camel_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}
