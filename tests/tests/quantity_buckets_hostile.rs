//! Hostile tests of split sales that sell several units per purchase
//! (`sale create --shards 3 --max-per-buyer L --max-per-purchase Q`), with
//! real services: buyers of every home bucket racing for the last units,
//! one `Idempotency-Key` from many connections while units are moved to
//! its home bucket, a transfer stopped between its two steps (a mover
//! killed there), a bucket whose keys are lost while a transfer to it is
//! open, and quantities that no single bucket holds.

use crate::support::gateway::{Client, Gateway, Resp};
use crate::support::worker::{wait_orders, Opts, WorkerProc};
use redis::Commands;
use seckill_common::buckets::home_bucket;
use seckill_common::ids::keyed_reservation_id;
use seckill_common::keys::SaleKeys;
use seckill_common::message::OrderMessage;
use seckill_common::transfer;
use seckill_tests::{RedisServer, TempDir, TestDb};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

const K: u32 = 3;

/// Creates a sale of `stock` units over [`K`] buckets, `l` units per buyer
/// and `q` per purchase, open now for an hour; returns its id.
fn create(redis: &RedisServer, db: &TestDb, review: &Path, stock: u64, l: u32, q: u32) -> u64 {
    let (l, q) = (l.to_string(), q.to_string());
    let args = [
        "--shards",
        "3",
        "--max-per-buyer",
        &l,
        "--max-per-purchase",
        &q,
    ];
    seckill_tests::sale_created(redis, db, review, "HOSTILE-SPLIT", stock, &args).0
}

/// Each bucket's stock.
fn stocks(redis: &RedisServer, sale: u64) -> Vec<i64> {
    let mut con = redis.con();
    (0..K)
        .map(|b| {
            con.get::<_, Option<i64>>(SaleKeys::bucket(sale, b).stock())
                .unwrap()
                .unwrap_or(0)
        })
        .collect()
}

/// Every flow record of the sale: `(bucket, rid, quantity)`, sorted.
fn flows(redis: &RedisServer, sale: u64) -> Vec<(u32, String, u32)> {
    let mut con = redis.con();
    let mut out = Vec::new();
    for b in 0..K {
        let all: Vec<(String, String)> = con.hgetall(SaleKeys::bucket(sale, b).flow()).unwrap();
        for (rid, f) in all {
            if rid == "checkpoint" {
                continue;
            }
            let q = OrderMessage::parse(f.as_bytes()).unwrap().quantity;
            out.push((b, rid, q));
        }
    }
    out.sort();
    out
}

/// `(sum of stocks, sum of total_stock, units in flow records, open
/// transfers)` over the buckets.
fn units(redis: &RedisServer, sale: u64) -> (i64, i64, i64, i64) {
    let mut con = redis.con();
    let (mut total, mut open) = (0, 0);
    for b in 0..K {
        let k = SaleKeys::bucket(sale, b);
        total += con
            .hget::<_, _, Option<i64>>(k.meta(), "total_stock")
            .unwrap()
            .unwrap_or(0);
        open += con.hlen::<_, i64>(k.transfers_open()).unwrap();
    }
    let held: i64 = flows(redis, sale).iter().map(|f| i64::from(f.2)).sum();
    (stocks(redis, sale).iter().sum(), total, held, open)
}

/// How many 503 answers [`buy_final`] retried.
static RETRIED: AtomicUsize = AtomicUsize::new(0);

/// How many times [`live_units`] was read.
static LIVE_CHECKS: AtomicUsize = AtomicUsize::new(0);

/// The units of `sale` not reserved, read in one script (one Redis
/// server): every bucket's stock and the units of its open transfers not
/// yet taken in by their destination (between step 2 and the close they
/// are in the destination's stock already).
fn live_units(redis: &RedisServer, sale: u64) -> i64 {
    let script = redis::Script::new(
        r"
local n = 0
for i = 1, #KEYS, 3 do
  n = n + tonumber(redis.call('GET', KEYS[i]) or '0')
  for _, pair in ipairs({redis.call('HGETALL', KEYS[i + 1])}) do
    for j = 1, #pair, 2 do
      local rec = cjson.decode(pair[j + 1])
      if redis.call('HEXISTS', KEYS[3 * rec['to'] + 3], pair[j]) == 0 then
        n = n + rec['units']
      end
    end
  end
end
return n
",
    );
    LIVE_CHECKS.fetch_add(1, Ordering::Relaxed);
    let mut inv = script.prepare_invoke();
    for b in 0..K {
        let k = SaleKeys::bucket(sale, b);
        inv.key(k.stock())
            .key(k.transfers_open())
            .key(k.transfers_in());
    }
    inv.invoke(&mut redis.con()).unwrap()
}

/// One answer: status, error, reservation id, `units_left`.
#[derive(Debug, Clone)]
struct Answer {
    status: u16,
    error: String,
    rid: Option<String>,
    left: Option<u64>,
}

/// A purchase on `c` (reconnected when the gateway closes it).
fn buy(c: &mut Client, port: u16, sale: u64, user: &str, q: u32, key: &str) -> Answer {
    let r: Resp = c.buy_units(sale, user, q, key);
    if r.header("connection")
        .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    {
        *c = Client::connect(port);
    }
    let j: serde_json::Value = serde_json::from_str(&r.body).unwrap_or_default();
    Answer {
        status: r.status,
        error: j["error"].as_str().unwrap_or("").to_string(),
        rid: j["reservation_id"].as_str().map(str::to_string),
        left: j["units_left"].as_u64(),
    }
}

/// Buyers `PREFIX{i}` (i < `n`) each buy one unit with key `key` until
/// the sale is sold out: the units they got (any answer but 202 or
/// `sold_out` fails the test).
fn sell_the_rest(c: &mut Client, port: u16, sale: u64, prefix: &str, n: usize, key: &str) -> usize {
    let mut sold = 0;
    for i in 0..n {
        let u = format!("{prefix}{i}");
        let a = buy(c, port, sale, &u, 1, key);
        match (a.status, a.error.as_str()) {
            (202, _) => sold += 1,
            (410, "sold_out") => {}
            _ => panic!("{u}: {a:?}"),
        }
    }
    sold
}

/// The review file holds no finding but the data loss the test caused.
fn only_the_loss(redis: &RedisServer, db: &TestDb, review: &Path) {
    let findings = crate::support::quantity::findings(redis, db, review);
    assert!(
        findings.iter().all(|f| f.0 == "redis_data_loss"),
        "{findings:?}"
    );
}

/// Buys `q` units for `user` until a final answer: 503 is retried with the
/// same key, `not_enough_stock` with the units left under a new key.
/// Returns the 202 `(rid, units)`, if any, and the final answer.
///
/// With no release in the sale its units left only go down, so as each
/// `not_enough_stock` with `left` units, or `sold_out`, is heard, the sale
/// (read at one instant, [`live_units`]) holds at most `left` units, or
/// none: never an answer that the sale could not cover while it could.
fn buy_final(
    c: &mut Client,
    redis: &RedisServer,
    port: u16,
    sale: u64,
    user: &str,
    q: u32,
) -> (Option<(String, u32)>, Answer) {
    let (mut q, mut n) = (q, 0);
    for _ in 0..5000 {
        let a = buy(c, port, sale, user, q, &format!("k{n}"));
        match (a.status, a.error.as_str()) {
            (202, _) => return (Some((a.rid.clone().unwrap(), q)), a),
            (503, _) => {
                RETRIED.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
            (410, "not_enough_stock") => {
                let left = a.left.unwrap() as u32;
                assert!((1..q).contains(&left), "{user}: {a:?}");
                let live = live_units(redis, sale);
                assert!(
                    live <= i64::from(left),
                    "{user}: {a:?} with {live} units left"
                );
                q = left;
                n += 1;
            }
            (410, "sold_out") => {
                assert_eq!(live_units(redis, sale), 0, "{user}: sold_out");
                return (None, a);
            }
            _ => return (None, a),
        }
    }
    panic!("{user}: no final answer");
}

/// Sales of 11 and of 4 units over 3 buckets, 3 units per buyer and per
/// purchase, raced by 45 buyers of all three home buckets at once (9
/// threads), each asking for 2 or 3 and taking what is left on
/// `not_enough_stock`; eight sales in a row, the reconciler running
/// throughout. Every sale sells exactly its units, each purchase whole in
/// its buyer's home bucket; every `not_enough_stock` and `sold_out` is
/// true when heard (`buy_final`); no purchase sent after a `sold_out`
/// answer was heard gets a 202 (there are no releases: sold out is
/// final); no transfer is left open; the reconciler finds nothing.
#[test]
fn buyers_of_every_home_bucket_racing_for_the_last_units_sell_them_once_and_whole() {
    let _crowd = crate::support::crowd();
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let stop = AtomicBool::new(false);
    let runs = AtomicUsize::new(0);
    let run_findings: Mutex<Vec<String>> = Mutex::default();
    let mut report = Vec::new();
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Acquire) {
                let (code, out) = seckill_tests::reconciler(&redis, &db, &review, &["run"]);
                runs.fetch_add(1, Ordering::Relaxed);
                if code != 0 {
                    run_findings.lock().unwrap().push(out);
                }
            }
        });
        for round in 0..8 {
            // 11 units (4/4/3 or so), or 4 (2/1/1): short of most asks.
            let stock: u64 = if round % 2 == 0 { 11 } else { 4 };
            let sale = create(&redis, &db, &review, stock, 3, 3);
            let users: Vec<String> = (0..45).map(|i| format!("r{round}u{i}")).collect();
            let homes: Vec<u32> = users.iter().map(|u| home_bucket(u, K)).collect();
            for b in 0..K {
                assert!(homes.contains(&b), "every home bucket has buyers");
            }
            let sold: Mutex<Vec<(String, String, u32)>> = Mutex::default();
            let sold_out_heard = AtomicBool::new(false);
            let late_wins = AtomicUsize::new(0);
            std::thread::scope(|s2| {
                for t in 0..9 {
                    let (sold, heard, late, users) = (&sold, &sold_out_heard, &late_wins, &users);
                    let redis = &redis;
                    let port = g.port;
                    s2.spawn(move || {
                        let mut c = Client::connect(port);
                        for u in users.iter().skip(t).step_by(9) {
                            let after_sold_out = heard.load(Ordering::Acquire);
                            let q = 2 + u.bytes().last().map_or(0, |b| u32::from(b % 2));
                            let (won, last) = buy_final(&mut c, redis, port, sale, u, q);
                            match won {
                                Some((rid, q)) => {
                                    if after_sold_out {
                                        late.fetch_add(1, Ordering::Relaxed);
                                    }
                                    sold.lock().unwrap().push((u.clone(), rid, q));
                                }
                                None => {
                                    assert_eq!(
                                        (last.status, last.error.as_str()),
                                        (410, "sold_out"),
                                        "{u}"
                                    );
                                    heard.store(true, Ordering::Release);
                                }
                            }
                        }
                    });
                }
            });
            let sold = sold.into_inner().unwrap();
            let sold_units: u32 = sold.iter().map(|s| s.2).sum();
            assert_eq!(
                u64::from(sold_units),
                stock,
                "units answered 202 in sale {sale}"
            );
            assert_eq!(
                late_wins.load(Ordering::Relaxed),
                0,
                "202s after a sold_out"
            );
            let mut want: Vec<(u32, String, u32)> = sold
                .iter()
                .map(|(u, r, q)| (home_bucket(u, K), r.clone(), *q))
                .collect();
            want.sort();
            assert_eq!(
                flows(&redis, sale),
                want,
                "each purchase whole in its home bucket"
            );
            assert_eq!(units(&redis, sale), (0, stock as i64, stock as i64, 0));
            wait_orders(&db, sale, sold.len() as i64, Duration::from_secs(60));
            let moved: i64 = (0..K)
                .map(|b| {
                    redis
                        .con()
                        .hget::<_, _, Option<i64>>(SaleKeys::bucket(sale, b).meta(), "moved_in")
                        .unwrap()
                        .unwrap_or(0)
                })
                .sum();
            report.push((sale, sold.len(), moved));
        }
        stop.store(true, Ordering::Release);
    });
    let findings = crate::support::quantity::findings(&redis, &db, &review);
    assert!(findings.is_empty(), "{findings:?}");
    let bad = run_findings.into_inner().unwrap();
    assert!(
        bad.is_empty(),
        "{} runs: {bad:?}",
        runs.load(Ordering::Relaxed)
    );
    eprintln!(
        "(sale, purchases, units moved): {report:?}; {} reconciler runs during the crowd; \
         {} not_enough_stock or sold_out answers checked against the units left; {} 503s retried",
        runs.load(Ordering::Relaxed),
        LIVE_CHECKS.load(Ordering::Relaxed),
        RETRIED.load(Ordering::Relaxed)
    );
}

/// The buyer's home bucket emptied (its 3 units moved to the others), then
/// 16 connections send the same purchase of 3 units under one key at
/// once: each pulls units home, and all answer 202 with the one keyed
/// reservation id; exactly one reservation of 3 exists, in the home bucket,
/// and the sale keeps 6 units in stock, none in an open transfer.
#[test]
fn one_key_from_sixteen_connections_while_units_are_pulled_home_reserves_once() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    for attempt in 0..4 {
        let sale = create(&redis, &db, &review, 9, 3, 3);
        let user = format!("same{attempt}");
        let h = home_bucket(&user, K);
        let s = stocks(&redis, sale);
        assert_eq!(s, vec![3, 3, 3]);
        let mut con = redis.con();
        let o = (h + 1) % K;
        assert_eq!(
            transfer::transfer(&mut con, SaleKeys::bucket(sale, h), o, 3).unwrap(),
            3
        );
        let rid = keyed_reservation_id(sale, &user, "same");
        let answers: Mutex<Vec<(u16, Option<String>)>> = Mutex::default();
        std::thread::scope(|s| {
            for _ in 0..16 {
                let (answers, user, port) = (&answers, &user, g.port);
                s.spawn(move || {
                    let mut c = Client::connect(port);
                    for _ in 0..2000 {
                        let a = buy(&mut c, port, sale, user, 3, "same");
                        if a.status != 503 {
                            answers.lock().unwrap().push((a.status, a.rid));
                            return;
                        }
                    }
                    panic!("no final answer");
                });
            }
        });
        let answers = answers.into_inner().unwrap();
        assert_eq!(answers.len(), 16);
        for a in &answers {
            assert_eq!(a, &(202, Some(rid.clone())));
        }
        assert_eq!(flows(&redis, sale), vec![(h, rid.clone(), 3)]);
        assert_eq!(units(&redis, sale), (6, 9, 3, 0));
        let held: String = con.hget(SaleKeys::bucket(sale, h).buyers(), &user).unwrap();
        assert_eq!(held, format!("{rid}:3"));
    }
}

/// A mover stopped between the two steps of a transfer (step 1 alone:
/// what a gateway killed there leaves): 3 units of bucket `o` are in an
/// open record to the home bucket `h`, counted in no bucket's stock. The
/// sale still sells exactly its 9 units: a purchase of 3 by a buyer of
/// the third bucket `t` (which holds 3) needs no pull; a purchase of 3
/// by a buyer of `h` (empty but for the units on their way) completes the
/// open transfer and takes them; the reconciler run once the record is a
/// second old finds nothing to complete (the pull did) and no mismatch.
#[test]
fn a_transfer_stopped_between_its_steps_is_completed_by_the_next_pull_and_units_are_kept() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let sale = create(&redis, &db, &review, 9, 3, 3);
    let mut users: Vec<String> = Vec::new();
    for b in 0..K {
        users.push(seckill_tests::users_of("stop", b, K, 1).remove(0));
    }
    let (h, o, t) = (0u32, 1u32, 2u32);
    let mut con = redis.con();
    // Empty h into t, then step 1 alone from o to h.
    assert_eq!(
        transfer::transfer(&mut con, SaleKeys::bucket(sale, h), t, 3).unwrap(),
        3
    );
    let tid = "0123456789abcdef0123456789abcdef";
    assert_eq!(
        transfer::take_out(&mut con, SaleKeys::bucket(sale, o), h, tid, 3).unwrap(),
        3
    );
    assert_eq!(stocks(&redis, sale), vec![0, 0, 6]);
    assert_eq!(units(&redis, sale), (6, 6, 0, 1));
    // A young open record: the reconciler leaves it to its mover and
    // reports nothing.
    let findings = crate::support::quantity::findings(&redis, &db, &review);
    assert!(findings.is_empty(), "{findings:?}");
    let mut c = Client::connect(g.port);
    let a = buy(&mut c, g.port, sale, &users[h as usize], 3, "a");
    assert_eq!(a.status, 202, "{a:?}");
    assert_eq!(units(&redis, sale), (6, 9, 3, 0));
    let a = buy(&mut c, g.port, sale, &users[o as usize], 3, "a");
    assert_eq!(a.status, 202, "{a:?}");
    let a = buy(&mut c, g.port, sale, &users[t as usize], 3, "a");
    assert_eq!(a.status, 202, "{a:?}");
    let a = buy(&mut c, g.port, sale, "stop-late", 1, "a");
    assert_eq!((a.status, a.error.as_str()), (410, "sold_out"), "{a:?}");
    assert_eq!(units(&redis, sale), (0, 9, 9, 0));
    wait_orders(&db, sale, 3, Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(1100));
    let findings = crate::support::quantity::findings(&redis, &db, &review);
    assert!(findings.is_empty(), "{findings:?}");
}

/// Quantities no single bucket holds: a sale of 3 units over 3 buckets
/// (1 each) sells 3 to one buyer (units pulled from both others), and a
/// sale of 6 (2 each), 5 per purchase, sells 5 to one buyer and then the
/// last 1 to another (2 of it is 410 `not_enough_stock` with 1 left);
/// 6 units, all there, are above Q: 400 with nothing moved.
#[test]
fn a_quantity_above_every_bucket_but_within_the_sale_is_pulled_together_whole() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let mut c = Client::connect(g.port);
    let sale = create(&redis, &db, &review, 3, 3, 3);
    assert_eq!(stocks(&redis, sale), vec![1, 1, 1]);
    let a = buy(&mut c, g.port, sale, "edge1", 3, "a");
    assert_eq!(a.status, 202, "{a:?}");
    let rid = keyed_reservation_id(sale, "edge1", "a");
    assert_eq!(flows(&redis, sale), vec![(home_bucket("edge1", K), rid, 3)]);
    assert_eq!(units(&redis, sale), (0, 3, 3, 0));

    let sale = create(&redis, &db, &review, 6, 5, 5);
    assert_eq!(stocks(&redis, sale), vec![2, 2, 2]);
    let a = buy(&mut c, g.port, sale, "edge2", 6, "a");
    assert_eq!(
        (a.status, a.error.as_str()),
        (400, "invalid_request"),
        "{a:?}"
    );
    assert_eq!(stocks(&redis, sale), vec![2, 2, 2]);
    let a = buy(&mut c, g.port, sale, "edge2", 5, "b");
    assert_eq!(a.status, 202, "{a:?}");
    assert_eq!(units(&redis, sale), (1, 6, 5, 0));
    let a = buy(&mut c, g.port, sale, "edge3", 2, "a");
    assert_eq!(
        (a.status, a.error.as_str(), a.left),
        (410, "not_enough_stock", Some(1)),
        "{a:?}"
    );
    let a = buy(&mut c, g.port, sale, "edge3", 1, "b");
    assert_eq!(a.status, 202, "{a:?}");
    let a = buy(&mut c, g.port, sale, "edge4", 1, "a");
    assert_eq!((a.status, a.error.as_str()), (410, "sold_out"), "{a:?}");
    assert_eq!(units(&redis, sale), (0, 6, 6, 0));
}

/// Deletes every key of bucket `b` of `sale` (its Redis data lost; `b` =
/// [`K`]: every bucket's, as a Redis restarted empty).
fn lose_bucket(redis: &RedisServer, sale: u64, b: u32) -> usize {
    let mut con = redis.con();
    if b == K {
        return (0..K).map(|b| lose_bucket(redis, sale, b)).sum();
    }
    let tag = SaleKeys::bucket(sale, b).tag();
    let keys: Vec<String> = con.keys(format!("*{tag}*")).unwrap();
    for k in &keys {
        let _: () = con.del(k).unwrap();
    }
    keys.len()
}

/// The first user of home bucket `b` whose id starts with `prefix`.
fn user_of(prefix: &str, b: u32) -> String {
    seckill_tests::users_of(prefix, b, K, 1).remove(0)
}

/// A sale of 9 units over 3 buckets (3 each), 3 per buyer and purchase:
/// a buyer of bucket 0 takes its 3, a second one takes 3 moved from
/// bucket 1 (the fullest, first by number), a buyer of bucket 2 takes 2;
/// all 3 orders reach MySQL. Then bucket `lost` loses all its keys, the
/// reconciler finds the loss, and `sale repair` rebuilds it: the sale
/// still sells exactly 1 more unit (bucket 1's share went to bucket 0
/// and stays there whichever side of the transfer lost its record), and
/// the reconciler is clean. Returns each bucket's stock after the repair.
fn sell_lose_repair(lost: u32) -> Vec<i64> {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let sale = create(&redis, &db, &review, 9, 3, 3);
    let mut c = Client::connect(g.port);
    for (u, q) in [
        (user_of("rep-a", 0), 3),
        (user_of("rep-b", 0), 3),
        (user_of("rep-c", 2), 2),
    ] {
        let a = buy(&mut c, g.port, sale, &u, q, "k");
        assert_eq!(a.status, 202, "{u}: {a:?}");
    }
    assert_eq!(stocks(&redis, sale), vec![0, 0, 1]);
    assert_eq!(units(&redis, sale), (1, 9, 8, 0));
    wait_orders(&db, sale, 3, Duration::from_secs(30));
    assert!(lose_bucket(&redis, sale, lost) >= 2);
    let (code, out) = seckill_tests::reconciler(&redis, &db, &review, &["run"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("redis_data_loss 1"), "{out}");
    let (code, out) = seckill_tests::reconciler(
        &redis,
        &db,
        &review,
        &["sale", "repair", &sale.to_string(), "--by", "hostile"],
    );
    assert_eq!(code, 0, "{out}");
    let after = stocks(&redis, sale);
    let sold = sell_the_rest(&mut c, g.port, sale, "rep-late", 12, "k");
    assert_eq!(
        sold, 1,
        "units sold after the repair of bucket {lost} (stocks {after:?})"
    );
    assert_eq!(units(&redis, sale), (0, 9, 9, 0));
    wait_orders(&db, sale, 4, Duration::from_secs(30));
    only_the_loss(&redis, &db, &review);
    after
}

#[test]
fn a_repaired_destination_bucket_keeps_the_units_moved_in_and_sold() {
    assert_eq!(sell_lose_repair(0), vec![0, 0, 1]);
}

#[test]
fn a_repaired_source_bucket_does_not_get_back_the_units_it_gave() {
    assert_eq!(sell_lose_repair(1), vec![0, 0, 1]);
}

#[test]
fn a_sale_whose_every_bucket_and_transfer_record_is_lost_is_repaired_to_its_last_unit() {
    let after = sell_lose_repair(K);
    assert_eq!(after.iter().sum::<i64>(), 1, "{after:?}");
}

/// Bucket 1's keys lost (deleted) and then a transfer of 2 units from
/// bucket 0 to it (as `sale rebalance` makes to a bucket that reads
/// empty): step 1 is done and step 2 refused ("not loaded"), so the 2
/// units wait in bucket 0's open record. A buyer of bucket 2 (emptied into
/// bucket 0, which holds 4) then hears 503 `unavailable`, never `sold_out`
/// or `not_enough_stock`: every pull first completes the open transfers
/// and that one cannot be (`sale rebalance` exits 2 on it). The
/// reconciler finds the loss and pauses the sale; `sale repair` rebuilds
/// bucket 1 with its share of 3 and the 2 of the open record: 5, the sale's 9
/// units all there, and exactly 9 are sold; the reconciler finds nothing
/// new. The worker starts after the repair (its loss watch would pause
/// the sale before the first buyer is heard).
#[test]
fn a_lost_bucket_with_a_transfer_open_to_it_is_repaired_with_every_unit() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let sale = create(&redis, &db, &review, 9, 3, 3);
    assert_eq!(lose_bucket(&redis, sale, 1), 2);
    let mut con = redis.con();
    let r = transfer::transfer(&mut con, SaleKeys::bucket(sale, 0), 1, 2);
    let e = r.expect_err("step 2 into a lost bucket").to_string();
    assert!(e.contains("is not loaded: transfer left open"), "{e}");
    assert_eq!(units(&redis, sale), (4, 4, 0, 1));
    assert_eq!(
        transfer::transfer(&mut con, SaleKeys::bucket(sale, 2), 0, 3).unwrap(),
        3
    );
    assert_eq!(stocks(&redis, sale), vec![4, 0, 0]);
    let u2 = user_of("lost", 2);
    let mut c = Client::connect(g.port);
    let a = buy(&mut c, g.port, sale, &u2, 2, "a");
    assert_eq!((a.status, a.error.as_str()), (503, "unavailable"), "{a:?}");
    let (code, out) = seckill_tests::reconciler(&redis, &db, &review, &["run"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("observed [redis_data_loss 1]"), "{out}");
    let (code, out) = seckill_tests::reconciler(
        &redis,
        &db,
        &review,
        &["sale", "rebalance", &sale.to_string()],
    );
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("not loaded: transfer left open"), "{out}");
    let a = buy(&mut c, g.port, sale, &u2, 2, "a");
    assert_eq!((a.status, a.error.as_str()), (503, "sale_paused"), "{a:?}");
    let (code, out) = seckill_tests::reconciler(
        &redis,
        &db,
        &review,
        &["sale", "repair", &sale.to_string(), "--by", "hostile"],
    );
    assert_eq!(code, 0, "{out}");
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    assert_eq!(units(&redis, sale), (9, 9, 0, 0));
    assert_eq!(stocks(&redis, sale), vec![4, 5, 0]);
    let sold = sell_the_rest(&mut c, g.port, sale, "lost-late", 20, "a");
    assert_eq!(sold, 9);
    assert_eq!(units(&redis, sale), (0, 9, 9, 0));
    wait_orders(&db, sale, 9, Duration::from_secs(30));
    only_the_loss(&redis, &db, &review);
}

/// Units in open transfer records over the buckets of `sale` not yet
/// taken in by their destination (between step 2 and the close they are
/// in its stock already).
fn open_units(redis: &RedisServer, sale: u64) -> i64 {
    let mut con = redis.con();
    (0..K)
        .map(|b| {
            let all: Vec<(String, String)> = con
                .hgetall(SaleKeys::bucket(sale, b).transfers_open())
                .unwrap();
            all.iter()
                .map(|(tid, j)| {
                    let r = transfer::Record::parse(j, transfer::Direction::Out).unwrap();
                    let to = SaleKeys::bucket(sale, r.peer);
                    let taken: bool = redis.con().hexists(to.transfers_in(), tid).unwrap();
                    if taken {
                        0
                    } else {
                        r.units as i64
                    }
                })
                .sum::<i64>()
        })
        .sum()
}

/// One purchase on a fresh connection to the gateway on `port`; `None`
/// when the gateway is gone (killed) before it answers.
fn try_buy(port: u16, sale: u64, user: &str, q: u32, key: &str) -> Option<Answer> {
    use std::io::{BufReader, Write};
    let s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    let body = format!(r#"{{"user_id":"{user}","quantity":{q}}}"#);
    let req = crate::support::gateway::format_request(
        "POST",
        &format!("/v1/sales/{sale}/purchases"),
        Some(&body),
        true,
    )
    .replacen("\r\n", &format!("\r\nIdempotency-Key: {key}\r\n"), 1);
    let mut r = BufReader::new(s);
    r.get_mut().write_all(req.as_bytes()).ok()?;
    let resp = crate::support::gateway::read_resp(&mut r)?;
    let j: serde_json::Value = serde_json::from_str(&resp.body).unwrap_or_default();
    Some(Answer {
        status: resp.status,
        error: j["error"].as_str().unwrap_or("").to_string(),
        rid: j["reservation_id"].as_str().map(str::to_string),
        left: j["units_left"].as_u64(),
    })
}

/// A sale of 900 units over 3 buckets, 3 per buyer and purchase, bought by
/// 6 threads of buyers of every home bucket (1-3 units each, a lost answer
/// or a 503 retried with the same key, `not_enough_stock` with the units
/// left under a new key) while the gateway is killed with SIGKILL every
/// 150 ms, up to 4 times while the crowd lasts (a new one started each
/// time). At each kill, with no gateway running, the units are conserved
/// exactly: stock + units reserved + units in open
/// transfers = 900. At the end exactly 900 units are answered 202 (each
/// reservation id once, retries of a lost answer replayed), they are
/// exactly the flow records, each in its buyer's home bucket, and the
/// reconciler finds nothing but half-done transfers it completed.
#[test]
fn gateways_killed_mid_crowd_lose_and_double_no_unit_of_a_split_sale() {
    let _crowd = crate::support::crowd();
    const STOCK: i64 = 900;
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let env = [("SECKILL_GATEWAY_BUYER_RATE", "0")];
    let mut g = Gateway::start(&redis, &env);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let sale = create(&redis, &db, &review, STOCK as u64, 3, 3);
    let port = std::sync::atomic::AtomicU16::new(g.port);
    let done = AtomicUsize::new(0);
    let won: Mutex<std::collections::BTreeMap<String, (String, u32)>> = Mutex::default();
    let mut at_kills = Vec::new();
    std::thread::scope(|s| {
        for t in 0..6 {
            let (port, done, won) = (&port, &done, &won);
            s.spawn(move || {
                for i in 0..250 {
                    let user = format!("kg{t}x{i}");
                    let (mut q, mut n) = (1 + (i % 3) as u32, 0);
                    loop {
                        let p = port.load(Ordering::Acquire);
                        let Some(a) = try_buy(p, sale, &user, q, &format!("k{n}")) else {
                            std::thread::sleep(Duration::from_millis(5));
                            continue;
                        };
                        match (a.status, a.error.as_str()) {
                            (202, _) => {
                                let rid = a.rid.unwrap();
                                let old =
                                    won.lock().unwrap().insert(rid.clone(), (user.clone(), q));
                                assert!(old.is_none(), "{rid} answered twice");
                                break;
                            }
                            (503, _) => std::thread::sleep(Duration::from_millis(2)),
                            (410, "not_enough_stock") => {
                                q = a.left.unwrap() as u32;
                                n += 1;
                            }
                            (410, "sold_out") => break,
                            _ => panic!("{user}: {a:?}"),
                        }
                    }
                }
                done.fetch_add(1, Ordering::AcqRel);
            });
        }
        for _ in 0..4 {
            std::thread::sleep(Duration::from_millis(150));
            if done.load(Ordering::Acquire) == 6 {
                break;
            }
            let _ = g.child.kill();
            let _ = g.child.wait();
            let (stock, total, held, open) = units(&redis, sale);
            let moving = open_units(&redis, sale);
            at_kills.push((stock, held, open, moving));
            assert_eq!(
                stock + held + moving,
                STOCK,
                "at a kill: {stock} {total} {held} {moving}"
            );
            g = Gateway::start(&redis, &env);
            port.store(g.port, Ordering::Release);
        }
    });
    assert!(!at_kills.is_empty());
    let won = won.into_inner().unwrap();
    let sold: u32 = won.values().map(|w| w.1).sum();
    assert_eq!(i64::from(sold), STOCK);
    let mut want: Vec<(u32, String, u32)> = won
        .iter()
        .map(|(rid, (u, q))| (home_bucket(u, K), rid.clone(), *q))
        .collect();
    want.sort();
    assert_eq!(flows(&redis, sale), want);
    wait_orders(&db, sale, won.len() as i64, Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(1100));
    let findings = crate::support::quantity::findings(&redis, &db, &review);
    assert!(
        findings
            .iter()
            .all(|f| f.1.starts_with("transfer_incomplete:")),
        "{findings:?}"
    );
    assert_eq!(units(&redis, sale), (0, STOCK, STOCK, 0));
    eprintln!(
        "(stock, held, open transfers, units in them) at each kill: {at_kills:?}; {} purchases",
        won.len()
    );
}

/// Redis's count of commands processed so far.
fn commands(redis: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query(&mut redis.con())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

/// Every unit of a sale of 9 moved into bucket 1, which then carries a
/// data-loss pause mark (the watch pauses the buckets one at a time, and
/// the repair resumes them one at a time): a buyer of bucket 0 asking for
/// 2 hears 503 `sale_paused` three times in a row, never `sold_out` or
/// `not_enough_stock`, and no unit leaves the paused bucket. The pull
/// sees the pause in its first read of the buckets and moves nothing:
/// each such purchase costs Redis 28 commands here (at most 40 asserted),
/// where trying the moves round after round cost 92-101.
#[test]
fn units_only_in_a_paused_bucket_are_never_moved_nor_called_sold_out() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let sale = create(&redis, &db, &review, 9, 3, 3);
    let mut con = redis.con();
    for b in [0, 2] {
        assert_eq!(
            transfer::transfer(&mut con, SaleKeys::bucket(sale, b), 1, 3).unwrap(),
            3
        );
    }
    let _: () = con
        .hset(
            SaleKeys::bucket(sale, 1).meta(),
            "paused",
            "redis_data_loss",
        )
        .unwrap();
    let mut c = Client::connect(g.port);
    let u0 = user_of("pz", 0);
    let mut cost = Vec::new();
    for _ in 0..3 {
        let before = commands(&redis);
        let a = buy(&mut c, g.port, sale, &u0, 2, "a");
        cost.push(commands(&redis) - before);
        assert_eq!((a.status, a.error.as_str()), (503, "sale_paused"), "{a:?}");
    }
    assert!(cost.iter().all(|&n| n <= 40), "Redis commands: {cost:?}");
    assert_eq!(stocks(&redis, sale), vec![0, 9, 0]);
    assert_eq!(
        (units(&redis, sale), open_units(&redis, sale)),
        ((9, 9, 0, 0), 0)
    );
    eprintln!("Redis commands per purchase: {cost:?}");
}

/// Bucket 1's stock key alone lost (deleted, as an eviction would) after
/// a buyer of bucket 1 took 2 of its 3 units: the next buyer of bucket 1
/// starts a pull whose step 2 is refused (the stock is not there), so 2
/// units of bucket 0 wait in an open record and that buyer, and then a
/// buyer of bucket 0 (whose pull meets the open record), hear 503
/// `unavailable`, never `sold_out`; a buyer of bucket 2 still buys 2 there.
/// The reconciler finds the loss and pauses the sale; `sale repair`
/// rebuilds it with the 5 units not sold and the open record taken in
/// (bucket 2's 202 made after the loss reaches MySQL then; no worker runs
/// from the loss to the repair, so no loss watch pauses the sale before
/// the reconciler does): exactly 5
/// more units are sold (9 in all), and nothing new is found.
#[test]
fn a_lost_stock_key_stops_pulls_until_the_repair_which_keeps_every_unit() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let sale = create(&redis, &db, &review, 9, 3, 3);
    let mut c = Client::connect(g.port);
    let a = buy(&mut c, g.port, sale, &user_of("sk-a", 1), 2, "k");
    assert_eq!(a.status, 202, "{a:?}");
    wait_orders(&db, sale, 1, Duration::from_secs(30));
    // No worker until the repair: its loss watch would pause the sale
    // before the buyers below are heard.
    drop(w);
    let _: () = redis.con().del(SaleKeys::bucket(sale, 1).stock()).unwrap();
    let mut heard = Vec::new();
    for u in [user_of("sk-b", 1), user_of("sk-c", 0), user_of("sk-d", 2)] {
        let a = buy(&mut c, g.port, sale, &u, 2, "k");
        heard.push((home_bucket(&u, K), a.status, a.error));
    }
    assert_eq!(
        heard,
        vec![
            (1, 503, "unavailable".to_string()),
            (0, 503, "unavailable".to_string()),
            (2, 202, String::new())
        ]
    );
    // Bucket 1's last unit went with its stock key; 2 units are on their way.
    assert_eq!(units(&redis, sale), (2, 7, 4, 1));
    assert_eq!(
        (open_units(&redis, sale), stocks(&redis, sale)),
        (2, vec![1, 0, 1])
    );
    let (code, out) = seckill_tests::reconciler(&redis, &db, &review, &["run"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("observed [redis_data_loss 1]"), "{out}");
    let a = buy(&mut c, g.port, sale, "sk-paused", 1, "k");
    assert_eq!((a.status, a.error.as_str()), (503, "sale_paused"), "{a:?}");
    let (code, out) = seckill_tests::reconciler(
        &redis,
        &db,
        &review,
        &["sale", "repair", &sale.to_string(), "--by", "hostile"],
    );
    assert_eq!(code, 0, "{out}");
    // Bucket 2's reservation made after the loss is kept in flight and
    // reaches MySQL once the sale is repaired.
    assert!(out.contains("1 reservations in flight kept"), "{out}");
    let _w = WorkerProc::start(&redis, &db, "w2", &Opts::default());
    wait_orders(&db, sale, 2, Duration::from_secs(30));
    assert_eq!(
        (units(&redis, sale), open_units(&redis, sale)),
        ((5, 9, 4, 0), 0)
    );
    let sold = sell_the_rest(&mut c, g.port, sale, "sk-late", 20, "k");
    assert_eq!(sold, 5);
    assert_eq!(units(&redis, sale), (0, 9, 9, 0));
    wait_orders(&db, sale, 7, Duration::from_secs(30));
    only_the_loss(&redis, &db, &review);
}
