//! Owns the verification of one buyer token against the key file's keys
//! (the rules: `identity.rs`'s top doc, docs/IDENTITY.md) and the memory of
//! verified tokens: remembered by the first 128 bits of their SHA-256
//! until their `exp` (plus the leeway), in [`SHARDS`] shards of at most
//! `SECKILL_AUTH_CACHE_MAX / SHARDS` entries, so a client's retries cost a
//! hash and a lookup, not a signature check.

use crate::admission::credentials::{Credentials, Refused, MAX_TOKEN_BYTES};
use crate::admission::signature::SignatureKey;
use crate::metrics::{Metrics, Why};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::{DecodingKey, Validation};
use seckill_common::token::{Alg, KeySet};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// Shards of the verified-token memory (one mutex each).
pub const SHARDS: usize = 16;

/// The claims the gateway reads; the library checks `exp`, `nbf`, `aud`.
#[derive(Deserialize)]
struct Claims {
    sub: String,
    exp: u64,
    #[serde(default)]
    iat: Option<u64>,
}

/// The header members that choose the key (`alg`, `kid`); `decode` then
/// checks the whole header itself (`decode_header` would decode it twice:
/// docs/PERFORMANCE.md, "Buyer tokens").
#[derive(Deserialize)]
struct KeyChoice {
    alg: String,
    kid: Option<String>,
    /// RFC 7515 4.1.11: extensions the token must not be taken without;
    /// the gateway understands none, so a token with `crit` is refused
    /// (`decode` does not look at it).
    crit: Option<serde::de::IgnoredAny>,
}

/// Longest header segment read (base64url); a real one is under 100 bytes.
const MAX_HEADER_B64: usize = 512;

/// The 401 the client reads for a token refused for `why`.
fn refused(why: Why) -> Refused {
    match why {
        Why::Expired => Refused::Expired,
        _ => Refused::Invalid,
    }
}

impl KeyChoice {
    /// Reads them from `token`. Errors: [`Why::Malformed`] for a header
    /// that is not base64url JSON with a string `alg`, too long, or with
    /// `crit`.
    fn read(token: &str) -> Result<KeyChoice, Why> {
        let head = token.split('.').next().unwrap_or_default();
        if head.len() > MAX_HEADER_B64 {
            return Err(Why::Malformed);
        }
        let json = URL_SAFE_NO_PAD.decode(head).map_err(|_| Why::Malformed)?;
        let choice: KeyChoice = serde_json::from_slice(&json).map_err(|_| Why::Malformed)?;
        if choice.crit.is_some() {
            return Err(Why::Malformed);
        }
        Ok(choice)
    }
}

/// One verified token in memory.
struct Remembered {
    sub: Box<str>,
    exp: u64,
    /// The key set's generation it was verified under: a token verified
    /// before a reload is checked again with the new keys.
    generation: u32,
}

/// One key of the key file, ready to verify with.
struct KeyCheck {
    /// The algorithm the key is pinned to.
    alg: Alg,
    /// Checks the signature (parsed once: `signature.rs`).
    signature: SignatureKey,
    /// What `jsonwebtoken` decodes the header and claims with (the
    /// signature checked already).
    decoding: DecodingKey,
}

/// The keys by `kid`.
type Keys = HashMap<String, KeyCheck>;

/// Verifies tokens against the keys of the key file.
pub struct Verifier {
    /// Replaced whole by [`Verifier::replace_keys`] (a reload); read only
    /// for a token not in memory, which pays a signature check anyway.
    keys: RwLock<Arc<Keys>>,
    /// Bumped after each replacement of `keys`.
    generation: AtomicU32,
    /// The claims rules, one per algorithm ([`Alg::index`]).
    validations: [Validation; 4],
    leeway_s: u64,
    /// `SECKILL_AUTH_MAX_TTL` in seconds: the longest lifetime accepted.
    max_ttl_s: u64,
    shard_max: usize,
    shards: Vec<Mutex<HashMap<u128, Remembered>>>,
}

impl Verifier {
    /// A verifier of `keys` for `audience`, with `leeway_s` seconds of clock
    /// skew, refusing tokens that live longer than `max_ttl_s` seconds
    /// ([`Verifier::lifetime_ok`]), remembering at most about `cache_max`
    /// tokens (0: none).
    pub fn new(
        keys: &KeySet,
        audience: &str,
        leeway_s: u64,
        max_ttl_s: u64,
        cache_max: usize,
    ) -> Verifier {
        Verifier::with_issuer(keys, audience, None, leeway_s, max_ttl_s, cache_max)
    }

    /// As [`Verifier::new`], and with `issuer` every token's `iss` must be
    /// exactly it (`SECKILL_AUTH_ISSUER`).
    pub fn with_issuer(
        keys: &KeySet,
        audience: &str,
        issuer: Option<&str>,
        leeway_s: u64,
        max_ttl_s: u64,
        cache_max: usize,
    ) -> Verifier {
        let validation = |alg: Alg| {
            let mut v = Validation::new(alg.jwt());
            // The signature is checked by `SignatureKey::signs` first, with
            // the key parsed once (`check`); `decode` then reads the header
            // and checks the claims, its rules unchanged. Deprecated in
            // favour of `dangerous::insecure_decode`, which checks no claim.
            #[allow(deprecated)]
            v.insecure_disable_signature_validation();
            v.leeway = leeway_s;
            v.validate_exp = true;
            v.validate_nbf = true;
            v.set_audience(&[audience]);
            match issuer {
                Some(iss) => {
                    v.set_issuer(&[iss]);
                    v.set_required_spec_claims(&["exp", "aud", "sub", "iss"]);
                }
                None => v.set_required_spec_claims(&["exp", "aud", "sub"]),
            }
            v
        };
        Verifier {
            keys: RwLock::new(Arc::new(keys_of(keys))),
            generation: AtomicU32::new(0),
            validations: Alg::ALL.map(validation),
            leeway_s,
            max_ttl_s,
            shard_max: cache_max.div_ceil(SHARDS),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }

    /// Verifies with `keys` from now on: tokens of a key no longer in the
    /// set are refused, and every remembered token is checked again once
    /// (the memory does not say which key verified it).
    pub fn replace_keys(&self, keys: &KeySet) {
        let fresh = Arc::new(keys_of(keys));
        *self.keys.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        self.generation.fetch_add(1, Ordering::AcqRel);
        for shard in &self.shards {
            shard.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
    }

    /// The buyer (`sub`) of the token in `creds` at Unix second `now`; a
    /// refusal is counted by its reason ([`Why`]) and logged at debug level.
    ///
    /// Errors: [`Refused`].
    pub fn verify(
        &self,
        creds: &Credentials,
        now: u64,
        metrics: &Metrics,
    ) -> Result<String, Refused> {
        self.verify_why(creds, now, metrics).map_err(|why| {
            metrics.token_refused(why);
            log::debug!("buyer token refused: {}", why.label());
            refused(why)
        })
    }

    /// [`Verifier::verify`] with the reason of a refusal.
    fn verify_why(&self, creds: &Credentials, now: u64, metrics: &Metrics) -> Result<String, Why> {
        let token = match creds {
            Credentials::Bearer(token) => token,
            Credentials::Missing => return Err(Why::Missing),
            Credentials::Unusable => return Err(Why::Unusable),
        };
        if token.len() > MAX_TOKEN_BYTES {
            return Err(Why::TooLong);
        }
        let digest = Sha256::digest(token.as_bytes());
        let mut id = [0u8; 16];
        id.copy_from_slice(&digest[..16]);
        let id = u128::from_le_bytes(id);
        let shard = &self.shards[(id as usize) % SHARDS];
        // Read before the keys (in `check`): a reload between the two leaves
        // this token remembered under the old generation, checked again.
        let generation = self.generation.load(Ordering::Acquire);
        if self.shard_max > 0 {
            let mut map = shard.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(r) = map.get(&id) {
                if r.generation != generation {
                    map.remove(&id);
                } else if now > r.exp.saturating_add(self.leeway_s) {
                    map.remove(&id);
                    return Err(Why::Expired);
                } else {
                    metrics.token_cache_hits.inc();
                    return Ok(r.sub.to_string());
                }
            }
        }
        let claims = self.check(token, now, metrics)?;
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
                    generation,
                },
            );
        }
        Ok(claims.sub)
    }

    /// The signature and claims check of one token not in memory.
    fn check(&self, token: &str, now: u64, metrics: &Metrics) -> Result<Claims, Why> {
        use jsonwebtoken::errors::ErrorKind;
        let header = KeyChoice::read(token)?;
        let kid = header.kid.as_deref().ok_or(Why::UnknownKid)?;
        let keys = Arc::clone(&self.keys.read().unwrap_or_else(|p| p.into_inner()));
        let key = keys.get(kid).ok_or(Why::UnknownKid)?;
        // The key decides the algorithm, never the token (an HS256 token
        // "signed" with an Ed25519 or RSA public key as its secret is
        // refused here).
        if header.alg != key.alg.as_str() {
            return Err(Why::WrongAlgorithm);
        }
        let validation = &self.validations[key.alg.index()];
        metrics.signature_checks.inc();
        if !key.signature.signs(token) {
            return Err(Why::BadSignature);
        }
        let data = jsonwebtoken::decode::<Claims>(token, &key.decoding, validation).map_err(
            |e| match e.kind() {
                ErrorKind::ExpiredSignature => Why::Expired,
                ErrorKind::InvalidSignature => Why::BadSignature,
                ErrorKind::InvalidAudience => Why::WrongAudience,
                ErrorKind::InvalidIssuer => Why::WrongIssuer,
                ErrorKind::ImmatureSignature => Why::NotYetValid,
                ErrorKind::InvalidAlgorithm => Why::WrongAlgorithm,
                _ => Why::Malformed,
            },
        )?;
        let c = data.claims;
        if !seckill_common::is_valid_token(&c.sub) {
            return Err(Why::BadSubject);
        }
        if c.iat
            .is_some_and(|iat| iat > now.saturating_add(self.leeway_s))
        {
            return Err(Why::NotYetValid);
        }
        if !self.lifetime_ok(&c, now) {
            return Err(Why::LifetimeOverMax);
        }
        Ok(c)
    }

    /// Whether a token lives at most `SECKILL_AUTH_MAX_TTL`: `exp - iat`
    /// when it says when it was issued, else `exp - now` (plus the leeway,
    /// as `now` is the gateway's clock, not the issuer's). A token valid for
    /// a year is refused even while young: a leaked one must not be worth
    /// more than the bound (RFC 8725 3.10; docs/IDENTITY.md).
    fn lifetime_ok(&self, c: &Claims, now: u64) -> bool {
        match c.iat {
            Some(iat) => c.exp.saturating_sub(iat) <= self.max_ttl_s,
            None => c.exp.saturating_sub(now) <= self.max_ttl_s.saturating_add(self.leeway_s),
        }
    }
}

/// The `sub` a compact JWS names, read without checking anything else:
/// which buyer a request says it is, never proof of it. `None` for a token
/// that is not three base64url parts with a JSON payload whose `sub` is a
/// valid buyer id.
pub fn claimed_sub(token: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Sub {
        sub: String,
    }
    if token.len() > MAX_TOKEN_BYTES {
        return None;
    }
    let mut parts = token.split('.');
    let (_, payload, _) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let json = URL_SAFE_NO_PAD.decode(payload).ok()?;
    let sub = serde_json::from_slice::<Sub>(&json).ok()?.sub;
    seckill_common::is_valid_token(&sub).then_some(sub)
}

/// The verifying keys of `set` by `kid`. A key aws-lc refuses (never one
/// `seckill_common::token::parse` took: it checks the same) verifies
/// nothing and is logged.
fn keys_of(set: &KeySet) -> Keys {
    set.keys
        .iter()
        .filter_map(|k| {
            let Some(signature) = SignatureKey::of(k) else {
                log::error!(
                    "key {:?} ({}): refused by aws-lc, verifies no token",
                    k.kid,
                    k.alg.as_str()
                );
                return None;
            };
            let check = KeyCheck {
                alg: k.alg,
                signature,
                decoding: k.decoding_key(),
            };
            Some((k.kid.clone(), check))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    fn now_s() -> u64 {
        seckill_common::now_ms() / 1000
    }
    use seckill_common::token::{generate, Claims as Mint, Signer};

    fn setup() -> (Verifier, Signer, Signer, Metrics) {
        let hs = generate(Alg::Hs256, "h").unwrap();
        let ed = generate(Alg::EdDsa, "e").unwrap();
        let public =
            seckill_common::token::parse(&KeySet::of(vec![hs.clone(), ed.clone()]).to_jwks(false))
                .unwrap();
        (
            Verifier::new(&public, "seckill", 30, 24 * 3600, 1000),
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
        // The library checks exp and nbf against its own clock, which may be
        // a second or more past `now`: each case stays 10 s off the 30 s
        // leeway's edge.
        assert_eq!(check(mint(&|c| c.exp = now - 41)), Err(Refused::Expired));
        assert_eq!(check(mint(&|c| c.exp = now - 19)), Ok("bob".into()));
        assert_eq!(
            check(mint(&|c| c.nbf = Some(now + 41))),
            Err(Refused::Invalid)
        );
        assert_eq!(check(mint(&|c| c.nbf = Some(now + 19))), Ok("bob".into()));
        assert_eq!(
            check(mint(&|c| c.iat = Some(now + 41))),
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
    fn a_token_living_longer_than_the_bound_is_refused() {
        let (v, hs, _, m) = setup();
        let now = now_s();
        let day = 24 * 3600;
        let token = |iat: Option<u64>, exp: u64| {
            let mut c = Mint::new("carol", "seckill", 60);
            (c.iat, c.exp) = (iat, exp);
            bearer(hs.mint(&c).unwrap())
        };
        let check = |c: Credentials| v.verify(&c, now, &m);
        // exp - iat, whatever the clock: exactly the bound, or one second more.
        let ok = Ok("carol".to_string());
        assert_eq!(check(token(Some(now - 10), now - 10 + day)), ok);
        assert_eq!(
            check(token(Some(now - 10), now - 9 + day)),
            Err(Refused::Invalid)
        );
        // Without iat, exp - now with the leeway.
        assert_eq!(check(token(None, now + day + 30)), ok);
        assert_eq!(check(token(None, now + day + 31)), Err(Refused::Invalid));
    }

    #[test]
    fn each_refusal_is_counted_by_its_reason() {
        let (v, hs, _, m) = setup();
        let now = now_s();
        let other = Signer::new(&generate(Alg::Hs256, "rotated").unwrap()).unwrap();
        let mut long = Mint::new("dave", "seckill", 60);
        long.iat = Some(now);
        long.exp = now + 48 * 3600;
        let mut expired = Mint::new("dave", "seckill", 60);
        expired.exp = now - 100;
        let cases = [
            (Credentials::Missing, "missing"),
            (Credentials::Unusable, "unusable"),
            (bearer("x".repeat(MAX_TOKEN_BYTES + 1)), "too_long"),
            (bearer("abc".into()), "malformed"),
            (
                bearer(other.mint(&Mint::new("dave", "seckill", 60)).unwrap()),
                "unknown_kid",
            ),
            (bearer(hs.mint(&long).unwrap()), "lifetime_over_max"),
            (bearer(hs.mint(&expired).unwrap()), "expired"),
        ];
        for (creds, _) in &cases {
            assert!(v.verify(creds, now, &m).is_err());
        }
        let page = m.render().unwrap();
        for (_, reason) in &cases {
            let line = format!("seckill_gateway_tokens_refused_total{{reason=\"{reason}\"}} 1\n");
            assert!(page.contains(&line), "{line}{page}");
        }
        let line = "seckill_gateway_tokens_refused_total{reason=\"bad_signature\"} 0\n";
        assert!(page.contains(line), "{page}");
    }

    #[test]
    fn a_token_with_a_crit_header_is_refused() {
        // RFC 7515 4.1.11: a JWS whose `crit` lists extensions the
        // recipient does not understand is invalid; the gateway understands
        // none, so any `crit` is refused.
        let hs = generate(Alg::Hs256, "h").unwrap();
        let v = Verifier::new(
            &KeySet::of(vec![hs.clone()]),
            "seckill",
            30,
            24 * 3600,
            1000,
        );
        let m = Metrics::default();
        let claims = Mint::new("dave", "seckill", 60);
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        header.kid = Some("h".into());
        let secret = URL_SAFE_NO_PAD
            .decode(hs.to_jwk(true)["k"].as_str().unwrap())
            .unwrap();
        let key = jsonwebtoken::EncodingKey::from_secret(&secret);
        let plain = jsonwebtoken::encode(&header, &claims, &key).unwrap();
        assert_eq!(v.verify(&bearer(plain), now_s(), &m), Ok("dave".into()));
        header.crit = Some(vec!["seckill-ext".into()]);
        header.extras.insert("seckill-ext".into(), "1".into());
        let critical = jsonwebtoken::encode(&header, &claims, &key).unwrap();
        assert_eq!(
            v.verify(&bearer(critical), now_s(), &m),
            Err(Refused::Invalid)
        );
    }

    #[test]
    fn a_removed_key_verifies_nothing_once_its_reload_returned_under_a_flood() {
        use std::sync::atomic::{AtomicBool, AtomicU64};
        let a = generate(Alg::Hs256, "a").unwrap();
        let b = generate(Alg::EdDsa, "b").unwrap();
        let (with_a, without_a) = (
            KeySet::of(vec![a.clone(), b.clone()]),
            KeySet::of(vec![b.clone()]),
        );
        let v = Verifier::new(&with_a, "seckill", 30, 24 * 3600, 1000);
        let m = Metrics::default();
        let ta = bearer(
            Signer::new(&a)
                .unwrap()
                .mint(&Mint::new("ann", "seckill", 600))
                .unwrap(),
        );
        let tb = bearer(
            Signer::new(&b)
                .unwrap()
                .mint(&Mint::new("ben", "seckill", 600))
                .unwrap(),
        );
        // state % 4: 0 a in the set, 1 removing it, 2 a removed, 3 adding it back.
        let state = AtomicU64::new(0);
        let stop = AtomicBool::new(false);
        let (accepted_after_removal, b_refused, a_accepted) =
            (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    while !stop.load(Ordering::SeqCst) {
                        let before = state.load(Ordering::SeqCst);
                        let ra = v.verify(&ta, now_s(), &m);
                        let after = state.load(Ordering::SeqCst);
                        if ra.is_ok() {
                            a_accepted.fetch_add(1, Ordering::SeqCst);
                            if before == after && before % 4 == 2 {
                                accepted_after_removal.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                        if v.verify(&tb, now_s(), &m) != Ok("ben".into()) {
                            b_refused.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                });
            }
            for round in 0..200u64 {
                state.store(4 * round + 1, Ordering::SeqCst);
                v.replace_keys(&without_a);
                state.store(4 * round + 2, Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_micros(500));
                state.store(4 * round + 3, Ordering::SeqCst);
                v.replace_keys(&with_a);
                state.store(4 * round + 4, Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_micros(500));
            }
            stop.store(true, Ordering::SeqCst);
        });
        assert_eq!(accepted_after_removal.load(Ordering::SeqCst), 0);
        assert_eq!(b_refused.load(Ordering::SeqCst), 0);
        assert!(a_accepted.load(Ordering::SeqCst) > 0, "the flood ran");
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
