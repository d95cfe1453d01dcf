//! Shared by the worker tests (`worker_*.rs` and others):
//! starting and signalling real `seckill-worker` processes, filling queues
//! through the real reservation script, and the exactly-once checks.

use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::dead_letter::DeadLetter;
use seckill_common::keys::{self, SaleKeys};
use seckill_common::reservation::{reserve, ReserveOutcome};
use seckill_tests::cluster::TestRedis;
use seckill_tests::{TempDir, TestDb};
use std::collections::HashMap;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

/// One running `seckill-worker`, killed (SIGKILL) on drop.
pub struct WorkerProc {
    /// The worker id.
    pub id: String,
    /// Its `/metrics` port.
    pub metrics_port: u16,
    child: Option<Child>,
    _logs: TempDir,
}

/// Options of a worker start beyond the test's Redis and database.
#[derive(Clone)]
pub struct Opts {
    pub batch: usize,
    pub max_attempts: u32,
    pub heartbeat_ttl: &'static str,
    pub crash_at: Option<&'static str>,
    /// `SECKILL_WORKER_EXPIRY_EVERY` (the expiry sweep's idle pause).
    pub expiry_every: &'static str,
    /// `SECKILL_WORKER_RETRY_FOR` (how long a statement error is retried
    /// before it counts an attempt); unset: the worker's default.
    pub retry_for: Option<&'static str>,
    /// Further variables set for the worker (another binary's, say).
    pub env: &'static [(&'static str, &'static str)],
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            batch: 256,
            max_attempts: 5,
            heartbeat_ttl: "3s",
            crash_at: None,
            expiry_every: "200ms",
            retry_for: None,
            env: &[],
        }
    }
}

/// Waits for the worker's log to say what it did with
/// `SECKILL_WORKER_CRASH_AT` and fails unless it armed `point`: a worker
/// built without the `crash-points` feature ignores the variable, and a
/// crash test against it would wait for a crash that never comes.
fn assert_crash_point_armed(log: &std::path::Path, point: &str) {
    let mut text = String::new();
    seckill_tests::wait_until(
        Duration::from_secs(30),
        "the worker to log its crash point",
        || {
            text = std::fs::read_to_string(log).unwrap_or_default();
            text.contains("SECKILL_WORKER_CRASH_AT=")
        },
    );
    assert!(
        text.contains(&format!(
            "crash point armed: SECKILL_WORKER_CRASH_AT={point} "
        )),
        "this seckill-worker did not arm crash point {point}: build it with \
         `cargo build --workspace --all-targets --features seckill-worker/crash-points` \
         (scripts/test.sh does); its log:\n{text}"
    );
}

impl WorkerProc {
    /// Starts worker `id` against `redis` and `db`; with `opts.crash_at`,
    /// waits until the worker logged that it armed that crash point (it
    /// needs a build with the `crash-points` feature).
    pub fn start(redis: &impl TestRedis, db: &TestDb, id: &str, opts: &Opts) -> WorkerProc {
        let logs = TempDir::new();
        let port = seckill_tests::free_port();
        let mut cmd = seckill_tests::command("seckill-worker");
        cmd.env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("RUST_LOG", "info")
            .env("SECKILL_REDIS_URL", redis.url())
            .env("SECKILL_MYSQL_URL", db.url())
            .env("SECKILL_WORKER_ID", id)
            .env("SECKILL_WORKER_BATCH", opts.batch.to_string())
            .env("SECKILL_WORKER_MAX_ATTEMPTS", opts.max_attempts.to_string())
            .env("SECKILL_WORKER_BLOCK", "200ms")
            .env("SECKILL_WORKER_HEARTBEAT_TTL", opts.heartbeat_ttl)
            .env("SECKILL_WORKER_EXPIRY_EVERY", opts.expiry_every)
            .env("SECKILL_MYSQL_TIMEOUT", "5s")
            .env("SECKILL_WORKER_METRICS_LISTEN", format!("127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(logs.path().join("stderr.log"))
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::null()),
            );
        if let Some(p) = opts.crash_at {
            cmd.env("SECKILL_WORKER_CRASH_AT", p);
        }
        if let Some(d) = opts.retry_for {
            cmd.env("SECKILL_WORKER_RETRY_FOR", d);
        }
        for (k, v) in opts.env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start seckill-worker");
        if let Some(p) = opts.crash_at {
            assert_crash_point_armed(&logs.path().join("stderr.log"), p);
        }
        WorkerProc {
            id: id.to_string(),
            metrics_port: port,
            child: Some(child),
            _logs: logs,
        }
    }

    /// What the worker wrote to stderr (its log) so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self._logs.path().join("stderr.log")).unwrap_or_default()
    }

    /// Waits (bounded) until the worker's `/metrics` listener accepts.
    pub fn wait_metrics(&self) {
        seckill_tests::wait_until(Duration::from_secs(30), "the worker's /metrics", || {
            std::net::TcpStream::connect(("127.0.0.1", self.metrics_port)).is_ok()
        });
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Sends `signal` (e.g. `-TERM`, `-STOP`, `-CONT`, `-KILL`) with `kill`.
    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .arg(signal)
            .arg(self.pid().to_string())
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill {signal} failed");
    }

    /// Waits (bounded) for the process to exit and returns its status.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let mut status = None;
        seckill_tests::wait_until(timeout, "the worker to exit", || {
            status = child.try_wait().expect("try_wait");
            status.is_some()
        });
        status.expect("exited")
    }

    /// The sum of every series (all label sets) of the counter or gauge
    /// `name` on the worker's `/metrics` page; panics when it is missing.
    pub fn metric(&self, name: &str) -> u64 {
        let page = self.metrics();
        let values: Vec<u64> = page
            .lines()
            .filter_map(|l| l.strip_prefix(name))
            .filter(|rest| rest.starts_with('{') || rest.starts_with(' '))
            .filter_map(|rest| rest.rsplit(' ').next()?.parse().ok())
            .collect();
        assert!(!values.is_empty(), "{name} missing from:\n{page}");
        values.iter().sum()
    }

    /// The worker's `/metrics` page (plain HTTP/1.0 GET over a socket).
    pub fn metrics(&self) -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.metrics_port))
            .expect("connect to /metrics");
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
            .expect("send");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("read");
        out
    }
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Reserves one unit for each of `n` users `PREFIX-i` through the real
/// reservation script; every one must succeed.
pub fn reserve_users(redis: &impl TestRedis, sale: u64, prefix: &str, n: usize) {
    let mut con = redis.target_con();
    for i in 0..n {
        let r = reserve(&mut con, sale, &format!("{prefix}-{i}")).expect("reserve");
        assert!(matches!(r, ReserveOutcome::Reserved(_)), "{r:?}");
    }
}

/// Waits until the sale's queue and every processing list are empty.
pub fn wait_drained(redis: &impl TestRedis, sale: u64, timeout: Duration) {
    let k = SaleKeys::new(sale);
    let mut con = redis.target_con();
    seckill_tests::wait_until(timeout, "the queue and processing lists to drain", || {
        let q: usize = con.llen(k.queue()).unwrap();
        q == 0 && processing_total(&mut con, sale) == 0
    });
}

/// Messages in every registered worker's processing list of `sale`.
pub fn processing_total(con: &mut impl redis::ConnectionLike, sale: u64) -> usize {
    let k = SaleKeys::new(sale);
    let workers: Vec<String> = con.smembers(keys::WORKERS).unwrap();
    workers
        .iter()
        .map(|w| con.llen::<_, usize>(k.processing(w)).unwrap())
        .sum()
}

/// Waits until MySQL holds `n` orders for `sale`.
pub fn wait_orders(db: &TestDb, sale: u64, n: i64, timeout: Duration) {
    seckill_tests::wait_until(timeout, &format!("{n} orders of sale {sale}"), || {
        db.count(&format!(
            "SELECT COUNT(*) FROM orders WHERE sale_id = {sale}"
        )) >= n
    });
}

/// The dead-letter entries of `sale`, oldest first.
pub fn dead_letters(redis: &impl TestRedis, sale: u64) -> Vec<DeadLetter> {
    let raw: Vec<Vec<u8>> = redis
        .target_con()
        .lrange(SaleKeys::new(sale).dead_letter(), 0, -1)
        .unwrap();
    raw.iter()
        .rev()
        .map(|r| DeadLetter::parse(r).expect("a dead-letter entry"))
        .collect()
}

/// Asserts that every flow record of `sale` became exactly one order and one
/// ledger row (`delta -1`, reason `order`), that MySQL stock went down by
/// exactly that many from `stock`, that every status is `confirmed`, and
/// that nothing is queued, in flight or dead-lettered.
pub fn assert_exactly_once(db: &TestDb, redis: &impl TestRedis, sale: u64, stock: i64) {
    let k = SaleKeys::new(sale);
    let mut con = redis.target_con();
    let flow: HashMap<String, String> = con.hgetall(k.flow()).unwrap();
    let n = flow.len() as i64;
    let mut c = db.conn();
    let orders: Vec<(String, String, u32, String)> = c
        .exec(
            "SELECT reservation_id, user_id, quantity, status FROM orders WHERE sale_id = ?",
            (sale,),
        )
        .unwrap();
    assert_eq!(orders.len() as i64, n, "orders of sale {sale}");
    for (rid, user, qty, status) in &orders {
        let msg = flow.get(rid).expect("every order has a flow record");
        assert!(msg.contains(&format!("\"user_id\":\"{user}\"")));
        assert_eq!((*qty, status.as_str()), (1, "confirmed"));
    }
    let ledger = db.count(&format!(
        "SELECT COUNT(*) FROM stock_ledger WHERE sale_id = {sale} AND delta = -1 AND reason = 'order'"
    ));
    let ledger_all = db.count(&format!(
        "SELECT COUNT(*) FROM stock_ledger WHERE sale_id = {sale}"
    ));
    assert_eq!((ledger, ledger_all), (n, n), "ledger rows of sale {sale}");
    let available = db.count(&format!(
        "SELECT available_stock FROM sales WHERE id = {sale}"
    ));
    assert_eq!(available, stock - n, "available_stock of sale {sale}");
    let statuses: HashMap<String, String> = con.hgetall(k.status()).unwrap();
    assert_eq!(statuses.len() as i64, n);
    assert!(
        statuses.values().all(|s| s == "confirmed"),
        "every status confirmed"
    );
    let q: usize = con.llen(k.queue()).unwrap();
    let dlq: usize = con.llen(k.dead_letter()).unwrap();
    assert_eq!((q, processing_total(&mut con, sale), dlq), (0, 0, 0));
}

/// Puts payment `payment_id` of `amount_cents` for reservation `rid` on the
/// payment queue, as the gateway's `POST /v1/payments` does once the
/// signature holds (`seckill_common::payment::enqueue`).
pub fn pay(redis: &impl TestRedis, rid: &str, payment_id: &str, amount_cents: u64) {
    seckill_common::payment::enqueue(
        &mut redis.target_con(),
        &seckill_common::payment::PaymentMessage {
            v: 1,
            reservation_id: rid.into(),
            payment_id: payment_id.into(),
            amount_cents,
            received_ms: seckill_common::now_ms(),
        },
    )
    .expect("enqueue a payment");
}
