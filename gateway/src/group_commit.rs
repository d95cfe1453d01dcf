//! Owns the group commit: handler threads hand purchases (with their
//! requests) over a bounded crossbeam channel to a few Redis threads, and
//! each Redis thread sends whatever has queued up meanwhile as one pipeline
//! of `EVALSHA` calls (up to [`MAX_BATCH`]) and answers the requests. Each script call stays atomic on its own; the pipeline
//! only saves round trips. A `NOSCRIPT` reply means that script did not run:
//! the thread loads the script and sends those purchases again.

use crate::app::{own, App};
use crate::handler::finish;
use crate::metrics::Metrics;
use crate::purchase;
use crate::redis_link::{Link, Unavailable};
use crate::routes::Label;
use crossbeam_channel::Receiver;
use redis::Value;
use seckill_common::reservation::{parse_reply, prepare, reserve_script, ReserveOutcome};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tiny_http::Request;

/// Most purchases in one pipeline.
pub const MAX_BATCH: usize = 256;

/// Purchases waiting for a Redis thread before handlers answer 503.
pub const QUEUE_CAPACITY: usize = 8192;

/// One purchase waiting for a pipeline: the request itself travels with it
/// and the Redis thread answers it, so a handler never waits on Redis and
/// the number of purchases in flight is not bounded by the handler count.
pub struct Job {
    /// The sale.
    pub sale_id: u64,
    /// A valid user id (checked by the handler).
    pub user_id: String,
    /// A fresh id from `ids::new_reservation_id`.
    pub reservation_id: String,
    /// The request to answer; its body has been read completely.
    pub request: Request,
    /// When the handler took it (for the latency histogram).
    pub start: Instant,
}

/// Runs one Redis thread: takes the first waiting job, then whatever else
/// has queued up (at most [`MAX_BATCH`]), sends them as one pipeline, and
/// answers each request. Runs until every job sender is dropped.
pub fn redis_thread(jobs: Receiver<Job>, mut link: Link, app: Arc<App>) {
    let mut batch: Vec<Job> = Vec::with_capacity(MAX_BATCH);
    while let Ok(first) = jobs.recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(j) => batch.push(j),
                Err(_) => break,
            }
        }
        let results = run_batch(&mut link, &batch, &app.metrics);
        for (job, r) in batch.drain(..).zip(results) {
            let reply = purchase::conclude(&app, job.sale_id, &job.user_id, r);
            finish(&app, job.request, Label::Purchase, reply, job.start);
            app.pending.fetch_sub(1, Ordering::SeqCst);
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
            results[i] = parse_reply(v).map(|o| own(o, rid)).map_err(|e| {
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
