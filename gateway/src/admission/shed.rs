//! Owns load shedding: the bound on purchases of this gateway waiting for
//! Redis at once (`SECKILL_GATEWAY_PURCHASES_IN_FLIGHT`). A purchase
//! beyond it is answered 503 `overloaded` at once instead of queueing
//! behind the others, so the latency of admitted purchases stays flat as
//! the offered load grows (measured by `scripts/bench-shed.sh`). Only
//! purchases take a place (`purchase/mod.rs`): reads are bounded by the shared
//! Redis links instead (`redis/link.rs`, `LinkPool`), so a shed buyer can
//! still read its status (docs/LIMITS.md).

use std::sync::atomic::{AtomicUsize, Ordering};

/// The in-flight bound and its count.
pub struct Shed {
    max: usize,
    in_flight: AtomicUsize,
}

/// One admitted purchase; dropping it frees its place.
pub struct Admitted<'a>(&'a Shed);

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        self.0.free();
    }
}

impl Admitted<'_> {
    /// Keeps the place past this borrow, for a purchase answered by
    /// another thread (`answer.rs`): whoever holds it then calls
    /// [`Shed::free`] exactly once.
    pub fn keep(self) {
        std::mem::forget(self);
    }
}

impl Shed {
    /// At most `max` purchases in flight (at least 1).
    pub fn new(max: usize) -> Shed {
        Shed {
            max: max.max(1),
            in_flight: AtomicUsize::new(0),
        }
    }

    /// A place for one purchase, or `None` when `max` are in flight.
    pub fn try_admit(&self) -> Option<Admitted<'_>> {
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| Admitted(self))
    }

    /// Frees one place taken by [`Shed::try_admit`] and kept
    /// ([`Admitted::keep`]).
    pub fn free(&self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// Purchases in flight now.
    #[cfg(test)]
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_holds_and_places_come_back() {
        let s = Shed::new(2);
        let a = s.try_admit();
        let b = s.try_admit();
        assert!(a.is_some() && b.is_some());
        assert!(s.try_admit().is_none());
        drop(a);
        assert_eq!(s.in_flight(), 1);
        assert!(s.try_admit().is_some());
        assert_eq!(s.in_flight(), 1, "the temporary was dropped");
    }
}
