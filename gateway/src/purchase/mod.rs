//! Owns one purchase as domain decisions, never as HTTP replies: admit
//! (the body, then the public facts with no signature check: the sold-out
//! memory and a window not yet open; then the verified buyer and the
//! buyer's share: [`Purchases::admit`]), prepare (the in-flight bound and the home
//! bucket: [`Purchases::prepare`]), reserve (`redis/reserver.rs`, and the
//! pull of units to a home bucket that holds too few: `home.rs`) and conclude (what
//! Redis said, remembered and counted: [`Purchases::conclude`]). Every
//! path ends in a [`Decision`]; `http/` says it to the client.
//!
//! - [`body`]: the strict reading of the purchase body;
//! - [`soldout`]: the sold-out memory, ordered by the sale's reservation
//!   sequence; [`buyers`]: a sold-out sale's buyers, loaded once, bounded,
//!   into a [`buyer_set::BuyerSet`];
//! - [`recheck`]: whether a sale remembered sold out still is, and
//!   whether a sale is paused, read with no buyer; [`paused`]: a paused
//!   sale's answer, remembered half a second;
//! - [`home`]: which bucket of a split sale a buyer buys from.

pub mod body;
pub mod buyer_set;
pub mod buyers;
pub mod home;
pub mod paused;
pub mod recheck;
pub mod soldout;

use crate::admission::identity::Denied;
use crate::admission::shed::Admitted;
use crate::admission::{Admission, Credentials};
use crate::metrics::{Metrics, Outcome};
use crate::redis::fitness::Fitness;
use crate::redis::link::{LinkPool, Unavailable};
use crate::redis::reserver::Reserver;
use buyers::Loader;
use home::BucketCounts;
use paused::{PausedSales, Seen};
use recheck::Still;
use seckill_common::allowance::Held;
use seckill_common::keys::SaleKeys;
use seckill_common::reservation::{Replied, ReserveOutcome};
use soldout::{Closed, Known, SoldOutCache};
use std::sync::Arc;
use std::time::Instant;

/// How far before a sale's opening, by this host's clock, the gateway
/// stops saying `sale_not_started` itself and lets the script decide by
/// Redis's clock: a host clock behind Redis's by less than this never
/// refuses a purchase Redis would take.
pub const CLOCK_MARGIN_MS: u64 = 1_000;

/// What a purchase came to: each is one answer to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The units were reserved under this reservation id (or were
    /// before, by the same key and quantity: the same answer again).
    Reserved(String),
    /// Fewer units left than asked for (at least one): holds how many.
    NotEnoughStock(u64),
    /// The buyer's allowance is used up: their reservations.
    LimitReached(Held),
    /// The quantity is above the sale's limit per purchase (held).
    AboveMax(u32),
    /// The `Idempotency-Key` was used for a purchase of another quantity
    /// (the reservation id it made).
    KeyReused(String),
    /// The sale sells several units per buyer: a purchase needs an
    /// `Idempotency-Key`.
    KeyRequired,
    /// The buyer already holds (or held) this reservation id.
    AlreadyPurchased(String),
    /// The sale's window has not opened.
    NotStarted,
    /// The sale is paused (data lost, or an operator's pause).
    Paused,
    /// The sale is closed: sold out, ended, or not known.
    Closed(Closed),
    /// Redis could not decide in time.
    Unavailable,
    /// Too many purchases are waiting for Redis.
    Overloaded,
    /// Beyond the buyer's share.
    TooManyRequests,
    /// The body is refused (the detail).
    Invalid(&'static str),
    /// The request may not act as this buyer.
    Denied(Denied),
}

/// What the purchase path shares: the sold-out memory, the bucket
/// counts, the buyers loader, the way to Redis, and Redis's fitness.
pub struct Purchases {
    /// The sold-out fast path.
    pub soldout: Arc<SoldOutCache>,
    /// Sales found paused by a read with no buyer.
    pub paused: PausedSales,
    /// Each sale's number of buckets (also read by the status routes).
    pub buckets: Arc<BucketCounts>,
    /// Loads a sold-out sale's buyers into `soldout`.
    pub buyers: Loader,
    /// How a purchase reaches Redis.
    pub reserver: Reserver,
    /// The shared Redis links (bucket counts, one buyer's read, pulls).
    pub links: Arc<LinkPool>,
    /// Set while Redis can evict the sale's keys.
    pub fitness: Arc<Fitness>,
    /// Outcome counters.
    pub metrics: Arc<Metrics>,
}

/// A purchase that goes to the units script (`reserve_units.rs`): it
/// names a quantity above one or carries an `Idempotency-Key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Units {
    /// Units asked for.
    pub quantity: u32,
    /// The keyed reservation id (`ids::keyed_reservation_id`); `None`
    /// without a key (the script then answers `key_required`, or the
    /// sale's limit per purchase for a sale of one unit per buyer).
    pub rid: Option<String>,
}

/// A purchase admitted and routed, not yet sent to Redis.
pub struct Prepared<'a> {
    /// The buyer (the token's, or the body's with `SECKILL_AUTH=none`).
    pub user_id: String,
    /// The buyer's home bucket (`home.rs`); a sale of one bucket's keys.
    pub home: SaleKeys,
    /// The sale's number of buckets.
    pub k: u32,
    /// `Some` for a purchase of the units script; `None` for the one-unit
    /// script (group commit), as every purchase of a one-unit sale.
    pub units: Option<Units>,
    /// Its place under the in-flight bound (`admission/shed.rs`).
    pub place: Admitted<'a>,
}

impl Purchases {
    /// Everything of a purchase before Redis: [`Purchases::admit`], the
    /// in-flight bound (`Overloaded` beyond it) and the buyer's home
    /// bucket. `key` is the request's valid `Idempotency-Key`, if any. A
    /// purchase of one unit without a key goes to the one-unit script;
    /// one with a quantity or a key to the units script on the buyer's
    /// home bucket, whether the sale is split over buckets or not.
    ///
    /// Errors: the final decision when no reservation script is to run.
    pub fn prepare<'a>(
        &self,
        admission: &'a Admission,
        sale_id: u64,
        body: &[u8],
        creds: &Credentials,
        key: Option<&str>,
    ) -> Result<Prepared<'a>, Decision> {
        let (user_id, quantity) = self.admit(admission, sale_id, body, creds)?;
        let Some(place) = admission.shed.try_admit() else {
            self.metrics.shed.inc();
            return Err(Decision::Overloaded);
        };
        let (home, k) = self
            .buckets
            .home(&self.links, sale_id, &user_id)
            .map_err(|Unavailable| self.unavailable())?;
        let units = match (quantity, key) {
            (1, None) => None,
            (quantity, key) => Some(Units {
                quantity,
                rid: key
                    .map(|key| seckill_common::ids::keyed_reservation_id(sale_id, &user_id, key)),
            }),
        };
        Ok(Prepared {
            user_id,
            home,
            k,
            units,
            place,
        })
    }

    /// The rest of a purchase on this thread: the reservation, the pull
    /// of units for a split sale's home bucket that holds fewer than
    /// asked for (`home.rs`), and the decision ([`Purchases::conclude`]).
    pub fn complete(&self, sale_id: u64, p: Prepared<'_>) -> Decision {
        let Prepared {
            user_id,
            home,
            k,
            units,
            place: _place,
        } = p;
        if let Some(units) = units {
            let asked = home::UnitsAsked {
                quantity: units.quantity,
                rid: units.rid.as_deref(),
            };
            let outcome = self
                .reserver
                .reserve_units(home, &user_id, asked.rid, asked.quantity);
            // A sale of one unit per buyer: one unit is the one-unit
            // script's (the key is not needed), more are above its limit.
            let one_unit = matches!(&outcome, Ok(r) if r.outcome == ReserveOutcome::OnePerBuyer);
            if !(one_unit && units.quantity == 1) {
                let outcome = home::reach_units(self, home, k, &user_id, asked, outcome);
                let outcome = home::ended_elsewhere(&self.links, home, k, outcome);
                return self.conclude(sale_id, k, &user_id, units.quantity, outcome);
            }
        }
        let outcome = self.reserver.reserve(home, &user_id);
        let outcome = home::reach_stock(self, home, k, &user_id, outcome);
        let outcome = home::ended_elsewhere(&self.links, home, k, outcome);
        self.conclude(sale_id, k, &user_id, 1, outcome)
    }

    /// The first half of a purchase, before Redis. Public facts first,
    /// for anyone, without a signature check and without using the
    /// claimed identity to decide: a body that cannot be read, a Redis
    /// unfit for purchases, what the sold-out memory knows (ended, not
    /// found, sold out; its recheck read with no buyer, `recheck.rs`), a
    /// pause of every bucket (`paused.rs`) and a window known not to open
    /// within [`CLOCK_MARGIN_MS`]. For a
    /// sold-out sale the buyer the request claims to be
    /// (`Identity::claimed_buyer`, unverified) only chooses which buyer is
    /// looked up: one who holds no reservation is told `sold_out` at once;
    /// a winner's retry is `AlreadyPurchased` with its reservation id only
    /// once the token is verified (a forged token naming a winner is
    /// refused). Otherwise the buyer is verified (the token's `sub`, or
    /// the body's `user_id` with `SECKILL_AUTH=none`) and then charged its
    /// share before Redis is asked.
    ///
    /// Returns the verified buyer and the units the body asks for.
    ///
    /// Errors: the final decision when no reservation script is needed.
    pub fn admit(
        &self,
        admission: &Admission,
        sale_id: u64,
        body: &[u8],
        creds: &Credentials,
    ) -> Result<(String, u32), Decision> {
        let body::Body {
            user_id: body_user,
            quantity,
        } = body::parse_body(body, admission.identity.body_names_buyer()).map_err(|detail| {
            self.metrics.outcome(Outcome::Invalid);
            Decision::Invalid(detail)
        })?;
        if self.fitness.unfit() {
            return Err(self.unavailable());
        }
        match self.soldout.get(sale_id, Instant::now()) {
            Known::Ask => {
                if self.paused_publicly(sale_id)? {
                    self.metrics.outcome(Outcome::Paused);
                    return Err(Decision::Paused);
                }
                if self.not_started(sale_id)? {
                    self.metrics.outcome(Outcome::NotStarted);
                    return Err(Decision::NotStarted);
                }
                if self.recheck_sold_out(sale_id)? == Still::SoldOut {
                    let user_id = self.sold_out(admission, sale_id, None, creds, body_user)?;
                    return Ok((user_id, quantity));
                }
                let user_id = self.verified(admission, creds, body_user)?;
                charge_buyer(admission, sale_id, &user_id)?;
                Ok((user_id, quantity))
            }
            Known::Closed(Closed::SoldOut, set) => {
                let user_id = self.sold_out(admission, sale_id, set, creds, body_user)?;
                Ok((user_id, quantity))
            }
            Known::Closed(closed, _) => {
                self.metrics.outcome(match closed {
                    Closed::Ended => Outcome::EndedFromMemory,
                    _ => Outcome::UnknownSaleFromMemory,
                });
                Err(Decision::Closed(closed))
            }
        }
    }

    /// Whether `sale_id`'s window opens more than [`CLOCK_MARGIN_MS`]
    /// from now by this host's clock, as its meta was last read with its
    /// bucket count (`home.rs`, read again each second): a public fact,
    /// said with no buyer. Nearer the opening the script decides, by
    /// Redis's clock.
    ///
    /// Errors: `Unavailable` when the meta cannot be read in time.
    /// A sale whose meta no purchase has read yet is not known to be
    /// upcoming (the purchase goes the whole way, and its `prepare` reads
    /// the meta).
    fn not_started(&self, sale_id: u64) -> Result<bool, Decision> {
        if self.buckets.starts_at(sale_id).is_none() {
            return Ok(false);
        }
        self.buckets
            .of(&self.links, sale_id)
            .map_err(|Unavailable| self.unavailable())?;
        Ok(self.buckets.starts_at(sale_id).is_some_and(|starts| {
            seckill_common::now_ms().saturating_add(CLOCK_MARGIN_MS) < starts
        }))
    }

    /// Whether `sale_id` is paused in every bucket, a public fact said
    /// with no buyer: from the pause memory (`paused.rs`, half a second),
    /// or read again (`recheck::paused_everywhere`) when that memory is due
    /// or the window memory's pause mark (`home.rs`) says to. A sale with
    /// neither is not read (the script decides, after the signature).
    ///
    /// Errors: `Unavailable` when Redis cannot be read in time.
    fn paused_publicly(&self, sale_id: u64) -> Result<bool, Decision> {
        match self.paused.get(sale_id, Instant::now()) {
            Seen::Paused => return Ok(true),
            Seen::Due => {}
            Seen::NotKnown if self.buckets.paused(sale_id) => {}
            Seen::NotKnown => return Ok(false),
        }
        let read_at = Instant::now();
        let k = self
            .buckets
            .of(&self.links, sale_id)
            .map_err(|Unavailable| self.unavailable())?;
        let paused = recheck::paused_everywhere(&self.links, sale_id, k)
            .map_err(|Unavailable| self.unavailable())?;
        self.buckets.set_paused(sale_id, paused);
        if paused {
            self.paused.paused(sale_id, read_at);
        } else {
            self.paused.resumed(sale_id);
        }
        Ok(paused)
    }

    /// The recheck of a sale remembered sold out, made by the caller
    /// [`SoldOutCache::get`] chose, without a buyer (`recheck.rs`; a split
    /// sale's every bucket): still sold out is remembered again (a
    /// one-bucket sale's buyers loaded if they are not), a change forgets
    /// the memory; a sale not remembered sold out is `Changed` at once
    /// (the purchase goes to Redis).
    ///
    /// Errors: `Unavailable` when Redis cannot be read in time.
    fn recheck_sold_out(&self, sale_id: u64) -> Result<Still, Decision> {
        let Some(seq) = self.soldout.sold_out_at(sale_id, seckill_common::now_ms) else {
            return Ok(Still::Changed);
        };
        let k = self
            .buckets
            .of(&self.links, sale_id)
            .map_err(|Unavailable| self.unavailable())?;
        let still = match k {
            1 => recheck::sold_out_still(&self.links, sale_id, seq),
            _ => recheck::split_sold_out_still(&self.links, sale_id, k, seq),
        }
        .map_err(|Unavailable| self.unavailable())?;
        match still {
            Still::SoldOut => {
                if self
                    .soldout
                    .confirmed_sold_out(sale_id, seq, Instant::now())
                    && k == 1
                {
                    self.buyers.request(&self.soldout, sale_id, seq);
                }
            }
            Still::Changed => self.soldout.stock_back(sale_id),
        }
        Ok(still)
    }

    /// The buyer a request proves to be.
    ///
    /// Errors: `Denied` (counted).
    fn verified(
        &self,
        admission: &Admission,
        creds: &Credentials,
        body_user: Option<String>,
    ) -> Result<String, Decision> {
        admission
            .identity
            .buyer(creds, body_user, &self.metrics)
            .map_err(|d| {
                self.metrics.outcome(match d {
                    Denied::Token(_) => Outcome::InvalidToken,
                    _ => Outcome::UserMismatch,
                });
                Decision::Denied(d)
            })
    }

    /// A purchase of a sale remembered sold out: `sold_out` unless the
    /// buyer it claims to be holds a reservation (in `set`, the buyers in
    /// memory, or else by one `HGET` of that buyer, `buyers.rs`); then the
    /// claim is verified, and only a verified winner hears its id. A
    /// buyer of a sale of several units per buyer (their entry is a list
    /// of reservations, `allowance.rs`; such a sale's buyers are never
    /// loaded into memory) goes on to Redis once verified and charged:
    /// only the script knows whether the purchase repeats one of theirs.
    ///
    /// Returns the verified buyer to send to Redis.
    ///
    /// Errors: the decision.
    fn sold_out(
        &self,
        admission: &Admission,
        sale_id: u64,
        set: Option<Arc<buyer_set::BuyerSet>>,
        creds: &Credentials,
        body_user: Option<String>,
    ) -> Result<String, Decision> {
        let claimed = admission
            .identity
            .claimed_buyer(creds, body_user.as_deref());
        let from_memory = set.is_some();
        let holds = match (claimed.as_deref(), set) {
            (None, _) => None,
            (Some(user), Some(set)) => set.lookup(user),
            (Some(user), None) => {
                match buyers::lookup_one(&self.links, &self.buckets, sale_id, user) {
                    Ok(r) => r,
                    Err(Unavailable) => return Err(self.unavailable()),
                }
            }
        };
        let Some(rid) = holds else {
            self.metrics.outcome(match from_memory {
                true => Outcome::SoldOutFromMemory,
                false => Outcome::SoldOutAfterBuyerRead,
            });
            return Err(Decision::Closed(Closed::SoldOut));
        };
        match self.verified(admission, creds, body_user) {
            Ok(user) if Some(&user) == claimed.as_ref() => {
                if !from_memory && !admission.charge_buyer(sale_id, &user) {
                    return Err(Decision::TooManyRequests);
                }
                if rid.contains(':') {
                    return Ok(user);
                }
                self.metrics.outcome(match from_memory {
                    true => Outcome::AlreadyPurchasedFromMemory,
                    false => Outcome::AlreadyPurchasedAfterBuyerRead,
                });
                Err(Decision::AlreadyPurchased(rid))
            }
            // Verified as another buyer than the one looked up (a body
            // naming someone else: refused by `verified` already).
            Ok(_) => {
                self.metrics.outcome(Outcome::UserMismatch);
                Err(Decision::Denied(Denied::UserMismatch))
            }
            Err(d) => Err(d),
        }
    }

    /// The second half: the decision on what Redis said (or could not
    /// say), with the sold-out memory and the outcome counter updated (a
    /// reservation also counts its `quantity` units).
    /// The memory is ordered by the reply's `seq`, never by the order in
    /// which threads get here (`soldout.rs`). For a sale of `buckets` > 1
    /// a reply's `seq` is its bucket's while a sell-out's is the whole
    /// sale's (`home.rs`), so the two cannot be ordered: a reservation, or
    /// a winner's retry that finds stock in its bucket, forgets a sold-out
    /// memory at once (a stale one costs the next purchases a trip to
    /// Redis, which answers; waiting for the recheck would sell one
    /// returned unit per recheck and tell the others `sold_out`), and its
    /// buyers are read one at a time from their home buckets, never loaded.
    pub fn conclude(
        &self,
        sale_id: u64,
        buckets: u32,
        user_id: &str,
        quantity: u32,
        outcome: Result<Replied, Unavailable>,
    ) -> Decision {
        let Replied {
            outcome,
            seq,
            stock,
        } = match outcome {
            Ok(r) => r,
            Err(Unavailable) => return self.unavailable(),
        };
        match outcome {
            ReserveOutcome::Reserved(rid) => {
                self.metrics.outcome(Outcome::Reserved);
                self.metrics.units_reserved(quantity);
                if buckets == 1 {
                    self.soldout.reserved(sale_id, seq);
                } else {
                    self.soldout.stock_back(sale_id);
                }
                Decision::Reserved(rid)
            }
            ReserveOutcome::AlreadyPurchased(rid) => {
                self.metrics.outcome(Outcome::AlreadyPurchased);
                self.winner_retried(sale_id, buckets, seq, stock);
                Decision::AlreadyPurchased(rid)
            }
            // A retry (same reservation id) of a call whose reply was
            // lost, released since: what this request bought, now
            // expired, cancelled or rolled back (the release removed the
            // buyer's mark and kept the id in `buyers:released`, where the
            // status route reads it).
            ReserveOutcome::Released(rid) => {
                self.metrics.outcome(Outcome::AlreadyPurchased);
                self.soldout.inconclusive(sale_id, Instant::now());
                Decision::AlreadyPurchased(rid)
            }
            ReserveOutcome::NotStarted => {
                self.metrics.outcome(Outcome::NotStarted);
                self.soldout.inconclusive(sale_id, Instant::now());
                Decision::NotStarted
            }
            ReserveOutcome::Paused(reason) => {
                self.metrics.outcome(Outcome::Paused);
                self.soldout.inconclusive(sale_id, Instant::now());
                if buckets == 1 {
                    // The next purchase reads the pause with no buyer.
                    self.buckets.set_paused(sale_id, true);
                }
                log::debug!("sale {sale_id} is paused ({reason}); purchase of {user_id} refused");
                Decision::Paused
            }
            ReserveOutcome::SoldOut => self.closed(sale_id, buckets, Closed::SoldOut, seq),
            ReserveOutcome::Ended => self.closed(sale_id, buckets, Closed::Ended, seq),
            // One bucket of a split sale unknown to Redis (its keys lost)
            // says nothing of the sale: not remembered, and `Unavailable`
            // for this buyer, unless the sale's window has closed
            // (`home::ended_elsewhere` made that `Ended`: an archived
            // sale's removed bucket).
            ReserveOutcome::UnknownSale if buckets > 1 => self.unavailable(),
            ReserveOutcome::UnknownSale => self.closed(sale_id, buckets, Closed::Unknown, seq),
            other => self.units_outcome(other),
        }
    }

    /// The answers of the units script (`reserve_units.rs`), and the
    /// one-unit script's `key_required`. None of them touches the
    /// sold-out memory but a reservation: fewer units left than asked for
    /// is not sold out (a smaller purchase may fit).
    fn units_outcome(&self, o: ReserveOutcome) -> Decision {
        let (counted, d) = match o {
            ReserveOutcome::Replayed(rid) => (Outcome::Repeated, Decision::Reserved(rid)),
            ReserveOutcome::NotEnoughStock(left) => {
                (Outcome::SoldOut, Decision::NotEnoughStock(left))
            }
            ReserveOutcome::LimitReached(held) => {
                (Outcome::AlreadyPurchased, Decision::LimitReached(held))
            }
            ReserveOutcome::AboveMax(q) => (Outcome::Invalid, Decision::AboveMax(q)),
            ReserveOutcome::OnePerBuyer => (Outcome::Invalid, Decision::AboveMax(1)),
            ReserveOutcome::KeyReused(rid) => (Outcome::Invalid, Decision::KeyReused(rid)),
            ReserveOutcome::KeyRequired => (Outcome::Invalid, Decision::KeyRequired),
            // Never: `conclude` takes the others.
            _ => (Outcome::Unavailable, Decision::Unavailable),
        };
        self.metrics.outcome(counted);
        d
    }

    /// A winner's retry carries the stock: stock back is a sale to reopen
    /// at once, none a sold out confirmed (in a split sale the stock is
    /// one bucket's: none there says nothing).
    fn winner_retried(&self, sale_id: u64, buckets: u32, seq: u64, stock: Option<u64>) {
        match stock {
            Some(0) if buckets == 1 => {
                if self
                    .soldout
                    .confirmed_sold_out(sale_id, seq, Instant::now())
                {
                    self.buyers.request(&self.soldout, sale_id, seq);
                }
            }
            Some(0) | None => self.soldout.inconclusive(sale_id, Instant::now()),
            Some(_) => self.soldout.stock_back(sale_id),
        }
    }

    /// Redis said `c` at `seq`: remembered (the buyers loaded for a
    /// one-bucket sale's sell-out) and counted.
    fn closed(&self, sale_id: u64, buckets: u32, c: Closed, seq: u64) -> Decision {
        let ends = self.buckets.ends_at(sale_id);
        if self
            .soldout
            .closed_ending(sale_id, c, seq, Instant::now(), ends)
            && buckets == 1
        {
            self.buyers.request(&self.soldout, sale_id, seq);
        }
        self.metrics.outcome(match c {
            Closed::SoldOut => Outcome::SoldOut,
            Closed::Ended => Outcome::Ended,
            Closed::Unknown => Outcome::UnknownSale,
        });
        Decision::Closed(c)
    }

    fn unavailable(&self) -> Decision {
        self.metrics.outcome(Outcome::Unavailable);
        Decision::Unavailable
    }
}

/// The per-buyer share (`admission/limits.rs`), charged once the buyer is
/// verified, by every attempt that calls Redis for that buyer (the
/// reservation script, or a winner's retry read by one `HGET`): a forger
/// never spends a real buyer's share. An attempt decided from memory, or
/// told `sold_out` after an unverified claim's `HGET`, costs no buyer's
/// share (the client address's share, charged first by `http/`, bounds
/// those), so a buyer who keeps clicking after the sell-out still hears
/// `sold_out`.
///
/// Errors: `TooManyRequests` beyond the share.
fn charge_buyer(admission: &Admission, sale_id: u64, user_id: &str) -> Result<(), Decision> {
    if admission.charge_buyer(sale_id, user_id) {
        Ok(())
    } else {
        Err(Decision::TooManyRequests)
    }
}

#[cfg(test)]
mod tests;
