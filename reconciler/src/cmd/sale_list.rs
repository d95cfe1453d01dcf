//! Owns `sale list`: one line per sale MySQL holds, with its window,
//! state, units (total / left / reserved / ordered / paid) and pause, read
//! from MySQL and from Redis (every bucket's stock); changes nothing.

use crate::config::Config;
use crate::connect;
use crate::error::RunError;
use crate::output::write_stdout;
use mysql::prelude::Queryable;
use seckill_common::keys::SaleKeys;
use seckill_common::now_ms;
use seckill_common::redis_target::Con;
use seckill_common::timefmt::format_ms;

/// One sale as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Listed {
    id: u64,
    sku: String,
    starts_at_ms: u64,
    ends_at_ms: u64,
    total: u64,
    available: i64,
    ordered: u64,
    paid: u64,
    paused_reason: Option<String>,
    paused_by: Option<String>,
    data_loss: Option<String>,
    archived: bool,
    /// `per_user_limit/max_per_purchase`.
    limit: String,
}

type Row = (
    u64,
    String,
    i64,
    i64,
    u64,
    i64,
    Option<String>,
    Option<String>,
    Option<String>,
    i64,
    u32,
    u32,
);

fn read(db: &mut mysql::Conn) -> Result<Vec<Listed>, RunError> {
    let rows: Vec<Row> = db.query(
        "SELECT s.id, s.sku, CAST(UNIX_TIMESTAMP(s.starts_at) * 1000 AS SIGNED),
                CAST(UNIX_TIMESTAMP(s.ends_at) * 1000 AS SIGNED), s.total_stock,
                s.available_stock, s.paused_reason, s.paused_by, r.paused_reason,
                s.archived_at IS NOT NULL, s.per_user_limit, s.max_per_purchase
         FROM sales s LEFT JOIN sale_redis_state r ON r.sale_id = s.id ORDER BY s.id",
    )?;
    let counts: Vec<(u64, u64, u64)> = db.query(
        "SELECT sale_id,
                CAST(SUM(IF(status NOT IN ('expired', 'cancelled'), quantity, 0)) AS UNSIGNED),
                CAST(SUM(IF(status = 'paid', quantity, 0)) AS UNSIGNED)
         FROM orders GROUP BY sale_id",
    )?;
    let counts: std::collections::HashMap<u64, (u64, u64)> =
        counts.into_iter().map(|(s, o, p)| (s, (o, p))).collect();
    Ok(rows
        .into_iter()
        .map(
            |(id, sku, s, e, total, available, pr, pb, dl, archived, l, q)| {
                let (ordered, paid) = counts.get(&id).copied().unwrap_or((0, 0));
                Listed {
                    id,
                    sku,
                    starts_at_ms: s.max(0) as u64,
                    ends_at_ms: e.max(0) as u64,
                    total,
                    available,
                    ordered,
                    paid,
                    paused_reason: pr,
                    paused_by: pb,
                    data_loss: dl,
                    archived: archived == 1,
                    limit: format!("{l}/{q}"),
                }
            },
        )
        .collect())
}

/// The stock Redis holds for sale `id` over every bucket; `None` when
/// Redis does not hold the sale (or holds only its archive's tombstone).
fn redis_stock(redis: &mut Con, id: u64) -> Result<Option<i64>, RunError> {
    let Some(k) = seckill_common::buckets::count(redis, id)? else {
        return Ok(None);
    };
    let mut sum = None;
    for b in 0..k {
        let s: Option<i64> = redis::cmd("GET")
            .arg(SaleKeys::bucket(id, b).stock())
            .query(redis)?;
        if let Some(s) = s {
            sum = Some(sum.unwrap_or(0) + s.max(0));
        }
    }
    Ok(sum)
}

/// The state word of sale `l` with `left` units at `now`.
fn state(l: &Listed, left: i64, now: u64) -> &'static str {
    if l.archived {
        "archived"
    } else if l.paused_reason.is_some() || l.data_loss.is_some() {
        "paused"
    } else if now < l.starts_at_ms {
        "upcoming"
    } else if now >= l.ends_at_ms {
        "ended"
    } else if left <= 0 {
        "sold_out"
    } else {
        "active"
    }
}

/// `sale list`: exit 0.
///
/// Errors: Redis or MySQL failures.
pub fn run(config: &Config) -> Result<u8, RunError> {
    let mut db = crate::replica_read::read_only_connect(config)?;
    let mut redis = connect::redis(&config.services)?;
    let sales = read(&mut db)?;
    let now = now_ms();
    let mut lines = Vec::with_capacity(sales.len());
    for l in &sales {
        let left = if l.archived {
            l.available
        } else {
            redis_stock(&mut redis, l.id)?.unwrap_or(l.available)
        };
        let reserved = (l.total as i64 - left).max(0);
        let paused = match (&l.data_loss, &l.paused_reason) {
            (Some(d), Some(r)) => format!(
                "{d}; operator {}: {r}",
                l.paused_by.as_deref().unwrap_or("?")
            ),
            (Some(d), None) => d.clone(),
            (None, Some(r)) => format!("operator {}: {r}", l.paused_by.as_deref().unwrap_or("?")),
            (None, None) => "-".to_string(),
        };
        lines.push(format!(
            "{:<6} {:<16} {} .. {}  {:<9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7}  {paused}",
            l.id,
            l.sku,
            format_ms(l.starts_at_ms),
            format_ms(l.ends_at_ms),
            state(l, left, now),
            l.total,
            left,
            reserved,
            l.ordered,
            l.paid,
            l.limit
        ));
    }
    write_stdout(|w| {
        writeln!(
            w,
            "{:<6} {:<16} {:<52}  {:<9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7}  paused",
            "id",
            "sku",
            "window (UTC)",
            "state",
            "total",
            "left",
            "reserved",
            "ordered",
            "paid",
            "limit"
        )?;
        for line in &lines {
            writeln!(w, "{line}")?;
        }
        Ok(())
    })
    .map_err(RunError::Output)?;
    Ok(0)
}
