//! Owns `sale create`: insert the sale in MySQL, then load it into Redis;
//! refused (and its MySQL row taken back) when Redis already holds a live
//! sale with the new id.

use crate::cli::{
    err, parse_u64, shards, Command, Opts, UsageError, MAX_AHEAD_MS, MAX_PAYMENT_WINDOW_MS,
    MAX_PRICE_CENTS, MAX_STOCK, MAX_WINDOW_MS,
};
use crate::config::Config;
use crate::connect;
use crate::error::RunError;
use crate::output::outln;
use crate::redis_read::read_meta;
use crate::sale_read::fetch_sale;
use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::allowance::MAX_UNITS;
use seckill_common::keys::SaleKeys;
use seckill_common::redis_target::Con;
use seckill_common::sale::Limits;
use seckill_common::timefmt::format_ms;
use seckill_common::timefmt::parse_time_ms;
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
                            payment_window_ms, rebuy_after_release, buckets,
                            per_user_limit, max_per_purchase)
         VALUES (?, ?, ?, ?, ?, FROM_UNIXTIME(? / 1000), FROM_UNIXTIME(? / 1000), ?, ?, ?, ?, ?)",
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
            a.limits.max_per_buyer,
            a.limits.max_per_purchase,
        ),
    )?;
    let id = db.last_insert_id();
    let sale = fetch_sale(&mut db, id)?
        .ok_or_else(|| RunError::NoSuch(format!("the new sale {id} vanished from MySQL")))?;
    let loaded = match seckill_common::buckets::load_limited_into_redis(
        &mut con, &sale, a.shards, 0, a.limits,
    ) {
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
        "created sale {id}: {} unit{} of {} from {} to {}{}{}{}",
        sale.total_stock,
        if sale.total_stock == 1 { "" } else { "s" },
        sale.sku,
        format_ms(sale.starts_at_ms),
        format_ms(sale.ends_at_ms),
        match a.shards {
            1 => String::new(),
            k => format!(", in {k} buckets"),
        },
        match a.limits.max_per_buyer {
            1 => String::new(),
            l => format!(
                ", up to {l} units per buyer, {} per purchase",
                a.limits.max_per_purchase
            ),
        },
        a.payment_window_ms.map_or(String::new(), |w| format!(
            ", payment window {}",
            seckill_common::config::short_duration(std::time::Duration::from_millis(w))
        ))
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

/// Arguments of `sale create`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaleCreate {
    /// 1-64 characters of `A-Z a-z 0-9 _ . -`.
    pub sku: String,
    /// 1 ..= [`MAX_STOCK`] units.
    pub stock: u64,
    /// Window start, Unix ms.
    pub starts_at_ms: u64,
    /// Window end, Unix ms; after the start, at most [`MAX_WINDOW_MS`] later.
    pub ends_at_ms: u64,
    /// At most 255 characters.
    pub title: String,
    /// At most [`MAX_PRICE_CENTS`].
    pub price_cents: u64,
    /// `--payment-window`, ms (1 ms ..= [`MAX_PAYMENT_WINDOW_MS`]): orders
    /// are `pending_payment` until reservation time + this. `None` (the
    /// default): orders are final (`confirmed`) at creation.
    pub payment_window_ms: Option<u64>,
    /// `--rebuy-after-release` (only with a window): the buyer of an order
    /// that expired or was cancelled may buy again.
    pub rebuy_after_release: bool,
    /// `--shards K`: buckets (1 ..= `buckets::MAX_BUCKETS`, default 1);
    /// any of them with or without a payment window (an order's units go
    /// back to its buyer's home bucket).
    pub shards: u32,
    /// `--max-per-buyer L` (1 ..= `MAX_UNITS`, default 1) and
    /// `--max-per-purchase Q` (1 ..= `L`, default `L`), with any number of
    /// buckets (a buyer's units are counted in their home bucket).
    pub limits: Limits,
}

/// `sale create --sku --stock --starts-at --ends-at [--title] [--price-cents]`.
pub fn parse(opts: &mut Opts, now_ms: u64) -> Result<Command, UsageError> {
    let sku = opts
        .take("sku")
        .ok_or_else(|| UsageError::new("--sku is required"))?;
    let stock = opts
        .take("stock")
        .ok_or_else(|| UsageError::new("--stock is required"))?;
    let starts = opts
        .take("starts-at")
        .ok_or_else(|| UsageError::new("--starts-at is required"))?;
    let ends = opts
        .take("ends-at")
        .ok_or_else(|| UsageError::new("--ends-at is required"))?;
    let title = opts.take("title").unwrap_or_default();
    let price = opts.take("price-cents").unwrap_or_else(|| "0".into());
    if !seckill_common::is_valid_token(&sku) {
        return err(format!(
            "--sku {sku:?}: expected {}",
            seckill_common::TOKEN_RULE
        ));
    }
    let stock: u64 = stock
        .parse()
        .ok()
        .filter(|n| (1..=MAX_STOCK).contains(n))
        .ok_or_else(|| {
            UsageError::new(format!(
                "--stock {stock:?}: expected an integer from 1 to {MAX_STOCK}"
            ))
        })?;
    let starts_at_ms = parse_time_ms(&starts, now_ms)
        .map_err(|e| UsageError::new(format!("--starts-at {starts:?}: {e}")))?;
    let ends_at_ms = parse_time_ms(&ends, now_ms)
        .map_err(|e| UsageError::new(format!("--ends-at {ends:?}: {e}")))?;
    for (name, given, ms) in [
        ("--starts-at", &starts, starts_at_ms),
        ("--ends-at", &ends, ends_at_ms),
    ] {
        if ms > now_ms.saturating_add(MAX_AHEAD_MS) {
            return err(format!("{name} {given:?}: more than 10 years ahead"));
        }
    }
    if ends_at_ms <= starts_at_ms {
        return err("--ends-at must be after --starts-at");
    }
    if ends_at_ms - starts_at_ms > MAX_WINDOW_MS {
        return err("the sale window is longer than 366 days");
    }
    if ends_at_ms <= now_ms {
        return err("--ends-at is in the past: the sale would never open");
    }
    if title.chars().count() > 255 || title.chars().any(char::is_control) {
        return err("--title: at most 255 characters, no control characters");
    }
    let price_cents = parse_u64(&price, "--price-cents")?;
    if price_cents > MAX_PRICE_CENTS {
        return err(format!("--price-cents: at most {MAX_PRICE_CENTS}"));
    }
    let payment_window_ms = match opts.take("payment-window") {
        None => None,
        Some(w) => Some(
            humantime::parse_duration(&w)
                .ok()
                .map(|d| d.as_millis() as u64)
                .filter(|ms| (1..=MAX_PAYMENT_WINDOW_MS).contains(ms))
                .ok_or_else(|| {
                    UsageError::new(format!(
                        "--payment-window {w:?}: expected a duration from 1ms to 7d (15m, 30s)"
                    ))
                })?,
        ),
    };
    let rebuy_after_release = opts.take("rebuy-after-release").is_some();
    if rebuy_after_release && payment_window_ms.is_none() {
        return err("--rebuy-after-release needs --payment-window");
    }
    let shards = shards(opts)?;
    let limits = limits(opts)?;
    Ok(Command::SaleCreate(SaleCreate {
        sku,
        stock,
        starts_at_ms,
        ends_at_ms,
        title,
        price_cents,
        payment_window_ms,
        rebuy_after_release,
        shards,
        limits,
    }))
}

/// `--max-per-buyer L --max-per-purchase Q` (defaults 1 and `L`).
fn limits(opts: &mut Opts) -> Result<Limits, UsageError> {
    let unit = |name: &str, v: Option<String>, max: u32| -> Result<Option<u32>, UsageError> {
        v.map(|v| {
            v.parse()
                .ok()
                .filter(|n| (1..=max).contains(n))
                .ok_or_else(|| {
                    UsageError::new(format!(
                        "--{name} {v:?}: expected an integer from 1 to {max}"
                    ))
                })
        })
        .transpose()
    };
    let l = unit("max-per-buyer", opts.take("max-per-buyer"), MAX_UNITS)?.unwrap_or(1);
    let q = match unit("max-per-purchase", opts.take("max-per-purchase"), MAX_UNITS)? {
        Some(q) if q > l => {
            return err(format!(
                "--max-per-purchase {q} is above --max-per-buyer {l}: one purchase cannot \
                 take more than a buyer may hold"
            ))
        }
        Some(q) => q,
        None => l,
    };
    Ok(Limits {
        max_per_buyer: l,
        max_per_purchase: q,
    })
}
