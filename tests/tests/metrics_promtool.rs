//! Checks the `/metrics` page of every binary that serves one (the gateway
//! and the worker) and the reconciler's metrics file (a oneshot: it leaves
//! a file for node_exporter's textfile collector) with Prometheus' own
//! linter, `promtool check metrics`, after a little traffic has given the
//! counters and histograms values: exit 0 and no lint output, the content
//! type of the text format 0.0.4, and exactly the metric families the
//! README and DESIGN.md list. promtool comes from Debian's `prometheus`
//! package, which `scripts/test.sh` installs; without it these tests fail.

use crate::support::gateway as gateway_support;
use crate::support::worker as support;

use gateway_support::{buy, get, open_sale, Client, Gateway};
use seckill_tests::{create_sale, wait_until, RedisServer, TestDb};
use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;
use support::{pay, reserve_users, wait_drained, wait_orders, Opts, WorkerProc};

/// What both binaries send as `Content-Type` with `/metrics`.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

const LONG: Duration = Duration::from_secs(60);

/// Runs `promtool check metrics` on `page` and returns (exit code, what it
/// printed on stdout and stderr). Panics, saying how to install it, when
/// promtool is missing: a check that cannot run must not pass.
fn promtool_check(page: &str) -> (Option<i32>, String) {
    let spawned = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => panic!(
            "cannot run promtool ({e}): install Debian's package `prometheus` \
             (`apt-get install -y --no-install-recommends prometheus`; \
             ./scripts/test.sh does this when promtool is missing)"
        ),
    };
    child
        .stdin
        .take()
        .expect("promtool's stdin")
        .write_all(page.as_bytes())
        .expect("write the page to promtool");
    let out = child.wait_with_output().expect("wait for promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// Asserts that promtool accepts `page` without a single lint.
fn assert_promtool_clean(page: &str) {
    let (code, said) = promtool_check(page);
    assert_eq!(
        (code, said.as_str()),
        (Some(0), ""),
        "promtool check metrics on:\n{page}"
    );
}

/// The metric family names of the `# TYPE` lines of `page`, with the type.
fn families(page: &str) -> BTreeSet<String> {
    page.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(String::from)
        .collect()
}

/// The value of the sample line `series` (name and labels exactly as
/// written) on `page`.
fn sample(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn the_gateways_metrics_pass_promtool_after_purchases() {
    let redis = RedisServer::start();
    open_sale(&redis, 1, 5);
    let g = Gateway::start(&redis, &[]);
    let mut c = Client::connect(g.port);
    let statuses: Vec<u16> = ["u1", "u1", "u2"]
        .iter()
        .map(|u| c.buy(1, u).status)
        .collect();
    assert_eq!(statuses, [202, 409, 202]);
    assert_eq!(buy(g.port, 99, "u1").status, 404);
    assert_eq!(get(g.port, "/v1/sales/1").status, 200);

    // A request is counted just after its answer is written: wait until
    // the last one is.
    // A request is counted after its answer is written, on its
    // connection's thread: wait until every answer sent is counted.
    let want: Vec<(&str, f64)> = vec![
        (
            r#"seckill_gateway_requests_total{route="purchase",status="202"}"#,
            2.0,
        ),
        (
            r#"seckill_gateway_requests_total{route="purchase",status="409"}"#,
            1.0,
        ),
        (
            r#"seckill_gateway_requests_total{route="purchase",status="404"}"#,
            1.0,
        ),
        (
            r#"seckill_gateway_requests_total{route="sale",status="200"}"#,
            1.0,
        ),
        (
            r#"seckill_gateway_purchases_total{outcome="reserved"}"#,
            2.0,
        ),
        (
            r#"seckill_gateway_purchases_total{outcome="sold_out"}"#,
            0.0,
        ),
        (
            r#"seckill_gateway_purchases_total{outcome="already_purchased"}"#,
            1.0,
        ),
        (
            r#"seckill_gateway_purchases_total{outcome="unknown_sale"}"#,
            1.0,
        ),
        (r#"seckill_gateway_purchases_total{outcome="paused"}"#, 0.0),
        ("seckill_gateway_units_reserved_total", 2.0),
        (
            r#"seckill_gateway_request_duration_seconds_count{route="purchase"}"#,
            4.0,
        ),
        (
            r#"seckill_gateway_request_duration_seconds_bucket{route="purchase",le="+Inf"}"#,
            4.0,
        ),
        (
            r#"seckill_gateway_request_duration_seconds_count{route="sale"}"#,
            1.0,
        ),
        (
            r#"seckill_gateway_request_duration_seconds_count{route="readyz"}"#,
            0.0,
        ),
        ("seckill_gateway_redis_errors_total", 0.0),
        ("seckill_gateway_shed_total", 0.0),
        (r#"seckill_gateway_limited_total{limit="buyer"}"#, 0.0),
        (r#"seckill_gateway_limited_total{limit="address"}"#, 0.0),
    ];
    let mut m = get(g.port, "/metrics");
    wait_until(LONG, "every request to be counted", || {
        m = get(g.port, "/metrics");
        want.iter()
            .all(|(series, v)| sample(&m.body, series) == Some(*v))
    });
    assert_eq!(m.status, 200);
    assert_eq!(m.header("Content-Type"), Some(TEXT_FORMAT));
    assert_promtool_clean(&m.body);
    let page = &m.body;
    let expected: BTreeSet<String> = [
        "seckill_gateway_requests_total counter",
        "seckill_gateway_purchases_total counter",
        "seckill_gateway_units_reserved_total counter",
        "seckill_gateway_request_duration_seconds histogram",
        "seckill_gateway_redis_errors_total counter",
        "seckill_gateway_redis_connects_total counter",
        "seckill_gateway_connections gauge",
        "seckill_gateway_connections_in_use gauge",
        "seckill_gateway_reconnects_total counter",
        "seckill_gateway_requests_in_flight gauge",
        "seckill_gateway_parked_connections_total counter",
        "seckill_gateway_pipelined_purchases_total counter",
        "seckill_gateway_redis_pipelines_total counter",
        "seckill_gateway_abandoned_purchases_total counter",
        "seckill_gateway_slow_answers_total counter",
        "seckill_gateway_buyers_remembered gauge",
        "seckill_gateway_redis_persistence_off gauge",
        "seckill_gateway_redis_refused_total counter",
        "seckill_gateway_tokens_verified_total counter",
        "seckill_gateway_token_cache_hits_total counter",
        "seckill_gateway_limited_total counter",
        "seckill_gateway_limit_table_full_total counter",
        "seckill_gateway_shed_total counter",
        "seckill_gateway_signature_checks_total counter",
        "seckill_gateway_tokens_refused_total counter",
        "seckill_gateway_build_info gauge",
        "process_resident_memory_bytes gauge",
        "process_virtual_memory_bytes gauge",
        "process_threads gauge",
        "process_open_fds gauge",
        "process_max_fds gauge",
    ]
    .map(String::from)
    .into();
    assert_eq!(families(page), expected, "{page}");
    for (series, v) in &want {
        assert_eq!(sample(page, series), Some(*v), "{series} on:\n{page}");
    }
    // A route × status pair never answered has no series (as before).
    assert!(!page.contains(r#"route="purchase",status="410""#), "{page}");
}

#[test]
fn the_workers_metrics_pass_promtool_after_orders() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 10, -1000, 600_000);
    reserve_users(&redis, sale, "u", 3);
    let w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    wait_orders(&db, sale, 3, LONG);
    wait_drained(&redis, sale, LONG);
    // The housekeeping thread refreshes the per-sale gauges about once a
    // second; wait for the drained queue to show.
    // The per-sale gauges are refreshed by the worker's housekeeping, not
    // by the batch: wait until they show the drained sale.
    let queue_series = format!("seckill_queue_length{{sale=\"{sale}\"}}");
    let processing_series = format!("seckill_processing_length{{sale=\"{sale}\"}}");
    wait_until(LONG, "the per-sale gauges", || {
        let page = w.metrics();
        sample(&page, &queue_series) == Some(0.0) && sample(&page, &processing_series) == Some(0.0)
    });

    let raw = w.metrics();
    let (head, page) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(
        head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"),
        "{head}"
    );
    let content_type = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Type: "))
        .map(str::trim);
    assert_eq!(content_type, Some(TEXT_FORMAT), "{head}");
    assert_promtool_clean(page);
    let expected: BTreeSet<String> = [
        "seckill_worker_orders_applied_total counter",
        "seckill_worker_messages_already_done_total counter",
        "seckill_worker_batches_total counter",
        "seckill_worker_batch_size histogram",
        "seckill_worker_batch_seconds histogram",
        "seckill_worker_retries_total counter",
        "seckill_worker_dead_lettered_total counter",
        "seckill_worker_fenced_total counter",
        "seckill_worker_requeued_total counter",
        "seckill_worker_reclaimed_total counter",
        "seckill_worker_redis_data_loss_total counter",
        "seckill_worker_redis_errors_total counter",
        "seckill_worker_connections gauge",
        "seckill_worker_reconnects_total counter",
        "seckill_queue_length gauge",
        "seckill_processing_length gauge",
        "seckill_queue_oldest_age_seconds gauge",
        "seckill_dead_letter_length gauge",
        "seckill_payments_queue_length gauge",
        "seckill_payments_dead_letter_length gauge",
        "seckill_worker_payments_total counter",
        "seckill_worker_cancellations_total counter",
        "seckill_worker_orders_expired_total counter",
        "seckill_worker_releases_total counter",
        "seckill_worker_shared_lists_exporter gauge",
        "seckill_worker_consumers gauge",
        "seckill_worker_consumers_max gauge",
        "seckill_worker_build_info gauge",
        "process_resident_memory_bytes gauge",
        "process_virtual_memory_bytes gauge",
        "process_threads gauge",
        "process_open_fds gauge",
        "process_max_fds gauge",
    ]
    .map(String::from)
    .into();
    assert_eq!(families(page), expected, "{page}");
    for (series, v) in [
        (
            r#"seckill_worker_orders_applied_total{worker="w1"}"#.to_string(),
            3.0,
        ),
        (
            r#"seckill_worker_messages_already_done_total{worker="w1"}"#.into(),
            0.0,
        ),
        (r#"seckill_worker_batch_size_sum{worker="w1"}"#.into(), 3.0),
        (
            r#"seckill_worker_retries_total{worker="w1",cause="connection"}"#.into(),
            0.0,
        ),
        (
            r#"seckill_worker_retries_total{worker="w1",cause="deadlock_or_lock_wait"}"#.into(),
            0.0,
        ),
        (
            r#"seckill_worker_dead_lettered_total{worker="w1",reason="stock_exhausted"}"#.into(),
            0.0,
        ),
        (format!("seckill_processing_length{{sale=\"{sale}\"}}"), 0.0),
        (
            format!("seckill_dead_letter_length{{sale=\"{sale}\"}}"),
            0.0,
        ),
        ("seckill_payments_dead_letter_length".into(), 0.0),
        (
            r#"seckill_worker_shared_lists_exporter{worker="w1"}"#.into(),
            1.0,
        ),
        (
            format!(
                "seckill_worker_build_info{{worker=\"w1\",version=\"{}\"}}",
                env!("CARGO_PKG_VERSION")
            ),
            1.0,
        ),
        (
            format!("seckill_queue_oldest_age_seconds{{sale=\"{sale}\"}}"),
            0.0,
        ),
    ] {
        assert_eq!(sample(page, &series), Some(v), "{series} on:\n{page}");
    }
    let batches = sample(page, r#"seckill_worker_batches_total{worker="w1"}"#);
    assert!(matches!(batches, Some(b) if b >= 1.0), "{page}");
    assert_eq!(
        sample(page, r#"seckill_worker_batch_seconds_count{worker="w1"}"#),
        sample(page, r#"seckill_worker_batch_size_count{worker="w1"}"#),
        "{page}"
    );
}

/// `seckill-reconciler run` writes its figures to
/// `SECKILL_RECONCILER_METRICS_FILE`: promtool accepts the file, it holds
/// the run's exact figures, and a failed run says so while keeping the
/// last success's time.
#[test]
fn the_reconcilers_metrics_file_passes_promtool_and_holds_the_runs_figures() {
    use redis::Commands;
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 5, -1000, 600_000);
    let dlq = seckill_common::keys::SaleKeys::new(sale).dead_letter();
    let _: () = redis.con().lpush(dlq, "not a dead-letter entry").unwrap();
    let dir = seckill_tests::TempDir::new();
    let file = dir.path().join("seckill_reconciler.prom");
    let run = |mysql_url: String| {
        seckill_tests::command("seckill-reconciler")
            .env("SECKILL_REDIS_URL", redis.url())
            .env("SECKILL_MYSQL_URL", mysql_url)
            .env("SECKILL_REVIEW_DB", dir.path().join("review.sqlite3"))
            .env("SECKILL_RECONCILE_GRACE", "0s")
            .env("SECKILL_RECONCILER_METRICS_FILE", &file)
            .arg("run")
            .output()
            .expect("run seckill-reconciler")
            .status
            .code()
    };
    assert_eq!(run(db.url()), Some(1), "one open finding");
    let text = std::fs::read_to_string(&file).expect("the metrics file");
    assert_promtool_clean(&text);
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&file).expect("stat").permissions(),
    );
    assert_eq!(mode & 0o777, 0o644, "readable by node_exporter");
    let open = |kind: &str, severity: &str| {
        sample(
            &text,
            &format!(r#"seckill_reconciler_open_findings{{kind="{kind}",severity="{severity}"}}"#),
        )
    };
    assert_eq!(open("dead_letter", "normal"), Some(1.0));
    assert_eq!(open("stock_mismatch", "critical"), Some(0.0));
    assert_eq!(sample(&text, "seckill_reconciler_sales_checked"), Some(1.0));
    assert_eq!(
        sample(&text, "seckill_reconciler_last_run_success"),
        Some(1.0)
    );
    let finished = sample(&text, "seckill_reconciler_last_run_timestamp_seconds");
    assert!(finished.is_some(), "{text}");
    assert_eq!(
        sample(&text, "seckill_reconciler_last_success_timestamp_seconds"),
        finished
    );

    // MySQL unreachable: the run fails (exit 2), and says so.
    assert_eq!(run(seckill_tests::DEAD_MYSQL_URL.to_string()), Some(2));
    let failed = std::fs::read_to_string(&file).expect("the metrics file");
    assert_promtool_clean(&failed);
    assert_eq!(
        sample(&failed, "seckill_reconciler_last_run_success"),
        Some(0.0)
    );
    assert_eq!(
        sample(&failed, "seckill_reconciler_last_success_timestamp_seconds"),
        finished
    );
    assert!(sample(&failed, "seckill_reconciler_last_run_timestamp_seconds") > finished);
}

/// After a small sale of known outcome the reconciler's metrics file holds
/// each sale's progress exactly: a sale of 10 with a payment window where 6
/// buyers reserved and 2 paid (stock left 4, reserved 6, ordered 6, paid
/// 2), and a sale of 3 whose 2 orders expired (their units back on sale:
/// stock left 3, nothing reserved, ordered or paid).
#[test]
fn the_reconcilers_metrics_file_holds_each_sales_progress_exactly() {
    use mysql::prelude::Queryable;
    use redis::Commands;
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = seckill_tests::TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let sale = seckill_tests::create_windowed_sale(&redis, &db, &review, 10, "1h");
    let expiring = seckill_tests::create_windowed_sale(&redis, &db, &review, 3, "1ms");
    reserve_users(&redis, sale, "u", 6);
    reserve_users(&redis, expiring, "x", 2);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    wait_orders(&db, sale, 6, LONG);
    wait_until(LONG, "the expired orders' units back in Redis", || {
        let stock: i64 = redis
            .con()
            .get(seckill_common::keys::SaleKeys::new(expiring).stock())
            .unwrap();
        stock == 3
    });
    let rids: Vec<String> = db
        .conn()
        .exec(
            "SELECT reservation_id FROM orders WHERE sale_id = ? ORDER BY user_id LIMIT 2",
            (sale,),
        )
        .unwrap();
    for (i, rid) in rids.iter().enumerate() {
        pay(&redis, rid, &format!("pay-{i}"), 1999);
    }
    wait_until(LONG, "the two payments applied", || {
        db.count(&format!(
            "SELECT COUNT(*) FROM orders WHERE sale_id = {sale} AND status = 'paid'"
        )) == 2
    });
    let file = dir.path().join("seckill_reconciler.prom");
    let out = seckill_tests::command("seckill-reconciler")
        .env("SECKILL_REDIS_URL", redis.url())
        .env("SECKILL_MYSQL_URL", db.url())
        .env("SECKILL_REVIEW_DB", &review)
        .env("SECKILL_RECONCILE_GRACE", "0s")
        .env("SECKILL_RECONCILER_METRICS_FILE", &file)
        .arg("run")
        .output()
        .expect("run seckill-reconciler");
    assert_eq!(
        out.status.code(),
        Some(0),
        "a clean run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&file).expect("the metrics file");
    assert_promtool_clean(&text);
    let progress = |id: u64| -> Vec<Option<f64>> {
        ["stock", "stock_left", "reserved", "ordered", "paid"]
            .iter()
            .map(|what| sample(&text, &format!(r#"seckill_sale_{what}{{sale="{id}"}}"#)))
            .collect()
    };
    let figures = |v: [f64; 5]| v.map(Some).to_vec();
    assert_eq!(
        progress(sale),
        figures([10.0, 4.0, 6.0, 6.0, 2.0]),
        "{text}"
    );
    assert_eq!(
        progress(expiring),
        figures([3.0, 3.0, 0.0, 0.0, 0.0]),
        "{text}"
    );
    let series = text
        .lines()
        .filter(|l| l.starts_with("seckill_sale_"))
        .count();
    assert_eq!(series, 10, "five series for each of the two sales: {text}");
}
