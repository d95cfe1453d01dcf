//! Owns the gateway's memory of its buyers: for each sale, the user ids this
//! process has seen holding a reservation (a 202 or a 409 from Redis) and
//! their reservation ids. The sold-out fast path answers a retry of such a
//! buyer 409 with the reservation id, as the API promises, instead of 410,
//! still without a Redis call.
//!
//! Bounded by the stock: every entry is one reserved unit of the sale (one
//! reservation per user per sale), so a sale of N units costs at most N
//! entries per gateway. When a sold-out sale sells again (stock came back:
//! an operator rolled a reservation back) the sale's entries are dropped, as
//! any of them may be the released one; a user Redis answers `sold_out` is
//! dropped too. A retry that reaches another gateway, which never saw that
//! buyer, or comes after such a drop, gets 410 from memory (README limits).

use std::collections::HashMap;
use std::sync::Mutex;

/// Sale id -> user id -> reservation id.
#[derive(Debug, Default)]
pub struct Buyers(Mutex<HashMap<u64, HashMap<String, String>>>);

impl Buyers {
    /// Records that `user_id` holds `reservation_id` in `sale_id` (the
    /// latest answer from Redis wins).
    pub fn remember(&self, sale_id: u64, user_id: &str, reservation_id: &str) {
        // A poisoned lock only means another thread panicked mid-insert; the
        // map is still a valid map.
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(sale_id)
            .or_default()
            .insert(user_id.to_string(), reservation_id.to_string());
    }

    /// Forgets `user_id` in `sale_id` (Redis says the user holds nothing).
    pub fn forget(&self, sale_id: u64, user_id: &str) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(users) = m.get_mut(&sale_id) {
            users.remove(user_id);
        }
    }

    /// Forgets every buyer of `sale_id`: stock came back, so a reservation
    /// may have been released (rolled back) since it was remembered.
    pub fn forget_sale(&self, sale_id: u64) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.remove(&sale_id);
    }

    /// The reservation id `user_id` holds in `sale_id`, if this gateway saw it.
    pub fn lookup(&self, sale_id: u64, user_id: &str) -> Option<String> {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.get(&sale_id)?.get(user_id).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_the_latest_reservation_per_user_and_sale() {
        let b = Buyers::default();
        b.remember(1, "alice", "r1");
        b.remember(1, "alice", "r2");
        b.remember(2, "bob", "r3");
        b.remember(2, "carol", "r4");
        assert_eq!(b.lookup(1, "alice").as_deref(), Some("r2"));
        assert_eq!(b.lookup(2, "alice"), None);
        assert_eq!(b.lookup(2, "bob").as_deref(), Some("r3"));
        b.forget(2, "bob");
        assert_eq!(b.lookup(2, "bob"), None);
        assert_eq!(b.lookup(2, "carol").as_deref(), Some("r4"));
        b.forget_sale(2);
        assert_eq!(b.lookup(2, "carol"), None);
        assert_eq!(b.lookup(1, "alice").as_deref(), Some("r2"));
    }
}
