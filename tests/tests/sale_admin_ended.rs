//! Specifies `sale pause` of an ended sale with the real gateway and
//! reconciler on a private Redis and MySQL: refused (exit 1, one `refused`
//! audit row, nothing changed), so its buyers keep hearing 403
//! `sale_ended`, not 503 `sale_paused` with a `Retry-After` that tells them
//! to retry.

use crate::support::gateway as gw;

use gw::{buy, Gateway};
use mysql::prelude::Queryable;
use seckill_common::timefmt::format_ms;
use seckill_tests::{reconciler, RedisServer, TempDir, TestDb};
use std::path::Path;

/// The audit rows of sale `id`: (actor, action, result).
fn rows(review: &Path, id: u64) -> Vec<(String, String, String)> {
    let c = rusqlite::Connection::open(review).unwrap();
    let mut st = c
        .prepare("SELECT actor, action, result FROM actions WHERE sale_id = ?1 ORDER BY id")
        .unwrap();
    let r = st
        .query_map([id as i64], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap();
    r.collect::<Result<_, _>>().unwrap()
}

#[test]
fn a_pause_of_an_ended_sale_is_refused_and_its_buyers_keep_hearing_sale_ended() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    // Opened 10 s ago for 5 s: ended 5 s ago.
    let id = seckill_tests::create_sale(&db, &redis, 5, -10_000, 5_000);
    let s = id.to_string();
    let ends: u64 = db
        .conn()
        .exec_first(
            "SELECT CAST(UNIX_TIMESTAMP(ends_at) * 1000 AS UNSIGNED) FROM sales WHERE id = ?",
            (id,),
        )
        .unwrap()
        .unwrap();
    let (code, out) = reconciler(&redis, &db, &review, &["run"]);
    assert_eq!(code, 0, "{out}");
    let g = Gateway::start(&redis, &[]);
    let r = buy(g.port, id, "late-1");
    assert_eq!(
        (r.status, r.error()),
        (403, "sale_ended".to_string()),
        "{}",
        r.body
    );

    let refusal = format!(
        "seckill-reconciler: refused: sale {id} ended at {}: its purchases are answered \
         403 sale_ended already (`sale extend {id} --ends-at T` opens it again); nothing \
         changed\n",
        format_ms(ends)
    );
    let pause = ["sale", "pause", &s, "--reason", "test", "--by", "oncall"];
    let mut dry = pause.to_vec();
    dry.push("--dry-run");
    assert_eq!(reconciler(&redis, &db, &review, &dry), (1, refusal.clone()));
    assert_eq!(rows(&review, id), []);
    assert_eq!(reconciler(&redis, &db, &review, &pause), (1, refusal));
    let refused = (
        "oncall".to_string(),
        "pause".to_string(),
        "refused".to_string(),
    );
    assert_eq!(rows(&review, id), [refused]);

    let paused: (Option<String>, Option<String>) = db
        .conn()
        .exec_first(
            "SELECT paused_reason, paused_by FROM sales WHERE id = ?",
            (id,),
        )
        .unwrap()
        .unwrap();
    assert_eq!(paused, (None, None));
    let r = buy(g.port, id, "late-2");
    assert_eq!(
        (r.status, r.error()),
        (403, "sale_ended".to_string()),
        "{}",
        r.body
    );
    assert_eq!(r.header("Retry-After"), None);
    let (code, out) = reconciler(
        &redis,
        &db,
        &review,
        &["sale", "resume", &s, "--by", "oncall"],
    );
    assert_eq!(
        (code, out),
        (
            0,
            format!("no_change: sale {id} is not paused by an operator\n")
        )
    );
}
