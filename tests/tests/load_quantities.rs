//! Specifies several units per purchase end to end with the real binaries:
//! a sale of 100 units with at most 4 units per buyer and 3 per purchase
//! (`sale create --max-per-buyer 4 --max-per-purchase 3`), 2,000 buyers
//! each asking 1, 2 or 3 units at random with an `Idempotency-Key`, half of
//! them sending the same purchase again with the same key and a quarter
//! buying again with a new key (`seckill-load --quantities 1:1:1
//! --retry-same-key 0.5 --duplicates 0.25`): exactly 100 units sold, every
//! buyer at most 4 units in the answers, Redis and MySQL, every same-key
//! retry answered with its purchase's reservation id, orders and ledger in
//! units equal to the reservations, the stock never below 0 (a poller
//! reads it every millisecond) and nothing for the reconciler to find.

use crate::support::gateway::Gateway;
use crate::support::quantity::{self, Terms};
use crate::support::worker::{Opts, WorkerProc};
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_tests::{load_report, RedisServer, TempDir, TestDb};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The lowest value the sale's stock counter took while `selling` held,
/// read every millisecond on a connection of its own.
fn stock_poller(
    redis: &RedisServer,
    sale: u64,
    selling: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(i64, u64)> {
    let mut con = redis.con();
    std::thread::spawn(move || {
        let key = SaleKeys::new(sale).stock();
        let (mut lowest, mut reads) = (i64::MAX, 0u64);
        while selling.load(Ordering::Acquire) {
            if let Ok(Some(v)) = con.get::<_, Option<i64>>(&key) {
                lowest = lowest.min(v);
                reads += 1;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        (lowest, reads)
    })
}

#[test]
fn a_quantity_mix_of_2000_buyers_sells_exactly_100_units_within_the_limit() {
    let _crowd = crate::support::crowd();
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let review_db = review.path().join("review.sqlite3");
    let sale = quantity::create(&redis, &db, &review_db, &Terms::of(100));
    let gw = Gateway::start(&redis, crate::support::gateway::PATIENT);
    let _w = WorkerProc::start(&redis, &db, "qty-w1", &Opts::default());
    let selling = Arc::new(AtomicBool::new(true));
    let poller = stock_poller(&redis, sale, selling.clone());
    let out = seckill_tests::command("seckill-load")
        .args(["--sale", &sale.to_string()])
        .args(["--url", &format!("http://127.0.0.1:{}", gw.port)])
        .arg("--key")
        .arg(seckill_tests::auth::signing_key_file())
        .args(["--users", "2000", "--connections", "16", "--seed", "31"])
        .args([
            "--quantities",
            "1:1:1",
            "--retry-same-key",
            "0.5",
            "--duplicates",
            "0.25",
        ])
        .args(["--hostile", "0", "--user-prefix", "qty", "--json"])
        .args(["--drain-timeout", "60s", "--timeout", "60s"])
        .env("SECKILL_REDIS_URL", redis.url())
        .env("SECKILL_MYSQL_URL", db.url())
        .output()
        .expect("run seckill-load");
    selling.store(false, Ordering::Release);
    let (lowest, reads) = poller.join().expect("the poller");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_str(&stdout).expect("a JSON report");
    assert_eq!(load_report::verdicts(&r), load_report::expected_units(&[]));
    let u = &r["units"];
    let figures: Vec<Option<u64>> = [
        "max_per_buyer",
        "max_per_purchase",
        "units_accepted",
        "retries",
        "retries_mismatched",
    ]
    .iter()
    .map(|k| u[k].as_u64())
    .collect();
    assert_eq!(figures, [Some(4), Some(3), Some(100), Some(1000), Some(0)]);
    assert!(
        reads > 0 && lowest >= 0,
        "stock read {reads} times, lowest {lowest}"
    );
    // The same figures read here, not only by the simulator.
    let q = |sql: &str| db.count(&sql.replace("SALE", &sale.to_string()));
    assert_eq!(
        q("SELECT SUM(quantity) FROM orders WHERE sale_id = SALE"),
        100
    );
    assert_eq!(
        q("SELECT -SUM(delta) FROM stock_ledger WHERE sale_id = SALE AND reason = 'order'"),
        100
    );
    assert_eq!(
        q(
            "SELECT COUNT(*) FROM (SELECT user_id FROM orders WHERE sale_id = SALE
           GROUP BY user_id HAVING SUM(quantity) > 4) t"
        ),
        0
    );
    assert_eq!(q("SELECT available_stock FROM sales WHERE id = SALE"), 0);
    seckill_tests::assert_reconciles_clean(&redis, &db, &review_db);
}
