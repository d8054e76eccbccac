//! Two axum services on 127.0.0.1, and miniflow's async API between them.
//!
//! - **Orders** (`POST /orders`): writes the order's row, its `order_placed` event and the
//!   `reserve_stock` command the workflow decides, in ONE transaction of its SQLite file
//!   (`AsyncStore::transaction`): all three commit, or none. A second order with the same ID is
//!   refused with `409`, and writes nothing.
//! - **The async dispatcher**, in the orders service, delivers `reserve_stock` over HTTP to the
//!   warehouse with the command ID as the `Idempotency-Key`; the warehouse's answer (the reservation)
//!   comes back into the order's workflow as one `command_completed` event.
//! - **Warehouse** (`POST /reservations`): reserves the key, writes the reservation (its effect) and
//!   the key's record in ONE transaction of its own SQLite file (`AsyncIdempotencyStore::begin_in`
//!   / `finish_in`), so the effect happens at most once per key whatever the timing; a repeat of the
//!   key gets the stored answer again (`Idempotent-Replayed: true`), a key with other parameters
//!   `422`, a request without a key `400`.
//!
//! Two faults are injected to show it: the dispatcher sends the first delivery of `order-002`
//! twice at once (a duplicate on the wire), and the warehouse loses its answer to the first request
//! for `order-003` after committing the reservation (the dispatcher sees a `503` and delivers again
//! with the same key). Every order still gets exactly one reservation.
//!
//! `cargo run -p miniflow-example-axum` runs the whole demo and prints what happened.
//!
//! The same services on PostgreSQL, each role a process of its own (the orders service, any number
//! of workers, the warehouse on a database of its own), are `src/bin/postgres.rs`
//! (`axum-orders-postgres orders|worker|warehouse --database URL`); `tests/faults.rs` runs them on
//! a throwaway cluster while it kills the worker, loses answers and stops the server. Both share
//! the workflow, the HTTP calls and the answers of `src/lib.rs`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use axum::{Json, Router};
use miniflow::prelude::*;
use miniflow::tokio::{AsyncDispatcher, AsyncIdempotencyStore, AsyncStore};
use miniflow::{
    json, Begin, Delivery, Digest, Engine, Error, Event, IdempotencyKey, IdempotencyPolicy,
    RetryPolicy, Value, WorkflowId,
};
use miniflow_example_axum::{
    answer, answer_lost, deliver, http_client, post_json, OrderFlow, Reply, INTENT,
};

// ------------------------------------------------------------------------------------------------
// The orders service

struct Orders {
    store: AsyncStore,
    engine: Arc<Engine<OrderFlow>>,
}

fn orders_service(orders: Arc<Orders>) -> Router {
    Router::new()
        .route("/orders", post(place_order))
        .with_state(orders)
}

/// `POST /orders {order_id, sku, quantity}`: the order's row, its event and its command, in one
/// transaction.
async fn place_order(State(orders): State<Arc<Orders>>, Json(order): Json<Value>) -> Response {
    let id = match WorkflowId::new(order["order_id"].as_str().unwrap_or_default()) {
        Ok(id) => id,
        Err(e) => return answer(StatusCode::BAD_REQUEST, json!({ "error": e.to_string() })),
    };
    let engine = orders.engine.clone();
    let placed = orders
        .store
        .transaction(move |tx| {
            let row = (
                id.as_str(),
                order["sku"].to_string(),
                order["quantity"].to_string(),
            );
            let inserted = tx.execute(
                "INSERT INTO orders (order_id, sku, quantity) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (order_id) DO NOTHING",
                row,
            )?;
            if inserted == 0 {
                return Ok(None); // placed before: nothing more is written
            }
            tx.handle(&engine, &id, Event::new("order_placed", order))
                .map(Some)
        })
        .await;
    match placed {
        Ok(Some(handled)) => answer(
            StatusCode::CREATED,
            json!({ "commands": handled.command_ids.iter().map(ToString::to_string).collect::<Vec<_>>() }),
        ),
        Ok(None) => answer(StatusCode::CONFLICT, json!({ "error": "already placed" })),
        Err(e) => answer(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({ "error": e.to_string() }),
        ),
    }
}

// ------------------------------------------------------------------------------------------------
// The warehouse service

struct Warehouse {
    store: AsyncStore,
    keys: AsyncIdempotencyStore,
    /// Lose the answer to the first request for this order, after committing it.
    lose_first_answer_for: Mutex<Option<String>>,
    requests: AtomicUsize,
    replayed: AtomicUsize,
}

fn warehouse_service(warehouse: Arc<Warehouse>) -> Router {
    Router::new()
        .route("/reservations", post(reserve))
        .with_state(warehouse)
}

/// `POST /reservations` with `Idempotency-Key`: the reservation and the key's record in one
/// transaction.
async fn reserve(
    State(warehouse): State<Arc<Warehouse>>,
    headers: HeaderMap,
    Json(request): Json<Value>,
) -> Response {
    warehouse.requests.fetch_add(1, Ordering::SeqCst);
    let key = headers
        .get("idempotency-key")
        .and_then(|key| key.to_str().ok())
        .map(IdempotencyKey::new);
    let key = match key {
        Some(Ok(key)) => key,
        Some(Err(e)) => return answer(StatusCode::BAD_REQUEST, json!({ "error": e.to_string() })),
        None => {
            return answer(
                StatusCode::BAD_REQUEST,
                json!({ "error": "Idempotency-Key is missing" }),
            )
        }
    };
    let digest = Digest::of_intent(&request, &INTENT);
    let order_id = request["order_id"].as_str().unwrap_or_default().to_owned();
    let keys = warehouse.keys.clone();
    let reply = warehouse
        .store
        .transaction(move |tx| match keys.begin_in(tx, &key, digest)? {
            Begin::Fresh { token } => {
                let n: i64 = tx
                    .sql()
                    .query_row("SELECT count(*) + 1 FROM reservations", [], |row| {
                        row.get(0)
                    })
                    .map_err(|e| Error::Storage(Box::new(e)))?;
                let reservation = format!("RSV-{n}");
                tx.execute(
                    "INSERT INTO reservations (reservation_id, order_id, idempotency_key) \
                     VALUES (?1, ?2, ?3)",
                    (&reservation, &order_id, key.as_str()),
                )?;
                let result = json!({ "reservation_id": reservation, "order_id": order_id });
                keys.finish_in(tx, &key, token, &result)?;
                Ok(Reply::Created(result))
            }
            Begin::Completed { result } => Ok(Reply::Replayed(result)),
            Begin::Conflict { .. } => Ok(Reply::Mismatch),
            Begin::InProgress { .. } => Ok(Reply::Busy),
        })
        .await;
    match reply {
        Ok(Reply::Created(result)) => {
            let order = result["order_id"].as_str().unwrap_or_default();
            let mut lose = warehouse.lose_first_answer_for.lock().unwrap();
            if lose.as_deref() == Some(order) {
                *lose = None; // committed, but the caller never hears of it
                return answer_lost();
            }
            Reply::Created(result).into_response()
        }
        Ok(reply) => {
            if matches!(reply, Reply::Replayed(_)) {
                warehouse.replayed.fetch_add(1, Ordering::SeqCst);
            }
            reply.into_response()
        }
        Err(e) => answer(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({ "error": e.to_string() }),
        ),
    }
}

// ------------------------------------------------------------------------------------------------
// The demo

async fn serve(router: Router) -> Result<String, Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    miniflow_example_axum::serve(listener, router);
    Ok(format!("http://{address}"))
}

async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;

    let warehouse_store = AsyncStore::open(dir.path().join("warehouse.db")).await?;
    warehouse_store
        .transaction(|tx| {
            tx.execute(
                "CREATE TABLE reservations (reservation_id TEXT PRIMARY KEY, order_id TEXT, \
                 idempotency_key TEXT)",
                [],
            )
        })
        .await?;
    let warehouse = Arc::new(Warehouse {
        keys: AsyncIdempotencyStore::new(warehouse_store.clone(), IdempotencyPolicy::default())?,
        store: warehouse_store,
        lose_first_answer_for: Mutex::new(Some("order-003".to_owned())),
        requests: AtomicUsize::new(0),
        replayed: AtomicUsize::new(0),
    });
    let warehouse_url = serve(warehouse_service(warehouse.clone())).await?;

    let store = AsyncStore::open(dir.path().join("orders.db")).await?;
    store
        .transaction(|tx| {
            tx.execute(
                "CREATE TABLE orders (order_id TEXT PRIMARY KEY, sku TEXT, quantity TEXT)",
                [],
            )
        })
        .await?;
    let engine = Arc::new(Engine::new(OrderFlow));
    let orders = Arc::new(Orders {
        store: store.clone(),
        engine: engine.clone(),
    });
    let orders_url = serve(orders_service(orders)).await?;

    let client = http_client();
    let handler = {
        let (client, url) = (client.clone(), format!("{warehouse_url}/reservations"));
        move |delivery: Delivery| {
            let duplicate =
                delivery.command_id.to_string() == "order-002:1:0" && delivery.attempt == 1;
            deliver(client.clone(), url.clone(), duplicate, delivery)
        }
    };
    let dispatcher = AsyncDispatcher::new(store.clone(), handler)
        .concurrency(8)
        .workflow(engine.clone())
        .retry_policy(RetryPolicy::default().initial_delay(Duration::from_millis(50)))
        .poll_interval(Duration::from_millis(20))
        .start()?;

    // Five orders at once, and one of them again.
    let ids: Vec<String> = (1..=5).map(|n| format!("order-{n:03}")).collect();
    let mut placing = tokio::task::JoinSet::new();
    for (n, id) in ids.iter().enumerate() {
        let (client, url) = (client.clone(), format!("{orders_url}/orders"));
        let order = json!({ "order_id": id, "sku": format!("SKU-{}", 10 + n), "quantity": n + 1 });
        placing.spawn(async move { post_json(&client, &url, None, &order).await });
    }
    let mut placed = 0;
    while let Some(answer) = placing.join_next().await {
        let (status, _) = answer??;
        if status == StatusCode::CREATED {
            placed += 1;
        }
    }
    println!("orders placed: {placed}");
    let again = json!({ "order_id": "order-001", "sku": "SKU-10", "quantity": 1 });
    let (status, _) = post_json(&client, &format!("{orders_url}/orders"), None, &again).await?;
    println!("the same order again: {}", status.as_u16());

    // Wait for each order's reservation to come back into its workflow.
    let until = Instant::now() + Duration::from_secs(20);
    let mut reserved = BTreeMap::new();
    while reserved.len() < ids.len() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
        for id in &ids {
            let w = WorkflowId::new(id.as_str())?;
            let replayed = store
                .with_store({
                    let engine = engine.clone();
                    move |store| engine.replay(store, &w)
                })
                .await?;
            if let Some(reservation) = replayed.state.reservation {
                reserved.insert(id.clone(), reservation);
            }
        }
    }
    let shutdown = dispatcher.shutdown(Duration::from_secs(5)).await;
    for id in &ids {
        let reservation = reserved.get(id).map_or("none", String::as_str);
        println!("{id}: reserved {reservation}");
    }
    let stats = shutdown.stats;
    println!(
        "deliveries: {} completed, {} retried, {} dead",
        stats.completed, stats.retried, stats.dead
    );
    println!(
        "warehouse requests: {}, replayed answers: {}",
        warehouse.requests.load(Ordering::SeqCst),
        warehouse.replayed.load(Ordering::SeqCst)
    );

    let per_order: Vec<(String, i64)> = warehouse
        .store
        .transaction(|tx| {
            let mut rows = tx
                .sql()
                .prepare("SELECT order_id, count(*) FROM reservations GROUP BY order_id ORDER BY order_id")
                .map_err(|e| Error::Storage(Box::new(e)))?;
            let counts = rows
                .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
                .and_then(Iterator::collect)
                .map_err(|e| Error::Storage(Box::new(e)));
            counts
        })
        .await?;
    let total: i64 = per_order.iter().map(|(_, n)| n).sum();
    println!("reservations at the warehouse: {total}");
    let line: Vec<String> = per_order
        .iter()
        .map(|(id, n)| format!("{id}={n}"))
        .collect();
    println!("reservations per order: {}", line.join(" "));
    let pending = store.with_store(|store| store.pending(100)).await?;
    println!("commands pending: {}", pending.len());
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    demo().await
}
