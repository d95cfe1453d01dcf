//! Owns the keys the benchmarks sign RS256 and ES256 tokens with, as an
//! identity provider would: a fixed 2048-bit RSA key and a fixed P-256 key
//! (made for the benchmarks only, with `openssl genrsa` and `openssl ecparam`), their public halves as a provider
//! publishes them (a JWKS), and minting. Shared by `token_cost.rs` and
//! `provider_tokens.rs` (`#[path]` modules; not an example of its own).

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use seckill_common::token::Claims;

/// A 2048-bit RSA private key (PKCS#1 DER, base64) made for this benchmark
/// only: it signs the RS256 tokens an identity provider would.
pub const BENCH_RSA_PKCS1_B64: &str = concat!(
    "MIIEogIBAAKCAQEAmFmx1uYH4YC4ybNzVyk5Opxt+EYs3WjVcOU26TV1nPcbV60BumFtzQzPVOoFOB2fWLNfOOBbjA",
    "IfTDn5dBav/FSO+Kc0qUCVSAIxmrp7pOCdWvojgQOvAcF+1qHV27QIKf284iYGmlwptgqyv18xY2yPWLETmmiUJtK9",
    "rkRkXkhJdAPgSCCWMIzeRh7Ks/XDPWiIotp0b1bpXq7ce/cnWieqxF78Th/NXicTL39EKPhsSmfmINZ4TWyxk+fi4Q",
    "RPtYrCVpFyC+qSrohUoRlM0J6cXdeUm4bzOdPlzDBQh9LolE1j7aq/7s8/aTD5EZj1Qhld7zZmhxaA8tCPPKN6lQID",
    "AQABAoIBADOZWWK76Rpmou9pkFyKcUAZICPQ/LwGmBfTAjyNJycBCGkzBt1Nx0cGGiib1CWz3rbHla4pSshKJbiHAC",
    "Zh0rwHFZ9A3lSes5C+cXeCxoLKsnDQPHsjOMBC/UcLa+er+4HhVvpPP7hDE7t8txqazprqd0hmPQn0do0JnkWqE0Zc",
    "9hFZFwVV/3FDNBV5ojivPyBQfK1/3/Xgk43pYTKZx8e3iu5UAwIvU72jWaSBTAd5OFvyQ/j3uRxbX9I1SdpYsMgPkl",
    "g7TpvXotT3rLIB/W+yaLtGs9MJGGqBS4XCdLs5MXtmveU9tnLZTchhvNfOlymBr87SN+zRbO76LK3/XWcCgYEA1h2J",
    "c8wv6KmIkXOotyeuBQ0HcgxiKapbb9HKt/GSj0lcDVjOE9DG7Z8G+ngkuZLhs5e6unTG6LUoVH4zCV5N3xU1mQJnyD",
    "qyVSHS0e8L7MFj5X1YgK7MFZdXq9dVS/NUeuyz0A7gBy1j15dvyhrZnNKTYFkBnZpkI7AxPC0N7W8CgYEAticXdSWD",
    "yFJ4G7SNgQw1Yk7PBjL0Kp4KH3mbsdpq1zdsL7AHVxqN7Cmigy6nxK04xo8ijtbEOt02rV+Nn8ABko30ufcKbVcl3C",
    "qnBFnw6taP4KAiowoQ4c2H8yEpQSU3F5pwEkmbVDf3yzG/F+QQbleU+AEnln6eT4fp2eUxXjsCgYBIi7dvqaYt4Ysp",
    "JRPsAqC+i1yTcsirr1HNwDo8OrhanhN3XjhslFdiWXhm0uA2lCKu0+DrnfdrDz476opmSTJ/PFNtpVf+ioyztYMVqD",
    "XVIO0061RaPV9ejWmiCpKW6joccCi4fOHA7MsgV+oDgzdqIBrZES8v9Air4t27stQ+NwKBgBUIzpyoiF9JprUMVIri",
    "bge8Mgv1Nlz1gxW/ZUtUfaH8tHGNUkustVbgN/QOHzGHD1dekA8OnfpuMTI0JpacBZJ28hvHe1zFA4o5IrBN8pQr0t",
    "GNrHJHZ0usAFcDLVBoi8QeAXMbLOS80dCVHgwUOhGD65/4AipO1Nk6SLbw0JKhAoGAfDkYGdfpzYrqTdzTPJ/MOdT6",
    "gV8WoiJJVRmEGRsDccQKI29OeY900Vdi39G0U0jYgjKRYSTzzqYbKtd5ONsBsFKyyoZAattenImaUfAebxwW4rg2MQ",
    "QWIrq81MVHLIcpLTQc7cosz07nWxUhO0zj3m6Gh6wtuwW2BZFtdbHX1YQ=",
);

/// A P-256 private key (PKCS#8 DER, base64) made for this benchmark only:
/// it signs the ES256 tokens an identity provider would.
pub const BENCH_P256_PKCS8_B64: &str = concat!(
    "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgupprce2PsJBIUNZX6VFK6v9NAWNmnF9prR2bL6kd+c",
    "GhRANCAAS0ywXosSOqaLNraDfwmYyLp/EOwUot9YjfMYedCeLMIEOsLc0BBBp/83GjrN5BRc85a3AzKsa7+H1UY4pA",
    "V45b",
);

/// The kid of the RSA key in [`Provider::jwks`].
pub const RSA_KID: &str = "r";

/// The kid of the P-256 key in [`Provider::jwks`].
pub const EC_KID: &str = "p";

/// The benchmarks' provider keys.
pub struct Provider {
    /// The public halves, as a provider's JWKS (what a gateway's key file holds).
    pub jwks: serde_json::Value,
    /// Signs RS256 tokens.
    pub rsa: jsonwebtoken::EncodingKey,
    /// Signs ES256 tokens.
    pub ec: jsonwebtoken::EncodingKey,
}

/// The fixed RSA and P-256 keys.
pub fn provider() -> Provider {
    use aws_lc_rs::signature::{
        EcdsaKeyPair, KeyPair, RsaKeyPair, ECDSA_P256_SHA256_FIXED_SIGNING,
    };
    let der = STANDARD.decode(BENCH_RSA_PKCS1_B64).unwrap();
    let rsa_key = RsaKeyPair::from_der(&der).unwrap();
    let ec_der = STANDARD.decode(BENCH_P256_PKCS8_B64).unwrap();
    let ec_key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &ec_der).unwrap();
    // Uncompressed SEC 1: 04 || x || y.
    let point = ec_key.public_key().as_ref();
    let b = |v: &[u8]| URL_SAFE_NO_PAD.encode(v);
    let public = rsa_key.public_key();
    let jwks = serde_json::json!({"keys": [
        {"kty": "RSA", "kid": RSA_KID, "alg": "RS256", "use": "sig",
         "n": b(public.modulus().big_endian_without_leading_zero()),
         "e": b(public.exponent().big_endian_without_leading_zero())},
        {"kty": "EC", "kid": EC_KID, "crv": "P-256", "alg": "ES256", "use": "sig",
         "x": b(&point[1..33]), "y": b(&point[33..65])},
    ]});
    Provider {
        jwks,
        rsa: jsonwebtoken::EncodingKey::from_rsa_der(&der),
        ec: jsonwebtoken::EncodingKey::from_ec_der(&ec_der),
    }
}

/// A token for each of `subs`, signed with `alg` by `key` under `kid`,
/// audience `seckill`, valid for `ttl_s` seconds.
pub fn mint(
    alg: jsonwebtoken::Algorithm,
    kid: &str,
    key: &jsonwebtoken::EncodingKey,
    subs: impl Iterator<Item = String>,
    ttl_s: u64,
) -> Vec<String> {
    let mut header = jsonwebtoken::Header::new(alg);
    header.kid = Some(kid.to_string());
    subs.map(|sub| {
        let claims = Claims::new(&sub, "seckill", ttl_s);
        jsonwebtoken::encode(&header, &claims, key).unwrap()
    })
    .collect()
}
