//! Owns what `sale repair` writes into each bucket of a sale (`cmd/repair/`
//! runs the command, its checks and its audit): the Redis state rebuilt
//! from MySQL's orders, and each bucket's books rebuilt from the transfer
//! records of both sides.
//!
//! Per bucket (a sale of one bucket is bucket 0 alone), for the orders
//! whose buyer's home bucket it is (`buckets::home_bucket`):
//! - an order holding a unit (`confirmed`, `pending_payment` with its
//!   `pay_by`, `paid`): its flow record, its buyer's mark and that status;
//! - an order whose unit was released (`expired`, `cancelled`): its flow
//!   record moved to `released` (what the release's Redis step leaves, so
//!   that step finds it done and does not count the unit twice), that
//!   status, and the buyer's mark only when the sale does not let a
//!   released buyer buy again; the unit counts back in stock;
//! - a flow record without an order: kept (in flight) unless its user holds
//!   an order of another reservation, or had one released in a sale that
//!   does not let them buy again (a duplicate: released).
//!
//! A sale of several units per buyer is restored by [`restore_multi`]
//! (each bucket of a split one with the orders homed there): each buyer's
//! mark is rebuilt as their list of held reservations (`allowance::Held`)
//! from MySQL's orders, every count in units, so a bucket's books and
//! stock are in units too.
//!
//! Books: a transfer recorded on one side only (the other side's master
//! lost it, or it was left open) is written on the other side, so each
//! bucket's `total_stock` is its share + units in − units out over the
//! same records as its peers'. Stock = `total_stock` − units of the orders
//! holding units − units of the reservations in flight.

use crate::error::RunError;
use redis::Commands;
use seckill_common::allowance::{Entry, Held};
use seckill_common::keys::{PurchaseStatus, SaleKeys};
use seckill_common::message::{OrderMessage, MESSAGE_VERSION};
use seckill_common::order::OrderStatus;
use seckill_common::redis_target::Con;
use seckill_common::transfer::{Direction, Record};
use std::collections::{HashMap, HashSet};

/// One order of MySQL, as the repair needs it.
#[derive(Debug, Clone)]
pub struct OrderRow {
    /// `orders.reservation_id`.
    pub rid: String,
    /// `orders.user_id`.
    pub user: String,
    /// `orders.reserved_at`, Unix ms (0 when NULL).
    pub reserved_at_ms: u64,
    /// `orders.status` (an older row's `created` reads as `confirmed`).
    pub status: OrderStatus,
    /// `orders.pay_by`, Unix ms (for `pending_payment`).
    pub pay_by_ms: Option<u64>,
    /// `orders.quantity`: its units.
    pub quantity: u32,
}

/// What the repair did to one bucket.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BucketRepair {
    /// Orders holding a unit whose mark, flow record and status were written.
    pub orders: usize,
    /// Orders whose unit was released, written as released.
    pub released_orders: usize,
    /// Duplicate reservations released (their ids).
    pub duplicates: Vec<String>,
    /// Reservations without an order kept (still on their way).
    pub in_flight: usize,
    /// Units of the orders holding units and of the reservations kept.
    pub held_units: u64,
    /// Units of the released orders and of the duplicates released.
    pub gone_units: u64,
    /// The bucket's `total_stock` after the repair (share + in − out).
    pub total: i64,
    /// Units on sale after the repair.
    pub stock: i64,
    /// The bucket's reservation sequence after the repair.
    pub seq: u64,
    /// The bucket's checkpoint after the repair.
    pub checkpoint: u64,
}

/// A bucket's transfer records: transfer id -> record.
#[derive(Debug, Default, Clone)]
pub struct Books {
    /// `transfers:out` and `transfers:open` (the peer is the destination).
    pub out: HashMap<String, Record>,
    /// `transfers:open` alone.
    pub open: HashSet<String>,
    /// `transfers:in` (the peer is the source).
    pub inn: HashMap<String, Record>,
}

/// Reads the transfer records of each of `buckets` (a malformed record is
/// skipped: it is the reconciler's `transfer_unmatched` to report).
///
/// Errors: Redis failures.
pub fn read_books(con: &mut Con, buckets: &[SaleKeys]) -> Result<Vec<Books>, RunError> {
    let mut all = Vec::with_capacity(buckets.len());
    for k in buckets {
        let mut b = Books::default();
        for key in [k.transfers_out(), k.transfers_open()] {
            let recs: HashMap<String, String> = con.hgetall(&key)?;
            for (tid, raw) in recs {
                if key == k.transfers_open() {
                    b.open.insert(tid.clone());
                }
                if let Some(r) = Record::parse(&raw, Direction::Out) {
                    b.out.insert(tid, r);
                }
            }
        }
        let recs: HashMap<String, String> = con.hgetall(k.transfers_in())?;
        for (tid, raw) in recs {
            if let Some(r) = Record::parse(&raw, Direction::In) {
                b.inn.insert(tid, r);
            }
        }
        all.push(b);
    }
    Ok(all)
}

/// Completes every side missing from `books` (in place) and adds to
/// `pipes[b]` the writes of bucket b's missing records and the removal of
/// its open records (the destination's record is written by the same
/// repair). Each transfer then counts once on each side.
pub fn match_books(books: &mut [Books], pipes: &mut [redis::Pipeline], keys: &[SaleKeys]) {
    let n = books.len();
    let mut add_in: Vec<(usize, String, Record)> = Vec::new();
    let mut add_out: Vec<(usize, String, Record)> = Vec::new();
    for (s, b) in books.iter().enumerate() {
        for (tid, r) in &b.out {
            let d = r.peer as usize;
            if d < n && !books[d].inn.contains_key(tid) {
                add_in.push((
                    d,
                    tid.clone(),
                    Record {
                        peer: s as u32,
                        ..*r
                    },
                ));
            }
        }
        for (tid, r) in &b.inn {
            let src = r.peer as usize;
            if src < n && !books[src].out.contains_key(tid) {
                add_out.push((
                    src,
                    tid.clone(),
                    Record {
                        peer: s as u32,
                        ..*r
                    },
                ));
            }
        }
    }
    for (d, tid, r) in add_in {
        let json = r.to_json(Direction::In);
        pipes[d].hset(keys[d].transfers_in(), &tid, json).ignore();
        books[d].inn.insert(tid, r);
    }
    for (s, tid, r) in add_out {
        let json = r.to_json(Direction::Out);
        pipes[s].hset(keys[s].transfers_out(), &tid, json).ignore();
        books[s].out.insert(tid, r);
    }
    for (s, b) in books.iter_mut().enumerate() {
        for tid in b.open.drain() {
            pipes[s].hdel(keys[s].transfers_open(), &tid).ignore();
        }
    }
}

/// Moves units, on paper, to every bucket whose books (`share` + in − out,
/// after [`match_books`]) give it fewer units than its orders and
/// reservations in flight hold, from the buckets with units to spare,
/// lowest bucket first: one transfer record on each side per move (id
/// `repair-MARK-SRC-DST`, so a repeat of the same repair writes the same
/// records), added to `books` and to `pipes`. The sale's units are
/// conserved; a deficit the others cannot cover is left (the caller
/// refuses).
///
/// Why: a bucket whose master failed over behind its writes kept giving
/// units away (transfers to drained peers) that its lost reservations had
/// taken, until the pause; MySQL's orders, not those records, say what
/// each bucket holds.
pub fn cover_deficits(
    books: &mut [Books],
    pipes: &mut [redis::Pipeline],
    keys: &[SaleKeys],
    shares: &[u64],
    done: &[BucketRepair],
    mark: &str,
) {
    let n = books.len();
    let spare: Vec<i64> = (0..n)
        .map(|b| {
            let moved_in: u64 = books[b].inn.values().map(|r| r.units).sum();
            let moved_out: u64 = books[b].out.values().map(|r| r.units).sum();
            shares[b] as i64 + moved_in as i64 - moved_out as i64 - done[b].held_units as i64
        })
        .collect();
    let mut spare = spare;
    let at_ms = seckill_common::now_ms();
    for d in 0..n {
        let mut need = -spare[d];
        for src in 0..n {
            if need <= 0 {
                break;
            }
            if src == d || spare[src] <= 0 {
                continue;
            }
            let units = spare[src].min(need);
            let tid = format!("repair-{mark}-{src}-{d}");
            let rec = |peer: usize| Record {
                peer: peer as u32,
                units: units as u64,
                at_ms,
            };
            pipes[src]
                .hset(
                    keys[src].transfers_out(),
                    &tid,
                    rec(d).to_json(Direction::Out),
                )
                .ignore();
            pipes[d]
                .hset(
                    keys[d].transfers_in(),
                    &tid,
                    rec(src).to_json(Direction::In),
                )
                .ignore();
            books[src].out.insert(tid.clone(), rec(d));
            books[d].inn.insert(tid, rec(src));
            spare[src] -= units;
            spare[d] += units;
            need -= units;
        }
    }
}

/// What Redis holds of one bucket before the repair.
#[derive(Debug, Default)]
pub struct BucketNow {
    /// `flow`: reservation id -> order message.
    pub flows: HashMap<String, String>,
    /// `released`: reservation id -> order message.
    pub released: HashMap<String, String>,
    /// `buyers`: user -> reservation id (or, in a sale of several units per
    /// buyer, their list of reservations).
    pub buyers: HashMap<String, String>,
    /// `queue`.
    pub queue: Vec<String>,
}

/// Reads [`BucketNow`] of bucket `k`.
///
/// Errors: Redis failures.
pub fn read_now(con: &mut Con, k: &SaleKeys) -> Result<BucketNow, RunError> {
    // In pages (`HSCAN`, `LRANGE`), never a whole key in one call: the sale
    // is paused, so nothing moves under the reads.
    let mut queue = Vec::new();
    crate::redis_read::for_each_in_list(con, &k.queue(), |raw| {
        queue.push(String::from_utf8_lossy(raw).into_owned())
    })?;
    Ok(BucketNow {
        flows: crate::redis_read::hash_entries(con, &k.flow())?,
        released: crate::redis_read::hash_entries(con, &k.released())?,
        buyers: crate::redis_read::hash_entries(con, &k.buyers())?,
        queue,
    })
}

/// Adds to `pipe` the writes that restore bucket `k`'s reservations from
/// `orders` (those homed in this bucket) over what Redis holds (`now`),
/// per the module doc; `rebuy`: the sale lets a released buyer buy again.
/// Returns the counts (books, stock, sequence not yet set).
pub fn restore(
    pipe: &mut redis::Pipeline,
    k: &SaleKeys,
    orders: &[&OrderRow],
    now: &BucketNow,
    rebuy: bool,
) -> BucketRepair {
    let ordered: HashSet<&str> = orders.iter().map(|o| o.rid.as_str()).collect();
    let live: HashSet<&str> = orders
        .iter()
        .filter(|o| !o.status.is_released())
        .map(|o| o.user.as_str())
        .collect();
    // Who may not reserve again: a buyer holding a unit, and a released
    // buyer when the sale does not let them buy again.
    let barred: HashSet<&str> = orders
        .iter()
        .filter(|o| !rebuy || !o.status.is_released())
        .map(|o| o.user.as_str())
        .collect();
    let mut out = BucketRepair::default();
    let message = |o: &OrderRow| message_of(k, o, now);
    // Released first, so that a live order of the same buyer (a rebuy)
    // writes the buyer's mark last.
    for o in orders.iter().filter(|o| o.status.is_released()) {
        let msg = message(o);
        pipe.hset(k.released(), &o.rid, &msg).ignore();
        pipe.hdel(k.flow(), &o.rid).ignore();
        if now.queue.contains(&msg) {
            pipe.lrem(k.queue(), 0, &msg).ignore();
        }
        let word = match o.status {
            OrderStatus::Cancelled => PurchaseStatus::Cancelled,
            _ => PurchaseStatus::Expired,
        };
        pipe.hset(k.status(), &o.rid, word.as_str()).ignore();
        if !live.contains(o.user.as_str()) {
            if !rebuy {
                pipe.hset(k.buyers(), &o.user, &o.rid).ignore();
            } else if now.buyers.get(&o.user) == Some(&o.rid) {
                pipe.hdel(k.buyers(), &o.user).ignore();
            }
        }
        out.released_orders += 1;
        out.gone_units += 1;
    }
    for o in orders.iter().filter(|o| !o.status.is_released()) {
        if !now.flows.contains_key(&o.rid) {
            pipe.hset(k.flow(), &o.rid, message(o)).ignore();
        }
        pipe.hdel(k.released(), &o.rid).ignore();
        pipe.hset(k.buyers(), &o.user, &o.rid).ignore();
        let word = match o.status {
            OrderStatus::PendingPayment => PurchaseStatus::PendingPayment,
            OrderStatus::Paid => PurchaseStatus::Paid,
            _ => PurchaseStatus::Confirmed,
        };
        pipe.hset(k.status(), &o.rid, word.as_str()).ignore();
        if let (OrderStatus::PendingPayment, Some(at)) = (o.status, o.pay_by_ms) {
            pipe.hset(k.pay_by(), &o.rid, at).ignore();
        }
        out.orders += 1;
        out.held_units += 1;
    }
    for (rid, raw) in &now.flows {
        if ordered.contains(rid.as_str()) {
            continue;
        }
        let user = OrderMessage::parse(raw.as_bytes())
            .map(|m| m.user_id)
            .unwrap_or_default();
        if barred.contains(user.as_str()) {
            // A duplicate: its user holds an order of another reservation
            // (or had one released in a sale without buying again).
            pipe.hdel(k.flow(), rid).ignore();
            pipe.hset(k.status(), rid, PurchaseStatus::Failed.as_str())
                .ignore();
            if now.queue.contains(raw) {
                pipe.lrem(k.queue(), 0, raw).ignore();
            }
            out.duplicates.push(rid.clone());
            out.gone_units += 1;
        } else {
            out.in_flight += 1;
            out.held_units += 1;
        }
    }
    out
}

/// The flow record of order `o` of bucket `k`: what Redis holds of it
/// (live or released), else the order message rebuilt from MySQL.
fn message_of(k: &SaleKeys, o: &OrderRow, now: &BucketNow) -> String {
    now.flows
        .get(&o.rid)
        .or_else(|| now.released.get(&o.rid))
        .cloned()
        .unwrap_or_else(|| {
            OrderMessage {
                v: MESSAGE_VERSION,
                reservation_id: o.rid.clone(),
                sale_id: k.sale_id,
                user_id: o.user.clone(),
                reserved_at_ms: o.reserved_at_ms,
                quantity: o.quantity,
            }
            .to_json()
        })
}

/// [`restore`] for a sale of several units per buyer (`per_buyer` = `L`
/// above 1; one bucket's orders and flow records): the same flow records, `released` entries and
/// statuses, but each buyer's mark is the list of their reservations that
/// count against their allowance (`allowance::Held`, oldest first): their
/// live orders, their released ones unless the sale lets released units be
/// bought again (`rebuy`), then the reservations in flight. A reservation in
/// flight that would take its buyer over `L` is a duplicate: released.
/// Every count is in units too (`held_units`, `gone_units`).
pub fn restore_multi(
    pipe: &mut redis::Pipeline,
    k: &SaleKeys,
    orders: &[&OrderRow],
    now: &BucketNow,
    (rebuy, per_buyer): (bool, u32),
) -> BucketRepair {
    let mut out = BucketRepair::default();
    let mut held: std::collections::BTreeMap<String, Held> = Default::default();
    for o in orders {
        let msg = message_of(k, o, now);
        if o.status.is_released() {
            pipe.hset(k.released(), &o.rid, &msg).ignore();
            pipe.hdel(k.flow(), &o.rid).ignore();
            if now.queue.contains(&msg) {
                pipe.lrem(k.queue(), 0, &msg).ignore();
            }
            let word = match o.status {
                OrderStatus::Cancelled => PurchaseStatus::Cancelled,
                _ => PurchaseStatus::Expired,
            };
            pipe.hset(k.status(), &o.rid, word.as_str()).ignore();
            out.released_orders += 1;
            out.gone_units += u64::from(o.quantity);
            if rebuy {
                continue;
            }
        } else {
            if !now.flows.contains_key(&o.rid) {
                pipe.hset(k.flow(), &o.rid, &msg).ignore();
            }
            pipe.hdel(k.released(), &o.rid).ignore();
            pipe.hset(k.status(), &o.rid, live_word(o.status).as_str())
                .ignore();
            if let (OrderStatus::PendingPayment, Some(at)) = (o.status, o.pay_by_ms) {
                pipe.hset(k.pay_by(), &o.rid, at).ignore();
            }
            out.orders += 1;
            out.held_units += u64::from(o.quantity);
        }
        held.entry(o.user.clone()).or_default().0.push(Entry {
            reservation_id: o.rid.clone(),
            quantity: o.quantity,
        });
    }
    waiting_multi(pipe, k, orders, now, per_buyer, (&mut held, &mut out));
    for user in now.buyers.keys().filter(|u| !held.contains_key(*u)) {
        pipe.hdel(k.buyers(), user).ignore();
    }
    for (user, list) in held.iter().filter(|(_, l)| !l.0.is_empty()) {
        pipe.hset(k.buyers(), user, list.to_string()).ignore();
    }
    out
}

/// The reservations in flight (flow records without an order) of a sale
/// of several units per buyer, oldest first: each kept and added to its
/// buyer's list in `held`, or released as a duplicate when it would take
/// its buyer over `per_buyer` units ([`restore_multi`]).
fn waiting_multi(
    pipe: &mut redis::Pipeline,
    k: &SaleKeys,
    orders: &[&OrderRow],
    now: &BucketNow,
    per_buyer: u32,
    (held, out): (
        &mut std::collections::BTreeMap<String, Held>,
        &mut BucketRepair,
    ),
) {
    let ordered: HashSet<&str> = orders.iter().map(|o| o.rid.as_str()).collect();
    let mut waiting: Vec<(u64, &String, &String, Option<OrderMessage>)> = now
        .flows
        .iter()
        .filter(|(rid, _)| !ordered.contains(rid.as_str()))
        .map(|(rid, raw)| {
            let m = OrderMessage::parse(raw.as_bytes()).ok();
            (m.as_ref().map_or(0, |m| m.reserved_at_ms), rid, raw, m)
        })
        .collect();
    waiting.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    for (_, rid, raw, m) in waiting {
        let Some(m) = m else {
            // Not a message: nobody's allowance; left as it is.
            out.in_flight += 1;
            out.held_units += 1;
            continue;
        };
        let list = held.entry(m.user_id.clone()).or_default();
        if list.units() + u64::from(m.quantity) > u64::from(per_buyer) {
            pipe.hdel(k.flow(), rid).ignore();
            pipe.hset(k.status(), rid, PurchaseStatus::Failed.as_str())
                .ignore();
            if now.queue.contains(raw) {
                pipe.lrem(k.queue(), 0, raw).ignore();
            }
            out.duplicates.push(rid.clone());
            out.gone_units += u64::from(m.quantity);
        } else {
            list.0.push(Entry {
                reservation_id: rid.clone(),
                quantity: m.quantity,
            });
            out.in_flight += 1;
            out.held_units += u64::from(m.quantity);
        }
    }
}

/// The purchase status of an order holding units.
fn live_word(status: OrderStatus) -> PurchaseStatus {
    match status {
        OrderStatus::PendingPayment => PurchaseStatus::PendingPayment,
        OrderStatus::Paid => PurchaseStatus::Paid,
        _ => PurchaseStatus::Confirmed,
    }
}

/// The meta field that holds the mark of the repair that last rebuilt the
/// sale (how an interrupted repair is known to have happened).
pub const REPAIRED_BY: &str = "repaired_by";
