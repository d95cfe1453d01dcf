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

use crate::apply::Applied;
use crate::consume::{CrashPoint, Worker};
use crate::error::ApplyError;
use seckill_common::dead_letter::DeadLetter;
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
    dead: Vec<DeadLetter>,
    requeue: Vec<usize>,
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
        if !valid.is_empty() {
            let all: Vec<&OrderMessage> = valid.iter().map(|(_, m)| m).collect();
            let whole = match self.apply_retrying(sale_id, &all) {
                None => return BatchEnd::Interrupted,
                Some(r) => r,
            };
            self.metrics.batches.inc();
            self.metrics.batch_size.observe(all.len() as f64);
            match whole {
                Ok(Applied::Done { inserted, already }) => {
                    self.count_done(inserted, already);
                    s.confirmed
                        .extend(valid.iter().map(|(_, m)| m.reservation_id.clone()));
                }
                Ok(Applied::UnknownSale) => {
                    for (i, _) in &valid {
                        failures.push(Failure {
                            raw: *i,
                            reason: format!("unknown sale {sale_id}"),
                            final_now: true,
                        });
                    }
                }
                Ok(Applied::StockExhausted) | Err(_) => {
                    if let Err(e) = &whole {
                        log::warn!("sale {sale_id}: batch of {}: {e}; one by one", all.len());
                    } else {
                        log::warn!(
                            "sale {sale_id}: MySQL stock cannot cover a batch of {}; one by one",
                            all.len()
                        );
                    }
                    for (i, m) in &valid {
                        match self.apply_retrying(sale_id, &[m]) {
                            None => return BatchEnd::Interrupted,
                            Some(Ok(Applied::Done { inserted, already })) => {
                                self.count_done(inserted, already);
                                s.confirmed.push(m.reservation_id.clone());
                            }
                            Some(Ok(Applied::UnknownSale)) => failures.push(Failure {
                                raw: *i,
                                reason: format!("unknown sale {sale_id}"),
                                final_now: true,
                            }),
                            Some(Ok(Applied::StockExhausted)) => failures.push(Failure {
                                raw: *i,
                                reason: "stock exhausted in MySQL".into(),
                                final_now: true,
                            }),
                            Some(Err(e)) => failures.push(Failure {
                                raw: *i,
                                reason: e,
                                final_now: false,
                            }),
                        }
                    }
                }
            }
        }
        self.metrics
            .batch_seconds
            .observe_duration(started.elapsed());
        self.crash_if(CrashPoint::AfterCommit);

        if !failures.is_empty() {
            if let Err(e) = self.count_failures(sale_id, &raw, &valid, failures, &mut s) {
                log::warn!("sale {sale_id}: counting failed attempts: {e}");
                return BatchEnd::RedisFailed;
            }
        }
        match self.settle(sale_id, &raw, &s) {
            Ok(()) => {
                self.metrics.dead_lettered.add(s.dead.len() as u64);
                self.metrics.requeued.add(s.requeue.len() as u64);
                BatchEnd::Settled
            }
            Err(e) => {
                log::warn!("sale {sale_id}: settling a batch in redis: {e}");
                BatchEnd::RedisFailed
            }
        }
    }

    fn count_done(&self, inserted: usize, already: usize) {
        self.metrics.applied.add(inserted as u64);
        self.metrics.already_done.add(already as u64);
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

    /// Applies `msgs` until MySQL gives an answer: deadlocks and lock-wait
    /// timeouts are retried on the same connection, lost connections on a
    /// new one, both with capped exponential backoff and never counted
    /// against the messages. `None`: shutdown came first. `Some(Err)`: a
    /// server error that counts as a failed application.
    fn apply_retrying(
        &mut self,
        sale_id: u64,
        msgs: &[&OrderMessage],
    ) -> Option<Result<Applied, String>> {
        let mut backoff = crate::consume::Backoff::new();
        loop {
            match self.db.apply(sale_id, msgs) {
                Ok(a) => return Some(Ok(a)),
                Err(ApplyError::Permanent(e)) => return Some(Err(e)),
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
                return None;
            }
        }
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
            p.hset(k.status(), rid, "confirmed").ignore();
            p.hdel(k.attempts(), rid).ignore();
        }
        for d in &s.dead {
            p.lpush(k.dead_letter(), d.to_json()).ignore();
            if let Some(rid) = &d.reservation_id {
                p.hset(k.status(), rid, "failed").ignore();
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
