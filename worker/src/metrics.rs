//! Owns the worker's metrics and their `/metrics` listener (Prometheus text
//! format, like the gateway's): orders applied, batches and their sizes and
//! durations, retries, dead letters, reclaimed messages, and per sale the
//! queue length, the processing-list length and the age of the oldest
//! queued message.

use seckill_common::metrics::{Counter, Exposition, Histogram, LATENCY_BUCKETS_S, SIZE_BUCKETS};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Figures of one sale's queue, refreshed by the housekeeping thread.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SaleGauges {
    /// The sale id.
    pub sale_id: u64,
    /// Messages waiting in the queue.
    pub queued: i64,
    /// Messages in every registered worker's processing list of the sale.
    pub processing: i64,
    /// Age in ms of the oldest queued message (`reserved_at_ms` to now, by
    /// this machine's clock); 0 when the queue is empty.
    pub oldest_age_ms: i64,
}

/// Every metric of one worker process. Counters are lock-free; the per-sale
/// gauges are replaced whole under a mutex about once a second.
#[derive(Debug)]
pub struct Metrics {
    /// Orders created (one per newly inserted order row).
    pub applied: Counter,
    /// Messages whose order already existed (redelivery, duplicate push).
    pub already_done: Counter,
    /// MySQL transactions committed or refused for a batch.
    pub batches: Counter,
    /// Messages per batch.
    pub batch_size: Histogram,
    /// Seconds to apply one batch in MySQL, retries included.
    pub batch_seconds: Histogram,
    /// Transactions retried after a deadlock or lock-wait timeout.
    pub retries_transient: Counter,
    /// Transactions retried after a lost or refused MySQL connection.
    pub retries_connection: Counter,
    /// Messages moved to a dead-letter list.
    pub dead_lettered: Counter,
    /// Messages the fence refused (no matching flow record in Redis); also
    /// counted in `dead_lettered`.
    pub fenced: Counter,
    /// Messages put back on the queue after a failed application.
    pub requeued: Counter,
    /// Messages moved back from dead workers' (or this worker's previous
    /// run's) processing lists.
    pub reclaimed: Counter,
    /// Sales the data-loss watch found behind MySQL's mark (and paused).
    pub data_loss_detected: Counter,
    /// Redis errors seen by the consuming loop.
    pub redis_errors: Counter,
    /// Per-sale queue figures.
    pub sales: Mutex<Vec<SaleGauges>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            applied: Counter::default(),
            already_done: Counter::default(),
            batches: Counter::default(),
            batch_size: Histogram::new(SIZE_BUCKETS),
            batch_seconds: Histogram::new(LATENCY_BUCKETS_S),
            retries_transient: Counter::default(),
            retries_connection: Counter::default(),
            dead_lettered: Counter::default(),
            fenced: Counter::default(),
            requeued: Counter::default(),
            reclaimed: Counter::default(),
            data_loss_detected: Counter::default(),
            redis_errors: Counter::default(),
            sales: Mutex::new(Vec::new()),
        }
    }
}

impl Metrics {
    /// The `/metrics` page of worker `worker_id`.
    pub fn render(&self, worker_id: &str) -> String {
        let w = [("worker", worker_id)];
        let mut e = Exposition::new();
        e.counter(
            "seckill_worker_orders_applied_total",
            "Orders created in MySQL.",
            &w,
            self.applied.get(),
        );
        e.counter(
            "seckill_worker_messages_already_done_total",
            "Messages whose order already existed (redelivered or duplicated).",
            &w,
            self.already_done.get(),
        );
        e.counter(
            "seckill_worker_batches_total",
            "Batches applied in MySQL.",
            &w,
            self.batches.get(),
        );
        e.histogram(
            "seckill_worker_batch_size",
            "Messages per batch.",
            &w,
            &self.batch_size,
        );
        e.histogram(
            "seckill_worker_batch_seconds",
            "Time to apply one batch in MySQL, retries included.",
            &w,
            &self.batch_seconds,
        );
        let help = "MySQL transactions retried, by cause.";
        e.counter(
            "seckill_worker_retries_total",
            help,
            &[("worker", worker_id), ("cause", "deadlock_or_lock_wait")],
            self.retries_transient.get(),
        );
        e.counter(
            "seckill_worker_retries_total",
            help,
            &[("worker", worker_id), ("cause", "connection")],
            self.retries_connection.get(),
        );
        e.counter(
            "seckill_worker_dead_lettered_total",
            "Messages moved to a dead-letter list.",
            &w,
            self.dead_lettered.get(),
        );
        e.counter(
            "seckill_worker_fenced_total",
            "Messages dead-lettered without applying: Redis held no matching flow record.",
            &w,
            self.fenced.get(),
        );
        e.counter(
            "seckill_worker_requeued_total",
            "Messages put back on the queue after a failed application.",
            &w,
            self.requeued.get(),
        );
        e.counter(
            "seckill_worker_reclaimed_total",
            "Messages moved back to a queue from a processing list.",
            &w,
            self.reclaimed.get(),
        );
        e.counter(
            "seckill_worker_redis_data_loss_total",
            "Sales found with Redis behind MySQL's reservation sequence (paused).",
            &w,
            self.data_loss_detected.get(),
        );
        e.counter(
            "seckill_worker_redis_errors_total",
            "Redis errors in the consuming loop.",
            &w,
            self.redis_errors.get(),
        );
        let sales = self.sales.lock().map(|s| s.clone()).unwrap_or_default();
        let ids: Vec<String> = sales.iter().map(|s| s.sale_id.to_string()).collect();
        for (s, id) in sales.iter().zip(&ids) {
            e.gauge(
                "seckill_queue_length",
                "Messages waiting in a sale's queue.",
                &[("sale", id)],
                s.queued,
            );
        }
        for (s, id) in sales.iter().zip(&ids) {
            e.gauge(
                "seckill_processing_length",
                "Messages in the processing lists of a sale (all workers).",
                &[("sale", id)],
                s.processing,
            );
        }
        for (s, id) in sales.iter().zip(&ids) {
            e.gauge(
                "seckill_queue_oldest_age_ms",
                "Age in ms of the oldest queued message of a sale (0: empty).",
                &[("sale", id)],
                s.oldest_age_ms,
            );
        }
        e.finish()
    }
}

/// Serves `GET /metrics` on `listen` from a background thread until the
/// process exits; any other path gets 404. Returns the bound address (useful
/// with port 0) and the thread.
///
/// Errors: the address cannot be bound, or the thread cannot start.
pub fn serve(
    listen: SocketAddr,
    metrics: Arc<Metrics>,
    worker_id: String,
) -> Result<(SocketAddr, JoinHandle<()>), String> {
    let server = tiny_http::Server::http(listen).map_err(|e| format!("{listen}: {e}"))?;
    let bound = server
        .server_addr()
        .to_ip()
        .ok_or_else(|| format!("{listen}: not an IP listener"))?;
    let handle = std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for req in server.incoming_requests() {
                let resp = if req.url() == "/metrics" && *req.method() == tiny_http::Method::Get {
                    let body = metrics.render(&worker_id);
                    let ct = tiny_http::Header::from_bytes(
                        &b"Content-Type"[..],
                        &b"text/plain; version=0.0.4"[..],
                    );
                    let mut r = tiny_http::Response::from_string(body);
                    if let Ok(h) = ct {
                        r = r.with_header(h);
                    }
                    r
                } else {
                    tiny_http::Response::from_string("not found\n").with_status_code(404)
                };
                // A client that hung up is not our problem.
                let _ = req.respond(resp);
            }
        })
        .map_err(|e| e.to_string())?;
    Ok((bound, handle))
}
