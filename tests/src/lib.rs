//! Owns the test harness every integration test uses: a private
//! `redis-server` per test on a free loopback port, a fresh MySQL database per
//! test (dropped afterwards), paths to the workspace's binaries, and a few
//! helpers to read Redis and MySQL state. Tests run in parallel safely: they
//! share nothing but the MariaDB server, and there each has its own database.
//!
//! MySQL server: `SECKILL_TEST_MYSQL_URL` (default `mysql://root@127.0.0.1:3306/`).
//!
//! # Layout
//!
//! - This file: the harness ([`RedisServer`], [`TestDb`], [`command`] for a
//!   workspace binary with a cleared environment).
//! - [`mariadb`]: private MariaDB servers, a primary and its GTID replica.
//! - [`sentinel`]: a master, its replica and three Redis Sentinels.
//! - [`load`]: the load simulator behind `seckill-load` (its own `# Layout`;
//!   its unit tests run with the library's: `cargo test -p seckill-tests --lib`).
//! - `src/bin/`: `seckill-load` (the crowd and its invariants),
//!   `seckill-baseline` (the MySQL-only design the benchmarks compare with)
//!   and `seckill-report` (the HTML report, `src/report_html.rs` with its
//!   charts in `src/report_svg.rs`).
//! - `tests/`: the integration tests, one binary `it` (`tests/main.rs`):
//!   a module per file, named `AREA_TOPIC.rs` (`gateway_*`, `worker_*`,
//!   `reconciler_*`, `redis_*`, `e2e_*`, ...), the shared helpers in
//!   `tests/support/`. A new test file: `tests/AREA_TOPIC.rs` plus
//!   `mod AREA_TOPIC;` in `tests/main.rs`.
#![forbid(unsafe_code)]
#![allow(clippy::missing_panics_doc)] // test support: panicking is the failure report

pub mod auth;
pub mod cluster;
pub mod load;
pub mod load_report;
pub mod mariadb;
pub mod report_html;
pub mod report_svg;
pub mod sentinel;

use mysql::prelude::Queryable;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub use seckill_common as common;

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A free TCP port on 127.0.0.1 (bound, released), from 10000 up to below
/// the kernel's range for outgoing connections, and never one this process
/// handed out before. Not an ephemeral port: any outgoing connection (a
/// test's client, a gateway's Redis link) may take one between this check
/// and the server's bind, and CI saw a gateway exit with "Address already
/// in use" on one.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let low: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768);
    let span = low.saturating_sub(10_000).max(1_000);
    let mut x = u64::from(std::process::id())
        ^ (seckill_common::now_ms() << 16)
        ^ SEQ
            .fetch_add(1, Ordering::SeqCst)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    for _ in 0..10_000 {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let p = (10_000 + (x >> 33) % u64::from(span)) as u16;
        if !given.contains(&p) && TcpListener::bind(("127.0.0.1", p)).is_ok() {
            given.push(p);
            return p;
        }
    }
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

/// A unique name for this process and call, e.g. `12345_7_1764400000123`.
pub fn unique_suffix() -> String {
    format!(
        "{}_{}_{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst),
        seckill_common::now_ms() % 1_000_000_000
    )
}

/// A directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `$TMPDIR/seckill-test-<unique>`.
    pub fn new() -> TempDir {
        let p = std::env::temp_dir().join(format!("seckill-test-{}", unique_suffix()));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Default for TempDir {
    fn default() -> Self {
        TempDir::new()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A private `redis-server` on a free loopback port, killed on drop. It can be
/// stopped and started again on the same port (with AOF on, data survives).
pub struct RedisServer {
    /// The port it listens on.
    pub port: u16,
    dir: TempDir,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server with append-only persistence on (`appendfsync always`),
    /// so a stop and start keeps every acknowledged write.
    ///
    /// A port taken between [`free_port`] and Redis's bind (by another
    /// test) is noticed (our child exits, or another server answers) and a
    /// new port is tried, up to 5 times.
    pub fn start() -> RedisServer {
        let mut s = RedisServer {
            port: free_port(),
            dir: TempDir::new(),
            child: None,
        };
        for _ in 0..4 {
            match s.launch() {
                Ok(()) => return s,
                Err(e) => {
                    eprintln!("{e}; trying another port");
                    s.stop();
                    s.port = free_port();
                }
            }
        }
        if let Err(e) = s.launch() {
            panic!("{e}");
        }
        s
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A new synchronous connection.
    pub fn con(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .expect("redis url")
            .get_connection()
            .expect("connect to test redis")
    }

    /// Its data directory (the append-only files live in `appendonlydir/`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The server's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again (after [`RedisServer::stop`]) on the same port
    /// and data directory, and waits until it answers, checking that the
    /// answer comes from this child (`INFO server`'s `process_id`).
    pub fn restart(&mut self) {
        if let Err(e) = self.launch() {
            panic!("{e}");
        }
    }

    fn launch(&mut self) -> Result<(), String> {
        self.stop();
        let child = dies_with_test(redis_server_bin())
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--save", ""])
            .args(["--appendonly", "yes", "--appendfsync", "always"])
            .args(["--daemonize", "no", "--loglevel", "warning"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server (is it installed? scripts/test.sh installs it)");
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // Our own child must be the one answering: a port released by
            // `free_port` (or while this server was stopped) may have been
            // taken by another test's server.
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                return Err(format!(
                    "redis-server on port {} exited ({status}): the port was taken?",
                    self.port
                ));
            }
            if let Ok(c) = redis::Client::open(self.url()) {
                if let Ok(mut con) = c.get_connection() {
                    if let Ok(info) = redis::cmd("INFO").arg("server").query::<String>(&mut con) {
                        let answering = info
                            .lines()
                            .find_map(|l| l.strip_prefix("process_id:"))
                            .and_then(|v| v.trim().parse::<u32>().ok());
                        if answering != Some(pid) {
                            return Err(format!(
                                "port {} is answered by another redis-server ({answering:?}, \
                                 not our {pid})",
                                self.port
                            ));
                        }
                        // INFO answers while the data set is still loading;
                        // PING only once it is loaded.
                        if redis::cmd("PING").query::<String>(&mut con).is_ok() {
                            return Ok(());
                        }
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(format!("redis-server did not start on {}", self.port));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

pub(crate) fn redis_server_bin() -> String {
    std::env::var("SECKILL_TEST_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_string())
}

/// A fresh MySQL database, migrated, dropped on drop.
pub struct TestDb {
    /// The database's name, `seckill_test_<unique>`.
    pub name: String,
    server_url: String,
}

impl TestDb {
    /// Creates and migrates `seckill_test_<unique>` on `SECKILL_TEST_MYSQL_URL`.
    pub fn create() -> TestDb {
        let server_url = std::env::var("SECKILL_TEST_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/".to_string());
        TestDb::create_on(&server_url)
    }

    /// Creates and migrates `seckill_test_<unique>` on the server at
    /// `server_url` (`mysql://user@host:port/`).
    pub fn create_on(server_url: &str) -> TestDb {
        let server_url = server_url.trim_end_matches('/').to_string() + "/";
        let db = TestDb {
            name: format!("seckill_test_{}", unique_suffix()),
            server_url,
        };
        seckill_common::schema::migrate(&db.url(), Duration::from_secs(10)).expect(
            "create and migrate the test database (is MariaDB running? see scripts/test.sh)",
        );
        db
    }

    /// A guard for another database of this test, `<name><suffix>`, that is
    /// not created here (the test creates it, e.g. by `migrate`) and is
    /// dropped with the guard, whatever the test does in between.
    pub fn sibling(&self, suffix: &str) -> TestDb {
        TestDb {
            name: format!("{}{suffix}", self.name),
            server_url: self.server_url.clone(),
        }
    }

    /// `mysql://.../seckill_test_<unique>`.
    pub fn url(&self) -> String {
        format!("{}{}", self.server_url, self.name)
    }

    /// A new connection to this database.
    pub fn conn(&self) -> mysql::Conn {
        seckill_common::schema::connect(&self.url(), Duration::from_secs(10)).expect("connect")
    }

    /// Runs a query that returns one integer, e.g. `SELECT COUNT(*) FROM orders`.
    pub fn count(&self, sql: &str) -> i64 {
        let v: Option<i64> = self.conn().query_first(sql).expect("query");
        v.unwrap_or(0)
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if std::env::var_os("SECKILL_TEST_KEEP_DB").is_some() {
            return;
        }
        if let Ok(mut c) =
            seckill_common::schema::connect(&self.server_url, Duration::from_secs(10))
        {
            let _ = c.query_drop(format!("DROP DATABASE IF EXISTS `{}`", self.name));
        }
    }
}

/// Path of a workspace binary (`seckill-gateway`, ...), built by
/// `cargo build --workspace --all-targets --features
/// seckill-worker/crash-points` (as `scripts/test.sh` does) next to the test
/// executables; the crash tests need the worker's crash points.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // target/debug/deps/test-xxxx -> target/debug/NAME
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf();
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace --all-targets --features seckill-worker/crash-points` (scripts/test.sh does)",
        p.display()
    );
    if let Some(src) = newer_source(&p) {
        panic!(
            "{} is older than {src}: run `cargo build --workspace --all-targets --features seckill-worker/crash-points` (`cargo test --test it` does not rebuild the binaries a test starts)",
            p.display()
        );
    }
    p
}

/// A source file of this workspace that `cargo` built `bin` from (its
/// dep-info file, `bin.d`, next to it) and that changed after `bin` was
/// built, if any: a test would otherwise run the old binary without a word
/// (`cargo test --test it` builds only the tests).
/// `None` too when there is no dep-info file.
pub fn newer_source(bin: &Path) -> Option<String> {
    let built = std::fs::metadata(bin).and_then(|m| m.modified()).ok()?;
    let info = std::fs::read_to_string(bin.with_extension("d")).ok()?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent()?;
    let head = format!("{}:", bin.display().to_string().replace(' ', "\\ "));
    let deps = info.lines().find_map(|l| l.strip_prefix(head.as_str()))?;
    // Paths are separated by spaces; a space inside one is written `\ `.
    deps.replace("\\ ", "\0")
        .split_whitespace()
        .map(|f| PathBuf::from(f.replace('\0', " ")))
        .filter(|f| f.starts_with(root))
        .find(|f| {
            std::fs::metadata(f)
                .and_then(|m| m.modified())
                .is_ok_and(|t| t > built)
        })
        .map(|f| f.display().to_string())
}

/// Where a spawned binary's URLs point until the test sets its own: a port
/// nothing listens on (1), so a test that forgets one fails instead of
/// reaching the machine's Redis or MySQL.
pub const DEAD_REDIS_URL: &str = "redis://127.0.0.1:1/";
/// See [`DEAD_REDIS_URL`].
pub const DEAD_MYSQL_URL: &str = "mysql://root@127.0.0.1:1/seckill_nowhere";

/// A command for `program` that dies with the thread spawning it: it runs
/// under `setpriv --pdeathsig KILL` (util-linux; `setpriv` execs, so the
/// pid is the program's), so a test runner killed mid-test, or a test
/// thread that ends without its `Drop`, leaves no server or binary behind.
/// Spawn on the test's own thread: the signal fires when the spawning
/// thread ends, and is armed once `setpriv` runs (a thread that ends in the
/// first milliseconds, before the exec, may miss it).
pub fn dies_with_test(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--pdeathsig", "KILL", "--"]).arg(program);
    c
}

/// A command for the workspace binary `name` (see [`bin`]) started from a
/// cleared environment: only `PATH`, `RUST_LOG=warn`, and every URL at a
/// dead port ([`DEAD_REDIS_URL`], [`DEAD_MYSQL_URL`]), the review file in a
/// directory that does not exist, and the tests' buyer key file
/// (`SECKILL_AUTH_KEYS`, [`auth::gateway_key_file`]), dying with the
/// spawning thread ([`dies_with_test`]). The caller sets the test's own
/// servers.
pub fn command(name: &str) -> Command {
    let mut c = dies_with_test(bin(name));
    c.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("RUST_LOG", "warn")
        .env("SECKILL_REDIS_URL", DEAD_REDIS_URL)
        .env("SECKILL_MYSQL_URL", DEAD_MYSQL_URL)
        .env("SECKILL_REVIEW_DB", "/nonexistent/seckill-review.sqlite3")
        .env("SECKILL_AUTH_KEYS", auth::gateway_key_file());
    c
}

/// Creates a sale of `stock` units at 1999 cents, open now for an hour,
/// with `--payment-window window`, through `seckill-reconciler sale create`
/// (review file `review`); returns its id.
pub fn create_windowed_sale(
    redis: &RedisServer,
    db: &TestDb,
    review: &Path,
    stock: u64,
    window: &str,
) -> u64 {
    create_windowed_split_sale(redis, db, review, stock, window, 1)
}

/// [`create_windowed_sale`] split over `shards` buckets (`--shards`).
pub fn create_windowed_split_sale(
    redis: &RedisServer,
    db: &TestDb,
    review: &Path,
    stock: u64,
    window: &str,
    shards: u32,
) -> u64 {
    let shards = shards.to_string();
    let extra = ["--payment-window", window, "--shards", &shards];
    sale_created(redis, db, review, "LC-1", stock, &extra).0
}

/// Runs `seckill-reconciler sale create` of a sale `sku` of `stock` units
/// at 1999 cents, open now for an hour, with the further arguments
/// `extra` ([`reconciler`]); returns its exit code and output (for a
/// refusal, as for a sale).
pub fn sale_create(
    redis: &impl cluster::TestRedis,
    db: &TestDb,
    review: &Path,
    sku: &str,
    stock: u64,
    extra: &[&str],
) -> (i32, String) {
    let stock = stock.to_string();
    let mut args = vec![
        "sale",
        "create",
        "--sku",
        sku,
        "--stock",
        &stock,
        "--starts-at",
        "now",
        "--ends-at",
        "now+1h",
        "--price-cents",
        "1999",
    ];
    args.extend(extra);
    reconciler(redis, db, review, &args)
}

/// [`sale_create`] that must succeed: the new sale's id and the command's
/// output.
pub fn sale_created(
    redis: &impl cluster::TestRedis,
    db: &TestDb,
    review: &Path,
    sku: &str,
    stock: u64,
    extra: &[&str],
) -> (u64, String) {
    let (code, out) = sale_create(redis, db, review, sku, stock, extra);
    assert_eq!(code, 0, "{out}");
    let id = out.lines().find_map(|l| l.trim().parse().ok());
    (id.expect("the new sale id"), out)
}

/// Makes the review file at `review` when missing, as an installed
/// system's first `run` did: every audited command (`sale pause`, `sale
/// repair`, ...) refuses without it.
pub fn review_file(review: &Path) {
    seckill_reconciler::cmd::run::create_review_file(review).expect("create the review file");
}

/// Runs `seckill-reconciler ARGS` ([`command`]) against the test's Redis
/// and database, with the review file `review` and no grace period
/// (made first for a `sale` command, [`review_file`]); returns the exit
/// code and stdout followed by stderr.
pub fn reconciler(
    redis: &impl cluster::TestRedis,
    db: &TestDb,
    review: &Path,
    args: &[&str],
) -> (i32, String) {
    if args.first() == Some(&"sale") {
        review_file(review);
    }
    let out = command("seckill-reconciler")
        .env("SECKILL_REDIS_URL", redis.url())
        .env("SECKILL_MYSQL_URL", db.url())
        .env("SECKILL_REVIEW_DB", review)
        .env("SECKILL_RECONCILE_GRACE", "0s")
        .args(args)
        .output()
        .expect("run seckill-reconciler");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Runs `seckill-reconciler run` ([`reconciler`]) and asserts it exits 0
/// and leaves no finding at all, in any state.
pub fn assert_reconciles_clean(redis: &impl cluster::TestRedis, db: &TestDb, review: &Path) {
    let (code, out) = reconciler(redis, db, review, &["run"]);
    assert_eq!(code, 0, "{out}");
    let (_, out) = reconciler(redis, db, review, &["findings", "--state", "all", "--json"]);
    assert_eq!(out.trim(), "[]", "no finding at all");
}

/// The first `n` user ids `PREFIX-i` whose home bucket of `k` is `bucket`.
pub fn users_of(prefix: &str, bucket: u32, k: u32, n: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .filter(|u| seckill_common::buckets::home_bucket(u, k) == bucket)
        .take(n)
        .collect()
}

/// Inserts a sale into MySQL and loads it into Redis; returns its id.
/// `starts_in_ms` may be negative (already open); the window lasts `len_ms`.
pub fn create_sale(
    db: &TestDb,
    redis: &impl cluster::TestRedis,
    stock: u64,
    starts_in_ms: i64,
    len_ms: u64,
) -> u64 {
    create_split_sale(db, redis, stock, starts_in_ms, len_ms, 1)
}

/// [`create_sale`] split over `buckets` buckets
/// (`seckill_common::buckets::load_into_redis`; 1: exactly [`create_sale`]).
pub fn create_split_sale(
    db: &TestDb,
    redis: &impl cluster::TestRedis,
    stock: u64,
    starts_in_ms: i64,
    len_ms: u64,
    buckets: u32,
) -> u64 {
    let mut sale = test_sale(0, stock, starts_in_ms, len_ms);
    let mut c = db.conn();
    c.exec_drop(
        "INSERT INTO sales (sku, title, price_cents, total_stock, available_stock, starts_at, ends_at, buckets)
         VALUES (?, ?, ?, ?, ?, FROM_UNIXTIME(? / 1000), FROM_UNIXTIME(? / 1000), ?)",
        (
            &sale.sku,
            &sale.title,
            sale.price_cents,
            stock,
            stock,
            sale.starts_at_ms,
            sale.ends_at_ms,
            buckets,
        ),
    )
    .expect("insert sale");
    sale.id = c.last_insert_id();
    let loaded =
        seckill_common::buckets::load_into_redis(&mut redis.target_con(), &sale, buckets, 0);
    assert!(loaded.expect("load"));
    sale.id
}

/// A sale of `stock` over `buckets` buckets, open for ten minutes, whose
/// buckets are not all on one master of `cluster` (the slots of the hash
/// tags decide; a later sale id gives other slots), and the master port of
/// each bucket.
pub fn split_sale_over_masters(
    db: &TestDb,
    cluster: &cluster::RedisCluster,
    stock: u64,
    buckets: u32,
) -> (u64, Vec<u16>) {
    (0..20)
        .find_map(|_| {
            let sale = create_split_sale(db, cluster, stock, -1000, 600_000, buckets);
            let masters: Vec<u16> = (0..buckets)
                .map(|b| {
                    cluster
                        .master_of(&seckill_common::keys::SaleKeys::bucket(sale, b).stock())
                        .expect("every bucket has a master")
                })
                .collect();
            masters
                .iter()
                .any(|&m| m != masters[0])
                .then_some((sale, masters))
        })
        .expect("a sale whose buckets span two masters")
}

/// [`users_of`] over several buckets: the first `n` user ids `PREFIX-i`
/// whose home bucket of `k` is one of `buckets`.
pub fn users_in(prefix: &str, buckets: &[u32], n: usize, k: u32) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .filter(|u| buckets.contains(&seckill_common::buckets::home_bucket(u, k)))
        .take(n)
        .collect()
}

/// A sale of `stock` units (SKU `SKU-TEST`, 19.99) whose window opens
/// `starts_in_ms` from now (negative: already open) and lasts `len_ms`.
pub fn test_sale(
    id: u64,
    stock: u64,
    starts_in_ms: i64,
    len_ms: u64,
) -> seckill_common::sale::Sale {
    let starts = (seckill_common::now_ms() as i64 + starts_in_ms) as u64;
    seckill_common::sale::Sale {
        id,
        sku: "SKU-TEST".into(),
        title: "test sale".into(),
        price_cents: 1999,
        total_stock: stock,
        available_stock: stock as i64,
        starts_at_ms: starts,
        ends_at_ms: starts + len_ms,
    }
}

/// Waits until `f` returns true, polling every 20 ms; panics after `timeout`
/// with `what` in the message.
pub fn wait_until(timeout: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every key one purchase touches for sale `id` (stock, meta, buyers, flow
/// records, statuses, queue) with its full content, sorted: two equal
/// snapshots prove that nothing changed in Redis.
pub fn sale_snapshot(con: &mut redis::Connection, id: u64) -> Vec<(String, String)> {
    use redis::Commands;
    let k = seckill_common::keys::SaleKeys::new(id);
    let mut out = Vec::new();
    let stock: Option<String> = con.get(k.stock()).expect("GET stock");
    out.push(("stock".into(), format!("{stock:?}")));
    for h in [k.meta(), k.buyers(), k.flow(), k.status()] {
        let mut v: Vec<(String, String)> = con.hgetall(&h).expect("HGETALL");
        v.sort();
        out.push((h, format!("{v:?}")));
    }
    let q: Vec<String> = con.lrange(k.queue(), 0, -1).expect("LRANGE queue");
    out.push((k.queue(), format!("{q:?}")));
    out
}

/// Whether process `pid` is stopped (state `T` in `/proc/PID/stat`), e.g.
/// after SIGSTOP.
pub fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .map(|r| r.trim_start().starts_with('T'))
        })
        .unwrap_or(false)
}
