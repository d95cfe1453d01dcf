//! Owns a purchase answered by the Redis thread that reserved it
//! ([`Answer`]): the connection thread hands the whole request over with
//! the purchase ([`hand_off`]) and goes back to reading its socket; the
//! Redis thread, once the script has answered, writes the reply without
//! waiting (tiny_http's `Request::respond_now`, patch 0015) and counts it.
//!
//! Why: a connection thread that waited for its purchase's outcome was
//! woken twice per purchase (its socket, then the outcome) against once
//! per health check; the second wake-up cost 5.7-7.5 µs of CPU per
//! purchase (`handoff_cost`, docs/PERFORMANCE.md "The hand-off").
//!
//! What keeps it safe:
//! - the Redis thread never waits on a client: an answer that cannot be
//!   written whole at once (the client stopped reading, an earlier answer
//!   of its connection is not written yet) is finished on a thread of its
//!   own ([`FINISHER`]), which waits as the connection thread would have;
//! - a connection has at most one handed-off purchase unanswered: while
//!   one is, its next purchase waits for its outcome on its own thread
//!   (today's path), so a client that pipelines purchases and never reads
//!   holds at most one finisher thread;
//! - a request pipelined behind a handed-off purchase is served only once
//!   Redis has decided that purchase ([`wait_for_decision`]): requests of
//!   a connection take effect in their order (RFC 9112, 9.3.2), so a
//!   status read, a cancellation or a retry sees the purchase before it
//!   (a status read pipelined after a purchase is never answered 404
//!   while the purchase gets its 202). A client that waits for each answer
//!   never waits here: the decision comes before the answer;
//! - a purchase still queued `Reserver::pipeline_wait` after it
//!   arrived is answered 503 by the Redis thread that takes it, and never
//!   sent (as a waiter that gave up);
//! - the stop waits for handed-off purchases as for any request being
//!   handled (`Lifecycle::active` is released when the answer is written).
//!
//! A split sale's purchase (it may pull units from other buckets: more
//! round trips) and a purchase without group commit stay on their
//! connection's thread.

use crate::http::{outcomes, Gateway};
use crate::metrics::Label;
use crate::purchase::Prepared;
use crate::redis::group_commit::{Deliver, Job, Outcome, ReplyTo};
use crate::redis::link::Unavailable;
use crossbeam_channel::Sender;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::Thread;
use std::time::{Duration, Instant};
use tiny_http::{Request, Unfinished};

/// The name of the threads that finish an answer the Redis thread could
/// not write at once.
pub const FINISHER: &str = "gw-finish";

thread_local! {
    /// On a connection thread: its last handed-off purchase, and the
    /// number of the connection it came from (tiny_http's
    /// `Request::connection_id`, patch 0017: never given twice by a
    /// server, where a peer address comes back with a client's next
    /// connection from the same port).
    static PENDING: RefCell<Option<(Arc<Pending>, u64)>> = const { RefCell::new(None) };
}

/// Where a handed-off purchase stands, for the requests behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Stage {
    /// Redis has not decided the purchase yet.
    Undecided = 0,
    /// Not decided, and the connection thread is parked until it is.
    Awaited = 1,
    /// Decided (an outcome, or not sent).
    Decided = 2,
}

/// A [`Stage`] shared between a connection thread and a Redis thread.
struct StageCell(AtomicU8);

impl StageCell {
    fn new(d: Stage) -> StageCell {
        StageCell(AtomicU8::new(d as u8))
    }

    fn of(v: u8) -> Stage {
        match v {
            0 => Stage::Undecided,
            1 => Stage::Awaited,
            _ => Stage::Decided,
        }
    }

    fn load(&self) -> Stage {
        StageCell::of(self.0.load(Ordering::Acquire))
    }

    fn store(&self, d: Stage) {
        self.0.store(d as u8, Ordering::Relaxed);
    }

    fn swap(&self, d: Stage) -> Stage {
        StageCell::of(self.0.swap(d as u8, Ordering::AcqRel))
    }

    /// Sets `new` if it is `current`.
    fn replace(&self, current: Stage, new: Stage) {
        let _ = self.0.compare_exchange(
            current as u8,
            new as u8,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }
}

/// A connection thread's last handed-off purchase, shared with its
/// [`Answer`] (one per connection thread, reused purchase after purchase).
pub struct Pending {
    /// Whether Redis has decided it.
    state: StageCell,
    /// Set when the answer is released: the connection may hand off the
    /// next purchase.
    released: AtomicBool,
    /// The connection thread, woken by the decision when it waits for it.
    thread: Thread,
}

impl Pending {
    /// An undecided purchase of the calling connection thread.
    fn of_this_thread() -> Arc<Pending> {
        Arc::new(Pending {
            state: StageCell::new(Stage::Undecided),
            released: AtomicBool::new(false),
            thread: std::thread::current(),
        })
    }

    /// Redis has decided the purchase: later requests of its connection
    /// may be served. Idempotent.
    fn decide(&self) {
        if self.state.swap(Stage::Decided) == Stage::Awaited {
            self.thread.unpark();
        }
    }
}

/// Waits, on a connection thread, until Redis has decided the purchase
/// this thread last handed off, if it came from the connection numbered
/// `connection`
/// (a request pipelined behind it must see it), at most `limit` (the
/// longest a purchase waits for its outcome on its own thread, as
/// `redis/reserver.rs` waits: three Redis timeouts queued, three more once
/// sent). Costs one load when there is nothing to wait for: a client that
/// waits for each answer gets it after the decision.
///
/// Returns false when `limit` ran out with the purchase still undecided:
/// the request must not be served (503: it could take effect before the
/// purchase ahead of it), and the next one waits again.
pub fn wait_for_decision(connection: u64, limit: Duration) -> bool {
    PENDING.with_borrow(|pending| {
        let Some((p, from)) = pending else {
            return true;
        };
        if p.state.load() == Stage::Decided || *from != connection {
            return true;
        }
        // Undecided, or awaited by an earlier wait that ran out; either
        // way the decision unparks this thread from now on.
        p.state.replace(Stage::Undecided, Stage::Awaited);
        let deadline = Instant::now() + limit;
        while p.state.load() != Stage::Decided {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                log::warn!("a handed-off purchase was not decided in {limit:?}; the request behind it is answered 503");
                return false;
            }
            std::thread::park_timeout(left);
        }
        true
    })
}

/// A purchase whose client the Redis thread answers. Dropping it releases
/// what the request held: its count (`/metrics`), its place under the
/// in-flight bound, its place in `Lifecycle::active`, and its
/// connection's claim.
pub struct Answer {
    gw: Arc<Gateway>,
    /// `None` once the reply is written (or handed to a finisher).
    rq: Option<Request>,
    sale_id: u64,
    label: Label,
    /// When the request was read (its latency, and its queue deadline).
    start: Instant,
    /// Past this the purchase is not sent (answered 503).
    deadline: Instant,
    /// The status written, for the count (500: none was, tiny_http's).
    status: u16,
    /// Its connection's: decided, then released.
    pending: Arc<Pending>,
}

impl Deliver for Answer {
    /// Whether the purchase may still be sent to Redis (false: queued past
    /// its deadline; it is answered 503).
    fn may_send(&self) -> bool {
        Instant::now() < self.deadline
    }

    /// Answers the client with what Redis said about the purchase of
    /// `user_id` (`Purchases::conclude`), without waiting on the client.
    fn deliver(mut self: Box<Self>, user_id: &str, outcome: Outcome) {
        // Redis is done with it: its connection's next request may go on
        // (its answer is written after this one, tiny_http keeps the order).
        self.pending.decide();
        let decision = self
            .gw
            .purchases
            .conclude(self.sale_id, 1, user_id, 1, outcome);
        let reply = outcomes::purchase(&decision);
        self.status = reply.status;
        let Some(rq) = self.rq.take() else {
            return;
        };
        match rq.respond_now(reply.into_response()) {
            Ok(None) => {}
            Ok(Some(rest)) => finish_elsewhere(*self, rest),
            Err(e) => log::debug!("writing a response: {e}"),
        }
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        // A request never answered (a panic on the way) gets tiny_http's
        // 500 here, before it is counted.
        drop(self.rq.take());
        self.gw.count(self.label, self.status, self.start);
        self.gw.admission.shed.free();
        self.gw.lifecycle.active.fetch_sub(1, Ordering::SeqCst);
        self.pending.decide();
        self.pending.released.store(true, Ordering::Release);
    }
}

/// The right to hand one purchase to the Redis threads ([`hand_off`]).
pub struct Claim<'a> {
    jobs: &'a Sender<Job>,
    pending: Arc<Pending>,
}

/// Whether the prepared purchase `p` is to be answered by a Redis thread:
/// a one-bucket sale's purchase under group commit whose connection (this
/// thread) has no handed-off purchase unanswered. `None`: it is completed
/// on this thread (`Purchases::complete`).
pub fn claim<'a>(gw: &'a Gateway, p: &Prepared<'_>, connection: u64) -> Option<Claim<'a>> {
    let jobs = gw.purchases.reserver.jobs()?;
    if p.k != 1 {
        return None;
    }
    let pending = PENDING.with_borrow_mut(|pending| match pending {
        Some((p, _)) if !p.released.load(Ordering::Acquire) => None,
        Some((p, from)) => {
            // Its answer has released it and will not touch it again.
            p.released.store(false, Ordering::Relaxed);
            p.state.store(Stage::Undecided);
            *from = connection;
            Some(p.clone())
        }
        None => {
            let p = Pending::of_this_thread();
            *pending = Some((p.clone(), connection));
            Some(p)
        }
    })?;
    Some(Claim { jobs, pending })
}

/// Hands the prepared purchase `p` and its request to the Redis threads,
/// which answer it ([`Answer::deliver`]); with the queue full, answers it
/// 503 at once.
///
/// The request stays counted in `Lifecycle::active` (the caller must not
/// release it) until the answer is written.
pub fn hand_off(
    gw: &Arc<Gateway>,
    rq: Request,
    sale_id: u64,
    start: Instant,
    p: Prepared<'_>,
    claim: Claim<'_>,
) {
    let Prepared {
        user_id,
        home,
        k: _,
        units: _,
        place,
    } = p;
    place.keep();
    let answer = Answer {
        gw: gw.clone(),
        rq: Some(rq),
        sale_id,
        label: Label::Purchase,
        start,
        deadline: start + gw.purchases.reserver.pipeline_wait(),
        status: 500,
        pending: claim.pending,
    };
    let job = Job {
        sale_id: home.sale_id,
        bucket: home.bucket,
        user_id,
        reservation_id: seckill_common::ids::new_reservation_id(),
        reply_to: ReplyTo::Client(Box::new(answer)),
    };
    if let Err(e) = claim.jobs.try_send(job) {
        // The queue is full: 503 now, from this thread.
        let job = e.into_inner();
        job.reply_to.fill(&job.user_id, Err(Unavailable));
    }
}

/// Writes the rest of an answer on a thread of its own (it may wait for
/// the client up to the socket's write timeout); the answer is released
/// after it. When no thread can be started the rest is given up and the
/// connection closed.
fn finish_elsewhere(answer: Answer, rest: Unfinished) {
    answer.gw.metrics.slow_answers.inc();
    let both = Arc::new(Mutex::new(Some((answer, rest))));
    let theirs = both.clone();
    let started = std::thread::Builder::new()
        .name(FINISHER.into())
        .stack_size(64 * 1024)
        .spawn(move || {
            let taken = theirs.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some((answer, rest)) = taken {
                if let Err(e) = rest.finish() {
                    log::debug!("writing a response: {e}");
                }
                drop(answer);
            }
        });
    if let Err(e) = started {
        log::warn!("no thread to finish an answer ({e}): closing its connection");
        let taken = both.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((_answer, rest)) = taken {
            rest.abandon();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Makes this thread's last hand-off an undecided purchase from the
    /// connection numbered `connection`.
    fn pending_from(connection: u64) -> Arc<Pending> {
        let p = Pending::of_this_thread();
        PENDING.with_borrow_mut(|slot| *slot = Some((p.clone(), connection)));
        p
    }

    #[test]
    fn only_the_same_connection_waits_and_the_decision_wakes_it() {
        let conn = 4000;
        let other = 4001;
        assert!(
            wait_for_decision(conn, Duration::ZERO),
            "nothing handed off"
        );
        let p = pending_from(conn);
        assert!(
            wait_for_decision(other, Duration::ZERO),
            "another connection"
        );
        let decider = p.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            decider.decide();
        });
        // A guard against a hang, not a timed assertion.
        assert!(wait_for_decision(conn, Duration::from_secs(30)));
        t.join().unwrap();
        assert!(wait_for_decision(conn, Duration::ZERO), "decided");
    }

    #[test]
    fn a_wait_that_runs_out_refuses_the_request_and_the_next_one_waits_again() {
        let conn = 4002;
        let p = pending_from(conn);
        assert!(!wait_for_decision(conn, Duration::from_millis(10)));
        // Still undecided: the next request is refused too (the state is
        // left awaited, not decided).
        assert!(!wait_for_decision(conn, Duration::from_millis(10)));
        p.decide();
        assert!(wait_for_decision(conn, Duration::from_millis(10)));
    }
}
