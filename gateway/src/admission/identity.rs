//! Owns who a request is from: the buyer named by its credentials
//! (`credentials.rs`; read from the headers by `http/`), the key file read at start
//! (`SECKILL_AUTH_KEYS`, a JWKS document, `common/src/token.rs`), and the
//! rule that a buyer acts only as itself (a body `user_id` or a status path
//! naming another user: 403 `user_mismatch`). Verifying a token and the
//! memory of verified tokens: `verifier.rs`. With `SECKILL_AUTH=none` the
//! body's `user_id` is believed as sent (development only).
//!
//! A token is a compact JWS (RFC 7515/7519): `alg` HS256, EdDSA, RS256 or ES256
//! exactly as its key's, `kid` naming a key of the file, `sub` the buyer
//! (1-64 of `A-Z a-z 0-9 _ . -`), `aud` the configured audience, `exp`
//! required, `nbf` and `iat` honoured, all three with
//! `SECKILL_AUTH_LEEWAY`, and a lifetime of at most `SECKILL_AUTH_MAX_TTL`.
//! Anything else (no token, `alg: none`, an
//! algorithm that is not its key's, an unknown `kid`, a `crit` header
//! (no extension is understood here), bad base64, a bad
//! signature, a token over `MAX_TOKEN_BYTES`) is 401 `invalid_token`;
//! an expired token 401 `token_expired`; both with `WWW-Authenticate`.

use crate::admission::credentials::{Credentials, Refused};
use crate::admission::verifier::{claimed_sub, Verifier};
use crate::config::{AuthMode, IdentitySettings};
use crate::metrics::Metrics;
use seckill_common::token::Alg;
use std::fmt;

/// Why a request may not act as the buyer it asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// The token was refused (401).
    Token(Refused),
    /// The token names another buyer than the body or the path (403
    /// `user_mismatch`).
    UserMismatch,
    /// `SECKILL_AUTH=none` and the body names no buyer (400).
    NoUser,
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

/// The key file of `config`, read and checked, with a warning for each key
/// passed over and for Ed25519 private keys (a gateway needs only the
/// public half), and one line naming the keys in use.
fn load_keys(config: &IdentitySettings) -> Result<seckill_common::token::KeySet, IdentityError> {
    let path = config.keys.as_ref().ok_or(IdentityError::NoKeyFile)?;
    let keys =
        seckill_common::token::load(path).map_err(|e| IdentityError::KeyFile(path.clone(), e))?;
    for skipped in &keys.skipped {
        log::warn!("SECKILL_AUTH_KEYS={}: {skipped}", path.display());
    }
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
        "buyer tokens: {} key(s) from {} ({}), audience {:?}{}",
        keys.keys.len(),
        path.display(),
        keys.keys
            .iter()
            .map(|k| format!("{} {}", k.kid, k.alg.as_str()))
            .collect::<Vec<_>>()
            .join(", "),
        config.audience,
        config
            .issuer
            .as_deref()
            .map(|i| format!(", issuer {i:?}"))
            .unwrap_or_default()
    );
    Ok(keys)
}

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
    pub fn from_config(config: &IdentitySettings) -> Result<Identity, IdentityError> {
        if config.mode == AuthMode::None {
            log::warn!(
                "SECKILL_AUTH=none: purchases are made as the user_id in the body, unverified; \
                 anyone can buy as anyone. For development only."
            );
            return Ok(Identity::Unverified);
        }
        let keys = load_keys(config)?;
        Ok(Identity::Jwt(Box::new(Verifier::with_issuer(
            &keys,
            &config.audience,
            config.issuer.as_deref(),
            config.leeway.as_secs(),
            config.max_ttl.as_secs(),
            config.cache_max,
        ))))
    }

    /// Reads the key file again (a SIGHUP) and verifies with its keys from
    /// now on; tokens of a key that left the file are refused at once. An
    /// unusable file changes nothing: the keys in use stay.
    ///
    /// Errors: [`IdentityError`] (the old keys are kept).
    pub fn reload(&self, config: &IdentitySettings) -> Result<(), IdentityError> {
        match self {
            Identity::Unverified => Ok(()),
            Identity::Jwt(v) => {
                let keys = load_keys(config)?;
                v.replace_keys(&keys);
                Ok(())
            }
        }
    }

    /// Whether the body must name the buyer (`SECKILL_AUTH=none`).
    pub fn body_names_buyer(&self) -> bool {
        matches!(self, Identity::Unverified)
    }

    /// The buyer of a purchase: the token's `sub` (a body `user_id` must
    /// agree), or with `none` the body's `user_id` (`parse_body` made sure
    /// there is one).
    ///
    /// Errors: [`Denied`].
    pub fn buyer(
        &self,
        creds: &Credentials,
        body_user: Option<String>,
        metrics: &Metrics,
    ) -> Result<String, Denied> {
        match self {
            Identity::Unverified => body_user.ok_or(Denied::NoUser),
            Identity::Jwt(v) => {
                let sub = v.verify(creds, now_s(), metrics).map_err(Denied::Token)?;
                match body_user {
                    Some(u) if u != sub => Err(Denied::UserMismatch),
                    _ => Ok(sub),
                }
            }
        }
    }

    /// The buyer a purchase says it is for, unverified: the token's `sub`
    /// as written (`verifier::claimed_sub`), or with `none` the body's
    /// `user_id`. It may choose which buyer's public record is looked up,
    /// never what is answered: [`Identity::buyer`] decides that.
    pub fn claimed_buyer(&self, creds: &Credentials, body_user: Option<&str>) -> Option<String> {
        match (self, creds) {
            (Identity::Unverified, _) => body_user.map(str::to_string),
            (Identity::Jwt(_), Credentials::Bearer(token)) => claimed_sub(token),
            (Identity::Jwt(_), _) => None,
        }
    }

    /// Whose purchase status a `GET` may read: `path_user` is the user of
    /// `/purchases/{user}`, `None` for `/purchases/me`. With `none`, the
    /// path's user (`me` is then the user named `me`).
    ///
    /// Errors: [`Denied`] (`UserMismatch` for another buyer's status).
    pub fn reader(
        &self,
        creds: &Credentials,
        path_user: Option<&str>,
        metrics: &Metrics,
    ) -> Result<String, Denied> {
        match self {
            Identity::Unverified => Ok(path_user.unwrap_or("me").to_string()),
            Identity::Jwt(v) => {
                let sub = v.verify(creds, now_s(), metrics).map_err(Denied::Token)?;
                match path_user {
                    Some(u) if u != sub => Err(Denied::UserMismatch),
                    _ => Ok(sub),
                }
            }
        }
    }
}

pub(crate) fn now_s() -> u64 {
    seckill_common::now_ms() / 1000
}
