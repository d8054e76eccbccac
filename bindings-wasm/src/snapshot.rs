//! Reading a snapshot in JS: `JSON.parse`, then each row read field by field into the core's rows,
//! which `MemoryStore::from_snapshot_rows` checks as `from_snapshot` does. The module then carries no
//! JSON text parser and no deserialization code of its own (a quarter of its size); the fields are
//! those `MemoryStore::export_snapshot` writes (a Node test round-trips every kind of row).

use miniflow_core::{
    EventRecord, KindControl, Lease, MemoryStore, OutboxRow, Seq, Status, TimerRow, TimerStatus,
    Timestamp, TraceContext, WorkflowId,
};
use wasm_bindgen::JsValue;

use crate::convert::{items, stored_json, string, whole, Fields};
use crate::error::{from_core, invalid, IntoJs};

/// The store `text` (from `exportSnapshot`) holds.
pub fn read(text: &str) -> Result<MemoryStore, JsValue> {
    let not_a_snapshot = |reason: String| invalid("snapshot", reason);
    let value = js_sys::JSON::parse(text)
        .map_err(|_| not_a_snapshot("is not a miniflow snapshot: not JSON".into()))?;
    let snapshot = Fields::any("snapshot", &value)?;
    let format = snapshot
        .optional_string("format")
        .ok()
        .flatten()
        .ok_or_else(|| not_a_snapshot("is not a miniflow snapshot: no format".into()))?;
    let version = snapshot.whole("version")?;
    MemoryStore::check_snapshot_header(&format, version).map_err(not_a_snapshot)?;
    let rows = |name: &'static str| items(&snapshot.path(name), &snapshot.get(name));
    let (mut events, mut outbox, mut timers) = (Vec::new(), Vec::new(), Vec::new());
    for (path, row) in rows("events")? {
        events.push(event(&path, &row)?);
    }
    for (path, row) in rows("outbox")? {
        outbox.push(command(&path, &row)?);
    }
    for (path, row) in rows("timers")? {
        timers.push(timer(&path, &row)?);
    }
    // Version 1 has no controls.
    let mut controls = Vec::new();
    if !snapshot.get("controls").is_undefined() {
        for (path, row) in rows("controls")? {
            controls.push(control(&path, &row)?);
        }
    }
    MemoryStore::from_snapshot_rows(events, outbox, timers, controls).js()
}

fn time(path: &str, value: &JsValue) -> Result<Timestamp, JsValue> {
    whole(path, value).map(Timestamp::from_millis)
}

fn count(path: &str, value: &JsValue) -> Result<u32, JsValue> {
    u32::try_from(whole(path, value)?).map_err(|_| invalid(path, "is above 4294967295"))
}

fn parsed<T: std::str::FromStr<Err: Into<miniflow_core::Error>>>(
    path: &str,
    value: &JsValue,
) -> Result<T, JsValue> {
    string(path, value)?.parse().map_err(from_core)
}

fn event(path: &str, value: &JsValue) -> Result<EventRecord, JsValue> {
    let row = Fields::any(path, value)?;
    Ok(EventRecord {
        workflow_id: WorkflowId::new(row.string("workflow_id")?).map_err(from_core)?,
        seq: Seq::new(row.whole("seq")?).map_err(from_core)?,
        kind: row.string("kind")?,
        payload: row.read("payload", stored_json)?,
        recorded_at: row.read("recorded_at", time)?,
    })
}

fn command(path: &str, value: &JsValue) -> Result<OutboxRow, JsValue> {
    let row = Fields::any(path, value)?;
    let lease = row.nullable("lease", |path, value| {
        let lease = Fields::any(path, value)?;
        Ok(Lease {
            owner: lease.string("owner")?,
            expires_at: lease.read("expires_at", time)?,
            token: lease.whole("token")?,
        })
    })?;
    Ok(OutboxRow {
        command_id: row.read("command_id", parsed)?,
        kind: row.string("kind")?,
        payload: row.read("payload", stored_json)?,
        priority: row.nullable("priority", priority)?.unwrap_or(0),
        status: row.read("status", parsed::<Status>)?,
        attempts: row.read("attempts", count)?,
        last_error: row.nullable("last_error", string)?,
        available_at: row.read("available_at", time)?,
        lease,
        created_at: row.read("created_at", time)?,
        processed_at: row.nullable("processed_at", time)?,
        manual_retries: row.read("manual_retries", count)?,
        resolution: row.nullable("resolution", string)?,
        report_result: row.boolean("report_result", Some(false))?,
        result: row.nullable("result", stored_json)?,
        cancel_requested: row.boolean("cancel_requested", Some(false))?,
        trace_context: row.nullable("trace_context", trace_context)?,
    })
}

/// A stored priority: an integer that fits an `i32` (absent in version 1: 0).
fn priority(path: &str, value: &JsValue) -> Result<i32, JsValue> {
    value
        .as_f64()
        .filter(|n| n.fract() == 0.0 && *n >= f64::from(i32::MIN) && *n <= f64::from(i32::MAX))
        .map(|n| n as i32)
        .ok_or_else(|| invalid(path, "expected a whole number that fits 32 bits"))
}

/// A stored W3C trace context: `{ traceparent, tracestate? }`, checked by the core.
fn trace_context(path: &str, value: &JsValue) -> Result<TraceContext, JsValue> {
    let context = Fields::any(path, value)?;
    let tracestate = context.nullable("tracestate", string)?;
    TraceContext::parse(&context.string("traceparent")?, tracestate.as_deref()).map_err(from_core)
}

/// An operator's control of a kind (version 2).
fn control(path: &str, value: &JsValue) -> Result<KindControl, JsValue> {
    let row = Fields::any(path, value)?;
    Ok(KindControl {
        kind: row.string("kind")?,
        paused: row.boolean("paused", Some(false))?,
        concurrency_limit: row.nullable("concurrency_limit", count)?,
        changed_by: row.string("changed_by")?,
        changed_at: row.read("changed_at", time)?,
    })
}

fn timer(path: &str, value: &JsValue) -> Result<TimerRow, JsValue> {
    let row = Fields::any(path, value)?;
    Ok(TimerRow {
        timer_id: row.read("timer_id", parsed)?,
        name: row.string("name")?,
        event_kind: row.string("event_kind")?,
        event_payload: row.read("event_payload", stored_json)?,
        fire_at: row.read("fire_at", time)?,
        available_at: row.read("available_at", time)?,
        status: row.read("status", parsed::<TimerStatus>)?,
        created_at: row.read("created_at", time)?,
        processed_at: row.nullable("processed_at", time)?,
        last_error: row.nullable("last_error", string)?,
    })
}
