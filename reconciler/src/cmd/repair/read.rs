//! Owns what `sale repair` reads before it rebuilds: every order of the
//! sale from MySQL, each bucket's marks as Redis holds them now, and what
//! `--dry-run` says the rebuild would write.

use crate::error::RunError;
use crate::repair_rebuild::OrderRow;
use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_common::order::OrderStatus;
use seckill_common::redis_target::Con;

/// Every order of sale `id`, as the repair reads them.
///
/// Errors: MySQL failures.
pub fn read_orders(db: &mut mysql::Conn, id: u64) -> Result<Vec<OrderRow>, RunError> {
    // reservation id, user, reserved at ms, status, pay by ms, quantity
    type Row = (String, String, Option<i64>, String, Option<i64>, u32);
    let rows: Vec<Row> = db.exec(
        "SELECT reservation_id, user_id, CAST(UNIX_TIMESTAMP(reserved_at) * 1000 AS SIGNED),
                status, CAST(UNIX_TIMESTAMP(pay_by) * 1000 AS SIGNED), quantity
         FROM orders WHERE sale_id = ? ORDER BY id",
        (id,),
    )?;
    Ok(rows
        .into_iter()
        .map(|(rid, user, at, status, pay_by, quantity)| OrderRow {
            quantity,
            rid,
            user,
            reserved_at_ms: at.unwrap_or(0).max(0) as u64,
            // An older row's `created` holds its unit, as `confirmed` does.
            status: status.parse().unwrap_or(OrderStatus::Confirmed),
            pay_by_ms: pay_by.map(|p| p.max(0) as u64),
        })
        .collect())
}

/// A bucket's reservation sequence, checkpoint and `moved_in` as Redis
/// holds them now, read leniently: a field that is not a number (the
/// damage being repaired, perhaps) counts as 0, and is overwritten by the
/// repair.
///
/// Errors: Redis failures.
pub fn redis_marks(con: &mut Con, k: &SaleKeys) -> redis::RedisResult<(u64, Option<u64>, u64)> {
    let (total, releases_now, ck, moved_in): (
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    ) = redis::cmd("HMGET")
        .arg(k.meta())
        .arg("total_stock")
        .arg("releases")
        .arg("checkpoint")
        .arg("moved_in")
        .query(con)?;
    let stock_now: Option<String> = con.get(k.stock())?;
    let num = |v: &Option<String>| v.as_deref().and_then(|v| v.parse::<i64>().ok());
    let redis_seq = seckill_common::reservation::sequence(
        num(&total).unwrap_or(0).max(0) as u64,
        num(&stock_now).unwrap_or(0),
        num(&releases_now).unwrap_or(0).max(0) as u64,
    );
    let redis_ck = num(&ck).map(|c| c.max(0) as u64);
    Ok((
        redis_seq,
        redis_ck,
        num(&moved_in).unwrap_or(0).max(0) as u64,
    ))
}

/// What the rebuild of `sale` (its `buckets`) would write, for `--dry-run`:
/// the orders MySQL holds, the units they hold, and the stock Redis would
/// get (the reservations Redis still queues stay on their way).
///
/// Errors: Redis or MySQL failures.
pub fn would(
    con: &mut Con,
    db: &mut mysql::Conn,
    sale: &seckill_common::sale::Sale,
    buckets: &[SaleKeys],
) -> Result<String, RunError> {
    let orders = read_orders(db, sale.id)?;
    let held: u64 = orders
        .iter()
        .filter(|o| !o.status.is_released())
        .map(|o| u64::from(o.quantity))
        .sum();
    let mut queued = 0u64;
    for k in buckets {
        queued += con.llen::<_, u64>(k.queue())?;
    }
    let total = sale.total_stock;
    let stock = total.saturating_sub(held + queued);
    let kept = match queued {
        0 => String::new(),
        q => format!(", {q} reservation(s) still queued kept"),
    };
    Ok(format!(
        "{} orders ({held} units held), stock {stock} of {total} in {} bucket(s){kept}",
        orders.len(),
        buckets.len()
    ))
}
