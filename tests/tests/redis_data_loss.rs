//! Specifies what happens when Redis loses acknowledged reservations
//! (docs/reliability.md §4): sell 200 of 500 with a worker draining, kill -9 Redis and restart
//! it from an append-only file missing its last 100 reservations. The sale
//! pauses (purchases 503 `sale_paused`; none of the lost users' retries
//! is given a second reservation, as purchases are held from the restart
//! until the watch's check),
//! `seckill-reconciler sale repair` rebuilds it from MySQL, every user
//! holding an order gets 409 with their original reservation id, no user
//! has two orders, and the sale goes on to exactly 500 orders.

use crate::support::after_repair::holders_409_then_sells_out_exactly;
use crate::support::gateway as gateway_support;
use crate::support::worker as worker_support;

use gateway_support::{Client, Gateway};
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_tests::{create_sale, RedisServer, TempDir, TestDb};
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};
use worker_support::{wait_orders, Opts, WorkerProc};

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

fn reconciler(redis: &RedisServer, db: &TestDb, dir: &TempDir, args: &[&str]) -> (i32, String) {
    seckill_tests::reconciler(redis, db, &dir.path().join("review.sqlite3"), args)
}

fn buy_all(
    c: &mut Client,
    sale: u64,
    users: impl Iterator<Item = String>,
) -> HashMap<String, String> {
    users
        .map(|u| {
            let r = c.buy(sale, &u);
            assert_eq!(r.status, 202, "{u}: {r:?}");
            let rid = r.json()["reservation_id"].as_str().unwrap().to_string();
            (u, rid)
        })
        .collect()
}

#[test]
fn a_redis_that_lost_reservations_pauses_the_sale_until_repaired_from_mysql() {
    let mut redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let sale = create_sale(&db, &redis, 500, -1000, 600_000);
    let k = SaleKeys::new(sale);
    // The lost buyers retry in a loop on purpose: no per-buyer limit.
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let mut c = Client::connect(g.port);
    let mut rids = buy_all(&mut c, sale, (0..100).map(|i| format!("u{i}")));
    wait_orders(&db, sale, 100, Duration::from_secs(20));
    // The append-only file as it was here: the next 100 will be lost.
    let snapshot = TempDir::new();
    copy_dir(&redis.dir().join("appendonlydir"), snapshot.path());
    rids.extend(buy_all(&mut c, sale, (100..200).map(|i| format!("u{i}"))));
    wait_orders(&db, sale, 200, Duration::from_secs(20));
    // Let the workers' watch see the sequence at 200.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        db.count(&format!(
            "SELECT seq_high FROM sale_redis_state WHERE sale_id = {sale}"
        )),
        200
    );

    redis.stop();
    let aof = redis.dir().join("appendonlydir");
    std::fs::remove_dir_all(&aof).unwrap();
    copy_dir(snapshot.path(), &aof);
    redis.restart();
    let restarted = Instant::now();
    let seq = seckill_common::reservation::read_sequence(&mut redis.con(), sale).unwrap();
    assert_eq!(seq, 100, "the restart lost the last 100 reservations");

    // The lost users retry at once, and keep retrying until the pause.
    let mut c = Client::connect(g.port);
    let mut slipped: Vec<(String, Duration)> = Vec::new();
    let mut paused_at = None;
    'retry: while restarted.elapsed() < Duration::from_secs(10) {
        for i in 100..200 {
            let u = format!("u{i}");
            let r = c.buy(sale, &u);
            match (r.status, r.error().as_str()) {
                (202, _) => slipped.push((u, restarted.elapsed())),
                (503, "sale_paused") => {
                    assert_eq!(r.header("Retry-After"), Some("1"));
                    paused_at = Some(restarted.elapsed());
                    break 'retry;
                }
                (409 | 503, _) => {}
                other => panic!("{u}: {other:?}"),
            }
        }
    }
    let paused_at = paused_at.expect("the sale was never paused");
    let window = slipped.last().map_or(Duration::ZERO, |(_, t)| *t);
    eprintln!(
        "data-loss window: paused {paused_at:?} after the restart; {} purchases slipped \
         through, the last {window:?} after it",
        slipped.len()
    );
    // The restarted server has another replication id: the gateway holds
    // purchases until the watch has checked the sale, so none slips through.
    assert_eq!(slipped, Vec::new(), "window {window:?}");
    // Paused for everyone, and said so (the first `sale_paused` may be the
    // hold of a bucket whose master changed, before the watch's pause).
    assert_eq!(c.buy(sale, "someone-new").error(), "sale_paused");
    seckill_tests::wait_until(Duration::from_secs(10), "the page to say paused", || {
        let shown = gateway_support::get(g.port, &format!("/v1/sales/{sale}"));
        shown.json()["state"] == "paused"
    });

    // The reconciler reports it: one critical finding, nothing else.
    let (code, out) = reconciler(&redis, &db, &dir, &["run"]);
    assert_eq!(code, 1, "{out}");
    let (_, listed) = reconciler(&redis, &db, &dir, &["findings", "--json"]);
    let findings: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let findings = findings.as_array().unwrap();
    assert_eq!(findings.len(), 1, "{listed}");
    assert_eq!(findings[0]["kind"], "redis_data_loss");
    assert_eq!(findings[0]["severity"], "critical");
    let (code, out) = reconciler(&redis, &db, &dir, &["sale", "repair", &sale.to_string()]);
    assert_eq!(code, 64, "--by is required: {out}");
    let (code, out) = reconciler(
        &redis,
        &db,
        &dir,
        &["sale", "repair", &sale.to_string(), "--by", "alice"],
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!(
            "{} duplicate reservations released",
            slipped.len()
        )),
        "{out}"
    );
    // The duplicates' dead letters (if a worker got to them before the
    // pause) are archived with the repair, none left to report.
    let mut con = redis.con();
    let dead: usize = con.llen(k.dead_letter()).unwrap();
    assert_eq!(dead, 0);
    let archived: Vec<String> = con.lrange(k.dead_letter_archive(), 0, -1).unwrap();
    for a in &archived {
        let v: serde_json::Value = serde_json::from_str(a).unwrap();
        assert_eq!(v["settled_by"]["action"], "repair", "{a}");
        assert_eq!(v["settled_by"]["actor"], "alice", "{a}");
    }
    eprintln!("{} dead letters archived by the repair", archived.len());
    // Every user holding an order: 409 with the original id; the sale goes
    // on to exactly 500.
    holders_409_then_sells_out_exactly(|u| c.buy(sale, u), &rids, 200, &db, (sale, 500));
    assert_eq!(
        db.count(&format!(
            "SELECT available_stock FROM sales WHERE id = {sale}"
        )),
        0
    );
    let stock: i64 = redis.con().get(k.stock()).unwrap();
    assert_eq!(stock, 0);
    let shown = gateway_support::get(g.port, &format!("/v1/sales/{sale}"));
    assert_eq!(shown.json()["state"], "sold_out", "{shown:?}");
    // The next run finds nothing new, and the repair is in the audit log
    // once, started and done, naming alice.
    let (code, out) = reconciler(&redis, &db, &dir, &["run"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(" 0 new, "), "{out}");
    let review = rusqlite::Connection::open(dir.path().join("review.sqlite3")).unwrap();
    let rows: Vec<(String, String, String)> = review
        .prepare("SELECT actor, action, result FROM actions ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        rows,
        vec![
            ("alice".into(), "repair".into(), "started".into()),
            ("alice".into(), "repair".into(), "done".into()),
        ]
    );
}
