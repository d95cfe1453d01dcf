//! Owns the consuming loop: which sale's queue to take from next, when to
//! block, and what to do after a Redis error.
//!
//! Fairness across sales: one blocking call can watch only one queue, so the
//! loop makes a pass over every known sale, taking up to
//! `SECKILL_WORKER_BATCH` messages from each without blocking (a busy sale
//! cannot starve a quiet one: each gets at most one batch per pass). Only
//! when a whole pass found every queue empty does it block, for at most
//! `SECKILL_WORKER_BLOCK`, on one sale's queue, a different sale each idle
//! pass. A message for a quiet sale thus waits at most about one block time
//! plus one pass. Sales are rediscovered from `seckill:sales` every 2 s.
//!
//! A process may run several consumers (`pool.rs`). Batches of one sale
//! serialize on the sale's MySQL row, so a second consumer on the same
//! sale adds nothing (docs/PERFORMANCE.md, "Performance: worker"): a consumer takes
//! only from a sale no other consumer of its process holds ([`Claims`]),
//! and starts its pass at its own slot, so consumers spread over sales.

use crate::apply::Db;
use crate::batch::{BatchEnd, Handler};
use crate::config::Config;
use crate::crash::CrashPoints;
use crate::loss_watch::PausedSales;
use crate::metrics::Metrics;
use crate::queue::Consumer;
use crate::start_check::{self, StartCheck};
use crate::WorkerError;
use seckill_common::keys::SaleKeys;
use seckill_common::Shutdown;
use seckill_common::{redact, redis_error};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How often the set of sales is read again (a new sale is consumed within
/// this time plus one block).
pub const SALES_REFRESH: Duration = Duration::from_secs(2);

/// Whether `e` is an interrupted system call (`EINTR`). redis 1.x keeps an
/// I/O error as an `Arc<dyn Error>`, which is what `source` returns, so the
/// `io::Error` is looked for behind that `Arc` as well.
fn interrupted(e: &redis::RedisError) -> bool {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let Some(s) = std::error::Error::source(e) else {
        return false;
    };
    let io = s.downcast_ref::<std::io::Error>().or_else(|| {
        s.downcast_ref::<Shared>()
            .and_then(|a| a.downcast_ref::<std::io::Error>())
    });
    io.is_some_and(|io| io.kind() == std::io::ErrorKind::Interrupted)
}

/// The sales the consumers of one process are taking from right now: at
/// most one consumer of a process works on a sale at a time (on one of
/// its buckets' queues: every bucket of a sale decrements the same MySQL
/// row).
#[derive(Debug, Clone, Default)]
pub struct Claims(Arc<Mutex<HashSet<u64>>>);

/// A sale held by one consumer; given back when dropped.
pub struct Claim {
    claims: Claims,
    sale_id: u64,
}

impl Claims {
    /// Holds the sale of bucket `sale` for the caller; `None` when another
    /// consumer holds it.
    pub fn claim(&self, sale: SaleKeys) -> Option<Claim> {
        let mut held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        held.insert(sale.sale_id).then(|| Claim {
            claims: self.clone(),
            sale_id: sale.sale_id,
        })
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut held = self.claims.0.lock().unwrap_or_else(PoisonError::into_inner);
        held.remove(&self.sale_id);
    }
}

/// One consumer: its processing lists, its MySQL session, its loop.
pub struct Worker {
    config: Config,
    db: Db,
    consumer: Consumer,
    metrics: Arc<Metrics>,
    shutdown: Shutdown,
    /// Test builds only (`crate::crash`); nothing armed otherwise.
    crash: CrashPoints,
    /// The queues to consume: every bucket of every sale (`queue::buckets`).
    sales: Vec<SaleKeys>,
    sales_read: Option<Instant>,
    /// Index into `sales` of the queue to block on in the next idle pass.
    idle_turn: usize,
    /// A Redis error happened: reconnect and reclaim our own processing lists
    /// before taking anything new (a move may have happened unseen).
    must_reclaim: bool,
    /// Sales paused by the data-loss watch (`loss_watch.rs`): none of their
    /// messages is taken until the sale is repaired.
    paused: PausedSales,
    /// The last refusal logged per sale (`broken`).
    broken_sales: HashMap<SaleKeys, String>,
    /// The sales the other consumers of this process hold.
    claims: Claims,
    /// This consumer's slot in its process (0: the first); where its pass
    /// starts.
    slot: usize,
    /// Stop after taking nothing for this long (`None`: never; the
    /// consumers of the minimum).
    idle_stop: Option<Duration>,
    /// When this consumer last took a message (or started).
    last_took: Instant,
}

impl Worker {
    /// A worker over already-configured clients; nothing is contacted yet.
    pub fn new(
        config: Config,
        db: Db,
        consumer: Consumer,
        metrics: Arc<Metrics>,
        shutdown: Shutdown,
    ) -> Worker {
        Worker {
            config,
            db,
            consumer,
            metrics,
            shutdown,
            crash: CrashPoints::from_env(),
            sales: Vec::new(),
            sales_read: None,
            idle_turn: 0,
            must_reclaim: true,
            paused: PausedSales::default(),
            broken_sales: HashMap::new(),
            claims: Claims::default(),
            slot: 0,
            idle_stop: None,
            last_took: Instant::now(),
        }
    }

    /// Makes this consumer slot `slot` of a pool sharing `claims`, stopping
    /// after `idle_stop` without a message (`None`: never).
    pub fn join_pool(&mut self, claims: Claims, slot: usize, idle_stop: Option<Duration>) {
        self.claims = claims;
        self.slot = slot;
        self.idle_stop = idle_stop;
    }

    /// The flag that stops this consumer.
    pub fn stop_flag(&self) -> &Shutdown {
        &self.shutdown
    }

    /// This consumer's id (its processing lists' and heartbeat's name).
    pub fn id(&self) -> &str {
        &self.config.worker_id
    }

    /// Shares the set of paused sales the data-loss watch keeps.
    pub fn share_paused(&mut self, paused: PausedSales) {
        self.paused = paused;
    }

    /// The buckets of the sales this worker last read from `seckill:sales`
    /// (ascending): the ones it may have processing lists for.
    pub fn sales(&self) -> &[SaleKeys] {
        &self.sales
    }

    /// Waits until Redis and MySQL both answer (retrying with backoff) and
    /// MySQL holds this build's schema (`start_check`); `Ok(false)` when
    /// shutdown came first. Each failure names the address (without its
    /// password) and the variable that sets it.
    ///
    /// Errors: [`WorkerError::MysqlRefused`] when MySQL refuses what waiting
    /// cannot fix (access denied, unknown database, missing tables);
    /// [`WorkerError::RedisRefused`] when Redis refuses the password.
    pub fn wait_for_dependencies(&mut self) -> Result<bool, WorkerError> {
        let mut backoff = crate::RETRY;
        let redis_at = redact::address(&self.config.services.redis_url, "SECKILL_REDIS_URL");
        let mysql_at = redact::address(&self.config.services.mysql_url, "SECKILL_MYSQL_URL");
        loop {
            let redis = self.consumer.con().map(|_| ());
            let mysql = start_check::check(
                &self.config.services.mysql_url,
                self.config.services.mysql_timeout,
            );
            match (redis, mysql) {
                (_, Err(StartCheck::Permanent(why))) => {
                    return Err(WorkerError::MysqlRefused(format!("{mysql_at}: {why}")));
                }
                (Err(e), _) if redis_error::is_auth(&e) => {
                    let why = redis_error::explain(&e);
                    return Err(WorkerError::RedisRefused(format!("{redis_at}: {why}")));
                }
                (Ok(()), Ok(())) => return Ok(true),
                (r, m) => {
                    if let Err(e) = r {
                        log::warn!("waiting for redis at {redis_at}: {e}");
                        self.consumer.reset();
                    }
                    if let Err(e) = m {
                        log::warn!("waiting for mysql at {mysql_at}: {e}");
                    }
                }
            }
            if !backoff.sleep(&self.shutdown) {
                return Ok(false);
            }
        }
    }

    fn refresh_sales(&mut self) -> redis::RedisResult<()> {
        if self.sales_read.is_some_and(|t| t.elapsed() < SALES_REFRESH) {
            return Ok(());
        }
        let sales = crate::queue::buckets(self.consumer.con()?)?;
        if sales != self.sales {
            log::info!("consuming {} sale queues", sales.len());
        }
        self.sales = sales;
        self.sales_read = Some(Instant::now());
        Ok(())
    }

    /// Logs (once per distinct error per sale) that Redis refused a command
    /// on one sale's keys; the sale is skipped until they are fixed.
    fn broken(&mut self, sale: SaleKeys, e: &redis::RedisError) {
        let text = e.to_string();
        if self.broken_sales.get(&sale) != Some(&text) {
            log::error!(
                "{}: skipped: Redis refused its queue or processing list: {text}",
                sale.tag()
            );
            self.broken_sales.insert(sale, text);
        }
    }

    fn redis_failed(&mut self, e: &redis::RedisError) {
        if interrupted(e) {
            // SIGTERM arrives before the flag is set (ctrlc sets it from its
            // own thread); not a Redis problem.
            log::info!("redis call interrupted by a signal");
        } else {
            log::warn!(
                "redis at {}: {e}",
                redact::address(&self.config.services.redis_url, "SECKILL_REDIS_URL")
            );
        }
        self.metrics.redis_errors.inc();
        self.consumer.reset();
        self.must_reclaim = true;
    }

    /// Runs until the shutdown flag is set; the batch in hand is always
    /// finished (or, when MySQL is unreachable, left in the processing list)
    /// before returning.
    pub fn run(&mut self) {
        let mut backoff = crate::RETRY;
        self.last_took = Instant::now();
        while !self.shutdown.is_triggered() {
            if let Some(idle) = self.idle_stop.filter(|&d| self.last_took.elapsed() >= d) {
                log::info!(
                    "consumer {}: took nothing for {} ms: stopping",
                    self.config.worker_id,
                    idle.as_millis()
                );
                break;
            }
            match self.pass() {
                Ok(()) => backoff.reset(),
                Err(e) if self.shutdown.is_triggered() => {
                    // Typically the signal interrupted the blocking call
                    // (EINTR); the server may still have moved a message,
                    // which the reclaim below puts back.
                    log::info!("redis call ended by shutdown: {e}");
                    self.consumer.reset();
                    self.must_reclaim = true;
                }
                Err(e) => {
                    self.redis_failed(&e);
                    if !backoff.sleep(&self.shutdown) {
                        break;
                    }
                }
            }
        }
        // Holding no batch now: put back anything left in this worker's
        // processing lists (a batch MySQL could not take, a move the signal
        // interrupted) so other workers take it at once. Best effort: a
        // restart or the other workers' reclaim covers a failure here.
        self.consumer.reset();
        let sales = self.sales.clone();
        match self.consumer.reclaim_own(&sales) {
            Ok(0) => {}
            Ok(n) => {
                log::info!("put {n} untouched messages back on their queues");
                self.metrics.reclaimed.inc_by(n);
            }
            Err(e) => log::warn!("putting my processing lists back on exit: {e}"),
        }
    }

    /// One pass over every sale; blocks on one queue when all were empty.
    fn pass(&mut self) -> redis::RedisResult<()> {
        if self.must_reclaim {
            // Read the sales again: a lost move may be in any of them.
            self.sales_read = None;
            self.refresh_sales()?;
            let sales = self.sales.clone();
            let n = self.consumer.reclaim_own(&sales)?;
            if n > 0 {
                log::warn!("moved {n} messages of my previous run back to their queues");
            }
            self.metrics.reclaimed.inc_by(n);
            self.must_reclaim = false;
        }
        self.refresh_sales()?;
        let sales = self.paused.unpaused(&self.sales);
        if sales.is_empty() {
            seckill_common::backoff::sleep_unless(self.config.worker_block, &self.shutdown);
            return Ok(());
        }
        let mut took_any = false;
        for i in 0..sales.len() {
            if self.shutdown.is_triggered() {
                return Ok(());
            }
            let sale = sales[(i + self.slot) % sales.len()];
            let Some(_claim) = self.claims.claim(sale) else {
                continue;
            };
            let batch = match self.consumer.take(sale, self.config.worker_batch) {
                Ok(b) => b,
                // One sale's broken key (a queue or processing list of the
                // wrong type) must not stop the others: skip it this pass.
                Err(e) if seckill_common::is_error_reply(&e) => {
                    self.broken(sale, &e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            if !batch.is_empty() {
                took_any = true;
                self.finish(sale, batch);
                if self.must_reclaim {
                    return Ok(());
                }
            }
        }
        if took_any {
            self.last_took = Instant::now();
            return Ok(());
        }
        self.wait_and_finish(&sales)
    }

    /// The idle pass: blocks on one sale's queue (a different unheld one
    /// each time) for at most `SECKILL_WORKER_BLOCK`; when the other
    /// consumers hold every sale, sleeps that long instead.
    fn wait_and_finish(&mut self, sales: &[SaleKeys]) -> redis::RedisResult<()> {
        let mut held = None;
        for _ in 0..sales.len() {
            self.idle_turn = (self.idle_turn + 1) % sales.len();
            let sale = sales[self.idle_turn];
            if let Some(c) = self.claims.claim(sale) {
                held = Some((sale, c));
                break;
            }
        }
        let Some((sale, _claim)) = held else {
            seckill_common::backoff::sleep_unless(self.config.worker_block, &self.shutdown);
            return Ok(());
        };
        let first = match self.consumer.wait_one(sale) {
            Ok(m) => m,
            Err(e) if seckill_common::is_error_reply(&e) => {
                self.broken(sale, &e);
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        if let Some(first) = first {
            self.last_took = Instant::now();
            let mut batch = vec![first];
            if self.config.worker_batch > 1 {
                batch.extend(self.consumer.take(sale, self.config.worker_batch - 1)?);
            }
            self.finish(sale, batch);
        }
        Ok(())
    }

    fn finish(&mut self, sale: SaleKeys, batch: Vec<Vec<u8>>) {
        let handler = Handler::new(
            &self.config,
            &mut self.db,
            &mut self.consumer,
            &self.metrics,
            &self.shutdown,
            &mut self.crash,
        );
        match handler.handle(sale, batch) {
            BatchEnd::Settled => {}
            BatchEnd::Interrupted => {
                log::warn!(
                    "{}: stopping with a batch unapplied in my processing list",
                    sale.tag()
                )
            }
            BatchEnd::RedisFailed => {
                self.metrics.redis_errors.inc();
                self.consumer.reset();
                self.must_reclaim = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::interrupted;
    use std::io;

    #[test]
    fn eintr_from_redis_is_recognised() {
        let e = redis::RedisError::from(io::Error::from(io::ErrorKind::Interrupted));
        assert!(interrupted(&e), "{e}");
        let e = redis::RedisError::from(io::Error::from_raw_os_error(4));
        assert!(interrupted(&e), "{e}");
        let e = redis::RedisError::from(io::Error::from(io::ErrorKind::ConnectionReset));
        assert!(!interrupted(&e), "{e}");
    }
}
