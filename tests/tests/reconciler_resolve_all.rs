//! Specifies `resolve all --kind KIND --sale ID`, the bulk form of
//! `resolve`, on real Redis, MariaDB and SQLite: `--dry-run` says what it
//! would do for each finding and records nothing; the real one acts on
//! every open finding of the kind once, each with its own audit rows; and
//! killed with SIGKILL part-way, then run again, every finding ends acted
//! on exactly once (one `done` row each, each message queued once).

use crate::support::reconciler as support;

use redis::Commands;
use seckill_common::keys::SaleKeys;
use std::time::{Duration, Instant};
use support::{ok, World};

/// `n` reservations whose messages were lost, then a run: `n` open
/// `flow_without_order` findings.
fn lost_world(stock: u64, n: usize) -> World {
    let w = World::new(stock);
    let users: Vec<String> = (0..n).map(|i| format!("u{i}")).collect();
    let users: Vec<&str> = users.iter().map(String::as_str).collect();
    for rid in w.reserve(&users) {
        w.lose_message(&rid);
    }
    assert_eq!(w.run(), 1);
    w
}

fn bulk_args(w: &World, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "resolve",
        "all",
        "--kind",
        "flow_without_order",
        "--sale",
        &w.sale.to_string(),
        "--reorder",
        "--by",
        "bulk",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn queued(w: &World) -> usize {
    w.redis.con().llen(SaleKeys::new(w.sale).queue()).unwrap()
}

#[test]
fn resolve_all_acts_on_each_open_finding_of_the_kind_once_and_dry_run_records_nothing() {
    let w = lost_world(10, 5);
    let s = w.sale;
    let args = bulk_args(&w, &["--dry-run"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = ok(&w.cmd("0s", &args));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 6, "{out}");
    assert!(
        lines[..5]
            .iter()
            .all(|l| l.starts_with("dry run, nothing changed: ")),
        "{out}"
    );
    assert_eq!(
        lines[5],
        format!(
            "5 open flow_without_order finding(s) of sale {s}: would act on 5, refused 0, \
             closed meanwhile 0"
        )
    );
    assert_eq!(
        w.review_count("SELECT COUNT(*) FROM actions WHERE actor = 'bulk'"),
        0
    );
    assert_eq!(queued(&w), 0);

    let args = bulk_args(&w, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = ok(&w.cmd("0s", &args));
    assert!(
        out.ends_with(&format!(
            "5 open flow_without_order finding(s) of sale {s}: acted on 5, refused 0, \
             closed meanwhile 0\n"
        )),
        "{out}"
    );
    assert_eq!(queued(&w), 5);
    assert_eq!(
        w.review_count(
            "SELECT COUNT(*) FROM actions WHERE actor = 'bulk' AND action = 'reorder'
               AND result = 'started'"
        ),
        5
    );
    assert_eq!(
        w.review_count(
            "SELECT COUNT(DISTINCT finding_id) FROM actions WHERE actor = 'bulk'
               AND result = 'done' AND completes IS NOT NULL"
        ),
        5
    );
    assert_eq!(
        w.review_count("SELECT COUNT(*) FROM findings WHERE state = 'open'"),
        0
    );
    // Nothing open any more: a repeat has nothing to do.
    let out = ok(&w.cmd("0s", &args));
    assert_eq!(
        out,
        format!("no open flow_without_order finding of sale {s}; nothing to do\n")
    );
}

#[test]
fn resolve_all_killed_part_way_then_repeated_acts_on_every_finding_exactly_once() {
    const N: usize = 300;
    let w = lost_world(N as u64, N);
    let args = bulk_args(&w, &[]);
    let mut child = seckill_tests::command("seckill-reconciler")
        .args(&args)
        .env("SECKILL_MYSQL_URL", w.db.url())
        .env("SECKILL_REDIS_URL", w.redis.url())
        .env("SECKILL_REVIEW_DB", w.review_path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // SIGKILL once some, not all, are done.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let done =
            w.review_count("SELECT COUNT(*) FROM actions WHERE actor = 'bulk' AND result = 'done'");
        if done >= 20 {
            break;
        }
        assert!(Instant::now() < deadline, "only {done} done in 120 s");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let before = w.review_count("SELECT COUNT(*) FROM findings WHERE state = 'open'");
    assert!(
        before > 0 && before < N as i64,
        "{before} open after the kill"
    );

    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ok(&w.cmd("0s", &args));
    assert_eq!(
        w.review_count("SELECT COUNT(*) FROM findings WHERE state = 'open'"),
        0
    );
    // One done row per finding; every started row completed once.
    assert_eq!(
        w.review_count(
            "SELECT COUNT(*) FROM (SELECT finding_id FROM actions WHERE actor = 'bulk'
               AND result = 'done' GROUP BY finding_id HAVING COUNT(*) = 1)"
        ),
        N as i64
    );
    assert_eq!(
        w.review_count("SELECT COUNT(*) FROM actions WHERE actor = 'bulk' AND result = 'done'"),
        N as i64
    );
    assert_eq!(
        w.review_count(
            "SELECT COUNT(*) FROM actions s WHERE s.actor = 'bulk' AND s.result = 'started'
               AND (SELECT COUNT(*) FROM actions c WHERE c.completes = s.id) <> 1"
        ),
        0
    );
    // Each lost message queued again exactly once.
    let k = SaleKeys::new(w.sale);
    let msgs: Vec<String> = w.redis.con().lrange(k.queue(), 0, -1).unwrap();
    let distinct: std::collections::HashSet<&String> = msgs.iter().collect();
    assert_eq!((msgs.len(), distinct.len()), (N, N));
}
