//! Specifies the whole pipeline with the real binaries as processes: the
//! gateway, two workers, the load simulator and the reconciler, on a private
//! Redis and a fresh MySQL database. A crowd of 5,000 users (10 % clicking
//! twice) over 64 connections buys a sale of 500 units: exactly 500 are
//! reserved, ordered, ledgered and deducted, and reconciliation finds nothing;
//! on one Redis and on a real Redis Cluster (3 masters, 3 replicas).

use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_tests::cluster::{RedisCluster, TestRedis};
use seckill_tests::{create_sale, free_port, wait_until, RedisServer, TempDir, TestDb};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A child process stopped with SIGKILL if the test ends early.
struct Proc(Option<Child>);

impl Proc {
    /// Sends SIGTERM and returns the exit code; `None` when the process is
    /// still running 10 s later (it is then killed with SIGKILL).
    fn terminate(&mut self) -> Option<i32> {
        let mut child = self.0.take()?;
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let Some(s) = child.try_wait().unwrap() {
                return s.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn start(name: &str, env: &[(&str, String)]) -> Proc {
    let mut cmd = seckill_tests::command(name);
    cmd.env("RUST_LOG", "warn").stdout(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    Proc(Some(cmd.spawn().unwrap()))
}

// One crowd at a time (`support::crowd`), beside the binary's other tests:
// each of 5,000 EdDSA tokens verified by a debug build (several ms each),
// so answers take seconds at times. A longer Redis timeout and request
// timeout, so that a loaded machine does not shed (503) or time out a
// purchase the exact counts below expect; these tests are about exactness,
// not latency.

#[test]
fn a_crowd_of_5000_buys_exactly_500_units_into_500_orders_with_0_findings() {
    crowd_buys_500(&RedisServer::start(), "5s");
}

#[test]
fn on_a_redis_cluster_a_crowd_of_5000_buys_exactly_500_units_with_0_findings() {
    crowd_buys_500(&RedisCluster::start(), "5s");
}

/// `redis_timeout`: the gateway's `SECKILL_REDIS_TIMEOUT`.
fn crowd_buys_500(redis: &impl TestRedis, redis_timeout: &str) {
    let _crowd = crate::support::crowd();
    let db = TestDb::create();
    let sale = create_sale(&db, redis, 500, -1_000, 600_000);
    let port = free_port();
    let common = [
        ("SECKILL_REDIS_URL", redis.url()),
        ("SECKILL_MYSQL_URL", db.url()),
    ];

    let mut gateway = start(
        "seckill-gateway",
        &[
            common[0].clone(),
            ("SECKILL_LISTEN", format!("127.0.0.1:{port}")),
            ("SECKILL_REDIS_TIMEOUT", redis_timeout.to_string()),
        ],
    );
    let mut workers: Vec<Proc> = ["e2e-w1", "e2e-w2"]
        .iter()
        .map(|id| {
            let mut env = common.to_vec();
            env.push(("SECKILL_WORKER_ID", id.to_string()));
            env.push((
                "SECKILL_WORKER_METRICS_LISTEN",
                format!("127.0.0.1:{}", free_port()),
            ));
            start("seckill-worker", &env)
        })
        .collect();
    wait_until(Duration::from_secs(10), "the gateway to listen", || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });

    let out = seckill_tests::command("seckill-load")
        .args(["--sale", &sale.to_string()])
        .args(["--url", &format!("http://127.0.0.1:{port}")])
        .args(["--users", "5000", "--connections", "64"])
        .args(["--duplicates", "0.1", "--hostile", "10", "--seed", "6"])
        .arg("--key")
        .arg(seckill_tests::auth::signing_key_file())
        .args(["--user-prefix", "e2e", "--drain-timeout", "60s", "--json"])
        .args(["--timeout", "60s"])
        .envs(common.iter().cloned())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["ok"], true);
    assert_eq!(report["accepted"], 500);
    assert_eq!(report["answers"]["202"], 500);
    assert_eq!(report["unexpected"], 0);
    // 5,000 first clicks and 500 second clicks: every one that was not a
    // 202 is a 409 or a 410.
    let already = report["already_purchased"].as_u64().unwrap();
    let sold_out = report["sold_out"].as_u64().unwrap();
    assert_eq!(already + sold_out, 5_500 - 500);
    // The 7 hostile bodies and paths, and a forged, an expired and another
    // user's token: 401, 401, 403 (the load tool sends these three first,
    // one at a time: once the sale is known sold out they would be 410,
    // public facts before identity, gateway_public_answers.rs).
    assert_eq!(report["hostile"], 10);
    assert_eq!(report["answers"]["401"], 2);
    assert_eq!(report["answers"]["403"], 1);
    assert_eq!(
        seckill_tests::load_report::verdicts(&report),
        seckill_tests::load_report::expected(&[])
    );

    // The same figures read here, not only by the simulator.
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM orders WHERE sale_id = {sale}"
        )),
        500
    );
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(DISTINCT user_id) FROM orders WHERE sale_id = {sale}"
        )),
        500
    );
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM stock_ledger WHERE sale_id = {sale} AND reason = 'order' AND delta = -1"
        )),
        500
    );
    assert_eq!(
        db.count(&format!(
            "SELECT available_stock FROM sales WHERE id = {sale}"
        )),
        0
    );
    let mut con = redis.target_con();
    let k = SaleKeys::new(sale);
    assert_eq!(con.get::<_, i64>(k.stock()).unwrap(), 0);
    assert_eq!(con.hlen::<_, i64>(k.flow()).unwrap(), 500);
    assert_eq!(con.llen::<_, i64>(k.queue()).unwrap(), 0);
    assert_eq!(con.llen::<_, i64>(k.dead_letter()).unwrap(), 0);

    let review = TempDir::new();
    let rec = seckill_tests::command("seckill-reconciler")
        .arg("run")
        .envs(common.iter().cloned())
        .env("SECKILL_RECONCILE_GRACE", "0s")
        .env("SECKILL_REVIEW_DB", review.path().join("review.sqlite3"))
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert_eq!(
        rec.status.code(),
        Some(0),
        "reconciler found something: {}\n{}",
        String::from_utf8_lossy(&rec.stdout),
        String::from_utf8_lossy(&rec.stderr)
    );
    let review_db = rusqlite::Connection::open(review.path().join("review.sqlite3")).unwrap();
    let findings: i64 = review_db
        .query_row("SELECT COUNT(*) FROM findings", [], |r| r.get(0))
        .unwrap();
    assert_eq!(findings, 0);

    assert_eq!(gateway.terminate(), Some(0));
    for w in &mut workers {
        assert_eq!(w.terminate(), Some(0));
    }
}
