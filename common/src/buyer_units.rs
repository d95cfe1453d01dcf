//! Owns MySQL's count of the units a buyer holds in a sale: the sum of the
//! quantities of their orders of that sale whose status holds units (every
//! status but `expired` and `cancelled`, [`crate::order::RELEASED_SQL`]).
//! The worker checks a message of a sale of several units per buyer
//! against it before the order is made (`worker/src/apply.rs`), and
//! `resolve --recreate` before it re-creates one, so MySQL never holds
//! more than `sales.per_user_limit` units of one buyer even when Redis
//! forgot some of them (a data loss that new purchases masked).
//!
//! The read goes by `orders_sale_buyer` (`sale_id`, `user_id`, migration
//! 10): a batch's check reads only its buyers' orders, whatever the size
//! of the sale.

use crate::order::RELEASED_SQL;
use crate::schema::placeholders;
use mysql::prelude::Queryable;
use mysql::{Params, Value};
use std::collections::HashMap;

/// The units each of `users` holds in sale `sale_id` (a buyer holding none
/// is absent), read by `db` (a transaction holding the sale row reads it
/// stable: every writer of the sale's orders locks that row first).
///
/// Errors: MySQL failures.
pub fn held_units<Q: Queryable>(
    db: &mut Q,
    sale_id: u64,
    users: &[&str],
) -> mysql::Result<HashMap<String, u64>> {
    if users.is_empty() {
        return Ok(HashMap::new());
    }
    let sql = format!(
        "SELECT user_id, CAST(SUM(quantity) AS UNSIGNED) FROM orders
         WHERE sale_id = ? AND user_id IN ({}) AND status NOT IN {RELEASED_SQL}
         GROUP BY user_id",
        placeholders(users.len())
    );
    let mut params = vec![Value::from(sale_id)];
    params.extend(users.iter().map(|u| Value::from(*u)));
    let rows: Vec<(String, u64)> = db.exec(sql, Params::Positional(params))?;
    Ok(rows.into_iter().collect())
}
