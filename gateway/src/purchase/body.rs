//! Owns the strict reading of a purchase body: `{"user_id": "..."}` (or
//! `{}` with a token), with an optional `"quantity": N`, and nothing else.
//! Unknown fields are refused: a client that sends a field the gateway
//! does not honour must learn it rather than be served something else.
//! A quantity is an integer from 1 to `allowance::MAX_UNITS` (the sale's
//! own limit per purchase is known to Redis only: the units script
//! answers it); anything else is a 400 whose detail says what was wrong.

use seckill_common::allowance::MAX_UNITS;
use serde::Deserialize;
use serde_json::Value;

/// The request body, `{"user_id": "...", "quantity": N}` (both optional)
/// and nothing else.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PurchaseBody {
    #[serde(default, deserialize_with = "some_string")]
    user_id: Option<String>,
    #[serde(default, deserialize_with = "some_value")]
    quantity: Option<Value>,
}

/// A present `user_id` must be a string (`null` is refused, not "absent").
fn some_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    String::deserialize(d).map(Some)
}

/// A present `quantity`, whatever its JSON type (`null` included), is
/// judged by [`quantity`].
fn some_value<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// What a purchase body asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Body {
    /// The buyer the body names, if any.
    pub user_id: Option<String>,
    /// Units asked for, 1 when the body does not say.
    pub quantity: u32,
}

/// The rule for `user_id`, as told to clients.
pub const USER_ID_RULE: &str = concat!("user_id must be ", seckill_common::token_rule!());

const EXPECTED: &str = "expected {\"user_id\": \"...\"} with a string user_id and an optional \
     integer quantity, and no other field (or {} with a token)";

/// Details of a refused `quantity`.
pub const QUANTITY_NULL: &str = "quantity must be an integer from 1 to 100, not null";
/// A string quantity.
pub const QUANTITY_STRING: &str = "quantity must be an integer from 1 to 100, not a string";
/// A fractional quantity.
pub const QUANTITY_FRACTION: &str =
    "quantity must be a whole number from 1 to 100, written without a decimal point";
/// Zero or a negative quantity.
pub const QUANTITY_TOO_SMALL: &str = "quantity must be at least 1";
/// A quantity above [`MAX_UNITS`].
pub const QUANTITY_TOO_LARGE: &str = "quantity must be at most 100";
/// A quantity of another JSON type.
pub const QUANTITY_TYPE: &str = "quantity must be an integer from 1 to 100";

const _: () = assert!(MAX_UNITS == 100, "the quantity details name 100");

/// The units a `quantity` value asks for.
///
/// Errors: the detail of the 400.
fn quantity(v: &Value) -> Result<u32, &'static str> {
    match v {
        Value::Null => Err(QUANTITY_NULL),
        Value::String(_) => Err(QUANTITY_STRING),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(0), _) | (None, Some(_)) => Err(QUANTITY_TOO_SMALL),
            (Some(q), _) if q > u64::from(MAX_UNITS) => Err(QUANTITY_TOO_LARGE),
            (Some(q), _) => u32::try_from(q).map_err(|_| QUANTITY_TOO_LARGE),
            (None, None) => match n.as_f64() {
                Some(f) if f < 1.0 => Err(QUANTITY_TOO_SMALL),
                Some(f) if f > f64::from(MAX_UNITS) => Err(QUANTITY_TOO_LARGE),
                _ => Err(QUANTITY_FRACTION),
            },
        },
        _ => Err(QUANTITY_TYPE),
    }
}

/// Reads the user id, if any, and the quantity from a purchase body;
/// `required` (with `SECKILL_AUTH=none`) makes a missing user id a 400.
///
/// Errors: the detail of the 400 `invalid_request` for an empty,
/// malformed, truncated, non-UTF-8 or too deeply nested body (serde_json
/// stops at 128 levels), a missing (when `required`), non-string, null or
/// duplicate `user_id`, an unknown field, a user id that breaks the rule,
/// or a quantity that is not an integer from 1 to 100 (null, a string, a
/// fraction, 0 or below, above 100).
pub fn parse_body(body: &[u8], required: bool) -> Result<Body, &'static str> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err("empty body");
    }
    // serde would also take a struct from an array (`["alice"]`).
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(EXPECTED);
    }
    let parsed: PurchaseBody = serde_json::from_slice(body).map_err(|e| {
        use serde_json::error::Category;
        match e.classify() {
            Category::Eof => "truncated JSON",
            Category::Syntax | Category::Io => "malformed JSON",
            Category::Data => EXPECTED,
        }
    })?;
    let quantity = match &parsed.quantity {
        None => 1,
        Some(v) => quantity(v)?,
    };
    match parsed.user_id {
        None if required => Err(EXPECTED),
        Some(u) if !seckill_common::is_valid_token(&u) => Err(USER_ID_RULE),
        user_id => Ok(Body { user_id, quantity }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detail(body: &[u8]) -> String {
        parse_body(body, true).unwrap_err().to_string()
    }

    #[test]
    fn a_valid_body_gives_the_user_id() {
        let user = |b: &[u8], required| parse_body(b, required).unwrap().user_id;
        assert_eq!(
            user(br#"{"user_id":"alice-1.x_Y"}"#, true),
            Some("alice-1.x_Y".into())
        );
        assert_eq!(user(b" {\"user_id\" : \"a\"}\n", false), Some("a".into()));
        assert_eq!(user(b"{}", false), None);
        assert_eq!(parse_body(b"{}", false).unwrap().quantity, 1);
        assert!(parse_body(br#"{"user_id":null}"#, false).is_err());
    }

    #[test]
    fn every_hostile_body_is_a_400() {
        assert_eq!(detail(b""), "empty body");
        assert_eq!(detail(br#"{"user_id":"al"#), "truncated JSON");
        assert_eq!(detail(b"{user_id: 1}"), "malformed JSON");
        assert_eq!(detail(b"{\"user_id\":\"\xff\xfe\"}"), "malformed JSON");
        detail(&vec![b'['; 100_000]);
        for b in [
            r#"{"user_id":5}"#,
            r#"{"user_id":null}"#,
            r#"{"user_id":["a"]}"#,
            r#"{}"#,
            r#"{"user_id":"a","qty":2}"#,
            r#"{"user_id":"a","quantity":2,"quantity":3}"#,
            r#"{"user_id":"a","user_id":"b"}"#,
            r#"["a"]"#,
        ] {
            assert!(detail(b.as_bytes()).starts_with("expected"), "{b}");
        }
        let long = format!(r#"{{"user_id":"{}"}}"#, "a".repeat(65));
        for b in [
            long.as_str(),
            r#"{"user_id":"a b"}"#,
            "{\"user_id\":\"a\\u0001\"}",
            r#"{"user_id":""}"#,
        ] {
            assert_eq!(detail(b.as_bytes()), USER_ID_RULE, "{b}");
        }
    }

    #[test]
    fn a_quantity_is_an_integer_from_1_to_100() {
        for (b, q) in [
            (r#"{"quantity":1}"#, 1),
            (r#"{"quantity":3,"user_id":"a"}"#, 3),
            (r#"{"user_id":"a","quantity":100}"#, 100),
        ] {
            assert_eq!(parse_body(b.as_bytes(), false).unwrap().quantity, q, "{b}");
        }
        for (b, d) in [
            (r#"{"quantity":0}"#, QUANTITY_TOO_SMALL),
            (r#"{"quantity":-2}"#, QUANTITY_TOO_SMALL),
            (r#"{"quantity":-0.5}"#, QUANTITY_TOO_SMALL),
            (r#"{"quantity":1.5}"#, QUANTITY_FRACTION),
            (r#"{"quantity":2.0}"#, QUANTITY_FRACTION),
            (r#"{"quantity":1e300}"#, QUANTITY_TOO_LARGE),
            (r#"{"quantity":"2"}"#, QUANTITY_STRING),
            (r#"{"quantity":null}"#, QUANTITY_NULL),
            (r#"{"quantity":101}"#, QUANTITY_TOO_LARGE),
            (r#"{"quantity":18446744073709551616}"#, QUANTITY_TOO_LARGE),
            (r#"{"quantity":true}"#, QUANTITY_TYPE),
            (r#"{"quantity":[2]}"#, QUANTITY_TYPE),
        ] {
            assert_eq!(parse_body(b.as_bytes(), false).unwrap_err(), d, "{b}");
        }
    }
}
