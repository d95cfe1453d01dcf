//! Owns the worker's metrics and their `/metrics` listener (Prometheus text
//! format, like the gateway's): orders applied, batches and their sizes and
//! durations, retries, dead letters, reclaimed messages, and per sale the
//! queue length, the processing-list length and the age of the oldest
//! queued message. `prometheus-client` metrics in one registry; the
//! worker's own series carry the label `worker`, the per-sale ones (the
//! same for every worker) do not.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use seckill_common::metrics::{latency_histogram, size_histogram};
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
    /// this machine's clock); 0 when the queue is empty. Exposed in seconds
    /// (`seckill_queue_oldest_age_seconds`).
    pub oldest_age_ms: i64,
}

/// Every metric of one worker process. Counters are lock-free; the per-sale
/// gauges are replaced whole under a mutex about once a second.
#[derive(Debug)]
pub struct Metrics {
    /// What `/metrics` renders; holds a clone of every handle below.
    registry: Registry,
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
    /// Per-sale queue figures (read by [`SaleFigures`] at each scrape).
    pub sales: Arc<Mutex<Vec<SaleGauges>>>,
}

/// Registers a fresh counter as `name` (without `_total`; `help` without
/// its final full stop, see `seckill_common::metrics`) and returns it.
fn counter(r: &mut Registry, name: &str, help: &str) -> Counter {
    let c = Counter::default();
    r.register(name, help, c.clone());
    c
}

/// Registers `h` as `name` and returns it.
fn histogram(r: &mut Registry, name: &str, help: &str, h: Histogram) -> Histogram {
    r.register(name, help, h.clone());
    h
}

impl Metrics {
    /// The metrics of worker `worker_id` (the value of every series' label
    /// `worker`, but the per-sale gauges').
    pub fn new(worker_id: &str) -> Metrics {
        let mut root = Registry::default();
        let sales = Arc::new(Mutex::new(Vec::new()));
        root.register_collector(Box::new(SaleFigures(sales.clone())));
        let r = root.sub_registry_with_label(("worker".into(), worker_id.to_string().into()));
        let retries = Family::<[(&'static str, &'static str); 1], Counter>::default();
        r.register(
            "seckill_worker_retries",
            "MySQL transactions retried, by cause",
            retries.clone(),
        );
        let retries_transient = retries
            .get_or_create(&[("cause", "deadlock_or_lock_wait")])
            .clone();
        let retries_connection = retries.get_or_create(&[("cause", "connection")]).clone();
        let applied = counter(
            r,
            "seckill_worker_orders_applied",
            "Orders created in MySQL",
        );
        let already_done = counter(
            r,
            "seckill_worker_messages_already_done",
            "Messages whose order already existed (redelivered or duplicated)",
        );
        let batches = counter(r, "seckill_worker_batches", "Batches applied in MySQL");
        let batch_size = histogram(
            r,
            "seckill_worker_batch_size",
            "Messages per batch",
            size_histogram(),
        );
        let batch_seconds = histogram(
            r,
            "seckill_worker_batch_seconds",
            "Time to apply one batch in MySQL, retries included",
            latency_histogram(),
        );
        let dead_lettered = counter(
            r,
            "seckill_worker_dead_lettered",
            "Messages moved to a dead-letter list",
        );
        let fenced = counter(
            r,
            "seckill_worker_fenced",
            "Messages dead-lettered without applying: Redis held no matching flow record",
        );
        let requeued = counter(
            r,
            "seckill_worker_requeued",
            "Messages put back on the queue after a failed application",
        );
        let reclaimed = counter(
            r,
            "seckill_worker_reclaimed",
            "Messages moved back to a queue from a processing list",
        );
        let data_loss_detected = counter(
            r,
            "seckill_worker_redis_data_loss",
            "Sales found with Redis behind MySQL's reservation sequence (paused)",
        );
        let redis_errors = counter(
            r,
            "seckill_worker_redis_errors",
            "Redis errors in the consuming loop",
        );
        Metrics {
            registry: root,
            applied,
            already_done,
            batches,
            batch_size,
            batch_seconds,
            retries_transient,
            retries_connection,
            dead_lettered,
            fenced,
            requeued,
            reclaimed,
            data_loss_detected,
            redis_errors,
            sales,
        }
    }

    /// The `/metrics` page (Prometheus text format 0.0.4; serve it with
    /// `seckill_common::metrics::CONTENT_TYPE`).
    ///
    /// Errors: passed on from the library (never in practice: the page is
    /// written into a `String`).
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        seckill_common::metrics::render(&self.registry)
    }
}

/// Writes the per-sale gauges from the figures the housekeeping thread last
/// stored: `seckill_queue_length`, `seckill_processing_length` and
/// `seckill_queue_oldest_age_seconds`, each with the label `sale`; nothing
/// while no sale is known.
#[derive(Debug)]
struct SaleFigures(Arc<Mutex<Vec<SaleGauges>>>);

/// Name, HELP (with its full stop: a collector's text is written as given)
/// and value of each per-sale gauge.
type SaleGauge = (&'static str, &'static str, fn(&SaleGauges) -> f64);

const SALE_GAUGES: [SaleGauge; 3] = [
    (
        "seckill_queue_length",
        "Messages waiting in a sale's queue.",
        |s| s.queued as f64,
    ),
    (
        "seckill_processing_length",
        "Messages in the processing lists of a sale (all workers).",
        |s| s.processing as f64,
    ),
    (
        "seckill_queue_oldest_age_seconds",
        "Age in seconds of the oldest queued message of a sale (0: empty).",
        |s| s.oldest_age_ms as f64 / 1000.0,
    ),
];

impl Collector for SaleFigures {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let sales = self.0.lock().map(|s| s.clone()).unwrap_or_default();
        if sales.is_empty() {
            return Ok(());
        }
        for (name, help, value) in SALE_GAUGES {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for s in &sales {
                let id = s.sale_id.to_string();
                let labels = [("sale", id.as_str())];
                ConstGauge::new(value(s)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
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
                    match metrics.render() {
                        Ok(body) => {
                            let ct = tiny_http::Header::from_bytes(
                                &b"Content-Type"[..],
                                seckill_common::metrics::CONTENT_TYPE.as_bytes(),
                            );
                            let mut r = tiny_http::Response::from_string(body);
                            if let Ok(h) = ct {
                                r = r.with_header(h);
                            }
                            r
                        }
                        Err(_) => tiny_http::Response::from_string("metrics unavailable\n")
                            .with_status_code(500),
                    }
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
