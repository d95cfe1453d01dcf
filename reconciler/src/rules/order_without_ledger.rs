//! Owns the `order_without_ledger` rule and its automatic fix: an order with
//! no stock-ledger deduction is compensated (`compensate.rs`, finding
//! `auto_fixed`) when the cross-checks hold: the Redis flow record exists
//! and the MySQL books balance, so the missing row means a missing
//! deduction and not a lost ledger row whose decrement did happen. Otherwise
//! it is open, with the reason it was not fixed.

use crate::compensate::{compensate, Compensation};
use crate::error::RunError;
use crate::mysql_read::Books;
use crate::review::findings::{Kind, Observation};
use crate::rules::obs;
use crate::scan::SaleScan;
use serde_json::json;
use std::collections::HashSet;

/// One observation per order without ledger row; compensates those that
/// pass the cross-checks, keeping `s.books` up to date with each fix.
///
/// Errors: MySQL failures of a compensation.
pub fn observe(mysql: &mut mysql::Conn, s: &mut SaleScan) -> Result<Vec<Observation>, RunError> {
    let balanced = s.books.balanced();
    let no_flow: HashSet<&String> = s.no_flow.iter().collect();
    let mut out = Vec::with_capacity(s.no_ledger.len());
    for rid in &s.no_ledger {
        let flow_ok = !no_flow.contains(rid);
        let mut evidence = json!({
            "ledger_deduction": null,
            "flow_record_in_redis": flow_ok,
            "books": books_json(&s.books),
        });
        let fixed = if flow_ok && balanced {
            match compensate(mysql, s.sale_id, rid)? {
                Compensation::Done {
                    units,
                    ledger_id,
                    available_after,
                } => {
                    let units = units as i64;
                    s.books.ledger_deductions += units;
                    s.books.available_stock = available_after;
                    Some(format!(
                        "inserted stock_ledger row {ledger_id} (reason compensation, delta \
                         -{units}); available_stock {} -> {available_after}",
                        available_after + units
                    ))
                }
                Compensation::NotNeeded => continue, // deducted meanwhile
                Compensation::NoStockLeft => {
                    evidence["not_fixed"] = json!("available_stock cannot cover the order's units");
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
        let d = s.details.get(rid);
        let mut o = obs(Kind::OrderWithoutLedger, s.sale_id, rid.clone(), evidence);
        o.reservation_id = Some(rid.clone());
        o.user_id = d.map(|d| d.user_id.clone());
        o.order_id = d.map(|d| d.id);
        o.fixed = fixed;
        out.push(o);
    }
    Ok(out)
}

/// The books as evidence.
pub(crate) fn books_json(b: &Books) -> serde_json::Value {
    json!({"total_stock": b.total_stock, "ledger_deductions": b.ledger_deductions,
           "available_stock": b.available_stock, "orders": b.orders})
}
