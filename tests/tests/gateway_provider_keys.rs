//! Specifies buyer tokens from a shop's identity provider against the real
//! gateway and a private Redis: a JWKS shaped like a provider's published
//! keys (RSA signing keys with certificate chains, an encryption key, an EC
//! key) is used as it is; tokens minted by PyJWT, an independent JWT
//! library, with RS256 and ES256 buy; its forgeries (a wrong key, `alg`
//! swapped to HS256 with the public key as the secret, `none`, a wrong
//! issuer, the encryption key, the forger's keys by `jku`/`x5u`, a `crit`
//! extension, an ES256 signature in DER or all zero, `alg` in lower case)
//! are 401 and change nothing; SIGHUP reloads
//! the key file, forgetting tokens of a key that left it, and an unusable
//! file keeps the keys in use.
//!
//! PyJWT runs from `SECKILL_PYJWT_PYTHON` (a python with `jwt` and
//! `cryptography`, set by `scripts/test.sh`, `ensure_pyjwt`).

use crate::support::gateway as gateway_support;

use gateway_support::*;
use seckill_tests::{wait_until, RedisServer, TempDir};
use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

const SALE: u64 = 31;
const ISSUER: &str = "https://login.shop.example/realms/shop";

/// The provider's files and PyJWT's tokens, written into `dir`.
fn provider(dir: &TempDir) -> HashMap<String, String> {
    let python = std::env::var("SECKILL_PYJWT_PYTHON").unwrap_or_else(|_| {
        panic!(
            "SECKILL_PYJWT_PYTHON is not set: run ./scripts/test.sh (ensure_pyjwt installs \
             PyJWT in target/venv-pyjwt), or set it to a python with pyjwt[crypto]"
        )
    });
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/py/provider_tokens.py");
    let out = Command::new(python)
        .arg(script)
        .arg(dir.path())
        .arg("seckill")
        .arg(ISSUER)
        .output()
        .expect("run PyJWT");
    assert!(
        out.status.success(),
        "provider_tokens.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(dir.path().join("tokens.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn buy_as(port: u16, token: &str) -> Resp {
    let rq = format!(
        "POST /v1/sales/{SALE}/purchases HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Authorization: Bearer {token}\r\nContent-Length: 2\r\n\r\n{{}}"
    );
    raw(port, rq.as_bytes()).expect("an answer")
}

fn path(dir: &TempDir, name: &str) -> String {
    dir.path().join(name).display().to_string()
}

#[test]
fn a_providers_published_keys_verify_its_tokens_and_refuse_every_forgery() {
    let redis = RedisServer::start();
    open_sale(&redis, SALE, 100);
    let dir = TempDir::new();
    let tokens = provider(&dir);
    let keys = path(&dir, "provider.jwks");
    let g = Gateway::start(
        &redis,
        &[
            ("SECKILL_AUTH_KEYS", keys.as_str()),
            ("SECKILL_AUTH_ISSUER", ISSUER),
        ],
    );
    for forged in [
        "forged_wrong_key",
        "forged_hs256_pem",
        "forged_hs256_der",
        "forged_hs256_n",
        "forged_none",
        "forged_es256_as_rs256",
        "wrong_issuer",
        "enc_key_kid",
        "forged_jku_x5u",
        "crit_extension",
        "es256_der_signature",
        "es256_zero_signature",
        "es256_lowercase_alg",
    ] {
        let r = buy_as(g.port, &tokens[forged]);
        assert_eq!(
            (r.status, r.error()),
            (401, "invalid_token".into()),
            "{forged}"
        );
    }
    assert_eq!(counts(&redis, SALE), (100, 0, 0), "a forgery changed Redis");
    for good in ["rs256_rsa1", "rs256_rsa2", "es256_ec1"] {
        assert_eq!(buy_as(g.port, &tokens[good]).status, 202, "{good}");
    }
    // A retry is the same buyer: the token's sub, nobody else.
    let again = buy_as(g.port, &tokens["rs256_rsa1"]);
    assert_eq!(again.status, 409, "{again:?}");
    assert_eq!(counts(&redis, SALE), (97, 3, 3));
}

#[test]
fn sighup_reloads_the_key_file_and_an_unusable_one_keeps_the_keys_in_use() {
    let redis = RedisServer::start();
    open_sale(&redis, SALE, 100);
    let dir = TempDir::new();
    let tokens = provider(&dir);
    let live = path(&dir, "live.jwks");
    std::fs::copy(path(&dir, "provider.jwks"), &live).unwrap();
    let mut g = Gateway::start(
        &redis,
        &[
            ("SECKILL_AUTH_KEYS", live.as_str()),
            ("SECKILL_AUTH_ISSUER", ISSUER),
        ],
    );
    // Verified and remembered before the rotation.
    assert_eq!(buy_as(g.port, &tokens["rs256_rsa2"]).status, 202);

    // The provider rotated rsa2 out: after SIGHUP even the remembered token
    // of rsa2 is refused, while rsa1's still buy.
    std::fs::copy(path(&dir, "rotated.jwks"), &live).unwrap();
    signal(g.child.id(), "HUP");
    wait_until(
        Duration::from_secs(5),
        "the rotated keys to be in use",
        || buy_as(g.port, &tokens["rs256_rsa2"]).status == 401,
    );
    assert_eq!(buy_as(g.port, &tokens["rs256_rsa1"]).status, 202);

    // An unusable file (a 1024-bit RSA key, which looks usable) is refused
    // and the keys in use stay: ec1 still buys, the gateway still runs.
    let weak = r#"{"keys":[{"kty":"RSA","kid":"weak","alg":"RS256","use":"sig","e":"AQAB","n":"-42Xhjmi3d52_KWhO66FM-4D-07eMHZQDR4NkbHzqwMVF7U0Ho0hhsGWih0QxLn7_-e07F7btDiwZHJiMoMU8QC0wirn6XEkVZau85Z5-q-c5zHJjF-jE8V7dMNId4qNyh7QlXnBv4K5qHipTdMv0mvf6P4zkTNvCi3VhiJyMME"}]}"#;
    std::fs::write(&live, weak).unwrap();
    signal(g.child.id(), "HUP");
    std::thread::sleep(Duration::from_millis(500));
    assert!(g.alive(), "an unusable key file stopped the gateway");
    assert_eq!(buy_as(g.port, &tokens["es256_ec1"]).status, 202);
    assert_eq!(buy_as(g.port, &tokens["rs256_rsa2"]).status, 401);
    assert_eq!(counts(&redis, SALE), (97, 3, 3));
    assert_eq!(
        g.terminate(Duration::from_secs(5)).map(|s| s.success()),
        Some(true),
        "SIGTERM still stops it"
    );
}

#[test]
fn a_burst_of_sighups_and_a_truncated_or_missing_key_file_keep_the_keys_in_use() {
    let redis = RedisServer::start();
    open_sale(&redis, SALE, 100);
    let dir = TempDir::new();
    let tokens = provider(&dir);
    let live = path(&dir, "live.jwks");
    std::fs::copy(path(&dir, "provider.jwks"), &live).unwrap();
    let mut g = Gateway::start(
        &redis,
        &[
            ("SECKILL_AUTH_KEYS", live.as_str()),
            ("SECKILL_AUTH_ISSUER", ISSUER),
        ],
    );
    assert_eq!(buy_as(g.port, &tokens["rs256_rsa1"]).status, 202);

    // 50 SIGHUPs in a row: the gateway keeps running and verifying.
    for _ in 0..50 {
        signal(g.child.id(), "HUP");
    }
    std::thread::sleep(Duration::from_millis(400));
    assert!(g.alive(), "a burst of SIGHUPs stopped the gateway");
    assert_eq!(buy_as(g.port, &tokens["es256_ec1"]).status, 202);

    // The file cut mid-write, then gone: each reload is refused and the
    // keys in use stay (rsa2 still verifies).
    let text = std::fs::read_to_string(&live).unwrap();
    std::fs::write(&live, &text[..text.len() / 2]).unwrap();
    signal(g.child.id(), "HUP");
    std::thread::sleep(Duration::from_millis(400));
    std::fs::remove_file(&live).unwrap();
    signal(g.child.id(), "HUP");
    std::thread::sleep(Duration::from_millis(400));
    assert!(g.alive(), "an unreadable key file stopped the gateway");
    assert_eq!(buy_as(g.port, &tokens["rs256_rsa2"]).status, 202);

    // The rotated file back in place: rsa2 leaves at the next SIGHUP.
    std::fs::copy(path(&dir, "rotated.jwks"), &live).unwrap();
    signal(g.child.id(), "HUP");
    wait_until(
        Duration::from_secs(5),
        "the rotated keys to be in use",
        || buy_as(g.port, &tokens["rs256_rsa2"]).status == 401,
    );
    assert_eq!(counts(&redis, SALE), (97, 3, 3));

    // SIGINT (the Ctrl-C handler, not the signal thread) still stops it.
    signal(g.child.id(), "INT");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(s) = g.child.try_wait().unwrap() {
            break Some(s);
        }
        if std::time::Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.map(|s| s.success()), Some(true), "SIGINT stops it");
}
