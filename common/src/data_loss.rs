//! Owns the detection of Redis losing acknowledged data of a sale, and the
//! sale's pause (docs/reliability.md §4).
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
//! A sale whose keys are gone before any mark was written (no worker ever
//! ran, and no reconciliation run saw it) is told from one never sold by
//! MySQL's record of its load (`load_record.rs`, `sales.loaded_at`): a
//! loaded sale, not archived, whose stock counter or meta is gone in any
//! bucket lost them, and is paused as any other loss. The pause is then
//! written into a meta hash that holds nothing else, which the reservation
//! script reads first (503 `sale_paused`, not 404 or 410), and `sale load`
//! refuses the sale (`sale repair` rebuilds it). What such a loss takes
//! cannot be counted: the reservations acknowledged since the last mark
//! are known neither to MySQL nor to what is left of Redis.
//!
//! A split sale (`buckets.rs`) has these marks per bucket (bucket 0's in
//! `sale_redis_state`, the others' in `sale_bucket_marks`,
//! `bucket_marks.rs`), each bucket compared with its own, but **one pause
//! per sale**: a loss in any bucket pauses every bucket (the `paused` field
//! in each bucket's meta), so the gateways refuse the whole sale, the
//! workers take none of its buckets' messages, and `sale repair` rebuilds
//! all buckets at once. A bucket alone could not be kept selling safely:
//! its transfers with the lost bucket are on both sides' books, and a
//! lost buyer's second purchase is only seen against MySQL by the repair.
//!
//! A master change holds purchases until the next check: each passing
//! check stamps the bucket's meta twice, once replicated
//! ([`STAMP_FIELD`]) and once on the server alone
//! ([`LOCAL_STAMP_FIELD`]); a failover's promoted replica and a server
//! restarted from its append-only file hold the first and not the second,
//! so the reservation scripts take nothing in a bucket whose stamps differ
//! (503 `sale_paused`) until a watch (or a `run`) has compared it with
//! MySQL there. A lost buyer's retry is
//! therefore never given a second reservation before the loss is seen,
//! and the check on the new master is exact: with nothing sold since the
//! change, a checkpoint behind its mark only says the watch's own writes
//! were lost, and a sale is paused only when its sequence is behind its
//! mark or its counts are short, i.e. when it lost purchases (an idle or
//! sold-out sale is not). A restart from an RDB file (or from an
//! append-only file rewritten after the last check) restores both stamps
//! and is not seen as changed: the checkpoint rule then holds as above. A loss of only reservations made after the last check (less than
//! [`WATCH_EVERY`] of sales) leaves Redis at or above the mark: the
//! reconciler's `order_without_flow` rule reports those, and the
//! `orders_sale_user` key keeps a user from a second order.

use crate::bucket_marks::BucketMarks;
use mysql::prelude::Queryable;
use redis::ConnectionLike;
use std::fmt;
use std::time::Duration;

/// The meta hash's field that holds a sale's data-loss pause (its
/// [`PauseReason`] while paused), as a literal so Lua scripts can
/// `concat!` it into their source; [`PAUSED_FIELD`] everywhere else.
#[macro_export]
macro_rules! paused_field {
    () => {
        "paused"
    };
}

/// The meta hash's field of a sale's data-loss pause (the reservation
/// script refuses a sale that has it; [`watch_sale`] writes it).
pub const PAUSED_FIELD: &str = paused_field!();

/// The meta hash's field that [`WATCH_LUA`] stamps with each passing
/// check of a bucket (the new checkpoint), replicated and persisted as
/// every write, as a literal for the scripts' source; [`STAMP_FIELD`]
/// everywhere else.
#[macro_export]
macro_rules! stamp_field {
    () => {
        "check_stamp"
    };
}

/// The meta hash's field holding the same stamp written on this server
/// only (`redis.set_repl(redis.REPL_NONE)`: neither sent to replicas nor
/// appended to the append-only file), as a literal for the scripts'
/// source; [`LOCAL_STAMP_FIELD`] everywhere else.
#[macro_export]
macro_rules! local_stamp_field {
    () => {
        "check_stamp_local"
    };
}

/// See [`stamp_field`]. On the server the watch last checked a bucket on,
/// the two stamps are equal. A replica promoted since, or a server
/// restarted from its append-only file, has the replicated stamp but not
/// the local one (or an older one, from a full copy of the data set), so
/// the two differ exactly when the bucket's master changed since its last
/// check, and either may have lost the bucket's last writes: the
/// reservation scripts then take nothing (`paused 0 master_changed`, 503
/// `sale_paused`) until a watch has compared the bucket with MySQL and
/// stamped both again, so no purchase can cover a loss up before it is
/// seen. A bucket never checked (no stamp) is not held. Free at purchase
/// time: two more fields of the script's one `HMGET` of the meta.
pub const STAMP_FIELD: &str = stamp_field!();

/// See [`local_stamp_field`].
pub const LOCAL_STAMP_FIELD: &str = local_stamp_field!();

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

/// A bucket found behind its marks (or gone), for the evidence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    /// The bucket (0 for a sale of one bucket).
    pub bucket: u32,
    /// Its reservation sequence in Redis now (0: the bucket is gone).
    pub redis_seq: u64,
    /// Its sequence mark in MySQL.
    pub seq_high: u64,
    /// Its checkpoint in Redis now.
    pub checkpoint: u64,
    /// Its checkpoint mark in MySQL.
    pub checkpoint_high: u64,
}

/// What one comparison of a sale found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SaleState {
    /// Every bucket is at or beyond both its marks; the checkpoints were
    /// raised.
    Consistent {
        /// The sum of the buckets' reservation sequences now.
        redis_seq: u64,
        /// The buckets found whole on another master than at their last
        /// check (a failover or restart that lost none of their
        /// purchases), in order: their purchases resume now.
        moved: Vec<u32>,
    },
    /// The sale is not in Redis, and MySQL has no mark for it and no
    /// record of its load (never sold).
    Absent,
    /// A bucket is behind a mark (or lost the sale): Redis lost data. The
    /// whole sale was paused now.
    LossDetected {
        /// The buckets behind (at least one), in order.
        gaps: Vec<Gap>,
    },
    /// The sale was already paused (the pause re-asserted in every bucket).
    Paused {
        /// Why.
        reason: PauseReason,
        /// The buckets still behind their marks (what the repair rebuilds),
        /// in order.
        gaps: Vec<Gap>,
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
    /// Whether the sale was loaded into Redis and is not archived
    /// (`load_record.rs`): its keys are then expected in Redis.
    pub loaded: bool,
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

/// The MySQL side of sale `sale_id` (marks zero and not paused when MySQL
/// has no row for it; not loaded when `sales` records no load or the sale
/// is archived), in one query.
///
/// Errors: MySQL failures.
pub fn mysql_state<Q: Queryable>(db: &mut Q, sale_id: u64) -> Result<Marks, mysql::Error> {
    // Aggregates: one row even when `sale_redis_state` has none.
    type Row = (Option<u64>, Option<u64>, Option<String>, u64);
    let row: Option<Row> = db.exec_first(
        "SELECT MAX(seq_high), MAX(checkpoint_high), MAX(paused_reason),
                (SELECT COUNT(*) FROM sales WHERE id = ? AND loaded_at IS NOT NULL
                   AND archived_at IS NULL)
         FROM sale_redis_state WHERE sale_id = ?",
        (sale_id, sale_id),
    )?;
    Ok(row
        .map(|(s, c, r, loaded)| Marks {
            seq_high: s.unwrap_or(0),
            checkpoint_high: c.unwrap_or(0),
            paused: r.as_deref().map(PauseReason::parse),
            loaded: loaded > 0,
        })
        .unwrap_or_default())
}

/// The watch script, run on one bucket. `KEYS`: the bucket's meta hash,
/// stock counter, buyers and flow records; `ARGV`: the bucket's sequence
/// mark and checkpoint mark in MySQL. Replies `{state, seq, checkpoint,
/// verdict}` with `seq` the bucket's reservation sequence
/// (`reservation::sequence`) and `verdict` `behind` or `ok` (what `state`
/// would be without a pause):
/// - `absent`: no meta hash, or a meta hash without its stock counter (the
///   counter was lost);
/// - `paused`: meta field [`PAUSED_FIELD`] set (nothing written; the verdict tells
///   whether the bucket is still behind, for the evidence);
/// - `behind`: Redis is below a mark, or holds fewer buyer marks or flow
///   records than units taken (`total − stock`: every unit held has both,
///   so fewer means those keys lost writes; in a sale of several units per
///   buyer, a buyer mark covers at most `max_per_buyer` units and a flow
///   record `max_per_purchase`, so fewer than the units over those);
///   nothing written;
/// - `ok`, after raising the checkpoint to one above the larger of Redis's
///   and MySQL's (never down) and stamping it into [`STAMP_FIELD`] and,
///   on this server only, [`LOCAL_STAMP_FIELD`] (which lets the
///   reservation scripts sell again after a master change).
///
/// A bucket whose two stamps differ (another master than at its last
/// check: a failover or a restart since) had its purchases held since the
/// change ([`STAMP_FIELD`]): no new
/// reservation can have covered a loss up, so a checkpoint behind its mark
/// is not a loss by itself there (only the watch's own writes were lost);
/// its sequence below the mark, or fewer buyer marks or flow records than
/// units taken, still is. The reply's fifth element says `moved` for such
/// a bucket, `same` otherwise (the shorter replies above: `same`).
///
/// Error replies (nothing written, the marks do not move): a key of the
/// wrong type; in a bucket not paused, a stock, `total_stock`, `releases`
/// or `checkpoint` that is not an integer.
pub const WATCH_LUA: &str = concat!(
    crate::lua_expect_types!(),
    r#"
-- Effects replication (the default from Redis 7): the local stamp below
-- must not reach the replicas or the append-only file.
redis.replicate_commands()
local bad = expect_types({KEYS[1], 'hash', KEYS[2], 'string', KEYS[3], 'hash', KEYS[4], 'hash'})
if bad then return bad end
if redis.call('EXISTS', KEYS[1]) == 0 then return {'absent', '0', '0', 'behind'} end
local m = redis.call('HMGET', KEYS[1], 'total_stock', 'releases', 'checkpoint', '"#,
    paused_field!(),
    r#"', 'max_per_buyer', 'max_per_purchase', '"#,
    stamp_field!(),
    r#"', '"#,
    local_stamp_field!(),
    r#"')
local paused = m[4]
local function int(v, what)
  if v == false or v == nil then return 0 end
  if not string.find(v, '^-?%d+$') then
    return nil, redis.error_reply('ERR ' .. what .. ' is not an integer')
  end
  return tonumber(v)
end
-- A paused bucket is reported paused whatever its damage.
local function fail(e, fck)
  if paused then return {'paused', '0', fck or '0', 'behind'} end
  return e
end
local ck, e1 = int(m[3], KEYS[1] .. ' field checkpoint')
if e1 then return fail(e1) end
local fck = string.format('%d', ck)
local left = redis.call('GET', KEYS[2])
if not left or not m[1] then return {paused and 'paused' or 'absent', '0', fck, 'behind'} end
local stock, e2 = int(left, KEYS[2])
if e2 then return fail(e2, fck) end
local total, e3 = int(m[1], KEYS[1] .. ' field total_stock')
if e3 then return fail(e3, fck) end
local releases, e4 = int(m[2], KEYS[1] .. ' field releases')
if e4 then return fail(e4, fck) end
local seq = total - stock + releases
if seq < 0 then seq = 0 end
local fseq = string.format('%d', seq)
local held = total - stock
local per_buyer = tonumber(m[5]) or 1
local per_purchase = tonumber(m[6]) or per_buyer
-- On a new master (the stamps differ) the purchases were held since, so
-- nothing covered a loss up: a checkpoint behind is only the watch's own
-- writes lost, and the sequence and counts say whether purchases were.
local moved = m[7] and m[7] ~= m[8]
local behind = seq < tonumber(ARGV[1]) or (ck < tonumber(ARGV[2]) and not moved)
   or redis.call('HLEN', KEYS[3]) * per_buyer < held
   or redis.call('HLEN', KEYS[4]) * per_purchase < held
local fmoved = moved and 'moved' or 'same'
if paused then return {'paused', fseq, fck, behind and 'behind' or 'ok', fmoved} end
if behind then return {'behind', fseq, fck, 'behind', fmoved} end
local nextck = math.max(ck, tonumber(ARGV[2])) + 1
local fnext = string.format('%d', nextck)
redis.call('HSET', KEYS[1], 'checkpoint', fnext, '"#,
    stamp_field!(),
    r#"', fnext)
redis.set_repl(redis.REPL_NONE)
redis.call('HSET', KEYS[1], '"#,
    local_stamp_field!(),
    r#"', fnext)
redis.set_repl(redis.REPL_ALL)
return {'ok', fseq, fnext, 'ok', fmoved}
"#
);

fn watch_script() -> &'static redis::Script {
    static S: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
    S.get_or_init(|| redis::Script::new(WATCH_LUA))
}

/// How many buckets sale `sale_id` has, for the watch and the repair: the
/// largest of what bucket 0's meta says (`buckets::count`), what MySQL
/// has marks for (`bucket_marks::known_buckets`) and the K MySQL records
/// (`buckets::recorded`), so a bucket 0 that lost its meta does not hide
/// the other buckets, marks or not.
///
/// Errors: Redis or MySQL failures, a meta hash of the wrong type.
pub fn bucket_count<C: ConnectionLike, Q: Queryable>(
    con: &mut C,
    db: &mut Q,
    sale_id: u64,
) -> Result<u32, WatchError> {
    let redis = crate::buckets::count(con, sale_id)?.unwrap_or(1);
    let mysql = crate::bucket_marks::known_buckets(db, sale_id)?;
    let recorded = crate::buckets::recorded(db, sale_id)?.unwrap_or(1);
    Ok(redis
        .max(mysql)
        .max(recorded)
        .clamp(1, crate::buckets::MAX_BUCKETS))
}

/// What [`WATCH_LUA`] found of one bucket (its reply's first element).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BucketState {
    /// At or beyond both marks; its checkpoint was raised.
    Ok,
    /// No meta hash, or no stock counter.
    Absent,
    /// Below a mark, or fewer buyer marks or flow records than units taken.
    Behind,
    /// Paused already (nothing written).
    Paused,
}

impl BucketState {
    /// The script's word for the state; `None` for a word this build does
    /// not know.
    fn parse(word: &str) -> Option<BucketState> {
        Some(match word {
            "ok" => BucketState::Ok,
            "absent" => BucketState::Absent,
            "behind" => BucketState::Behind,
            "paused" => BucketState::Paused,
            _ => return None,
        })
    }
}

/// One bucket's reply to [`WATCH_LUA`].
struct BucketReply {
    state: BucketState,
    seq: u64,
    checkpoint: u64,
    behind: bool,
    /// Checked on another master than the last passing check.
    moved: bool,
}

fn watch_bucket<C: ConnectionLike>(
    con: &mut C,
    k: &crate::keys::SaleKeys,
    marks: BucketMarks,
) -> Result<BucketReply, WatchError> {
    let reply: Vec<String> = watch_script()
        .key(k.meta())
        .key(k.stock())
        .key(k.buyers())
        .key(k.flow())
        .arg(marks.seq_high)
        .arg(marks.checkpoint_high)
        .invoke(con)?;
    let unexpected = || WatchError::UnexpectedReply(format!("{reply:?}"));
    let (state, seq, ck, verdict, moved) = match reply.as_slice() {
        [state, seq, ck, verdict] => (state, seq, ck, verdict, false),
        [state, seq, ck, verdict, moved] => (state, seq, ck, verdict, moved == "moved"),
        _ => return Err(unexpected()),
    };
    Ok(BucketReply {
        state: BucketState::parse(state).ok_or_else(unexpected)?,
        seq: seq.parse().map_err(|_| unexpected())?,
        checkpoint: ck.parse().map_err(|_| unexpected())?,
        behind: verdict == "behind",
        moved,
    })
}

/// Compares every bucket of sale `sale_id` in Redis with its MySQL marks:
/// when all are at or beyond both, raises the checkpoints (Redis, then
/// MySQL) and the sequence marks; when one is behind (or lost its keys),
/// pauses the whole sale; re-asserts an existing pause in every bucket (a
/// Redis that lost data may have lost the pause too). A bucket gone from
/// Redis (no meta, or no stock counter) is a loss when MySQL has a mark
/// for it or records the sale's load; with neither it never sold.
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
    let k = bucket_count(con, db, sale_id)?;
    let mut all = vec![BucketMarks {
        seq_high: marks.seq_high,
        checkpoint_high: marks.checkpoint_high,
    }];
    all.extend(crate::bucket_marks::read_split(db, sale_id, k)?);
    let mut replies = Vec::with_capacity(all.len());
    for (b, m) in all.iter().enumerate() {
        let keys = crate::keys::SaleKeys::bucket(sale_id, b as u32);
        replies.push(watch_bucket(con, &keys, *m)?);
    }
    let never_sold = |m: &BucketMarks| !marks.loaded && m.seq_high == 0 && m.checkpoint_high == 0;
    let gaps: Vec<Gap> = replies
        .iter()
        .zip(&all)
        .enumerate()
        .filter(|(_, (r, m))| match r.state {
            BucketState::Absent => !never_sold(m),
            _ => r.behind,
        })
        .map(|(b, (r, m))| Gap {
            bucket: b as u32,
            redis_seq: r.seq,
            seq_high: m.seq_high,
            checkpoint: r.checkpoint,
            checkpoint_high: m.checkpoint_high,
        })
        .collect();
    if let Some(reason) = marks.paused {
        // Re-read: a repair clears MySQL before Redis, so a pause still in
        // MySQL now and gone from Redis was lost by Redis.
        if replies.iter().any(|r| r.state != BucketState::Paused)
            && mysql_state(db, sale_id)?.paused.is_some()
        {
            for (b, r) in replies.iter().enumerate() {
                if r.state != BucketState::Paused {
                    set_redis_pause(con, sale_id, b as u32, reason)?;
                }
            }
        }
        return Ok(SaleState::Paused { reason, gaps });
    }
    let lost = replies.iter().zip(&all).any(|(r, m)| match r.state {
        BucketState::Behind => true,
        BucketState::Absent => !never_sold(m),
        BucketState::Ok | BucketState::Paused => false,
    });
    if lost {
        pause_buckets(con, db, sale_id, k, PauseReason::RedisDataLoss)?;
        return Ok(SaleState::LossDetected { gaps });
    }
    // Paused in Redis only: a repair is resuming it (MySQL first).
    if replies.iter().any(|r| r.state == BucketState::Paused) {
        return Ok(SaleState::Paused {
            reason: PauseReason::RedisDataLoss,
            gaps,
        });
    }
    if replies.iter().all(|r| r.state == BucketState::Absent) {
        return Ok(SaleState::Absent);
    }
    let ok: Vec<(u32, u64, u64)> = replies
        .iter()
        .enumerate()
        .filter(|(_, r)| r.state == BucketState::Ok)
        .map(|(b, r)| (b as u32, r.seq, r.checkpoint))
        .collect();
    if let Some(&(0, seq, ck)) = ok.first() {
        db.exec_drop(
            "INSERT INTO sale_redis_state (sale_id, seq_high, checkpoint_high) VALUES (?, ?, ?)
             ON DUPLICATE KEY UPDATE seq_high = GREATEST(seq_high, VALUES(seq_high)),
               checkpoint_high = GREATEST(checkpoint_high, VALUES(checkpoint_high)),
               updated_at = UTC_TIMESTAMP(3)",
            (sale_id, seq, ck),
        )?;
    }
    crate::bucket_marks::raise_split(db, sale_id, &ok)?;
    Ok(SaleState::Consistent {
        redis_seq: ok.iter().map(|m| m.1).sum(),
        moved: replies
            .iter()
            .enumerate()
            .filter(|(_, r)| r.state == BucketState::Ok && r.moved)
            .map(|(b, _)| b as u32)
            .collect(),
    })
}

/// Pauses `sale_id`, every bucket: MySQL first (the decision), then each
/// bucket's meta in Redis.
///
/// Errors: [`WatchError`]; a failure after the MySQL step is completed by
/// the next [`watch_sale`], which re-asserts the pause in Redis.
pub fn pause<C: ConnectionLike, Q: Queryable>(
    con: &mut C,
    db: &mut Q,
    sale_id: u64,
    reason: PauseReason,
) -> Result<(), WatchError> {
    let k = bucket_count(con, db, sale_id)?;
    pause_buckets(con, db, sale_id, k, reason)
}

fn pause_buckets<C: ConnectionLike, Q: Queryable>(
    con: &mut C,
    db: &mut Q,
    sale_id: u64,
    buckets: u32,
    reason: PauseReason,
) -> Result<(), WatchError> {
    db.exec_drop(
        "INSERT INTO sale_redis_state (sale_id, paused_reason, paused_at)
         VALUES (?, ?, UTC_TIMESTAMP(3))
         ON DUPLICATE KEY UPDATE paused_reason = COALESCE(paused_reason, VALUES(paused_reason)),
                                 paused_at = COALESCE(paused_at, VALUES(paused_at))",
        (sale_id, reason.as_str()),
    )?;
    for b in 0..buckets.max(1) {
        set_redis_pause(con, sale_id, b, reason)?;
    }
    Ok(())
}

fn set_redis_pause<C: ConnectionLike>(
    con: &mut C,
    sale_id: u64,
    bucket: u32,
    reason: PauseReason,
) -> redis::RedisResult<()> {
    redis::cmd("HSET")
        .arg(crate::keys::SaleKeys::bucket(sale_id, bucket).meta())
        .arg(PAUSED_FIELD)
        .arg(reason.as_str())
        .query(con)
}

/// Ends the pause of `sale_id` in MySQL, with bucket 0's marks set to `seq`
/// and `checkpoint` (the repaired Redis values; a split sale's other
/// buckets' are set first with `bucket_marks::set_split`). Run only by the repair, which
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
