//! Owns the expiry sweep: a thread of the worker that expires pending
//! orders past their payment deadline and puts their units back on sale,
//! and completes every release whose Redis step is not done yet (a crash
//! between the MySQL and the Redis step, a cancellation).
//!
//! One pass: the payments that came before their order
//! ([`early_payment::apply`]); the pending orders past their deadline
//! ([`lifecycle::due_orders`], up to `SECKILL_WORKER_BATCH` by the index
//! (`status`, `pay_by`)), each closed in Redis ([`receipt::close`]: from
//! then on a payment for it is late) with every payment received before
//! the closing applied in MySQL first, then those still pending expired
//! ([`lifecycle::expire`], one transaction per sale); then
//! [`lifecycle::complete_releases`] (Redis, then the MySQL mark). So an
//! order whose payment the gateway received at or before `pay_by` is
//! never expired, however late a worker applies the payment
//! (`common/src/receipt.rs` has the argument). A
//! pass that did something is followed by the next at once; an idle one
//! by a pause of `SECKILL_WORKER_EXPIRY_EVERY`. Every worker runs one:
//! the guarded `UPDATE` (under the rows' locks) lets exactly one sweeper
//! expire an order, and the Redis step is idempotent by reservation id.
//! Why a worker thread rather than a reconciler command under a timer: the
//! worker already holds the connections, restarts under systemd, and runs
//! on every machine that applies orders, so the deadline lag is the pause
//! and not a timer's period (design note, "Order lifecycle").
//!
//! Test-only crash points (`crash.rs`, builds with the `crash-points`
//! feature only):
//! `expire_after_mysql` aborts right after a pass expired orders in MySQL,
//! `expire_after_redis` right after a Redis step and before its mark.

use crate::config::Config;
use crate::crash::{CrashPoint, CrashPoints};
use crate::links::Links;
use crate::metrics::{count, Metrics};
use crate::WorkerError;
use seckill_common::early_payment;
use seckill_common::lifecycle::{self, Completed, Due, Paid, PaymentOutcome};
use seckill_common::receipt::{self, Closing};
use seckill_common::redis_target::{Con, Target};
use seckill_common::Shutdown;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The sweep's settings and handles.
pub struct Expiry {
    /// Redis.
    pub client: Target,
    /// `SECKILL_MYSQL_URL`.
    pub mysql_url: String,
    /// `SECKILL_REDIS_TIMEOUT`.
    pub redis_timeout: Duration,
    /// `SECKILL_MYSQL_TIMEOUT`.
    pub mysql_timeout: Duration,
    /// Orders per pass (`SECKILL_WORKER_BATCH`).
    pub batch: usize,
    /// Pause after an idle pass (`SECKILL_WORKER_EXPIRY_EVERY`).
    pub every: Duration,
    /// Stops the thread.
    pub shutdown: Shutdown,
    /// Expiries, releases and early payments counted.
    pub metrics: Arc<Metrics>,
}

/// Starts the sweep of a worker configured by `config` (see [`Expiry`]).
///
/// Errors: [`WorkerError::Thread`] when the thread could not be created.
pub fn start(
    config: &Config,
    client: &Target,
    shutdown: &Shutdown,
    metrics: &Arc<Metrics>,
) -> Result<JoinHandle<()>, WorkerError> {
    Expiry {
        client: client.clone(),
        mysql_url: config.services.mysql_url.clone(),
        redis_timeout: config.services.redis_timeout,
        mysql_timeout: config.services.mysql_timeout,
        batch: config.worker_batch,
        every: config.worker_expiry_every,
        shutdown: shutdown.clone(),
        metrics: metrics.clone(),
    }
    .start()
    .map_err(|e| WorkerError::Thread(e.to_string()))
}

impl Expiry {
    /// Starts the thread.
    ///
    /// Errors: the thread could not be created.
    pub fn start(self) -> std::io::Result<JoinHandle<()>> {
        std::thread::Builder::new()
            .name("expiry".into())
            .spawn(move || self.run())
    }

    fn run(self) {
        let mut crash = CrashPoints::from_env();
        let mut links = Links::new(
            self.client.clone(),
            self.redis_timeout,
            self.mysql_url.clone(),
            self.mysql_timeout,
            "expiry sweep",
        );
        while !self.shutdown.is_triggered() {
            let busy = links
                .run(|con, conn| self.pass(conn, con, &mut crash))
                .unwrap_or(false);
            if !busy {
                self.pause();
            }
        }
    }

    /// Sleeps `every` in slices of at most 50 ms, so a shutdown is seen soon.
    fn pause(&self) {
        let mut left = self.every;
        while !left.is_zero() && !self.shutdown.is_triggered() {
            let step = left.min(Duration::from_millis(50));
            std::thread::sleep(step);
            left -= step;
        }
    }

    /// Counts the payments the sweep decided and writes `paid` as the Redis
    /// status of each order they paid (MySQL decided; a failed write is
    /// logged, and the reconciler compares MySQL).
    fn decided(&self, db: &mut mysql::Conn, con: &mut Con, decided: &[early_payment::Decided]) {
        for d in decided {
            count(
                &self.metrics.payments,
                crate::metrics::payment_outcome_index(d.outcome),
            );
            if d.outcome == PaymentOutcome::Paid {
                if let Err(e) = crate::payments::write_paid(con, db, &d.reservation_id) {
                    log::warn!("expiry sweep: paid status of {}: {e}", d.reservation_id);
                }
            }
        }
    }

    /// One pass; `true` when it decided, expired or completed anything.
    fn pass(
        &self,
        db: &mut mysql::Conn,
        con: &mut Con,
        crash: &mut CrashPoints,
    ) -> Result<bool, PassError> {
        // Payments that came before their order first: an order paid in
        // time is decided paid before its deadline can expire it.
        let early = early_payment::apply(db, self.batch)?;
        self.decided(db, con, &early);
        let due = lifecycle::due_orders(db, self.batch)?;
        let (closed, applied) = close(db, con, &due)?;
        let rids: Vec<String> = closed.iter().map(|d| d.reservation_id.clone()).collect();
        let waiting = early_payment::apply_for(db, &rids)?;
        self.decided(db, con, &waiting);
        let expired = lifecycle::expire(db, &closed)?;
        if expired > 0 {
            crash.reached(CrashPoint::ExpireAfterMysql);
        }
        let mut between = || crash.reached(CrashPoint::ExpireAfterRedis);
        self.metrics.expired.inc_by(expired as u64);
        let done: Completed = lifecycle::complete_releases(db, con, self.batch, &mut between)?;
        let releases = &self.metrics.releases;
        for (i, n) in [done.released, done.already, done.not_found]
            .into_iter()
            .enumerate()
        {
            if let Some(c) = releases.get(i) {
                c.inc_by(n as u64);
            }
        }
        if expired > 0 || done.released > 0 || done.already > 0 || done.not_found > 0 {
            log::info!(
                "expiry sweep: {expired} expired in MySQL ({} closed, {applied} payments received \
                 before the closing applied); Redis: {} released, {} already, {} not found",
                closed.len(),
                done.released,
                done.already,
                done.not_found
            );
        }
        Ok(!early.is_empty()
            || applied > 0
            || !waiting.is_empty()
            || expired > 0
            || done != Completed::default())
    }
}

/// Closes each of `due` in Redis (`receipt::close`) and applies in MySQL
/// every payment received before its closing (`lifecycle::pay`, one
/// payment by its id however many apply it), then forgets those receipts.
/// Returns the orders closed (those whose deadline Redis's clock has not
/// passed yet stay open for the next pass) and how many payments it
/// applied.
///
/// Errors: Redis or MySQL failures (what was closed stays closed; the next
/// pass closes again and gets the same receipts).
fn close(db: &mut mysql::Conn, con: &mut Con, due: &[Due]) -> Result<(Vec<Due>, usize), PassError> {
    let mut closed = Vec::with_capacity(due.len());
    let mut applied = 0;
    for d in due {
        let Closing::Closed(received) = receipt::close(con, &d.reservation_id, d.pay_by_ms)? else {
            continue;
        };
        for m in &received {
            let done = lifecycle::pay(db, &m.payment())?;
            log::info!(
                "expiry sweep: payment {} for {} received before the closing: {done:?}",
                m.payment_id,
                m.reservation_id
            );
            if let Paid::Applied(PaymentOutcome::Paid) | Paid::Duplicate(PaymentOutcome::Paid) =
                done
            {
                if let Err(e) = crate::payments::write_paid(con, db, &m.reservation_id) {
                    log::warn!("expiry sweep: paid status of {}: {e}", m.reservation_id);
                }
            }
            receipt::forget(con, m)?;
            applied += 1;
        }
        closed.push(d.clone());
    }
    Ok((closed, applied))
}

/// Why a pass stopped.
#[derive(Debug)]
enum PassError {
    /// A MySQL transition failed (or its Redis step).
    Lifecycle(lifecycle::LifecycleError),
    /// A receipt script failed.
    Redis(redis::RedisError),
}

impl std::fmt::Display for PassError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PassError::Lifecycle(e) => write!(f, "{e}"),
            PassError::Redis(e) => write!(f, "payment receipt: redis: {e}"),
        }
    }
}

impl From<lifecycle::LifecycleError> for PassError {
    fn from(e: lifecycle::LifecycleError) -> Self {
        PassError::Lifecycle(e)
    }
}

impl From<redis::RedisError> for PassError {
    fn from(e: redis::RedisError) -> Self {
        PassError::Redis(e)
    }
}
