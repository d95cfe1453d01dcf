//! Specifies an operator's changes to a live sale (`seckill-reconciler sale
//! list | pause | resume | end | extend | add-stock`) with the real
//! gateway, worker and reconciler on a private Redis and MySQL: each
//! command's exact effect on Redis, MySQL, the audit log and the answers
//! of a gateway that had already cached the sale, within a second; the
//! refusals (resume while Redis lost data, load of a paused sale, rollback
//! for a sale MySQL no longer holds); and kill -9 of each command at random
//! moments, after which its effect happened once and its audit rows are
//! complete.

use crate::support::gateway as gw;
use crate::support::worker as wk;

use gw::{buy, get, Gateway};
use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_tests::{reconciler, RedisServer, TempDir, TestDb};
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};
use wk::{wait_orders, Opts, WorkerProc};

const LONG: Duration = Duration::from_secs(60);

/// The bound the issue sets on every gateway seeing a change.
const WITHIN: Duration = Duration::from_secs(1);

/// Buys as `user` until the answer's (status, error) is `want`, for at most
/// [`WITHIN`] after `since`; panics with the last answer otherwise. Returns
/// the answer's `Retry-After`.
fn answered_within(
    port: u16,
    sale: u64,
    user: &str,
    want: (u16, &str),
    since: Instant,
) -> Option<String> {
    loop {
        let r = buy(port, sale, user);
        let got = (r.status, r.error());
        if (got.0, got.1.as_str()) == want {
            return r.header("Retry-After").map(str::to_string);
        }
        assert!(
            since.elapsed() < WITHIN,
            "sale {sale}: {want:?} not answered within 1 s of the change; last {got:?} {}",
            r.body
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The audit rows naming sale `id`: (id, action, result, completes, actor).
type Row = (i64, String, String, Option<i64>, String);

fn rows(review: &Path, id: u64) -> Vec<Row> {
    let c = rusqlite::Connection::open(review).unwrap();
    let mut st = c
        .prepare(
            "SELECT id, action, result, completes, actor FROM actions WHERE sale_id = ?1
               AND finding_id IS NULL ORDER BY id",
        )
        .unwrap();
    let r = st
        .query_map([id as i64], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .unwrap();
    r.collect::<Result<_, _>>().unwrap()
}

/// The last two rows are one started row and its `done` completion of
/// `action` by `op`.
fn assert_written_ahead(review: &Path, id: u64, action: &str) {
    let r = rows(review, id);
    let [.., s, d] = r.as_slice() else {
        panic!("{r:?}")
    };
    assert_eq!(
        (s.1.as_str(), s.2.as_str(), s.3, s.4.as_str()),
        (action, "started", None, "op")
    );
    assert_eq!(
        (d.1.as_str(), d.2.as_str(), d.3, d.4.as_str()),
        (action, "done", Some(s.0), "op")
    );
}

/// MySQL's (total, available, ends ms, paused_reason, paused_by) of sale `id`.
fn mysql_sale(db: &TestDb, id: u64) -> (u64, i64, u64, Option<String>, Option<String>) {
    db.conn()
        .exec_first(
            "SELECT total_stock, available_stock,
                    CAST(UNIX_TIMESTAMP(ends_at) * 1000 AS UNSIGNED), paused_reason, paused_by
             FROM sales WHERE id = ?",
            (id,),
        )
        .unwrap()
        .unwrap()
}

fn meta(redis: &RedisServer, id: u64, bucket: u32) -> HashMap<String, String> {
    redis
        .con()
        .hgetall(SaleKeys::bucket(id, bucket).meta())
        .unwrap()
}

fn stock(redis: &RedisServer, id: u64, bucket: u32) -> i64 {
    redis
        .con()
        .get(SaleKeys::bucket(id, bucket).stock())
        .unwrap()
}

fn op(redis: &RedisServer, db: &TestDb, review: &Path, args: &[&str]) -> (i32, String) {
    reconciler(redis, db, review, args)
}

/// The sale of [`each_change_takes_effect_in_mysql_redis_the_log_and_a_caching_gateway_within_a_second`]
/// and what serves it (the gateway and the worker stop first).
struct LiveSale {
    g: Gateway,
    _w: WorkerProc,
    id: u64,
    s: String,
    review: std::path::PathBuf,
    _dir: TempDir,
    db: TestDb,
    redis: RedisServer,
}

/// A sale of 5 units with one order (buyer `a`), a worker and a gateway.
fn a_sale_with_one_order() -> LiveSale {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let id = seckill_tests::create_sale(&db, &redis, 5, -1000, 3_600_000);
    let s = id.to_string();
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let g = Gateway::start(&redis, &[]);
    assert_eq!(buy(g.port, id, "a").status, 202);
    wait_orders(&db, id, 1, LONG);

    LiveSale {
        g,
        _w,
        id,
        s,
        review,
        _dir: dir,
        db,
        redis,
    }
}

/// `sale list` shows its figures; `sale pause` (dry run first, then for
/// real, then again) pauses it in MySQL, Redis and the gateway.
fn list_then_pause(t: &LiveSale) {
    let redis = &t.redis;
    let db = &t.db;
    let review = t.review.as_path();
    let g = &t.g;
    let id = t.id;
    let s = t.s.as_str();
    // list: one line with its figures.
    let (code, out) = op(redis, db, review, &["sale", "list"]);
    assert_eq!(code, 0, "{out}");
    let line = out.lines().nth(1).unwrap_or_default().to_string();
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words[0], s, "{out}");
    assert_eq!(
        &words[5..],
        ["active", "5", "4", "1", "1", "0", "1/1", "-"],
        "{out}"
    );

    // pause --dry-run: nothing changes, nothing is logged.
    let (code, out) = op(
        redis,
        db,
        review,
        &[
            "sale",
            "pause",
            s,
            "--reason",
            "fraud check",
            "--by",
            "op",
            "--dry-run",
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with("dry run, nothing changed: pause sale"),
        "{out}"
    );
    assert_eq!(mysql_sale(db, id).3, None);
    assert!(!meta(redis, id, 0).contains_key("operator_paused"));
    assert!(rows(review, id).is_empty());

    // pause: purchases 503 sale_paused with Retry-After, reads served.
    let (code, out) = op(
        redis,
        db,
        review,
        &["sale", "pause", s, "--reason", "fraud check", "--by", "op"],
    );
    let t = Instant::now();
    assert_eq!(code, 0, "{out}");
    let m = mysql_sale(db, id);
    assert_eq!(
        (m.3.as_deref(), m.4.as_deref()),
        (Some("fraud check"), Some("op"))
    );
    assert_eq!(meta(redis, id, 0)["operator_paused"], "fraud check");
    assert_written_ahead(review, id, "pause");
    let retry = answered_within(g.port, id, "b", (503, "sale_paused"), t);
    assert_eq!(retry.as_deref(), Some("1"));
    let r = get(g.port, &format!("/v1/sales/{id}"));
    assert_eq!(
        (r.status, r.json()["state"].as_str()),
        (200, Some("paused"))
    );
    // Again: nothing to change, one no_change row.
    let (code, out) = op(
        redis,
        db,
        review,
        &["sale", "pause", s, "--reason", "again", "--by", "op"],
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("no_change: sale") && out.contains("paused already (by op: fraud check)"),
        "{out}"
    );
    assert_eq!(rows(review, id).last().unwrap().2, "no_change");
    let (_, out) = op(redis, db, review, &["sale", "list"]);
    assert!(
        out.contains(" paused ") && out.ends_with("operator op: fraud check\n"),
        "{out}"
    );

    let (_, out) = op(redis, db, review, &["sale", "show", s]);
    assert!(
        out.contains("PAUSED            by an operator (fraud check)"),
        "{out}"
    );
}

/// `sale resume`, `sale end` (at Redis's clock plus the margin) and
/// `sale extend` each take effect within a second.
fn resume_end_then_extend(t: &LiveSale) {
    let redis = &t.redis;
    let db = &t.db;
    let review = t.review.as_path();
    let g = &t.g;
    let id = t.id;
    let s = t.s.as_str();
    // resume: purchases again.
    let (code, out) = op(redis, db, review, &["sale", "resume", s, "--by", "op"]);
    let t = Instant::now();
    assert_eq!(code, 0, "{out}");
    assert_eq!(mysql_sale(db, id).3, None);
    assert!(!meta(redis, id, 0).contains_key("operator_paused"));
    assert_written_ahead(review, id, "resume");
    answered_within(g.port, id, "b", (202, ""), t);

    // end: 403 sale_ended once the end (Redis's clock + the margin every
    // bucket is written within) arrives, in MySQL and Redis the same end.
    let margin = seckill_common::sale_admin::END_MARGIN_MS;
    let asked = seckill_common::now_ms();
    let (code, out) = op(redis, db, review, &["sale", "end", s, "--by", "op"]);
    assert_eq!(code, 0, "{out}");
    let ends = mysql_sale(db, id).2;
    assert!(
        (asked + margin..=seckill_common::now_ms() + margin).contains(&ends),
        "{ends}"
    );
    assert_eq!(meta(redis, id, 0)["ends_at_ms"], ends.to_string());
    assert_written_ahead(review, id, "end");
    // "c" buys nothing before the end: the wait is for the end itself.
    std::thread::sleep(Duration::from_millis(
        ends - seckill_common::now_ms().min(ends),
    ));
    answered_within(g.port, id, "c", (403, "sale_ended"), Instant::now());

    // extend: open again.
    let (code, out) = op(
        redis,
        db,
        review,
        &["sale", "extend", s, "--ends-at", "now+1h", "--by", "op"],
    );
    let t = Instant::now();
    assert_eq!(code, 0, "{out}");
    let ends = mysql_sale(db, id).2;
    assert!(ends > seckill_common::now_ms() + 3_500_000, "{ends}");
    assert_eq!(meta(redis, id, 0)["ends_at_ms"], ends.to_string());
    assert_written_ahead(review, id, "extend");
    answered_within(g.port, id, "c", (202, ""), t);
}

/// Sold out, then 3 units added: the gateway that remembers it sold
/// out sells them within a second.
fn add_stock_to_the_sold_out_sale(t: &LiveSale) {
    let redis = &t.redis;
    let db = &t.db;
    let review = t.review.as_path();
    let g = &t.g;
    let id = t.id;
    let s = t.s.as_str();
    // Sell out (5 units: a, b, c, d, e), then add 3: the gateway that
    // remembers the sale sold out sells them within a second.
    assert_eq!(buy(g.port, id, "d").status, 202);
    assert_eq!(buy(g.port, id, "e").status, 202);
    assert_eq!(buy(g.port, id, "f").status, 410);
    wait_orders(db, id, 5, LONG);
    let (code, out) = op(
        redis,
        db,
        review,
        &["sale", "add-stock", s, "3", "--by", "op"],
    );
    let t = Instant::now();
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("add 3 unit(s) to sale") && out.contains("(total 5 -> 8)"),
        "{out}"
    );
    let m = mysql_sale(db, id);
    assert_eq!((m.0, m.1), (8, 3));
    let ledger: Vec<(i64, String, String)> = db
        .conn()
        .exec(
            "SELECT delta, user_id, reservation_id FROM stock_ledger
             WHERE sale_id = ? AND reason = 'add_stock'",
            (id,),
        )
        .unwrap();
    assert_eq!(ledger.len(), 1);
    assert_eq!((ledger[0].0, ledger[0].1.as_str()), (3, "op"));
    assert_eq!(meta(redis, id, 0)["total_stock"], "8");
    assert_eq!(stock(redis, id, 0), 3);
    let marks: HashMap<String, String> = redis
        .con()
        .hgetall(SaleKeys::new(id).stock_added())
        .unwrap();
    assert_eq!(
        marks,
        HashMap::from([(ledger[0].2.clone(), "3".to_string())])
    );
    assert_written_ahead(review, id, "add_stock");
    answered_within(g.port, id, "f", (202, ""), t);
    wait_orders(db, id, 6, LONG);
}

/// The reconciler's books and the workers' data-loss watch count the
/// added units; every started row has exactly one completion.
fn the_books_count_the_added_units(t: &LiveSale) {
    let redis = &t.redis;
    let db = &t.db;
    let review = t.review.as_path();
    let id = t.id;
    // The reconciler's books and the workers' data-loss watch count the
    // added units: a clean run, no pause.
    seckill_tests::assert_reconciles_clean(redis, db, review);
    assert!(!meta(redis, id, 0).contains_key("paused"));
    let (_, out) = op(redis, db, review, &["sale", "list"]);
    let words: Vec<String> = out
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .map(String::from)
        .collect();
    assert_eq!(
        &words[5..],
        ["active", "8", "2", "6", "6", "0", "1/1", "-"],
        "{out}"
    );
    // Every started row has exactly one completion.
    let all = rows(review, id);
    let started: Vec<i64> = all
        .iter()
        .filter(|r| r.2 == "started")
        .map(|r| r.0)
        .collect();
    for sid in &started {
        assert_eq!(
            all.iter().filter(|r| r.3 == Some(*sid)).count(),
            1,
            "{all:?}"
        );
    }
    assert_eq!(started.len(), 5);
}

#[test]
fn each_change_takes_effect_in_mysql_redis_the_log_and_a_caching_gateway_within_a_second() {
    let t = a_sale_with_one_order();
    list_then_pause(&t);
    resume_end_then_extend(&t);
    add_stock_to_the_sold_out_sale(&t);
    the_books_count_the_added_units(&t);
}

#[test]
fn refusals_change_nothing() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let id = seckill_tests::create_sale(&db, &redis, 5, -1000, 3_600_000);
    let s = id.to_string();

    // An operator pause and a data-loss pause at once.
    let (code, out) = op(
        &redis,
        &db,
        &review,
        &["sale", "pause", &s, "--reason", "stock count", "--by", "op"],
    );
    assert_eq!(code, 0, "{out}");
    seckill_common::data_loss::pause(
        &mut redis.con(),
        &mut db.conn(),
        id,
        seckill_common::data_loss::PauseReason::RedisDataLoss,
    )
    .unwrap();
    let n = rows(&review, id).len();
    let (code, out) = op(&redis, &db, &review, &["sale", "resume", &s, "--by", "op"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("paused because Redis lost data of it (redis_data_loss)"),
        "{out}"
    );
    assert_eq!(mysql_sale(&db, id).3.as_deref(), Some("stock count"));
    let after = rows(&review, id);
    assert_eq!((after.len(), after[n].2.as_str()), (n + 1, "refused"));
    // `sale list` tells both pauses apart.
    let (_, out) = op(&redis, &db, &review, &["sale", "list"]);
    assert!(
        out.contains("redis_data_loss; operator op: stock count"),
        "{out}"
    );

    // Only the operator's pause left, keys gone: `sale load` is refused too.
    let mut con = redis.con();
    let _: () = con.del(SaleKeys::new(id).stock()).unwrap();
    db.conn()
        .exec_drop(
            "UPDATE sale_redis_state SET paused_reason = NULL WHERE sale_id = ?",
            (id,),
        )
        .unwrap();
    let (code, out) = op(&redis, &db, &review, &["sale", "load", &s]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!("sale {id} is paused by op (stock count)")),
        "{out}"
    );

    // add-stock to an ended sale, extend to before the end: refused.
    let other = seckill_tests::create_sale(&db, &redis, 5, -7_200_000, 3_600_000);
    let o = other.to_string();
    let (code, out) = op(
        &redis,
        &db,
        &review,
        &["sale", "add-stock", &o, "2", "--by", "op"],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("ended at"), "{out}");
    let fresh = seckill_tests::create_sale(&db, &redis, 5, -1000, 7_200_000);
    let f = fresh.to_string();
    let (code, out) = op(
        &redis,
        &db,
        &review,
        &["sale", "extend", &f, "--ends-at", "now+1h", "--by", "op"],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("`sale end"), "{out}");
    assert_eq!(mysql_sale(&db, other).0, 5);
    assert_eq!(stock(&redis, other, 0), 5);
    // No such sale: exit 2.
    let (code, out) = op(
        &redis,
        &db,
        &review,
        &["sale", "end", "999999", "--by", "op"],
    );
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("no sale 999999 in MySQL"), "{out}");
}

#[test]
fn sale_load_refuses_a_sale_paused_for_redis_data_loss() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let id = seckill_tests::create_sale(&db, &redis, 5, -1000, 3_600_000);
    seckill_common::data_loss::pause(
        &mut redis.con(),
        &mut db.conn(),
        id,
        seckill_common::data_loss::PauseReason::RedisDataLoss,
    )
    .unwrap();
    // Its keys vanished: a load would put 5 units on sale, unpaused.
    let mut con = redis.con();
    let _: () = con.del(SaleKeys::new(id).meta()).unwrap();
    let _: () = con.del(SaleKeys::new(id).stock()).unwrap();
    let (code, out) = op(&redis, &db, &review, &["sale", "load", &id.to_string()]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!("sale {id} is paused (redis_data_loss)")),
        "{out}"
    );
    let gone: Option<i64> = con.get(SaleKeys::new(id).stock()).unwrap();
    assert_eq!(gone, None, "nothing loaded");
}

#[test]
fn a_rollback_is_refused_for_a_sale_mysql_no_longer_holds() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let id = seckill_tests::create_sale(&db, &redis, 5, -1000, 3_600_000);
    let g = Gateway::start(&redis, &[]);
    assert_eq!(buy(g.port, id, "a").status, 202);
    db.conn()
        .exec_drop("DELETE FROM sales WHERE id = ?", (id,))
        .unwrap();
    // The worker dead-letters its order message (no sale to order from).
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    seckill_tests::wait_until(LONG, "one dead letter", || {
        redis
            .con()
            .llen::<_, usize>(SaleKeys::new(id).dead_letter())
            .unwrap()
            == 1
    });
    let (code, out) = op(&redis, &db, &review, &["run"]);
    assert_eq!(code, 1, "{out}");
    let c = rusqlite::Connection::open(&review).unwrap();
    let finding: i64 = c
        .query_row(
            "SELECT id FROM findings WHERE sale_id = ?1 AND reservation_id IS NOT NULL
               AND kind = 'dead_letter'",
            [id as i64],
            |r| r.get(0),
        )
        .unwrap();
    let (code, out) = op(
        &redis,
        &db,
        &review,
        &["resolve", &finding.to_string(), "--rollback", "--by", "op"],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("MySQL holds no sale {id}")), "{out}");
    assert_eq!(stock(&redis, id, 0), 4, "nothing put back on sale");
}

#[test]
fn a_split_sale_gets_added_units_at_each_buckets_share_of_the_new_total() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let id = seckill_tests::create_split_sale(&db, &redis, 10, -1000, 3_600_000, 3);
    let s = id.to_string();
    let (code, out) = op(
        &redis,
        &db,
        &review,
        &["sale", "add-stock", &s, "2", "--by", "op"],
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("bucket 0 +0, bucket 1 +1, bucket 2 +1"),
        "{out}"
    );
    // 10 over 3 was 4, 3, 3; 12 over 3 is 4, 4, 4.
    for b in 0..3 {
        let m = meta(&redis, id, b);
        assert_eq!(
            (m["total_stock"].as_str(), m["share"].as_str()),
            ("4", "4"),
            "bucket {b}"
        );
        assert_eq!(stock(&redis, id, b), 4, "bucket {b}");
    }
    // Pause, end: every bucket.
    let (code, out) = op(
        &redis,
        &db,
        &review,
        &["sale", "pause", &s, "--reason", "x", "--by", "op"],
    );
    assert_eq!(code, 0, "{out}");
    let (code, out) = op(&redis, &db, &review, &["sale", "end", &s, "--by", "op"]);
    assert_eq!(code, 0, "{out}");
    let ends = mysql_sale(&db, id).2.to_string();
    for b in 0..3 {
        let m = meta(&redis, id, b);
        assert_eq!(
            (m["operator_paused"].as_str(), m["ends_at_ms"].as_str()),
            ("x", ends.as_str()),
            "bucket {b}"
        );
    }
    seckill_tests::assert_reconciles_clean(&redis, &db, &review);
}

/// A small pseudo-random sequence (xorshift), seeded from the clock and
/// printed, so a failing run can be told apart.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// Starts `seckill-reconciler ARGS` and kills it (SIGKILL) after `delay`.
fn kill_after(redis: &RedisServer, db: &TestDb, review: &Path, args: &[&str], delay: Duration) {
    let mut child = seckill_tests::command("seckill-reconciler")
        .env("SECKILL_REDIS_URL", redis.url())
        .env("SECKILL_MYSQL_URL", db.url())
        .env("SECKILL_REVIEW_DB", review)
        .env("SECKILL_RECONCILE_GRACE", "0s")
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(delay);
    let _ = child.kill();
    let _ = child.wait();
}

/// How long one uninterrupted `args` takes, to spread the kills over it.
fn duration_of(redis: &RedisServer, db: &TestDb, review: &Path, args: &[&str]) -> Duration {
    let t = Instant::now();
    let (code, out) = op(redis, db, review, args);
    assert_eq!(code, 0, "{out}");
    t.elapsed()
}

#[test]
fn a_killed_command_makes_its_change_once_and_its_audit_rows_complete() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let id = seckill_tests::create_split_sale(&db, &redis, 10, -1000, 3_600_000, 2);
    let s = id.to_string();
    let seed = seckill_common::now_ms() | 1;
    println!("kill seed {seed}");
    let mut rng = Rng(seed);
    let kills = 20;
    let pause = ["sale", "pause", &s, "--reason", "k", "--by", "op"];
    let resume = ["sale", "resume", &s, "--by", "op"];
    let end = ["sale", "end", &s, "--by", "op"];
    let extend = ["sale", "extend", &s, "--ends-at", "now+2h", "--by", "op"];
    let add = ["sale", "add-stock", &s, "1", "--by", "op"];
    let d = duration_of(&redis, &db, &review, &add);
    for round in 0..kills {
        for args in [&pause[..], &resume[..], &end[..], &extend[..], &add[..]] {
            // Most of a command's time is its start (configuration,
            // connections); its changes come in the last part: kill in
            // the last half, and a little after.
            let us = d.as_micros() as u64;
            let delay = Duration::from_micros(us / 2 + rng.below(us * 6 / 10 + 1));
            kill_after(&redis, &db, &review, args, delay);
            let _ = round;
        }
    }
    // The next command completes what the kills left.
    let (code, out) = op(&redis, &db, &review, &["sale", "resume", &s, "--by", "op"]);
    assert_eq!(code, 0, "{out}");

    let all = rows(&review, id);
    let started: Vec<&Row> = all.iter().filter(|r| r.2 == "started").collect();
    for st in &started {
        let done: Vec<&Row> = all.iter().filter(|r| r.3 == Some(st.0)).collect();
        assert_eq!(
            done.len(),
            1,
            "started row {} completed once: {all:?}",
            st.0
        );
        assert_eq!(done[0].1, st.1);
        assert!(["done", "failed"].contains(&done[0].2.as_str()), "{done:?}");
    }
    // Each change decided once per done row, none for a failed one.
    let done_of = |action: &str| {
        all.iter()
            .filter(|r| r.1 == action && r.2 == "done" && r.3.is_some())
            .count() as i64
    };
    let changes = |action: &str| {
        db.count(&format!(
            "SELECT COUNT(*) FROM sale_changes WHERE sale_id = {id} AND action = '{action}'"
        ))
    };
    assert_eq!(changes("pause"), done_of("pause"));
    assert_eq!(changes("resume"), done_of("resume"));
    assert_eq!(changes("end_at"), done_of("end") + done_of("extend"));
    let added = done_of("add_stock");
    assert_eq!(changes("add_stock"), added);
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM stock_ledger WHERE sale_id = {id} AND reason = 'add_stock'"
        )),
        added
    );
    // The units: MySQL, and Redis over both buckets, went up by exactly the
    // done add-stocks.
    let (total, available, ends, paused, _) = mysql_sale(&db, id);
    assert_eq!((total as i64, available), (10 + added, 10 + added));
    let redis_total: i64 = (0..2)
        .map(|b| meta(&redis, id, b)["total_stock"].parse::<i64>().unwrap())
        .sum();
    let redis_stock: i64 = (0..2).map(|b| stock(&redis, id, b)).sum();
    assert_eq!((redis_total, redis_stock), (10 + added, 10 + added));
    // Redis follows MySQL's end and pause in both buckets.
    for b in 0..2 {
        let m = meta(&redis, id, b);
        assert_eq!(m["ends_at_ms"], ends.to_string(), "bucket {b}");
        assert_eq!(m.get("operator_paused"), paused.as_ref(), "bucket {b}");
    }
    let c = rusqlite::Connection::open(&review).unwrap();
    let recovered: i64 = c
        .query_row(
            "SELECT COUNT(*) FROM actions WHERE result = 'done'
               AND detail LIKE '%recorded after an interruption%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    println!(
        "{} kills over {d:?}-long commands: {} started rows, {recovered} completed as done \
         by the next command, {} as failed, {added} add-stock done",
        kills * 5,
        started.len(),
        all.iter().filter(|r| r.2 == "failed").count()
    );
    seckill_tests::assert_reconciles_clean(&redis, &db, &review);
}

#[test]
fn a_repair_after_redis_lost_data_keeps_an_operators_pause_until_resume() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let id = seckill_tests::create_sale(&db, &redis, 5, -1000, 3_600_000);
    let s = id.to_string();
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let g = Gateway::start(&redis, &[]);
    assert_eq!(buy(g.port, id, "a").status, 202);
    wait_orders(&db, id, 1, LONG);
    let (code, out) = op(
        &redis,
        &db,
        &review,
        &["sale", "pause", &s, "--reason", "audit", "--by", "op"],
    );
    assert_eq!(code, 0, "{out}");
    // Redis loses the sale's meta and stock: the workers' watch pauses it.
    let mut con = redis.con();
    let _: () = con.del(SaleKeys::new(id).meta()).unwrap();
    let _: () = con.del(SaleKeys::new(id).stock()).unwrap();
    seckill_tests::wait_until(LONG, "the data-loss pause", || {
        db.count(&format!(
            "SELECT COUNT(*) FROM sale_redis_state WHERE sale_id = {id}
               AND paused_reason IS NOT NULL"
        )) == 1
    });
    let (code, out) = op(&redis, &db, &review, &["run"]);
    assert_eq!(code, 1, "{out}");
    let (code, out) = op(&redis, &db, &review, &["sale", "resume", &s, "--by", "op"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("open redis_data_loss finding"), "{out}");
    let (code, out) = op(&redis, &db, &review, &["sale", "repair", &s, "--by", "op"]);
    assert_eq!(code, 0, "{out}");
    // The data-loss pause ended; the operator's stays, in MySQL and Redis.
    let m = meta(&redis, id, 0);
    assert_eq!(
        (m.get("paused"), m["operator_paused"].as_str()),
        (None, "audit")
    );
    assert_eq!(mysql_sale(&db, id).3.as_deref(), Some("audit"));
    let r = buy(g.port, id, "b");
    assert_eq!((r.status, r.error()), (503, "sale_paused".to_string()));
    let (code, out) = op(&redis, &db, &review, &["sale", "resume", &s, "--by", "op"]);
    let t = Instant::now();
    assert_eq!(code, 0, "{out}");
    answered_within(g.port, id, "b", (202, ""), t);
}

#[test]
fn payments_and_cancellations_go_on_in_a_paused_and_in_an_ended_sale() {
    // Paused, then ended: orders are paid and cancelled as before.
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let id = seckill_tests::create_windowed_sale(&redis, &db, &review, 5, "1h");
    let s = id.to_string();
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let g = Gateway::start(&redis, &[]);
    for u in ["a", "b", "c"] {
        assert_eq!(buy(g.port, id, u).status, 202);
    }
    wait_orders(&db, id, 3, LONG);
    let rid = |user: &str| -> String {
        db.conn()
            .exec_first(
                "SELECT reservation_id FROM orders WHERE sale_id = ? AND user_id = ?",
                (id, user),
            )
            .unwrap()
            .unwrap()
    };
    let pay = |user: &str| {
        let m = seckill_common::payment::PaymentMessage {
            v: 1,
            reservation_id: rid(user),
            payment_id: format!("pay-{user}"),
            amount_cents: 1999,
            received_ms: seckill_common::now_ms(),
        };
        seckill_common::payment::enqueue(&mut redis.con(), &m).unwrap();
    };
    let status = |user: &str| -> String {
        db.conn()
            .exec_first(
                "SELECT status FROM orders WHERE sale_id = ? AND user_id = ?",
                (id, user),
            )
            .unwrap()
            .unwrap()
    };
    let (code, out) = op(
        &redis,
        &db,
        &review,
        &["sale", "pause", &s, "--reason", "p", "--by", "op"],
    );
    assert_eq!(code, 0, "{out}");
    pay("a");
    seckill_tests::wait_until(LONG, "a paid while paused", || status("a") == "paid");
    let (code, out) = op(&redis, &db, &review, &["sale", "end", &s, "--by", "op"]);
    assert_eq!(code, 0, "{out}");
    pay("b");
    seckill_tests::wait_until(LONG, "b paid after the end", || status("b") == "paid");
    // c cancels after the end: the unit goes back (to a sale that takes
    // no purchase).
    let rq = format!(
        "DELETE /v1/sales/{id}/purchases/me HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Authorization: Bearer {}\r\n\r\n",
        seckill_tests::auth::token_for("c")
    );
    let r = gw::raw(g.port, rq.as_bytes()).expect("an answer");
    assert_eq!(r.status, 202, "{}", r.body);
    seckill_tests::wait_until(LONG, "c cancelled", || status("c") == "cancelled");
    assert_eq!(
        buy(g.port, id, "d").status,
        503,
        "paused wins over ended: still 503"
    );
}
