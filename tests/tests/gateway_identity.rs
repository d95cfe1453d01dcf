//! Specifies signed buyer identity (docs/IDENTITY.md) against the real gateway and
//! a real, private Redis: every bad token gets its 401 (or 403) with
//! `WWW-Authenticate`, changes nothing in Redis, and the next valid purchase
//! succeeds; the buyer is the token's `sub`; `/purchases/me` and the old
//! status path read only the token's own purchase; key rotation; the start
//! refused without keys; `SECKILL_AUTH=none` as before.

use crate::support::gateway as gateway_support;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use gateway_support::*;
use seckill_common::token::{self, Alg, Claims, KeySet, Signer};
use seckill_tests::auth::{signer, token_for, ED_KID, HS_KID};
use seckill_tests::{RedisServer, TempDir};
use std::time::Duration;

const SALE: u64 = 12;
/// The tests' HS256 secret (`seckill_tests::auth::SIGNING_JWKS`, `k`).
const HS_SECRET: &[u8] = b"test-secret-of-seckill-tests-32bytes";

/// Every key of the Redis server with its content (the whole database, so
/// that no bad token can have written anywhere).
fn everything(redis: &RedisServer) -> Vec<(String, String)> {
    let mut con = redis.con();
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    keys.sort();
    keys.into_iter()
        .map(|k| {
            let dump: Vec<u8> = redis::cmd("DUMP").arg(&k).query(&mut con).unwrap();
            (k, format!("{dump:?}"))
        })
        .collect()
}

/// A purchase with `Authorization: <auth>` (none when `None`) and `body`.
fn buy_with(port: u16, auth: Option<&str>, body: &str) -> Resp {
    let mut rq =
        format!("POST /v1/sales/{SALE}/purchases HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
    if let Some(a) = auth {
        rq.push_str(&format!("Authorization: {a}\r\n"));
    }
    rq.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    raw(port, rq.as_bytes()).expect("an answer")
}

fn get_with(port: u16, auth: Option<&str>, path: &str) -> Resp {
    let mut rq = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
    if let Some(a) = auth {
        rq.push_str(&format!("Authorization: {a}\r\n"));
    }
    rq.push_str("\r\n");
    raw(port, rq.as_bytes()).expect("an answer")
}

fn bearer(t: &str) -> String {
    format!("Bearer {t}")
}

fn now() -> u64 {
    seckill_common::now_ms() / 1000
}

fn b64(s: &str) -> String {
    URL_SAFE_NO_PAD.encode(s)
}

/// A token with this header (`alg` HS256, `kid` as given) and claims
/// (JSON), signed as HS256 with `secret`.
fn hs256_raw(kid: Option<&str>, claims: &str, secret: &[u8]) -> String {
    let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    h.kid = kid.map(String::from);
    let claims: serde_json::Value = serde_json::from_str(claims).unwrap();
    jsonwebtoken::encode(&h, &claims, &jsonwebtoken::EncodingKey::from_secret(secret)).unwrap()
}

fn assert_401(r: &Resp, code: &str, what: &str) {
    assert_eq!(
        (r.status, r.error()),
        (401, code.to_string()),
        "{what}: {r:?}"
    );
    assert!(
        r.header("WWW-Authenticate")
            .is_some_and(|v| v.starts_with("Bearer")),
        "{what}: {r:?}"
    );
}

/// Every kind of bad token mallory might send, as (what, the
/// `Authorization` header or none, the 401's error code); `good` is a
/// valid token of mallory's, whose signature one case flips.
fn bad_token_cases(good: &str) -> Vec<(&'static str, Option<String>, &'static str)> {
    let claims = |exp: u64| format!(r#"{{"sub":"mallory","aud":"seckill","exp":{exp}}}"#);
    let mut sig_flipped = good.to_string();
    let last = sig_flipped.pop().unwrap();
    sig_flipped.push(if last == 'A' { 'B' } else { 'A' });
    // The Ed25519 public key of the tests' key file, used as an HS256 secret.
    let ed_public = URL_SAFE_NO_PAD
        .decode(
            token::parse(
                &std::fs::read_to_string(seckill_tests::auth::gateway_key_file()).unwrap(),
            )
            .unwrap()
            .find(ED_KID)
            .unwrap()
            .to_jwk(false)["x"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
    let mint = |f: &dyn Fn(&mut Claims)| {
        let mut c = Claims::new("mallory", "seckill", 600);
        f(&mut c);
        signer(HS_KID).mint(&c).unwrap()
    };
    let other_key = Signer::new(&token::generate(Alg::Hs256, HS_KID).unwrap())
        .unwrap()
        .mint(&Claims::new("mallory", "seckill", 600))
        .unwrap();
    let unknown_kid = Signer::new(&token::generate(Alg::Hs256, "nobody").unwrap())
        .unwrap()
        .mint(&Claims::new("mallory", "seckill", 600))
        .unwrap();
    vec![
        ("no Authorization header", None, "invalid_token"),
        (
            "another scheme",
            Some(format!("Basic {}", b64("a:b"))),
            "invalid_token",
        ),
        (
            "Bearer without a token",
            Some("Bearer ".into()),
            "invalid_token",
        ),
        (
            "alg none",
            Some(bearer(&format!(
                "{}.{}.",
                b64(r#"{"alg":"none","kid":"test-hs-1"}"#),
                b64(&claims(now() + 600))
            ))),
            "invalid_token",
        ),
        (
            "HS256 signed with the Ed25519 public key as secret",
            Some(bearer(&hs256_raw(
                Some(ED_KID),
                &claims(now() + 600),
                &ed_public,
            ))),
            "invalid_token",
        ),
        ("unknown kid", Some(bearer(&unknown_kid)), "invalid_token"),
        (
            "no kid",
            Some(bearer(&hs256_raw(None, &claims(now() + 600), HS_SECRET))),
            "invalid_token",
        ),
        (
            "bad base64",
            Some(bearer("e30*.e30*.e30*")),
            "invalid_token",
        ),
        ("not three parts", Some(bearer("abc")), "invalid_token"),
        (
            "a flipped signature",
            Some(bearer(&sig_flipped)),
            "invalid_token",
        ),
        (
            "signed by another secret",
            Some(bearer(&other_key)),
            "invalid_token",
        ),
        (
            "a token over 4 KiB",
            Some(bearer(
                &mint(&|c| c.sub = "x".repeat(64)).repeat(40)[..5000],
            )),
            "invalid_token",
        ),
        (
            "expired",
            Some(bearer(&mint(&|c| c.exp = now() - 120))),
            "token_expired",
        ),
        (
            "not yet valid (nbf)",
            Some(bearer(&mint(&|c| c.nbf = Some(now() + 600)))),
            "invalid_token",
        ),
        (
            "issued in the future (iat)",
            Some(bearer(&mint(&|c| c.iat = Some(now() + 600)))),
            "invalid_token",
        ),
        (
            "another audience",
            Some(bearer(&mint(&|c| c.aud = "shop".into()))),
            "invalid_token",
        ),
        (
            "no exp",
            Some(bearer(&hs256_raw(
                Some(HS_KID),
                r#"{"sub":"mallory","aud":"seckill"}"#,
                HS_SECRET,
            ))),
            "invalid_token",
        ),
        (
            "a sub that breaks the user id rule",
            Some(bearer(&mint(&|c| c.sub = "a b".into()))),
            "invalid_token",
        ),
    ]
}

#[test]
fn every_bad_token_is_refused_and_changes_nothing_in_redis() {
    let redis = RedisServer::start();
    open_sale(&redis, SALE, 10);
    let g = Gateway::start(&redis, &[]);
    let p = g.port;
    let before = everything(&redis);
    let body = r#"{"user_id":"mallory"}"#;
    let good = token_for("mallory");
    let cases = bad_token_cases(&good);
    for (what, auth, code) in &cases {
        let r = buy_with(p, auth.as_deref(), body);
        assert_401(&r, code, what);
    }
    // Another user's token (valid): 403, nothing reserved.
    let r = buy_with(p, Some(&bearer(&token_for("alice"))), body);
    assert_eq!(
        (r.status, r.error()),
        (403, "user_mismatch".into()),
        "{r:?}"
    );
    assert_eq!(before, everything(&redis), "Redis changed");
    // The next valid purchase succeeds, as the token's user.
    let r = buy_with(p, Some(&bearer(&good)), body);
    assert_eq!(r.status, 202, "{r:?}");
    assert_eq!(counts(&redis, SALE), (9, 1, 1));
    let metrics = get(p, "/metrics").body;
    assert!(
        metrics.contains(&format!(
            "seckill_gateway_purchases_total{{outcome=\"invalid_token\"}} {}",
            cases.len()
        )),
        "{metrics}"
    );
    assert!(metrics.contains("seckill_gateway_purchases_total{outcome=\"user_mismatch\"} 1"));
}

#[test]
fn the_buyer_is_the_tokens_sub_and_reads_only_its_own_status() {
    let redis = RedisServer::start();
    open_sale(&redis, SALE, 10);
    let g = Gateway::start(&redis, &[]);
    let p = g.port;
    let alice = bearer(&token_for("alice"));
    let ed_bob = bearer(
        &signer(ED_KID)
            .mint(&Claims::new("bob", "seckill", 600))
            .unwrap(),
    );
    // A body without user_id: the token names the buyer (HS256 and EdDSA).
    let a = buy_with(p, Some(&alice), "{}");
    assert_eq!(a.status, 202, "{a:?}");
    let b = buy_with(p, Some(&ed_bob), r#"{"user_id":"bob"}"#);
    assert_eq!(b.status, 202, "{b:?}");
    // The same token again: one purchase per user holds.
    let again = buy_with(p, Some(&alice), "{}");
    assert_eq!(
        (again.status, again.json()["reservation_id"].clone()),
        (409, a.json()["reservation_id"].clone())
    );
    assert_eq!(counts(&redis, SALE), (8, 2, 2));
    let flow: std::collections::HashMap<String, String> = redis::Commands::hgetall(
        &mut redis.con(),
        seckill_common::keys::SaleKeys::new(SALE).buyers(),
    )
    .unwrap();
    assert_eq!(flow.len(), 2);
    assert!(
        flow.contains_key("alice") && flow.contains_key("bob"),
        "{flow:?}"
    );

    let me = format!("/v1/sales/{SALE}/purchases/me");
    let r = get_with(p, Some(&alice), &me);
    assert_eq!(
        (r.status, r.json()["reservation_id"].clone()),
        (200, a.json()["reservation_id"].clone())
    );
    let r = get_with(p, Some(&ed_bob), &me);
    assert_eq!(
        (r.status, r.json()["reservation_id"].clone()),
        (200, b.json()["reservation_id"].clone())
    );
    // The old path: the token's own user only.
    let r = get_with(
        p,
        Some(&alice),
        &format!("/v1/sales/{SALE}/purchases/alice"),
    );
    assert_eq!(r.status, 200, "{r:?}");
    let r = get_with(p, Some(&alice), &format!("/v1/sales/{SALE}/purchases/bob"));
    assert_eq!(
        (r.status, r.error()),
        (403, "user_mismatch".into()),
        "{r:?}"
    );
    assert_401(
        &get_with(p, None, &me),
        "invalid_token",
        "status without a token",
    );
    let carol = bearer(&token_for("carol"));
    let r = get_with(p, Some(&carol), &me);
    assert_eq!(
        (r.status, r.error()),
        (404, "purchase_not_found".into()),
        "{r:?}"
    );
}

fn write_keys(dir: &TempDir, name: &str, keys: &[&token::Key]) -> String {
    let path = dir.path().join(name);
    let set = KeySet::of(keys.iter().map(|k| (*k).clone()).collect());
    std::fs::write(&path, set.to_jwks(false)).unwrap();
    path.display().to_string()
}

#[test]
fn keys_rotate_old_and_new_while_both_are_configured_then_only_new() {
    let redis = RedisServer::start();
    open_sale(&redis, SALE, 100);
    let dir = TempDir::new();
    let old = token::generate(Alg::EdDsa, "shop-2026-05").unwrap();
    let new = token::generate(Alg::EdDsa, "shop-2026-06").unwrap();
    let mint = |k: &token::Key, u: &str| {
        bearer(
            &Signer::new(k)
                .unwrap()
                .mint(&Claims::new(u, "seckill", 600))
                .unwrap(),
        )
    };
    let both = write_keys(&dir, "both.jwks", &[&old, &new]);
    let only_new = write_keys(&dir, "new.jwks", &[&new]);

    let mut g = Gateway::start(&redis, &[("SECKILL_AUTH_KEYS", &both)]);
    let old_tok = mint(&old, "u-old");
    assert_eq!(buy_with(g.port, Some(&old_tok), "{}").status, 202);
    assert_eq!(
        buy_with(g.port, Some(&mint(&new, "u-new")), "{}").status,
        202
    );
    assert_eq!(
        g.terminate(Duration::from_secs(5)).map(|s| s.success()),
        Some(true)
    );

    let g = Gateway::start(&redis, &[("SECKILL_AUTH_KEYS", &only_new)]);
    let before = everything(&redis);
    // Even the token the last gateway had verified and remembered.
    assert_401(
        &buy_with(g.port, Some(&old_tok), "{}"),
        "invalid_token",
        "old key, removed",
    );
    assert_401(
        &buy_with(g.port, Some(&mint(&old, "u-old-2")), "{}"),
        "invalid_token",
        "old key, removed",
    );
    assert_eq!(before, everything(&redis), "Redis changed");
    assert_eq!(
        buy_with(g.port, Some(&mint(&new, "u-new-2")), "{}").status,
        202
    );
    assert_eq!(counts(&redis, SALE), (97, 3, 3));
}

#[test]
fn jwt_without_keys_refuses_to_start_and_says_what_to_set() {
    let out = seckill_tests::command("seckill-gateway")
        .env_remove("SECKILL_AUTH_KEYS")
        .env(
            "SECKILL_LISTEN",
            format!("127.0.0.1:{}", seckill_tests::free_port()),
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("SECKILL_AUTH_KEYS") && err.contains("SECKILL_AUTH=none"),
        "{err}"
    );

    let dir = TempDir::new();
    let empty = dir.path().join("empty.jwks");
    std::fs::write(&empty, r#"{"keys":[]}"#).unwrap();
    let out = seckill_tests::command("seckill-gateway")
        .env("SECKILL_AUTH_KEYS", &empty)
        .env(
            "SECKILL_LISTEN",
            format!("127.0.0.1:{}", seckill_tests::free_port()),
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no key"), "{err}");
}

#[test]
fn auth_none_believes_the_body_and_warns_at_start() {
    let redis = RedisServer::start();
    open_sale(&redis, SALE, 10);
    let port = seckill_tests::free_port();
    let child = seckill_tests::command("seckill-gateway")
        .env("SECKILL_AUTH", "none")
        .env("SECKILL_LISTEN", format!("127.0.0.1:{port}"))
        .env("SECKILL_REDIS_URL", redis.url())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    seckill_tests::wait_until(Duration::from_secs(10), "the gateway to listen", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let r = buy_with(port, None, r#"{"user_id":"dev"}"#);
    assert_eq!(r.status, 202, "{r:?}");
    let r = buy_with(port, None, "{}");
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(
        get_with(port, None, &format!("/v1/sales/{SALE}/purchases/dev")).status,
        200
    );
    signal(child.id(), "TERM");
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("SECKILL_AUTH=none") && err.contains("development"),
        "{err}"
    );
}
