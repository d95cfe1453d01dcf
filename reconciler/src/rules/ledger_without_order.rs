//! Owns the `ledger_without_order` rule: a stock-ledger deduction that no
//! order holds and no `release` row gave back (`scan.rs`, steps 3 and 7) is
//! a unit MySQL counts as sold to nobody. Critical and open: MySQL's stock
//! no longer covers the unit, so re-queuing the message cannot make the
//! order (the worker's batch would deduct it a second time) and releasing
//! it in Redis would sell a unit MySQL does not have. Its fix is
//! `resolve ID --recreate` (`recreate.rs`), with the ledger row and what
//! Redis holds as the evidence.

use crate::review::findings::{Kind, Observation};
use crate::rules::obs;
use crate::scan::SaleScan;
use seckill_common::message::OrderMessage;
use seckill_common::timefmt::format_ms;
use serde_json::json;

/// One critical observation per deduction without order, in reservation id
/// order.
pub fn observe(s: &SaleScan) -> Vec<Observation> {
    s.ledger_only
        .iter()
        .map(|l| {
            let d = &l.deduction;
            let mut o = obs(
                Kind::LedgerWithoutOrder,
                s.sale_id,
                d.reservation_id.clone(),
                json!({
                    "ledger_row": {
                        "id": d.id,
                        "reservation_id": d.reservation_id,
                        "user_id": d.user_id,
                        "delta": d.delta,
                        "reason": d.reason,
                        "created_at": format_ms(d.created_ms),
                    },
                    "order": null,
                    "flow_record": l.flow_record,
                    "status": l.status,
                }),
            );
            o.critical = true;
            o.reservation_id = Some(d.reservation_id.clone());
            o.user_id = Some(
                l.flow_record
                    .as_deref()
                    .and_then(|f| OrderMessage::parse(f.as_bytes()).ok())
                    .map_or_else(|| d.user_id.clone(), |m| m.user_id),
            );
            o
        })
        .collect()
}
