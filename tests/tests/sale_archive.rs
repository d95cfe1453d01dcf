//! Specifies the end of a sale (`seckill-reconciler sale archive`, and
//! `run`'s own archive `SECKILL_ARCHIVE_AFTER` past the end) with the real
//! gateway, worker and reconciler on a private Redis and MySQL: ten sales
//! of every kind (paid, expired, final at creation, split over buckets)
//! run and end; each one ready is archived exactly once, by hand or by
//! `run`, leaving nothing in Redis but its tombstone; a sale not ended or
//! with an open finding is refused with nothing changed; a late buyer
//! still hears 403 `sale_ended`; the next runs find nothing.

use crate::support::gateway as gw;
use crate::support::worker as wk;

use gw::{buy, get, Gateway};
use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_common::payment::{enqueue, PaymentMessage};
use seckill_tests::{RedisServer, TempDir, TestDb};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use wk::{wait_orders, Opts, WorkerProc};

const LONG: Duration = Duration::from_secs(120);

/// Every key of the private Redis (`SCAN`), with its type, sorted.
fn all_keys(redis: &RedisServer) -> Vec<(String, String)> {
    let mut con = redis.con();
    let keys: Vec<String> = con.scan().unwrap().collect::<Result<_, _>>().unwrap();
    let mut out: Vec<(String, String)> = keys
        .into_iter()
        .map(|k| {
            let t: String = redis::cmd("TYPE").arg(&k).query(&mut con).unwrap();
            (k, t)
        })
        .collect();
    out.sort();
    out
}

/// Every key of every sale, with its type, and the content of sale
/// `id`'s keys of bucket 0 (its meta without the workers' `checkpoint`
/// and its stamps,
/// which their data-loss watch moves while the sale is live): what a
/// refused archive must leave as it was. (Processing lists come and go:
/// a blocking take of an empty queue creates and drops one.)
fn sales_state(redis: &RedisServer, id: u64) -> (Vec<(String, String)>, Vec<String>) {
    let keys: Vec<(String, String)> = all_keys(redis)
        .into_iter()
        .filter(|(k, _)| k.contains("{sale:") && !k.contains(":processing:"))
        .collect();
    let mut con = redis.con();
    let mut content = Vec::new();
    for (k, t) in keys
        .iter()
        .filter(|(k, _)| k.contains(&format!("{{sale:{id}}}")))
    {
        let v = match t.as_str() {
            "hash" => {
                let mut h: BTreeMap<String, String> = con.hgetall(k).unwrap();
                for watched in ["checkpoint", "check_stamp", "check_stamp_local"] {
                    h.remove(watched);
                }
                format!("{h:?}")
            }
            "list" => format!("{:?}", con.lrange::<_, Vec<String>>(k, 0, -1).unwrap()),
            _ => format!("{:?}", con.get::<_, Option<String>>(k).unwrap()),
        };
        content.push(format!("{k} {v}"));
    }
    (keys, content)
}

/// The keys of sale `id` (any bucket) among `keys`.
fn keys_of(keys: &[(String, String)], id: u64) -> Vec<String> {
    let (tag, split) = (format!("{{sale:{id}}}"), format!("{{sale:{id}:b"));
    keys.iter()
        .filter(|(k, _)| k.contains(&tag) || k.contains(&split))
        .map(|(k, _)| k.clone())
        .collect()
}

/// `seckill-reconciler ARGS` with `SECKILL_ARCHIVE_AFTER=after`.
fn reconciler(
    redis: &RedisServer,
    db: &TestDb,
    review: &Path,
    after: &str,
    args: &[&str],
) -> (i32, String) {
    let out = seckill_tests::command("seckill-reconciler")
        .env("SECKILL_REDIS_URL", redis.url())
        .env("SECKILL_MYSQL_URL", db.url())
        .env("SECKILL_REVIEW_DB", review)
        .env("SECKILL_RECONCILE_GRACE", "0s")
        .env("SECKILL_ARCHIVE_AFTER", after)
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// Moves sale `id`'s window `by_ms` into the past, in MySQL and in every
/// bucket's Redis meta, and its orders' `reserved_at` with it
/// ([`age_orders`]): the sale ended that long before it would have.
fn age(db: &TestDb, redis: &RedisServer, id: u64, buckets: u32, by_ms: u64) {
    db.conn()
        .exec_drop(
            "UPDATE sales SET starts_at = starts_at - INTERVAL ? SECOND,
                              ends_at = ends_at - INTERVAL ? SECOND
             WHERE id = ?",
            (by_ms / 1000, by_ms / 1000, id),
        )
        .unwrap();
    age_orders(db, id, by_ms);
    let mut con = redis.con();
    for b in 0..buckets {
        let meta = SaleKeys::bucket(id, b).meta();
        for f in ["starts_at_ms", "ends_at_ms"] {
            let _: i64 = con.hincr(&meta, f, -(by_ms as i64)).unwrap();
        }
    }
}

/// Moves the `reserved_at` of sale `id`'s orders reserved at or after its
/// (aged) end `by_ms` back, into the window they were reserved in (else
/// they are `order_outside_window` findings and the sale is not clean).
fn age_orders(db: &TestDb, id: u64, by_ms: u64) {
    db.conn()
        .exec_drop(
            "UPDATE orders o JOIN sales s ON s.id = o.sale_id
             SET o.reserved_at = o.reserved_at - INTERVAL ? SECOND
             WHERE o.sale_id = ? AND o.reserved_at >= s.ends_at",
            (by_ms / 1000, id),
        )
        .unwrap();
}

fn pay(redis: &RedisServer, rid: &str, payment_id: &str) {
    let m = PaymentMessage {
        v: 1,
        reservation_id: rid.into(),
        payment_id: payment_id.into(),
        amount_cents: 1999,
        received_ms: seckill_common::now_ms(),
    };
    enqueue(&mut redis.con(), &m).unwrap();
}

/// The archive rows of the audit log: (sale, actor, result), by sale.
fn archive_rows(review: &Path) -> Vec<(i64, String, String)> {
    let c = rusqlite::Connection::open(review).unwrap();
    let mut st = c
        .prepare(
            "SELECT sale_id, actor, result FROM actions WHERE action = 'archive'
             ORDER BY sale_id, id",
        )
        .unwrap();
    let rows = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap();
    rows.collect::<Result<_, _>>().unwrap()
}

/// The sales of [`ten_ended_sales_are_archived_once_each_leaving_only_tombstones`]
/// and what serves them (the gateway and the worker stop first).
struct TenSales {
    g: Gateway,
    _w: WorkerProc,
    first: u64,
    late_sale: u64,
    sales: Vec<(u64, u32)>,
    review: std::path::PathBuf,
    _dir: TempDir,
    db: TestDb,
    redis: RedisServer,
}

/// Ten sales of every kind, three orders each: 1-3 paid, 4-6 expired
/// (sale 4 with a late payment), 7-9 final at creation, 10 split over
/// 3 buckets; none ended yet.
fn ten_sales_bought_paid_and_expired() -> TenSales {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    // 1-3: every order paid; 4-6: every order expired (1 ms window);
    // 7-9: final at creation; 10: final at creation, split over 3 buckets.
    let mut sales: Vec<(u64, u32)> = Vec::new();
    for window in ["1h", "1h", "1h", "1ms", "1ms", "1ms"] {
        let id = seckill_tests::create_windowed_sale(&redis, &db, &review, 3, window);
        sales.push((id, 1));
    }
    for _ in 0..3 {
        sales.push((
            seckill_tests::create_sale(&db, &redis, 3, -1000, 3_600_000),
            1,
        ));
    }
    sales.push((
        seckill_tests::create_split_sale(&db, &redis, 3, -1000, 3_600_000, 3),
        3,
    ));
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let g = Gateway::start(&redis, &[]);
    for &(id, _) in &sales {
        for u in 0..3 {
            let r = buy(g.port, id, &format!("s{id}-u{u}"));
            assert_eq!(r.status, 202, "sale {id}: {}", r.body);
        }
    }
    for &(id, _) in &sales {
        wait_orders(&db, id, 3, LONG);
    }
    let rids = |id: u64| -> Vec<String> {
        db.conn()
            .exec(
                "SELECT reservation_id FROM orders WHERE sale_id = ? ORDER BY user_id",
                (id,),
            )
            .unwrap()
    };
    for &(id, _) in &sales[..3] {
        for (i, rid) in rids(id).iter().enumerate() {
            pay(&redis, rid, &format!("pay-{id}-{i}"));
        }
    }
    // A payment after sale 4's orders expired: an open `late_payment`.
    let (late_sale, _) = sales[3];
    seckill_tests::wait_until(LONG, "every order final and released in Redis", || {
        db.count(
            "SELECT COUNT(*) FROM orders WHERE status IN ('paid', 'confirmed')
               OR (status = 'expired' AND redis_released_at IS NOT NULL)",
        ) == 30
    });
    pay(&redis, &rids(late_sale)[0], "pay-late");
    seckill_tests::wait_until(LONG, "the late payment recorded", || {
        db.count("SELECT COUNT(*) FROM payments WHERE outcome = 'late_payment'") == 1
    });
    TenSales {
        g,
        _w,
        first: sales[0].0,
        late_sale,
        sales,
        review,
        _dir: dir,
        db,
        redis,
    }
}

/// Refusals that change nothing: not ended; ended (aged two hours) but
/// no run since it settled; an open finding.
fn archives_before_their_time_are_refused(t: &TenSales) {
    let redis = &t.redis;
    let db = &t.db;
    let review = t.review.as_path();
    let sales = t.sales.clone();
    let first = t.first;
    let late_sale = t.late_sale;
    // Not ended: refused, nothing changed.
    let before = sales_state(redis, first);
    let (code, out) = reconciler(
        redis,
        db,
        review,
        "off",
        &["sale", "archive", &first.to_string(), "--by", "op"],
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("a minute (or SECKILL_RECONCILE_GRACE) after its end, not before"),
        "{out}"
    );
    assert_eq!(sales_state(redis, first), before);

    for &(id, k) in &sales {
        age(db, redis, id, k, 2 * 3_600_000);
    }
    // Ended two hours ago, but no run has started since it settled (its end
    // + the grace): refused, and the refusal names that time (a run before
    // it does not count).
    let before = sales_state(redis, first);
    let (code, out) = reconciler(
        redis,
        db,
        review,
        "off",
        &["sale", "archive", &first.to_string(), "--by", "op"],
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "no reconciliation run has checked sale {first} since it settled at "
        )) && out.contains("(its end + the grace): run `seckill-reconciler run` first"),
        "{out}"
    );
    assert_eq!(sales_state(redis, first), before);
    let (code, out) = reconciler(redis, db, review, "off", &["run"]);
    assert_eq!(code, 1, "the late payment is open: {out}");
    // With an open finding: refused, nothing changed.
    let before = sales_state(redis, late_sale);
    let (code, out) = reconciler(
        redis,
        db,
        review,
        "off",
        &["sale", "archive", &late_sale.to_string(), "--by", "op"],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("1 open finding(s)"), "{out}");
    assert_eq!(sales_state(redis, late_sale), before);
    assert_eq!(
        db.count("SELECT COUNT(*) FROM sales WHERE archived_at IS NOT NULL"),
        0
    );
}

/// Sale 1 archived by hand, the others by `run`, but the one with an
/// open finding: only each tombstone is left in Redis.
fn archives_by_hand_and_by_run_leave_only_tombstones(t: &TenSales) {
    let redis = &t.redis;
    let db = &t.db;
    let review = t.review.as_path();
    let sales = t.sales.clone();
    let first = t.first;
    let late_sale = t.late_sale;
    // By hand, then by `run` (ended 2 h ago, past the default 1 h).
    let (code, out) = reconciler(
        redis,
        db,
        review,
        "off",
        &["sale", "archive", &first.to_string(), "--by", "op"],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(&format!("archived sale {first}")), "{out}");
    let (code, out) = reconciler(redis, db, review, "1h", &["run"]);
    assert_eq!(code, 1, "the late payment is still open: {out}");

    let keys = all_keys(redis);
    for &(id, _) in &sales {
        let mine = keys_of(&keys, id);
        if id == late_sale {
            assert!(mine.contains(&SaleKeys::new(id).released()), "{mine:?}");
            continue;
        }
        assert_eq!(mine, [SaleKeys::new(id).meta()], "sale {id}");
        let meta: BTreeMap<String, String> = redis.con().hgetall(SaleKeys::new(id).meta()).unwrap();
        let fields: Vec<&str> = meta.keys().map(String::as_str).collect();
        assert_eq!(
            fields,
            [
                "archived_at_ms",
                "ends_at_ms",
                "starts_at_ms",
                "stock_left",
                "total_stock"
            ]
        );
        assert_eq!(meta["total_stock"], "3");
        // Every order paid or confirmed: none left; expired: all back.
        let left = if sales[3..6].iter().any(|&(s, _)| s == id) {
            "3"
        } else {
            "0"
        };
        assert_eq!(meta["stock_left"], left, "sale {id}");
        let member: bool = redis
            .con()
            .sismember(seckill_common::keys::SALES, id)
            .unwrap();
        assert!(!member, "sale {id} left seckill:sales");
    }
    assert_eq!(
        db.count("SELECT COUNT(*) FROM sales WHERE archived_at IS NOT NULL"),
        9
    );
}

/// A late buyer, in a plain and in the split sale: 403 `sale_ended`.
fn late_buyers_hear_sale_ended(t: &TenSales) {
    let g = &t.g;
    let sales = t.sales.clone();
    // A late buyer, in a plain and in the split sale: 403 sale_ended.
    for &(id, _) in [sales[1], sales[9]].iter() {
        let r = buy(g.port, id, "late-buyer");
        assert_eq!(
            (r.status, r.error()),
            (403, "sale_ended".to_string()),
            "sale {id}"
        );
        let r = get(g.port, &format!("/v1/sales/{id}"));
        assert_eq!((r.status, r.json()["state"].clone()), (200, "ended".into()));
    }
}

/// The finding settled (dismissed: refunded), the next run archives the
/// last sale and leaves no open finding, the one after too; an archived
/// sale's payments are still checked (the dismissed one is still seen,
/// and stays closed).
fn the_settled_finding_lets_run_archive_the_last(t: &TenSales) {
    let redis = &t.redis;
    let db = &t.db;
    let review = t.review.as_path();
    let sales = t.sales.clone();
    let late_sale = t.late_sale;
    // The finding settled (dismissed: refunded), the next run archives the
    // last sale and leaves no open finding, the one after too; an archived
    // sale's payments are still checked (the dismissed one is still seen,
    // and stays closed).
    let (_, json) = reconciler(redis, db, review, "1h", &["findings", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let open: Vec<(String, i64)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["kind"].as_str().unwrap().to_string(),
                f["sale_id"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(open, [("late_payment".to_string(), late_sale as i64)]);
    let fid = v[0]["id"].as_i64().unwrap().to_string();
    let (code, out) = reconciler(
        redis,
        db,
        review,
        "1h",
        &[
            "resolve",
            &fid,
            "--dismiss",
            "--by",
            "op",
            "--note",
            "refunded",
        ],
    );
    assert_eq!(code, 0, "{out}");
    for _ in 0..2 {
        let (code, out) = reconciler(redis, db, review, "1h", &["run"]);
        assert_eq!(code, 0, "{out}");
        // The dismissed finding, still there, is no news for the run.
        assert!(
            out.contains("observed [], 0 new, 0 reopened, 0 auto-fixed, 0 open"),
            "{out}"
        );
    }
    let keys = all_keys(redis);
    for &(id, _) in &sales {
        assert_eq!(keys_of(&keys, id), [SaleKeys::new(id).meta()], "sale {id}");
    }
    assert_eq!(
        db.count("SELECT COUNT(*) FROM sales WHERE archived_at IS NOT NULL"),
        10
    );
}

/// Once each in the audit log, with the three refusals; a repeat by hand
/// changes nothing and says so.
fn each_archive_is_audited_once(t: &TenSales) {
    let redis = &t.redis;
    let db = &t.db;
    let review = t.review.as_path();
    let sales = t.sales.clone();
    let first = t.first;
    let late_sale = t.late_sale;
    // Once each in the audit log, with the three refusals; a repeat by hand
    // changes nothing and says so.
    let (code, out) = reconciler(
        redis,
        db,
        review,
        "off",
        &["sale", "archive", &first.to_string(), "--by", "op"],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("by op; nothing changed"), "{out}");
    let mut want: Vec<(i64, String, String)> = Vec::new();
    for &(id, _) in &sales {
        let id = id as i64;
        let row = |actor: &str, result: &str| (id, actor.to_string(), result.to_string());
        if id == first as i64 {
            want.extend([
                row("op", "refused"),
                row("op", "refused"),
                row("op", "done"),
                row("op", "no_change"),
            ]);
        } else if id == late_sale as i64 {
            want.extend([row("op", "refused"), row("reconciler", "done")]);
        } else {
            want.push(row("reconciler", "done"));
        }
    }
    assert_eq!(archive_rows(review), want);
}

/// `sale show` says archived, by whom.
fn sale_show_says_archived_by_whom(t: &TenSales) {
    let redis = &t.redis;
    let db = &t.db;
    let review = t.review.as_path();
    let sales = t.sales.clone();
    let first = t.first;
    // `sale show` says archived, by whom.
    for &(id, _) in &sales {
        let (code, out) = reconciler(redis, db, review, "off", &["sale", "show", &id.to_string()]);
        assert_eq!(code, 0, "{out}");
        let by = if id == first { "op" } else { "reconciler" };
        let line = out
            .lines()
            .find(|l| l.starts_with("archived "))
            .unwrap_or_default();
        assert!(line.ends_with(&format!(" by {by}: Redis keeps only its window (a late buyer hears sale_ended); MySQL and the review file keep the rest")), "sale {id}: {out}");
    }
}

#[test]
fn ten_ended_sales_are_archived_once_each_leaving_only_tombstones() {
    let t = ten_sales_bought_paid_and_expired();
    archives_before_their_time_are_refused(&t);
    archives_by_hand_and_by_run_leave_only_tombstones(&t);
    late_buyers_hear_sale_ended(&t);
    the_settled_finding_lets_run_archive_the_last(&t);
    each_archive_is_audited_once(&t);
    sale_show_says_archived_by_whom(&t);
}

/// An archive killed after MySQL's decision and before its Redis step (the
/// state such a kill leaves: `archived_at` and `archived_by` set, every key
/// still in Redis, no audit row) is finished by the next `run`, recorded
/// once under the operator who asked, and never again.
#[test]
fn an_archive_interrupted_after_mysql_is_finished_by_the_next_run_once() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let id = seckill_tests::create_split_sale(&db, &redis, 2, -1000, 3_600_000, 2);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let g = Gateway::start(&redis, &[]);
    for u in 0..2 {
        assert_eq!(buy(g.port, id, &format!("u{u}")).status, 202);
    }
    wait_orders(&db, id, 2, LONG);
    age(&db, &redis, id, 2, 2 * 3_600_000);
    let (code, out) = reconciler(&redis, &db, &review, "off", &["run"]);
    assert_eq!(code, 0, "{out}");
    assert!(keys_of(&all_keys(&redis), id).len() > 1);
    db.conn()
        .exec_drop(
            "UPDATE sales SET archived_at = UTC_TIMESTAMP(3), archived_by = 'alice' WHERE id = ?",
            (id,),
        )
        .unwrap();
    for _ in 0..2 {
        let (code, out) = reconciler(&redis, &db, &review, "off", &["run"]);
        assert_eq!(code, 0, "{out}");
        assert_eq!(keys_of(&all_keys(&redis), id), [SaleKeys::new(id).meta()]);
        assert_eq!(
            archive_rows(&review),
            [(id as i64, "alice".to_string(), "done".to_string())]
        );
    }
    // Its keys back from a snapshot older than the archive: the next run removes them again, the tombstone stays.
    let mut con = redis.con();
    let _: () = con.set(SaleKeys::new(id).stock(), 2).unwrap();
    let _: () = con.set(SaleKeys::bucket(id, 1).stock(), 1).unwrap();
    let _: () = con.sadd(seckill_common::keys::SALES, id).unwrap();
    let (code, out) = reconciler(&redis, &db, &review, "off", &["run"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(keys_of(&all_keys(&redis), id), [SaleKeys::new(id).meta()]);
    // The tombstone lost: `sale load` must not put the
    // archived sale back on sale; refused, nothing written.
    let _: () = redis.con().del(SaleKeys::new(id).meta()).unwrap();
    let (code, out) = reconciler(
        &redis,
        &db,
        &review,
        "off",
        &["sale", "load", &id.to_string()],
    );
    assert_eq!(
        (code, out.trim()),
        (
            1,
            format!("seckill-reconciler: sale {id} was archived by alice: it stays out of Redis; nothing loaded").as_str()
        )
    );
    assert_eq!(keys_of(&all_keys(&redis), id), Vec::<String>::new());
}

/// Reservations still queued when the sale ended (the workers were down)
/// are no finding (they are on their way), but archiving would delete
/// them: refused until the workers have made them orders.
#[test]
fn a_sale_whose_reservations_are_still_queued_is_not_archived() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let id = seckill_tests::create_sale(&db, &redis, 3, -1000, 3_600_000);
    wk::reserve_users(&redis, id, "u", 2);
    age(&db, &redis, id, 1, 2 * 3_600_000);
    let (code, out) = reconciler(&redis, &db, &review, "1h", &["run"]);
    assert_eq!(code, 0, "{out}");
    let before = sales_state(&redis, id);
    let (code, out) = reconciler(
        &redis,
        &db,
        &review,
        "off",
        &["sale", "archive", &id.to_string(), "--by", "op"],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("2 order message(s) still queued"), "{out}");
    assert_eq!(sales_state(&redis, id), before);
    assert_eq!(
        db.count("SELECT COUNT(*) FROM sales WHERE archived_at IS NOT NULL"),
        0
    );

    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    wait_orders(&db, id, 2, LONG);
    wk::wait_drained(&redis, id, LONG);
    age_orders(&db, id, 2 * 3_600_000);
    let (code, out) = reconciler(&redis, &db, &review, "1h", &["run"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(keys_of(&all_keys(&redis), id), [SaleKeys::new(id).meta()]);
    assert_eq!(
        archive_rows(&review),
        [
            (id as i64, "op".to_string(), "refused".to_string()),
            (id as i64, "reconciler".to_string(), "done".to_string())
        ]
    );
}

/// A sale of 6 units split over 3 buckets, one unit bought in each bucket
/// through the gateway on `port` and made an order by the running worker,
/// every message applied, then ended 2 h ago (MySQL and Redis). Returns
/// its id.
fn ended_split_sale(redis: &RedisServer, db: &TestDb, port: u16) -> u64 {
    let id = seckill_tests::create_split_sale(db, redis, 6, -1000, 3_600_000, 3);
    for b in 0..3 {
        let u = &seckill_tests::users_of("buyer", b, 3, 1)[0];
        let r = buy(port, id, u);
        assert_eq!(r.status, 202, "{u}: {}", r.body);
    }
    wait_orders(db, id, 3, LONG);
    seckill_tests::wait_until(LONG, "every order message applied", || {
        seckill_common::archive::messages_on_their_way(&mut redis.con(), id).unwrap() == 0
    });
    age(db, redis, id, 3, 2 * 3_600_000);
    id
}

/// `sale rebalance` of an archived split sale is refused as archived
/// (exit 1, as `sale load` of one), and nothing is written: its tombstone
/// keeps no bucket count, so it must not be taken for a sale of one bucket
/// ("sale N has one bucket: nothing to move", exit 0).
#[test]
fn rebalancing_an_archived_split_sale_is_refused_as_archived() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let g = Gateway::start(&redis, &[]);
    let id = ended_split_sale(&redis, &db, g.port);
    let (code, out) = reconciler(&redis, &db, &review, "1h", &["run"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        archive_rows(&review),
        [(id as i64, "reconciler".into(), "done".into())]
    );
    let before = sales_state(&redis, id);
    assert_eq!(keys_of(&before.0, id), [SaleKeys::new(id).meta()]);

    let (code, out) = reconciler(
        &redis,
        &db,
        &review,
        "1h",
        &["sale", "rebalance", &id.to_string()],
    );
    assert_eq!(
        (code, out.trim()),
        (
            1,
            format!(
                "seckill-reconciler: sale {id} was archived by reconciler: its buckets are gone \
                 from Redis on purpose; nothing moved"
            )
            .as_str()
        )
    );
    assert_eq!(sales_state(&redis, id), before);
}

/// An archive of a split sale killed half-way, after MySQL's decision,
/// answers every late buyer 403 `sale_ended` at once, as the whole archive
/// does, and the next `run` finishes it, once (not 503 for the removed
/// buckets' buyers until that run). Both kill points are
/// made by hand as the killed command left them: (a) buckets 2 and 1
/// removed, bucket 0 whole (the order of an older build, and what a
/// gateway routing by the K it remembers meets); (b) this build's first
/// step alone, bucket 0's tombstone written, buckets 1 and 2 whole.
#[test]
fn a_split_sale_archive_killed_half_way_answers_sale_ended_and_run_finishes_it() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let g = Gateway::start(&redis, &[]);
    let (a, b) = (
        ended_split_sale(&redis, &db, g.port),
        ended_split_sale(&redis, &db, g.port),
    );
    let (code, out) = reconciler(&redis, &db, &review, "off", &["run"]);
    assert_eq!(code, 0, "{out}");
    for id in [a, b] {
        db.conn()
            .exec_drop(
                "UPDATE sales SET archived_at = UTC_TIMESTAMP(3), archived_by = 'alice'
                 WHERE id = ?",
                (id,),
            )
            .unwrap();
    }
    let mut con = redis.con();
    let workers: Vec<String> = con.smembers(seckill_common::keys::WORKERS).unwrap();
    // (a) Buckets 2 and 1 removed, as the killed archive removed them.
    for bucket in [2, 1] {
        let k = SaleKeys::bucket(a, bucket);
        let _: () = con.del(k.meta()).unwrap();
        for key in seckill_common::archive::bucket_keys(k, &workers) {
            let _: () = con.del(key).unwrap();
        }
    }
    // (b) Bucket 0's tombstone alone.
    let meta: BTreeMap<String, u64> = con.hgetall(SaleKeys::new(b).meta()).unwrap();
    let t = seckill_common::archive::Tombstone {
        starts_at_ms: meta["starts_at_ms"],
        ends_at_ms: meta["ends_at_ms"],
        total_stock: 6,
        stock_left: 3,
        archived_at_ms: seckill_common::now_ms(),
    };
    seckill_common::archive::write_tombstone(&mut con, b, &workers, &t).unwrap();
    assert!(keys_of(&all_keys(&redis), b).len() > 1);

    for id in [a, b] {
        let mut answers: BTreeMap<(u16, String), usize> = BTreeMap::new();
        // The removed buckets first: a `sale_ended` from bucket 0 would be
        // remembered for 500 ms and answer the others from memory.
        for bucket in [2, 1, 0] {
            let mut users = seckill_tests::users_of("late", bucket, 3, 2);
            users.extend(seckill_tests::users_of("buyer", bucket, 3, 1));
            for u in &users {
                let r = buy(g.port, id, u);
                *answers.entry((r.status, r.error())).or_default() += 1;
            }
        }
        assert_eq!(
            answers,
            BTreeMap::from([((403, "sale_ended".to_string()), 9)]),
            "sale {id}"
        );
        let r = get(g.port, &format!("/v1/sales/{id}"));
        assert_eq!((r.status, r.json()["state"].clone()), (200, "ended".into()));
    }

    for _ in 0..2 {
        let (code, out) = reconciler(&redis, &db, &review, "off", &["run"]);
        assert_eq!(code, 0, "{out}");
        let keys = all_keys(&redis);
        for id in [a, b] {
            assert_eq!(keys_of(&keys, id), [SaleKeys::new(id).meta()], "sale {id}");
        }
        assert_eq!(
            archive_rows(&review),
            [
                (a as i64, "alice".to_string(), "done".to_string()),
                (b as i64, "alice".to_string(), "done".to_string())
            ]
        );
    }
}

/// `GET /v1/sales/{id}` of an archived sale says what its purchases say,
/// `ended`, with the stock it ended with (what the same read said just
/// before the archive) and when it was archived (not `stock_remaining` 0,
/// as if it had sold out).
#[test]
fn an_archived_sale_reads_as_ended_with_the_stock_it_ended_with() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let g = Gateway::start(&redis, &[]);
    let id = ended_split_sale(&redis, &db, g.port);
    let path = format!("/v1/sales/{id}");
    let before = get(g.port, &path);
    assert_eq!(before.status, 200);
    let mut want = before.json();
    assert_eq!(
        (want["stock_remaining"].clone(), want["state"].clone()),
        (3.into(), "ended".into())
    );

    let (code, out) = reconciler(&redis, &db, &review, "1h", &["run"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(keys_of(&all_keys(&redis), id), [SaleKeys::new(id).meta()]);
    let at: i64 = db.count(&format!(
        "SELECT CAST(UNIX_TIMESTAMP(archived_at) * 1000 AS SIGNED) FROM sales WHERE id = {id}"
    ));
    want["archived_at"] = seckill_common::timefmt::format_ms(at as u64).into();
    let after = get(g.port, &path);
    assert_eq!((after.status, after.json()), (200, want));
    let r = buy(g.port, id, "late-buyer");
    assert_eq!((r.status, r.error()), (403, "sale_ended".to_string()));
}
