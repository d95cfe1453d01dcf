//! Owns `token keygen` and `token issue`: making the key files of buyer
//! tokens and minting a token from one, for operators, the demo and tests
//! (the shop's login service mints its own; docs/IDENTITY.md).

use crate::cli::{err, parse_u64, Command, Opts, UsageError};
use crate::cli_help::PROGRAM;
use crate::output::outln;
use seckill_common::token::{self, Alg, Claims, KeySet, Signer};
use std::path::Path;
use std::time::Duration;

/// Why a token command failed (exit 2).
#[derive(Debug)]
#[non_exhaustive]
pub enum TokenError {
    /// A key file could not be read or used.
    KeyFile(String, token::KeyFileError),
    /// A key file could not be written.
    Write(String, std::io::Error),
    /// No random bytes for a new key.
    Random(std::io::Error),
    /// The kid asked for is in the file already (`keygen`) or not at all
    /// (`issue`), or the file has no key that can sign.
    Kid(String),
    /// Signing failed.
    Mint(token::MintError),
}

impl std::fmt::Display for TokenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenError::KeyFile(p, e) => write!(f, "{p}: {e}"),
            TokenError::Write(p, e) => write!(f, "writing {p}: {e}"),
            TokenError::Random(e) => write!(f, "reading random bytes: {e}"),
            TokenError::Kid(m) => f.write_str(m),
            TokenError::Mint(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for TokenError {}

/// Reads the key file at `path`, or an empty set when it does not exist.
fn existing(path: &str) -> Result<Vec<token::Key>, TokenError> {
    if !Path::new(path).exists() {
        return Ok(Vec::new());
    }
    token::load(Path::new(path))
        .map(|s| s.keys)
        .map_err(|e| TokenError::KeyFile(path.to_string(), e))
}

/// Writes `keys` as a JWKS document to `path` (mode 0600: it may hold
/// secrets), replacing the file through a rename.
fn write(path: &str, keys: Vec<token::Key>, private: bool) -> Result<(), TokenError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let text = KeySet::of(keys).to_jwks(private);
    let tmp = format!("{path}.tmp");
    let w = |e| TokenError::Write(path.to_string(), e);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(w)?;
    f.write_all(text.as_bytes()).map_err(w)?;
    f.sync_all().map_err(w)?;
    std::fs::rename(&tmp, path).map_err(w)
}

/// `token keygen`: a new random key added to the signing file `--out`
/// (created when missing) and, with `--public`, its verifying half added
/// to the gateway's file (an Ed25519 key without `d`; an HS256 secret as
/// it is). Prints the kid.
///
/// Errors: [`TokenError`] (a kid already in either file, unreadable files).
pub fn keygen(a: &TokenKeygen) -> Result<u8, TokenError> {
    let mut signing = existing(&a.out)?;
    let mut public = match &a.public {
        Some(p) => existing(p)?,
        None => Vec::new(),
    };
    if signing.iter().chain(&public).any(|k| k.kid == a.kid) {
        return Err(TokenError::Kid(format!(
            "kid {:?} is in the key file already",
            a.kid
        )));
    }
    let key = token::generate(a.alg, &a.kid).map_err(TokenError::Random)?;
    signing.push(key.clone());
    write(&a.out, signing, true)?;
    if let Some(p) = &a.public {
        public.push(key);
        write(p, public, false)?;
    }
    outln!("{}", a.kid);
    Ok(0)
}

/// `token issue`: prints one token for `--user` (or `--count` of them for
/// `U-0 ..`), valid for `--ttl`, signed by `--kid` or else the last key of
/// `--key` that can sign.
///
/// Errors: [`TokenError`].
/// A `--ttl` longer than `max_ttl` (this environment's
/// `SECKILL_AUTH_MAX_TTL`, which the gateway enforces) is issued, with a
/// warning on stderr: the gateway would refuse the token.
pub fn issue(a: &TokenIssue, audience: &str, max_ttl: Duration) -> Result<u8, TokenError> {
    if a.ttl_s > max_ttl.as_secs() {
        eprintln!(
            "{PROGRAM}: warning: --ttl {} is longer than SECKILL_AUTH_MAX_TTL ({}): a gateway \
             with that maximum refuses this token (401 invalid_token); issue it with --ttl {} \
             or less, or raise SECKILL_AUTH_MAX_TTL on the gateway",
            short(a.ttl_s),
            short(max_ttl.as_secs()),
            short(max_ttl.as_secs())
        );
    }
    let set = token::load(Path::new(&a.key)).map_err(|e| TokenError::KeyFile(a.key.clone(), e))?;
    let key = match &a.kid {
        Some(kid) => set
            .find(kid)
            .ok_or_else(|| TokenError::Kid(format!("{}: no key with kid {kid:?}", a.key)))?,
        None => set.signing_key(&a.key).map_err(TokenError::Kid)?,
    };
    let signer = Signer::new(key).map_err(TokenError::Mint)?;
    let aud = a.audience.as_deref().unwrap_or(audience);
    let Some(n) = a.count else {
        let claims = Claims::new(&a.user, aud, a.ttl_s);
        outln!("{}", signer.mint(&claims).map_err(TokenError::Mint)?);
        return Ok(0);
    };
    for i in 0..n {
        let claims = Claims::new(&format!("{}-{i}", a.user), aud, a.ttl_s);
        outln!("{}", signer.mint(&claims).map_err(TokenError::Mint)?);
    }
    Ok(0)
}

/// `s` seconds as an operator writes them: `24h`, `90m`, `45s`.
fn short(s: u64) -> String {
    match s {
        _ if s % 3600 == 0 => format!("{}h", s / 3600),
        _ if s % 60 == 0 => format!("{}m", s / 60),
        _ => format!("{s}s"),
    }
}

/// Arguments of `token keygen`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenKeygen {
    /// `--alg`.
    pub alg: seckill_common::token::Alg,
    /// `--kid`: the id rule (1-64 of `A-Z a-z 0-9 _ . -`).
    pub kid: String,
    /// `--out`: the signing key file.
    pub out: String,
    /// `--public`: the gateway's key file.
    pub public: Option<String>,
}

/// Arguments of `token issue`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenIssue {
    /// `--user`: the buyer (`sub`), the user id rule.
    pub user: String,
    /// `--key`: the signing key file.
    pub key: String,
    /// `--ttl` in whole seconds (1 s to 30 days; default 10 minutes).
    pub ttl_s: u64,
    /// `--kid`.
    pub kid: Option<String>,
    /// `--audience`.
    pub audience: Option<String>,
    /// `--count`: tokens for `U-0 .. U-(N-1)` instead of one for `U`.
    pub count: Option<u64>,
}

/// `token keygen --alg HS256|EdDSA --kid K --out FILE [--public FILE]`.
pub fn parse_keygen(opts: &mut Opts) -> Result<Command, UsageError> {
    let alg = opts.take("alg").unwrap_or_default();
    let alg = seckill_common::token::Alg::parse(&alg)
        .ok_or_else(|| UsageError::new(format!("--alg {alg:?}: expected HS256 or EdDSA")))?;
    if matches!(alg, Alg::Rs256 | Alg::Es256) {
        // The gateway verifies these; the identity provider makes them.
        return err(format!(
            "--alg {}: expected HS256 or EdDSA (keygen makes the shop's own keys); an \
             identity provider's {} keys are not made here: point SECKILL_AUTH_KEYS at a \
             copy of its published JWKS (docs/IDENTITY.md, \"An identity provider's \
             published keys\")",
            alg.as_str(),
            alg.as_str()
        ));
    }
    let kid = opts
        .take("kid")
        .ok_or_else(|| UsageError::new("--kid is required"))?;
    if !seckill_common::is_valid_token(&kid) {
        return err(format!(
            "--kid {kid:?}: expected {}",
            seckill_common::TOKEN_RULE
        ));
    }
    let out = opts
        .take("out")
        .ok_or_else(|| UsageError::new("--out is required"))?;
    let public = opts.take("public");
    Ok(Command::TokenKeygen(TokenKeygen {
        alg,
        kid,
        out,
        public,
    }))
}

/// `token issue --user U --key FILE [--ttl 10m] [--kid K] [--audience A] [--count N]`.
pub fn parse_issue(opts: &mut Opts) -> Result<Command, UsageError> {
    let user = opts
        .take("user")
        .ok_or_else(|| UsageError::new("--user is required"))?;
    if !seckill_common::is_valid_token(&user) {
        return err(format!(
            "--user {user:?}: expected {}",
            seckill_common::TOKEN_RULE
        ));
    }
    let key = opts
        .take("key")
        .ok_or_else(|| UsageError::new("--key is required"))?;
    let ttl = opts.take("ttl").unwrap_or_else(|| "10m".into());
    let ttl_s = humantime::parse_duration(&ttl)
        .ok()
        .map(|d| d.as_secs())
        .filter(|s| (1..=30 * 24 * 3600).contains(s))
        .ok_or_else(|| {
            UsageError::new(format!(
                "--ttl {ttl:?}: expected a duration from 1s to 30d, such as 10m"
            ))
        })?;
    let kid = opts.take("kid");
    let audience = opts.take("audience");
    let count = match opts.take("count") {
        None => None,
        Some(c) => Some(parse_u64(&c, "--count")?.clamp(1, 100_000_000)),
    };
    if count.is_some() && !seckill_common::is_valid_token(&format!("{user}-99999999")) {
        return err("--user with --count: U-N must stay within 64 characters");
    }
    Ok(Command::TokenIssue(TokenIssue {
        user,
        key,
        ttl_s,
        kid,
        audience,
        count,
    }))
}
