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

/// A 2048-bit RSA private key (PKCS#1 DER, base64) made for this benchmark
/// only: it signs the RS256 tokens an identity provider would.
const BENCH_RSA_PKCS1_B64: &str = concat!(
    "MIIEogIBAAKCAQEAmFmx1uYH4YC4ybNzVyk5Opxt+EYs3WjVcOU26TV1nPcbV60BumFtzQzPVOoFOB2fWLNfOOBbjA",
    "IfTDn5dBav/FSO+Kc0qUCVSAIxmrp7pOCdWvojgQOvAcF+1qHV27QIKf284iYGmlwptgqyv18xY2yPWLETmmiUJtK9",
    "rkRkXkhJdAPgSCCWMIzeRh7Ks/XDPWiIotp0b1bpXq7ce/cnWieqxF78Th/NXicTL39EKPhsSmfmINZ4TWyxk+fi4Q",
    "RPtYrCVpFyC+qSrohUoRlM0J6cXdeUm4bzOdPlzDBQh9LolE1j7aq/7s8/aTD5EZj1Qhld7zZmhxaA8tCPPKN6lQID",
    "AQABAoIBADOZWWK76Rpmou9pkFyKcUAZICPQ/LwGmBfTAjyNJycBCGkzBt1Nx0cGGiib1CWz3rbHla4pSshKJbiHAC",
    "Zh0rwHFZ9A3lSes5C+cXeCxoLKsnDQPHsjOMBC/UcLa+er+4HhVvpPP7hDE7t8txqazprqd0hmPQn0do0JnkWqE0Zc",
    "9hFZFwVV/3FDNBV5ojivPyBQfK1/3/Xgk43pYTKZx8e3iu5UAwIvU72jWaSBTAd5OFvyQ/j3uRxbX9I1SdpYsMgPkl",
    "g7TpvXotT3rLIB/W+yaLtGs9MJGGqBS4XCdLs5MXtmveU9tnLZTchhvNfOlymBr87SN+zRbO76LK3/XWcCgYEA1h2J",
    "c8wv6KmIkXOotyeuBQ0HcgxiKapbb9HKt/GSj0lcDVjOE9DG7Z8G+ngkuZLhs5e6unTG6LUoVH4zCV5N3xU1mQJnyD",
    "qyVSHS0e8L7MFj5X1YgK7MFZdXq9dVS/NUeuyz0A7gBy1j15dvyhrZnNKTYFkBnZpkI7AxPC0N7W8CgYEAticXdSWD",
    "yFJ4G7SNgQw1Yk7PBjL0Kp4KH3mbsdpq1zdsL7AHVxqN7Cmigy6nxK04xo8ijtbEOt02rV+Nn8ABko30ufcKbVcl3C",
    "qnBFnw6taP4KAiowoQ4c2H8yEpQSU3F5pwEkmbVDf3yzG/F+QQbleU+AEnln6eT4fp2eUxXjsCgYBIi7dvqaYt4Ysp",
    "JRPsAqC+i1yTcsirr1HNwDo8OrhanhN3XjhslFdiWXhm0uA2lCKu0+DrnfdrDz476opmSTJ/PFNtpVf+ioyztYMVqD",
    "XVIO0061RaPV9ejWmiCpKW6joccCi4fOHA7MsgV+oDgzdqIBrZES8v9Air4t27stQ+NwKBgBUIzpyoiF9JprUMVIri",
    "bge8Mgv1Nlz1gxW/ZUtUfaH8tHGNUkustVbgN/QOHzGHD1dekA8OnfpuMTI0JpacBZJ28hvHe1zFA4o5IrBN8pQr0t",
    "GNrHJHZ0usAFcDLVBoi8QeAXMbLOS80dCVHgwUOhGD65/4AipO1Nk6SLbw0JKhAoGAfDkYGdfpzYrqTdzTPJ/MOdT6",
    "gV8WoiJJVRmEGRsDccQKI29OeY900Vdi39G0U0jYgjKRYSTzzqYbKtd5ONsBsFKyyoZAattenImaUfAebxwW4rg2MQ",
    "QWIrq81MVHLIcpLTQc7cosz07nWxUhO0zj3m6Gh6wtuwW2BZFtdbHX1YQ=",
);

/// RS256 and ES256 keys as a provider publishes them (the public halves,
/// read by the gateway's own parser) and tokens signed with their private
/// halves, `TOKENS` of each.
fn provider_tokens() -> (KeySet, Vec<Credentials>, Vec<Credentials>) {
    use base64::engine::general_purpose::STANDARD;
    use rsa::pkcs1::DecodeRsaPrivateKey;
    use rsa::traits::PublicKeyParts;
    let der = STANDARD.decode(BENCH_RSA_PKCS1_B64).unwrap();
    let rsa_key = rsa::RsaPrivateKey::from_pkcs1_der(&der).unwrap();
    let ec_key = p256::ecdsa::SigningKey::from_slice(&[7u8; 32]).unwrap();
    let point = ec_key.verifying_key().to_encoded_point(false);
    let b = |v: &[u8]| URL_SAFE_NO_PAD.encode(v);
    let jwks = serde_json::json!({"keys": [
        {"kty": "RSA", "kid": "r", "alg": "RS256", "n": b(&rsa_key.n().to_bytes_be()),
         "e": b(&rsa_key.e().to_bytes_be())},
        {"kty": "EC", "kid": "p", "crv": "P-256", "alg": "ES256",
         "x": b(point.x().unwrap()), "y": b(point.y().unwrap())},
    ]});
    let set = seckill_common::token::parse(&jwks.to_string()).unwrap();
    let ec_der = {
        use p256::pkcs8::EncodePrivateKey;
        ec_key.to_pkcs8_der().unwrap().as_bytes().to_vec()
    };
    let mint = |alg, kid: &str, key: &jsonwebtoken::EncodingKey| -> Vec<Credentials> {
        let mut header = jsonwebtoken::Header::new(alg);
        header.kid = Some(kid.to_string());
        (0..TOKENS)
            .map(|i| {
                let claims = Claims::new(&format!("cost-{i}"), "seckill", 600);
                Credentials::Bearer(jsonwebtoken::encode(&header, &claims, key).unwrap())
            })
            .collect()
    };
    let rs = mint(
        jsonwebtoken::Algorithm::RS256,
        "r",
        &jsonwebtoken::EncodingKey::from_rsa_der(&der),
    );
    let es = mint(
        jsonwebtoken::Algorithm::ES256,
        "p",
        &jsonwebtoken::EncodingKey::from_ec_der(&ec_der),
    );
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
    let (provider, rs_tokens, es_tokens) = provider_tokens();
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
