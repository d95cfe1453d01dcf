//! Owns the `sale` operator commands: create a sale in MySQL and load it into
//! Redis, load an existing one without ever overwriting live stock (nor
//! one Redis lost since its recorded load: `sale repair`'s job), and show
//! MySQL and Redis figures side by side, and whether it is archived (the
//! repair of a sale Redis lost data of is `repair_cmd.rs`, the archive
//! `archive_cmd.rs`). `create` refuses (and takes its
//! MySQL row back) when Redis already holds a live sale with the new id.

use crate::cli::SaleCreate;
use crate::output::{outln, write_stdout};
use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_common::redis_target::Con;
use seckill_common::sale::Sale;
use seckill_common::timefmt::format_ms;
use seckill_common::Config;
use std::collections::HashMap;
use std::error::Error;

type Res<T> = Result<T, Box<dyn Error>>;

/// `id, sku, title, price_cents, total_stock, available_stock, starts ms, ends ms`.
type SaleRow = (u64, String, String, u64, u64, i64, i64, i64);

/// Opens a Redis connection with the configured timeouts and checks the
/// server (`seckill_common::redis_server`: an eviction policy that can
/// delete the sale's keys is refused, exit 2).
pub fn redis_con(config: &Config) -> Res<Con> {
    let (con, _) = seckill_common::redis_server::connect(&config.redis_url, config.redis_timeout)?;
    Ok(con)
}

/// Reads sale `id` from MySQL; `None` when there is none.
pub fn fetch_sale(db: &mut mysql::Conn, id: u64) -> Res<Option<Sale>> {
    let row: Option<SaleRow> = db.exec_first(
        "SELECT id, sku, title, price_cents, total_stock, available_stock,
                CAST(UNIX_TIMESTAMP(starts_at) * 1000 AS SIGNED),
                CAST(UNIX_TIMESTAMP(ends_at) * 1000 AS SIGNED)
         FROM sales WHERE id = ?",
        (id,),
    )?;
    Ok(row.map(
        |(id, sku, title, price_cents, total_stock, available_stock, s, e)| Sale {
            id,
            sku,
            title,
            price_cents,
            total_stock,
            available_stock,
            starts_at_ms: s.max(0) as u64,
            ends_at_ms: e.max(0) as u64,
        },
    ))
}

/// Orders of sale `id` that hold a unit (released ones do not).
fn order_count(db: &mut mysql::Conn, id: u64) -> Res<u64> {
    Ok(seckill_common::lifecycle::held_units(db, id)?)
}

/// The mark `sale show` puts under its books when the ledger's deductions
/// and the orders holding a unit differ (each order holds exactly one
/// deduction): which side has more, and the finding `run` opens for it.
fn ledger_mark(ledger: i64, orders: u64) -> Option<String> {
    let diff = ledger - i64::try_from(orders).unwrap_or(i64::MAX);
    match diff {
        0 => None,
        d if d > 0 => Some(format!(
            "{d} ledger deduction(s) with no order holding the unit (finding \
             ledger_without_order; fix: resolve ID --recreate)"
        )),
        d => Some(format!(
            "{} order(s) with no ledger deduction (finding order_without_ledger)",
            -d
        )),
    }
}

/// `sale create`: inserts the sale, then loads it into Redis; prints the id.
///
/// Redis may already hold a live sale with the new id (another MySQL
/// database sharing this Redis: both start at sale id 1). Then nothing is
/// loaded, the new MySQL row is deleted again (nothing can reference it yet:
/// no gateway sold it, so no worker has an order for it) and the exit code is
/// 2. The row is deleted too when the load fails.
pub fn create(config: &Config, a: &SaleCreate) -> Res<u8> {
    let mut db = seckill_common::schema::connect(&config.mysql_url, config.mysql_timeout)?;
    // Check Redis first, so an unreachable Redis leaves no orphan sale behind.
    let mut con = redis_con(config)?;
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
    let sale = fetch_sale(&mut db, id)?.ok_or("the new sale vanished")?;
    let loaded = match seckill_common::buckets::load_into_redis(&mut con, &sale, a.shards, 0) {
        Ok(loaded) => loaded,
        Err(e) => {
            let undo = delete_sale(&mut db, id);
            return Err(format!("redis: {e}; {undo}").into());
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

/// The numeric fields of sale `id`'s meta hash (`total_stock`,
/// `starts_at_ms`, `ends_at_ms`, `seq`); others (`paused`) are left out.
fn read_meta(con: &mut Con, id: u64) -> redis::RedisResult<HashMap<String, u64>> {
    let all: HashMap<String, String> = con.hgetall(SaleKeys::new(id).meta())?;
    Ok(all
        .into_iter()
        .filter_map(|(f, v)| v.parse().ok().map(|v| (f, v)))
        .collect())
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

/// `sale load`: puts a MySQL sale into Redis, unless Redis holds its
/// stock, split over the K MySQL records for it (`sales.buckets`); `shards`
/// (`--shards K`) may only repeat that K (a disagreeing one is refused,
/// exit 64: another K would move buyers to other home buckets, away from
/// their orders' flow records and marks). A sale MySQL records no K for
/// (created before migration 5) takes `shards` (default 1), and MySQL
/// records it (or the K Redis holds it with, when it does). A sale whose
/// load MySQL records and whose keys Redis has lost since is refused, exit
/// 1 ([`lost_since_loaded`]); every load is recorded (`sales.loaded_at`).
pub fn load(config: &Config, id: u64, shards: Option<u32>) -> Res<u8> {
    let mut db = seckill_common::schema::connect(&config.mysql_url, config.mysql_timeout)?;
    let Some(sale) = fetch_sale(&mut db, id)? else {
        eprintln!("seckill-reconciler: no sale {id} in MySQL");
        return Ok(2);
    };
    // An archived sale stays out of Redis: with its tombstone lost, a load
    // would put it back on sale and nothing would remove it again.
    if let Some(by) = crate::archive_cmd::sale_state(&mut db, id)?.and_then(|s| s.archived_by) {
        eprintln!(
            "seckill-reconciler: sale {id} was archived by {by}: it stays out of Redis; nothing loaded"
        );
        return Ok(1);
    }
    if let Some(why) = crate::sale_admin_cmd::load_refusal(&mut db, id)? {
        eprintln!("seckill-reconciler: refused: {why}; nothing loaded");
        return Ok(1);
    }
    let ordered = order_count(&mut db, id)?;
    let mut con = redis_con(config)?;
    if let Some(why) = lost_since_loaded(&mut con, &mut db, id)? {
        eprintln!("seckill-reconciler: {why}");
        return Ok(1);
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
    if recorded.is_none() {
        db.exec_drop(
            "UPDATE sales SET buckets = ? WHERE id = ? AND buckets IS NULL",
            (buckets, id),
        )?;
    }
    // A sale whose bucket 0 is gone while other buckets are live lost part
    // of its keys: loading bucket 0 alone would offer its units again on
    // top of theirs. Not supported yet.
    let bucket0: Option<i64> = con.get(SaleKeys::new(id).stock())?;
    if bucket0.is_none() && seckill_common::buckets::split_elsewhere(&mut con, id)? {
        eprintln!(
            "seckill-reconciler: sale {id}: bucket 0 is gone but other buckets are live; \
             reloading part of a split sale is not supported yet; nothing loaded"
        );
        return Ok(2);
    }
    let loaded = seckill_common::buckets::load_into_redis(&mut con, &sale, buckets, ordered)?;
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
/// acknowledged before the loss with nothing reported; `run` pauses such a
/// sale and `sale repair` rebuilds it. Only for a sale that can still sell
/// (its window not closed a minute ago), the ones the data-loss watch and
/// `run` check: an ended sale reloaded sells nothing.
///
/// Errors: Redis or MySQL failures.
fn lost_since_loaded(con: &mut Con, db: &mut mysql::Conn, id: u64) -> Res<Option<String>> {
    let Some(at) = seckill_common::load_record::loaded_at_ms(db, id)? else {
        return Ok(None);
    };
    let open: Option<i64> = db.exec_first(
        "SELECT ends_at > UTC_TIMESTAMP(3) - INTERVAL 1 MINUTE FROM sales WHERE id = ?",
        (id,),
    )?;
    if open != Some(1) {
        return Ok(None);
    }
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
         `seckill-reconciler run` (it pauses the sale and opens a critical redis_data_loss \
         finding), then `seckill-reconciler sale repair {id} --by NAME`",
        format_ms(at)
    )))
}

/// `sale show`: MySQL and Redis figures side by side; the Redis column is
/// read from Redis only (the meta hash and counters), so a sale id that Redis
/// holds for another database shows as such.
pub fn show(config: &Config, id: u64) -> Res<u8> {
    let mut db = crate::replica_read::read_only_connect(config)?;
    let Some(sale) = fetch_sale(&mut db, id)? else {
        eprintln!("seckill-reconciler: no sale {id} in MySQL");
        return Ok(2);
    };
    let orders = order_count(&mut db, id)?;
    let ledger = seckill_common::schema::ledger_deductions(&mut db, id)?;
    // The order lifecycle: the payment window, and every order by status
    // (the `orders` line counts those holding a unit).
    let window: Option<Option<u64>> =
        db.exec_first("SELECT payment_window_ms FROM sales WHERE id = ?", (id,))?;
    let by_status: Vec<(String, u64)> = db.exec(
        "SELECT status, COUNT(*) FROM orders WHERE sale_id = ? GROUP BY status ORDER BY status",
        (id,),
    )?;
    let archived = crate::archive_cmd::sale_state(&mut db, id)?
        .and_then(|s| Some((s.tombstone.archived_at_ms, s.archived_by?)));
    let mut con = redis_con(config)?;
    let k = SaleKeys::new(id);
    let mut released: u64 = con.hlen(k.released())?;
    let mut stock: Option<i64> = con.get(k.stock())?;
    let mut meta: HashMap<String, u64> = read_meta(&mut con, id)?;
    let paused: Option<String> = con.hget(k.meta(), "paused")?;
    let operator_paused: Option<String> =
        con.hget(k.meta(), seckill_common::sale_admin::OPERATOR_PAUSED)?;
    let mut flows: u64 = con.hlen(k.flow())?;
    let mut queued: u64 = con.llen(k.queue())?;
    let mut dead: u64 = con.llen(k.dead_letter())?;
    let buckets = seckill_common::buckets::count(&mut con, id)?.unwrap_or(1);
    let figs = match buckets {
        1 => Vec::new(),
        n => crate::buckets_cmd::all_figures(&mut con, id, n)?,
    };
    if buckets > 1 {
        // The sale's Redis column adds its buckets up.
        stock = figs.iter().map(|f| f.stock).sum();
        let total: Option<i64> = figs.iter().map(|f| f.total_stock).sum();
        match total.and_then(|t| u64::try_from(t).ok()) {
            Some(t) => meta.insert("total_stock".into(), t),
            None => meta.remove("total_stock"),
        };
        flows = figs.iter().map(|f| f.flows).sum();
        released = figs.iter().map(|f| f.released).sum();
        queued = figs.iter().map(|f| f.queued).sum();
        dead = figs.iter().map(|f| f.dead).sum();
    }
    let not_loaded = || "(not loaded)".to_string();
    let redis_window = match (meta.get("starts_at_ms"), meta.get("ends_at_ms")) {
        (Some(&s), Some(&e)) if (s, e) != (sale.starts_at_ms, sale.ends_at_ms) => {
            Some(format!("{} .. {}", format_ms(s), format_ms(e)))
        }
        _ => None,
    };
    write_stdout(|w| {
        // A sale created without --title has an empty one: nothing to quote.
        match sale.title.as_str() {
            "" => writeln!(w, "sale {id}  sku {}", sale.sku)?,
            title => writeln!(w, "sale {id}  sku {}  {title:?}", sale.sku)?,
        }
        writeln!(
            w,
            "window            {} .. {}",
            format_ms(sale.starts_at_ms),
            format_ms(sale.ends_at_ms)
        )?;
        if let Some((at, by)) = &archived {
            writeln!(
                w,
                "archived          {} by {by}: Redis keeps only its window (a late buyer \
                 hears sale_ended); MySQL and the review file keep the rest",
                format_ms(*at)
            )?;
        }
        if let Some(rw) = &redis_window {
            writeln!(w, "window in Redis   {rw}  (differs from MySQL)")?;
        }
        writeln!(w, "                  MySQL        Redis")?;
        writeln!(
            w,
            "total stock       {:<12} {}",
            sale.total_stock,
            meta.get("total_stock")
                .map_or_else(not_loaded, u64::to_string)
        )?;
        writeln!(
            w,
            "available/stock   {:<12} {}",
            sale.available_stock,
            stock.map_or_else(not_loaded, |s| s.to_string())
        )?;
        writeln!(w, "ledger deductions {:<12} -", ledger)?;
        writeln!(w, "orders holding    {:<12} -", orders)?;
        if let Some(mark) = ledger_mark(ledger, orders) {
            writeln!(w, "                  ! {mark}")?;
        }
        if let Some(ms) = window.flatten() {
            writeln!(
                w,
                "payment window    {}",
                humantime::format_duration(std::time::Duration::from_millis(ms))
            )?;
        }
        if !by_status.is_empty() {
            let list: Vec<String> = by_status
                .iter()
                .map(|(st, n)| format!("{st} {n}"))
                .collect();
            writeln!(w, "orders by status  {}", list.join(", "))?;
        }
        writeln!(w, "released units    -            {released}")?;
        writeln!(w, "reservations      -            {flows}")?;
        writeln!(w, "queued messages   -            {queued}")?;
        writeln!(w, "dead letters      -            {dead}")?;
        if buckets > 1 {
            writeln!(w, "buckets           -            {buckets}")?;
            crate::buckets_cmd::write_table(w, id, &figs)?;
        }
        if let Some(p) = &paused {
            writeln!(
                w,
                "PAUSED            {p}: run `seckill-reconciler run`, then \
                 `seckill-reconciler sale repair {id} --by NAME`"
            )?;
        }
        if let Some(p) = &operator_paused {
            writeln!(
                w,
                "PAUSED            by an operator ({p}): `seckill-reconciler sale resume {id} \
                 --by NAME`"
            )?;
        }
        Ok(())
    })?;
    Ok(0)
}
