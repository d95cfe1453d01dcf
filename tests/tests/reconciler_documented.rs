//! Specifies documented reconciler behaviours no other test exercises:
//! `resolve` of an unknown finding, `findings --sale` and each
//! `--state`, `run` exiting 2 (with a `failed` run recorded) when MySQL
//! cannot be reached or when the review file is newer than the build, a
//! missing ledger row left open when the books do not balance, a finding
//! closed as `no_longer_observed`, and the run lock (wait, then exit 2).

use crate::support::reconciler as support;

use redis::Commands;
use seckill_common::keys::SaleKeys;
use support::World;

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn resolve_of_an_unknown_finding_exits_2_and_changes_nothing() {
    let w = World::new(5);
    assert_eq!(w.run(), 0);
    let out = w.cmd("0s", &["resolve", "999", "--dismiss", "--by", "alice"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no finding 999"), "{err}");
    assert_eq!(w.review_count("SELECT COUNT(*) FROM actions"), 0);
}

#[test]
fn findings_filters_by_sale_and_by_each_state() {
    let w = World::new(5);
    let rids = w.reserve(&["u1", "u2"]);
    // Two flow records with no order and no message on its way.
    let k = SaleKeys::new(w.sale);
    let mut con = w.redis.con();
    let _: () = con.del(k.queue()).unwrap();
    assert_eq!(w.run(), 1);
    let json = |args: &[&str]| -> Vec<serde_json::Value> {
        let out = w.cmd("0s", args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        serde_json::from_str(&stdout(&out)).unwrap()
    };
    let sale = w.sale.to_string();
    assert_eq!(json(&["findings", "--json"]).len(), 2);
    assert_eq!(json(&["findings", "--sale", &sale, "--json"]).len(), 2);
    assert_eq!(json(&["findings", "--sale", "999999", "--json"]).len(), 0);
    assert_eq!(json(&["findings", "--state", "open", "--json"]).len(), 2);
    assert_eq!(
        json(&["findings", "--state", "resolved", "--json"]).len(),
        0
    );
    assert_eq!(
        json(&["findings", "--state", "auto_fixed", "--json"]).len(),
        0
    );
    // One dismissed: open 1, resolved 1, all 2.
    let first = &json(&["findings", "--json"])[0];
    let id = first["id"].as_i64().unwrap().to_string();
    let out = w.cmd("0s", &["resolve", &id, "--dismiss", "--by", "alice"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(json(&["findings", "--state", "open", "--json"]).len(), 1);
    assert_eq!(
        json(&["findings", "--state", "resolved", "--json"]).len(),
        1
    );
    assert_eq!(json(&["findings", "--state", "all", "--json"]).len(), 2);
    let subjects: Vec<String> = json(&["findings", "--state", "all", "--json"])
        .iter()
        .map(|f| f["subject"].as_str().unwrap().to_string())
        .collect();
    let mut want = rids.clone();
    want.sort();
    let mut got = subjects;
    got.sort();
    assert_eq!(got, want);
}

#[test]
fn run_exits_2_and_records_a_failed_run_when_mysql_is_unreachable() {
    let w = World::new(5);
    assert_eq!(w.run(), 0);
    let out = seckill_tests::command("seckill-reconciler")
        .arg("run")
        .env("SECKILL_REDIS_URL", w.redis.url())
        .env("SECKILL_REVIEW_DB", w.review_path())
        .env("SECKILL_MYSQL_TIMEOUT", "1s")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("failed: mysql"), "{err}");
    assert_eq!(
        w.review_count("SELECT COUNT(*) FROM runs WHERE outcome = 'failed'"),
        1
    );
    assert_eq!(w.review_count("SELECT COUNT(*) FROM runs"), 2);
}

#[test]
fn a_missing_ledger_row_stays_open_when_the_books_do_not_balance() {
    let w = World::new(5);
    let rids = w.reserve(&["u1", "u2"]);
    w.apply(&rids);
    // The ledger row goes and available_stock is not given back: the books
    // say 5 − 1 ≠ 3, so the missing row may be a lost row of a decrement
    // that did happen, and compensating would deduct twice.
    w.sql(&format!(
        "DELETE FROM stock_ledger WHERE reservation_id = '{}'",
        rids[0]
    ));
    assert_eq!(w.run(), 1);
    let mut keys = w.finding_keys();
    keys.sort();
    assert_eq!(
        keys,
        vec![
            (
                "order_without_ledger".into(),
                rids[0].clone(),
                "open".into()
            ),
            ("stock_mismatch".into(), "mysql_books".into(), "open".into()),
        ]
    );
    let f = w.findings();
    let open = f
        .iter()
        .find(|f| f["kind"] == "order_without_ledger")
        .unwrap();
    assert_eq!(
        open["evidence"]["not_fixed"],
        "the MySQL books do not balance; a deduction may exist without its ledger row"
    );
    assert_eq!(
        w.sql("SELECT COUNT(*) FROM stock_ledger WHERE reason = 'compensation'"),
        0
    );
    assert_eq!(
        w.sql("SELECT available_stock FROM sales WHERE id = {sale}"),
        3
    );
    assert_eq!(w.review_count("SELECT COUNT(*) FROM actions"), 0);
}

#[test]
fn a_finding_no_longer_observed_is_closed_by_the_reconciler_with_one_row() {
    let w = World::new(5);
    let rids = w.reserve(&["u1"]);
    w.apply(&rids);
    w.sql("UPDATE sales SET available_stock = 1 WHERE id = {sale}");
    assert_eq!(w.run(), 1);
    assert_eq!(
        w.finding_keys(),
        vec![("stock_mismatch".into(), "mysql_books".into(), "open".into())]
    );
    // Someone puts it right outside the tool.
    w.sql("UPDATE sales SET available_stock = 4 WHERE id = {sale}");
    assert_eq!(w.run(), 0);
    let f = &w.findings()[0];
    assert_eq!(f["state"], "resolved");
    assert_eq!(f["resolution"], "no_longer_observed");
    assert_eq!(f["resolved_by"], "reconciler");
    assert_eq!(
        w.review_count(
            "SELECT COUNT(*) FROM actions WHERE action = 'close' AND result = 'done' \
             AND actor = 'reconciler'"
        ),
        1
    );
    assert_eq!(w.review_count("SELECT COUNT(*) FROM actions"), 1);
    // A third run changes nothing.
    assert_eq!(w.run(), 0);
    assert_eq!(w.review_count("SELECT COUNT(*) FROM actions"), 1);
}

#[test]
fn a_second_run_waits_for_the_lock_and_gives_up_with_exit_2() {
    let w = World::new(5);
    let mut con = w.redis.con();
    let lock = seckill_common::keys::RECONCILE_LOCK;
    // A holder whose lock expires after 2 s: the run waits, then runs.
    let _: () = redis::cmd("SET")
        .arg(lock)
        .arg("other-host:1:token")
        .arg("PX")
        .arg(2000)
        .query(&mut con)
        .unwrap();
    let started = std::time::Instant::now();
    assert_eq!(w.run(), 0);
    assert!(started.elapsed() >= std::time::Duration::from_millis(1500));
    assert_eq!(w.review_count("SELECT COUNT(*) FROM runs"), 1);
    // A holder that keeps it: the run gives up after its wait (45 s).
    let _: () = redis::cmd("SET")
        .arg(lock)
        .arg("other-host:2:token")
        .query(&mut con)
        .unwrap();
    let out = w.cmd("0s", &["run"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("another run holds {lock} (other-host:2:token)")),
        "{err}"
    );
    // It is recorded as a failed run, and left the holder's lock alone.
    assert_eq!(w.review_count("SELECT COUNT(*) FROM runs"), 2);
    assert_eq!(
        w.review_count(
            "SELECT COUNT(*) FROM runs WHERE outcome = 'failed' \
             AND error LIKE '%another run holds%'"
        ),
        1
    );
    let holder: String = con.get(lock).unwrap();
    assert_eq!(holder, "other-host:2:token");
}

#[test]
fn run_exits_2_when_the_review_file_is_from_a_newer_build() {
    let w = World::new(5);
    assert_eq!(w.run(), 0);
    let c = rusqlite::Connection::open(w.review_path()).unwrap();
    c.execute_batch("PRAGMA user_version = 99").unwrap();
    drop(c);
    let out = w.cmd("0s", &["run"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("schema version 99 is newer than this build"),
        "{err}"
    );
    let c = rusqlite::Connection::open(w.review_path()).unwrap();
    let runs: i64 = c
        .query_row("SELECT COUNT(*) FROM runs", [], |r| r.get(0))
        .unwrap();
    assert_eq!(runs, 1);
}
