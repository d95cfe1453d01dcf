//! Specifies the `ledger_without_order` finding and its fix, `resolve
//! --recreate`, with a real `seckill-worker`, gateway, Redis, MariaDB and
//! SQLite: an order lost in MySQL while its stock-ledger deduction stayed is
//! one critical finding; re-creating it makes exactly one order without a
//! second deduction and the buyer reads `confirmed` again; a rollback is
//! refused at every step. Also: an action settles only the dead letters
//! that existed when it started (an entry its own effect causes is a new
//! finding); a buyer whose reservation was rolled back reads `failed`.

use crate::support::gateway as gateway_support;
use crate::support::reconciler as support;
use crate::support::worker;

use gateway_support::Gateway;
use redis::Commands;
use seckill_common::keys::SaleKeys;
use std::time::Duration;
use support::{ok, World};

const LONG: Duration = Duration::from_secs(60);

/// `(exit code, stderr)` of a command expected to be refused.
fn refused(out: &std::process::Output) -> (Option<i32>, String) {
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The buyer's status as `GET /v1/sales/{sale}/purchases/{user}` answers it.
fn status_of(g: &Gateway, sale: u64, user: &str) -> (u16, String) {
    let r = gateway_support::get(g.port, &format!("/v1/sales/{sale}/purchases/{user}"));
    let v = if r.status == 200 {
        r.json()["status"].as_str().unwrap_or("").to_string()
    } else {
        r.error()
    };
    (r.status, v)
}

/// Asserts that `--rollback` (dry run and real) and `--reorder` of finding
/// `id` are refused with exit 1 and a text containing `why`, and that the
/// Redis stock stays `stock`.
fn rollback_refused(w: &World, id: &str, why: &str, stock: i64) {
    for action in ["--rollback", "--reorder"] {
        for dry in [true, false] {
            let mut args = vec!["resolve", id, action, "--by", "mallory"];
            if dry {
                args.push("--dry-run");
            }
            let (code, err) = refused(&w.cmd("0s", &args));
            assert_eq!(code, Some(1), "{action} dry={dry}: {err}");
            assert!(err.contains(why), "{action} dry={dry}: {err}");
            assert_eq!(w.redis_stock(), stock, "{action} dry={dry}");
        }
    }
}

/// A sold-out sale of 3, ordered by the real worker, whose order of `u2`
/// is then deleted in MySQL (its ledger row and deduction stay). Returns
/// the world, the gateway, the worker and u2's reservation id.
fn order_lost_in_mysql() -> (World, Gateway, worker::WorkerProc, String) {
    let w = World::new(3);
    let g = Gateway::start(&w.redis, &[]);
    let mut rids = Vec::new();
    for u in ["u1", "u2", "u3"] {
        let r = gateway_support::buy(g.port, w.sale, u);
        assert_eq!(r.status, 202, "{r:?}");
        rids.push(r.json()["reservation_id"].as_str().unwrap().to_string());
    }
    let wk = worker::WorkerProc::start(&w.redis, &w.db, "w1", &worker::Opts::default());
    worker::wait_orders(&w.db, w.sale, 3, LONG);
    worker::wait_drained(&w.redis, w.sale, LONG);
    seckill_tests::wait_until(LONG, "u2 confirmed", || {
        status_of(&g, w.sale, "u2") == (200, "confirmed".into())
    });
    let rid = rids[1].clone();
    w.sql(&format!(
        "DELETE FROM orders WHERE reservation_id = '{rid}'"
    ));
    (w, g, wk, rid)
}

/// Orders, ledger rows of reservation `rid`; the sale's available stock.
fn mysql_of(w: &World, rid: &str) -> (i64, i64, i64) {
    (
        w.sql(&format!(
            "SELECT COUNT(*) FROM orders WHERE reservation_id = '{rid}'"
        )),
        w.sql(&format!(
            "SELECT COUNT(*) FROM stock_ledger WHERE reservation_id = '{rid}'"
        )),
        w.sql("SELECT available_stock FROM sales WHERE id = {sale}"),
    )
}

#[test]
fn an_order_lost_in_mysql_with_its_deduction_is_one_finding_that_recreate_fixes() {
    let (w, g, _wk, rid) = order_lost_in_mysql();
    let ledger_id = w.sql(&format!(
        "SELECT id FROM stock_ledger WHERE reservation_id = '{rid}'"
    ));
    assert_eq!(mysql_of(&w, &rid), (0, 1, 0));

    // `sale show` marks the difference.
    let show = ok(&w.cmd("0s", &["sale", "show", &w.sale.to_string()]));
    assert!(show.contains("ledger deductions 3 "), "{show}");
    assert!(show.contains("orders holding    2 "), "{show}");
    assert!(
        show.contains(
            "! 1 ledger deduction(s) with no order holding the unit (finding \
             ledger_without_order; fix: resolve ID --recreate)"
        ),
        "{show}"
    );

    // One finding, critical, the ledger row as evidence.
    assert_eq!(w.run(), 1);
    let f = w.findings();
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0]["kind"], "ledger_without_order");
    assert_eq!(f[0]["subject"], rid.as_str());
    assert_eq!(f[0]["severity"], "critical");
    assert_eq!(f[0]["evidence"]["ledger_row"]["id"], ledger_id);
    assert_eq!(f[0]["evidence"]["ledger_row"]["reason"], "order");
    assert_eq!(f[0]["evidence"]["ledger_row"]["user_id"], "u2");
    assert_eq!(f[0]["evidence"]["status"], "confirmed");
    let id = f[0]["id"].as_i64().unwrap().to_string();

    // A rollback (or a reorder) of it is refused, dry run or not.
    rollback_refused(
        &w,
        &id,
        "applies to flow_without_order and dead_letter (a ledger_without_order is fixed by \
         --recreate)",
        0,
    );

    // The documented fix, previewed, then done.
    let dry = ok(&w.cmd(
        "0s",
        &["resolve", &id, "--recreate", "--by", "alice", "--dry-run"],
    ));
    assert!(
        dry.contains(&format!(
            "dry run, nothing changed: would re-create the order of {rid} for buyer u2 from \
             ledger row {ledger_id} (reason order)"
        )),
        "{dry}"
    );
    assert_eq!(mysql_of(&w, &rid), (0, 1, 0));
    let done = ok(&w.cmd("0s", &["resolve", &id, "--recreate", "--by", "alice"]));
    assert!(done.starts_with("done: re-created order "), "{done}");
    assert!(
        done.contains(&format!(
            "of {rid} for buyer u2 (confirmed) from ledger row {ledger_id}: no second \
             deduction, available_stock stays 0; Redis status confirmed"
        )),
        "{done}"
    );

    // Exactly one order and one ledger row, stock unchanged everywhere.
    assert_eq!(mysql_of(&w, &rid), (1, 1, 0));
    assert_eq!(
        w.sql(&format!(
            "SELECT COUNT(*) FROM orders WHERE reservation_id = '{rid}' AND user_id = 'u2' \
             AND status = 'confirmed' AND sale_id = {{sale}}"
        )),
        1
    );
    assert_eq!(
        w.sql("SELECT COUNT(*) FROM orders WHERE sale_id = {sale}"),
        3
    );
    assert_eq!(
        w.sql("SELECT COUNT(*) FROM stock_ledger WHERE sale_id = {sale}"),
        3
    );
    assert_eq!(w.redis_stock(), 0);
    assert_eq!(status_of(&g, w.sale, "u2"), (200, "confirmed".into()));
    let show = ok(&w.cmd("0s", &["sale", "show", &w.sale.to_string()]));
    assert!(!show.contains("! "), "{show}");

    // The next run finds nothing; the worker dead-lettered nothing.
    assert_eq!(w.run(), 0);
    assert_eq!(
        w.review_count("SELECT COUNT(*) FROM findings WHERE state = 'open'"),
        0
    );
    assert_eq!(
        w.review_count(
            "SELECT COUNT(*) FROM findings WHERE state = 'resolved' AND resolution = 'recreate'"
        ),
        1
    );
    assert!(worker::dead_letters(&w.redis, w.sale).is_empty());
    // Written ahead: one `started`, one `done` completing it.
    for (result, n) in [("started", 1), ("done", 1)] {
        assert_eq!(
            w.review_count(&format!(
                "SELECT COUNT(*) FROM actions WHERE action = 'recreate' AND result = '{result}'"
            )),
            n,
            "{result}"
        );
    }

    // Afterwards a rollback is still refused, and a repeat changes nothing.
    rollback_refused(&w, &id, "already resolved (recreate by alice)", 0);
    let again = ok(&w.cmd("0s", &["resolve", &id, "--recreate", "--by", "alice"]));
    assert!(again.contains("MySQL already holds order"), "{again}");
    assert_eq!(mysql_of(&w, &rid), (1, 1, 0));
    assert_eq!(w.run(), 0);
}

/// The story as it went with the documented `--reorder`: the re-sent
/// message is dead-lettered by the worker (MySQL's stock cannot cover a
/// second deduction) and the buyer's status turns `on_hold`. A rollback of
/// the `dead_letter` finding is refused (MySQL deducted the unit); the
/// `--recreate` of the ledger finding settles both, and the buyer reads
/// `confirmed` again.
#[test]
fn a_reservation_mysql_deducted_is_never_rolled_back_even_from_its_dead_letter() {
    let (w, g, _wk, rid) = order_lost_in_mysql();
    let k = SaleKeys::new(w.sale);
    let mut con = w.redis.con();
    let raw: String = con.hget(k.flow(), &rid).unwrap();
    let _: i64 = con.lpush(k.queue(), &raw).unwrap();
    seckill_tests::wait_until(LONG, "the re-sent message dead-lettered", || {
        worker::dead_letters(&w.redis, w.sale).len() == 1
    });
    let dead = worker::dead_letters(&w.redis, w.sale);
    assert_eq!(dead[0].reservation_id.as_deref(), Some(rid.as_str()));
    seckill_tests::wait_until(LONG, "u2 on_hold", || {
        status_of(&g, w.sale, "u2") == (200, "on_hold".into())
    });

    assert_eq!(w.run(), 1);
    let keys = w.finding_keys();
    assert_eq!(
        keys,
        vec![
            ("dead_letter".to_string(), rid.clone(), "open".to_string()),
            (
                "ledger_without_order".to_string(),
                rid.clone(),
                "open".to_string()
            ),
        ]
    );
    let f = w.findings();
    let id_of = |kind: &str| {
        f.iter().find(|x| x["kind"] == kind).unwrap()["id"]
            .as_i64()
            .unwrap()
            .to_string()
    };
    let (dl, lw) = (id_of("dead_letter"), id_of("ledger_without_order"));
    rollback_refused(
        &w,
        &dl,
        &format!("MySQL's stock ledger deducted a unit for {rid}"),
        0,
    );
    assert_eq!(
        w.review_count("SELECT COUNT(*) FROM actions WHERE result = 'refused'"),
        2
    );

    ok(&w.cmd("0s", &["resolve", &lw, "--recreate", "--by", "alice"]));
    assert_eq!(mysql_of(&w, &rid), (1, 1, 0));
    assert_eq!(w.redis_stock(), 0);
    assert_eq!(status_of(&g, w.sale, "u2"), (200, "confirmed".into()));
    // The dead letter it settled is archived with the action.
    assert!(worker::dead_letters(&w.redis, w.sale).is_empty());
    let archived: Vec<String> = con.lrange(k.dead_letter_archive(), 0, -1).unwrap();
    assert_eq!(archived.len(), 1);
    let a: serde_json::Value = serde_json::from_str(&archived[0]).unwrap();
    assert_eq!(a["settled_by"]["action"], "recreate");
    assert_eq!(
        w.review_count("SELECT COUNT(*) FROM findings WHERE state = 'open'"),
        0
    );
    rollback_refused(&w, &dl, "already resolved (recreate by alice)", 0);
    assert_eq!(w.run(), 0);
}

/// A sale of 3: u1 ordered by the real worker; u2's reservation refused by
/// it and dead-lettered once (u2 holds an order from another reservation,
/// written by hand with its ledger row and deduction, so the books
/// balance). After a run: `flow_without_order`, `dead_letter` (u2's
/// reservation) and `order_without_flow` (the hand-written order) open.
/// Returns the world, the worker, u2's reservation id, the first dead
/// letter's time and the ids of the three findings in that order.
fn dead_lettered_by_a_conflict() -> (World, worker::WorkerProc, String, u64, [String; 3]) {
    let w = World::new(3);
    let rids = w.reserve(&["u1", "u2"]);
    let other = "f".repeat(32);
    for q in [
        format!(
            "INSERT INTO orders (reservation_id, sale_id, user_id, quantity, status, reserved_at)
             VALUES ('{other}', {{sale}}, 'u2', 1, 'confirmed', UTC_TIMESTAMP(3))"
        ),
        format!(
            "INSERT INTO stock_ledger (reservation_id, sale_id, user_id, delta, reason)
             VALUES ('{other}', {{sale}}, 'u2', -1, 'order')"
        ),
        "UPDATE sales SET available_stock = available_stock - 1 WHERE id = {sale}".to_string(),
    ] {
        w.sql(&q);
    }
    let wk = worker::WorkerProc::start(&w.redis, &w.db, "w1", &worker::Opts::default());
    seckill_tests::wait_until(LONG, "u2's reservation dead-lettered", || {
        worker::dead_letters(&w.redis, w.sale).len() == 1
    });
    worker::wait_orders(&w.db, w.sale, 2, LONG);
    worker::wait_drained(&w.redis, w.sale, LONG);
    let first = worker::dead_letters(&w.redis, w.sale).remove(0);
    assert_eq!(first.reservation_id.as_deref(), Some(rids[1].as_str()));
    assert!(
        first.reason.contains("user already holds order"),
        "{first:?}"
    );
    assert_eq!(w.run(), 1);
    let keys = w.finding_keys();
    assert_eq!(
        keys,
        vec![
            ("dead_letter".into(), rids[1].clone(), "open".into()),
            ("flow_without_order".into(), rids[1].clone(), "open".into()),
            ("order_without_flow".into(), other.clone(), "open".into()),
        ]
    );
    let f = w.findings();
    let id_of = |kind: &str| {
        f.iter().find(|x| x["kind"] == kind).unwrap()["id"]
            .as_i64()
            .unwrap()
            .to_string()
    };
    let ids = [
        id_of("flow_without_order"),
        id_of("dead_letter"),
        id_of("order_without_flow"),
    ];
    (w, wk, rids[1].clone(), first.at_ms, ids)
}

/// Waits until the worker dead-lettered the re-queued message of `rid`
/// (an entry later than `first_ms`), and returns it.
fn second_dead_letter(
    w: &World,
    rid: &str,
    first_ms: u64,
) -> seckill_common::dead_letter::DeadLetter {
    seckill_tests::wait_until(LONG, "the re-queued message dead-lettered", || {
        worker::dead_letters(&w.redis, w.sale)
            .iter()
            .any(|d| d.at_ms > first_ms)
    });
    worker::wait_drained(&w.redis, w.sale, LONG);
    let later: Vec<_> = worker::dead_letters(&w.redis, w.sale)
        .into_iter()
        .filter(|d| d.at_ms > first_ms)
        .collect();
    assert_eq!(later.len(), 1, "{later:?}");
    assert_eq!(later[0].reservation_id.as_deref(), Some(rid));
    later.into_iter().next().unwrap()
}

/// After an action whose effect the worker dead-lettered again: the run
/// opens exactly one `dead_letter` finding, with the worker's reason, and
/// the archive holds only the entry that existed when the action started.
fn the_new_dead_letter_is_reported_and_only_the_old_one_archived(
    w: &World,
    rid: &str,
    first_ms: u64,
) {
    assert_eq!(w.run(), 1);
    let open: Vec<serde_json::Value> = w
        .findings()
        .into_iter()
        .filter(|f| f["state"] == "open" && f["kind"] == "dead_letter")
        .collect();
    assert_eq!(open.len(), 1, "{open:#?}");
    assert_eq!(open[0]["subject"], rid);
    let reason = open[0]["evidence"]["reason"].as_str().unwrap();
    assert!(reason.contains("user already holds order"), "{reason}");
    assert!(open[0]["evidence"]["at_ms"].as_u64().unwrap() > first_ms);
    let archived: Vec<String> = w
        .redis
        .con()
        .lrange(SaleKeys::new(w.sale).dead_letter_archive(), 0, -1)
        .unwrap();
    assert_eq!(archived.len(), 1, "{archived:?}");
    let a: serde_json::Value = serde_json::from_str(&archived[0]).unwrap();
    let entry: serde_json::Value = serde_json::from_str(a["entry"].as_str().unwrap()).unwrap();
    assert_eq!(entry["at_ms"].as_u64(), Some(first_ms));
    assert_eq!(a["settled_by"]["action"], "reorder");
}

#[test]
fn a_reorder_the_worker_dead_letters_again_opens_a_dead_letter_finding() {
    let (w, _wk, rid, first_ms, [flow, _, _]) = dead_lettered_by_a_conflict();
    ok(&w.cmd("0s", &["resolve", &flow, "--reorder", "--by", "alice"]));
    second_dead_letter(&w, &rid, first_ms);
    the_new_dead_letter_is_reported_and_only_the_old_one_archived(&w, &rid, first_ms);
}

/// The same when the reorder was interrupted after its effect (a kill -9
/// between the push and the completion, made here by hand: the `started`
/// row, then the reorder script with its mark), and the worker
/// dead-lettered the message before the next command completed the
/// action: the completion archives only the entries dead-lettered before
/// its `started` row.
#[test]
fn an_interrupted_reorder_completed_later_leaves_the_new_dead_letter_to_the_run() {
    let (w, _wk, rid, first_ms, [flow, _, other]) = dead_lettered_by_a_conflict();
    std::thread::sleep(Duration::from_millis(5));
    let at = seckill_common::timefmt::format_ms(seckill_common::now_ms());
    let c = rusqlite::Connection::open(w.review_path()).unwrap();
    c.execute(
        "INSERT INTO actions (at, actor, finding_id, action, detail, result)
         VALUES (?1, 'alice', ?2, 'reorder', 'started: queue it again', 'started')",
        rusqlite::params![at, flow.parse::<i64>().unwrap()],
    )
    .unwrap();
    let mark = format!("{}@{at}", c.last_insert_rowid());
    drop(c);
    let mut con = w.redis.con();
    let workers: Vec<String> = con.smembers(seckill_common::keys::WORKERS).unwrap();
    let queued = seckill_common::reorder::reorder_in(
        &mut con,
        SaleKeys::new(w.sale),
        &rid,
        &workers,
        Some(&mark),
    )
    .unwrap();
    assert_eq!(queued, seckill_common::reorder::ReorderOutcome::Queued);
    second_dead_letter(&w, &rid, first_ms);
    // Any command completes it first: a dismissal of another finding.
    ok(&w.cmd("0s", &["resolve", &other, "--dismiss", "--by", "bob"]));
    assert_eq!(
        w.review_count(
            "SELECT COUNT(*) FROM actions d JOIN actions s ON d.completes = s.id
             WHERE s.result = 'started' AND d.result = 'done' AND d.action = 'reorder'"
        ),
        1
    );
    the_new_dead_letter_is_reported_and_only_the_old_one_archived(&w, &rid, first_ms);
}

/// A buyer answered 202 whose reservation an operator rolled back reads
/// `failed` (200, the same id), not 404: the release keeps the id of the
/// mark it removes (`buyers:released`).
#[test]
fn a_buyer_answered_202_reads_failed_after_a_rollback() {
    let w = World::new(10);
    let g = Gateway::start(&w.redis, &[]);
    let r = gateway_support::buy(g.port, w.sale, "u1");
    assert_eq!(r.status, 202, "{r:?}");
    let rid = r.json()["reservation_id"].as_str().unwrap().to_string();
    w.lose_message(&rid);
    assert_eq!(w.run(), 1);
    let id = w.findings()[0]["id"].as_i64().unwrap().to_string();
    ok(&w.cmd("0s", &["resolve", &id, "--rollback", "--by", "alice"]));
    assert_eq!(w.redis_stock(), 10);
    let s = gateway_support::get(g.port, &format!("/v1/sales/{}/purchases/u1", w.sale));
    assert_eq!(s.status, 200, "{s:?}");
    assert_eq!(s.json()["reservation_id"], rid.as_str());
    assert_eq!(s.json()["status"], "failed");
    assert_eq!(w.run(), 0);
}

/// The same in a sale split over two buckets with a payment window: the
/// order is made again `pending_payment` with the deadline the worker
/// gave it, and the status and deadline are written in the buyer's home
/// bucket, where the buyer reads them.
#[test]
fn recreate_in_a_split_sale_with_a_payment_window_writes_the_buyers_home_bucket() {
    const K: u32 = 2;
    let redis = seckill_tests::RedisServer::start();
    let db = seckill_tests::TestDb::create();
    let dir = seckill_tests::TempDir::new();
    let file = dir.path().join("review.sqlite3");
    let sale = seckill_tests::create_windowed_split_sale(&redis, &db, &file, 4, "1h", K);
    let w = World {
        redis,
        db,
        dir,
        sale,
    };
    let g = Gateway::start(&w.redis, &[]);
    let users: Vec<String> = (0..4).map(|i| format!("s{i}")).collect();
    let mut rids = Vec::new();
    for u in &users {
        let r = gateway_support::buy(g.port, sale, u);
        assert_eq!(r.status, 202, "{r:?}");
        rids.push(r.json()["reservation_id"].as_str().unwrap().to_string());
    }
    let _wk = worker::WorkerProc::start(&w.redis, &w.db, "w1", &worker::Opts::default());
    worker::wait_orders(&w.db, sale, 4, LONG);
    let i = users
        .iter()
        .position(|u| seckill_common::buckets::home_bucket(u, K) == 1)
        .expect("a buyer of bucket 1");
    let (user, rid) = (users[i].as_str(), rids[i].clone());
    seckill_tests::wait_until(LONG, "the buyer's order pending", || {
        status_of(&g, sale, user) == (200, "pending_payment".into())
    });
    let pay_by = w.sql(&format!(
        "SELECT CAST(UNIX_TIMESTAMP(pay_by) * 1000 AS SIGNED) FROM orders \
         WHERE reservation_id = '{rid}'"
    ));
    w.sql(&format!(
        "DELETE FROM orders WHERE reservation_id = '{rid}'"
    ));
    // What a worker's dead letter would have written meanwhile.
    let home = SaleKeys::bucket(sale, 1);
    let _: () = w.redis.con().hset(home.status(), &rid, "failed").unwrap();

    assert_eq!(w.run(), 1);
    let f = w.findings();
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0]["kind"], "ledger_without_order");
    assert_eq!(f[0]["evidence"]["status"], "failed");
    let id = f[0]["id"].as_i64().unwrap().to_string();
    let done = ok(&w.cmd("0s", &["resolve", &id, "--recreate", "--by", "alice"]));
    assert!(
        done.contains(&format!(
            "for buyer {user} (pending_payment) from ledger row"
        )) && done.ends_with("Redis status pending_payment\n"),
        "{done}"
    );
    assert_eq!(mysql_of(&w, &rid), (1, 1, 0));
    assert_eq!(
        w.sql(&format!(
            "SELECT CAST(UNIX_TIMESTAMP(pay_by) * 1000 AS SIGNED) FROM orders \
             WHERE reservation_id = '{rid}' AND status = 'pending_payment'"
        )),
        pay_by
    );
    let mut con = w.redis.con();
    let st: Option<String> = con.hget(home.status(), &rid).unwrap();
    assert_eq!(st.as_deref(), Some("pending_payment"));
    let deadline: Option<i64> = con.hget(home.pay_by(), &rid).unwrap();
    assert_eq!(deadline, Some(pay_by));
    assert_eq!(status_of(&g, sale, user), (200, "pending_payment".into()));
    let stocks: Vec<i64> = (0..K)
        .map(|b| con.get(SaleKeys::bucket(sale, b).stock()).unwrap())
        .collect();
    assert_eq!(stocks.iter().sum::<i64>(), 0, "{stocks:?}");
    assert_eq!(w.run(), 0);
}

/// Writes a `started` row of `action` on finding `id` by `actor`, as an
/// action killed after it would have left it.
fn started_row(w: &World, id: &str, action: &str, actor: &str) {
    let at = seckill_common::timefmt::format_ms(seckill_common::now_ms());
    let c = rusqlite::Connection::open(w.review_path()).unwrap();
    c.execute(
        "INSERT INTO actions (at, actor, finding_id, action, detail, result)
         VALUES (?1, ?2, ?3, ?4, 'started: interrupted', 'started')",
        rusqlite::params![at, actor, id.parse::<i64>().unwrap(), action],
    )
    .unwrap();
}

/// A `--recreate` killed before its effect is completed as `failed`
/// (nothing changed, the finding stays open); one killed after its MySQL
/// commit, before its Redis status write, is completed as `done` by the
/// next command, which writes the status: one order, one `done` row.
#[test]
fn an_interrupted_recreate_is_completed_from_what_mysql_holds() {
    let (w, g, _wk, rid) = order_lost_in_mysql();
    assert_eq!(w.run(), 1);
    let id = w.findings()[0]["id"].as_i64().unwrap().to_string();

    started_row(&w, &id, "recreate", "alice");
    assert_eq!(w.run(), 1);
    assert_eq!(
        w.review_count(
            "SELECT COUNT(*) FROM actions WHERE action = 'recreate' AND result = 'failed'"
        ),
        1
    );
    assert_eq!(w.findings()[0]["state"], "open");
    assert_eq!(mysql_of(&w, &rid), (0, 1, 0));

    // Killed after the commit: the order is there, the status is not
    // (here `failed`, as a dead letter would have left it).
    started_row(&w, &id, "recreate", "bob");
    w.sql(&format!(
        "INSERT INTO orders (reservation_id, sale_id, user_id, quantity, status, reserved_at)
         VALUES ('{rid}', {{sale}}, 'u2', 1, 'confirmed', UTC_TIMESTAMP(3))"
    ));
    let k = SaleKeys::new(w.sale);
    let _: () = w.redis.con().hset(k.status(), &rid, "failed").unwrap();
    assert_eq!(status_of(&g, w.sale, "u2"), (200, "failed".into()));
    assert_eq!(w.run(), 0);
    assert_eq!(status_of(&g, w.sale, "u2"), (200, "confirmed".into()));
    assert_eq!(mysql_of(&w, &rid), (1, 1, 0));
    for (result, n) in [("started", 2), ("failed", 1), ("done", 1)] {
        assert_eq!(
            w.review_count(&format!(
                "SELECT COUNT(*) FROM actions WHERE action = 'recreate' AND result = '{result}'"
            )),
            n,
            "{result}"
        );
    }
    assert_eq!(
        w.review_count(
            "SELECT COUNT(*) FROM actions d JOIN actions s ON d.completes = s.id
             WHERE d.result = 'done' AND s.actor = 'bob' AND d.actor = 'bob'"
        ),
        1
    );
    let f = &w.findings()[0];
    assert_eq!(
        (f["state"].as_str(), f["resolved_by"].as_str()),
        (Some("resolved"), Some("bob"))
    );
}
