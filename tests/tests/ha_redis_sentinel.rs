//! A standalone Redis under Redis Sentinel
//! (`SECKILL_REDIS_URL=redis+sentinel://…/seckill`): a master, a replica and
//! three Sentinels on free ports (`seckill_tests::sentinel`), a real
//! gateway and worker, a crowd buying. The master is killed with SIGKILL:
//! purchases are answered 503 only while no master is known, then 202
//! again from the master Sentinel elected, with nothing restarted; every
//! reservation ends as exactly one order, none oversold, and a reconciler
//! run through the Sentinels finds nothing. With the replica cut off
//! before the kill, the lost reservations are one `redis_data_loss`
//! finding and `sale repair` ends with exactly one order per buyer.

use crate::support::after_repair::holders_409_then_sells_out_exactly;
use crate::support::gateway as gateway_support;
use crate::support::worker as worker_support;

use gateway_support::{buy, Gateway};
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_tests::cluster::TestRedis;
use seckill_tests::sentinel::SentinelSet;
use seckill_tests::{create_sale, TempDir, TestDb};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use worker_support::{wait_drained, wait_orders, Opts, WorkerProc};

const STOCK: u64 = 1000;
const BUYERS: usize = 4;

/// Each buyer `PREFIX-t-i` buys until answered 202 (or 409: its
/// reservation was made but the answer lost); returns every answer as
/// (ms since `t0`, status).
fn crowd(port: u16, sale: u64, prefix: &str, per_thread: usize, t0: Instant) -> Vec<(u128, u16)> {
    let threads: Vec<_> = (0..BUYERS)
        .map(|t| {
            let prefix = prefix.to_string();
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                for i in 0..per_thread {
                    let u = format!("{prefix}-{t}-{i}");
                    let deadline = Instant::now() + Duration::from_secs(60);
                    loop {
                        let r = buy(port, sale, &u);
                        seen.push((t0.elapsed().as_millis(), r.status));
                        match r.status {
                            202 | 409 => break,
                            503 => {
                                assert!(Instant::now() < deadline, "{u}: 503 for 60 s");
                                std::thread::sleep(Duration::from_millis(20));
                            }
                            other => panic!("{u}: {other} {r:?}"),
                        }
                    }
                }
                seen
            })
        })
        .collect();
    threads
        .into_iter()
        .flat_map(|t| t.join().expect("buyer thread"))
        .collect()
}

#[test]
fn a_killed_master_is_replaced_by_the_one_sentinel_elects_without_a_restart() {
    let mut set = SentinelSet::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let sale = create_sale(&db, &set, STOCK, -1000, 600_000);
    let g = Gateway::start(&set, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let _w = WorkerProc::start(&set, &db, "w1", &Opts::default());

    let t0 = Instant::now();
    let before = crowd(g.port, sale, "early", 25, t0);
    assert!(before.iter().all(|&(_, s)| s == 202), "{before:?}");
    wait_orders(&db, sale, 100, Duration::from_secs(30));
    // The replica holds every reservation so far.
    let mut m = set.master.con();
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query(&mut m)
        .expect("WAIT");
    assert_eq!(acked, 1);
    let old_master = set.master.port;
    assert_eq!(set.master_port(), Some(old_master));

    set.master.stop();
    let killed = Instant::now();
    let after = crowd(g.port, sale, "late", 50, killed);
    assert_eq!(
        set.master_port(),
        Some(set.replica.port),
        "Sentinel promoted the replica"
    );
    let statuses: HashMap<u16, usize> = after.iter().fold(HashMap::new(), |mut m, &(_, s)| {
        *m.entry(s).or_default() += 1;
        m
    });
    let first_ok = after
        .iter()
        .filter(|&&(_, s)| s != 503)
        .map(|&(t, _)| t)
        .min();
    let last_503 = after
        .iter()
        .filter(|&&(_, s)| s == 503)
        .map(|&(t, _)| t)
        .max();
    let first_503 = after
        .iter()
        .filter(|&&(_, s)| s == 503)
        .map(|&(t, _)| t)
        .min();
    // Answered 503 only before the new master served: no 503 after a 202.
    if let (Some(ok), Some(last)) = (first_ok, last_503) {
        let late_503: Vec<_> = after
            .iter()
            .filter(|&&(t, s)| s == 503 && t > ok + 1000)
            .collect();
        assert!(late_503.is_empty(), "503 after the master was back: {late_503:?} (first 202 at {ok} ms, last 503 at {last} ms)");
    }
    println!(
        "sentinel failover: answers after the kill {statuses:?}; first 503 at {first_503:?} ms, \
         last 503 at {last_503:?} ms, first 202 at {first_ok:?} ms after the kill"
    );

    // Exact counts: every reservation one order, nothing oversold.
    let users: HashSet<String> = (0..BUYERS)
        .flat_map(|t| {
            (0..25)
                .map(move |i| format!("early-{t}-{i}"))
                .chain((0..50).map(move |i| format!("late-{t}-{i}")))
        })
        .collect();
    let n = users.len() as i64;
    wait_orders(&db, sale, n, Duration::from_secs(60));
    wait_drained(&set, sale, Duration::from_secs(30));
    let k = SaleKeys::new(sale);
    let mut con = set.target_con();
    let flow: HashMap<String, String> = con.hgetall(k.flow()).expect("flow");
    let stock: i64 = con.get(k.stock()).expect("stock");
    assert_eq!(flow.len() as i64, n, "one reservation per buyer");
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM orders WHERE sale_id = {sale}"
        )),
        n
    );
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(DISTINCT user_id) FROM orders WHERE sale_id = {sale}"
        )),
        n
    );
    assert_eq!(stock + n, STOCK as i64, "no unit lost or sold twice");
    // The reconciler follows the Sentinels too, and finds nothing.
    seckill_tests::assert_reconciles_clean(&set, &db, &review);
}

fn buy_all(port: u16, sale: u64, users: impl Iterator<Item = String>) -> HashMap<String, String> {
    users
        .map(|u| {
            let r = buy(port, sale, &u);
            assert_eq!(r.status, 202, "{u}: {r:?}");
            let rid = r.json()["reservation_id"].as_str().unwrap().to_string();
            (u, rid)
        })
        .collect()
}

#[test]
fn a_failover_that_lost_reservations_is_one_finding_and_the_repair_gives_one_order_per_buyer() {
    const STOCK: u64 = 300;
    let mut set = SentinelSet::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let sale = create_sale(&db, &set, STOCK, -1000, 600_000);
    let k = SaleKeys::new(sale);
    // The lost buyers retry on purpose: no per-buyer limit.
    let g = Gateway::start(&set, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let _w = WorkerProc::start(&set, &db, "w1", &Opts::default());
    let mut rids = buy_all(g.port, sale, (0..100).map(|i| format!("u{i}")));
    wait_orders(&db, sale, 100, Duration::from_secs(30));
    // The replica cut off: stopped, its link closed by the master. The
    // next 50 are acknowledged and ordered, then lost with the master.
    let (replica_pid, _master) = set.cut_off_replica();
    rids.extend(buy_all(g.port, sale, (100..150).map(|i| format!("u{i}"))));
    wait_orders(&db, sale, 150, Duration::from_secs(30));
    seckill_tests::wait_until(Duration::from_secs(10), "the watch to see 150", || {
        db.count(&format!(
            "SELECT seq_high FROM sale_redis_state WHERE sale_id = {sale}"
        )) == 150
    });
    set.master.stop();
    gateway_support::signal(replica_pid, "CONT");
    let killed = Instant::now();

    // Until the new master serves (and while the watch notices): 503 or
    // 202/409, never another answer; then the sale is paused.
    let mut answers: HashMap<u16, usize> = HashMap::new();
    let mut paused = false;
    'buy: while killed.elapsed() < Duration::from_secs(60) {
        for i in 100..150 {
            let u = format!("u{i}");
            let r = buy(g.port, sale, &u);
            *answers.entry(r.status).or_default() += 1;
            match (r.status, r.error().as_str()) {
                (503, "sale_paused") => {
                    paused = true;
                    break 'buy;
                }
                (202 | 409 | 503, _) => {}
                other => panic!("{u}: {other:?}"),
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(paused, "the sale was never paused: {answers:?}");
    // The gateway may hear the new master (held: 503 sale_paused) before
    // the Sentinel this asks has switched too.
    seckill_tests::wait_until(
        Duration::from_secs(10),
        "Sentinel to name the replica",
        || set.master_port() == Some(set.replica.port),
    );
    println!(
        "sentinel failover with lost writes: paused {} ms after the kill; answers {answers:?}",
        killed.elapsed().as_millis()
    );

    // One redis_data_loss finding; the repair rebuilds the sale from MySQL.
    let (code, out) = seckill_tests::reconciler(&set, &db, &review, &["run"]);
    assert_eq!(code, 1, "{out}");
    let (_, listed) = seckill_tests::reconciler(&set, &db, &review, &["findings", "--json"]);
    let findings: serde_json::Value = serde_json::from_str(&listed).expect("JSON");
    let kinds: Vec<&str> = findings
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|f| f["kind"].as_str())
        .collect();
    assert_eq!(kinds, vec!["redis_data_loss"], "{listed}");
    let (code, out) = seckill_tests::reconciler(
        &set,
        &db,
        &review,
        &["sale", "repair", &sale.to_string(), "--by", "tester"],
    );
    assert_eq!(code, 0, "{out}");

    // Every buyer holding an order: 409 with their own reservation id; the
    // sale sells out to exactly its stock, one order per buyer.
    holders_409_then_sells_out_exactly(|u| buy(g.port, sale, u), &rids, 150, &db, (sale, STOCK));
    let stock: i64 = set.target_con().get(k.stock()).expect("stock");
    assert_eq!(stock, 0);
}
