//! Owns the sold-out fast path: once Redis has said a sale is sold out,
//! ended or unknown, purchases for it are answered from memory without a
//! Redis call, for at most [`RECHECK_AFTER`]. After that the next purchase
//! asks Redis again, so stock that comes back (an operator's rollback) is
//! noticed within that time (the gateway issue asks for 1 s).

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};

/// How long a "closed" answer from Redis is trusted: 500 ms, half of the
/// issue's 1 s bound, so even a purchase that races the expiry sees
/// restored stock in time.
pub const RECHECK_AFTER: Duration = Duration::from_millis(500);

/// Most sales remembered at once; beyond it the memory is cleared, so a
/// flood of made-up sale ids cannot grow it without bound.
pub const MAX_SALES: usize = 10_000;

/// Why a sale takes no purchases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// No stock left (410 `sold_out`).
    SoldOut,
    /// The window has closed (403 `sale_ended`).
    Ended,
    /// No such sale in Redis (404 `sale_not_found`).
    Unknown,
}

/// Sale id -> (why closed, until when the answer is trusted).
#[derive(Debug, Default)]
pub struct SoldOutCache {
    sales: RwLock<HashMap<u64, (Closed, Instant)>>,
}

impl SoldOutCache {
    /// The remembered state of `sale_id`, if still fresh at `now`.
    pub fn get(&self, sale_id: u64, now: Instant) -> Option<Closed> {
        let sales = self.sales.read().ok()?;
        match sales.get(&sale_id) {
            Some((c, until)) if *until > now => Some(*c),
            _ => None,
        }
    }

    /// Forgets `sale_id` once Redis has sold a unit of it again (stock came
    /// back: an operator's rollback). Returns whether it had been closed, so
    /// the caller can drop what it remembered from before.
    pub fn reopen(&self, sale_id: u64) -> bool {
        let known = self
            .sales
            .read()
            .map(|s| s.contains_key(&sale_id))
            .unwrap_or(false);
        known
            && self
                .sales
                .write()
                .map(|mut s| s.remove(&sale_id).is_some())
                .unwrap_or(false)
    }

    /// Remembers that Redis said `closed` for `sale_id` at `now`.
    pub fn put(&self, sale_id: u64, closed: Closed, now: Instant) {
        if let Ok(mut sales) = self.sales.write() {
            if sales.len() >= MAX_SALES && !sales.contains_key(&sale_id) {
                sales.clear();
            }
            sales.insert(sale_id, (closed, now + RECHECK_AFTER));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_sale_is_trusted_only_until_the_recheck() {
        let c = SoldOutCache::default();
        let t0 = Instant::now();
        assert_eq!(c.get(1, t0), None);
        c.put(1, Closed::SoldOut, t0);
        assert_eq!(
            c.get(1, t0 + Duration::from_millis(499)),
            Some(Closed::SoldOut)
        );
        assert_eq!(c.get(1, t0 + RECHECK_AFTER), None);
        assert_eq!(c.get(2, t0), None);
    }

    #[test]
    fn made_up_sale_ids_cannot_grow_it_without_bound() {
        let c = SoldOutCache::default();
        let t0 = Instant::now();
        for id in 0..(MAX_SALES as u64 + 5) {
            c.put(id, Closed::Unknown, t0);
        }
        assert!(c.sales.read().unwrap().len() <= MAX_SALES);
    }
}
