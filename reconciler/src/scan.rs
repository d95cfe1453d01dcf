//! Owns the scan of one sale: every read the record-by-record rules need,
//! made in an order chosen so that work in progress is never reported, and
//! gathered into one [`SaleScan`] value for the rules (`rules/`) to judge.
//!
//! Order of reads:
//! 1. Redis totals (one `MULTI`);
//! 2. MySQL in one snapshot (`mysql_read::snapshot`): the books, the
//!    orders' reservation ids streamed into a sorted `Vec<u128>` (16 bytes
//!    per order: the only memory that grows with the sale), the ledger's
//!    deductions streamed (16 bytes each); then
//! 3. the orders that have a deduction are marked, and the deductions that
//!    no order holds and no `release` row gave back are kept (one merge);
//! 4. the flow records by `HSCAN`, marking orders that have one; a flow record
//!    with no order and older than the grace period becomes a candidate;
//! 5. the dead-letter list;
//! 6. for candidates only (`unordered.rs`): the queue, then the processing
//!    lists, read in pages, then a MySQL re-check (an order committed after
//!    step 2 clears it) and a flow re-check (released meanwhile clears it),
//!    up to three times; then one atomic check of every list for the few
//!    left while the lists are short (`seckill_common::in_flight`), the
//!    re-checks again, and their status. No call holds Redis for more than
//!    a few milliseconds, whatever the backlog;
//! 7. the details (order id, user) of orders missing a flow record or a
//!    ledger row, and, for the deductions kept in step 3: a point look-up of their order
//!    (any state) and their ledger row, and their flow record and status
//!    in Redis (in whichever bucket holds them). Their flow record is not
//!    also a `flow_without_order` candidate;
//! 8. the orders MySQL released (expired, cancelled) whose flow record Redis
//!    still holds (their Redis step did not happen), and the payments that
//!    were not applied as `paid`.
//!
//! Only the orders that hold a unit (confirmed, pending, paid) are expected
//! to have a flow record (steps 2 and 4); a released one has its record in
//! the sale's `released` hash.
//!
//! A sale split over buckets (`seckill_common::buckets`) is read bucket by
//! bucket: the totals summed at one instant (`bucket_read::totals`), steps
//! 4-6 on each bucket's flow records, dead letters, queue and processing
//! lists (an order's flow record is in its buyer's home bucket; any bucket's
//! record counts). Step 8 reads each released order's flow record in the
//! bucket that holds it (`ReleasedOrder::keys`: its buyer's home bucket).

use crate::error::RunError;
use crate::mysql_read::{
    self, rid_to_u128, u128_to_rid, Books, Deduction, OddPayment, OrderDetail,
};
use crate::redis_read::{self, DeadLetters, RedisTotals};
use crate::unordered::{self, Candidates};
use seckill_common::keys::SaleKeys;
use seckill_common::lifecycle::{released_orders, ReleasedOrder};
use seckill_common::message::OrderMessage;
use seckill_common::redis_target::Con;
use std::collections::HashMap;
use std::time::Duration;

/// Everything one sale's reconciliation needs.
pub struct Ctx<'a> {
    /// Redis (reads and nothing else).
    pub redis: &'a mut Con,
    /// MySQL (reads, and compensation).
    pub mysql: &'a mut mysql::Conn,
    /// Reservations younger than this are skipped.
    pub grace: Duration,
    /// Called between chunks: keeps the run lock, stops on a signal.
    pub tick: &'a mut dyn FnMut() -> Result<(), RunError>,
}

/// A flow record older than the grace period with no order, not queued, not
/// in a processing list, and still in Redis after every re-check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unordered {
    /// Its reservation id.
    pub reservation_id: String,
    /// The flow record's text (the order message).
    pub flow_record: String,
    /// Its purchase status in Redis (`None` when absent).
    pub status: Option<String>,
}

/// A stock-ledger deduction that MySQL did not give back and no order
/// holds, with what Redis holds of its reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerOnly {
    /// The ledger row.
    pub deduction: Deduction,
    /// The reservation's flow record (the order message), in whichever
    /// bucket holds it; `None` when Redis holds none.
    pub flow_record: Option<String>,
    /// Its purchase status in Redis (`None` when absent).
    pub status: Option<String>,
}

/// What one sale's scan read, in the order of the module doc.
#[derive(Debug)]
pub struct SaleScan {
    /// The sale.
    pub sale_id: u64,
    /// Redis totals (step 1).
    pub totals: RedisTotals,
    /// MySQL books (step 1).
    pub books: Books,
    /// Orders read (step 2).
    pub orders: u64,
    /// Flow records read (step 4).
    pub flow_records: u64,
    /// Flow records skipped as younger than the grace period (step 4).
    pub young: u64,
    /// The dead-letter list (step 5).
    pub dead: DeadLetters,
    /// Flow records without order (step 6).
    pub unordered: Vec<Unordered>,
    /// Reservation ids of orders with no flow record (steps 2 and 4), orders
    /// whose reservation id is not one of ours first.
    pub no_flow: Vec<String>,
    /// Reservation ids of orders with no ledger deduction (steps 2 and 3).
    pub no_ledger: Vec<String>,
    /// The details of the orders in `no_flow` and `no_ledger` (step 7).
    pub details: HashMap<String, OrderDetail>,
    /// Stock-ledger deductions with no order (steps 3 and 7).
    pub ledger_only: Vec<LedgerOnly>,
    /// Orders released in MySQL whose flow record Redis still holds (step 8).
    pub released_held: Vec<ReleasedOrder>,
    /// The sale's payments not applied as `paid` (step 8).
    pub odd_payments: Vec<OddPayment>,
}

/// A bit per entry of a sorted list of ids (orders, candidates).
pub struct Bits(Vec<u64>);

impl Bits {
    /// `n` bits, all clear.
    pub fn new(n: usize) -> Bits {
        Bits(vec![0; n.div_ceil(64)])
    }
    /// Sets bit `i`.
    pub fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    /// Bit `i`.
    pub fn get(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
}

/// Scans sale `sale_id`, split over `buckets` buckets (1: not split);
/// `None` when MySQL has no such sale.
///
/// Errors: Redis or MySQL failures, or what `ctx.tick` returns.
pub fn scan(ctx: &mut Ctx<'_>, sale_id: u64, buckets: u32) -> Result<Option<SaleScan>, RunError> {
    let totals = match buckets {
        1 => redis_read::totals(ctx.redis, sale_id)?,
        k => match crate::bucket_read::totals(ctx.redis, sale_id, k)? {
            Some(t) => t,
            None => {
                log::warn!("sale {sale_id}: transfers kept moving units; totals judged next run");
                let mut t = redis_read::totals(ctx.redis, sale_id)?;
                t.unsettled = true;
                t
            }
        },
    };
    let Some((books, orders, odd_orders, deducted, given_back)) = read_mysql(ctx, sale_id)? else {
        return Ok(None);
    };
    let has_ledger = ledger_marks(&orders, &deducted);
    let no_order = deducted_without_order(&orders, &deducted, &given_back);
    drop(deducted);
    drop(given_back);
    let mut flows = FlowMarks {
        has_flow: Bits::new(orders.len()),
        candidates: Candidates::new(),
        read: 0,
        young: 0,
    };
    let mut dead = DeadLetters::default();
    let mut unordered_all = Vec::new();
    for k in seckill_common::buckets::all(sale_id, buckets) {
        let f = flow_marks(ctx, k, &orders, totals.now_ms)?;
        for (w, bits) in flows.has_flow.0.iter_mut().zip(&f.has_flow.0) {
            *w |= bits;
        }
        flows.read += f.read;
        flows.young += f.young;
        redis_read::dead_letters_into(ctx.redis, k, &mut dead)?;
        unordered_all.extend(unordered::unordered(
            ctx.redis,
            ctx.mysql,
            k,
            f.candidates,
            &mut *ctx.tick,
        )?);
    }
    let ledger_only = ledger_only(ctx, sale_id, no_order)?;
    // A flow record whose unit MySQL deducted is the `ledger_without_order`
    // finding's evidence, not a finding of its own.
    unordered_all.retain(|u| {
        !ledger_only
            .iter()
            .any(|l| l.deduction.reservation_id == u.reservation_id)
    });
    let unordered = unordered_all;

    let mut no_flow = odd_orders;
    let mut no_ledger = Vec::new();
    for (i, v) in orders.iter().enumerate() {
        if !flows.has_flow.get(i) {
            no_flow.push(u128_to_rid(*v));
        }
        if !has_ledger.get(i) {
            no_ledger.push(u128_to_rid(*v));
        }
    }
    let mut details = HashMap::new();
    if !no_flow.is_empty() || !no_ledger.is_empty() {
        let all: Vec<String> = no_flow.iter().chain(no_ledger.iter()).cloned().collect();
        for d in mysql_read::order_details(ctx.mysql, &all)? {
            details.insert(d.reservation_id.clone(), d);
        }
    }
    let released_held = released_held(ctx, sale_id)?;
    let odd_payments = mysql_read::odd_payments(ctx.mysql, Some(sale_id))?;
    Ok(Some(SaleScan {
        released_held,
        odd_payments,
        sale_id,
        totals,
        books,
        orders: orders.len() as u64,
        flow_records: flows.read,
        young: flows.young,
        dead,
        unordered,
        no_flow,
        no_ledger,
        details,
        ledger_only,
    }))
}

/// Step 3: the reservations `deducted` (sorted) that no order of `orders`
/// holds and no ledger release in `given_back` (sorted) gave back.
fn deducted_without_order(orders: &[u128], deducted: &[u128], given_back: &[u128]) -> Vec<u128> {
    let mut out: Vec<u128> = deducted
        .iter()
        .filter(|v| orders.binary_search(v).is_err() && given_back.binary_search(v).is_err())
        .copied()
        .collect();
    out.dedup();
    out
}

/// Step 7: the deductions of `no_order` whose reservation has no order in
/// MySQL (in any state: a released order is another story), with their
/// ledger row and what Redis holds of them, in reservation id order.
fn ledger_only(
    ctx: &mut Ctx<'_>,
    sale_id: u64,
    no_order: Vec<u128>,
) -> Result<Vec<LedgerOnly>, RunError> {
    if no_order.is_empty() {
        return Ok(Vec::new());
    }
    let mut rids: Vec<String> = no_order.into_iter().map(u128_to_rid).collect();
    let ordered: Vec<String> = mysql_read::order_details(ctx.mysql, &rids)?
        .into_iter()
        .map(|o| o.reservation_id)
        .collect();
    rids.retain(|r| !ordered.contains(r));
    let mut out = Vec::with_capacity(rids.len());
    for deduction in mysql_read::deductions_of(ctx.mysql, &rids)? {
        let rid = deduction.reservation_id.as_str();
        let k = seckill_common::buckets::holding(ctx.redis, sale_id, rid, SaleKeys::flow)?;
        let (flow_record, status) = match k {
            Some(k) => (
                redis_read::hash_values(ctx.redis, &k.flow(), &[rid.to_string()])?
                    .pop()
                    .flatten(),
                redis_read::hash_values(ctx.redis, &k.status(), &[rid.to_string()])?
                    .pop()
                    .flatten(),
            ),
            None => (None, None),
        };
        out.push(LedgerOnly {
            deduction,
            flow_record,
            status,
        });
    }
    (ctx.tick)()?;
    Ok(out)
}

/// Step 8: the released orders whose flow record is still in Redis.
fn released_held(ctx: &mut Ctx<'_>, sale_id: u64) -> Result<Vec<ReleasedOrder>, RunError> {
    let released = released_orders(ctx.mysql, sale_id)?;
    if released.is_empty() {
        return Ok(released);
    }
    // One `HMGET` per bucket, of the orders it holds.
    let mut by_bucket: HashMap<u32, Vec<ReleasedOrder>> = HashMap::new();
    for o in released {
        by_bucket.entry(o.bucket).or_default().push(o);
    }
    let mut held = Vec::new();
    for orders in by_bucket.into_values() {
        let Some(k) = orders.first().map(ReleasedOrder::keys) else {
            continue;
        };
        let rids: Vec<String> = orders.iter().map(|o| o.reservation_id.clone()).collect();
        let flows = redis_read::hash_values(ctx.redis, &k.flow(), &rids)?;
        held.extend(
            orders
                .into_iter()
                .zip(flows)
                .filter(|(_, f)| f.is_some())
                .map(|(o, _)| o),
        );
    }
    (ctx.tick)()?;
    held.sort_by_key(|o| o.id);
    Ok(held)
}

/// Step 2: the books, the orders' reservation ids (sorted and distinct),
/// those that are not one of ours (as text), and the ledger's deductions
/// and releases (each sorted), in one snapshot; `None` when MySQL has no such sale.
#[allow(clippy::type_complexity)]
fn read_mysql(
    ctx: &mut Ctx<'_>,
    sale_id: u64,
) -> Result<Option<(Books, Vec<u128>, Vec<String>, Vec<u128>, Vec<u128>)>, RunError> {
    let mut orders: Vec<u128> = Vec::new();
    let mut odd: Vec<String> = Vec::new();
    let snap = mysql_read::snapshot(ctx.mysql, sale_id, |id| match rid_to_u128(id) {
        Some(v) => orders.push(v),
        None => odd.push(String::from_utf8_lossy(id).into_owned()),
    })?;
    let Some(snap) = snap else {
        return Ok(None);
    };
    orders.sort_unstable();
    orders.dedup();
    (ctx.tick)()?;
    Ok(Some((
        snap.books,
        orders,
        odd,
        snap.deducted,
        snap.released,
    )))
}

/// Step 3: which of `orders` have a deduction (both sorted: one merge).
fn ledger_marks(orders: &[u128], deducted: &[u128]) -> Bits {
    let mut has_ledger = Bits::new(orders.len());
    let mut d = deducted.iter().peekable();
    for (i, v) in orders.iter().enumerate() {
        while d.next_if(|x| *x < v).is_some() {}
        if d.peek() == Some(&v) {
            has_ledger.set(i);
        }
    }
    has_ledger
}

/// What step 4 read.
struct FlowMarks {
    /// Which orders have a flow record.
    has_flow: Bits,
    /// Flow records with no order, older than the grace period.
    candidates: Candidates,
    /// Flow records read.
    read: u64,
    /// Flow records younger than the grace period.
    young: u64,
}

/// Step 4: the flow records of bucket `k`, by `HSCAN`.
fn flow_marks(
    ctx: &mut Ctx<'_>,
    k: SaleKeys,
    orders: &[u128],
    now_ms: u64,
) -> Result<FlowMarks, RunError> {
    let grace_ms = ctx.grace.as_millis() as u64;
    let mut m = FlowMarks {
        has_flow: Bits::new(orders.len()),
        candidates: Candidates::new(),
        read: 0,
        young: 0,
    };
    redis_read::scan_hash(
        ctx.redis,
        &k.flow(),
        |field, value| {
            m.read += 1;
            if let Some(i) = rid_to_u128(field).and_then(|v| orders.binary_search(&v).ok()) {
                m.has_flow.set(i);
                return;
            }
            let at = OrderMessage::parse(value)
                .map(|m| m.reserved_at_ms)
                .unwrap_or(0);
            if now_ms.saturating_sub(at) < grace_ms {
                m.young += 1;
                return;
            }
            m.candidates.add(field);
        },
        &mut *ctx.tick,
    )?;
    m.candidates.seal();
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::ledger_marks;

    /// The merge marks exactly the orders whose id is among the deductions,
    /// with deductions before, between, after and equal to the orders.
    #[test]
    fn ledger_marks_are_the_orders_with_a_deduction() {
        let orders = [3u128, 5, 9, 12];
        let deducted = [1u128, 5, 5, 7, 12, 40];
        let marks = ledger_marks(&orders, &deducted);
        let got: Vec<bool> = (0..orders.len()).map(|i| marks.get(i)).collect();
        assert_eq!(got, [false, true, false, true]);
        let none = ledger_marks(&orders, &[]);
        assert!((0..orders.len()).all(|i| !none.get(i)));
    }
}
