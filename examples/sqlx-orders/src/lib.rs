//! An order service and a warehouse on sqlx, with miniflow's rows in their own transactions.
//!
//! - [`Shop::place`] writes the order's row and its workflow's first event and commands in ONE
//!   `sqlx::Transaction<'_, Postgres>` of the service's: both commit, or neither. miniflow joins the
//!   transaction (`store.start_in(&mut *tx, …)`), never commits it, and a lost race on the
//!   workflow comes back as `Error::Conflict` with the transaction still usable.
//! - [`Shop::cancel`] records a later event of the order's workflow the same way (`handle_in`, which
//!   replays the workflow's history through the same transaction).
//! - [`Warehouse::reserve`] is the receiver: the key's reservation, the effect (a row of its own)
//!   and the key's record commit in one sqlx transaction (`begin_in` / `finish_in`), so a repeated
//!   delivery gets the stored answer and the effect happens once.
//!
//! The tests (`tests/`) run each case on a throwaway PostgreSQL cluster.

use miniflow::tokio::{AsyncPostgresIdempotencyStore, AsyncPostgresStore};
use miniflow::{
    json, Begin, Command, Decision, Digest, Engine, Error, Event, EventRecord, Handled,
    IdempotencyKey, Value, Workflow, WorkflowId,
};
use sqlx::PgPool;

/// An order reserves its stock when placed, and releases it when cancelled.
pub struct OrderFlow;

impl Workflow for OrderFlow {
    type State = bool;

    fn evolve(&self, cancelled: &mut bool, event: &EventRecord) {
        *cancelled |= event.kind == "order_cancelled";
    }

    fn decide(&self, cancelled: &bool, event: &EventRecord) -> Decision {
        match event.kind.as_str() {
            "order_placed" => {
                Decision::new().command(Command::new("reserve_stock", event.payload.clone()))
            }
            "order_cancelled" if !*cancelled => Decision::new().command(Command::new(
                "release_stock",
                json!({ "order_id": event.workflow_id }),
            )),
            _ => Decision::none(),
        }
    }
}

/// What placing an order did.
#[derive(Debug, PartialEq, Eq)]
pub enum Placed {
    /// The order's row and its workflow committed together; these are its commands.
    New(Vec<String>),
    /// An order with this ID exists: nothing was written.
    AlreadyPlaced,
}

/// The order service: its own tables on a sqlx pool, miniflow's beside them in the same database.
pub struct Shop {
    pool: PgPool,
    store: AsyncPostgresStore,
    engine: Engine<OrderFlow>,
}

impl Shop {
    /// The service on `pool`, with miniflow's store on the same database; creates its table.
    pub async fn new(pool: PgPool, store: AsyncPostgresStore) -> Result<Self, sqlx::Error> {
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS orders \
             (id TEXT PRIMARY KEY, sku TEXT NOT NULL, quantity BIGINT NOT NULL)",
        )
        .execute(&pool)
        .await?;
        Ok(Self {
            pool,
            store,
            engine: Engine::new(OrderFlow),
        })
    }

    /// Places order `id`: its row, its `order_placed` event and the `reserve_stock` command, in one
    /// transaction of the service's.
    pub async fn place(&self, id: &str, sku: &str, quantity: i64) -> Result<Placed, ShopError> {
        let workflow_id = WorkflowId::new(id).map_err(Error::from)?;
        let mut tx = self.pool.begin().await?;
        let inserted = sqlx::query(
            "INSERT INTO orders (id, sku, quantity) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
        )
        .bind(id)
        .bind(sku)
        .bind(quantity)
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() == 0 {
            return Ok(Placed::AlreadyPlaced);
        }
        let event = Event::new(
            "order_placed",
            json!({ "order_id": id, "sku": sku, "quantity": quantity }),
        );
        let handled = self
            .store
            .start_in(&mut *tx, &self.engine, &workflow_id, event)
            .await?;
        tx.commit().await?;
        Ok(Placed::New(ids(&handled)))
    }

    /// Cancels order `id`, marking its row and recording `order_cancelled` in one transaction.
    pub async fn cancel(&self, id: &str) -> Result<Vec<String>, ShopError> {
        let workflow_id = WorkflowId::new(id).map_err(Error::from)?;
        let mut tx = self.pool.begin().await?;
        sqlx::query("UPDATE orders SET quantity = 0 WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let event = Event::new("order_cancelled", json!({}));
        let handled = self
            .store
            .handle_in(&mut *tx, &self.engine, &workflow_id, event)
            .await?;
        tx.commit().await?;
        Ok(ids(&handled))
    }

    /// The engine, for tests and dispatchers.
    pub fn engine(&self) -> &Engine<OrderFlow> {
        &self.engine
    }
}

fn ids(handled: &Handled) -> Vec<String> {
    handled
        .command_ids
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// What went wrong in the service: its own SQL, or miniflow's part.
#[derive(Debug)]
pub enum ShopError {
    /// The service's own statement, or its commit.
    Sql(sqlx::Error),
    /// miniflow's part (a lost race is `Error::Conflict`).
    Miniflow(Error),
}

impl From<sqlx::Error> for ShopError {
    fn from(e: sqlx::Error) -> Self {
        Self::Sql(e)
    }
}

impl From<Error> for ShopError {
    fn from(e: Error) -> Self {
        Self::Miniflow(e)
    }
}

impl std::fmt::Display for ShopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Sql(e) => write!(f, "sql: {e}"),
            Self::Miniflow(e) => write!(f, "miniflow: {e}"),
        }
    }
}

impl std::error::Error for ShopError {}

/// The warehouse: reservations on a sqlx pool, its idempotency records in the same transactions.
pub struct Warehouse {
    pool: PgPool,
    records: AsyncPostgresIdempotencyStore,
}

/// What a reservation request got.
#[derive(Debug, PartialEq)]
pub enum Answer {
    /// Reserved now: the effect and its record committed together.
    Reserved(Value),
    /// Reserved before with this key: the stored answer, and no second effect.
    Replayed(Value),
    /// Another delivery of this key is under way.
    InProgress,
    /// The key came back with other parameters.
    Conflict,
}

impl Warehouse {
    /// The warehouse on `pool`, its records kept by `records`; creates its table.
    pub async fn new(
        pool: PgPool,
        records: AsyncPostgresIdempotencyStore,
    ) -> Result<Self, sqlx::Error> {
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS reservations \
             (id BIGSERIAL PRIMARY KEY, key TEXT NOT NULL, sku TEXT NOT NULL, quantity BIGINT NOT NULL)",
        )
        .execute(&pool)
        .await?;
        Ok(Self { pool, records })
    }

    /// Reserves `quantity` of `sku` for the delivery `key` (its command ID): at most one effect per
    /// key, in one transaction with the key's record.
    pub async fn reserve(&self, key: &str, sku: &str, quantity: i64) -> Result<Answer, ShopError> {
        let key = IdempotencyKey::new(key)?;
        let digest = Digest::of(&json!({ "sku": sku, "quantity": quantity }));
        let mut tx = self.pool.begin().await?;
        let token = match self.records.begin_in(&mut *tx, &key, digest).await? {
            Begin::Fresh { token } => token,
            Begin::Completed { result } => return Ok(Answer::Replayed(result)),
            Begin::InProgress { .. } => return Ok(Answer::InProgress),
            Begin::Conflict { .. } => return Ok(Answer::Conflict),
        };
        let (id,): (i64,) = sqlx::query_as(
            "INSERT INTO reservations (key, sku, quantity) VALUES ($1, $2, $3) RETURNING id",
        )
        .bind(key.as_str())
        .bind(sku)
        .bind(quantity)
        .fetch_one(&mut *tx)
        .await?;
        let answer = json!({ "reservation_id": id });
        self.records
            .finish_in(&mut *tx, &key, token, &answer)
            .await?;
        tx.commit().await?;
        Ok(Answer::Reserved(answer))
    }
}
