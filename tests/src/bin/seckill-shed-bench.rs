//! `seckill-shed-bench`: the load generator of `scripts/bench-shed.sh`.
//! N keep-alive connections (one thread each) buy as fast as they are
//! answered, each purchase a distinct user; a shed purchase (503
//! `overloaded`) is sent again at once, so the offered load stays N in
//! flight. Prints one line: `admitted_per_s p50_ms p99_ms shed_share
//! other` over the admitted (202) purchases and every answer. With
//! `BENCH_PACE_MS=P` each connection instead waits a random 0-2P ms (mean
//! P) before each purchase, its first included: N connections then offer
//! about N × 1000 / P purchases a second whatever the answers' latency (the
//! latency of many open, mostly idle connections; wrk's `delay()` cannot
//! measure it: its timers are a list it scans on every event, which with
//! 500 connections a thread delays the responses it times). For
//! benchmarks only; exit 2 when it cannot connect.
//!
//! Usage: `seckill-shed-bench ADDR SALE CONNECTIONS SECONDS PREFIX`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Default)]
struct Tally {
    admitted_us: Vec<u32>,
    shed: u64,
    other: u64,
}

/// Reads one response; its status and whether the body names `overloaded`.
fn read_answer(r: &mut BufReader<TcpStream>) -> Option<(u16, bool)> {
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let status: u16 = line.split(' ').nth(1)?.parse().ok()?;
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).ok()? == 0 {
            return None;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    Some((status, body.windows(10).any(|w| w == b"overloaded")))
}

fn client(addr: String, sale: u64, id: usize, secs: u64, prefix: String) -> Option<Tally> {
    let s = TcpStream::connect(&addr).ok()?;
    s.set_nodelay(true).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    let mut r = BufReader::new(s);
    let mut t = Tally::default();
    let end = Instant::now() + Duration::from_secs(secs);
    let backoff = Duration::from_millis(
        std::env::var("BENCH_SHED_BACKOFF_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
    );
    let pace_ms: u64 = std::env::var("BENCH_PACE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // xorshift64, seeded per connection: the waits need no quality.
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ ((id as u64 + 1) << 17);
    let mut n = 0u64;
    while Instant::now() < end {
        n += 1;
        if pace_ms > 0 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            std::thread::sleep(Duration::from_micros(rng % (2 * pace_ms * 1000 + 1)));
        }
        let body = format!(r#"{{"user_id":"{prefix}-{id}-{n}"}}"#);
        let req = format!(
            "POST /v1/sales/{sale}/purchases HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let t0 = Instant::now();
        r.get_mut().write_all(req.as_bytes()).ok()?;
        match read_answer(&mut r)? {
            (202, _) => t
                .admitted_us
                .push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32),
            (503, true) => {
                t.shed += 1;
                std::thread::sleep(backoff);
            }
            _ => t.other += 1,
        }
    }
    Some(t)
}

fn main() -> ExitCode {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let [addr, sale, conns, secs, prefix] = a.as_slice() else {
        eprintln!("usage: seckill-shed-bench ADDR SALE CONNECTIONS SECONDS PREFIX");
        return ExitCode::from(64);
    };
    let (Ok(sale), Ok(conns), Ok(secs)) = (sale.parse(), conns.parse(), secs.parse()) else {
        eprintln!("SALE, CONNECTIONS and SECONDS are numbers");
        return ExitCode::from(64);
    };
    let threads: Vec<_> = (0..conns)
        .map(|i| {
            let (addr, prefix) = (addr.clone(), prefix.clone());
            std::thread::spawn(move || client(addr, sale, i, secs, prefix))
        })
        .collect();
    let mut all = Tally::default();
    for t in threads {
        match t.join() {
            Ok(Some(t)) => {
                all.admitted_us.extend(t.admitted_us);
                all.shed += t.shed;
                all.other += t.other;
            }
            _ => {
                eprintln!("a connection failed");
                return ExitCode::from(2);
            }
        }
    }
    all.admitted_us.sort_unstable();
    let pick = |q: f64| {
        let v = &all.admitted_us;
        v.get(((v.len() as f64 * q) as usize).min(v.len().saturating_sub(1)))
            .map_or(0.0, |&us| us as f64 / 1000.0)
    };
    let admitted = all.admitted_us.len() as u64;
    let answers = admitted + all.shed + all.other;
    println!(
        "{:.0} {:.2} {:.2} {:.3} {}",
        admitted as f64 / secs as f64,
        pick(0.50),
        pick(0.99),
        all.shed as f64 / answers.max(1) as f64,
        all.other
    );
    ExitCode::SUCCESS
}
