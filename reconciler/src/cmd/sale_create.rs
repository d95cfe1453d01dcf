//! Owns `sale create`: insert the sale in MySQL, then load it into Redis;
//! refused (and its MySQL row taken back) when Redis already holds a live
//! sale with the new id.

use crate::cli::SaleCreate;
use crate::config::Config;
use crate::connect;
use crate::error::RunError;
use crate::output::outln;
use crate::redis_read::read_meta;
use crate::sale_read::fetch_sale;
use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_common::redis_target::Con;
use seckill_common::timefmt::format_ms;
use std::collections::HashMap;

/// `sale create`: inserts the sale, then loads it into Redis; prints the id.
///
/// Redis may already hold a live sale with the new id (another MySQL
/// database sharing this Redis: both start at sale id 1). Then nothing is
/// loaded, the new MySQL row is deleted again (nothing can reference it yet:
/// no gateway sold it, so no worker has an order for it) and the exit code is
/// 2. The row is deleted too when the load fails.
pub fn run(config: &Config, a: &SaleCreate) -> Result<u8, RunError> {
    let mut db = connect::mysql(&config.services)?;
    // Check Redis first, so an unreachable Redis leaves no orphan sale behind.
    let mut con = connect::redis(&config.services)?;
    db.exec_drop(
        "INSERT INTO sales (sku, title, price_cents, total_stock, available_stock, starts_at, ends_at,
                            payment_window_ms, rebuy_after_release, buckets)
         VALUES (?, ?, ?, ?, ?, FROM_UNIXTIME(? / 1000), FROM_UNIXTIME(? / 1000), ?, ?, ?)",
        (
            &a.sku,
            &a.title,
            a.price_cents,
            a.stock,
            a.stock,
            a.starts_at_ms,
            a.ends_at_ms,
            a.payment_window_ms,
            a.rebuy_after_release,
            a.shards,
        ),
    )?;
    let id = db.last_insert_id();
    let sale = fetch_sale(&mut db, id)?
        .ok_or_else(|| RunError::NoSuch(format!("the new sale {id} vanished from MySQL")))?;
    let loaded = match seckill_common::buckets::load_into_redis(&mut con, &sale, a.shards, 0) {
        Ok(loaded) => loaded,
        Err(e) => {
            let undo = delete_sale(&mut db, id);
            return Err(RunError::CreateUndone(e, undo));
        }
    };
    if !loaded {
        let live = describe_live(&mut con, id);
        let undo = delete_sale(&mut db, id);
        eprintln!(
            "seckill-reconciler: Redis already holds a live sale {id} ({live}), probably \
             from another database: sale ids must be unique per Redis; {undo}"
        );
        return Ok(2);
    }
    if let Err(e) = seckill_common::load_record::record(&mut db, id) {
        eprintln!(
            "seckill-reconciler: sale {id} is on sale in Redis, but recording its load in \
             MySQL failed ({e}): run `seckill-reconciler sale load {id}` to record it"
        );
        return Ok(2);
    }
    eprintln!(
        "created sale {id}: {} unit{} of {} from {} to {}{}",
        sale.total_stock,
        if sale.total_stock == 1 { "" } else { "s" },
        sale.sku,
        format_ms(sale.starts_at_ms),
        format_ms(sale.ends_at_ms),
        match a.shards {
            1 => String::new(),
            k => format!(", in {k} buckets"),
        }
    );
    outln!("{id}");
    Ok(0)
}

/// Deletes sale row `id` that `create` just inserted; says what happened.
fn delete_sale(db: &mut mysql::Conn, id: u64) -> String {
    match db.exec_drop("DELETE FROM sales WHERE id = ?", (id,)) {
        Ok(()) => format!("the new MySQL sale row {id} was removed again: nothing was created"),
        Err(e) => format!("removing the new MySQL sale row {id} failed ({e}): delete it by hand"),
    }
}

/// The stock and window of the sale Redis holds under `id`, as text.
fn describe_live(con: &mut Con, id: u64) -> String {
    let k = SaleKeys::new(id);
    let stock: redis::RedisResult<Option<i64>> = con.get(k.stock());
    let meta: redis::RedisResult<HashMap<String, u64>> = read_meta(con, id);
    match (stock, meta) {
        (Ok(stock), Ok(meta)) => format!(
            "stock {}, total {}, window {} .. {}",
            stock.map_or_else(|| "?".to_string(), |s| s.to_string()),
            meta.get("total_stock")
                .map_or_else(|| "?".to_string(), u64::to_string),
            meta.get("starts_at_ms")
                .map_or_else(|| "?".to_string(), |ms| format_ms(*ms)),
            meta.get("ends_at_ms")
                .map_or_else(|| "?".to_string(), |ms| format_ms(*ms)),
        ),
        (Err(e), _) | (_, Err(e)) => format!("its figures could not be read: {e}"),
    }
}
