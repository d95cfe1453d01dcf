//! Shared by the `gateway_*` tests: start the real `seckill-gateway` binary
//! on a free port against a private Redis, a minimal HTTP/1.1 client over
//! `TcpStream` (able to send byte-exact hostile requests), sales loaded
//! straight into Redis, and a snapshot of a sale's keys to prove "Redis is
//! unchanged".

use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_common::sale::load_into_redis;
use seckill_tests::{free_port, test_sale, wait_until, RedisServer};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Gateway settings for tests about exact counts rather than latency: a
/// Redis timeout long enough that a loaded test machine never turns a
/// purchase into a 503 (the pipeline wait is three of it).
pub const PATIENT: &[(&str, &str)] = &[("SECKILL_REDIS_TIMEOUT", "10s")];

/// A running gateway, killed (SIGKILL) on drop if still running.
pub struct Gateway {
    pub port: u16,
    pub child: Child,
}

impl Gateway {
    /// Starts the gateway on a free port against `redis`; extra env vars
    /// override the defaults. Waits until `/healthz` answers.
    pub fn start(redis: &impl seckill_tests::cluster::TestRedis, env: &[(&str, &str)]) -> Gateway {
        let port = free_port();
        let mut cmd = seckill_tests::command("seckill-gateway");
        cmd.env("SECKILL_LISTEN", format!("127.0.0.1:{port}"))
            .env("SECKILL_REDIS_URL", redis.url())
            .env("SECKILL_GATEWAY_THREADS", "8")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start seckill-gateway");
        let mut g = Gateway { port, child };
        wait_until(
            Duration::from_secs(10),
            "the gateway to answer /healthz",
            || {
                assert!(
                    g.child.try_wait().unwrap().is_none(),
                    "gateway exited early"
                );
                TcpStream::connect(("127.0.0.1", port)).is_ok()
                    && get(port, "/healthz").status == 200
            },
        );
        g
    }

    /// Sends SIGTERM and waits (at most `within`) for the exit.
    pub fn terminate(&mut self, within: Duration) -> Option<ExitStatus> {
        signal(self.child.id(), "TERM");
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(s) = self.child.try_wait().unwrap() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Whether the process still runs.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `kill -SIG pid`.
pub fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig} {pid}");
}

/// An HTTP answer.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Resp {
    /// A header's value (case-insensitive name).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
    /// The body's `error` field.
    pub fn error(&self) -> String {
        self.json()["error"].as_str().unwrap_or("").to_string()
    }
}

/// Reads one final response (skipping interim 1xx ones, as HTTP/1.1
/// clients must); `None` when the connection closed first.
pub fn read_resp(r: &mut impl BufRead) -> Option<Resp> {
    loop {
        let resp = read_one(r)?;
        if resp.status >= 200 {
            return Some(resp);
        }
    }
}

fn read_one(r: &mut impl BufRead) -> Option<Resp> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let status: u16 = line.split(' ').nth(1)?.parse().ok()?;
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).ok()? == 0 {
            return None;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    let len: usize = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("Content-Length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    Some(Resp {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// A keep-alive connection.
pub struct Client {
    reader: BufReader<TcpStream>,
}

impl Client {
    /// Connects to the gateway.
    pub fn connect(port: u16) -> Client {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect to gateway");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.set_nodelay(true).unwrap();
        Client {
            reader: BufReader::new(s),
        }
    }

    /// Sends one request and reads its answer.
    pub fn send(&mut self, method: &str, path: &str, body: Option<&str>) -> Resp {
        let req = format_request(method, path, body, false);
        self.reader.get_mut().write_all(req.as_bytes()).unwrap();
        read_resp(&mut self.reader).expect("an answer")
    }

    /// `POST /v1/sales/{sale}/purchases` for `user`.
    pub fn buy(&mut self, sale: u64, user: &str) -> Resp {
        let body = format!(r#"{{"user_id":"{user}"}}"#);
        self.send("POST", &format!("/v1/sales/{sale}/purchases"), Some(&body))
    }

    /// A purchase of `quantity` units for `user` under `Idempotency-Key:
    /// key`.
    pub fn buy_units(&mut self, sale: u64, user: &str, quantity: u32, key: &str) -> Resp {
        let body = format!(r#"{{"user_id":"{user}","quantity":{quantity}}}"#);
        let req = format_request(
            "POST",
            &format!("/v1/sales/{sale}/purchases"),
            Some(&body),
            false,
        )
        .replacen("\r\n", &format!("\r\nIdempotency-Key: {key}\r\n"), 1);
        self.reader.get_mut().write_all(req.as_bytes()).unwrap();
        read_resp(&mut self.reader).expect("an answer")
    }
}

/// The bytes of one HTTP/1.1 request; `close` adds `Connection: close`.
/// A purchase whose body names a `user_id`, and a status read of
/// `/purchases/{user}`, carry that user's token
/// (`seckill_tests::auth::token_for`), as a shop's client would.
pub fn format_request(method: &str, path: &str, body: Option<&str>, close: bool) -> String {
    let mut r = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    if let Some(user) = acting_user(method, path, body) {
        r.push_str(&format!(
            "Authorization: Bearer {}\r\n",
            seckill_tests::auth::token_for(&user)
        ));
    }
    if close {
        r.push_str("Connection: close\r\n");
    }
    if let Some(b) = body {
        r.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        ));
    } else {
        r.push_str("\r\n");
    }
    r
}

/// The user a request acts as (see [`format_request`]), if any.
fn acting_user(method: &str, path: &str, body: Option<&str>) -> Option<String> {
    let rest = path.strip_prefix("/v1/sales/")?;
    let (_, tail) = rest.split_once('/')?;
    let user = match (method, tail.strip_prefix("purchases")?) {
        ("POST", "") => {
            let v: serde_json::Value = serde_json::from_str(body?).ok()?;
            v.get("user_id")?.as_str()?.to_string()
        }
        ("GET", u) => u.strip_prefix('/')?.to_string(),
        _ => return None,
    };
    seckill_common::is_valid_token(&user).then_some(user)
}

/// One request on a new connection.
pub fn request(port: u16, method: &str, path: &str, body: Option<&str>) -> Resp {
    raw(port, format_request(method, path, body, true).as_bytes()).expect("an answer")
}

/// `GET path` on a new connection.
pub fn get(port: u16, path: &str) -> Resp {
    request(port, "GET", path, None)
}

/// A purchase on a new connection.
pub fn buy(port: u16, sale: u64, user: &str) -> Resp {
    let body = format!(r#"{{"user_id":"{user}"}}"#);
    request(
        port,
        "POST",
        &format!("/v1/sales/{sale}/purchases"),
        Some(&body),
    )
}

/// Sends `bytes` on a new connection and reads one answer (`None` when the
/// server closed without one).
pub fn raw(port: u16, bytes: &[u8]) -> Option<Resp> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    // The server may answer and close before taking every byte.
    let _ = s.write_all(bytes);
    read_resp(&mut BufReader::new(s))
}

/// A sale loaded into Redis (no MySQL needed), open for 10 minutes from
/// 1 s ago unless `starts_in_ms`/`len_ms` say otherwise.
pub fn load_sale(redis: &RedisServer, id: u64, stock: u64, starts_in_ms: i64, len_ms: u64) {
    let sale = test_sale(id, stock, starts_in_ms, len_ms);
    assert!(load_into_redis(&mut redis.con(), &sale, 0).unwrap());
}

/// An open sale with `stock` units.
pub fn open_sale(redis: &RedisServer, id: u64, stock: u64) {
    load_sale(redis, id, stock, -1000, 600_000);
}

/// An open sale `id` of `stock` units that sells up to `l` units per buyer
/// and `q` per purchase: [`open_sale`] with the limits written into its
/// meta (`max_per_buyer`, `max_per_purchase`), as `sale load` writes them.
pub fn open_units_sale(redis: &RedisServer, id: u64, stock: u64, l: u32, q: u32) {
    use seckill_common::allowance::{MAX_PER_BUYER_FIELD, MAX_PER_PURCHASE_FIELD};
    open_sale(redis, id, stock);
    let _: () = redis
        .con()
        .hset_multiple(
            SaleKeys::new(id).meta(),
            &[(MAX_PER_BUYER_FIELD, l), (MAX_PER_PURCHASE_FIELD, q)],
        )
        .unwrap();
}

/// Every key of the sale with its full content (`seckill_tests::sale_snapshot`).
pub fn snapshot(redis: &RedisServer, id: u64) -> Vec<(String, String)> {
    seckill_tests::sale_snapshot(&mut redis.con(), id)
}

/// The sale's stock, flow records and queue length.
pub fn counts(redis: &RedisServer, id: u64) -> (i64, usize, usize) {
    let mut con = redis.con();
    let k = SaleKeys::new(id);
    (
        con.get(k.stock()).unwrap(),
        con.hlen(k.flow()).unwrap(),
        con.llen(k.queue()).unwrap(),
    )
}

/// Scripts run by `EVALSHA` on `redis` so far (`INFO commandstats`): a
/// purchase answered from memory leaves it unchanged.
pub fn evalsha_calls(redis: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut redis.con())
        .unwrap();
    info.lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split("calls=").nth(1))
        .and_then(|s| s.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Purchases the gateway on `port` has sent to Redis in its group-commit
/// pipelines (`seckill_gateway_pipelined_purchases_total` on `/metrics`):
/// each is one buyer's turn in a call of the reservation script (a call
/// carries every buyer of its bucket in the batch, so `EVALSHA` calls
/// count fewer).
pub fn purchases_sent(port: u16) -> u64 {
    let m = get(port, "/metrics");
    assert_eq!(m.status, 200, "/metrics");
    m.body
        .lines()
        .find_map(|l| l.strip_prefix("seckill_gateway_pipelined_purchases_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// `users` buying sale `sale` at once on the gateway at `port`, one
/// thread and connection each: each buyer's (status, error code), in order.
pub fn buy_all(port: u16, sale: u64, users: &[String]) -> Vec<(u16, String)> {
    std::thread::scope(|s| {
        let handles: Vec<_> = users
            .iter()
            .map(|u| {
                s.spawn(move || {
                    let r = Client::connect(port).buy(sale, u);
                    (r.status, r.error())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a buyer"))
            .collect()
    })
}

/// Buys until the answer is final: a 503 (Redis busy, or transfers kept
/// moving under the pull) is retried, as a client would.
///
/// A 503 may come after Redis reserved the unit (the answer did not come
/// in time: the documented "unknown, retry"); the retry then gets 409 with
/// the buyer's own reservation id, which is this buyer's win: reported as
/// the 202 it stands for (a machine loaded by the other tests of this file
/// met it once).
pub fn buy_final(c: &mut Client, sale: u64, user: &str) -> (u16, serde_json::Value) {
    let mut retried = false;
    loop {
        let r = c.buy(sale, user);
        match r.status {
            503 => retried = true,
            409 if retried => return (202, r.json()),
            s => return (s, r.json()),
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
