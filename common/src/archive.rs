//! Owns the Redis side of archiving an ended sale (`seckill-reconciler sale
//! archive`, `reconciler/src/sale_archive.rs` decides when): removing every
//! key of every bucket of the sale and leaving one tombstone.
//!
//! The **tombstone** is bucket 0's meta hash cut down to `starts_at_ms`,
//! `ends_at_ms`, `total_stock`, `stock_left` (the units the sale ended
//! with unsold: MySQL's `available_stock`, every order final by then) and
//! `archived_at_ms`, about 120 bytes: the gateway's reservation script
//! then still answers a late request `ended` (403 `sale_ended`) and
//! `GET /v1/sales/{id}` still shows the window with state `ended`, the
//! stock it ended with and when it was archived; without it both would say
//! 404 `sale_not_found`. Everything else goes: stock,
//! buyer marks, flow records, statuses, deadlines, released records,
//! queues, every worker's processing list, dead letters and their archive,
//! attempts, reorder marks, transfers (the keys of `keys.rs`), and the
//! sale's id in `seckill:sales`, so workers stop watching its queues. What
//! matters stays in MySQL (orders, ledger, payments) and the review file
//! (the findings' evidence).
//!
//! Order, so that an interruption leaves a state the next attempt finishes
//! and every gateway answers a late buyer 403 `sale_ended` at every step:
//! bucket 0 first, in one script (its keys deleted and the tombstone
//! written together, which drops the `buckets` field, so gateways route
//! every buyer to bucket 0 and its tombstone from then on), then buckets
//! K − 1 .. 1 (each one `MULTI` of `DEL`s, one slot; a buyer a gateway
//! still routes to one by its remembered K reads that bucket's own ended
//! window, or, once it is gone, bucket 0's: `gateway/src/purchase/home.rs`), then
//! `SREM seckill:sales`. (With the buckets removed first, a split sale
//! killed half-way would answer 503 to the removed buckets' buyers until
//! the next `run`.) Each step is idempotent: a repeat deletes nothing more and
//! writes the same tombstone; since the tombstone keeps no bucket count, a
//! repeat learns K from MySQL and from the buckets still present
//! ([`bucket_count`]).

use crate::buckets;
use crate::keys::{SaleKeys, SALES, WORKERS};
use redis::{ConnectionLike, Script};
use std::sync::OnceLock;

/// The meta field of the tombstone that says when the sale was archived
/// (Unix ms).
pub const ARCHIVED_FIELD: &str = "archived_at_ms";

/// The meta field of the tombstone that keeps the units the sale ended
/// with unsold (what `GET /v1/sales/{id}` showed as `stock_remaining` just
/// before the archive). A tombstone written before it existed has none.
pub const STOCK_LEFT_FIELD: &str = "stock_left";

/// Every key of bucket `k` but its meta hash, with the processing lists of
/// the workers `workers` (`seckill:workers`).
pub fn bucket_keys(k: SaleKeys, workers: &[String]) -> Vec<String> {
    let mut v = vec![
        k.stock(),
        k.buyers(),
        k.released_buyers(),
        k.flow(),
        k.status(),
        k.pay_by(),
        k.released(),
        k.queue(),
        k.dead_letter(),
        k.attempts(),
        k.dead_letter_archive(),
        k.reorder_marks(),
        k.stock_added(),
        k.transfers_out(),
        k.transfers_open(),
        k.transfers_in(),
    ];
    v.extend(workers.iter().map(|w| k.processing(w)));
    v
}

/// Order messages of sale `sale_id` still on their way to MySQL: in a
/// bucket's queue or in a worker's processing list (`seckill:workers`).
/// Archiving such a sale would delete reservations no order holds yet
/// (and the reconciler does not report them: they are on their way).
///
/// Errors: Redis failures.
pub fn messages_on_their_way<C: ConnectionLike>(
    con: &mut C,
    sale_id: u64,
) -> redis::RedisResult<u64> {
    let k = buckets::count(con, sale_id)?.unwrap_or(1);
    let workers: Vec<String> = redis::cmd("SMEMBERS").arg(WORKERS).query(con)?;
    let mut n = 0;
    for bk in buckets::all(sale_id, k) {
        n += redis::cmd("LLEN").arg(bk.queue()).query::<u64>(con)?;
        for w in &workers {
            n += redis::cmd("LLEN").arg(bk.processing(w)).query::<u64>(con)?;
        }
    }
    Ok(n)
}

/// `KEYS`: bucket 0's meta, then every other key of bucket 0 (one slot);
/// `ARGV`: starts ms, ends ms, total stock, archived-at ms, stock left.
/// Deletes them all and writes the tombstone; replies 1.
const TOMBSTONE_LUA: &str = r#"
for i = 1, #KEYS do redis.call('DEL', KEYS[i]) end
redis.call('HSET', KEYS[1], 'starts_at_ms', ARGV[1], 'ends_at_ms', ARGV[2],
  'total_stock', ARGV[3], 'archived_at_ms', ARGV[4], 'stock_left', ARGV[5])
return 1
"#;

fn tombstone_script() -> &'static Script {
    static S: OnceLock<Script> = OnceLock::new();
    S.get_or_init(|| Script::new(TOMBSTONE_LUA))
}

/// The window and size the tombstone keeps (from MySQL's `sales` row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tombstone {
    /// Window start, Unix ms.
    pub starts_at_ms: u64,
    /// Window end, Unix ms.
    pub ends_at_ms: u64,
    /// Units the sale had.
    pub total_stock: u64,
    /// Units it ended with unsold (MySQL's `available_stock`).
    pub stock_left: u64,
    /// When it was archived, Unix ms.
    pub archived_at_ms: u64,
}

/// How many buckets to clear for sale `sale_id`: the most of `recorded`
/// (MySQL's `sales.buckets`), bucket 0's `buckets` field (gone once the
/// tombstone is written) and the highest bucket Redis still holds, plus
/// one (`buckets::highest_present`: an archive interrupted after its
/// tombstone left the others; a sale created before migration 5 has no
/// recorded K).
///
/// Errors: Redis failures.
pub fn bucket_count<C: ConnectionLike>(
    con: &mut C,
    sale_id: u64,
    recorded: Option<u32>,
) -> redis::RedisResult<u32> {
    let in_meta = buckets::count(con, sale_id)?.unwrap_or(1);
    let present = buckets::highest_present(con, sale_id)?.map_or(1, |b| b + 1);
    Ok(recorded.unwrap_or(1).max(in_meta).max(present))
}

/// Removes every Redis key of sale `sale_id` (its buckets counted by
/// [`bucket_count`] with `recorded`, MySQL's K) and leaves its tombstone
/// (see the module doc); returns how many buckets were cleared (1 for a
/// sale Redis no longer holds, or one cleared already; a repeat is
/// harmless).
///
/// Errors: Redis failures (the steps done stay done; a repeat finishes).
pub fn remove<C: ConnectionLike>(
    con: &mut C,
    sale_id: u64,
    recorded: Option<u32>,
    t: &Tombstone,
) -> redis::RedisResult<u32> {
    let k = bucket_count(con, sale_id, recorded)?;
    remove_buckets(con, sale_id, k, t)
}

/// [`remove`] of a sale of `k` buckets, whatever bucket 0's meta says.
///
/// Errors: as [`remove`].
pub fn remove_buckets<C: ConnectionLike>(
    con: &mut C,
    sale_id: u64,
    k: u32,
    t: &Tombstone,
) -> redis::RedisResult<u32> {
    let workers: Vec<String> = redis::cmd("SMEMBERS").arg(WORKERS).query(con)?;
    write_tombstone(con, sale_id, &workers, t)?;
    for b in (1..k).rev() {
        clear_bucket(con, SaleKeys::bucket(sale_id, b), &workers)?;
    }
    redis::cmd("SREM").arg(SALES).arg(sale_id).exec(con)?;
    Ok(k)
}

/// The first step of [`remove_buckets`]: bucket 0's keys (with the
/// processing lists of `workers`) deleted and tombstone `t` written, in one
/// script. Public for the tests that stop an archive there.
///
/// Errors: Redis failures.
pub fn write_tombstone<C: ConnectionLike>(
    con: &mut C,
    sale_id: u64,
    workers: &[String],
    t: &Tombstone,
) -> redis::RedisResult<()> {
    let b0 = SaleKeys::new(sale_id);
    let mut inv = tombstone_script().key(b0.meta());
    for key in bucket_keys(b0, workers) {
        inv.key(key);
    }
    inv.arg(t.starts_at_ms)
        .arg(t.ends_at_ms)
        .arg(t.total_stock)
        .arg(t.archived_at_ms)
        .arg(t.stock_left)
        .invoke::<i64>(con)?;
    Ok(())
}

/// Deletes every key of bucket `bk` (a bucket above 0), its meta included,
/// in one `MULTI` (one slot).
///
/// Errors: Redis failures.
fn clear_bucket<C: ConnectionLike>(
    con: &mut C,
    bk: SaleKeys,
    workers: &[String],
) -> redis::RedisResult<()> {
    let mut p = redis::pipe();
    p.atomic();
    p.del(bk.meta()).ignore();
    for key in bucket_keys(bk, workers) {
        p.del(key).ignore();
    }
    p.query::<()>(con)
}
