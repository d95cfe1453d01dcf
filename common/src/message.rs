//! Owns the order message: the JSON that the reservation script writes as the
//! flow record and pushes onto the sale's queue, and that the worker applies.
//!
//! Shape (version 1), one line of JSON:
//! `{"v":1,"reservation_id":"<32 hex>","sale_id":42,"user_id":"alice","reserved_at_ms":1764400000000}`
//! and, for a reservation of more than one unit, a last field
//! `"quantity":N` (2 ≤ N ≤ [`crate::allowance::MAX_UNITS`]); absent means
//! one unit, so a one-unit message is byte for byte what it always was.
//!
//! The Lua script builds this text itself (see `reservation.rs`), so the field
//! order and names here and there must agree; a test checks they do.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The only message version this build writes and reads.
pub const MESSAGE_VERSION: u32 = 1;

/// One reserved unit on its way to becoming an order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderMessage {
    /// Format version; always [`MESSAGE_VERSION`] for messages this build accepts.
    pub v: u32,
    /// The idempotency key, unique per reserved unit (see [`crate::ids`]).
    pub reservation_id: String,
    /// MySQL `sales.id`.
    pub sale_id: u64,
    /// The buyer; 1-64 characters of `A-Z a-z 0-9 _ . -`.
    pub user_id: String,
    /// When Redis reserved the unit, Unix time in ms from Redis's own clock.
    pub reserved_at_ms: u64,
    /// Units reserved together (one order of N units); written only when
    /// more than one.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub quantity: u32,
}

fn one() -> u32 {
    1
}

fn is_one(q: &u32) -> bool {
    *q == 1
}

/// Why a queued message could not be read. Such a message is dead-lettered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MessageError {
    /// Not JSON of the expected shape (the serde message says where).
    Malformed(String),
    /// A version this build does not know.
    UnsupportedVersion(u32),
    /// A field is present but its value breaks a rule (empty id, bad user id).
    InvalidField(&'static str),
}

impl fmt::Display for MessageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MessageError::Malformed(d) => write!(f, "malformed order message: {d}"),
            MessageError::UnsupportedVersion(v) => {
                write!(f, "unsupported order message version: {v}")
            }
            MessageError::InvalidField(name) => write!(f, "invalid order message field: {name}"),
        }
    }
}

impl std::error::Error for MessageError {}

impl OrderMessage {
    /// Parses and validates a queued message. Never panics, whatever the bytes.
    pub fn parse(raw: &[u8]) -> Result<OrderMessage, MessageError> {
        let m: OrderMessage =
            serde_json::from_slice(raw).map_err(|e| MessageError::Malformed(e.to_string()))?;
        if m.v != MESSAGE_VERSION {
            return Err(MessageError::UnsupportedVersion(m.v));
        }
        if !crate::ids::is_valid_reservation_id(&m.reservation_id) {
            return Err(MessageError::InvalidField("reservation_id"));
        }
        if !crate::is_valid_token(&m.user_id) {
            return Err(MessageError::InvalidField("user_id"));
        }
        if m.sale_id == 0 {
            return Err(MessageError::InvalidField("sale_id"));
        }
        if m.quantity == 0 || m.quantity > crate::allowance::MAX_UNITS {
            return Err(MessageError::InvalidField("quantity"));
        }
        Ok(m)
    }

    /// The JSON text, byte for byte what the reservation script writes.
    pub fn to_json(&self) -> String {
        // serde_json keeps struct field order; user ids need no escaping
        // (their alphabet has no quote, backslash or control character).
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> OrderMessage {
        OrderMessage {
            v: 1,
            reservation_id: "0123456789abcdef0123456789abcdef".into(),
            sale_id: 42,
            user_id: "alice".into(),
            reserved_at_ms: 1_764_400_000_000,
            quantity: 1,
        }
    }

    #[test]
    fn several_units_carry_their_quantity_last() {
        let mut m = sample();
        m.quantity = 3;
        let json = m.to_json();
        assert!(json.ends_with(r#","reserved_at_ms":1764400000000,"quantity":3}"#));
        assert_eq!(OrderMessage::parse(json.as_bytes()).unwrap(), m);
        for bad in [0u32, crate::allowance::MAX_UNITS + 1] {
            m.quantity = bad;
            assert_eq!(
                OrderMessage::parse(m.to_json().as_bytes()),
                Err(MessageError::InvalidField("quantity"))
            );
        }
    }

    #[test]
    fn round_trips_in_the_documented_shape() {
        let json = sample().to_json();
        assert_eq!(
            json,
            r#"{"v":1,"reservation_id":"0123456789abcdef0123456789abcdef","sale_id":42,"user_id":"alice","reserved_at_ms":1764400000000}"#
        );
        assert_eq!(OrderMessage::parse(json.as_bytes()).unwrap(), sample());
    }

    #[test]
    fn bad_messages_are_typed_errors() {
        assert!(matches!(
            OrderMessage::parse(b"not json"),
            Err(MessageError::Malformed(_))
        ));
        assert!(matches!(
            OrderMessage::parse(&[0xff, 0xfe]),
            Err(MessageError::Malformed(_))
        ));
        assert!(matches!(
            OrderMessage::parse(b""),
            Err(MessageError::Malformed(_))
        ));
        let mut m = sample();
        m.v = 2;
        assert_eq!(
            OrderMessage::parse(m.to_json().as_bytes()),
            Err(MessageError::UnsupportedVersion(2))
        );
        let mut m = sample();
        m.user_id = "a b".into();
        assert_eq!(
            OrderMessage::parse(m.to_json().as_bytes()),
            Err(MessageError::InvalidField("user_id"))
        );
        let mut m = sample();
        m.reservation_id = "x".into();
        assert_eq!(
            OrderMessage::parse(m.to_json().as_bytes()),
            Err(MessageError::InvalidField("reservation_id"))
        );
        let deep = "[".repeat(100_000);
        assert!(matches!(
            OrderMessage::parse(deep.as_bytes()),
            Err(MessageError::Malformed(d)) if d.starts_with("invalid type: sequence")
        ));
    }
}
