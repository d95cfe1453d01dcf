//! Owns the strict reading of a purchase body: `{"user_id": "..."}` (or
//! `{}` with a token) and nothing else. Unknown fields are refused: a
//! client that sends, say, `"quantity": 2` must learn that it is not
//! honoured rather than be silently sold one unit.

use serde::Deserialize;

/// The request body, `{"user_id": "..."}` (or `{}` with a token) and
/// nothing else.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PurchaseBody {
    #[serde(default, deserialize_with = "some_string")]
    user_id: Option<String>,
}

/// A present `user_id` must be a string (`null` is refused, not "absent").
fn some_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    String::deserialize(d).map(Some)
}

/// The rule for `user_id`, as told to clients.
pub const USER_ID_RULE: &str = concat!("user_id must be ", seckill_common::token_rule!());

const EXPECTED: &str =
    "expected {\"user_id\": \"...\"} with a string user_id and no other field (or {} with a token)";

/// Reads the user id, if any, from a purchase body; `required` (with
/// `SECKILL_AUTH=none`) makes a missing one a 400.
///
/// Errors: the detail of the 400 `invalid_request` for an empty,
/// malformed, truncated, non-UTF-8 or too deeply nested body (serde_json
/// stops at 128 levels), a missing (when `required`), non-string, null or
/// duplicate `user_id`, an unknown field, or a user id that breaks the rule.
pub fn parse_body(body: &[u8], required: bool) -> Result<Option<String>, &'static str> {
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
    match parsed.user_id {
        None if required => Err(EXPECTED),
        Some(u) if !seckill_common::is_valid_token(&u) => Err(USER_ID_RULE),
        u => Ok(u),
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
        assert_eq!(
            parse_body(br#"{"user_id":"alice-1.x_Y"}"#, true).unwrap(),
            Some("alice-1.x_Y".into())
        );
        assert_eq!(
            parse_body(b" {\"user_id\" : \"a\"}\n", false).unwrap(),
            Some("a".into())
        );
        assert_eq!(parse_body(b"{}", false).unwrap(), None);
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
            r#"{"user_id":"a","quantity":2}"#,
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
}
