//! Owns what the gateway reads from request headers beside the body's
//! framing (`body.rs`): the buyer's credentials (`Authorization`), the
//! payment signature, the `X-Forwarded-For` chain, and a purchase's
//! `Idempotency-Key`.

use crate::admission::Credentials;
use seckill_common::payment;
use tiny_http::Request;

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

/// The payment service's signature header, if any.
pub fn payment_signature(rq: &Request) -> Option<String> {
    rq.headers()
        .iter()
        .find(|h| h.field.equiv(payment::SIGNATURE_HEADER))
        .map(|h| h.value.as_str().to_string())
}

/// The values of every `X-Forwarded-For` header, in order.
pub fn forwarded_for(rq: &Request) -> impl DoubleEndedIterator<Item = &str> {
    rq.headers()
        .iter()
        .filter(|h| h.field.equiv("X-Forwarded-For"))
        .map(|h| h.value.as_str())
}

/// The name of a purchase's key header.
pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";

/// The detail of the 400 for a malformed `Idempotency-Key`.
pub const IDEMPOTENCY_KEY_RULE: &str =
    "Idempotency-Key must be one header of 1-64 characters of A-Z a-z 0-9 _ . : -";

/// The request's `Idempotency-Key`, if it has one.
///
/// Errors: [`IDEMPOTENCY_KEY_RULE`] for a repeated header or a value
/// that breaks the rule (`ids::is_valid_idempotency_key`).
pub fn idempotency_key(rq: &Request) -> Result<Option<String>, &'static str> {
    let mut found = None;
    for h in rq.headers() {
        if !h.field.equiv(IDEMPOTENCY_KEY) {
            continue;
        }
        let v = h.value.as_str().trim();
        if found.is_some() || !seckill_common::ids::is_valid_idempotency_key(v) {
            return Err(IDEMPOTENCY_KEY_RULE);
        }
        found = Some(v.to_string());
    }
    Ok(found)
}
