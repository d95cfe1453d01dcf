//! Specifies docs/DESIGN.md "Redis down" and docs/reliability.md §9 for a
//! connection that breaks mid-call: the purchase's script ran in
//! Redis, and the connection broke before its reply reached the gateway.
//! The gateway sends the purchase once more on a fresh connection with the
//! same reservation id; the script finds the buyer's own reservation, so the
//! buyer gets 202 with that id (not 409, not 503) and exactly one unit is
//! taken. The break is made by a TCP relay between the gateway and the
//! test's private Redis that, once armed, forwards the next `EVALSHA` and
//! closes the connection instead of forwarding Redis's reply. Run with group
//! commit (one Redis thread) and without (one shared link). With
//! `SECKILL_REDIS_REPLICAS_ACK`, the second sending is not 202 while its
//! replica does not have the reservation.

use crate::support::gateway as gateway_support;

use gateway_support::{buy, counts, evalsha_calls, open_sale, Gateway};
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_tests::cluster::TestRedis;
use seckill_tests::RedisServer;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// A relay from a local port to Redis that can cut one call.
struct Relay {
    port: u16,
    /// Set: the next `EVALSHA` sent through is forwarded, its reply dropped
    /// and its connection closed.
    armed: Arc<AtomicBool>,
    /// Connections cut so far.
    cuts: Arc<AtomicUsize>,
    /// Run once, by the cut, after Redis's reply to the cut call was read
    /// and before the connection is closed (so before the gateway's
    /// second sending): what happens in between.
    between: Hook,
}

type Hook = Arc<std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>>>;

impl Relay {
    /// Listens on a free port, relaying every connection to `redis_port`.
    fn start(redis_port: u16) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let armed = Arc::new(AtomicBool::new(false));
        let cuts = Arc::new(AtomicUsize::new(0));
        let between: Hook = Arc::default();
        let (a, c, h) = (armed.clone(), cuts.clone(), between.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if let Ok(server) = TcpStream::connect(("127.0.0.1", redis_port)) {
                    relay_pair(client, server, a.clone(), c.clone(), h.clone());
                }
            }
        });
        Relay {
            port,
            armed,
            cuts,
            between,
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl TestRedis for Relay {
    fn url(&self) -> String {
        Relay::url(self)
    }
}

/// Whether `chunk` carries an `EVALSHA` command (any case).
fn has_evalsha(chunk: &[u8]) -> bool {
    chunk.windows(7).any(|w| w.eq_ignore_ascii_case(b"EVALSHA"))
}

/// Two threads copying bytes each way; see [`Relay::armed`].
fn relay_pair(
    client: TcpStream,
    server: TcpStream,
    armed: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
    between: Hook,
) {
    let cut = Arc::new(AtomicBool::new(false));
    let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    let cut_up = cut.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 16384];
        while let Ok(n @ 1..) = c_in.read(&mut buf) {
            if has_evalsha(&buf[..n]) && armed.swap(false, Ordering::SeqCst) {
                // Before forwarding: any reply read from now on is this call's.
                cut_up.store(true, Ordering::SeqCst);
            }
            if s_out.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = s_out.shutdown(Shutdown::Both);
    });
    let (mut s_in, mut c_out) = (server, client);
    std::thread::spawn(move || {
        let mut buf = [0u8; 16384];
        while let Ok(n @ 1..) = s_in.read(&mut buf) {
            if cut.load(Ordering::SeqCst) {
                if let Some(f) = between.lock().unwrap().take() {
                    f();
                }
                cuts.fetch_add(1, Ordering::SeqCst);
                break;
            }
            if c_out.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = c_out.shutdown(Shutdown::Both);
        let _ = s_in.shutdown(Shutdown::Both);
    });
}

/// A relay in front of `redis` and a gateway whose one purchase link
/// goes through it (`SECKILL_GATEWAY_THREADS=1`), with
/// `SECKILL_GATEWAY_REDIS_THREADS=redis_threads` and `extra`.
fn relayed_gateway(
    redis: &RedisServer,
    redis_threads: &str,
    extra: &[(&str, &str)],
) -> (Relay, Gateway) {
    let relay = Relay::start(redis.port);
    let mut env = vec![
        ("SECKILL_GATEWAY_REDIS_THREADS", redis_threads),
        ("SECKILL_GATEWAY_THREADS", "1"),
    ];
    env.extend_from_slice(extra);
    let g = Gateway::start(&relay, &env);
    (relay, g)
}

fn a_purchase_whose_reply_was_lost_is_202_with_its_own_id(redis_threads: &str) {
    let redis = RedisServer::start();
    let sale = 1;
    open_sale(&redis, sale, 5);
    let (relay, g) = relayed_gateway(&redis, redis_threads, &[]);
    // Warm-up: the one link that carries purchases has been in use.
    assert_eq!(buy(g.port, sale, "u0").status, 202);
    let calls_before = evalsha_calls(&redis);

    relay.armed.store(true, Ordering::SeqCst);
    let first = buy(g.port, sale, "u1");
    assert_eq!(relay.cuts.load(Ordering::SeqCst), 1, "one call was cut");
    assert!(!relay.armed.load(Ordering::SeqCst));

    let u1_rid: Option<String> = redis
        .con()
        .hget(SaleKeys::new(sale).buyers(), "u1")
        .unwrap();
    assert_eq!(first.status, 202, "{first:?}");
    assert_eq!(first.json()["reservation_id"].as_str(), u1_rid.as_deref());
    // The cut call ran, and so did its second sending, which took nothing.
    assert_eq!(evalsha_calls(&redis) - calls_before, 2);
    assert_eq!(counts(&redis, sale), (3, 2, 2), "u0 and u1, one unit each");

    // The client's own retry: 409 with the same id, nothing more taken.
    let again = buy(g.port, sale, "u1");
    assert_eq!(
        (again.status, again.error()),
        (409, "already_purchased".into())
    );
    assert_eq!(again.json()["reservation_id"].as_str(), u1_rid.as_deref());
    assert_eq!(counts(&redis, sale), (3, 2, 2));
}

#[test]
fn a_pipelined_purchase_whose_connection_broke_after_it_ran_is_202_not_409() {
    a_purchase_whose_reply_was_lost_is_202_with_its_own_id("1");
}

#[test]
fn a_single_purchase_whose_connection_broke_after_it_ran_is_202_not_409() {
    a_purchase_whose_reply_was_lost_is_202_with_its_own_id("0");
}

/// `SECKILL_REDIS_REPLICAS_ACK=1` with the connection cut after the script
/// ran: the second sending on a fresh connection finds the buyer's own
/// reservation, and that connection's `WAIT` covers none of its writes (it
/// made none), so it says nothing of whether a replica has the
/// reservation. Here the replica is stopped, so it has not: the purchase
/// must not be 202 (503, and the retry 409 with its id, as the WAIT mode's
/// unconfirmed purchases).
#[test]
fn with_replicas_ack_a_purchase_resent_after_a_cut_is_not_202_unless_a_replica_has_it() {
    let redis = RedisServer::start();
    let replica = RedisServer::start();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(redis.port)
        .query(&mut replica.con())
        .unwrap();
    seckill_tests::wait_until(
        std::time::Duration::from_secs(20),
        "the replica online",
        || {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut redis.con())
                .unwrap();
            info.contains("state=online")
        },
    );
    let sale = 1;
    open_sale(&redis, sale, 5);
    let (relay, g) = relayed_gateway(
        &redis,
        "1",
        &[
            ("SECKILL_REDIS_REPLICAS_ACK", "1"),
            ("SECKILL_REDIS_TIMEOUT", "1s"),
        ],
    );
    // Warm-up: the replica confirms, and the link has been in use.
    assert_eq!(buy(g.port, sale, "u0").status, 202);

    let pid = replica.pid().unwrap();
    gateway_support::signal(pid, "STOP");
    relay.armed.store(true, Ordering::SeqCst);
    let first = buy(g.port, sale, "u1");
    let cuts = relay.cuts.load(Ordering::SeqCst);
    gateway_support::signal(pid, "CONT");
    assert_eq!(cuts, 1, "one call was cut");
    assert_eq!(counts(&redis, sale), (3, 2, 2), "u0 and u1, one unit each");
    assert_eq!(
        (first.status, first.error()),
        (503, "unavailable".into()),
        "no replica had u1's reservation when it was answered: {first:?}"
    );
    let again = buy(g.port, sale, "u1");
    assert_eq!(again.status, 409, "{again:?}");
}

/// The purchase of `user` in bucket `home` of sale `sale` whose reply is
/// cut; between the cut and the gateway's second sending, `between` runs
/// (given the reservation id the cut call took). Returns the purchase's
/// answer and that id.
fn cut_with_between(
    redis: &RedisServer,
    relay: &Relay,
    port: u16,
    sale: u64,
    home: SaleKeys,
    user: &str,
    between: impl FnOnce(&mut redis::Connection, &str) + Send + 'static,
) -> (gateway_support::Resp, String) {
    let taken: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    let (t, mut con, buyers, u) = (taken.clone(), redis.con(), home.buyers(), user.to_string());
    *relay.between.lock().unwrap() = Some(Box::new(move || {
        let rid: String = con.hget(&buyers, &u).expect("the cut call reserved");
        between(&mut con, &rid);
        *t.lock().unwrap() = Some(rid);
    }));
    relay.armed.store(true, Ordering::SeqCst);
    let answer = buy(port, sale, user);
    assert_eq!(relay.cuts.load(Ordering::SeqCst), 1, "one call was cut");
    let rid = taken.lock().unwrap().clone().expect("the hook ran");
    (answer, rid)
}

/// Releases `rid` as `resolve --rollback` does (no worker holds it).
fn roll_back(con: &mut redis::Connection, k: SaleKeys, rid: &str) {
    assert!(matches!(
        seckill_common::release::release_in(con, k, rid, &[]).unwrap(),
        seckill_common::release::ReleaseOutcome::Released { .. }
    ));
}

/// Takes one unit of bucket `k` for `user` with the reservation script.
fn take_one(con: &mut redis::Connection, k: SaleKeys, user: &str) {
    let rid = seckill_common::ids::new_reservation_id();
    let reply: redis::Value = seckill_common::reservation::prepare_in(k, user, &rid)
        .invoke(con)
        .unwrap();
    assert_eq!(
        seckill_common::reservation::parse(&reply).unwrap().outcome,
        seckill_common::reservation::ReserveOutcome::Reserved(rid)
    );
}

/// docs/reliability.md §9 end to end: the reservation of a cut call is
/// rolled back before the gateway's second sending; the second sending
/// takes nothing and the buyer gets 409 with the id.
fn a_resent_purchase_rolled_back_in_between_is_409_and_takes_nothing(redis_threads: &str) {
    let redis = RedisServer::start();
    let sale = 1;
    open_sale(&redis, sale, 5);
    let (relay, g) = relayed_gateway(&redis, redis_threads, &[]);
    assert_eq!(buy(g.port, sale, "u0").status, 202);
    let k = SaleKeys::new(sale);
    let (first, rid) = cut_with_between(&redis, &relay, g.port, sale, k, "u1", move |con, rid| {
        roll_back(con, k, rid)
    });
    assert_eq!(
        (
            first.status,
            first.error(),
            first.json()["reservation_id"].as_str()
        ),
        (409, "already_purchased".to_string(), Some(rid.as_str())),
        "{first:?}"
    );
    assert_eq!(counts(&redis, sale), (4, 1, 1), "u0's unit only");
}

#[test]
fn a_pipelined_purchase_rolled_back_between_its_two_sendings_takes_nothing() {
    a_resent_purchase_rolled_back_in_between_is_409_and_takes_nothing("1");
}

#[test]
fn a_single_purchase_rolled_back_between_its_two_sendings_takes_nothing() {
    a_resent_purchase_rolled_back_in_between_is_409_and_takes_nothing("0");
}

/// The status route after the 409 of a released re-send: 200 with the
/// id's own status, `failed` (the rollback removed the buyer's mark and
/// kept the id in `buyers:released`, which the route reads when the buyer
/// holds no mark): a buyer who was answered 202 reads a status until the
/// sale is archived. A new purchase of the same buyer is then read
/// instead.
#[test]
fn the_status_route_after_a_purchase_rolled_back_between_its_two_sendings_reads_failed() {
    let redis = RedisServer::start();
    let sale = 1;
    open_sale(&redis, sale, 5);
    let (relay, g) = relayed_gateway(&redis, "1", &[]);
    assert_eq!(buy(g.port, sale, "u0").status, 202);
    let k = SaleKeys::new(sale);
    let (first, rid) = cut_with_between(&redis, &relay, g.port, sale, k, "u1", move |con, rid| {
        roll_back(con, k, rid)
    });
    assert_eq!(first.status, 409, "{first:?}");
    let status = gateway_support::get(g.port, "/v1/sales/1/purchases/u1");
    assert_eq!(status.status, 200, "{status:?}");
    assert_eq!(
        (
            status.json()["reservation_id"].as_str(),
            status.json()["status"].as_str()
        ),
        (Some(rid.as_str()), Some("failed")),
        "{status:?}"
    );
    let own: Option<String> = redis.con().hget(k.status(), &rid).unwrap();
    assert_eq!(own.as_deref(), Some("failed"));
    // Buying again (the mark is gone): the new purchase is what it reads.
    let again = buy(g.port, sale, "u1");
    assert_eq!(again.status, 202, "{again:?}");
    let status = gateway_support::get(g.port, "/v1/sales/1/purchases/u1");
    assert_eq!(
        (
            status.status,
            status.json()["reservation_id"].as_str().map(str::to_string)
        ),
        (
            200,
            again.json()["reservation_id"].as_str().map(str::to_string)
        ),
        "{status:?}"
    );
    // A buyer who never bought is still 404.
    let none = gateway_support::get(g.port, "/v1/sales/1/purchases/u9");
    assert_eq!(
        (none.status, none.error()),
        (404, "purchase_not_found".to_string())
    );
}

/// The same in a sale split over two buckets whose home bucket has no unit
/// left at the second sending (the released unit was bought by another
/// buyer meanwhile) while the other bucket has: the second sending must
/// not take a unit either (it did: `sold_out` from the script, whose check
/// ran only while stock was left, then the gateway pulled a unit from the
/// other bucket and bought it under a fresh id: 202, a second unit for the
/// same purchase).
fn a_split_sale_purchase_rolled_back_in_between_takes_nothing(redis_threads: &str) {
    let redis = RedisServer::start();
    let sale = 2;
    let k = 2;
    let s = seckill_tests::test_sale(sale, 4, -1000, 600_000);
    assert!(seckill_common::buckets::load_into_redis(&mut redis.con(), &s, k, 0).unwrap());
    let (relay, g) = relayed_gateway(
        &redis,
        redis_threads,
        &[("SECKILL_GATEWAY_BUYER_RATE", "0")],
    );
    let users = seckill_tests::users_of("b0", 0, k, 3);
    let home = SaleKeys::bucket(sale, 0);
    assert_eq!(buy(g.port, sale, &users[0]).status, 202);
    let other = users[2].clone();
    let (first, rid) = cut_with_between(
        &redis,
        &relay,
        g.port,
        sale,
        home,
        &users[1],
        move |con, rid| {
            roll_back(con, home, rid);
            take_one(con, home, &other);
        },
    );
    let mut con = redis.con();
    let stocks: Vec<i64> = (0..k)
        .map(|b| con.get(SaleKeys::bucket(sale, b).stock()).unwrap())
        .collect();
    let flows: usize = (0..k)
        .map(|b| {
            con.hlen::<_, usize>(SaleKeys::bucket(sale, b).flow())
                .unwrap()
        })
        .sum();
    assert_eq!(
        (
            first.status,
            first.json()["reservation_id"].as_str(),
            stocks,
            flows
        ),
        (409, Some(rid.as_str()), vec![0, 2], 2),
        "{first:?}"
    );
}

#[test]
fn a_pipelined_split_sale_purchase_rolled_back_between_its_two_sendings_takes_nothing() {
    a_split_sale_purchase_rolled_back_in_between_takes_nothing("1");
}

#[test]
fn a_single_split_sale_purchase_rolled_back_between_its_two_sendings_takes_nothing() {
    a_split_sale_purchase_rolled_back_in_between_takes_nothing("0");
}
