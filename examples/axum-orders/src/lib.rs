//! What the two versions of the axum example share: the order's workflow, the HTTP client and its
//! calls, the dispatcher's handler, and how the services answer.
//!
//! - `src/main.rs` (`cargo run -p miniflow-example-axum`): both services and the dispatcher in one
//!   process, on SQLite files.
//! - `src/bin/postgres.rs` (`axum-orders-postgres orders|worker|warehouse`): each role a process
//!   of its own, on PostgreSQL.

use std::time::Duration;

use axum::body::Bytes;
use axum::http::{Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use miniflow::{
    json, Command, CommandCompleted, Decision, Delivery, EventRecord, Outcome, Value, Workflow,
    COMMAND_COMPLETED,
};

/// The HTTP client both versions call the services with.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// The fields of a reservation request that define its intent (its digest).
pub const INTENT: [&str; 3] = ["order_id", "sku", "quantity"];

/// How long a call waits for its answer before its result counts as unknown.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

// ------------------------------------------------------------------------------------------------
// The order's workflow

/// An order reserves its stock; the reservation comes back as `command_completed`.
pub struct OrderFlow;

/// An order, as its workflow's events make it.
#[derive(Default)]
pub struct Order {
    /// The warehouse's reservation, once its answer came back.
    pub reservation: Option<String>,
}

impl Workflow for OrderFlow {
    type State = Order;

    fn evolve(&self, order: &mut Order, event: &EventRecord) {
        if event.kind == COMMAND_COMPLETED {
            if let Ok(done) = serde_json::from_value::<CommandCompleted>(event.payload.clone()) {
                order.reservation = done.result["reservation_id"].as_str().map(str::to_owned);
            }
        }
    }

    fn decide(&self, order: &Order, event: &EventRecord) -> Decision {
        match event.kind.as_str() {
            "order_placed" if order.reservation.is_none() => Decision::new().command(
                Command::new(
                    "reserve_stock",
                    json!({
                        "order_id": event.workflow_id,
                        "sku": event.payload["sku"],
                        "quantity": event.payload["quantity"],
                    }),
                )
                .report_result(),
            ),
            _ => Decision::none(),
        }
    }
}

// ------------------------------------------------------------------------------------------------
// The services' side

/// A JSON answer with `status`.
pub fn answer(status: StatusCode, body: Value) -> Response {
    (status, Json(body)).into_response()
}

/// The answer to a request whose store failed: `503`, so that the caller tries again.
pub fn unavailable(error: impl std::fmt::Display) -> Response {
    eprintln!("answered 503: {error}");
    answer(
        StatusCode::SERVICE_UNAVAILABLE,
        json!({ "error": error.to_string() }),
    )
}

/// What a warehouse's reservation request came to.
pub enum Reply {
    /// The reservation was made now, and committed with its key's record.
    Created(Value),
    /// The key was seen before: its stored result, no new reservation.
    Replayed(Value),
    /// The key was used with other parameters.
    Mismatch,
    /// Another request holds the key.
    Busy,
}

impl Reply {
    /// The HTTP answer: `201` for a reservation (made now or before, the latter marked
    /// `Idempotent-Replayed: true`), `422` for a key with other parameters, `409` while another
    /// request holds the key.
    pub fn into_response(self) -> Response {
        match self {
            Reply::Created(result) => answer(StatusCode::CREATED, result),
            Reply::Replayed(result) => (
                StatusCode::CREATED,
                [("idempotent-replayed", "true")],
                Json(result),
            )
                .into_response(),
            Reply::Mismatch => answer(
                StatusCode::UNPROCESSABLE_ENTITY,
                json!({ "error": "this key was used with other parameters" }),
            ),
            Reply::Busy => answer(
                StatusCode::CONFLICT,
                json!({ "error": "in progress, retry" }),
            ),
        }
    }
}

/// The answer a warehouse gives when it loses its answer on purpose (after its commit).
pub fn answer_lost() -> Response {
    answer(
        StatusCode::SERVICE_UNAVAILABLE,
        json!({ "error": "answer lost" }),
    )
}

/// Serves `router` on `listener`, in the background.
pub fn serve(listener: tokio::net::TcpListener, router: Router) {
    tokio::spawn(async move { axum::serve(listener, router).await });
}

// ------------------------------------------------------------------------------------------------
// The client side: HTTP calls and the dispatcher's handler

/// A client for plain HTTP on 127.0.0.1.
pub fn http_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// POSTs `body` as JSON (with `key` as `Idempotency-Key`); the status and the JSON answer.
///
/// # Errors
///
/// No answer: the connection failed, or none came within 5 s (the result is unknown).
pub async fn post_json(
    client: &HttpClient,
    url: &str,
    key: Option<&str>,
    body: &Value,
) -> Result<(StatusCode, Value), String> {
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(url)
        .header("content-type", "application/json");
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|e| e.to_string())?;
    call(client, request).await
}

/// GETs `url`; the status and the JSON answer.
///
/// # Errors
///
/// As [`post_json`].
pub async fn get_json(client: &HttpClient, url: &str) -> Result<(StatusCode, Value), String> {
    let request = Request::builder()
        .method(Method::GET)
        .uri(url)
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    call(client, request).await
}

async fn call(
    client: &HttpClient,
    request: Request<Full<Bytes>>,
) -> Result<(StatusCode, Value), String> {
    let response = tokio::time::timeout(CALL_TIMEOUT, client.request(request))
        .await
        .map_err(|_| "timed out: the result is unknown".to_owned())?
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let body = tokio::time::timeout(CALL_TIMEOUT, response.into_body().collect())
        .await
        .map_err(|_| "timed out reading the answer".to_owned())?
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
}

/// Delivers `reserve_stock` to the warehouse at `url`, the command ID as the key. Only a 2xx
/// completes it; a timeout, a connection error, a 409 or a 5xx is retried with the same key; any
/// other 4xx is dead. With `duplicate`, the same request is sent twice at once.
pub async fn deliver(
    client: HttpClient,
    url: String,
    duplicate: bool,
    delivery: Delivery,
) -> Outcome {
    let key = delivery.command_id.to_string();
    let call = || post_json(&client, &url, Some(&key), &delivery.payload);
    let answer = if duplicate {
        let (first, second) = tokio::join!(call(), call());
        first.and(second)
    } else {
        call().await
    };
    match answer {
        Ok((status, body)) if status.is_success() => Outcome::done_with(body),
        Ok((status, _)) if status == StatusCode::CONFLICT || status.is_server_error() => {
            Outcome::retry(status)
        }
        Ok((status, body)) => Outcome::permanent(format!("{status} {body}")),
        Err(unknown) => Outcome::retry(unknown),
    }
}
