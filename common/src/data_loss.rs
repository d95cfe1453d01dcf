//! Owns the detection of Redis losing acknowledged data of a sale, and the
//! sale's pause (issue 10 §4).
//!
//! Two marks that Redis can only fall behind by losing writes, each kept
//! in MySQL (`sale_redis_state`) as the highest value seen: the sale's
//! reservation sequence (`total_stock − stock + releases`: units ever
//! reserved, see `reservation::sequence`) and a checkpoint (meta field
//! `checkpoint`) that every worker's watch raises by one every
//! [`WATCH_EVERY`], in Redis first (only ever upwards, in one script) and
//! then in MySQL. The checkpoint is what catches a loss that new
//! reservations have already covered up: purchases made right after the
//! restart raise the sequence again, but nothing but the watch raises the
//! checkpoint. Redis can only go *behind* a mark by losing writes: a restart from an AOF missing its last
//! second (`appendfsync everysec`), a failover to a replica that lagged, a
//! flush. Then users whose reservations were lost could buy again, and
//! units MySQL has sold would be sold twice, so the sale is **paused**:
//! `paused_reason` is set in MySQL (the decision, it survives another Redis
//! loss) and the meta field `paused` in Redis (what the reservation script
//! reads: purchases get 503 `sale_paused`); workers take none of its
//! messages; the reconciler opens a critical finding `redis_data_loss`.
//! `seckill-reconciler sale repair ID` rebuilds the sale's Redis state from
//! MySQL and resumes it.
//!
//! The watch also checks what the marks cannot see: a sale whose stock
//! counter is gone, and one holding fewer buyer marks or flow records than
//! units taken (one key lost alone: its winners could buy twice).
//!
//! Window: purchases can still slip through between the restart and the
//! first check after it (at most [`WATCH_EVERY`] plus one Redis reconnect of
//! the worker; measured in `tests/tests/redis_data_loss.rs`). Each is a
//! second reservation of a user who may hold an order; the repair releases
//! it. A loss of only reservations made after the last check (less than
//! [`WATCH_EVERY`] of sales) leaves Redis at or above the mark: the
//! reconciler's `order_without_flow` rule reports those, and the
//! `orders_sale_user` key keeps a user from a second order.

use mysql::prelude::Queryable;
use redis::ConnectionLike;
use std::fmt;
use std::time::Duration;

/// How often each worker compares every sale's Redis sequence with MySQL.
pub const WATCH_EVERY: Duration = Duration::from_millis(200);

/// Why a sale is paused. Stored as text in `sale_redis_state.paused_reason`
/// and in the Redis meta field `paused`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseReason {
    /// Redis is behind MySQL's high-water mark: it lost reservations.
    RedisDataLoss,
}

impl PauseReason {
    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            PauseReason::RedisDataLoss => "redis_data_loss",
        }
    }

    /// Reads the stored text; unknown text is kept as data loss (the only
    /// reason this build writes), so a pause is never ignored.
    pub fn parse(_s: &str) -> PauseReason {
        PauseReason::RedisDataLoss
    }
}

/// What one comparison of a sale found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaleState {
    /// Redis is at or beyond both marks; the checkpoint was raised.
    Consistent {
        /// Redis's reservation sequence now.
        redis_seq: u64,
    },
    /// The sale is not in Redis and MySQL has no mark for it (never sold).
    Absent,
    /// Redis is behind a mark (or lost the sale): it lost data. The sale
    /// was paused now.
    LossDetected {
        /// Redis's reservation sequence now (0: the sale is gone).
        redis_seq: u64,
        /// The sequence mark in MySQL.
        seq_high: u64,
    },
    /// The sale was already paused (the pause re-asserted in Redis).
    Paused {
        /// Why.
        reason: PauseReason,
    },
}

/// The MySQL side of one sale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Marks {
    /// The highest reservation sequence seen in Redis.
    pub seq_high: u64,
    /// The highest checkpoint written to Redis.
    pub checkpoint_high: u64,
    /// Why the sale is paused, if it is.
    pub paused: Option<PauseReason>,
}

/// Why a comparison could not be made.
#[derive(Debug)]
#[non_exhaustive]
pub enum WatchError {
    /// Redis failed.
    Redis(redis::RedisError),
    /// MySQL failed.
    Mysql(mysql::Error),
    /// The watch script answered something this build does not know.
    UnexpectedReply(String),
}

impl fmt::Display for WatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WatchError::Redis(e) => write!(f, "data-loss watch: redis: {e}"),
            WatchError::Mysql(e) => write!(f, "data-loss watch: mysql: {e}"),
            WatchError::UnexpectedReply(r) => write!(f, "data-loss watch: unexpected reply {r}"),
        }
    }
}

impl std::error::Error for WatchError {}

impl From<redis::RedisError> for WatchError {
    fn from(e: redis::RedisError) -> Self {
        WatchError::Redis(e)
    }
}

impl From<mysql::Error> for WatchError {
    fn from(e: mysql::Error) -> Self {
        WatchError::Mysql(e)
    }
}

/// The MySQL side of sale `sale_id` (all zero and not paused when MySQL
/// has no row for it).
///
/// Errors: MySQL failures.
pub fn mysql_state<Q: Queryable>(db: &mut Q, sale_id: u64) -> Result<Marks, mysql::Error> {
    let row: Option<(u64, u64, Option<String>)> = db.exec_first(
        "SELECT seq_high, checkpoint_high, paused_reason FROM sale_redis_state WHERE sale_id = ?",
        (sale_id,),
    )?;
    Ok(row
        .map(|(s, c, r)| Marks {
            seq_high: s,
            checkpoint_high: c,
            paused: r.as_deref().map(PauseReason::parse),
        })
        .unwrap_or_default())
}

/// The watch script. `KEYS`: the sale's meta hash, stock counter, buyers
/// and flow records; `ARGV`: MySQL's sequence mark and checkpoint mark.
/// Replies `{state, seq, checkpoint}` with `seq` the reservation sequence
/// (`reservation::sequence`):
/// - `absent`: no meta hash, or a meta hash without its stock counter (the
///   counter was lost);
/// - `paused`: meta field `paused` set;
/// - `behind`: Redis is below a mark, or holds fewer buyer marks or flow
///   records than units taken (`total − stock`: every unit held has both,
///   so fewer means those keys lost writes); nothing written;
/// - `ok`, after raising the checkpoint to one above the larger of Redis's
///   and MySQL's (never down).
///
/// Error replies (nothing written, the sale's marks do not move): a key of
/// the wrong type, a stock, `total_stock`, `releases` or `checkpoint` that
/// is not an integer.
pub const WATCH_LUA: &str = concat!(
    crate::lua_expect_types!(),
    r#"
local bad = expect_types({KEYS[1], 'hash', KEYS[2], 'string', KEYS[3], 'hash', KEYS[4], 'hash'})
if bad then return bad end
if redis.call('EXISTS', KEYS[1]) == 0 then return {'absent', '0', '0'} end
local m = redis.call('HMGET', KEYS[1], 'total_stock', 'releases', 'checkpoint', 'paused')
local function int(v, what)
  if v == false or v == nil then return 0 end
  if not string.find(v, '^-?%d+$') then
    return nil, redis.error_reply('ERR ' .. what .. ' is not an integer')
  end
  return tonumber(v)
end
local ck, e1 = int(m[3], KEYS[1] .. ' field checkpoint')
if e1 then return e1 end
if m[4] then return {'paused', '0', string.format('%d', ck)} end
local left = redis.call('GET', KEYS[2])
if not left or not m[1] then return {'absent', '0', string.format('%d', ck)} end
local stock, e2 = int(left, KEYS[2])
if e2 then return e2 end
local total, e3 = int(m[1], KEYS[1] .. ' field total_stock')
if e3 then return e3 end
local releases, e4 = int(m[2], KEYS[1] .. ' field releases')
if e4 then return e4 end
local seq = total - stock + releases
if seq < 0 then seq = 0 end
local fseq = string.format('%d', seq)
local fck = string.format('%d', ck)
local held = total - stock
if seq < tonumber(ARGV[1]) or ck < tonumber(ARGV[2])
   or redis.call('HLEN', KEYS[3]) < held or redis.call('HLEN', KEYS[4]) < held then
  return {'behind', fseq, fck}
end
local nextck = math.max(ck, tonumber(ARGV[2])) + 1
redis.call('HSET', KEYS[1], 'checkpoint', string.format('%d', nextck))
return {'ok', fseq, string.format('%d', nextck)}
"#
);

fn watch_script() -> &'static redis::Script {
    static S: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
    S.get_or_init(|| redis::Script::new(WATCH_LUA))
}

/// Compares sale `sale_id` in Redis with MySQL's marks: when Redis is at
/// or beyond both, raises the checkpoint (Redis, then MySQL) and the
/// sequence mark; when it is behind one (or lost the sale), pauses the
/// sale; re-asserts an existing pause in Redis (a Redis that lost data may
/// have lost the pause too).
///
/// Errors: [`WatchError`]; nothing is decided then.
pub fn watch_sale<C: ConnectionLike, Q: Queryable>(
    con: &mut C,
    db: &mut Q,
    sale_id: u64,
) -> Result<SaleState, WatchError> {
    // MySQL first: Redis's marks only grow (short of a loss), so a read
    // after MySQL's is never behind a mark raised in between.
    let marks = mysql_state(db, sale_id)?;
    let k = crate::keys::SaleKeys::new(sale_id);
    let reply: Vec<String> = watch_script()
        .key(k.meta())
        .key(k.stock())
        .key(k.buyers())
        .key(k.flow())
        .arg(marks.seq_high)
        .arg(marks.checkpoint_high)
        .invoke(con)?;
    let unexpected = || WatchError::UnexpectedReply(format!("{reply:?}"));
    let [state, seq, ck] = reply.as_slice() else {
        return Err(unexpected());
    };
    let redis_seq: u64 = seq.parse().map_err(|_| unexpected())?;
    let checkpoint: u64 = ck.parse().map_err(|_| unexpected())?;
    if let Some(reason) = marks.paused {
        // Re-read: a repair clears MySQL before Redis, so a pause still in
        // MySQL now and gone from Redis was lost by Redis.
        if state != "paused" && mysql_state(db, sale_id)?.paused.is_some() {
            set_redis_pause(con, sale_id, reason)?;
        }
        return Ok(SaleState::Paused { reason });
    }
    match state.as_str() {
        "ok" => {
            db.exec_drop(
                "INSERT INTO sale_redis_state (sale_id, seq_high, checkpoint_high) VALUES (?, ?, ?)
                 ON DUPLICATE KEY UPDATE seq_high = GREATEST(seq_high, VALUES(seq_high)),
                   checkpoint_high = GREATEST(checkpoint_high, VALUES(checkpoint_high)),
                   updated_at = UTC_TIMESTAMP(3)",
                (sale_id, redis_seq, checkpoint),
            )?;
            Ok(SaleState::Consistent { redis_seq })
        }
        "absent" if marks.seq_high == 0 && marks.checkpoint_high == 0 => Ok(SaleState::Absent),
        "absent" | "behind" => {
            pause(con, db, sale_id, PauseReason::RedisDataLoss)?;
            Ok(SaleState::LossDetected {
                redis_seq,
                seq_high: marks.seq_high,
            })
        }
        // Paused in Redis only: a repair is resuming it (MySQL first).
        "paused" => Ok(SaleState::Paused {
            reason: PauseReason::RedisDataLoss,
        }),
        _ => Err(unexpected()),
    }
}

/// Pauses `sale_id`: MySQL first (the decision), then Redis.
///
/// Errors: [`WatchError`]; a failure after the MySQL step is completed by
/// the next [`watch_sale`], which re-asserts the pause in Redis.
pub fn pause<C: ConnectionLike, Q: Queryable>(
    con: &mut C,
    db: &mut Q,
    sale_id: u64,
    reason: PauseReason,
) -> Result<(), WatchError> {
    db.exec_drop(
        "INSERT INTO sale_redis_state (sale_id, paused_reason, paused_at)
         VALUES (?, ?, UTC_TIMESTAMP(3))
         ON DUPLICATE KEY UPDATE paused_reason = COALESCE(paused_reason, VALUES(paused_reason)),
                                 paused_at = COALESCE(paused_at, VALUES(paused_at))",
        (sale_id, reason.as_str()),
    )?;
    set_redis_pause(con, sale_id, reason)?;
    Ok(())
}

fn set_redis_pause<C: ConnectionLike>(
    con: &mut C,
    sale_id: u64,
    reason: PauseReason,
) -> redis::RedisResult<()> {
    redis::cmd("HSET")
        .arg(crate::keys::SaleKeys::new(sale_id).meta())
        .arg("paused")
        .arg(reason.as_str())
        .query(con)
}

/// Ends the pause of `sale_id` in MySQL, with the marks set to `seq` and
/// `checkpoint` (the repaired Redis values). Run only by the repair, which
/// then ends the pause in Redis (meta field `paused`) together with the
/// rebuilt state: until then the watch leaves a pause that only Redis
/// holds, so the sale stays paused.
///
/// Errors: [`WatchError::Mysql`].
pub fn resume_mysql<Q: Queryable>(
    db: &mut Q,
    sale_id: u64,
    seq: u64,
    checkpoint: u64,
) -> Result<(), WatchError> {
    db.exec_drop(
        "INSERT INTO sale_redis_state (sale_id, seq_high, checkpoint_high) VALUES (?, ?, ?)
         ON DUPLICATE KEY UPDATE seq_high = VALUES(seq_high),
           checkpoint_high = VALUES(checkpoint_high), paused_reason = NULL,
           paused_at = NULL, updated_at = UTC_TIMESTAMP(3)",
        (sale_id, seq, checkpoint),
    )?;
    Ok(())
}
