//! Specifies a hot sale split over buckets (`sale create --shards K`,
//! `seckill_common::buckets`, `seckill_common::transfer`) with the real
//! gateway, worker and reconciler on a private Redis and MySQL: no unit
//! oversold in any bucket or in total, one purchase per buyer whatever the
//! bucket, `sold_out` only once every bucket is empty (units are pulled to
//! an empty home bucket, a half-done transfer included), and a transfer
//! interrupted between its two steps completed exactly once by the
//! reconciler, which finds nothing while units move.

use crate::support::gateway as gw;
use crate::support::worker as wk;

use gw::{buy, buy_final, get, Client, Gateway};
use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::buckets::{home_bucket, load_into_redis};
use seckill_common::keys::SaleKeys;
use seckill_common::transfer::{self, Direction, Record};
use seckill_tests::{create_split_sale, test_sale, users_of, RedisServer, TempDir, TestDb};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// Each bucket's stock, bucket 0 first.
fn stocks(con: &mut redis::Connection, sale: u64, k: u32) -> Vec<i64> {
    (0..k)
        .map(|b| con.get(SaleKeys::bucket(sale, b).stock()).unwrap())
        .collect()
}

/// Units taken in by, and given out of, each bucket (from the records).
fn moved(con: &mut redis::Connection, sale: u64, k: u32) -> (Vec<u64>, Vec<u64>) {
    let sum = |con: &mut redis::Connection, key: String, side: Direction| -> u64 {
        let recs: HashMap<String, String> = con.hgetall(key).unwrap();
        recs.values()
            .map(|r| Record::parse(r, side).unwrap().units)
            .sum()
    };
    (0..k)
        .map(|b| {
            let kb = SaleKeys::bucket(sale, b);
            (
                sum(con, kb.transfers_in(), Direction::In),
                sum(con, kb.transfers_out(), Direction::Out),
            )
        })
        .unzip()
}

/// Loads sale `id` of `stock` units, open for an hour, into Redis only,
/// split over `k` buckets.
fn load_split(redis: &RedisServer, id: u64, stock: u64, k: u32) {
    let sale = test_sale(id, stock, -1000, 3_600_000);
    assert!(load_into_redis(&mut redis.con(), &sale, k, 0).unwrap());
}

/// `seckill-reconciler run` with the default grace period (30 s: the
/// crowd's young reservations are not judged, the totals and transfers
/// are), as the timer runs it during a sale; its exit code.
fn run_during_sale(redis: &RedisServer, db: &TestDb, review: &std::path::Path) -> i32 {
    let out = seckill_tests::command("seckill-reconciler")
        .env("SECKILL_REDIS_URL", redis.url())
        .env("SECKILL_MYSQL_URL", db.url())
        .env("SECKILL_REVIEW_DB", review)
        .arg("run")
        .output()
        .unwrap();
    out.status.code().unwrap_or(-1)
}

#[test]
fn three_buckets_sell_exactly_300_units_to_1000_buyers_into_300_orders_one_each() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_split_sale(&db, &redis, 300, -1000, 3_600_000, 3);
    let gateway = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let _worker = wk::WorkerProc::start(&redis, &db, "bk-w1", &wk::Opts::default());
    // Demand skewed by the hash: 600 buyers of bucket 0, 300 of 1, 100 of
    // 2, against 100 units each, so buckets 0 and 1 drain first and pull.
    let mut users = users_of("crowd", 0, 3, 600);
    users.extend(users_of("crowd", 1, 3, 300));
    users.extend(users_of("crowd", 2, 3, 100));
    let port = gateway.port;
    let review = TempDir::new();
    let path = review.path().join("review.sqlite3");
    let selling = std::sync::atomic::AtomicBool::new(true);
    let mut runs_during = Vec::new();
    let answers: Vec<(String, u16, serde_json::Value)> = std::thread::scope(|s| {
        // The reconciler's timer during the sale: transfers are in flight.
        let reconciling = s.spawn(|| {
            let mut codes = Vec::new();
            while selling.load(std::sync::atomic::Ordering::Acquire) || codes.is_empty() {
                codes.push(run_during_sale(&redis, &db, &path));
            }
            codes
        });
        let handles: Vec<_> = users
            .chunks(1000 / 16 + 1)
            .map(|chunk| {
                s.spawn(move || {
                    let mut c = Client::connect(port);
                    chunk
                        .iter()
                        .map(|u| {
                            let (st, body) = buy_final(&mut c, sale, u);
                            (u.clone(), st, body)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let all = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        selling.store(false, std::sync::atomic::Ordering::Release);
        runs_during = reconciling.join().unwrap();
        all
    });
    assert!(
        runs_during.iter().all(|c| *c == 0),
        "runs during the sale found nothing: {runs_during:?}"
    );
    let winners: HashSet<&str> = answers
        .iter()
        .filter(|(_, st, _)| *st == 202)
        .map(|(u, _, _)| u.as_str())
        .collect();
    let by_status = answers.iter().fold(HashMap::new(), |mut m, (_, st, _)| {
        *m.entry(*st).or_insert(0) += 1;
        m
    });
    assert_eq!(by_status, HashMap::from([(202, 300), (410, 700)]));
    let mut con = redis.con();
    assert_eq!(stocks(&mut con, sale, 3), [0, 0, 0]);
    let (taken, given) = moved(&mut con, sale, 3);
    assert_eq!(taken.iter().sum::<u64>(), given.iter().sum::<u64>());
    assert!(taken[0] > 0, "bucket 0 pulled units: {taken:?}");
    let transfers: usize = (0..3)
        .map(|b| {
            con.hlen::<_, usize>(SaleKeys::bucket(sale, b).transfers_in())
                .unwrap()
        })
        .sum();
    eprintln!("{} reconciler runs during the sale", runs_during.len());
    eprintln!(
        "units moved in per bucket {taken:?} in {transfers} transfers; {} EVALSHA for 1,000 \
         buyers (reservations, pulls' snapshots and transfer steps)",
        gw::evalsha_calls(&redis)
    );
    let mut flows = 0;
    for b in 0..3 {
        let kb = SaleKeys::bucket(sale, b);
        let buyers: HashMap<String, String> = con.hgetall(kb.buyers()).unwrap();
        assert!(buyers.keys().all(|u| home_bucket(u, 3) == b));
        let n: usize = con.hlen(kb.flow()).unwrap();
        assert_eq!(n, buyers.len());
        let total: i64 = con.hget(kb.meta(), "total_stock").unwrap();
        assert_eq!(total, n as i64, "bucket {b}: its total is what it sold");
        flows += n;
    }
    assert_eq!(flows, 300);

    wk::wait_orders(&db, sale, 300, Duration::from_secs(60));
    let ordered: Vec<String> = mysql::prelude::Queryable::exec(
        &mut db.conn(),
        "SELECT user_id FROM orders WHERE sale_id = ?",
        (sale,),
    )
    .unwrap();
    let ordered_set: HashSet<&str> = ordered.iter().map(String::as_str).collect();
    assert_eq!((ordered.len(), &ordered_set), (300, &winners));
    let available = db.count(&format!(
        "SELECT available_stock FROM sales WHERE id = {sale}"
    ));
    assert_eq!(available, 0);

    seckill_tests::assert_reconciles_clean(&redis, &db, &path);
}

#[test]
fn buyers_of_a_drained_bucket_still_buy_until_the_whole_sale_is_sold() {
    let redis = RedisServer::start();
    let sale = 41;
    load_split(&redis, sale, 30, 3);
    let gateway = Gateway::start(&redis, &[]);
    let home0 = users_of("drain", 0, 3, 31);
    let mut c = Client::connect(gateway.port);
    for (i, u) in home0.iter().take(30).enumerate() {
        if i == 10 {
            let s = get(gateway.port, &format!("/v1/sales/{sale}")).json();
            assert_eq!(s["stock_remaining"], 20, "bucket 0 empty, the sale not");
            assert_eq!(s["state"], "active");
        }
        let r = c.buy(sale, u);
        assert_eq!(
            r.status,
            202,
            "purchase {i} of a bucket-0 buyer: {}",
            r.error()
        );
    }
    let mut con = redis.con();
    assert_eq!(stocks(&mut con, sale, 3), [0, 0, 0]);
    let (taken, given) = moved(&mut con, sale, 3);
    assert_eq!(taken, [20, 0, 0]);
    assert_eq!(given.iter().sum::<u64>(), 20);
    let flows: usize = con.hlen(SaleKeys::new(sale).flow()).unwrap();
    assert_eq!(flows, 30);
    // Now, and only now, the sale is sold out, for every bucket's buyers.
    assert_eq!(c.buy(sale, &home0[30]).error(), "sold_out");
    for b in [1, 2] {
        let u = &users_of("drain", b, 3, 1)[0];
        assert_eq!(buy(gateway.port, sale, u).error(), "sold_out");
    }
    let status = get(
        gateway.port,
        &format!("/v1/sales/{sale}/purchases/{}", home0[0]),
    );
    assert_eq!(
        (status.status, status.json()["status"].clone()),
        (200, "queued".into())
    );
    let s = get(gateway.port, &format!("/v1/sales/{sale}")).json();
    assert_eq!(
        (s["stock_remaining"].clone(), s["state"].clone()),
        (0.into(), "sold_out".into())
    );
}

#[test]
fn units_left_in_a_half_done_transfer_are_still_sold() {
    let redis = RedisServer::start();
    let sale = 42;
    load_split(&redis, sale, 6, 3); // 2 units per bucket
    let mut con = redis.con();
    let (b0, b1, b2) = (
        SaleKeys::bucket(sale, 0),
        SaleKeys::bucket(sale, 1),
        SaleKeys::bucket(sale, 2),
    );
    // Buckets 0 and 1 given to bucket 2 by step 1 alone (a mover that
    // crashed): 4 units are in no bucket's stock, only in open records.
    assert_eq!(
        transfer::take_out(&mut con, b0, 2, "t-0-to-2", 2).unwrap(),
        2
    );
    assert_eq!(
        transfer::take_out(&mut con, b1, 2, "t-1-to-2", 2).unwrap(),
        2
    );
    assert_eq!(stocks(&mut con, sale, 3), [0, 0, 2]);
    let gateway = Gateway::start(&redis, &[]);
    let buyers = users_of("half", 0, 3, 7);
    for u in &buyers[..6] {
        let r = buy(gateway.port, sale, u);
        assert_eq!(r.status, 202, "{u}: {}", r.error());
    }
    assert_eq!(buy(gateway.port, sale, &buyers[6]).error(), "sold_out");
    assert_eq!(stocks(&mut con, sale, 3), [0, 0, 0]);
    let open: usize = con.hlen(b0.transfers_open()).unwrap();
    let open1: usize = con.hlen(b1.transfers_open()).unwrap();
    assert_eq!((open, open1), (0, 0));
    let taken: HashMap<String, String> = con.hgetall(b2.transfers_in()).unwrap();
    assert!(taken.contains_key("t-0-to-2") && taken.contains_key("t-1-to-2"));
    let flows: usize = con.hlen(b0.flow()).unwrap();
    assert_eq!(flows, 6, "every unit sold to bucket 0's buyers");
}

#[test]
fn a_second_purchase_by_the_same_buyer_is_409_whatever_its_bucket() {
    let redis = RedisServer::start();
    let sale = 43;
    load_split(&redis, sale, 6, 3);
    let gateway = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let mut c = Client::connect(gateway.port);
    let mut ids = Vec::new();
    for b in 0..3 {
        let u = users_of("twice", b, 3, 1).remove(0);
        let first = c.buy(sale, &u);
        assert_eq!(first.status, 202);
        let rid = first.json()["reservation_id"].clone();
        let again = c.buy(sale, &u);
        assert_eq!(
            (again.status, again.json()["reservation_id"].clone()),
            (409, rid.clone())
        );
        ids.push((u, rid));
    }
    // Sell the rest to buyers of bucket 0 (they pull from 1 and 2).
    for u in users_of("rest", 0, 3, 3) {
        assert_eq!(c.buy(sale, &u).status, 202);
    }
    assert_eq!(
        c.buy(sale, &users_of("late", 1, 3, 1)[0]).error(),
        "sold_out"
    );
    let mut con = redis.con();
    for (b, (u, rid)) in ids.iter().enumerate() {
        let again = c.buy(sale, u);
        assert_eq!(
            (again.status, again.json()["reservation_id"].clone()),
            (409, rid.clone())
        );
        for other in 0..3u32 {
            let held: bool = con
                .hexists(SaleKeys::bucket(sale, other).buyers(), u)
                .unwrap();
            assert_eq!(
                held,
                other == b as u32,
                "{u}'s mark is in its home bucket only"
            );
        }
    }
    let sold: usize = (0..3)
        .map(|b| {
            con.hlen::<_, usize>(SaleKeys::bucket(sale, b).flow())
                .unwrap()
        })
        .sum();
    assert_eq!((sold, stocks(&mut con, sale, 3)), (6, vec![0, 0, 0]));
}

#[test]
fn a_transfer_interrupted_between_its_steps_is_completed_once_by_the_reconciler() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_split_sale(&db, &redis, 30, -1000, 3_600_000, 3);
    let review = TempDir::new();
    let path = review.path().join("review.sqlite3");
    let mut con = redis.con();
    let (b0, b1) = (SaleKeys::bucket(sale, 0), SaleKeys::bucket(sale, 1));
    // Step 1 alone: bucket 1 gives 4 units to bucket 0, then the mover dies.
    assert_eq!(transfer::take_out(&mut con, b1, 0, "tid-1", 4).unwrap(), 4);
    // The reconciler leaves a transfer younger than 1 s
    // (`rules::transfers::IN_FLIGHT_MS`) to its mover.
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(stocks(&mut con, sale, 3), [10, 6, 10]);
    let (code, show) =
        seckill_tests::reconciler(&redis, &db, &path, &["sale", "show", &sale.to_string()]);
    assert_eq!(code, 0, "{show}");
    assert!(show.contains("buckets           -            3"), "{show}");
    let row1 = show
        .lines()
        .find(|l| l.starts_with(&format!("1       {{sale:{sale}:b1}}")))
        .unwrap_or_else(|| panic!("no bucket 1 row: {show}"));
    assert_eq!(
        row1.split_whitespace().collect::<Vec<_>>(),
        [
            "1",
            &format!("{{sale:{sale}:b1}}"),
            "6",
            "6",
            "10",
            "0",
            "0",
            "0",
            "0",
            "0",
            "0/1/1"
        ]
    );

    for run in 0..2 {
        let (code, out) = seckill_tests::reconciler(&redis, &db, &path, &["run"]);
        assert_eq!(code, 0, "run {run}: {out}");
        assert_eq!(stocks(&mut con, sale, 3), [14, 6, 10], "run {run}");
        let (_, out) = seckill_tests::reconciler(
            &redis,
            &db,
            &path,
            &["findings", "--state", "all", "--json"],
        );
        let f: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
        let keys: Vec<_> = f
            .iter()
            .map(|f| (f["kind"].clone(), f["subject"].clone(), f["state"].clone()))
            .collect();
        assert_eq!(
            keys,
            [(
                "stock_mismatch".into(),
                "transfer_incomplete:tid-1".into(),
                "auto_fixed".into()
            )],
            "run {run}"
        );
    }
    let total0: i64 = con.hget(b0.meta(), "total_stock").unwrap();
    let open: usize = con.hlen(b1.transfers_open()).unwrap();
    assert_eq!((total0, open), (14, 0));
    // Step 2 once more (a second completer racing the first): nothing moves.
    let rec = Record {
        peer: 0,
        units: 4,
        at_ms: 0,
    };
    assert!(!transfer::complete(&mut con, b1, "tid-1", rec).unwrap());
    assert_eq!(stocks(&mut con, sale, 3), [14, 6, 10]);
}

/// A reservation whose message was lost, in bucket 1 of 3: `resolve
/// --rollback` releases it in bucket 1 (its unit back in bucket 1's stock
/// only, its flow record and mark gone, status `failed`), and a repeat
/// changes nothing; another in bucket 2, `--reorder` queues its message on
/// bucket 2's queue, whose worker makes it an order; `run` then clean.
#[test]
fn resolve_rolls_back_and_reorders_in_the_reservations_bucket() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_split_sale(&db, &redis, 9, -1000, 3_600_000, 3);
    let review = TempDir::new();
    let path = review.path().join("review.sqlite3");
    let mut con = redis.con();
    // Reserved, its message lost: a flow record that never becomes an order.
    let mut lost = |bucket: u32| -> (String, String) {
        let k = SaleKeys::bucket(sale, bucket);
        let user = users_of("lost", bucket, 3, 1).remove(0);
        let rid = seckill_common::ids::new_reservation_id();
        let reply: redis::Value = seckill_common::reservation::prepare_in(k, &user, &rid)
            .invoke(&mut con)
            .unwrap();
        assert_eq!(
            seckill_common::reservation::parse_reply(&reply).unwrap(),
            seckill_common::reservation::ReserveOutcome::Reserved(rid.clone())
        );
        let _: Option<String> = con.rpop(k.queue(), None).unwrap();
        (user, rid)
    };
    let (user1, rid1) = lost(1);
    let (_, rid2) = lost(2);
    assert_eq!(stocks(&mut con, sale, 3), [3, 2, 2]);
    let (code, out) = seckill_tests::reconciler(&redis, &db, &path, &["run"]);
    assert_eq!(code, 1, "{out}");
    let (_, out) = seckill_tests::reconciler(&redis, &db, &path, &["findings", "--json"]);
    let f: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    let id_of = |rid: &str| -> String {
        let f: Vec<&serde_json::Value> = f
            .iter()
            .filter(|f| f["reservation_id"].as_str() == Some(rid))
            .collect();
        assert_eq!(f.len(), 1, "{out}");
        assert_eq!(f[0]["kind"].as_str(), Some("flow_without_order"));
        f[0]["id"].to_string()
    };
    let (id1, id2) = (id_of(&rid1), id_of(&rid2));
    let resolve = |id: &str, action: &str| {
        seckill_tests::reconciler(
            &redis,
            &db,
            &path,
            &["resolve", id, action, "--by", "alice"],
        )
    };
    let (code, out) = resolve(&id1, "--rollback");
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("released {rid1} in Redis: stock 2 -> 3")),
        "{out}"
    );
    let b1 = SaleKeys::bucket(sale, 1);
    let held: bool = con.hexists(b1.flow(), &rid1).unwrap();
    let mark: Option<String> = con.hget(b1.buyers(), &user1).unwrap();
    let status: Option<String> = con.hget(b1.status(), &rid1).unwrap();
    assert_eq!(
        (held, mark, status.as_deref()),
        (false, None, Some("failed"))
    );
    assert_eq!(stocks(&mut con, sale, 3), [3, 3, 2]);
    let (code, out) = resolve(&id1, "--rollback");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("already released"), "{out}");
    assert_eq!(stocks(&mut con, sale, 3), [3, 3, 2]);

    let (code, out) = resolve(&id2, "--reorder");
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("queued the order message of {rid2} again")),
        "{out}"
    );
    let queued: Vec<usize> = (0..3)
        .map(|b| con.llen(SaleKeys::bucket(sale, b).queue()).unwrap())
        .collect();
    assert_eq!(queued, [0, 0, 1]);
    let _w = wk::WorkerProc::start(&redis, &db, "rs-w1", &wk::Opts::default());
    wk::wait_orders(&db, sale, 1, Duration::from_secs(60));
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM orders WHERE sale_id = {sale} AND reservation_id = '{rid2}'"
        )),
        1
    );
    assert_eq!(stocks(&mut con, sale, 3), [3, 3, 2]);
    let (code, out) = seckill_tests::reconciler(&redis, &db, &path, &["run"]);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn reconciling_while_two_movers_shuffle_units_finds_nothing_and_loses_no_unit() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_split_sale(&db, &redis, 300, -1000, 3_600_000, 3);
    let review = TempDir::new();
    let path = review.path().join("review.sqlite3");
    let moving = std::sync::atomic::AtomicBool::new(true);
    let (runs, moves) = std::thread::scope(|s| {
        let movers: Vec<_> = (0..2u32)
            .map(|m| {
                let (redis, moving) = (&redis, &moving);
                s.spawn(move || {
                    let mut con = redis.con();
                    let mut n = 0u64;
                    let mut i = m;
                    while moving.load(std::sync::atomic::Ordering::Acquire) {
                        let (from, to) = (i % 3, (i + 1 + m) % 3);
                        let from = SaleKeys::bucket(sale, from);
                        if to != from.bucket {
                            n += transfer::transfer(&mut con, from, to, 1 + u64::from(i % 7))
                                .unwrap();
                        }
                        i += 1;
                        // Pauses, so that some of the runs' reads find the
                        // buckets still and judge the totals.
                        std::thread::sleep(Duration::from_millis(3));
                    }
                    n
                })
            })
            .collect();
        // Stops the movers however this closure ends: a run that panics
        // fails the test instead of leaving the scope waiting on them.
        struct Stop<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(false, std::sync::atomic::Ordering::Release);
            }
        }
        let stop = Stop(&moving);
        let runs: Vec<i32> = (0..4)
            .map(|_| run_during_sale(&redis, &db, &path))
            .collect();
        drop(stop);
        let moves: u64 = movers.into_iter().map(|h| h.join().unwrap()).sum();
        (runs, moves)
    });
    eprintln!("{moves} units moved while 4 reconciler runs read");
    assert!(moves > 0);
    assert_eq!(runs, [0, 0, 0, 0]);
    let mut con = redis.con();
    assert_eq!(stocks(&mut con, sale, 3).iter().sum::<i64>(), 300);
    let (taken, given) = moved(&mut con, sale, 3);
    assert_eq!(taken.iter().sum::<u64>(), moves);
    assert_eq!(given.iter().sum::<u64>(), moves);
    seckill_tests::assert_reconciles_clean(&redis, &db, &path);
}

#[test]
fn sale_create_with_shards_splits_the_stock_and_without_it_writes_todays_keys() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let path = review.path().join("review.sqlite3");
    let create = |extra: &[&str]| -> u64 {
        let mut args = vec![
            "sale",
            "create",
            "--sku",
            "HOT-1",
            "--stock",
            "10",
            "--starts-at",
            "now",
            "--ends-at",
            "now+1h",
        ];
        args.extend_from_slice(extra);
        let (code, out) = seckill_tests::reconciler(&redis, &db, &path, &args);
        assert_eq!(code, 0, "{out}");
        out.lines().find_map(|l| l.trim().parse().ok()).unwrap()
    };
    let split = create(&["--shards", "3"]);
    let plain = create(&[]);
    let mut con = redis.con();
    assert_eq!(stocks(&mut con, split, 3), [4, 3, 3]);
    for b in 0..3 {
        let meta: HashMap<String, String> = con.hgetall(SaleKeys::bucket(split, b).meta()).unwrap();
        assert_eq!(meta["share"], meta["total_stock"]);
        assert_eq!(
            meta.get("buckets").map(String::as_str),
            (b == 0).then_some("3")
        );
    }
    let meta: HashMap<String, String> = con.hgetall(SaleKeys::new(plain).meta()).unwrap();
    let mut fields: Vec<&str> = meta.keys().map(String::as_str).collect();
    fields.sort_unstable();
    assert_eq!(fields, ["ends_at_ms", "starts_at_ms", "total_stock"]);
    let extra: bool = con.exists(SaleKeys::bucket(plain, 1).stock()).unwrap();
    assert!(!extra, "a sale of one bucket has no other bucket");

    // Bucket 0 sold out by hand (as buyers would): the rebalance refills it.
    let _: () = con.set(SaleKeys::new(split).stock(), 0).unwrap();
    let _: () = con
        .hset(SaleKeys::new(split).meta(), "total_stock", 0)
        .unwrap();
    let _: () = con.hset(SaleKeys::new(split).meta(), "share", 0).unwrap();
    let (code, out) = seckill_tests::reconciler(
        &redis,
        &db,
        &path,
        &["sale", "rebalance", &split.to_string()],
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("0 half-done transfer(s) completed, 1 unit(s) moved"),
        "{out}"
    );
    assert_eq!(stocks(&mut con, split, 3), [1, 3, 2]);
    let (code, out) = seckill_tests::reconciler(
        &redis,
        &db,
        &path,
        &["sale", "rebalance", &plain.to_string()],
    );
    assert_eq!(
        (code, out.trim()),
        (
            0,
            format!("sale {plain} has one bucket: nothing to move").as_str()
        )
    );
}

/// What the operator commands do not support on split sales yet is
/// refused with nothing changed: `sale load` after bucket
/// 0 alone was lost would offer its units again on top of the live
/// buckets'. `sale repair` of a sale the watch has not paused changes
/// nothing, even with bucket 0 (which holds K) gone (it once sized bucket 0
/// as the whole sale: Redis then offered units MySQL no longer had).
#[test]
fn a_partial_reload_is_refused_and_a_repair_of_a_live_split_sale_changes_nothing() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let path = review.path().join("review.sqlite3");
    let sale = create_split_sale(&db, &redis, 9, -1_000, 600_000, 3);
    let id = sale.to_string();
    let mut con = redis.con();
    let k0 = SaleKeys::new(sale);
    let _: () = con.del(&[k0.meta(), k0.stock()]).unwrap();
    let before = seckill_tests::sale_snapshot(&mut con, sale);
    let (code, out) =
        seckill_tests::reconciler(&redis, &db, &path, &["sale", "load", &id, "--shards", "3"]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("bucket 0 is gone but other buckets are live"),
        "{out}"
    );
    let live: Vec<Option<i64>> = (0..3)
        .map(|b| con.get(SaleKeys::bucket(sale, b).stock()).unwrap())
        .collect();
    assert_eq!(live, vec![None, Some(3), Some(3)]);
    let (code, out) =
        seckill_tests::reconciler(&redis, &db, &path, &["sale", "repair", &id, "--by", "op"]);
    assert_eq!(
        (code, out.trim()),
        (
            0,
            format!("sale {sale} is not paused; nothing to repair").as_str()
        )
    );
    assert_eq!(seckill_tests::sale_snapshot(&mut con, sale), before);
}

/// Every key of sale `sale` in Redis (all its buckets' tags).
fn sale_keys(con: &mut redis::Connection, sale: u64) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("seckill:{{sale:{sale}*"))
        .query(con)
        .unwrap();
    keys.sort();
    keys
}

/// K lives in MySQL too (`sales.buckets`): a split sale with a payment
/// window that Redis lost entirely, whose load MySQL does not record (a
/// sale from before migration 7; a recorded one is refused, `sale repair`
/// rebuilds it: `redis_data_loss_unseen.rs`), reloads with `sale load ID`
/// alone into its 3 buckets, its ordered units left out, and the load is
/// recorded; a disagreeing `--shards` is refused (exit 64) and writes
/// nothing; the same `--shards` is accepted.
/// A sale MySQL records no K for (created before migration 5) records the
/// `--shards` it is loaded with.
#[test]
fn a_split_sale_redis_lost_reloads_with_the_k_mysql_keeps() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let path = review.path().join("review.sqlite3");
    let sale = seckill_tests::create_windowed_split_sale(&redis, &db, &path, 9, "1h", 3);
    let id = sale.to_string();
    assert_eq!(
        db.count(&format!("SELECT buckets FROM sales WHERE id = {sale}")),
        3
    );
    let mut con = redis.con();
    assert_eq!(stocks(&mut con, sale, 3), [3, 3, 3]);
    // One order held, as a worker would have written it (its unit stays out).
    db.conn()
        .exec_drop(
            "INSERT INTO orders (reservation_id, sale_id, user_id, status) VALUES (?, ?, 'u1', 'paid')",
            (seckill_common::ids::new_reservation_id(), sale),
        )
        .unwrap();
    // Redis loses the sale.
    let keys = sale_keys(&mut con, sale);
    let _: () = con.del(keys).unwrap();
    let _: () = con.srem(seckill_common::keys::SALES, sale).unwrap();
    let (code, out) = seckill_tests::reconciler(&redis, &db, &path, &["sale", "load", &id]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!("sale repair {sale} --by NAME")),
        "{out}"
    );
    assert_eq!(sale_keys(&mut con, sale), Vec::<String>::new());
    let loaded = format!("SELECT COUNT(*) FROM sales WHERE id = {sale} AND loaded_at IS NOT NULL");
    db.conn()
        .exec_drop("UPDATE sales SET loaded_at = NULL WHERE id = ?", (sale,))
        .unwrap();

    let (code, out) =
        seckill_tests::reconciler(&redis, &db, &path, &["sale", "load", &id, "--shards", "2"]);
    assert_eq!(code, 64, "{out}");
    assert!(
        out.contains(&format!("sale {sale} has 3 bucket(s)"))
            && out.contains("--shards 2 disagrees"),
        "{out}"
    );
    assert_eq!(sale_keys(&mut con, sale), Vec::<String>::new());
    let (code, out) = seckill_tests::reconciler(&redis, &db, &path, &["sale", "load", &id]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("with stock 8 (9 total, 1 already ordered), in 3 buckets"),
        "{out}"
    );
    assert_eq!(stocks(&mut con, sale, 3), [3, 3, 2]);
    assert_eq!(db.count(&loaded), 1);
    let k: Option<u32> = con.hget(SaleKeys::new(sale).meta(), "buckets").unwrap();
    assert_eq!(k, Some(3));
    let (code, out) =
        seckill_tests::reconciler(&redis, &db, &path, &["sale", "load", &id, "--shards", "3"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("already live in Redis"), "{out}");

    // A sale from before migration 5: no K in MySQL; loaded with --shards 2,
    // MySQL records 2.
    let old = create_split_sale(&db, &redis, 4, -1_000, 600_000, 1);
    db.conn()
        .exec_drop("UPDATE sales SET buckets = NULL WHERE id = ?", (old,))
        .unwrap();
    let keys = sale_keys(&mut con, old);
    let _: () = con.del(keys).unwrap();
    let (code, out) = seckill_tests::reconciler(
        &redis,
        &db,
        &path,
        &["sale", "load", &old.to_string(), "--shards", "2"],
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(stocks(&mut con, old, 2), [2, 2]);
    assert_eq!(
        db.count(&format!("SELECT buckets FROM sales WHERE id = {old}")),
        2
    );
}

/// One bucket's keys lost: its buyers get 503 (retry), the other buckets'
/// buyers still buy — the lost bucket does not close the sale as unknown
/// (which would answer every buyer 404 `sale_not_found` from memory).
#[test]
fn a_lost_bucket_is_503_for_its_buyers_and_does_not_close_the_sale() {
    let redis = RedisServer::start();
    load_split(&redis, 31, 30, 3);
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let k1 = SaleKeys::bucket(31, 1);
    let _: () = redis
        .con()
        .del(&[
            k1.meta(),
            k1.stock(),
            k1.buyers(),
            k1.flow(),
            k1.status(),
            k1.queue(),
        ])
        .unwrap();
    let lost: Vec<u16> = users_of("l", 1, 3, 5)
        .iter()
        .map(|u| buy(g.port, 31, u).status)
        .collect();
    assert_eq!(lost, vec![503; 5]);
    let others: Vec<u16> = users_of("o", 0, 3, 3)
        .iter()
        .chain(users_of("o", 2, 3, 3).iter())
        .map(|u| buy(g.port, 31, u).status)
        .collect();
    assert_eq!(others, vec![202; 6]);
}

/// Sale `sale` (20 units) loaded with one bucket, read by a new gateway
/// (a purchase), then removed and loaded again with 3 buckets: the
/// gateway, and a connection to Redis.
fn reloaded_after_a_gateway_read_it(
    redis: &RedisServer,
    sale: u64,
) -> (Gateway, redis::Connection) {
    load_split(redis, sale, 20, 1);
    let g = Gateway::start(redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    assert_eq!(buy(g.port, sale, "warm").status, 202);
    let mut con = redis.con();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("seckill:{{sale:{sale}}}*"))
        .query(&mut con)
        .unwrap();
    let _: () = con.del(keys).unwrap();
    load_split(redis, sale, 20, 3);
    (g, con)
}

/// A sale reloaded with another bucket count: a gateway that knew the old
/// count reads it again within `RECOUNT_AFTER` (1 s), so a buyer is routed
/// to the new home bucket (a gateway that kept K = 1 would give one buyer
/// two 202s).
#[test]
fn a_gateway_sees_a_new_bucket_count_within_a_second() {
    let redis = RedisServer::start();
    let (g, mut con) = reloaded_after_a_gateway_read_it(&redis, 32);
    std::thread::sleep(Duration::from_millis(1100));
    let user = users_of("dbl", 1, 3, 1).remove(0);
    let first = buy(g.port, 32, &user);
    assert_eq!(first.status, 202, "{first:?}");
    let held: Option<String> = con.hget(SaleKeys::bucket(32, 1).buyers(), &user).unwrap();
    assert_eq!(
        held.as_deref(),
        first.json()["reservation_id"].as_str(),
        "the buyer's mark is in its home bucket of 3"
    );
    assert_eq!(buy(g.port, 32, &user).status, 409);
}

/// Calls of `cmd` by Redis's `INFO commandstats` (commands a script runs
/// included).
fn calls(con: &mut redis::Connection, cmd: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(con).unwrap();
    let head = format!("cmdstat_{cmd}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&head))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// When a sale's remembered bucket count is due again (`RECOUNT_AFTER`),
/// one purchase reads it and the others in flight keep the remembered
/// count for that round trip: 32 purchases at once after a second make
/// exactly one more `HMGET` of the meta beside their scripts' own. Before,
/// each connection thread that found the count due read it (a stampede of
/// round trips, and of new links, at every second's turn).
#[test]
fn a_due_bucket_count_is_read_again_by_one_purchase() {
    let redis = RedisServer::start();
    load_split(&redis, 33, 1000, 1);
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let mut clients: Vec<Client> = (0..32).map(|_| Client::connect(g.port)).collect();
    // The count is read by the first purchase; the crowd comes 1.1 s
    // after it, inside the window where one purchase reads it again and
    // the others keep it (a K read 1.25 s ago is read by everyone).
    let read = std::time::Instant::now();
    for (i, c) in clients.iter_mut().enumerate() {
        assert_eq!(c.buy(33, &format!("warm{i}")).status, 202);
    }
    let mut con = redis.con();
    let due = read + Duration::from_millis(1100);
    std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
    let (hmget, scripts) = (calls(&mut con, "hmget"), calls(&mut con, "evalsha"));
    let barrier = std::sync::Barrier::new(clients.len());
    let statuses: Vec<u16> = std::thread::scope(|s| {
        let handles: Vec<_> = clients
            .iter_mut()
            .enumerate()
            .map(|(i, c)| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    c.buy(33, &format!("due{i}")).status
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(statuses, vec![202; 32]);
    let scripts = calls(&mut con, "evalsha") - scripts;
    // Each script call reads the meta once (no release yet: no statuses).
    assert_eq!(calls(&mut con, "hmget") - hmget - scripts, 1);
}

/// The grace of a due bucket count (`RECOUNT_GRACE`) runs from the read
/// too, not only from the claim: a K read long ago, reloaded since with another K,
/// must not be used by a purchase that arrives while the claimer's read is
/// in flight. Here the sale is reloaded with 3 buckets right after the
/// gateway read K = 1, nobody buys for 3 s, then two purchases arrive while
/// Redis is briefly paused: the second must not be routed by K = 1 (it
/// would buy in bucket 0 and again in its home bucket of 3: two 202s).
/// Before the claim, every caller of a due K read it itself.
#[test]
fn a_k_read_long_ago_is_not_used_while_another_purchase_reads_it_again() {
    let redis = RedisServer::start();
    let (g, mut con) = reloaded_after_a_gateway_read_it(&redis, 34);
    // Well past RECOUNT_AFTER + RECOUNT_GRACE after the reload.
    std::thread::sleep(Duration::from_millis(3000));
    let user = users_of("dbl", 1, 3, 1).remove(0);
    let mut claimer = Client::connect(g.port);
    let mut late = Client::connect(g.port);
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(300)
        .arg("ALL")
        .query(&mut con)
        .unwrap();
    let first = std::thread::scope(|s| {
        let c = s.spawn(|| claimer.buy(34, "claimer").status);
        std::thread::sleep(Duration::from_millis(60));
        let first = late.buy(34, &user);
        assert_eq!(c.join().unwrap(), 202);
        first
    });
    assert_eq!(first.status, 202, "{first:?}");
    let again = buy(g.port, 34, &user);
    assert_eq!(again.status, 409, "one buyer, two purchases: {again:?}");
    let in_bucket_0: Option<String> = con.hget(SaleKeys::bucket(34, 0).buyers(), &user).unwrap();
    assert_eq!(in_bucket_0, None, "routed by the K = 1 read 3 s before");
}
