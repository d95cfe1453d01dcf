//! Owns the buyer tokens of the tests: one fixed test key file (an HS256
//! secret and an Ed25519 key, JWKS) that every gateway a test starts
//! verifies with (`crate::command` names it in `SECKILL_AUTH_KEYS`), and
//! tokens minted for any user with it. The keys are constants: they guard
//! nothing but test gateways.

use seckill_common::token::{self, Claims, KeySet, Signer};
use std::path::PathBuf;
use std::sync::OnceLock;

/// kid of the tests' HS256 key (what [`token_for`] signs with).
pub const HS_KID: &str = "test-hs-1";
/// kid of the tests' Ed25519 key.
pub const ED_KID: &str = "test-ed-1";

/// The tests' signing key file (with the Ed25519 private part).
pub const SIGNING_JWKS: &str = r#"{"keys":[
 {"kty":"oct","kid":"test-hs-1","alg":"HS256","k":"dGVzdC1zZWNyZXQtb2Ytc2Vja2lsbC10ZXN0cy0zMmJ5dGVz"},
 {"kty":"OKP","crv":"Ed25519","kid":"test-ed-1","alg":"EdDSA","x":"bHflSl9H0EWtPbf1vh4MkwrIODLcwXvFI5bJFYoOnHU","d":"SZXGQQVUC283rO67B5BXuDj1e71j9taGHGKvKCurq2g"}
]}"#;

/// The audience the tests' tokens carry (the gateway's default).
pub const AUDIENCE: &str = "seckill";

fn signing() -> &'static KeySet {
    static SET: OnceLock<KeySet> = OnceLock::new();
    SET.get_or_init(|| token::parse(SIGNING_JWKS).expect("the tests' key file parses"))
}

/// A signer for the tests' key `kid`.
pub fn signer(kid: &str) -> Signer {
    Signer::new(signing().find(kid).expect("a test kid")).expect("a signing key")
}

/// Writes `text` to `name` under the temporary directory (same content for
/// every process, replaced through a rename) and returns the path.
fn write_once(name: &str, text: String) -> PathBuf {
    let dir = std::env::temp_dir();
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, text).expect("write a test key file");
    std::fs::rename(&tmp, &path).expect("rename a test key file");
    path
}

/// The gateway's key file of the tests (no private Ed25519 part).
pub fn gateway_key_file() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        write_once(
            "seckill-test-gateway-keys-v1.jwks",
            signing().to_jwks(false),
        )
    })
    .clone()
}

/// The tests' signing key file ([`SIGNING_JWKS`]), for `seckill-load --key`
/// (which signs with its last key: the Ed25519 one).
pub fn signing_key_file() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        write_once(
            "seckill-test-signing-keys-v1.jwks",
            SIGNING_JWKS.to_string(),
        )
    })
    .clone()
}

/// A token for `user` from the tests' HS256 key, valid for 10 minutes.
pub fn token_for(user: &str) -> String {
    static HS: OnceLock<Signer> = OnceLock::new();
    HS.get_or_init(|| signer(HS_KID))
        .mint(&Claims::new(user, AUDIENCE, 600))
        .expect("mint a test token")
}
