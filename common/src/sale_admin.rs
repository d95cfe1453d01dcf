//! Owns an operator's changes to a sale after its creation (`seckill-reconciler
//! sale pause | resume | end | extend | add-stock`): the MySQL decision and the
//! Redis step that follows it in every bucket.
//!
//! MySQL decides: one transaction inserts the change's row in
//! `sale_changes`, keyed by the audited action (`action_key`, 32 hex
//! characters), and changes `sales` (the pause columns, `ends_at`, or
//! `total_stock` and `available_stock` with a `stock_ledger` row of reason
//! [`ADD_STOCK_REASON`]). A second attempt of the same action finds its row
//! and changes nothing, so a change is made once however often it is
//! retried. Redis follows, from MySQL's current row ([`follow`]): each
//! bucket's meta `ends_at_ms` and [`OPERATOR_PAUSED`], which the reservation
//! script reads on every purchase (by Redis's clock, `TIME` in the
//! script); for an add-stock, each bucket's units in
//! one script that also writes the action's mark into the bucket's
//! `stock_added` hash, so the units go in once. Both steps are safe to
//! repeat: an interrupted command is completed by repeating them.
//!
//! An end set now (`sale end`) is never the moment of the command: it is
//! Redis's `TIME` ([`redis_now_ms`]) plus [`END_MARGIN_MS`], recorded in MySQL
//! and written into every bucket's meta before it arrives, so the end
//! MySQL records is the one every bucket enforces and no reservation is at
//! or after it. Each bucket's write checks it by that bucket's own `TIME`
//! ([`Followed::late`]): a bucket that was still open when the end had
//! passed (the command stalled past the margin, or was killed and
//! completed later) is reported, and the reconciler's
//! `order_outside_window` rule names any order it took meanwhile.
//!
//! An operator's pause is not the data-loss pause (`data_loss.rs`): it is
//! its own meta field and its own MySQL columns, the workers go on applying
//! the sale's order messages, and neither `sale repair` nor the data-loss
//! watch sets or clears it.
//!
//! A split sale (`buckets.rs`) gets added units so that each bucket's
//! share is the one a sale created with the new total would have
//! ([`added_to_bucket`]): bucket `b` gets `share(new) − share(old)`.

use crate::buckets::share;
use crate::keys::SaleKeys;
use mysql::prelude::Queryable;
use redis::{ConnectionLike, Script};
use std::sync::OnceLock;

/// The meta field that holds an operator's pause reason while the sale is
/// paused by `sale pause` (purchases answered 503 `sale_paused`).
pub const OPERATOR_PAUSED: &str = "operator_paused";

/// How far after Redis's `TIME` an end set now (`sale end`) lies: time
/// for the audit row, MySQL's commit and one script per bucket, each of
/// which then writes the end before it arrives (`tests/tests/sale_end_exact.rs`
/// ends sales so while 64 connections buy).
pub const END_MARGIN_MS: u64 = 1000;

/// The `stock_ledger.reason` of units an operator added (`delta` +N).
pub const ADD_STOCK_REASON: &str = "add_stock";

/// A change an operator makes to a sale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Refuse purchases, with this reason, until [`Change::Resume`].
    Pause {
        /// Why (shown by `sale list` and `sale show`).
        reason: String,
    },
    /// End an operator's pause.
    Resume,
    /// Move the window's end to this time (Unix ms): `sale end` (now) and
    /// `sale extend`.
    EndAt {
        /// The new end.
        ends_at_ms: u64,
    },
    /// Put this many more units on sale.
    AddStock {
        /// Units, at least 1.
        units: u64,
    },
}

impl Change {
    /// The name stored in `sale_changes.action`.
    pub fn name(&self) -> &'static str {
        match self {
            Change::Pause { .. } => "pause",
            Change::Resume => "resume",
            Change::EndAt { .. } => "end_at",
            Change::AddStock { .. } => "add_stock",
        }
    }
}

/// A change's row in `sale_changes`: the evidence it was decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    /// The sale.
    pub sale_id: u64,
    /// `sale_changes.action` ([`Change::name`]).
    pub action: String,
    /// Units added (an add-stock), else `None`.
    pub units: Option<u64>,
    /// `sales.total_stock` before the units were added (an add-stock).
    pub total_before: Option<u64>,
}

/// The row of action `key`, if its change was decided.
///
/// Errors: MySQL failures.
pub fn decided<Q: Queryable>(db: &mut Q, key: &str) -> Result<Option<Decided>, mysql::Error> {
    let row: Option<(u64, String, Option<u64>, Option<u64>)> = db.exec_first(
        "SELECT sale_id, action, units, total_before FROM sale_changes WHERE action_key = ?",
        (key,),
    )?;
    Ok(row.map(|(sale_id, action, units, total_before)| Decided {
        sale_id,
        action,
        units,
        total_before,
    }))
}

/// Decides `change` of sale `sale_id` for action `key` by `actor` in one
/// MySQL transaction (see the module doc). Returns `false` when the action's
/// change was decided before (nothing changed now).
///
/// Errors: MySQL failures (the transaction is rolled back: nothing decided).
pub fn decide(
    db: &mut mysql::Conn,
    sale_id: u64,
    key: &str,
    actor: &str,
    change: &Change,
    detail: &str,
) -> Result<bool, mysql::Error> {
    let mut tx = db.start_transaction(mysql::TxOpts::default())?;
    let total: Option<u64> = tx.exec_first(
        "SELECT total_stock FROM sales WHERE id = ? FOR UPDATE",
        (sale_id,),
    )?;
    let units = match change {
        Change::AddStock { units } => Some(*units),
        _ => None,
    };
    tx.exec_drop(
        "INSERT IGNORE INTO sale_changes
           (action_key, sale_id, action, actor, detail, units, total_before)
         VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            key,
            sale_id,
            change.name(),
            actor,
            detail.chars().take(255).collect::<String>(),
            units,
            units.and(total),
        ),
    )?;
    if tx.affected_rows() == 0 {
        tx.rollback()?;
        return Ok(false);
    }
    match change {
        Change::Pause { reason } => tx.exec_drop(
            "UPDATE sales SET paused_reason = ?, paused_by = ?, paused_at = UTC_TIMESTAMP(3)
             WHERE id = ?",
            (reason, actor, sale_id),
        )?,
        Change::Resume => tx.exec_drop(
            "UPDATE sales SET paused_reason = NULL, paused_by = NULL, paused_at = NULL
             WHERE id = ?",
            (sale_id,),
        )?,
        Change::EndAt { ends_at_ms } => tx.exec_drop(
            "UPDATE sales SET ends_at = FROM_UNIXTIME(? / 1000) WHERE id = ?",
            (ends_at_ms, sale_id),
        )?,
        Change::AddStock { units } => {
            tx.exec_drop(
                "UPDATE sales SET total_stock = total_stock + ?,
                   available_stock = available_stock + ? WHERE id = ?",
                (units, units, sale_id),
            )?;
            tx.exec_drop(
                "INSERT INTO stock_ledger (reservation_id, sale_id, user_id, delta, reason)
                 VALUES (?, ?, ?, ?, ?)",
                (key, sale_id, actor, units, ADD_STOCK_REASON),
            )?;
        }
    }
    tx.commit()?;
    Ok(true)
}

/// The units bucket `bucket` of a sale of `buckets` buckets gets when
/// `units` are added to a total of `total_before`: its share of the new
/// total less its share of the old one (one bucket: all of them).
pub fn added_to_bucket(total_before: u64, units: u64, buckets: u32, bucket: u32) -> u64 {
    share(total_before + units, buckets, bucket) - share(total_before, buckets, bucket)
}

/// `KEYS`: a bucket's meta; `ARGV`: the window end (Unix ms) and the
/// operator's pause reason (empty: not paused). Writes nothing and replies
/// `{0, 0}` for a bucket Redis does not hold (no `total_stock`) or holds as
/// an archive's tombstone; else sets `ends_at_ms`, sets or clears
/// `operator_paused` and replies `{1, late}`: `late` is 0 unless the
/// bucket's end moves earlier to an end Redis's clock has reached (the
/// bucket took purchases at or after the new end), then how late the
/// write is, in ms, plus 1.
const FOLLOW_LUA: &str = concat!(
    r#"
if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then return {0, 0} end
local m = redis.call('HMGET', KEYS[1], 'total_stock', 'archived_at_ms', 'ends_at_ms')
if not m[1] or m[2] then return {0, 0} end"#,
    crate::lua_now!(),
    r#"
local new = tonumber(ARGV[1])
local old = tonumber(m[3] or '')
local late = 0
if old and old > new and now >= new then late = now - new + 1 end
redis.call('HSET', KEYS[1], 'ends_at_ms', ARGV[1])
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], 'operator_paused')
else
  redis.call('HSET', KEYS[1], 'operator_paused', ARGV[2])
end
return {1, late}
"#
);

/// `KEYS`: a bucket's meta, stock and `stock_added`; `ARGV`: the action
/// key and the units. Replies 0 when the action's mark is there already
/// (added already; nothing changed), -1 when Redis does not hold the
/// bucket's stock (nothing changed: `sale load` puts MySQL's total there),
/// else adds the units to the stock, to `total_stock` (and `share`, which a
/// split sale's bucket has) and writes the mark, and replies 1.
const ADD_STOCK_LUA: &str = concat!(
    crate::lua_expect_types!(),
    r#"
local bad = expect_types({KEYS[1], 'hash', KEYS[2], 'string', KEYS[3], 'hash'})
if bad then return bad end
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then return 0 end
if redis.call('EXISTS', KEYS[2]) == 0 or redis.call('HEXISTS', KEYS[1], 'total_stock') == 0 then
  return -1
end
redis.call('INCRBY', KEYS[2], ARGV[2])
redis.call('HINCRBY', KEYS[1], 'total_stock', ARGV[2])
if redis.call('HEXISTS', KEYS[1], 'share') == 1 then
  redis.call('HINCRBY', KEYS[1], 'share', ARGV[2])
end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
return 1
"#
);

fn follow_script() -> &'static Script {
    static S: OnceLock<Script> = OnceLock::new();
    S.get_or_init(|| Script::new(FOLLOW_LUA))
}

fn add_stock_script() -> &'static Script {
    static S: OnceLock<Script> = OnceLock::new();
    S.get_or_init(|| Script::new(ADD_STOCK_LUA))
}

/// What MySQL says of the settings Redis follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `sales.ends_at`, Unix ms.
    pub ends_at_ms: u64,
    /// `sales.paused_reason`: an operator's pause.
    pub paused_reason: Option<String>,
}

/// Sale `sale_id`'s [`Settings`]; `None` when MySQL has no such sale.
///
/// Errors: MySQL failures.
pub fn settings<Q: Queryable>(db: &mut Q, sale_id: u64) -> Result<Option<Settings>, mysql::Error> {
    let row: Option<(i64, Option<String>)> = db.exec_first(
        "SELECT CAST(UNIX_TIMESTAMP(ends_at) * 1000 AS SIGNED), paused_reason
         FROM sales WHERE id = ?",
        (sale_id,),
    )?;
    Ok(row.map(|(e, paused_reason)| Settings {
        ends_at_ms: e.max(0) as u64,
        paused_reason,
    }))
}

/// What [`follow`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Followed {
    /// Buckets written (the others Redis does not hold).
    pub held: u32,
    /// Buckets whose end moved earlier to an end their Redis clock had
    /// already reached when written: (bucket, ms late, at least 0). Such a
    /// bucket took purchases at or after the end MySQL records.
    pub late: Vec<(u32, u64)>,
}

/// Sets MySQL's window end and operator pause of sale `sale_id` in each of
/// its `buckets` buckets that Redis holds; says how many it wrote and
/// which were written late.
///
/// Errors: Redis failures.
pub fn follow<C: ConnectionLike>(
    con: &mut C,
    sale_id: u64,
    buckets: u32,
    s: &Settings,
) -> redis::RedisResult<Followed> {
    let mut f = Followed::default();
    for b in 0..buckets.max(1) {
        let k = SaleKeys::bucket(sale_id, b);
        let (wrote, late): (i64, u64) = follow_script()
            .key(k.meta())
            .arg(s.ends_at_ms)
            .arg(s.paused_reason.as_deref().unwrap_or(""))
            .invoke(con)?;
        f.held += u32::from(wrote == 1);
        if late > 0 {
            f.late.push((b, late - 1));
        }
    }
    Ok(f)
}

/// Redis's clock (`TIME` on `con`), Unix ms: the clock the reservation
/// script judges the window by, so the one a sale's end is set by.
///
/// Errors: Redis failures.
pub fn redis_now_ms<C: ConnectionLike>(con: &mut C) -> redis::RedisResult<u64> {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(con)?;
    Ok(secs * 1000 + micros / 1000)
}

/// What adding units did to one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    /// The units went in now.
    Now,
    /// The action's mark was there: they went in before.
    Before,
    /// Redis does not hold the bucket's stock: nothing written.
    NotLoaded,
}

/// Adds `units` of action `key` to bucket `k` once (see [`ADD_STOCK_LUA`]'s
/// doc in the source); 0 units write nothing.
///
/// Errors: Redis failures, a key of the wrong type.
pub fn add_to_bucket<C: ConnectionLike>(
    con: &mut C,
    k: &SaleKeys,
    key: &str,
    units: u64,
) -> redis::RedisResult<Added> {
    if units == 0 {
        return Ok(Added::Before);
    }
    let r: i64 = add_stock_script()
        .key(k.meta())
        .key(k.stock())
        .key(k.stock_added())
        .arg(key)
        .arg(units)
        .invoke(con)?;
    Ok(match r {
        1 => Added::Now,
        0 => Added::Before,
        _ => Added::NotLoaded,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn added_units_keep_each_bucket_at_its_share_of_the_new_total() {
        // 10 over 3 is 4, 3, 3; 12 over 3 is 4, 4, 4.
        let got: Vec<u64> = (0..3).map(|b| added_to_bucket(10, 2, 3, b)).collect();
        assert_eq!(got, [0, 1, 1]);
        assert_eq!(added_to_bucket(10, 5, 1, 0), 5);
        for (before, units, k) in [(10, 7, 3), (0, 1, 4), (300, 299, 7)] {
            let sum: u64 = (0..k).map(|b| added_to_bucket(before, units, k, b)).sum();
            assert_eq!(sum, units, "{before} + {units} over {k}");
        }
    }
}
