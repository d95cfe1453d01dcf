//! Owns the `order_outside_window` rule: an order holding units (not
//! expired or cancelled) whose `reserved_at` is before its sale's
//! `starts_at` or at or after its `ends_at`. The reservation script takes
//! nothing outside the window its bucket's meta holds, by Redis's clock,
//! and `sale end` writes the end into every bucket before it arrives
//! (`seckill_common::sale_admin`), so such an order means Redis enforced
//! another window than MySQL records (a bucket written late, a meta
//! changed by hand, clocks apart). Open, one per order (the subject is its
//! reservation id), with the times as evidence; a person decides whether
//! it stands (then `resolve ID --dismiss --note`) or cancels and refunds
//! it first. Orders without `reserved_at` are not judged.

use crate::review::findings::{Kind, Observation};
use crate::rules::obs;
use mysql::prelude::Queryable;
use seckill_common::order::RELEASED_SQL;
use seckill_common::timefmt::format_ms;
use serde_json::json;

/// Orders reported per sale and run, at most (each its finding).
const MAX_ORDERS: u64 = 1000;

/// One observation per order of sale `sale_id` reserved outside its window.
///
/// Errors: MySQL failures.
pub fn observe(db: &mut impl Queryable, sale_id: u64) -> Result<Vec<Observation>, mysql::Error> {
    type Row = (u64, String, String, u32, String, i64, i64, i64);
    let rows: Vec<Row> = db.exec(
        format!(
            "SELECT o.id, o.reservation_id, o.user_id, o.quantity, o.status,
                    CAST(UNIX_TIMESTAMP(o.reserved_at) * 1000 AS SIGNED),
                    CAST(UNIX_TIMESTAMP(s.starts_at) * 1000 AS SIGNED),
                    CAST(UNIX_TIMESTAMP(s.ends_at) * 1000 AS SIGNED)
             FROM orders o JOIN sales s ON s.id = o.sale_id
             WHERE o.sale_id = ? AND o.status NOT IN {RELEASED_SQL}
               AND (o.reserved_at < s.starts_at OR o.reserved_at >= s.ends_at)
             ORDER BY o.id LIMIT ?"
        ),
        (sale_id, MAX_ORDERS),
    )?;
    Ok(rows
        .into_iter()
        .map(|(id, rid, user, quantity, status, at, starts, ends)| {
            let ms = |t: i64| format_ms(t.max(0) as u64);
            let (side, by_ms) = if at < starts {
                ("before_start", starts - at)
            } else {
                ("at_or_after_end", at - ends)
            };
            let mut o = obs(
                Kind::OrderOutsideWindow,
                sale_id,
                rid.clone(),
                json!({"rule": "sales.starts_at <= orders.reserved_at < sales.ends_at",
                       "side": side, "by_ms": by_ms,
                       "reserved_at": ms(at), "starts_at": ms(starts), "ends_at": ms(ends),
                       "quantity": quantity, "status": status}),
            );
            o.reservation_id = Some(rid);
            o.user_id = Some(user);
            o.order_id = Some(id);
            o
        })
        .collect())
}
