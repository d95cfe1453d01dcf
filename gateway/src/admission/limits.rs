//! Owns the bounded shares: a rate limit per buyer per sale and one per
//! client address, each a fixed-size table of token buckets kept as GCRA
//! entries (the "generic cell rate algorithm": one theoretical arrival
//! time per key, equivalent to a token bucket of rate R and burst B).
//!
//! # Memory
//!
//! Each table is allocated once at start: `SECKILL_GATEWAY_LIMIT_SLOTS`
//! entries of 16 bytes (a 64-bit key hash and a 64-bit time), in 64
//! shards behind one mutex each, organised as sets of [`WAYS`] entries
//! (a key can live only in the set its hash names). No key is ever
//! stored, so nothing a client sends grows the process.
//!
//! # When a table is full
//!
//! A new key takes an empty entry of its set, or one whose bucket has
//! refilled to B (idle: forgetting it loses nothing, a returning key gets
//! the same full bucket it would have had). An active entry is never
//! evicted: a flood of fresh ids cannot push a bot's drained bucket out
//! to give it a fresh burst. When all [`WAYS`] entries of the set are
//! active the new key is refused 429 (fail closed: counted in
//! `seckill_gateway_limit_table_full_total`). Filling a set takes more
//! than `WAYS` distinct active keys hashing to it within B/R seconds
//! (2.5 s for buyers at the defaults): with a million entries that is
//! hundreds of thousands of distinct keys a second, above what one
//! gateway serves, and the address limit stands in front of the buyer
//! limit. Keys are hashed with SipHash under a random per-process key,
//! so a client cannot aim its keys at one set; two keys whose hashes
//! agree in 63 bits share one bucket (for a million live keys, a chance
//! of about 5 in 10^8).

use crate::config::LimitSettings;
use seckill_common::trusted::canonical;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Instant;

/// Entries per set.
pub const WAYS: usize = 8;

/// Shards (one mutex each) per table.
pub const SHARDS: usize = 64;

/// Bytes of one table entry.
pub const ENTRY_BYTES: usize = std::mem::size_of::<Entry>();

/// What a limit said about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Within the share.
    Allowed,
    /// Over the rate: answer 429.
    Limited,
    /// The key is new and its set holds only active keys: answer 429.
    TableFull,
}

/// A rate R per second with a burst B, as GCRA: an emission interval of
/// 1/R and a tolerance of (B − 1)/R.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rule {
    interval_ns: u64,
    tolerance_ns: u64,
}

impl Rule {
    /// `None` when `rate` is 0 (no limit).
    fn new(rate: u32, burst: u32) -> Option<Rule> {
        if rate == 0 {
            return None;
        }
        let interval_ns = 1_000_000_000 / u64::from(rate);
        Some(Rule {
            interval_ns,
            tolerance_ns: interval_ns * u64::from(burst.max(1) - 1),
        })
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    /// The key's hash with the low bit set; 0 is an empty entry.
    tag: u64,
    /// Theoretical arrival time, ns on the table's clock: the bucket is
    /// full when it is not after now.
    tat: u64,
}

/// One fixed-size table of GCRA entries (see the module doc).
pub struct Table {
    rule: Option<Rule>,
    shards: Box<[Mutex<Box<[Entry]>>]>,
    sets_per_shard: usize,
    start: Instant,
}

/// Every clock reading is offset by this, so that an empty entry's `tat`
/// of 0 is always in the past.
const EPOCH_NS: u64 = 1 << 40;

impl Table {
    /// A table of at least `slots` entries (rounded up to whole sets in
    /// every shard) for `rate` per second with `burst`; `rate` 0 allows
    /// everything and allocates nothing.
    pub fn new(rate: u32, burst: u32, slots: usize) -> Table {
        let rule = Rule::new(rate, burst);
        let sets_per_shard = match rule {
            None => 0,
            Some(_) => slots.div_ceil(SHARDS * WAYS).max(1),
        };
        let shards = (0..SHARDS)
            .map(|_| Mutex::new(vec![Entry::default(); sets_per_shard * WAYS].into_boxed_slice()))
            .collect();
        Table {
            rule,
            shards,
            sets_per_shard,
            start: Instant::now(),
        }
    }

    /// Entries in the table (0 without a limit).
    pub fn capacity(&self) -> usize {
        self.sets_per_shard * WAYS * SHARDS
    }

    /// Charges one request of the key whose hash is `hash` (its low bit
    /// is ignored), now.
    pub fn charge(&self, hash: u64) -> Verdict {
        self.charge_at(hash, self.start.elapsed().as_nanos() as u64)
    }

    /// [`Table::charge`] at `elapsed_ns` after the table was made.
    fn charge_at(&self, hash: u64, elapsed_ns: u64) -> Verdict {
        let Some(rule) = self.rule else {
            return Verdict::Allowed;
        };
        let now = EPOCH_NS.saturating_add(elapsed_ns);
        let tag = hash | 1;
        let shard = (hash >> 58) as usize % SHARDS;
        let set = ((hash >> 16) as usize % self.sets_per_shard) * WAYS;
        // A poisoned lock only means another thread panicked mid-update of
        // two integers; the entries are still usable.
        let mut entries = self.shards[shard].lock().unwrap_or_else(|p| p.into_inner());
        let Some(ways) = entries.get_mut(set..set + WAYS) else {
            return Verdict::Allowed; // never: `set` is below sets_per_shard
        };
        let mut free = None;
        for (i, e) in ways.iter().enumerate() {
            if e.tag == tag {
                let tat = e.tat.max(now);
                if tat - now > rule.tolerance_ns {
                    return Verdict::Limited;
                }
                ways[i].tat = tat + rule.interval_ns;
                return Verdict::Allowed;
            }
            if free.is_none() && (e.tag == 0 || e.tat <= now) {
                free = Some(i);
            }
        }
        match free {
            Some(i) => {
                ways[i] = Entry {
                    tag,
                    tat: now + rule.interval_ns,
                };
                Verdict::Allowed
            }
            None => Verdict::TableFull,
        }
    }
}

/// Both limits of one gateway process.
pub struct Limits {
    buyers: Table,
    addresses: Table,
    hasher: RandomState,
}

impl Limits {
    /// The limits from the gateway's settings (`SECKILL_GATEWAY_BUYER_*`,
    /// `SECKILL_GATEWAY_ADDRESS_*`, `SECKILL_GATEWAY_LIMIT_SLOTS`).
    pub fn new(s: &LimitSettings) -> Limits {
        Limits {
            buyers: Table::new(s.buyer_rate, s.buyer_burst, s.slots),
            addresses: Table::new(s.address_rate, s.address_burst, s.slots),
            hasher: RandomState::new(),
        }
    }

    /// Charges one purchase attempt of `user_id` on `sale_id`.
    pub fn charge_buyer(&self, sale_id: u64, user_id: &str) -> Verdict {
        self.buyers.charge(self.hasher.hash_one((sale_id, user_id)))
    }

    /// Charges one request of the client address `addr` (an IPv6 address
    /// by its /64: one client usually holds a whole /64). Every request
    /// of an address is charged before it is looked at, so invalid
    /// requests (and invalid tokens) count against it; code that finds a
    /// request invalid late may charge it again to make failures dearer.
    pub fn charge_address(&self, addr: IpAddr) -> Verdict {
        let key: u128 = match canonical(addr) {
            IpAddr::V4(v4) => u128::from(u32::from(v4)),
            IpAddr::V6(v6) => (u128::from(v6) >> 64) | (1 << 127),
        };
        self.addresses.charge(self.hasher.hash_one(key))
    }

    /// Entries of the buyer and the address table (for the start log).
    pub fn capacity(&self) -> (usize, usize) {
        (self.buyers.capacity(), self.addresses.capacity())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate() {
        let t = Table::new(2, 5, 1024);
        let ms = 1_000_000;
        let allowed = (0..100)
            .filter(|_| t.charge_at(42, 0) == Verdict::Allowed)
            .count();
        assert_eq!(allowed, 5, "the burst, no more at once");
        assert_eq!(
            t.charge_at(44, 0),
            Verdict::Allowed,
            "another key has its own"
        );
        assert_eq!(t.charge_at(42, 499 * ms), Verdict::Limited);
        assert_eq!(
            t.charge_at(42, 500 * ms),
            Verdict::Allowed,
            "a token after 1/R"
        );
        assert_eq!(t.charge_at(42, 500 * ms), Verdict::Limited);
        // Ten seconds idle: a full bucket of 5 again, never more.
        let later = (0..100)
            .filter(|_| t.charge_at(42, 10_500 * ms) == Verdict::Allowed)
            .count();
        assert_eq!(later, 5);
        // Over a second at the rate: B + R attempts.
        let t = Table::new(2, 5, 1024);
        let in_a_second = (0..=1000u64)
            .filter(|i| t.charge_at(7 << 1, i * ms) == Verdict::Allowed)
            .count();
        assert_eq!(in_a_second, 5 + 2);
    }

    #[test]
    fn rate_zero_is_no_limit() {
        let t = Table::new(0, 5, 1024);
        assert_eq!(t.capacity(), 0);
        assert!((0..1000).all(|_| t.charge(1) == Verdict::Allowed));
    }

    #[test]
    fn a_full_set_refuses_new_keys_and_keeps_active_ones() {
        // One set per shard: keys with the same top six bits share a set.
        let t = Table::new(1, 2, 1);
        assert_eq!(t.capacity(), SHARDS * WAYS);
        let key = |i: u64| (i << 1) | (5 << 58);
        for i in 0..WAYS as u64 {
            assert_eq!(t.charge_at(key(i), 0), Verdict::Allowed);
        }
        assert_eq!(t.charge_at(key(100), 0), Verdict::TableFull);
        // The active keys kept their buckets: one more each, then limited.
        assert_eq!(t.charge_at(key(0), 0), Verdict::Allowed);
        assert_eq!(t.charge_at(key(0), 0), Verdict::Limited);
        assert_eq!(
            t.charge_at(key(100) | (6 << 58), 0),
            Verdict::Allowed,
            "other shard"
        );
    }

    #[test]
    fn an_idle_entry_is_reused() {
        let t = Table::new(1000, 1, 1);
        let key = |i: u64| (i << 1) | (7 << 58);
        for i in 0..WAYS as u64 {
            assert_eq!(t.charge_at(key(i), 0), Verdict::Allowed);
        }
        assert_eq!(t.charge_at(key(100), 999_999), Verdict::TableFull);
        assert_eq!(
            t.charge_at(key(100), 1_000_000),
            Verdict::Allowed,
            "idle entries refilled"
        );
        // The entry it took was idle; the others are still there (idle too).
        assert_eq!(t.charge_at(key(100), 1_000_000), Verdict::Limited);
    }

    #[test]
    fn ipv6_clients_are_charged_by_their_64() {
        let c = LimitSettings {
            buyer_rate: 2,
            buyer_burst: 5,
            address_rate: 1,
            address_burst: 1,
            slots: 1 << 20,
        };
        let l = Limits::new(&c);
        let a = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(l.charge_address(a("2001:db8::1")), Verdict::Allowed);
        assert_eq!(l.charge_address(a("2001:db8::ffff:2")), Verdict::Limited);
        assert_eq!(l.charge_address(a("2001:db8:0:1::1")), Verdict::Allowed);
        assert_eq!(l.charge_address(a("10.0.0.1")), Verdict::Allowed);
        assert_eq!(l.charge_address(a("::ffff:10.0.0.1")), Verdict::Limited);
        assert_eq!(l.charge_buyer(1, "alice"), Verdict::Allowed);
    }
}
