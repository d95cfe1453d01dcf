//! Measures what one purchase's metric updates cost on the gateway's hot
//! path: requests in flight up and down, the outcome counter, the request
//! counter and the latency observation of `Metrics::request`, and the
//! group commit's two pipeline counters (at worst one pipeline per
//! purchase), through the gateway's `prometheus-client` metrics. Prints
//! nanoseconds per purchase; asserts nothing (a benchmark, not a test).
//! Run it on a release build:
//! `cargo run --release -p seckill-gateway --example metrics_cost`
//! (figures in docs/PERFORMANCE.md, "Performance: gateway").

use seckill_gateway::metrics::{Label, Metrics, Outcome};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

fn main() {
    let per_thread = 2_000_000;
    println!("threads | ns/purchase (best of 3)");
    for threads in [1, 2, 8, 64] {
        let n = per_thread / threads as u32;
        let mut runs = Vec::new();
        for _round in 0..3 {
            let m = Arc::new(Metrics::default());
            runs.push(ns_per_call(threads, n, Arc::new(move |d| purchase(&m, d))));
        }
        let best = runs.iter().copied().fold(f64::INFINITY, f64::min);
        println!("{threads:>7} | {best:>23.1}");
    }
}
