//! Shared by the tests that look at a page as a person would: Debian's
//! Chromium, headless, renders a local file to its DOM (`--dump-dom`) and
//! to a screenshot (`--screenshot`), and what `seckill-report` drew is read
//! back from that DOM (`tests/src/report_html.rs` names its elements).
//! `scripts/test.sh` installs `chromium` when missing.

use seckill_tests::TempDir;
use std::path::Path;
use std::process::{Command, Stdio};

/// Width and height of the screenshots, in px.
pub const WINDOW: (u32, u32) = (800, 3000);

/// Runs headless Chromium on `file` with `args`; panics, saying how to
/// install it, when it is missing, and when it fails.
fn chromium(file: &Path, args: &[String]) -> Vec<u8> {
    let profile = TempDir::new();
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
        ])
        .arg("--disable-dev-shm-usage")
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(format!("file://{}", file.display()))
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run chromium ({e}): install Debian's package `chromium` \
                 (./scripts/test.sh does this when it is missing)"
            )
        });
    assert!(
        out.status.success(),
        "chromium {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The DOM of `file` once loaded, as Chromium serializes it.
pub fn dump_dom(file: &Path) -> String {
    String::from_utf8_lossy(&chromium(file, &["--dump-dom".to_string()])).into_owned()
}

/// A screenshot of `file` ([`WINDOW`]) written to `png`; returns the
/// image's width and height as its PNG header says (panics when the file
/// is not a PNG).
pub fn screenshot(file: &Path, png: &Path) -> (u32, u32) {
    chromium(
        file,
        &[
            format!("--window-size={},{}", WINDOW.0, WINDOW.1),
            format!("--screenshot={}", png.display()),
        ],
    );
    let bytes = std::fs::read(png).expect("the screenshot");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "a PNG");
    let be = |i: usize| u32::from_be_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    // The IHDR chunk comes first: length, "IHDR", width, height.
    assert_eq!(&bytes[12..16], b"IHDR");
    (be(16), be(20))
}

/// The value of attribute `name` in the tag text `tag`.
pub fn attr(tag: &str, name: &str) -> Option<String> {
    let key = format!(" {name}=\"");
    let start = tag.find(&key)? + key.len();
    let len = tag[start..].find('"')?;
    Some(tag[start..start + len].to_string())
}

/// The opening tags `<NAME ...>` in `html`, in order.
pub fn tags<'a>(html: &'a str, name: &str) -> Vec<&'a str> {
    let open = format!("<{name} ");
    let mut out = Vec::new();
    let mut rest = html;
    while let Some(i) = rest.find(&open) {
        let tail = &rest[i..];
        let end = tail.find('>').map_or(tail.len(), |e| e + 1);
        out.push(&tail[..end]);
        rest = &tail[end..];
    }
    out
}

/// What one chart of a report drew: its series as (name, points, last
/// value in the legend), in order, and its limit line's name if any.
#[derive(Debug, Clone, PartialEq)]
pub struct Drawn {
    pub series: Vec<(String, usize, String)>,
    pub limit: Option<String>,
}

/// Every chart of the page `dom` as (id, what it drew), in order.
pub fn charts(dom: &str) -> Vec<(String, Drawn)> {
    let mut out = Vec::new();
    let mut rest = dom;
    while let Some(i) = rest.find("<svg class=\"chart\"") {
        let svg_end = rest[i..].find("</svg>").map_or(rest.len(), |e| i + e);
        let svg = &rest[i..svg_end];
        let id = attr(svg, "data-chart").unwrap_or_default();
        let legend_at = rest[svg_end..]
            .find("<ul class=\"legend\"")
            .map_or(rest.len(), |e| svg_end + e);
        let legend_end = rest[legend_at..]
            .find("</ul>")
            .map_or(rest.len(), |e| legend_at + e);
        let legend = &rest[legend_at..legend_end];
        let lasts: Vec<(String, String)> = tags(legend, "li")
            .iter()
            .filter_map(|li| Some((attr(li, "data-series")?, attr(li, "data-last")?)))
            .collect();
        let series = tags(svg, "polyline")
            .iter()
            .map(|p| {
                let name = attr(p, "data-series").unwrap_or_default();
                let points = attr(p, "data-points")
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                let last = lasts
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, l)| l.clone())
                    .unwrap_or_default();
                (name, points, last)
            })
            .collect();
        let limit = tags(svg, "line").iter().find_map(|l| attr(l, "data-limit"));
        out.push((id, Drawn { series, limit }));
        rest = &rest[legend_end..];
    }
    out
}
