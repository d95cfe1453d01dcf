//! Owns a buyer's allowance in a sale that sells more than one unit per
//! buyer: the sale's limits as its Redis meta holds them, and the buyer's
//! entry in the sale's buyers hash that counts the units they hold.
//!
//! A sale has a per-buyer limit `L` (meta field [`MAX_PER_BUYER_FIELD`],
//! MySQL `sales.per_user_limit`; absent means 1) and a per-purchase limit
//! `Q ≤ L` ([`MAX_PER_PURCHASE_FIELD`], `sales.max_per_purchase`; absent
//! means `L`). With `L = 1` the buyers hash maps a buyer to their one
//! reservation id, as it always has. With `L > 1` it maps a buyer to the
//! list of reservations that count against their allowance,
//! `"RID:Q,RID:Q"` in the order they were made ([`Held`]): the units they
//! hold are the sum of the quantities, and a 409 names the entries. A
//! release takes its entry out of the list when the sale lets released
//! units be bought again (`rebuy_after_release`) and leaves it otherwise.
//!
//! The reservation script (`reservation.rs`) and the release script
//! (`release.rs`) read and write the same text in Lua; the tests of each
//! script check it against [`Held::parse`].

use std::fmt;

/// Meta field: the most units one buyer may hold at once (`L`).
pub const MAX_PER_BUYER_FIELD: &str = "max_per_buyer";

/// Meta field: the most units one purchase may take (`Q`, at most `L`).
pub const MAX_PER_PURCHASE_FIELD: &str = "max_per_purchase";

/// The highest `L` (and so `Q` and any one message's quantity) a sale may
/// have: it bounds a buyer's list and every unit count a script handles.
pub const MAX_UNITS: u32 = 100;

/// One reservation counted against a buyer's allowance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The reservation id (32 lowercase hex digits).
    pub reservation_id: String,
    /// Its units.
    pub quantity: u32,
}

/// A buyer's entry in the buyers hash of a sale with `L > 1`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Held(pub Vec<Entry>);

/// Why a buyers-hash value is not a [`Held`] list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldError(pub String);

impl fmt::Display for HeldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a list of RID:QUANTITY entries: {:?}", self.0)
    }
}

impl std::error::Error for HeldError {}

impl Held {
    /// Reads `"RID:Q,RID:Q"`; the empty string is the empty list.
    ///
    /// Errors: an entry without a valid id or a quantity in
    /// `1..=MAX_UNITS`.
    pub fn parse(s: &str) -> Result<Held, HeldError> {
        if s.is_empty() {
            return Ok(Held::default());
        }
        let bad = || HeldError(s.chars().take(200).collect());
        let mut out = Vec::new();
        for part in s.split(',') {
            let (rid, q) = part.split_once(':').ok_or_else(bad)?;
            let q: u32 = q.parse().map_err(|_| bad())?;
            if !crate::ids::is_valid_reservation_id(rid) || q == 0 || q > MAX_UNITS {
                return Err(bad());
            }
            out.push(Entry {
                reservation_id: rid.to_string(),
                quantity: q,
            });
        }
        Ok(Held(out))
    }

    /// The units the buyer holds.
    pub fn units(&self) -> u64 {
        self.0.iter().map(|e| u64::from(e.quantity)).sum()
    }
}

impl fmt::Display for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}:{}", e.reservation_id, e.quantity)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "0123456789abcdef0123456789abcdef";
    const B: &str = "fedcba9876543210fedcba9876543210";

    #[test]
    fn lists_round_trip_and_count_units() {
        let h = Held::parse(&format!("{A}:2,{B}:1")).unwrap();
        assert_eq!(h.units(), 3);
        assert_eq!(h.to_string(), format!("{A}:2,{B}:1"));
        assert_eq!(Held::parse("").unwrap().units(), 0);
    }

    #[test]
    fn broken_lists_are_errors() {
        for bad in [
            A.to_string(),
            format!("{A}:0"),
            format!("{A}:101"),
            format!("{A}:x"),
            format!("{A}:1,"),
            "xyz:1".to_string(),
        ] {
            assert!(Held::parse(&bad).is_err(), "{bad}");
        }
    }
}
