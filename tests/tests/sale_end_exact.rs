//! Specifies the end of a live sale at its edge: while a crowd of 64
//! connections buys, `seckill-reconciler sale end` records one end in
//! MySQL that every bucket's meta holds before it arrives, so no
//! reservation (flow record or order) is at or after the recorded end, on
//! a one-bucket and a three-bucket sale, and on a Redis Cluster; a bucket
//! written after the end (the command held back) is named, and the
//! `order_outside_window` rule reports exactly the orders reserved
//! outside their sale's window (taken so, or planted in MySQL), none
//! inside it; a command killed between MySQL's commit and the buckets is
//! completed by `run` with one end everywhere.

use crate::support::gateway::{Client, Gateway};
use crate::support::worker::{wait_orders, Opts, WorkerProc};
use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_common::message::OrderMessage;
use seckill_tests::{RedisServer, TempDir, TestDb};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const CONNECTIONS: usize = 64;

/// How long the crowd may go on after `sale end` returned before every
/// connection must have heard `sale_ended`.
const ENDED_WITHIN: Duration = Duration::from_secs(30);

/// One connection of the crowd: buys as a new buyer each time until it
/// hears 403 `sale_ended` after `ended` was set; returns its 202s.
fn buyer(port: u16, sale: u64, t: usize, ended: &AtomicBool, won: &AtomicU64) -> u64 {
    let mut c = Client::connect(port);
    let mut n = 0;
    let mut deadline = None;
    for i in 0.. {
        let r = c.buy(sale, &format!("e{t}x{i}"));
        if r.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
        {
            c = Client::connect(port);
        }
        match (r.status, r.error().as_str()) {
            (202, _) => {
                n += 1;
                won.fetch_add(1, Ordering::Relaxed);
            }
            (403, "sale_ended") if ended.load(Ordering::Relaxed) => return n,
            (403, "sale_ended") => panic!("sale_ended before `sale end` ran"),
            (503, _) => std::thread::sleep(Duration::from_millis(2)),
            other => panic!("{other:?} {}", r.body),
        }
        if ended.load(Ordering::Relaxed) {
            let d = *deadline.get_or_insert_with(|| Instant::now() + ENDED_WITHIN);
            assert!(Instant::now() < d, "still selling 30 s after `sale end`");
        }
    }
    n
}

/// The recorded end (Unix ms) of `sale` in MySQL.
fn recorded_end(db: &TestDb, sale: u64) -> u64 {
    db.conn()
        .exec_first(
            "SELECT CAST(UNIX_TIMESTAMP(ends_at) * 1000 AS UNSIGNED) FROM sales WHERE id = ?",
            (sale,),
        )
        .unwrap()
        .unwrap()
}

/// The reservation ids of `sale`'s flow records (all `buckets`) reserved
/// at or after `end`.
fn flows_at_or_after(redis: &RedisServer, sale: u64, buckets: u32, end: u64) -> Vec<String> {
    let mut con = redis.con();
    let mut late = Vec::new();
    for b in 0..buckets {
        let all: Vec<(String, String)> = con.hgetall(SaleKeys::bucket(sale, b).flow()).unwrap();
        for (rid, f) in all {
            if OrderMessage::parse(f.as_bytes()).unwrap().reserved_at_ms >= end {
                late.push(rid);
            }
        }
    }
    late
}

/// The subjects of every `order_outside_window` finding of a `run` on
/// `review`.
fn outside_window(redis: &RedisServer, db: &TestDb, review: &Path) -> BTreeSet<String> {
    let (code, out) = seckill_tests::reconciler(redis, db, review, &["run"]);
    assert!(code == 0 || code == 1, "reconciler run: {out}");
    let (code, json) =
        seckill_tests::reconciler(redis, db, review, &["findings", "--state", "all", "--json"]);
    assert_eq!(code, 0, "{json}");
    let v: serde_json::Value = serde_json::from_str(json.trim()).expect("findings json");
    v.as_array()
        .expect("a list")
        .iter()
        .filter(|f| f["kind"] == "order_outside_window")
        .map(|f| f["subject"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// A crowd of [`CONNECTIONS`] buys a sale of `buckets` buckets for 400 ms,
/// then `sale end` runs while it goes on buying until each connection
/// hears `sale_ended`; every 202 becomes an order, and none is reserved
/// at or after the end MySQL records, which every bucket's meta holds.
fn ending_under_a_crowd(buckets: u32) {
    let _crowd = crate::support::crowd();
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let shards = buckets.to_string();
    let (sale, _) = seckill_tests::sale_created(
        &redis,
        &db,
        &review,
        "END",
        1_000_000,
        &["--shards", &shards],
    );
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let g = Gateway::start(
        &redis,
        &[
            ("SECKILL_GATEWAY_BUYER_RATE", "0"),
            ("SECKILL_GATEWAY_THREADS", "64"),
        ],
    );
    let (ended, won) = (AtomicBool::new(false), AtomicU64::new(0));
    let (code, out) = std::thread::scope(|s| {
        for t in 0..CONNECTIONS {
            let (ended, won, port) = (&ended, &won, g.port);
            s.spawn(move || buyer(port, sale, t, ended, won));
        }
        let start = Instant::now();
        while won.load(Ordering::Relaxed) < 200 || start.elapsed() < Duration::from_millis(400) {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the crowd buys nothing"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        ended.store(true, Ordering::Relaxed);
        seckill_tests::reconciler(
            &redis,
            &db,
            &review,
            &["sale", "end", &sale.to_string(), "--by", "op"],
        )
    });
    assert_eq!(code, 0, "{out}");
    let won = won.into_inner();
    wait_orders(&db, sale, won as i64, Duration::from_secs(120));
    let end = recorded_end(&db, sale);
    for b in 0..buckets {
        let held: Option<u64> = redis
            .con()
            .hget(SaleKeys::bucket(sale, b).meta(), "ends_at_ms")
            .unwrap();
        assert_eq!(held, Some(end), "bucket {b}'s end is MySQL's");
    }
    let late_orders = db.count(&format!(
        "SELECT COUNT(*) FROM orders o JOIN sales s ON s.id = o.sale_id \
         WHERE o.sale_id = {sale} AND o.reserved_at >= s.ends_at"
    ));
    let late_flows = flows_at_or_after(&redis, sale, buckets, end);
    eprintln!(
        "{won} × 202 over {buckets} bucket(s); {late_orders} orders and {} flow records \
         at or after the recorded end; {out}",
        late_flows.len()
    );
    assert_eq!((late_orders, late_flows.len()), (0, 0), "{out}");
    assert_eq!(outside_window(&redis, &db, &review), BTreeSet::new());
}

#[test]
fn sale_end_under_a_crowd_leaves_no_reservation_at_or_after_the_recorded_end() {
    ending_under_a_crowd(1);
}

#[test]
fn sale_end_of_a_split_sale_under_a_crowd_leaves_no_reservation_at_or_after_the_recorded_end() {
    ending_under_a_crowd(3);
}

/// Plants an order of `sale` reserved at `at` (SQL) for `user`; returns
/// its reservation id.
fn plant(db: &TestDb, sale: u64, n: u32, at: &str) -> String {
    let rid = format!("{:032x}", 0xfeed_0000_u64 + u64::from(n));
    db.conn()
        .exec_drop(
            format!(
                "INSERT INTO orders (reservation_id, sale_id, user_id, quantity, multi_unit, \
                 status, reserved_at) VALUES (?, ?, ?, 1, 0, 'confirmed', {at})"
            ),
            (&rid, sale, format!("planted{n}")),
        )
        .unwrap();
    rid
}

/// Orders planted in MySQL before the start, at the end and after it are
/// reported, one finding each with its times as evidence; orders at the
/// start and just before the end are not.
#[test]
fn the_rule_reports_exactly_the_orders_reserved_outside_their_sales_window() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let sale = seckill_tests::create_sale(&db, &redis, 100, -60_000, 120_000);
    let s = "(SELECT starts_at FROM sales WHERE id = SALE)";
    let e = "(SELECT ends_at FROM sales WHERE id = SALE)";
    let at = |t: &str| t.replace("SALE", &sale.to_string());
    let outside: BTreeSet<String> = [
        plant(&db, sale, 1, &at(&format!("{s} - INTERVAL 1 SECOND"))),
        plant(&db, sale, 2, &at(e)),
        plant(&db, sale, 3, &at(&format!("{e} + INTERVAL 0.001 SECOND"))),
    ]
    .into();
    plant(&db, sale, 4, &at(s));
    plant(&db, sale, 5, &at(&format!("{e} - INTERVAL 0.001 SECOND")));
    assert_eq!(outside_window(&redis, &db, &review), outside);
    let (code, json) = seckill_tests::reconciler(&redis, &db, &review, &["findings", "--json"]);
    assert_eq!(code, 0, "{json}");
    let v: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    let f = v
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "order_outside_window" && f["user_id"] == "planted2")
        .expect("the order at the end");
    let ev = &f["evidence"];
    assert_eq!(ev["reserved_at"], ev["ends_at"], "{ev}");
    assert_eq!(f["state"], "open", "{f}");
}

/// `sale end` held back past its margin (MySQL's row locked by another
/// session for 1.5 s, as a stalled command or one killed after MySQL's
/// commit and completed later would be): the bucket takes purchases
/// after the end MySQL then records; the command says the bucket was
/// written late, Redis and MySQL agree on the end, and `run` reports
/// exactly the orders taken meanwhile as `order_outside_window`.
#[test]
fn a_bucket_written_after_the_end_is_reported_with_each_order_it_took() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let (sale, _) = seckill_tests::sale_created(&redis, &db, &review, "LATE", 100, &[]);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let mut lock = db.conn();
    lock.query_drop("START TRANSACTION").unwrap();
    let _: Option<u64> = lock
        .exec_first("SELECT id FROM sales WHERE id = ? FOR UPDATE", (sale,))
        .unwrap();
    let asked = seckill_common::now_ms();
    let margin = seckill_common::sale_admin::END_MARGIN_MS;
    let (code, out, late) = std::thread::scope(|s| {
        let cmd = s.spawn(|| {
            seckill_tests::reconciler(
                &redis,
                &db,
                &review,
                &["sale", "end", &sale.to_string(), "--by", "op"],
            )
        });
        // Its started row is written once its end is chosen; then past
        // that end, while MySQL holds the command back.
        seckill_tests::wait_until(Duration::from_secs(30), "the started row", || {
            rusqlite::Connection::open(&review)
                .and_then(|c| {
                    c.query_row(
                        "SELECT COUNT(*) FROM actions WHERE result = 'started'",
                        [],
                        |r| r.get::<_, i64>(0),
                    )
                })
                .is_ok_and(|n| n == 1)
        });
        std::thread::sleep(Duration::from_millis(margin + 200));
        let mut c = Client::connect(g.port);
        let late: BTreeSet<String> = (0..3)
            .map(|i| {
                let r = c.buy(sale, &format!("late{i}"));
                assert_eq!(r.status, 202, "{}", r.body);
                r.json()["reservation_id"].as_str().unwrap().to_string()
            })
            .collect();
        lock.query_drop("ROLLBACK").unwrap();
        let (code, out) = cmd.join().unwrap();
        (code, out, late)
    });
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("bucket 0 written") && out.contains("ms after the end"),
        "{out}"
    );
    eprintln!("{out}");
    let end = recorded_end(&db, sale);
    let held: Option<u64> = redis
        .con()
        .hget(SaleKeys::new(sale).meta(), "ends_at_ms")
        .unwrap();
    assert_eq!(held, Some(end));
    assert!(end > asked, "{end}");
    wait_orders(&db, sale, 3, Duration::from_secs(60));
    assert_eq!(outside_window(&redis, &db, &review), late);
}

/// `sale end` of a three-bucket sale killed (-9) after MySQL's commit and
/// before any bucket is written (Redis's writes held by `CLIENT PAUSE
/// WRITE`): MySQL records the new end while every bucket holds the old
/// one; the next `run` completes the action, after which MySQL and every
/// bucket hold the same end, and the audit log one started row and its
/// `done`.
#[test]
fn sale_end_killed_between_mysql_and_redis_leaves_one_end_everywhere_after_run() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let (sale, _) =
        seckill_tests::sale_created(&redis, &db, &review, "KILL", 30, &["--shards", "3"]);
    let before = recorded_end(&db, sale);
    let bucket_ends = || -> Vec<Option<u64>> {
        (0..3)
            .map(|b| {
                redis
                    .con()
                    .hget(SaleKeys::bucket(sale, b).meta(), "ends_at_ms")
                    .unwrap()
            })
            .collect()
    };
    let pause = |args: &[&str]| {
        let _: () = redis::cmd("CLIENT")
            .arg(args)
            .query(&mut redis.con())
            .unwrap();
    };
    pause(&["PAUSE", "60000", "WRITE"]);
    let mut child = seckill_tests::command("seckill-reconciler")
        .env("SECKILL_REDIS_URL", redis.url())
        .env("SECKILL_MYSQL_URL", db.url())
        .env("SECKILL_REVIEW_DB", &review)
        .args(["sale", "end", &sale.to_string(), "--by", "op"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let decided = format!("SELECT COUNT(*) FROM sale_changes WHERE sale_id = {sale}");
    seckill_tests::wait_until(Duration::from_secs(30), "MySQL's decision", || {
        db.count(&decided) == 1
    });
    child.kill().unwrap();
    child.wait().unwrap();
    pause(&["UNPAUSE"]);
    let end = recorded_end(&db, sale);
    assert!(end < before, "{end} {before}");
    assert_eq!(
        bucket_ends(),
        vec![Some(before); 3],
        "no bucket written yet"
    );
    let (code, out) = seckill_tests::reconciler(&redis, &db, &review, &["run"]);
    assert!(code == 0 || code == 1, "{out}");
    assert_eq!(bucket_ends(), vec![Some(end); 3], "{out}");
    let c = rusqlite::Connection::open(&review).unwrap();
    let rows: Vec<(String, String)> = c
        .prepare("SELECT action, result FROM actions WHERE sale_id = ?1 ORDER BY id")
        .unwrap()
        .query_map([sale as i64], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let want = [("end", "started"), ("end", "done")].map(|(a, r)| (a.to_string(), r.to_string()));
    assert_eq!(rows, want);
}

/// On a real Redis Cluster, `sale end` of a three-bucket sale (buckets in
/// different slots) reads Redis's clock there and writes one end, MySQL's,
/// into every bucket, a second ahead.
#[test]
fn on_a_redis_cluster_sale_end_writes_mysqls_end_into_every_bucket_ahead_of_it() {
    use seckill_tests::cluster::{RedisCluster, TestRedis};
    let db = TestDb::create();
    let cluster = RedisCluster::start();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let (sale, _) =
        seckill_tests::sale_created(&cluster, &db, &review, "CL-END", 30, &["--shards", "3"]);
    let asked = seckill_common::now_ms();
    let (code, out) = seckill_tests::reconciler(
        &cluster,
        &db,
        &review,
        &["sale", "end", &sale.to_string(), "--by", "op"],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("Redis follows in 3 bucket(s)"), "{out}");
    assert!(!out.contains("after the end"), "{out}");
    let end = recorded_end(&db, sale);
    assert!(
        end >= asked + seckill_common::sale_admin::END_MARGIN_MS,
        "{end}"
    );
    let mut con = cluster.target_con();
    for b in 0..3 {
        let held: Option<u64> = con
            .hget(SaleKeys::bucket(sale, b).meta(), "ends_at_ms")
            .unwrap();
        assert_eq!(held, Some(end), "bucket {b}");
    }
}
