//! Owns `sale load ID`: put a MySQL sale into Redis without ever
//! overwriting live stock, nor one Redis lost since its recorded load
//! (`sale repair`'s job).

use crate::config::Config;
use crate::connect;
use crate::error::{RunError, EXIT_REFUSED};
use crate::output::outln;
use crate::sale_read::{fetch_sale, held_units};
use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_common::redis_target::Con;
use seckill_common::timefmt::format_ms;

/// `sale load`: puts a MySQL sale into Redis, unless Redis holds its
/// stock, split over the K MySQL records for it (`sales.buckets`); `shards`
/// (`--shards K`) may only repeat that K (a disagreeing one is refused,
/// exit 64: another K would move buyers to other home buckets, away from
/// their orders' flow records and marks). A sale MySQL records no K for
/// (created before migration 5) takes `shards` (default 1), and MySQL
/// records it (or the K Redis holds it with, when it does). A sale whose
/// load MySQL records and whose keys Redis has lost since is refused, exit
/// 1 ([`lost_since_loaded`]); every load is recorded (`sales.loaded_at`).
pub fn run(config: &Config, id: u64, shards: Option<u32>) -> Result<u8, RunError> {
    let mut db = connect::mysql(&config.services)?;
    let Some(sale) = fetch_sale(&mut db, id)? else {
        return Err(RunError::NoSuch(format!("no sale {id} in MySQL")));
    };
    // An archived sale stays out of Redis: were its tombstone lost, a load
    // would put it back on sale and nothing would remove it again.
    if let Some(by) = crate::sale_read::sale_state(&mut db, id)?.and_then(|s| s.archived_by) {
        eprintln!(
            "seckill-reconciler: sale {id} was archived by {by}: it stays out of Redis; nothing loaded"
        );
        return Ok(EXIT_REFUSED);
    }
    if let Some(why) = crate::sale_read::load_refusal(&mut db, id)? {
        eprintln!("seckill-reconciler: refused: {why}; nothing loaded");
        return Ok(EXIT_REFUSED);
    }
    let ordered = held_units(&mut db, id)?;
    let mut con = connect::redis(&config.services)?;
    if let Some(why) = lost_since_loaded(&mut con, &mut db, id)? {
        eprintln!("seckill-reconciler: {why}");
        return Ok(EXIT_REFUSED);
    }
    let recorded = seckill_common::buckets::recorded(&mut db, id)?;
    // A sale created before migration 5 that Redis still holds: its K is
    // the one Redis routes by.
    let known = match recorded {
        Some(k) => Some(k),
        None => seckill_common::buckets::count(&mut con, id)?,
    };
    let buckets = match (known, shards) {
        (Some(k), Some(s)) if k != s => {
            eprintln!(
                "seckill-reconciler: sale {id} has {k} bucket(s) (MySQL's sales.buckets, set by \
                 `sale create --shards {k}`); --shards {s} disagrees: leave --shards out; \
                 nothing loaded"
            );
            return Ok(64);
        }
        (Some(k), _) => k,
        (None, s) => s.unwrap_or(1),
    };
    let limits = seckill_common::sale::Limits::read(&mut db, id)?;
    if recorded.is_none() {
        db.exec_drop(
            "UPDATE sales SET buckets = ? WHERE id = ? AND buckets IS NULL",
            (buckets, id),
        )?;
    }
    // A sale whose bucket 0 is gone while other buckets are live lost part
    // of its keys: loading bucket 0 alone would offer its units again on
    // top of theirs, so the load is refused.
    let bucket0: Option<i64> = con.get(SaleKeys::new(id).stock())?;
    if bucket0.is_none() && seckill_common::buckets::split_elsewhere(&mut con, id)? {
        eprintln!(
            "seckill-reconciler: sale {id}: bucket 0 is gone but other buckets are live; \
             reloading part of a split sale is not supported yet; nothing loaded"
        );
        return Ok(2);
    }
    let loaded = seckill_common::buckets::load_limited_into_redis(
        &mut con, &sale, buckets, ordered, limits,
    )?;
    // Live either way now (a load interrupted before its record, or a sale
    // from before the record, is recorded by this one).
    seckill_common::load_record::record(&mut db, id)?;
    if loaded {
        outln!(
            "loaded sale {id} into Redis with stock {} ({} total, {} already ordered){}",
            sale.total_stock.saturating_sub(ordered),
            sale.total_stock,
            ordered,
            match buckets {
                1 => String::new(),
                k => format!(", in {k} buckets"),
            }
        );
    } else {
        let live: Option<i64> = con.get(SaleKeys::new(id).stock())?;
        outln!(
            "sale {id} already live in Redis (stock {}); left unchanged",
            live.unwrap_or(0)
        );
    }
    Ok(0)
}

/// Why sale `id` must not be loaded: MySQL records its load
/// (`load_record.rs`) and Redis has lost its stock counter or meta in a
/// bucket since. Loading it would offer again the units of purchases
/// acknowledged before the loss with nothing reported; `run` opens a
/// `redis_data_loss` finding (and pauses a sale that can still sell) and
/// `sale repair` rebuilds it. An ended sale too: a load would put back its
/// stock without its flow records, leaving MySQL and Redis apart.
///
/// Errors: Redis or MySQL failures.
fn lost_since_loaded(
    con: &mut Con,
    db: &mut mysql::Conn,
    id: u64,
) -> Result<Option<String>, RunError> {
    let Some(at) = seckill_common::load_record::loaded_at_ms(db, id)? else {
        return Ok(None);
    };
    let k = seckill_common::data_loss::bucket_count(con, db, id)?;
    let gone = seckill_common::load_record::gone_buckets(con, id, k)?;
    if gone.is_empty() {
        return Ok(None);
    }
    let which = match (k, gone.as_slice()) {
        (1, _) => String::new(),
        (_, b) => format!(
            " (bucket{} {})",
            if b.len() == 1 { "" } else { "s" },
            b.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
        ),
    };
    Ok(Some(format!(
        "sale {id} was loaded into Redis at {} and Redis has lost its stock counter or \
         meta since{which}: the purchases it acknowledged that MySQL holds no order of are \
         lost, and a load would sell their units again; nothing loaded. Run \
         `seckill-reconciler run` (it opens a critical redis_data_loss finding, and pauses \
         the sale unless it has ended), then `seckill-reconciler sale repair {id} --by NAME`",
        format_ms(at)
    )))
}
