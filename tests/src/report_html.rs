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
//! Each chart is an `<svg class="chart" data-chart="NAME">` with one
//! `<polyline class="series" data-series="…" data-points="N">` per series
//! that has data, so a browser's DOM tells what was drawn (the test reads
//! it: `tests/tests/e2e_demo.rs`); its legend gives each series' last value.

use serde_json::Value;
use std::fmt::Write;

/// Width and height of a chart, in SVG user units (px).
const W: f64 = 720.0;
const H: f64 = 240.0;
/// Margins: left (y labels), right, top, bottom (x labels).
const ML: f64 = 60.0;
const MR: f64 = 12.0;
const MT: f64 = 22.0;
const MB: f64 = 30.0;

/// Series colours, in order (readable on white, told apart by most
/// colour-blind readers: the Okabe-Ito palette).
const COLOURS: [&str; 8] = [
    "#0072b2", "#e69f00", "#009e73", "#d55e00", "#cc79a7", "#56b4e9", "#f0e442", "#000000",
];

/// One line of a chart: its name, its colour and its points (x, y).
struct Series {
    name: String,
    colour: &'static str,
    points: Vec<(f64, f64)>,
}

/// One chart: what it is called, its axes' titles, its series and an
/// optional horizontal limit line (name, y).
struct Chart {
    id: &'static str,
    title: String,
    x_title: &'static str,
    y_title: &'static str,
    series: Vec<Series>,
    limit: Option<(String, f64)>,
}

/// `s` escaped for HTML text and attribute values.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Round tick steps covering `0..=max` in about five steps.
fn ticks(max: f64) -> Vec<f64> {
    if !(max > 0.0) || !max.is_finite() {
        return vec![0.0, 1.0];
    }
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let n = (max / step).ceil() as usize;
    (0..=n.max(1)).map(|i| i as f64 * step).collect()
}

/// A number for an axis or a legend: integers as such, else at most 2
/// decimals.
fn num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

impl Chart {
    /// The chart as an SVG element plus its legend.
    fn render(&self, out: &mut String) {
        let xs = || {
            self.series
                .iter()
                .flat_map(|s| s.points.iter().map(|p| p.0))
        };
        let x_min = xs().fold(f64::INFINITY, f64::min).min(0.0);
        let x_max = xs().fold(0.0f64, f64::max);
        let y_max = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .chain(self.limit.iter().map(|l| l.1))
            .fold(0.0f64, f64::max);
        let yt = ticks(y_max);
        // Round x ticks from 0 (samples a few ms before the first request
        // sit left of it).
        let xt: Vec<f64> = ticks(x_max).into_iter().filter(|x| *x >= x_min).collect();
        let y_top = *yt.last().unwrap_or(&1.0);
        let x_end = xt.last().copied().unwrap_or(1.0).max(x_max);
        let x_span = (x_end - x_min).max(1e-9);
        let px = |x: f64| ML + (x - x_min) / x_span * (W - ML - MR);
        let py = |y: f64| MT + (1.0 - y / y_top) * (H - MT - MB);
        let _ = writeln!(out, "<h3>{}</h3>", escape(&self.title));
        let _ = writeln!(
            out,
            r#"<svg class="chart" data-chart="{}" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="{}">"#,
            self.id,
            escape(&self.title)
        );
        for y in &yt {
            let _ = writeln!(
                out,
                r##"<line class="grid" x1="{ML}" x2="{:.1}" y1="{:.1}" y2="{:.1}"/><text class="tick" x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                W - MR,
                py(*y),
                py(*y),
                ML - 6.0,
                py(*y) + 4.0,
                num(*y)
            );
        }
        for x in &xt {
            let _ = writeln!(
                out,
                r#"<text class="tick" x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                px(*x),
                H - MB + 16.0,
                num(*x)
            );
        }
        let _ = writeln!(
            out,
            r#"<text class="axis" x="{:.1}" y="{:.1}" text-anchor="end">{}</text><text class="axis" x="4" y="12">{}</text>"#,
            W - MR,
            H - 2.0,
            self.x_title,
            self.y_title
        );
        if let Some((name, y)) = &self.limit {
            let _ = writeln!(
                out,
                r#"<line class="limit" data-limit="{}" x1="{ML}" x2="{:.1}" y1="{:.1}" y2="{:.1}"/>"#,
                escape(name),
                W - MR,
                py(*y),
                py(*y)
            );
        }
        for s in &self.series {
            let pts: Vec<String> = s
                .points
                .iter()
                .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
                .collect();
            let _ = writeln!(
                out,
                r#"<polyline class="series" data-series="{}" data-points="{}" stroke="{}" points="{}"/>"#,
                escape(&s.name),
                s.points.len(),
                s.colour,
                pts.join(" ")
            );
        }
        if self.series.is_empty() {
            let _ = writeln!(
                out,
                r#"<text class="empty" x="{:.1}" y="{:.1}" text-anchor="middle">no data</text>"#,
                W / 2.0,
                H / 2.0
            );
        }
        let _ = writeln!(out, "</svg>");
        let _ = write!(out, r#"<ul class="legend" data-chart="{}">"#, self.id);
        if let Some((name, y)) = &self.limit {
            let _ = write!(
                out,
                r#"<li><span class="swatch dashed"></span>{} {}</li>"#,
                escape(name),
                num(*y)
            );
        }
        for s in &self.series {
            let last = s.points.last().map_or(0.0, |p| p.1);
            let _ = write!(
                out,
                r#"<li data-series="{0}" data-last="{1}"><span class="swatch" style="background:{2}"></span>{0}: last {1}</li>"#,
                escape(&s.name),
                num(last),
                s.colour
            );
        }
        let _ = writeln!(out, "</ul>");
    }
}

/// The numbers of `v` (an array), `None` where not a number.
fn numbers(v: &Value) -> Vec<Option<f64>> {
    v.as_array()
        .map(|a| a.iter().map(Value::as_f64).collect())
        .unwrap_or_default()
}

/// Series `name` over `xs` from `ys`, points where both are numbers; `None`
/// when it has none.
fn series(name: &str, i: usize, xs: &[Option<f64>], ys: &[Option<f64>]) -> Option<Series> {
    let points: Vec<(f64, f64)> = xs
        .iter()
        .zip(ys)
        .filter_map(|(x, y)| Some(((*x)?, (*y)?)))
        .collect();
    (!points.is_empty()).then(|| Series {
        name: name.to_string(),
        colour: COLOURS[i % COLOURS.len()],
        points,
    })
}

/// Series `name` of per-bucket values `ys` as steps: each bucket `b` kept
/// (`keep[b]`) is a flat segment over its `bucket_ms` (two points), so a
/// run of one bucket still shows; `None` when none is kept.
fn steps(
    name: &str,
    i: usize,
    bucket_ms: f64,
    ys: &[Option<f64>],
    keep: &[bool],
) -> Option<Series> {
    let mut xs = Vec::new();
    let mut vs = Vec::new();
    for (b, y) in ys.iter().enumerate() {
        if keep.get(b).copied().unwrap_or(false) {
            let x0 = b as f64 * bucket_ms / 1000.0;
            xs.extend([Some(x0), Some(x0 + bucket_ms / 1000.0)]);
            vs.extend([*y, *y]);
        }
    }
    series(name, i, &xs, &vs)
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
    let _ = writeln!(out, r#"<table class="figures">"#);
    for (k, v) in rows {
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
    fn ticks_are_round_and_cover_the_maximum() {
        assert_eq!(ticks(50.0), vec![0.0, 10.0, 20.0, 30.0, 40.0, 50.0]);
        assert_eq!(ticks(7.0), vec![0.0, 2.0, 4.0, 6.0, 8.0]);
        assert_eq!(ticks(0.0), vec![0.0, 1.0]);
    }

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
