//! Measures what checking one buyer token costs: microseconds per
//! `admission::verifier::Verifier::verify` of a token never seen before (the memory of
//! verified tokens off), HS256, EdDSA, RS256 (2048 bits) and ES256, a hit
//! in that memory, and the
//! parts no code of ours can make cheaper: the bare Ed25519 signature check
//! (`ed25519-dalek`, what jsonwebtoken calls) and the bare HMAC-SHA256 over
//! the same signing input. Single thread, best of 3, wall time on a release
//! build; prints, asserts nothing (a benchmark, not a test):
//! `cargo run --release -p seckill-gateway --example token_cost`
//! (figures in docs/PERFORMANCE.md, "Buyer tokens").

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use seckill_common::token::{generate, Alg, Claims, KeySet, Signer};
use seckill_gateway::admission::verifier::Verifier;
use seckill_gateway::admission::Credentials;
use seckill_gateway::metrics::Metrics;
use std::hint::black_box;
use std::time::Instant;

/// Tokens per measured round (each verified once per round).
const TOKENS: usize = 5_000;

#[path = "bench_keys/mod.rs"]
mod bench_keys;

/// RS256 and ES256 keys as a provider publishes them (the public halves,
/// read by the gateway's own parser) and tokens signed with their private
/// halves, `TOKENS` of each.
fn provider_tokens() -> (KeySet, Vec<Credentials>, Vec<Credentials>) {
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
    (set, rs, es)
}

/// Best of 3 rounds of `f` over `items`, in µs per item.
fn best_us<T>(items: &[T], mut f: impl FnMut(&T)) -> f64 {
    (0..3)
        .map(|_| {
            let start = Instant::now();
            for i in items {
                f(i);
            }
            start.elapsed().as_secs_f64() * 1e6 / items.len() as f64
        })
        .fold(f64::MAX, f64::min)
}

fn tokens(signer: &Signer) -> Vec<Credentials> {
    (0..TOKENS)
        .map(|i| {
            let t = signer
                .mint(&Claims::new(&format!("cost-{i}"), "seckill", 600))
                .unwrap();
            Credentials::Bearer(t)
        })
        .collect()
}

/// The signing input and the signature of a compact JWS.
fn split(c: &Credentials) -> (Vec<u8>, Vec<u8>) {
    let Credentials::Bearer(t) = c else {
        unreachable!()
    };
    let (input, sig) = t.rsplit_once('.').unwrap();
    (
        input.as_bytes().to_vec(),
        URL_SAFE_NO_PAD.decode(sig).unwrap(),
    )
}

fn main() {
    // Minted first: RS256 signing takes seconds, and every token's `iat`
    // must not be ahead of `now` below by more than the leeway.
    let (provider, rs_tokens, es_tokens) = provider_tokens();
    let hs = generate(Alg::Hs256, "h").unwrap();
    let ed = generate(Alg::EdDsa, "e").unwrap();
    let set = KeySet::of(vec![hs.clone(), ed.clone()]);
    let public = seckill_common::token::parse(&set.to_jwks(false)).unwrap();
    let uncached = Verifier::new(&public, "seckill", 30, 24 * 3600, 0);
    let cached = Verifier::new(&public, "seckill", 30, 24 * 3600, 2 * TOKENS);
    let m = Metrics::default();
    let now = seckill_common::now_ms() / 1000;
    let hs_tokens = tokens(&Signer::new(&hs).unwrap());
    let ed_tokens = tokens(&Signer::new(&ed).unwrap());
    for t in hs_tokens.iter() {
        assert!(cached.verify(t, now, &m).is_ok());
    }

    let hs_us = best_us(&hs_tokens, |t| assert!(uncached.verify(t, now, &m).is_ok()));
    let ed_us = best_us(&ed_tokens, |t| assert!(uncached.verify(t, now, &m).is_ok()));
    let hit_us = best_us(&hs_tokens, |t| assert!(cached.verify(t, now, &m).is_ok()));
    let provider = Verifier::new(&provider, "seckill", 30, 24 * 3600, 0);
    let rs_us = best_us(&rs_tokens, |t| assert!(provider.verify(t, now, &m).is_ok()));
    let es_us = best_us(&es_tokens, |t| assert!(provider.verify(t, now, &m).is_ok()));

    let ed_key = ed25519_dalek::VerifyingKey::from_bytes(
        &URL_SAFE_NO_PAD
            .decode(
                public.find("e").unwrap().to_jwk(false)["x"]
                    .as_str()
                    .unwrap(),
            )
            .unwrap()
            .try_into()
            .unwrap(),
    )
    .unwrap();
    let ed_parts: Vec<_> = ed_tokens.iter().map(split).collect();
    let ed_bare = best_us(&ed_parts, |(input, sig)| {
        let sig = ed25519_dalek::Signature::from_slice(sig).unwrap();
        assert!(ed_key.verify_strict(black_box(input), &sig).is_ok());
    });
    let secret = URL_SAFE_NO_PAD
        .decode(hs.to_jwk(false)["k"].as_str().unwrap())
        .unwrap();
    let hs_parts: Vec<_> = hs_tokens.iter().map(split).collect();
    let hs_bare = best_us(&hs_parts, |(input, sig)| {
        use hmac::Mac;
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&secret).unwrap();
        mac.update(black_box(input));
        assert!(mac.verify_slice(sig).is_ok());
    });

    println!("token check, one thread, best of 3, {TOKENS} distinct tokens:");
    println!("  HS256, not in memory          {hs_us:6.2} us (bare HMAC-SHA256 {hs_bare:5.2} us)");
    println!(
        "  EdDSA, not in memory          {ed_us:6.2} us (bare Ed25519 verify {ed_bare:5.2} us)"
    );
    println!("  RS256 (2048), not in memory   {rs_us:6.2} us");
    println!("  ES256, not in memory          {es_us:6.2} us");
    println!("  a token in memory (a retry)   {hit_us:6.2} us");
    println!(
        "  ours (parsing, claims, memory): HS256 {:.2} us, EdDSA {:.2} us",
        hs_us - hs_bare,
        ed_us - ed_bare
    );
}
