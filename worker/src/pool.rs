//! Owns the consumers of one worker process: runs
//! `SECKILL_WORKER_CONSUMERS_MIN` of them always, adds one while sales
//! have a backlog, lets the ones above the minimum stop when idle, and
//! stops them all on shutdown.
//!
//! Each consumer is a thread with its own id (`ID` for the first, `ID.1`,
//! `ID.2`, … after it: [`consumer_id`]), so its own processing lists,
//! heartbeat (beaten by the housekeeping thread while it is a
//! [`Members`] member) and MySQL session. The rule that adds one follows
//! what more consumers buy (docs/PERFORMANCE.md, "Performance: worker"): batches of
//! one sale serialize on its MySQL row (all its buckets' too), so a consumer
//! is added only while fewer run than sales whose oldest queued message is older
//! than `SECKILL_WORKER_SCALE_AFTER`, up to `SECKILL_WORKER_CONSUMERS_MAX`;
//! every consumer takes only from a sale no other consumer of the process
//! holds (`consume::Claims`). A consumer above the minimum that took
//! nothing for `SECKILL_WORKER_IDLE_AFTER` stops between two batches: it
//! finishes the batch in hand, puts back what is left in its processing
//! lists and deregisters (`consume::Worker::run`, [`crate::leave`]); what
//! a crash leaves is reclaimed by the next start of the process
//! ([`reclaim_previous`]) or, once its heartbeat expires, by any worker.

use crate::config::Config;
use crate::consume::{Claims, Worker};
use crate::loss_watch::PausedSales;
use crate::metrics::Metrics;
use crate::{apply, housekeeping, queue};
use redis::Commands;
use seckill_common::connections::{Held, Slot, Store};
use seckill_common::keys;
use seckill_common::message::OrderMessage;
use seckill_common::redis_target::{Con, Target};
use seckill_common::Shutdown;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The id of the consumer in `slot` of worker `worker_id`: the worker id
/// itself for slot 0 (a process of one consumer is named as it always
/// was), `ID.SLOT` after it.
pub fn consumer_id(worker_id: &str, slot: usize) -> String {
    if slot == 0 {
        worker_id.to_string()
    } else {
        format!("{worker_id}.{slot}")
    }
}

/// The ids of this process's running consumers, whose heartbeats the
/// housekeeping thread beats. Held while beating, so a consumer removed
/// from it is never beaten (re-registered) after its deregistration.
#[derive(Debug, Clone, Default)]
pub struct Members(Arc<Mutex<Vec<String>>>);

impl Members {
    /// Runs `f` over the ids, holding them.
    pub fn with<T>(&self, f: impl FnOnce(&[String]) -> T) -> T {
        f(&self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn add(&self, id: &str) {
        let mut ids = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if !ids.iter().any(|i| i == id) {
            ids.push(id.to_string());
        }
    }

    fn remove(&self, id: &str) {
        let mut ids = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        ids.retain(|i| i != id);
    }
}

struct Running {
    stop: Shutdown,
    handle: JoinHandle<()>,
}

/// The consumers of one process and what they share.
pub struct Pool {
    /// The process's settings (its `worker_id` is slot 0's).
    pub config: Config,
    /// Redis client (each consumer opens its own connections).
    pub client: Target,
    /// The process's metrics.
    pub metrics: Arc<Metrics>,
    /// The process's shutdown flag.
    pub shutdown: Shutdown,
    /// The sales the data-loss watch paused.
    pub paused: PausedSales,
    /// The running consumers' ids, beaten by the housekeeping thread.
    pub members: Members,
    claims: Claims,
    slots: Vec<Option<Running>>,
    /// Counted open while held (`seckill_common::connections`).
    con: Option<Held<Con>>,
    slot: Slot,
    at_max_logged: bool,
}

impl Pool {
    /// A pool of no consumer yet.
    pub fn new(
        config: Config,
        client: Target,
        metrics: Arc<Metrics>,
        shutdown: Shutdown,
        paused: PausedSales,
        members: Members,
    ) -> Pool {
        let max = config.worker_consumers_max;
        metrics.consumers_max.set(max as i64);
        Pool {
            config,
            client,
            metrics,
            shutdown,
            paused,
            members,
            claims: Claims::default(),
            slots: (0..max).map(|_| None).collect(),
            con: None,
            slot: Slot::new(Store::Redis),
            at_max_logged: false,
        }
    }

    fn running(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// Runs the consumers until shutdown: `first` (slot 0, built and its
    /// dependencies waited for by the caller) and the rest of the minimum
    /// at once, then one more each check while the backlog asks for it.
    /// Returns when every consumer has stopped and deregistered.
    pub fn run(mut self, first: Worker) {
        if let Err(e) = self.reclaim_previous() {
            log::warn!("reclaiming the lists of my previous run's consumers: {e}");
        }
        self.start(0, first, self.shutdown.clone());
        for slot in 1..self.config.worker_consumers_min {
            self.add(slot, "the minimum");
        }
        let every = (self.config.worker_scale_after / 2)
            .clamp(Duration::from_millis(100), Duration::from_secs(1));
        let mut checked: Option<Instant> = None;
        while !self.shutdown.is_triggered() {
            self.reap();
            let due = checked.is_none_or(|t| t.elapsed() >= every);
            if due && self.config.worker_consumers_max > self.config.worker_consumers_min {
                if let Err(e) = self.grow() {
                    log::warn!("consumer pool: reading the backlog: {e}");
                    self.con = None;
                }
                checked = Some(Instant::now());
            }
            seckill_common::backoff::sleep_unless(Duration::from_millis(100), &self.shutdown);
        }
        for r in self.slots.iter().flatten() {
            r.stop.trigger();
        }
        for r in self.slots.iter_mut().filter_map(Option::take) {
            join(r.handle);
        }
        self.metrics.consumers.set(0);
    }

    /// Joins the consumers that stopped on their own (idle).
    fn reap(&mut self) {
        for slot in self.slots.iter_mut() {
            if slot.as_ref().is_some_and(|r| r.handle.is_finished()) {
                if let Some(r) = slot.take() {
                    join(r.handle);
                }
            }
        }
        self.metrics.consumers.set(self.running() as i64);
    }

    /// Adds a consumer when fewer run than sales have a backlog (at least
    /// the minimum, at most the maximum).
    fn grow(&mut self) -> redis::RedisResult<()> {
        let running = self.running();
        let max = self.config.worker_consumers_max;
        let (backlogged, oldest_ms) = self.backlog()?;
        let want = backlogged.clamp(self.config.worker_consumers_min, max);
        if running >= want {
            if backlogged > max && !self.at_max_logged {
                log::warn!(
                    "consumer pool at its maximum of {max}: {backlogged} sales have a \
                     message older than {} ms (oldest {oldest_ms} ms)",
                    self.config.worker_scale_after.as_millis()
                );
                self.at_max_logged = true;
            }
            return Ok(());
        }
        self.at_max_logged = false;
        if let Some(slot) = self.slots.iter().position(Option::is_none) {
            let why = format!(
                "{backlogged} sales have a message older than {} ms (oldest {oldest_ms} ms)",
                self.config.worker_scale_after.as_millis()
            );
            self.add(slot, &why);
        }
        Ok(())
    }

    /// How many unpaused sales have a queue (bucket) holding a message
    /// older than `SECKILL_WORKER_SCALE_AFTER`, and the oldest age in ms
    /// (one `LINDEX` per queue, one pipeline).
    fn backlog(&mut self) -> redis::RedisResult<(usize, u64)> {
        if self.con.is_none() {
            let t = self.config.services.redis_timeout;
            self.con = Some(self.slot.hold(queue::open(&self.client, t, t)?));
        }
        let Some(con) = self.con.as_mut() else {
            return Ok((0, 0));
        };
        let sales = self.paused.unpaused(&queue::buckets(con)?);
        if sales.is_empty() {
            return Ok((0, 0));
        }
        let mut p = redis::pipe();
        for k in &sales {
            p.lindex(k.queue(), -1);
        }
        let oldest: Vec<Option<Vec<u8>>> = p.query(con)?;
        let now = seckill_common::now_ms();
        let after = self.config.worker_scale_after.as_millis() as u64;
        let ages: Vec<(u64, u64)> = sales
            .iter()
            .zip(&oldest)
            .filter_map(|(k, raw)| Some((k.sale_id, OrderMessage::parse(raw.as_ref()?).ok()?)))
            .map(|(sale, m)| (sale, now.saturating_sub(m.reserved_at_ms)))
            .collect();
        // Sales, not buckets: a sale's buckets share its MySQL row.
        let mut backlogged: Vec<u64> = ages
            .iter()
            .filter(|(_, a)| *a >= after)
            .map(|(s, _)| *s)
            .collect();
        backlogged.sort_unstable();
        backlogged.dedup();
        let oldest_ms = ages.iter().map(|(_, a)| *a).max().unwrap_or(0);
        Ok((backlogged.len(), oldest_ms))
    }

    /// Starts the consumer of `slot` (above 0), logging `why`.
    fn add(&mut self, slot: usize, why: &str) {
        let id = consumer_id(&self.config.worker_id, slot);
        let mut config = self.config.clone();
        config.worker_id = id.clone();
        let built = queue::Consumer::new(
            &config.services.redis_url,
            &id,
            config.services.redis_timeout,
            config.worker_block,
        )
        .map_err(|e| e.to_string())
        .and_then(|consumer| {
            let limits = apply::SessionLimits::for_heartbeat(config.worker_heartbeat_ttl);
            let db = apply::Db::new(
                &config.services.mysql_url,
                config.services.mysql_timeout,
                limits,
            )
            .map_err(|e| e.to_string())?;
            Ok((consumer, db))
        });
        let (consumer, db) = match built {
            Ok(b) => b,
            Err(e) => {
                log::error!("consumer {id}: cannot be built: {e}");
                return;
            }
        };
        let stop = Shutdown::new();
        let w = Worker::new(config, db, consumer, self.metrics.clone(), stop.clone());
        self.start(slot, w, stop);
        log::info!(
            "consumer {id} started ({why}): {} of at most {} running",
            self.running(),
            self.config.worker_consumers_max
        );
    }

    /// Runs `w` in `slot` on a thread of its own.
    fn start(&mut self, slot: usize, mut w: Worker, stop: Shutdown) {
        let idle =
            (slot >= self.config.worker_consumers_min).then_some(self.config.worker_idle_after);
        w.join_pool(self.claims.clone(), slot, idle);
        w.share_paused(self.paused.clone());
        let (client, members) = (self.client.clone(), self.members.clone());
        let config = self.config.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("consumer-{slot}"))
            .spawn(move || consume_thread(w, slot, &config, &client, &members));
        match spawned {
            Ok(handle) => self.slots[slot] = Some(Running { stop, handle }),
            Err(e) => log::error!("consumer in slot {slot}: no thread: {e}"),
        }
        self.metrics.consumers.set(self.running() as i64);
    }

    /// Moves back to their queues the processing lists of this process's
    /// consumers of a previous run (`ID.N` in `seckill:workers`: the
    /// worker id is unique, so that process is gone) and deregisters them,
    /// before any consumer of this run takes anything.
    fn reclaim_previous(&mut self) -> redis::RedisResult<()> {
        let t = self.config.services.redis_timeout;
        let mut con = queue::open(&self.client, t, t)?;
        let sales = queue::buckets(&mut con)?;
        let workers: Vec<String> = con.smembers(keys::WORKERS)?;
        let prefix = format!("{}.", self.config.worker_id);
        let mut moved = 0;
        for w in workers.iter().filter(|w| {
            w.strip_prefix(&prefix)
                .is_some_and(|n| n.parse::<usize>().is_ok_and(|n| n >= 1))
        }) {
            for s in &sales {
                moved += queue::reclaim(&mut con, *s, w)?;
            }
            housekeeping::deregister(&mut con, w, &sales)?;
        }
        if moved > 0 {
            log::warn!(
                "moved {moved} messages of my previous run's consumers back to their queues"
            );
            self.metrics.reclaimed.inc_by(moved);
        }
        Ok(())
    }
}

/// Joins a consumer's thread; a consumer that panicked takes the process
/// down with it, as a panic of the consuming loop always did (systemd
/// restarts it, and the restart reclaims what its consumers held).
fn join(handle: JoinHandle<()>) {
    if let Err(panic) = handle.join() {
        std::panic::resume_unwind(panic);
    }
}

/// One consumer's thread: registers it (slot 0 is registered by
/// [`crate::run`]), runs it, and when it stops takes it out of the
/// heartbeat and deregisters it.
fn consume_thread(
    mut w: Worker,
    slot: usize,
    process: &Config,
    client: &Target,
    members: &Members,
) {
    let mut config = process.clone();
    config.worker_id = w.id().to_string();
    if slot > 0 && !crate::register(client, &config, w.stop_flag()) {
        return;
    }
    members.add(&config.worker_id);
    w.run();
    members.remove(&config.worker_id);
    crate::leave(client, &config, w.sales());
}
