//! Owns the `buyer_over_limit` rule: in a sale of several units per buyer
//! (`sales.per_user_limit` above 1), MySQL holds one order per reservation;
//! Redis keeps each buyer's allowance (`allowance.rs`) and the worker
//! checks it again in MySQL before it makes an order (`worker/src/apply.rs`);
//! a buyer whose orders holding units (confirmed, pending, paid) sum to
//! more than the limit got past both (an order written outside them). Critical and open, one per buyer (the subject),
//! with their orders as the evidence. A sale of one unit per buyer cannot
//! break it: MySQL's `orders_sale_live_user` key allows one order per
//! buyer there, so the rule reads nothing for it.

use crate::review::findings::{Kind, Observation};
use crate::rules::obs;
use mysql::prelude::Queryable;
use seckill_common::order::RELEASED_SQL;
use serde_json::json;

/// Buyers over the limit, at most this many per run (each its finding).
const MAX_BUYERS: u64 = 1000;

/// One critical observation per buyer of sale `sale_id` whose orders
/// holding units sum to more than `per_user_limit`.
///
/// Errors: MySQL failures.
pub fn observe(
    db: &mut mysql::Conn,
    sale_id: u64,
    per_user_limit: i64,
) -> Result<Vec<Observation>, mysql::Error> {
    if per_user_limit <= 1 {
        return Ok(Vec::new());
    }
    let over: Vec<(String, i64, String)> = db.exec(
        format!(
            "SELECT user_id, CAST(SUM(quantity) AS SIGNED),
                    GROUP_CONCAT(CONCAT(reservation_id, ':', quantity, ':', status) ORDER BY id)
             FROM orders WHERE sale_id = ? AND status NOT IN {RELEASED_SQL}
             GROUP BY user_id HAVING SUM(quantity) > ? ORDER BY user_id LIMIT ?"
        ),
        (sale_id, per_user_limit, MAX_BUYERS),
    )?;
    Ok(over
        .into_iter()
        .map(|(user, units, list)| {
            let orders: Vec<serde_json::Value> = list
                .split(',')
                .filter_map(|e| {
                    let mut p = e.splitn(3, ':');
                    Some(json!({"reservation_id": p.next()?,
                                "quantity": p.next()?.parse::<u64>().ok()?,
                                "status": p.next()?}))
                })
                .collect();
            let mut o = obs(
                Kind::BuyerOverLimit,
                sale_id,
                user.clone(),
                json!({"rule": "units a buyer's orders hold <= sales.per_user_limit",
                       "units": units, "per_user_limit": per_user_limit,
                       "orders": orders}),
            );
            o.critical = true;
            o.user_id = Some(user);
            o
        })
        .collect())
}
