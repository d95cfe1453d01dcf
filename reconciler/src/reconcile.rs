//! Owns the three-way reconciliation of one sale: Redis flow records vs the
//! MySQL stock ledger vs the orders, record by record, plus the totals. It
//! produces observations (see `review_findings.rs`) and performs the one
//! automatic fix, compensation (`compensate.rs`).
//!
//! Order of reads, chosen so that work in progress is never reported:
//! 1. Redis totals (one `MULTI`) and MySQL books (one snapshot);
//! 2. the orders' reservation ids, streamed into a sorted `Vec<u128>`
//!    (16 bytes per order: the only memory that grows with the sale);
//! 3. the ledger's deductions, streamed, marking orders that have one;
//! 4. the flow records by `HSCAN`, marking orders that have one; a flow record
//!    with no order and older than the grace period becomes a candidate;
//! 5. for candidates only: the queue, then the processing lists (a message
//!    being moved is seen in one of them), then a MySQL re-check (an order
//!    committed after step 2 clears it).
//!
//! Rules:
//! - `flow_without_order`: candidate still without order, not queued nor in a
//!   processing list (a dead-lettered one counts, with the worker's reason).
//! - `order_without_ledger`: compensated (`auto_fixed`) when the cross-checks
//!   hold: the Redis flow record exists and the MySQL books balance, so the
//!   missing row means a missing deduction and not a lost ledger row whose
//!   decrement did happen; otherwise open with the reason.
//! - `order_without_flow`: open; the evidence says what Redis should hold.
//! - `stock_mismatch`: `mysql_books` (total − ledger deductions ≠ available),
//!   `redis_stock` (Redis stock + reservations ≠ total), `oversell` (orders >
//!   total, critical).
//! - `dead_letter`: one per dead-letter entry, with the worker's reason
//!   (`dead_letters.rs`).
//!
//! A sale Redis sells but MySQL lost is `missing_sale.rs`'s rule.

use crate::compensate::{compensate, Compensation};
use crate::error::RunError;
use crate::mysql_read::{self, rid_to_u128, u128_to_rid, Books};
use crate::redis_read::{self, RedisTotals};
use crate::review_findings::{Kind, Observation};
use seckill_common::keys::{SaleKeys, WORKERS};
use seckill_common::message::OrderMessage;
use serde_json::json;
use std::collections::HashMap;
use std::time::Duration;

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
}

/// Everything one sale's reconciliation needs.
pub struct Ctx<'a> {
    /// Redis (reads and nothing else).
    pub redis: &'a mut redis::Connection,
    /// MySQL (reads, and compensation).
    pub mysql: &'a mut mysql::Conn,
    /// Reservations younger than this are skipped.
    pub grace: Duration,
    /// Called between chunks: keeps the run lock, stops on a signal.
    pub tick: &'a mut dyn FnMut() -> Result<(), RunError>,
}

struct Bits(Vec<u64>);

impl Bits {
    fn new(n: usize) -> Bits {
        Bits(vec![0; n.div_ceil(64)])
    }
    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    fn get(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
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

/// Reconciles sale `sale_id`; `None` when MySQL has no such sale.
///
/// Errors: Redis or MySQL failures, or what `tick` returns.
pub fn reconcile_sale(ctx: &mut Ctx<'_>, sale_id: u64) -> Result<Option<SaleReport>, RunError> {
    let k = SaleKeys::new(sale_id);
    let totals = redis_read::totals(ctx.redis, sale_id)?;
    let Some(mut books) = mysql_read::books(ctx.mysql, sale_id)? else {
        return Ok(None);
    };
    let mut report = SaleReport::default();

    // 2. orders
    let mut orders: Vec<u128> = Vec::with_capacity(books.orders.max(0) as usize);
    let mut odd_orders: Vec<String> = Vec::new();
    mysql_read::for_each_order_id(ctx.mysql, sale_id, |id| match rid_to_u128(id) {
        Some(v) => orders.push(v),
        None => odd_orders.push(String::from_utf8_lossy(id).into_owned()),
    })?;
    orders.sort_unstable();
    orders.dedup();
    report.orders = orders.len() as u64;
    (ctx.tick)()?;

    // 3. ledger deductions
    let mut has_ledger = Bits::new(orders.len());
    for v in mysql_read::deducted_ids(ctx.mysql, sale_id)? {
        if let Ok(i) = orders.binary_search(&v) {
            has_ledger.set(i);
        }
    }
    (ctx.tick)()?;

    // 4. flow records
    let mut has_flow = Bits::new(orders.len());
    let mut candidates: HashMap<String, String> = HashMap::new();
    let (now_ms, grace_ms) = (totals.now_ms, ctx.grace.as_millis() as u64);
    let mut young = 0u64;
    let mut flows = 0u64;
    redis_read::scan_hash(
        ctx.redis,
        &k.flow(),
        |field, value| {
            flows += 1;
            if let Some(i) = rid_to_u128(field).and_then(|v| orders.binary_search(&v).ok()) {
                has_flow.set(i);
                return;
            }
            let at = OrderMessage::parse(value)
                .map(|m| m.reserved_at_ms)
                .unwrap_or(0);
            if now_ms.saturating_sub(at) < grace_ms {
                young += 1;
                return;
            }
            candidates.insert(
                String::from_utf8_lossy(field).into_owned(),
                String::from_utf8_lossy(value).into_owned(),
            );
        },
        &mut *ctx.tick,
    )?;
    report.young = young;
    report.flow_records = flows;

    // dead-letter entries (always read: they are findings of their own)
    let dead = crate::dead_letters::read(ctx.redis, sale_id)?;

    // 5. candidates: in flight? ordered meanwhile?
    if !candidates.is_empty() {
        let mut lists = vec![k.queue()];
        for w in redis_read::set_members(ctx.redis, WORKERS)? {
            lists.push(k.processing(&w));
        }
        for list in &lists {
            redis_read::for_each_in_list(ctx.redis, list, |raw| {
                if let Some(rid) = redis_read::message_rid(raw) {
                    candidates.remove(String::from_utf8_lossy(rid).as_ref());
                }
            })?;
        }
        // The scans above read one list after another, so a message that a
        // reclaim moved from a processing list back to the queue in between
        // was in neither scan. The few candidates left are checked again in
        // one atomic script over every list.
        if !candidates.is_empty() {
            let texts: Vec<(String, String)> = candidates
                .iter()
                .map(|(rid, text)| (rid.clone(), text.clone()))
                .collect();
            let in_flight = still_in_flight(ctx.redis, &lists, &texts)?;
            for (rid, _) in texts.iter().zip(in_flight).filter(|(_, f)| *f) {
                candidates.remove(&rid.0);
            }
        }
        let rids: Vec<String> = candidates.keys().cloned().collect();
        for o in mysql_read::order_details(ctx.mysql, &rids)? {
            candidates.remove(&o.reservation_id);
        }
        let rids: Vec<String> = candidates.keys().cloned().collect();
        let statuses = redis_read::hash_values(ctx.redis, &k.status(), &rids)?;
        let still = redis_read::hash_values(ctx.redis, &k.flow(), &rids)?;
        for ((rid, status), flow) in rids.iter().zip(statuses).zip(still) {
            if flow.is_none() {
                continue; // released meanwhile
            }
            let flow_text = candidates.get(rid).cloned().unwrap_or_default();
            let msg = OrderMessage::parse(flow_text.as_bytes()).ok();
            let dl = dead
                .entries
                .iter()
                .find(|d| d.reservation_id.as_deref() == Some(rid.as_str()));
            let mut o = obs(
                Kind::FlowWithoutOrder,
                sale_id,
                rid.clone(),
                json!({
                    "flow_record": flow_text,
                    "status": status,
                    "age_ms": msg.as_ref().map(|m| now_ms.saturating_sub(m.reserved_at_ms)),
                    "queued_or_in_flight": false,
                    "dead_letter_reason": dl.map(|d| d.reason.clone()),
                }),
            );
            o.reservation_id = Some(rid.clone());
            o.user_id = msg.map(|m| m.user_id);
            report.observations.push(o);
        }
    }

    // orders without flow record, and without ledger row
    let mut no_flow: Vec<String> = odd_orders;
    let mut no_ledger: Vec<String> = Vec::new();
    for (i, v) in orders.iter().enumerate() {
        if !has_flow.get(i) {
            no_flow.push(u128_to_rid(*v));
        }
        if !has_ledger.get(i) {
            no_ledger.push(u128_to_rid(*v));
        }
    }
    drop(orders);
    let mut details = HashMap::new();
    if !no_flow.is_empty() || !no_ledger.is_empty() {
        let all: Vec<String> = no_flow.iter().chain(no_ledger.iter()).cloned().collect();
        for d in mysql_read::order_details(ctx.mysql, &all)? {
            details.insert(d.reservation_id.clone(), d);
        }
    }
    for rid in &no_flow {
        let d = details.get(rid);
        let should = d.map(|d| {
            OrderMessage {
                v: seckill_common::message::MESSAGE_VERSION,
                reservation_id: rid.clone(),
                sale_id,
                user_id: d.user_id.clone(),
                reserved_at_ms: d.reserved_at_ms,
            }
            .to_json()
        });
        let mut o = obs(
            Kind::OrderWithoutFlow,
            sale_id,
            rid.clone(),
            json!({
                "redis_should_hold": [
                    {"key": k.flow(), "field": rid, "value": should},
                    {"key": k.buyers(), "field": d.map(|d| d.user_id.clone()), "value": rid},
                ],
            }),
        );
        o.reservation_id = Some(rid.clone());
        o.user_id = d.map(|d| d.user_id.clone());
        o.order_id = d.map(|d| d.id);
        report.observations.push(o);
    }
    let balanced = books.balanced();
    let no_flow: std::collections::HashSet<&String> = no_flow.iter().collect();
    for rid in &no_ledger {
        let d = details.get(rid);
        let flow_ok = !no_flow.contains(rid);
        let mut evidence = json!({
            "ledger_deduction": null,
            "flow_record_in_redis": flow_ok,
            "books": books_json(&books),
        });
        let fixed = if flow_ok && balanced {
            match compensate(ctx.mysql, sale_id, rid)? {
                Compensation::Done {
                    ledger_id,
                    available_after,
                } => {
                    books.ledger_deductions += 1;
                    books.available_stock = available_after;
                    Some(format!(
                        "inserted stock_ledger row {ledger_id} (reason compensation, delta -1); \
                         available_stock {} -> {available_after}",
                        available_after + 1
                    ))
                }
                Compensation::NotNeeded => continue, // deducted meanwhile
                Compensation::NoStockLeft => {
                    evidence["not_fixed"] = json!("available_stock is 0");
                    None
                }
            }
        } else {
            evidence["not_fixed"] = json!(if flow_ok {
                "the MySQL books do not balance; a deduction may exist without its ledger row"
            } else {
                "no Redis flow record to cross-check against"
            });
            None
        };
        let mut o = obs(Kind::OrderWithoutLedger, sale_id, rid.clone(), evidence);
        o.reservation_id = Some(rid.clone());
        o.user_id = d.map(|d| d.user_id.clone());
        o.order_id = d.map(|d| d.id);
        o.fixed = fixed;
        report.observations.push(o);
    }

    report
        .observations
        .extend(totals_observations(sale_id, &books, &totals));
    report
        .observations
        .extend(crate::dead_letters::observations(sale_id, dead));
    Ok(Some(report))
}

fn books_json(b: &Books) -> serde_json::Value {
    json!({"total_stock": b.total_stock, "ledger_deductions": b.ledger_deductions,
           "available_stock": b.available_stock, "orders": b.orders})
}

/// The `stock_mismatch` observations of a sale's totals.
fn totals_observations(sale_id: u64, books: &Books, totals: &RedisTotals) -> Vec<Observation> {
    let mut out = Vec::new();
    if !books.balanced() {
        out.push(obs(
            Kind::StockMismatch,
            sale_id,
            "mysql_books".into(),
            json!({"rule": "total_stock - ledger deductions = available_stock",
                   "books": books_json(books),
                   "difference": books.total_stock - books.ledger_deductions
                       - books.available_stock}),
        ));
    }
    let redis_sum = totals.stock.map(|s| s + totals.reservations);
    if redis_sum != Some(books.total_stock) {
        out.push(obs(
            Kind::StockMismatch,
            sale_id,
            "redis_stock".into(),
            json!({"rule": "Redis stock + Redis reservations = total_stock",
                   "redis_stock": totals.stock, "redis_reservations": totals.reservations,
                   "total_stock": books.total_stock}),
        ));
    }
    if books.orders > books.total_stock {
        let mut o = obs(
            Kind::StockMismatch,
            sale_id,
            "oversell".into(),
            json!({"rule": "orders <= total_stock", "orders": books.orders,
                   "total_stock": books.total_stock}),
        );
        o.critical = true;
        out.push(o);
    }
    out
}

/// For each `(rid, message)`, whether the message sits in any of `lists`
/// (the queue and the processing lists), all checked in one atomic script,
/// in chunks of 100 messages.
fn still_in_flight(
    con: &mut redis::Connection,
    lists: &[String],
    messages: &[(String, String)],
) -> redis::RedisResult<Vec<bool>> {
    static SCRIPT: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
    let script = SCRIPT.get_or_init(|| {
        redis::Script::new(
            r"
local found = {}
for i, msg in ipairs(ARGV) do
  found[i] = 0
  for _, list in ipairs(KEYS) do
    if redis.call('LPOS', list, msg) then found[i] = 1; break end
  end
end
return found",
        )
    });
    let mut out = Vec::with_capacity(messages.len());
    for chunk in messages.chunks(100) {
        let mut inv = script.prepare_invoke();
        for l in lists {
            inv.key(l);
        }
        for (_, m) in chunk {
            inv.arg(m);
        }
        let flags: Vec<i64> = inv.invoke(con)?;
        out.extend(flags.into_iter().map(|f| f == 1));
    }
    Ok(out)
}
