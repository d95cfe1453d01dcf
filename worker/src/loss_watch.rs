//! Owns the worker's data-loss watch: a thread that every
//! `data_loss::WATCH_EVERY` (200 ms) compares each sale's reservation
//! sequence in Redis with the high-water mark in MySQL
//! (`seckill_common::data_loss`), raising the mark, pausing a sale whose
//! Redis is behind it, and keeping the set of paused sales the consuming
//! loop skips ([`PausedSales`]); each pass also checks the server's eviction
//! policy, so a policy changed at run time stops the consuming loop too.
//!
//! After a Redis master change (a failover, a restart) the gateways hold
//! each bucket's purchases until this watch has checked it on the new
//! master (`data_loss::STAMP_FIELD`): a sale that lost no purchase
//! resumes at that pass (logged once), one that did is paused.
//!
//! A split sale is compared bucket by bucket and paused as a whole (every
//! bucket's meta; `data_loss.rs`): the consuming loop skips all of a
//! paused sale's buckets, as the gateways refuse purchases in all of them.
//!
//! Sales watched: every sale MySQL has whose window has not been closed for
//! a minute, read from MySQL (a Redis that lost everything has lost its
//! sales set too; a closed sale cannot sell again). Each costs one MySQL
//! write per pass per worker (the checkpoints) and two reads (the marks,
//! and how many buckets they cover), plus one script per bucket.

use crate::links::Links;
use crate::metrics::Metrics;
use mysql::prelude::Queryable;
use seckill_common::data_loss::{self, SaleState, WATCH_EVERY};
use seckill_common::keys::SaleKeys;
use seckill_common::redis_target::{Con, Target};
use seckill_common::Shutdown;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

/// The sales the watch found paused, and whether the Redis server is unfit
/// (an eviction policy that can delete the sale's keys, seen at the watch's
/// last pass), shared with the consuming loop.
#[derive(Debug, Clone, Default)]
pub struct PausedSales {
    sales: Arc<RwLock<HashSet<u64>>>,
    unfit: Arc<AtomicBool>,
}

impl PausedSales {
    /// `sales` without the paused ones, in order; none while the server is
    /// unfit (the worker takes nothing then).
    pub fn unpaused(&self, sales: &[SaleKeys]) -> Vec<SaleKeys> {
        if self.unfit.load(Ordering::Acquire) {
            return Vec::new();
        }
        let p = self.sales.read().unwrap_or_else(|e| e.into_inner());
        sales
            .iter()
            .copied()
            .filter(|s| !p.contains(&s.sale_id))
            .collect()
    }

    fn set(&self, sale_id: u64, paused: bool) {
        let mut p = self.sales.write().unwrap_or_else(|e| e.into_inner());
        if paused {
            p.insert(sale_id);
        } else {
            p.remove(&sale_id);
        }
    }
}

/// What the watch thread needs.
pub struct LossWatch {
    /// Redis client (the thread opens its own connection).
    pub client: Target,
    /// `SECKILL_MYSQL_URL`.
    pub mysql_url: String,
    /// `SECKILL_REDIS_TIMEOUT`.
    pub redis_timeout: Duration,
    /// `SECKILL_MYSQL_TIMEOUT`.
    pub mysql_timeout: Duration,
    /// Filled for the consuming loop.
    pub paused: PausedSales,
    /// Where detections are counted.
    pub metrics: Arc<Metrics>,
    /// Stops the thread.
    pub shutdown: Shutdown,
    /// The last refusal logged per sale (each said once).
    pub refused: std::sync::Mutex<std::collections::HashMap<u64, String>>,
}

impl LossWatch {
    /// Starts the thread.
    ///
    /// Errors: the thread could not be created.
    pub fn start(self) -> std::io::Result<JoinHandle<()>> {
        std::thread::Builder::new()
            .name("loss-watch".into())
            .spawn(move || self.run())
    }

    fn run(self) {
        let mut links = Links::new(
            self.client.clone(),
            self.redis_timeout,
            self.mysql_url.clone(),
            self.mysql_timeout,
            "data-loss watch",
        );
        while !self.shutdown.is_triggered() {
            links.run(|con, conn| self.pass(con, conn));
            std::thread::sleep(WATCH_EVERY);
        }
    }

    fn pass(&self, con: &mut Con, db: &mut mysql::Conn) -> Result<(), data_loss::WatchError> {
        // A policy changed on a live connection would otherwise be seen
        // only at the consumer's next reconnect.
        match seckill_common::redis_server::check(con) {
            Ok(_) => {
                if self.paused.unfit.swap(false, Ordering::AcqRel) {
                    log::info!("redis: the eviction policy is fixed; consuming again");
                }
            }
            Err(seckill_common::redis_server::ServerError::Redis(e)) => return Err(e.into()),
            Err(e) => {
                if !self.paused.unfit.swap(true, Ordering::AcqRel) {
                    log::error!("{e}; taking no messages until it is fixed");
                }
            }
        }
        // Sales that can still sell (window not closed a minute ago): a
        // closed sale cannot sell twice, and each watched sale costs one
        // MySQL write per pass.
        let sales: Vec<u64> = db.query(
            "SELECT id FROM sales WHERE ends_at > UTC_TIMESTAMP(3) - INTERVAL 1 MINUTE ORDER BY id",
        )?;
        for sale in sales {
            let state = match data_loss::watch_sale(con, db, sale) {
                Ok(s) => s,
                // One sale's broken key must not blind the watch to the
                // others: that sale is skipped (its marks do not move).
                Err(data_loss::WatchError::Redis(e)) if seckill_common::is_error_reply(&e) => {
                    let text = e.to_string();
                    let mut said = self.refused.lock().unwrap_or_else(|p| p.into_inner());
                    if said.get(&sale) != Some(&text) {
                        log::error!("sale {sale}: data-loss watch skipped: {text}");
                        said.insert(sale, text);
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            match state {
                SaleState::Consistent { redis_seq, moved } => {
                    if !moved.is_empty() {
                        log::info!(
                            "sale {sale}: checked on a new Redis master (buckets {moved:?}): \
                             no purchase lost (reservation sequence {redis_seq}); purchases \
                             resume"
                        );
                    }
                    self.paused.set(sale, false)
                }
                SaleState::Absent => self.paused.set(sale, false),
                SaleState::LossDetected { gaps } => {
                    self.metrics.data_loss_detected.inc();
                    let behind: Vec<String> = gaps
                        .iter()
                        .map(|g| {
                            format!(
                                "bucket {}: reservation sequence {} vs {}, checkpoint {} vs {}",
                                g.bucket, g.redis_seq, g.seq_high, g.checkpoint, g.checkpoint_high
                            )
                        })
                        .collect();
                    log::error!(
                        "sale {sale}: Redis lost data of this sale (Redis is behind what MySQL \
                         has seen: {}; or fewer buyer marks / flow records than units taken, \
                         or a loaded sale's stock counter or meta is gone); sale paused, every bucket: run \
                         `seckill-reconciler run`, then `seckill-reconciler sale repair {sale} \
                         --by NAME`",
                        behind.join("; ")
                    );
                    self.paused.set(sale, true);
                }
                SaleState::Paused { .. } => self.paused.set(sale, true),
            }
        }
        Ok(())
    }
}
