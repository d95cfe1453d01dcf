//! Runs the shipped monitoring for real: a private Prometheus (Debian's
//! `prometheus` binary; free port, data in a temp dir, 1 s scrape and rule
//! intervals) on `ops/prometheus/prometheus.yml` (only targets, intervals
//! and the rule file's path replaced; without the stores' exporters, which
//! `ops_exporters.rs` runs) with `ops/prometheus/seckill.rules.yml`,
//! scraping a real gateway and worker during a small sale. Every expression
//! of `ops/grafana/seckill.json` and every rule is asked through the HTTP
//! API (`/api/v1/query`): each is valid, each panel query returns data,
//! the sale-progress panel holds the reconciliation run's exact figures,
//! every rule evaluates without error, nothing fires while all is healthy,
//! and a dead letter (a malformed message pushed to the sale's queue) fires
//! `SeckillDeadLetters` (its `for` is 0) and nothing else; then an oversell
//! found by a reconciliation run fires `SeckillOversold` through the
//! reconciler's metrics file, exported by a private node_exporter.

use crate::support::gateway as gateway_support;
use crate::support::ops as ops_support;
use crate::support::prometheus::Prometheus;
use crate::support::worker as support;

use gateway_support::{buy, Gateway};
use mysql::prelude::Queryable;
use ops_support::{http_get, replace_once, repo_file};
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_tests::{
    create_sale, dies_with_test, free_port, wait_until, RedisServer, TempDir, TestDb,
};
use serde_json::Value;
use std::process::{Child, Stdio};
use std::time::Duration;
use support::{dead_letters, wait_orders, Opts, WorkerProc};

const LONG: Duration = Duration::from_secs(60);

/// Rules in `seckill.rules.yml` (recording and alerting), as promtool counts them.
const RULES: usize = 33;

/// Prometheus on the shipped configuration, scraping the gateway on
/// `gateway`, the worker on `worker` (metrics ports) and node_exporter on
/// `textfile` (the reconciler's metrics file).
fn start_prometheus(gateway: u16, worker: u16, textfile: u16) -> Prometheus {
    let shipped = std::fs::read_to_string(repo_file("ops/prometheus/prometheus.yml"))
        .expect("read ops/prometheus/prometheus.yml");
    // Without the stores' exporters and their rules (ops_exporters.rs).
    let (shipped, _stores) = ops_support::split_store_jobs(&shipped);
    let shipped = replace_once(&shipped, "  - /etc/prometheus/stores.rules.yml\n", "");
    let rules = repo_file("ops/prometheus/seckill.rules.yml");
    let mut conf = replace_once(&shipped, "scrape_interval: 15s", "scrape_interval: 1s");
    conf = replace_once(&conf, "evaluation_interval: 15s", "evaluation_interval: 1s");
    conf = replace_once(
        &conf,
        "/etc/prometheus/seckill.rules.yml",
        &rules.display().to_string(),
    );
    conf = replace_once(
        &conf,
        "['127.0.0.1:8080']",
        &format!("['127.0.0.1:{gateway}']"),
    );
    conf = replace_once(
        &conf,
        "['127.0.0.1:9101', '127.0.0.1:9102']",
        &format!("['127.0.0.1:{worker}']"),
    );
    conf = replace_once(
        &conf,
        "['127.0.0.1:9100']",
        &format!("['127.0.0.1:{textfile}']"),
    );
    Prometheus::start(&conf)
}

/// `seckill-reconciler run` on the test's servers (grace 0), its review
/// file in `review` and its metrics file in `metrics_dir`; its exit code.
fn reconcile(
    redis: &RedisServer,
    db: &TestDb,
    review: &TempDir,
    metrics_dir: &TempDir,
) -> Option<i32> {
    seckill_tests::command("seckill-reconciler")
        .env("SECKILL_REDIS_URL", redis.url())
        .env("SECKILL_MYSQL_URL", db.url())
        .env("SECKILL_REVIEW_DB", review.path().join("review.sqlite3"))
        .env("SECKILL_RECONCILE_GRACE", "0s")
        .env(
            "SECKILL_RECONCILER_METRICS_FILE",
            metrics_dir.path().join("seckill_reconciler.prom"),
        )
        .arg("run")
        .status()
        .expect("run seckill-reconciler")
        .code()
}

/// A private node_exporter with only its textfile collector, over `dir`.
struct NodeExporter {
    port: u16,
    _child: KillOnDrop,
}

/// Kills and reaps its child on drop.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl NodeExporter {
    fn start(dir: &std::path::Path) -> NodeExporter {
        let port = free_port();
        let child = dies_with_test("prometheus-node-exporter")
            .arg("--collector.disable-defaults")
            .arg("--collector.textfile")
            .arg(format!("--collector.textfile.directory={}", dir.display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run prometheus-node-exporter ({e}): install Debian's package \
                     `prometheus-node-exporter` (./scripts/test.sh does this when it is missing)"
                )
            });
        let mut child = KillOnDrop(child);
        wait_until(LONG, "node_exporter to export the metrics file", || {
            assert!(
                child.0.try_wait().expect("try_wait").is_none(),
                "node_exporter exited"
            );
            matches!(http_get(port, "/metrics"), Some((200, body))
                if body.contains("seckill_reconciler_last_run_success 1"))
        });
        NodeExporter {
            port,
            _child: child,
        }
    }
}

/// Every panel expression of the shipped dashboard but the stores' rows
/// (tests/tests/ops_exporters.rs asks those of the real exporters).
fn dashboard_exprs() -> Vec<String> {
    let (panels, _stores) = ops_support::dashboard_panels();
    assert_eq!(panels.len(), 23);
    ops_support::panel_exprs(&panels)
}

/// The sale-progress panel shows the run's exact figures: 20 units, 5
/// sold, no payment window (so none paid).
fn assert_sale_progress(p: &Prometheus, sale: u64) {
    let progress: Vec<(String, f64)> = ["stock", "stock_left", "reserved", "ordered", "paid"]
        .iter()
        .map(|what| {
            let r = p.query(&format!("max by (sale) (seckill_sale_{what})"));
            assert_eq!(r.len(), 1, "{what}: one sale: {r:?}");
            let v = r[0]["value"][1].as_str().and_then(|v| v.parse().ok());
            assert_eq!(r[0]["metric"]["sale"], sale.to_string(), "{what}");
            (what.to_string(), v.unwrap_or(f64::NAN))
        })
        .collect();
    let want: Vec<(String, f64)> = [
        ("stock", 20.0),
        ("stock_left", 15.0),
        ("reserved", 5.0),
        ("ordered", 5.0),
        ("paid", 0.0),
    ]
    .map(|(w, v)| (w.to_string(), v))
    .to_vec();
    assert_eq!(progress, want);
}

#[test]
fn every_dashboard_and_rule_query_works_on_a_real_prometheus_and_a_dead_letter_fires_its_alert() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 20, -1000, 600_000);
    let g = Gateway::start(&redis, &[]);
    let w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    for i in 0..5 {
        assert_eq!(buy(g.port, sale, &format!("u{i}")).status, 202);
    }
    wait_orders(&db, sale, 5, LONG);
    // The reconciler's metrics file after a clean run, exported by a
    // private node_exporter's textfile collector (as in production).
    let metrics_dir = TempDir::new();
    let review = TempDir::new();
    assert_eq!(
        reconcile(&redis, &db, &review, &metrics_dir),
        Some(0),
        "a clean run"
    );
    let exporter = NodeExporter::start(metrics_dir.path());
    let p = start_prometheus(g.port, w.metrics_port, exporter.port);

    wait_until(LONG, "the three targets to be scraped", || {
        let up = p.query("up");
        up.len() == 3 && up.iter().all(|s| s["value"][1] == "1")
    });

    // The dashboard: every query valid at once, and each returns data once
    // its window holds enough samples.
    let exprs = dashboard_exprs();
    assert_eq!(exprs.len(), 43);
    for e in &exprs {
        p.query(e);
    }
    for e in &exprs {
        wait_until(LONG, &format!("data for {e}"), || !p.query(e).is_empty());
    }
    assert_sale_progress(&p, sale);

    // The rules: all loaded, each evaluated without error, each query valid.
    let mut rules: Vec<Value> = Vec::new();
    wait_until(LONG, "every rule to be evaluated", || {
        let data = p.api("rules");
        rules = data["groups"]
            .as_array()
            .map(|g| {
                g.iter()
                    .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
                    .collect()
            })
            .unwrap_or_default();
        rules.len() == RULES && rules.iter().all(|r| r["health"] == "ok")
    });
    for r in &rules {
        p.query(r["query"].as_str().expect("a rule's query"));
    }
    // Healthy: nothing fires or is pending, once an evaluation has seen
    // every series (an evaluation that ran before the first scrape of the
    // reconciler's file found `absent(...)` and left SeckillReconcilerStale
    // pending until the next one, 1 s later: seen on a loaded machine).
    let deadline = std::time::Instant::now() + LONG;
    let mut alerts = p.alerts_by("worker");
    while !alerts.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        alerts = p.alerts_by("worker");
    }
    assert_eq!(alerts, vec![], "{}", p.log());

    // A dead letter fires its alert.
    let _: () = redis
        .con()
        .lpush(SaleKeys::new(sale).queue(), "this is not json")
        .expect("push a malformed message");
    wait_until(LONG, "the message to be dead-lettered", || {
        dead_letters(&redis, sale).len() == 1
    });
    // The counter fires its alert; the sale's dead-letter list, grown,
    // makes SeckillDeadLettersGrowing pending (it fires after 5 min).
    let growing = (
        "SeckillDeadLettersGrowing".to_string(),
        "pending".to_string(),
        String::new(),
    );
    wait_until(LONG, "SeckillDeadLetters to fire", || {
        let a = p.alerts_by("worker");
        a.contains(&("SeckillDeadLetters".into(), "firing".into(), "w1".into()))
            && a.contains(&growing)
    });
    let mut now = p.alerts_by("worker");
    now.sort();
    assert_eq!(
        now,
        vec![
            ("SeckillDeadLetters".into(), "firing".into(), "w1".into()),
            growing.clone(),
        ]
    );

    // An oversell (16 orders written behind the system's back: 21 of 20
    // units) found by the next reconciliation run fires SeckillOversold
    // through the metrics file and node_exporter.
    let mut c = db.conn();
    for i in 0..16 {
        c.exec_drop(
            "INSERT INTO orders (reservation_id, sale_id, user_id, status) VALUES (?, ?, ?, 'confirmed')",
            (format!("{i:032x}"), sale, format!("forged-{i}")),
        )
        .expect("insert an order");
    }
    assert_eq!(
        reconcile(&redis, &db, &review, &metrics_dir),
        Some(1),
        "open findings"
    );
    wait_until(LONG, "SeckillOversold to fire", || {
        p.alerts_by("worker")
            .contains(&("SeckillOversold".into(), "firing".into(), String::new()))
    });
    let mut firing = p.alerts_by("worker");
    firing.sort();
    assert_eq!(
        firing,
        vec![
            ("SeckillDeadLetters".into(), "firing".into(), "w1".into()),
            growing,
            (
                "SeckillOpenFindings".into(),
                "pending".into(),
                String::new()
            ),
            ("SeckillOversold".into(), "firing".into(), String::new()),
        ]
    );
}
