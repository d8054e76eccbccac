//! IDs and retry arithmetic for JS: the same derivations as every other host.

use std::time::Duration;

use miniflow_core::{check_retention, CommandId, Seq, TimerId};
use serde::Serialize;
use wasm_bindgen::prelude::*;

use crate::convert::{command_id, millis, string, whole, workflow_id};
use crate::error::IntoJs;

/// `"{workflowId}:{eventSeq}:{index}"`, checked.
#[wasm_bindgen(js_name = commandId)]
pub fn derive_command_id(
    #[wasm_bindgen(js_name = workflowId, unchecked_param_type = "string")] workflow: JsValue,
    #[wasm_bindgen(js_name = eventSeq, unchecked_param_type = "number")] event_seq: JsValue,
    #[wasm_bindgen(unchecked_param_type = "number")] index: JsValue,
) -> Result<String, JsValue> {
    let seq = Seq::new(whole("eventSeq", &event_seq)?).js()?;
    let index = whole("index", &index)?;
    let index = u32::try_from(index)
        .map_err(|_| crate::error::invalid("index", format!("{index} is above 4294967295")))?;
    Ok(CommandId::new(workflow_id(&workflow)?, seq, index)
        .js()?
        .to_string())
}

#[derive(Serialize)]
struct Parsed {
    workflow_id: String,
    event_seq: u64,
    index: u32,
}

/// The parts of a command ID, parsed from the right.
#[wasm_bindgen(js_name = parseCommandId, unchecked_return_type = "ParsedCommandId")]
pub fn parse_command_id(
    #[wasm_bindgen(unchecked_param_type = "string")] id: JsValue,
) -> Result<JsValue, JsValue> {
    let id = command_id(&id)?;
    crate::convert::to_js(&Parsed {
        workflow_id: id.workflow_id().to_string(),
        event_seq: id.event_seq().get(),
        index: id.index(),
    })
}

/// The workflow a timer ID fires into; throws `INVALID_INPUT` for a malformed ID.
#[wasm_bindgen(js_name = timerWorkflowId)]
pub fn timer_workflow_id(
    #[wasm_bindgen(js_name = timerId, unchecked_param_type = "string")] id: JsValue,
) -> Result<String, JsValue> {
    Ok(string("timerId", &id)?
        .parse::<TimerId>()
        .js()?
        .workflow_id()
        .to_string())
}

use crate::types::retry_policy as policy;

fn ms(d: Duration) -> f64 {
    d.as_millis() as f64
}

/// The backoff (ms) after attempt `attempt` of `commandId` failed, as every host computes it.
#[wasm_bindgen]
pub fn backoff(
    #[wasm_bindgen(unchecked_param_type = "RetryPolicyInput | undefined")] retry_policy: JsValue,
    #[wasm_bindgen(js_name = commandId, unchecked_param_type = "string")] id: JsValue,
    #[wasm_bindgen(unchecked_param_type = "number")] attempt: JsValue,
) -> Result<f64, JsValue> {
    let attempt = u32::try_from(whole("attempt", &attempt)?).unwrap_or(u32::MAX);
    Ok(ms(
        policy(&retry_policy)?.backoff(&command_id(&id)?, attempt)
    ))
}

/// The longest time (ms) from a command's first claim to its becoming dead.
#[wasm_bindgen(js_name = retryHorizon)]
pub fn retry_horizon(
    #[wasm_bindgen(unchecked_param_type = "RetryPolicyInput | undefined")] retry_policy: JsValue,
    #[wasm_bindgen(js_name = leaseTtlMs, unchecked_param_type = "number")] lease_ttl_ms: JsValue,
) -> Result<f64, JsValue> {
    Ok(ms(
        policy(&retry_policy)?.horizon(millis("leaseTtlMs", &lease_ttl_ms)?)
    ))
}

/// Throws `RETENTION_TOO_SHORT` when a receiver keeping keys for `retentionMs` would forget them before
/// a producer with `policy` and `leaseTtlMs` stops retrying (plus `marginMs`).
#[wasm_bindgen(js_name = checkRetention)]
pub fn check_retention_js(
    #[wasm_bindgen(js_name = retentionMs, unchecked_param_type = "number")] retention_ms: JsValue,
    #[wasm_bindgen(unchecked_param_type = "RetryPolicyInput | undefined")] retry_policy: JsValue,
    #[wasm_bindgen(js_name = leaseTtlMs, unchecked_param_type = "number")] lease_ttl_ms: JsValue,
    #[wasm_bindgen(js_name = marginMs, unchecked_param_type = "number")] margin_ms: JsValue,
) -> Result<(), JsValue> {
    check_retention(
        millis("retentionMs", &retention_ms)?,
        &policy(&retry_policy)?,
        millis("leaseTtlMs", &lease_ttl_ms)?,
        millis("marginMs", &margin_ms)?,
    )
    .js()
}
