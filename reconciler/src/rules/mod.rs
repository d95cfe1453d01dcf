//! Owns the reconciliation rules: one file per rule, each turning what was
//! read into observations (see `review/findings.rs` for how they become
//! findings). [`reconcile_sale`] applies the record-by-record rules to one
//! sale's [`SaleScan`] (`scan.rs`); the two sale-wide rules run before it,
//! from `cmd/run/`, and decide whether it runs at all.
//!
//! | rule | file | finding |
//! |---|---|---|
//! | flow record without order | [`flow_without_order`] | open, with the worker's dead-letter reason if any |
//! | order without flow record | [`order_without_flow`] | open; the evidence says what Redis should hold |
//! | order without ledger row | [`order_without_ledger`] | compensated (`auto_fixed`) when the cross-checks hold, else open |
//! | ledger deduction without order | [`ledger_without_order`] | open, critical; fixed by `resolve --recreate` |
//! | stock totals | [`stock_mismatch`] | open (`oversell` critical) |
//! | dead-letter entry | [`dead_letter`] | open, one per entry |
//! | Redis behind MySQL's marks | [`redis_data_loss`] | critical, one per sale; pauses the sale |
//! | a sale Redis sells that MySQL lacks | [`sale_missing_in_mysql`] | critical, one per sale |
//! | released in MySQL, held in Redis | [`released_held`] | `auto_fixed` by doing the release's Redis step |
//! | a payment not applied as `paid` | [`payments`] | open, one per payment id (`late_payment`, `payment_amount_mismatch`, ...) |
//! | an entry of the payment queue's dead letters | [`payment_dead_letter`] | `dead_letter` of sale 0, open, one per entry; only `--dismiss` |
//! | a buyer over the sale's per-buyer limit in MySQL | [`buyer_over_limit`] | open, critical, one per buyer |
//! | an order reserved outside its sale's window | [`order_outside_window`] | open, one per order |
//! | transfers between a sale's buckets | [`transfers`] | `stock_mismatch`: a half-done transfer completed (`auto_fixed`); unbalanced bucket books, one-sided transfers open |

pub mod buyer_over_limit;
pub mod dead_letter;
pub mod flow_without_order;
pub mod ledger_without_order;
pub mod order_outside_window;
pub mod order_without_flow;
pub mod order_without_ledger;
pub mod payment_dead_letter;
pub mod payments;
pub mod redis_data_loss;
pub mod released_held;
pub mod sale_missing_in_mysql;
pub mod stock_mismatch;
pub mod transfers;

use crate::error::RunError;
use crate::metrics_file::SaleProgress;
use crate::review::findings::{Kind, Observation};
use crate::scan::{self, Ctx, SaleScan};

/// What reconciling one sale found and did.
#[derive(Debug, Default)]
pub struct SaleReport {
    /// Every discrepancy observed (fixed ones carry what was done).
    pub observations: Vec<Observation>,
    /// Flow records skipped as younger than the grace period.
    pub young: u64,
    /// Flow records read.
    pub flow_records: u64,
    /// Orders read.
    pub orders: u64,
    /// The sale's progress as this scan read it (for the metrics file).
    pub progress: SaleProgress,
}

/// An observation of `kind` with nothing but its subject and evidence set.
pub(crate) fn obs(
    kind: Kind,
    sale_id: u64,
    subject: String,
    evidence: serde_json::Value,
) -> Observation {
    Observation {
        kind,
        sale_id,
        subject,
        reservation_id: None,
        user_id: None,
        order_id: None,
        critical: false,
        evidence,
        fixed: None,
    }
}

/// Scans sale `sale_id` and applies the record-by-record rules to it, in
/// the order of the table above; `None` when MySQL has no such sale.
///
/// Errors: Redis or MySQL failures, or what `ctx.tick` returns.
pub fn reconcile_sale(ctx: &mut Ctx<'_>, sale_id: u64) -> Result<Option<SaleReport>, RunError> {
    let buckets = seckill_common::buckets::count(ctx.redis, sale_id)?.unwrap_or(1);
    // Before the scan: it completes half-done transfers, whose units the
    // totals would otherwise find in no bucket.
    let transfers = match buckets {
        1 => Vec::new(),
        k => transfers::observe(ctx.redis, sale_id, k)?,
    };
    let Some(mut s) = scan::scan(ctx, sale_id, buckets)? else {
        return Ok(None);
    };
    let mut report = SaleReport {
        young: s.young,
        flow_records: s.flow_records,
        orders: s.orders,
        progress: SaleProgress::of(sale_id, &s.totals, &s.books),
        ..SaleReport::default()
    };
    let out = &mut report.observations;
    out.extend(transfers);
    out.extend(flow_without_order::observe(&s));
    out.extend(order_without_flow::observe(&s));
    out.extend(order_without_ledger::observe(ctx.mysql, &mut s)?);
    out.extend(ledger_without_order::observe(&s));
    // Before the Redis totals are judged: each fix moves a unit back to
    // Redis's stock (the totals read in step 1 already count it there,
    // as the flow record was counted among the reservations).
    out.extend(released_held::observe(ctx.mysql, ctx.redis, &s)?);
    out.extend(payments::observe(sale_id, &s.odd_payments));
    out.extend(stock_mismatch::observe(&s));
    out.extend(buyer_over_limit::observe(
        ctx.mysql,
        sale_id,
        s.books.per_user_limit,
    )?);
    out.extend(order_outside_window::observe(ctx.mysql, sale_id)?);
    let SaleScan { dead, .. } = s;
    out.extend(dead_letter::observations(sale_id, dead));
    Ok(Some(report))
}
