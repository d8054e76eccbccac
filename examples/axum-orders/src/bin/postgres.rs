//! The axum example on PostgreSQL, one process per role:
//!
//! ```text
//! cargo build -p miniflow-example-axum    # target/debug/axum-orders-postgres
//! createdb orders; createdb warehouse
//! axum-orders-postgres orders    --database URL --listen 127.0.0.1:8080
//! axum-orders-postgres worker    --database URL --warehouse http://127.0.0.1:8081
//! axum-orders-postgres warehouse --database URL --listen 127.0.0.1:8081
//! ```
//!
//! - **orders** (`POST /orders {order_id, sku, quantity}`): the order's row, its `order_placed`
//!   event and its `reserve_stock` command in ONE tokio-postgres transaction of the service's own
//!   (`AsyncPostgresStore::start_in`); a second order with the same ID is `409` and writes nothing.
//!   `GET /orders/{id}` reads the order's reservation from its workflow.
//! - **worker**: an `AsyncDispatcher` on the orders database, woken by `LISTEN/NOTIFY`, delivering
//!   each command to the warehouse with `Idempotency-Key: <command id>`; the answer comes back into
//!   the order's workflow as one `command_completed`, committed with the ack. Any number of workers
//!   may run, on any machine.
//! - **warehouse** (`POST /reservations`): the key's reservation, the reservation row (the effect)
//!   and the key's record commit in ONE transaction (`AsyncPostgresIdempotencyStore::begin_in` /
//!   `finish_in`), on a database of its own. `GET /stats` counts its requests.
//!
//! Each process prints `ready <address>` (or `ready`) on stdout once it serves, its errors on
//! stderr, and stops on SIGINT or SIGTERM (the worker after its deliveries in flight, up to 10 s).
//! The database may go away and come back: each request that needs it fails with `503` meanwhile,
//! and the pools and the dispatcher reconnect by themselves.
//!
//! Options: `--database` (or `DATABASE_URL`); `--listen` (or `LISTEN`; `127.0.0.1:0` by default,
//! a free port, printed); the worker's `--warehouse` (or `WAREHOUSE_URL`), `--concurrency` (8) and
//! `--lease-ttl-ms` (30000, how long a killed worker's commands wait before another worker takes
//! them); the warehouse's `--work-ms` (0, how long the effect takes inside its transaction) and, as
//! a fault switch for tests, `--lose-answer-every N`: every Nth new reservation is committed but its
//! answer is replaced by a `503`, so the dispatcher delivers again with the same key.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use miniflow::tokio::{AsyncDispatcher, AsyncPostgresIdempotencyStore, AsyncPostgresStore};
use miniflow::{
    json, replay, Begin, Delivery, Digest, Engine, Error, Event, IdempotencyKey, IdempotencyPolicy,
    RetryPolicy, Value, WorkflowId,
};
use miniflow_example_axum::{
    answer, answer_lost, deliver, http_client, serve, unavailable, OrderFlow, Reply, INTENT,
};

type Failed = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> Result<(), Failed> {
    let mut args = std::env::args().skip(1);
    let role = args.next().unwrap_or_default();
    let options = Options::parse(args)?;
    match role.as_str() {
        "orders" => orders(&options).await,
        "worker" => worker(&options).await,
        "warehouse" => warehouse(&options).await,
        other => Err(format!(
            "unknown role {other:?}: axum-orders-postgres orders|worker|warehouse --database URL …"
        )
        .into()),
    }
}

/// `--name value` pairs.
struct Options(HashMap<String, String>);

impl Options {
    fn parse(mut args: impl Iterator<Item = String>) -> Result<Self, Failed> {
        let mut options = HashMap::new();
        while let Some(name) = args.next() {
            let Some(name) = name.strip_prefix("--") else {
                return Err(format!("expected an option, found {name:?}").into());
            };
            let value = args.next().ok_or(format!("--{name} needs a value"))?;
            options.insert(name.to_owned(), value);
        }
        Ok(Self(options))
    }

    fn text(&self, name: &str, env: &str, default: Option<&str>) -> Result<String, Failed> {
        self.0
            .get(name)
            .cloned()
            .or_else(|| std::env::var(env).ok())
            .or(default.map(str::to_owned))
            .ok_or_else(|| format!("--{name} (or {env}) is needed").into())
    }

    fn number(&self, name: &str, default: u64) -> Result<u64, Failed> {
        match self.0.get(name) {
            Some(text) => Ok(text
                .parse()
                .map_err(|e| format!("--{name} {text:?}: {e}"))?),
            None => Ok(default),
        }
    }

    fn database(&self) -> Result<String, Failed> {
        self.text("database", "DATABASE_URL", None)
    }

    async fn listener(&self) -> Result<tokio::net::TcpListener, Failed> {
        let address = self.text("listen", "LISTEN", Some("127.0.0.1:0"))?;
        Ok(tokio::net::TcpListener::bind(&address).await?)
    }
}

/// Serves `router` and says so on stdout; runs until interrupted.
async fn serve_until_stopped(
    listener: tokio::net::TcpListener,
    router: Router,
) -> Result<(), Failed> {
    let address = listener.local_addr()?;
    serve(listener, router);
    println!("ready {address}");
    stopped().await
}

/// Waits for SIGINT or SIGTERM.
async fn stopped() -> Result<(), Failed> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        interrupted = tokio::signal::ctrl_c() => interrupted?,
        _ = terminate.recv() => {}
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------------
// orders

struct Orders {
    store: AsyncPostgresStore,
    engine: Engine<OrderFlow>,
}

async fn orders(options: &Options) -> Result<(), Failed> {
    let store = AsyncPostgresStore::connect(&options.database()?).await?;
    store
        .client()
        .await?
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS orders \
             (order_id TEXT PRIMARY KEY, sku TEXT NOT NULL, quantity BIGINT NOT NULL)",
        )
        .await?;
    let orders = Arc::new(Orders {
        store,
        engine: Engine::new(OrderFlow),
    });
    let router = Router::new()
        .route("/orders", post(place_order))
        .route("/orders/{id}", get(show_order))
        .with_state(orders);
    serve_until_stopped(options.listener().await?, router).await
}

/// What placing an order came to.
enum Placed {
    New(Vec<String>),
    Before,
}

/// `POST /orders {order_id, sku, quantity}`: the order's row, its event and its command, in one
/// transaction of the service's.
async fn place_order(State(orders): State<Arc<Orders>>, Json(order): Json<Value>) -> Response {
    let id = match WorkflowId::new(order["order_id"].as_str().unwrap_or_default()) {
        Ok(id) => id,
        Err(e) => return answer(StatusCode::BAD_REQUEST, json!({ "error": e.to_string() })),
    };
    let (Some(sku), Some(quantity)) = (order["sku"].as_str(), order["quantity"].as_i64()) else {
        return answer(
            StatusCode::BAD_REQUEST,
            json!({ "error": "sku (text) and quantity (integer) are needed" }),
        );
    };
    match place(&orders, &id, sku, quantity, order.clone()).await {
        Ok(Placed::New(commands)) => answer(StatusCode::CREATED, json!({ "commands": commands })),
        Ok(Placed::Before) => answer(StatusCode::CONFLICT, json!({ "error": "already placed" })),
        Err(e) => unavailable(e),
    }
}

async fn place(
    orders: &Orders,
    id: &WorkflowId,
    sku: &str,
    quantity: i64,
    order: Value,
) -> Result<Placed, Failed> {
    let mut client = orders.store.client().await?;
    let tx = client.transaction().await?;
    let inserted = tx
        .execute(
            "INSERT INTO orders (order_id, sku, quantity) VALUES ($1, $2, $3) \
             ON CONFLICT (order_id) DO NOTHING",
            &[&id.as_str(), &sku, &quantity],
        )
        .await?;
    if inserted == 0 {
        return Ok(Placed::Before); // dropping `tx` rolls it back: nothing is written
    }
    let event = Event::new("order_placed", order);
    let handled = match orders.store.start_in(&tx, &orders.engine, id, event).await {
        Ok(handled) => handled,
        Err(Error::Conflict { .. }) => return Ok(Placed::Before),
        Err(e) => return Err(e.into()),
    };
    tx.commit().await?;
    let commands = handled.command_ids.iter().map(ToString::to_string);
    Ok(Placed::New(commands.collect()))
}

/// `GET /orders/{id}`: the order's reservation, from its workflow's events.
async fn show_order(State(orders): State<Arc<Orders>>, Path(id): Path<String>) -> Response {
    let id = match WorkflowId::new(id) {
        Ok(id) => id,
        Err(e) => return answer(StatusCode::BAD_REQUEST, json!({ "error": e.to_string() })),
    };
    let events = match orders.store.load(&id).await {
        Ok(events) if events.is_empty() => {
            return answer(StatusCode::NOT_FOUND, json!({ "error": "no such order" }))
        }
        Ok(events) => events,
        Err(e) => return unavailable(e),
    };
    match replay(orders.engine.workflow(), &events) {
        Ok(replayed) => answer(
            StatusCode::OK,
            json!({ "order_id": id, "reservation": replayed.state.reservation }),
        ),
        Err(e) => answer(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({ "error": e.to_string() }),
        ),
    }
}

// ------------------------------------------------------------------------------------------------
// worker

async fn worker(options: &Options) -> Result<(), Failed> {
    let store = AsyncPostgresStore::connect(&options.database()?).await?;
    let url = format!(
        "{}/reservations",
        options.text("warehouse", "WAREHOUSE_URL", None)?
    );
    let client = http_client();
    let handler = move |delivery: Delivery| deliver(client.clone(), url.clone(), false, delivery);
    // Retries that outlast a database restart or a warehouse away for a while: from 100 ms,
    // doubling up to 2 s, 40 attempts before a command is dead.
    let retries = RetryPolicy::default()
        .initial_delay(Duration::from_millis(100))
        .max_delay(Duration::from_secs(2))
        .max_attempts(40);
    let concurrency = usize::try_from(options.number("concurrency", 8)?)?;
    let running = AsyncDispatcher::new(store, handler)
        .workflow(Arc::new(Engine::new(OrderFlow)))
        .concurrency(concurrency)
        .lease_ttl(Duration::from_millis(
            options.number("lease-ttl-ms", 30_000)?,
        ))
        .retry_policy(retries)
        .poll_interval(Duration::from_millis(100))
        .on_error(|e| eprintln!("worker: {e}"))
        .start()?;
    println!("ready");
    stopped().await?;
    let shutdown = running.shutdown(Duration::from_secs(10)).await;
    eprintln!(
        "worker: {} completed, {} retried, {} dead",
        shutdown.stats.completed, shutdown.stats.retried, shutdown.stats.dead
    );
    Ok(())
}

// ------------------------------------------------------------------------------------------------
// warehouse

struct Warehouse {
    keys: AsyncPostgresIdempotencyStore,
    work: Duration,
    /// Every how many new reservations an answer is lost after the commit (0: never).
    lose_answer_every: u64,
    requests: AtomicU64,
    reserved: AtomicU64,
    replayed: AtomicU64,
    lost: AtomicU64,
}

async fn warehouse(options: &Options) -> Result<(), Failed> {
    // The warehouse's own database: its records' table beside its reservations, no outbox.
    let keys =
        AsyncPostgresIdempotencyStore::connect(&options.database()?, IdempotencyPolicy::default())
            .await?;
    keys.client()
        .await?
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS reservations (reservation_id BIGSERIAL PRIMARY KEY, \
             order_id TEXT NOT NULL, sku TEXT NOT NULL, quantity BIGINT NOT NULL, \
             idempotency_key TEXT NOT NULL)",
        )
        .await?;
    let warehouse = Arc::new(Warehouse {
        keys,
        work: Duration::from_millis(options.number("work-ms", 0)?),
        lose_answer_every: options.number("lose-answer-every", 0)?,
        requests: AtomicU64::new(0),
        reserved: AtomicU64::new(0),
        replayed: AtomicU64::new(0),
        lost: AtomicU64::new(0),
    });
    let router = Router::new()
        .route("/reservations", post(reserve))
        .route("/stats", get(stats))
        .with_state(warehouse);
    serve_until_stopped(options.listener().await?, router).await
}

/// `GET /stats`: the warehouse's counts since it started.
async fn stats(State(warehouse): State<Arc<Warehouse>>) -> Response {
    let count = |n: &AtomicU64| n.load(Ordering::SeqCst);
    answer(
        StatusCode::OK,
        json!({
            "requests": count(&warehouse.requests),
            "reserved": count(&warehouse.reserved),
            "replayed": count(&warehouse.replayed),
            "lost": count(&warehouse.lost),
        }),
    )
}

/// `POST /reservations` with `Idempotency-Key`: the key's reservation, the reservation row and the
/// key's record in one transaction.
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
    match reserve_once(&warehouse, &key, &request).await {
        Ok(Reply::Created(result)) => {
            let n = warehouse.reserved.fetch_add(1, Ordering::SeqCst) + 1;
            let every = warehouse.lose_answer_every;
            if every > 0 && n % every == 0 {
                warehouse.lost.fetch_add(1, Ordering::SeqCst);
                return answer_lost(); // committed, but the caller never hears of it
            }
            Reply::Created(result).into_response()
        }
        Ok(reply) => {
            if matches!(reply, Reply::Replayed(_)) {
                warehouse.replayed.fetch_add(1, Ordering::SeqCst);
            }
            reply.into_response()
        }
        Err(e) => unavailable(e),
    }
}

async fn reserve_once(
    warehouse: &Warehouse,
    key: &IdempotencyKey,
    request: &Value,
) -> Result<Reply, Failed> {
    let digest = Digest::of_intent(request, &INTENT);
    let mut client = warehouse.keys.client().await?;
    let tx = client.transaction().await?;
    let token = match warehouse.keys.begin_in(&tx, key, digest).await? {
        Begin::Fresh { token } => token,
        Begin::Completed { result } => return Ok(Reply::Replayed(result)),
        Begin::Conflict { .. } => return Ok(Reply::Mismatch),
        Begin::InProgress { .. } => return Ok(Reply::Busy),
    };
    let order_id = request["order_id"].as_str().unwrap_or_default();
    let sku = request["sku"].as_str().unwrap_or_default();
    let quantity = request["quantity"].as_i64().unwrap_or_default();
    tokio::time::sleep(warehouse.work).await; // the effect takes its time
    let row = tx
        .query_one(
            "INSERT INTO reservations (order_id, sku, quantity, idempotency_key) \
             VALUES ($1, $2, $3, $4) RETURNING reservation_id",
            &[&order_id, &sku, &quantity, &key.as_str()],
        )
        .await?;
    let reservation: i64 = row.try_get(0)?;
    let result = json!({ "reservation_id": format!("RSV-{reservation}"), "order_id": order_id });
    warehouse.keys.finish_in(&tx, key, token, &result).await?;
    tx.commit().await?;
    Ok(Reply::Created(result))
}
