//! Owns who a request is from: the `Authorization: Bearer` token read from
//! the headers ([`credentials`]), its verification against the key file
//! (`SECKILL_AUTH_KEYS`, a JWKS document, `common/src/token.rs`), the
//! memory of verified tokens, and the rule that a buyer acts only as
//! itself (a body `user_id` or a status path naming another user: 403
//! `user_mismatch`). With `SECKILL_AUTH=none` the body's `user_id` is
//! believed as sent (development only).
//!
//! A token is a compact JWS (RFC 7515/7519): `alg` HS256 or EdDSA (Ed25519)
//! exactly as its key's, `kid` naming a key of the file, `sub` the buyer
//! (1-64 of `A-Z a-z 0-9 _ . -`), `aud` the configured audience, `exp`
//! required, `nbf` and `iat` honoured, all three with
//! `SECKILL_AUTH_LEEWAY`. Anything else (no token, `alg: none`, an
//! algorithm that is not its key's, an unknown `kid`, bad base64, a bad
//! signature, a token over [`MAX_TOKEN_BYTES`]) is 401 `invalid_token`;
//! an expired token 401 `token_expired`; both with `WWW-Authenticate`.
//!
//! Verified tokens are remembered by the first 128 bits of their SHA-256
//! until their `exp` (plus the leeway), in [`SHARDS`] shards of at most
//! `SECKILL_AUTH_CACHE_MAX / SHARDS` entries: a client's retries cost a
//! hash and a lookup, not a signature check.

use crate::metrics::Metrics;
use crate::reply::Reply;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::{DecodingKey, Validation};
use seckill_common::token::{Alg, KeySet};
use seckill_common::{AuthMode, Config};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use tiny_http::Request;

/// Longest token taken, in bytes (the issue's 4 KiB); a longer one is 401
/// before any decoding.
pub const MAX_TOKEN_BYTES: usize = 4096;

/// Shards of the verified-token memory (one mutex each).
pub const SHARDS: usize = 16;

/// What a request presented in its `Authorization` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// No `Authorization` header.
    Missing,
    /// One `Authorization: Bearer <token>` (the token, not yet checked).
    Bearer(String),
    /// Another scheme, an empty token or more than one header.
    Unusable,
}

/// Reads the `Authorization` header of `rq` (scheme case-insensitive,
/// RFC 9110 §11.1).
pub fn credentials(rq: &Request) -> Credentials {
    let mut found = Credentials::Missing;
    for h in rq.headers() {
        if !h.field.equiv("Authorization") {
            continue;
        }
        if found != Credentials::Missing {
            return Credentials::Unusable;
        }
        let v = h.value.as_str().trim();
        found = match v.split_once(' ') {
            Some((scheme, token))
                if scheme.eq_ignore_ascii_case("Bearer") && !token.trim().is_empty() =>
            {
                Credentials::Bearer(token.trim().to_string())
            }
            _ => Credentials::Unusable,
        };
    }
    found
}

/// Why a token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// 401 `invalid_token`.
    Invalid,
    /// 401 `token_expired`.
    Expired,
}

impl Refused {
    /// The 401 reply, with `WWW-Authenticate: Bearer` (RFC 6750 §3).
    pub fn reply(self) -> Reply {
        let (code, challenge) = match self {
            Refused::Invalid => (
                "invalid_token",
                r#"Bearer realm="seckill", error="invalid_token""#,
            ),
            Refused::Expired => (
                "token_expired",
                r#"Bearer realm="seckill", error="invalid_token", error_description="expired""#,
            ),
        };
        let mut r = Reply::error(401, code);
        r.extra = Some(("WWW-Authenticate", challenge));
        r
    }
}

/// Why the identity settings cannot be used; the gateway does not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum IdentityError {
    /// `SECKILL_AUTH=jwt` without `SECKILL_AUTH_KEYS`.
    NoKeyFile,
    /// The key file cannot be used.
    KeyFile(std::path::PathBuf, seckill_common::token::KeyFileError),
}

impl fmt::Display for IdentityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdentityError::NoKeyFile => write!(
                f,
                "SECKILL_AUTH=jwt (the default) needs keys to verify buyer tokens: set \
                 SECKILL_AUTH_KEYS to a JWKS key file (docs/IDENTITY.md), or \
                 SECKILL_AUTH=none for development only"
            ),
            IdentityError::KeyFile(p, e) => {
                write!(f, "SECKILL_AUTH_KEYS={}: {e}", p.display())
            }
        }
    }
}

impl std::error::Error for IdentityError {}

/// How the gateway learns who buys (`SECKILL_AUTH`).
pub enum Identity {
    /// `none`: the body's `user_id`, believed as sent.
    Unverified,
    /// `jwt`: a verified token's `sub`.
    Jwt(Box<Verifier>),
}

impl Identity {
    /// The identity `config` asks for, with the key file read now. Logs a
    /// warning for `none`, and one for a key file holding Ed25519 private
    /// keys (a gateway needs only the public half).
    ///
    /// Errors: [`IdentityError`].
    pub fn from_config(config: &Config) -> Result<Identity, IdentityError> {
        if config.auth == AuthMode::None {
            log::warn!(
                "SECKILL_AUTH=none: purchases are made as the user_id in the body, unverified; \
                 anyone can buy as anyone. For development only."
            );
            return Ok(Identity::Unverified);
        }
        let path = config.auth_keys.as_ref().ok_or(IdentityError::NoKeyFile)?;
        let keys = seckill_common::token::load(path)
            .map_err(|e| IdentityError::KeyFile(path.clone(), e))?;
        if keys
            .keys
            .iter()
            .any(|k| k.alg == Alg::EdDsa && k.can_sign())
        {
            log::warn!(
                "SECKILL_AUTH_KEYS={} holds Ed25519 private keys (d): a gateway needs only \
                 the public half; give it the file without d",
                path.display()
            );
        }
        log::info!(
            "buyer tokens: {} key(s) from {} ({}), audience {:?}",
            keys.keys.len(),
            path.display(),
            keys.keys
                .iter()
                .map(|k| format!("{} {}", k.kid, k.alg.as_str()))
                .collect::<Vec<_>>()
                .join(", "),
            config.auth_audience
        );
        Ok(Identity::Jwt(Box::new(Verifier::new(
            &keys,
            &config.auth_audience,
            config.auth_leeway.as_secs(),
            config.auth_cache_max,
        ))))
    }

    /// Whether the body must name the buyer (`SECKILL_AUTH=none`).
    pub fn body_names_buyer(&self) -> bool {
        matches!(self, Identity::Unverified)
    }

    /// The buyer of a purchase: the token's `sub` (a body `user_id` must
    /// agree), or with `none` the body's `user_id` (`parse_body` made sure
    /// there is one).
    ///
    /// Errors: 401 (see [`Refused`]), 403 `user_mismatch`.
    pub fn buyer(
        &self,
        creds: &Credentials,
        body_user: Option<String>,
        metrics: &Metrics,
    ) -> Result<String, Reply> {
        match self {
            Identity::Unverified => body_user.ok_or_else(|| Reply::invalid("no user_id")),
            Identity::Jwt(v) => {
                let sub = v.verify(creds, now_s(), metrics).map_err(Refused::reply)?;
                match body_user {
                    Some(u) if u != sub => Err(Reply::error(403, "user_mismatch")),
                    _ => Ok(sub),
                }
            }
        }
    }

    /// Whose purchase status a `GET` may read: `path_user` is the user of
    /// `/purchases/{user}`, `None` for `/purchases/me`. With `none`, the
    /// path's user (`me` is then the user named `me`).
    ///
    /// Errors: 401 (see [`Refused`]), 403 `user_mismatch` for another
    /// buyer's status.
    pub fn reader(
        &self,
        creds: &Credentials,
        path_user: Option<&str>,
        metrics: &Metrics,
    ) -> Result<String, Reply> {
        match self {
            Identity::Unverified => Ok(path_user.unwrap_or("me").to_string()),
            Identity::Jwt(v) => {
                let sub = v.verify(creds, now_s(), metrics).map_err(Refused::reply)?;
                match path_user {
                    Some(u) if u != sub => Err(Reply::error(403, "user_mismatch")),
                    _ => Ok(sub),
                }
            }
        }
    }
}

fn now_s() -> u64 {
    seckill_common::now_ms() / 1000
}

/// The claims the gateway reads; the library checks `exp`, `nbf`, `aud`.
#[derive(Deserialize)]
struct Claims {
    sub: String,
    exp: u64,
    #[serde(default)]
    iat: Option<u64>,
}

/// The header members that choose the key (`alg`, `kid`); `decode` then
/// checks the whole header itself (`decode_header` before it decoded it
/// twice: docs/PERFORMANCE.md, "Buyer tokens").
#[derive(Deserialize)]
struct KeyChoice {
    alg: String,
    kid: Option<String>,
}

/// Longest header segment read (base64url); a real one is under 100 bytes.
const MAX_HEADER_B64: usize = 512;

impl KeyChoice {
    /// Reads them from `token`. Errors: [`Refused::Invalid`] for a header
    /// that is not base64url JSON with a string `alg`, or too long.
    fn read(token: &str) -> Result<KeyChoice, Refused> {
        let head = token.split('.').next().unwrap_or_default();
        if head.len() > MAX_HEADER_B64 {
            return Err(Refused::Invalid);
        }
        let json = URL_SAFE_NO_PAD.decode(head).map_err(|_| Refused::Invalid)?;
        serde_json::from_slice(&json).map_err(|_| Refused::Invalid)
    }
}

/// One verified token in memory.
struct Remembered {
    sub: Box<str>,
    exp: u64,
}

/// Verifies tokens against the keys of the key file.
pub struct Verifier {
    keys: HashMap<String, (Alg, DecodingKey)>,
    hs256: Validation,
    eddsa: Validation,
    leeway_s: u64,
    shard_max: usize,
    shards: Vec<Mutex<HashMap<u128, Remembered>>>,
}

impl Verifier {
    /// A verifier of `keys` for `audience`, with `leeway_s` seconds of clock
    /// skew, remembering at most about `cache_max` tokens (0: none).
    pub fn new(keys: &KeySet, audience: &str, leeway_s: u64, cache_max: usize) -> Verifier {
        let validation = |alg: Alg| {
            let mut v = Validation::new(alg.jwt());
            v.leeway = leeway_s;
            v.validate_exp = true;
            v.validate_nbf = true;
            v.set_audience(&[audience]);
            v.set_required_spec_claims(&["exp", "aud", "sub"]);
            v
        };
        Verifier {
            keys: keys
                .keys
                .iter()
                .map(|k| (k.kid.clone(), (k.alg, k.decoding_key())))
                .collect(),
            hs256: validation(Alg::Hs256),
            eddsa: validation(Alg::EdDsa),
            leeway_s,
            shard_max: cache_max.div_ceil(SHARDS),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }

    /// The buyer (`sub`) of the token in `creds` at Unix second `now`.
    ///
    /// Errors: [`Refused`].
    pub fn verify(
        &self,
        creds: &Credentials,
        now: u64,
        metrics: &Metrics,
    ) -> Result<String, Refused> {
        let Credentials::Bearer(token) = creds else {
            return Err(Refused::Invalid);
        };
        if token.len() > MAX_TOKEN_BYTES {
            return Err(Refused::Invalid);
        }
        let digest = Sha256::digest(token.as_bytes());
        let mut id = [0u8; 16];
        id.copy_from_slice(&digest[..16]);
        let id = u128::from_le_bytes(id);
        let shard = &self.shards[(id as usize) % SHARDS];
        if self.shard_max > 0 {
            let mut map = shard.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(r) = map.get(&id) {
                if now > r.exp.saturating_add(self.leeway_s) {
                    map.remove(&id);
                    return Err(Refused::Expired);
                }
                metrics.token_cache_hits.inc();
                return Ok(r.sub.to_string());
            }
        }
        let claims = self.check(token, now)?;
        metrics.tokens_verified.inc();
        if self.shard_max > 0 {
            let mut map = shard.lock().unwrap_or_else(|p| p.into_inner());
            if map.len() >= self.shard_max {
                let before = map.len();
                let leeway = self.leeway_s;
                map.retain(|_, r| now <= r.exp.saturating_add(leeway));
                // Little expired: start the shard afresh, so that a flood of
                // new tokens costs one sweep per shard_max/8 tokens at most.
                if before - map.len() < self.shard_max / 8 + 1 {
                    map.clear();
                }
            }
            map.insert(
                id,
                Remembered {
                    sub: claims.sub.as_str().into(),
                    exp: claims.exp,
                },
            );
        }
        Ok(claims.sub)
    }

    /// The signature and claims check of one token not in memory.
    fn check(&self, token: &str, now: u64) -> Result<Claims, Refused> {
        let header = KeyChoice::read(token)?;
        let kid = header.kid.as_deref().ok_or(Refused::Invalid)?;
        let (alg, key) = self.keys.get(kid).ok_or(Refused::Invalid)?;
        // The key decides the algorithm, never the token (an HS256 token
        // "signed" with an Ed25519 public key as its secret is refused here).
        if header.alg != alg.as_str() {
            return Err(Refused::Invalid);
        }
        let validation = match alg {
            Alg::Hs256 => &self.hs256,
            Alg::EdDsa => &self.eddsa,
        };
        let data =
            jsonwebtoken::decode::<Claims>(token, key, validation).map_err(|e| match e.kind() {
                jsonwebtoken::errors::ErrorKind::ExpiredSignature => Refused::Expired,
                _ => Refused::Invalid,
            })?;
        let c = data.claims;
        if !seckill_common::is_valid_token(&c.sub) {
            return Err(Refused::Invalid);
        }
        if c.iat
            .is_some_and(|iat| iat > now.saturating_add(self.leeway_s))
        {
            return Err(Refused::Invalid);
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use seckill_common::token::{generate, Claims as Mint, Signer};

    fn setup() -> (Verifier, Signer, Signer, Metrics) {
        let hs = generate(Alg::Hs256, "h").unwrap();
        let ed = generate(Alg::EdDsa, "e").unwrap();
        let public = seckill_common::token::parse(
            &KeySet {
                keys: vec![hs.clone(), ed.clone()],
            }
            .to_jwks(false),
        )
        .unwrap();
        (
            Verifier::new(&public, "seckill", 30, 1000),
            Signer::new(&hs).unwrap(),
            Signer::new(&ed).unwrap(),
            Metrics::default(),
        )
    }

    fn bearer(t: String) -> Credentials {
        Credentials::Bearer(t)
    }

    #[test]
    fn both_algorithms_verify_and_a_retry_is_a_lookup() {
        let (v, hs, ed, m) = setup();
        let now = now_s();
        for s in [&hs, &ed] {
            let t = s.mint(&Mint::new("alice", "seckill", 60)).unwrap();
            assert_eq!(v.verify(&bearer(t.clone()), now, &m), Ok("alice".into()));
            assert_eq!(v.verify(&bearer(t), now, &m), Ok("alice".into()));
        }
        assert_eq!((m.tokens_verified.get(), m.token_cache_hits.get()), (2, 2));
    }

    #[test]
    fn claims_are_checked_with_the_leeway() {
        let (v, hs, _, m) = setup();
        let now = now_s();
        let mint = |f: &dyn Fn(&mut Mint)| {
            let mut c = Mint::new("bob", "seckill", 60);
            f(&mut c);
            bearer(hs.mint(&c).unwrap())
        };
        let check = |c: Credentials| v.verify(&c, now, &m);
        assert_eq!(check(mint(&|c| c.exp = now - 31)), Err(Refused::Expired));
        assert_eq!(check(mint(&|c| c.exp = now - 29)), Ok("bob".into()));
        assert_eq!(
            check(mint(&|c| c.nbf = Some(now + 31))),
            Err(Refused::Invalid)
        );
        assert_eq!(check(mint(&|c| c.nbf = Some(now + 29))), Ok("bob".into()));
        assert_eq!(
            check(mint(&|c| c.iat = Some(now + 31))),
            Err(Refused::Invalid)
        );
        assert_eq!(
            check(mint(&|c| c.aud = "other".into())),
            Err(Refused::Invalid)
        );
        assert_eq!(
            check(mint(&|c| c.sub = "a b".into())),
            Err(Refused::Invalid)
        );
        // An entry remembered until exp + leeway, then expired.
        let t = mint(&|c| c.exp = now + 1);
        assert_eq!(v.verify(&t, now, &m), Ok("bob".into()));
        assert_eq!(v.verify(&t, now + 31, &m), Ok("bob".into()));
        assert_eq!(v.verify(&t, now + 32, &m), Err(Refused::Expired));
    }

    #[test]
    fn the_memory_stays_bounded() {
        let (v, hs, _, m) = setup();
        let now = now_s();
        for i in 0..5000 {
            let t = hs
                .mint(&Mint::new(&format!("u{i}"), "seckill", 60))
                .unwrap();
            assert!(v.verify(&bearer(t), now, &m).is_ok());
        }
        let held: usize = v.shards.iter().map(|s| s.lock().unwrap().len()).sum();
        assert!(held <= 1000 + SHARDS, "{held}");
    }
}
