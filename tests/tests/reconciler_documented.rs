//! Specifies documented reconciler behaviours no other test exercised
//! (issue 17): `resolve` of an unknown finding, `findings --sale` and each
//! `--state`, and `run` exiting 2 (with a `failed` run recorded) when MySQL
//! cannot be reached.

#[path = "reconciler_support.rs"]
mod support;
#[path = "worker_support.rs"]
mod worker_support;

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
