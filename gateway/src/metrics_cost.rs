//! Measures what one purchase's metric updates cost on the gateway's hot
//! path — requests in flight up and down, the outcome counter, the request
//! counter and the latency observation of `Metrics::request`, and the group
//! commit's two pipeline counters (at worst one pipeline per purchase) —
//! with `prometheus-client` (`crate::metrics::Metrics`) against the
//! hand-written atomics it replaced (kept here, test-only, as the
//! baseline). Prints nanoseconds per purchase; asserts nothing (a
//! benchmark, not a test). Run it on a release build:
//! `cargo test --release -p seckill-gateway metrics_cost -- --ignored --nocapture`
//! (figures in docs/PERFORMANCE.md, "Performance: gateway").

use crate::metrics::{Metrics, Outcome};
use crate::routes::Label;
use seckill_common::metrics::LATENCY_BUCKETS_S;
use std::hint::black_box;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The hand-written metrics of commit 309b44d, reduced to what a purchase
/// touches: the same atomics and the same bucket search.
struct Baseline {
    in_flight: AtomicI64,
    outcomes: [AtomicU64; 11],
    requests: Vec<[AtomicU64; 12]>,
    buckets: Vec<Vec<AtomicU64>>,
    sums: Vec<AtomicU64>,
    counts: Vec<AtomicU64>,
    pipelined: AtomicU64,
    pipelines: AtomicU64,
}

const STATUSES: [u16; 12] = [200, 202, 400, 403, 404, 405, 409, 410, 413, 500, 503, 0];

impl Baseline {
    fn new() -> Baseline {
        let routes = 7;
        Baseline {
            in_flight: AtomicI64::new(0),
            outcomes: std::array::from_fn(|_| AtomicU64::new(0)),
            requests: (0..routes)
                .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
                .collect(),
            buckets: (0..routes)
                .map(|_| {
                    (0..=LATENCY_BUCKETS_S.len())
                        .map(|_| AtomicU64::new(0))
                        .collect()
                })
                .collect(),
            sums: (0..routes).map(|_| AtomicU64::new(0)).collect(),
            counts: (0..routes).map(|_| AtomicU64::new(0)).collect(),
            pipelined: AtomicU64::new(0),
            pipelines: AtomicU64::new(0),
        }
    }

    fn purchase(&self, took: Duration) {
        let r = Label::Purchase as usize;
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.pipelines.fetch_add(1, Ordering::Relaxed);
        self.pipelined.fetch_add(1, Ordering::Relaxed);
        self.outcomes[Outcome::Reserved as usize].fetch_add(1, Ordering::Relaxed);
        let s = STATUSES
            .iter()
            .position(|&c| c == black_box(202))
            .unwrap_or(STATUSES.len() - 1);
        self.requests[r][s].fetch_add(1, Ordering::Relaxed);
        let v = took.as_secs_f64();
        let i = LATENCY_BUCKETS_S
            .iter()
            .position(|b| v <= *b)
            .unwrap_or(LATENCY_BUCKETS_S.len());
        self.buckets[r][i].fetch_add(1, Ordering::Relaxed);
        self.sums[r].fetch_add((v.max(0.0) * 1e6) as u64, Ordering::Relaxed);
        self.counts[r].fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The same updates through the gateway's real `Metrics`.
fn purchase(m: &Metrics, took: Duration) {
    m.in_flight.inc();
    m.pipelines.inc();
    m.pipelined.inc_by(1);
    m.outcome(Outcome::Reserved);
    m.request(Label::Purchase, black_box(202), took);
    m.in_flight.dec();
}

/// Runs `f` `per_thread` times on each of `threads` threads at once and
/// returns the CPU nanoseconds one call took: wall time × the threads that
/// can run at once (at most the machine's cores) ÷ all calls.
fn ns_per_call(threads: usize, per_thread: u32, f: Arc<dyn Fn(Duration) + Send + Sync>) -> f64 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let f = f.clone();
            std::thread::spawn(move || {
                for i in 0..per_thread {
                    // 0.3 to 1.3 ms: the purchase bucket range of a busy run.
                    let took = Duration::from_micros(300 + u64::from((i + t as u32) % 1000));
                    f(black_box(took));
                }
            })
        })
        .collect();
    for h in handles {
        let _ = h.join();
    }
    let wall = start.elapsed().as_nanos() as f64;
    wall * threads.min(cores) as f64 / (threads as f64 * f64::from(per_thread))
}

#[test]
#[ignore = "a benchmark: run with --release -- --ignored --nocapture"]
fn metric_updates_of_one_purchase_old_vs_prometheus_client() {
    let per_thread = 2_000_000;
    println!("threads | hand-written ns/purchase | prometheus-client ns/purchase");
    for threads in [1, 2, 8, 64] {
        let n = per_thread / threads as u32;
        let mut old = Vec::new();
        let mut new = Vec::new();
        for _round in 0..3 {
            let b = Arc::new(Baseline::new());
            old.push(ns_per_call(threads, n, Arc::new(move |d| b.purchase(d))));
            let m = Arc::new(Metrics::default());
            new.push(ns_per_call(threads, n, Arc::new(move |d| purchase(&m, d))));
        }
        let best = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
        println!("{threads:>7} | {:>24.1} | {:>29.1}", best(&old), best(&new));
    }
}
