//! Owns the crowd: every request of the plan is formatted before the first
//! is sent (so the run measures the server, not the formatting), then one
//! thread per keep-alive connection takes the next one, sends it (at the
//! arrival rate, or as fast as possible), and records every answer; a
//! progress line goes to stderr once a second. The simulator's own CPU
//! during the sending is measured ([`Outcome::cpu_us`]): on a machine it
//! shares with the server, that is CPU the server did not get.

use super::http::{self, Connection};
use super::plan::{self, Hostile, Step};
use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// The answer to one planned request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Index into the plan.
    pub step: usize,
    /// HTTP status; 0 when no answer came (see [`Outcome::errors`]).
    pub status: u16,
    /// From the first byte written to the last byte read, in µs.
    pub latency_us: u32,
    /// When the answer was read, in ms since the first request was sent.
    pub done_ms: u32,
    /// `reservation_id` of a 202 or 409 answer.
    pub reservation_id: Option<String>,
    /// `error` of a 401, 403, 409, 410 or 422 answer (`sale_not_started`,
    /// `sale_ended`, `user_mismatch`, `invalid_token`, `token_expired`,
    /// `already_purchased`, `limit_reached`, `sold_out`,
    /// `not_enough_stock`, `idempotency_key_reused`).
    pub error_code: Option<String>,
    /// `units_left` of a 410 `not_enough_stock` answer.
    pub units_left: Option<u64>,
}

/// Everything the crowd saw.
#[derive(Debug, Default)]
pub struct Outcome {
    /// One record per planned request, in plan order.
    pub records: Vec<Record>,
    /// From the first request sent to the last answer read.
    pub elapsed: Duration,
    /// Unix ms when the first request was sent.
    pub started_at_ms: u64,
    /// The first few transport errors, for the report.
    pub errors: Vec<String>,
    /// TCP connections opened in total.
    pub connects: u64,
    /// Requests sent again because a kept-alive connection had been closed.
    pub resent: u64,
    /// This process's CPU time (user + system, every thread) from the
    /// first request sent to the last answer read, in µs (0 where
    /// `/proc/self/stat` cannot be read).
    pub cpu_us: u64,
}

/// This process's CPU time so far (user + system), in µs, from
/// `/proc/self/stat` (fields 14 and 15, in clock ticks of 10 ms: the
/// kernel's `USER_HZ` on Linux); 0 when it cannot be read.
pub fn process_cpu_us() -> u64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0;
    };
    // After the command name (in parentheses, may hold spaces) come fields
    // 3 onwards; utime and stime are 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |r| r.1);
    rest.split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|x| x.parse::<u64>().ok())
        .sum::<u64>()
        * 10_000
}

/// How to send.
pub struct DriveSpec<'a> {
    /// The gateway.
    pub addr: SocketAddr,
    /// For the `Host` header.
    pub host: &'a str,
    /// The sale bought from.
    pub sale_id: u64,
    /// User ids are `PREFIX-n`.
    pub user_prefix: &'a str,
    /// Connections, one thread each.
    pub connections: u32,
    /// Requests per second in total; 0 = as fast as possible.
    pub rate: f64,
    /// Per-request timeout.
    pub timeout: Duration,
    /// The crowd's tokens, when the gateway verifies them.
    pub tokens: Option<&'a Tokens>,
    /// Each purchase carries its `Idempotency-Key` header
    /// (`plan::idempotency_key`) and, above one unit, its `quantity`.
    pub keys: bool,
    /// The first `lead` requests are sent one at a time on one connection,
    /// each answered before the crowd starts (`plan::lead`: the identity
    /// refusals, asked while the sale is surely not sold out, since a sale
    /// known sold out answers 410 whatever the token).
    pub lead: usize,
}

/// The tokens of a crowd, minted before the first request is sent (so
/// that signing costs the measured run nothing).
pub struct Tokens {
    /// User number -> its token.
    pub users: Vec<String>,
    /// `hostile-token`'s token signed with a random key of the real `kid`.
    pub forged: String,
    /// `hostile-token`'s token, expired two minutes ago.
    pub expired: String,
    /// `hostile-token`'s valid token (for a body naming another user, and
    /// the bodies refused before any token is looked at).
    pub other_user: String,
    /// The token of the user the unknown-sale request names.
    pub unknown_sale: String,
}

impl Tokens {
    /// Tokens for users `PREFIX-0 .. PREFIX-(users-1)` and the hostile
    /// kinds, signed by `key` for `audience`, valid for `ttl_s`.
    ///
    /// Errors: the key cannot sign.
    pub fn mint(
        key: &seckill_common::token::Key,
        audience: &str,
        prefix: &str,
        users: u32,
        ttl_s: u64,
    ) -> Result<Tokens, seckill_common::token::MintError> {
        use seckill_common::token::{generate, Claims, MintError, Signer};
        let signer = Signer::new(key)?;
        let claims = |u: &str| Claims::new(u, audience, ttl_s);
        let users = (0..users)
            .map(|u| signer.mint(&claims(&format!("{prefix}-{u}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let forger = generate(key.alg, &key.kid)
            .map_err(|e| MintError::Sign(e.to_string()))
            .and_then(|k| Signer::new(&k))?;
        let mut expired = claims("hostile-token");
        expired.exp = expired.exp.saturating_sub(ttl_s + 120);
        Ok(Tokens {
            users,
            forged: forger.mint(&claims("hostile-token"))?,
            expired: signer.mint(&expired)?,
            other_user: signer.mint(&claims("hostile-token"))?,
            unknown_sale: signer.mint(&claims("hostile-unknown-sale"))?,
        })
    }

    /// The token step `s` carries, if any.
    fn for_step(&self, s: Step) -> Option<&str> {
        match s {
            Step::Purchase(b) => self.users.get(b.user as usize).map(String::as_str),
            Step::Hostile(Hostile::ForgedToken) => Some(&self.forged),
            Step::Hostile(Hostile::ExpiredToken) => Some(&self.expired),
            Step::Hostile(Hostile::UnknownSale) => Some(&self.unknown_sale),
            Step::Hostile(_) => Some(&self.other_user),
        }
    }
}

#[derive(Default)]
struct Counters {
    done: AtomicU64,
    accepted: AtomicU64,
    already: AtomicU64,
    sold_out: AtomicU64,
    other: AtomicU64,
    failed: AtomicU64,
}

/// The bytes of step `s`.
fn request_bytes(spec: &DriveSpec<'_>, s: Step) -> Vec<u8> {
    let token = spec.tokens.and_then(|t| t.for_step(s));
    match s {
        Step::Purchase(b) => {
            let body = purchase_body(spec.user_prefix, b);
            let key = spec.keys.then(|| plan::idempotency_key(b.key));
            http::post_json_keyed(
                spec.host,
                &format!("/v1/sales/{}/purchases", spec.sale_id),
                body.as_bytes(),
                token,
                key.as_deref(),
            )
        }
        Step::Hostile(h) => {
            // With keys, a key of their own: each is refused for what it
            // is, not for a missing header.
            let (path, body) = h.path_and_body(spec.sale_id);
            let key = spec.keys.then_some("hostile");
            http::post_json_keyed(spec.host, &path, &body, token, key)
        }
    }
}

/// The body of purchase `b`: `{"user_id":"PREFIX-n"}`, with `"quantity":N`
/// above one unit (one unit is the default: the body stays today's).
pub fn purchase_body(prefix: &str, b: plan::Buy) -> String {
    match b.quantity {
        0 | 1 => format!(r#"{{"user_id":"{prefix}-{}"}}"#, b.user),
        q => format!(r#"{{"user_id":"{prefix}-{}","quantity":{q}}}"#, b.user),
    }
}

/// The bytes of every step of `plan`, in plan order: formatted before the
/// run, so that [`run`] only sends (about 100 bytes each without a token,
/// 300 with one: 60 MB for 200,000 buyers with tokens).
pub fn format_all(spec: &DriveSpec<'_>, plan: &[Step]) -> Vec<Vec<u8>> {
    plan.iter().map(|&s| request_bytes(spec, s)).collect()
}

/// Sends every request of `requests` (from [`format_all`]; records name
/// them by their index, the plan's step) and returns what came back. Never
/// fails: a request without an answer is recorded with status 0.
pub fn run(spec: &DriveSpec<'_>, requests: &[Vec<u8>]) -> Outcome {
    let next = AtomicUsize::new(0);
    let counters = Counters::default();
    let finished = Arc::new(AtomicBool::new(false));
    let cpu_before = process_cpu_us();
    let start = Instant::now();
    let started_at_ms = seckill_common::now_ms();
    let total = requests.len() as u64;
    let mut outcome = Outcome {
        started_at_ms,
        ..Outcome::default()
    };
    let lead_done = AtomicBool::new(spec.lead == 0);
    thread::scope(|scope| {
        let progress = scope.spawn(|| progress_loop(&counters, &finished, total, start));
        let mut handles = Vec::new();
        let (next, counters, lead_done) = (&next, &counters, &lead_done);
        for c in 0..spec.connections {
            handles.push(scope.spawn(move || {
                let mut con = Connection::new(spec.addr, spec.timeout);
                let mut recs = Vec::new();
                let mut errs = Vec::new();
                loop {
                    while c != 0 && !lead_done.load(Ordering::Acquire) {
                        thread::sleep(Duration::from_millis(1));
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(req) = requests.get(i) else { break };
                    if spec.rate > 0.0 {
                        let due = start + Duration::from_secs_f64(i as f64 / spec.rate);
                        let now = Instant::now();
                        if due > now {
                            thread::sleep(due - now);
                        }
                    }
                    let t0 = Instant::now();
                    let answer = con.send(req);
                    let latency_us = t0.elapsed().as_micros().min(u32::MAX as u128) as u32;
                    let done_ms = start.elapsed().as_millis().min(u32::MAX as u128) as u32;
                    let rec = record(i, answer, latency_us, done_ms, counters, &mut errs);
                    recs.push(rec);
                    counters.done.fetch_add(1, Ordering::Relaxed);
                    if i + 1 >= spec.lead {
                        lead_done.store(true, Ordering::Release);
                    }
                }
                (recs, errs, con.connects, con.resent)
            }));
        }
        for h in handles {
            if let Ok((recs, errs, connects, resent)) = h.join() {
                outcome.records.extend(recs);
                if outcome.errors.len() < 10 {
                    outcome.errors.extend(errs);
                }
                outcome.connects += connects;
                outcome.resent += resent;
            }
        }
        outcome.elapsed = start.elapsed();
        outcome.cpu_us = process_cpu_us().saturating_sub(cpu_before);
        finished.store(true, Ordering::SeqCst);
        let _ = progress.join();
    });
    outcome.records.sort_by_key(|r| r.step);
    outcome
}

/// The record of request `i` from its answer (or the error that left it
/// without one), counted in `counters`; the first errors are kept in `errs`.
fn record(
    i: usize,
    answer: Result<http::Response, http::HttpError>,
    latency_us: u32,
    done_ms: u32,
    counters: &Counters,
    errs: &mut Vec<String>,
) -> Record {
    match answer {
        Ok(r) => {
            let c = match r.status {
                202 => &counters.accepted,
                409 => &counters.already,
                410 => &counters.sold_out,
                _ => &counters.other,
            };
            c.fetch_add(1, Ordering::Relaxed);
            let rid = matches!(r.status, 202 | 409)
                .then(|| http::json_str(&r.body, "reservation_id"))
                .flatten();
            let code = matches!(r.status, 401 | 403 | 409 | 410 | 422)
                .then(|| http::json_str(&r.body, "error"))
                .flatten();
            let units_left = (r.status == 410)
                .then(|| http::json_u64(&r.body, "units_left"))
                .flatten();
            Record {
                step: i,
                status: r.status,
                latency_us,
                done_ms,
                reservation_id: rid,
                error_code: code,
                units_left,
            }
        }
        Err(e) => {
            counters.failed.fetch_add(1, Ordering::Relaxed);
            if errs.len() < 5 {
                errs.push(format!("request {i}: {e}"));
            }
            Record {
                step: i,
                status: 0,
                latency_us,
                done_ms,
                reservation_id: None,
                error_code: None,
                units_left: None,
            }
        }
    }
}

/// Prints `sent/total, answers by kind, req/s` once a second (in place on a
/// terminal, one line per 5 s otherwise), and a last line at the end.
fn progress_loop(c: &Counters, finished: &AtomicBool, total: u64, start: Instant) {
    let tty = std::io::stderr().is_terminal();
    let every = if tty {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(5)
    };
    let mut last = Instant::now();
    loop {
        let done = finished.load(Ordering::SeqCst);
        if done || last.elapsed() >= every {
            last = Instant::now();
            let n = c.done.load(Ordering::Relaxed);
            let secs = start.elapsed().as_secs_f64().max(1e-3);
            let line = format!(
                "load: {n}/{total} sent | 202 {} | 409 {} | 410 {} | other {} | no answer {} | {:.0} req/s",
                c.accepted.load(Ordering::Relaxed),
                c.already.load(Ordering::Relaxed),
                c.sold_out.load(Ordering::Relaxed),
                c.other.load(Ordering::Relaxed),
                c.failed.load(Ordering::Relaxed),
                n as f64 / secs
            );
            let mut err = std::io::stderr().lock();
            if tty {
                let _ = write!(err, "\r{line}\x1b[K");
                if done {
                    let _ = writeln!(err);
                }
            } else {
                let _ = writeln!(err, "{line}");
            }
        }
        if done {
            return;
        }
        thread::sleep(Duration::from_millis(50));
    }
}
