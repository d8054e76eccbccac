//! The synchronous store's pool: `r2d2` over `r2d2_postgres`, each connection with its statement
//! cache, tested before it is handed out only when it has been idle a while.

use std::ops::{Deref, DerefMut};
use std::time::Duration;

use miniflow_core::Error;
use postgres::tls::{MakeTlsConnect, TlsConnect};
use postgres::{Client, Config, Socket};
use r2d2_postgres::PostgresConnectionManager;

use crate::db::{Connection, Connections, Pooled};
use crate::errors::storage;

/// A connection checked out of the pool; it goes back when dropped.
pub type PooledClient = Box<dyn DerefMut<Target = Client> + Send>;

/// The client of a checked-out connection, for the caller.
pub(crate) struct ClientOf(pub(crate) Pooled);

impl Deref for ClientOf {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.0.client
    }
}

impl DerefMut for ClientOf {
    fn deref_mut(&mut self) -> &mut Client {
        &mut self.0.client
    }
}

/// The pool's connections: `r2d2_postgres`'s, each with its statement cache.
pub(crate) struct Manager<T>(pub(crate) PostgresConnectionManager<T>);

/// How long a pooled connection may have been idle and still be handed out untested.
const TRUSTED_IDLE: Duration = Duration::from_secs(1);

impl<T> r2d2::ManageConnection for Manager<T>
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::TlsConnect: Send,
    T::Stream: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    type Connection = Connection;
    type Error = postgres::Error;

    fn connect(&self) -> Result<Connection, postgres::Error> {
        self.0.connect().map(Connection::new)
    }

    /// Asks the server only about a connection that has been idle a while: the server may have
    /// closed it meanwhile (an idle-session timeout, a restart, a proxy), and a connection taken
    /// back at once is still open. So a busy pool pays no round trip per operation, and an idle one
    /// pays one per checkout instead of failing its caller's operation.
    fn is_valid(&self, connection: &mut Connection) -> Result<(), postgres::Error> {
        if connection.idle_since.elapsed() < TRUSTED_IDLE {
            return Ok(());
        }
        self.0.is_valid(&mut connection.client)
    }

    fn has_broken(&self, connection: &mut Connection) -> bool {
        connection.idle_since = std::time::Instant::now(); // given back: idle from now on
                                                           // A transaction of the store's still open (an operation that panicked): closing the
                                                           // connection rolls it back.
        connection.in_transaction || self.0.has_broken(&mut connection.client)
    }
}

pub(crate) struct Pool<T>
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::TlsConnect: Send,
    T::Stream: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    pub(crate) pool: r2d2::Pool<Manager<T>>,
    pub(crate) config: Config,
    pub(crate) tls: T,
}

impl<T> Connections for Pool<T>
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::TlsConnect: Send,
    T::Stream: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    fn get(&self) -> Result<Pooled, Error> {
        self.pool
            .get()
            .map(|connection| Box::new(connection) as Pooled)
            .map_err(|e| Error::Storage(format!("no PostgreSQL connection: {e}").into()))
    }

    fn dedicated(&self) -> Result<Client, Error> {
        self.config.connect(self.tls.clone()).map_err(storage)
    }
}
