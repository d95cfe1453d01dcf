//! Owns buyer tokens outside the gateway's hot path: the key file (a JWKS
//! document, RFC 7517, with the key types of RFC 7518 §6.4 and RFC 8037),
//! key generation, and minting a token (a compact JWS, RFC 7515/7519) for
//! operators, the demo, the load simulator and the tests. The gateway
//! verifies with the keys read here (`gateway/src/admission/identity.rs`).
//!
//! # The key file
//!
//! ```json
//! {"keys": [
//!   {"kty": "oct", "kid": "shop-hs-2026-06", "alg": "HS256", "k": "<base64url secret>"},
//!   {"kty": "OKP", "crv": "Ed25519", "kid": "shop-ed-2026-06", "alg": "EdDSA",
//!    "x": "<base64url public key>", "d": "<base64url private key: signing files only>"}
//! ]}
//! ```
//!
//! Each key needs `kid` (unique in the file: 1-128 visible ASCII characters,
//! as providers publish them; a key made here follows the gateway's rule
//! for ids, 1-64 of `A-Z a-z 0-9 _ . -`), `alg` (`HS256`, `EdDSA`,
//! `RS256`, `ES256`; implied for RSA, EC P-256 and Ed25519 keys) and the
//! matching `kty`. An HS256 secret has at least 32 bytes (RFC 7518 §3.2);
//! an Ed25519 `x` (and `d`) exactly 32. A key with a `use` other than
//! `sig`, `key_ops` without `verify` or `sign` (RFC 7517 §4.2-4.3: not a
//! key for signatures), or another algorithm is passed over
//! ([`KeySet::skipped`]); other members are ignored. A gateway's file holds the public half of
//! Ed25519 keys (no `d`), so a gateway holds nothing that can mint a
//! token; HS256 secrets are shared by necessity.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use jsonwebtoken::{DecodingKey, EncodingKey};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::Read;
use std::path::Path;

/// A signature algorithm the gateway accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Alg {
    /// HMAC with SHA-256 over a shared secret (RFC 7518 §3.2).
    Hs256,
    /// Ed25519 signatures (RFC 8037): gateways hold only public keys.
    EdDsa,
    /// RSASSA-PKCS1-v1_5 with SHA-256 (RFC 7518 §3.3), an RSA key of 2048 to
    /// 4096 bits: what most identity providers sign with. Verify only.
    Rs256,
    /// ECDSA on P-256 with SHA-256 (RFC 7518 §3.4). Verify only.
    Es256,
}

impl Alg {
    /// The JOSE name (`HS256`, `EdDSA`).
    pub fn as_str(self) -> &'static str {
        match self {
            Alg::Hs256 => "HS256",
            Alg::EdDsa => "EdDSA",
            Alg::Rs256 => "RS256",
            Alg::Es256 => "ES256",
        }
    }

    /// Reads a JOSE name; `None` for any other algorithm.
    pub fn parse(s: &str) -> Option<Alg> {
        match s {
            "HS256" => Some(Alg::Hs256),
            "EdDSA" => Some(Alg::EdDsa),
            "RS256" => Some(Alg::Rs256),
            "ES256" => Some(Alg::Es256),
            _ => None,
        }
    }

    /// The `jsonwebtoken` algorithm.
    pub fn jwt(self) -> jsonwebtoken::Algorithm {
        match self {
            Alg::Hs256 => jsonwebtoken::Algorithm::HS256,
            Alg::EdDsa => jsonwebtoken::Algorithm::EdDSA,
            Alg::Rs256 => jsonwebtoken::Algorithm::RS256,
            Alg::Es256 => jsonwebtoken::Algorithm::ES256,
        }
    }

    /// Every accepted algorithm.
    pub const ALL: [Alg; 4] = [Alg::Hs256, Alg::EdDsa, Alg::Rs256, Alg::Es256];

    /// Its position in [`Alg::ALL`] (a table index).
    pub fn index(self) -> usize {
        match self {
            Alg::Hs256 => 0,
            Alg::EdDsa => 1,
            Alg::Rs256 => 2,
            Alg::Es256 => 3,
        }
    }
}

/// Smallest RSA modulus accepted, in bits (RFC 7518 §3.3 requires 2048).
pub const MIN_RSA_BITS: usize = 2048;

/// Largest RSA modulus accepted, in bits: keeps each token's signature
/// check cheap (a 4096-bit key costs about 4 times a 2048-bit one).
pub const MAX_RSA_BITS: usize = 4096;

/// Longest `kid` read from a key file, in characters.
pub const FILE_KID_MAX: usize = 128;

/// Whether `kid` may name a key of a key file: 1-[`FILE_KID_MAX`] visible
/// ASCII characters. Wider than the id rule keys made here follow
/// ([`generate`]), as providers publish kids such as the standard base64 of
/// a thumbprint (`+`, `/`, `=`); no space or control character, so a kid
/// printed in a log line stays one word of that line.
fn is_file_kid(kid: &str) -> bool {
    (1..=FILE_KID_MAX).contains(&kid.len()) && kid.bytes().all(|b| b.is_ascii_graphic())
}

/// The key material of one key.
#[derive(Clone, PartialEq, Eq)]
enum Material {
    /// An HS256 secret (at least 32 bytes).
    Secret(Vec<u8>),
    /// An Ed25519 public key and, in a signing file, its private seed.
    Ed25519 {
        public: [u8; 32],
        private: Option<[u8; 32]>,
    },
    /// An RSA public key: modulus and exponent, big-endian, as the JWK's `n`
    /// and `e` decode.
    Rsa { n: Vec<u8>, e: Vec<u8> },
    /// A P-256 public key: the JWK's `x` and `y` (32 bytes each).
    P256 { x: [u8; 32], y: [u8; 32] },
}

/// What checks a signature of one key ([`Key::verifying_bytes`]).
#[derive(Clone, Copy)]
pub enum VerifyingBytes<'a> {
    /// The HS256 secret.
    Secret(&'a [u8]),
    /// The Ed25519 public key.
    Ed25519(&'a [u8; 32]),
    /// An RSA public key.
    Rsa {
        /// The modulus, big-endian, without leading zeros.
        n: &'a [u8],
        /// The public exponent, big-endian, without leading zeros.
        e: &'a [u8],
    },
    /// The P-256 point, uncompressed (SEC 1: `04 || x || y`).
    P256([u8; 65]),
}

/// One key of a key file.
#[derive(Clone, PartialEq, Eq)]
pub struct Key {
    /// The `kid` that tokens name in their header.
    pub kid: String,
    /// The key's algorithm: a token must name exactly this one.
    pub alg: Alg,
    material: Material,
}

impl fmt::Debug for Key {
    // Never prints key material.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({} {})", self.kid, self.alg.as_str())
    }
}

impl Key {
    /// The key that verifies tokens of this key.
    pub fn decoding_key(&self) -> DecodingKey {
        match &self.material {
            Material::Secret(s) => DecodingKey::from_secret(s),
            Material::Ed25519 { public, .. } => DecodingKey::from_ed_der(public),
            Material::Rsa { n, e } => DecodingKey::from_rsa_raw_components(n, e),
            Material::P256 { x, y } => {
                let mut sec1 = Vec::with_capacity(65);
                sec1.push(0x04);
                sec1.extend_from_slice(x);
                sec1.extend_from_slice(y);
                DecodingKey::from_ec_der(&sec1)
            }
        }
    }

    /// The bytes a signature is checked with: the HS256 secret or the
    /// public key (the gateway parses them once per key file).
    pub fn verifying_bytes(&self) -> VerifyingBytes<'_> {
        match &self.material {
            Material::Secret(s) => VerifyingBytes::Secret(s),
            Material::Ed25519 { public, .. } => VerifyingBytes::Ed25519(public),
            Material::Rsa { n, e } => VerifyingBytes::Rsa { n, e },
            Material::P256 { x, y } => {
                let mut sec1 = [0u8; 65];
                sec1[0] = 0x04;
                sec1[1..33].copy_from_slice(x);
                sec1[33..].copy_from_slice(y);
                VerifyingBytes::P256(sec1)
            }
        }
    }

    /// Whether the key can sign (an HS256 secret, or an Ed25519 key with `d`).
    pub fn can_sign(&self) -> bool {
        match self.material {
            Material::Secret(_) => true,
            Material::Ed25519 { private, .. } => private.is_some(),
            Material::Rsa { .. } | Material::P256 { .. } => false,
        }
    }

    fn encoding_key(&self) -> Option<EncodingKey> {
        match &self.material {
            Material::Secret(s) => Some(EncodingKey::from_secret(s)),
            Material::Ed25519 { private, .. } => {
                // PKCS#8 v1 of an Ed25519 seed (RFC 8410 §7): a fixed
                // 16-byte prefix, then the 32 bytes.
                let mut der = vec![
                    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04,
                    0x22, 0x04, 0x20,
                ];
                der.extend_from_slice(private.as_ref()?);
                Some(EncodingKey::from_ed_der(&der))
            }
            Material::Rsa { .. } | Material::P256 { .. } => None,
        }
    }

    /// The key as a JWK; `private` keeps an Ed25519 key's `d` (a signing
    /// file), otherwise only the public half is written. HS256 secrets are
    /// always written (a gateway needs them).
    pub fn to_jwk(&self, private: bool) -> serde_json::Value {
        let b64 = |b: &[u8]| URL_SAFE_NO_PAD.encode(b);
        match &self.material {
            Material::Secret(s) => serde_json::json!({
                "kty": "oct", "kid": self.kid, "alg": "HS256", "k": b64(s),
            }),
            Material::Ed25519 { public, private: d } => {
                let mut v = serde_json::json!({
                    "kty": "OKP", "crv": "Ed25519", "kid": self.kid, "alg": "EdDSA",
                    "x": b64(public),
                });
                if let (true, Some(d)) = (private, d) {
                    v["d"] = serde_json::Value::String(b64(d));
                }
                v
            }
            Material::Rsa { n, e } => serde_json::json!({
                "kty": "RSA", "kid": self.kid, "alg": "RS256", "use": "sig",
                "n": b64(n), "e": b64(e),
            }),
            Material::P256 { x, y } => serde_json::json!({
                "kty": "EC", "crv": "P-256", "kid": self.kid, "alg": "ES256", "use": "sig",
                "x": b64(x), "y": b64(y),
            }),
        }
    }
}

/// The keys of one key file, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySet {
    /// At least one key; `kid`s are unique.
    pub keys: Vec<Key>,
    /// The file's keys that are not for verifying tokens here (an
    /// encryption key, a type or algorithm this gateway does not verify),
    /// passed over: the caller logs each.
    pub skipped: Vec<Skipped>,
}

/// A key of the file passed over, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Its position in `keys` (from 0).
    pub index: usize,
    /// Its `kid`, when it has one.
    pub kid: Option<String>,
    /// Why, e.g. `use "enc": an encryption key`.
    pub reason: String,
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kid {
            Some(kid) => write!(
                f,
                "keys[{}] (kid {kid:?}) skipped: {}",
                self.index, self.reason
            ),
            None => write!(f, "keys[{}] skipped: {}", self.index, self.reason),
        }
    }
}

impl KeySet {
    /// A set of `keys`, none skipped (keys made or read by this program).
    pub fn of(keys: Vec<Key>) -> KeySet {
        KeySet {
            keys,
            skipped: Vec::new(),
        }
    }

    /// The key named `kid`.
    pub fn find(&self, kid: &str) -> Option<&Key> {
        self.keys.iter().find(|k| k.kid == kid)
    }

    /// The newest key that can sign (the last in the file), or, when none
    /// can, why, for the file `path`: its keys are public only (the
    /// gateway's file, `token keygen --public`; an HS256 secret always
    /// signs), so the text names the signing file keygen wrote with it.
    pub fn signing_key(&self, path: &str) -> Result<&Key, String> {
        self.keys
            .iter()
            .rev()
            .find(|k| k.can_sign())
            .ok_or_else(|| {
                format!(
                    "{path}: no key that can sign: the file holds only public keys (the gateway's \
                 file, `token keygen --public`); give --key the signing file keygen wrote with \
                 --out (the one holding the private keys)"
                )
            })
    }

    /// The JWKS document of these keys (see [`Key::to_jwk`] for `private`).
    pub fn to_jwks(&self, private: bool) -> String {
        let keys: Vec<_> = self.keys.iter().map(|k| k.to_jwk(private)).collect();
        let mut s =
            serde_json::to_string_pretty(&serde_json::json!({ "keys": keys })).unwrap_or_default();
        s.push('\n');
        s
    }
}

/// Why a key file cannot be used.
#[derive(Debug)]
#[non_exhaustive]
pub enum KeyFileError {
    /// The file could not be read.
    Read(std::io::Error),
    /// Not a JWKS document (`{"keys": [...]}`), with serde's message.
    NotJwks(String),
    /// The file has no key.
    NoKeys,
    /// Every key of the file was passed over (`skipped`): none verifies a
    /// token here.
    NoUsableKey(Vec<Skipped>),
    /// Key number `index` (from 0) is unusable, and why.
    BadKey {
        /// Its position in `keys`.
        index: usize,
        /// Its `kid` when it has one (so the message names the key).
        kid: Option<String>,
        /// What is wrong, e.g. `an HS256 secret needs at least 32 bytes`.
        reason: String,
    },
    /// Two keys share this `kid`.
    DuplicateKid(String),
}

impl fmt::Display for KeyFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyFileError::Read(e) => write!(f, "cannot read the key file: {e}"),
            KeyFileError::NotJwks(e) => {
                write!(
                    f,
                    "the key file is not a JWKS document {{\"keys\": [...]}}: {e}"
                )
            }
            KeyFileError::NoKeys => write!(f, "the key file holds no key"),
            KeyFileError::NoUsableKey(skipped) => {
                write!(
                    f,
                    "the key file holds no key to verify tokens with (HS256, EdDSA, RS256 or \
                     ES256 signature keys)"
                )?;
                for sk in skipped {
                    write!(f, "; {sk}")?;
                }
                Ok(())
            }
            KeyFileError::BadKey {
                index,
                kid: Some(kid),
                reason,
            } => write!(f, "keys[{index}] (kid {kid:?}): {reason}"),
            KeyFileError::BadKey { index, reason, .. } => write!(f, "keys[{index}]: {reason}"),
            KeyFileError::DuplicateKid(k) => write!(f, "two keys have kid {k:?}"),
        }
    }
}

impl std::error::Error for KeyFileError {}

/// One JWK as written in the file; members we do not use are ignored.
#[derive(Deserialize)]
struct RawJwk {
    kty: Option<String>,
    kid: Option<String>,
    alg: Option<String>,
    crv: Option<String>,
    k: Option<String>,
    x: Option<String>,
    y: Option<String>,
    n: Option<String>,
    e: Option<String>,
    d: Option<String>,
    /// RFC 7517 §4.2: `sig` or `enc`; a key for encryption is not one to
    /// verify signatures with.
    #[serde(rename = "use")]
    use_: Option<String>,
    /// RFC 7517 §4.3: what the key may do; without `verify` (or `sign`)
    /// it may not check a token.
    key_ops: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct RawJwks {
    keys: Vec<RawJwk>,
}

/// Reads and checks the key file at `path` ([`parse`]).
///
/// Errors: [`KeyFileError`].
pub fn load(path: &Path) -> Result<KeySet, KeyFileError> {
    let text = std::fs::read_to_string(path).map_err(KeyFileError::Read)?;
    parse(&text)
}

/// Parses and checks a JWKS document (the rules are in the file's top
/// comment). An Ed25519 key with `d` must have the `x` that `d` gives.
///
/// Errors: [`KeyFileError`] naming the first unusable key.
pub fn parse(text: &str) -> Result<KeySet, KeyFileError> {
    let raw: RawJwks =
        serde_json::from_str(text).map_err(|e| KeyFileError::NotJwks(e.to_string()))?;
    if raw.keys.is_empty() {
        return Err(KeyFileError::NoKeys);
    }
    let mut keys: Vec<Key> = Vec::with_capacity(raw.keys.len());
    let mut skipped = Vec::new();
    for (index, j) in raw.keys.into_iter().enumerate() {
        let kid = j.kid.clone();
        let key = match one_key(j) {
            Ok(key) => key,
            Err(KeyProblem::Skip(reason)) => {
                skipped.push(Skipped { index, kid, reason });
                continue;
            }
            Err(KeyProblem::Broken(reason)) => {
                return Err(KeyFileError::BadKey { index, kid, reason })
            }
        };
        if keys.iter().any(|k| k.kid == key.kid) {
            return Err(KeyFileError::DuplicateKid(key.kid));
        }
        keys.push(key);
    }
    if keys.is_empty() {
        return Err(KeyFileError::NoUsableKey(skipped));
    }
    Ok(KeySet { keys, skipped })
}

/// Why one JWK gives no key.
enum KeyProblem {
    /// Not a key to verify tokens with here (an encryption key, a type or
    /// algorithm not accepted): passed over with a warning.
    Skip(String),
    /// A signature key of an accepted kind whose content is unusable (a
    /// short RSA modulus, a point off the curve, bad base64): the whole file
    /// is refused, as its author meant this key to verify tokens.
    Broken(String),
}

impl From<String> for KeyProblem {
    fn from(s: String) -> Self {
        KeyProblem::Broken(s)
    }
}

impl From<&str> for KeyProblem {
    fn from(s: &str) -> Self {
        KeyProblem::Broken(s.to_string())
    }
}

/// The algorithm a JWK is pinned to: its `alg`, or for a key type with one
/// accepted algorithm only (RSA: RS256, EC P-256: ES256, OKP Ed25519:
/// EdDSA) the one its type implies, as providers often leave `alg` out.
fn pinned_alg(j: &RawJwk) -> Result<Alg, KeyProblem> {
    let implied = match (j.kty.as_deref(), j.crv.as_deref()) {
        (Some("RSA"), _) => Some(Alg::Rs256),
        (Some("EC"), Some("P-256")) => Some(Alg::Es256),
        (Some("OKP"), Some("Ed25519")) => Some(Alg::EdDsa),
        _ => None,
    };
    match (j.alg.as_deref(), implied) {
        (Some(name), _) => Alg::parse(name).ok_or_else(|| {
            KeyProblem::Skip(format!(
                "alg {name:?} is not verified here (HS256, EdDSA, RS256 or ES256)"
            ))
        }),
        (None, Some(alg)) => Ok(alg),
        (None, None) => match j.kty.as_deref() {
            Some("oct") => Err("no alg (an oct key needs alg HS256)".into()),
            Some(kty) => Err(KeyProblem::Skip(format!(
                "kty {kty:?}{} is not verified here",
                j.crv
                    .as_deref()
                    .map(|c| format!(" crv {c:?}"))
                    .unwrap_or_default()
            ))),
            None => Err("no kty".into()),
        },
    }
}

fn one_key(j: RawJwk) -> Result<Key, KeyProblem> {
    signature_use(&j)?;
    let alg = pinned_alg(&j)?;
    let kid = j.kid.clone().ok_or("no kid")?;
    if !is_file_kid(&kid) {
        return Err(format!(
            "kid must be 1-{FILE_KID_MAX} visible ASCII characters (no space or control \
             character)"
        )
        .into());
    }
    let material = match (alg, j.kty.as_deref()) {
        (Alg::Hs256, Some("oct")) => secret(j)?,
        (Alg::EdDsa, Some("OKP")) => ed25519_key(j)?,
        (Alg::Rs256, Some("RSA")) => rsa_public_key(j)?,
        (Alg::Es256, Some("EC")) => p256_public_key(j)?,
        (Alg::Hs256, _) => return Err("an HS256 key needs kty oct".into()),
        (Alg::EdDsa, _) => return Err("an EdDSA key needs kty OKP".into()),
        (Alg::Rs256, _) => return Err("an RS256 key needs kty RSA".into()),
        (Alg::Es256, _) => return Err("an ES256 key needs kty EC".into()),
    };
    Ok(Key { kid, alg, material })
}

/// Passes over a JWK whose `use` or `key_ops` say it does not check
/// signatures.
fn signature_use(j: &RawJwk) -> Result<(), KeyProblem> {
    if let Some(u) = j.use_.as_deref().filter(|u| *u != "sig") {
        return Err(KeyProblem::Skip(format!(
            "use {u:?}: only a signature key (use \"sig\") checks tokens"
        )));
    }
    if let Some(ops) = &j.key_ops {
        if !ops.iter().any(|o| o == "verify" || o == "sign") {
            return Err(KeyProblem::Skip(format!(
                "key_ops {ops:?} has neither \"verify\" nor \"sign\": not a key to check tokens with"
            )));
        }
    }
    Ok(())
}

/// The bytes of JWK member `name` (base64url, padding tolerated).
fn b64(name: &str, v: Option<String>) -> Result<Vec<u8>, String> {
    let v = v.ok_or(format!("no {name}"))?;
    URL_SAFE_NO_PAD
        .decode(v.trim_end_matches('='))
        .map_err(|_| format!("{name} is not base64url"))
}

/// The HS256 secret of an `oct` JWK (at least 32 bytes).
fn secret(j: RawJwk) -> Result<Material, KeyProblem> {
    let k = b64("k", j.k)?;
    if k.len() < 32 {
        return Err("an HS256 secret needs at least 32 bytes (RFC 7518 3.2)".into());
    }
    Ok(Material::Secret(k))
}

/// The Ed25519 key of an `OKP` JWK: its public key (never a weak point)
/// and, when it has `d`, the private seed matching it.
fn ed25519_key(j: RawJwk) -> Result<Material, KeyProblem> {
    if j.crv.as_deref() != Some("Ed25519") {
        return Err("an EdDSA key needs crv Ed25519".into());
    }
    let x: [u8; 32] = b64("x", j.x)?
        .try_into()
        .map_err(|_| "x must be 32 bytes".to_string())?;
    let private = match j.d {
        None => None,
        Some(d) => {
            let d: [u8; 32] = b64("d", Some(d))?
                .try_into()
                .map_err(|_| "d must be 32 bytes".to_string())?;
            if ed25519_public(&d) != x {
                return Err("x is not the public key of d".into());
            }
            Some(d)
        }
    };
    let public = ed25519_dalek::VerifyingKey::from_bytes(&x)
        .map_err(|_| "x is not an Ed25519 public key".to_string())?;
    // A small-order point verifies forged signatures (RFC 8032,
    // 5.1.7 leaves it to the verifier): such a key is never real.
    if public.is_weak() {
        return Err("x is a weak (small-order) Ed25519 point".into());
    }
    Ok(Material::Ed25519 { public: x, private })
}

/// The RS256 public key of an `RSA` JWK (modulus within the accepted
/// sizes; a private key is refused).
fn rsa_public_key(j: RawJwk) -> Result<Material, KeyProblem> {
    let n = strip_zeros(b64("n", j.n)?);
    let e = strip_zeros(b64("e", j.e)?);
    let bits = n.len() * 8 - n.first().map_or(8, |b| b.leading_zeros() as usize);
    if bits < MIN_RSA_BITS {
        return Err(
            format!("an RS256 modulus needs at least {MIN_RSA_BITS} bits, n has {bits}").into(),
        );
    }
    if bits > MAX_RSA_BITS {
        return Err(format!(
            "an RS256 modulus has at most {MAX_RSA_BITS} bits here (each token's check \
             stays cheap), n has {bits}"
        )
        .into());
    }
    rsa_public_rules(&n, &e).map_err(|err| format!("n and e are not an RSA public key: {err}"))?;
    if j.d.is_some() {
        return Err("an RS256 key here is a public key: remove d (and p, q...)".into());
    }
    Ok(Material::Rsa { n, e })
}

/// Largest RSA public exponent accepted: 2^33 - 1, the bound of RSA
/// verifiers (aws-lc, ring, RustCrypto's `rsa`).
const MAX_RSA_EXPONENT: u64 = (1 << 33) - 1;

/// Why `n` and `e` (big-endian, without leading zeros, `n` within the
/// accepted sizes) are not an RSA public key: `e` over 2^33 - 1 or not
/// below `n`, `n` even, `e` even or below 2. A key failing one would verify
/// nothing.
fn rsa_public_rules(n: &[u8], e: &[u8]) -> Result<(), &'static str> {
    let too_large = "public exponent too large";
    if e.len() > 8 {
        return Err(too_large);
    }
    let e_value = e.iter().fold(0u64, |v, b| (v << 8) | u64::from(*b));
    // Both without leading zeros: the longer is the larger.
    let e_below_n = e.len() < n.len() || (e.len() == n.len() && e < n);
    if !e_below_n || n.last().is_none_or(|b| b % 2 == 0) {
        return Err("invalid modulus");
    }
    if e_value % 2 == 0 {
        return Err("invalid exponent");
    }
    if e_value < 2 {
        return Err("public exponent too small");
    }
    if e_value > MAX_RSA_EXPONENT {
        return Err(too_large);
    }
    Ok(())
}

/// The ES256 public key of an `EC` JWK (a point of P-256; a private key is
/// refused).
fn p256_public_key(j: RawJwk) -> Result<Material, KeyProblem> {
    if j.crv.as_deref() != Some("P-256") {
        return Err("an ES256 key needs crv P-256".into());
    }
    let x: [u8; 32] = b64("x", j.x)?
        .try_into()
        .map_err(|_| "x must be 32 bytes".to_string())?;
    let y: [u8; 32] = b64("y", j.y)?
        .try_into()
        .map_err(|_| "y must be 32 bytes".to_string())?;
    let mut sec1 = [0u8; 65];
    sec1[0] = 0x04;
    sec1[1..33].copy_from_slice(&x);
    sec1[33..].copy_from_slice(&y);
    // aws-lc parses the point as it verifies with it: on the curve, both
    // coordinates below the field's prime.
    aws_lc_rs::signature::ParsedPublicKey::new(
        &aws_lc_rs::signature::ECDSA_P256_SHA256_FIXED,
        sec1,
    )
    .map_err(|_| "x and y are not a point of P-256".to_string())?;
    if j.d.is_some() {
        return Err("an ES256 key here is a public key: remove d".into());
    }
    Ok(Material::P256 { x, y })
}

/// `v` without its leading zero bytes (a big-endian integer as JWKs write
/// it, sometimes with a sign byte).
fn strip_zeros(v: Vec<u8>) -> Vec<u8> {
    let first = v.iter().position(|b| *b != 0).unwrap_or(v.len());
    v[first..].to_vec()
}

fn ed25519_public(seed: &[u8; 32]) -> [u8; 32] {
    ed25519_dalek::SigningKey::from_bytes(seed)
        .verifying_key()
        .to_bytes()
}

/// A new random key (32 bytes from `/dev/urandom`: the HS256 secret, or
/// the Ed25519 seed).
///
/// Errors: the random source cannot be read; `kid` breaks the id rule
/// (`InvalidInput`).
pub fn generate(alg: Alg, kid: &str) -> std::io::Result<Key> {
    if !crate::is_valid_token(kid) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("kid must be {}", crate::TOKEN_RULE),
        ));
    }
    let mut seed = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut seed)?;
    let material = match alg {
        Alg::Hs256 => Material::Secret(seed.to_vec()),
        Alg::EdDsa => Material::Ed25519 {
            public: ed25519_public(&seed),
            private: Some(seed),
        },
        Alg::Rs256 | Alg::Es256 => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "{} keys are verified, not made, here: use the identity provider's \
                     published keys (docs/IDENTITY.md)",
                    alg.as_str()
                ),
            ))
        }
    };
    Ok(Key {
        kid: kid.to_string(),
        alg,
        material,
    })
}

/// The claims of a buyer token. `sub` is the buyer; times are Unix seconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// The buyer's user id (the gateway's rule: 1-64 of `A-Z a-z 0-9 _ . -`).
    pub sub: String,
    /// The audience (the gateway's `SECKILL_AUTH_AUDIENCE`, default `seckill`).
    pub aud: String,
    /// Expiry (required by the gateway).
    pub exp: u64,
    /// Issued at.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub iat: Option<u64>,
    /// Not before.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub nbf: Option<u64>,
}

impl Claims {
    /// Claims for `sub` and `aud`, issued now, valid for `ttl_s` seconds.
    pub fn new(sub: &str, aud: &str, ttl_s: u64) -> Claims {
        let now = crate::now_ms() / 1000;
        Claims {
            sub: sub.to_string(),
            aud: aud.to_string(),
            exp: now + ttl_s,
            iat: Some(now),
            nbf: None,
        }
    }
}

/// Why a token could not be minted.
#[derive(Debug)]
#[non_exhaustive]
pub enum MintError {
    /// The key has no private half (an Ed25519 key without `d`).
    NotASigningKey(String),
    /// The signing library refused (its message).
    Sign(String),
}

impl fmt::Display for MintError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MintError::NotASigningKey(kid) => write!(
                f,
                "key {kid:?} cannot sign: an Ed25519 key needs its private part d"
            ),
            MintError::Sign(e) => write!(f, "signing: {e}"),
        }
    }
}

impl std::error::Error for MintError {}

/// A key ready to sign many tokens.
pub struct Signer {
    kid: String,
    header: jsonwebtoken::Header,
    key: EncodingKey,
}

impl Signer {
    /// A signer for `key`.
    ///
    /// Errors: [`MintError::NotASigningKey`].
    pub fn new(key: &Key) -> Result<Signer, MintError> {
        let enc = key
            .encoding_key()
            .ok_or_else(|| MintError::NotASigningKey(key.kid.clone()))?;
        let mut header = jsonwebtoken::Header::new(key.alg.jwt());
        header.kid = Some(key.kid.clone());
        Ok(Signer {
            kid: key.kid.clone(),
            header,
            key: enc,
        })
    }

    /// The signing key's `kid`.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// A compact JWS of `claims` (`header.payload.signature`, base64url).
    ///
    /// Errors: [`MintError::Sign`].
    pub fn mint(&self, claims: &Claims) -> Result<String, MintError> {
        jsonwebtoken::encode(&self.header, claims, &self.key)
            .map_err(|e| MintError::Sign(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_round_trip_and_keep_d_only_in_signing_files() {
        let ed = generate(Alg::EdDsa, "e1").unwrap();
        let hs = generate(Alg::Hs256, "h1").unwrap();
        let set = KeySet::of(vec![hs.clone(), ed.clone()]);
        let signing = parse(&set.to_jwks(true)).unwrap();
        assert_eq!(signing, set);
        let public = parse(&set.to_jwks(false)).unwrap();
        assert!(public.find("h1").unwrap().can_sign());
        assert!(!public.find("e1").unwrap().can_sign());
        assert!(signing.find("e1").unwrap().can_sign());
        assert!(matches!(
            Signer::new(public.find("e1").unwrap()),
            Err(MintError::NotASigningKey(_))
        ));
        let t = Signer::new(&ed)
            .unwrap()
            .mint(&Claims::new("alice", "seckill", 60))
            .unwrap();
        assert_eq!(t.split('.').count(), 3);
        // The newest key that signs; a public-only file says which to use.
        assert_eq!(signing.signing_key("k.jwks").unwrap().kid, "e1");
        let only_public = parse(&KeySet::of(vec![ed]).to_jwks(false)).unwrap();
        let why = only_public.signing_key("gw.jwks").unwrap_err();
        assert!(
            why.starts_with("gw.jwks: no key that can sign: the file holds only public keys")
                && why.contains("--out"),
            "{why}"
        );
    }

    #[test]
    fn unusable_key_files_are_refused_with_the_reason() {
        let bad = |s: &str| match parse(s) {
            Err(KeyFileError::BadKey { reason, .. }) => reason,
            other => panic!("{other:?}"),
        };
        assert!(matches!(parse("[]"), Err(KeyFileError::NotJwks(_))));
        assert!(matches!(parse(r#"{"keys":[]}"#), Err(KeyFileError::NoKeys)));
        assert!(
            bad(r#"{"keys":[{"kty":"oct","kid":"a","alg":"HS256","k":"c2hvcnQ"}]}"#)
                .contains("32 bytes")
        );
        // A file whose only keys are passed over holds no usable key.
        let none_usable = |s: &str| match parse(s) {
            Err(KeyFileError::NoUsableKey(skipped)) => {
                assert_eq!(skipped.len(), 1, "{skipped:?}");
                skipped[0].reason.clone()
            }
            other => panic!("{other:?}"),
        };
        assert!(
            none_usable(r#"{"keys":[{"kty":"oct","kid":"a","alg":"HS256","use":"enc","k":"x"}]}"#)
                .contains("use \"enc\""),
            "a key for encryption"
        );
        assert!(
            none_usable(
                r#"{"keys":[{"kty":"oct","kid":"a","alg":"HS256","key_ops":["encrypt"],"k":"x"}]}"#
            )
            .contains("key_ops"),
            "a key that may not verify"
        );
        assert!(
            none_usable(r#"{"keys":[{"kty":"oct","kid":"a","alg":"none","k":"x"}]}"#)
                .contains("not verified here")
        );
        assert!(
            none_usable(r#"{"keys":[{"kty":"EC","crv":"P-384","kid":"a","x":"x","y":"y"}]}"#)
                .contains("P-384")
        );
        assert!(bad(
            r#"{"keys":[{"kty":"OKP","crv":"Ed25519","kid":"a","alg":"EdDSA","x":"AAAA"}]}"#
        )
        .contains("32 bytes"));
        assert!(
            bad(r#"{"keys":[{"kty":"OKP","kid":"a","alg":"HS256","k":"x"}]}"#).contains("kty oct")
        );
        assert!(
            bad(r#"{"keys":[{"kty":"oct","kid":"a b","alg":"HS256","k":"x"}]}"#).contains("kid")
        );
        let k = URL_SAFE_NO_PAD.encode([7u8; 32]);
        let two = format!(
            r#"{{"keys":[{{"kty":"oct","kid":"a","alg":"HS256","k":"{k}"}},{{"kty":"oct","kid":"a","alg":"HS256","k":"{k}"}}]}}"#
        );
        assert!(matches!(parse(&two), Err(KeyFileError::DuplicateKid(_))));
    }

    #[test]
    fn provider_keys_are_taken_skipped_or_refused_key_by_key() {
        let b = |v: &[u8]| URL_SAFE_NO_PAD.encode(v);
        // The P-256 generator G: a real point.
        let gx = "axfR8uEsQkf4vOblY6RA8ncDfYEt6zOg9KE5RdiYwpY";
        let gy = "T-NC4v4af5uO5-tKfA-eFivOM1drMV7Oy7ZAaDe_UfU";
        let mut n = vec![0xc5u8; 256];
        n[255] = 0x01;
        let e = b(&[1, 0, 1]);
        let file = format!(
            r#"{{"keys":[
              {{"kty":"RSA","kid":"r1","use":"sig","alg":"RS256","n":"{n}","e":"{e}","x5c":["MIIB"]}},
              {{"kty":"RSA","kid":"r2","n":"{n}","e":"{e}"}},
              {{"kty":"RSA","kid":"enc","use":"enc","alg":"RSA-OAEP","n":"{n}","e":"{e}"}},
              {{"kty":"RSA","kid":"r384","alg":"RS384","n":"{n}","e":"{e}"}},
              {{"kty":"EC","kid":"e1","crv":"P-256","x":"{gx}","y":"{gy}"}}
            ]}}"#,
            n = b(&n),
        );
        let set = parse(&file).unwrap();
        let kept: Vec<_> = set.keys.iter().map(|k| (k.kid.as_str(), k.alg)).collect();
        assert_eq!(
            kept,
            [("r1", Alg::Rs256), ("r2", Alg::Rs256), ("e1", Alg::Es256)]
        );
        let skipped: Vec<_> = set.skipped.iter().map(|s| s.kid.as_deref()).collect();
        assert_eq!(skipped, [Some("enc"), Some("r384")]);
        assert!(set.keys.iter().all(|k| !k.can_sign()));

        let refused = |file: String| match parse(&file) {
            Err(KeyFileError::BadKey { reason, .. }) => reason,
            other => panic!("{other:?}"),
        };
        let short = b(&[0xc5u8; 128]);
        assert!(refused(format!(
            r#"{{"keys":[{{"kty":"RSA","kid":"s","alg":"RS256","n":"{short}","e":"{e}"}}]}}"#
        ))
        .contains("2048 bits, n has 1024"));
        let off_curve = b(&[7u8; 32]);
        assert!(refused(format!(
            r#"{{"keys":[{{"kty":"EC","kid":"o","crv":"P-256","alg":"ES256","x":"{gx}","y":"{off_curve}"}}]}}"#
        ))
        .contains("not a point of P-256"));
        // A usable key beside the broken one does not save the file.
        assert!(refused(format!(
            r#"{{"keys":[{{"kty":"EC","kid":"e1","crv":"P-256","x":"{gx}","y":"{gy}"}},
               {{"kty":"RSA","kid":"s","alg":"RS256","n":"{short}","e":"{e}"}}]}}"#
        ))
        .contains("2048"));
    }

    #[test]
    fn a_provider_kid_in_standard_base64_is_taken() {
        // Some providers publish a kid as standard base64 of a thumbprint
        // (`+`, `/`, `=`), as a user pool's jwks.json does.
        let b = |v: &[u8]| URL_SAFE_NO_PAD.encode(v);
        let mut n = vec![0xc5u8; 256];
        n[255] = 0x01;
        let kid = "vyVQH7UMjwYboVvyFf+zd4KHZfgc+RtmU/A2vHhgITI=";
        let file = format!(
            r#"{{"keys":[{{"alg":"RS256","e":"AQAB","kid":"{kid}","kty":"RSA","n":"{n}","use":"sig"}}]}}"#,
            n = b(&n),
        );
        let set = parse(&file).unwrap();
        assert_eq!(set.find(kid).map(|k| k.alg), Some(Alg::Rs256));
        // Still refused: an empty kid, a control character or a space, an
        // id longer than the bound.
        let with_kid = |kid: &str| {
            let file = format!(
                r#"{{"keys":[{{"e":"AQAB","kid":{kid},"kty":"RSA","n":"{n}"}}]}}"#,
                kid = serde_json::Value::String(kid.into()),
                n = b(&n),
            );
            match parse(&file) {
                Err(KeyFileError::BadKey { reason, .. }) => reason,
                other => panic!("{other:?}"),
            }
        };
        for bad in [
            "",
            "a b",
            "a\nb",
            "k\u{1b}[2J",
            &"k".repeat(FILE_KID_MAX + 1),
        ] {
            assert!(with_kid(bad).contains("kid must be"), "{bad:?}");
        }
    }

    #[test]
    fn an_rsa_key_over_4096_bits_is_refused_naming_the_bound() {
        // 8192 bits: a real RSA modulus size, past what is verified here.
        let mut n = vec![0xc5u8; 1024];
        n[1023] = 0x01;
        let file = format!(
            r#"{{"keys":[{{"kty":"RSA","kid":"big","n":"{}","e":"AQAB"}}]}}"#,
            URL_SAFE_NO_PAD.encode(&n)
        );
        match parse(&file) {
            Err(KeyFileError::BadKey { reason, .. }) => assert_eq!(
                reason,
                "an RS256 modulus has at most 4096 bits here (each token's check stays \
                 cheap), n has 8192"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_small_order_ed25519_key_is_refused() {
        // The identity point (1, 0...): with it as the key, a forged
        // signature `R = identity, s = 0` verifies for any message.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        let x = URL_SAFE_NO_PAD.encode(identity);
        let file = format!(
            r#"{{"keys":[{{"kty":"OKP","crv":"Ed25519","kid":"w","alg":"EdDSA","x":"{x}"}}]}}"#
        );
        match parse(&file) {
            Err(KeyFileError::BadKey { reason, .. }) => {
                assert_eq!(reason, "x is a weak (small-order) Ed25519 point");
            }
            other => panic!("{other:?}"),
        }
    }
}
