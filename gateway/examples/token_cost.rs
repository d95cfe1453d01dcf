//! Measures what checking one buyer token costs, beside what the machine's
//! OpenSSL pays for the same signature: per algorithm (HS256, EdDSA, RS256
//! with a 2048-bit key, ES256), microseconds of CPU per
//! `admission::verifier::Verifier::verify` of a token never seen before
//! (the memory of verified tokens off), per signature check alone
//! (`admission::signature::SignatureKey::signs`, what `verify` calls), and
//! per `verify` of a token in that memory (a retry); and for EdDSA, RS256
//! and ES256 `openssl speed -seconds S ed25519|rsa2048|ecdsap256`'s verify,
//! run between our measures (interleaved, ROUNDS rounds), with the ratios.
//!
//! CPU time of the measuring thread (`/proc/thread-self/schedstat`), as
//! `openssl speed` divides by its own user CPU time: on a shared, busy
//! machine wall time would count the other processes. Best of 3 passes
//! of at least 0.1 s of CPU over 2,000 distinct tokens per figure.
//! Prints, asserts nothing (a benchmark, not a test):
//! `TOKEN_COST_ROUNDS=3 TOKEN_COST_OPENSSL_SECONDS=2 cargo run --release -p seckill-gateway --example token_cost`
//! (figures in docs/PERFORMANCE.md, "Buyer tokens").

use seckill_common::token::{generate, Alg, Claims, KeySet, Signer};
use seckill_gateway::admission::signature::SignatureKey;
use seckill_gateway::admission::verifier::Verifier;
use seckill_gateway::admission::Credentials;
use seckill_gateway::metrics::Metrics;
use std::process::Command;

/// Tokens per measured pass (each verified once per pass).
const TOKENS: usize = 2_000;

#[path = "bench_keys/mod.rs"]
mod bench_keys;

/// CPU seconds this thread has run (the scheduler's count, in ns).
fn thread_cpu_s() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |ns| ns / 1e9)
}

/// CPU time of one pass at least: the scheduler adds a running thread's
/// time at its ticks (4 ms at most apart), so a pass of 0.1 s is within
/// 4 %.
const PASS_CPU_S: f64 = 0.1;

/// Best of 3 passes of `f` over `items` (each pass going over them again
/// until it took [`PASS_CPU_S`]), in µs of CPU per item.
fn best_us<T>(items: &[T], mut f: impl FnMut(&T)) -> f64 {
    (0..3)
        .map(|_| {
            let start = thread_cpu_s();
            let mut done = 0usize;
            while done == 0 || thread_cpu_s() - start < PASS_CPU_S {
                for i in items {
                    f(i);
                }
                done += items.len();
            }
            (thread_cpu_s() - start) * 1e6 / done as f64
        })
        .fold(f64::MAX, f64::min)
}

/// `openssl speed`'s µs per verify of `what` (`rsa2048`, `ecdsap256`,
/// `ed25519`): the last figure (verify/s) of the line under the header
/// naming `verify/s`. `None` without openssl or with another output.
fn openssl_verify_us(what: &str, seconds: &str) -> Option<f64> {
    let out = Command::new("openssl")
        .args(["speed", "-seconds", seconds, what])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    lines.find(|l| l.contains("verify/s"))?;
    let per_s: f64 = lines.next()?.split_whitespace().last()?.parse().ok()?;
    (per_s > 0.0).then(|| 1e6 / per_s)
}

/// The tokens of one algorithm and the key set that verifies them.
struct Case {
    alg: Alg,
    /// `openssl speed`'s name of the same signature, if any.
    openssl: Option<&'static str>,
    keys: KeySet,
    kid: &'static str,
    tokens: Vec<Credentials>,
}

fn own_case(alg: Alg, kid: &'static str, openssl: Option<&'static str>) -> Case {
    let key = generate(alg, kid).unwrap();
    let signer = Signer::new(&key).unwrap();
    let tokens = (0..TOKENS)
        .map(|i| {
            let t = signer
                .mint(&Claims::new(&format!("cost-{i}"), "seckill", 600))
                .unwrap();
            Credentials::Bearer(t)
        })
        .collect();
    let public = seckill_common::token::parse(&KeySet::of(vec![key]).to_jwks(false)).unwrap();
    Case {
        alg,
        openssl,
        keys: public,
        kid,
        tokens,
    }
}

/// RS256 and ES256 as a provider signs them (the public halves read by
/// the gateway's own parser).
fn provider_cases() -> [Case; 2] {
    let p = bench_keys::provider();
    let set = seckill_common::token::parse(&p.jwks.to_string()).unwrap();
    let mint = |alg, kid, key| -> Vec<Credentials> {
        let subs = (0..TOKENS).map(|i| format!("cost-{i}"));
        bench_keys::mint(alg, kid, key, subs, 600)
            .into_iter()
            .map(Credentials::Bearer)
            .collect()
    };
    let rs = mint(jsonwebtoken::Algorithm::RS256, bench_keys::RSA_KID, &p.rsa);
    let es = mint(jsonwebtoken::Algorithm::ES256, bench_keys::EC_KID, &p.ec);
    [
        Case {
            alg: Alg::Rs256,
            openssl: Some("rsa2048"),
            keys: set.clone(),
            kid: bench_keys::RSA_KID,
            tokens: rs,
        },
        Case {
            alg: Alg::Es256,
            openssl: Some("ecdsap256"),
            keys: set,
            kid: bench_keys::EC_KID,
            tokens: es,
        },
    ]
}

/// One round's figures of a case: (check, signature alone, in memory,
/// openssl), µs.
fn measure(case: &Case, seconds: &str, now: u64, m: &Metrics) -> [Option<f64>; 4] {
    let openssl = case.openssl.and_then(|w| openssl_verify_us(w, seconds));
    let uncached = Verifier::new(&case.keys, "seckill", 30, 24 * 3600, 0);
    let cached = Verifier::new(&case.keys, "seckill", 30, 24 * 3600, 2 * TOKENS);
    for t in &case.tokens {
        assert!(cached.verify(t, now, m).is_ok());
    }
    let sig = SignatureKey::of(case.keys.find(case.kid).unwrap()).unwrap();
    let check = best_us(&case.tokens, |t| {
        assert!(uncached.verify(t, now, m).is_ok())
    });
    let bare = best_us(&case.tokens, |t| {
        let Credentials::Bearer(t) = t else {
            unreachable!()
        };
        assert!(sig.signs(t));
    });
    let hit = best_us(&case.tokens, |t| assert!(cached.verify(t, now, m).is_ok()));
    [Some(check), Some(bare), Some(hit), openssl]
}

fn main() {
    let rounds: usize = std::env::var("TOKEN_COST_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let seconds = std::env::var("TOKEN_COST_OPENSSL_SECONDS").unwrap_or_else(|_| "2".into());
    // Minted first: every token's `iat` must not be ahead of `now`.
    let [rs, es] = provider_cases();
    let cases = [
        own_case(Alg::Hs256, "h", None),
        own_case(Alg::EdDsa, "e", Some("ed25519")),
        rs,
        es,
    ];
    let m = Metrics::default();
    let now = seckill_common::now_ms() / 1000;
    let load = || std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "token check, µs of CPU per token, best of 3 passes (>= {PASS_CPU_S} s) over {TOKENS} \
         distinct tokens, {rounds} rounds, openssl speed -seconds {seconds} between (load at start: {})",
        load().trim()
    );
    println!(
        "  {:<6} {:>5} {:>10} {:>10} {:>10} {:>10} {:>14} {:>12}",
        "alg",
        "round",
        "check",
        "signature",
        "in memory",
        "openssl",
        "check/openssl",
        "sig/openssl"
    );
    let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => format!("{:.2}", a / b),
        _ => "-".to_string(),
    };
    for round in 1..=rounds {
        for case in &cases {
            let [check, bare, hit, openssl] = measure(case, &seconds, now, &m);
            println!(
                "  {:<6} {:>5} {:>10} {:>10} {:>10} {:>10} {:>14} {:>12}",
                case.alg.as_str(),
                round,
                fmt(check),
                fmt(bare),
                fmt(hit),
                fmt(openssl),
                ratio(check, openssl),
                ratio(bare, openssl)
            );
        }
    }
    println!("(load at end: {})", load().trim());
}
