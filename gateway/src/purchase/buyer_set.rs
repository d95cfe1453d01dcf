//! Owns the compact set of a sold-out sale's buyers, user id ->
//! reservation id ([`BuyerSet`]): what the sold-out memory holds and the
//! buyers loader fills.

use std::collections::HashMap;

/// The buyers of one sale: user id -> reservation id, the id kept as the
/// 128-bit number its 32 hex digits spell (16 bytes instead of a string).
#[derive(Debug, Default)]
pub struct BuyerSet(HashMap<Box<str>, u128>);

impl BuyerSet {
    /// Adds `user_id` holding `reservation_id`. Returns false (and adds
    /// nothing) when the id is not 32 lowercase hex digits.
    pub fn insert(&mut self, user_id: &str, reservation_id: &str) -> bool {
        if !seckill_common::ids::is_valid_reservation_id(reservation_id) {
            return false;
        }
        match u128::from_str_radix(reservation_id, 16) {
            Ok(v) => {
                self.0.insert(user_id.into(), v);
                true
            }
            Err(_) => false,
        }
    }

    /// The reservation id `user_id` holds, as 32 lowercase hex digits.
    pub fn lookup(&self, user_id: &str) -> Option<String> {
        self.0.get(user_id).map(|v| format!("{v:032x}"))
    }

    /// Buyers in the set.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the set holds no buyer.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_keeps_ids_exactly_and_refuses_malformed_ones() {
        let mut s = BuyerSet::default();
        assert!(s.insert("alice", "00000000000000000000000000000001"));
        assert!(s.insert("bob", "f44949492a3758ee0000000000000000"));
        assert!(!s.insert("eve", "F44949492A3758EE0000000000000000"));
        assert!(!s.insert("eve", "short"));
        assert_eq!(s.len(), 2);
        assert_eq!(
            s.lookup("alice").as_deref(),
            Some("00000000000000000000000000000001")
        );
        assert_eq!(
            s.lookup("bob").as_deref(),
            Some("f44949492a3758ee0000000000000000")
        );
        assert_eq!(s.lookup("eve"), None);
    }
}
