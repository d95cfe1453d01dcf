//! Specifies the reconciler on sales of several units per buyer, with the
//! real binaries: `sale create`'s limits (in MySQL, in the Redis meta, in
//! `sale show` and `sale list`, and its refusals), a consistent sale of
//! N-unit orders reconciles clean, a lost flow record or a lost order is
//! reported in units, and a buyer whose orders in MySQL hold more than the
//! limit is a critical `buyer_over_limit`.

use crate::support::quantity::{self, meta, reserve, Terms};
use crate::support::worker::{wait_drained, wait_orders, Opts, WorkerProc};
use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_tests::{RedisServer, TempDir, TestDb};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(120);

#[test]
fn sale_create_records_the_limits_and_refuses_bad_ones() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let sale = quantity::create(&redis, &db, &file, &Terms::of(100));
    let l: Option<(u32, u32)> = db
        .conn()
        .exec_first(
            "SELECT per_user_limit, max_per_purchase FROM sales WHERE id = ?",
            (sale,),
        )
        .unwrap();
    assert_eq!(l, Some((4, 3)));
    assert_eq!(
        (
            meta(&redis, sale, "max_per_buyer"),
            meta(&redis, sale, "max_per_purchase")
        ),
        (4, 3)
    );
    let (code, show) =
        seckill_tests::reconciler(&redis, &db, &file, &["sale", "show", &sale.to_string()]);
    assert_eq!(code, 0, "{show}");
    assert!(
        show.contains("buyer/purchase    4/3          4/3\n"),
        "{show}"
    );
    let (_, list) = seckill_tests::reconciler(&redis, &db, &file, &["sale", "list"]);
    let words: Vec<&str> = list
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(&words[words.len() - 2..], ["4/3", "-"], "{list}");
    // A sale of one unit per buyer has no limit fields in its meta.
    let one = seckill_tests::create_windowed_sale(&redis, &db, &file, 5, "1m");
    assert_eq!(
        (
            meta(&redis, one, "max_per_buyer"),
            meta(&redis, one, "max_per_purchase")
        ),
        (-1, -1)
    );
    let create = |extra: &[&str]| quantity::sale_create(&redis, &db, &file, 9, extra);
    for (extra, says) in [
        (
            &["--max-per-buyer", "2", "--max-per-purchase", "3"][..],
            "--max-per-purchase 3 is above --max-per-buyer 2",
        ),
        (
            &["--max-per-buyer", "101"][..],
            "--max-per-buyer \"101\": expected an integer from 1 to 100",
        ),
        (
            &["--max-per-buyer", "0"][..],
            "--max-per-buyer \"0\": expected an integer from 1 to 100",
        ),
    ] {
        let (code, out) = create(extra);
        assert_eq!(code, 64, "{extra:?}: {out}");
        assert!(out.contains(says), "{extra:?}: {out}");
    }
    assert_eq!(db.count("SELECT COUNT(*) FROM sales"), 2);
    let (_, help) = seckill_tests::reconciler(&redis, &db, &file, &["sale", "create", "--help"]);
    assert!(
        help.contains("--max-per-buyer L") && help.contains("--max-per-purchase Q"),
        "{help}"
    );
}

/// A sale of 60 units sold as 3 + 1 to 5 buyers and 2 to 5 others
/// (30 units), applied by a real worker; returns it and the reservation ids.
fn sold(redis: &RedisServer, db: &TestDb, file: &std::path::Path) -> (u64, Vec<String>) {
    let sale = quantity::create(redis, db, file, &Terms::of(60));
    let mut rids = Vec::new();
    for i in 0..5 {
        rids.push(reserve(redis, sale, &format!("b{i}"), "k1", 3));
        rids.push(reserve(redis, sale, &format!("b{i}"), "k2", 1));
        rids.push(reserve(redis, sale, &format!("c{i}"), "k", 2));
    }
    let _w = WorkerProc::start(redis, db, "w1", &Opts::default());
    wait_orders(db, sale, 15, LONG);
    wait_drained(redis, sale, LONG);
    (sale, rids)
}

#[test]
fn a_consistent_sale_of_several_units_reconciles_clean_and_losses_count_units() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let (sale, rids) = sold(&redis, &db, &file);
    assert_eq!(quantity::findings(&redis, &db, &file), []);
    // A lost flow record (3 units): Redis stock + reservations is 3 short
    // of the total, and the order has no flow record.
    let k = SaleKeys::new(sale);
    let _: () = redis.con().hdel(k.flow(), &rids[0]).unwrap();
    let f = quantity::findings(&redis, &db, &file);
    let kinds: Vec<(&str, &str)> = f.iter().map(|f| (f.0.as_str(), f.1.as_str())).collect();
    assert_eq!(
        kinds,
        [
            ("order_without_flow", rids[0].as_str()),
            ("stock_mismatch", "redis_stock")
        ]
    );
    let (_, json) = seckill_tests::reconciler(&redis, &db, &file, &["findings", "--json"]);
    let v: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    let ev = |kind: &str| {
        v.as_array()
            .unwrap()
            .iter()
            .find(|f| f["kind"] == kind)
            .map(|f| f["evidence"].clone())
            .unwrap()
    };
    let should = &ev("order_without_flow")["redis_should_hold"];
    assert!(
        should[0]["value"]
            .as_str()
            .unwrap()
            .ends_with(",\"quantity\":3}"),
        "{should}"
    );
    assert_eq!(should[1]["value"], format!("{}:3", rids[0]));
    let s = ev("stock_mismatch");
    assert_eq!(
        (s["redis_stock"].as_i64(), s["redis_reservations"].as_i64()),
        (Some(30), Some(27))
    );
}

#[test]
fn a_lost_order_of_three_units_is_three_units_of_ledger_without_order() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let (_sale, rids) = sold(&redis, &db, &file);
    db.conn()
        .exec_drop("DELETE FROM orders WHERE reservation_id = ?", (&rids[0],))
        .unwrap();
    let f = quantity::findings(&redis, &db, &file);
    assert_eq!(
        f,
        [(
            "ledger_without_order".to_string(),
            rids[0].clone(),
            "critical".to_string()
        )]
    );
    let (_, json) = seckill_tests::reconciler(&redis, &db, &file, &["findings", "--json"]);
    let v: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(v[0]["evidence"]["ledger_row"]["delta"], -3, "{v}");
    // The re-created order holds the message's 3 units; the books balance.
    let id = v[0]["id"].as_i64().unwrap().to_string();
    let (code, out) = seckill_tests::reconciler(
        &redis,
        &db,
        &file,
        &["resolve", &id, "--recreate", "--by", "op"],
    );
    assert_eq!(code, 0, "{out}");
    let q: Option<(u32, bool)> = db
        .conn()
        .exec_first(
            "SELECT quantity, multi_unit FROM orders WHERE reservation_id = ?",
            (&rids[0],),
        )
        .unwrap();
    assert_eq!(q, Some((3, true)));
    let open: Vec<_> = quantity::findings(&redis, &db, &file)
        .into_iter()
        .filter(|f| f.0 != "ledger_without_order")
        .collect();
    assert_eq!(open, []);
}

#[test]
fn a_buyer_over_the_limit_in_mysql_is_critical() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let (sale, _) = sold(&redis, &db, &file);
    // c0 holds 2 units; a third reservation of 3 units takes them to 5 > 4
    // (what Redis's allowance check refuses, and the worker too: written
    // here by hand, its order in MySQL before a worker sees the message).
    let extra = reserve(&redis, sale, "c0", "k9", 3);
    let mut c = db.conn();
    c.exec_drop(
        "INSERT INTO orders (reservation_id, sale_id, user_id, quantity, multi_unit, status, \
         reserved_at) VALUES (?, ?, 'c0', 3, 1, 'confirmed', UTC_TIMESTAMP(3))",
        (&extra, sale),
    )
    .unwrap();
    c.exec_drop(
        "INSERT INTO stock_ledger (reservation_id, sale_id, user_id, delta, reason) \
         VALUES (?, ?, 'c0', -3, 'order')",
        (&extra, sale),
    )
    .unwrap();
    c.exec_drop(
        "UPDATE sales SET available_stock = available_stock - 3 WHERE id = ?",
        (sale,),
    )
    .unwrap();
    let _w = WorkerProc::start(&redis, &db, "w2", &Opts::default());
    wait_orders(&db, sale, 16, LONG);
    wait_drained(&redis, sale, LONG);
    let f = quantity::findings(&redis, &db, &file);
    assert_eq!(
        f,
        [(
            "buyer_over_limit".to_string(),
            "c0".to_string(),
            "critical".to_string()
        )]
    );
    let (_, json) = seckill_tests::reconciler(&redis, &db, &file, &["findings", "--json"]);
    let v: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    let ev = &v[0]["evidence"];
    assert_eq!(
        (ev["units"].as_i64(), ev["per_user_limit"].as_i64()),
        (Some(5), Some(4)),
        "{ev}"
    );
    assert_eq!(ev["orders"][1]["reservation_id"], extra.as_str());
    assert_eq!(ev["orders"][1]["quantity"], 3);
}

#[test]
fn sale_load_puts_the_limits_and_the_units_held_into_redis() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let mut c = db.conn();
    c.query_drop(
        "INSERT INTO sales (id, sku, total_stock, available_stock, starts_at, ends_at,
                            per_user_limit, max_per_purchase)
         VALUES (900, 'LOAD', 10, 7, UTC_TIMESTAMP(3), UTC_TIMESTAMP(3) + INTERVAL 1 HOUR, 4, 2)",
    )
    .unwrap();
    c.query_drop(
        "INSERT INTO orders (reservation_id, sale_id, user_id, quantity, multi_unit, status)
         VALUES ('00000000000000000000000000000abc', 900, 'a', 3, 1, 'confirmed')",
    )
    .unwrap();
    // The same sale as 901, loaded split over 2 buckets: each bucket
    // gets its share of the units on sale and the limits.
    c.query_drop(
        "INSERT INTO sales (id, sku, total_stock, available_stock, starts_at, ends_at,
                            per_user_limit, max_per_purchase)
         VALUES (901, 'LOAD2', 10, 7, UTC_TIMESTAMP(3), UTC_TIMESTAMP(3) + INTERVAL 1 HOUR, 4, 2)",
    )
    .unwrap();
    c.query_drop(
        "INSERT INTO orders (reservation_id, sale_id, user_id, quantity, multi_unit, status)
         VALUES ('00000000000000000000000000000abd', 901, 'a', 3, 1, 'confirmed')",
    )
    .unwrap();
    let (code, out) = seckill_tests::reconciler(
        &redis,
        &db,
        &file,
        &["sale", "load", "901", "--shards", "2"],
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("with stock 7 (10 total, 3 already ordered), in 2 buckets"),
        "{out}"
    );
    let mut con = redis.con();
    for (b, stock) in [(0, 4), (1, 3)] {
        let k = SaleKeys::bucket(901, b);
        let s: i64 = con.get(k.stock()).unwrap();
        let limits: (u32, u32) = redis::cmd("HMGET")
            .arg(k.meta())
            .arg("max_per_buyer")
            .arg("max_per_purchase")
            .query(&mut con)
            .unwrap();
        assert_eq!((s, limits), (stock, (4, 2)), "bucket {b}");
    }
    let (code, out) = seckill_tests::reconciler(&redis, &db, &file, &["sale", "load", "900"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("with stock 7 (10 total, 3 already ordered)"),
        "{out}"
    );
    assert_eq!(quantity::redis_stock(&redis, 900), 7);
    assert_eq!(
        (
            meta(&redis, 900, "max_per_buyer"),
            meta(&redis, 900, "max_per_purchase")
        ),
        (4, 2)
    );
}

#[test]
fn a_repair_rebuilds_the_buyers_lists_in_units() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let t = Terms {
        window: Some("1h"),
        ..Terms::of(40)
    };
    let sale = quantity::create(&redis, &db, &file, &t);
    let ra1 = reserve(&redis, sale, "a", "k1", 3);
    let ra2 = reserve(&redis, sale, "a", "k2", 1);
    let rb = reserve(&redis, sale, "b", "k1", 2);
    let rc = reserve(&redis, sale, "c", "k1", 3);
    let w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    wait_orders(&db, sale, 4, LONG);
    db.conn()
        .exec_drop(
            "UPDATE orders SET pay_by = UTC_TIMESTAMP(3) - INTERVAL 1 SECOND WHERE reservation_id = ?",
            (&rc,),
        )
        .unwrap();
    seckill_tests::wait_until(LONG, "c's 3 units back in Redis", || {
        quantity::redis_stock(&redis, sale) == 34
    });
    drop(w);
    // Redis loses the reservations' keys; then b reserves 3 more units
    // (5 > 4: their list was lost) and d 2 units, neither applied yet.
    let k = SaleKeys::new(sale);
    for key in [k.flow(), k.buyers(), k.status(), k.released(), k.pay_by()] {
        let _: () = redis.con().del(key).unwrap();
    }
    let rb2 = reserve(&redis, sale, "b", "k2", 3);
    let rd = reserve(&redis, sale, "d", "k1", 2);
    let (code, out) = seckill_tests::reconciler(&redis, &db, &file, &["run"]);
    assert_eq!(code, 1, "{out}");
    let paused: bool = redis.con().hexists(k.meta(), "paused").unwrap();
    assert!(paused, "the run paused the sale");
    let (code, out) = seckill_tests::reconciler(
        &redis,
        &db,
        &file,
        &["sale", "repair", &sale.to_string(), "--by", "tester"],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("1 duplicate reservations released"), "{out}");
    // Held: a 3 + 1 and b 2 (orders), d 2 (in flight): 8 units.
    assert_eq!(quantity::redis_stock(&redis, sale), 32);
    let held = |u: &str| quantity::held(&redis, sale, u);
    assert_eq!(held("a"), Some(format!("{ra1}:3,{ra2}:1")));
    assert_eq!(held("b"), Some(format!("{rb}:2")));
    assert_eq!(
        held("c"),
        Some(format!("{rc}:3")),
        "kept: no --rebuy-after-release"
    );
    assert_eq!(held("d"), Some(format!("{rd}:2")));
    let st: std::collections::HashMap<String, String> = redis.con().hgetall(k.status()).unwrap();
    assert_eq!((st[&rb2].as_str(), st[&rc].as_str()), ("failed", "expired"));
    assert_eq!(
        (
            meta(&redis, sale, "max_per_buyer"),
            meta(&redis, sale, "max_per_purchase")
        ),
        (4, 3)
    );
    // d's message becomes an order; the books hold 8 units.
    let _w = WorkerProc::start(&redis, &db, "w2", &Opts::default());
    wait_orders(&db, sale, 5, LONG);
    wait_drained(&redis, sale, LONG);
    assert_eq!(quantity::books(&db, sale), (4, 8, 8, 32));
}

#[test]
fn an_order_of_three_units_without_its_deduction_is_compensated_by_three() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let (sale, rids) = sold(&redis, &db, &file);
    // The order's deduction never happened: no ledger row, the 3 units
    // still in available_stock.
    let mut c = db.conn();
    c.exec_drop(
        "DELETE FROM stock_ledger WHERE reservation_id = ?",
        (&rids[0],),
    )
    .unwrap();
    c.exec_drop(
        "UPDATE sales SET available_stock = available_stock + 3 WHERE id = ?",
        (sale,),
    )
    .unwrap();
    assert_eq!(quantity::books(&db, sale), (15, 30, 27, 33));
    let f = quantity::findings(&redis, &db, &file);
    assert_eq!(
        f,
        [(
            "order_without_ledger".to_string(),
            rids[0].clone(),
            "normal".to_string()
        )]
    );
    let (_, json) = seckill_tests::reconciler(
        &redis,
        &db,
        &file,
        &["findings", "--state", "all", "--json"],
    );
    let v: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(v[0]["state"], "auto_fixed", "{v}");
    let fix = v[0]["fix"].as_str().unwrap_or_default();
    assert!(fix.contains("delta -3); available_stock 33 -> 30"), "{fix}");
    assert_eq!(quantity::books(&db, sale), (15, 30, 30, 30));
}

/// The open `ledger_without_order` finding of reservation `rid`: its id.
fn ledger_finding(redis: &RedisServer, db: &TestDb, file: &std::path::Path, rid: &str) -> String {
    let (_, json) = seckill_tests::reconciler(redis, db, file, &["findings", "--json"]);
    let v: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    let f = v
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "ledger_without_order" && f["subject"] == rid)
        .unwrap_or_else(|| panic!("no ledger_without_order of {rid}: {json}"));
    f["id"].as_i64().unwrap().to_string()
}

/// `resolve --recreate` in a sale of several units per buyer (4): a buyer
/// whose user id is b0's first reservation id (the live key of b0's
/// multi-unit order) holds nothing by that, so their lost order of 2 is
/// re-created; c0, whose lost order held 2 units and who holds 3 more
/// since, gets no re-created order (5 > 4), refused naming the figures.
#[test]
fn recreate_counts_a_buyers_units_not_a_look_alike_live_key() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let (sale, rids) = sold(&redis, &db, &file);
    let lost = |rid: &str| {
        db.conn()
            .exec_drop("DELETE FROM orders WHERE reservation_id = ?", (rid,))
            .unwrap();
    };
    lost(&rids[2]);
    let twin = reserve(&redis, sale, &rids[0], "k", 2);
    let more = reserve(&redis, sale, "c0", "k9", 3);
    let _w = WorkerProc::start(&redis, &db, "w2", &Opts::default());
    wait_orders(&db, sale, 16, LONG);
    wait_drained(&redis, sale, LONG);
    assert_eq!(
        quantity::num(
            &db,
            &format!("SELECT COUNT(*) FROM orders WHERE reservation_id = '{more}'")
        ),
        1
    );
    lost(&twin);
    let f = quantity::findings(&redis, &db, &file);
    let mut want = vec![
        (
            "ledger_without_order".to_string(),
            rids[2].clone(),
            "critical".to_string(),
        ),
        (
            "ledger_without_order".to_string(),
            twin.clone(),
            "critical".to_string(),
        ),
    ];
    want.sort();
    assert_eq!(f, want);
    let id = ledger_finding(&redis, &db, &file, &twin);
    let (code, out) = seckill_tests::reconciler(
        &redis,
        &db,
        &file,
        &["resolve", &id, "--recreate", "--by", "op"],
    );
    assert_eq!(code, 0, "{out}");
    let q: Option<(String, u32, bool)> = db
        .conn()
        .exec_first(
            "SELECT user_id, quantity, multi_unit FROM orders WHERE reservation_id = ?",
            (&twin,),
        )
        .unwrap();
    assert_eq!(q, Some((rids[0].clone(), 2, true)));
    let id = ledger_finding(&redis, &db, &file, &rids[2]);
    let (code, out) = seckill_tests::reconciler(
        &redis,
        &db,
        &file,
        &["resolve", &id, "--recreate", "--by", "op"],
    );
    assert_eq!(code, 1, "{out}");
    let why = format!(
        "buyer c0 holds 3 unit(s) of sale {sale} in MySQL; the order of {} would add 2, over \
         its limit of 4 per buyer; settle by hand",
        rids[2]
    );
    assert!(out.contains(&why), "{out}");
    assert_eq!(
        quantity::num(
            &db,
            &format!(
                "SELECT COUNT(*) FROM orders WHERE reservation_id = '{}'",
                rids[2]
            )
        ),
        0
    );
}
