//! Owns the Prometheus text exposition shared by the gateway's and the
//! worker's `/metrics`: lock-free counters, gauges and histograms, and the
//! functions that write them in the text format (version 0.0.4).
//!
//! Each binary keeps its own metrics in a struct of these atomics (no global
//! registry, no lock on the hot path) and renders them with [`Exposition`].

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

/// A monotonically increasing count.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    /// The current count.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down (in-flight requests, queue lengths).
#[derive(Debug, Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    /// Adds one.
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    /// Subtracts one.
    pub fn dec(&self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
    /// Sets the value.
    pub fn set(&self, v: i64) {
        self.0.store(v, Ordering::Relaxed);
    }
    /// The current value.
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Latency bucket upper bounds in seconds: 100 µs to 5 s.
pub const LATENCY_BUCKETS_S: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Size bucket upper bounds (batch sizes, counts): 1 to 10,000.
pub const SIZE_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 10000.0,
];

/// A histogram with fixed upper bounds; observations are lock-free.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Non-cumulative counts, one per bound, plus one for `+Inf`.
    buckets: Vec<AtomicU64>,
    /// Sum of observations in millionths of the unit (µs for seconds).
    sum_millionths: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    /// A histogram over `bounds` (ascending upper bounds).
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_millionths: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    /// Records one value (in the unit of the bounds).
    pub fn observe(&self, v: f64) {
        let i = self
            .bounds
            .iter()
            .position(|b| v <= *b)
            .unwrap_or(self.bounds.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_millionths
            .fetch_add((v.max(0.0) * 1e6) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Records a duration in seconds.
    pub fn observe_duration(&self, d: Duration) {
        self.observe(d.as_secs_f64());
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

/// A `/metrics` page being written.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
    last_family: String,
}

fn labels_text(labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let inner: Vec<String> = labels
        .iter()
        .map(|(k, v)| {
            let v = v
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            format!("{k}=\"{v}\"")
        })
        .collect();
    format!("{{{}}}", inner.join(","))
}

impl Exposition {
    /// An empty page.
    pub fn new() -> Self {
        Exposition::default()
    }

    fn header(&mut self, name: &str, kind: &str, help: &str) {
        if self.last_family != name {
            let _ = writeln!(self.out, "# HELP {name} {help}");
            let _ = writeln!(self.out, "# TYPE {name} {kind}");
            self.last_family = name.to_string();
        }
    }

    /// Writes one counter sample; samples of one family must be consecutive.
    pub fn counter(&mut self, name: &str, help: &str, labels: &[(&str, &str)], v: u64) {
        self.header(name, "counter", help);
        let _ = writeln!(self.out, "{name}{} {v}", labels_text(labels));
    }

    /// Writes one gauge sample.
    pub fn gauge(&mut self, name: &str, help: &str, labels: &[(&str, &str)], v: i64) {
        self.header(name, "gauge", help);
        let _ = writeln!(self.out, "{name}{} {v}", labels_text(labels));
    }

    /// Writes a histogram (cumulative `_bucket`, `_sum`, `_count`).
    pub fn histogram(&mut self, name: &str, help: &str, labels: &[(&str, &str)], h: &Histogram) {
        self.header(name, "histogram", help);
        let mut cum = 0u64;
        for (i, b) in h.buckets.iter().enumerate() {
            cum += b.load(Ordering::Relaxed);
            let le = h
                .bounds
                .get(i)
                .map_or_else(|| "+Inf".to_string(), |b| b.to_string());
            let mut l: Vec<(&str, &str)> = labels.to_vec();
            l.push(("le", &le));
            let _ = writeln!(self.out, "{name}_bucket{} {cum}", labels_text(&l));
        }
        let sum = h.sum_millionths.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(self.out, "{name}_sum{} {sum}", labels_text(labels));
        let _ = writeln!(
            self.out,
            "{name}_count{} {}",
            labels_text(labels),
            h.count()
        );
    }

    /// The page text; serve with `Content-Type: text/plain; version=0.0.4`.
    pub fn finish(self) -> String {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_text_format() {
        let h = Histogram::new(&[0.001, 0.01]);
        h.observe(0.0005);
        h.observe(0.005);
        h.observe(3.0);
        let mut e = Exposition::new();
        e.counter(
            "req_total",
            "Requests.",
            &[("route", "a"), ("status", "200")],
            3,
        );
        e.counter(
            "req_total",
            "Requests.",
            &[("route", "b"), ("status", "404")],
            1,
        );
        e.gauge("in_flight", "In flight.", &[], 2);
        e.histogram("lat_seconds", "Latency.", &[], &h);
        let t = e.finish();
        assert_eq!(t.matches("# TYPE req_total counter").count(), 1);
        assert!(t.contains("req_total{route=\"a\",status=\"200\"} 3\n"));
        assert!(t.contains("in_flight 2\n"));
        assert!(t.contains("lat_seconds_bucket{le=\"0.001\"} 1\n"));
        assert!(t.contains("lat_seconds_bucket{le=\"0.01\"} 2\n"));
        assert!(t.contains("lat_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(t.contains("lat_seconds_count 3\n"));
    }
}
