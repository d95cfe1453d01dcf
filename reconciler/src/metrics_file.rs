//! Owns the metrics file `run` leaves behind for Prometheus: a oneshot has
//! no `/metrics` to scrape, so after each run the reconciler writes its
//! figures in the text format to `SECKILL_RECONCILER_METRICS_FILE`, which
//! node_exporter's textfile collector exports (docs/OPERATIONS.md, "Alerts
//! and the dashboard"). The alerts `SeckillReconcilerStale`,
//! `SeckillReconcilerFailing`, `SeckillOversold` and `SeckillOpenFindings`
//! read it.
//!
//! Series (all gauges, names as the Prometheus conventions want):
//! - `seckill_reconciler_last_run_timestamp_seconds`: when the last run
//!   finished (Unix s);
//! - `seckill_reconciler_last_run_success`: 1 when it finished its pass
//!   (with or without open findings), 0 when it failed;
//! - `seckill_reconciler_last_success_timestamp_seconds`: when the last run
//!   that did not fail finished (absent until one has);
//! - `seckill_reconciler_last_run_duration_seconds`, `…_sales_checked`;
//! - `seckill_reconciler_mysql_primary_up`: 0 when the last run reached no
//!   writable MySQL server (the primary down, no replica promoted yet);
//! - `seckill_reconciler_mysql_refused_writable_servers`: writable servers
//!   of `SECKILL_MYSQL_URL` the last run's connect refused (an old primary
//!   back writable, or two at one generation: `mysql_writable.rs`);
//! - with `SECKILL_MYSQL_REPLICA_URL` (`replica_read.rs`):
//!   `seckill_reconciler_replica_used` (0: the run fell back to the
//!   primary), `…_replica_wait_seconds`, `…_replica_confirmed_sales`
//!   (flagged on the replica, re-read on the primary) and
//!   `…_replica_cleared_sales` (of those, clean on the primary);
//! - `seckill_reconciler_open_findings{kind, severity}`: open findings
//!   after the run, one series per kind and severity (zeros included, so an
//!   alert sees 0, not nothing). Kinds are the finding kinds (13): bounded.
//!
//! And per sale the run reconciled, with the label `sale` (the sales active
//! or ended within the lookback: bounded), as the run's scan read them
//! (`scan.rs`: the Redis totals in one `MULTI`, MySQL in one snapshot), at
//! no cost beyond the run's own reads ([`SaleProgress`]):
//! - `seckill_sale_stock`: the sale's units (`sales.total_stock`);
//! - `seckill_sale_stock_left`: Redis's stock counter, units still on sale
//!   (absent while the sale is not loaded in Redis);
//! - `seckill_sale_reserved`: units reserved and not released (Redis's
//!   flow records), queued ones included;
//! - `seckill_sale_ordered`: units held by orders in MySQL (confirmed,
//!   pending payment, paid: the sum of their quantities);
//! - `seckill_sale_paid`: of those, the units of the paid ones.
//!
//! On a healthy sale `stock_left + reserved = stock` and
//! `paid ≤ ordered ≤ reserved`; `reserved − ordered` is what the queue
//! still carries, `ordered > stock` an oversell. A paused sale (Redis lost
//! data) or a sale MySQL lacks has no such series.

use crate::mysql_read::Books;
use crate::redis_read::RedisTotals;
use crate::replica_read::ReplicaFigures;
use crate::review::findings::{Kind, Severity};
use crate::review::{Review, ReviewError, RunCounts};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::AtomicU64;

/// A gauge of `f64` values (timestamps, seconds).
type FloatGauge = Gauge<f64, AtomicU64>;

/// What one run leaves in the file.
#[derive(Debug, Clone, PartialEq)]
pub struct RunFigures {
    /// When the run finished, Unix ms.
    pub finished_ms: u64,
    /// Whether it finished its pass.
    pub success: bool,
    /// When the last run that did not fail finished, Unix ms (this one if
    /// it succeeded).
    pub last_success_ms: Option<u64>,
    /// How long it took, s.
    pub duration_s: f64,
    /// Sales it reconciled.
    pub sales_checked: u64,
    /// Open findings after it, by kind and severity (pairs absent are 0).
    pub open: Vec<(Kind, Severity, u64)>,
    /// Each reconciled sale's progress, in the order reconciled.
    pub sales: Vec<SaleProgress>,
    /// What the run did with the replica (`None`: none configured).
    pub replica: Option<ReplicaFigures>,
    /// Whether a writable MySQL primary answered (`false`: the run could
    /// not reach one, see `run`'s module doc).
    pub mysql_primary_up: bool,
    /// Writable MySQL servers the run's last connect refused
    /// (`seckill_common::mysql_writable::refused_writable`).
    pub mysql_refused_writable: u64,
}

/// One sale's progress as one run's scan read it (see the module doc for
/// the series); counts are units (one per reservation or order).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SaleProgress {
    /// The sale.
    pub sale_id: u64,
    /// `sales.total_stock`.
    pub stock: i64,
    /// Redis's stock counter (summed over buckets); `None` when not loaded.
    pub stock_left: Option<i64>,
    /// Redis's flow records: units reserved and not released.
    pub reserved: i64,
    /// MySQL orders holding a unit.
    pub ordered: i64,
    /// MySQL orders `paid`.
    pub paid: i64,
}

impl SaleProgress {
    /// The progress of `sale_id` from its scan's Redis totals and MySQL books.
    pub fn of(sale_id: u64, totals: &RedisTotals, books: &Books) -> SaleProgress {
        SaleProgress {
            sale_id,
            stock: books.total_stock,
            stock_left: totals.stock,
            reserved: totals.reservations,
            ordered: books.orders,
            paid: books.paid,
        }
    }
}

impl RunFigures {
    /// The figures of a run that ended at `finished_ms`, read from the
    /// review store for what spans runs.
    ///
    /// Errors: [`ReviewError`] from the review store.
    pub fn read(
        review: &Review,
        finished_ms: u64,
        success: bool,
        duration_s: f64,
        counts: &RunCounts,
        sales: Vec<SaleProgress>,
    ) -> Result<RunFigures, ReviewError> {
        let last_success_ms = review
            .last_success()?
            .and_then(|t| seckill_common::timefmt::parse_time_ms(&t, finished_ms).ok());
        Ok(RunFigures {
            finished_ms,
            success,
            last_success_ms,
            duration_s,
            sales_checked: counts.sales_checked,
            open: review.open_by_kind()?,
            sales,
            replica: None,
            mysql_primary_up: true,
            mysql_refused_writable: 0,
        })
    }
}

type Labels = [(&'static str, &'static str); 2];

/// A per-sale series: name, HELP, and its value for a sale (`None`: no
/// sample for that sale).
type SaleSeries = (&'static str, &'static str, fn(&SaleProgress) -> Option<i64>);

/// The file's text (Prometheus text format 0.0.4, `# EOF` last).
///
/// Errors: never in practice (encoding into a `String`).
pub fn render(f: &RunFigures) -> Result<String, std::fmt::Error> {
    let mut r = Registry::default();
    register_run(&mut r, f);
    if let Some(rf) = &f.replica {
        register_replica(&mut r, rf);
    }
    register_open_findings(&mut r, f);
    register_sale_series(&mut r, f);
    seckill_common::metrics::render(&r)
}

/// Registers a gauge `name` of value `v`.
fn gauge(r: &mut Registry, name: &str, help: &str, v: f64) {
    let g = FloatGauge::default();
    g.set(v);
    r.register(name, help, g);
}

/// Registers the figures of the run itself: when it finished, whether it
/// succeeded (and when one last did), how long it took, sales checked.
fn register_run(r: &mut Registry, f: &RunFigures) {
    gauge(
        r,
        "seckill_reconciler_last_run_timestamp_seconds",
        "When the last reconciliation run finished, Unix seconds",
        f.finished_ms as f64 / 1000.0,
    );
    gauge(
        r,
        "seckill_reconciler_last_run_success",
        "1 when the last run finished its pass (open findings or not), 0 when it failed",
        if f.success { 1.0 } else { 0.0 },
    );
    if let Some(ms) = f.last_success_ms {
        gauge(
            r,
            "seckill_reconciler_last_success_timestamp_seconds",
            "When the last run that did not fail finished, Unix seconds",
            ms as f64 / 1000.0,
        );
    }
    gauge(
        r,
        "seckill_reconciler_mysql_primary_up",
        "1 when the last run reached a writable MySQL primary, 0 when none answered",
        if f.mysql_primary_up { 1.0 } else { 0.0 },
    );
    gauge(
        r,
        "seckill_reconciler_mysql_refused_writable_servers",
        "Writable MySQL servers of SECKILL_MYSQL_URL the last run refused: an old primary back writable, or two at one primary generation",
        f.mysql_refused_writable as f64,
    );
    gauge(
        r,
        "seckill_reconciler_last_run_duration_seconds",
        "How long the last run took",
        f.duration_s,
    );
    gauge(
        r,
        "seckill_reconciler_sales_checked",
        "Sales the last run reconciled",
        f.sales_checked as f64,
    );
}

/// Registers how the run used the MySQL replica.
fn register_replica(r: &mut Registry, rf: &ReplicaFigures) {
    gauge(
        r,
        "seckill_reconciler_replica_used",
        "1 when the last run read the MySQL replica, 0 when it fell back to the primary",
        if rf.used { 1.0 } else { 0.0 },
    );
    gauge(
        r,
        "seckill_reconciler_replica_wait_seconds",
        "How long the last run waited for the replica to reach the primary's position",
        rf.wait_s,
    );
    gauge(
        r,
        "seckill_reconciler_replica_confirmed_sales",
        "Sales the replica's scan flagged that the last run re-read on the primary",
        rf.confirmed_on_primary as f64,
    );
    gauge(
        r,
        "seckill_reconciler_replica_cleared_sales",
        "Of those, sales the primary found clean (the replica was behind)",
        rf.cleared_by_primary as f64,
    );
}

/// Registers the open findings by kind and severity (every pair, 0 when
/// none).
fn register_open_findings(r: &mut Registry, f: &RunFigures) {
    let open = Family::<Labels, Gauge>::default();
    r.register(
        "seckill_reconciler_open_findings",
        "Open findings after the last run, by kind and severity",
        open.clone(),
    );
    for &kind in Kind::ALL.iter() {
        for &severity in Severity::ALL.iter() {
            let n = f
                .open
                .iter()
                .find(|(k, s, _)| *k == kind && *s == severity)
                .map_or(0, |(_, _, n)| *n);
            open.get_or_create(&[("kind", kind.as_str()), ("severity", severity.as_str())])
                .set(n as i64);
        }
    }
}

/// Registers the per-sale series (stock, stock left, reserved, ordered,
/// paid), one sample per sale that has a value.
fn register_sale_series(r: &mut Registry, f: &RunFigures) {
    let per_sale: [SaleSeries; 5] = [
        ("seckill_sale_stock", "A sale's units (MySQL)", |p| {
            Some(p.stock)
        }),
        (
            "seckill_sale_stock_left",
            "Units of a sale still on sale (Redis's stock counter)",
            |p| p.stock_left,
        ),
        (
            "seckill_sale_reserved",
            "Units of a sale reserved and not released (Redis's flow records)",
            |p| Some(p.reserved),
        ),
        (
            "seckill_sale_ordered",
            "Orders of a sale holding a unit (MySQL: confirmed, pending payment, paid)",
            |p| Some(p.ordered),
        ),
        ("seckill_sale_paid", "Orders of a sale paid (MySQL)", |p| {
            Some(p.paid)
        }),
    ];
    for (name, help, value) in per_sale {
        let family = Family::<[(&'static str, String); 1], Gauge>::default();
        r.register(name, help, family.clone());
        for p in &f.sales {
            if let Some(v) = value(p) {
                family
                    .get_or_create(&[("sale", p.sale_id.to_string())])
                    .set(v);
            }
        }
    }
}

/// Writes `text` to `path` whole or not at all (a temporary file in the
/// same directory, then a rename, as node_exporter's textfile collector
/// asks), readable by others (`0644`: node_exporter runs as another user).
/// Only a regular file (or nothing) at `path` is replaced: the rename
/// would replace a device, a directory's entry or a symlink just as well,
/// and the reconciler may run as root.
///
/// Errors: I/O errors of the directory or the file; `InvalidInput` when
/// something other than a regular file is at `path`.
pub fn write(path: &Path, text: &str) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_file() => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a regular file: left as it is",
            ))
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let tmp = path.with_extension("prom.tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    // The process umask (0077 in the unit) narrowed the mode at creation.
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_regular_file_or_nothing_is_replaced() {
        let dir = std::env::temp_dir().join(format!("seckill-mf-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a-directory")).expect("temp dir");
        let file = dir.join("m.prom");
        assert!(write(&file, "x 1\n").is_ok());
        assert!(write(&file, "x 2\n").is_ok());
        assert_eq!(
            std::fs::read_to_string(&file).ok().as_deref(),
            Some("x 2\n")
        );
        let not_file = write(&dir.join("a-directory"), "x 3\n");
        assert_eq!(
            not_file.map_err(|e| e.kind()),
            Err(std::io::ErrorKind::InvalidInput)
        );
        assert!(!dir.join("a-directory.prom.tmp").exists());
        let device = write(Path::new("/dev/null"), "x 4\n");
        assert_eq!(
            device.map_err(|e| e.kind()),
            Err(std::io::ErrorKind::InvalidInput)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_file_holds_every_series_with_its_value() {
        let f = RunFigures {
            finished_ms: 1_764_400_000_500,
            success: true,
            last_success_ms: Some(1_764_400_000_500),
            duration_s: 0.25,
            sales_checked: 3,
            open: vec![
                (Kind::StockMismatch, Severity::Critical, 1),
                (Kind::DeadLetter, Severity::Normal, 2),
            ],
            sales: vec![
                SaleProgress {
                    sale_id: 7,
                    stock: 10,
                    stock_left: Some(4),
                    reserved: 6,
                    ordered: 5,
                    paid: 2,
                },
                SaleProgress {
                    sale_id: 8,
                    stock: 3,
                    stock_left: None,
                    ..SaleProgress::default()
                },
            ],
            replica: Some(ReplicaFigures {
                used: false,
                wait_s: 1.5,
                confirmed_on_primary: 0,
                cleared_by_primary: 0,
            }),
            mysql_primary_up: false,
            mysql_refused_writable: 1,
        };
        let text = match render(&f) {
            Ok(t) => t,
            Err(e) => panic!("render: {e}"),
        };
        for line in [
            "seckill_reconciler_last_run_timestamp_seconds 1764400000.5",
            "seckill_reconciler_last_run_success 1.0",
            "seckill_reconciler_last_success_timestamp_seconds 1764400000.5",
            "seckill_reconciler_last_run_duration_seconds 0.25",
            "seckill_reconciler_sales_checked 3.0",
            "seckill_reconciler_replica_used 0.0",
            "seckill_reconciler_replica_wait_seconds 1.5",
            "seckill_reconciler_mysql_primary_up 0.0",
            "seckill_reconciler_mysql_refused_writable_servers 1.0",
            r#"seckill_reconciler_open_findings{kind="stock_mismatch",severity="critical"} 1"#,
            r#"seckill_reconciler_open_findings{kind="dead_letter",severity="normal"} 2"#,
            r#"seckill_reconciler_open_findings{kind="dead_letter",severity="critical"} 0"#,
            r#"seckill_sale_stock{sale="7"} 10"#,
            r#"seckill_sale_stock_left{sale="7"} 4"#,
            r#"seckill_sale_reserved{sale="7"} 6"#,
            r#"seckill_sale_ordered{sale="7"} 5"#,
            r#"seckill_sale_paid{sale="7"} 2"#,
            r#"seckill_sale_stock{sale="8"} 3"#,
            r#"seckill_sale_reserved{sale="8"} 0"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
        let series = text
            .lines()
            .filter(|l| l.starts_with("seckill_reconciler_open_findings{"))
            .count();
        assert_eq!(series, Kind::ALL.len() * Severity::ALL.len());
        // Sale 8 is not loaded in Redis: no stock-left series for it.
        let left: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("seckill_sale_stock_left{"))
            .collect();
        assert_eq!(left, [r#"seckill_sale_stock_left{sale="7"} 4"#]);
    }
}
