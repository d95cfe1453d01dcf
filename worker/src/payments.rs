//! Owns the worker's payment consumer: a thread that takes payments from
//! the payment queue (`seckill_common::payment`) into this worker's own
//! processing list, applies each in MySQL (`lifecycle::pay`, idempotent by
//! `payment_id`) and only then removes it. On start it puts back what its
//! processing list still holds from a previous run (a crash: applied or
//! not, a repeat is one payment). A failed application is put back on the
//! queue and retried with backoff; it counts one failed attempt only once
//! `SECKILL_WORKER_RETRY_FOR` passed since the message's first failure
//! (the field `ID:since` of the attempts hash, Unix ms), so a short MySQL
//! fault (a table renamed by a migration, a grant being changed, the
//! server restarting) dead-letters no payment. A payment that fails
//! `SECKILL_WORKER_MAX_ATTEMPTS` counted times, or does not parse, goes to
//! the dead-letter list.
//!
//! After a payment that made its order `paid` (applied now, or found
//! applied already, as a redelivery repairs a lost write) the reservation's
//! Redis status becomes `paid`, for `GET .../purchases/me`; after any
//! payment committed, its receipt is forgotten (`seckill_common::receipt`:
//! MySQL holds it now). The same queue
//! carries the buyers' cancellations (`payment::Queued::Cancel`): the
//! MySQL step (`lifecycle::cancel`, which decides) and then the release's
//! Redis step (`lifecycle::redis_step`; a failure there is completed by
//! the next expiry sweep). A cancellation of an order no longer pending,
//! or of none, changes nothing and is logged.

use crate::config::Config;
use crate::metrics::{count, Metrics};
use crate::queue;
use crate::WorkerError;
use prometheus_client::metrics::counter::Counter;
use redis::Commands;
use seckill_common::connections::{Held, Slot, Store};
use seckill_common::keys::PurchaseStatus;
use seckill_common::lifecycle::{self, Cancelled, Paid, PaymentOutcome};
use seckill_common::payment::{self, CancelMessage, PaymentMessage, Queued};
use seckill_common::receipt;
use seckill_common::redis_target::{Con, Target};
use seckill_common::release::OrderRelease;
use seckill_common::Shutdown;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Starts the consumer of a worker configured by `config`.
///
/// Errors: [`WorkerError::Thread`] when the thread could not be created.
pub fn start(
    config: &Config,
    client: &Target,
    shutdown: &Shutdown,
    metrics: &Arc<Metrics>,
) -> Result<JoinHandle<()>, WorkerError> {
    let c = Consumer {
        client: client.clone(),
        config: config.clone(),
        shutdown: shutdown.clone(),
        metrics: metrics.clone(),
    };
    std::thread::Builder::new()
        .name("payments".into())
        .spawn(move || c.run())
        .map_err(|e| WorkerError::Thread(e.to_string()))
}

struct Consumer {
    client: Target,
    config: Config,
    shutdown: Shutdown,
    /// Payments and cancellations by outcome.
    metrics: Arc<Metrics>,
}

/// The index in `metrics::PAYMENT_OUTCOMES` of what a payment came to.
fn payment_outcome(p: &Paid) -> usize {
    match p {
        Paid::Applied(o) => crate::metrics::payment_outcome_index(*o),
        Paid::Duplicate(_) => 5,
        Paid::Conflict(_) => 6,
    }
}

/// How long one blocking take waits.
const BLOCK: Duration = Duration::from_millis(200);

impl Consumer {
    fn run(self) {
        let mine = payment::processing(&self.config.worker_id);
        let mut redis: Option<Held<Con>> = None;
        let mut db: Option<Held<mysql::Conn>> = None;
        let (mut redis_slot, mut db_slot) = (Slot::new(Store::Redis), Slot::new(Store::Mysql));
        let mut reclaimed = false;
        let mut backoff = crate::RETRY;
        while !self.shutdown.is_triggered() {
            if redis.is_none() {
                let read = self.config.services.redis_timeout + BLOCK;
                redis = queue::open(&self.client, self.config.services.redis_timeout, read)
                    .ok()
                    .map(|c| redis_slot.hold(c));
            }
            if db.is_none() {
                db = seckill_common::schema::connect(
                    &self.config.services.mysql_url,
                    self.config.services.mysql_timeout,
                )
                .ok()
                .map(|c| db_slot.hold(c));
            }
            let (Some(con), Some(conn)) = (redis.as_deref_mut(), db.as_deref_mut()) else {
                std::thread::sleep(BLOCK);
                continue;
            };
            let r = if reclaimed {
                self.one(con, conn, &mine)
            } else {
                reclaim(con, &mine).map(|()| reclaimed = true)
            };
            match r {
                Ok(()) => backoff.reset(),
                Err(e) => {
                    log::warn!("payments: {e}");
                    redis = None;
                    db = None;
                    backoff.sleep(&self.shutdown);
                }
            }
        }
    }

    /// Whether a failure of the message whose first-failure field is
    /// `since` counts as an attempt: only once `SECKILL_WORKER_RETRY_FOR`
    /// passed since its first failure (recorded now when there is none).
    fn counts(&self, con: &mut Con, since: &str) -> Result<bool, String> {
        let now = seckill_common::now_ms();
        let _: bool = con
            .hset_nx(payment::ATTEMPTS, since, now)
            .map_err(|e| e.to_string())?;
        let first: u64 = con
            .hget::<_, _, Option<u64>>(payment::ATTEMPTS, since)
            .map_err(|e| e.to_string())?
            .unwrap_or(now);
        let window = u64::try_from(self.config.worker_retry_for.as_millis()).unwrap_or(u64::MAX);
        Ok(now.saturating_sub(first) >= window)
    }

    /// Takes and applies at most one payment.
    fn one(&self, con: &mut Con, db: &mut mysql::Conn, mine: &str) -> Result<(), String> {
        let raw: Option<Vec<u8>> = redis::cmd("BLMOVE")
            .arg(payment::QUEUE)
            .arg(mine)
            .arg("RIGHT")
            .arg("LEFT")
            .arg(BLOCK.as_secs_f64())
            .query(con)
            .map_err(|e| e.to_string())?;
        let Some(raw) = raw else { return Ok(()) };
        let m = match Queued::parse(&raw) {
            Ok(m) => m,
            Err(why) => {
                // Neither a payment nor a cancellation: counted as a payment.
                count(&self.metrics.payments, 8);
                return dead_letter(con, mine, &raw, &format!("unparsable: {why}"));
            }
        };
        let applied = match &m {
            Queued::Payment(p) => apply_payment(con, db, p).map(|paid| {
                count(&self.metrics.payments, payment_outcome(&paid));
            }),
            Queued::Cancel(c) => apply_cancel(con, db, c, &self.metrics.releases).map(|i| {
                count(&self.metrics.cancellations, i);
            }),
        };
        // The index of `retried` and `dead_lettered` in either label set.
        let (failures, retried, dead) = match &m {
            Queued::Payment(_) => (&self.metrics.payments, 7, 8),
            Queued::Cancel(_) => (&self.metrics.cancellations, 3, 4),
        };
        let field = m.attempts_field();
        let since = format!("{field}:since");
        match applied {
            Ok(()) => redis::pipe()
                .atomic()
                .lrem(mine, 1, &raw)
                .hdel(payment::ATTEMPTS, &[&field, &since])
                .query::<()>(con)
                .map_err(|e| e.to_string()),
            Err(e) => {
                if self.counts(con, &since)? {
                    let n: u32 = con
                        .hincr(payment::ATTEMPTS, &field, 1)
                        .map_err(|e| e.to_string())?;
                    if n >= self.config.worker_max_attempts {
                        count(failures, dead);
                        con.hdel::<_, _, ()>(payment::ATTEMPTS, &since)
                            .map_err(|e| e.to_string())?;
                        return dead_letter(con, mine, &raw, &e);
                    }
                }
                redis::pipe()
                    .atomic()
                    .lrem(mine, 1, &raw)
                    .lpush(payment::QUEUE, &raw)
                    .query::<()>(con)
                    .map_err(|e| e.to_string())?;
                count(failures, retried);
                Err(e)
            }
        }
    }
}

/// Applies one payment in MySQL; when its order is paid, its Redis status
/// becomes `paid`.
///
/// Returns what MySQL made of it.
///
/// Errors: MySQL or Redis failures, as text (the message is retried; the
/// payment id makes the repeat one payment).
fn apply_payment(con: &mut Con, db: &mut mysql::Conn, m: &PaymentMessage) -> Result<Paid, String> {
    let done = lifecycle::pay(db, &m.payment()).map_err(|e| e.to_string())?;
    if let Paid::Conflict(_) = done {
        log::warn!(
            "payment {} for {} ({} cents) conflicts with the payment of that id applied \
             before, which stands: recorded for the reconciler",
            m.payment_id,
            m.reservation_id,
            m.amount_cents
        );
    } else {
        log::info!(
            "payment {} for {}: {done:?}",
            m.payment_id,
            m.reservation_id
        );
    }
    if let Paid::Applied(PaymentOutcome::Paid) | Paid::Duplicate(PaymentOutcome::Paid) = done {
        write_paid(con, db, &m.reservation_id)?;
    }
    // MySQL holds it now: the sweep no longer needs the receipt.
    receipt::forget(con, m).map_err(|e| e.to_string())?;
    Ok(done)
}

/// Writes `paid` as the Redis status of order `reservation_id`, in the
/// bucket that holds it (`lifecycle::order_keys`; none for an archived
/// sale: a redelivery brings no key back).
///
/// Errors: MySQL or Redis failures, as text.
pub(crate) fn write_paid(
    con: &mut Con,
    db: &mut mysql::Conn,
    reservation_id: &str,
) -> Result<(), String> {
    let keys = lifecycle::order_keys(db, reservation_id).map_err(|e| e.to_string())?;
    if let Some(k) = keys {
        con.hset::<_, _, _, ()>(k.status(), reservation_id, PurchaseStatus::Paid.as_str())
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Applies one cancellation: the MySQL step decides, the Redis step of the
/// release follows.
///
/// Returns the index in `metrics::CANCEL_OUTCOMES` of what it came to;
/// the Redis step is counted in `releases` (`metrics::RELEASE_OUTCOMES`),
/// as the sweep counts the steps it does.
///
/// Errors: MySQL failures (nothing changed, retried), as text. A failed
/// Redis step is logged and left to the next sweep (MySQL's decision
/// stands; retrying the message would find the order no longer pending).
fn apply_cancel(
    con: &mut Con,
    db: &mut mysql::Conn,
    m: &CancelMessage,
    releases: &[Counter],
) -> Result<usize, String> {
    let decided = lifecycle::cancel_named(db, m.sale_id, &m.user_id, Some(&m.reservation_id))
        .map_err(|e| e.to_string())?;
    let index = match &decided {
        Cancelled::Done(_) => 0,
        Cancelled::NoOrder => 1,
        Cancelled::NotPending(_) => 2,
    };
    match decided {
        Cancelled::Done(rid) => {
            log::info!("sale {}: {} cancelled order {rid}", m.sale_id, m.user_id);
            let steps = lifecycle::pending_redis_steps(db, Some(m.sale_id), usize::MAX)
                .map_err(|e| e.to_string())?;
            for o in steps.iter().filter(|o| o.reservation_id == rid) {
                match lifecycle::redis_step(db, con, o, &mut || {}) {
                    Ok(r) => count(releases, release_outcome(r)),
                    Err(e) => log::warn!(
                        "sale {}: cancelled {rid}: {e}; the sweep completes it",
                        m.sale_id
                    ),
                }
            }
        }
        Cancelled::NoOrder => log::info!(
            "sale {}: cancellation of {} by {}: no order, nothing changed",
            m.sale_id,
            m.reservation_id,
            m.user_id
        ),
        Cancelled::NotPending(st) => log::info!(
            "sale {}: cancellation of {} by {}: order is {st}, nothing changed",
            m.sale_id,
            m.reservation_id,
            m.user_id
        ),
    }
    Ok(index)
}

/// The index in `metrics::RELEASE_OUTCOMES` of what a release's Redis
/// step came to.
fn release_outcome(r: OrderRelease) -> usize {
    match r {
        OrderRelease::Released { .. } => 0,
        OrderRelease::Already => 1,
        OrderRelease::NotFound => 2,
    }
}

/// Moves everything left in this worker's processing list back to the queue.
fn reclaim(con: &mut Con, mine: &str) -> Result<(), String> {
    loop {
        let moved: Option<Vec<u8>> = redis::cmd("LMOVE")
            .arg(mine)
            .arg(payment::QUEUE)
            .arg("RIGHT")
            .arg("RIGHT")
            .query(con)
            .map_err(|e| e.to_string())?;
        if moved.is_none() {
            return Ok(());
        }
    }
}

/// Moves `raw` from the processing list to the dead letters with `reason`.
fn dead_letter(con: &mut Con, mine: &str, raw: &[u8], reason: &str) -> Result<(), String> {
    log::error!("payment dead-lettered: {reason}");
    let entry = payment::dead_letter_entry(raw, reason);
    redis::pipe()
        .atomic()
        .lrem(mine, 1, raw)
        .lpush(payment::DEAD_LETTERS, entry)
        .query::<()>(con)
        .map_err(|e| e.to_string())
}
