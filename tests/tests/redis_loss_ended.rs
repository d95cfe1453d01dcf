//! Specifies the settlement of a sale that Redis lost after it ended, with
//! the real gateway, worker and reconciler on a private Redis and MySQL:
//! an ended sale that lost its keys is one `redis_data_loss` finding (not
//! an `order_without_flow` per order and a `stock_mismatch`), `sale load`
//! refuses it, `sale repair --dry-run` says what the repair would write and
//! writes nothing, and `sale repair` rebuilds it from MySQL so the next run
//! finds it clean and it can be archived; an archived sale's tombstone lost
//! with Redis is written again by `run` and by `sale repair`, so late
//! buyers hear 403 `sale_ended`, not 404.

use crate::support::gateway as gw;
use crate::support::worker as wk;

use gw::{buy, Gateway};
use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_tests::{reconciler, RedisServer, TempDir, TestDb};
use std::path::Path;
use std::time::{Duration, Instant};
use wk::{wait_orders, Opts, WorkerProc};

const LONG: Duration = Duration::from_secs(60);

/// The open findings: (kind, subject).
fn open_findings(redis: &RedisServer, db: &TestDb, review: &Path) -> Vec<(String, String)> {
    let (code, out) = reconciler(redis, db, review, &["findings", "--json"]);
    assert_eq!(code, 0, "{out}");
    let v: Vec<serde_json::Value> = serde_json::from_str(&out).expect("findings JSON");
    let mut f: Vec<(String, String)> = v
        .iter()
        .map(|f| {
            (
                f["kind"].as_str().unwrap_or("").to_string(),
                f["subject"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    f.sort();
    f
}

/// The audit rows of sale `id` or its findings: (actor, action, result).
fn audit(review: &Path, id: u64) -> Vec<(String, String, String)> {
    let c = rusqlite::Connection::open(review).unwrap();
    let mut st = c
        .prepare(
            "SELECT actor, action, result FROM actions WHERE (sale_id = ?1 OR finding_id IN
               (SELECT id FROM findings WHERE sale_id = ?1)) AND actor <> 'reconciler'
             ORDER BY id",
        )
        .unwrap();
    let r = st
        .query_map([id as i64], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap();
    r.collect::<Result<_, _>>().unwrap()
}

fn row(actor: &str, action: &str, result: &str) -> (String, String, String) {
    (actor.into(), action.into(), result.into())
}

/// Moves sale `id`'s window into the past in MySQL: it ended `ago_s`
/// seconds ago (a sale ended that long before Redis lost it); its orders
/// move with it, to a second before the end, so that they stay reserved
/// inside the window (else each is an `order_outside_window` finding).
fn ended_ago(db: &TestDb, id: u64, ago_s: u64) {
    let mut c = db.conn();
    c.exec_drop(
        "UPDATE sales SET starts_at = UTC_TIMESTAMP(3) - INTERVAL 2 HOUR,
                ends_at = UTC_TIMESTAMP(3) - INTERVAL ? SECOND WHERE id = ?",
        (ago_s, id),
    )
    .unwrap();
    c.exec_drop(
        "UPDATE orders o JOIN sales s ON s.id = o.sale_id
         SET o.reserved_at = s.ends_at - INTERVAL 1 SECOND
         WHERE o.sale_id = ? AND o.reserved_at >= s.ends_at",
        (id,),
    )
    .unwrap();
}

/// Buys as `user` until the answer's (status, error) is `want`, for at most
/// a second; panics with the last answer otherwise.
fn answered(port: u16, sale: u64, user: &str, want: (u16, &str)) {
    let since = Instant::now();
    loop {
        let r = buy(port, sale, user);
        if (r.status, r.error().as_str()) == want {
            return;
        }
        assert!(
            since.elapsed() < Duration::from_secs(1),
            "sale {sale}: {want:?} not answered within 1 s; last {} {}",
            r.status,
            r.body
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_ended_sale_that_lost_its_keys_is_repaired_from_mysql_and_then_archived() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let (id, _) = seckill_tests::sale_created(&redis, &db, &review, "END-1", 10, &[]);
    let s = id.to_string();
    let g = Gateway::start(&redis, &[]);
    {
        let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
        for i in 0..6 {
            assert_eq!(buy(g.port, id, &format!("u-{i}")).status, 202);
        }
        wait_orders(&db, id, 6, LONG);
        wk::wait_drained(&redis, id, LONG);
    }
    ended_ago(&db, id, 120);
    let _: () = redis::cmd("FLUSHALL").query(&mut redis.con()).unwrap();

    let (code, out) = reconciler(&redis, &db, &review, &["run"]);
    assert_eq!(code, 1, "{out}");
    let loss = vec![("redis_data_loss".to_string(), "sale".to_string())];
    assert_eq!(open_findings(&redis, &db, &review), loss);
    let (code, out) = reconciler(&redis, &db, &review, &["sale", "load", &s]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("sale repair {s} --by NAME")), "{out}");

    let (code, out) = reconciler(
        &redis,
        &db,
        &review,
        &["sale", "repair", &s, "--by", "oncall", "--dry-run"],
    );
    assert_eq!(
        (code, out),
        (
            0,
            format!(
                "dry run, nothing changed: rebuild sale {id}'s Redis state from MySQL: \
                 6 orders (6 units held), stock 4 of 10 in 1 bucket(s)\n"
            )
        )
    );
    let keys: usize = redis::cmd("DBSIZE").query(&mut redis.con()).unwrap();
    assert_eq!(keys, 0, "the dry run wrote to Redis");
    assert_eq!(audit(&review, id), []);

    let (code, out) = reconciler(
        &redis,
        &db,
        &review,
        &["sale", "repair", &s, "--by", "oncall"],
    );
    assert_eq!(code, 0, "{out}");
    let k = SaleKeys::new(id);
    let mut con = redis.con();
    let stock: i64 = con.get(k.stock()).unwrap();
    let flows: usize = con.hlen(k.flow()).unwrap();
    let buyers: usize = con.hlen(k.buyers()).unwrap();
    assert_eq!((stock, flows, buyers), (4, 6, 6));
    assert_eq!(
        audit(&review, id),
        [
            row("oncall", "repair", "started"),
            row("oncall", "repair", "done")
        ]
    );
    answered(g.port, id, "late", (403, "sale_ended"));

    let (code, out) = reconciler(&redis, &db, &review, &["run"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(open_findings(&redis, &db, &review), []);
    let (code, out) = reconciler(
        &redis,
        &db,
        &review,
        &["sale", "archive", &s, "--by", "oncall"],
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        db.count(&format!("SELECT COUNT(*) FROM orders WHERE sale_id = {id}")),
        6
    );
}

#[test]
fn an_archived_sales_tombstone_lost_with_redis_is_written_again() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let (id, _) = seckill_tests::sale_created(&redis, &db, &review, "END-2", 3, &[]);
    let s = id.to_string();
    ended_ago(&db, id, 120);
    let (code, out) = reconciler(&redis, &db, &review, &["run"]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = reconciler(&redis, &db, &review, &["sale", "archive", &s, "--by", "op"]);
    assert_eq!(code, 0, "{out}");
    let g = Gateway::start(&redis, &[]);
    answered(g.port, id, "late", (403, "sale_ended"));
    let meta = SaleKeys::new(id).meta();
    let archived_at: String = redis.con().hget(&meta, "archived_at_ms").unwrap();

    // Lost with Redis: late buyers would hear 404; the next run writes it.
    let _: () = redis::cmd("FLUSHALL").query(&mut redis.con()).unwrap();
    answered(g.port, id, "late", (404, "sale_not_found"));
    let (code, out) = reconciler(&redis, &db, &review, &["run"]);
    assert_eq!(code, 0, "{out}");
    let again: String = redis.con().hget(&meta, "archived_at_ms").unwrap();
    assert_eq!(again, archived_at);
    answered(g.port, id, "late", (403, "sale_ended"));

    // And `sale repair`, audited, for a sale beyond the run's lookback.
    let _: () = redis::cmd("FLUSHALL").query(&mut redis.con()).unwrap();
    let (code, out) = reconciler(
        &redis,
        &db,
        &review,
        &["sale", "repair", &s, "--by", "oncall"],
    );
    assert_eq!(
        (code, out),
        (
            0,
            format!(
                "done: sale {id} is archived and Redis had lost its tombstone: written \
                 again (late buyers hear 403 sale_ended)\n"
            )
        )
    );
    answered(g.port, id, "late", (403, "sale_ended"));
    let (code, out) = reconciler(
        &redis,
        &db,
        &review,
        &["sale", "repair", &s, "--by", "oncall"],
    );
    assert_eq!(
        (code, out),
        (
            0,
            format!("sale {id} is archived and its tombstone is in Redis; nothing to repair\n")
        )
    );
    let archive = row("op", "archive", "done");
    assert_eq!(
        audit(&review, id),
        [
            archive,
            row("oncall", "repair", "started"),
            row("oncall", "repair", "done")
        ]
    );
}
