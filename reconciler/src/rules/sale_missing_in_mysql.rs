//! Owns the `sale_missing_in_mysql` rule: a sale Redis knows (member of
//! `seckill:sales`, its stock counter or meta present, not ended before the
//! lookback) that MySQL does not hold at all. Redis goes on selling it while
//! every worker dead-letters its messages (`unknown sale N`): an undersell no
//! MySQL-side rule can see, so it is one critical finding per sale (subject
//! `sale`) with the evidence (units reserved, messages dead-lettered, what
//! is still queued, orders MySQL kept), plus the sale's dead-letter findings.
//! The flow-record rules are not applied: without the sale row there are no
//! books to compare with, and the dead letters already name each reservation.

use crate::error::RunError;
use crate::redis_read;
use crate::review::findings::{Kind, Observation};
use crate::rules::dead_letter;
use crate::rules::obs;
use mysql::prelude::Queryable;
use seckill_common::keys::SaleKeys;
use seckill_common::redis_target::Con;
use serde_json::json;
use std::collections::HashMap;
use std::time::Duration;

/// The subject of the one finding per missing sale.
pub const SUBJECT: &str = "sale";

/// The observations of sale `sale_id`, which Redis lists and the MySQL sales
/// in play do not: `None` when MySQL does hold the sale (it ended before the
/// lookback) or Redis holds nothing live of it.
///
/// Errors: Redis or MySQL failures.
pub fn observe(
    redis: &mut Con,
    mysql: &mut mysql::Conn,
    sale_id: u64,
    lookback: Duration,
) -> Result<Option<Vec<Observation>>, RunError> {
    let known: Option<u64> = mysql.exec_first("SELECT id FROM sales WHERE id = ?", (sale_id,))?;
    if known.is_some() {
        return Ok(None);
    }
    let k = SaleKeys::new(sale_id);
    #[allow(clippy::type_complexity)] // one MULTI reply: meta, stock, four lengths, TIME
    let (meta, stock, reserved, queued, dead, archived, time): (
        HashMap<String, String>,
        Option<i64>,
        i64,
        i64,
        i64,
        i64,
        (u64, u64),
    ) = redis::pipe()
        .atomic()
        .hgetall(k.meta())
        .get(k.stock())
        .hlen(k.flow())
        .llen(k.queue())
        .llen(k.dead_letter())
        .llen(k.dead_letter_archive())
        .cmd("TIME")
        .query(redis)?;
    if meta.is_empty() && stock.is_none() {
        return Ok(None);
    }
    let now_ms = time.0 * 1000 + time.1 / 1000;
    let num = |f: &str| meta.get(f).and_then(|v| v.parse::<u64>().ok());
    if let Some(ends) = num("ends_at_ms") {
        if ends.saturating_add(lookback.as_millis() as u64) < now_ms {
            return Ok(None);
        }
    }
    let orders: Option<i64> =
        mysql.exec_first("SELECT COUNT(*) FROM orders WHERE sale_id = ?", (sale_id,))?;
    // A sale of several units per buyer: a flow record holds up to
    // `max_per_purchase` units; the units taken are `total − stock`.
    let reserved = match (
        num(seckill_common::allowance::MAX_PER_BUYER_FIELD),
        num("total_stock"),
        stock,
    ) {
        (Some(l), Some(total), Some(left)) if l > 1 => total as i64 - left,
        _ => reserved,
    };
    let mut found = obs(
        Kind::SaleMissingInMysql,
        sale_id,
        SUBJECT.to_string(),
        json!({
            "rule": "every sale live in Redis has its row in MySQL",
            "units_reserved": reserved,
            "dead_lettered": dead,
            "dead_letters_archived": archived,
            "queued": queued,
            "redis_stock": stock,
            "total_stock": num("total_stock"),
            "starts_at_ms": num("starts_at_ms"),
            "ends_at_ms": num("ends_at_ms"),
            "orders_in_mysql": orders.unwrap_or(0),
        }),
    );
    found.critical = true;
    let mut out = vec![found];
    out.extend(dead_letter::observations(
        sale_id,
        redis_read::dead_letters(redis, sale_id)?,
    ));
    Ok(Some(out))
}
