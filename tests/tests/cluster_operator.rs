//! Specifies the operator's `sale` commands and a reconciliation run on a
//! real Redis Cluster, through the real `seckill-reconciler` binary: `sale
//! create` writes MySQL and the sale's slot (and `seckill:sales`, in its own
//! slot), `sale load` changes nothing live, `sale show` reads both sides,
//! and `run` (scans, run lock, dead-letter review) finds nothing.

use redis::Commands;
use seckill_common::keys::{self, SaleKeys};
use seckill_common::reservation::{reserve, ReserveOutcome};
use seckill_tests::cluster::{RedisCluster, TestRedis};
use seckill_tests::{TempDir, TestDb};

#[test]
fn on_a_redis_cluster_sale_create_load_show_and_a_clean_run() {
    let db = TestDb::create();
    let cluster = RedisCluster::start();
    let review = TempDir::new();
    let review = review.path().join("review.sqlite3");
    let run = |args: &[&str]| seckill_tests::reconciler(&cluster, &db, &review, args);
    let (code, out) = run(&[
        "sale",
        "create",
        "--sku",
        "PHONE-1",
        "--stock",
        "3",
        "--starts-at",
        "now",
        "--ends-at",
        "now+1h",
        "--price-cents",
        "49900",
        "--title",
        "Phone",
    ]);
    assert_eq!(code, 0, "{out}");
    let id: u64 = out.lines().next().unwrap().trim().parse().unwrap();
    let mut con = cluster.target_con();
    let k = SaleKeys::new(id);
    assert_eq!(con.get::<_, i64>(k.stock()).unwrap(), 3);
    assert!(con.sismember::<_, _, bool>(keys::SALES, id).unwrap());
    assert!(matches!(
        reserve(&mut con, id, "u1").unwrap(),
        ReserveOutcome::Reserved(_)
    ));

    // A load of a live sale changes nothing.
    let (code, out) = run(&["sale", "load", &id.to_string()]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(con.get::<_, i64>(k.stock()).unwrap(), 2);

    let (code, out) = run(&["sale", "show", &id.to_string()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("total stock       3            3"), "{out}");
    assert!(out.contains("reservations      -            1"), "{out}");

    // The reservation is not an order yet (no worker runs): within the
    // grace period that is no finding; the run takes and frees its lock.
    let out = seckill_tests::command("seckill-reconciler")
        .env("SECKILL_REDIS_URL", cluster.url())
        .env("SECKILL_MYSQL_URL", db.url())
        .env("SECKILL_REVIEW_DB", &review)
        .arg("run")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(!con.exists::<_, bool>(keys::RECONCILE_LOCK).unwrap());
}
