//! Owns the worker's metrics and their `/metrics` listener (Prometheus text
//! format, like the gateway's): orders applied, batches and their sizes and
//! durations, retries, dead letters by reason, reclaimed messages,
//! payments, cancellations, expiries and releases by outcome, the
//! consumers running and their maximum, the build's version, the
//! process figures and its Redis and MySQL connections (open, reconnects:
//! `seckill_common::connections`); and per sale the queue length, the
//! processing-list length, the dead-letter list's length and the age of
//! the oldest queued message, with the payments queue and its dead
//! letters. `prometheus-client` metrics in one registry; the worker's own
//! series carry the label `worker`. The per-sale and payments gauges
//! describe shared Redis lists, so one worker at a time exports them (the
//! holder of the gauge lease, `housekeeping.rs`): `sum()` over workers
//! counts each list once.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use seckill_common::metrics::{latency_histogram, size_histogram};
use seckill_common::process_metrics::ProcessFigures;
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
    /// Entries of the sale's dead-letter lists (every bucket).
    pub dead_letters: i64,
}

/// Figures of the shared lists, written by the holder of the gauge lease
/// (`housekeeping.rs`); `None` in every other worker, which exports none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SharedGauges {
    /// Per sale, ascending.
    pub sales: Vec<SaleGauges>,
    /// Payments and cancellations waiting in `seckill:{payments}`.
    pub payments_queued: i64,
    /// Entries of the payments dead-letter list `seckill:{payments}:dlq`.
    pub payments_dead_letters: i64,
}

/// The `reason` label of `seckill_worker_dead_lettered_total`, in order
/// (`crate::batch::reason_label` maps a dead letter's reason to one).
pub const DEAD_LETTER_REASONS: [&str; 8] = [
    "malformed",
    "no_flow_record",
    "unknown_sale",
    "stock_exhausted",
    "buyer_holds_order",
    "max_attempts",
    "over_buyer_limit",
    "other",
];

/// The `outcome` label of `seckill_worker_payments_total`, in order: what
/// a payment came to in MySQL (`lifecycle::PaymentOutcome`, applied now),
/// a delivery of a payment id applied before (`duplicate`) or applied for
/// another reservation or amount (`conflict`), a failed attempt put back
/// on the queue (`retried`), and one given up on (`dead_lettered`).
pub const PAYMENT_OUTCOMES: [&str; 10] = [
    "paid",
    "amount_mismatch",
    "late",
    "unknown_reservation",
    "not_payable",
    "duplicate",
    "conflict",
    "retried",
    "dead_lettered",
    "after_cancellation",
];

/// The index in [`PAYMENT_OUTCOMES`] of what MySQL made of a payment.
pub fn payment_outcome_index(o: seckill_common::lifecycle::PaymentOutcome) -> usize {
    use seckill_common::lifecycle::PaymentOutcome;
    match o {
        PaymentOutcome::Paid => 0,
        PaymentOutcome::AmountMismatch => 1,
        PaymentOutcome::Late => 2,
        PaymentOutcome::UnknownReservation => 3,
        PaymentOutcome::NotPayable => 4,
        PaymentOutcome::AfterCancellation => 9,
        // Only ever found stored (a drop wrote it): a delivery of a
        // payment id recorded before.
        PaymentOutcome::Dropped => 5,
    }
}

/// The `outcome` label of `seckill_worker_cancellations_total`, in order:
/// the pending order is cancelled now, the buyer holds no order, the order
/// is no longer pending (nothing changed), a failed attempt put back on
/// the queue, one given up on.
pub const CANCEL_OUTCOMES: [&str; 5] = [
    "cancelled",
    "no_order",
    "not_pending",
    "retried",
    "dead_lettered",
];

/// The `outcome` label of `seckill_worker_releases_total`, in order: the
/// Redis step of a release (expiry, cancellation) put the unit back on
/// sale now, found it done already, or found no flow record (Redis lost it;
/// the reconciler reports the unit).
pub const RELEASE_OUTCOMES: [&str; 3] = ["released", "already", "not_found"];

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
    /// Transactions retried after a statement error, within
    /// `SECKILL_WORKER_RETRY_FOR`.
    pub retries_statement: Counter,
    /// Messages moved to a dead-letter list, by reason
    /// ([`DEAD_LETTER_REASONS`] order).
    pub dead_lettered: Vec<Counter>,
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
    /// Payments by outcome ([`PAYMENT_OUTCOMES`] order).
    pub payments: Vec<Counter>,
    /// Cancellations by outcome ([`CANCEL_OUTCOMES`] order).
    pub cancellations: Vec<Counter>,
    /// Pending orders expired in MySQL by the sweep.
    pub expired: Counter,
    /// Redis steps of releases by outcome ([`RELEASE_OUTCOMES`] order).
    pub releases: Vec<Counter>,
    /// 1 while this worker holds the gauge lease and exports the shared
    /// lists' gauges, else 0.
    pub gauge_reporter: Gauge,
    /// Consumers this process runs now (`pool.rs`).
    pub consumers: Gauge,
    /// `SECKILL_WORKER_CONSUMERS_MAX`, so a rule can tell a pool at its
    /// maximum.
    pub consumers_max: Gauge,
    /// The shared lists' figures (read by [`SaleFigures`] at each scrape);
    /// `None` unless this worker holds the gauge lease.
    pub sales: Arc<Mutex<Option<SharedGauges>>>,
}

/// Registers a fresh counter as `name` (without `_total`; `help` without
/// its final full stop, see `seckill_common::metrics`) and returns it.
fn counter(r: &mut Registry, name: &str, help: &str) -> Counter {
    let c = Counter::default();
    r.register(name, help, c.clone());
    c
}

/// Registers a family of counters with one label and returns the handle
/// of each series, one per entry of `values`, in order (every series
/// exists from the start, at 0).
fn by_label(
    r: &mut Registry,
    name: &str,
    help: &str,
    label: &'static str,
    values: &[&'static str],
) -> Vec<Counter> {
    let family = Family::<[(&'static str, &'static str); 1], Counter>::default();
    r.register(name, help, family.clone());
    values
        .iter()
        .map(|v| family.get_or_create(&[(label, v)]).clone())
        .collect()
}

/// Registers the MySQL retry counters, by cause, and returns the handles
/// (deadlock or lock-wait timeout, lost or refused connection).
fn retries(r: &mut Registry) -> (Counter, Counter, Counter) {
    let retries = Family::<[(&'static str, &'static str); 1], Counter>::default();
    r.register(
        "seckill_worker_retries",
        "MySQL transactions retried, by cause",
        retries.clone(),
    );
    let transient = retries
        .get_or_create(&[("cause", "deadlock_or_lock_wait")])
        .clone();
    let connection = retries.get_or_create(&[("cause", "connection")]).clone();
    let statement = retries.get_or_create(&[("cause", "statement")]).clone();
    (transient, connection, statement)
}

/// Registers the dead letters by reason ([`DEAD_LETTER_REASONS`] order).
fn dead_letter_series(r: &mut Registry) -> Vec<Counter> {
    by_label(
        r,
        "seckill_worker_dead_lettered",
        "Messages moved to a sale's dead-letter list, by reason: malformed (unparsable, or \
         another sale's), no_flow_record (the fence: released or never made), unknown_sale, \
         stock_exhausted (MySQL stock), buyer_holds_order, max_attempts \
         (SECKILL_WORKER_MAX_ATTEMPTS server errors), over_buyer_limit (the buyer's orders \
         would hold more than max_per_buyer units in MySQL), other",
        "reason",
        &DEAD_LETTER_REASONS,
    )
}

/// Registers the payments by outcome ([`PAYMENT_OUTCOMES`] order).
fn payment_series(r: &mut Registry) -> Vec<Counter> {
    by_label(
        r,
        "seckill_worker_payments",
        "Payments taken from the payments queue, by outcome: paid, amount_mismatch, late, \
         after_cancellation, \
         unknown_reservation, not_payable (applied now), duplicate (that payment id applied \
         before), conflict (that id applied before for another reservation or amount), \
         retried (a failed attempt, requeued), dead_lettered",
        "outcome",
        &PAYMENT_OUTCOMES,
    )
}

/// Registers the cancellations by outcome ([`CANCEL_OUTCOMES`] order).
fn cancellation_series(r: &mut Registry) -> Vec<Counter> {
    by_label(
        r,
        "seckill_worker_cancellations",
        "Buyers' cancellations taken from the payments queue, by outcome: cancelled, \
         no_order, not_pending (nothing changed), retried, dead_lettered",
        "outcome",
        &CANCEL_OUTCOMES,
    )
}

/// Registers the Redis steps of releases by outcome ([`RELEASE_OUTCOMES`]
/// order).
fn release_series(r: &mut Registry) -> Vec<Counter> {
    by_label(
        r,
        "seckill_worker_releases",
        "Redis steps of releases (expiries, cancellations), by outcome: released (unit back \
         on sale), already (done before), not_found (no flow record in Redis)",
        "outcome",
        &RELEASE_OUTCOMES,
    )
}

/// Registers the gauge saying whether this worker exports the shared
/// lists' gauges and returns it (0 until it holds the gauge lease).
fn exporter_gauge(r: &mut Registry) -> Gauge {
    let gauge_reporter = Gauge::default();
    r.register(
        "seckill_worker_shared_lists_exporter",
        "1 while this worker exports the shared queue and dead-letter gauges (one worker at a time)",
        gauge_reporter.clone(),
    );
    gauge_reporter
}

/// Registers `seckill_worker_consumers` and `seckill_worker_consumers_max`.
fn consumer_gauges(r: &mut Registry) -> (Gauge, Gauge) {
    let running = Gauge::default();
    r.register(
        "seckill_worker_consumers",
        "Consumers this worker process runs now (each its own processing lists and MySQL session)",
        running.clone(),
    );
    let max = Gauge::default();
    r.register(
        "seckill_worker_consumers_max",
        "Most consumers this worker process may run (SECKILL_WORKER_CONSUMERS_MAX)",
        max.clone(),
    );
    (running, max)
}

/// Registers the build's version as `seckill_worker_build_info` (always 1).
fn build_info(r: &mut Registry) {
    let build = Family::<[(&'static str, &'static str); 1], Gauge>::default();
    r.register(
        "seckill_worker_build_info",
        "1, labelled with the version of this worker's build",
        build.clone(),
    );
    build
        .get_or_create(&[("version", env!("CARGO_PKG_VERSION"))])
        .set(1);
}

/// Adds one to entry `i` of `counters` (nothing when out of range).
pub fn count(counters: &[Counter], i: usize) {
    if let Some(c) = counters.get(i) {
        c.inc();
    }
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
        let sales = Arc::new(Mutex::new(None));
        root.register_collector(Box::new(SaleFigures(sales.clone())));
        let r = root.sub_registry_with_label(("worker".into(), worker_id.to_string().into()));
        let (retries_transient, retries_connection, retries_statement) = retries(r);
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
        let dead_lettered = dead_letter_series(r);
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
        let payments = payment_series(r);
        let cancellations = cancellation_series(r);
        let expired = counter(
            r,
            "seckill_worker_orders_expired",
            "Pending orders expired in MySQL by the sweep (payment deadline passed)",
        );
        let releases = release_series(r);
        let gauge_reporter = exporter_gauge(r);
        let (consumers, consumers_max) = consumer_gauges(r);
        build_info(r);
        use seckill_common::connections::{register, Export, Store};
        register(
            r,
            "seckill_worker",
            &[Store::Redis, Store::Mysql],
            Export::OpenAndReconnects,
        );
        root.register_collector(Box::new(ProcessFigures));
        Metrics {
            registry: root,
            applied,
            already_done,
            batches,
            batch_size,
            batch_seconds,
            retries_transient,
            retries_connection,
            retries_statement,
            dead_lettered,
            fenced,
            requeued,
            reclaimed,
            data_loss_detected,
            redis_errors,
            payments,
            cancellations,
            expired,
            releases,
            gauge_reporter,
            consumers,
            consumers_max,
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

/// Writes the shared lists' gauges from the figures the housekeeping thread
/// last stored: per sale (label `sale`) `seckill_queue_length`,
/// `seckill_processing_length`, `seckill_dead_letter_length` and
/// `seckill_queue_oldest_age_seconds`, then `seckill_payments_queue_length`
/// and `seckill_payments_dead_letter_length`; nothing unless this worker
/// holds the gauge lease.
#[derive(Debug)]
struct SaleFigures(Arc<Mutex<Option<SharedGauges>>>);

/// Name, HELP (with its full stop: a collector's text is written as given)
/// and value of each per-sale gauge.
type SaleGauge = (&'static str, &'static str, fn(&SaleGauges) -> f64);

const SALE_GAUGES: [SaleGauge; 4] = [
    (
        "seckill_queue_length",
        "Messages waiting in a sale's queue (exported by one worker).",
        |s| s.queued as f64,
    ),
    (
        "seckill_processing_length",
        "Messages in the processing lists of a sale (all workers; exported by one worker).",
        |s| s.processing as f64,
    ),
    (
        "seckill_dead_letter_length",
        "Entries of a sale's dead-letter lists, settled ones excluded (exported by one worker).",
        |s| s.dead_letters as f64,
    ),
    (
        "seckill_queue_oldest_age_seconds",
        "Age in seconds of the oldest queued message of a sale (0: empty; exported by one worker).",
        |s| s.oldest_age_ms as f64 / 1000.0,
    ),
];

impl Collector for SaleFigures {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(shared) = self.0.lock().ok().and_then(|s| s.clone()) else {
            return Ok(());
        };
        if !shared.sales.is_empty() {
            for (name, help, value) in SALE_GAUGES {
                let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
                for s in &shared.sales {
                    let id = s.sale_id.to_string();
                    let labels = [("sale", id.as_str())];
                    ConstGauge::new(value(s)).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        let payments = [
            (
                "seckill_payments_queue_length",
                "Payments and cancellations waiting in the payments queue (exported by one worker).",
                shared.payments_queued,
            ),
            (
                "seckill_payments_dead_letter_length",
                "Entries of the payments dead-letter list (exported by one worker).",
                shared.payments_dead_letters,
            ),
        ];
        for (name, help, value) in payments {
            let e = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(value).encode(e)?;
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
