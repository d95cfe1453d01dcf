//! Owns the group commit: connection threads hand purchases over a bounded
//! crossbeam channel to a few Redis threads, and each Redis thread sends
//! whatever has queued up meanwhile (up to [`MAX_BATCH`]) as one pipeline
//! of `EVALSHA` calls, one call per bucket carrying all of that bucket's
//! buyers (the script's batch form, `reservation::write_calls`: Redis
//! checks the sale once per call, not once per buyer), one pipeline per
//! master on a Redis Cluster (`slot_router.rs`), and sends each outcome
//! where it goes ([`ReplyTo`]): to whoever answers its client without
//! ever waiting on it ([`Deliver`], `http/answer.rs`), or to the thread that
//! waits for it (a split sale's purchase, a connection's second pipelined
//! purchase). Each call is atomic; the buyers in it are taken in order as
//! if one after the other. A `NOSCRIPT` reply means that script did not
//! run: the thread loads the script and sends those purchases again.

use crate::metrics::Metrics;
use crate::redis::link::{Link, Unavailable};
use crossbeam_channel::Receiver;
use redis::Value;
use seckill_common::keys::SaleKeys;
use seckill_common::reservation::{
    own, parse_batch, reserve_script, write_calls, Replied, ReserveKeys, ReserveOutcome,
};
use seckill_common::slot_router::{Packed, Replies};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Most purchases in one pipeline.
pub const MAX_BATCH: usize = 256;

// A batch's buyers of one bucket go in one call of the script, which
// refuses more than this.
const _: () = assert!(MAX_BATCH <= seckill_common::reservation::MAX_BUYERS_PER_CALL);

/// Purchases waiting for a Redis thread; beyond it a purchase is answered
/// 503 at once.
pub const QUEUE_CAPACITY: usize = 8192;

/// What Redis said about one purchase (with `reservation::own` applied),
/// or [`Unavailable`].
pub type Outcome = Result<Replied, Unavailable>;

/// One purchase waiting for a pipeline.
pub struct Job {
    /// The sale.
    pub sale_id: u64,
    /// The bucket of the sale (the buyer's home bucket; 0 for a sale of one).
    pub bucket: u32,
    /// A valid user id (checked by the handler).
    pub user_id: String,
    /// A fresh id from `ids::new_reservation_id`.
    pub reservation_id: String,
    /// Where the outcome goes.
    pub reply_to: ReplyTo,
}

/// Takes a purchase's outcome on the Redis thread that decided it, and
/// answers its client without waiting on it (`http/answer.rs`).
pub trait Deliver: Send {
    /// Whether the purchase may still be sent to Redis (false: queued past
    /// its deadline; [`Deliver::deliver`] is then called with
    /// [`Unavailable`]).
    fn may_send(&self) -> bool;

    /// Hands on what Redis said about the purchase of `user_id`.
    fn deliver(self: Box<Self>, user_id: &str, outcome: Outcome);
}

/// Where a purchase's outcome goes.
pub enum ReplyTo {
    /// To the thread that waits for it.
    Waiter(Arc<Slot>),
    /// To its client, answered on the Redis thread.
    Client(Box<dyn Deliver>),
}

impl ReplyTo {
    /// Whether the purchase may be written to Redis now (false: its waiter
    /// gave up, or it was queued past its deadline); if so a waiter keeps
    /// waiting for it past its queue timeout.
    pub fn mark_sent(&self) -> bool {
        match self {
            ReplyTo::Waiter(slot) => slot.mark_sent(),
            ReplyTo::Client(answer) => answer.may_send(),
        }
    }

    /// Sends the outcome where it goes.
    pub fn fill(self, user_id: &str, outcome: Outcome) {
        match self {
            ReplyTo::Waiter(slot) => slot.fill(outcome),
            ReplyTo::Client(answer) => answer.deliver(user_id, outcome),
        }
    }
}

/// A one-time mailbox for one purchase's outcome: a connection thread
/// waits on it, a Redis thread fills it. (A plain mutex and condition
/// variable: the waiting thread sleeps at once.)
///
/// Its phase settles who decides, under the one lock: a Redis thread marks
/// it sent just before writing the pipeline, unless the waiter has already
/// given up (then the purchase is not sent: its client was told 503); a
/// waiter whose purchase was sent keeps waiting for the answer (a little
/// longer), since the script may run.
#[derive(Default)]
pub struct Slot {
    state: Mutex<SlotState>,
    filled: Condvar,
}

#[derive(Default)]
struct SlotState {
    outcome: Option<Outcome>,
    phase: Phase,
}

#[derive(Default, Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    #[default]
    Queued,
    Sent,
    Abandoned,
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

    /// Marks the purchase as about to be written to Redis. Returns false
    /// (and it must not be sent) when the waiter has already given up.
    pub fn mark_sent(&self) -> bool {
        let mut s = self.lock();
        if s.phase == Phase::Abandoned {
            return false;
        }
        s.phase = Phase::Sent;
        true
    }

    /// Whether the waiter has given up (see [`Slot::wait`]).
    #[cfg(test)]
    fn abandoned(&self) -> bool {
        self.lock().phase == Phase::Abandoned
    }

    /// Waits for the outcome: up to `timeout` while the purchase is still
    /// queued (then the slot is abandoned), up to `timeout + sent_extra`
    /// once it has been sent.
    ///
    /// Errors: [`Unavailable`] when none came in time.
    pub fn wait(&self, timeout: Duration, sent_extra: Duration) -> Outcome {
        let start = Instant::now();
        let mut s = self.lock();
        let mut first = true;
        loop {
            if let Some(outcome) = s.outcome.take() {
                return outcome;
            }
            let limit = match s.phase {
                Phase::Sent => timeout + sent_extra,
                _ => timeout,
            };
            // The first wait is the whole limit: `start` was just taken
            // (one clock read fewer per purchase).
            let left = if first {
                limit
            } else {
                limit.saturating_sub(start.elapsed())
            };
            first = false;
            if left.is_zero() {
                if s.phase == Phase::Queued {
                    s.phase = Phase::Abandoned;
                }
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
///
/// `ack`: `Some((replicas, timeout))` with `SECKILL_REDIS_REPLICAS_ACK`: a
/// reservation is answered only once that many replicas have it (`WAIT`
/// after each master's pipeline), else 503.
pub fn redis_thread(
    jobs: Receiver<Job>,
    mut link: Link,
    metrics: &Metrics,
    ack: Option<(usize, Duration)>,
) {
    let mut batch: Vec<Job> = Vec::with_capacity(MAX_BATCH);
    while next_batch(&jobs, &mut batch) {
        let results = run_batch(&mut link, &batch, metrics, ack);
        for (job, r) in batch.drain(..).zip(results) {
            // A waiting thread may have given up (it answered 503).
            job.reply_to.fill(&job.user_id, r);
        }
    }
}

/// Fills the empty `batch` with the first waiting job (waiting for one)
/// and whatever else has queued up, at most [`MAX_BATCH`]. False once
/// every job sender is dropped.
pub fn next_batch(jobs: &Receiver<Job>, batch: &mut Vec<Job>) -> bool {
    let Ok(first) = jobs.recv() else {
        return false;
    };
    batch.push(first);
    while batch.len() < MAX_BATCH {
        match jobs.try_recv() {
            Ok(j) => batch.push(j),
            Err(_) => break,
        }
    }
    true
}

/// Most buckets whose reservation keys a Redis thread keeps encoded (a
/// flash sale is one hot sale, or one sale split over a few buckets).
pub const KEYS_KEPT: usize = 64;

thread_local! {
    /// The reservation keys of the buckets this Redis thread sent to last,
    /// so their six keys and the call's head are spelled once
    /// (`ReserveKeys`); cleared beyond [`KEYS_KEPT`].
    static KEYS: std::cell::RefCell<Vec<ReserveKeys>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A batch's purchases of one bucket: its keys and the jobs' indices.
type Group = (SaleKeys, Vec<usize>);

/// The purchases of a batch by bucket, in order of first arrival, each
/// bucket's in order: one call of the script per bucket (`write_calls`).
fn by_bucket(batch: &[Job], sent: &[usize]) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for &i in sent {
        let k = SaleKeys::bucket(batch[i].sale_id, batch[i].bucket);
        match groups.iter_mut().find(|(g, _)| *g == k) {
            Some((_, idx)) => idx.push(i),
            None => groups.push((k, vec![i])),
        }
    }
    groups
}

/// The batch's calls, one per bucket group, written into one buffer.
fn pack(batch: &[Job], groups: &[Group]) -> Packed {
    let purchases: usize = groups.iter().map(|(_, idx)| idx.len()).sum();
    let mut p = Packed::with_capacity(groups.len(), groups.len() * 320 + purchases * 80);
    let mut buyers: Vec<(&str, &str)> = Vec::with_capacity(purchases);
    KEYS.with_borrow_mut(|kept| {
        for (k, idx) in groups {
            let at = match kept.iter().position(|rk| rk.bucket == *k) {
                Some(at) => at,
                None => {
                    if kept.len() >= KEYS_KEPT {
                        kept.clear();
                    }
                    kept.push(ReserveKeys::of(*k));
                    kept.len() - 1
                }
            };
            let rk = &kept[at];
            buyers.clear();
            buyers.extend(
                idx.iter()
                    .map(|&i| (batch[i].user_id.as_str(), batch[i].reservation_id.as_str())),
            );
            p.push(rk.slot, |out| write_calls(out, rk, &buyers));
        }
    });
    p
}

fn run_batch(
    link: &mut Link,
    batch: &[Job],
    metrics: &Metrics,
    ack: Option<(usize, Duration)>,
) -> Vec<Outcome> {
    let mut results = vec![Err(Unavailable); batch.len()];
    let mut todo: Vec<usize> = (0..batch.len()).collect();
    // Two passes at most: the second only for NOSCRIPT replies.
    for pass in 0..2 {
        if todo.is_empty() {
            break;
        }
        // Built on the first call of the closure: after the connection is
        // up (a reconnect may wait out a Redis stall) and just before the
        // write, so a purchase whose client gave up meanwhile is left out.
        // A second call (a retry on a fresh connection) resends the same.
        // One call of the script per bucket, with that bucket's cluster
        // slot: on a cluster the batch goes as one pipeline per master
        // (`Con::pipeline_by_slot`).
        let mut pipe: Option<(Packed, Vec<Group>)> = None;
        let mut sent: Vec<usize> = Vec::new();
        let reply = link.with(|con| {
            let (p, _) = pipe.get_or_insert_with(|| {
                sent = todo
                    .iter()
                    .copied()
                    .filter(|&i| batch[i].reply_to.mark_sent())
                    .collect();
                let groups = by_bucket(batch, &sent);
                (pack(batch, &groups), groups)
            });
            if p.is_empty() {
                return Ok(Replies::new());
            }
            con.pipeline_by_slot(p, ack)
        });
        let Some((_, groups)) = pipe else {
            // No connection: nothing was sent.
            return results;
        };
        metrics.abandoned.inc_by((todo.len() - sent.len()) as u64);
        todo = sent;
        if todo.is_empty() {
            return results;
        }
        metrics.pipelines.inc();
        metrics.pipelined.inc_by(todo.len() as u64);
        let replies = match reply {
            Ok(r) => r,
            Err(Unavailable) => return results,
        };
        if replies.len() != groups.len() {
            log::error!(
                "redis: {} replies to a pipeline of {}",
                replies.len(),
                groups.len()
            );
            return results;
        }
        let mut again = Vec::new();
        for ((_, idx), reply) in groups.iter().zip(&replies) {
            let (v, acked) = (&reply.value, reply.replicated);
            if !reply.reached {
                // Its master is down (a failover): 503 for these purchases
                // only, the other masters' purchases keep their outcomes.
                metrics.redis_errors.inc_by(idx.len() as u64);
                continue;
            }
            if let Value::ServerError(se) = v {
                if se.kind() == Some(redis::ServerErrorKind::NoScript) && pass == 0 {
                    again.extend_from_slice(idx);
                    continue;
                }
            }
            for (&i, r) in idx.iter().zip(parse_batch(v, idx.len())) {
                let rid = &batch[i].reservation_id;
                results[i] = r.map(|o| own(o, rid)).map_err(|e| {
                    metrics.redis_errors.inc();
                    log::error!("redis: reservation: {e}");
                    Unavailable
                });
                // Reserved on the master, not yet on the replicas asked
                // for: no 202 (a retry finds it: 409 with its id).
                if !acked
                    && matches!(
                        results[i],
                        Ok(Replied {
                            outcome: ReserveOutcome::Reserved(_),
                            ..
                        })
                    )
                {
                    results[i] = Err(Unavailable);
                }
            }
        }
        if !again.is_empty() {
            log::warn!("redis: NOSCRIPT in a pipeline; loading the script again");
            if link.with(|con| con.load_script(reserve_script())).is_err() {
                return results;
            }
        }
        again.sort_unstable();
        todo = again;
    }
    results
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replied(outcome: ReserveOutcome) -> Replied {
        Replied {
            outcome,
            seq: 0,
            stock: None,
        }
    }

    #[test]
    fn a_waiter_that_gives_up_marks_its_slot_abandoned() {
        let slot = Slot::default();
        assert!(!slot.abandoned());
        assert_eq!(
            slot.wait(Duration::from_millis(10), Duration::from_secs(5)),
            Err(Unavailable)
        );
        assert!(slot.abandoned());
        // Never sent after that; a late outcome is harmless.
        assert!(!slot.mark_sent());
        slot.fill(Ok(replied(ReserveOutcome::SoldOut)));
    }

    #[test]
    fn a_sent_purchase_is_waited_for_past_the_queue_timeout() {
        let slot = Arc::new(Slot::default());
        assert!(slot.mark_sent());
        let filler = slot.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            filler.fill(Ok(replied(ReserveOutcome::SoldOut)));
        });
        // 20 ms for a queued purchase, but this one was sent.
        assert_eq!(
            slot.wait(Duration::from_millis(20), Duration::from_secs(5)),
            Ok(replied(ReserveOutcome::SoldOut))
        );
        assert!(!slot.abandoned());
        t.join().unwrap();
        // Sent and never answered: given up after timeout + extra.
        let slot = Slot::default();
        assert!(slot.mark_sent());
        assert_eq!(
            slot.wait(Duration::from_millis(10), Duration::from_millis(10)),
            Err(Unavailable)
        );
        assert!(!slot.abandoned());
    }

    #[test]
    fn an_outcome_filled_in_time_is_returned_and_the_slot_not_abandoned() {
        let slot = Arc::new(Slot::default());
        let filler = slot.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            filler.fill(Ok(replied(ReserveOutcome::NotStarted)));
        });
        assert_eq!(
            slot.wait(Duration::from_secs(5), Duration::ZERO),
            Ok(replied(ReserveOutcome::NotStarted))
        );
        assert!(!slot.abandoned());
        t.join().unwrap();
    }
}
