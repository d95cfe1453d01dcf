//! Owns the `sale` operator commands: create a sale in MySQL and load it into
//! Redis, load an existing one without ever overwriting live stock, and show
//! MySQL and Redis figures side by side.

use crate::cli::SaleCreate;
use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_common::sale::{load_into_redis, Sale};
use seckill_common::timefmt::format_ms;
use seckill_common::Config;
use std::error::Error;

type Res<T> = Result<T, Box<dyn Error>>;

/// `id, sku, title, price_cents, total_stock, available_stock, starts ms, ends ms`.
type SaleRow = (u64, String, String, u64, u64, i64, i64, i64);

/// Opens a Redis connection with the configured timeouts.
pub fn redis_con(config: &Config) -> Res<redis::Connection> {
    let client = redis::Client::open(config.redis_url.as_str())?;
    let con = client.get_connection_with_timeout(config.redis_timeout)?;
    con.set_read_timeout(Some(config.redis_timeout))?;
    con.set_write_timeout(Some(config.redis_timeout))?;
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

fn order_count(db: &mut mysql::Conn, id: u64) -> Res<u64> {
    let n: Option<u64> = db.exec_first("SELECT COUNT(*) FROM orders WHERE sale_id = ?", (id,))?;
    Ok(n.unwrap_or(0))
}

/// `sale create`: inserts the sale, then loads it into Redis; prints the id.
pub fn create(config: &Config, a: &SaleCreate) -> Res<u8> {
    let mut db = seckill_common::schema::connect(&config.mysql_url, config.mysql_timeout)?;
    // Check Redis first, so an unreachable Redis leaves no orphan sale behind.
    let mut con = redis_con(config)?;
    db.exec_drop(
        "INSERT INTO sales (sku, title, price_cents, total_stock, available_stock, starts_at, ends_at)
         VALUES (?, ?, ?, ?, ?, FROM_UNIXTIME(? / 1000), FROM_UNIXTIME(? / 1000))",
        (
            &a.sku,
            &a.title,
            a.price_cents,
            a.stock,
            a.stock,
            a.starts_at_ms,
            a.ends_at_ms,
        ),
    )?;
    let id = db.last_insert_id();
    let sale = fetch_sale(&mut db, id)?.ok_or("the new sale vanished")?;
    load_into_redis(&mut con, &sale, 0)?;
    eprintln!(
        "created sale {id}: {} units of {} from {} to {}",
        sale.total_stock,
        sale.sku,
        format_ms(sale.starts_at_ms),
        format_ms(sale.ends_at_ms)
    );
    println!("{id}");
    Ok(0)
}

/// `sale load`: puts a MySQL sale into Redis unless Redis holds its stock.
pub fn load(config: &Config, id: u64) -> Res<u8> {
    let mut db = seckill_common::schema::connect(&config.mysql_url, config.mysql_timeout)?;
    let Some(sale) = fetch_sale(&mut db, id)? else {
        eprintln!("seckill-reconciler: no sale {id} in MySQL");
        return Ok(2);
    };
    let ordered = order_count(&mut db, id)?;
    let mut con = redis_con(config)?;
    if load_into_redis(&mut con, &sale, ordered)? {
        println!(
            "loaded sale {id} into Redis with stock {} ({} total, {} already ordered)",
            sale.total_stock.saturating_sub(ordered),
            sale.total_stock,
            ordered
        );
    } else {
        let live: Option<i64> = con.get(SaleKeys::new(id).stock())?;
        println!(
            "sale {id} already live in Redis (stock {}); left unchanged",
            live.unwrap_or(0)
        );
    }
    Ok(0)
}

/// `sale show`: MySQL and Redis figures side by side.
pub fn show(config: &Config, id: u64) -> Res<u8> {
    let mut db = seckill_common::schema::connect(&config.mysql_url, config.mysql_timeout)?;
    let Some(sale) = fetch_sale(&mut db, id)? else {
        eprintln!("seckill-reconciler: no sale {id} in MySQL");
        return Ok(2);
    };
    let orders = order_count(&mut db, id)?;
    let ledger: Option<i64> = db.exec_first(
        "SELECT CAST(COALESCE(-SUM(delta), 0) AS SIGNED) FROM stock_ledger WHERE sale_id = ?",
        (id,),
    )?;
    let mut con = redis_con(config)?;
    let k = SaleKeys::new(id);
    let stock: Option<i64> = con.get(k.stock())?;
    let flows: u64 = con.hlen(k.flow())?;
    let queued: u64 = con.llen(k.queue())?;
    let dead: u64 = con.llen(k.dead_letter())?;
    println!("sale {id}  sku {}  {:?}", sale.sku, sale.title);
    println!(
        "window            {} .. {}",
        format_ms(sale.starts_at_ms),
        format_ms(sale.ends_at_ms)
    );
    println!("                  MySQL        Redis");
    println!(
        "total stock       {:<12} {}",
        sale.total_stock, sale.total_stock
    );
    println!(
        "available/stock   {:<12} {}",
        sale.available_stock,
        stock.map_or_else(|| "(not loaded)".to_string(), |s| s.to_string())
    );
    println!("ledger deductions {:<12} -", ledger.unwrap_or(0));
    println!("orders            {:<12} -", orders);
    println!("reservations      -            {flows}");
    println!("queued messages   -            {queued}");
    println!("dead letters      -            {dead}");
    Ok(0)
}
