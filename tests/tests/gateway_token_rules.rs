//! Specifies two rules of docs/IDENTITY.md against the real gateway: a
//! token living longer than `SECKILL_AUTH_MAX_TTL` (`exp - iat`, or
//! `exp - now` plus the leeway without `iat`) is 401 `invalid_token` and
//! changes nothing in Redis, one exactly at the bound buys; and a key file
//! holding any key the gateway cannot use (RSA, no `alg`, an unknown
//! `alg`, a duplicate `kid`) is refused whole at start, exit 2, with a
//! message naming the key.

use crate::support::gateway as gateway_support;

use gateway_support::*;
use seckill_common::token::Claims;
use seckill_tests::auth::{signer, HS_KID};
use seckill_tests::{RedisServer, TempDir};

const SALE: u64 = 21;

/// A purchase by `user` with `token`.
fn buy_as(port: u16, user: &str, token: &str) -> Resp {
    let body = format!(r#"{{"user_id":"{user}"}}"#);
    let rq = format!(
        "POST /v1/sales/{SALE}/purchases HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Authorization: Bearer {token}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    raw(port, rq.as_bytes()).expect("an answer")
}

/// A token for `user` with these `iat` and `exp` (Unix seconds).
fn token(user: &str, iat: Option<u64>, exp: u64) -> String {
    let mut c = Claims::new(user, "seckill", 60);
    (c.iat, c.exp) = (iat, exp);
    signer(HS_KID).mint(&c).unwrap()
}

#[test]
fn a_token_living_longer_than_the_max_ttl_is_invalid() {
    let redis = RedisServer::start();
    open_sale(&redis, SALE, 10);
    let g = Gateway::start(
        &redis,
        &[
            ("SECKILL_AUTH_MAX_TTL", "1h"),
            ("SECKILL_AUTH_LEEWAY", "30s"),
        ],
    );
    let now = seckill_common::now_ms() / 1000;
    let before = snapshot(&redis, SALE);
    let too_long = [
        ("iat", token("mallory", Some(now - 60), now - 60 + 3601)),
        (
            "iat, young",
            token("mallory", Some(now), now + 365 * 86_400),
        ),
        ("no iat", token("mallory", None, now + 7200)),
    ];
    for (what, t) in &too_long {
        let r = buy_as(g.port, "mallory", t);
        assert_eq!(
            (r.status, r.error()),
            (401, "invalid_token".into()),
            "{what}"
        );
        assert_eq!(
            r.header("WWW-Authenticate"),
            Some(r#"Bearer realm="seckill", error="invalid_token""#),
            "{what}"
        );
    }
    assert_eq!(snapshot(&redis, SALE), before, "nothing changed in Redis");

    // Exactly at the bound: exp - iat = 3600, and no iat with exp 10 min on.
    let r = buy_as(
        g.port,
        "alice",
        &token("alice", Some(now - 60), now - 60 + 3600),
    );
    assert_eq!(r.status, 202, "{r:?}");
    let r = buy_as(g.port, "bob", &token("bob", None, now + 600));
    assert_eq!(r.status, 202, "{r:?}");
    assert_eq!(counts(&redis, SALE), (8, 2, 2));
}

/// Runs the gateway with `jwks` as its key file; its exit code and stderr.
fn start_with_keys(jwks: &str) -> (Option<i32>, String) {
    let dir = TempDir::new();
    let path = dir.path().join("keys.jwks");
    std::fs::write(&path, jwks).unwrap();
    let out = seckill_tests::command("seckill-gateway")
        .env("SECKILL_AUTH_KEYS", &path)
        .env(
            "SECKILL_LISTEN",
            format!("127.0.0.1:{}", seckill_tests::free_port()),
        )
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The tests' HS256 key (`seckill_tests::auth::SIGNING_JWKS`), usable.
const GOOD: &str = r#"{"kty":"oct","kid":"test-hs-1","alg":"HS256","k":"dGVzdC1zZWNyZXQtb2Ytc2Vja2lsbC10ZXN0cy0zMmJ5dGVz"}"#;

#[test]
fn a_key_file_with_a_broken_signature_key_is_refused_whole_at_start() {
    let rsa = r#"{"kty":"RSA","kid":"rsa-1","alg":"RS256","n":"sXch","e":"AQAB"}"#;
    let no_alg =
        r#"{"kty":"oct","kid":"hs-2","k":"dGVzdC1zZWNyZXQtb2Ytc2Vja2lsbC10ZXN0cy0zMmJ5dGVz"}"#;
    let cases = [
        (
            rsa,
            r#"keys[1] (kid "rsa-1"): an RS256 modulus needs at least 2048 bits, n has 24"#,
        ),
        (
            no_alg,
            r#"keys[1] (kid "hs-2"): no alg (an oct key needs alg HS256)"#,
        ),
        (GOOD, r#"two keys have kid "test-hs-1""#),
    ];
    for (second, message) in cases {
        let jwks = format!(r#"{{"keys":[{GOOD},{second}]}}"#);
        let (code, err) = start_with_keys(&jwks);
        assert_eq!(code, Some(2), "{message}: {err}");
        assert!(
            err.contains(&format!("keys.jwks: {message}")),
            "{message}: {err}"
        );
    }
    // A key of an algorithm not verified here (HS512) is passed over, as a
    // provider's file holds keys for other uses; alone it leaves no key.
    let odd_alg = r#"{"kty":"oct","kid":"hs-3","alg":"HS512","k":"dGVzdC1zZWNyZXQtb2Ytc2Vja2lsbC10ZXN0cy0zMmJ5dGVz"}"#;
    let (code, err) = start_with_keys(&format!(r#"{{"keys":[{odd_alg}]}}"#));
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(
            r#"no key to verify tokens with (HS256, EdDSA, RS256 or ES256 signature keys); keys[0] (kid "hs-3") skipped: alg "HS512" is not verified here"#
        ),
        "{err}"
    );
    let dir = TempDir::new();
    let path = dir.path().join("keys.jwks");
    std::fs::write(&path, format!(r#"{{"keys":[{GOOD},{odd_alg}]}}"#)).unwrap();
    let redis = RedisServer::start();
    let path = path.to_string_lossy().into_owned();
    let mut g = Gateway::start(&redis, &[("SECKILL_AUTH_KEYS", path.as_str())]);
    assert!(g.alive());
}
