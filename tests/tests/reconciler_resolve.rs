//! Specifies the operator's `resolve` actions and the reconciler working with
//! a real `seckill-worker`, on real Redis, MariaDB and SQLite: a rollback puts
//! exactly one unit back and repeating it changes nothing; a reorder becomes
//! exactly one order; a dry run changes nothing and refuses exactly what the
//! real action refuses; every action is logged.

use crate::support::reconciler as support;
use crate::support::worker;

use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_tests::RedisServer;
use std::time::Duration;
use support::{ok, World};

/// A sale of 10 with 3 reservations: 2 ordered, the third's message lost.
/// Returns the world, the reservation ids and the finding id of the loss.
fn one_lost_message() -> (World, Vec<String>, String) {
    let w = World::new(10);
    let rids = w.reserve(&["u1", "u2", "u3"]);
    w.apply(&rids[..2]);
    w.lose_message(&rids[2]);
    assert_eq!(w.run(), 1);
    let f = w.findings();
    assert_eq!(f.len(), 1);
    assert_eq!(f[0]["kind"], "flow_without_order");
    let id = f[0]["id"].as_i64().unwrap().to_string();
    (w, rids, id)
}

#[test]
fn rollback_puts_exactly_one_unit_back_and_repeating_it_changes_nothing() {
    let (w, rids, id) = one_lost_message();
    let k = SaleKeys::new(w.sale);
    assert_eq!(w.redis_stock(), 7);

    let dry = ok(&w.cmd(
        "0s",
        &["resolve", &id, "--rollback", "--by", "alice", "--dry-run"],
    ));
    assert!(dry.contains("stock 7 -> 8"), "{dry}");
    assert_eq!(w.redis_stock(), 7);
    assert_eq!(w.review_count("SELECT COUNT(*) FROM actions"), 0);

    ok(&w.cmd(
        "0s",
        &[
            "resolve",
            &id,
            "--rollback",
            "--by",
            "alice",
            "--note",
            "lost",
        ],
    ));
    assert_eq!(w.redis_stock(), 8);
    let mut con = w.redis.con();
    assert!(!con.hexists::<_, _, bool>(k.flow(), &rids[2]).unwrap());
    assert!(!con.hexists::<_, _, bool>(k.buyers(), "u3").unwrap());
    let status: String = con.hget(k.status(), &rids[2]).unwrap();
    assert_eq!(status, "failed");

    assert_eq!(w.run(), 0);
    assert_eq!(w.redis_stock(), 8);
    let f = &w.findings()[0];
    assert_eq!(f["state"], "resolved");
    assert_eq!(f["resolved_by"], "alice");
    assert_eq!(f["note"], "lost");

    let again = ok(&w.cmd("0s", &["resolve", &id, "--rollback", "--by", "bob"]));
    assert!(again.contains("already released"), "{again}");
    assert_eq!(w.redis_stock(), 8);
    // Written ahead: `started`, then its `done`; the repeat, which has no
    // effect, is one `no_change` row.
    assert_eq!(
        w.review_count("SELECT COUNT(*) FROM actions WHERE action = 'rollback'"),
        3
    );
    for (result, n) in [("started", 1), ("done", 1), ("no_change", 1)] {
        assert_eq!(
            w.review_count(&format!(
                "SELECT COUNT(*) FROM actions WHERE action = 'rollback' AND result = '{result}'"
            )),
            n,
            "{result}"
        );
    }
    assert_eq!(
        w.review_count(
            "SELECT COUNT(*) FROM actions d JOIN actions s ON d.completes = s.id
             WHERE d.result = 'done' AND s.result = 'started' AND d.actor = 'alice'"
        ),
        1
    );
    // The unit can be sold again.
    assert_eq!(w.reserve(&["u9"]).len(), 1);
    assert_eq!(w.redis_stock(), 7);
}

#[test]
fn rollback_is_refused_while_mysql_holds_the_order() {
    let (w, rids, id) = one_lost_message();
    w.apply(&rids[2..]); // the order arrives after all
    let out = w.cmd("0s", &["resolve", &id, "--rollback", "--by", "alice"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(w.redis_stock(), 7);
    assert_eq!(
        w.review_count("SELECT COUNT(*) FROM actions WHERE result = 'refused'"),
        1
    );
    assert_eq!(w.findings()[0]["state"], "open");
}

#[test]
fn dismiss_closes_with_the_note_and_actions_are_append_only() {
    let (w, _, id) = one_lost_message();
    ok(&w.cmd(
        "0s",
        &[
            "resolve",
            &id,
            "--dismiss",
            "--by",
            "carol",
            "--note",
            "test unit",
        ],
    ));
    let f = &w.findings()[0];
    assert_eq!(
        (f["state"].as_str(), f["resolution"].as_str()),
        (Some("resolved"), Some("dismiss"))
    );
    assert_eq!(w.run(), 0);
    assert_eq!(w.findings()[0]["state"], "resolved");
    let c = rusqlite::Connection::open(w.review_path()).unwrap();
    for sql in ["DELETE FROM actions", "UPDATE actions SET actor = 'x'"] {
        let e = c.execute(sql, []).unwrap_err().to_string();
        assert_eq!(e, "actions is append-only", "{sql}");
    }
}

#[test]
fn reorder_then_the_worker_makes_exactly_one_order() {
    let (w, rids, id) = one_lost_message();
    let k = SaleKeys::new(w.sale);
    ok(&w.cmd("0s", &["resolve", &id, "--reorder", "--by", "alice"]));
    let again = ok(&w.cmd("0s", &["resolve", &id, "--reorder", "--by", "bob"]));
    assert!(again.contains("already queued"), "{again}");
    let queued: i64 = w.redis.con().llen(k.queue()).unwrap();
    assert_eq!(queued, 1);

    let _worker = worker::WorkerProc::start(&w.redis, &w.db, "w1", &worker::Opts::default());
    worker::wait_orders(&w.db, w.sale, 3, Duration::from_secs(60));
    worker::wait_drained(&w.redis, w.sale, Duration::from_secs(60));
    assert_eq!(
        w.sql(&format!(
            "SELECT COUNT(*) FROM orders WHERE reservation_id = '{}'",
            rids[2]
        )),
        1
    );
    assert_eq!(
        w.sql("SELECT COUNT(*) FROM stock_ledger WHERE sale_id = {sale}"),
        3
    );
    assert_eq!(
        w.sql("SELECT available_stock FROM sales WHERE id = {sale}"),
        7
    );
    // A reorder after the order exists changes nothing.
    let late = ok(&w.cmd("0s", &["resolve", &id, "--reorder", "--by", "bob"]));
    assert!(late.contains("already holds order"), "{late}");
    assert_eq!(w.run(), 0);
    assert_eq!(
        w.sql("SELECT COUNT(*) FROM orders WHERE sale_id = {sale}"),
        3
    );
}

#[test]
fn a_clean_sale_after_the_worker_has_drained_gives_no_finding() {
    let w = World::new(50);
    let _worker = worker::WorkerProc::start(&w.redis, &w.db, "w1", &worker::Opts::default());
    worker::reserve_users(&w.redis, w.sale, "buyer", 30);
    worker::wait_orders(&w.db, w.sale, 30, Duration::from_secs(60));
    worker::wait_drained(&w.redis, w.sale, Duration::from_secs(60));
    assert_eq!(w.run(), 0);
    assert!(w.findings().is_empty());
    let table = ok(&w.cmd("0s", &["findings"]));
    assert_eq!(table.trim(), "no findings");
}

#[test]
fn an_unreachable_redis_exits_2_and_records_a_failed_run() {
    let w = World::new(5);
    let mut dead = RedisServer::start();
    dead.stop();
    let out = seckill_tests::command("seckill-reconciler")
        .arg("run")
        .env("SECKILL_MYSQL_URL", w.db.url())
        .env("SECKILL_REDIS_URL", dead.url())
        .env("SECKILL_REVIEW_DB", w.review_path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        w.review_count("SELECT COUNT(*) FROM runs WHERE outcome = 'failed'"),
        1
    );
}

/// Exit code and stderr of `out`.
fn refused(out: &std::process::Output) -> (Option<i32>, String) {
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_confirmed_order_lost_in_mysql_is_refused_alike_by_dry_run_and_rollback_and_reorder_fixes_it() {
    let w = World::new(10);
    let rids = w.reserve(&["u1", "u2"]);
    w.apply(&rids);
    // MySQL loses u2's confirmed order and its ledger row; the unit is back in
    // available_stock. Redis still says `confirmed`: the buyer was told so.
    for q in [
        format!("DELETE FROM orders WHERE reservation_id = '{}'", rids[1]),
        format!(
            "DELETE FROM stock_ledger WHERE reservation_id = '{}'",
            rids[1]
        ),
        "UPDATE sales SET available_stock = available_stock + 1 WHERE id = {sale}".to_string(),
    ] {
        w.sql(&q);
    }
    assert_eq!(w.run(), 1);
    let f = w.findings();
    assert_eq!(f.len(), 1);
    assert_eq!(
        (f[0]["kind"].as_str(), f[0]["subject"].as_str()),
        (Some("flow_without_order"), Some(rids[1].as_str()))
    );
    assert_eq!(f[0]["evidence"]["status"], "confirmed");
    let id = f[0]["id"].as_i64().unwrap().to_string();

    let why = format!(
        "refused: {} is confirmed in Redis but MySQL holds no order for it: the order was \
         confirmed and later lost in MySQL; use --reorder to create it again (a rollback \
         would resell a unit the buyer was told is theirs)",
        rids[1]
    );
    let dry = w.cmd(
        "0s",
        &["resolve", &id, "--rollback", "--by", "alice", "--dry-run"],
    );
    let (code, err) = refused(&dry);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(&why), "{err}");
    assert!(dry.stdout.is_empty());
    assert_eq!(w.review_count("SELECT COUNT(*) FROM actions"), 0);

    let real = w.cmd("0s", &["resolve", &id, "--rollback", "--by", "alice"]);
    let (code, err) = refused(&real);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(&why), "{err}");
    assert_eq!(w.redis_stock(), 8);
    assert_eq!(
        w.review_count("SELECT COUNT(*) FROM actions WHERE result = 'refused'"),
        1
    );
    assert_eq!(w.findings()[0]["state"], "open");

    // What the refusal advises works: the worker creates the order again.
    let dry = ok(&w.cmd(
        "0s",
        &["resolve", &id, "--reorder", "--by", "alice", "--dry-run"],
    ));
    assert!(dry.contains("would queue the order message"), "{dry}");
    ok(&w.cmd("0s", &["resolve", &id, "--reorder", "--by", "alice"]));
    let _worker = worker::WorkerProc::start(&w.redis, &w.db, "w1", &worker::Opts::default());
    worker::wait_orders(&w.db, w.sale, 2, Duration::from_secs(60));
    worker::wait_drained(&w.redis, w.sale, Duration::from_secs(60));
    assert_eq!(
        w.sql("SELECT COUNT(*) FROM stock_ledger WHERE sale_id = {sale}"),
        2
    );
    assert_eq!(
        w.sql("SELECT available_stock FROM sales WHERE id = {sale}"),
        8
    );
    assert_eq!(w.redis_stock(), 8);
    assert_eq!(w.run(), 0);
}

#[test]
fn a_dry_run_refuses_exactly_what_the_real_action_refuses() {
    let (w, rids, id) = one_lost_message();
    let k = SaleKeys::new(w.sale);
    // A worker has just taken the lost message: it sits in its processing list.
    let mut con = w.redis.con();
    let raw: String = con.hget(k.flow(), &rids[2]).unwrap();
    let _: i64 = con.sadd(seckill_common::keys::WORKERS, "w9").unwrap();
    let _: i64 = con.lpush(k.processing("w9"), &raw).unwrap();
    let why = format!(
        "refused: {} is in {}: a worker is applying it; try again later",
        rids[2],
        k.processing("w9")
    );
    for dry_run in [true, false] {
        let mut args = vec!["resolve", id.as_str(), "--rollback", "--by", "alice"];
        if dry_run {
            args.push("--dry-run");
        }
        let (code, err) = refused(&w.cmd("0s", &args));
        assert_eq!(code, Some(1), "dry run {dry_run}: {err}");
        assert!(err.contains(&why), "dry run {dry_run}: {err}");
        assert_eq!(w.redis_stock(), 7);
    }
    // Released for real once the worker gave the message back to the queue.
    let _: i64 = con.del(k.processing("w9")).unwrap();
    ok(&w.cmd("0s", &["resolve", &id, "--rollback", "--by", "alice"]));
    assert_eq!(w.redis_stock(), 8);
    // Rolled back: a reorder of the same finding is refused, dry run or not.
    for dry_run in [true, false] {
        let mut args = vec!["resolve", id.as_str(), "--reorder", "--by", "bob"];
        if dry_run {
            args.push("--dry-run");
        }
        let (code, err) = refused(&w.cmd("0s", &args));
        assert_eq!(code, Some(1), "dry run {dry_run}: {err}");
        assert!(
            err.contains("already resolved (rollback by alice)"),
            "dry run {dry_run}: {err}"
        );
    }
    assert_eq!(
        w.review_count("SELECT COUNT(*) FROM actions WHERE result = 'refused'"),
        2
    );
}

#[test]
fn a_finding_closed_one_way_is_not_acted_on_another_way() {
    let (w, _rids, id) = one_lost_message();
    let k = SaleKeys::new(w.sale);
    ok(&w.cmd(
        "0s",
        &[
            "resolve",
            &id,
            "--dismiss",
            "--by",
            "alice",
            "--note",
            "checked by hand",
        ],
    ));
    let flows_before: usize = w.redis.con().hlen(k.flow()).unwrap();
    for action in ["--rollback", "--reorder"] {
        for dry in [false, true] {
            let mut args = vec!["resolve", id.as_str(), action, "--by", "bob"];
            if dry {
                args.push("--dry-run");
            }
            let out = w.cmd("0s", &args);
            assert_eq!(out.status.code(), Some(1), "{action} dry={dry}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("already resolved (dismiss by alice)"), "{err}");
        }
    }
    assert_eq!(w.redis_stock(), 7);
    let flows_after: usize = w.redis.con().hlen(k.flow()).unwrap();
    assert_eq!(flows_after, flows_before);
    let queued: usize = w.redis.con().llen(k.queue()).unwrap();
    assert_eq!(queued, 0);
    // The refusals are logged; the dismissal stays the resolution.
    assert_eq!(
        w.review_count("SELECT COUNT(*) FROM actions WHERE result = 'refused'"),
        2
    );
    assert_eq!(
        w.review_count("SELECT COUNT(*) FROM findings WHERE resolution = 'dismiss'"),
        1
    );
}

#[test]
fn a_reorder_that_fails_again_opens_its_finding_again_but_a_dismissal_stays() {
    let (w, rids, id) = one_lost_message();
    ok(&w.cmd("0s", &["resolve", &id, "--reorder", "--by", "alice"]));
    // The re-queued message is lost again (say, dead-lettered once more).
    w.lose_message(&rids[2]);
    assert_eq!(w.run(), 1);
    let f = w.findings();
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0]["id"].as_i64().unwrap().to_string(), id);
    assert_eq!(f[0]["state"], "open");
    // Now a person can act on it again: a rollback is allowed.
    ok(&w.cmd("0s", &["resolve", &id, "--rollback", "--by", "bob"]));
    assert_eq!(w.redis_stock(), 8);
    assert_eq!(w.run(), 0);

    // A dismissed finding stays closed however often it is observed.
    let (w, _rids, id) = one_lost_message();
    ok(&w.cmd("0s", &["resolve", &id, "--dismiss", "--by", "alice"]));
    assert_eq!(w.run(), 0);
    assert_eq!(
        w.review_count("SELECT COUNT(*) FROM findings WHERE state = 'open'"),
        0
    );
}

/// The findings about payments name a reservation but are each their own
/// decision (dismissing one `payment_conflict` must not close every
/// finding of its reservation). Two conflicting deliveries of one
/// payment id for reservation r0, and a late payment for r2 whose message
/// was lost: dismissing one conflict closes that one only, with one row;
/// the rollback of r2 closes its `flow_without_order` and leaves its late
/// payment open; the next run keeps all of that.
#[test]
fn dismissing_one_payment_finding_closes_that_one_only_with_one_row() {
    let w = World::new(10);
    let rids = w.reserve(&["u1", "u2", "u3"]);
    w.apply(&rids[..2]);
    w.lose_message(&rids[2]);
    {
        use mysql::prelude::Queryable;
        let mut db = w.db.conn();
        db.exec_drop(
            "INSERT INTO payments (payment_id, reservation_id, sale_id, amount_cents, outcome,
                                   received_at)
             VALUES ('pay-a', ?, ?, 1999, 'paid', UTC_TIMESTAMP(3)),
                    ('pay-late', ?, ?, 1999, 'late_payment', UTC_TIMESTAMP(3))",
            (&rids[0], w.sale, &rids[2], w.sale),
        )
        .unwrap();
        db.exec_drop(
            "INSERT INTO payment_conflicts (payment_id, reservation_id, amount_cents, received_at)
             VALUES ('pay-a', ?, 1000, UTC_TIMESTAMP(3)), ('pay-a', ?, 500, UTC_TIMESTAMP(3))",
            (&rids[0], &rids[0]),
        )
        .unwrap();
    }
    assert_eq!(w.run(), 1);
    let r0 = &rids[0];
    let r2 = &rids[2];
    let want_open = |states: [&str; 4]| {
        let mut v = vec![
            (
                "flow_without_order".to_string(),
                r2.clone(),
                states[0].to_string(),
            ),
            (
                "late_payment".to_string(),
                "pay-late".to_string(),
                states[1].to_string(),
            ),
            (
                "payment_conflict".to_string(),
                format!("pay-a/{r0}/1000"),
                states[2].to_string(),
            ),
            (
                "payment_conflict".to_string(),
                format!("pay-a/{r0}/500"),
                states[3].to_string(),
            ),
        ];
        v.sort();
        v
    };
    assert_eq!(w.finding_keys(), want_open(["open"; 4]));
    let id_of = |subject: &str| -> i64 {
        w.findings()
            .iter()
            .find(|f| f["subject"] == subject)
            .and_then(|f| f["id"].as_i64())
            .unwrap()
    };
    let conflict = id_of(&format!("pay-a/{r0}/1000"));
    ok(&w.cmd(
        "0s",
        &[
            "resolve",
            &conflict.to_string(),
            "--dismiss",
            "--by",
            "carol",
            "--note",
            "refunded",
        ],
    ));
    assert_eq!(
        w.finding_keys(),
        want_open(["open", "open", "resolved", "open"])
    );
    assert_eq!(w.review_count("SELECT COUNT(*) FROM actions"), 1);
    assert_eq!(
        w.review_count(&format!(
            "SELECT COUNT(*) FROM actions WHERE finding_id = {conflict} AND action = 'dismiss'
               AND result = 'done' AND actor = 'carol'"
        )),
        1
    );

    // A rollback of r2 settles its flow_without_order, not its payment.
    let lost = id_of(r2);
    ok(&w.cmd(
        "0s",
        &["resolve", &lost.to_string(), "--rollback", "--by", "dave"],
    ));
    assert_eq!(
        w.finding_keys(),
        want_open(["resolved", "open", "resolved", "open"])
    );
    let late = id_of("pay-late");
    assert_eq!(
        w.review_count(&format!(
            "SELECT COUNT(*) FROM actions WHERE finding_id = {late}"
        )),
        0
    );
    assert_eq!(w.run(), 1);
    assert_eq!(
        w.finding_keys(),
        want_open(["resolved", "open", "resolved", "open"])
    );
}
