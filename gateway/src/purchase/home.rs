//! Owns the routing of a purchase to its buyer's home bucket for a sale
//! split over buckets (`seckill_common::buckets`): the memory of each
//! sale's bucket count (and window: its start for the public
//! `sale_not_started`, its end for the sold-out memory), the pull
//! of units to a home bucket that holds fewer than a purchase asks for
//! before a buyer is told `sold_out` or `not_enough_stock`
//! (`seckill_common::transfer::pull`: [`reach_stock`] for one unit,
//! [`reach_units`] for a purchase of the units script), and the sale's own
//! window when the home bucket is gone ([`ended_elsewhere`]).
//!
//! A one-bucket sale (the default) is routed to its own keys with no extra
//! call while its count is remembered: one `HMGET` of its meta per sale per
//! gateway process, at most once per [`RECOUNT_AFTER`].

use crate::purchase::Purchases;
use crate::redis::link::{LinkPool, Unavailable};
use seckill_common::buckets;
use seckill_common::keys::SaleKeys;
use seckill_common::reservation::{Replied, ReserveOutcome};
use seckill_common::transfer::{self, Pull, PULL_ROUNDS};
use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};

/// Most sales whose bucket count is remembered; beyond it the memory is
/// cleared (made-up sale ids are never remembered: only loaded sales are).
pub const MAX_SALES: usize = 10_000;

/// How long a remembered bucket count is used before it is read again. A
/// sale's K does not change while Redis holds it, but an operator who
/// reloads a lost sale with another `--shards` changes it: a gateway that
/// kept the old K would route a buyer to another home bucket and let them
/// buy twice. Once a second per sale per gateway is one
/// `HMGET` (one caller reads it, [`RECOUNT_GRACE`]), nothing beside a
/// purchase's script.
pub const RECOUNT_AFTER: Duration = Duration::from_secs(1);

/// How long past [`RECOUNT_AFTER`] the other callers keep a due K while
/// the first one that found it due reads it again ([`BucketCounts::of`]):
/// a K is never used once read 1.25 s ago. If that read has not answered
/// by then (a stalled master of bucket 0), every caller reads it, as
/// with no claim: none goes on with an old K, and an idle sale's K read
/// long ago is read again by everyone (kept while another purchase read
/// it, it could route a buyer of a reloaded sale to a second 202).
pub const RECOUNT_GRACE: Duration = Duration::from_millis(250);

/// What is remembered of one sale.
#[derive(Debug, Clone, Copy)]
struct Known {
    /// Its number of buckets.
    k: u32,
    /// Its window start (Unix ms), when bucket 0's meta has one.
    starts: Option<u64>,
    /// Its window end (Unix ms), when bucket 0's meta has one.
    ends: Option<u64>,
    /// Whether bucket 0's meta carried a pause mark: when set, a purchase
    /// reads every bucket's pause before its token is checked
    /// (`paused.rs`); never an answer by itself.
    paused: bool,
    /// When `k` and `ends` were read.
    read_at: Instant,
    /// Whether a caller has taken the read of this due K on itself (see
    /// [`BucketCounts::of`]).
    claimed: bool,
}

/// Sale id -> its number of buckets (K ≥ 1), window end and when they were
/// read, for sales Redis holds.
#[derive(Debug, Default)]
pub struct BucketCounts {
    known: RwLock<HashMap<u64, Known>>,
}

impl BucketCounts {
    /// The number of buckets of `sale_id`: from memory, else one `HMGET`
    /// (`buckets::count`). A sale Redis does not hold counts as 1 and is
    /// not remembered (the script then answers `unknown_sale`).
    ///
    /// A K read [`RECOUNT_AFTER`] ago is due: the first caller to find it
    /// so reads it again, and the others keep the remembered K meanwhile,
    /// for at most [`RECOUNT_GRACE`], so the purchases in flight at each
    /// second's turn do not each make one more round trip
    /// (`sale_buckets::a_due_bucket_count_is_read_again_by_one_purchase`).
    ///
    /// Errors: [`Unavailable`] when Redis cannot be read in time.
    pub fn of(&self, links: &LinkPool, sale_id: u64) -> Result<u32, Unavailable> {
        let known = self
            .known
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&sale_id)
            .copied();
        if let Some(n) = known {
            if n.read_at.elapsed() < RECOUNT_AFTER {
                return Ok(n.k);
            }
            if let Some(k) = self.kept_while_due(sale_id, n) {
                return Ok(k);
            }
        }
        let Some((k, starts, ends, paused)) =
            links.with(|link| link.with(|con| buckets::count_and_window(con, sale_id)))?
        else {
            // No longer held (lost, archived): forgotten, so every caller
            // reads it again, as for a sale never seen.
            if known.is_some() {
                self.known
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&sale_id);
            }
            return Ok(1);
        };
        let mut known = self.known.write().unwrap_or_else(|p| p.into_inner());
        if known.len() >= MAX_SALES {
            known.clear();
        }
        let read_at = Instant::now();
        known.insert(
            sale_id,
            Known {
                k,
                starts,
                ends,
                paused,
                read_at,
                claimed: false,
            },
        );
        Ok(k)
    }

    /// For a caller that found `sale_id`'s K `n` due: `None` when it must
    /// read it again (the first such caller, which claims the read, and
    /// every caller once `n` was read [`RECOUNT_AFTER`] + [`RECOUNT_GRACE`]
    /// ago), else the K to use (the remembered one, or one read meanwhile).
    fn kept_while_due(&self, sale_id: u64, n: Known) -> Option<u32> {
        if n.read_at.elapsed() >= RECOUNT_AFTER + RECOUNT_GRACE {
            return None;
        }
        if n.claimed {
            return Some(n.k);
        }
        let mut known = self.known.write().unwrap_or_else(|p| p.into_inner());
        let e = known.get_mut(&sale_id)?;
        if e.read_at != n.read_at || e.claimed {
            // Read again meanwhile, or claimed by another caller.
            return Some(e.k);
        }
        e.claimed = true;
        None
    }

    /// The window end (Unix ms) of `sale_id` as last read with its K
    /// ([`BucketCounts::of`]), from memory only: `None` when not read.
    pub fn ends_at(&self, sale_id: u64) -> Option<u64> {
        self.known
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&sale_id)
            .and_then(|n| n.ends)
    }

    /// Whether `sale_id`'s bucket 0 carried a pause mark when last read
    /// with its K (or as [`BucketCounts::set_paused`] said since), from
    /// memory only: false when not read.
    pub fn paused(&self, sale_id: u64) -> bool {
        self.known
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&sale_id)
            .is_some_and(|n| n.paused)
    }

    /// Notes a fresher read of `sale_id`'s pause (a recheck of the pause
    /// marks, the script's `paused`): a remembered sale only.
    pub fn set_paused(&self, sale_id: u64, paused: bool) {
        if self.paused(sale_id) == paused {
            return;
        }
        if let Some(n) = self
            .known
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&sale_id)
        {
            n.paused = paused;
        }
    }

    /// The window start (Unix ms) of `sale_id` as last read with its K,
    /// from memory only: `None` when not read (a sale not held is never
    /// remembered).
    pub fn starts_at(&self, sale_id: u64) -> Option<u64> {
        self.known
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&sale_id)
            .and_then(|n| n.starts)
    }

    /// The keys of `user_id`'s home bucket in `sale_id`, and the sale's K.
    ///
    /// Errors: as [`BucketCounts::of`].
    pub fn home(
        &self,
        links: &LinkPool,
        sale_id: u64,
        user_id: &str,
    ) -> Result<(SaleKeys, u32), Unavailable> {
        let k = self.of(links, sale_id)?;
        Ok((
            SaleKeys::bucket(sale_id, buckets::home_bucket(user_id, k)),
            k,
        ))
    }
}

/// For a sale of `k` > 1 buckets: when the home bucket `home` answered
/// `sold_out`, pulls units into it and tries the purchase again (with a
/// fresh reservation id each time), until a reply other than `sold_out`,
/// or the whole sale is found sold out (`transfer::pull`); then the
/// `sold_out` reply carries the sale's sequence. Any other outcome is
/// returned as it is.
///
/// The answer is always the last purchase's: a purchase made in the last
/// round is answered as made, never 503 (which says nothing was reserved).
///
/// Errors: [`Unavailable`] when Redis cannot be reached, and when the
/// buckets kept changing under [`PULL_ROUNDS`] attempts with nothing
/// reserved (never a false `sold_out`: the buyer retries).
pub fn reach_stock(
    p: &Purchases,
    home: SaleKeys,
    k: u32,
    user_id: &str,
    mut outcome: Result<Replied, Unavailable>,
) -> Result<Replied, Unavailable> {
    if k <= 1 {
        return outcome;
    }
    for _ in 0..PULL_ROUNDS {
        if !short(&outcome, false) {
            return outcome;
        }
        let pulled = p
            .links
            .with(|link| link.with(|con| transfer::pull(con, home.sale_id, k, home.bucket, 1)))?;
        match pulled {
            Pull::Ready => outcome = p.reserver.reserve(home, user_id),
            Pull::SoldOut { seq } => {
                return Ok(Replied {
                    outcome: ReserveOutcome::SoldOut,
                    seq,
                    stock: None,
                })
            }
            Pull::Paused => return Ok(paused_bucket()),
            // Never for one unit: fewer than one left is sold out.
            Pull::NotEnough { .. } | Pull::Busy => return Err(Unavailable),
        }
    }
    after_rounds(outcome, false)
}

/// Whether `outcome` asks for units to be pulled home: `sold_out`, and
/// `not_enough` too when `units` (a purchase of the units script).
fn short(outcome: &Result<Replied, Unavailable>, units: bool) -> bool {
    match outcome {
        Ok(Replied {
            outcome: ReserveOutcome::SoldOut,
            ..
        }) => true,
        Ok(Replied {
            outcome: ReserveOutcome::NotEnoughStock(_),
            ..
        }) => units,
        _ => false,
    }
}

/// The answer once [`PULL_ROUNDS`] rounds are spent: the last purchase's
/// outcome when it was anything but short (a reservation made in the last
/// round is answered as made), else 503 with nothing reserved.
fn after_rounds(
    outcome: Result<Replied, Unavailable>,
    units: bool,
) -> Result<Replied, Unavailable> {
    if short(&outcome, units) {
        return Err(Unavailable);
    }
    outcome
}

/// A purchase of the units script (`reserve_units.rs`) in a sale split
/// over buckets: how many units and under which keyed reservation id.
#[derive(Debug, Clone, Copy)]
pub struct UnitsAsked<'a> {
    /// Units asked for.
    pub quantity: u32,
    /// The keyed reservation id (`None`: no key, the script answers
    /// `key_required` before it reads the stock).
    pub rid: Option<&'a str>,
}

/// [`reach_stock`] for a purchase of several units: when the home bucket
/// `home` answered `sold_out` or `not_enough` (fewer than the quantity
/// left there), pulls units into it until it holds the quantity
/// (`transfer::pull`) and makes the purchase again under the same keyed
/// reservation id (the script answers a repeat `replayed`, so a purchase
/// made once is never made twice), until a reply other than those two.
/// The purchase is always the home bucket's alone, all or nothing: never
/// part in one bucket and part in another. When the whole sale cannot
/// cover the quantity the reply is `not_enough` with the sale's units
/// left, or `sold_out` with the sale's sequence when none is left: the
/// sold-out memory hears `sold_out` only then. As with [`reach_stock`], a
/// purchase made in the last round is answered as made.
///
/// Errors: as [`reach_stock`].
pub fn reach_units(
    p: &Purchases,
    home: SaleKeys,
    k: u32,
    user_id: &str,
    asked: UnitsAsked<'_>,
    mut outcome: Result<Replied, Unavailable>,
) -> Result<Replied, Unavailable> {
    if k <= 1 {
        return outcome;
    }
    for _ in 0..PULL_ROUNDS {
        if !short(&outcome, true) {
            return outcome;
        }
        let need = u64::from(asked.quantity);
        let pulled = p.links.with(|link| {
            link.with(|con| transfer::pull(con, home.sale_id, k, home.bucket, need))
        })?;
        let answer = |outcome, seq| {
            Ok(Replied {
                outcome,
                seq,
                stock: None,
            })
        };
        match pulled {
            Pull::Ready => {
                outcome = p
                    .reserver
                    .reserve_units(home, user_id, asked.rid, asked.quantity)
            }
            Pull::SoldOut { seq } => return answer(ReserveOutcome::SoldOut, seq),
            Pull::NotEnough { left } => return answer(ReserveOutcome::NotEnoughStock(left), 0),
            Pull::Paused => return Ok(paused_bucket()),
            Pull::Busy => return Err(Unavailable),
        }
    }
    after_rounds(outcome, true)
}

/// The reply to a purchase whose units are only in buckets paused for a
/// data loss (`Pull::Paused`): the sale is paused (503 `sale_paused`).
fn paused_bucket() -> Replied {
    Replied {
        outcome: ReserveOutcome::Paused("units only in a paused bucket".into()),
        seq: 0,
        stock: None,
    }
}

/// For a sale of `k` > 1 buckets whose home bucket `home` answered
/// `unknown_sale` (its keys are gone): the sale's own window decides, read
/// from bucket 0's meta with Redis's clock (one pipeline of `HGET` and
/// `TIME`). When it has ended, the reply is `ended` (403 `sale_ended`, what
/// the whole archived sale answers: an archive removes the buckets after
/// writing bucket 0's tombstone, and a gateway may still route by the K it
/// remembers, or an older archive was interrupted with buckets gone and
/// bucket 0 whole); otherwise, or when bucket 0 is gone too, `outcome` as
/// it is (503 for this buyer: one lost bucket of a live sale says nothing
/// of the others). Any other outcome is returned as it is, with no call.
pub fn ended_elsewhere(
    links: &LinkPool,
    home: SaleKeys,
    k: u32,
    outcome: Result<Replied, Unavailable>,
) -> Result<Replied, Unavailable> {
    let gone = matches!(
        outcome,
        Ok(Replied {
            outcome: ReserveOutcome::UnknownSale,
            ..
        })
    );
    if k <= 1 || !gone {
        return outcome;
    }
    let meta = SaleKeys::new(home.sale_id).meta();
    let read = links.with(|link| {
        link.with(|con| {
            redis::pipe()
                .cmd("HGET")
                .arg(&meta)
                .arg("ends_at_ms")
                .cmd("TIME")
                .query::<(Option<String>, (u64, u64))>(con)
        })
    });
    match read {
        Ok((Some(ends), (secs, micros)))
            if ends
                .parse::<u64>()
                .is_ok_and(|e| secs * 1000 + micros / 1000 >= e) =>
        {
            Ok(Replied {
                outcome: ReserveOutcome::Ended,
                seq: 0,
                stock: None,
            })
        }
        _ => outcome,
    }
}
