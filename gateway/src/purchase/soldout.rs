//! Owns the sold-out fast path: once Redis has said a sale is sold out,
//! ended or unknown, purchases for it are answered from memory without a
//! Redis call, for at most [`RECHECK_AFTER`]; and, for a sold-out sale, the
//! memory of its buyers, so that a winner's retry still gets 409 with its
//! own reservation id from every gateway.
//!
//! Ordering, never guessing: every reply of the reservation script carries
//! the sale's reservation sequence `seq` (units ever reserved; Redis runs
//! scripts one at a time, so `seq` orders their replies). A sale is
//! remembered as sold out *at* a `seq`. A `reserved` reply with a higher
//! `seq` ran after that sell-out (stock came back: an operator released a
//! reservation), so the sale is forgotten and buys again; one with a lower
//! or equal `seq` ran before it and changes nothing, in whatever order the
//! connection threads conclude their replies (a rollback inferred from
//! that order would wipe every remembered buyer).
//!
//! Buyers: when a sale is first remembered as sold out at a `seq`, the
//! buyers loader (`buyers.rs`) reads the sale's `buyers` hash once (bounded
//! by the stock, and by `SECKILL_GATEWAY_BUYERS_MAX` over all sales) and
//! installs it only if Redis still says sold out at that same `seq`. Until
//! then, or when it does not fit, the purchase path reads the one buyer
//! (`HGET`). A sale's buyers are freed when it is forgotten, when Redis
//! answers `ended` or `unknown`, and by the loader's sweep once the sale's
//! window has closed.
//!
//! Single flight: when an answer expires, only the first purchase to see
//! that asks Redis; the others keep the answer from memory for up to
//! [`RECHECK_WINDOW`] while it does.
//!
//! The window first: a sold-out answer is remembered with the sale's end
//! (`ends_at_ms`, which the gateway read with the sale's bucket count,
//! `home.rs`), and from that end on (this machine's clock) it is not
//! trusted at all: every purchase asks Redis, whose clock decides, until
//! Redis answers `ended` (remembered then). A sold-out sale is never
//! answered 410 `sold_out` from memory after its end, where Redis says
//! 403 `sale_ended`.

use crate::purchase::buyer_set::BuyerSet;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// How long a "closed" answer from Redis is trusted: 500 ms, half of the
/// 1 s bound on seeing restored stock, so even a purchase that races the expiry sees
/// restored stock in time.
pub const RECHECK_AFTER: Duration = Duration::from_millis(500);

/// How long the other purchases keep answering from memory while the first
/// one after an expiry asks Redis; if that one gets no answer (Redis down),
/// the next purchase after this window asks again.
pub const RECHECK_WINDOW: Duration = Duration::from_millis(100);

/// How soon a sold-out answer is rechecked after an inconclusive recheck
/// (a winner's 409 from the script says nothing of the stock): soon enough
/// that restored stock is seen at once, far enough apart that a crowd of
/// winners' retries cannot all become script calls (at most one per 20 ms
/// per sale).
pub const INCONCLUSIVE_RETRY: Duration = Duration::from_millis(20);

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

impl Closed {
    fn code(self) -> u8 {
        match self {
            Closed::SoldOut => 0,
            Closed::Ended => 1,
            Closed::Unknown => 2,
        }
    }

    fn from_code(c: u8) -> Closed {
        match c {
            0 => Closed::SoldOut,
            1 => Closed::Ended,
            _ => Closed::Unknown,
        }
    }
}

/// What the memory knows of a sold-out sale's buyers.
#[derive(Debug, Clone, Default)]
pub enum Buyers {
    /// Not asked for yet (or the last load was discarded).
    #[default]
    Unknown,
    /// The loader is reading them.
    Loading,
    /// Every buyer as of the entry's `seq`.
    Loaded(Arc<BuyerSet>),
    /// More than fit in `SECKILL_GATEWAY_BUYERS_MAX`: read one by one.
    TooMany,
}

/// What the memory says about a purchase.
#[derive(Debug, Clone)]
pub enum Known {
    /// Ask Redis: not remembered, or due for its recheck and this caller
    /// makes it.
    Ask,
    /// Closed; for [`Closed::SoldOut`], its buyers when loaded.
    Closed(Closed, Option<Arc<BuyerSet>>),
}

/// One remembered sale.
#[derive(Debug)]
struct Entry {
    /// [`Closed::code`].
    closed: AtomicU8,
    /// Until when (µs since the cache's `base`) the answer is trusted.
    until_us: AtomicU64,
    /// The sale's reservation sequence when Redis gave the answer.
    seq: AtomicU64,
    buyers: RwLock<Buyers>,
    /// The sale's window end (Unix ms), once the loader has read it; 0
    /// before. The sweep frees sales past it.
    ends_at_ms: AtomicU64,
}

/// Sale id -> remembered answer.
#[derive(Debug)]
pub struct SoldOutCache {
    base: Instant,
    sales: RwLock<HashMap<u64, Arc<Entry>>>,
    /// Buyers held over all entries, and the most allowed.
    buyers_held: AtomicUsize,
    buyers_max: usize,
}

impl SoldOutCache {
    /// An empty memory that holds at most `buyers_max` buyers in all
    /// (`SECKILL_GATEWAY_BUYERS_MAX`).
    pub fn new(buyers_max: usize) -> SoldOutCache {
        SoldOutCache {
            base: Instant::now(),
            sales: RwLock::default(),
            buyers_held: AtomicUsize::new(0),
            buyers_max,
        }
    }

    fn micros(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.base).as_micros()).unwrap_or(u64::MAX)
    }

    fn entry(&self, sale_id: u64) -> Option<Arc<Entry>> {
        self.sales.read().ok()?.get(&sale_id).cloned()
    }

    /// Buyers held in memory now, over all sales.
    pub fn buyers_held(&self) -> usize {
        self.buyers_held.load(Ordering::Acquire)
    }

    /// The remembered state of `sale_id` at `now` (this machine's clock for
    /// the sale's end). After the expiry, [`Known::Ask`] for the first
    /// caller (who asks Redis) and the remembered state for the others
    /// during [`RECHECK_WINDOW`]; a sold-out sale past its end is
    /// [`Known::Ask`] for everyone.
    pub fn get(&self, sale_id: u64, now: Instant) -> Known {
        self.get_at(sale_id, now, seckill_common::now_ms)
    }

    /// [`SoldOutCache::get`] with the wall clock `wall_ms` (Unix ms), read
    /// only for a sold-out sale whose end is known.
    pub fn get_at(&self, sale_id: u64, now: Instant, wall_ms: impl FnOnce() -> u64) -> Known {
        let Some(e) = self.entry(sale_id) else {
            return Known::Ask;
        };
        if Closed::from_code(e.closed.load(Ordering::Acquire)) == Closed::SoldOut {
            let end = e.ends_at_ms.load(Ordering::Acquire);
            if end != 0 && wall_ms() >= end {
                return Known::Ask;
            }
        }
        let now_us = self.micros(now);
        let until = e.until_us.load(Ordering::Acquire);
        if now_us >= until {
            let window = self.micros(now + RECHECK_WINDOW);
            if e.until_us
                .compare_exchange(until, window, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Known::Ask;
            }
        }
        let closed = Closed::from_code(e.closed.load(Ordering::Acquire));
        let buyers = match &*e.buyers.read().unwrap_or_else(|p| p.into_inner()) {
            Buyers::Loaded(set) if closed == Closed::SoldOut => Some(set.clone()),
            _ => None,
        };
        Known::Closed(closed, buyers)
    }

    /// The sequence at which `sale_id` is remembered sold out, while its
    /// window is not known to have closed (by the wall clock `wall_ms`):
    /// what a caller [`SoldOutCache::get`] sent to Redis for the recheck
    /// compares with (`recheck.rs`). `None` for any other memory.
    pub fn sold_out_at(&self, sale_id: u64, wall_ms: impl FnOnce() -> u64) -> Option<u64> {
        let e = self.entry(sale_id)?;
        if Closed::from_code(e.closed.load(Ordering::Acquire)) != Closed::SoldOut {
            return None;
        }
        let end = e.ends_at_ms.load(Ordering::Acquire);
        if end != 0 && wall_ms() >= end {
            return None;
        }
        Some(e.seq.load(Ordering::Acquire))
    }

    /// Remembers that Redis said `closed` for `sale_id` at sequence `seq`
    /// and time `now`, trusted for [`RECHECK_AFTER`]. An answer older than
    /// the one remembered (lower `seq`) changes nothing, but for `Ended`:
    /// a window that closed stays closed, whatever the order of the replies
    /// (and the `seq` of a split sale's bucket says nothing of the sale's).
    ///
    /// Returns true when the caller should have the sale's buyers loaded
    /// (sold out, not loaded, not loading): the entry is then `Loading`.
    pub fn closed(&self, sale_id: u64, closed: Closed, seq: u64, now: Instant) -> bool {
        self.closed_ending(sale_id, closed, seq, now, None)
    }

    /// [`SoldOutCache::closed`], with the sale's window end `ends_at_ms`
    /// (Unix ms) when the caller knows it: a sold-out answer is not
    /// trusted from then on ([`SoldOutCache::get`]).
    pub fn closed_ending(
        &self,
        sale_id: u64,
        closed: Closed,
        seq: u64,
        now: Instant,
        ends_at_ms: Option<u64>,
    ) -> bool {
        let until = self.micros(now + RECHECK_AFTER);
        let e = match self.entry(sale_id) {
            Some(e) => e,
            None => self.insert(sale_id, closed, seq, until),
        };
        if let Some(end) = ends_at_ms.filter(|&end| end != 0) {
            e.ends_at_ms.store(end, Ordering::Release);
        }
        let old_seq = e.seq.load(Ordering::Acquire);
        if seq < old_seq && closed != Closed::Ended {
            return false;
        }
        let old = Closed::from_code(e.closed.swap(closed.code(), Ordering::AcqRel));
        e.seq.store(seq, Ordering::Release);
        e.until_us.store(until, Ordering::Release);
        let mut buyers = e.buyers.write().unwrap_or_else(|p| p.into_inner());
        if closed != Closed::SoldOut || old != Closed::SoldOut || seq != old_seq {
            // Another state, or sold out again after more sales: what was
            // held describes another moment.
            self.drop_buyers(&mut buyers);
        }
        if closed == Closed::SoldOut && matches!(*buyers, Buyers::Unknown) {
            *buyers = Buyers::Loading;
            return true;
        }
        false
    }

    fn insert(&self, sale_id: u64, closed: Closed, seq: u64, until: u64) -> Arc<Entry> {
        let mut sales = self.sales.write().unwrap_or_else(|p| p.into_inner());
        if sales.len() >= MAX_SALES && !sales.contains_key(&sale_id) {
            for e in sales.values() {
                self.drop_buyers(&mut e.buyers.write().unwrap_or_else(|p| p.into_inner()));
            }
            sales.clear();
        }
        sales
            .entry(sale_id)
            .or_insert_with(|| {
                Arc::new(Entry {
                    closed: AtomicU8::new(closed.code()),
                    until_us: AtomicU64::new(until),
                    seq: AtomicU64::new(seq),
                    buyers: RwLock::new(Buyers::Unknown),
                    ends_at_ms: AtomicU64::new(0),
                })
            })
            .clone()
    }

    fn drop_buyers(&self, buyers: &mut Buyers) {
        if let Buyers::Loaded(set) = std::mem::take(buyers) {
            self.buyers_held.fetch_sub(set.len(), Ordering::AcqRel);
        }
    }

    /// Notes that Redis reserved a unit of `sale_id` at sequence `seq`.
    /// When that is after the remembered sell-out (stock came back), the
    /// sale is forgotten, buyers and all; an older reply changes nothing.
    pub fn reserved(&self, sale_id: u64, seq: u64) {
        let Some(e) = self.entry(sale_id) else { return };
        if seq <= e.seq.load(Ordering::Acquire) {
            return;
        }
        self.forget_if(sale_id, |cur| Arc::ptr_eq(cur, &e));
    }

    /// Notes a winner's retry (409) that found stock left in `sale_id`:
    /// units came back (released, expired, cancelled), so a sold-out
    /// memory is forgotten at once instead of waiting for a conclusive
    /// recheck (returned stock is sold again within 1 s, however many
    /// winners retry meanwhile).
    pub fn stock_back(&self, sale_id: u64) {
        let Some(e) = self.entry(sale_id) else { return };
        if Closed::from_code(e.closed.load(Ordering::Acquire)) == Closed::SoldOut {
            self.forget_if(sale_id, |cur| Arc::ptr_eq(cur, &e));
        }
    }

    /// Notes a winner's retry (409) that found no stock in `sale_id` at
    /// `seq`: as conclusive as a `sold_out` reply, when the sale is
    /// remembered sold out (an `Ended` or `Unknown` memory is forgotten, as
    /// [`SoldOutCache::inconclusive`] does). Returns what
    /// [`SoldOutCache::closed`] returns.
    pub fn confirmed_sold_out(&self, sale_id: u64, seq: u64, now: Instant) -> bool {
        match self.entry(sale_id) {
            Some(e) if Closed::from_code(e.closed.load(Ordering::Acquire)) == Closed::SoldOut => {
                self.closed(sale_id, Closed::SoldOut, seq, now)
            }
            _ => {
                self.inconclusive(sale_id, now);
                false
            }
        }
    }

    /// Notes a reply that shows `sale_id` loaded and its window open but
    /// says nothing of its stock (`already_purchased`, `paused`,
    /// `not_started`). An `Unknown` or `Ended` memory is forgotten. A
    /// `SoldOut` one that is being rechecked (within [`RECHECK_WINDOW`] of
    /// its expiry) is made due again after [`INCONCLUSIVE_RETRY`]: when most
    /// purchases are winners' retries (409 from the script), the recheck
    /// must not wait a whole window per inconclusive answer.
    pub fn inconclusive(&self, sale_id: u64, now: Instant) {
        let Some(e) = self.entry(sale_id) else { return };
        match Closed::from_code(e.closed.load(Ordering::Acquire)) {
            Closed::SoldOut => {
                let soon = self.micros(now + INCONCLUSIVE_RETRY);
                let window = self.micros(now + RECHECK_WINDOW);
                let until = e.until_us.load(Ordering::Acquire);
                if until <= window {
                    let _ = e.until_us.compare_exchange(
                        until,
                        soon,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    );
                }
            }
            Closed::Ended | Closed::Unknown => self.forget_if(sale_id, |cur| Arc::ptr_eq(cur, &e)),
        }
    }

    fn forget_if(&self, sale_id: u64, pred: impl Fn(&Arc<Entry>) -> bool) {
        let mut sales = self.sales.write().unwrap_or_else(|p| p.into_inner());
        if sales.get(&sale_id).is_some_and(&pred) {
            if let Some(e) = sales.remove(&sale_id) {
                self.drop_buyers(&mut e.buyers.write().unwrap_or_else(|p| p.into_inner()));
            }
        }
    }

    /// Installs the buyers the loader read for `sale_id` while Redis said
    /// sold out at `seq`, with the sale's window end `ends_at_ms`. `None`
    /// means they do not fit or could not be read (`too_many` tells which).
    /// Ignored unless the entry is still sold out at that `seq` and loading.
    pub fn loaded(
        &self,
        sale_id: u64,
        seq: u64,
        set: Option<BuyerSet>,
        too_many: bool,
        ends_at_ms: u64,
    ) {
        let Some(e) = self.entry(sale_id) else { return };
        let mut buyers = e.buyers.write().unwrap_or_else(|p| p.into_inner());
        // A load for an earlier sell-out: a newer one is on its way.
        if !matches!(*buyers, Buyers::Loading) || e.seq.load(Ordering::Acquire) != seq {
            return;
        }
        if ends_at_ms != 0 {
            e.ends_at_ms.store(ends_at_ms, Ordering::Release);
        }
        let current = Closed::from_code(e.closed.load(Ordering::Acquire)) == Closed::SoldOut;
        *buyers = match set {
            Some(set) if current => {
                let n = set.len();
                let held = self.buyers_held.fetch_add(n, Ordering::AcqRel);
                if held + n > self.buyers_max {
                    self.buyers_held.fetch_sub(n, Ordering::AcqRel);
                    Buyers::TooMany
                } else {
                    Buyers::Loaded(Arc::new(set))
                }
            }
            _ if too_many && current => Buyers::TooMany,
            _ => Buyers::Unknown,
        };
    }

    /// Buyers that can still be loaded before the bound is reached.
    pub fn buyers_room(&self) -> usize {
        self.buyers_max.saturating_sub(self.buyers_held())
    }

    /// Forgets every sale whose window closed before `now_ms` (Unix ms,
    /// this machine's clock): their buyers are no longer needed (Redis
    /// answers `ended` to everyone). Returns how many were forgotten.
    pub fn sweep(&self, now_ms: u64) -> usize {
        let ended: Vec<u64> = match self.sales.read() {
            Ok(s) => s
                .iter()
                .filter(|(_, e)| {
                    let end = e.ends_at_ms.load(Ordering::Acquire);
                    end != 0 && end < now_ms
                })
                .map(|(id, _)| *id)
                .collect(),
            Err(_) => return 0,
        };
        for id in &ended {
            self.forget_if(*id, |_| true);
        }
        ended.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(pairs: &[(&str, &str)]) -> BuyerSet {
        let mut s = BuyerSet::default();
        for (u, r) in pairs {
            assert!(s.insert(u, r));
        }
        s
    }

    const R1: &str = "0123456789abcdef0123456789abcdef";

    fn closed(k: Known) -> Option<Closed> {
        match k {
            Known::Ask => None,
            Known::Closed(c, _) => Some(c),
        }
    }

    #[test]
    fn a_winners_retry_that_finds_stock_reopens_and_one_that_finds_none_confirms() {
        let c = SoldOutCache::new(100);
        let t0 = Instant::now();
        c.closed(1, Closed::SoldOut, 10, t0);
        // At the recheck, a 409 with stock 0: sold out again for a whole
        // RECHECK_AFTER (not 20 ms, as an inconclusive answer).
        let t1 = t0 + RECHECK_AFTER;
        assert_eq!(closed(c.get(1, t1)), None);
        c.confirmed_sold_out(1, 10, t1);
        let t2 = t1 + RECHECK_AFTER - Duration::from_millis(1);
        assert_eq!(closed(c.get(1, t2)), Some(Closed::SoldOut));
        // A 409 with stock: forgotten at once.
        c.stock_back(1);
        assert!(matches!(c.get(1, t2), Known::Ask));
        // On a sale remembered ended, neither says it is sold out.
        c.closed(2, Closed::Ended, 3, t0);
        assert!(!c.confirmed_sold_out(2, 3, t0));
        assert!(matches!(c.get(2, t0), Known::Ask));
        c.closed(3, Closed::Ended, 3, t0);
        c.stock_back(3);
        assert_eq!(closed(c.get(3, t0)), Some(Closed::Ended));
    }

    #[test]
    fn a_sold_out_sale_past_its_end_is_asked_by_everyone_until_redis_says_ended() {
        let c = SoldOutCache::new(100);
        let t0 = Instant::now();
        c.closed_ending(1, Closed::SoldOut, 10, t0, Some(5_000));
        assert_eq!(
            closed(c.get_at(1, t0, || 4_999)),
            Some(Closed::SoldOut),
            "before the end: from memory"
        );
        // From the end on, within the 500 ms: every caller asks Redis.
        for _ in 0..3 {
            assert_eq!(closed(c.get_at(1, t0, || 5_000)), None);
        }
        // Redis says ended (an older seq too): remembered, for everyone.
        c.closed(1, Closed::Ended, 3, t0);
        assert_eq!(closed(c.get_at(1, t0, || 5_001)), Some(Closed::Ended));
        assert_eq!(closed(c.get_at(1, t0, || 5_001)), Some(Closed::Ended));
        // A failed buyers load (end 0) keeps the end known.
        c.closed_ending(2, Closed::SoldOut, 1, t0, Some(5_000));
        c.loaded(2, 1, None, false, 0);
        assert_eq!(closed(c.get_at(2, t0, || 5_000)), None);
        // Unknown end: the 500 ms rule alone.
        c.closed(3, Closed::SoldOut, 1, t0);
        assert_eq!(closed(c.get_at(3, t0, || u64::MAX)), Some(Closed::SoldOut));
    }

    #[test]
    fn a_closed_sale_is_trusted_only_until_the_recheck() {
        let c = SoldOutCache::new(100);
        let t0 = Instant::now();
        assert!(matches!(c.get(1, t0), Known::Ask));
        assert!(c.closed(1, Closed::SoldOut, 10, t0));
        let t = t0 + Duration::from_millis(499);
        assert_eq!(closed(c.get(1, t)), Some(Closed::SoldOut));
        assert!(matches!(c.get(2, t0), Known::Ask));
        // Expired: the first caller asks Redis, the others wait for it.
        let t1 = t0 + RECHECK_AFTER;
        assert_eq!(closed(c.get(1, t1)), None);
        assert_eq!(closed(c.get(1, t1)), Some(Closed::SoldOut));
        let t2 = t1 + RECHECK_WINDOW;
        assert_eq!(closed(c.get(1, t2)), None);
        assert_eq!(closed(c.get(1, t2)), Some(Closed::SoldOut));
        // The answer came back, still loading: not asked to load again.
        assert!(!c.closed(1, Closed::Ended, 10, t2));
        assert_eq!(closed(c.get(1, t2)), Some(Closed::Ended));
    }

    #[test]
    fn only_a_reservation_after_the_sell_out_reopens_the_sale() {
        let c = SoldOutCache::new(100);
        let t0 = Instant::now();
        assert!(c.closed(7, Closed::SoldOut, 300, t0));
        c.loaded(7, 300, Some(set(&[("alice", R1)])), false, u64::MAX);
        assert_eq!(c.buyers_held(), 1);
        // A reply of a script that ran before the sell-out, concluded late.
        c.reserved(7, 299);
        c.reserved(7, 300);
        let Known::Closed(Closed::SoldOut, Some(b)) = c.get(7, t0) else {
            panic!("expected sold out with buyers");
        };
        assert_eq!(b.lookup("alice").as_deref(), Some(R1));
        assert_eq!(b.lookup("bob"), None);
        // An older sold-out answer changes nothing.
        assert!(!c.closed(7, Closed::SoldOut, 250, t0));
        assert_eq!(c.buyers_held(), 1);
        // A reservation after it: stock came back.
        c.reserved(7, 301);
        assert!(matches!(c.get(7, t0), Known::Ask));
        assert_eq!(c.buyers_held(), 0);
    }

    #[test]
    fn an_inconclusive_recheck_is_followed_by_another_20_ms_later() {
        let c = SoldOutCache::new(10);
        let t0 = Instant::now();
        assert!(c.closed(1, Closed::SoldOut, 5, t0));
        // Fresh: a late 409 changes nothing.
        c.inconclusive(1, t0);
        assert_eq!(closed(c.get(1, t0)), Some(Closed::SoldOut));
        // Due: the first purchase rechecks and gets a 409 from the script.
        let t1 = t0 + RECHECK_AFTER;
        assert_eq!(closed(c.get(1, t1)), None);
        assert_eq!(closed(c.get(1, t1)), Some(Closed::SoldOut));
        c.inconclusive(1, t1);
        let soon = t1 + INCONCLUSIVE_RETRY;
        assert_eq!(
            closed(c.get(1, soon - Duration::from_millis(1))),
            Some(Closed::SoldOut)
        );
        assert_eq!(closed(c.get(1, soon)), None, "rechecked 20 ms later");
        // An unknown sale that answers at all is forgotten.
        c.closed(2, Closed::Unknown, 0, t0);
        c.inconclusive(2, t0);
        assert!(matches!(c.get(2, t0), Known::Ask));
    }

    #[test]
    fn buyers_are_bounded_and_loaded_only_for_the_current_sell_out() {
        let c = SoldOutCache::new(2);
        let t0 = Instant::now();
        assert!(c.closed(1, Closed::SoldOut, 5, t0));
        // Sold out again at a later seq while loading: a new load is asked
        // for, and the first one's result is stale.
        assert!(c.closed(1, Closed::SoldOut, 6, t0));
        c.loaded(1, 5, Some(set(&[("a", R1)])), false, 0);
        assert_eq!(c.buyers_held(), 0);
        assert!(!c.closed(1, Closed::SoldOut, 6, t0));
        c.loaded(
            1,
            6,
            Some(set(&[("a", R1), ("b", R1), ("c", R1)])),
            false,
            0,
        );
        assert_eq!(c.buyers_held(), 0, "three buyers do not fit in two");
        assert!(matches!(c.get(1, t0), Known::Closed(Closed::SoldOut, None)));
        // Too many is remembered: no load asked for again at the same seq.
        assert!(!c.closed(1, Closed::SoldOut, 6, t0));
        assert!(c.closed(2, Closed::SoldOut, 1, t0));
        c.loaded(2, 1, Some(set(&[("a", R1), ("b", R1)])), false, 1_000);
        assert_eq!(c.buyers_held(), 2);
        // Ended frees them.
        assert!(!c.closed(2, Closed::Ended, 1, t0));
        assert_eq!(c.buyers_held(), 0);
    }

    #[test]
    fn the_sweep_frees_sales_whose_window_closed() {
        let c = SoldOutCache::new(10);
        let t0 = Instant::now();
        assert!(c.closed(1, Closed::SoldOut, 1, t0));
        c.loaded(1, 1, Some(set(&[("a", R1)])), false, 1_000);
        assert!(c.closed(2, Closed::SoldOut, 1, t0));
        c.loaded(2, 1, Some(set(&[("b", R1)])), false, 5_000);
        assert_eq!(c.sweep(999), 0);
        assert_eq!(c.sweep(2_000), 1);
        assert_eq!(c.buyers_held(), 1);
        assert!(matches!(c.get(1, t0), Known::Ask));
        assert_eq!(c.sweep(6_000), 1);
        assert_eq!(c.buyers_held(), 0);
    }

    #[test]
    fn made_up_sale_ids_cannot_grow_it_without_bound() {
        let c = SoldOutCache::new(10);
        let t0 = Instant::now();
        for id in 0..(MAX_SALES as u64 + 5) {
            c.closed(id, Closed::Unknown, 0, t0);
        }
        assert!(c.sales.read().unwrap().len() <= MAX_SALES);
    }
}
