//! Owns what the gateway's and the worker's `/metrics` share on top of the
//! Prometheus project's Rust client (`prometheus-client`): the histogram
//! bucket bounds, the rendering of a registry in the Prometheus text format
//! (version 0.0.4) and the `Content-Type` to serve it with.
//!
//! Each binary keeps its metrics as `prometheus-client` counters, gauges and
//! histograms (atomics; a histogram observation takes one uncontended
//! mutex) registered in one `Registry` per process, and holds its own
//! handles to them, so the hot path never looks a label set up.
//!
//! Two rules of the library to know when registering: a counter is
//! registered without its `_total` suffix (the encoder appends it: register
//! `"x"` to expose `x_total`), and the library appends a full stop to every
//! HELP text (register `"Requests"` to expose `# HELP ... Requests.`).

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Latency bucket upper bounds in seconds: 100 µs to 5 s.
pub const LATENCY_BUCKETS_S: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Size bucket upper bounds (batch sizes, counts): 1 to 10,000.
pub const SIZE_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 10000.0,
];

/// The `Content-Type` of what [`render`] writes:
/// `text/plain; version=0.0.4; charset=utf-8`.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// A histogram over [`LATENCY_BUCKETS_S`] (observe seconds).
pub fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS_S.iter().copied())
}

/// A histogram over [`SIZE_BUCKETS`] (observe counts).
pub fn size_histogram() -> Histogram {
    Histogram::new(SIZE_BUCKETS.iter().copied())
}

/// The `/metrics` page of `registry` in the Prometheus text format 0.0.4
/// (serve it with [`CONTENT_TYPE`]).
///
/// Errors: a collector registered in `registry` failed to encode (writing
/// to a `String` itself cannot fail).
pub fn render(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut page = String::new();
    prometheus_text::encode(&mut page, registry)?;
    Ok(page)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;

    #[test]
    fn renders_the_text_format_with_the_names_registered_without_total() {
        let mut r = Registry::default();
        let req = Family::<[(&str, &str); 2], Counter>::default();
        r.register("req", "Requests", req.clone());
        req.get_or_create(&[("route", "a"), ("status", "200")])
            .inc_by(3);
        let g: Gauge = Gauge::default();
        r.register("in_flight", "In flight", g.clone());
        g.set(2);
        let h = Histogram::new([0.001, 0.01]);
        r.register("lat_seconds", "Latency", h.clone());
        h.observe(0.0005);
        h.observe(0.005);
        h.observe(3.0);
        let t = render(&r).unwrap_or_default();
        assert!(t.contains("# HELP req_total Requests.\n# TYPE req_total counter\n"));
        assert!(
            t.contains("req_total{route=\"a\",status=\"200\"} 3\n"),
            "{t}"
        );
        assert!(t.contains("in_flight 2\n"), "{t}");
        assert!(t.contains("lat_seconds_bucket{le=\"0.001\"} 1\n"), "{t}");
        assert!(t.contains("lat_seconds_bucket{le=\"0.01\"} 2\n"), "{t}");
        assert!(t.contains("lat_seconds_bucket{le=\"+Inf\"} 3\n"), "{t}");
        assert!(t.contains("lat_seconds_count 3\n"), "{t}");
        assert!(!t.contains("# EOF"), "{t}");
    }

    #[test]
    fn bucket_bounds_print_as_before() {
        // The `le` values of the hand-written exposition were Rust's `{}`
        // of each bound; the library's must be the same strings.
        let h = latency_histogram();
        let mut r = Registry::default();
        r.register("l_seconds", "L", h);
        let t = render(&r).unwrap_or_default();
        for b in LATENCY_BUCKETS_S {
            assert!(
                t.contains(&format!("l_seconds_bucket{{le=\"{b}\"}} 0\n")),
                "{b}: {t}"
            );
        }
        let mut r = Registry::default();
        r.register("s", "S", size_histogram());
        let t = render(&r).unwrap_or_default();
        for b in SIZE_BUCKETS {
            assert!(
                t.contains(&format!("s_bucket{{le=\"{b}\"}} 0\n")),
                "{b}: {t}"
            );
        }
    }
}
