//! Owns what the reconciler reads from Redis: the sales and workers Redis
//! knows (`SSCAN`), a sale's totals in one atomic `MULTI` (stock counter,
//! number of flow records, Redis's clock; a sale of several units per
//! buyer, or each bucket of such a split sale, sums its flow records'
//! units by `HSCAN` between two such reads),
//! the flow records by `HSCAN` in
//! chunks, and lists (queue, processing lists, dead-letter list) by `LRANGE`
//! in chunks. Never `KEYS`, never a whole hash or list in one reply.

use redis::Value;
use seckill_common::dead_letter::DeadLetter;
use seckill_common::keys::SaleKeys;
use seckill_common::redis_target::Con;
use std::collections::HashMap;

/// Fields asked for per `HSCAN` call (a hint to Redis, not a limit).
pub const HSCAN_COUNT: usize = 200;
/// Elements per `LRANGE` call.
pub const LIST_CHUNK: isize = 1000;

/// A sale's Redis totals at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedisTotals {
    /// The stock counter; `None` when the sale is not loaded.
    pub stock: Option<i64>,
    /// Units reserved and not released: `HLEN` of the flow records (a
    /// sale of one unit per buyer), or the sum of their quantities.
    pub reservations: i64,
    /// Redis's clock (`TIME`), Unix ms: the clock of `reserved_at_ms`.
    pub now_ms: u64,
    /// A sale split over buckets whose totals could not be read at one
    /// instant (`bucket_read::totals`): `stock` and `reservations` are not
    /// to be judged.
    pub unsettled: bool,
}

/// Every member of a set, by `SSCAN`.
pub fn set_members(con: &mut Con, key: &str) -> redis::RedisResult<Vec<String>> {
    let mut out = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, chunk): (u64, Vec<String>) = redis::cmd("SSCAN")
            .arg(key)
            .arg(cursor)
            .arg("COUNT")
            .arg(500)
            .query(con)?;
        out.extend(chunk);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// How many times [`unit_totals`] reads a sale of several units per buyer
/// before it gives up for this run (its totals then `unsettled`).
pub const UNIT_TRIES: usize = 3;

/// The stock counter, the units reserved (the number of flow records, or
/// for a sale of several units per buyer the sum of their quantities,
/// [`unit_totals`]) and the time, read at one instant so that `stock +
/// reservations` is exact even while buyers reserve.
pub fn totals(con: &mut Con, sale_id: u64) -> redis::RedisResult<RedisTotals> {
    let k = SaleKeys::new(sale_id);
    if sells_units(con, &k)? {
        return unit_totals(con, &k);
    }
    let (stock, reservations, time): (Option<i64>, i64, (u64, u64)) = redis::pipe()
        .atomic()
        .get(k.stock())
        .hlen(k.flow())
        .cmd("TIME")
        .query(con)?;
    Ok(RedisTotals {
        stock,
        reservations,
        now_ms: time.0 * 1000 + time.1 / 1000,
        unsettled: false,
    })
}

/// Whether the sale whose bucket 0 is `k` sells more than one unit per
/// buyer (its meta `max_per_buyer` above 1; every bucket's meta says the
/// same).
///
/// Errors: Redis failures.
pub fn sells_units(con: &mut Con, k: &SaleKeys) -> redis::RedisResult<bool> {
    let limit: Option<String> = redis::cmd("HGET")
        .arg(k.meta())
        .arg(seckill_common::allowance::MAX_PER_BUYER_FIELD)
        .query(con)?;
    Ok(limit.and_then(|l| l.parse::<u32>().ok()).unwrap_or(1) > 1)
}

/// One bucket (or one-bucket sale) of several units per buyer at one
/// instant ([`bucket_units`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketUnits {
    /// Its stock counter (`None`: not loaded).
    pub stock: Option<i64>,
    /// The units of its flow records.
    pub units: i64,
    /// Its meta `total_stock` (`None`: absent or not a number).
    pub total_stock: Option<i64>,
    /// Redis's clock at the first read, Unix ms.
    pub now_ms: u64,
    /// Whether the stock, `releases` and `total_stock` moved during
    /// every one of [`UNIT_TRIES`] reads (the figures are then the last
    /// read's, not of one instant).
    pub unsettled: bool,
}

/// The units of bucket `k`'s flow records summed by `HSCAN` (never one
/// call that holds Redis for all of them), bracketed by two atomic reads
/// of the stock counter and the meta fields `releases` and
/// `total_stock`. Every reservation lowers the stock, every release
/// raises `releases` and every transfer step moves `total_stock`, so when
/// both reads agree no flow record came or went between them and the
/// figures are exact at that instant. A bucket that kept moving for
/// [`UNIT_TRIES`] reads is `unsettled`: judged by a later run.
///
/// Errors: Redis failures.
pub fn bucket_units(con: &mut Con, k: &SaleKeys) -> redis::RedisResult<BucketUnits> {
    type Marks = (Option<i64>, Option<String>, Option<String>);
    let marks = |con: &mut Con| -> redis::RedisResult<(Marks, (u64, u64))> {
        let (stock, releases, total, time) = redis::pipe()
            .atomic()
            .get(k.stock())
            .hget(k.meta(), "releases")
            .hget(k.meta(), "total_stock")
            .cmd("TIME")
            .query(con)?;
        Ok(((stock, releases, total), time))
    };
    let mut last = None;
    for _ in 0..UNIT_TRIES {
        let (before, time) = marks(con)?;
        let mut seen: std::collections::HashSet<u128> = std::collections::HashSet::new();
        let mut units = 0i64;
        scan_hash(
            con,
            &k.flow(),
            |field, value| {
                // `HSCAN` may return an entry twice: count it once.
                if let Some(id) = crate::mysql_read::rid_to_u128(field) {
                    if !seen.insert(id) {
                        return;
                    }
                }
                units += seckill_common::message::OrderMessage::parse(value)
                    .map_or(1, |m| i64::from(m.quantity));
            },
            || Ok::<(), redis::RedisError>(()),
        )?;
        let (after, _) = marks(con)?;
        let t = BucketUnits {
            stock: before.0,
            units,
            total_stock: before.2.as_deref().and_then(|t| t.parse().ok()),
            now_ms: time.0 * 1000 + time.1 / 1000,
            unsettled: before != after,
        };
        if !t.unsettled {
            return Ok(t);
        }
        last = Some(t);
    }
    Ok(last.unwrap_or(BucketUnits {
        stock: None,
        units: 0,
        total_stock: None,
        now_ms: 0,
        unsettled: true,
    }))
}

/// The totals of a one-bucket sale of several units per buyer
/// ([`bucket_units`] of its keys).
fn unit_totals(con: &mut Con, k: &SaleKeys) -> redis::RedisResult<RedisTotals> {
    let u = bucket_units(con, k)?;
    Ok(RedisTotals {
        stock: u.stock,
        reservations: u.units,
        now_ms: u.now_ms,
        unsettled: u.unsettled,
    })
}

/// Calls `f(field, value)` for every entry of hash `key`, `HSCAN`ning
/// [`HSCAN_COUNT`] at a time, and `tick()` after every chunk (to keep the run
/// lock and to stop on a signal; an error from it ends the scan). An entry
/// may be seen twice (Redis's `HSCAN` guarantee); every entry present for the
/// whole scan is seen at least once.
pub fn scan_hash<E: From<redis::RedisError>>(
    con: &mut Con,
    key: &str,
    mut f: impl FnMut(&[u8], &[u8]),
    mut tick: impl FnMut() -> Result<(), E>,
) -> Result<(), E> {
    let mut cursor: u64 = 0;
    loop {
        let reply: Value = redis::cmd("HSCAN")
            .arg(key)
            .arg(cursor)
            .arg("COUNT")
            .arg(HSCAN_COUNT)
            .query(con)?;
        let (next, items) = split_scan_reply(reply)?;
        let mut it = items.iter();
        while let (Some(field), Some(value)) = (it.next(), it.next()) {
            if let (Value::BulkString(k), Value::BulkString(v)) = (field, value) {
                f(k, v);
            }
        }
        tick()?;
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// The units the order messages of hash `key` hold (a flow-record hash,
/// or the `released` hash): the sum of their quantities (1 for a value
/// that does not parse), each field counted once, by [`scan_hash`].
pub fn hash_units(con: &mut Con, key: &str) -> redis::RedisResult<u64> {
    let mut seen: std::collections::HashSet<Vec<u8>> = std::collections::HashSet::new();
    let mut units = 0u64;
    scan_hash(
        con,
        key,
        |field, value| {
            if seen.insert(field.to_vec()) {
                units += seckill_common::message::OrderMessage::parse(value)
                    .map_or(1, |m| u64::from(m.quantity));
            }
        },
        || Ok::<(), redis::RedisError>(()),
    )?;
    Ok(units)
}

/// Every entry of hash `key` (lossy UTF-8), by [`scan_hash`].
pub fn hash_entries(
    con: &mut Con,
    key: &str,
) -> redis::RedisResult<std::collections::HashMap<String, String>> {
    let mut out = std::collections::HashMap::new();
    scan_hash(
        con,
        key,
        |f, v| {
            out.insert(
                String::from_utf8_lossy(f).into_owned(),
                String::from_utf8_lossy(v).into_owned(),
            );
        },
        || Ok::<(), redis::RedisError>(()),
    )?;
    Ok(out)
}

fn split_scan_reply(reply: Value) -> redis::RedisResult<(u64, Vec<Value>)> {
    let bad = || {
        redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "unexpected HSCAN reply",
        ))
    };
    let Value::Array(mut parts) = reply else {
        return Err(bad());
    };
    if parts.len() != 2 {
        return Err(bad());
    }
    let items = match parts.pop() {
        Some(Value::Array(items)) => items,
        _ => return Err(bad()),
    };
    let next: u64 = match parts.pop() {
        Some(Value::BulkString(c)) => std::str::from_utf8(&c)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(bad)?,
        _ => return Err(bad()),
    };
    Ok((next, items))
}

/// Calls `f(element)` for every element of list `key`, [`LIST_CHUNK`] at a
/// time from the head. Elements pushed meanwhile may be seen twice; an
/// element moved to another list meanwhile may be missed here (read the
/// queue before the processing lists, so a moving message is seen in one).
pub fn for_each_in_list(
    con: &mut Con,
    key: &str,
    mut f: impl FnMut(&[u8]),
) -> redis::RedisResult<()> {
    let mut start: isize = 0;
    loop {
        let chunk: Vec<Vec<u8>> = redis::cmd("LRANGE")
            .arg(key)
            .arg(start)
            .arg(start + LIST_CHUNK - 1)
            .query(con)?;
        for e in &chunk {
            f(e);
        }
        if (chunk.len() as isize) < LIST_CHUNK {
            return Ok(());
        }
        start += LIST_CHUNK;
    }
}

/// For each of `fields`, the value of hash `key` (`None` when absent), by
/// `HMGET` in chunks.
pub fn hash_values(
    con: &mut Con,
    key: &str,
    fields: &[String],
) -> redis::RedisResult<Vec<Option<String>>> {
    let mut out = Vec::with_capacity(fields.len());
    for chunk in fields.chunks(500) {
        let vals: Vec<Option<String>> = redis::cmd("HMGET").arg(key).arg(chunk).query(con)?;
        out.extend(vals);
    }
    Ok(out)
}

/// A sale's dead-letter list as read.
#[derive(Debug, Default)]
pub struct DeadLetters {
    /// The entries that parse as [`DeadLetter`], head first.
    pub entries: Vec<DeadLetter>,
    /// Anything else pushed onto the list (lossy UTF-8).
    pub foreign: Vec<String>,
}

/// Reads the dead-letter list of `sale_id` ([`LIST_CHUNK`] entries at a
/// time).
pub fn dead_letters(con: &mut Con, sale_id: u64) -> redis::RedisResult<DeadLetters> {
    let mut out = DeadLetters::default();
    dead_letters_into(con, SaleKeys::new(sale_id), &mut out)?;
    Ok(out)
}

/// Reads the payment queue's dead-letter list (`seckill:{payments}:dlq`),
/// raw entries head first ([`LIST_CHUNK`] at a time).
pub fn payment_dead_letters(con: &mut Con) -> redis::RedisResult<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for_each_in_list(con, seckill_common::payment::DEAD_LETTERS, |raw| {
        out.push(raw.to_vec())
    })?;
    Ok(out)
}

/// Adds the dead-letter list of bucket `k` to `out`.
pub fn dead_letters_into(
    con: &mut Con,
    k: SaleKeys,
    out: &mut DeadLetters,
) -> redis::RedisResult<()> {
    for_each_in_list(con, &k.dead_letter(), |raw| match DeadLetter::parse(raw) {
        Some(d) => out.entries.push(d),
        None => out.foreign.push(String::from_utf8_lossy(raw).into_owned()),
    })
}

/// The reservation id inside a queued order message, without a full parse
/// (the reservation script writes it first after the version).
pub fn message_rid(raw: &[u8]) -> Option<&[u8]> {
    const TAG: &[u8] = b"\"reservation_id\":\"";
    let at = raw.windows(TAG.len()).position(|w| w == TAG)? + TAG.len();
    raw.get(at..at + 32)
}

/// The numeric fields of sale `id`'s meta hash (`total_stock`,
/// `starts_at_ms`, `ends_at_ms`, `seq`); others (`paused`) are left out.
pub fn read_meta(con: &mut Con, id: u64) -> redis::RedisResult<HashMap<String, u64>> {
    let all: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(SaleKeys::new(id).meta())
        .query(con)?;
    Ok(all
        .into_iter()
        .filter_map(|(f, v)| v.parse().ok().map(|v| (f, v)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_rid_finds_the_id() {
        let m = br#"{"v":1,"reservation_id":"0123456789abcdef0123456789abcdef","sale_id":4}"#;
        assert_eq!(
            message_rid(m),
            Some(&b"0123456789abcdef0123456789abcdef"[..])
        );
        assert_eq!(message_rid(b"garbage"), None);
        assert_eq!(message_rid(br#"{"reservation_id":"abc"}"#), None);
    }
}
