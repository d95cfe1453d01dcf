//! Owns the `flow_without_order` rule: a flow record older than the grace
//! period with no order, neither queued nor in a processing list after every
//! re-check (`scan.rs`, step 6), is units taken that no order holds (the
//! evidence's `units`: the message's quantity). Open,
//! with the worker's reason when the message was dead-lettered. A flow
//! record whose unit MySQL's ledger deducted is not one: it is the
//! evidence of a `ledger_without_order` (`ledger_without_order.rs`), whose
//! fix is not a reorder or a rollback.

use crate::review::findings::{Kind, Observation};
use crate::rules::obs;
use crate::scan::SaleScan;
use seckill_common::message::OrderMessage;
use serde_json::json;

/// One observation per flow record without order, in reservation id order.
pub fn observe(s: &SaleScan) -> Vec<Observation> {
    let now_ms = s.totals.now_ms;
    s.unordered
        .iter()
        .map(|u| {
            let rid = &u.reservation_id;
            let msg = OrderMessage::parse(u.flow_record.as_bytes()).ok();
            let dl = s
                .dead
                .entries
                .iter()
                .find(|d| d.reservation_id.as_deref() == Some(rid.as_str()));
            let mut o = obs(
                Kind::FlowWithoutOrder,
                s.sale_id,
                rid.clone(),
                json!({
                    "flow_record": u.flow_record,
                    "status": u.status,
                    "age_ms": msg.as_ref().map(|m| now_ms.saturating_sub(m.reserved_at_ms)),
                    "units": msg.as_ref().map(|m| m.quantity),
                    "queued_or_in_flight": false,
                    "dead_letter_reason": dl.map(|d| d.reason.clone()),
                }),
            );
            o.reservation_id = Some(rid.clone());
            o.user_id = msg.map(|m| m.user_id);
            o
        })
        .collect()
}
