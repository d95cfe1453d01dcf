//! Specifies `seckill-reconciler run` on real Redis, MariaDB and SQLite: a
//! clean sale gives no finding; each kind of discrepancy injected by hand
//! gives exactly that finding, recorded once however often it is seen; an
//! order without a ledger row is compensated exactly once, even by two
//! concurrent runs; reservations on their way are never reported.

use crate::support::reconciler as support;

use redis::Commands;
use seckill_common::dead_letter::DeadLetter;
use seckill_common::keys::SaleKeys;
use support::World;

fn key(kind: &str, subject: &str, state: &str) -> (String, String, String) {
    (kind.into(), subject.into(), state.into())
}

/// A sale of 10 with 4 reservations, all turned into orders.
fn four_orders() -> (World, Vec<String>) {
    let w = World::new(10);
    let rids = w.reserve(&["u1", "u2", "u3", "u4"]);
    w.apply(&rids);
    (w, rids)
}

#[test]
fn a_clean_sale_gives_no_finding_and_exit_0() {
    let (w, _) = four_orders();
    assert_eq!(w.run(), 0);
    assert!(w.findings().is_empty());
    assert_eq!(
        w.review_count("SELECT COUNT(*) FROM runs WHERE outcome = 'clean'"),
        1
    );
    assert_eq!(w.review_count("SELECT sales_checked FROM runs"), 1);
    let mode = std::fs::metadata(w.review_path()).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(mode.permissions().mode() & 0o777, 0o600);
}

/// The order is deleted, its ledger row and deduction stay: the unit is
/// MySQL's `ledger_without_order` (critical), not a `flow_without_order`,
/// whose fixes (a reorder, a rollback) do not apply to it.
#[test]
fn a_deleted_order_gives_ledger_without_order_once() {
    let (w, rids) = four_orders();
    w.sql(&format!(
        "DELETE FROM orders WHERE reservation_id = '{}'",
        rids[1]
    ));
    assert_eq!(w.run(), 1);
    assert_eq!(
        w.finding_keys(),
        vec![key("ledger_without_order", &rids[1], "open")]
    );
    assert_eq!(w.run(), 1);
    assert_eq!(
        w.finding_keys(),
        vec![key("ledger_without_order", &rids[1], "open")]
    );
    assert_eq!(w.review_count("SELECT times_seen FROM findings"), 2);
    assert_eq!(
        w.review_count("SELECT new_findings FROM runs WHERE id = 2"),
        0
    );
    let f = &w.findings()[0];
    assert_eq!(f["user_id"], "u2");
    assert_eq!(f["evidence"]["status"], "confirmed");
    assert_eq!(f["severity"], "critical");
}

#[test]
fn a_missing_ledger_row_is_compensated_exactly_once() {
    let (w, rids) = four_orders();
    // The deduction never happened: no ledger row, stock not decremented.
    w.sql(&format!(
        "DELETE FROM stock_ledger WHERE reservation_id = '{}'",
        rids[2]
    ));
    w.sql("UPDATE sales SET available_stock = available_stock + 1 WHERE id = {sale}");
    assert_eq!(
        w.sql("SELECT available_stock FROM sales WHERE id = {sale}"),
        7
    );
    assert_eq!(w.run(), 0);
    assert_eq!(
        w.finding_keys(),
        vec![key("order_without_ledger", &rids[2], "auto_fixed")]
    );
    assert_eq!(
        w.sql("SELECT available_stock FROM sales WHERE id = {sale}"),
        6
    );
    let comp = format!(
        "SELECT COUNT(*) FROM stock_ledger WHERE reservation_id = '{}' AND reason = 'compensation' AND delta = -1",
        rids[2]
    );
    assert_eq!(w.sql(&comp), 1);
    assert_eq!(
        w.review_count(
            "SELECT COUNT(*) FROM actions WHERE action = 'compensate' AND actor = 'reconciler'"
        ),
        1
    );
    // A second run finds nothing new and changes nothing.
    assert_eq!(w.run(), 0);
    assert_eq!(
        w.finding_keys(),
        vec![key("order_without_ledger", &rids[2], "auto_fixed")]
    );
    assert_eq!(w.sql(&comp), 1);
    assert_eq!(
        w.sql("SELECT available_stock FROM sales WHERE id = {sale}"),
        6
    );
    assert_eq!(w.review_count("SELECT COUNT(*) FROM actions"), 1);
}

#[test]
fn a_lost_flow_record_gives_order_without_flow_with_what_redis_should_hold() {
    let (w, rids) = four_orders();
    // Redis rewound past the reservation: flow record and mark gone, unit back.
    let k = SaleKeys::new(w.sale);
    let mut con = w.redis.con();
    let _: i64 = con.hdel(k.flow(), &rids[0]).unwrap();
    let _: i64 = con.hdel(k.buyers(), "u1").unwrap();
    let _: i64 = con.incr(k.stock(), 1).unwrap();
    assert_eq!(w.run(), 1);
    assert_eq!(
        w.finding_keys(),
        vec![key("order_without_flow", &rids[0], "open")]
    );
    let f = &w.findings()[0];
    let should = &f["evidence"]["redis_should_hold"][0];
    assert_eq!(should["key"], k.flow());
    let value: serde_json::Value = serde_json::from_str(should["value"].as_str().unwrap()).unwrap();
    assert_eq!(value["user_id"], "u1");
    assert_eq!(value["reservation_id"], rids[0].as_str());
    assert_eq!(value["sale_id"], w.sale);
    assert!(f["order_id"].as_i64().unwrap() > 0);
}

#[test]
fn a_dead_letter_entry_gives_a_dead_letter_finding_with_the_reason() {
    let (w, _) = four_orders();
    let entry = DeadLetter {
        message: "not json".into(),
        reason: "malformed order message: expected value".into(),
        attempts: 0,
        worker: "w1".into(),
        at_ms: 1,
        reservation_id: None,
    };
    let _: i64 = w
        .redis
        .con()
        .lpush(SaleKeys::new(w.sale).dead_letter(), entry.to_json())
        .unwrap();
    assert_eq!(w.run(), 1);
    let f = w.findings();
    assert_eq!(f.len(), 1);
    assert_eq!(f[0]["kind"], "dead_letter");
    assert_eq!(f[0]["evidence"]["reason"], entry.reason);
    assert_eq!(w.run(), 1);
    assert_eq!(w.findings().len(), 1);
}

#[test]
fn a_wrong_available_stock_gives_one_stock_mismatch() {
    let (w, _) = four_orders();
    w.sql("UPDATE sales SET available_stock = 9 WHERE id = {sale}");
    assert_eq!(w.run(), 1);
    assert_eq!(
        w.finding_keys(),
        vec![key("stock_mismatch", "mysql_books", "open")]
    );
    assert_eq!(w.findings()[0]["evidence"]["difference"], -3);
    // Put right outside the tool: the next run closes it as no longer observed.
    w.sql("UPDATE sales SET available_stock = 6 WHERE id = {sale}");
    assert_eq!(w.run(), 0);
    assert_eq!(
        w.finding_keys(),
        vec![key("stock_mismatch", "mysql_books", "resolved")]
    );
}

#[test]
fn reservations_on_their_way_or_within_the_grace_period_are_not_findings() {
    let w = World::new(10);
    let rids = w.reserve(&["u1", "u2", "u3"]);
    w.apply(&rids[..2]);
    // Still queued (no worker running): not a finding even with no grace.
    assert_eq!(w.run(), 0);
    assert!(w.findings().is_empty());
    // Lost on its way, but younger than the default 60 s grace period.
    w.lose_message(&rids[2]);
    let out = w.cmd("60s", &["run"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(w.findings().is_empty());
    // Without the grace period it is reported.
    assert_eq!(w.run(), 1);
    assert_eq!(
        w.finding_keys(),
        vec![key("flow_without_order", &rids[2], "open")]
    );
}

#[test]
fn two_concurrent_runs_compensate_exactly_once() {
    let (w, rids) = four_orders();
    w.sql(&format!(
        "DELETE FROM stock_ledger WHERE reservation_id = '{}'",
        rids[3]
    ));
    w.sql("UPDATE sales SET available_stock = available_stock + 1 WHERE id = {sale}");
    let codes: Vec<i32> = std::thread::scope(|s| {
        let a = s.spawn(|| w.run());
        let b = s.spawn(|| w.run());
        vec![a.join().unwrap(), b.join().unwrap()]
    });
    assert_eq!(codes, vec![0, 0]);
    assert_eq!(
        w.sql("SELECT COUNT(*) FROM stock_ledger WHERE reason = 'compensation'"),
        1
    );
    assert_eq!(
        w.sql("SELECT available_stock FROM sales WHERE id = {sale}"),
        6
    );
    assert_eq!(
        w.finding_keys(),
        vec![key("order_without_ledger", &rids[3], "auto_fixed")]
    );
    assert_eq!(w.review_count("SELECT COUNT(*) FROM actions"), 1);
}

#[test]
fn more_orders_than_stock_is_a_critical_oversell() {
    let w = World::new(2);
    let rids = w.reserve(&["u1", "u2"]);
    w.apply(&rids);
    // An order written around the gateway, for a unit that does not exist.
    w.sql(
        "INSERT INTO orders (reservation_id, sale_id, user_id, status)
         VALUES ('ffffffffffffffffffffffffffffffff', {sale}, 'intruder', 'confirmed')",
    );
    assert_eq!(w.run(), 1);
    let intruder = "ffffffffffffffffffffffffffffffff";
    let mut keys = w.finding_keys();
    keys.sort();
    let mut expected = vec![
        key("stock_mismatch", "oversell", "open"),
        key("order_without_flow", intruder, "open"),
        key("order_without_ledger", intruder, "open"),
    ];
    expected.sort();
    assert_eq!(keys, expected);
    let f = w.findings();
    let no_ledger = f
        .iter()
        .find(|f| f["kind"] == "order_without_ledger")
        .unwrap();
    assert_eq!(
        no_ledger["evidence"]["not_fixed"],
        "no Redis flow record to cross-check against"
    );
    let oversell = f.iter().find(|f| f["subject"] == "oversell").unwrap();
    assert_eq!(oversell["severity"], "critical");
}

#[test]
fn redis_losing_all_its_data_shows_every_order_without_flow_and_a_mismatch() {
    let (w, rids) = four_orders();
    let _: () = redis::cmd("FLUSHALL").query(&mut w.redis.con()).unwrap();
    assert_eq!(w.run(), 1);
    let mut expected: Vec<_> = rids
        .iter()
        .map(|r| key("order_without_flow", r, "open"))
        .collect();
    expected.push(key("stock_mismatch", "redis_stock", "open"));
    let mut got = w.finding_keys();
    got.sort();
    expected.sort();
    assert_eq!(got, expected);
}

#[test]
fn a_reservation_in_a_workers_processing_list_is_not_a_finding() {
    let w = World::new(10);
    let rids = w.reserve(&["u1", "u2"]);
    w.apply(&rids[..1]);
    // A worker has taken the second message and not yet committed it.
    let k = SaleKeys::new(w.sale);
    let mut con = w.redis.con();
    let raw: String = con.rpop(k.queue(), None).unwrap();
    let _: i64 = con.sadd(seckill_common::keys::WORKERS, "w7").unwrap();
    let _: i64 = con.lpush(k.processing("w7"), &raw).unwrap();
    assert!(raw.contains(&rids[1]));
    assert_eq!(w.run(), 0);
    assert!(w.finding_keys().is_empty());
}
