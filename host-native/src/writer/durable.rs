//! Making a group durable after its COMMIT, off the writer thread.
//!
//! With `synchronous=FULL`, SQLite syncs the WAL inside every COMMIT, and the writer thread, which
//! holds the file's write lock, waits for the disk each time: about half of its time under load.
//! Instead the writer's connection commits with `synchronous=NORMAL` (the WAL is written, not synced)
//! and the reply thread syncs the WAL file once for every group that committed since its last sync,
//! before it answers any of them, while the writer already runs the next group. A caller is still
//! answered only once its commit is on disk; only the wait moved.
//!
//! Why this is as durable as `FULL`: the WAL is one file written front to back, and a sync of it
//! covers every frame written before the sync began, commits of other connections included. After a
//! power loss SQLite recovers the WAL's valid frames up to the last commit among them: a prefix of
//! the commits. Every group answered was in the synced prefix. A commit that is not yet synced can be
//! read by other connections (a read, a claim); whatever they derive from it and write is later in
//! the WAL, so it is lost with it, and a claim is answered (its commands handed to a handler) only
//! after a sync that covers both. A checkpoint still syncs the WAL before it copies it into the
//! database file, as with `NORMAL`. What a plain read shows (`pending`, `load`, the CLI) may be a
//! moment ahead of the disk, as with `NORMAL`: act on commands through claims, never on such reads.
//!
//! A sync that fails stops the writer for good (like PostgreSQL after a failed `fsync`): the pages it
//! was to write may have been dropped by the kernel, and a later sync that succeeds would not bring
//! them back. Every request from then on gets an [`Error::Storage`] saying so; reopen the store.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use miniflow_core::Error;

/// How the commits of one writer reach the disk.
pub(super) enum Durability {
    /// Each COMMIT syncs (or does not) as the connection's `synchronous` says.
    AtCommit,
    /// The connection commits without syncing; the reply thread syncs the WAL before it answers.
    SyncWal {
        /// The database's WAL file (its path and `-wal`).
        path: PathBuf,
        /// The WAL, opened at the first sync that finds it.
        file: Option<File>,
        /// Why the writer stopped: set by the first sync that failed, read by the writer thread.
        failed: Arc<OnceLock<String>>,
        /// How many syncs succeeded.
        syncs: Arc<AtomicU64>,
    },
}

impl Durability {
    /// Makes every commit of this writer so far durable.
    pub(super) fn sync(&mut self) -> Result<(), Error> {
        let Durability::SyncWal {
            path,
            file,
            failed,
            syncs,
        } = self
        else {
            return Ok(());
        };
        if let Some(why) = failed.get() {
            return Err(Error::Storage(why.clone().into()));
        }
        let fail = |e: io::Error| {
            let why = format!(
                "could not sync the write-ahead log {} ({e}): the last commits may not be on \
                 disk, and this writer takes no more writes; reopen the store",
                path.display()
            );
            Error::Storage(failed.get_or_init(|| why).clone().into())
        };
        if file.is_none() {
            // Opened for writing too: some systems sync only a file opened so. Nothing is written.
            match OpenOptions::new().read(true).write(true).open(&*path) {
                Ok(opened) => *file = Some(opened),
                // No commit of this writer has written a page yet.
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(fail(e)),
            }
        }
        if let Some(wal) = file {
            wal.sync_data().map_err(fail)?;
            syncs.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Why the writer stopped taking writes, once a sync has failed.
pub(super) fn stopped_by(failed: &OnceLock<String>) -> Option<Error> {
    failed.get().map(|why| Error::Storage(why.clone().into()))
}
