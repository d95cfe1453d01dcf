//! Owns the public answer of a paused sale: once a read with no buyer
//! (`recheck.rs`) has found every bucket of a sale paused, its purchases
//! are answered paused from memory, to anyone, without a signature check,
//! for at most [`RECHECK_AFTER`] (the sold-out memory's bound); then the
//! first purchase to find the answer due reads the pause marks again and
//! the others keep the answer for at most [`RECHECK_WINDOW`] while it does.
//!
//! Why that bound: `sale resume` promises that every gateway takes
//! purchases again within a second. An answer read at `t` is used until
//! `t` + 500 ms, and the read that replaces it is made by the first
//! purchase after that: a resume at any moment after the read is seen by
//! the first purchase 500 ms later at most (plus one round trip), well
//! within the second. The window memory's pause mark (`home.rs`, up to
//! 1.25 s old) only says when to read; it never answers.

use crate::purchase::soldout::{RECHECK_AFTER, RECHECK_WINDOW};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;
use std::time::Instant;

/// Most sales remembered paused at once; beyond it the memory is cleared
/// (only sales whose meta was read are ever remembered).
pub const MAX_SALES: usize = 10_000;

/// What the memory says about a sale's pause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Not remembered paused.
    NotKnown,
    /// Paused, as read less than [`RECHECK_AFTER`] ago (or being read
    /// again by another purchase).
    Paused,
    /// Due: this caller reads the pause marks again.
    Due,
}

/// Sale id -> until when (µs since `base`) its pause is trusted.
#[derive(Debug)]
pub struct PausedSales {
    base: Instant,
    sales: RwLock<HashMap<u64, AtomicU64>>,
}

impl Default for PausedSales {
    fn default() -> Self {
        PausedSales {
            base: Instant::now(),
            sales: RwLock::default(),
        }
    }
}

impl PausedSales {
    fn micros(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.base).as_micros()).unwrap_or(u64::MAX)
    }

    /// The remembered pause of `sale_id` at `now`: [`Seen::Due`] for the
    /// first caller after the expiry (single flight), [`Seen::Paused`] for
    /// the others during [`RECHECK_WINDOW`].
    pub fn get(&self, sale_id: u64, now: Instant) -> Seen {
        let sales = self.sales.read().unwrap_or_else(|p| p.into_inner());
        let Some(until) = sales.get(&sale_id) else {
            return Seen::NotKnown;
        };
        let now_us = self.micros(now);
        let u = until.load(Ordering::Acquire);
        if now_us < u {
            return Seen::Paused;
        }
        let window = self.micros(now + RECHECK_WINDOW);
        match until.compare_exchange(u, window, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => Seen::Due,
            Err(_) => Seen::Paused,
        }
    }

    /// Remembers `sale_id` paused as read at `read_at` (before the read
    /// was sent), trusted for [`RECHECK_AFTER`] from then.
    pub fn paused(&self, sale_id: u64, read_at: Instant) {
        let until = self.micros(read_at + RECHECK_AFTER);
        let mut sales = self.sales.write().unwrap_or_else(|p| p.into_inner());
        if sales.len() >= MAX_SALES && !sales.contains_key(&sale_id) {
            sales.clear();
        }
        sales
            .entry(sale_id)
            .or_insert_with(|| AtomicU64::new(0))
            .store(until, Ordering::Release);
    }

    /// Forgets `sale_id`'s pause (a read found it taking purchases).
    pub fn resumed(&self, sale_id: u64) {
        let known = self
            .sales
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&sale_id);
        if known {
            self.sales
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&sale_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_pause_is_trusted_half_a_second_then_read_again_by_one_caller() {
        let m = PausedSales::default();
        let t0 = Instant::now();
        assert_eq!(m.get(1, t0), Seen::NotKnown);
        m.paused(1, t0);
        let fresh = t0 + RECHECK_AFTER - Duration::from_millis(1);
        assert_eq!(m.get(1, fresh), Seen::Paused);
        assert_eq!(m.get(2, fresh), Seen::NotKnown);
        // Due: one caller reads again, the others keep the answer.
        let due = t0 + RECHECK_AFTER;
        assert_eq!(m.get(1, due), Seen::Due);
        assert_eq!(m.get(1, due), Seen::Paused);
        // That read never answered: the next one after the window reads.
        assert_eq!(m.get(1, due + RECHECK_WINDOW), Seen::Due);
        // Resumed: forgotten at once, for everyone.
        m.resumed(1);
        assert_eq!(m.get(1, due), Seen::NotKnown);
    }
}
