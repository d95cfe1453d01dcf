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

//!
//! Split into [`SHARDS`] locks by (sale, user), so the many connection
//! threads that look buyers up at once rarely wait on each other (a thread
//! preempted while holding the one lock of a single map stalled every other
//! thread for whole scheduler slices: p99 of the sold-out path went from
//! about 2 ms to hundreds of ms when requests moved onto connection threads).

use std::collections::HashMap;
use std::sync::Mutex;

/// Number of independently locked parts.
pub const SHARDS: usize = 64;

/// Sale id -> user id -> reservation id, in [`SHARDS`] parts.
#[derive(Debug)]
pub struct Buyers(Vec<Mutex<HashMap<u64, HashMap<String, String>>>>);

impl Default for Buyers {
    fn default() -> Self {
        Buyers((0..SHARDS).map(|_| Mutex::default()).collect())
    }
}

/// FNV-1a over the sale id and the user id: picks the part.
fn shard(sale_id: u64, user_id: &str) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in sale_id.to_le_bytes().iter().chain(user_id.as_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % SHARDS as u64) as usize
}

impl Buyers {
    fn part(
        &self,
        sale_id: u64,
        user_id: &str,
    ) -> std::sync::MutexGuard<'_, HashMap<u64, HashMap<String, String>>> {
        let m = &self.0[shard(sale_id, user_id)];
        // A poisoned lock only means another thread panicked mid-insert; the
        // map is still a valid map.
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that `user_id` holds `reservation_id` in `sale_id` (the
    /// latest answer from Redis wins).
    pub fn remember(&self, sale_id: u64, user_id: &str, reservation_id: &str) {
        self.part(sale_id, user_id)
            .entry(sale_id)
            .or_default()
            .insert(user_id.to_string(), reservation_id.to_string());
    }

    /// Forgets `user_id` in `sale_id` (Redis says the user holds nothing).
    pub fn forget(&self, sale_id: u64, user_id: &str) {
        if let Some(users) = self.part(sale_id, user_id).get_mut(&sale_id) {
            users.remove(user_id);
        }
    }

    /// Forgets every buyer of `sale_id`: stock came back, so a reservation
    /// may have been released (rolled back) since it was remembered.
    pub fn forget_sale(&self, sale_id: u64) {
        for m in &self.0 {
            m.lock().unwrap_or_else(|p| p.into_inner()).remove(&sale_id);
        }
    }

    /// The reservation id `user_id` holds in `sale_id`, if this gateway saw it.
    pub fn lookup(&self, sale_id: u64, user_id: &str) -> Option<String> {
        self.part(sale_id, user_id)
            .get(&sale_id)?
            .get(user_id)
            .cloned()
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
