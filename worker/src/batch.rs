//! Owns what happens to one batch taken from a sale's queue: parse, apply in
//! MySQL (one transaction, retried on deadlocks and lost connections; message
//! by message when the batch cannot go through whole), then settle it in
//! Redis ([`crate::queue::Consumer::settle`], one `MULTI`: statuses, dead
//! letters, requeues, and removal from the processing list). A [`Batch`]
//! records each message's outcome once, whichever path decided it.
//!
//! Order of effects, and why a crash anywhere is harmless: MySQL commits
//! first; Redis is settled after. A crash in between leaves the batch in the
//! processing list; it is reclaimed and applied again, and the apply is
//! idempotent (no second order, ledger row or decrement).
//!
//! The fence: a message is applied only while Redis still holds the
//! reservation behind it. Right before each MySQL transaction (after any
//! retry wait and the connect, immediately before `BEGIN`) one `HMGET` of
//! the sale's flow hash reads the flow records of the messages; a message
//! whose flow record is missing or differs byte for byte from it (pushed by
//! hand, or released by `seckill-reconciler resolve --rollback` while a
//! paused worker held it in memory) is dead-lettered with
//! [`NO_FLOW_RECORD`] and removed from the processing list, never applied;
//! its status and attempt count are left alone (a released reservation stays
//! `failed`, a made-up one gets none). Remaining window: a release between
//! that read and the `COMMIT` still becomes an order. The release script
//! refuses while the message is in a processing list, so this needs a worker
//! paused inside the window long enough for its list to be reclaimed; the
//! reconciler then reports the order as `order_without_flow`.
//!
//! A message whose buyer already holds an order of the sale from another
//! reservation is dead-lettered (`user already holds order N from
//! reservation R`, status `on_hold`), not confirmed; the same reservation id
//! again is "already done" (idempotency). In a sale of several units per
//! buyer, a message that would take its buyer over the sale's limit in
//! MySQL is dead-lettered the same way ([`OVER_BUYER_LIMIT`]). A dead
//! letter keeps its flow record, so its units stay taken in Redis and the
//! reconciler reports them (`flow_without_order` with the dead letter's
//! reason, and `dead_letter`) until an operator settles them (`resolve
//! --rollback` puts them back on sale).

use crate::apply::{Applied, Db};
use crate::config::Config;
use crate::crash::{CrashPoint, CrashPoints};
use crate::error::ApplyError;
use crate::metrics::Metrics;
use crate::queue::{Consumer, Settlement};
use seckill_common::dead_letter::DeadLetter;
use seckill_common::keys::SaleKeys;
use seckill_common::message::OrderMessage;
use seckill_common::status_write::Created;
use seckill_common::Shutdown;
use std::time::Instant;

/// How handling a batch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchEnd {
    /// Applied and settled: the processing list no longer holds it.
    Settled,
    /// Shutdown came while MySQL could not be reached: the batch stays in
    /// the processing list, to be reclaimed.
    Interrupted,
    /// Reading the flow records, counting attempts or settling in Redis
    /// failed: the batch stays in the processing list; the caller
    /// reconnects and reclaims it (a harmless redelivery).
    RedisFailed,
}

/// Dead-letter reason of a message that would take its buyer over the
/// sale's limit of units per buyer in MySQL (followed by the figures).
pub const OVER_BUYER_LIMIT: &str = "buyer over limit in MySQL";

/// Dead-letter reason of a message the fence refused.
pub const NO_FLOW_RECORD: &str =
    "no matching flow record: the reservation was released or never made";

/// The index in `metrics::DEAD_LETTER_REASONS` of a dead letter's
/// `reason`, by the reasons this file writes: the fence's
/// ([`NO_FLOW_RECORD`]), MySQL's final refusals (`unknown sale`, `stock
/// exhausted`, `user already holds`, [`OVER_BUYER_LIMIT`]), `max
/// attempts: ...` after `SECKILL_WORKER_MAX_ATTEMPTS` server errors, and a
/// message that does not parse or names another sale (`malformed`).
pub fn reason_label(reason: &str) -> usize {
    let prefixes: [(&str, usize); 7] = [
        (NO_FLOW_RECORD, 1),
        ("unknown sale", 2),
        ("stock exhausted", 3),
        ("user already holds", 4),
        ("max attempts", 5),
        (OVER_BUYER_LIMIT, 6),
        ("order message for sale", 0),
    ];
    if let Some((_, i)) = prefixes.iter().find(|(p, _)| reason.starts_with(p)) {
        return *i;
    }
    if reason.contains("order message") || reason.contains("malformed") {
        return 0;
    }
    7
}

/// What became of one message of a batch. Set once by whichever step
/// decided it; only `Refused` is replaced later (by its attempt count).
#[derive(Debug)]
enum Outcome {
    /// Parsed, for this sale, waiting for MySQL.
    Pending,
    /// Its order exists now (made by this batch or before): status
    /// `confirmed`, or `pending_payment` with this deadline (Unix ms),
    /// attempts cleared.
    Confirmed(Option<u64>),
    /// MySQL refused it: one failed attempt to count, then dead letter or
    /// requeue; `final_now` dead-letters it whatever the count (unknown
    /// sale, stock gone, the buyer's other order).
    Refused { reason: String, final_now: bool },
    /// Dead-lettered; status `on_hold` and attempts cleared when it names a
    /// reservation.
    Dead(DeadLetter),
    /// Dead-lettered by the fence: status and attempts left alone.
    Fenced(DeadLetter),
    /// Its unit was released already (the order expired or was cancelled,
    /// and the release moved its flow record to the `released` hash): a
    /// redelivery of a message whose order exists. It only leaves the
    /// processing list; MySQL is not asked (a released unit may be sold
    /// again, so nothing may insert its order now), status left alone.
    Released,
    /// Back on the queue for another attempt.
    Requeued,
}

/// One message of a batch as taken from the queue.
#[derive(Debug)]
struct Entry {
    raw: Vec<u8>,
    /// `None` when it did not parse or belongs to another sale (then its
    /// outcome is `Dead` from the start).
    message: Option<OrderMessage>,
    outcome: Outcome,
}

/// One batch taken from a sale's queue (oldest first), each message with
/// its outcome. Positions (`usize`) index the batch as taken.
#[derive(Debug)]
pub struct Batch {
    sale_id: u64,
    /// The bucket of the sale whose queue it came from (0 for a sale of one).
    bucket: u32,
    /// The worker handling it, named in its dead letters.
    worker_id: String,
    entries: Vec<Entry>,
}

fn lossy(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw).into_owned()
}

/// A dead letter of `raw` written by `worker`, logged.
fn dead_letter(
    worker: &str,
    raw: &[u8],
    reason: String,
    attempts: u32,
    reservation_id: Option<String>,
) -> DeadLetter {
    log::warn!("dead-lettering {:?}: {reason}", lossy(raw));
    DeadLetter {
        message: lossy(raw),
        reason,
        attempts,
        worker: worker.to_string(),
        at_ms: seckill_common::now_ms(),
        reservation_id,
    }
}

/// Whether a whole-batch answer sends the batch through message by
/// message (stock that cannot cover all of it, or a server error that one
/// message may be causing).
fn needs_one_by_one(answer: &Result<Applied, String>) -> bool {
    matches!(answer, Ok(Applied::StockExhausted) | Err(_))
}

impl Batch {
    /// Parses `raw`, the messages taken from sale `sale_id`'s queue by
    /// `worker_id`. A message that does not parse, or belongs to another
    /// sale, is dead-lettered at attempt 0 at once.
    pub fn parse(sale_id: u64, worker_id: &str, raw: Vec<Vec<u8>>) -> Batch {
        let entries = raw
            .into_iter()
            .map(|raw| {
                let dead =
                    |reason, rid| Outcome::Dead(dead_letter(worker_id, &raw, reason, 0, rid));
                let (message, outcome) = match OrderMessage::parse(&raw) {
                    Ok(m) if m.sale_id == sale_id => (Some(m), Outcome::Pending),
                    Ok(m) => {
                        let reason = format!(
                            "order message for sale {} in the queue of sale {sale_id}",
                            m.sale_id
                        );
                        (None, dead(reason, Some(m.reservation_id)))
                    }
                    Err(e) => (None, dead(e.to_string(), None)),
                };
                Entry {
                    raw,
                    message,
                    outcome,
                }
            })
            .collect();
        Batch {
            sale_id,
            bucket: 0,
            worker_id: worker_id.to_string(),
            entries,
        }
    }

    /// The sale whose queue the batch came from.
    pub fn sale_id(&self) -> u64 {
        self.sale_id
    }

    /// The keys of the bucket whose queue the batch came from: its flow
    /// records, statuses and processing list are there.
    pub fn keys(&self) -> SaleKeys {
        SaleKeys::bucket(self.sale_id, self.bucket)
    }

    /// The positions still waiting for MySQL.
    pub fn pending(&self) -> Vec<usize> {
        self.positions(|o| matches!(o, Outcome::Pending))
    }

    /// The positions MySQL refused whose attempts are not counted yet.
    pub fn refused(&self) -> Vec<usize> {
        self.positions(|o| matches!(o, Outcome::Refused { .. }))
    }

    fn positions(&self, f: impl Fn(&Outcome) -> bool) -> Vec<usize> {
        (0..self.entries.len())
            .filter(|i| self.entries[*i].message.is_some() && f(&self.entries[*i].outcome))
            .collect()
    }

    /// The parsed messages at `which` (positions without one are skipped;
    /// [`Batch::pending`] and [`Batch::refused`] return none such).
    pub fn messages(&self, which: &[usize]) -> Vec<&OrderMessage> {
        which
            .iter()
            .filter_map(|i| self.entries.get(*i)?.message.as_ref())
            .collect()
    }

    /// The reservation ids of [`Batch::messages`]`(which)`, in that order.
    pub fn rids(&self, which: &[usize]) -> Vec<&str> {
        self.messages(which)
            .into_iter()
            .map(|m| m.reservation_id.as_str())
            .collect()
    }

    /// The fence's verdict on the messages at `which`, given `flows`, their
    /// flow records in the order of [`Batch::rids`]`(which)`, and
    /// `released`, their records in the sale's `released` hash in the same
    /// order (empty when no flow record was missing): a message whose
    /// released record is exactly it is [`Outcome::Released`]; any other
    /// whose flow record is missing or differs byte for byte from it is
    /// dead-lettered with [`NO_FLOW_RECORD`]. Returns the positions that
    /// passed and how many were dead-lettered.
    pub fn fence(
        &mut self,
        which: &[usize],
        flows: Vec<Option<Vec<u8>>>,
        released: Vec<Option<Vec<u8>>>,
    ) -> (Vec<usize>, usize) {
        let (mut live, mut fenced) = (Vec::new(), 0);
        let with_message: Vec<usize> = which
            .iter()
            .copied()
            .filter(|i| self.entries.get(*i).is_some_and(|e| e.message.is_some()))
            .collect();
        let mut released = released.into_iter();
        for (i, flow) in with_message.into_iter().zip(flows) {
            let gone = released.next().flatten();
            let e = &mut self.entries[i];
            if flow.as_deref() == Some(e.raw.as_slice()) {
                live.push(i);
                continue;
            }
            if flow.is_none() && gone.as_deref() == Some(e.raw.as_slice()) {
                e.outcome = Outcome::Released;
                continue;
            }
            let rid = e.message.as_ref().map(|m| m.reservation_id.clone());
            let dl = dead_letter(&self.worker_id, &e.raw, NO_FLOW_RECORD.into(), 0, rid);
            e.outcome = Outcome::Fenced(dl);
            fenced += 1;
        }
        (live, fenced)
    }

    /// Records MySQL's answer for the messages at `live`, in the order they
    /// were given to [`Db::apply`]: `Done` confirms them, except its
    /// conflicts (final refusals: the buyer holds another order) and its
    /// messages over the buyer's limit (final refusals too); an
    /// unknown sale or exhausted stock is a final refusal of all of them; a
    /// server error (`Err`) a refusal that counts as one failed attempt.
    pub fn record(&mut self, live: &[usize], answer: Result<Applied, String>, metrics: &Metrics) {
        let refuse_all = |reason: String, final_now| -> Vec<Outcome> {
            live.iter()
                .map(|_| Outcome::Refused {
                    reason: reason.clone(),
                    final_now,
                })
                .collect()
        };
        let outcomes = match answer {
            Ok(Applied::Done {
                inserted,
                already,
                conflicts,
                over_limit,
                window_ms,
            }) => {
                metrics.applied.inc_by(inserted as u64);
                metrics.already_done.inc_by(already as u64);
                let mut out: Vec<Outcome> = live
                    .iter()
                    .map(|&i| {
                        let at = self
                            .entries
                            .get(i)
                            .and_then(|e| e.message.as_ref())
                            .map(|m| m.reserved_at_ms);
                        Outcome::Confirmed(window_ms.zip(at).map(|(w, at)| at.saturating_add(w)))
                    })
                    .collect();
                for c in conflicts {
                    if let Some(o) = out.get_mut(c.index) {
                        *o = Outcome::Refused {
                            reason: format!(
                                "user already holds order {} from reservation {}",
                                c.order_id, c.reservation_id
                            ),
                            final_now: true,
                        };
                    }
                }
                for o in over_limit {
                    if let Some(slot) = out.get_mut(o.index) {
                        *slot = Outcome::Refused {
                            reason: format!(
                                "{OVER_BUYER_LIMIT}: the buyer's orders hold {} unit(s), this \
                                 message takes {} more, max_per_buyer {}",
                                o.held, o.quantity, o.limit
                            ),
                            final_now: true,
                        };
                    }
                }
                out
            }
            Ok(Applied::UnknownSale) => refuse_all(format!("unknown sale {}", self.sale_id), true),
            Ok(Applied::StockExhausted) => refuse_all("stock exhausted in MySQL".into(), true),
            Err(e) => refuse_all(e, false),
        };
        for (&i, o) in live.iter().zip(outcomes) {
            if let Some(e) = self.entries.get_mut(i) {
                e.outcome = o;
            }
        }
    }

    /// Decides each refused message at `refused` (from [`Batch::refused`])
    /// given its attempt count in `counts` (same order): dead letter when
    /// the refusal is final or the count reached `max`
    /// (`SECKILL_WORKER_MAX_ATTEMPTS`; the reason then starts `max
    /// attempts: `), else back on the queue.
    pub fn give_up_or_requeue(&mut self, refused: &[usize], counts: Vec<u32>, max: u32) {
        for (&i, n) in refused.iter().zip(counts) {
            let Some(e) = self.entries.get_mut(i) else {
                continue;
            };
            let Outcome::Refused { reason, final_now } =
                std::mem::replace(&mut e.outcome, Outcome::Requeued)
            else {
                continue;
            };
            if final_now || n >= max {
                let reason = if final_now {
                    reason
                } else {
                    format!("max attempts: {reason}")
                };
                let rid = e.message.as_ref().map(|m| m.reservation_id.clone());
                e.outcome = Outcome::Dead(dead_letter(&self.worker_id, &e.raw, reason, n, rid));
            } else {
                log::warn!(
                    "sale {}: attempt {n} of {max} failed: {reason}; requeued",
                    self.sale_id
                );
            }
        }
    }

    /// The Redis writes that finish the batch. A message without a final
    /// outcome (none is left once the batch was applied and its refusals
    /// counted) is not in them and stays in the processing list.
    pub fn settlement(&self) -> Settlement<'_> {
        let mut s = Settlement::default();
        for e in &self.entries {
            match &e.outcome {
                Outcome::Pending | Outcome::Refused { .. } => continue,
                Outcome::Confirmed(pay_by_ms) => match &e.message {
                    Some(m) => s.confirmed.push(Created {
                        reservation_id: m.reservation_id.as_str(),
                        pay_by_ms: *pay_by_ms,
                    }),
                    None => continue,
                },
                Outcome::Dead(d) => s.dead.push(d),
                Outcome::Fenced(d) => s.fenced.push(d),
                Outcome::Requeued => s.requeue.push(&e.raw),
                Outcome::Released => {}
            }
            s.remove.push(&e.raw);
        }
        s
    }
}

/// Handles one batch for the worker that took it, with the worker's
/// clients borrowed for the time.
pub struct Handler<'a> {
    /// When MySQL first refused this batch with a statement error (the
    /// start of its `SECKILL_WORKER_RETRY_FOR`).
    refused_since: Option<Instant>,
    config: &'a Config,
    db: &'a mut Db,
    consumer: &'a mut Consumer,
    metrics: &'a Metrics,
    shutdown: &'a Shutdown,
    crash: &'a mut CrashPoints,
}

impl<'a> Handler<'a> {
    /// A handler over the worker's configuration, clients and crash points.
    pub fn new(
        config: &'a Config,
        db: &'a mut Db,
        consumer: &'a mut Consumer,
        metrics: &'a Metrics,
        shutdown: &'a Shutdown,
        crash: &'a mut CrashPoints,
    ) -> Handler<'a> {
        Handler {
            refused_since: None,
            config,
            db,
            consumer,
            metrics,
            shutdown,
            crash,
        }
    }

    /// Handles `raw`, the messages just moved into this worker's processing
    /// list of bucket `keys` of a sale (oldest first): parse, apply, settle.
    pub fn handle(mut self, keys: SaleKeys, raw: Vec<Vec<u8>>) -> BatchEnd {
        self.crash.reached(CrashPoint::AfterMove);
        let mut batch = Batch::parse(keys.sale_id, &self.config.worker_id, raw);
        batch.bucket = keys.bucket;
        if let Err(end) = self.apply(&mut batch) {
            return end;
        }
        self.crash.reached(CrashPoint::AfterCommit);
        self.settle(batch)
    }

    /// Applies the pending messages: the whole batch in one transaction,
    /// or, when MySQL stock cannot cover it or the server refuses it,
    /// message by message; every answer goes to [`Batch::record`].
    fn apply(&mut self, batch: &mut Batch) -> Result<(), BatchEnd> {
        let all = batch.pending();
        if all.is_empty() {
            return Ok(());
        }
        let (live, whole) = self.apply_fenced(batch, &all)?;
        if !needs_one_by_one(&whole) {
            batch.record(&live, whole, self.metrics);
            return Ok(());
        }
        let sale_id = batch.sale_id();
        match &whole {
            Err(e) => log::warn!("sale {sale_id}: batch of {}: {e}; one by one", live.len()),
            Ok(_) => log::warn!(
                "sale {sale_id}: MySQL stock cannot cover a batch of {}; one by one",
                live.len()
            ),
        }
        for p in live {
            let (one, answer) = self.apply_fenced(batch, &[p])?;
            // An empty `one`: the fence refused the message this time.
            if !one.is_empty() {
                batch.record(&one, answer, self.metrics);
            }
        }
        Ok(())
    }

    /// The fence: reads the flow records of the messages at `which` in one
    /// `HMGET` and dead-letters those without a matching one
    /// ([`Batch::fence`]); returns the positions that passed.
    ///
    /// Errors: `RedisFailed` when the read failed.
    fn fence(&mut self, batch: &mut Batch, which: &[usize]) -> Result<Vec<usize>, BatchEnd> {
        let sale_id = batch.sale_id();
        let flows = match self.consumer.flow_records(batch.keys(), &batch.rids(which)) {
            Ok(f) => f,
            Err(e) => {
                log::warn!("sale {sale_id}: reading flow records: {e}");
                return Err(BatchEnd::RedisFailed);
            }
        };
        let released = if flows.iter().any(Option::is_none) {
            match self
                .consumer
                .released_records(batch.keys(), &batch.rids(which))
            {
                Ok(r) => r,
                Err(e) => {
                    log::warn!("sale {sale_id}: reading released records: {e}");
                    return Err(BatchEnd::RedisFailed);
                }
            }
        } else {
            Vec::new()
        };
        let (live, fenced) = batch.fence(which, flows, released);
        self.metrics.fenced.inc_by(fenced as u64);
        Ok(live)
    }

    /// Applies the messages at `which` until MySQL gives an answer, each
    /// attempt fenced: right before it (after any retry wait and the MySQL
    /// connect, immediately before `BEGIN`) the flow records are read, and
    /// messages without a matching one are dead-lettered and never applied.
    /// Deadlocks and lock-wait timeouts are retried on the same connection,
    /// lost connections on a new one, both with [`crate::RETRY`] backoff
    /// and never counted against the messages. Returns the positions
    /// applied (empty, with a `Done` of nothing, when the fence passed
    /// none) and the answer; an `Err` answer is a server error that counts
    /// as a failed application.
    ///
    /// Errors: `Interrupted` when shutdown came while MySQL could not be
    /// reached, `RedisFailed` when the fence could not read.
    fn apply_fenced(
        &mut self,
        batch: &mut Batch,
        which: &[usize],
    ) -> Result<(Vec<usize>, Result<Applied, String>), BatchEnd> {
        let sale_id = batch.sale_id();
        let started = Instant::now();
        let mut live = which.to_vec();
        let mut backoff = crate::RETRY;
        let answer = loop {
            // Connect first, so that nothing but BEGIN follows the fence.
            let r = match self.db.connect() {
                Err(e) => Err(e),
                Ok(()) => {
                    live = self.fence(batch, &live)?;
                    if live.is_empty() {
                        return Ok((live, Ok(Applied::nothing())));
                    }
                    self.db.apply(sale_id, &batch.messages(&live))
                }
            };
            match r {
                Ok(a) => break Ok(a),
                Err(ApplyError::Permanent(e)) => {
                    if !self.retry_statement(sale_id, &e) {
                        break Err(e);
                    }
                }
                Err(e @ ApplyError::Transient(_)) => {
                    self.metrics.retries_transient.inc();
                    log::info!("sale {sale_id}: {e}; retrying");
                }
                Err(e) => {
                    self.metrics.retries_connection.inc();
                    log::warn!("sale {sale_id}: {e}; reconnecting");
                }
            }
            if !backoff.sleep(self.shutdown) {
                return Err(BatchEnd::Interrupted);
            }
        };
        // One observation per transaction, as `batches` counts them: a
        // batch re-applied one by one is that many batches.
        self.metrics.batches.inc();
        self.metrics.batch_size.observe(live.len() as f64);
        self.metrics
            .batch_seconds
            .observe(started.elapsed().as_secs_f64());
        Ok((live, answer))
    }

    /// Whether a statement error `e` of this batch is retried: yes within
    /// `SECKILL_WORKER_RETRY_FOR` of the batch's first one (logged at
    /// `error` the first time, with its remedy, then at `info`); no after,
    /// and the error counts against the messages.
    fn retry_statement(&mut self, sale_id: u64, e: &str) -> bool {
        let budget = self.config.worker_retry_for;
        let since = match self.refused_since {
            Some(t) => t,
            None => {
                log::error!(
                    "sale {sale_id}: mysql: {e}; retrying for up to {} s before counting \
                     a failed attempt (SECKILL_WORKER_RETRY_FOR)",
                    budget.as_secs_f64()
                );
                *self.refused_since.insert(Instant::now())
            }
        };
        if since.elapsed() >= budget {
            return false;
        }
        self.metrics.retries_statement.inc();
        log::info!("sale {sale_id}: mysql: {e}; retrying");
        true
    }

    /// Counts one failed attempt per refused message in Redis, decides
    /// each ([`Batch::give_up_or_requeue`]), then settles the batch
    /// ([`Consumer::settle`]).
    fn settle(&mut self, mut batch: Batch) -> BatchEnd {
        let sale_id = batch.sale_id();
        let refused = batch.refused();
        if !refused.is_empty() {
            match self
                .consumer
                .count_attempts(batch.keys(), &batch.rids(&refused))
            {
                Ok(counts) => {
                    batch.give_up_or_requeue(&refused, counts, self.config.worker_max_attempts)
                }
                Err(e) => {
                    log::warn!("sale {sale_id}: counting failed attempts: {e}");
                    return BatchEnd::RedisFailed;
                }
            }
        }
        let s = batch.settlement();
        match self.consumer.settle(batch.keys(), &s) {
            Ok(()) => {
                for d in s.dead.iter().chain(&s.fenced) {
                    crate::metrics::count(&self.metrics.dead_lettered, reason_label(&d.reason));
                }
                self.metrics.requeued.inc_by(s.requeue.len() as u64);
                BatchEnd::Settled
            }
            Err(e) => {
                log::warn!("sale {sale_id}: settling a batch in redis: {e}");
                BatchEnd::RedisFailed
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::Conflict;

    fn msg(sale_id: u64, n: u32) -> Vec<u8> {
        OrderMessage {
            v: 1,
            reservation_id: rid(n),
            sale_id,
            user_id: format!("u{n}"),
            reserved_at_ms: 1_000,
            quantity: 1,
        }
        .to_json()
        .into_bytes()
    }

    fn rid(n: u32) -> String {
        format!("{n:032x}")
    }

    fn reasons(d: &[&DeadLetter]) -> Vec<(String, u32, Option<String>)> {
        d.iter()
            .map(|d| (d.reason.clone(), d.attempts, d.reservation_id.clone()))
            .collect()
    }

    fn dl(reason: &str, attempts: u32, n: u32) -> (String, u32, Option<String>) {
        (reason.to_string(), attempts, Some(rid(n)))
    }

    /// Seven messages, each decided by a different step, end in exactly
    /// one list each; every one of them leaves the processing list.
    #[test]
    fn each_message_gets_one_outcome_whichever_step_decides_it() {
        let raw = vec![
            b"not json".to_vec(),
            msg(8, 1), // another sale's
            msg(7, 2), // applied
            msg(7, 3), // the buyer's other order
            msg(7, 4), // fenced
            msg(7, 5), // server error, attempt 1 of 3: requeued
            msg(7, 6), // server error, attempt 3 of 3: dead
        ];
        let metrics = Metrics::new("w1");
        let mut b = Batch::parse(7, "w1", raw.clone());
        assert_eq!(b.pending(), [2, 3, 4, 5, 6]);
        assert_eq!(b.rids(&[2, 4]), [rid(2), rid(4)]);
        let flows = [2, 3, 4, 5, 6].map(|i| (i != 4).then(|| raw[i].clone()));
        let (live, fenced) = b.fence(&b.pending(), flows.to_vec(), Vec::new());
        assert_eq!((live.as_slice(), fenced), (&[2, 3, 5, 6][..], 1));
        let conflict = Conflict {
            index: 1,
            order_id: 40,
            reservation_id: rid(9),
        };
        let done = Applied::Done {
            inserted: 1,
            already: 0,
            conflicts: vec![conflict],
            over_limit: Vec::new(),
            window_ms: None,
        };
        b.record(&[2, 3], Ok(done), &metrics);
        b.record(&[5, 6], Err("trigger says no".into()), &metrics);
        assert_eq!(metrics.applied.get(), 1);
        assert_eq!(b.pending(), Vec::<usize>::new());
        let refused = b.refused();
        assert_eq!(refused, [3, 5, 6]);
        b.give_up_or_requeue(&refused, vec![1, 1, 3], 3);
        assert_eq!(b.refused(), Vec::<usize>::new());

        let s = b.settlement();
        assert_eq!(
            s.confirmed,
            [Created {
                reservation_id: &rid(2),
                pay_by_ms: None
            }]
        );
        assert_eq!(
            reasons(&s.fenced),
            [dl(NO_FLOW_RECORD, 0, 4)],
            "{:?}",
            s.fenced
        );
        let dead = reasons(&s.dead);
        assert_eq!(dead.len(), 4, "{dead:?}");
        assert_eq!(dead[0].1, 0);
        assert_eq!(dead[0].2, None);
        assert_eq!(
            dead[1],
            dl("order message for sale 8 in the queue of sale 7", 0, 1)
        );
        let held = format!("user already holds order 40 from reservation {}", rid(9));
        assert_eq!(dead[2], dl(&held, 1, 3));
        assert_eq!(dead[3], dl("max attempts: trigger says no", 3, 6));
        assert_eq!(s.requeue, [raw[5].as_slice()]);
        let all: Vec<&[u8]> = raw.iter().map(Vec::as_slice).collect();
        assert_eq!(s.remove, all);
    }

    /// A message over its buyer's limit in MySQL is dead-lettered at once
    /// with the figures, counted under `over_buyer_limit`; the batch's
    /// other message is confirmed.
    #[test]
    fn a_message_over_the_buyers_limit_is_a_final_refusal() {
        let metrics = Metrics::new("w1");
        let mut b = Batch::parse(7, "w1", vec![msg(7, 1), msg(7, 2)]);
        let done = Applied::Done {
            inserted: 1,
            already: 0,
            conflicts: Vec::new(),
            over_limit: vec![crate::apply::OverLimit {
                index: 1,
                held: 4,
                quantity: 2,
                limit: 4,
            }],
            window_ms: None,
        };
        b.record(&[0, 1], Ok(done), &metrics);
        assert_eq!(b.refused(), [1]);
        b.give_up_or_requeue(&[1], vec![1], 5);
        let s = b.settlement();
        let reason = format!(
            "{OVER_BUYER_LIMIT}: the buyer's orders hold 4 unit(s), this message takes 2 more, \
             max_per_buyer 4"
        );
        assert_eq!(reasons(&s.dead), [dl(&reason, 1, 2)]);
        assert_eq!(s.confirmed.len(), 1);
        assert_eq!(
            crate::metrics::DEAD_LETTER_REASONS[reason_label(&reason)],
            "over_buyer_limit"
        );
        assert_eq!(
            crate::metrics::DEAD_LETTER_REASONS[reason_label("what")],
            "other"
        );
    }

    #[test]
    fn an_unknown_sale_or_exhausted_stock_is_a_final_refusal_of_each() {
        let metrics = Metrics::new("w1");
        let mut b = Batch::parse(7, "w1", vec![msg(7, 1), msg(7, 2)]);
        b.record(&[0], Ok(Applied::UnknownSale), &metrics);
        b.record(&[1], Ok(Applied::StockExhausted), &metrics);
        b.give_up_or_requeue(&b.refused(), vec![1, 1], 5);
        let s = b.settlement();
        assert_eq!(
            reasons(&s.dead),
            [
                dl("unknown sale 7", 1, 1),
                dl("stock exhausted in MySQL", 1, 2)
            ]
        );
        assert!(s.confirmed.is_empty() && s.requeue.is_empty());
        assert!(needs_one_by_one(&Ok(Applied::StockExhausted)));
        assert!(needs_one_by_one(&Err(String::new())));
        assert!(!needs_one_by_one(&Ok(Applied::UnknownSale)));
        assert!(!needs_one_by_one(&Ok(Applied::nothing())));
    }

    /// A redelivered message whose unit the lifecycle released (its flow
    /// record moved to `released`) leaves the processing list with no
    /// dead letter and no MySQL call; a missing flow record that was not
    /// released is still fenced.
    #[test]
    fn a_redelivery_of_a_released_unit_only_leaves_the_processing_list() {
        let raw = vec![msg(7, 1), msg(7, 2), msg(7, 3)];
        let mut b = Batch::parse(7, "w1", raw.clone());
        let flows = vec![Some(raw[0].clone()), None, None];
        let released = vec![None, Some(raw[1].clone()), Some(msg(7, 9))];
        let (live, fenced) = b.fence(&b.pending(), flows, released);
        assert_eq!((live.as_slice(), fenced), (&[0][..], 1));
        assert_eq!(b.pending(), [0]);
        let s = b.settlement();
        assert_eq!(reasons(&s.fenced), [dl(NO_FLOW_RECORD, 0, 3)]);
        assert!(s.dead.is_empty() && s.requeue.is_empty() && s.confirmed.is_empty());
        assert_eq!(s.remove, [raw[1].as_slice(), raw[2].as_slice()]);
    }
}
