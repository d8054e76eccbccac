//! The PostgreSQL server the tests use, and one fresh database per test so they run in parallel.
//!
//! With `MINIFLOW_TEST_DATABASE_URL` set (a role that may `CREATE DATABASE`), each test database is
//! created on that server and dropped after the test. Otherwise the first test starts a throwaway
//! cluster for the whole test process: `initdb` into a new temporary directory (as the `postgres`
//! user when the tests run as root), a free port on 127.0.0.1, `fsync` on, started with
//! `pg_ctl -w`. A watchdog process stops it (fast shutdown) and removes the directory as soon as
//! the test process ends, however it ends — normally, on a panic, killed — because it waits on a
//! pipe that only the test process holds open. Nothing is left running to block the next run.
//!
//! A test that stops and restarts the server starts a [`Cluster`] of its own the same way.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use miniflow::postgres::{Client, NoTls};

/// The server for this test process: how to reach it, and a connection to create databases with.
struct Server {
    /// The throwaway cluster this process started, if it started one.
    cluster: Option<Cluster>,
    /// A URL whose database part [`Server::url`] replaces.
    base: String,
    admin: Mutex<Client>,
    /// Whether new databases sort text with ICU's en-US rules, so that every test shows miniflow's
    /// byte order does not depend on the database's collation.
    icu: bool,
}

static SERVER: OnceLock<Result<Server, String>> = OnceLock::new();
static DATABASES: AtomicUsize = AtomicUsize::new(0);

fn server() -> &'static Server {
    match SERVER.get_or_init(|| match std::env::var("MINIFLOW_TEST_DATABASE_URL") {
        Ok(url) if !url.trim().is_empty() => Server::external(url.trim()),
        _ => Server::throwaway(),
    }) {
        Ok(server) => server,
        Err(e) => panic!("no PostgreSQL server for the tests: {e}"),
    }
}

/// A database of its own for one test, dropped when the test ends.
pub struct TestDatabase {
    name: String,
}

impl TestDatabase {
    /// A new, empty database.
    pub fn new() -> Self {
        let server = server();
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        let name = format!(
            "miniflow_test_{}_{}_{}",
            std::process::id(),
            stamp % 100_000_000,
            DATABASES.fetch_add(1, Ordering::SeqCst)
        );
        let collation = if server.icu {
            " TEMPLATE template0 ENCODING 'UTF8' LOCALE 'C' LOCALE_PROVIDER icu ICU_LOCALE 'en-US'"
        } else {
            ""
        };
        server
            .admin
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .batch_execute(&format!("CREATE DATABASE {name}{collation}"))
            .unwrap_or_else(|e| panic!("create the test database {name}: {e}"));
        Self { name }
    }

    /// Its connection URL.
    pub fn url(&self) -> String {
        server().url(&self.name)
    }

    /// A connection of its own, outside any store.
    pub fn client(&self) -> Client {
        Client::connect(&self.url(), NoTls).expect("connect to the test database")
    }
}

/// The directory of the throwaway cluster this process started, if it started one.
pub fn throwaway_dir() -> Option<PathBuf> {
    server().cluster.as_ref().map(|cluster| cluster.dir.clone())
}

/// Whether the tests run on a server of the caller's (`MINIFLOW_TEST_DATABASE_URL`), which they may
/// not stop.
pub fn external_server() -> bool {
    std::env::var("MINIFLOW_TEST_DATABASE_URL").is_ok_and(|url| !url.trim().is_empty())
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        if let Some(Ok(server)) = SERVER.get() {
            let mut admin = server
                .admin
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // Best effort: a database left behind only costs disk until the cluster goes.
            let _ = admin.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

impl Server {
    fn external(url: &str) -> Result<Self, String> {
        let mut admin = Client::connect(url, NoTls).map_err(|e| format!("{url}: {e}"))?;
        let icu = supports_icu(&mut admin);
        Ok(Self {
            cluster: None,
            base: url.to_owned(),
            admin: Mutex::new(admin),
            icu,
        })
    }

    /// `base` with its database replaced by `database`.
    fn url(&self, database: &str) -> String {
        replace_database(&self.base, database)
    }

    fn throwaway() -> Result<Self, String> {
        let cluster = Cluster::start()?;
        let base = cluster.url("postgres");
        let mut admin = Client::connect(&base, NoTls).map_err(|e| format!("{base}: {e}"))?;
        let icu = supports_icu(&mut admin);
        Ok(Self {
            cluster: Some(cluster),
            base,
            admin: Mutex::new(admin),
            icu,
        })
    }
}

/// A throwaway cluster: `initdb` into a new temporary directory, served on a free port of 127.0.0.1
/// with `fsync` on. Its watchdog stops it and removes the directory when the test process ends.
/// A test that stops the server ([`Cluster::stop_immediately`]) starts a cluster of its own, so
/// that no other test loses its server.
pub struct Cluster {
    dir: PathBuf,
    bin: PathBuf,
    root: bool,
    port: u16,
    /// The pipe the watchdog waits on; closed when the process ends.
    _watchdog: ChildStdin,
}

impl Cluster {
    /// Creates and starts a new cluster.
    pub fn start() -> Result<Self, String> {
        let mut cluster = Self::unstarted()?;
        run(as_postgres(cluster.root, &cluster.bin.join("initdb"))
            .current_dir(&cluster.dir)
            .arg("-D")
            .arg(cluster.dir.join("data"))
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"]))?;
        cluster.serve_on_a_free_port()?;
        Ok(cluster)
    }

    /// A hot standby of `primary`, streaming its write-ahead log: a base backup of it
    /// (`pg_basebackup -R -X stream`) started on a port of its own. Once promoted it asks for no
    /// standby of its own (`synchronous_standby_names = ''`), so that its commits do not wait.
    /// Take it before [`Cluster::require_synchronous_standby`]: until it streams, the primary's
    /// commits would wait for it.
    pub fn standby_of(primary: &Cluster) -> Result<Self, String> {
        let mut cluster = Self::unstarted()?;
        run(
            as_postgres(cluster.root, &cluster.bin.join("pg_basebackup"))
                .current_dir(&cluster.dir)
                .args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &primary.port.to_string(),
                    "-U",
                    "postgres",
                ])
                .arg("-D")
                .arg(cluster.dir.join("data"))
                .args(["-R", "-X", "stream", "-c", "fast", "--no-sync"]),
        )?;
        cluster.configure(&["synchronous_standby_names = ''"])?;
        cluster.serve_on_a_free_port()?;
        Ok(cluster)
    }

    /// Makes every commit of `self`, a primary, wait until a standby has flushed it
    /// (`synchronous_standby_names = '*'`, `synchronous_commit = on`), and waits until a standby
    /// streams in sync: from then on, a commit the primary acknowledged is on the standby's disk.
    pub fn require_synchronous_standby(&self) -> Result<(), String> {
        let url = self.url("postgres");
        let mut admin = Client::connect(&url, NoTls).map_err(|e| format!("{url}: {e}"))?;
        // One statement each: ALTER SYSTEM refuses a transaction block.
        for statement in [
            "ALTER SYSTEM SET synchronous_standby_names = '*'",
            "ALTER SYSTEM SET synchronous_commit = on",
            "SELECT pg_reload_conf()",
        ] {
            admin
                .batch_execute(statement)
                .map_err(|e| format!("{statement}: {e:?}"))?;
        }
        for _ in 0..300 {
            let in_sync: i64 = admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
                    &[],
                )
                .and_then(|row| row.try_get(0))
                .map_err(|e| format!("pg_stat_replication: {e}"))?;
            if in_sync > 0 {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Err("no standby in sync after 30 s".to_owned())
    }

    /// Promotes a standby to a primary (`pg_ctl promote -w`): it stops following and takes writes.
    pub fn promote(&self) -> Result<(), String> {
        run(self.pg_ctl().args(["-w", "-t", "60", "promote"]))
    }

    /// A new directory (and its watchdog) for a cluster, nothing in it yet.
    fn unstarted() -> Result<Self, String> {
        let bin = postgres_bin_dir()?;
        let root = running_as_root();
        let parent = if root {
            PathBuf::from("/tmp")
        } else {
            std::env::temp_dir()
        };
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let dir = parent.join(format!("miniflow-pg-{}-{stamp}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        // The watchdog first: whatever happens from here on, the directory (and a started server)
        // goes with the test process.
        let watchdog = watchdog(&dir)?;
        if root {
            run(Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir))?;
        }
        Ok(Self {
            dir,
            bin,
            root,
            port: 0,
            _watchdog: watchdog,
        })
    }

    /// Appends `settings` to the cluster's `postgresql.conf` (a later line wins).
    fn configure(&self, settings: &[&str]) -> Result<(), String> {
        let path = self.dir.join("data").join("postgresql.conf");
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| format!("open {}: {e}", path.display()))?;
        writeln!(file, "\n{}", settings.join("\n"))
            .map_err(|e| format!("write {}: {e}", path.display()))
    }

    /// Starts the server on a free port, trying another if the port was taken meanwhile.
    fn serve_on_a_free_port(&mut self) -> Result<(), String> {
        let mut last_error = String::new();
        for _ in 0..3 {
            self.port = free_port()?;
            match self.serve() {
                Ok(()) => return Ok(()),
                Err(e) => last_error = e,
            }
        }
        let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        Err(format!(
            "the throwaway cluster did not start: {last_error}\n{log}"
        ))
    }

    /// The port it serves on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of `database` on this cluster, as the superuser `postgres`.
    pub fn url(&self, database: &str) -> String {
        format!("postgresql://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Stops the server as a crash would: `pg_ctl stop -m immediate` ends every server process at
    /// once, without a checkpoint and without telling the clients; the next start recovers from the
    /// write-ahead log.
    pub fn stop_immediately(&self) -> Result<(), String> {
        run(self
            .pg_ctl()
            .args(["-w", "-t", "60", "-m", "immediate", "stop"]))
    }

    /// Starts the stopped server again, on the same directory and port, and waits until it accepts
    /// connections (after recovering from its write-ahead log, if it was stopped immediately).
    pub fn start_again(&self) -> Result<(), String> {
        self.serve()
    }

    /// Starts the server on its directory and port; waits until it accepts connections.
    fn serve(&self) -> Result<(), String> {
        let options = format!(
            "-k {} -p {} -c listen_addresses=127.0.0.1 -c fsync=on -c max_connections=300",
            self.dir.display(),
            self.port
        );
        run(self
            .pg_ctl()
            .args(["-w", "-t", "60", "-l"])
            .arg(self.dir.join("server.log"))
            .args(["-o", &options, "start"]))
    }

    /// `pg_ctl -D <data>`, as the `postgres` user when the tests run as root.
    fn pg_ctl(&self) -> Command {
        let mut command = as_postgres(self.root, &self.bin.join("pg_ctl"));
        command
            .current_dir(&self.dir)
            .arg("-D")
            .arg(self.dir.join("data"));
        command
    }
}

/// A cluster of a test's own stops when the test drops it; its watchdog removes the directory when
/// the test process ends. (The process's shared cluster lives in a static, never dropped: its
/// watchdog stops it.)
impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.stop_immediately(); // best effort: the watchdog stops it at the latest
    }
}

/// Whether the server creates databases with ICU collations (Debian's PostgreSQL does).
fn supports_icu(admin: &mut Client) -> bool {
    admin
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_collation WHERE collprovider = 'i')",
            &[],
        )
        .and_then(|row| row.try_get(0))
        .unwrap_or(false)
}

/// Where `initdb` and `pg_ctl` are: `MINIFLOW_PG_BIN_DIR`, `pg_config --bindir`, or the newest
/// `/usr/lib/postgresql/*/bin`.
fn postgres_bin_dir() -> Result<PathBuf, String> {
    let has_initdb = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    if let Ok(dir) = std::env::var("MINIFLOW_PG_BIN_DIR") {
        return Ok(PathBuf::from(dir));
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && has_initdb(&dir) {
            return Ok(dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|entry| {
                    let version = entry.file_name().to_string_lossy().parse().ok()?;
                    Some((version, entry.path().join("bin")))
                })
                .filter(|(_, dir)| has_initdb(dir))
                .collect()
        })
        .unwrap_or_default();
    versions.sort();
    versions.pop().map(|(_, dir)| dir).ok_or_else(|| {
        "initdb not found: install PostgreSQL (scripts/setup does: apt-get install postgresql), set \
         MINIFLOW_PG_BIN_DIR, or point MINIFLOW_TEST_DATABASE_URL at a server"
            .to_owned()
    })
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// `program` run as the `postgres` user when the tests run as root (PostgreSQL refuses root).
fn as_postgres(root: bool, program: &Path) -> Command {
    if root {
        // util-linux's runuser lives in /usr/sbin, which a CI job's PATH may leave out.
        let runuser = ["/usr/sbin/runuser", "/sbin/runuser", "/usr/bin/runuser"]
            .into_iter()
            .find(|path| Path::new(path).is_file())
            .unwrap_or("runuser");
        let mut command = Command::new(runuser);
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

fn run(command: &mut Command) -> Result<(), String> {
    let out = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{command:?}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{command:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// A port nobody listens on now.
fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|e| format!("find a free port: {e}"))
}

/// Starts the process that stops the cluster in `dir` and removes `dir` once the test process is
/// gone: it blocks reading a pipe whose only writer is the test process, so it wakes when the
/// test process exits or is killed. It ignores the terminal's signals, so a ^C of the test run
/// reaches it only as that end of file.
fn watchdog(dir: &Path) -> Result<ChildStdin, String> {
    const SCRIPT: &str = r#"
trap '' INT TERM HUP QUIT
cat > /dev/null
pid=$(head -n 1 "$1/data/postmaster.pid" 2>/dev/null)
if [ -n "$pid" ]; then
  kill -INT "$pid" 2>/dev/null
  # A server that shut down removed its pid file (it may linger as a zombie nobody reaps).
  i=0
  while [ -f "$1/data/postmaster.pid" ] && kill -0 "$pid" 2>/dev/null && [ "$i" -lt 100 ]; do
    sleep 0.1
    i=$((i + 1))
  done
  kill -QUIT "$pid" 2>/dev/null
fi
rm -rf "$1"
"#;
    let mut child = Command::new("sh")
        .args(["-c", SCRIPT, "miniflow-pg-watchdog"])
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("start the cluster's watchdog: {e}"))?;
    let mut pipe = child
        .stdin
        .take()
        .ok_or("the watchdog has no stdin".to_owned())?;
    // Nothing is ever written; the write only checks the pipe is open.
    pipe.write_all(b"")
        .map_err(|e| format!("watchdog pipe: {e}"))?;
    Ok(pipe)
}

/// `base` with its database replaced by `database`, its parameters kept.
pub fn replace_database(base: &str, database: &str) -> String {
    let (address, query) = match base.split_once('?') {
        Some((address, query)) => (address, format!("?{query}")),
        None => (base, String::new()),
    };
    let authority_start = address.find("://").map_or(0, |i| i + 3);
    let host_end = address[authority_start..]
        .find('/')
        .map_or(address.len(), |i| authority_start + i);
    format!("{}/{database}{query}", &address[..host_end])
}
