//! Owns a sale's shape and how it is put into Redis: the load script that
//! never overwrites a live stock counter.
//!
//! Loading is the one place where stock enters Redis. Existing systems
//! reload stock from the database on every restart and so put sold units
//! back on sale; here a load writes only when the sale's stock key is absent,
//! and then sets it to `total_stock - units already ordered in MySQL`.

use crate::keys::{SaleKeys, SALES};
use redis::{ConnectionLike, Script};
use std::sync::OnceLock;

/// A sale as stored in MySQL's `sales` table (times as Unix ms, UTC).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sale {
    /// `sales.id`.
    pub id: u64,
    /// Stock-keeping unit of the item on sale.
    pub sku: String,
    /// Human-readable title.
    pub title: String,
    /// Price in integer cents.
    pub price_cents: u64,
    /// Units offered in total.
    pub total_stock: u64,
    /// Units not yet deducted in MySQL.
    pub available_stock: i64,
    /// Window start, Unix ms (inclusive).
    pub starts_at_ms: u64,
    /// Window end, Unix ms (exclusive).
    pub ends_at_ms: u64,
}

/// A sale's limits on units (`allowance.rs`): MySQL's
/// `sales.per_user_limit` and `sales.max_per_purchase`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `L`: the most units one buyer holds at once (1 ..= `MAX_UNITS`).
    pub max_per_buyer: u32,
    /// `Q`: the most units one purchase takes (1 ..= `L`).
    pub max_per_purchase: u32,
}

impl Limits {
    /// One unit per buyer: every sale's limits unless it says otherwise.
    pub const ONE: Limits = Limits {
        max_per_buyer: 1,
        max_per_purchase: 1,
    };

    /// Sale `sale_id`'s limits as MySQL holds them; [`Limits::ONE`] when
    /// there is no such sale.
    ///
    /// Errors: MySQL failures.
    pub fn read<Q: mysql::prelude::Queryable>(
        db: &mut Q,
        sale_id: u64,
    ) -> Result<Limits, mysql::Error> {
        let row: Option<(u32, u32)> = db.exec_first(
            "SELECT per_user_limit, max_per_purchase FROM sales WHERE id = ?",
            (sale_id,),
        )?;
        Ok(row.map_or(Limits::ONE, |(l, q)| Limits {
            max_per_buyer: l,
            max_per_purchase: q,
        }))
    }
}

/// `KEYS`: meta, stock (one sale's slot; the global sales set is added to
/// apart, see [`load_into_redis`]); `ARGV`: sale id, total stock, starts
/// ms, ends ms, stock to put on sale, and optionally the sale's `L` and `Q`
/// (written into the meta as `max_per_buyer` and `max_per_purchase` when
/// `L` is above 1; a sale of one unit per buyer has neither). Replies 1 when loaded, 0 when the
/// stock key already existed (nothing changed); an error reply, with
/// nothing changed, when one of the keys holds the wrong type (`lua.rs`).
pub const LOAD_LUA: &str = concat!(
    crate::lua_expect_types!(),
    r#"
local bad = expect_types({KEYS[1], 'hash', KEYS[2], 'string'})
if bad then return bad end
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'total_stock', ARGV[2], 'starts_at_ms', ARGV[3], 'ends_at_ms', ARGV[4])
if ARGV[6] and ARGV[6] ~= '1' then
  redis.call('HSET', KEYS[1], 'max_per_buyer', ARGV[6], 'max_per_purchase', ARGV[7])
end
redis.call('SET', KEYS[2], ARGV[5])
return 1
"#
);
fn load_script() -> &'static Script {
    static S: OnceLock<Script> = OnceLock::new();
    S.get_or_init(|| Script::new(LOAD_LUA))
}

/// Puts `sale` on sale in Redis unless Redis already holds its stock counter.
/// `already_ordered` is the units MySQL's orders of the sale hold; the loaded
/// stock is `total_stock - already_ordered` (never below 0).
///
/// A sales set of the wrong type is refused first (nothing written); then
/// the sale's keys, then its id into `seckill:sales` (every time, so a
/// load interrupted between the two is completed by the next): on a
/// Redis Cluster the global set lives in another slot than the sale's keys,
/// and no script may touch both.
///
/// Returns `true` when loaded, `false` when live state was left untouched.
pub fn load_into_redis<C: ConnectionLike>(
    con: &mut C,
    sale: &Sale,
    already_ordered: u64,
) -> redis::RedisResult<bool> {
    load_limited_into_redis(con, sale, already_ordered, Limits::ONE)
}

/// [`load_into_redis`] of a sale with the given `limits` (written into its
/// meta when `L` is above 1); `already_ordered` counts units.
///
/// Errors: as [`load_into_redis`].
pub fn load_limited_into_redis<C: ConnectionLike>(
    con: &mut C,
    sale: &Sale,
    already_ordered: u64,
    limits: Limits,
) -> redis::RedisResult<bool> {
    let k = SaleKeys::new(sale.id);
    let stock = sale.total_stock.saturating_sub(already_ordered);
    // A read first, so that a sales set of the wrong type is refused
    // (Redis's own WRONGTYPE) before anything is written.
    redis::cmd("SISMEMBER").arg(SALES).arg(sale.id).exec(con)?;
    let loaded: i64 = load_script()
        .key(k.meta())
        .key(k.stock())
        .arg(sale.id)
        .arg(sale.total_stock)
        .arg(sale.starts_at_ms)
        .arg(sale.ends_at_ms)
        .arg(stock)
        .arg(limits.max_per_buyer)
        .arg(limits.max_per_purchase)
        .invoke(con)?;
    redis::cmd("SADD").arg(SALES).arg(sale.id).exec(con)?;
    Ok(loaded == 1)
}
