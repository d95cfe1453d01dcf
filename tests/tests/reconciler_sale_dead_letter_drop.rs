//! Specifies `seckill-reconciler dead-letter drop SALE ENTRY` on real
//! Redis, MariaDB and SQLite: a sale's dead letter naming no reservation
//! leaves the list (kept in the archive) once, audited, its finding
//! resolved by the operator with the note; one naming a reservation is
//! refused; a drop a kill left `started` is completed by the next `run`.

use crate::support::reconciler as support;

use redis::Commands;
use seckill_common::dead_letter::DeadLetter;
use seckill_common::keys::SaleKeys;
use support::{ok, World};

/// FNV-1a, 64 bits, as the reconciler names entries.
fn fnv1a(bytes: &[u8]) -> String {
    let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{h:016x}")
}

/// A sale whose dead-letter list holds a malformed message (no
/// reservation), a foreign text, and a dead letter of reservation `rid`.
/// Returns the world, the reservation and the two names without one.
fn world() -> (World, String, String, String) {
    let w = World::new(5);
    let rid = w.reserve(&["alice"]).remove(0);
    let k = SaleKeys::new(w.sale);
    let mut con = w.redis.con();
    let flow: String = con.hget(k.flow(), &rid).unwrap();
    let _: i64 = con.lrem(k.queue(), 1, &flow).unwrap();
    let named = DeadLetter {
        message: flow,
        reason: "stock exhausted in MySQL".into(),
        attempts: 5,
        worker: "w1".into(),
        at_ms: 1_764_446_400_000,
        reservation_id: Some(rid.clone()),
    };
    let malformed = DeadLetter {
        message: "{not json".into(),
        reason: "malformed order message: EOF".into(),
        attempts: 0,
        worker: "w1".into(),
        at_ms: 1_764_446_400_000,
        reservation_id: None,
    };
    let _: () = con.lpush(k.dead_letter(), named.to_json()).unwrap();
    let _: () = con.lpush(k.dead_letter(), malformed.to_json()).unwrap();
    let _: () = con.lpush(k.dead_letter(), "junk").unwrap();
    let m = format!("entry:{}", fnv1a(b"{not json"));
    let j = format!("entry:{}", fnv1a(b"junk"));
    (w, rid, m, j)
}

fn dlq_len(w: &World) -> i64 {
    w.redis
        .con()
        .llen(SaleKeys::new(w.sale).dead_letter())
        .unwrap()
}

#[test]
fn a_dead_letter_naming_no_reservation_is_dropped_once_audited() {
    let (w, rid, malformed, junk) = world();
    assert_eq!(w.run(), 1); // three dead_letter findings
    let sale = w.sale.to_string();
    let drop = |entry: &str, extra: &[&str]| {
        let mut args = vec!["dead-letter", "drop", &sale, entry, "--by", "oncall"];
        args.extend_from_slice(extra);
        w.cmd("0s", &args)
    };
    let out = drop(&malformed, &[]);
    assert_eq!(out.status.code(), Some(64));
    let out = ok(&drop(&malformed, &["--note", "bad push", "--dry-run"]));
    assert_eq!(
        out,
        format!(
            "dry run: would drop 1 dead letter(s) {malformed} of sale {sale}; nothing changed\n"
        )
    );
    assert_eq!(dlq_len(&w), 3);
    let out = ok(&drop(&malformed, &["--note", "bad push"]));
    let archive = SaleKeys::new(w.sale).dead_letter_archive();
    assert_eq!(
        out,
        format!("done: dropped 1 dead letter(s) {malformed} (kept in {archive})\n")
    );
    // By its bare hash, the foreign text.
    let bare = junk.trim_start_matches("entry:");
    ok(&drop(bare, &["--note", "pushed by hand"]));
    assert_eq!(dlq_len(&w), 1);
    let archived: Vec<String> = w.redis.con().lrange(&archive, 0, -1).unwrap();
    assert_eq!(archived.len(), 2);
    assert!(archived[1].contains("\"entry\":\"junk\""), "{archived:?}");
    // The one naming a reservation: refused, nothing changed or recorded.
    let before = w.review_count("SELECT COUNT(*) FROM actions");
    let out = drop(&rid, &["--note", "no"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--reorder") && err.contains(&rid), "{err}");
    let out = drop("entry:0000000000000000", &["--note", "no"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(w.review_count("SELECT COUNT(*) FROM actions"), before);
    assert_eq!(dlq_len(&w), 1);
    // Each finding resolved by oncall with the note, and one row naming it.
    for (subject, note) in [(&malformed, "bad push"), (&junk, "pushed by hand")] {
        let q = format!(
            "SELECT COUNT(*) FROM findings WHERE subject = '{subject}' AND state = 'resolved'
               AND resolved_by = 'oncall' AND note = '{note}' AND resolution = 'drop_dead_letter'"
        );
        assert_eq!(w.review_count(&q), 1, "{subject}");
        let q = format!(
            "SELECT COUNT(*) FROM actions a JOIN findings f ON f.id = a.finding_id
             WHERE f.subject = '{subject}' AND a.action = 'drop_dead_letter' AND a.actor = 'oncall'"
        );
        assert_eq!(w.review_count(&q), 1, "{subject}");
    }
    assert_eq!(
        w.review_count(
            "SELECT COUNT(*) FROM actions WHERE action = 'drop_dead_letter' AND sale_id IS NOT NULL
               AND ((result = 'started' AND completes IS NULL)
                 OR (result = 'done' AND completes IS NOT NULL))"
        ),
        4
    );
    // Again: nothing of that name is left.
    assert_eq!(
        drop(&malformed, &["--note", "again"]).status.code(),
        Some(2)
    );
    let list = ok(&w.cmd("0s", &["dead-letter", "list", &sale]));
    assert!(
        !list.contains(&malformed) && !list.contains(&junk),
        "{list}"
    );
    assert_eq!(w.run(), 1); // the reservation's findings stay open, no other
    let open: Vec<(String, String)> = w
        .finding_keys()
        .into_iter()
        .filter(|(_, _, state)| state == "open")
        .map(|(kind, subject, _)| (kind, subject))
        .collect();
    let about = |kind: &str| (kind.to_string(), rid.clone());
    assert_eq!(
        open,
        vec![about("dead_letter"), about("flow_without_order")]
    );
}

#[test]
fn a_drop_a_kill_left_started_is_completed_by_the_next_run() {
    let (w, _, _, _) = world();
    assert_eq!(w.run(), 1);
    let k = SaleKeys::new(w.sale);
    let c = rusqlite::Connection::open(w.review_path()).unwrap();
    for id in [301, 302] {
        c.execute(
            "INSERT INTO actions (id, at, actor, finding_id, action, detail, result, sale_id)
             VALUES (?1, '2026-12-04T10:00:00.000Z', 'oncall', NULL, 'drop_dead_letter', 'x',
               'started', ?2)",
            [id, w.sale as i64],
        )
        .unwrap();
    }
    drop(c);
    // 301's effect happened (its entry is in the archive); 302's did not.
    let mut con = w.redis.con();
    let raw: Vec<String> = con.lrange(k.dead_letter(), 0, -1).unwrap();
    let entry = raw
        .iter()
        .find(|r| r.contains("{not json"))
        .unwrap()
        .clone();
    let wrapped = serde_json::json!({"entry": entry, "settled_by": {"action": "drop_dead_letter",
        "actor": "oncall", "action_id": 301, "at": "2026-12-04T10:00:00.000Z"}});
    assert!(
        seckill_common::dead_letter::archive_in(&mut con, k, &entry, &wrapped.to_string()).unwrap()
    );
    w.run();
    let c = rusqlite::Connection::open(w.review_path()).unwrap();
    let done: Vec<(i64, String)> = c
        .prepare("SELECT completes, result FROM actions WHERE completes IN (301, 302) ORDER BY completes")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        done,
        vec![(301, "done".to_string()), (302, "failed".to_string())]
    );
    w.run();
    assert_eq!(
        w.review_count("SELECT COUNT(*) FROM actions WHERE completes IN (301, 302)"),
        2
    );
}
