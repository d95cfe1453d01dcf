//! Specifies the bounded shares and the load shedding (docs/LIMITS.md): a bot
//! with one user id gets one unit and at most its share of Redis calls
//! while honest buyers are served; a client address flooding invalid
//! requests is limited while other addresses are served; `X-Forwarded-For`
//! is believed only from a trusted proxy (rightmost untrusted hop); memory
//! stays bounded under a million distinct ids and addresses; purchases
//! beyond the in-flight bound are shed with 503 `overloaded` while Redis
//! is paused (reads are served meanwhile: not in the bound), and Redis
//! holds exactly the admitted ones. Client sockets are
//! bound to distinct loopback addresses (127.0.0.2, ...) to be distinct
//! clients.

use crate::support::gateway as gateway_support;

use gateway_support::{
    buy, counts, format_request, get, load_sale, open_sale, purchases_sent, read_resp, Gateway,
    Resp,
};
use seckill_tests::RedisServer;
use socket2::{Domain, Socket, Type};
use std::io::{BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant};

/// A connection to the gateway from the source address `from`.
fn connect_from(from: &str, port: u16) -> BufReader<TcpStream> {
    let ip: IpAddr = from.parse().unwrap();
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::new(ip, 0).into()).unwrap();
    s.connect(&SocketAddr::from(([127, 0, 0, 1], port)).into())
        .unwrap();
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.set_nodelay(true).unwrap();
    BufReader::new(s)
}

/// One request, with `X-Forwarded-For: xff` when given.
fn request(method: &str, path: &str, body: Option<&str>, xff: Option<&str>) -> String {
    let r = format_request(method, path, body, false);
    match xff {
        Some(x) => r.replacen("\r\n", &format!("\r\nX-Forwarded-For: {x}\r\n"), 1),
        None => r,
    }
}

fn purchase(sale: u64, user: &str, xff: Option<&str>) -> String {
    let body = format!(r#"{{"user_id":"{user}"}}"#);
    request(
        "POST",
        &format!("/v1/sales/{sale}/purchases"),
        Some(&body),
        xff,
    )
}

/// A purchase naming its buyer in the body only, with no token
/// (`SECKILL_AUTH=none`), forwarded for `xff`.
fn body_purchase(sale: u64, user: &str, xff: &str) -> String {
    let body = format!(r#"{{"user_id":"{user}"}}"#);
    format!(
        "POST /v1/sales/{sale}/purchases HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Forwarded-For: {xff}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Sends all `requests` at once on `c` (HTTP/1.1 pipelining), then reads
/// their answers in order.
fn pipeline(c: &mut BufReader<TcpStream>, requests: &[String]) -> Vec<Resp> {
    c.get_mut().write_all(requests.concat().as_bytes()).unwrap();
    (0..requests.len())
        .map(|_| read_resp(c).expect("an answer"))
        .collect()
}

fn metric(port: u16, line: &str) -> f64 {
    get(port, "/metrics")
        .body
        .lines()
        .find_map(|l| l.strip_prefix(line)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// Asserts `r` is the 429 of a limit.
fn assert_429(r: &Resp) {
    assert_eq!(
        (r.status, r.error()),
        (429, "too_many_requests".into()),
        "{r:?}"
    );
    assert_eq!(r.header("Retry-After"), Some("1"));
}

/// Most requests a limit of `rate`/s with `burst` lets through in
/// `elapsed` (the bucket starts full): B + R × ⌈elapsed⌉.
fn share(burst: u64, rate: u64, elapsed: Duration) -> u64 {
    burst + rate * elapsed.as_secs_f64().ceil() as u64
}

#[test]
fn a_bot_with_one_user_id_gets_one_unit_and_its_share_while_honest_buyers_are_served() {
    let _crowd = crate::support::crowd();
    let redis = RedisServer::start();
    open_sale(&redis, 1, 1000);
    // The defaults: 2 attempts/s, burst 5, per buyer per sale.
    let g = Gateway::start(&redis, &[]);
    let sent_before = purchases_sent(g.port);
    let start = Arc::new(Barrier::new(4 + 10));
    let port = g.port;
    let bots: Vec<_> = (0..4)
        .map(|_| {
            let start = start.clone();
            std::thread::spawn(move || {
                let mut c = connect_from("127.0.0.1", port);
                let reqs: Vec<String> = (0..250).map(|_| purchase(1, "bot", None)).collect();
                start.wait();
                let t = Instant::now();
                let answers = pipeline(&mut c, &reqs);
                (answers, t.elapsed())
            })
        })
        .collect();
    let honest: Vec<_> = (0..10)
        .map(|t| {
            let start = start.clone();
            std::thread::spawn(move || {
                let mut c = connect_from("127.0.0.1", port);
                start.wait();
                (0..10)
                    .map(|i| {
                        let r = pipeline(&mut c, &[purchase(1, &format!("h{t}-{i}"), None)]);
                        r[0].status
                    })
                    .collect::<Vec<u16>>()
            })
        })
        .collect();
    let mut answers = Vec::new();
    let mut elapsed = Duration::ZERO;
    for b in bots {
        let (a, e) = b.join().unwrap();
        answers.extend(a);
        elapsed = elapsed.max(e);
    }
    let honest: Vec<u16> = honest.into_iter().flat_map(|h| h.join().unwrap()).collect();
    assert_eq!(honest, vec![202; 100], "every honest buyer bought");
    assert_eq!(answers.len(), 1000);
    let reserved = answers.iter().filter(|r| r.status == 202).count();
    let again = answers.iter().filter(|r| r.status == 409).count();
    let limited: Vec<&Resp> = answers.iter().filter(|r| r.status == 429).collect();
    limited.iter().for_each(|r| assert_429(r));
    assert_eq!(reserved, 1, "the bot got exactly one unit");
    assert_eq!(
        reserved + again + limited.len(),
        1000,
        "nothing but 202, 409, 429"
    );
    let reached = (reserved + again) as u64;
    let sent = purchases_sent(g.port) - sent_before;
    eprintln!(
        "1,000 bot purchases in {elapsed:?}: {reached} reached Redis, {sent} purchases sent in all"
    );
    assert_eq!(
        sent,
        100 + reached,
        "each attempt let through was one buyer's turn in a script"
    );
    assert!(reached >= 5, "at least the burst: {reached}");
    assert!(
        reached <= share(5, 2, elapsed),
        "{reached} attempts in {elapsed:?}"
    );
    assert_eq!(counts(&redis, 1), (1000 - 101, 101, 101));
    assert_eq!(
        metric(g.port, "seckill_gateway_limited_total{limit=\"buyer\"}"),
        limited.len() as f64
    );
    assert_eq!(
        metric(g.port, "seckill_gateway_limited_total{limit=\"address\"}"),
        0.0,
        "127.0.0.1 is a trusted proxy by default and sent no X-Forwarded-For"
    );
}

#[test]
fn a_client_address_flooding_invalid_requests_is_limited_while_others_are_served() {
    let _crowd = crate::support::crowd();
    let redis = RedisServer::start();
    open_sale(&redis, 1, 100);
    let g = Gateway::start(
        &redis,
        &[
            ("SECKILL_GATEWAY_TRUSTED_PROXIES", "none"),
            ("SECKILL_GATEWAY_ADDRESS_RATE", "10"),
            ("SECKILL_GATEWAY_ADDRESS_BURST", "20"),
        ],
    );
    let invalid = request(
        "POST",
        "/v1/sales/1/purchases",
        Some(r#"{"user_id":"#),
        None,
    );
    let mut flooder = connect_from("127.0.0.2", g.port);
    let t = Instant::now();
    let answers = pipeline(&mut flooder, &vec![invalid.clone(); 300]);
    let elapsed = t.elapsed();
    let refused = answers.iter().filter(|r| r.status == 400).count() as u64;
    let limited: Vec<&Resp> = answers.iter().filter(|r| r.status != 400).collect();
    limited.iter().for_each(|r| assert_429(r));
    eprintln!("300 invalid requests in {elapsed:?}: {refused} answered 400");
    assert!(
        refused >= 20 && refused <= share(20, 10, elapsed),
        "{refused}"
    );
    // Other addresses: served as if nothing happened.
    let mut other = connect_from("127.0.0.3", g.port);
    let reqs: Vec<String> = (0..5)
        .map(|i| purchase(1, &format!("o{i}"), None))
        .collect();
    let served = pipeline(&mut other, &reqs);
    assert!(served.iter().all(|r| r.status == 202), "{served:?}");
    let mut third = connect_from("127.0.0.4", g.port);
    assert_eq!(pipeline(&mut third, &[invalid])[0].status, 400);
    // Only the five purchases changed Redis.
    assert_eq!(counts(&redis, 1), (95, 5, 5));
    assert_eq!(
        metric(g.port, "seckill_gateway_limited_total{limit=\"address\"}"),
        (300 - refused) as f64
    );
}

#[test]
fn a_forwarded_address_is_limited_only_from_a_trusted_proxy() {
    let redis = RedisServer::start();
    open_sale(&redis, 1, 100);
    let g = Gateway::start(
        &redis,
        &[
            ("SECKILL_GATEWAY_TRUSTED_PROXIES", "127.0.0.5"),
            ("SECKILL_GATEWAY_ADDRESS_RATE", "1"),
            ("SECKILL_GATEWAY_ADDRESS_BURST", "3"),
        ],
    );
    let sale = |xff: Option<&str>| request("GET", "/v1/sales/1", None, xff);
    let passed = |a: &[Resp]| {
        a.iter()
            .filter(|r| r.status != 429)
            .inspect(|r| assert_eq!(r.status, 200, "{r:?}"))
            .count() as u64
    };

    // Through the trusted proxy: the forwarded client is limited, however
    // it decorates the header (the proxy appends the real address last).
    let mut proxy = connect_from("127.0.0.5", g.port);
    let reqs: Vec<String> = (0..20)
        .map(|i| match i % 2 {
            0 => sale(Some("198.51.100.7")),
            _ => sale(Some(&format!("203.0.113.{i}, 198.51.100.7"))),
        })
        .collect();
    let t = Instant::now();
    let a = pipeline(&mut proxy, &reqs);
    let through = passed(&a);
    assert!(
        through >= 3 && through <= share(3, 1, t.elapsed()),
        "{through}"
    );
    a.iter().filter(|r| r.status == 429).for_each(assert_429);
    // Another client behind the same proxy has its own share, and the
    // proxy's own requests (no header: every hop trusted) are not limited.
    let a = pipeline(&mut proxy, &vec![sale(Some("198.51.100.8")); 3]);
    assert_eq!(passed(&a), 3);
    let a = pipeline(&mut proxy, &vec![sale(None); 20]);
    assert_eq!(passed(&a), 20);

    // From an untrusted peer the header is ignored: a new address in
    // every request does not help, the peer is charged.
    let mut direct = connect_from("127.0.0.6", g.port);
    let reqs: Vec<String> = (0..20)
        .map(|i| sale(Some(&format!("198.51.100.{}", 20 + i))))
        .collect();
    let t = Instant::now();
    let a = pipeline(&mut direct, &reqs);
    let direct_passed = passed(&a);
    assert!(
        direct_passed >= 3 && direct_passed <= share(3, 1, t.elapsed()),
        "{direct_passed}"
    );
}

#[test]
fn memory_stays_bounded_under_a_million_distinct_buyers_and_addresses() {
    let _crowd = crate::support::crowd();
    const SLOTS: u64 = 65_536;
    let redis = RedisServer::start();
    // An upcoming sale: every purchase runs the script (403
    // sale_not_started), so every one is charged to both tables.
    load_sale(&redis, 1, 10, 3_600_000, 600_000);
    open_sale(&redis, 2, 10);
    // The buyer comes from the body (`SECKILL_AUTH=none`): the memory of
    // verified tokens has its own bound (`SECKILL_AUTH_CACHE_MAX`,
    // docs/IDENTITY.md) and would hold 200,000 of this flood's tokens, and
    // a million signatures would cost minutes; the figure is the limits'
    // alone.
    let g = Gateway::start(
        &redis,
        &[
            ("SECKILL_GATEWAY_LIMIT_SLOTS", &SLOTS.to_string()),
            ("SECKILL_AUTH", "none"),
        ],
    );
    let pid = g.child.id();
    const CONNS: u64 = 8;
    const TOTAL: u64 = 1_000_000;
    const BATCH: u64 = 200;
    let forwarded = |i: u64| format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255);
    let run = |base: u64, n: u64| {
        let threads: Vec<_> = (0..CONNS)
            .map(|t| {
                let port = g.port;
                std::thread::spawn(move || {
                    let mut c = connect_from("127.0.0.1", port);
                    let (mut not_started, mut limited) = (0u64, 0u64);
                    let mut i = base + t;
                    while i < base + n {
                        let reqs: Vec<String> = (0..BATCH)
                            .map(|k| i + k * CONNS)
                            .filter(|&j| j < base + n)
                            .map(|j| body_purchase(1, &format!("flood-{j}"), &forwarded(j)))
                            .collect();
                        for r in pipeline(&mut c, &reqs) {
                            match r.status {
                                403 => not_started += 1,
                                429 => limited += 1,
                                _ => panic!("{r:?}"),
                            }
                        }
                        i += BATCH * CONNS;
                    }
                    (not_started, limited)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    };
    // Warm-up: the connection threads, their allocator arenas, the tables'
    // pages (touched as keys land), then the baseline.
    run(TOTAL, 100_000);
    let baseline = rss_kib(pid);
    let t = Instant::now();
    let (not_started, limited) = run(0, TOTAL);
    let after = rss_kib(pid);
    eprintln!(
        "{TOTAL} distinct buyers and addresses in {:?}: {not_started} × 403, {limited} × 429 \
         (table full: {}); RSS {baseline} KiB -> {after} KiB",
        t.elapsed(),
        metric(g.port, "seckill_gateway_limit_table_full_total"),
    );
    assert_eq!(not_started + limited, TOTAL);
    // The bound (README, "Bounded shares"): the two tables of 16-byte
    // entries are all the limits keep, 2 × 65,536 × 16 B = 2 MiB here,
    // touched during the warm-up; the flood adds under 8 MiB of anything
    // else. A map holding every key would need over 100 MiB.
    assert!(
        after < baseline + 8 * 1024,
        "RSS grew from {baseline} KiB to {after} KiB"
    );
    // An honest buyer behind the proxy is served after the flood.
    let mut c = connect_from("127.0.0.1", g.port);
    let r = pipeline(&mut c, &[purchase(2, "honest", Some("192.0.2.1"))]);
    assert_eq!(r[0].status, 202, "{:?}", r[0]);
}

#[test]
fn purchases_beyond_the_in_flight_bound_are_shed_while_redis_is_paused() {
    let redis = RedisServer::start();
    open_sale(&redis, 1, 100);
    let g = Gateway::start(
        &redis,
        &[
            ("SECKILL_GATEWAY_PURCHASES_IN_FLIGHT", "4"),
            ("SECKILL_REDIS_TIMEOUT", "30s"),
        ],
    );
    assert_eq!(buy(g.port, 1, "warm").status, 202);
    // Scripts wait while Redis is paused; reads go on.
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(60_000)
        .arg("WRITE")
        .query(&mut redis.con())
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let port = g.port;
    let buyers: Vec<_> = (0..20)
        .map(|i| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let r = buy(port, 1, &format!("p{i}"));
                tx.send(r).unwrap();
            })
        })
        .collect();
    // Sixteen answers come while Redis is still paused: all shed.
    for _ in 0..16 {
        let r = rx.recv_timeout(Duration::from_secs(20)).expect("an answer");
        assert_eq!((r.status, r.error()), (503, "overloaded".into()), "{r:?}");
        assert_eq!(r.header("Retry-After"), Some("1"));
    }
    // The four admitted ones are waiting for Redis.
    assert!(rx.try_recv().is_err());
    assert_eq!(metric(g.port, "seckill_gateway_shed_total"), 16.0);
    // Reads are not counted in the bound (README, "Bounded shares"): with
    // every place taken, the sale and a buyer's status are served, and the
    // next purchase is still shed.
    let sale = get(g.port, "/v1/sales/1");
    assert_eq!(
        (sale.status, sale.json()["stock_remaining"].as_i64()),
        (200, Some(99))
    );
    let status = get(g.port, "/v1/sales/1/purchases/warm");
    assert_eq!(
        (status.status, status.json()["status"].as_str()),
        (200, Some("queued"))
    );
    let shed = buy(g.port, 1, "late");
    assert_eq!((shed.status, shed.error()), (503, "overloaded".into()));
    assert_eq!(metric(g.port, "seckill_gateway_shed_total"), 17.0);
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query(&mut redis.con())
        .unwrap();
    for _ in 0..4 {
        let r = rx.recv_timeout(Duration::from_secs(20)).expect("an answer");
        assert_eq!(r.status, 202, "{r:?}");
    }
    for b in buyers {
        b.join().unwrap();
    }
    assert_eq!(counts(&redis, 1), (95, 5, 5));
    // With the pause over, the next purchase is admitted again.
    assert_eq!(buy(g.port, 1, "after").status, 202);
}
