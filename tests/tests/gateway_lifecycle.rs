//! Specifies the gateway's life: Redis stopped and started again under it
//! (503 with `Retry-After` meanwhile, no restart needed), SIGTERM under load
//! (exit 0 within 5 s, every 202 backed by its flow record and queue
//! message), the exit code 2 for bad configuration or a taken port, and
//! the start's log naming the port it got for `SECKILL_LISTEN` port 0.

use crate::support::gateway as gateway_support;

use gateway_support::*;
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_tests::{wait_until, RedisServer};
use std::collections::HashSet;
use std::net::TcpListener;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn redis_down_then_back(env: &[(&str, &str)]) {
    let mut redis = RedisServer::start();
    open_sale(&redis, 1, 10);
    let g = Gateway::start(&redis, env);
    assert_eq!(buy(g.port, 1, "before").status, 202);
    redis.stop();

    let r = buy(g.port, 1, "while-down");
    assert_eq!((r.status, r.error()), (503, "unavailable".into()), "{r:?}");
    assert_eq!(r.header("Retry-After"), Some("1"));
    let ready = get(g.port, "/readyz");
    assert_eq!(ready.status, 503);
    assert_eq!(ready.header("Retry-After"), Some("1"));
    assert_eq!(get(g.port, "/v1/sales/1").status, 503);
    assert_eq!(get(g.port, "/v1/sales/1/purchases/before").status, 503);
    assert_eq!(get(g.port, "/healthz").status, 200);

    redis.restart(); // AOF: the sale and the first purchase survive
    wait_until(
        Duration::from_secs(5),
        "a purchase after Redis is back",
        || buy(g.port, 1, "after").status == 202,
    );
    assert_eq!(get(g.port, "/readyz").status, 200);
    assert_eq!(buy(g.port, 1, "before").status, 409);
    assert_eq!(counts(&redis, 1), (8, 2, 2));
    let m = get(g.port, "/metrics").body;
    assert!(!m.contains("seckill_gateway_redis_errors_total 0\n"), "{m}");
}

#[test]
fn redis_stopped_gives_503_and_redis_back_serves_without_a_restart() {
    redis_down_then_back(&[]);
}

#[test]
fn redis_restart_is_survived_with_one_connection_per_handler_too() {
    redis_down_then_back(&[("SECKILL_GATEWAY_REDIS_THREADS", "0")]);
}

#[test]
fn a_flushed_script_cache_is_reloaded_inside_the_pipeline() {
    let redis = RedisServer::start();
    open_sale(&redis, 2, 10);
    let g = Gateway::start(&redis, &[]);
    assert_eq!(buy(g.port, 2, "a").status, 202);
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut redis.con())
        .unwrap();
    assert_eq!(buy(g.port, 2, "b").status, 202);
    assert_eq!(buy(g.port, 2, "a").status, 409);
    assert_eq!(counts(&redis, 2), (8, 2, 2));
}

#[test]
fn sigterm_under_load_exits_0_within_5s_and_every_202_has_its_records() {
    let redis = RedisServer::start();
    open_sale(&redis, 3, 100_000);
    // The default thread count (2 x cores), as systemd would start it.
    let mut g = Gateway::start(&redis, &[("SECKILL_GATEWAY_THREADS", "0")]);
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..16)
        .map(|t| {
            let (port, stop) = (g.port, stop.clone());
            std::thread::spawn(move || {
                let mut reserved = Vec::new();
                let mut i = 0;
                while !stop.load(Ordering::SeqCst) {
                    i += 1;
                    // A new connection per purchase: a closed one ends the loop.
                    let body = format!(r#"{{"user_id":"t{t}-{i}"}}"#);
                    let req = format_request("POST", "/v1/sales/3/purchases", Some(&body), true);
                    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
                        break;
                    };
                    use std::io::Write;
                    if s.write_all(req.as_bytes()).is_err() {
                        break;
                    }
                    match read_resp(&mut std::io::BufReader::new(s)) {
                        Some(r) if r.status == 202 => {
                            reserved.push(r.json()["reservation_id"].as_str().unwrap().to_string())
                        }
                        Some(r) => assert_eq!(r.status, 503, "{r:?}"),
                        None => {} // closed by the stop
                    }
                }
                reserved
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(700));
    let status = g.terminate(Duration::from_secs(5));
    stop.store(true, Ordering::SeqCst);
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "exit within 5 s with 0"
    );
    let reserved: HashSet<String> = clients
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    assert!(!reserved.is_empty());

    let mut con = redis.con();
    let k = SaleKeys::new(3);
    let flows: HashSet<String> = con.hkeys(k.flow()).unwrap();
    let queued: Vec<String> = con.lrange(k.queue(), 0, -1).unwrap();
    let queued: HashSet<String> = queued
        .iter()
        .map(|m| {
            seckill_common::message::OrderMessage::parse(m.as_bytes())
                .unwrap()
                .reservation_id
        })
        .collect();
    assert!(reserved.is_subset(&flows), "a 202 without its flow record");
    assert!(
        reserved.is_subset(&queued),
        "a 202 without its queue message"
    );
    // No unit taken without its records either.
    let stock: i64 = con.get(k.stock()).unwrap();
    assert_eq!(100_000 - stock, flows.len() as i64);
    assert_eq!(flows, queued);
}

#[test]
fn bad_configuration_and_a_taken_port_exit_with_2() {
    let run = |env: &[(&str, String)]| {
        let mut c = seckill_tests::command("seckill-gateway");
        c.env("RUST_LOG", "off")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (k, v) in env {
            c.env(k, v);
        }
        c.status().unwrap().code()
    };
    assert_eq!(run(&[("SECKILL_LISTEN", "nowhere".into())]), Some(2));
    assert_eq!(run(&[("SECKILL_BODY_LIMIT", "1".into())]), Some(2));
    assert_eq!(
        run(&[("SECKILL_GATEWAY_WRITE_TIMEOUT", "5".into())]),
        Some(2)
    );
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    assert_eq!(run(&[("SECKILL_LISTEN", addr)]), Some(2));
}

/// `SECKILL_LISTEN=127.0.0.1:0`: the start's log names the port the system
/// chose, and the gateway answers there.
#[test]
fn a_gateway_on_port_0_logs_the_port_it_got() {
    use std::io::BufRead;
    let redis = RedisServer::start();
    let mut child = seckill_tests::command("seckill-gateway")
        .env("SECKILL_LISTEN", "127.0.0.1:0")
        .env("SECKILL_REDIS_URL", redis.url())
        .env("SECKILL_GATEWAY_THREADS", "2")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start seckill-gateway");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = std::io::BufReader::new(stderr).lines();
    let line = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.contains("seckill-gateway listening on "))
        .expect("the listening line");
    let addr = line
        .split("listening on ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_default()
        .to_string();
    let port: u16 = addr
        .strip_prefix("127.0.0.1:")
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    assert_ne!(port, 0, "{line}");
    assert_eq!(get(port, "/healthz").status, 200, "{line}");
    signal(child.id(), "TERM");
    std::thread::spawn(move || lines.for_each(drop));
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(0));
}
