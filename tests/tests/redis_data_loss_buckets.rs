//! Specifies the data-loss watch and `sale repair` on a sale split over 3
//! buckets (docs/reliability.md §10), on one private Redis
//! where one bucket is put back to an older copy of itself (what a replica
//! that lagged becomes when it is promoted): 300 units, 80 of bucket 2's
//! buyers buy, bucket 2 is copied (`DUMP`), 60 more of its buyers buy (20
//! of its last units, then at least 40 pulled from the other buckets:
//! transfers), then
//! bucket 2 is restored from the copy, so it lost 60 reservations and the
//! records of the transfers into it, which buckets 0 and 1 still hold.
//! The watch pauses the whole sale (every bucket refuses with 503
//! `sale_paused`); `run` reports one `redis_data_loss` finding naming
//! bucket 2 and exactly the 60 lost orders; the repair rebuilds every
//! bucket (the transfers' in-records written back), after which a
//! reconciliation finds nothing, every holder gets 409 with their own id,
//! and the sale sells out to exactly 300 orders, one per buyer.

use crate::support::gateway as gateway_support;
use crate::support::worker as worker_support;

use gateway_support::{Client, Gateway};
use redis::Commands;
use seckill_common::buckets::home_bucket;
use seckill_common::keys::SaleKeys;
use seckill_tests::{create_split_sale, RedisServer, TempDir, TestDb};
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::time::Duration;
use worker_support::{wait_orders, Opts, WorkerProc};

const K: u32 = 3;
const LONG: Duration = Duration::from_secs(60);

fn users_of(bucket: u32, from: usize, n: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("dl-{i}"))
        .filter(|u| home_bucket(u, K) == bucket)
        .skip(from)
        .take(n)
        .collect()
}

fn buy_all(c: &mut Client, sale: u64, users: &[String]) -> HashMap<String, String> {
    users
        .iter()
        .map(|u| {
            let r = c.buy(sale, u);
            assert_eq!(r.status, 202, "{u}: {r:?}");
            (
                u.clone(),
                r.json()["reservation_id"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Every key of bucket `k` (those the test copies and puts back).
fn bucket_keys(k: &SaleKeys) -> Vec<String> {
    vec![
        k.meta(),
        k.stock(),
        k.buyers(),
        k.flow(),
        k.status(),
        k.queue(),
        k.transfers_out(),
        k.transfers_open(),
        k.transfers_in(),
    ]
}

fn mark(db: &TestDb, sale: u64, bucket: u32) -> i64 {
    db.count(&format!(
        "SELECT COALESCE(MAX(seq_high), 0) FROM sale_bucket_marks WHERE sale_id = {sale} AND bucket = {bucket}"
    ))
}

fn books_balance(con: &mut redis::Connection, sale: u64) {
    for b in 0..K {
        let k = SaleKeys::bucket(sale, b);
        let sum = |con: &mut redis::Connection, key: String| -> i64 {
            let recs: HashMap<String, String> = con.hgetall(key).unwrap();
            recs.values()
                .map(|r| {
                    serde_json::from_str::<serde_json::Value>(r).unwrap()["units"]
                        .as_i64()
                        .unwrap()
                })
                .sum()
        };
        let (share, total): (i64, i64) = redis::cmd("HMGET")
            .arg(k.meta())
            .arg("share")
            .arg("total_stock")
            .query(con)
            .unwrap();
        let inn = sum(con, k.transfers_in());
        let out = sum(con, k.transfers_out());
        assert_eq!(share + inn - out, total, "bucket {b}'s books");
    }
}

/// `run` opens one `redis_data_loss` finding naming bucket 2 only, behind
/// at 80 of MySQL's 140, with exactly the reservations of `lost`.
fn assert_bucket_2_lost(
    redis: &RedisServer,
    db: &TestDb,
    review: &Path,
    lost: &HashMap<String, String>,
) {
    let (code, out) = seckill_tests::reconciler(redis, db, review, &["run"]);
    assert_eq!(code, 1, "{out}");
    let (_, listed) = seckill_tests::reconciler(redis, db, review, &["findings", "--json"]);
    let findings: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let loss: Vec<&serde_json::Value> = findings
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "redis_data_loss")
        .collect();
    assert_eq!(loss.len(), 1, "{listed}");
    let behind = loss[0]["evidence"]["buckets_behind"].as_array().unwrap();
    assert_eq!(behind.len(), 1, "{listed}");
    assert_eq!(behind[0]["bucket"], 2);
    assert_eq!(behind[0]["seq_high"], 140);
    assert_eq!(behind[0]["redis_seq"], 80);
    let found: BTreeSet<&str> = behind[0]["lost_reservation_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    let expected: BTreeSet<&str> = lost.values().map(String::as_str).collect();
    assert_eq!(found, expected);
}

/// Every holder buying again gets 409 with their own reservation id; new
/// buyers then take exactly the 160 units left (410 after).
fn holders_409_then_160_more(c: &mut Client, sale: u64, holders: &HashMap<String, String>) {
    for (u, rid) in holders {
        let r = c.buy(sale, u);
        assert_eq!(
            (r.status, r.json()["reservation_id"].as_str()),
            (409, Some(rid.as_str())),
            "{u}"
        );
    }
    let mut sold = 0;
    for i in 0..400 {
        let u = format!("new-{i}");
        let r = c.buy(sale, &u);
        match r.status {
            202 => sold += 1,
            410 => {}
            s => panic!("{u}: {s} {r:?}"),
        }
    }
    assert_eq!(sold, 160);
}

#[test]
fn a_bucket_put_back_to_an_older_copy_pauses_the_whole_sale_and_the_repair_rebuilds_every_bucket() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let sale = create_split_sale(&db, &redis, 300, -1000, 3_600_000, K);
    let k2 = SaleKeys::bucket(sale, 2);
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let mut c = Client::connect(g.port);
    let mut con = redis.con();
    let mut holders = buy_all(&mut c, sale, &users_of(2, 0, 80));
    wait_orders(&db, sale, 80, LONG);
    seckill_tests::wait_until(LONG, "bucket 2's mark at 80", || mark(&db, sale, 2) == 80);
    let copy: Vec<(String, Option<Vec<u8>>)> = bucket_keys(&k2)
        .into_iter()
        .map(|key| {
            let d: Option<Vec<u8>> = redis::cmd("DUMP").arg(&key).query(&mut con).unwrap();
            (key, d)
        })
        .collect();
    let lost_buyers = users_of(2, 80, 60);
    let lost = buy_all(&mut c, sale, &lost_buyers);
    let moved_in: i64 = con.hget(k2.meta(), "moved_in").unwrap();
    assert!(
        moved_in >= 40,
        "bucket 2 pulled the 40 units it lacked: {moved_in}"
    );
    holders.extend(lost.clone());
    wait_orders(&db, sale, 140, LONG);
    seckill_tests::wait_until(LONG, "bucket 2's mark at 140", || mark(&db, sale, 2) == 140);
    // The checkpoint the older copy lacks is in MySQL too.
    std::thread::sleep(seckill_common::data_loss::WATCH_EVERY * 3);

    for (key, d) in &copy {
        match d {
            Some(bytes) => redis::cmd("RESTORE")
                .arg(key)
                .arg(0)
                .arg(bytes.as_slice())
                .arg("REPLACE")
                .exec(&mut con)
                .unwrap(),
            None => con.del::<_, ()>(key).unwrap(),
        }
    }
    seckill_tests::wait_until(LONG, "every bucket paused", || {
        (0..K).all(|b| {
            con.hexists::<_, _, bool>(SaleKeys::bucket(sale, b).meta(), "paused")
                .unwrap()
        })
    });
    // The gateway refuses the whole sale, whichever bucket is the buyer's.
    for b in 0..K {
        let u = &users_of(b, 500, 1)[0];
        let r = c.buy(sale, u);
        assert_eq!(
            (r.status, r.error().as_str()),
            (503, "sale_paused"),
            "bucket {b}"
        );
    }

    assert_bucket_2_lost(&redis, &db, &review, &lost);

    let (code, out) = seckill_tests::reconciler(
        &redis,
        &db,
        &review,
        &["sale", "repair", &sale.to_string(), "--by", "tester"],
    );
    assert_eq!(code, 0, "{out}");
    books_balance(&mut con, sale);
    let stocks: Vec<i64> = (0..K)
        .map(|b| con.get(SaleKeys::bucket(sale, b).stock()).unwrap())
        .collect();
    assert_eq!(stocks.iter().sum::<i64>(), 160, "{stocks:?}");
    assert_eq!(stocks[2], 100 + moved_in - 140, "{out}");
    // A second repair changes nothing and is not audited again.
    let (code, again) = seckill_tests::reconciler(
        &redis,
        &db,
        &review,
        &["sale", "repair", &sale.to_string(), "--by", "tester"],
    );
    assert_eq!(
        (code, again.trim()),
        (
            0,
            format!("sale {sale} is not paused; nothing to repair").as_str()
        )
    );
    let fresh = dir.path().join("after-repair.sqlite3");
    seckill_tests::assert_reconciles_clean(&redis, &db, &fresh);

    holders_409_then_160_more(&mut c, sale, &holders);
    wait_orders(&db, sale, 300, LONG);
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(DISTINCT user_id) FROM orders WHERE sale_id = {sale}"
        )),
        300
    );
    assert_eq!(
        db.count(&format!(
            "SELECT available_stock FROM sales WHERE id = {sale}"
        )),
        0
    );
    books_balance(&mut con, sale);
    // The repair is in the audit log once, started and done.
    let review = rusqlite::Connection::open(&review).unwrap();
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
            ("tester".into(), "repair".into(), "started".into()),
            ("tester".into(), "repair".into(), "done".into()),
        ]
    );
}
