//! The worker and producer processes of the multi-process tests on the async API, as a tokio
//! service would write them: an `AsyncDispatcher` on an `AsyncPostgresStore` (woken by its
//! `LISTEN` connection), delivering to a receiver whose effect commits with its record in one
//! transaction (`AsyncPostgresIdempotencyStore::run`), and a producer placing orders with `start`.
//! No `spawn_blocking` and no blocking call on the runtime: the process's main thread only watches
//! the database, as the synchronous worker process does.
//!
//! The receiver logs each delivery in `deliveries` as the synchronous one does, so the same
//! invariants hold; it also prints `effect=<command id>` once an effect's commit is acknowledged,
//! so that a test can tell an acknowledged effect from one the database never had.

use std::sync::Arc;
use std::time::Duration;

use miniflow::tokio::tokio_postgres::{self, NoTls, Transaction};
use miniflow::tokio::{AsyncDispatcher, AsyncPostgresIdempotencyStore, AsyncPostgresStore};
use miniflow::{
    json, Delivery, Digest, Engine, Error, Event, IdempotencyKey, IdempotencyPolicy, Outcome,
    Received,
};

use super::delivery::{
    loses_a_parcel, options, order_id, retry_policy, ErrorLog, Report, Shipping, Workers, PARCELS,
};
use crate::child;

/// A runtime of two threads, as a small service has.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Connects the async store to `url` as `app`, trying again until it can (a server may be down).
async fn connect(url: &str, app: &str, options: &miniflow::PostgresOptions) -> AsyncPostgresStore {
    let mut config: tokio_postgres::Config = url.parse().expect("a PostgreSQL URL");
    config.application_name(app);
    loop {
        match AsyncPostgresStore::connect_tls(config.clone(), NoTls, options).await {
            Ok(store) => return store,
            Err(e) => {
                eprintln!("{app}: connect: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Runs [`Workers`] on the async API (see [`Workers::run`]).
pub fn run_workers(workers: &Workers) -> Report {
    assert!(
        workers.crash.is_none(),
        "the async worker process has no crash points: kill it from outside"
    );
    let runtime = runtime();
    let errors = ErrorLog::default();
    let running = runtime.block_on(async {
        let store = connect(&workers.url, &workers.app, &workers.options()).await;
        let receiver = Arc::new(AsyncReceiver {
            keys: AsyncPostgresIdempotencyStore::new(
                store.clone(),
                IdempotencyPolicy {
                    retention: Duration::from_secs(24 * 3600),
                    reservation_timeout: Duration::from_secs(1),
                },
            )
            .expect("a receiver"),
            store: store.clone(),
            app: workers.app.clone(),
        });
        AsyncDispatcher::new(store, move |d: Delivery| receiver.clone().deliver(d))
            .workflow(Arc::new(Engine::new(Shipping)))
            .name(workers.app.clone())
            .concurrency(workers.workers * 4)
            .batch_size(32)
            .lease_ttl(workers.lease)
            .retry_policy(retry_policy())
            .on_error(errors.recorder(&workers.app))
            .start()
            .expect("start the dispatcher")
    });
    // The dispatcher's tasks run on the runtime's threads meanwhile.
    let (settled, listening) = workers.watch();
    let shutdown = runtime.block_on(running.shutdown(Duration::from_secs(10)));
    errors.report(workers, shutdown, settled, listening)
}

/// The idempotent receiver of [`super::delivery::Receiver`] on the async API: the effect, its
/// log entry and its record commit in one transaction.
struct AsyncReceiver {
    store: AsyncPostgresStore,
    keys: AsyncPostgresIdempotencyStore,
    app: String,
}

impl AsyncReceiver {
    async fn deliver(self: Arc<Self>, d: Delivery) -> Outcome {
        let order = d.payload["n"].as_u64().unwrap_or_default() as usize;
        if d.kind == "ship" && d.payload["parcel"] == PARCELS - 1 && loses_a_parcel(order) {
            return match self.log(&d, "lost").await {
                Ok(()) => Outcome::permanent("parcel lost"),
                Err(e) => Outcome::retry(e),
            };
        }
        self.effect(&d)
            .await
            .unwrap_or_else(|e| Outcome::retry(format!("receiver: {e}")))
    }

    async fn effect(&self, d: &Delivery) -> Result<Outcome, Error> {
        let id = d.command_id.to_string();
        let key = IdempotencyKey::new(id.as_str())?;
        let (app, pid) = (self.app.as_str(), i64::from(std::process::id()));
        let (token, attempt) = (i64::try_from(d.token).unwrap(), i64::from(d.attempt));
        let received = self
            .keys
            .run(
                &key,
                Digest::of(&d.payload),
                async |tx: &Transaction<'_>| {
                    tx.execute(
                        "INSERT INTO deliveries (command_id, token, attempt, app, pid, answer) \
                     VALUES ($1, $2, $3, $4, $5, 'effect')",
                        &[&id, &token, &attempt, &app, &pid],
                    )
                    .await
                    .map_err(storage)?;
                    tx.execute(
                        "INSERT INTO effects (command_id, token, app, pid) VALUES ($1, $2, $3, $4)",
                        &[&id, &token, &app, &pid],
                    )
                    .await
                    .map_err(storage)?;
                    Ok::<_, Error>(json!({ "reference": format!("REF-{id}") }))
                },
            )
            .await?;
        Ok(match received {
            Received::Done { result } => {
                println!("effect={id}");
                Outcome::done_with(result)
            }
            Received::Repeated { result } => {
                self.log(d, "completed").await?;
                Outcome::done_with(result)
            }
            Received::InProgress { .. } => {
                self.log(d, "in_progress").await?;
                Outcome::retry("409: in progress")
            }
            conflict @ Received::Conflict { .. } => {
                Outcome::permanent(format!("422: {conflict:?}"))
            }
        })
    }

    /// Logs a delivery that made no effect.
    async fn log(&self, d: &Delivery, answer: &str) -> Result<(), Error> {
        let (id, app, pid) = (
            d.command_id.to_string(),
            self.app.as_str(),
            i64::from(std::process::id()),
        );
        let (token, attempt) = (i64::try_from(d.token).unwrap(), i64::from(d.attempt));
        self.store
            .client()
            .await?
            .execute(
                "INSERT INTO deliveries (command_id, token, attempt, app, pid, answer) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
                &[&id, &token, &attempt, &app, &pid, &answer],
            )
            .await
            .map_err(storage)?;
        Ok(())
    }
}

fn storage(e: tokio_postgres::Error) -> Error {
    Error::Storage(Box::new(e))
}

/// Places the orders `0..orders` that are not placed yet with the async store, one every `pace`,
/// riding out store errors: an order whose commit failed is looked up again, so one whose commit
/// landed unseen is not placed twice. Returns how many errors it rode out.
async fn produce(store: &AsyncPostgresStore, orders: usize, pace: Duration) -> u64 {
    let engine = Engine::new(Shipping);
    let mut errors = 0;
    for n in 0..orders {
        let id = order_id(n);
        let mut pause = Duration::from_millis(10);
        loop {
            let placed = match store.load(&id).await {
                Ok(events) if !events.is_empty() => Ok(()),
                Ok(_) => {
                    let event = Event::new("order_placed", json!({ "n": n }));
                    match store.start(&engine, &id, event).await {
                        Ok(_) | Err(Error::Conflict { .. }) => Ok(()),
                        Err(e) => Err(e),
                    }
                }
                Err(e) => Err(e),
            };
            match placed {
                Ok(()) => break,
                Err(e) => {
                    errors += 1;
                    eprintln!("producer: order {n}: {e}; trying again in {pause:?}");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
            }
        }
        tokio::time::sleep(pace).await;
    }
    errors
}

/// Starts an async producer process placing orders `0..orders`, one every `pace`, as `app`.
pub fn spawn_producer(url: &str, app: &str, orders: usize, pace: Duration) -> std::process::Child {
    let settings = [
        ("MINIFLOW_PG_URL", url.to_owned()),
        ("MINIFLOW_PG_APP", app.to_owned()),
        ("MINIFLOW_ORDERS", orders.to_string()),
        ("MINIFLOW_PACE_MS", pace.as_millis().to_string()),
    ];
    child::spawn(
        "postgres::async_processes::child_pg_async_producer",
        "pg_async_producer",
        &settings,
    )
}

/// Child process: an async producer (see [`spawn_producer`]). Prints how many errors it rode out.
#[test]
fn child_pg_async_producer() {
    if child::role().as_deref() != Some("pg_async_producer") {
        return;
    }
    let url = child::setting("MINIFLOW_PG_URL");
    let app = child::setting("MINIFLOW_PG_APP");
    let orders = child::setting("MINIFLOW_ORDERS").parse().unwrap();
    let pace = Duration::from_millis(child::setting("MINIFLOW_PACE_MS").parse().unwrap());
    let errors = runtime().block_on(async {
        let store = connect(&url, &app, &options()).await;
        produce(&store, orders, pace).await
    });
    println!("producer_errors={errors}");
}
