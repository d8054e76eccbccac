//! The caller's-transaction cases on sqlx, each on a database of its own of a throwaway cluster:
//! what commits together, what a rollback takes with it, a lost race that leaves the transaction
//! usable, the history read back through sqlx's wire values, a receiver's effect once, and the
//! wake-up only after the service commits.

#[path = "../../../tests/it/postgres/cluster.rs"]
#[allow(dead_code)]
mod cluster;

use std::time::Duration;

use cluster::TestDatabase;
use miniflow::tokio::{AsyncPostgresIdempotencyStore, AsyncPostgresStore, CallerTransaction};
use miniflow::{json, Engine, Error, Event, Handled, IdempotencyPolicy, Status, WorkflowId};
use miniflow_example_sqlx::{Answer, OrderFlow, Placed, Shop, Warehouse};
use sqlx::postgres::{PgListener, PgPoolOptions};
use sqlx::PgPool;

fn wid(text: &str) -> WorkflowId {
    WorkflowId::new(text).unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn open(database: &TestDatabase) -> (PgPool, AsyncPostgresStore) {
    let store = AsyncPostgresStore::connect(&database.url()).await.unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&database.url())
        .await
        .unwrap();
    (pool, store)
}

/// Starts order `id`'s workflow inside the caller's transaction `tx`, nothing read first.
async fn start<'a>(
    store: &AsyncPostgresStore,
    tx: impl Into<CallerTransaction<'a>>,
    id: &str,
) -> Result<Handled, Error> {
    let event = Event::new("order_placed", json!({}));
    store
        .start_in(tx, &Engine::new(OrderFlow), &wid(id), event)
        .await
}

async fn count(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[test]
fn an_order_row_and_its_workflow_commit_together_in_the_services_sqlx_transaction() {
    let database = TestDatabase::new();
    runtime().block_on(async {
        let (pool, store) = open(&database).await;
        let shop = Shop::new(pool.clone(), store.clone()).await.unwrap();

        let placed = shop.place("order-1", "sku-7", 2).await.unwrap();
        assert_eq!(placed, Placed::New(vec!["order-1:1:0".to_owned()]));
        assert_eq!(count(&pool, "SELECT count(*) FROM orders").await, 1);
        let events = store.load(&wid("order-1")).await.unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(
            events[0].payload,
            json!({ "order_id": "order-1", "sku": "sku-7", "quantity": 2 })
        );
        let command = store
            .command(&"order-1:1:0".parse().unwrap())
            .await
            .unwrap()
            .expect("the command committed with the order");
        assert_eq!(command.kind, "reserve_stock");
        assert_eq!(command.status, Status::Pending);

        // The same order again writes nothing: the service's own check, before miniflow's.
        assert_eq!(
            shop.place("order-1", "sku-7", 2).await.unwrap(),
            Placed::AlreadyPlaced
        );
        assert_eq!(store.load(&wid("order-1")).await.unwrap().len(), 1);
    });
}

#[test]
fn a_rolled_back_sqlx_transaction_takes_miniflows_rows_with_it() {
    let database = TestDatabase::new();
    runtime().block_on(async {
        let (pool, store) = open(&database).await;
        Shop::new(pool.clone(), store.clone()).await.unwrap(); // its orders table
        let mut tx = pool.begin().await.unwrap();
        sqlx::query("INSERT INTO orders VALUES ('order-1', 'sku-7', 2)")
            .execute(&mut *tx)
            .await
            .unwrap();
        start(&store, &mut *tx, "order-1").await.unwrap();
        tx.rollback().await.unwrap();
        assert_eq!(count(&pool, "SELECT count(*) FROM orders").await, 0);
        assert!(store.load(&wid("order-1")).await.unwrap().is_empty());
        assert_eq!(store.stats().await.unwrap().pending(), 0);

        // Dropped without a commit, as an early `?` in a handler does: the same.
        {
            let mut tx = pool.begin().await.unwrap();
            start(&store, &mut tx, "order-2").await.unwrap();
        }
        assert!(store.load(&wid("order-2")).await.unwrap().is_empty());
    });
}

#[test]
fn a_lost_race_on_the_workflow_is_a_conflict_that_leaves_the_sqlx_transaction_usable() {
    let database = TestDatabase::new();
    runtime().block_on(async {
        let (pool, store) = open(&database).await;
        let shop = Shop::new(pool.clone(), store.clone()).await.unwrap();
        assert!(matches!(
            shop.place("order-1", "sku-7", 2).await.unwrap(),
            Placed::New(_)
        ));

        // Another transaction starts the same workflow (its order row under another ID): a Conflict,
        // and the service's transaction goes on and commits its own rows.
        let mut tx = pool.begin().await.unwrap();
        sqlx::query("INSERT INTO orders VALUES ('order-1b', 'sku-7', 1)")
            .execute(&mut *tx)
            .await
            .unwrap();
        let again = start(&store, &mut *tx, "order-1").await;
        assert!(matches!(again, Err(Error::Conflict { .. })), "{again:?}");
        let still: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
            .fetch_one(&mut *tx)
            .await
            .expect("the transaction is not aborted");
        assert_eq!(still, 2);
        tx.commit().await.unwrap();
        assert_eq!(count(&pool, "SELECT count(*) FROM orders").await, 2);
        assert_eq!(store.load(&wid("order-1")).await.unwrap().len(), 1);

        // Two transactions racing on one new workflow: one commit, one Conflict.
        let (mut first, mut second) = (pool.begin().await.unwrap(), pool.begin().await.unwrap());
        start(&store, &mut *first, "order-2").await.unwrap();
        let racing = {
            let store = store.clone();
            tokio::spawn(async move {
                let out = start(&store, &mut *second, "order-2").await;
                let usable = sqlx::query("SELECT 1").execute(&mut *second).await.is_ok();
                (out, usable)
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        first.commit().await.unwrap();
        let (out, usable) = racing.await.unwrap();
        assert!(matches!(out, Err(Error::Conflict { .. })), "{out:?}");
        assert!(usable, "the loser's transaction is usable");
    });
}

#[test]
fn a_later_event_replays_the_history_through_the_sqlx_transaction() {
    let database = TestDatabase::new();
    runtime().block_on(async {
        let (pool, store) = open(&database).await;
        let shop = Shop::new(pool.clone(), store.clone()).await.unwrap();
        shop.place("order-1", "sku-7", 2).await.unwrap();

        // The workflow decides on its history, read back through sqlx: cancelled once, a release;
        // cancelled again, nothing more.
        assert_eq!(shop.cancel("order-1").await.unwrap(), ["order-1:2:0"]);
        assert!(shop.cancel("order-1").await.unwrap().is_empty());
        let events = store.load(&wid("order-1")).await.unwrap();
        assert_eq!(
            events.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>(),
            ["order_placed", "order_cancelled", "order_cancelled"]
        );
        let quantity: i64 = sqlx::query_scalar("SELECT quantity FROM orders WHERE id = 'order-1'")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(
            quantity, 0,
            "the service's row changed in the same transactions"
        );
    });
}

#[test]
fn a_receivers_effect_and_its_record_commit_in_one_sqlx_transaction_once_per_key() {
    let database = TestDatabase::new();
    runtime().block_on(async {
        let (pool, store) = open(&database).await;
        let records =
            AsyncPostgresIdempotencyStore::new(store, IdempotencyPolicy::default()).unwrap();
        let warehouse = Warehouse::new(pool.clone(), records.clone()).await.unwrap();

        let first = warehouse.reserve("order-1:1:0", "sku-7", 2).await.unwrap();
        let Answer::Reserved(answer) = first else {
            panic!("{first:?}")
        };
        // Redelivered (the answer was lost on the way back): the stored answer, no second effect.
        assert_eq!(
            warehouse.reserve("order-1:1:0", "sku-7", 2).await.unwrap(),
            Answer::Replayed(answer)
        );
        assert_eq!(count(&pool, "SELECT count(*) FROM reservations").await, 1);
        // The key with other parameters: refused, nothing written.
        assert_eq!(
            warehouse.reserve("order-1:1:0", "sku-7", 3).await.unwrap(),
            Answer::Conflict
        );

        // Deliveries of one key at once: one effect, whatever the interleaving.
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let warehouse = Warehouse::new(pool.clone(), records.clone());
                tokio::spawn(async move {
                    let warehouse = warehouse.await.unwrap();
                    warehouse.reserve("order-2:1:0", "sku-1", 1).await.unwrap()
                })
            })
            .collect();
        let mut reserved = 0;
        for task in tasks {
            if let Answer::Reserved(_) = task.await.unwrap() {
                reserved += 1;
            }
        }
        assert_eq!(reserved, 1);
        assert_eq!(
            count(
                &pool,
                "SELECT count(*) FROM reservations WHERE key = 'order-2:1:0'"
            )
            .await,
            1
        );
    });
}

#[test]
fn a_finish_for_a_reservation_taken_over_writes_nothing_and_leaves_the_transaction_usable() {
    let database = TestDatabase::new();
    runtime().block_on(async {
        let (pool, store) = open(&database).await;
        let records =
            AsyncPostgresIdempotencyStore::new(store, IdempotencyPolicy::default()).unwrap();
        let key = miniflow::IdempotencyKey::new("order-1:1:0").unwrap();
        let digest = miniflow::Digest::of(&json!({}));
        let mut tx = pool.begin().await.unwrap();
        let miniflow::Begin::Fresh { token } =
            records.begin_in(&mut *tx, &key, digest).await.unwrap()
        else {
            panic!("a fresh key")
        };
        let stale = records
            .finish_in(&mut *tx, &key, token + 1, &json!({ "ok": true }))
            .await;
        assert!(
            matches!(stale, Err(Error::StaleReservation { .. })),
            "{stale:?}"
        );
        sqlx::query("SELECT 1")
            .execute(&mut *tx)
            .await
            .expect("the transaction is not aborted");
        records
            .finish_in(&mut *tx, &key, token, &json!({ "ok": true }))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let record = records.record(&key).await.unwrap().expect("committed");
        assert!(
            matches!(
                record.state,
                miniflow::backend::RecordState::Completed { .. }
            ),
            "{record:?}"
        );
    });
}

#[test]
fn the_wake_up_reaches_listeners_only_after_the_sqlx_transaction_commits() {
    let database = TestDatabase::new();
    runtime().block_on(async {
        let (pool, store) = open(&database).await;
        Shop::new(pool.clone(), store.clone()).await.unwrap(); // its orders table
        let mut listener = PgListener::connect(&database.url()).await.unwrap();
        listener.listen("miniflow_outbox").await.unwrap();

        let mut tx = pool.begin().await.unwrap();
        let caller: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        start(&store, &mut *tx, "order-1").await.unwrap();
        let early = tokio::time::timeout(Duration::from_millis(300), listener.recv()).await;
        assert!(early.is_err(), "no hint before the commit: {early:?}");
        tx.commit().await.unwrap();
        let hint = tokio::time::timeout(Duration::from_secs(5), listener.recv())
            .await
            .expect("a hint after the commit")
            .unwrap();
        assert_ne!(
            hint.process_id() as i32,
            caller,
            "sent by the store, not from inside the caller's transaction"
        );
    });
}

#[test]
fn a_sqlx_connection_outside_a_transaction_is_refused_saying_so() {
    let database = TestDatabase::new();
    runtime().block_on(async {
        let (pool, store) = open(&database).await;
        Shop::new(pool.clone(), store.clone()).await.unwrap(); // its orders table
        let mut connection = pool.acquire().await.unwrap();
        let refused = start(&store, &mut *connection, "order-1").await;
        let Err(Error::Storage(e)) = &refused else {
            panic!("{refused:?}")
        };
        assert!(e.to_string().contains("transaction block"), "{e}");
        assert!(store.load(&wid("order-1")).await.unwrap().is_empty());
    });
}

/// The `search_path` of the connection `tx`.
async fn search_path(tx: &mut sqlx::PgConnection) -> String {
    sqlx::query_scalar("SHOW search_path")
        .fetch_one(tx)
        .await
        .unwrap()
}

#[test]
fn in_a_schema_of_its_own_miniflows_rows_join_the_sqlx_transaction_and_give_its_search_path_back() {
    let database = TestDatabase::new();
    runtime().block_on(async {
        let options = miniflow::PostgresOptions::new().schema("outbox");
        let store = AsyncPostgresStore::connect_with(&database.url(), &options)
            .await
            .unwrap();
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .connect(&database.url())
            .await
            .unwrap();
        let shop = Shop::new(pool.clone(), store.clone()).await.unwrap();
        shop.place("order-1", "sku-7", 2).await.unwrap();
        assert_eq!(shop.cancel("order-1").await.unwrap(), ["order-1:2:0"]);

        let mut tx = pool.begin().await.unwrap();
        let before = search_path(&mut tx).await;
        start(&store, &mut *tx, "order-2").await.unwrap();
        let again = start(&store, &mut *tx, "order-2").await;
        assert!(matches!(again, Err(Error::Conflict { .. })), "{again:?}");
        assert_eq!(search_path(&mut tx).await, before, "the path given back");
        tx.commit().await.unwrap();

        assert_eq!(store.load(&wid("order-1")).await.unwrap().len(), 2);
        assert_eq!(store.load(&wid("order-2")).await.unwrap().len(), 1);
        assert_eq!(count(&pool, "SELECT count(*) FROM outbox.events").await, 3);
        assert_eq!(
            count(
                &pool,
                "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename = 'events'"
            )
            .await,
            0,
            "nothing of miniflow's beside the service's orders"
        );
        assert_eq!(count(&pool, "SELECT count(*) FROM orders").await, 1);
    });
}
