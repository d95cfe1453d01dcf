//! Specifies the operator's view of the queues and the payment dead
//! letters through the real `seckill-reconciler` on real Redis, MariaDB and
//! SQLite, with exact output: `queue show`, `dead-letter list`, `findings
//! show`, and `dead-letter requeue|drop payments` (one effect, one
//! `started` row and one completion row each; an interrupted one completed
//! by the next `run`).

use crate::support::reconciler as support;

use redis::Commands;
use seckill_common::dead_letter::DeadLetter;
use seckill_common::keys::{worker_heartbeat, SaleKeys, WORKERS};
use seckill_common::message::OrderMessage;
use seckill_common::payment::{self, CancelMessage, PaymentMessage};
use seckill_common::timefmt::format_ms;
use support::{ok, World};

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// FNV-1a, 64 bits, as the reconciler names entries.
fn fnv1a(bytes: &[u8]) -> String {
    let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{h:016x}")
}

/// `text` with the age after "oldest " replaced by `AGE` (the clock moves).
fn without_ages(text: &str) -> String {
    text.lines()
        .map(|l| match (l.find("oldest "), l.rfind(" old")) {
            (Some(a), Some(b)) if b > a + 7 => format!("{}AGE{}", &l[..a + 7], &l[b..]),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

const AT_MS: u64 = 1_764_446_400_000; // 2025-11-29T20:00:00Z

fn payment(id: &str, rid: &str) -> PaymentMessage {
    PaymentMessage {
        v: 1,
        reservation_id: rid.into(),
        payment_id: id.into(),
        amount_cents: 1999,
        received_ms: AT_MS,
    }
}

/// A sale with one message queued, one taken by worker w1 (alive), one
/// dead-lettered and one foreign entry in its dead-letter list; a payment
/// queued and one dead-lettered. Returns the world, the three reservations
/// and the payment dead letter's text.
fn queues() -> (World, Vec<String>, String) {
    let w = World::new(5);
    let rids = w.reserve(&["alice", "bob", "carol"]);
    let k = SaleKeys::new(w.sale);
    let mut con = w.redis.con();
    // The queue's tail is the oldest (LPUSH in): alice's goes to w1.
    let _: Option<String> = redis::cmd("LMOVE")
        .arg(k.queue())
        .arg(k.processing("w1"))
        .arg("RIGHT")
        .arg("LEFT")
        .query(&mut con)
        .unwrap();
    let _: () = con.sadd(WORKERS, "w1").unwrap();
    let _: () = con.set_ex(worker_heartbeat("w1"), "1", 60).unwrap();
    let flow: String = con.hget(k.flow(), &rids[2]).unwrap();
    let _: i64 = con.lrem(k.queue(), 1, &flow).unwrap();
    let dead = DeadLetter {
        message: flow,
        reason: "stock exhausted in MySQL".into(),
        attempts: 5,
        worker: "w1".into(),
        at_ms: AT_MS,
        reservation_id: Some(rids[2].clone()),
    };
    let _: () = con.lpush(k.dead_letter(), dead.to_json()).unwrap();
    let _: () = con.lpush(k.dead_letter(), "junk").unwrap();
    let _: () = con
        .lpush(payment::QUEUE, payment("pay-1", &rids[1]).to_json())
        .unwrap();
    let entry = payment::dead_letter_entry(
        payment("pay-7", &rids[0]).to_json().as_bytes(),
        "mysql: gave up",
    );
    let _: () = con.lpush(payment::DEAD_LETTERS, &entry).unwrap();
    let _: () = con.hset(payment::ATTEMPTS, "pay-7", 5).unwrap();
    (w, rids, entry)
}

#[test]
fn queue_show_counts_every_queue_processing_list_and_dead_letter_reason() {
    let (w, _, _) = queues();
    let out = ok(&w.cmd("0s", &["queue", "show", &w.sale.to_string()]));
    assert_eq!(
        without_ages(&out),
        format!(
            "sale {}\n\
             \x20 queued        1\n\
             \x20 processing    1 by w1 (alive), oldest AGE old\n\
             \x20 dead letters  2\n\
             \x20        1  (not a dead-letter entry)\n\
             \x20        1  stock exhausted in MySQL\n\
             payments\n\
             \x20 queued        1\n\
             \x20 processing    0\n\
             \x20 dead letters  1\n\
             \x20        1  mysql: gave up\n",
            w.sale
        )
    );
    // Every sale (the same one), and a sale Redis does not hold.
    assert_eq!(
        without_ages(&ok(&w.cmd("0s", &["queue", "show"]))),
        without_ages(&out)
    );
    let mut con = w.redis.con();
    let _: () = con.del(worker_heartbeat("w1")).unwrap();
    let out = ok(&w.cmd("0s", &["queue", "show", "999"]));
    assert_eq!(
        out,
        "sale 999: not in Redis\n\
         payments\n\
         \x20 queued        1\n\
         \x20 processing    0\n\
         \x20 dead letters  1\n\
         \x20        1  mysql: gave up\n"
    );
    let out = ok(&w.cmd("0s", &["queue", "show", &w.sale.to_string()]));
    assert!(out.contains("1 by w1 (no heartbeat), oldest "), "{out}");
}

#[test]
fn dead_letter_list_names_each_entry_as_its_finding_does() {
    let (w, rids, entry) = queues();
    let k = SaleKeys::new(w.sale);
    let flow: String = w.redis.con().hget(k.flow(), &rids[2]).unwrap();
    let reserved = format_ms(OrderMessage::parse(flow.as_bytes()).unwrap().reserved_at_ms);
    let out = ok(&w.cmd("0s", &["dead-letter", "list", &w.sale.to_string()]));
    let junk = format!("entry:{}", fnv1a(b"junk"));
    assert_eq!(
        out,
        format!(
            "id                                attempts  worker  reserved at               dead-lettered at          reason\n\
             {}  5         w1      {reserved}  2025-11-29T20:00:00.000Z  stock exhausted in MySQL\n\
             {junk:<32}  -         -       -                         -                         (not a dead-letter entry)\n",
            rids[2]
        )
    );
    let out = ok(&w.cmd("0s", &["dead-letter", "list", "payments"]));
    assert_eq!(
        out,
        format!(
            "entry             subject        received at               reason\n\
             {}  payment:pay-7  2025-11-29T20:00:00.000Z  mysql: gave up\n",
            fnv1a(entry.as_bytes())
        )
    );
    assert_eq!(
        ok(&w.cmd("0s", &["dead-letter", "list", "999"])),
        "sale 999: not in Redis, no dead letters\n"
    );
    let out = w.cmd("0s", &["dead-letter", "list", "pay"]);
    assert_eq!(out.status.code(), Some(64));
    assert_eq!(
        stderr(&out),
        "seckill-reconciler: SALE (a sale id, or payments): \"pay\" is not a non-negative \
         integer\nrun `seckill-reconciler dead-letter list --help` for usage\n"
    );
}

/// `(action, result, completes, finding_id, sale_id)` of every row.
type Row = (String, String, Option<i64>, Option<i64>, Option<i64>);

fn actions(w: &World) -> Vec<Row> {
    let c = rusqlite::Connection::open(w.review_path()).unwrap();
    let mut st = c
        .prepare("SELECT action, result, completes, finding_id, sale_id FROM actions ORDER BY id")
        .unwrap();
    let rows = st
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .unwrap();
    rows.map(Result::unwrap).collect()
}

fn row(action: &str, result: &str, completes: Option<i64>) -> Row {
    (action.into(), result.into(), completes, None, None)
}

/// Requeued already: nothing left, so a second requeue is refused (exit
/// 2, naming the command that lists them) and records nothing.
fn a_second_requeue_is_refused(w: &World) {
    let out = w.cmd(
        "0s",
        &[
            "dead-letter",
            "requeue",
            "payments",
            "payment:pay-7",
            "--by",
            "alice",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "seckill-reconciler: no payment dead letter \"payment:pay-7\": \
         `seckill-reconciler dead-letter list payments` lists them (entry or subject)\n"
    );
    assert_eq!(actions(w).len(), 3);
}

/// The requeue resolved the entry's finding, and the next run leaves it
/// so; `findings show` prints it whole with its actions (`rid`: the
/// reservation paid for, `message`: the payment message, `hash`: the
/// entry's).
fn findings_show_prints_the_requeued_entry(w: &World, rid: &str, message: &str, hash: &str) {
    assert_eq!(w.run(), 1);
    let f = w
        .findings()
        .into_iter()
        .find(|f| f["subject"] == "payment:pay-7")
        .unwrap();
    assert_eq!(f["state"], "resolved");
    let id = f["id"].as_i64().unwrap();
    let out = ok(&w.cmd("0s", &["findings", "show", &id.to_string()]));
    let close_at: String = rusqlite::Connection::open(w.review_path())
        .unwrap()
        .query_row("SELECT at FROM actions WHERE finding_id = ?1", [id], |r| {
            r.get(0)
        })
        .unwrap();
    let close_id = w.review_count(&format!("SELECT id FROM actions WHERE finding_id = {id}"));
    let fields = [
        ("finding:", id.to_string()),
        ("kind:", "dead_letter".into()),
        ("severity:", "normal".into()),
        ("state:", "resolved".into()),
        ("sale:", "0".into()),
        ("subject:", "payment:pay-7".into()),
        ("reservation:", "-".into()),
        ("user:", "-".into()),
        ("order:", "-".into()),
        ("first seen:", f["first_seen"].as_str().unwrap().into()),
        (
            "last seen:",
            format!("{} (runs: 1)", f["last_seen"].as_str().unwrap()),
        ),
        ("fix:", "-".into()),
        (
            "resolved:",
            format!("{close_at} by alice (requeue_payment)"),
        ),
        ("note:", "-".into()),
    ];
    let mut want: String = fields
        .iter()
        .map(|(n, v)| format!("{n:<12} {v}\n"))
        .collect();
    want.push_str(&format!(
        "evidence:\n\
         \x20 {{\n\
         \x20   \"message\": {msg},\n\
         \x20   \"queue\": \"seckill:{{payments}}:dlq\",\n\
         \x20   \"reason\": \"mysql: gave up\",\n\
         \x20   \"reservation_id\": \"{rid}\"\n\
         \x20 }}\n\
         actions:\n",
        msg = serde_json::to_string(message).unwrap(),
        rid = rid,
    ));
    let idw = close_id.to_string().len().max(2);
    want.push_str(&format!(
        "  {:>idw$}  {:<24}  actor  action           result  completes  detail\n",
        "id", "at"
    ));
    let requeued = format!(
        "action 1: put payment:pay-7 back on seckill:{{payments}} (entry {hash} kept in \
         seckill:{{payments}}:dlq:settled)"
    );
    want.push_str(&format!(
        "  {close_id:>idw$}  {close_at}  alice  requeue_payment  done            -  {requeued}\n"
    ));
    assert_eq!(out, want);
    let json: serde_json::Value = serde_json::from_str(&ok(
        &w.cmd("0s", &["findings", "show", &id.to_string(), "--json"])
    ))
    .unwrap();
    assert_eq!(json["finding"], f);
    assert_eq!(
        json["actions"],
        serde_json::json!([{"id": close_id, "at": close_at, "actor": "alice",
            "action": "requeue_payment", "result": "done", "completes": null,
            "detail": requeued}])
    );
    let out = w.cmd("0s", &["findings", "show", "999"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "seckill-reconciler: review store: no finding 999: `seckill-reconciler findings \
         --state all` lists every finding of SECKILL_REVIEW_DB\n"
    );
}

#[test]
fn a_payment_dead_letter_is_requeued_or_dropped_once_with_its_action_rows() {
    let (w, rids, entry) = queues();
    assert_eq!(w.run(), 1);
    let hash = fnv1a(entry.as_bytes());
    let mut con = w.redis.con();
    let message = payment("pay-7", &rids[0]).to_json();

    // A dry run changes and records nothing.
    let out = ok(&w.cmd(
        "0s",
        &[
            "dead-letter",
            "requeue",
            "payments",
            "payment:pay-7",
            "--by",
            "alice",
            "--dry-run",
        ],
    ));
    assert_eq!(
        out,
        format!(
            "dry run: would requeue payment dead letter {hash} (payment:pay-7; reason: mysql: \
             gave up); nothing changed\n"
        )
    );
    assert_eq!(actions(&w), vec![]);
    assert_eq!(con.llen::<_, i64>(payment::DEAD_LETTERS).unwrap(), 1);

    // Requeue by the finding's subject: the entry leaves, the message is
    // queued once, its attempts cleared, the entry kept under the action.
    let out = ok(&w.cmd(
        "0s",
        &[
            "dead-letter",
            "requeue",
            "payments",
            "payment:pay-7",
            "--by",
            "alice",
        ],
    ));
    assert_eq!(
        out,
        format!(
            "done: put payment:pay-7 back on seckill:{{payments}} (entry {hash} kept in \
             seckill:{{payments}}:dlq:settled)\n"
        )
    );
    assert_eq!(con.llen::<_, i64>(payment::DEAD_LETTERS).unwrap(), 0);
    let queued: Vec<String> = con.lrange(payment::QUEUE, 0, -1).unwrap();
    assert_eq!(queued.iter().filter(|m| **m == message).count(), 1);
    assert_eq!(queued.len(), 2);
    assert!(!con
        .hexists::<_, _, bool>(payment::ATTEMPTS, "pay-7")
        .unwrap());
    let settled: std::collections::HashMap<String, String> =
        con.hgetall(payment::DEAD_LETTERS_SETTLED).unwrap();
    assert_eq!(settled.len(), 1);
    let record: serde_json::Value = serde_json::from_str(settled.values().next().unwrap()).unwrap();
    assert_eq!(record["entry"], entry.as_str());
    assert_eq!(record["action"], "requeue_payment");
    assert_eq!(record["actor"], "alice");
    // Its finding is resolved by alice, with a row naming the action.
    let pay7 = w
        .findings()
        .into_iter()
        .find(|f| f["subject"] == "payment:pay-7")
        .unwrap()["id"]
        .as_i64()
        .unwrap();
    assert_eq!(
        actions(&w),
        vec![
            row("requeue_payment", "started", None),
            row("requeue_payment", "done", Some(1)),
            (
                "requeue_payment".into(),
                "done".into(),
                None,
                Some(pay7),
                None
            ),
        ]
    );

    a_second_requeue_is_refused(&w);

    // A cancellation dead letter dropped by its entry, with the note.
    let cancel = CancelMessage::new(w.sale, "bob", &rids[1], AT_MS).to_json();
    let dropped = payment::dead_letter_entry(cancel.as_bytes(), "gave up");
    let _: () = con.lpush(payment::DEAD_LETTERS, &dropped).unwrap();
    let dhash = fnv1a(dropped.as_bytes());
    let out = w.cmd(
        "0s",
        &["dead-letter", "drop", "payments", &dhash, "--by", "bob"],
    );
    assert_eq!(out.status.code(), Some(64));
    assert_eq!(
        stderr(&out),
        "seckill-reconciler: --note TEXT is required: say why the payment is not applied\n\
         run `seckill-reconciler dead-letter drop payments --help` for usage\n"
    );
    let out = ok(&w.cmd(
        "0s",
        &[
            "dead-letter",
            "drop",
            "payments",
            &dhash,
            "--by",
            "bob",
            "--note",
            "refunded",
        ],
    ));
    assert_eq!(
        out,
        format!(
            "done: dropped cancel:{} (entry {dhash} kept in seckill:{{payments}}:dlq:settled)\n",
            rids[1]
        )
    );
    assert_eq!(con.llen::<_, i64>(payment::DEAD_LETTERS).unwrap(), 0);
    assert_eq!(con.llen::<_, i64>(payment::QUEUE).unwrap(), 2);
    assert_eq!(
        con.hlen::<_, i64>(payment::DEAD_LETTERS_SETTLED).unwrap(),
        2
    );
    assert_eq!(
        actions(&w)[3..],
        [
            row("drop_payment", "started", None),
            row("drop_payment", "done", Some(4)),
        ]
    );

    findings_show_prints_the_requeued_entry(&w, &rids[0], &message, &hash);
}

#[test]
fn an_interrupted_payment_action_is_completed_by_the_next_run() {
    let (w, _, entry) = queues();
    assert_eq!(w.run(), 1);
    // Two started rows as a kill -9 leaves them: one whose script ran (its
    // mark is in the settled hash, the entry gone), one that never did.
    let c = rusqlite::Connection::open(w.review_path()).unwrap();
    for id in [101, 102] {
        c.execute(
            "INSERT INTO actions (id, at, actor, finding_id, action, detail, result)
             VALUES (?1, '2026-12-04T10:00:00.000Z', 'alice', NULL, 'drop_payment', 'x',
               'started')",
            [id],
        )
        .unwrap();
    }
    drop(c);
    let mut con = w.redis.con();
    let _: i64 = con.lrem(payment::DEAD_LETTERS, 1, &entry).unwrap();
    let _: () = con
        .hset(
            payment::DEAD_LETTERS_SETTLED,
            "101@2026-12-04T10:00:00.000Z",
            "{}",
        )
        .unwrap();
    assert_eq!(w.run(), 1);
    let c = rusqlite::Connection::open(w.review_path()).unwrap();
    let done: Vec<(i64, String, String)> = c
        .prepare(
            "SELECT completes, result, actor FROM actions WHERE completes IN (101, 102)
             ORDER BY completes",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        done,
        vec![
            (101, "done".to_string(), "alice".to_string()),
            (102, "failed".to_string(), "alice".to_string()),
        ]
    );
    // A second run adds nothing.
    assert_eq!(w.run(), 1);
    assert_eq!(
        w.review_count("SELECT COUNT(*) FROM actions WHERE completes IN (101, 102)"),
        2
    );
}

#[test]
fn a_requeue_killed_at_random_moments_happens_once_with_one_completion_row() {
    let (w, rids, entry) = queues();
    assert_eq!(w.run(), 1);
    let mut con = w.redis.con();
    let _: i64 = con.lrem(payment::DEAD_LETTERS, 1, &entry).unwrap();
    const N: u64 = 20;
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    for i in 0..N {
        let id = format!("pay-k{i}");
        let e = payment::dead_letter_entry(payment(&id, &rids[0]).to_json().as_bytes(), "x");
        let _: () = con.lpush(payment::DEAD_LETTERS, &e).unwrap();
        let mut child = seckill_tests::command("seckill-reconciler")
            .args([
                "dead-letter",
                "requeue",
                "payments",
                &format!("payment:{id}"),
            ])
            .args(["--by", "alice"])
            .env("SECKILL_MYSQL_URL", w.db.url())
            .env("SECKILL_REDIS_URL", w.redis.url())
            .env("SECKILL_REVIEW_DB", w.review_path())
            .env("RUST_LOG", "off")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        std::thread::sleep(std::time::Duration::from_millis((seed >> 33) % 40));
        let _ = child.kill(); // SIGKILL; it may have finished already
        let _ = child.wait();
    }
    assert_eq!(w.run(), 1); // completes what the kills left
    let queued: Vec<String> = con.lrange(payment::QUEUE, 0, -1).unwrap();
    let left: Vec<String> = con.lrange(payment::DEAD_LETTERS, 0, -1).unwrap();
    let settled: i64 = con.hlen(payment::DEAD_LETTERS_SETTLED).unwrap();
    let count = |sql: &str| w.review_count(sql);
    let done =
        count("SELECT COUNT(*) FROM actions WHERE action = 'requeue_payment' AND result = 'done'");
    // Each payment is exactly once either still a dead letter or requeued.
    for i in 0..N {
        let m = payment(&format!("pay-k{i}"), &rids[0]).to_json();
        let in_queue = queued.iter().filter(|q| **q == m).count();
        let in_dlq = left
            .iter()
            .filter(|e| e.contains(&format!("pay-k{i}\\")))
            .count();
        assert_eq!(
            in_queue + in_dlq,
            1,
            "pay-k{i}: queued {in_queue}, dead {in_dlq}"
        );
    }
    // One done row per effect, one completion per started row, none other.
    assert_eq!(done, settled);
    assert_eq!(done as usize, queued.len() - 1); // pay-1 was queued before
    assert_eq!(
        count("SELECT COUNT(*) FROM actions s WHERE s.result = 'started' AND (SELECT COUNT(*) FROM actions c WHERE c.completes = s.id) <> 1"),
        0
    );
    assert_eq!(
        count("SELECT COUNT(*) FROM actions WHERE result = 'started' AND action = 'requeue_payment'"),
        count("SELECT COUNT(*) FROM actions WHERE completes IS NOT NULL AND action = 'requeue_payment'")
    );
    println!(
        "{N} kills: {done} requeued, {} left as dead letters, {} started rows",
        left.len(),
        count("SELECT COUNT(*) FROM actions WHERE result = 'started'")
    );
}
