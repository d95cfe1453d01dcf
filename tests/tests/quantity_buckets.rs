//! Specifies split sales (`sale create --shards 3`) that sell several units
//! per purchase (`--max-per-buyer 4 --max-per-purchase 3`), over HTTP with
//! real services: a purchase of N units is taken whole from the buyer's
//! home bucket, after units are moved there from the other buckets when it
//! holds fewer (never part in one bucket and part in another); a purchase
//! the whole sale cannot cover is 410 `not_enough_stock` with the sale's
//! units left and changes nothing; a crowd sells exactly the stock in units
//! with the reconciler clean; and a master killed mid-sale on a Redis
//! Cluster pauses the sale, the reconciler names every lost order, and the
//! repair lets the sale sell out exactly, in units.

use crate::support::after_repair::{assert_one_loss_finding, repair_once_drained};
use crate::support::gateway::{get, Client, Gateway, Resp};
use crate::support::quantity;
use crate::support::worker::{wait_orders, Opts, WorkerProc};
use redis::Commands;
use seckill_common::buckets::home_bucket;
use seckill_common::ids::keyed_reservation_id;
use seckill_common::keys::SaleKeys;
use seckill_common::message::OrderMessage;
use seckill_tests::cluster::{RedisCluster, TestRedis};
use seckill_tests::{RedisServer, TempDir, TestDb};
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const BUCKETS: u32 = 3;

/// Creates a sale of `stock` units over [`BUCKETS`] buckets, up to 4 units
/// per buyer and 3 per purchase, open now for an hour, through `sale
/// create`; returns its id.
fn create(redis: &impl TestRedis, db: &TestDb, review: &Path, stock: u64) -> u64 {
    create_with(redis, db, review, stock, &[])
}

/// [`create`] with the further `sale create` arguments `extra`.
fn create_with(
    redis: &impl TestRedis,
    db: &TestDb,
    review: &Path,
    stock: u64,
    extra: &[&str],
) -> u64 {
    let mut args = vec![
        "--shards",
        "3",
        "--max-per-buyer",
        "4",
        "--max-per-purchase",
        "3",
    ];
    args.extend(extra);
    let (id, out) = seckill_tests::sale_created(redis, db, review, "QTY-SPLIT", stock, &args);
    assert!(
        out.contains("in 3 buckets, up to 4 units per buyer, 3 per purchase"),
        "{out}"
    );
    id
}

/// Each bucket's stock.
fn stocks(redis: &impl TestRedis, sale: u64) -> Vec<i64> {
    let mut con = redis.target_con();
    (0..BUCKETS)
        .map(|b| con.get(SaleKeys::bucket(sale, b).stock()).unwrap())
        .collect()
}

/// The buckets whose flow records hold `rid`, each with the quantity.
fn holding(redis: &impl TestRedis, sale: u64, rid: &str) -> Vec<(u32, u32)> {
    let mut con = redis.target_con();
    (0..BUCKETS)
        .filter_map(|b| {
            let f: Option<String> = con.hget(SaleKeys::bucket(sale, b).flow(), rid).unwrap();
            f.map(|f| (b, OrderMessage::parse(f.as_bytes()).unwrap().quantity))
        })
        .collect()
}

/// Every hash and counter of every bucket of `sale`, as text.
fn state(redis: &impl TestRedis, sale: u64) -> Vec<String> {
    let mut con = redis.target_con();
    let mut out = Vec::new();
    for b in 0..BUCKETS {
        let k = SaleKeys::bucket(sale, b);
        let stock: i64 = con.get(k.stock()).unwrap();
        out.push(format!("b{b} stock {stock}"));
        for h in [
            k.meta(),
            k.flow(),
            k.buyers(),
            k.status(),
            k.transfers_in(),
            k.transfers_out(),
        ] {
            let mut all: Vec<(String, String)> = con.hgetall(&h).unwrap();
            // What the workers' data-loss watch moves while the sale is live.
            all.retain(|(f, _)| {
                !["checkpoint", "check_stamp", "check_stamp_local"].contains(&f.as_str())
            });
            all.sort();
            out.push(format!("{h} {all:?}"));
        }
    }
    out
}

/// A client that reconnects when the gateway closes the connection.
struct Buyer {
    port: u16,
    c: Client,
}

/// One answer: status, error, reservation id, `units_left`.
#[derive(Debug, Clone)]
struct Answer {
    user: String,
    quantity: u32,
    status: u16,
    error: String,
    rid: Option<String>,
    left: Option<u64>,
}

impl Buyer {
    fn new(port: u16) -> Buyer {
        Buyer {
            port,
            c: Client::connect(port),
        }
    }

    fn buy(&mut self, sale: u64, user: &str, quantity: u32, key: &str) -> Answer {
        let r: Resp = self.c.buy_units(sale, user, quantity, key);
        if r.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
        {
            self.c = Client::connect(self.port);
        }
        let j: serde_json::Value = serde_json::from_str(&r.body).unwrap_or_default();
        Answer {
            user: user.to_string(),
            quantity,
            status: r.status,
            error: j["error"].as_str().unwrap_or("").to_string(),
            rid: j["reservation_id"].as_str().map(str::to_string),
            left: j["units_left"].as_u64(),
        }
    }
}

/// One buyer of the crowd of [`a_crowd_buying_units_of_a_split_sale_sells_exactly_the_stock`]:
/// two purchases (keys `a…` and `b…`) of 1-3 units, each retried on 503
/// with its key, and asked again for the units left (a new key) on
/// `not_enough_stock`; stops on `sold_out` or `limit_reached`. Returns the
/// 202s as `(rid, quantity)` and how many `not_enough_stock` it heard.
fn crowd_buyer(b: &mut Buyer, sale: u64, user: &str, i: usize) -> (Vec<(String, u32)>, usize) {
    let (mut won, mut short) = (Vec::new(), 0);
    for (round, first_q) in [("a", 1 + i % 3), ("b", 1 + (i / 3) % 3)] {
        let (mut q, mut n) = (first_q as u32, 0);
        for attempt in 0.. {
            assert!(attempt < 2000, "{user}: no final answer");
            let a = b.buy(sale, user, q, &format!("{round}{n}"));
            match (a.status, a.error.as_str()) {
                (202, _) => {
                    won.push((a.rid.unwrap(), q));
                    break;
                }
                (503, _) => std::thread::sleep(Duration::from_millis(5)),
                (410, "not_enough_stock") => {
                    let left = a.left.unwrap() as u32;
                    assert!((1..q).contains(&left), "{a:?}");
                    short += 1;
                    q = left;
                    n += 1;
                }
                (410, "sold_out") => return (won, short),
                (409, "limit_reached") => break,
                _ => panic!("{a:?}"),
            }
        }
    }
    (won, short)
}

/// 300 buyers over 8 threads, each buying 1-3 units twice, a sale of 60
/// units over 3 buckets (20 each), the buyers' home buckets 0 and 1 only:
/// their home buckets run dry, bucket 2's units are moved to them, and
/// exactly 60 units are sold, in MySQL and Redis.
#[test]
fn a_crowd_buying_units_of_a_split_sale_sells_exactly_the_stock() {
    let _crowd = crate::support::crowd();
    const STOCK: u64 = 60;
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let sale = create(&redis, &db, &review, STOCK);
    assert_eq!(quantity::meta(&redis, sale, "max_per_buyer"), 4);
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let users: Vec<String> = (0..)
        .map(|i| format!("u{i}"))
        .filter(|u| home_bucket(u, BUCKETS) < 2)
        .take(300)
        .collect();
    let sold: Mutex<Vec<(String, String, u32)>> = Mutex::default();
    let short = Mutex::new(0usize);
    std::thread::scope(|s| {
        for t in 0..8 {
            let (sold, short, port, users) = (&sold, &short, g.port, &users);
            s.spawn(move || {
                let mut b = Buyer::new(port);
                for i in (t..users.len()).step_by(8) {
                    let (won, n) = crowd_buyer(&mut b, sale, &users[i], i);
                    *short.lock().unwrap() += n;
                    let mut sold = sold.lock().unwrap();
                    sold.extend(won.into_iter().map(|(r, q)| (users[i].clone(), r, q)));
                }
            });
        }
    });
    let sold = sold.into_inner().unwrap();
    let units: u32 = sold.iter().map(|(_, _, q)| q).sum();
    assert_eq!(u64::from(units), STOCK, "units answered 202");
    wait_orders(&db, sale, sold.len() as i64, Duration::from_secs(60));
    // Each purchase is one reservation in its buyer's home bucket alone,
    // and one order of its units.
    for (user, rid, q) in &sold {
        assert_eq!(
            holding(&redis, sale, rid),
            vec![(home_bucket(user, BUCKETS), *q)],
            "{user} {rid}"
        );
        let row = format!(
            "SELECT COUNT(*) FROM orders WHERE sale_id = {sale} AND reservation_id = '{rid}' \
             AND user_id = '{user}' AND quantity = {q}"
        );
        assert_eq!(db.count(&row), 1, "{row}");
        // The lifecycle finds the order's bucket from its row: the buyer's
        // home bucket, where its flow record is.
        assert_eq!(
            seckill_common::lifecycle::order_keys(&mut db.conn(), rid).unwrap(),
            Some(SaleKeys::bucket(sale, home_bucket(user, BUCKETS)))
        );
    }
    assert_eq!(
        quantity::books(&db, sale),
        (sold.len() as i64, STOCK as i64, STOCK as i64, 0)
    );
    assert!(
        db.count(&format!(
            "SELECT COALESCE(MAX(u), 0) FROM (SELECT SUM(quantity) u FROM orders \
             WHERE sale_id = {sale} GROUP BY user_id) t"
        )) <= 4
    );
    assert_eq!(stocks(&redis, sale), vec![0, 0, 0]);
    let moved: i64 = (0..BUCKETS)
        .map(|b| {
            redis
                .con()
                .hget::<_, _, Option<i64>>(SaleKeys::bucket(sale, b).meta(), "moved_in")
                .unwrap()
                .unwrap_or(0)
        })
        .sum();
    // Bucket 2 sold nothing itself: every unit of it was moved.
    assert!(moved >= 20, "{moved} units moved between buckets");
    assert_eq!(
        quantity::num(
            &db,
            &format!("SELECT COUNT(*) FROM orders WHERE sale_id = {sale}")
        ),
        sold.len() as i64
    );
    let b2 = SaleKeys::bucket(sale, 2);
    let b2_total: i64 = redis.con().hget(b2.meta(), "total_stock").unwrap();
    let b2_flows: usize = redis.con().hlen(b2.flow()).unwrap();
    assert_eq!((b2_total, b2_flows), (0, 0));
    let findings = quantity::findings(&redis, &db, &review);
    assert!(findings.is_empty(), "{findings:?}");
    let (code, show) =
        seckill_tests::reconciler(&redis, &db, &review, &["sale", "show", &sale.to_string()]);
    assert_eq!(code, 0, "{show}");
    for row in [
        "buyer/purchase    4/3          4/3".to_string(),
        format!(
            "reservations      -            {} ({STOCK} units)",
            sold.len()
        ),
        "buckets           -            3".to_string(),
    ] {
        assert!(show.contains(&row), "{row:?} in\n{show}");
    }
    eprintln!(
        "{} purchases, {units} units, {moved} units moved between buckets, {} not_enough_stock",
        sold.len(),
        short.into_inner().unwrap()
    );
}

#[test]
fn a_purchase_takes_units_moved_to_its_home_bucket_and_one_the_sale_cannot_cover_changes_nothing() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let mut b = Buyer::new(g.port);

    // 9 units, 3 a bucket; the buyer's home bucket keeps 1, another has 5.
    let sale = create(&redis, &db, &review, 9);
    let user = "buyer1";
    let h = home_bucket(user, BUCKETS);
    let o = (h + 1) % BUCKETS;
    let third = (h + 2) % BUCKETS;
    let moved =
        seckill_common::transfer::transfer(&mut redis.con(), SaleKeys::bucket(sale, h), o, 2)
            .unwrap();
    assert_eq!(moved, 2);
    let s = stocks(&redis, sale);
    assert_eq!((s[h as usize], s[o as usize], s[third as usize]), (1, 5, 3));
    // No key: a sale of several units per buyer asks for one.
    let r = b.c.buy(sale, user);
    assert_eq!(
        (r.status, r.error().as_str()),
        (400, "idempotency_key_required")
    );

    let a = b.buy(sale, user, 3, "x");
    let rid = keyed_reservation_id(sale, user, "x");
    assert_eq!(
        (a.status, a.rid.as_deref()),
        (202, Some(rid.as_str())),
        "{a:?}"
    );
    // One reservation of 3 in the home bucket, after 3 units came from the
    // fullest bucket (the 2 missing or half of its 5, whichever is more).
    assert_eq!(holding(&redis, sale, &rid), vec![(h, 3)]);
    let s = stocks(&redis, sale);
    assert_eq!((s[h as usize], s[o as usize], s[third as usize]), (1, 2, 3));
    let hk = SaleKeys::bucket(sale, h);
    let mut con = redis.con();
    assert_eq!(con.hlen::<_, usize>(hk.transfers_in()).unwrap(), 1);
    let held: String = con.hget(hk.buyers(), user).unwrap();
    assert_eq!(held, format!("{rid}:3"));
    // The status read finds it in the buyer's home bucket, with its units.
    let r = get(g.port, &format!("/v1/sales/{sale}/purchases/{user}"));
    assert_eq!(r.status, 200, "{}", r.body);
    let j = r.json();
    assert_eq!(
        (j["reservation_id"].as_str(), j["quantity"].as_u64()),
        (Some(rid.as_str()), Some(3)),
        "{j}"
    );
    // The same key and quantity again: the same reservation, nothing taken.
    let before = state(&redis, sale);
    let a = b.buy(sale, user, 3, "x");
    assert_eq!(
        (a.status, a.rid.as_deref()),
        (202, Some(rid.as_str())),
        "{a:?}"
    );
    assert_eq!(state(&redis, sale), before);

    // A sale of 2 units over 3 buckets (1, 1, 0): 3 units are not there.
    let small = create(&redis, &db, &review, 2);
    let before = state(&redis, small);
    let a = b.buy(small, "buyer2", 3, "y");
    assert_eq!(
        (a.status, a.error.as_str(), a.left),
        (410, "not_enough_stock", Some(2)),
        "{a:?}"
    );
    assert_eq!(state(&redis, small), before, "nothing changed");
    // Not sold out: a purchase of 2 (moved to one bucket) and then none.
    let a = b.buy(small, "buyer3", 1, "z");
    assert_eq!(a.status, 202, "{a:?}");
    let a = b.buy(small, "buyer2", 1, "y2");
    assert_eq!(a.status, 202, "{a:?}");
    let a = b.buy(small, "buyer4", 1, "w");
    assert_eq!((a.status, a.error.as_str()), (410, "sold_out"), "{a:?}");
    assert_eq!(stocks(&redis, small), vec![0, 0, 0]);
}

/// Orders of 3 units of a split sale with a payment window, two of them
/// cancelled by their buyers: each gives its 3 units back to its buyer's
/// home bucket, and `sale show` counts in units, the sale's "released
/// units" (6) and, per bucket, the units its reservations hold (its total
/// less its stock) and the units released to it.
#[test]
fn cancelled_units_of_a_split_sale_go_back_to_their_buckets_counted_in_units() {
    use crate::support::lifecycle_http::{buy_units, gateway, me};
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let sale = create_with(&redis, &db, &review, 30, &["--payment-window", "10m"]);
    let g = gateway(&redis);
    let _w = WorkerProc::start(&redis, &db, "qb-cancel", &Opts::default());
    let users = ["ann", "bob", "cy"];
    let rids: Vec<String> = users
        .iter()
        .map(|u| buy_units(g.port, sale, u, 3, "k"))
        .collect();
    wait_orders(&db, sale, 3, Duration::from_secs(60));
    let live = |rid: &str| {
        quantity::num(
            &db,
            &format!("SELECT COUNT(*) FROM orders WHERE reservation_id = '{rid}' AND status = 'pending_payment'"),
        ) == 1
    };
    seckill_tests::wait_until(Duration::from_secs(60), "3 orders pending payment", || {
        rids.iter().all(|r| live(r))
    });
    for u in &users[..2] {
        let r = me(g.port, "DELETE", sale, Some(u));
        assert_eq!(r.status, 202, "{}", r.body);
    }
    seckill_tests::wait_until(Duration::from_secs(60), "2 releases done in Redis", || {
        quantity::num(
            &db,
            &format!("SELECT COUNT(*) FROM orders WHERE sale_id = {sale} AND status = 'cancelled' AND redis_released_at IS NOT NULL"),
        ) == 2
    });
    assert_eq!(stocks(&redis, sale).iter().sum::<i64>(), 27);
    let (code, show) =
        seckill_tests::reconciler(&redis, &db, &review, &["sale", "show", &sale.to_string()]);
    assert_eq!(code, 0, "{show}");
    assert!(
        show.contains("\nreleased units    -            6\n"),
        "{show}"
    );
    // Per bucket: (reservations, units held, units released), as the
    // buyers' home buckets say.
    let mut want = vec![(0u64, 0i64, 0u64); BUCKETS as usize];
    for (i, u) in users.iter().enumerate() {
        let w = &mut want[home_bucket(u, BUCKETS) as usize];
        match i {
            2 => (w.0, w.1) = (w.0 + 1, w.1 + 3),
            _ => w.2 += 3,
        }
    }
    let rows: Vec<(u64, i64, u64)> = show
        .lines()
        .skip_while(|l| !l.starts_with("bucket  tag"))
        .skip(1)
        .take(BUCKETS as usize)
        .map(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            (
                c[5].parse().unwrap(),
                c[6].parse().unwrap(),
                c[7].parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(rows, want, "{show}");
}

// The failover story, in units (cluster_failover_buckets.rs in one unit).

const C_STOCK: i64 = 3_000;
const C_BUYERS: usize = 20_000;
const C_THREADS: usize = 8;
/// Buyers before the replica is cut off, and while it is.
const C_BEFORE: usize = 400;
const C_CUT: usize = 200;

/// User `u{i}` buys 1, 2 or 3 units (by `i`), always under key `k`.
fn user_q(user: &str) -> u32 {
    let i: usize = user
        .trim_start_matches(|c: char| c.is_ascii_alphabetic())
        .parse()
        .unwrap();
    1 + (i % 3) as u32
}

/// Every user of `users` buys [`user_q`] units under key `k` over
/// [`C_THREADS`] threads until answered other than 503 (a 503 is retried
/// later with the same key) or `stop` says to stop (`stop_on_pause`: a
/// `sale_paused` answer sets it). Returns every answer, and the users not
/// finally answered.
fn crowd(
    port: u16,
    sale: u64,
    users: &[String],
    stop_on_pause: bool,
    deadline: Duration,
) -> (Vec<Answer>, Vec<String>) {
    let stop = AtomicBool::new(false);
    let answers = Mutex::new(Vec::new());
    let left = Mutex::new(Vec::new());
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for part in users.chunks(users.len().div_ceil(C_THREADS).max(1)) {
            let (stop, answers, left) = (&stop, &answers, &left);
            s.spawn(move || {
                let mut b = Buyer::new(port);
                let mut todo: std::collections::VecDeque<String> = part.iter().cloned().collect();
                let mut mine = Vec::new();
                while let Some(u) = todo.pop_front() {
                    if stop.load(Ordering::Acquire) {
                        todo.push_front(u);
                        break;
                    }
                    assert!(t0.elapsed() < deadline, "the crowd took over {deadline:?}");
                    let a = b.buy(sale, &u, user_q(&u), "k");
                    if a.status == 503 {
                        if stop_on_pause && a.error == "sale_paused" {
                            stop.store(true, Ordering::Release);
                        }
                        todo.push_back(u);
                    }
                    mine.push(a);
                }
                answers.lock().unwrap().extend(mine);
                left.lock().unwrap().extend(todo);
            });
        }
    });
    (answers.into_inner().unwrap(), left.into_inner().unwrap())
}

/// user -> (reservation id, units) of the 202s.
fn wins(answers: &[Answer]) -> HashMap<String, (String, u32)> {
    answers
        .iter()
        .filter(|a| a.status == 202)
        .map(|a| (a.user.clone(), (a.rid.clone().unwrap(), a.quantity)))
        .collect()
}

/// New buyers of one unit each take what purchases of more could not,
/// until sold out; then every order is one acknowledged purchase of
/// `holders` (user -> reservation id, units), its buyer's retry under the
/// same key and quantity answered 202 with it (a lost one too: the repair
/// restored it), and the books hold exactly the stock. The orders.
fn sweep_then_check_every_order(
    cluster: &RedisCluster,
    db: &TestDb,
    port: u16,
    sale: u64,
    holders: &mut HashMap<String, (String, u32)>,
) -> Vec<(String, String, u32)> {
    let sweep: Vec<String> = (0..C_STOCK).map(|i| format!("z{}", i * 3)).collect();
    let mut b = Buyer::new(port);
    'sweep: for u in &sweep {
        loop {
            let a = b.buy(sale, u, 1, "k");
            match (a.status, a.error.as_str()) {
                (202, _) => {
                    holders.insert(u.clone(), (a.rid.unwrap(), 1));
                    break;
                }
                (503, _) => std::thread::sleep(Duration::from_millis(5)),
                (410, "sold_out") => break 'sweep,
                _ => panic!("{a:?}"),
            }
        }
    }
    seckill_tests::wait_until(Duration::from_secs(120), "every unit ordered", || {
        db.count(&format!(
            "SELECT COALESCE(SUM(quantity), 0) FROM orders WHERE sale_id = {sale}"
        )) >= C_STOCK
    });
    // Every order is one acknowledged purchase, and its buyer's retry under
    // the same key and quantity is answered 202 with it (a lost one too:
    // the repair restored it).
    let orders: Vec<(String, String, u32)> = {
        let mut c = db.conn();
        mysql::prelude::Queryable::exec(
            &mut c,
            "SELECT user_id, reservation_id, quantity FROM orders WHERE sale_id = ?",
            (sale,),
        )
        .unwrap()
    };
    for (u, rid, q) in &orders {
        assert_eq!(holders.get(u), Some(&(rid.clone(), *q)), "{u}");
        assert_eq!(rid, &keyed_reservation_id(sale, u, "k"));
        let a = b.buy(sale, u, *q, "k");
        assert_eq!(
            (a.status, a.rid.as_deref()),
            (202, Some(rid.as_str())),
            "{u}"
        );
    }
    assert_eq!(orders.len(), holders.len());
    let (_, units, ledger, available) = quantity::books(db, sale);
    assert_eq!((units, ledger, available), (C_STOCK, C_STOCK, 0));
    assert!(
        db.count(&format!(
            "SELECT COALESCE(MAX(u), 0) FROM (SELECT SUM(quantity) u FROM orders \
             WHERE sale_id = {sale} GROUP BY user_id) t"
        )) <= 4
    );
    assert_eq!(stocks(cluster, sale).iter().sum::<i64>(), 0);
    orders
}

#[test]
fn a_killed_master_of_a_split_sale_of_units_pauses_it_every_lost_order_is_found_and_the_repair_sells_out(
) {
    let started = Instant::now();
    let mut cluster = RedisCluster::start_with(&[("cluster-require-full-coverage", "no")]);
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let sale = create(&cluster, &db, &review, C_STOCK as u64);
    let keys: Vec<SaleKeys> = (0..BUCKETS).map(|b| SaleKeys::bucket(sale, b)).collect();
    let master = cluster.master_of(&keys[1].stock()).unwrap();
    let replica = cluster.replica_of(&keys[1].stock()).unwrap();
    let lost: BTreeSet<u32> = (0..BUCKETS)
        .filter(|&b| cluster.master_of(&keys[b as usize].stock()) == Some(master))
        .collect();
    let g = Gateway::start(&cluster, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let _w1 = WorkerProc::start(&cluster, &db, "w1", &Opts::default());
    let _w2 = WorkerProc::start(&cluster, &db, "w2", &Opts::default());
    let users: Vec<String> = (0..C_BUYERS).map(|i| format!("u{i}")).collect();

    let (a1, rest) = crowd(
        g.port,
        sale,
        &users[..C_BEFORE],
        false,
        Duration::from_secs(60),
    );
    assert!(
        rest.is_empty() && a1.iter().all(|a| a.status == 202),
        "{a1:?}"
    );
    let mut holders = wins(&a1);
    wait_orders(&db, sale, C_BEFORE as i64, Duration::from_secs(60));
    let mut m = cluster.cut_off_replica(master, replica);
    let cut = &users[C_BEFORE..C_BEFORE + C_CUT];
    let (a2, rest) = crowd(g.port, sale, cut, false, Duration::from_secs(60));
    assert!(
        rest.is_empty() && a2.iter().all(|a| a.status == 202),
        "{a2:?}"
    );
    let cut_wins = wins(&a2);
    let expected_lost: BTreeSet<String> = cut_wins
        .iter()
        .filter(|(u, _)| lost.contains(&home_bucket(u, BUCKETS)))
        .map(|(_, (r, _))| r.clone())
        .collect();
    holders.extend(cut_wins);
    wait_orders(
        &db,
        sale,
        (C_BEFORE + C_CUT) as i64,
        Duration::from_secs(60),
    );
    seckill_tests::wait_until(Duration::from_secs(10), "the watch to see the cut", || {
        lost.iter().all(|&b| {
            let seq = seckill_common::transfer::snapshot(&mut m, keys[b as usize])
                .unwrap()
                .seq as i64;
            let sql = if b == 0 {
                format!("SELECT seq_high FROM sale_redis_state WHERE sale_id = {sale}")
            } else {
                format!(
                    "SELECT seq_high FROM sale_bucket_marks WHERE sale_id = {sale} AND bucket = {b}"
                )
            };
            db.count(&sql) == seq
        })
    });
    cluster.kill(master);
    cluster.signal(replica, "CONT");
    let killed = Instant::now();

    // New buyers until the sale pauses (the lost buyers retry after the
    // repair: under their key a retry here would write their reservation
    // again, and the loss would no longer be theirs to find).
    let fresh: Vec<String> = users[C_BEFORE + C_CUT..].to_vec();
    let (a3, waiting) = crowd(g.port, sale, &fresh, true, Duration::from_secs(90));
    let paused_after = killed.elapsed();
    let mut counts: HashMap<(u16, String), usize> = HashMap::new();
    for a in &a3 {
        *counts.entry((a.status, a.error.clone())).or_default() += 1;
        assert!(matches!(a.status, 202 | 503), "{a:?}");
    }
    assert!(a3.iter().any(|a| a.error == "sale_paused"), "{counts:?}");
    let lost_503 = a3
        .iter()
        .filter(|a| a.status == 503 && a.error != "sale_paused")
        .filter(|a| lost.contains(&home_bucket(&a.user, BUCKETS)))
        .count();
    assert!(lost_503 >= 1, "{counts:?}");
    let others_sold = a3
        .iter()
        .filter(|a| a.status == 202 && !lost.contains(&home_bucket(&a.user, BUCKETS)))
        .count();
    assert!(others_sold >= 1, "{counts:?}");
    eprintln!("failover in units: paused {paused_after:?} after the kill; answers {counts:?}");

    assert_one_loss_finding(&cluster, &db, &review, &lost, &expected_lost);

    repair_once_drained(&cluster, &db, &review, sale);

    // The same gateway sells the rest (a 503 is a pull that kept meeting
    // other transfers, retried with the same key), then new buyers of one
    // unit each take what purchases of more could not.
    let (a4, rest) = crowd(g.port, sale, &waiting, false, Duration::from_secs(120));
    assert!(rest.is_empty());
    for a in &a4 {
        assert!(
            matches!(
                (a.status, a.error.as_str()),
                (202, _) | (410, "sold_out") | (410, "not_enough_stock") | (503, "unavailable")
            ),
            "{a:?}"
        );
    }
    holders.extend(wins(&a3));
    holders.extend(wins(&a4));
    let orders = sweep_then_check_every_order(&cluster, &db, g.port, sale, &mut holders);
    eprintln!(
        "{} orders of {C_STOCK} units, {} lost and found; test took {:?}",
        orders.len(),
        expected_lost.len(),
        started.elapsed()
    );
}
