//! Owns the split of one sale into buckets (`sale create --shards K`): how
//! many a sale has, which bucket a buyer belongs to, each bucket's share of
//! the stock, and loading the buckets into Redis. Moving units between
//! buckets is `transfer.rs`.
//!
//! One Redis runs one script at a time, so a hot sale is split into K
//! buckets, each under its own hash tag (`keys.rs`: bucket 0 is the sale's
//! own `{sale:ID}`, bucket B `{sale:ID:bB}`), which a Redis Cluster puts on
//! different masters. A purchase stays one atomic script on one bucket: the
//! buyer's **home bucket** ([`home_bucket`]), which holds that buyer's mark,
//! flow record and queue message, so a buyer's allowance (one purchase
//! per user, or `L` units: `allowance.rs`) needs no cross-bucket step. A
//! purchase of `N` units takes all `N` from the home bucket; when it holds
//! fewer, units are first moved there from the others (`transfer.rs`), so
//! a purchase is never split over buckets. K = 1 (the default) is exactly the unsplit sale: the
//! same keys, the same scripts, no `buckets` field.
//!
//! K is kept twice: in bucket 0's meta (what gateways and workers route
//! by) and in MySQL's `sales.buckets` ([`recorded`], migration 5), which
//! outlives a Redis that lost the sale: `sale load ID` reloads it with the
//! same K, so every order's home bucket ([`home_bucket`] of its user id)
//! stays where its flow record and mark are, which is how the order
//! lifecycle and `resolve` find an order's bucket from its MySQL row.

use crate::keys::{SaleKeys, SALES};
use crate::sale::Sale;
use mysql::prelude::Queryable;
use redis::{ConnectionLike, Script};
use std::sync::OnceLock;

/// Most buckets a sale may have. A bucket costs a few keys and one step of
/// each sold-out check (`transfer::pull` reads every bucket), and more
/// buckets than masters buy nothing; 64 is far above any cluster here.
pub const MAX_BUCKETS: u32 = 64;

/// The meta field of bucket 0 that holds K (absent: 1).
pub const BUCKETS_FIELD: &str = "buckets";

/// The home bucket of `user_id` in a sale of `buckets` buckets: FNV-1a
/// (64-bit, offset basis 0xcbf29ce484222325, prime 0x100000001b3) of the
/// user id's bytes, modulo `buckets`. Stable across processes, builds and
/// machines (unlike std's randomly seeded hasher), so every gateway sends a
/// buyer to the same bucket; 0 when `buckets` is 0 or 1.
pub fn home_bucket(user_id: &str, buckets: u32) -> u32 {
    if buckets <= 1 {
        return 0;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in user_id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % u64::from(buckets)) as u32
}

/// Bucket `bucket`'s share of `units` split over `buckets` buckets: an even
/// split, the remainder one each to the first buckets (10 over 3: 4, 3, 3).
/// The shares add up to `units`.
pub fn share(units: u64, buckets: u32, bucket: u32) -> u64 {
    let k = u64::from(buckets.max(1));
    units / k + u64::from(u64::from(bucket) < units % k)
}

/// The keys of every bucket of sale `sale_id`, bucket 0 first.
pub fn all(sale_id: u64, buckets: u32) -> Vec<SaleKeys> {
    (0..buckets.max(1))
        .map(|b| SaleKeys::bucket(sale_id, b))
        .collect()
}

/// How many buckets sale `sale_id` has, from bucket 0's meta hash (one
/// `HMGET`): `None` when Redis holds no such sale (no `total_stock`), else
/// the `buckets` field (1 when absent, clamped to 1..=[`MAX_BUCKETS`]).
///
/// Errors: Redis failures, a meta hash of the wrong type.
pub fn count<C: ConnectionLike>(con: &mut C, sale_id: u64) -> redis::RedisResult<Option<u32>> {
    let (total, k): (Option<String>, Option<u32>) = redis::cmd("HMGET")
        .arg(SaleKeys::new(sale_id).meta())
        .arg("total_stock")
        .arg(BUCKETS_FIELD)
        .query(con)?;
    Ok(total.map(|_| k.unwrap_or(1).clamp(1, MAX_BUCKETS)))
}

/// A sale's K, window start and window end (Unix ms), and whether bucket
/// 0 carries a pause mark, as [`count_and_window`] reads them.
pub type CountAndWindow = (u32, Option<u64>, Option<u64>, bool);

/// [`count`] and the sale's window start and end (bucket 0's
/// `starts_at_ms` and `ends_at_ms`, Unix ms; `None` when absent or not a
/// number) and pause marks (the data-loss `paused` or the operator's
/// `operator_paused`) from the same `HMGET`: what a gateway routes by, the
/// start before which it says `sale_not_started` with no buyer, the end
/// its sold-out memory checks first, and when to read the pause of every
/// bucket before a signature check.
///
/// Errors: as [`count`].
pub fn count_and_window<C: ConnectionLike>(
    con: &mut C,
    sale_id: u64,
) -> redis::RedisResult<Option<CountAndWindow>> {
    type Fields = (
        Option<String>,
        Option<u32>,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    );
    let (total, k, starts, ends, paused, operator): Fields = redis::cmd("HMGET")
        .arg(SaleKeys::new(sale_id).meta())
        .arg("total_stock")
        .arg(BUCKETS_FIELD)
        .arg("starts_at_ms")
        .arg("ends_at_ms")
        .arg(crate::data_loss::PAUSED_FIELD)
        .arg(crate::sale_admin::OPERATOR_PAUSED)
        .query(con)?;
    Ok(total.map(|_| {
        (
            k.unwrap_or(1).clamp(1, MAX_BUCKETS),
            starts.and_then(|e| e.parse().ok()),
            ends.and_then(|e| e.parse().ok()),
            paused.is_some() || operator.is_some(),
        )
    }))
}

/// The K MySQL records for sale `sale_id` (`sales.buckets`): `None` when
/// none is recorded (a sale created before migration 5) or MySQL has no
/// such sale.
///
/// Errors: MySQL failures.
pub fn recorded<Q: Queryable>(db: &mut Q, sale_id: u64) -> Result<Option<u32>, mysql::Error> {
    let k: Option<Option<u32>> =
        db.exec_first("SELECT buckets FROM sales WHERE id = ?", (sale_id,))?;
    Ok(k.flatten())
}

/// Whether any bucket other than bucket 0 of `sale_id` is in Redis (its
/// meta or stock): the sale was split, whatever bucket 0 says (bucket 0
/// may be the one Redis lost). See [`highest_present`].
///
/// Errors: Redis failures.
pub fn split_elsewhere<C: ConnectionLike>(con: &mut C, sale_id: u64) -> redis::RedisResult<bool> {
    Ok(highest_present(con, sale_id)?.is_some())
}

/// The highest bucket above 0 of `sale_id` that Redis holds (its meta or
/// stock), `None` when none: reads buckets [`MAX_BUCKETS`] − 1 down to 1
/// (two `EXISTS` each, until one is found); for the operator's commands,
/// not a purchase.
///
/// Errors: Redis failures.
pub fn highest_present<C: ConnectionLike>(
    con: &mut C,
    sale_id: u64,
) -> redis::RedisResult<Option<u32>> {
    for b in (1..MAX_BUCKETS).rev() {
        let k = SaleKeys::bucket(sale_id, b);
        let n: u32 = redis::cmd("EXISTS").arg(k.meta()).query(con)?;
        let m: u32 = redis::cmd("EXISTS").arg(k.stock()).query(con)?;
        if n + m > 0 {
            return Ok(Some(b));
        }
    }
    Ok(None)
}

/// The bucket of sale `sale_id` whose hash `hash` (e.g. `SaleKeys::flow`)
/// holds field `rid`: one `HMGET` of bucket 0's meta for K ([`count`], 1
/// when Redis does not hold the sale), then one `HEXISTS` per bucket, bucket
/// 0 first; `None` when none does. What the operator's commands use to find
/// a reservation's bucket when MySQL holds no order for it (for an order,
/// its buyer's home bucket: `lifecycle::order_keys`).
///
/// Errors: Redis failures.
pub fn holding<C: ConnectionLike>(
    con: &mut C,
    sale_id: u64,
    rid: &str,
    hash: impl Fn(&SaleKeys) -> String,
) -> redis::RedisResult<Option<SaleKeys>> {
    for k in all(sale_id, count(con, sale_id)?.unwrap_or(1)) {
        let held: bool = redis::cmd("HEXISTS").arg(hash(&k)).arg(rid).query(con)?;
        if held {
            return Ok(Some(k));
        }
    }
    Ok(None)
}

/// The keys of every bucket of each sale in `sales` (one [`count`] each;
/// a sale Redis does not hold counts as one bucket), in order.
///
/// Errors: Redis failures.
pub fn expand<C: ConnectionLike>(con: &mut C, sales: &[u64]) -> redis::RedisResult<Vec<SaleKeys>> {
    let mut out = Vec::with_capacity(sales.len());
    for &s in sales {
        out.extend(all(s, count(con, s)?.unwrap_or(1)));
    }
    Ok(out)
}

/// `KEYS`: a bucket's meta and stock (nothing outside the bucket's slot:
/// the sales set is added to apart, as [`crate::sale::load_into_redis`]
/// does); `ARGV`: sale id, the bucket's total (its share), starts ms, ends
/// ms, stock to put on sale, K (written only into bucket 0's meta: `0`
/// writes none), the sale's `L` and `Q` (written into every bucket's meta
/// as `max_per_buyer` and `max_per_purchase` when `L` is above 1: the
/// units script reads them from the buyer's home bucket). Replies 1 when
/// loaded, 0 when the stock key already existed (nothing changed).
const LOAD_BUCKET_LUA: &str = concat!(
    crate::lua_expect_types!(),
    r#"
local bad = expect_types({KEYS[1], 'hash', KEYS[2], 'string'})
if bad then return bad end
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'total_stock', ARGV[2], 'share', ARGV[2],
  'starts_at_ms', ARGV[3], 'ends_at_ms', ARGV[4])
if ARGV[6] ~= '0' then redis.call('HSET', KEYS[1], 'buckets', ARGV[6]) end
if ARGV[7] ~= '1' then
  redis.call('HSET', KEYS[1], 'max_per_buyer', ARGV[7], 'max_per_purchase', ARGV[8])
end
redis.call('SET', KEYS[2], ARGV[5])
return 1
"#
);

fn load_bucket_script() -> &'static Script {
    static S: OnceLock<Script> = OnceLock::new();
    S.get_or_init(|| Script::new(LOAD_BUCKET_LUA))
}

/// Puts `sale` on sale in Redis split over `buckets` buckets, unless Redis
/// already holds its bucket 0 (then nothing is changed and the result is
/// `false`). With one bucket this is exactly [`crate::sale::load_into_redis`].
///
/// Each bucket gets [`share`] of `total_stock` as its `total_stock` (and
/// `share`, what the reconciler's books start from) and its share of
/// `total_stock − already_ordered` as its stock. Buckets K−1 .. 1 are loaded
/// first, bucket 0 (with `buckets`) last, then the sale id is added to
/// `seckill:sales` (a command of its own): until bucket 0 is there no gateway routes a purchase to the sale,
/// and a bucket already present from an interrupted load is left as it is.
///
/// Errors: Redis failures; a key of the wrong type (error reply, that
/// bucket unchanged).
pub fn load_into_redis<C: ConnectionLike>(
    con: &mut C,
    sale: &Sale,
    buckets: u32,
    already_ordered: u64,
) -> redis::RedisResult<bool> {
    load_limited_into_redis(
        con,
        sale,
        buckets,
        already_ordered,
        crate::sale::Limits::ONE,
    )
}

/// [`load_into_redis`] of a sale with the given `limits`, written into
/// every bucket's meta when `L` is above 1 (a sale of one bucket:
/// [`crate::sale::load_limited_into_redis`]). A buyer's allowance is one
/// bucket's job: their home bucket holds their buyers-hash entry, so every
/// purchase of theirs is checked against it there.
///
/// Errors: as [`load_into_redis`].
pub fn load_limited_into_redis<C: ConnectionLike>(
    con: &mut C,
    sale: &Sale,
    buckets: u32,
    already_ordered: u64,
    limits: crate::sale::Limits,
) -> redis::RedisResult<bool> {
    if buckets <= 1 {
        return crate::sale::load_limited_into_redis(con, sale, already_ordered, limits);
    }
    if count(con, sale.id)?.is_some() {
        return Ok(false);
    }
    let on_sale = sale.total_stock.saturating_sub(already_ordered);
    // A read first, so that a sales set of the wrong type is refused before
    // anything is written (as the unsplit load does).
    redis::cmd("SISMEMBER").arg(SALES).arg(sale.id).exec(con)?;
    let mut loaded = false;
    for b in (0..buckets).rev() {
        let k = SaleKeys::bucket(sale.id, b);
        let mut inv = load_bucket_script().prepare_invoke();
        inv.key(k.meta()).key(k.stock());
        let n: i64 = inv
            .arg(sale.id)
            .arg(share(sale.total_stock, buckets, b))
            .arg(sale.starts_at_ms)
            .arg(sale.ends_at_ms)
            .arg(share(on_sale, buckets, b))
            .arg(if b == 0 { buckets } else { 0 })
            .arg(limits.max_per_buyer)
            .arg(limits.max_per_purchase)
            .invoke(con)?;
        loaded = n == 1;
    }
    // Apart from the buckets' scripts (another slot on a cluster); safe to
    // redo, and a load interrupted before it is completed by the next.
    redis::cmd("SADD").arg(SALES).arg(sale.id).exec(con)?;
    Ok(loaded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up_and_differ_by_at_most_one() {
        for (units, k) in [(10, 3), (300, 3), (1, 4), (0, 2), (7, 1)] {
            let s: Vec<u64> = (0..k).map(|b| share(units, k, b)).collect();
            assert_eq!(s.iter().sum::<u64>(), units, "{units} over {k}");
            assert!(s.iter().max().unwrap() - s.iter().min().unwrap() <= 1);
        }
        assert_eq!(
            (0..3).map(|b| share(10, 3, b)).collect::<Vec<_>>(),
            [4, 3, 3]
        );
    }

    #[test]
    fn the_home_bucket_is_fnv1a_and_stable() {
        // FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c (the published test vector).
        assert_eq!(
            home_bucket("a", 1000),
            (0xaf63_dc4c_8601_ec8c_u64 % 1000) as u32
        );
        assert_eq!(home_bucket("anyone", 1), 0);
        let spread: Vec<usize> = (0..3)
            .map(|b| {
                (0..3000)
                    .filter(|i| home_bucket(&format!("u{i}"), 3) == b)
                    .count()
            })
            .collect();
        assert!(spread.iter().all(|&n| n > 800), "{spread:?}");
    }
}
