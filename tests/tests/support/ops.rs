//! Shared by the `ops_*` tests: templating a shipped configuration file
//! (each replaced piece must occur exactly once, so a change of the file's
//! shape fails the test instead of being silently missed), the path of a
//! repository file, and a plain HTTP/1.0 GET.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

/// The path of `rel` (e.g. `ops/prometheus/seckill.rules.yml`) in the repository.
pub fn repo_file(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel)
}

/// `text` with its one occurrence of `from` replaced by `to`; panics when
/// `from` occurs zero or several times.
pub fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert_eq!(
        text.matches(from).count(),
        1,
        "expected exactly one {from:?} in the shipped file:\n{text}"
    );
    text.replacen(from, to, 1)
}

/// `s` percent-encoded for a URL query value (every byte but the
/// unreserved ones).
pub fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `GET path` on 127.0.0.1:`port` with HTTP/1.0 (so the answer is neither
/// chunked nor kept alive): (status, body), or `None` when nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// Where `ops/prometheus/prometheus.yml`'s jobs of the stores' exporters
/// start (after the seckill services' jobs).
pub const STORE_JOBS: &str = "\n  # The stores themselves";

/// The shipped `prometheus.yml` split at [`STORE_JOBS`]: (global settings,
/// rule files and the services' jobs; the stores' jobs).
pub fn split_store_jobs(shipped: &str) -> (String, String) {
    assert_eq!(
        shipped.matches(STORE_JOBS).count(),
        1,
        "expected exactly one {STORE_JOBS:?} in prometheus.yml"
    );
    let at = shipped.find(STORE_JOBS).unwrap_or(shipped.len());
    (shipped[..at].to_string(), shipped[at..].to_string())
}

/// The panels of `ops/grafana/seckill.json` split at its first row: (the
/// services' panels; the stores' rows and their panels).
pub fn dashboard_panels() -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
    let text = std::fs::read_to_string(repo_file("ops/grafana/seckill.json"))
        .expect("read ops/grafana/seckill.json");
    let d: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let panels = d["panels"].as_array().cloned().expect("panels");
    let first_row = panels
        .iter()
        .position(|p| p["type"] == "row")
        .unwrap_or(panels.len());
    let (services, stores) = panels.split_at(first_row);
    (services.to_vec(), stores.to_vec())
}

/// Every target expression of `panels`.
pub fn panel_exprs(panels: &[serde_json::Value]) -> Vec<String> {
    panels
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| {
            t["expr"]
                .as_str()
                .expect("every target has an expr")
                .to_string()
        })
        .collect()
}

/// The shipped Prometheus configuration's folder, `ops/prometheus`.
pub fn prometheus_dir() -> PathBuf {
    repo_file("ops/prometheus")
}

/// Runs `promtool ARGS` in `ops/prometheus` and returns (exit code, what it
/// printed). Panics, saying how to install it, when promtool is missing.
pub fn promtool(args: &[&str]) -> (Option<i32>, String) {
    let out = std::process::Command::new("promtool")
        .args(args)
        .current_dir(prometheus_dir())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run promtool ({e}): install Debian's package `prometheus` \
                 (./scripts/test.sh does this when promtool is missing)"
            )
        });
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), said)
}
