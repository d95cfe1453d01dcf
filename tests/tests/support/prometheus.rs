//! A private Prometheus server (Debian's `prometheus` binary on a free
//! port, data in a temp dir) on a configuration a test wrote, and its HTTP
//! API: instant queries, rules and active alerts.

use super::ops::{http_get, url_encode};
use seckill_tests::{dies_with_test, free_port, wait_until, TempDir};
use serde_json::Value;
use std::process::{Child, Stdio};
use std::time::Duration;

/// A private Prometheus, killed on drop.
pub struct Prometheus {
    port: u16,
    child: Child,
    dir: TempDir,
}

impl Prometheus {
    /// Starts Prometheus on the configuration `conf` (written to its temp
    /// dir) and waits until it is ready (up to 60 s).
    pub fn start(conf: &str) -> Prometheus {
        let dir = TempDir::new();
        let conf_path = dir.path().join("prometheus.yml");
        std::fs::write(&conf_path, conf).expect("write prometheus.yml");
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log file");
        let child = dies_with_test("prometheus")
            .arg(format!("--config.file={}", conf_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run prometheus ({e}): install Debian's package `prometheus` \
                     (./scripts/test.sh does this when promtool is missing)"
                )
            });
        let mut p = Prometheus { port, child, dir };
        wait_until(Duration::from_secs(60), "Prometheus to be ready", || {
            assert!(
                p.child.try_wait().expect("try_wait").is_none(),
                "prometheus exited: {}",
                p.log()
            );
            matches!(http_get(port, "/-/ready"), Some((200, _)))
        });
        p
    }

    /// What Prometheus logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `GET /api/v1/PATH` as JSON; panics unless it answered 200 with
    /// `"status": "success"`.
    pub fn api(&self, path: &str) -> Value {
        let (status, body) = http_get(self.port, &format!("/api/v1/{path}"))
            .unwrap_or_else(|| panic!("no answer to /api/v1/{path}: {}", self.log()));
        let v: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("/api/v1/{path}: not JSON ({e}): {body}"));
        assert_eq!(
            (status, &v["status"]),
            (200, &Value::from("success")),
            "{path}: {body}"
        );
        v["data"].clone()
    }

    /// The result vector of the instant query `expr` (panics when invalid).
    pub fn query(&self, expr: &str) -> Vec<Value> {
        let data = self.api(&format!("query?query={}", url_encode(expr)));
        data["result"].as_array().cloned().unwrap_or_default()
    }

    /// Every rule of every loaded group.
    pub fn rules(&self) -> Vec<Value> {
        let data = self.api("rules");
        data["groups"]
            .as_array()
            .map(|g| {
                g.iter()
                    .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Active alerts as (name, state, value of the label `label`), sorted.
    pub fn alerts_by(&self, label: &str) -> Vec<(String, String, String)> {
        let data = self.api("alerts");
        let text = |v: &Value| v.as_str().unwrap_or("").to_string();
        let mut all: Vec<(String, String, String)> = data["alerts"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|x| {
                        (
                            text(&x["labels"]["alertname"]),
                            text(&x["state"]),
                            text(&x["labels"][label]),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        all.sort();
        all
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
