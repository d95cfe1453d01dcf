//! Owns the line charts of the HTML report (`report_html.rs`): plain
//! inline SVG, no script. A [`Chart`] is an `<svg class="chart"
//! data-chart="ID">` with round ticks, an optional dashed limit line
//! (`data-limit`) and one `<polyline class="series" data-series="NAME"
//! data-points="N">` per [`Series`], then a legend (`<ul class="legend">`)
//! giving each series' last value (`data-last`): the names a browser's DOM
//! shows, which `tests/tests/e2e_demo.rs` reads back.

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
pub struct Series {
    pub name: String,
    pub colour: &'static str,
    pub points: Vec<(f64, f64)>,
}

/// One chart: what it is called, its axes' titles, its series and an
/// optional horizontal limit line (name, y).
pub struct Chart {
    pub id: &'static str,
    pub title: String,
    pub x_title: &'static str,
    pub y_title: &'static str,
    pub series: Vec<Series>,
    pub limit: Option<(String, f64)>,
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
    if !max.is_finite() || max <= 0.0 {
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
pub fn num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// Where a chart's values fall in its SVG: the axes' ranges and ticks.
struct Frame {
    x_min: f64,
    x_span: f64,
    y_top: f64,
    xt: Vec<f64>,
    yt: Vec<f64>,
}

impl Frame {
    /// The SVG x of value `x`.
    fn px(&self, x: f64) -> f64 {
        ML + (x - self.x_min) / self.x_span * (W - ML - MR)
    }

    /// The SVG y of value `y`.
    fn py(&self, y: f64) -> f64 {
        MT + (1.0 - y / self.y_top) * (H - MT - MB)
    }
}

impl Chart {
    /// The chart as an SVG element plus its legend.
    pub fn render(&self, out: &mut String) {
        let f = self.frame();
        let _ = writeln!(out, "<h3>{}</h3>", escape(&self.title));
        let _ = writeln!(
            out,
            r#"<svg class="chart" data-chart="{}" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="{}">"#,
            self.id,
            escape(&self.title)
        );
        self.write_axes(out, &f);
        self.write_lines(out, &f);
        let _ = writeln!(out, "</svg>");
        self.write_legend(out);
    }

    /// The axes' ranges: x from 0 (or the earliest point) to the last
    /// point, y from 0 to the highest point or limit, both on round ticks.
    fn frame(&self) -> Frame {
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
        Frame {
            x_min,
            x_span,
            y_top,
            xt,
            yt,
        }
    }

    /// The grid lines with the y ticks, the x ticks and the axes' titles.
    fn write_axes(&self, out: &mut String, f: &Frame) {
        for y in &f.yt {
            let _ = writeln!(
                out,
                r##"<line class="grid" x1="{ML}" x2="{:.1}" y1="{:.1}" y2="{:.1}"/><text class="tick" x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                W - MR,
                f.py(*y),
                f.py(*y),
                ML - 6.0,
                f.py(*y) + 4.0,
                num(*y)
            );
        }
        for x in &f.xt {
            let _ = writeln!(
                out,
                r#"<text class="tick" x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                f.px(*x),
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
    }

    /// The limit's dashed line, a polyline per series, or "no data".
    fn write_lines(&self, out: &mut String, f: &Frame) {
        if let Some((name, y)) = &self.limit {
            let _ = writeln!(
                out,
                r#"<line class="limit" data-limit="{}" x1="{ML}" x2="{:.1}" y1="{:.1}" y2="{:.1}"/>"#,
                escape(name),
                W - MR,
                f.py(*y),
                f.py(*y)
            );
        }
        for s in &self.series {
            let pts: Vec<String> = s
                .points
                .iter()
                .map(|(x, y)| format!("{:.1},{:.1}", f.px(*x), f.py(*y)))
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
    }

    /// The legend: the limit, and each series with its last value.
    fn write_legend(&self, out: &mut String) {
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

/// Series `name` over `xs` from `ys`, points where both are numbers; `None`
/// when it has none.
pub fn series(name: &str, i: usize, xs: &[Option<f64>], ys: &[Option<f64>]) -> Option<Series> {
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
pub fn steps(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_maximum() {
        assert_eq!(ticks(50.0), vec![0.0, 10.0, 20.0, 30.0, 40.0, 50.0]);
        assert_eq!(ticks(7.0), vec![0.0, 2.0, 4.0, 6.0, 8.0]);
        assert_eq!(ticks(0.0), vec![0.0, 1.0]);
    }
}
