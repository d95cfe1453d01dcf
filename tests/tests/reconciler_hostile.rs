//! Specifies the reconciler's rules of docs/reliability.md §6-8, with real `seckill-worker` and `seckill-reconciler` processes, real
//! Redis, MariaDB and SQLite, and real `kill -9`: a sale MySQL lost is a
//! critical finding, not silence; a reservation's findings move together and
//! a settled dead letter is archived, never reported again; every operator
//! action is written ahead to the audit log and completed exactly once,
//! however the process is killed.

use crate::support::reconciler as support;
use crate::support::worker;

use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::dead_letter::DeadLetter;
use seckill_common::keys::SaleKeys;
use std::collections::{BTreeMap, HashSet};
use std::process::Stdio;
use std::time::{Duration, Instant};
use support::{ok, World};

/// `(id, kind, reservation_id)` of every finding in `state`.
fn ids_of(w: &World, state: &str) -> Vec<(i64, String, String)> {
    let mut v: Vec<_> = w
        .findings()
        .iter()
        .filter(|f| f["state"] == state)
        .map(|f| {
            (
                f["id"].as_i64().unwrap(),
                f["kind"].as_str().unwrap().to_string(),
                f["reservation_id"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn a_sale_mysql_lost_is_a_critical_finding_with_its_dead_letters() {
    let w = World::new(100);
    let k = SaleKeys::new(w.sale);
    let mut w1 = worker::WorkerProc::start(&w.redis, &w.db, "w1", &worker::Opts::default());
    worker::reserve_users(&w.redis, w.sale, "early", 40);
    worker::wait_orders(&w.db, w.sale, 40, Duration::from_secs(60));
    worker::wait_drained(&w.redis, w.sale, Duration::from_secs(60));
    w1.signal("-TERM");
    assert!(w1.wait_exit(Duration::from_secs(20)).success());

    // MySQL loses the sale's row; Redis goes on selling it.
    w.sql("DELETE FROM sales WHERE id = {sale}");
    worker::reserve_users(&w.redis, w.sale, "late", 60);
    let _w2 = worker::WorkerProc::start(&w.redis, &w.db, "w2", &worker::Opts::default());
    seckill_tests::wait_until(Duration::from_secs(60), "60 dead letters", || {
        w.redis.con().llen::<_, usize>(k.dead_letter()).unwrap() == 60
    });
    worker::wait_drained(&w.redis, w.sale, Duration::from_secs(60));
    let dl = worker::dead_letters(&w.redis, w.sale);
    assert!(
        dl.iter()
            .all(|d| d.reason == format!("unknown sale {}", w.sale)),
        "{dl:?}"
    );

    assert_eq!(w.run(), 1);
    let f = w.findings();
    assert_eq!(f.len(), 61, "{f:#?}");
    let missing: Vec<_> = f
        .iter()
        .filter(|f| f["kind"] == "sale_missing_in_mysql")
        .collect();
    assert_eq!(missing.len(), 1, "{f:#?}");
    let m = missing[0];
    assert_eq!(m["severity"], "critical");
    assert_eq!(m["state"], "open");
    assert_eq!(m["sale_id"].as_u64(), Some(w.sale));
    assert_eq!(m["evidence"]["units_reserved"], 100);
    assert_eq!(m["evidence"]["dead_lettered"], 60);
    assert_eq!(m["evidence"]["redis_stock"], 0);
    assert_eq!(m["evidence"]["total_stock"], 100);
    assert_eq!(m["evidence"]["orders_in_mysql"], 40);
    assert_eq!(
        f.iter()
            .filter(|f| f["kind"] == "dead_letter" && f["state"] == "open")
            .count(),
        60
    );
    assert_eq!(w.review_count("SELECT sales_checked FROM runs"), 1);
    assert_eq!(
        w.review_count("SELECT sale_missing_in_mysql FROM runs WHERE id = 1"),
        1
    );

    // Seen again: nothing new, nothing duplicated, still exit 1.
    assert_eq!(w.run(), 1);
    assert_eq!(w.findings().len(), 61);
    assert_eq!(
        w.review_count("SELECT new_findings FROM runs WHERE id = 2"),
        0
    );
}

/// A MySQL account of its own for the worker, dropped with the guard.
struct WorkerAccount {
    db: String,
    user: String,
    root: String,
}

impl WorkerAccount {
    /// The account `user` with the worker's rights on the tables of `w`'s
    /// database.
    fn create(w: &World) -> WorkerAccount {
        let root = w.db.url();
        let db = w.db.name.clone();
        let user = format!("w_{}", seckill_common::now_ms() % 1_000_000_000);
        let mut c = w.db.conn();
        c.query_drop(format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'"))
            .unwrap();
        for (table, rights) in [
            ("sales", "SELECT, UPDATE"),
            ("orders", "SELECT, INSERT, UPDATE"),
            ("stock_ledger", "SELECT, INSERT"),
            ("schema_migrations", "SELECT"),
        ] {
            c.query_drop(format!(
                "GRANT {rights} ON `{db}`.`{table}` TO '{user}'@'%'"
            ))
            .unwrap();
        }
        WorkerAccount { db, user, root }
    }

    /// Its URL.
    fn url(&self) -> String {
        format!("mysql://{}:pw@127.0.0.1:3306/{}", self.user, self.db)
    }

    fn sql(&self, q: &str) {
        seckill_common::schema::connect(&self.root, Duration::from_secs(10))
            .unwrap()
            .query_drop(q)
            .unwrap();
    }
}

impl Drop for WorkerAccount {
    fn drop(&mut self) {
        if let Ok(mut c) = seckill_common::schema::connect(&self.root, Duration::from_secs(10)) {
            let _ = c.query_drop(format!("DROP USER IF EXISTS '{}'@'%'", self.user));
        }
    }
}

#[test]
fn rolled_back_dead_letters_are_archived_and_never_reopen() {
    let w = World::new(60);
    let k = SaleKeys::new(w.sale);
    let account = WorkerAccount::create(&w);
    account.sql(&format!(
        "REVOKE INSERT ON `{}`.`orders` FROM '{}'@'%'",
        account.db, account.user
    ));
    let mut worker_cmd = seckill_tests::command("seckill-worker");
    worker_cmd
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("SECKILL_REDIS_URL", w.redis.url())
        .env("SECKILL_MYSQL_URL", account.url())
        .env("SECKILL_WORKER_ID", "w1")
        .env("SECKILL_WORKER_MAX_ATTEMPTS", "5")
        .env("SECKILL_WORKER_RETRY_FOR", "0s")
        .env("SECKILL_WORKER_BLOCK", "200ms")
        .env("SECKILL_WORKER_HEARTBEAT_TTL", "3s")
        .env(
            "SECKILL_WORKER_METRICS_LISTEN",
            format!("127.0.0.1:{}", seckill_tests::free_port()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut worker = worker_cmd.spawn().unwrap();
    worker::reserve_users(&w.redis, w.sale, "buyer", 60);
    seckill_tests::wait_until(Duration::from_secs(60), "60 dead letters", || {
        w.redis.con().llen::<_, usize>(k.dead_letter()).unwrap() == 60
    });
    worker::wait_drained(&w.redis, w.sale, Duration::from_secs(60));
    let _ = worker.kill();
    let _ = worker.wait();
    let dl = worker::dead_letters(&w.redis, w.sale);
    assert!(
        dl.iter()
            .all(|d| d.attempts == 5 && d.reason.starts_with("max attempts")),
        "{dl:?}"
    );
    assert_eq!(w.sql("SELECT COUNT(*) FROM orders"), 0);
    assert_eq!(w.redis_stock(), 0);

    assert_eq!(w.run(), 1);
    let open = ids_of(&w, "open");
    let count = |kind: &str| open.iter().filter(|f| f.1 == kind).count();
    assert_eq!(
        (count("flow_without_order"), count("dead_letter")),
        (60, 60)
    );

    // 30 rollbacks through the flow_without_order finding, 30 through the
    // dead_letter one: either way the sibling is closed with it.
    let mut by_rid: BTreeMap<String, Vec<(i64, String)>> = BTreeMap::new();
    for (id, kind, rid) in &open {
        by_rid
            .entry(rid.clone())
            .or_default()
            .push((*id, kind.clone()));
    }
    assert_eq!(by_rid.len(), 60);
    for (i, findings) in by_rid.values().enumerate() {
        let want = if i % 2 == 0 {
            "flow_without_order"
        } else {
            "dead_letter"
        };
        let id = findings.iter().find(|f| f.1 == want).unwrap().0.to_string();
        ok(&w.cmd("0s", &["resolve", &id, "--rollback", "--by", "alice"]));
    }
    assert_eq!(w.redis_stock(), 60);
    assert_eq!(ids_of(&w, "open").len(), 0);
    assert_eq!(ids_of(&w, "resolved").len(), 120);
    // One `done` rollback row per finding, every one naming alice.
    assert_eq!(
        w.review_count(
            "SELECT COUNT(*) FROM actions WHERE result = 'done' AND action = 'rollback'
               AND actor = 'alice'"
        ),
        120
    );
    assert_eq!(
        w.review_count(
            "SELECT COUNT(*) FROM (SELECT finding_id FROM actions WHERE result = 'done'
               GROUP BY finding_id HAVING COUNT(*) = 1)"
        ),
        120
    );
    // The entries left the dead-letter list for the archive, with the action.
    let mut con = w.redis.con();
    assert_eq!(con.llen::<_, usize>(k.dead_letter()).unwrap(), 0);
    let archived: Vec<String> = con.lrange(k.dead_letter_archive(), 0, -1).unwrap();
    assert_eq!(archived.len(), 60);
    let mut rids = HashSet::new();
    for a in &archived {
        let v: serde_json::Value = serde_json::from_str(a).unwrap();
        assert_eq!(v["settled_by"]["action"], "rollback", "{v}");
        assert_eq!(v["settled_by"]["actor"], "alice", "{v}");
        let entry = DeadLetter::parse(v["entry"].as_str().unwrap().as_bytes()).unwrap();
        rids.insert(entry.reservation_id.unwrap());
    }
    assert_eq!(rids.len(), 60);

    for run in 2..=4 {
        assert_eq!(w.run(), 0, "run {run}");
        assert_eq!(
            w.review_count(&format!(
                "SELECT new_findings + dead_letter + flow_without_order FROM runs WHERE id = {run}"
            )),
            0,
            "run {run}"
        );
    }
    assert_eq!(ids_of(&w, "open").len(), 0);
    assert_eq!(w.redis_stock(), 60);
}

#[test]
fn dismissing_one_finding_of_a_reservation_closes_its_siblings_with_a_row_each() {
    let w = World::new(5);
    let k = SaleKeys::new(w.sale);
    let rid = w.reserve(&["u1"]).remove(0);
    let mut con = w.redis.con();
    let raw: String = con.hget(k.flow(), &rid).unwrap();
    let _: i64 = con.lrem(k.queue(), 0, &raw).unwrap();
    let entry = DeadLetter {
        message: raw,
        reason: "max attempts: test".into(),
        attempts: 5,
        worker: "w1".into(),
        at_ms: 1,
        reservation_id: Some(rid.clone()),
    };
    let _: i64 = con.lpush(k.dead_letter(), entry.to_json()).unwrap();
    assert_eq!(w.run(), 1);
    let open = ids_of(&w, "open");
    assert_eq!(open.len(), 2);
    let dl = open.iter().find(|f| f.1 == "dead_letter").unwrap().0;
    ok(&w.cmd(
        "0s",
        &["resolve", &dl.to_string(), "--dismiss", "--by", "carol"],
    ));
    assert_eq!(ids_of(&w, "resolved").len(), 2);
    assert_eq!(
        w.review_count(
            "SELECT COUNT(*) FROM actions WHERE action = 'dismiss' AND result = 'done'
               AND actor = 'carol'"
        ),
        2
    );
    // Dismissed findings stay closed; the stock was not touched.
    assert_eq!(w.run(), 0);
    assert_eq!(w.run(), 0);
    assert_eq!(w.redis_stock(), 4);
    assert_eq!(ids_of(&w, "open").len(), 0);
}

/// A tiny xorshift generator: the kill delays, reproducible from the seed
/// printed by the test.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// How one `resolve` is killed.
#[derive(Debug, Clone, Copy)]
enum Kill {
    /// After a random delay within the command's usual duration.
    RandomDelay,
    /// As soon as its `started` row is in the review file.
    OnStartedRow,
    /// As soon as its effect is visible in Redis.
    OnEffect,
}

/// Findings per action of the kill test: 15 rollbacks, 15 reorders.
const EACH: usize = 15;

/// Each reservation's message dead-lettered as a worker does: two findings
/// per reservation (flow_without_order and dead_letter).
fn dead_letter_every_reservation(w: &World, rids: &[String]) {
    let k = SaleKeys::new(w.sale);
    let mut con = w.redis.con();
    for rid in rids {
        let raw: String = con.hget(k.flow(), rid).unwrap();
        let _: i64 = con.lrem(k.queue(), 0, &raw).unwrap();
        let _: i64 = con.hset(k.status(), rid, "failed").unwrap();
        let entry = DeadLetter {
            message: raw,
            reason: "max attempts: test".into(),
            attempts: 5,
            worker: "w1".into(),
            at_ms: 1,
            reservation_id: Some(rid.clone()),
        };
        let _: i64 = con.lpush(k.dead_letter(), entry.to_json()).unwrap();
    }
}

/// Whether `resolve ... action` of `rid` has its effect in Redis: the
/// flow record gone (a rollback), or the message queued (a reorder).
fn resolve_effect(con: &mut redis::Connection, sale: u64, rid: &str, action: &str) -> bool {
    let k = SaleKeys::new(sale);
    if action == "--rollback" {
        !con.hexists::<_, _, bool>(k.flow(), rid).unwrap()
    } else {
        con.lrange::<_, Vec<String>>(k.queue(), 0, -1)
            .unwrap()
            .iter()
            .any(|m| m.contains(rid))
    }
}

/// One `resolve FINDING ACTION` killed as `how` says (`usual`: the
/// command's usual duration), and where in the command the kill landed.
fn kill_one_resolve(
    w: &World,
    (id, rid, action): (&str, &str, &str),
    how: Kill,
    usual: Duration,
    rng: &mut Rng,
) -> &'static str {
    let review = w.review_path();
    let actions_of = |finding: &str| -> i64 {
        w.review_count(&format!(
            "SELECT COUNT(*) FROM actions WHERE finding_id = {finding}"
        ))
    };
    let mut con = w.redis.con();
    let before = actions_of(id);
    let mut child = seckill_tests::command("seckill-reconciler")
        .args(["resolve", id, action, "--by", "alice"])
        .env("SECKILL_MYSQL_URL", w.db.url())
        .env("SECKILL_REDIS_URL", w.redis.url())
        .env("SECKILL_REVIEW_DB", &review)
        .env("RUST_LOG", "off")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let sqlite = rusqlite::Connection::open(&review).unwrap();
    let deadline = Instant::now() + usual * 4 + Duration::from_millis(500);
    match how {
        Kill::RandomDelay => {
            let us = rng.below(usual.as_micros() as u64 + 1);
            std::thread::sleep(Duration::from_micros(us));
        }
        Kill::OnStartedRow => {
            while Instant::now() < deadline {
                let n: i64 = sqlite
                    .query_row(
                        &format!("SELECT COUNT(*) FROM actions WHERE finding_id = {id}"),
                        [],
                        |r| r.get(0),
                    )
                    .unwrap_or(before);
                if n > before {
                    break;
                }
            }
        }
        Kill::OnEffect => {
            while Instant::now() < deadline && !resolve_effect(&mut con, w.sale, rid, action) {}
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let after = actions_of(id);
    match (
        after - before,
        resolve_effect(&mut con, w.sale, rid, action),
    ) {
        (0, false) => "before the started row",
        (0, true) => "impossible: an effect without a started row",
        (1, false) => "between the started row and the effect",
        (1, true) => "after the effect, before the done row",
        (_, _) => "after the done row",
    }
}

/// Exactly one `done` row per finding (the target and its dead-letter
/// sibling), each naming the operator; every `started` row completed once.
fn assert_one_done_row_per_finding(w: &World) {
    assert_eq!(ids_of(w, "open").len(), 0);
    assert_eq!(
        w.review_count(
            "SELECT COUNT(*) FROM (SELECT finding_id FROM actions WHERE result = 'done'
               AND actor = 'alice' GROUP BY finding_id HAVING COUNT(*) = 1)"
        ),
        (4 * EACH) as i64
    );
    assert_eq!(
        w.review_count("SELECT COUNT(*) FROM actions WHERE result = 'done'"),
        (4 * EACH) as i64
    );
    assert_eq!(
        w.review_count(
            "SELECT COUNT(*) FROM actions s WHERE s.result = 'started' AND
               (SELECT COUNT(*) FROM actions c WHERE c.completes = s.id) <> 1"
        ),
        0
    );
}

/// Rollbacks moved the stock exactly once each; reorders queued exactly
/// one copy each, which a worker turns into exactly one order each.
fn assert_each_effect_once(w: &World, rids: &[String], stock_before: i64) {
    let k = SaleKeys::new(w.sale);
    let mut con = w.redis.con();
    assert_eq!(w.redis_stock(), stock_before + EACH as i64);
    let queued: Vec<String> = con.lrange(k.queue(), 0, -1).unwrap();
    assert_eq!(queued.len(), EACH);
    for rid in &rids[..EACH] {
        assert!(!con.hexists::<_, _, bool>(k.flow(), rid).unwrap());
    }
    for rid in &rids[EACH..] {
        assert_eq!(
            queued.iter().filter(|m| m.contains(rid.as_str())).count(),
            1
        );
    }
    assert_eq!(con.llen::<_, usize>(k.dead_letter()).unwrap(), 0);
    assert_eq!(
        con.llen::<_, usize>(k.dead_letter_archive()).unwrap(),
        2 * EACH
    );
    let _worker = worker::WorkerProc::start(&w.redis, &w.db, "w1", &worker::Opts::default());
    worker::wait_orders(&w.db, w.sale, EACH as i64, Duration::from_secs(30));
    worker::wait_drained(&w.redis, w.sale, Duration::from_secs(30));
    assert_eq!(w.sql("SELECT COUNT(*) FROM orders"), EACH as i64);
    assert_eq!(
        w.sql("SELECT available_stock FROM sales WHERE id = {sale}"),
        40 - EACH as i64
    );
    assert_eq!(w.run(), 0);
}

#[test]
fn every_killed_resolve_ends_with_exactly_one_done_row_and_its_effect_exactly_once() {
    let started = Instant::now();
    let w = World::new(40);
    let users: Vec<String> = (0..2 * EACH).map(|i| format!("u{i}")).collect();
    let refs: Vec<&str> = users.iter().map(String::as_str).collect();
    let rids = w.reserve(&refs);
    dead_letter_every_reservation(&w, &rids);
    assert_eq!(w.run(), 1);
    let open = ids_of(&w, "open");
    assert_eq!(open.len(), 4 * EACH);
    let target = |rid: &str| {
        open.iter()
            .find(|f| f.2 == rid && f.1 == "flow_without_order")
            .unwrap()
            .0
            .to_string()
    };
    let stock_before = w.redis_stock();
    assert_eq!(stock_before, 10);

    // Calibrate the random delays on dry runs (the same checks, no writes).
    let mut usual = Duration::ZERO;
    for _ in 0..3 {
        let t = Instant::now();
        ok(&w.cmd(
            "0s",
            &[
                "resolve",
                &target(&rids[0]),
                "--rollback",
                "--by",
                "alice",
                "--dry-run",
            ],
        ));
        usual = usual.max(t.elapsed());
    }
    let seed = seckill_common::now_ms() | 1;
    eprintln!("kill delays: seed {seed}, usual duration {usual:?}");
    let mut rng = Rng(seed);

    let mut landed: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, rid) in rids.iter().enumerate() {
        let action = if i < EACH { "--rollback" } else { "--reorder" };
        let how = [Kill::RandomDelay, Kill::OnStartedRow, Kill::OnEffect][i % 3];
        let id = target(rid);
        let phase = kill_one_resolve(&w, (&id, rid, action), how, usual, &mut rng);
        *landed.entry(phase).or_default() += 1;
        // Half are completed by a rerun right away, half by the next `run`.
        if i % 2 == 0 {
            ok(&w.cmd("0s", &["resolve", &id, action, "--by", "alice"]));
        }
    }
    eprintln!("kills landed: {landed:?}");
    assert!(!landed.contains_key("impossible: an effect without a started row"));
    w.run();
    // Every resolve rerun once more: the ones whose start was never written
    // act now; every other one finds its action done.
    for (i, rid) in rids.iter().enumerate() {
        let action = if i < EACH { "--rollback" } else { "--reorder" };
        ok(&w.cmd("0s", &["resolve", &target(rid), action, "--by", "alice"]));
    }
    assert_one_done_row_per_finding(&w);
    assert_each_effect_once(&w, &rids, stock_before);
    eprintln!("wall time {:?}", started.elapsed());
}
