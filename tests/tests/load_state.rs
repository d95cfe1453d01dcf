//! Specifies what `seckill-load` reads of a sale's state, with the real
//! gateway and worker: a sale split over three buckets is read whole (every
//! bucket's stock, buyers, flow records and queues), so a crowd that buys
//! it out passes every invariant; a Redis restarted while the tool waits
//! for the workers is read again (each failed read told on stderr and
//! counted in the report) instead of ending the run with exit 2; and a
//! one-unit quantity mix with keys (`--quantities 1 --retry-same-key 0.5`)
//! on a one-unit sale is checked in units, each same-key retry answered
//! with its purchase's reservation (409 naming it, or 410 once sold out).

use crate::support::gateway::Gateway;
use crate::support::worker::{Opts, WorkerProc};
use seckill_tests::{create_sale, create_split_sale, load_report, RedisServer, TestDb};
use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// `seckill-load` against `gw`'s sale `sale` with `args` after the common
/// ones (tokens, JSON report, generous timeouts: these tests are about
/// exactness, not latency).
fn load(redis: &RedisServer, db: &TestDb, gw: &Gateway, sale: u64, args: &[&str]) -> Command {
    let mut cmd = seckill_tests::command("seckill-load");
    cmd.args(["--sale", &sale.to_string()])
        .args(["--url", &format!("http://127.0.0.1:{}", gw.port)])
        .arg("--key")
        .arg(seckill_tests::auth::signing_key_file())
        .args(["--json", "--drain-timeout", "60s", "--timeout", "60s"])
        .args(args)
        .env("SECKILL_REDIS_URL", redis.url())
        .env("SECKILL_MYSQL_URL", db.url());
    cmd
}

fn report(out: &Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).expect("a JSON report")
}

/// 300 users (30 clicking twice) buy a sale of 60 units split over 3
/// buckets: 60 answered 202, and every invariant holds over the three
/// buckets (bucket 0 alone holds about a third of the units and buyers).
#[test]
fn a_split_sale_is_read_over_every_bucket() {
    let _crowd = crate::support::crowd();
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_split_sale(&db, &redis, 60, -1_000, 600_000, 3);
    let gw = Gateway::start(&redis, crate::support::gateway::PATIENT);
    let _w = WorkerProc::start(&redis, &db, "load-state-w1", &Opts::default());
    let out = load(&redis, &db, &gw, sale, &[])
        .args([
            "--users",
            "300",
            "--connections",
            "8",
            "--duplicates",
            "0.1",
        ])
        .args(["--hostile", "0", "--seed", "5", "--user-prefix", "split"])
        .output()
        .expect("run seckill-load");
    let r = report(&out);
    assert_eq!(
        (&r["accepted"], &r["answers"]["202"]),
        (&60.into(), &60.into())
    );
    assert_eq!(
        (
            &r["redis"]["buckets"],
            &r["redis"]["buyers"],
            &r["redis"]["stock"]
        ),
        (&3.into(), &60.into(), &0.into())
    );
    assert_eq!(load_report::verdicts(&r), load_report::expected(&[]));
    assert_eq!(r["redis_read_failures"], 0);
}

/// The sale's 20 units are bought with no worker running; while the tool
/// waits for the queue to drain, Redis is killed (the tool's read fails:
/// it says so and reads again) and started again on its append-only file,
/// then a worker drains the queue: exit 0, every invariant holds, and the
/// report counts exactly the failed reads stderr told of.
#[test]
fn a_redis_restarted_while_the_tool_waits_is_read_again() {
    let _crowd = crate::support::crowd();
    let mut redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 20, -1_000, 600_000);
    let gw = Gateway::start(&redis, crate::support::gateway::PATIENT);
    let mut child = load(&redis, &db, &gw, sale, &[])
        .args(["--users", "50", "--connections", "4", "--duplicates", "0"])
        .args(["--hostile", "0", "--seed", "2", "--user-prefix", "restart"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start seckill-load");
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut lines = Vec::new();
    let mut wait_for = |what: &str| {
        while let Ok(l) = rx.recv_timeout(Duration::from_secs(120)) {
            let hit = l.contains(what);
            lines.push(l);
            if hit {
                return;
            }
        }
        panic!("seckill-load never said {what:?}:\n{}", lines.join("\n"));
    };
    wait_for("waiting for the workers to drain the queue");
    redis.stop();
    wait_for("load: warning: reading the queues from Redis failed");
    redis.restart();
    let _w = WorkerProc::start(&redis, &db, "load-restart-w1", &Opts::default());
    let out = child.wait_with_output().expect("seckill-load exits");
    let _ = reader.join();
    lines.extend(rx.try_iter());
    let r = report(&out);
    assert_eq!(r["accepted"], 20);
    assert_eq!(load_report::verdicts(&r), load_report::expected(&[]));
    let warned = lines
        .iter()
        .filter(|l| l.contains("load: warning:"))
        .count();
    assert!(warned >= 1, "{lines:?}");
    assert_eq!(
        r["redis_read_failures"].as_u64(),
        Some(warned as u64),
        "{lines:?}"
    );
}

/// `--quantities 1 --retry-same-key 0.5` on a one-unit sale of 30 units:
/// 200 users, 100 of them retrying with the same key, 40 buying again with
/// a new key. Each purchase carries an `Idempotency-Key` (ignored by a
/// one-unit sale), no `quantity` (one unit is the default); 30 reservations
/// of 30 units, and the invariants in units all hold.
#[test]
fn a_one_unit_mix_with_keys_is_checked_in_units() {
    let _crowd = crate::support::crowd();
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 30, -1_000, 600_000);
    let gw = Gateway::start(&redis, crate::support::gateway::PATIENT);
    let _w = WorkerProc::start(&redis, &db, "load-units-w1", &Opts::default());
    let out = load(&redis, &db, &gw, sale, &[])
        .args([
            "--users",
            "200",
            "--connections",
            "8",
            "--duplicates",
            "0.2",
        ])
        .args(["--quantities", "1", "--retry-same-key", "0.5"])
        .args(["--hostile", "0", "--seed", "9", "--user-prefix", "units"])
        .output()
        .expect("run seckill-load");
    let r = report(&out);
    assert_eq!(load_report::verdicts(&r), load_report::expected_units(&[]));
    let u = &r["units"];
    let figures: Vec<(&str, u64)> = [
        "max_per_buyer",
        "max_per_purchase",
        "reservations",
        "units_accepted",
        "retries",
        "limit_reached",
        "not_enough_stock",
    ]
    .iter()
    .map(|k| (*k, u[k].as_u64().unwrap_or(u64::MAX)))
    .collect();
    assert_eq!(
        figures,
        [
            ("max_per_buyer", 1),
            ("max_per_purchase", 1),
            ("reservations", 30),
            ("units_accepted", 30),
            ("retries", 100),
            ("limit_reached", 0),
            ("not_enough_stock", 0),
        ]
    );
    // A retry of a winner is answered 409 naming its reservation, or 410
    // once the sale is sold out (the sold-out answer comes before the
    // buyer's mark): allowed with one unit per buyer, and only those.
    assert_eq!(u["retries_mismatched"], u["retries_410"]);
    // 200 first purchases, 40 second ones, 100 retries: each 202, 409 or 410.
    let answered: u64 = ["202", "409", "410"]
        .iter()
        .map(|s| r["answers"][s].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(answered, 340);
    assert_eq!(r["accepted"], 30);
}
