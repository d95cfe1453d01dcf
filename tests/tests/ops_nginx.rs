//! Runs the shipped reverse proxy for real: Debian's nginx (as root its
//! workers run as `nobody`) with `systemd/nginx-seckill.conf`, changed only
//! in its `upstream` server line and its `listen` port, inside a generated
//! main file whose log, pid and temp paths are in a temp dir (the package's
//! compiled-in ones are root-owned under /var). `nginx -t` accepts the
//! shipped file unchanged; purchases through it are balanced over two real
//! gateways; a body above its 4 KiB cap gets nginx's 413 and reaches no
//! gateway; `/metrics` stays private; and the client's own address reaches
//! the gateway (`X-Forwarded-For`, replacing a forged one), so the
//! per-address limit charges each client, not the proxy; a gateway killed
//! behind it costs no purchase, and none left is 503 `unavailable`;
//! nginx's own 429 is the gateway's JSON with `Retry-After`; 300 slow
//! clients hold no gateway thread and are cut off by nginx.

use crate::support::gateway as gateway_support;
use crate::support::ops as ops_support;

use gateway_support::{format_request, get, open_sale, raw, read_resp, request, Gateway, Resp};
use ops_support::{replace_once, repo_file};
use seckill_tests::{dies_with_test, free_port, wait_until, RedisServer, TempDir};
use socket2::{Domain, Socket, Type};
use std::io::{BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(30);

/// The shipped `upstream` server line's flags, kept for each test gateway.
const SERVER_FLAGS: &str = "max_fails=1 fail_timeout=2s";

/// Where Debian installs nginx (often not on a non-root PATH).
const NGINX: &str = "/usr/sbin/nginx";

/// The main configuration around an `http{}`-level include: one worker
/// (so round robin is exact), every path in `dir`.
fn main_conf(dir: &Path, include: &Path) -> String {
    let d = dir.display();
    format!(
        "worker_processes 1;\npid {d}/nginx.pid;\nevents {{ worker_connections 1024; }}\n\
         http {{\n    access_log {d}/access.log;\n    client_body_temp_path {d}/body;\n    \
         proxy_temp_path {d}/proxy;\n    fastcgi_temp_path {d}/fastcgi;\n    \
         uwsgi_temp_path {d}/uwsgi;\n    scgi_temp_path {d}/scgi;\n    include {};\n}}\n",
        include.display()
    )
}

/// `nginx ARGS -p dir -c conf -e dir/error.log`.
fn nginx(dir: &Path, conf: &Path) -> Command {
    let mut c = dies_with_test(NGINX);
    c.arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(conf)
        .arg("-e")
        .arg(dir.join("error.log"));
    c
}

/// A private nginx on a free port, stopped (SIGTERM, then SIGKILL) on drop.
struct Nginx {
    port: u16,
    child: Child,
    dir: TempDir,
}

impl Nginx {
    /// Starts nginx with the shipped file in front of the gateways on
    /// `upstreams`; waits until `/healthz` answers through it. A port that
    /// another test took between `free_port` and nginx's bind is replaced
    /// (up to 5 tries); any other early exit fails with nginx's log.
    fn start(upstreams: &[u16]) -> Nginx {
        for _ in 0..5 {
            if let Some(n) = Nginx::try_start(upstreams) {
                return n;
            }
        }
        panic!("nginx found no free port in 5 tries");
    }

    /// One start on a fresh port; `None` when the port was taken.
    fn try_start(upstreams: &[u16]) -> Option<Nginx> {
        let dir = TempDir::new();
        let shipped = std::fs::read_to_string(repo_file("systemd/nginx-seckill.conf"))
            .expect("read systemd/nginx-seckill.conf");
        let servers: String = upstreams
            .iter()
            .map(|p| format!("    server 127.0.0.1:{p} {SERVER_FLAGS};\n"))
            .collect();
        let port = free_port();
        let conf = replace_once(
            &shipped,
            &format!("    server 127.0.0.1:8080 {SERVER_FLAGS};\n"),
            &servers,
        );
        let conf = replace_once(
            &conf,
            "    listen 80;\n",
            &format!("    listen 127.0.0.1:{port};\n"),
        );
        let site = dir.path().join("seckill.conf");
        std::fs::write(&site, conf).expect("write seckill.conf");
        let main = dir.path().join("nginx.conf");
        std::fs::write(&main, main_conf(dir.path(), &site)).expect("write nginx.conf");
        let child = nginx(dir.path(), &main)
            .args(["-g", "daemon off;"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(dir.path().join("stderr.log"))
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::null()),
            )
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run {NGINX} ({e}): install Debian's `nginx` (./scripts/test.sh does)"
                )
            });
        let mut n = Nginx { port, child, dir };
        let mut taken = false;
        wait_until(LONG, "nginx to proxy /healthz", || {
            if n.child.try_wait().expect("try_wait").is_some() {
                let log = n.log();
                assert!(
                    log.contains("Address already in use"),
                    "nginx exited: {log}"
                );
                taken = true;
                return true;
            }
            // nginx's own `Server` header: the port is this nginx's, not a
            // gateway of another test that took it first.
            TcpStream::connect(("127.0.0.1", port)).is_ok() && {
                let r = get(port, "/healthz");
                r.status == 200 && r.header("Server").is_some_and(|v| v.starts_with("nginx"))
            }
        });
        (!taken).then_some(n)
    }

    /// nginx's error log, and what it wrote to stderr before it had one.
    fn log(&self) -> String {
        let read = |f: &str| std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default();
        read("stderr.log") + &read("error.log")
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of the sample `series` on the gateway's `/metrics` (0 when absent).
fn metric(port: u16, series: &str) -> f64 {
    get(port, "/metrics")
        .body
        .lines()
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

/// Purchase answers the gateway on `port` has counted, every status.
fn purchases_counted(port: u16) -> f64 {
    get(port, "/metrics")
        .body
        .lines()
        .filter(|l| l.starts_with("seckill_gateway_requests_total{route=\"purchase\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A keep-alive connection to `port` from the source address `from`.
fn connect_from(from: &str, port: u16) -> BufReader<TcpStream> {
    let ip: IpAddr = from.parse().expect("an address");
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    s.bind(&SocketAddr::new(ip, 0).into()).expect("bind");
    s.connect(&SocketAddr::from(([127, 0, 0, 1], port)).into())
        .expect("connect to nginx");
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    BufReader::new(s)
}

/// `GET /v1/sales/1` on `c` claiming to come from `forged`; its answer.
fn sale_forged(c: &mut BufReader<TcpStream>, forged: &str) -> Resp {
    let r = format_request("GET", "/v1/sales/1", None, false).replacen(
        "\r\n",
        &format!("\r\nX-Forwarded-For: {forged}\r\n"),
        1,
    );
    c.get_mut().write_all(r.as_bytes()).expect("send");
    read_resp(c).expect("an answer")
}

#[test]
fn nginx_t_accepts_the_shipped_file_unchanged() {
    let dir = TempDir::new();
    let main = dir.path().join("nginx.conf");
    let shipped = repo_file("systemd/nginx-seckill.conf");
    std::fs::write(&main, main_conf(dir.path(), &shipped)).expect("write nginx.conf");
    let out = nginx(dir.path(), &main)
        .arg("-t")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {NGINX} ({e}): install Debian's `nginx`"));
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("test is successful"), "{said}");
}

#[test]
fn purchases_through_nginx_are_balanced_over_two_gateways_and_big_bodies_get_413() {
    let redis = RedisServer::start();
    open_sale(&redis, 1, 100);
    let g1 = Gateway::start(&redis, &[]);
    let g2 = Gateway::start(&redis, &[]);
    let n = Nginx::start(&[g1.port, g2.port]);

    // 30 purchases and 2 more requests below: within nginx's per-address
    // burst of 40 (limit_req), however fast they go.
    for i in 0..30 {
        let r = gateway_support::buy(n.port, 1, &format!("u{i}"));
        assert_eq!(r.status, 202, "{r:?} {}", n.log());
    }
    let ok = r#"seckill_gateway_requests_total{route="purchase",status="202"}"#;
    wait_until(LONG, "every purchase to be counted", || {
        metric(g1.port, ok) + metric(g2.port, ok) == 30.0
    });
    // One nginx worker, round robin, no failure: strictly alternating.
    assert_eq!((metric(g1.port, ok), metric(g2.port, ok)), (15.0, 15.0));

    // Above client_max_body_size 4k: nginx answers 413 itself.
    let body = format!(r#"{{"user_id":"big","pad":"{}"}}"#, "a".repeat(5000));
    let r = raw(
        n.port,
        format_request("POST", "/v1/sales/1/purchases", Some(&body), true).as_bytes(),
    )
    .expect("an answer");
    assert_eq!(
        (r.status, r.error()),
        (413, "payload_too_large".into()),
        "{r:?}"
    );
    // A body within the cap (3 KiB, whitespace padded) still goes through.
    let body = format!(r#"{{"user_id":"small"{}}}"#, " ".repeat(3000));
    let r = request(n.port, "POST", "/v1/sales/1/purchases", Some(&body));
    assert_eq!(r.status, 202, "{r:?}");
    wait_until(LONG, "the small purchase to be counted", || {
        purchases_counted(g1.port) + purchases_counted(g2.port) == 31.0
    });
    // Metrics stay private.
    assert_eq!(get(n.port, "/metrics").status, 404);
    assert_eq!(
        purchases_counted(g1.port) + purchases_counted(g2.port),
        31.0
    );
}

#[test]
fn the_client_address_reaches_the_gateway_so_the_address_limit_charges_each_client() {
    let redis = RedisServer::start();
    open_sale(&redis, 1, 100);
    let g = Gateway::start(
        &redis,
        &[
            ("SECKILL_GATEWAY_ADDRESS_RATE", "1"),
            ("SECKILL_GATEWAY_ADDRESS_BURST", "3"),
        ],
    );
    let n = Nginx::start(&[g.port]);

    // Client A forges a new address in every request: nginx replaces the
    // header with A's own address, so A is charged (were nothing forwarded,
    // nobody would be: the proxy itself is trusted and never limited).
    let mut a = connect_from("127.0.0.2", n.port);
    let t = Instant::now();
    let answers: Vec<Resp> = (0..12)
        .map(|i| sale_forged(&mut a, &format!("198.51.100.{i}")))
        .collect();
    let elapsed = t.elapsed();
    let passed = answers.iter().filter(|r| r.status == 200).count() as u64;
    let limited: Vec<&Resp> = answers.iter().filter(|r| r.status == 429).collect();
    assert_eq!(passed + limited.len() as u64, 12, "{answers:?}");
    // Burst 3, then 1/s: B + R × ⌈elapsed⌉ at most.
    let share = 3 + elapsed.as_secs_f64().ceil() as u64;
    assert!(
        passed >= 3 && passed <= share,
        "{passed} of 12 in {elapsed:?}"
    );
    for r in &limited {
        assert_eq!(
            (r.error(), r.header("Retry-After")),
            ("too_many_requests".to_string(), Some("1")),
            "the gateway's 429, not nginx's: {r:?}"
        );
    }
    // Client B, right after, has a share of its own.
    let mut b = connect_from("127.0.0.3", n.port);
    for _ in 0..3 {
        assert_eq!(sale_forged(&mut b, "127.0.0.2").status, 200);
    }
    let series = r#"seckill_gateway_limited_total{limit="address"}"#;
    wait_until(LONG, "the 429s to be counted", || {
        metric(g.port, series) == limited.len() as f64
    });
}

/// A gateway killed behind nginx: every purchase is still answered 202 by
/// the other (a refused connect is passed on, never a sent POST), each is
/// reserved once; with no gateway left, nginx answers the gateway's own
/// 503 `unavailable` with `Retry-After`.
#[test]
fn a_killed_gateway_costs_no_purchase_and_none_left_is_a_503_unavailable() {
    let redis = RedisServer::start();
    open_sale(&redis, 1, 100);
    let mut g1 = Gateway::start(&redis, &[]);
    let mut g2 = Gateway::start(&redis, &[]);
    let n = Nginx::start(&[g1.port, g2.port]);
    g1.child.kill().expect("kill -9 the first gateway");
    g1.child.wait().expect("reap it");
    let answers: Vec<u16> = (0..20)
        .map(|i| gateway_support::buy(n.port, 1, &format!("k{i}")).status)
        .collect();
    assert_eq!(answers, vec![202; 20], "{}", n.log());
    let ok = r#"seckill_gateway_requests_total{route="purchase",status="202"}"#;
    wait_until(LONG, "the second gateway to count 20", || {
        metric(g2.port, ok) == 20.0
    });
    assert_eq!(gateway_support::counts(&redis, 1), (80, 20, 20));

    g2.child.kill().expect("kill -9 the second gateway");
    g2.child.wait().expect("reap it");
    let r = gateway_support::buy(n.port, 1, "nobody-left");
    assert_eq!(
        (r.status, r.error(), r.header("Retry-After")),
        (503, "unavailable".to_string(), Some("1")),
        "{r:?}"
    );
    assert_eq!(gateway_support::counts(&redis, 1), (80, 20, 20));
}

/// nginx's own refusals use the gateway's error shape: its per-address
/// request limit (20/s, burst 40) answers 429 `too_many_requests` with
/// `Retry-After: 1`, and what passes is within rate × time + burst.
#[test]
fn nginx_s_own_429_is_the_gateway_s_json_with_retry_after() {
    let redis = RedisServer::start();
    open_sale(&redis, 1, 100);
    let g = Gateway::start(&redis, &[]);
    let n = Nginx::start(&[g.port]);
    let mut c = connect_from("127.0.0.4", n.port);
    let t = Instant::now();
    let answers: Vec<Resp> = (0..80)
        .map(|_| {
            c.get_mut()
                .write_all(format_request("GET", "/healthz", None, false).as_bytes())
                .expect("send");
            read_resp(&mut c).expect("an answer")
        })
        .collect();
    let elapsed = t.elapsed();
    let passed = answers.iter().filter(|r| r.status == 200).count() as f64;
    let limited: Vec<&Resp> = answers.iter().filter(|r| r.status == 429).collect();
    assert_eq!(passed as usize + limited.len(), 80, "{answers:?}");
    // The Nginx::start probe took one; 1 + burst 40 + 20/s since.
    assert!(
        passed <= 41.0 + (20.0 * elapsed.as_secs_f64()).ceil(),
        "{passed} passed in {elapsed:?}"
    );
    assert!(
        !limited.is_empty(),
        "no 429 in 80 requests within {elapsed:?}"
    );
    for r in &limited {
        assert_eq!(
            (r.error(), r.header("Retry-After"), r.header("Content-Type")),
            (
                "too_many_requests".to_string(),
                Some("1"),
                Some("application/json")
            ),
            "{r:?}"
        );
    }
}

/// 300 slow clients that trickle a header (one byte a second) hold no
/// gateway thread: nginx buffers them, purchases from another address go
/// on, and nginx closes each slow one after `client_header_timeout` (5 s).
#[test]
fn three_hundred_slow_clients_behind_nginx_do_not_stop_purchases() {
    let redis = RedisServer::start();
    open_sale(&redis, 1, 100);
    let g = Gateway::start(&redis, &[]);
    let n = Nginx::start(&[g.port]);
    let healthz = r#"seckill_gateway_requests_total{route="healthz",status="200"}"#;
    // The start-up probes are counted just after their answers: let the
    // last one land before taking the figure (a CI run read it one short).
    std::thread::sleep(Duration::from_millis(300));
    let probes = metric(g.port, healthz);
    // 15 addresses x 20 connections: within nginx's limit_conn of 20.
    let mut slow: Vec<TcpStream> = (0..300)
        .map(|i| {
            let mut s = connect_from(&format!("127.0.1.{}", 1 + i / 20), n.port).into_inner();
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                .expect("start a header");
            s
        })
        .collect();
    for i in 0..20 {
        let r = gateway_support::buy(n.port, 1, &format!("s{i}"));
        assert_eq!(r.status, 202, "{r:?}");
        for s in slow.iter_mut().skip(i % 10).step_by(10) {
            let _ = s.write_all(b"X");
        }
    }
    assert_eq!(gateway_support::counts(&redis, 1), (80, 20, 20));
    // Every slow client is cut off by nginx, none answered by the gateway.
    for (i, s) in slow.iter_mut().enumerate() {
        s.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("set a read timeout");
        let mut buf = Vec::new();
        let got = std::io::Read::read_to_end(s, &mut buf);
        assert!(
            !String::from_utf8_lossy(&buf).contains("200 OK"),
            "slow client {i} was answered: {got:?}"
        );
        assert!(
            got.is_ok()
                || got
                    .as_ref()
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
            "slow client {i} still open after 20 s: {got:?}"
        );
    }
    // Not one of their health checks reached the gateway.
    assert_eq!(metric(g.port, healthz), probes);
}
