//! Owns the HTML report of a run (`seckill-report`, written by
//! `scripts/demo.sh` and `scripts/bench.sh` as `report.html` beside their
//! logs): one self-contained page (inline CSS and SVG, no script, nothing
//! fetched) drawn from `seckill-load`'s JSON report or the demo's
//! `demo.json` (which holds it as `load`), one section per input.
//!
//! Each section has the figures, four charts and the invariants table:
//! - `progress`: units on sale (Redis), reserved (Redis flow records),
//!   ordered and paid (MySQL) over the run, against the stock (a dashed
//!   line), from the report's `timeline.samples`;
//! - `answers`: the crowd's answers per second by HTTP status, from
//!   `timeline.answers` (counts per `bucket_ms`), one flat step per bucket
//!   (two points);
//! - `latency`: p50, p99 and max per bucket, in ms (a step per bucket
//!   with answers);
//! - `queue`: messages queued and in the processing lists.
//!
//! Each chart names what it drew in the DOM (`report_svg.rs`): a browser
//! shows it, and `tests/tests/e2e_demo.rs` reads it back.

use crate::report_svg::{escape, num, series, steps, Chart, Series};
use serde_json::Value;
use std::fmt::Write;

/// The numbers of `v` (an array), `None` where not a number.
fn numbers(v: &Value) -> Vec<Option<f64>> {
    v.as_array()
        .map(|a| a.iter().map(Value::as_f64).collect())
        .unwrap_or_default()
}

/// The four charts of one load report (`timeline` absent: charts without
/// data).
fn charts(load: &Value) -> Vec<Chart> {
    let t = &load["timeline"];
    let samples = &t["samples"];
    let secs: Vec<Option<f64>> = numbers(&samples["t_ms"])
        .into_iter()
        .map(|v| v.map(|ms| ms / 1000.0))
        .collect();
    let from_samples = |names: &[(&str, &str)]| -> Vec<Series> {
        names
            .iter()
            .enumerate()
            .filter_map(|(i, (key, name))| series(name, i, &secs, &numbers(&samples[*key])))
            .collect()
    };
    let bucket_ms = t["bucket_ms"].as_f64().unwrap_or(100.0).max(1.0);
    let answers: Vec<Series> = t["answers"]
        .as_object()
        .map(|m| {
            m.iter()
                .enumerate()
                .filter_map(|(i, (status, counts))| {
                    let per_s: Vec<Option<f64>> = numbers(counts)
                        .into_iter()
                        .map(|c| c.map(|c| c * 1000.0 / bucket_ms))
                        .collect();
                    let every = vec![true; per_s.len()];
                    steps(status, i, bucket_ms, &per_s, &every)
                })
                .collect()
        })
        .unwrap_or_default();
    // A bucket has latencies when any status has answers in it.
    let counts: Vec<Vec<Option<f64>>> = t["answers"]
        .as_object()
        .map(|m| m.values().map(numbers).collect())
        .unwrap_or_default();
    let buckets = counts.iter().map(Vec::len).max().unwrap_or(0);
    let answered: Vec<bool> = (0..buckets)
        .map(|b| {
            counts
                .iter()
                .any(|c| c.get(b).copied().flatten() > Some(0.0))
        })
        .collect();
    let latency: Vec<Series> = ["p50", "p99", "max"]
        .iter()
        .enumerate()
        .filter_map(|(i, q)| steps(q, i, bucket_ms, &numbers(&t["latency_ms"][*q]), &answered))
        .collect();
    let stock = load["total_stock"].as_f64().filter(|s| *s > 0.0);
    vec![
        Chart {
            id: "progress",
            title: "Units on sale, reserved, ordered and paid".into(),
            x_title: "s since the first request",
            y_title: "units",
            series: from_samples(&[
                ("stock_left", "on sale (Redis)"),
                ("reserved", "reserved (Redis)"),
                ("ordered", "ordered (MySQL)"),
                ("paid", "paid (MySQL)"),
            ]),
            limit: stock.map(|s| ("stock".to_string(), s)),
        },
        Chart {
            id: "answers",
            title: "The crowd's answers per second by status".into(),
            x_title: "s since the first request",
            y_title: "answers/s",
            series: answers,
            limit: None,
        },
        Chart {
            id: "latency",
            title: "Answer latency percentiles".into(),
            x_title: "s since the first request",
            y_title: "ms",
            series: latency,
            limit: None,
        },
        Chart {
            id: "queue",
            title: "Queue depth".into(),
            x_title: "s since the first request",
            y_title: "messages",
            series: from_samples(&[("queued", "queued"), ("processing", "processing")]),
            limit: None,
        },
    ]
}

/// The figures table of one load report.
fn figures(load: &Value, out: &mut String) {
    let f = |v: &Value| match v.as_f64() {
        Some(x) => num((x * 100.0).round() / 100.0),
        None => "-".to_string(),
    };
    let answers: Vec<String> = load["answers"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| format!("{k}: {}", f(v))).collect())
        .unwrap_or_default();
    let l = &load["latency_ms"];
    let rows = [
        ("users", f(&load["users"])),
        ("stock", f(&load["total_stock"])),
        (
            "requests",
            format!(
                "{} in {} s = {} req/s",
                f(&load["requests"]),
                f(&load["elapsed_s"]),
                f(&load["requests_per_s"])
            ),
        ),
        ("answers", answers.join(", ")),
        (
            "latency (ms)",
            format!(
                "p50 {}, p90 {}, p99 {}, max {}",
                f(&l["p50"]),
                f(&l["p90"]),
                f(&l["p99"]),
                f(&l["max"])
            ),
        ),
        ("sale open → last 202 (ms)", f(&load["open_to_last_202_ms"])),
        (
            "sale open → last order (ms)",
            f(&load["open_to_last_order_ms"]),
        ),
        ("queue drained after (ms)", f(&load["drain_ms"])),
    ];
    // The health-check burst (`--healthz-burst`), when the run sent one.
    let h = &load["healthz"];
    let healthz = h.is_object().then(|| {
        (
            "GET /healthz, same gateway",
            format!(
                "{} in {} s = {} req/s (the crowd at {} % of it)",
                f(&h["sent"]),
                f(&h["seconds"]),
                f(&h["rate_per_s"]),
                f(&h["crowd_share"]
                    .as_f64()
                    .map_or(Value::Null, |x| (x * 100.0).into()))
            ),
        )
    });
    let _ = writeln!(out, r#"<table class="figures">"#);
    for (k, v) in rows.into_iter().chain(healthz) {
        let _ = writeln!(
            out,
            "<tr><th>{}</th><td>{}</td></tr>",
            escape(k),
            escape(&v)
        );
    }
    let _ = writeln!(out, "</table>");
}

/// The invariants table of one load report: one row per invariant.
fn invariants(load: &Value, out: &mut String) {
    let _ = writeln!(
        out,
        r#"<h3>Invariants</h3><table class="invariants"><tr><th>invariant</th><th>verdict</th><th>detail</th></tr>"#
    );
    for c in load["invariants"].as_array().into_iter().flatten() {
        let ok = c["ok"].as_bool() == Some(true);
        let _ = writeln!(
            out,
            r#"<tr class="{}"><td>{}</td><td>{}</td><td>{}</td></tr>"#,
            if ok { "ok" } else { "fail" },
            escape(c["name"].as_str().unwrap_or("?")),
            if ok { "ok" } else { "FAIL" },
            escape(c["detail"].as_str().unwrap_or(""))
        );
    }
    let _ = writeln!(out, "</table>");
}

/// One section: `name`, and `report`, a demo's `demo.json` (the load
/// report under `load`, the run's verdict beside it) or a load report.
fn section(name: &str, report: &Value, out: &mut String) {
    let load = if report["load"].is_object() {
        &report["load"]
    } else {
        report
    };
    let _ = writeln!(out, r#"<section><h2>{}</h2>"#, escape(name));
    if report["load"].is_object() {
        let pass = report["pass"].as_bool() == Some(true);
        let _ = writeln!(
            out,
            r#"<p class="verdict {}">{}: sale {}, seckill-load exit {}, reconciler exit {}, exit codes after SIGTERM {}</p>"#,
            if pass { "ok" } else { "fail" },
            if pass { "PASS" } else { "FAIL" },
            escape(&report["sale"].to_string()),
            escape(&report["load_exit"].to_string()),
            escape(&report["reconciler_exit"].to_string()),
            escape(&report["stop_codes"].to_string())
        );
    }
    figures(load, out);
    for c in charts(load) {
        c.render(out);
    }
    invariants(load, out);
    let _ = writeln!(out, "</section>");
}

const STYLE: &str = "body{font:14px/1.4 sans-serif;margin:2em;color:#222}\
table{border-collapse:collapse;margin:.5em 0}th,td{border:1px solid #ccc;padding:2px 8px;text-align:left}\
tr.ok td:nth-child(2),.verdict.ok{color:#007a33}tr.fail td:nth-child(2),.verdict.fail{color:#b00020;font-weight:bold}\
svg.chart{display:block;background:#fff}.grid{stroke:#e4e4e4}.tick,.axis,.empty{font-size:11px;fill:#555}\
.series{fill:none;stroke-width:2}.limit{stroke:#b00020;stroke-dasharray:6 4}\
ul.legend{list-style:none;padding:0;margin:0 0 1.5em}ul.legend li{display:inline-block;margin-right:1.5em}\
.swatch{display:inline-block;width:14px;height:4px;margin-right:4px;vertical-align:middle}\
.swatch.dashed{border-top:2px dashed #b00020;height:0}";

/// The whole page over `(name, report)` sections.
pub fn page(title: &str, sections: &[(String, Value)]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{0}</title><style>{STYLE}</style></head><body><h1>{0}</h1>",
        escape(title)
    );
    for (name, report) in sections {
        section(name, report, &mut out);
    }
    let _ = writeln!(out, "</body></html>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_series_with_data_is_one_polyline_with_its_points() {
        let load = json!({
            "total_stock": 3,
            "invariants": [{"name": "a<b", "ok": true, "detail": "x & y"}],
            "timeline": {
                "bucket_ms": 100,
                "answers": {"202": [2, 1], "410": [0, 4]},
                "latency_ms": {"p50": [1.0, 2.0], "p99": [1.5, 3.0], "max": [2.0, 4.0]},
                "samples": {
                    "t_ms": [-5, 100, 200],
                    "stock_left": [3, 1, 0], "reserved": [0, 2, 3],
                    "ordered": [0, 0, 3], "paid": [0, 0, 1],
                    "queued": [null, null, null], "processing": [0, 2, 0],
                },
            },
        });
        let html = page("t", &[("s".into(), load)]);
        let count = |needle: &str| html.matches(needle).count();
        assert_eq!(count(r#"<svg class="chart""#), 4);
        assert_eq!(count(r#"data-points="3""#), 5, "{html}");
        assert_eq!(count(r#"data-points="4""#), 5, "{html}");
        assert_eq!(count(r#"<polyline"#), 10);
        assert_eq!(count(r#"data-limit="stock""#), 1);
        assert_eq!(count(r#"data-series="paid (MySQL)" data-last="1""#), 1);
        assert_eq!(count("a&lt;b"), 1);
        assert_eq!(count("x &amp; y"), 1);
        assert_eq!(count("http"), 0, "nothing fetched");
    }
}
