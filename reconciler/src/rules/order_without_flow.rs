//! Owns the `order_without_flow` rule: an order MySQL holds whose flow record
//! Redis does not (or whose reservation id is not one of ours). Open; the
//! evidence says what Redis should hold, so a person can restore it: the
//! order message with the order's quantity, and the buyer's mark (its
//! reservation id; in a sale of several units per buyer, its `RID:Q` entry
//! among the buyer's list, `allowance::Held`).

use crate::review::findings::{Kind, Observation};
use crate::rules::obs;
use crate::scan::SaleScan;
use seckill_common::keys::SaleKeys;
use seckill_common::message::{OrderMessage, MESSAGE_VERSION};
use serde_json::json;

/// One observation per order without flow record, in the scan's order.
pub fn observe(s: &SaleScan) -> Vec<Observation> {
    let k = SaleKeys::new(s.sale_id);
    s.no_flow
        .iter()
        .map(|rid| {
            let d = s.details.get(rid);
            let should = d.map(|d| {
                OrderMessage {
                    v: MESSAGE_VERSION,
                    reservation_id: rid.clone(),
                    sale_id: s.sale_id,
                    user_id: d.user_id.clone(),
                    reserved_at_ms: d.reserved_at_ms,
                    quantity: d.quantity,
                }
                .to_json()
            });
            let mark = match (s.books.per_user_limit, d) {
                (l, Some(d)) if l > 1 => format!("{rid}:{}", d.quantity),
                _ => rid.clone(),
            };
            let mut o = obs(
                Kind::OrderWithoutFlow,
                s.sale_id,
                rid.clone(),
                json!({
                    "redis_should_hold": [
                        {"key": k.flow(), "field": rid, "value": should},
                        {"key": k.buyers(), "field": d.map(|d| d.user_id.clone()), "value": mark},
                    ],
                }),
            );
            o.reservation_id = Some(rid.clone());
            o.user_id = d.map(|d| d.user_id.clone());
            o.order_id = d.map(|d| d.id);
            o
        })
        .collect()
}
