//! Owns the group commit: connection threads hand purchases over a bounded
//! crossbeam channel to a few Redis threads, and each Redis thread sends
//! whatever has queued up meanwhile as one pipeline of `EVALSHA` calls (up
//! to [`MAX_BATCH`]) and sends each outcome back to the thread that waits
//! for it, which answers its client. Each script call stays atomic on its
//! own; the pipeline only saves round trips. A Redis thread never writes to
//! a client socket, so a client that stops reading cannot stall it. A
//! `NOSCRIPT` reply means that script did not run: the thread loads the
//! script and sends those purchases again.

use crate::metrics::Metrics;
use crate::redis_link::{Link, Unavailable};
use crossbeam_channel::Receiver;
use redis::Value;
use seckill_common::reservation::{parse_reply, prepare, reserve_script, ReserveOutcome};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Most purchases in one pipeline.
pub const MAX_BATCH: usize = 256;

/// Purchases waiting for a Redis thread; beyond it a purchase is answered
/// 503 at once.
pub const QUEUE_CAPACITY: usize = 8192;

/// What Redis said about one purchase (with [`crate::app::own`] applied),
/// or [`Unavailable`].
pub type Outcome = Result<ReserveOutcome, Unavailable>;

/// One purchase waiting for a pipeline.
pub struct Job {
    /// The sale.
    pub sale_id: u64,
    /// A valid user id (checked by the handler).
    pub user_id: String,
    /// A fresh id from `ids::new_reservation_id`.
    pub reservation_id: String,
    /// Where the outcome goes: the waiting connection thread.
    pub reply_to: Arc<Slot>,
}

/// A one-time mailbox for one purchase's outcome: a connection thread
/// waits on it, a Redis thread fills it. (A plain mutex and condition
/// variable: the waiting thread sleeps at once, where a channel would spin
/// and yield first, which costs more CPU than the whole purchase when
/// dozens of threads wait at once on two cores.)
#[derive(Default)]
pub struct Slot {
    outcome: Mutex<Option<Outcome>>,
    filled: Condvar,
}

impl Slot {
    /// Stores the outcome and wakes the waiter.
    pub fn fill(&self, outcome: Outcome) {
        let mut o = self.outcome.lock().unwrap_or_else(|p| p.into_inner());
        *o = Some(outcome);
        self.filled.notify_one();
    }

    /// Waits up to `timeout` for the outcome.
    ///
    /// Errors: [`Unavailable`] when none came in time.
    pub fn wait(&self, timeout: Duration) -> Outcome {
        let deadline = Instant::now() + timeout;
        let mut o = self.outcome.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(outcome) = o.take() {
                return outcome;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Unavailable);
            }
            o = match self.filled.wait_timeout(o, left) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
    }
}

/// Runs one Redis thread: takes the first waiting job, then whatever else
/// has queued up (at most [`MAX_BATCH`]), sends them as one pipeline, and
/// sends each outcome back. Runs until every job sender is dropped.
pub fn redis_thread(jobs: Receiver<Job>, mut link: Link, metrics: &Metrics) {
    let mut batch: Vec<Job> = Vec::with_capacity(MAX_BATCH);
    while let Ok(first) = jobs.recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(j) => batch.push(j),
                Err(_) => break,
            }
        }
        let results = run_batch(&mut link, &batch, metrics);
        for (job, r) in batch.drain(..).zip(results) {
            // The waiting thread may have given up (it answered 503).
            job.reply_to.fill(r);
        }
    }
}

fn run_batch(
    link: &mut Link,
    batch: &[Job],
    metrics: &Metrics,
) -> Vec<Result<ReserveOutcome, Unavailable>> {
    let mut results = vec![Err(Unavailable); batch.len()];
    let mut todo: Vec<usize> = (0..batch.len()).collect();
    // Two passes at most: the second only for NOSCRIPT replies.
    for pass in 0..2 {
        if todo.is_empty() {
            break;
        }
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for &i in &todo {
            let j = &batch[i];
            pipe.invoke_script(&prepare(j.sale_id, &j.user_id, &j.reservation_id));
        }
        metrics.pipelines.inc();
        metrics.pipelined.add(todo.len() as u64);
        let replies: Vec<Value> = match link.with(|con| pipe.query(con)) {
            Ok(r) => r,
            Err(Unavailable) => return results,
        };
        if replies.len() != todo.len() {
            log::error!(
                "redis: {} replies to a pipeline of {}",
                replies.len(),
                todo.len()
            );
            return results;
        }
        let mut again = Vec::new();
        for (&i, v) in todo.iter().zip(replies.iter()) {
            if let Value::ServerError(se) = v {
                if se.kind() == Some(redis::ServerErrorKind::NoScript) && pass == 0 {
                    again.push(i);
                    continue;
                }
            }
            let rid = &batch[i].reservation_id;
            results[i] = parse_reply(v)
                .map(|o| crate::app::own(o, rid))
                .map_err(|e| {
                    metrics.redis_errors.inc();
                    log::error!("redis: reservation: {e}");
                    Unavailable
                });
        }
        if !again.is_empty() {
            log::warn!("redis: NOSCRIPT in a pipeline; loading the script again");
            if link
                .with(|con| reserve_script().prepare_invoke().load(con))
                .is_err()
            {
                return results;
            }
        }
        todo = again;
    }
    results
}
