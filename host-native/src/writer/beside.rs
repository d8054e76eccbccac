//! The `-wal` and `-shm` files beside the database, as the writer's connection opened them.
//!
//! SQLite keeps both open for as long as the connection lives and never replaces them itself. A
//! `-wal` deleted (or replaced) under a live store is the loss of every commit in it, and the
//! connection goes on writing into a file that no longer has a name: those commits are lost when it
//! closes, and another connection already reads a different log. Nothing in SQLite notices. So
//! after each group commits, before it is answered, the reply thread compares the files at those
//! paths with the ones the connection opened (device and inode, one `stat` each), and a mismatch
//! stops the writer for good, as a failed sync does.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use miniflow_core::Error;

/// The files beside one database and the identity each had when the writer started.
pub(super) struct Beside {
    files: Vec<Watched>,
}

struct Watched {
    path: PathBuf,
    /// What the file is, in words, for the error.
    what: &'static str,
    /// Its device and inode while the connection has it open; `None` until it is first seen.
    identity: Option<(u64, u64)>,
}

impl Beside {
    /// The `-wal` and `-shm` of the database at `db` (its canonical path), as they are now: call it
    /// once the writer's connection has read the database, so that it has them open.
    pub(super) fn of(db: &Path) -> Self {
        let watched = |suffix: &str, what| {
            let mut path = db.as_os_str().to_owned();
            path.push(suffix);
            let path = PathBuf::from(path);
            Watched {
                identity: identity(&path),
                path,
                what,
            }
        };
        Self {
            files: vec![
                watched("-wal", "write-ahead log"),
                watched("-shm", "shared-memory index"),
            ],
        }
    }

    /// Checks that each file is still the one the connection opened; on the first mismatch records
    /// why in `failed` (the writer takes no more writes) and returns it as an [`Error::Storage`].
    pub(super) fn check(&mut self, failed: &OnceLock<String>) -> Result<(), Error> {
        if let Some(why) = failed.get() {
            return Err(Error::Storage(why.clone().into()));
        }
        for file in &mut self.files {
            let now = identity(&file.path);
            match (file.identity, now) {
                (None, seen) => file.identity = seen,
                (Some(opened), Some(now)) if opened == now => {}
                (Some(_), _) => {
                    let why = format!(
                        "the {} {} was removed or replaced while the store was open: the commits \
                         in it are lost to every other connection, and later ones could not be \
                         durable, so this writer takes no more writes (the last commit was not \
                         acknowledged); stop every process using the store, then reopen it",
                        file.what,
                        file.path.display()
                    );
                    return Err(Error::Storage(failed.get_or_init(|| why).clone().into()));
                }
            }
        }
        Ok(())
    }
}

/// The device and inode of the file at `path`; `None` when there is none (or where the platform
/// does not say).
fn identity(path: &Path) -> Option<(u64, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Some((meta.dev(), meta.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        None
    }
}
