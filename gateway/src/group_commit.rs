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
/// variable: the waiting thread sleeps at once.) A waiter that gives up
/// marks it abandoned, so a Redis thread that has not sent the purchase yet
/// drops it instead of reserving a unit for a client already told 503.
#[derive(Default)]
pub struct Slot {
    state: Mutex<SlotState>,
    filled: Condvar,
}

#[derive(Default)]
struct SlotState {
    outcome: Option<Outcome>,
    abandoned: bool,
}

impl Slot {
    fn lock(&self) -> std::sync::MutexGuard<'_, SlotState> {
        // A poisoned lock only means the other side panicked mid-update.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores the outcome and wakes the waiter.
    pub fn fill(&self, outcome: Outcome) {
        self.lock().outcome = Some(outcome);
        self.filled.notify_one();
    }

    /// Whether the waiter has given up (see [`Slot::wait`]).
    pub fn abandoned(&self) -> bool {
        self.lock().abandoned
    }

    /// Waits up to `timeout` for the outcome; on timeout marks the slot
    /// abandoned.
    ///
    /// Errors: [`Unavailable`] when none came in time.
    pub fn wait(&self, timeout: Duration) -> Outcome {
        let deadline = Instant::now() + timeout;
        let mut s = self.lock();
        loop {
            if let Some(outcome) = s.outcome.take() {
                return outcome;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                s.abandoned = true;
                return Err(Unavailable);
            }
            s = match self.filled.wait_timeout(s, left) {
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
        // Purchases whose client was already answered 503 (it waited longer
        // than `pipeline_wait`, e.g. behind a Redis stall) are not sent.
        let before = batch.len();
        batch.retain(|j| !j.reply_to.abandoned());
        metrics.abandoned.add((before - batch.len()) as u64);
        if batch.is_empty() {
            continue;
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

#[cfg(test)]
mod tests {
    use super::*;
    use seckill_common::reservation::ReserveOutcome;

    #[test]
    fn a_waiter_that_gives_up_marks_its_slot_abandoned() {
        let slot = Slot::default();
        assert!(!slot.abandoned());
        assert_eq!(slot.wait(Duration::from_millis(10)), Err(Unavailable));
        assert!(slot.abandoned());
        // A late outcome is harmless.
        slot.fill(Ok(ReserveOutcome::SoldOut));
    }

    #[test]
    fn an_outcome_filled_in_time_is_returned_and_the_slot_not_abandoned() {
        let slot = Arc::new(Slot::default());
        let filler = slot.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            filler.fill(Ok(ReserveOutcome::NotStarted));
        });
        assert_eq!(
            slot.wait(Duration::from_secs(5)),
            Ok(ReserveOutcome::NotStarted)
        );
        assert!(!slot.abandoned());
        t.join().unwrap();
    }
}
