//! Specifies that every Lua script of the system (all in `common`) runs on
//! a real Redis Cluster: each call, through the same public function the
//! components use, succeeds, and the keys it declares (`KEYS`) all hash to
//! one slot. A [`Recorder`] between the function and the cluster reads
//! every `EVAL`/`EVALSHA` sent (also inside pipelines and `MULTI` blocks)
//! and notes the slots of its keys.

use redis::{ConnectionLike, RedisResult, Value};
use seckill_common::keys::{self, SaleKeys};
use seckill_common::payment::PaymentMessage;
use seckill_common::redis_target::Con;
use seckill_common::slot_router::slot_of;
use seckill_common::{archive, data_loss, dead_letter, in_flight, owned_key, release, reorder};
use seckill_common::{receipt, reliable_queue, reservation, status_write, transfer};
use seckill_tests::cluster::{RedisCluster, TestRedis};
use seckill_tests::{create_sale, TestDb};
use std::collections::BTreeSet;

/// Forwards every command to the cluster and records, per script call,
/// the set of slots of its declared keys.
struct Recorder {
    inner: Con,
    /// One entry per `EVAL`/`EVALSHA`: the script (its SHA1, or its body
    /// for `EVAL`) and the distinct slots of its `KEYS`.
    calls: Vec<(String, BTreeSet<u16>)>,
}

impl Recorder {
    /// Notes the script calls among the commands packed in `bytes`.
    fn note(&mut self, bytes: &[u8]) {
        for s in split_commands(bytes) {
            let name = s.first().map(|n| n.to_ascii_uppercase());
            if !matches!(name.as_deref(), Some("EVAL" | "EVALSHA")) {
                continue;
            }
            let n: usize = s.get(2).and_then(|n| n.parse().ok()).unwrap_or(0);
            let slots = s[3..3 + n].iter().map(|k| slot_of(k)).collect();
            self.calls.push((s[1].clone(), slots));
        }
    }
}

/// The commands packed in `b` (RESP arrays of bulk strings, as the client
/// sends them), each as its arguments.
fn split_commands(mut b: &[u8]) -> Vec<Vec<String>> {
    fn line<'a>(b: &mut &'a [u8]) -> &'a [u8] {
        let end = b.windows(2).position(|w| w == b"\r\n").unwrap_or(b.len());
        let l = &b[..end];
        *b = &b[(end + 2).min(b.len())..];
        l
    }
    let mut out = Vec::new();
    while b.first() == Some(&b'*') {
        let n: usize = std::str::from_utf8(&line(&mut b)[1..])
            .unwrap()
            .parse()
            .unwrap();
        let mut args = Vec::with_capacity(n);
        for _ in 0..n {
            let len: usize = std::str::from_utf8(&line(&mut b)[1..])
                .unwrap()
                .parse()
                .unwrap();
            args.push(String::from_utf8_lossy(&b[..len]).into_owned());
            b = &b[len + 2..];
        }
        out.push(args);
    }
    out
}

impl ConnectionLike for Recorder {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        self.note(cmd);
        self.inner.req_packed_command(cmd)
    }
    fn req_packed_commands(&mut self, cmd: &[u8], o: usize, c: usize) -> RedisResult<Vec<Value>> {
        self.note(cmd);
        self.inner.req_packed_commands(cmd, o, c)
    }
    fn get_db(&self) -> i64 {
        0
    }
    fn supports_pipelining(&self) -> bool {
        true
    }
    fn check_connection(&mut self) -> bool {
        self.inner.check_connection()
    }
    fn is_open(&self) -> bool {
        self.inner.is_open()
    }
}

#[test]
fn every_script_runs_on_a_redis_cluster_with_all_its_keys_in_one_slot() {
    let cluster = RedisCluster::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &cluster, 10, -1_000, 600_000);
    let k = SaleKeys::new(sale);
    let mut r = Recorder {
        inner: cluster.target_con(),
        calls: Vec::new(),
    };
    let workers = vec!["w1".to_string()];

    // The load script (again: already loaded, nothing changes).
    let s = test_sale(sale);
    assert!(!seckill_common::sale::load_into_redis(&mut r, &s, 0).unwrap());
    // The reservation script.
    let rid = match reservation::reserve(&mut r, sale, "u1").unwrap() {
        reservation::ReserveOutcome::Reserved(id) => id,
        other => panic!("{other:?}"),
    };
    // The reliable queue's take, the in-flight check and the reclaim.
    let taken = reliable_queue::take(&mut r, &k.queue(), &k.processing("w1"), 10).unwrap();
    assert_eq!(taken.len(), 1);
    let msg = String::from_utf8(taken[0].clone()).unwrap();
    let lists = vec![k.processing("w1")];
    assert_eq!(
        in_flight::still_in_flight(&mut r, &lists, &[&msg]).unwrap(),
        Some(vec![true])
    );
    assert_eq!(
        reliable_queue::reclaim(&mut r, &k.processing("w1"), &k.queue()).unwrap(),
        1
    );
    // The worker's status write, inside its settle MULTI.
    let mut p = redis::pipe();
    p.atomic();
    let created = [status_write::Created {
        reservation_id: &rid,
        pay_by_ms: None,
    }];
    status_write::add_created(&mut p, sale, &created);
    p.query::<Value>(&mut r).unwrap();
    // The operator's reorder (check mode: the message is queued already).
    assert_eq!(
        reorder::reorder(&mut r, sale, &rid, &workers, None).unwrap(),
        reorder::ReorderOutcome::AlreadyQueued
    );
    // The release check and the order release (expiry, cancel).
    release::check(&mut r, sale, &rid, &workers).unwrap().ok();
    let released = release::release_order(
        &mut r,
        k,
        &rid,
        seckill_common::order::Release::Cancel,
        true,
    )
    .unwrap();
    assert!(
        matches!(released, release::OrderRelease::Released { .. }),
        "{released:?}"
    );
    // The dead-letter archive move.
    let entry = r#"{"message":"x","reason":"y","attempts":1}"#;
    redis::cmd("LPUSH")
        .arg(k.dead_letter())
        .arg(entry)
        .exec(&mut r)
        .unwrap();
    assert!(dead_letter::archive(&mut r, sale, entry, "{}").unwrap());
    // The data-loss watch and pause.
    let mut c = db.conn();
    data_loss::watch_sale(&mut r, &mut c, sale).unwrap();
    data_loss::pause(&mut r, &mut c, sale, data_loss::PauseReason::RedisDataLoss).unwrap();
    // The owned-key scripts, on the reconciler's lock.
    redis::cmd("SET")
        .arg(keys::RECONCILE_LOCK)
        .arg("t")
        .exec(&mut r)
        .unwrap();
    assert!(owned_key::extend(&mut r, keys::RECONCILE_LOCK, "t", 60_000).unwrap());
    assert!(owned_key::release(&mut r, keys::RECONCILE_LOCK, "t").unwrap());
    // The payment receipt's scripts: the gateway's receive (with the
    // payment queue), the sweep's closing, the forget after MySQL.
    let queued = receipt::receive(
        &mut r,
        &PaymentMessage {
            v: 1,
            reservation_id: rid.clone(),
            payment_id: "p-1".into(),
            amount_cents: 1,
            received_ms: 0,
        },
    )
    .unwrap();
    assert_eq!(
        receipt::close(&mut r, &rid, 1).unwrap(),
        receipt::Closing::Closed(vec![queued.clone()])
    );
    receipt::forget(&mut r, &queued).unwrap();

    // A sale split over 3 buckets: each bucket's load script, then a
    // snapshot and a transfer (its two steps) between two buckets.
    let split = test_sale(sale + 1_000);
    assert!(seckill_common::buckets::load_into_redis(&mut r, &split, 3, 0).unwrap());
    let b1 = SaleKeys::bucket(split.id, 1);
    assert_eq!(transfer::snapshot(&mut r, b1).unwrap().stock, 3);
    assert_eq!(transfer::transfer(&mut r, b1, 2, 1).unwrap(), 1);
    // The archive of the split sale: bucket 0's tombstone script, each
    // other bucket's keys removed (a MULTI per bucket), then the sales set
    // apart.
    let t = archive::Tombstone {
        starts_at_ms: split.starts_at_ms,
        ends_at_ms: split.ends_at_ms,
        total_stock: split.total_stock,
        stock_left: split.total_stock,
        archived_at_ms: 1,
    };
    assert_eq!(archive::remove(&mut r, split.id, Some(3), &t).unwrap(), 3);
    for b in seckill_common::buckets::all(split.id, 3) {
        let stock: Option<i64> = redis::cmd("GET").arg(b.stock()).query(&mut r).unwrap();
        assert_eq!(stock, None, "bucket {} stock", b.bucket);
    }
    let tomb: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(SaleKeys::new(split.id).meta())
        .query(&mut r)
        .unwrap();
    assert_eq!(tomb.len(), 5, "{tomb:?}");

    // The 20 scripts of `common` (release::check and release_order share
    // one), every call on a single slot: the sale's, a bucket's of the
    // split sale, the lock's for the owned key, or the payments'.
    let scripts: BTreeSet<&String> = r.calls.iter().map(|c| &c.0).collect();
    assert_eq!(scripts.len(), 20);
    let sale_slot = slot_of(&k.stock());
    let lock_slot = slot_of(keys::RECONCILE_LOCK);
    let payments_slot = slot_of(seckill_common::payment::QUEUE);
    let bucket_slots: Vec<u16> = seckill_common::buckets::all(split.id, 3)
        .iter()
        .map(|b| slot_of(&b.stock()))
        .collect();
    for (i, (_, slots)) in r.calls.iter().enumerate() {
        assert_eq!(slots.len(), 1, "script call {i} spans slots {slots:?}");
        let s = *slots.iter().next().unwrap();
        assert!(
            s == sale_slot || s == lock_slot || s == payments_slot || bucket_slots.contains(&s),
            "call {i}: slot {s}"
        );
    }
    assert_ne!(sale_slot, lock_slot);
}

/// The sale as MySQL holds it (what `load_into_redis` takes).
fn test_sale(id: u64) -> seckill_common::sale::Sale {
    let mut s = seckill_tests::test_sale(id, 10, -1_000, 600_000);
    s.id = id;
    s
}
