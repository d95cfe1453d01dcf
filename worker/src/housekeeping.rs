//! Owns the worker's housekeeping thread: the heartbeat key, the reclaim of
//! dead workers' processing lists, and the per-sale queue gauges.
//!
//! A worker registers its id in `seckill:workers` and refreshes
//! `seckill:worker:ID:heartbeat` (TTL `SECKILL_WORKER_HEARTBEAT_TTL`) every
//! third of the TTL. On a clean exit with all its processing lists empty it
//! removes both ([`deregister`]); a crashed worker stays registered. Every half TTL it looks at each registered worker whose
//! heartbeat has expired and moves that worker's processing lists back to
//! their queues (one atomic script per list, see `queue.rs`). A worker that
//! was only paused (SIGSTOP) and resumes finishes its batch anyway; the
//! idempotent MySQL apply makes that second application harmless.
//!
//! The gauges of the shared lists (each sale's queue, processing lists and
//! dead letters, the payments queue and its dead letters) are read and
//! exported by one worker at a time: the holder of the gauge lease
//! (`seckill:gauges:reporter`, taken with `SET NX PX` for
//! [`GAUGE_LEASE_TTL`] and renewed every second by its holder), so that
//! `sum()` over the workers counts each list once. When the holder stops,
//! another worker takes the lease within [`GAUGE_LEASE_TTL`].

use crate::metrics::{Metrics, SaleGauges, SharedGauges};
use crate::queue;
use redis::Commands;
use seckill_common::connections::{Held, Slot, Store};
use seckill_common::keys::{self, SaleKeys};
use seckill_common::message::OrderMessage;
use seckill_common::redis_target::{Con, Target};
use seckill_common::Shutdown;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the housekeeping thread needs.
pub struct Housekeeping {
    /// Redis client (the thread opens its own connection).
    pub client: Target,
    /// This worker's id (the gauge lease's holder name, slot 0's id).
    pub worker_id: String,
    /// The ids of this process's running consumers: each gets its
    /// heartbeat, and none is reclaimed by this thread.
    pub members: crate::pool::Members,
    /// `SECKILL_WORKER_HEARTBEAT_TTL`.
    pub ttl: Duration,
    /// `SECKILL_REDIS_TIMEOUT`.
    pub timeout: Duration,
    /// Where the gauges and the reclaim counter go.
    pub metrics: Arc<Metrics>,
    /// Stops the thread (it also deletes the heartbeat on its way out).
    pub shutdown: Shutdown,
}

/// How long the gauge lease lasts without renewal (renewed every second).
pub const GAUGE_LEASE_TTL: Duration = Duration::from_secs(5);

/// Takes or renews the gauge lease for `worker_id`; whether it holds it now.
/// (A renewal that races the lease's expiry may extend another worker's
/// fresh lease: for a second both export, which a gauge survives.)
///
/// Errors: Redis failures.
pub fn gauge_lease(con: &mut Con, worker_id: &str) -> redis::RedisResult<bool> {
    let ttl = GAUGE_LEASE_TTL.as_millis() as u64;
    let taken: Option<String> = redis::cmd("SET")
        .arg(keys::GAUGE_LEASE)
        .arg(worker_id)
        .arg("NX")
        .arg("PX")
        .arg(ttl)
        .query(con)?;
    if taken.is_some() {
        return Ok(true);
    }
    let holder: Option<String> = con.get(keys::GAUGE_LEASE)?;
    if holder.as_deref() != Some(worker_id) {
        return Ok(false);
    }
    let _: bool = con.pexpire(keys::GAUGE_LEASE, ttl as i64)?;
    Ok(true)
}

/// Gives the gauge lease up when `worker_id` holds it (a clean exit), so
/// another worker takes it at once.
fn drop_gauge_lease(con: &mut Con, worker_id: &str) {
    let holder: Option<String> = con.get(keys::GAUGE_LEASE).unwrap_or(None);
    if holder.as_deref() == Some(worker_id) {
        let _ = con.del::<_, ()>(keys::GAUGE_LEASE);
    }
}

/// Registers worker `worker_id` and writes its first heartbeat.
///
/// Errors: Redis failures.
pub fn register(con: &mut Con, worker_id: &str, ttl: Duration) -> redis::RedisResult<()> {
    beat(con, worker_id, ttl)
}

/// Whether another live worker beats under `worker_id`: its heartbeat
/// is present and changes within half a TTL (a live worker beats every
/// third of one). A heartbeat left by a worker that died (kill -9) does not
/// change and is not one: its successor waits at most half a TTL, then
/// starts. `false` at once when there is no heartbeat (a clean stop
/// deletes it).
///
/// Errors: Redis failures.
pub fn beaten_by_another(
    con: &mut Con,
    worker_id: &str,
    ttl: Duration,
) -> redis::RedisResult<bool> {
    let key = keys::worker_heartbeat(worker_id);
    let first: Option<String> = con.get(&key)?;
    let Some(first) = first else {
        return Ok(false);
    };
    log::info!("worker {worker_id}: a heartbeat of this id is present; waiting up to {} ms to see whether its worker is live", (ttl / 2).as_millis());
    let deadline = Instant::now() + ttl / 2;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        let now: Option<String> = con.get(&key)?;
        match now {
            None => return Ok(false),
            Some(v) if v != first => return Ok(true),
            Some(_) => {}
        }
    }
    Ok(false)
}

/// Refreshes the heartbeat and the registration together: a Redis that
/// lost data (restarted empty, an older AOF) lost `seckill:workers` too, and
/// a worker missing from it would never have its lists reclaimed.
/// Two commands, not one pipeline: on a cluster the two keys are in
/// different slots.
fn beat(con: &mut Con, worker_id: &str, ttl: Duration) -> redis::RedisResult<()> {
    redis::cmd("SADD")
        .arg(keys::WORKERS)
        .arg(worker_id)
        .exec(con)?;
    redis::cmd("SET")
        .arg(keys::worker_heartbeat(worker_id))
        .arg(seckill_common::now_ms())
        .arg("PX")
        .arg(ttl.as_millis().max(1) as u64)
        .exec(con)
}

/// How often [`deregister`] retries when a watched key changed under it.
const DEREGISTER_TRIES: usize = 5;

/// What [`deregister`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deregistered {
    /// Removed from `seckill:workers`, heartbeat deleted.
    Removed,
    /// Still registered: this many messages sit in its processing lists
    /// (others reclaim them once the heartbeat is gone).
    Holding(u64),
    /// Still registered: the sales set or a processing list kept changing
    /// during every try (another process with the same worker id?).
    Contended,
}

/// Removes worker `worker_id` from `seckill:workers` and deletes its
/// heartbeat, on a clean exit, but only when every processing list it has
/// (for each sale in `seckill:sales` and in `known_sales`, the sales it
/// consumed) is empty: a worker holding a message must stay registered, or
/// no other worker would ever reclaim that message. The check and the
/// removal are one `WATCH`/`MULTI` transaction: a change to the sales set or
/// to one of the lists between them aborts it, and it is tried again, at
/// most 5 times. On a cluster (where those keys are in different slots) the
/// check reads each list, then the registration and the heartbeat are
/// removed in two commands: only this worker, which is stopping, moves
/// messages into its own lists, so nothing can arrive in between.
///
/// Errors: Redis failures (the worker then stays registered, which is safe:
/// it only costs others a look at its empty lists).
pub fn deregister(
    con: &mut Con,
    worker_id: &str,
    known_sales: &[SaleKeys],
) -> redis::RedisResult<Deregistered> {
    if con.is_cluster() {
        return deregister_unwatched(con, worker_id, known_sales);
    }
    for _ in 0..DEREGISTER_TRIES {
        redis::cmd("WATCH").arg(keys::SALES).exec(con)?;
        let mut sales = queue::buckets(con)?;
        sales.extend_from_slice(known_sales);
        sales.sort_unstable();
        sales.dedup();
        let lists: Vec<String> = sales.iter().map(|s| s.processing(worker_id)).collect();
        let mut held = 0u64;
        if !lists.is_empty() {
            redis::cmd("WATCH").arg(&lists).exec(con)?;
            let mut p = redis::pipe();
            for l in &lists {
                p.llen(l);
            }
            let lens: Vec<u64> = p.query(con)?;
            held = lens.iter().sum();
        }
        if held > 0 {
            redis::cmd("UNWATCH").exec(con)?;
            return Ok(Deregistered::Holding(held));
        }
        let done: Option<(u64, u64)> = redis::pipe()
            .atomic()
            .srem(keys::WORKERS, worker_id)
            .del(keys::worker_heartbeat(worker_id))
            .query(con)?;
        if done.is_some() {
            return Ok(Deregistered::Removed);
        }
    }
    Ok(Deregistered::Contended)
}

/// [`deregister`] on a cluster: the same check and removal, without the
/// transaction (see there why that is safe).
fn deregister_unwatched(
    con: &mut Con,
    worker_id: &str,
    known_sales: &[SaleKeys],
) -> redis::RedisResult<Deregistered> {
    let mut sales = queue::buckets(con)?;
    sales.extend_from_slice(known_sales);
    sales.sort_unstable();
    sales.dedup();
    let mut held = 0u64;
    for k in sales {
        held += con.llen::<_, u64>(k.processing(worker_id))?;
    }
    if held > 0 {
        return Ok(Deregistered::Holding(held));
    }
    con.srem::<_, _, ()>(keys::WORKERS, worker_id)?;
    con.del::<_, ()>(keys::worker_heartbeat(worker_id))?;
    Ok(Deregistered::Removed)
}

/// Moves the processing lists of every registered worker other than `me`
/// whose heartbeat has expired back to their queues; returns the number of
/// messages moved.
///
/// Errors: Redis failures.
pub fn reclaim_dead(con: &mut Con, me: &str, sales: &[SaleKeys]) -> redis::RedisResult<u64> {
    reclaim_dead_but(con, &[me.to_string()], sales)
}

/// [`reclaim_dead`] sparing every consumer id in `mine`.
///
/// Errors: Redis failures.
pub fn reclaim_dead_but(
    con: &mut Con,
    mine: &[String],
    sales: &[SaleKeys],
) -> redis::RedisResult<u64> {
    let workers: Vec<String> = con.smembers(keys::WORKERS)?;
    let mut moved = 0;
    for w in workers.iter().filter(|w| !mine.contains(w)) {
        let alive: bool = con.exists(keys::worker_heartbeat(w))?;
        if alive {
            continue;
        }
        for s in sales {
            let n = queue::reclaim(con, *s, w)?;
            if n > 0 {
                log::warn!("reclaimed {n} messages of {} from dead worker {w}", s.tag());
            }
            moved += n;
        }
    }
    Ok(moved)
}

/// The current figures of each sale's queue (lengths over all registered
/// workers' processing lists, age of the oldest queued message), one per
/// sale: the buckets of a sale split over buckets (`sales`, ascending, a
/// sale's buckets together) are added up, the oldest age is their largest.
///
/// Errors: Redis failures.
pub fn gauges(con: &mut Con, sales: &[SaleKeys]) -> redis::RedisResult<Vec<SaleGauges>> {
    let workers: Vec<String> = con.smembers(keys::WORKERS)?;
    let now = seckill_common::now_ms() as i64;
    let mut out: Vec<SaleGauges> = Vec::with_capacity(sales.len());
    for &k in sales {
        let mut p = redis::pipe();
        p.llen(k.dead_letter())
            .llen(k.queue())
            .lindex(k.queue(), -1);
        for w in &workers {
            p.llen(k.processing(w));
        }
        let (dead_letters, queued, oldest, rest): (i64, i64, Option<Vec<u8>>, Vec<i64>) = {
            let v: Vec<redis::Value> = p.query(con)?;
            let mut it = v.into_iter();
            let length = |it: &mut std::vec::IntoIter<redis::Value>| -> i64 {
                it.next()
                    .map(|v| redis::from_redis_value(v).unwrap_or(0))
                    .unwrap_or(0)
            };
            let dead_letters = length(&mut it);
            let queued = length(&mut it);
            let oldest: Option<Vec<u8>> = it
                .next()
                .and_then(|v| redis::from_redis_value(v).ok())
                .flatten();
            let rest = it
                .map(|v| redis::from_redis_value(v).unwrap_or(0))
                .collect();
            (dead_letters, queued, oldest, rest)
        };
        let oldest_age_ms = oldest
            .and_then(|raw| OrderMessage::parse(&raw).ok())
            .map(|m| (now - m.reserved_at_ms as i64).max(0))
            .unwrap_or(0);
        let processing: i64 = rest.iter().sum();
        match out.last_mut() {
            Some(g) if g.sale_id == k.sale_id => {
                g.queued += queued;
                g.processing += processing;
                g.dead_letters += dead_letters;
                g.oldest_age_ms = g.oldest_age_ms.max(oldest_age_ms);
            }
            _ => out.push(SaleGauges {
                sale_id: k.sale_id,
                queued,
                processing,
                oldest_age_ms,
                dead_letters,
            }),
        }
    }
    Ok(out)
}

impl Housekeeping {
    /// Starts the thread. It runs until the shutdown flag is set, then
    /// deletes this worker's heartbeat so others may reclaim at once whatever
    /// it leaves behind.
    ///
    /// Errors: the thread cannot be started.
    pub fn start(self) -> std::io::Result<JoinHandle<()>> {
        std::thread::Builder::new()
            .name("housekeeping".into())
            .spawn(move || self.run())
    }

    fn run(self) {
        let beat_every = (self.ttl / 3).max(Duration::from_millis(50));
        let reclaim_every = (self.ttl / 2).max(Duration::from_millis(100));
        let gauge_every = Duration::from_secs(1);
        let tick = beat_every.min(Duration::from_millis(200));
        let mut con: Option<Held<Con>> = None;
        let mut slot = Slot::new(Store::Redis);
        let (mut last_beat, mut last_reclaim, mut last_gauge) = (None, None, None::<Instant>);
        while !self.shutdown.is_triggered() {
            if con.is_none() {
                con = queue::open(&self.client, self.timeout, self.timeout)
                    .ok()
                    .map(|c| slot.hold(c));
            }
            if let Some(c) = con.as_mut() {
                if let Err(e) = self.tick(
                    c,
                    &mut last_beat,
                    &mut last_reclaim,
                    &mut last_gauge,
                    (beat_every, reclaim_every, gauge_every),
                ) {
                    log::warn!("housekeeping: redis: {e}");
                    con = None;
                }
            }
            std::thread::sleep(tick);
        }
        if let Some(c) = con.as_mut() {
            let _ = c.del::<_, ()>(keys::worker_heartbeat(&self.worker_id));
            drop_gauge_lease(c, &self.worker_id);
        }
    }

    fn tick(
        &self,
        con: &mut Con,
        last_beat: &mut Option<Instant>,
        last_reclaim: &mut Option<Instant>,
        last_gauge: &mut Option<Instant>,
        every: (Duration, Duration, Duration),
    ) -> redis::RedisResult<()> {
        let due =
            |last: &Option<Instant>, every: Duration| last.is_none_or(|t| t.elapsed() >= every);
        if due(last_beat, every.0) {
            // Holding the members: a consumer that leaves meanwhile is not
            // registered again after its deregistration.
            self.members
                .with(|ids| ids.iter().try_for_each(|id| beat(con, id, self.ttl)))?;
            *last_beat = Some(Instant::now());
        }
        let reclaim_due = due(last_reclaim, every.1);
        let gauge_due = due(last_gauge, every.2);
        if !reclaim_due && !gauge_due {
            return Ok(());
        }
        let sales = queue::buckets(con)?;
        if reclaim_due {
            let mut mine = self.members.with(<[String]>::to_vec);
            mine.push(self.worker_id.clone());
            let n = reclaim_dead_but(con, &mine, &sales)?;
            self.metrics.reclaimed.inc_by(n);
            *last_reclaim = Some(Instant::now());
        }
        if gauge_due {
            let shared = if gauge_lease(con, &self.worker_id)? {
                let (payments_queued, payments_dead_letters): (i64, i64) = redis::pipe()
                    .llen(seckill_common::payment::QUEUE)
                    .llen(seckill_common::payment::DEAD_LETTERS)
                    .query(con)?;
                Some(SharedGauges {
                    sales: gauges(con, &sales)?,
                    payments_queued,
                    payments_dead_letters,
                })
            } else {
                None
            };
            self.metrics.gauge_reporter.set(i64::from(shared.is_some()));
            if let Ok(mut m) = self.metrics.sales.lock() {
                *m = shared;
            }
            *last_gauge = Some(Instant::now());
        }
        Ok(())
    }
}
