//! Specifies what happens when Redis loses one key of a sale, or one sale's
//! key is broken: a lost buyers hash,
//! stock counter or meta hash pauses the sale (503 `sale_paused`, never a
//! second unit for a winner, never a silent sell-out or a 404), `run`
//! reports it again after an earlier repair, and `sale repair` rebuilds it;
//! a broken key of one sale stops neither the orders nor the checks of the
//! others.

use crate::support::gateway as gateway_support;
use crate::support::worker as worker_support;

use gateway_support::{Client, Gateway};
use seckill_common::keys::SaleKeys;
use seckill_tests::{create_sale, wait_until, RedisServer, TempDir, TestDb};
use std::time::Duration;
use worker_support::{wait_orders, Opts, WorkerProc};

fn reconciler(redis: &RedisServer, db: &TestDb, dir: &TempDir, args: &[&str]) -> (i32, String) {
    seckill_tests::reconciler(redis, db, &dir.path().join("review.sqlite3"), args)
}

fn checkpoint_high(db: &TestDb, sale: u64) -> i64 {
    db.count(&format!(
        "SELECT checkpoint_high FROM sale_redis_state WHERE sale_id = {sale}"
    ))
}

#[test]
fn a_lost_buyers_hash_stock_or_meta_pauses_the_sale_until_each_repair() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let sale = create_sale(&db, &redis, 10, -1000, 600_000);
    let k = SaleKeys::new(sale);
    // The same buyers retry on purpose: no per-buyer limit.
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let mut c = Client::connect(g.port);
    let mut holders: Vec<(String, String)> = Vec::new();
    for lost in [k.buyers(), k.stock(), k.meta()] {
        let user = format!("u{}", holders.len());
        let r = c.buy(sale, &user);
        assert_eq!(r.status, 202, "{r:?}");
        holders.push((user, r.json()["reservation_id"].as_str().unwrap().into()));
        wait_orders(&db, sale, holders.len() as i64, Duration::from_secs(20));
        // The watch has seen this state.
        let seen = checkpoint_high(&db, sale);
        wait_until(Duration::from_secs(5), "the watch to pass", || {
            checkpoint_high(&db, sale) > seen + 1
        });

        let _: () = redis::cmd("DEL")
            .arg(&lost)
            .query(&mut redis.con())
            .unwrap();
        // A winner retries until the pause; a retry that slips through in
        // the window (a second 202) is a duplicate the repair releases.
        let mut slipped = 0;
        wait_until(Duration::from_secs(5), "the pause", || {
            let r = c.buy(sale, &holders[0].0);
            slipped += usize::from(r.status == 202);
            r.error() == "sale_paused"
        });
        // Every holder, and anyone else: paused, not 404, not a second unit.
        for (u, _) in &holders {
            let r = c.buy(sale, u);
            assert_eq!(
                (r.status, r.error()),
                (503, "sale_paused".into()),
                "{lost}: {u}"
            );
        }
        let (code, out) = reconciler(&redis, &db, &dir, &["run"]);
        assert_eq!(code, 1, "{lost}: {out}");
        let (_, listed) = reconciler(&redis, &db, &dir, &["findings", "--json"]);
        let open: Vec<serde_json::Value> = serde_json::from_str(&listed).unwrap();
        assert_eq!(open.len(), 1, "{lost}: {listed}");
        assert_eq!(open[0]["kind"], "redis_data_loss", "{lost}");
        // Refused (exit 1) while a worker still holds a slipped message.
        let mut repaired = (1, String::new());
        wait_until(Duration::from_secs(10), "the repair", || {
            repaired = reconciler(
                &redis,
                &db,
                &dir,
                &["sale", "repair", &sale.to_string(), "--by", "tester"],
            );
            repaired.0 != 1
        });
        let (code, out) = repaired;
        assert_eq!(code, 0, "{lost}: {out}");
        assert!(
            out.contains(&format!(
                "{} orders restored, {slipped} duplicate reservations released",
                holders.len()
            )),
            "{lost}: {out}"
        );
        // Rebuilt: every holder 409 with the original id, as soon as the
        // gateway's recheck sees it.
        for (u, rid) in &holders {
            wait_until(Duration::from_secs(3), "the holder's 409", || {
                let r = c.buy(sale, u);
                r.status == 409 && r.json()["reservation_id"] == rid.as_str()
            });
        }
        let (code, out) = reconciler(&redis, &db, &dir, &["run"]);
        assert_eq!(code, 0, "{lost}: {out}");
    }
    // Three holders, three orders, nobody twice; 7 units still on sale.
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM orders WHERE sale_id = {sale}"
        )),
        3
    );
    let stock: i64 = redis::cmd("GET")
        .arg(k.stock())
        .query(&mut redis.con())
        .unwrap();
    assert_eq!(stock, 7);
    let r = c.buy(sale, "late");
    assert_eq!(r.status, 202, "{r:?}");
    wait_orders(&db, sale, 4, Duration::from_secs(20));
    // The repair was audited once per loss.
    let review = rusqlite::Connection::open(dir.path().join("review.sqlite3")).unwrap();
    let done: i64 = review
        .query_row(
            "SELECT COUNT(*) FROM actions WHERE action = 'repair' AND result = 'done' \
             AND actor = 'tester'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(done, 3);
}

#[test]
fn a_broken_key_of_one_sale_stops_neither_the_orders_nor_the_checks_of_another() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let broken = create_sale(&db, &redis, 10, -1000, 600_000);
    let healthy = create_sale(&db, &redis, 10, -1000, 600_000);
    let _: () = redis::cmd("SET")
        .arg(SaleKeys::new(broken).queue())
        .arg("x")
        .query(&mut redis.con())
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(SaleKeys::new(broken).meta())
        .arg("checkpoint")
        .arg("abc")
        .query(&mut redis.con())
        .unwrap();
    // The same buyers retry on purpose: no per-buyer limit.
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let mut c = Client::connect(g.port);
    for i in 0..5 {
        assert_eq!(c.buy(healthy, &format!("h{i}")).status, 202);
    }
    wait_orders(&db, healthy, 5, Duration::from_secs(20));
    // The watch keeps checking the healthy sale.
    let seen = checkpoint_high(&db, healthy);
    wait_until(Duration::from_secs(5), "the watch to pass", || {
        checkpoint_high(&db, healthy) > seen + 1
    });
    // The run checks the healthy sale and names the broken one (exit 2).
    let (code, out) = reconciler(&redis, &db, &dir, &["run"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("sales not checked"), "{out}");
    assert!(out.contains(&format!("{broken} (")), "{out}");
    assert!(out.contains("1 sales checked"), "{out}");
}

#[test]
fn a_worker_registers_again_when_redis_lost_the_workers_set() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let members = || -> Vec<String> {
        redis::cmd("SMEMBERS")
            .arg(seckill_common::keys::WORKERS)
            .query(&mut redis.con())
            .unwrap()
    };
    wait_until(Duration::from_secs(10), "w1 registered", || {
        members() == vec!["w1".to_string()]
    });
    // Redis lost it (an empty restart, an older AOF): back with the next
    // heartbeat (a third of the 3 s TTL), so its lists can be reclaimed.
    let _: () = redis::cmd("DEL")
        .arg(seckill_common::keys::WORKERS)
        .query(&mut redis.con())
        .unwrap();
    wait_until(Duration::from_secs(5), "w1 registered again", || {
        members() == vec!["w1".to_string()]
    });
}

#[test]
fn a_sale_closed_for_a_minute_whose_keys_are_gone_is_one_finding_and_no_pause() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    // Ended 90 s ago, once watched (MySQL holds its marks).
    let sale = create_sale(&db, &redis, 10, -120_000, 30_000);
    let mut c = db.conn();
    mysql::prelude::Queryable::query_drop(
        &mut c,
        format!(
            "INSERT INTO sale_redis_state (sale_id, seq_high, checkpoint_high) VALUES ({sale}, 3, 40)"
        ),
    )
    .unwrap();
    for key in [SaleKeys::new(sale).meta(), SaleKeys::new(sale).stock()] {
        let _: () = redis::cmd("DEL").arg(key).query(&mut redis.con()).unwrap();
    }
    // Not a loss to pause for (no purchase can come), but one
    // redis_data_loss finding that `sale repair` settles, not the books'
    // stock_mismatch (keys removed on purpose are an archive, which MySQL
    // records).
    let (code, out) = reconciler(&redis, &db, &dir, &["run"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("observed [redis_data_loss 1], 1 new"), "{out}");
    let paused: i64 = db.count(&format!(
        "SELECT COUNT(*) FROM sale_redis_state WHERE sale_id = {sale} AND paused_reason IS NOT NULL"
    ));
    assert_eq!(paused, 0);
}
