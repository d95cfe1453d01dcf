//! Owns `sale show ID`: MySQL and Redis figures side by side, the order
//! lifecycle's counts, and whether the sale is archived or paused.

use crate::config::Config;
use crate::connect;
use crate::error::RunError;
use crate::output::write_stdout;
use crate::redis_read::read_meta;
use crate::sale_read::{fetch_sale, held_units};
use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_common::redis_target::Con;
use seckill_common::sale::Sale;
use seckill_common::timefmt::format_ms;
use std::collections::HashMap;
use std::io::Write;

/// The mark `sale show` puts under its books when the ledger's deductions
/// and the units orders hold differ (each order holds its quantity's
/// deduction; the row `orders holding` counts units): which side has more, and the finding `run` opens for it.
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

/// What MySQL holds of the sale.
struct MysqlSide {
    sale: Sale,
    /// Orders holding a unit.
    orders: u64,
    /// The stock ledger's deductions.
    ledger: i64,
    /// `sales.payment_window_ms`.
    window: Option<Option<u64>>,
    /// Every order by status.
    by_status: Vec<(String, u64)>,
    /// When and by whom it was archived, if it was.
    archived: Option<(u64, String)>,
    /// `sales.per_user_limit` and `max_per_purchase`.
    limits: seckill_common::sale::Limits,
}

/// What Redis holds of the sale (summed over its buckets).
struct RedisSide {
    /// Units the order lifecycle gave back (expired, cancelled): the
    /// quantities of the `released` hash's order messages.
    released: u64,
    stock: Option<i64>,
    /// The numeric fields of the meta hash (`read_meta`).
    meta: HashMap<String, u64>,
    /// The data-loss pause.
    paused: Option<String>,
    /// An operator's pause.
    operator_paused: Option<String>,
    flows: u64,
    queued: u64,
    dead: u64,
    buckets: u32,
    /// Each bucket's figures (empty for one bucket).
    figs: Vec<crate::bucket_read::BucketFigures>,
}

/// `sale show`: MySQL and Redis figures side by side; the Redis column is
/// read from Redis only (the meta hash and counters), so a sale id that Redis
/// holds for another database shows as such.
///
/// Errors: no such sale in MySQL, Redis or MySQL failures, stdout.
pub fn run(config: &Config, id: u64) -> Result<u8, RunError> {
    let mut db = crate::replica_read::read_only_connect(config)?;
    let Some(sale) = fetch_sale(&mut db, id)? else {
        return Err(RunError::NoSuch(format!("no sale {id} in MySQL")));
    };
    let m = read_mysql(&mut db, sale)?;
    let mut con = connect::redis(&config.services)?;
    let r = read_redis(&mut con, id)?;
    write_stdout(|w| write(w, id, &m, &r)).map_err(RunError::Output)?;
    Ok(0)
}

/// The MySQL column of sale `sale`.
///
/// Errors: MySQL failures.
fn read_mysql(db: &mut mysql::Conn, sale: Sale) -> Result<MysqlSide, RunError> {
    let id = sale.id;
    let orders = held_units(db, id)?;
    let ledger = seckill_common::schema::ledger_deductions(db, id)?;
    // The order lifecycle: the window, and every order by status
    // (the `orders` line counts those holding a unit).
    let window: Option<Option<u64>> =
        db.exec_first("SELECT payment_window_ms FROM sales WHERE id = ?", (id,))?;
    let by_status: Vec<(String, u64)> = db.exec(
        "SELECT status, COUNT(*) FROM orders WHERE sale_id = ? GROUP BY status ORDER BY status",
        (id,),
    )?;
    let archived = crate::sale_read::sale_state(db, id)?
        .and_then(|s| Some((s.tombstone.archived_at_ms, s.archived_by?)));
    let limits = seckill_common::sale::Limits::read(db, id)?;
    Ok(MysqlSide {
        sale,
        orders,
        ledger,
        window,
        by_status,
        archived,
        limits,
    })
}

/// The Redis column of sale `id`, its buckets added up.
///
/// Errors: Redis failures.
fn read_redis(con: &mut Con, id: u64) -> Result<RedisSide, RunError> {
    let k = SaleKeys::new(id);
    let mut released: u64 = crate::redis_read::hash_units(con, &k.released())?;
    let mut stock: Option<i64> = con.get(k.stock())?;
    let mut meta: HashMap<String, u64> = read_meta(con, id)?;
    let paused: Option<String> = con.hget(k.meta(), seckill_common::data_loss::PAUSED_FIELD)?;
    let operator_paused: Option<String> =
        con.hget(k.meta(), seckill_common::sale_admin::OPERATOR_PAUSED)?;
    let mut flows: u64 = con.hlen(k.flow())?;
    let mut queued: u64 = con.llen(k.queue())?;
    let mut dead: u64 = con.llen(k.dead_letter())?;
    let buckets = seckill_common::buckets::count(con, id)?.unwrap_or(1);
    let figs = match buckets {
        1 => Vec::new(),
        n => crate::bucket_read::all_figures(con, id, n)?,
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
    Ok(RedisSide {
        released,
        stock,
        meta,
        paused,
        operator_paused,
        flows,
        queued,
        dead,
        buckets,
        figs,
    })
}

/// Writes the two columns of sale `id`.
fn write(w: &mut dyn Write, id: u64, m: &MysqlSide, r: &RedisSide) -> std::io::Result<()> {
    write_heading(w, id, m, r)?;
    write_stock(w, m, r)?;
    write_lifecycle(w, m)?;
    write_redis_lists(w, id, r)?;
    write_pauses(w, id, r)
}

/// Writes the sale's title, window and archiving, and Redis's window when
/// it differs from MySQL's.
fn write_heading(w: &mut dyn Write, id: u64, m: &MysqlSide, r: &RedisSide) -> std::io::Result<()> {
    let sale = &m.sale;
    let redis_window = match (r.meta.get("starts_at_ms"), r.meta.get("ends_at_ms")) {
        (Some(&s), Some(&e)) if (s, e) != (sale.starts_at_ms, sale.ends_at_ms) => {
            Some(format!("{} .. {}", format_ms(s), format_ms(e)))
        }
        _ => None,
    };
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
    if let Some((at, by)) = &m.archived {
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
    Ok(())
}

/// Writes the stock rows side by side: total and available stock, ledger
/// deductions and orders holding a unit (marked when they disagree).
fn write_stock(w: &mut dyn Write, m: &MysqlSide, r: &RedisSide) -> std::io::Result<()> {
    let not_loaded = || "(not loaded)".to_string();
    writeln!(w, "                  MySQL        Redis")?;
    writeln!(
        w,
        "total stock       {:<12} {}",
        m.sale.total_stock,
        r.meta
            .get("total_stock")
            .map_or_else(not_loaded, u64::to_string)
    )?;
    writeln!(
        w,
        "available/stock   {:<12} {}",
        m.sale.available_stock,
        r.stock.map_or_else(not_loaded, |s| s.to_string())
    )?;
    write_limits(w, m, r)?;
    writeln!(w, "ledger deductions {:<12} -", m.ledger)?;
    writeln!(w, "orders holding    {:<12} -", m.orders)?;
    if let Some(mark) = ledger_mark(m.ledger, m.orders) {
        writeln!(w, "                  ! {mark}")?;
    }
    Ok(())
}

/// Writes the units a buyer may hold and a purchase may take (`L/Q`), on
/// both sides, when either side has more than one unit per buyer (a sale
/// of one unit per buyer has no such meta fields).
fn write_limits(w: &mut dyn Write, m: &MysqlSide, r: &RedisSide) -> std::io::Result<()> {
    use seckill_common::allowance::{MAX_PER_BUYER_FIELD, MAX_PER_PURCHASE_FIELD};
    let l = r.meta.get(MAX_PER_BUYER_FIELD).copied().unwrap_or(1);
    let q = r.meta.get(MAX_PER_PURCHASE_FIELD).copied().unwrap_or(l);
    if m.limits.max_per_buyer == 1 && l == 1 {
        return Ok(());
    }
    let mysql = format!("{}/{}", m.limits.max_per_buyer, m.limits.max_per_purchase);
    writeln!(w, "buyer/purchase    {mysql:<12} {l}/{q}")
}

/// Writes the order lifecycle's rows: the payment window and the orders
/// by status.
fn write_lifecycle(w: &mut dyn Write, m: &MysqlSide) -> std::io::Result<()> {
    if let Some(ms) = m.window.flatten() {
        writeln!(
            w,
            "payment window    {}",
            humantime::format_duration(std::time::Duration::from_millis(ms))
        )?;
    }
    if !m.by_status.is_empty() {
        let list: Vec<String> = m
            .by_status
            .iter()
            .map(|(st, n)| format!("{st} {n}"))
            .collect();
        writeln!(w, "orders by status  {}", list.join(", "))?;
    }
    Ok(())
}

/// Writes the Redis-only rows: released units, reservations, queued
/// messages, dead letters, and the buckets' table when there are several.
fn write_redis_lists(w: &mut dyn Write, id: u64, r: &RedisSide) -> std::io::Result<()> {
    writeln!(w, "released units    -            {}", r.released)?;
    // A sale of several units per buyer: a reservation is of one or more
    // units, which are total − stock (over its buckets).
    let units = r
        .meta
        .get(seckill_common::allowance::MAX_PER_BUYER_FIELD)
        .is_some_and(|l| *l > 1);
    match (units, r.meta.get("total_stock"), r.stock) {
        (true, Some(&total), Some(stock)) => writeln!(
            w,
            "reservations      -            {} ({} units)",
            r.flows,
            total as i64 - stock
        )?,
        _ => writeln!(w, "reservations      -            {}", r.flows)?,
    }
    writeln!(w, "queued messages   -            {}", r.queued)?;
    writeln!(w, "dead letters      -            {}", r.dead)?;
    if r.buckets > 1 {
        writeln!(w, "buckets           -            {}", r.buckets)?;
        crate::bucket_read::write_table(w, id, &r.figs)?;
    }
    Ok(())
}

/// Writes the sale's pauses, each with the command that ends it.
fn write_pauses(w: &mut dyn Write, id: u64, r: &RedisSide) -> std::io::Result<()> {
    if let Some(p) = &r.paused {
        writeln!(
            w,
            "PAUSED            {p}: run `seckill-reconciler run`, then \
             `seckill-reconciler sale repair {id} --by NAME`"
        )?;
    }
    if let Some(p) = &r.operator_paused {
        writeln!(
            w,
            "PAUSED            by an operator ({p}): `seckill-reconciler sale resume {id} \
             --by NAME`"
        )?;
    }
    Ok(())
}
