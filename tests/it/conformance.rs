//! The store conformance suite, run against every store miniflow ships.

use miniflow::conformance::{Harness, IdempotencyHarness};
use miniflow::{
    IdempotencyPolicy, IdempotencyStore, MemoryIdempotencyStore, MemoryStore,
    SqliteIdempotencyStore, SqliteStore,
};
use tempfile::TempDir;

/// [`MemoryStore`]: reopening keeps the same store, as a process that never stopped.
pub struct MemoryHarness;

impl Harness for MemoryHarness {
    type Store = MemoryStore;

    fn open(&mut self) -> MemoryStore {
        MemoryStore::new()
    }

    fn reopen(&mut self, store: MemoryStore) -> MemoryStore {
        store
    }

    fn fail_commits_with_command_kind(&mut self, store: &mut MemoryStore, kind: &str) {
        store.fail_commits_with_command_kind(kind);
    }
}

/// [`SqliteStore`] on real files in a temporary directory; reopening closes the connection and opens the
/// file again.
pub struct SqliteHarness {
    dir: TempDir,
    files: usize,
}

impl SqliteHarness {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temporary directory"),
            files: 0,
        }
    }
}

impl Harness for SqliteHarness {
    type Store = SqliteStore;

    fn open(&mut self) -> SqliteStore {
        self.files += 1;
        SqliteStore::open(self.dir.path().join(format!("store-{}.db", self.files))).expect("open")
    }

    fn reopen(&mut self, store: SqliteStore) -> SqliteStore {
        let path = store.path().to_path_buf();
        drop(store);
        SqliteStore::open(path).expect("reopen")
    }

    /// A temporary trigger on the writer's connection aborts the insert of such a command: the event
    /// row and the commands before it are already written in the transaction, which must then roll
    /// back as a whole.
    fn fail_commits_with_command_kind(&mut self, store: &mut SqliteStore, kind: &str) {
        let trigger = format!(
            "CREATE TEMP TRIGGER fail_{kind} BEFORE INSERT ON main.outbox \
             WHEN NEW.kind = '{kind}' BEGIN SELECT RAISE(ABORT, 'injected failure'); END;"
        );
        store
            .writer()
            .expect("a store that writes")
            .run(move |tx| {
                tx.execute_batch(&trigger)
                    .map_err(|e| miniflow::Error::Storage(Box::new(e)))
            })
            .expect("install the failing trigger");
    }
}

pub struct MemoryIdempotencyHarness;

impl IdempotencyHarness for MemoryIdempotencyHarness {
    type Store = MemoryIdempotencyStore;

    fn open(&mut self, policy: IdempotencyPolicy) -> MemoryIdempotencyStore {
        MemoryIdempotencyStore::new(policy).expect("a valid policy")
    }

    fn reopen(&mut self, store: MemoryIdempotencyStore) -> MemoryIdempotencyStore {
        store
    }
}

impl IdempotencyHarness for SqliteHarness {
    type Store = SqliteIdempotencyStore;

    fn open(&mut self, policy: IdempotencyPolicy) -> SqliteIdempotencyStore {
        self.files += 1;
        let path = self.dir.path().join(format!("receiver-{}.db", self.files));
        SqliteIdempotencyStore::open(path, policy).expect("open")
    }

    fn reopen(&mut self, store: SqliteIdempotencyStore) -> SqliteIdempotencyStore {
        let (path, policy) = (store.path().to_path_buf(), *store.policy());
        drop(store);
        SqliteIdempotencyStore::open(path, policy).expect("reopen")
    }
}

mod memory_idempotency {
    miniflow::idempotency_conformance_tests!(super::MemoryIdempotencyHarness);
}

mod sqlite_idempotency {
    miniflow::idempotency_conformance_tests!(super::SqliteHarness::new());
}

mod memory {
    miniflow::store_conformance_tests!(super::MemoryHarness);
}

mod sqlite {
    miniflow::store_conformance_tests!(super::SqliteHarness::new());
}
