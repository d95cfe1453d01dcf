//! Owns the signature check of one compact JWS (RFC 7515) with one key of
//! the key file: the key parsed once, when the file is read (an RSA key's
//! Montgomery set-up, a P-256 point's check), then each token costs the
//! signature check alone, by aws-lc (`aws-lc-rs`: docs/PERFORMANCE.md,
//! "Buyer tokens"). HS256 compares its MAC in constant time. The claims
//! and every other rule are the verifier's (`verifier.rs`).

use aws_lc_rs::hmac;
use aws_lc_rs::signature::{
    ParsedPublicKey, RsaPublicKeyComponents, ECDSA_P256_SHA256_FIXED, ED25519,
    RSA_PKCS1_2048_8192_SHA256,
};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use seckill_common::token::{Key, VerifyingBytes};

/// A key ready to check signatures.
pub enum SignatureKey {
    /// HS256: HMAC-SHA256 with the shared secret (boxed: 1.2 KiB of
    /// precomputed state).
    Hmac(Box<hmac::Key>),
    /// RS256 (PKCS#1 v1.5, SHA-256, 2048-8192 bits), ES256 (P-256, SHA-256,
    /// `r || s` of 32 bytes each, RFC 7518 3.4) or EdDSA (Ed25519).
    Public(ParsedPublicKey),
}

impl SignatureKey {
    /// The check of `key`'s signatures; `None` when aws-lc refuses the
    /// key (a key read by `seckill_common::token::parse` passed the same
    /// rules before).
    pub fn of(key: &Key) -> Option<SignatureKey> {
        let parsed = match key.verifying_bytes() {
            VerifyingBytes::Secret(s) => {
                return Some(SignatureKey::Hmac(Box::new(hmac::Key::new(
                    hmac::HMAC_SHA256,
                    s,
                ))))
            }
            VerifyingBytes::Ed25519(x) => ParsedPublicKey::new(&ED25519, x),
            VerifyingBytes::Rsa { n, e } => {
                RsaPublicKeyComponents { n, e }.to_parsed_public_key(&RSA_PKCS1_2048_8192_SHA256)
            }
            VerifyingBytes::P256(sec1) => ParsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, sec1),
        };
        parsed.ok().map(SignatureKey::Public)
    }

    /// Whether `token`'s last segment (base64url, no padding) signs all
    /// that comes before its last `.` (the signing input) with this key.
    pub fn signs(&self, token: &str) -> bool {
        let Some((input, signature)) = token.rsplit_once('.') else {
            return false;
        };
        let Ok(signature) = URL_SAFE_NO_PAD.decode(signature) else {
            return false;
        };
        match self {
            SignatureKey::Hmac(key) => hmac::verify(key, input.as_bytes(), &signature).is_ok(),
            SignatureKey::Public(key) => key.verify_sig(input.as_bytes(), &signature).is_ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    //! The published vectors: RFC 7515 Appendix A.2 (RS256) and A.3
    //! (ES256), RFC 8037 Appendix A.4 (Ed25519), each checked as published,
    //! with one byte changed and cut short at every length; and ES256's
    //! other valid signature of the same input, `(r, n - s)` (A.3's own `s`
    //! is the high one, so both forms verify: ECDSA, FIPS 186-4 and RFC
    //! 7518 3.4, accept either).

    use super::*;
    use seckill_common::token::parse;

    /// The payload of RFC 7515's examples (`{"iss":"joe", ...}`).
    const A_PAYLOAD: &str =
        "eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFtcGxlLmNvbS9pc19yb290Ijp0cnVlfQ";

    const A2_N: &str = concat!(
        "ofgWCuLjybRlzo0tZWJjNiuSfb4p4fAkd_wWJcyQoTbji9k0l8W26mPddxHmfHQp-Vaw-4qPCJrcS2mJPMEzP1Pt0",
        "Bm4d4QlL-yRT-SFd2lZS-pCgNMsD1W_YpRPEwOWvG6b32690r2jZ47soMZo9wGzjb_7OMg0LOL-bSf63kpaSHSXnd",
        "S5z5rexMdbBYUsLA9e-KXBdQOS-UTo7WTBEMa2R2CapHg665xsmtdVMTBQY4uDZlxvb3qCo5ZwKh9kG4LT6_I5Ihl",
        "JH7aGhyxXFvUK-DWNmoudF8NAco9_h9iaGNj8q2ethFkMLs91kzk2PAcDTW9gb54h4FRWyuXpoQ",
    );
    const A2_SIG: &str = concat!(
        "cC4hiUPoj9Eetdgtv3hF80EGrhuB__dzERat0XF9g2VtQgr9PJbu3XOiZj5RZmh7AAuHIm4Bh-0Qc_lF5YKt_O8W2",
        "Fp5jujGbds9uJdbF9CUAr7t1dnZcAcQjbKBYNX4BAynRFdiuB--f_nZLgrnbyTyWzO75vRK5h6xBArLIARNPvkSjt",
        "QBMHlb1L07Qe7K0GarZRmB_eSN9383LcOLn6_dO--xi12jzDwusC-eOkHWEsqtFZESc6BfI7noOPqvhJ1phCnvWh6",
        "IeYI2w9QOYEUipUTI8np6LbgGY9Fs98rqVt5AXLIhWkWywlVmtVrBp0igcN_IoypGlUPQGe77Rw",
    );
    const A3_X: &str = "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU";
    const A3_Y: &str = "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0";
    const A3_SIG: &str =
        "DtEhU3ljbEg8L38VWAfUAqOyKAM6-Xx-F4GawxaepmXFCgfTjDxw5djxLa8ISlSApmWQxfKTUJqPP3-Kg6NU1Q";
    const RFC8037_X: &str = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";
    const RFC8037_D: &str = "nWGxne_9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A";
    const RFC8037_JWS: &str = concat!(
        "eyJhbGciOiJFZERTQSJ9.RXhhbXBsZSBvZiBFZDI1NTE5IHNpZ25pbmc.",
        "hgyY0il_MGCjP0JzlnLWG1PPOt7-09PGcvMg3AIbQR6dWbhijcNR4ki4iylGjg5BhVsPt9g7sVvpAr_MuM0KAg",
    );
    /// The order of P-256's group (FIPS 186-4 D.1.2.3), big-endian.
    const P256_ORDER: [u8; 32] = [
        0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0xff, 0xbc, 0xe6, 0xfa, 0xad, 0xa7, 0x17, 0x9e, 0x84, 0xf3, 0xb9, 0xca, 0xc2, 0xfc, 0x63,
        0x25, 0x51,
    ];

    /// (n - 1) / 2 of [`P256_ORDER`]: an `s` above it is high.
    const P256_HALF_ORDER: [u8; 32] = [
        0x7f, 0xff, 0xff, 0xff, 0x80, 0x00, 0x00, 0x00, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0xff, 0xde, 0x73, 0x7d, 0x56, 0xd3, 0x8b, 0xcf, 0x42, 0x79, 0xdc, 0xe5, 0x61, 0x7e, 0x31,
        0x92, 0xa8,
    ];

    /// The check of the one key of the JWKS `jwk` (a JSON object), read by
    /// the key file's own parser.
    fn key_of(jwk: &str) -> SignatureKey {
        let set = parse(&format!(r#"{{"keys":[{jwk}]}}"#)).unwrap();
        SignatureKey::of(&set.keys[0]).unwrap()
    }

    /// `token` with the byte at `at` changed (to another base64url digit).
    fn changed(token: &str, at: usize) -> String {
        let mut b = token.as_bytes().to_vec();
        b[at] = if b[at] == b'A' { b'B' } else { b'A' };
        String::from_utf8(b).unwrap()
    }

    #[test]
    fn rfc7515_a2_rs256_verifies_as_published_and_not_once_changed() {
        let key = key_of(&format!(
            r#"{{"kty":"RSA","kid":"a2","n":"{A2_N}","e":"AQAB"}}"#
        ));
        let jws = format!("eyJhbGciOiJSUzI1NiJ9.{A_PAYLOAD}.{A2_SIG}");
        assert!(key.signs(&jws));
        assert!(!key.signs(&changed(&jws, 30)), "payload changed");
        assert!(
            !key.signs(&changed(&jws, jws.len() - 5)),
            "signature changed"
        );
    }

    #[test]
    fn rfc7515_a3_es256_verifies_as_published_and_with_high_s() {
        let key = key_of(&format!(
            r#"{{"kty":"EC","crv":"P-256","kid":"a3","x":"{A3_X}","y":"{A3_Y}"}}"#
        ));
        let input = format!("eyJhbGciOiJFUzI1NiJ9.{A_PAYLOAD}");
        assert!(key.signs(&format!("{input}.{A3_SIG}")));
        assert!(!key.signs(&changed(&format!("{input}.{A3_SIG}"), 30)));
        // (r, n - s): the same input's other valid signature. ECDSA (FIPS
        // 186-4, RFC 7518 3.4) accepts either s; the verified-token memory
        // keys a token by its own bytes, so the twin is one more check
        // naming the same buyer, never a second identity.
        let sig = URL_SAFE_NO_PAD.decode(A3_SIG).unwrap();
        let mut twin = sig.clone(); // becomes (r, n - s)
        let mut borrow = 0i16;
        for i in (0..32).rev() {
            let d = i16::from(P256_ORDER[i]) - i16::from(sig[32 + i]) - borrow;
            twin[32 + i] = d.rem_euclid(256) as u8;
            borrow = i16::from(d < 0);
        }
        assert_eq!(borrow, 0, "s < n");
        // s > (n - 1) / 2 is the high S: exactly one of the two is. The
        // published A.3 signature happens to carry the high one.
        let is_high = |s: &[u8]| s > &P256_HALF_ORDER[..];
        assert!(
            is_high(&sig[32..]) && !is_high(&twin[32..]),
            "A.3's s is high"
        );
        assert!(key.signs(&format!("{input}.{}", URL_SAFE_NO_PAD.encode(&twin))));
        // The DER form of the signature (what OpenSSL writes) is not JOSE's.
        assert!(!key.signs(&format!("{input}.{}", URL_SAFE_NO_PAD.encode([0x30u8; 70]))));
    }

    #[test]
    fn rfc8037_a4_ed25519_verifies_as_published_and_not_once_changed() {
        let key = key_of(&format!(
            r#"{{"kty":"OKP","crv":"Ed25519","kid":"a4","x":"{RFC8037_X}"}}"#
        ));
        assert!(key.signs(RFC8037_JWS));
        assert!(!key.signs(&changed(RFC8037_JWS, 25)));
        // The RFC's private key is the one of its public key (keygen's check).
        let signing = format!(
            r#"{{"kty":"OKP","crv":"Ed25519","kid":"a4","x":"{RFC8037_X}","d":"{RFC8037_D}"}}"#
        );
        assert!(parse(&format!(r#"{{"keys":[{signing}]}}"#)).unwrap().keys[0].can_sign());
    }

    #[test]
    fn no_vector_cut_short_signs() {
        let cases = [
            (
                format!(r#"{{"kty":"RSA","kid":"a2","n":"{A2_N}","e":"AQAB"}}"#),
                format!("eyJhbGciOiJSUzI1NiJ9.{A_PAYLOAD}.{A2_SIG}"),
            ),
            (
                format!(r#"{{"kty":"EC","crv":"P-256","kid":"a3","x":"{A3_X}","y":"{A3_Y}"}}"#),
                format!("eyJhbGciOiJFUzI1NiJ9.{A_PAYLOAD}.{A3_SIG}"),
            ),
            (
                format!(r#"{{"kty":"OKP","crv":"Ed25519","kid":"a4","x":"{RFC8037_X}"}}"#),
                RFC8037_JWS.to_string(),
            ),
        ];
        for (jwk, jws) in &cases {
            let key = key_of(jwk);
            assert!(key.signs(jws));
            for len in 0..jws.len() {
                assert!(!key.signs(&jws[..len]), "{jws} cut at {len}");
            }
        }
    }

    #[test]
    fn a_signature_not_in_base64url_or_a_token_without_a_dot_signs_nothing() {
        let key = key_of(&format!(
            r#"{{"kty":"OKP","crv":"Ed25519","kid":"a4","x":"{RFC8037_X}"}}"#
        ));
        let (input, sig) = RFC8037_JWS.rsplit_once('.').unwrap();
        assert!(!key.signs(&format!("{input}.{sig}=")));
        assert!(!key.signs(&format!("{input}.{}", sig.replace('_', "/"))));
        assert!(!key.signs(input.split('.').next().unwrap()));
        assert!(!key.signs(""));
    }
}
