//! Writes the benchmark's provider keys and tokens for `scripts/bench-gateway.sh`:
//! the public JWKS of a fixed RSA and P-256 key (a gateway's key file, as
//! an identity provider publishes it) and COUNT tokens signed RS256 or
//! ES256, one per line on stdout, each for a distinct buyer
//! (`PREFIX-0`, `PREFIX-1`, ...), valid for an hour. Signs on every core:
//! an RS256 signature costs a millisecond or more here, and the bench wants
//! a distinct token per request.
//!
//! `cargo run --release -p seckill-gateway --example provider_tokens -- RS256|ES256 COUNT PREFIX KEYFILE`

#[path = "bench_keys/mod.rs"]
mod bench_keys;

use std::io::Write;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [alg, count, prefix, keyfile] = args.as_slice() else {
        eprintln!("usage: provider_tokens RS256|ES256 COUNT PREFIX KEYFILE");
        std::process::exit(64);
    };
    let count: usize = count.parse().expect("COUNT: a number");
    let p = bench_keys::provider();
    std::fs::write(keyfile, p.jwks.to_string()).expect("write KEYFILE");
    let (alg, kid, key) = match alg.as_str() {
        "RS256" => (jsonwebtoken::Algorithm::RS256, bench_keys::RSA_KID, &p.rsa),
        "ES256" => (jsonwebtoken::Algorithm::ES256, bench_keys::EC_KID, &p.ec),
        other => {
            eprintln!("provider_tokens: alg {other:?}: RS256 or ES256");
            std::process::exit(64);
        }
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = count.div_ceil(threads);
    let parts: Vec<Vec<String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let range = (t * per).min(count)..((t + 1) * per).min(count);
                s.spawn(move || {
                    let subs = range.map(|i| format!("{prefix}-{i}"));
                    bench_keys::mint(alg, kid, key, subs, 3600)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for t in parts.iter().flatten() {
        writeln!(out, "{t}").expect("write stdout");
    }
}
