//! `seckill-worker`: turns the reservations queued in Redis into MySQL
//! orders, in batches, idempotently, losing and doubling nothing whatever
//! process dies.
//!
//! # Layout
//!
//! - [`consume`]: one consumer's loop (fair passes over every sale's queue,
//!   blocking only when all are empty).
//! - [`pool`]: the process's consumers, between a minimum and a maximum,
//!   added while sales have a backlog.
//! - [`batch`]: one batch from taking to settling: parse, fence (apply only
//!   messages whose flow record Redis still holds), apply, dead-letter,
//!   requeue; one [`batch::Batch`] records each message's outcome.
//! - [`apply`]: the MySQL transaction (orders, stock ledger, guarded stock
//!   decrement), idempotent by reservation id.
//! - [`queue`]: the Redis side of the reliable queue (take, block, the
//!   fence's read, attempt counts, the `MULTI` that settles a batch,
//!   reclaim).
//! - [`start_check`]: the start-up check of MySQL (what waiting cannot
//!   fix stops the worker with exit code 2 and the remedy).
//! - [`session`]: what every MySQL session sets when it opens (the limits
//!   that end a frozen worker's session, `READ COMMITTED`).
//! - [`housekeeping`]: heartbeat, reclaim of dead workers' processing lists,
//!   queue gauges.
//! - [`links`]: the lazily opened connections of the background threads.
//! - [`loss_watch`]: the data-loss watch (Redis behind MySQL's reservation
//!   sequence pauses the sale) and the paused sales the loop skips.
//! - [`expiry`]: the expiry sweep (pending orders past their deadline back
//!   on sale; the Redis step of every release).
//! - [`payments`]: the payment consumer (payment queue -> MySQL).
//! - [`metrics`]: `prometheus-client` metrics and the `/metrics` listener.
//! - [`config`]: the worker's settings (the shared Redis and MySQL ones,
//!   and `SECKILL_WORKER_*`), resolved from the raw environment.
//! - [`error`]: why `run` stops, and how MySQL failures are classified.
//! - [`crash`]: test-only crash points (`SECKILL_WORKER_CRASH_AT`).
//!
//! # Features
//!
//! - `crash-points` (off by default, for tests only): compiles in the crash
//!   points of [`crash`]. No crate enables it, so `cargo build --release`
//!   (or `-p seckill-worker`) never has them and ignores the variable;
//!   `scripts/test.sh` builds and tests with
//!   `--features seckill-worker/crash-points`, and the test harness refuses
//!   to run a crash test against a worker built without it.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod apply;
pub mod batch;
pub mod config;
pub mod consume;
pub mod crash;
pub mod error;
pub mod expiry;
pub mod housekeeping;
pub mod links;
pub mod loss_watch;
pub mod metrics;
pub mod payments;
pub mod pool;
pub mod queue;
pub mod session;
pub mod start_check;

pub use error::WorkerError;

use crate::config::Config;
use seckill_common::backoff::Backoff;
use seckill_common::redis_target::Target;
use seckill_common::Shutdown;
use std::sync::Arc;
use std::time::Duration;

/// The worker's backoff between retries of a failed MySQL or Redis call:
/// 20 ms doubling up to 1 s (copy it to start one).
pub const RETRY: Backoff = Backoff::new(Duration::from_millis(20), Duration::from_secs(1));

/// Runs the worker until `shutdown` is set: serves `/metrics`, waits for
/// Redis and MySQL, registers, reclaims its own processing lists of a
/// previous run, tells systemd it is ready, and consumes. On shutdown it
/// finishes the batch in hand, puts back what is left in its processing
/// lists, tells systemd it is stopping, deletes its heartbeat and, when
/// every processing list of it is empty, removes itself from
/// `seckill:workers`; then returns `Ok`.
///
/// Errors: [`WorkerError`] for what cannot be retried (bad URLs, metrics
/// address in use, MySQL refusing this user or lacking the database, its
/// tables or a migration: [`start_check`]). Unreachable Redis or MySQL is
/// waited for, not an error.
pub fn run(config: Config, shutdown: Shutdown) -> Result<(), WorkerError> {
    let client = Target::open(config.services.redis_url.as_str())
        .map_err(|e| WorkerError::BadRedisUrl(e.to_string()))?;
    let consumer = queue::Consumer::new(
        &config.services.redis_url,
        &config.worker_id,
        config.services.redis_timeout,
        config.worker_block,
    )
    .map_err(|e| WorkerError::BadRedisUrl(e.to_string()))?;
    let limits = apply::SessionLimits::for_heartbeat(config.worker_heartbeat_ttl);
    let db = apply::Db::new(
        &config.services.mysql_url,
        config.services.mysql_timeout,
        limits,
    )
    .map_err(WorkerError::BadMysqlUrl)?;
    let metrics = Arc::new(metrics::Metrics::new(&config.worker_id));
    let (addr, _http) = metrics::serve(config.worker_metrics_listen, metrics.clone())
        .map_err(WorkerError::MetricsListen)?;
    log::info!(
        "worker {}: metrics on http://{addr}/metrics",
        config.worker_id
    );

    let mut worker = consume::Worker::new(
        config.clone(),
        db,
        consumer,
        metrics.clone(),
        shutdown.clone(),
    );
    if !worker.wait_for_dependencies()? {
        seckill_common::notify::stopping();
        return Ok(());
    }
    // A live worker under this id keeps its lists: this one stops before
    // registering, before it would move them back to the queues.
    refuse_a_live_id(&client, &config)?;
    // Register before consuming so others know whose lists these are.
    if !register(&client, &config, &shutdown) {
        return Ok(());
    }
    let paused = loss_watch::PausedSales::default();
    let members = pool::Members::default();
    let watch = loss_watch::LossWatch {
        client: client.clone(),
        mysql_url: config.services.mysql_url.clone(),
        redis_timeout: config.services.redis_timeout,
        mysql_timeout: config.services.mysql_timeout,
        paused: paused.clone(),
        metrics: metrics.clone(),
        shutdown: shutdown.clone(),
        refused: Default::default(),
    }
    .start()
    .map_err(|e| WorkerError::Thread(e.to_string()))?;
    let sweep = expiry::start(&config, &client, &shutdown, &metrics)?;
    let pay = payments::start(&config, &client, &shutdown, &metrics)?;
    let house = housekeeping::Housekeeping {
        client: client.clone(),
        worker_id: config.worker_id.clone(),
        ttl: config.worker_heartbeat_ttl,
        timeout: config.services.redis_timeout,
        metrics: metrics.clone(),
        members: members.clone(),
        shutdown: shutdown.clone(),
    }
    .start()
    .map_err(|e| WorkerError::Thread(e.to_string()))?;
    seckill_common::notify::ready();
    log::info!(
        "worker {}: consuming (consumers {} to {}, one more while a sale's oldest message \
         is {} ms old, stopping after {} ms idle; batch {}, max attempts {}; mysql session \
         limits: idle in transaction {} s, lock wait {} s, net read/write {} s)",
        config.worker_id,
        config.worker_consumers_min,
        config.worker_consumers_max,
        config.worker_scale_after.as_millis(),
        config.worker_idle_after.as_millis(),
        config.worker_batch,
        config.worker_max_attempts,
        limits.idle_transaction_s,
        limits.lock_wait_s,
        limits.net_s
    );
    // Each consumer deregisters itself when it stops (`pool.rs`).
    pool::Pool::new(config.clone(), client, metrics, shutdown, paused, members).run(worker);
    seckill_common::notify::stopping();
    log::info!("worker {}: stopping", config.worker_id);
    let _ = house.join();
    let _ = watch.join();
    let _ = sweep.join();
    let _ = pay.join();
    Ok(())
}

/// Stops with [`WorkerError::IdLive`] when another worker is live under
/// this id ([`housekeeping::beaten_by_another`]); a Redis error here is
/// logged and lets the start go on (registering retries it anyway).
fn refuse_a_live_id(client: &Target, config: &Config) -> Result<(), WorkerError> {
    let t = config.services.redis_timeout;
    let live = queue::open(client, t, t).and_then(|mut c| {
        housekeeping::beaten_by_another(&mut c, &config.worker_id, config.worker_heartbeat_ttl)
    });
    match live {
        Ok(true) => Err(WorkerError::IdLive(config.worker_id.clone())),
        Ok(false) => Ok(()),
        Err(e) => {
            log::warn!(
                "checking worker {}'s heartbeat in redis at {}: {e}",
                config.worker_id,
                client.address()
            );
            Ok(())
        }
    }
}

/// Registers this worker in `seckill:workers` (see
/// [`housekeeping::register`]), retrying until Redis takes it; `false` when
/// shutdown comes first.
pub(crate) fn register(client: &Target, config: &Config, shutdown: &Shutdown) -> bool {
    let mut backoff = RETRY;
    loop {
        let r = queue::open(
            client,
            config.services.redis_timeout,
            config.services.redis_timeout,
        )
        .and_then(|mut c| {
            housekeeping::register(&mut c, &config.worker_id, config.worker_heartbeat_ttl)
        });
        match r {
            Ok(()) => return true,
            Err(e) => log::warn!("registering worker in redis at {}: {e}", client.address()),
        }
        if !backoff.sleep(shutdown) {
            return false;
        }
    }
}

/// Deregisters this worker on a clean exit (see
/// [`housekeeping::deregister`]); a failure only leaves it registered, which
/// is logged and harmless.
pub(crate) fn leave(client: &Target, config: &Config, sales: &[seckill_common::keys::SaleKeys]) {
    let id = &config.worker_id;
    let r = queue::open(
        client,
        config.services.redis_timeout,
        config.services.redis_timeout,
    )
    .and_then(|mut c| housekeeping::deregister(&mut c, id, sales));
    match r {
        Ok(housekeeping::Deregistered::Removed) => {
            log::info!("worker {id}: processing lists empty, deregistered")
        }
        Ok(housekeeping::Deregistered::Holding(n)) => log::warn!(
            "worker {id}: {n} messages left in my processing lists: staying registered so others reclaim them"
        ),
        Ok(housekeeping::Deregistered::Contended) => {
            log::warn!("worker {id}: my processing lists kept changing: staying registered")
        }
        Err(e) => log::warn!("worker {id}: deregistering: {e}; staying registered"),
    }
}
