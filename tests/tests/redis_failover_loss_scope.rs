//! A lossy Sentinel failover (the replica cut off, the master killed after
//! more purchases and more watch passes) with three live sales: one that
//! lost acknowledged purchases, one idle, one sold out. Only the sale that
//! lost purchases is paused and reported (one `redis_data_loss` finding);
//! the others lost nothing but watch checkpoints and sell (or answer sold
//! out) again once a watch has checked them on the new master. The lost
//! buyers retry through the failover while the worker (its watch) is
//! frozen: none is given a second reservation id, as the gateways hold
//! purchases of a bucket whose master changed until a watch has checked it
//! (the sale's page says `paused` meanwhile, `active` after).

use crate::support::gateway as gateway_support;
use crate::support::worker as worker_support;

use gateway_support::buy;
use gateway_support::Gateway;
use seckill_tests::sentinel::SentinelSet;
use seckill_tests::{create_sale, TempDir, TestDb};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use worker_support::{wait_orders, Opts, WorkerProc};

/// Buys one unit for each of `users`, each answered 202; their ids.
fn buy_each(port: u16, sale: u64, users: &[String]) -> HashMap<String, String> {
    users
        .iter()
        .map(|u| {
            let r = buy(port, sale, u);
            assert_eq!(r.status, 202, "{u}: {r:?}");
            let rid = r.json()["reservation_id"].as_str().unwrap().to_string();
            (u.clone(), rid)
        })
        .collect()
}

fn names(prefix: &str, from: usize, to: usize) -> Vec<String> {
    (from..to).map(|i| format!("{prefix}{i}")).collect()
}

/// MySQL's checkpoint mark of `sale` (0 without one).
fn checkpoint_high(db: &TestDb, sale: u64) -> i64 {
    db.count(&format!(
        "SELECT COALESCE(MAX(checkpoint_high), 0) FROM sale_redis_state WHERE sale_id = {sale}"
    ))
}

/// The sales MySQL records paused for a data loss, in order.
fn paused_sales(db: &TestDb) -> Vec<u64> {
    use mysql::prelude::Queryable;
    let mut c = db.conn();
    c.query("SELECT sale_id FROM sale_redis_state WHERE paused_reason IS NOT NULL ORDER BY sale_id")
        .expect("paused sales")
}

/// The lost buyers retry every 20 ms for `for_how_long`; returns the
/// buyers answered 202 with an id other than their first, and every
/// answer counted by (status, error).
fn retry_lost(
    port: u16,
    sale: u64,
    rids: &HashMap<String, String>,
    for_how_long: Duration,
) -> (Vec<String>, HashMap<(u16, String), usize>) {
    let mut second = Vec::new();
    let mut answers: HashMap<(u16, String), usize> = HashMap::new();
    let until = Instant::now() + for_how_long;
    while Instant::now() < until {
        for (u, rid) in rids {
            let r = buy(port, sale, u);
            *answers.entry((r.status, r.error())).or_default() += 1;
            let other_id = || r.json()["reservation_id"].as_str() != Some(rid.as_str());
            if r.status == 202 && !second.contains(u) && other_id() {
                second.push(u.clone());
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    second.sort();
    (second, answers)
}

#[test]
fn a_lossy_failover_pauses_only_the_sale_that_lost_purchases_and_gives_no_second_id() {
    let mut set = SentinelSet::start();
    // The replica's first full copy done (Redis waits 5 s before a
    // diskless one): from here on it gets the write stream, as a replica
    // in service does, not a copy of the master's whole memory.
    seckill_tests::wait_until(Duration::from_secs(30), "the replica in sync", || {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut set.replica.con())
            .unwrap_or_default();
        info.contains("master_link_status:up")
    });
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let lossy = create_sale(&db, &set, 300, -1000, 600_000);
    let idle = create_sale(&db, &set, 100, -1000, 600_000);
    let sold_out = create_sale(&db, &set, 20, -1000, 600_000);
    let g = Gateway::start(&set, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let w = WorkerProc::start(&set, &db, "w1", &Opts::default());
    buy_each(g.port, lossy, &names("u", 0, 100));
    buy_each(g.port, idle, &names("i", 0, 10));
    buy_each(g.port, sold_out, &names("s", 0, 20));
    assert_eq!(buy(g.port, sold_out, "s20").status, 410);
    wait_orders(&db, lossy, 100, Duration::from_secs(30));
    wait_orders(&db, idle, 10, Duration::from_secs(30));
    wait_orders(&db, sold_out, 20, Duration::from_secs(30));

    // Cut off: 50 more purchases of `lossy`, acknowledged, ordered and
    // seen by the watch, then lost with the master; the other two sales
    // lose only the watch's checkpoints raised meanwhile.
    let replica_pid = set.cut_off_replica().0;
    let cut = [checkpoint_high(&db, idle), checkpoint_high(&db, sold_out)];
    let lost = buy_each(g.port, lossy, &names("u", 100, 150));
    wait_orders(&db, lossy, 150, Duration::from_secs(30));
    seckill_tests::wait_until(Duration::from_secs(10), "the watch to see 150", || {
        db.count(&format!(
            "SELECT seq_high FROM sale_redis_state WHERE sale_id = {lossy}"
        )) == 150
            && checkpoint_high(&db, idle) >= cut[0] + 3
            && checkpoint_high(&db, sold_out) >= cut[1] + 3
    });
    // The watch frozen through the failover: the gateway reaches the new
    // master first, as it can whenever the worker reconnects later.
    w.signal("-STOP");
    set.master.stop();
    gateway_support::signal(replica_pid, "CONT");
    seckill_tests::wait_until(Duration::from_secs(30), "Sentinel to promote", || {
        set.master_port() == Some(set.replica.port)
    });
    let (early, early_answers) = retry_lost(g.port, lossy, &lost, Duration::from_secs(3));
    // Held, and the sale's page says so as its purchases do.
    let page = |sale: u64| gateway_support::get(g.port, &format!("/v1/sales/{sale}")).json();
    assert_eq!(page(idle)["state"], "paused");
    let at_kill = [checkpoint_high(&db, idle), checkpoint_high(&db, sold_out)];
    w.signal("-CONT");
    // Each sale decided: paused, or its checkpoint raised on the new master.
    seckill_tests::wait_until(Duration::from_secs(30), "the watch to check all", || {
        let paused = paused_sales(&db);
        paused.contains(&lossy)
            && (paused.contains(&idle) || checkpoint_high(&db, idle) > at_kill[0])
            && (paused.contains(&sold_out) || checkpoint_high(&db, sold_out) > at_kill[1])
    });
    let (late, late_answers) = retry_lost(g.port, lossy, &lost, Duration::from_millis(500));
    assert_eq!(page(idle)["state"], "active");
    let idle_after = buy(g.port, idle, "i-after");
    let sold_out_after = buy(g.port, sold_out, "s-after");
    let paused = paused_sales(&db);
    let (code, out) = seckill_tests::reconciler(&set, &db, &review, &["run"]);
    let (_, listed) = seckill_tests::reconciler(&set, &db, &review, &["findings", "--json"]);
    let findings: serde_json::Value = serde_json::from_str(&listed).expect("JSON");
    let found: Vec<(String, String)> = findings
        .as_array()
        .expect("a list")
        .iter()
        .map(|f| (f["kind"].to_string(), f["sale_id"].to_string()))
        .collect();
    println!(
        "lossy failover: paused {paused:?} (lossy {lossy}, idle {idle}, sold out {sold_out}); \
         findings {found:?}; second ids while the watch was frozen {}, after {}; \
         answers {early_answers:?} then {late_answers:?}; idle sells: {}, sold out: {}",
        early.len(),
        late.len(),
        idle_after.status,
        sold_out_after.status
    );
    assert_eq!(early, Vec::<String>::new(), "buyers given a second id");
    assert_eq!(late, Vec::<String>::new(), "buyers given a second id");
    assert_eq!(paused, vec![lossy], "only the sale that lost purchases");
    assert_eq!(code, 1, "{out}");
    assert_eq!(
        found,
        vec![("\"redis_data_loss\"".to_string(), lossy.to_string())],
        "{listed}"
    );
    assert_eq!(idle_after.status, 202, "{idle_after:?}");
    assert_eq!(sold_out_after.status, 410, "{sold_out_after:?}");
    // The watch said so once for each sale that lost nothing.
    let log = w.log();
    let resumed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("checked on a new Redis master"))
        .collect();
    println!("{}", resumed.join("\n"));
    assert_eq!(resumed.len(), 2, "{resumed:?}");
    for sale in [idle, sold_out] {
        let said = format!("sale {sale}: checked on a new Redis master");
        assert!(resumed.iter().any(|l| l.contains(&said)), "{resumed:?}");
    }

    // The repair gives each lost buyer back their own id, one order each.
    let (code, out) = seckill_tests::reconciler(
        &set,
        &db,
        &review,
        &["sale", "repair", &lossy.to_string(), "--by", "tester"],
    );
    assert_eq!(code, 0, "{out}");
    for (u, rid) in &lost {
        let r = buy(g.port, lossy, u);
        assert_eq!(r.status, 409, "{u}: {r:?}");
        assert_eq!(r.json()["reservation_id"], rid.as_str(), "{u}");
    }
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM orders WHERE sale_id = {lossy}"
        )),
        150
    );
}
