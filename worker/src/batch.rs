//! Owns what happens to one batch taken from a sale's queue: parse, apply in
//! MySQL (one transaction, retried on deadlocks and lost connections; message
//! by message when the batch cannot go through whole), then settle it in
//! Redis in one `MULTI`: statuses, dead letters, requeues, and removal from
//! the processing list.
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
//! reservation R`, status `failed`), not confirmed; the same reservation id
//! again is "already done" (idempotency).

use crate::apply::{Applied, Conflict};
use crate::consume::{CrashPoint, Worker};
use crate::error::ApplyError;
use seckill_common::dead_letter::DeadLetter;
use seckill_common::keys::PurchaseStatus;
use seckill_common::keys::SaleKeys;
use seckill_common::message::OrderMessage;
use std::time::Instant;

/// How handling a batch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchEnd {
    /// Applied and settled: the processing list no longer holds it.
    Settled,
    /// Shutdown came while MySQL could not be reached: the batch stays in
    /// the processing list, to be reclaimed.
    Interrupted,
    /// Settling in Redis failed: the batch stays in the processing list;
    /// the caller reconnects and reclaims it (a harmless redelivery).
    RedisFailed,
}

/// One message that MySQL refused, with why and whether to give up at once.
struct Failure {
    raw: usize,
    reason: String,
    /// Dead-letter now whatever the attempt count (unknown sale, stock gone).
    final_now: bool,
}

/// The Redis writes that finish a batch.
#[derive(Default)]
struct Settlement {
    confirmed: Vec<String>,
    /// Dead letters whose reservation's status becomes `failed`.
    dead: Vec<DeadLetter>,
    /// Dead letters the fence refused: status and attempts left alone (the
    /// reservation was released, or never made).
    fenced: Vec<DeadLetter>,
    requeue: Vec<usize>,
}

/// Dead-letter reason of a message the fence refused.
pub const NO_FLOW_RECORD: &str =
    "no matching flow record: the reservation was released or never made";

/// How one fenced application came out.
enum Attempt {
    /// Shutdown came while MySQL could not be reached.
    Interrupted,
    /// Reading the flow records failed.
    RedisFailed(redis::RedisError),
    /// MySQL answered for these positions in `valid` (the ones the fence
    /// passed; empty, with a `Done` of nothing, when it passed none).
    Answer(Vec<usize>, Result<Applied, String>),
}

fn lossy(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw).into_owned()
}

impl Worker {
    /// Handles `raw`, the messages just moved into this worker's processing
    /// list of sale `sale_id` (oldest first).
    pub(crate) fn handle_batch(&mut self, sale_id: u64, raw: Vec<Vec<u8>>) -> BatchEnd {
        self.crash_if(CrashPoint::AfterMove);
        let started = Instant::now();
        let mut s = Settlement::default();
        let mut valid: Vec<(usize, OrderMessage)> = Vec::with_capacity(raw.len());
        for (i, r) in raw.iter().enumerate() {
            match OrderMessage::parse(r) {
                Ok(m) if m.sale_id == sale_id => valid.push((i, m)),
                Ok(m) => s.dead.push(self.dead_letter(
                    r,
                    format!(
                        "order message for sale {} in the queue of sale {sale_id}",
                        m.sale_id
                    ),
                    0,
                    Some(m.reservation_id),
                )),
                Err(e) => s.dead.push(self.dead_letter(r, e.to_string(), 0, None)),
            }
        }

        let mut failures: Vec<Failure> = Vec::new();
        // Positions in `valid` that the fence refused (dead-lettered below).
        let mut fenced: Vec<usize> = Vec::new();
        if !valid.is_empty() {
            let all: Vec<usize> = (0..valid.len()).collect();
            let (live, whole) = match self.apply_fenced(sale_id, &raw, &valid, &all, &mut fenced) {
                Attempt::Interrupted => return BatchEnd::Interrupted,
                Attempt::RedisFailed(e) => {
                    log::warn!("sale {sale_id}: reading flow records: {e}");
                    return BatchEnd::RedisFailed;
                }
                Attempt::Answer(live, r) => (live, r),
            };
            match whole {
                Ok(Applied::Done {
                    inserted,
                    already,
                    conflicts,
                }) => {
                    self.count_done(inserted, already);
                    self.settle_done(&valid, &live, conflicts, &mut s, &mut failures);
                }
                Ok(Applied::UnknownSale) => {
                    for p in &live {
                        failures.push(Failure {
                            raw: valid[*p].0,
                            reason: format!("unknown sale {sale_id}"),
                            final_now: true,
                        });
                    }
                }
                Ok(Applied::StockExhausted) | Err(_) => {
                    if let Err(e) = &whole {
                        log::warn!("sale {sale_id}: batch of {}: {e}; one by one", live.len());
                    } else {
                        log::warn!(
                            "sale {sale_id}: MySQL stock cannot cover a batch of {}; one by one",
                            live.len()
                        );
                    }
                    for p in live {
                        let i = valid[p].0;
                        let one = match self.apply_fenced(sale_id, &raw, &valid, &[p], &mut fenced)
                        {
                            Attempt::Interrupted => return BatchEnd::Interrupted,
                            Attempt::RedisFailed(e) => {
                                log::warn!("sale {sale_id}: reading flow records: {e}");
                                return BatchEnd::RedisFailed;
                            }
                            Attempt::Answer(l, _) if l.is_empty() => continue,
                            Attempt::Answer(_, r) => r,
                        };
                        match one {
                            Ok(Applied::Done {
                                inserted,
                                already,
                                conflicts,
                            }) => {
                                self.count_done(inserted, already);
                                self.settle_done(&valid, &[p], conflicts, &mut s, &mut failures);
                            }
                            Ok(Applied::UnknownSale) => failures.push(Failure {
                                raw: i,
                                reason: format!("unknown sale {sale_id}"),
                                final_now: true,
                            }),
                            Ok(Applied::StockExhausted) => failures.push(Failure {
                                raw: i,
                                reason: "stock exhausted in MySQL".into(),
                                final_now: true,
                            }),
                            Err(e) => failures.push(Failure {
                                raw: i,
                                reason: e,
                                final_now: false,
                            }),
                        }
                    }
                }
            }
        }
        for p in fenced {
            let (i, m) = &valid[p];
            s.fenced.push(self.dead_letter(
                &raw[*i],
                NO_FLOW_RECORD.into(),
                0,
                Some(m.reservation_id.clone()),
            ));
        }
        self.metrics
            .batch_seconds
            .observe(started.elapsed().as_secs_f64());
        self.crash_if(CrashPoint::AfterCommit);

        if !failures.is_empty() {
            if let Err(e) = self.count_failures(sale_id, &raw, &valid, failures, &mut s) {
                log::warn!("sale {sale_id}: counting failed attempts: {e}");
                return BatchEnd::RedisFailed;
            }
        }
        match self.settle(sale_id, &raw, &s) {
            Ok(()) => {
                let dead = s.dead.len() + s.fenced.len();
                self.metrics.dead_lettered.inc_by(dead as u64);
                self.metrics.requeued.inc_by(s.requeue.len() as u64);
                BatchEnd::Settled
            }
            Err(e) => {
                log::warn!("sale {sale_id}: settling a batch in redis: {e}");
                BatchEnd::RedisFailed
            }
        }
    }

    fn count_done(&self, inserted: usize, already: usize) {
        self.metrics.applied.inc_by(inserted as u64);
        self.metrics.already_done.inc_by(already as u64);
    }

    fn dead_letter(
        &self,
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
            worker: self.config.worker_id.clone(),
            at_ms: seckill_common::now_ms(),
            reservation_id,
        }
    }

    /// Records what a committed application did for the messages at
    /// positions `live` of `valid`: confirmed, except the conflicts, which
    /// are final failures (dead letter, status `failed`).
    fn settle_done(
        &self,
        valid: &[(usize, OrderMessage)],
        live: &[usize],
        conflicts: Vec<Conflict>,
        s: &mut Settlement,
        failures: &mut Vec<Failure>,
    ) {
        let mut refused = vec![false; live.len()];
        for c in conflicts {
            if let Some(r) = refused.get_mut(c.index) {
                *r = true;
            }
            failures.push(Failure {
                raw: valid[live[c.index]].0,
                reason: format!(
                    "user already holds order {} from reservation {}",
                    c.order_id, c.reservation_id
                ),
                final_now: true,
            });
        }
        for (p, refused) in live.iter().zip(refused) {
            if !refused {
                s.confirmed.push(valid[*p].1.reservation_id.clone());
            }
        }
    }

    /// The fence: reads the flow records of the messages at positions
    /// `which` of `valid` in one `HMGET` and returns the positions whose
    /// flow record is missing or differs byte for byte from the queued
    /// message.
    ///
    /// Errors: Redis failures.
    fn stale(
        &mut self,
        sale_id: u64,
        raw: &[Vec<u8>],
        valid: &[(usize, OrderMessage)],
        which: &[usize],
    ) -> redis::RedisResult<Vec<usize>> {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(SaleKeys::new(sale_id).flow());
        for p in which {
            cmd.arg(valid[*p].1.reservation_id.as_str());
        }
        let flows: Vec<Option<Vec<u8>>> = cmd.query(self.consumer.con()?)?;
        Ok(which
            .iter()
            .zip(flows)
            .filter(|(p, f)| f.as_deref() != Some(raw[valid[**p].0].as_slice()))
            .map(|(p, _)| *p)
            .collect())
    }

    /// Applies the messages at positions `which` of `valid` until MySQL
    /// gives an answer, each attempt fenced: right before it (after any
    /// retry wait and the MySQL connect, immediately before `BEGIN`) the
    /// flow records are read, and messages without a matching one are
    /// moved to `fenced` and never applied. Deadlocks and lock-wait timeouts
    /// are retried on the same connection, lost connections on a new one,
    /// both with capped exponential backoff and never counted against the
    /// messages. An `Err` answer is a server error that counts as a failed
    /// application.
    fn apply_fenced(
        &mut self,
        sale_id: u64,
        raw: &[Vec<u8>],
        valid: &[(usize, OrderMessage)],
        which: &[usize],
        fenced: &mut Vec<usize>,
    ) -> Attempt {
        let mut live = which.to_vec();
        let mut backoff = crate::consume::Backoff::new();
        let answer = loop {
            // Connect first, so that nothing but BEGIN follows the fence.
            let r = match self.db.connect() {
                Err(e) => Err(e),
                Ok(()) => {
                    let stale = match self.stale(sale_id, raw, valid, &live) {
                        Ok(stale) => stale,
                        Err(e) => return Attempt::RedisFailed(e),
                    };
                    live.retain(|p| !stale.contains(p));
                    self.metrics.fenced.inc_by(stale.len() as u64);
                    fenced.extend(stale);
                    if live.is_empty() {
                        let none = Applied::Done {
                            inserted: 0,
                            already: 0,
                            conflicts: Vec::new(),
                        };
                        return Attempt::Answer(live, Ok(none));
                    }
                    let msgs: Vec<&OrderMessage> = live.iter().map(|p| &valid[*p].1).collect();
                    self.db.apply(sale_id, &msgs)
                }
            };
            match r {
                Ok(a) => break Ok(a),
                Err(ApplyError::Permanent(e)) => break Err(e),
                Err(e @ ApplyError::Transient(_)) => {
                    self.metrics.retries_transient.inc();
                    log::info!("sale {sale_id}: {e}; retrying");
                }
                Err(e) => {
                    self.metrics.retries_connection.inc();
                    log::warn!("sale {sale_id}: {e}; reconnecting");
                }
            }
            if !backoff.sleep(&self.shutdown) {
                return Attempt::Interrupted;
            }
        };
        self.metrics.batches.inc();
        self.metrics.batch_size.observe(live.len() as f64);
        Attempt::Answer(live, answer)
    }

    /// Adds one failed application per refused message in Redis, then
    /// dead-letters those that reached `SECKILL_WORKER_MAX_ATTEMPTS` (or
    /// cannot succeed) and requeues the rest.
    fn count_failures(
        &mut self,
        sale_id: u64,
        raw: &[Vec<u8>],
        valid: &[(usize, OrderMessage)],
        failures: Vec<Failure>,
        s: &mut Settlement,
    ) -> redis::RedisResult<()> {
        let k = SaleKeys::new(sale_id);
        let rid_of = |i: usize| {
            valid
                .iter()
                .find(|(j, _)| *j == i)
                .map(|(_, m)| m.reservation_id.clone())
                .unwrap_or_default()
        };
        let mut p = redis::pipe();
        for f in &failures {
            p.hincr(k.attempts(), rid_of(f.raw), 1);
        }
        let counts: Vec<u32> = p.query(self.consumer.con()?)?;
        let max = self.config.worker_max_attempts;
        for (f, n) in failures.into_iter().zip(counts) {
            if f.final_now || n >= max {
                let reason = if f.final_now {
                    f.reason
                } else {
                    format!("max attempts: {}", f.reason)
                };
                let dl = self.dead_letter(&raw[f.raw], reason, n, Some(rid_of(f.raw)));
                s.dead.push(dl);
            } else {
                log::warn!(
                    "sale {sale_id}: attempt {n} of {max} failed: {}; requeued",
                    f.reason
                );
                s.requeue.push(f.raw);
            }
        }
        Ok(())
    }

    /// One `MULTI`: confirmed statuses (and their attempt counts cleared),
    /// dead letters with status `failed`, requeues, and `LREM` of every
    /// message of the batch from this worker's processing list.
    fn settle(&mut self, sale_id: u64, raw: &[Vec<u8>], s: &Settlement) -> redis::RedisResult<()> {
        let k = SaleKeys::new(sale_id);
        let mut p = redis::pipe();
        p.atomic();
        for rid in &s.confirmed {
            p.hset(k.status(), rid, PurchaseStatus::Confirmed.as_str())
                .ignore();
            p.hdel(k.attempts(), rid).ignore();
        }
        for d in &s.fenced {
            p.lpush(k.dead_letter(), d.to_json()).ignore();
        }
        for d in &s.dead {
            p.lpush(k.dead_letter(), d.to_json()).ignore();
            if let Some(rid) = &d.reservation_id {
                p.hset(k.status(), rid, PurchaseStatus::Failed.as_str())
                    .ignore();
                p.hdel(k.attempts(), rid).ignore();
            }
        }
        for i in &s.requeue {
            p.lpush(k.queue(), &raw[*i]).ignore();
        }
        let processing = k.processing(&self.config.worker_id);
        // The oldest message sits at the right end: search from there.
        for r in raw {
            p.lrem(&processing, -1, r).ignore();
        }
        self.consumer.run_pipe(&p)
    }
}
