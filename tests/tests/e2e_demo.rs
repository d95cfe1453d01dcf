//! Specifies `scripts/demo.sh` itself: on this machine, with a small sale
//! (50 units, 2,000 users; by default a quantity mix, with
//! `SECKILL_DEMO_QUANTITIES=0` one unit per buyer), the one-command flash
//! sale builds, runs every
//! service, verifies every invariant, takes 35 payments, lets 15 orders
//! expire and sells those 15 units again, finds nothing to reconcile, stops
//! everything and exits 0; its JSON report (`demo.json`) says the same,
//! every invariant by name; its HTML report (`report.html`, named by its
//! last line) renders in headless Chromium with every chart drawn from the
//! run's data. It runs against this test's private Redis and a
//! new `seckill_demo_*` database on the test MySQL server (dropped at the
//! end), and leaves no key behind in Redis.

use crate::support::browser as browser_support;

use seckill_tests::RedisServer;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `scripts/demo.sh`.
fn demo_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/demo.sh")
}

/// What a run of the demo left: its private Redis (to look for keys left
/// behind), its standard output and its JSON report.
struct Demo {
    redis: RedisServer,
    stdout: String,
    report: serde_json::Value,
}

/// Runs the demo on a sale of 50 units for 2,000 users over 32
/// connections; payers pay 70 % (35) of the winners, the other 15 orders
/// expire after 4 s, and 15 buyers told sold out buy and pay for those
/// units. `quantities`: `SECKILL_DEMO_QUANTITIES` (`None`: unset, the
/// demo's quantity mix). Asserts exit 0 and reads the JSON report the
/// demo names.
fn run_demo(quantities: Option<&str>) -> Demo {
    let mut cmd = Command::new(demo_script());
    cmd.args(["--stock", "50", "--users", "2000", "--connections", "32"]);
    cmd.args(["--pay-share", "0.7", "--payment-window", "4s"]);
    match quantities {
        Some(q) => cmd.env("SECKILL_DEMO_QUANTITIES", q),
        None => cmd.env_remove("SECKILL_DEMO_QUANTITIES"),
    };
    let redis = RedisServer::start();
    cmd.env("SECKILL_REDIS_URL", redis.url());
    // The account scripts/test.sh set up (root, or seckill_test when root
    // cannot log in over TCP): it may create seckill_demo_* databases.
    let server = std::env::var("SECKILL_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/".to_string());
    cmd.env("SECKILL_MYSQL_URL", server.trim_end_matches('/'));
    let out = cmd.output().expect("run scripts/demo.sh");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let path = stdout
        .lines()
        .find_map(|l| l.split_once("report (JSON): ").map(|(_, p)| p.trim()))
        .unwrap_or_else(|| panic!("the demo names its JSON report: {stdout}"));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("read demo.json"))
            .expect("demo.json is JSON");
    Demo {
        redis,
        stdout,
        report,
    }
}

/// Asserts that the demo left no key behind in `redis`.
fn assert_no_key_left(redis: &RedisServer) {
    let left: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut redis.con()).unwrap();
    assert!(left.is_empty(), "the demo left keys behind: {left:?}");
}

#[test]
fn the_demo_sells_50_units_to_2000_users_and_exits_0() {
    let _crowd = crate::support::crowd();
    // One unit per buyer: the exact one-unit counts below.
    let Demo {
        redis,
        stdout,
        report,
    } = run_demo(Some("0"));
    assert!(
        stdout.contains("verdict     every invariant holds"),
        "{stdout}"
    );
    assert!(stdout.contains("202: 50 "), "{stdout}");
    assert!(
        stdout.contains("reconciliation: 0 open findings"),
        "{stdout}"
    );
    assert!(
        stdout.contains("exit codes after SIGTERM (gateway, worker 1, worker 2): 0 0 0"),
        "{stdout}"
    );
    assert!(stdout.contains("PASS: sale "), "{stdout}");
    // The JSON report: every invariant by name, the exact answers.
    assert_eq!(
        (
            &report["pass"],
            &report["load_exit"],
            &report["reconciler_exit"],
            &report["stop_codes"]
        ),
        (
            &serde_json::json!(true),
            &serde_json::json!(0),
            &serde_json::json!(0),
            &serde_json::json!([0, 0, 0])
        )
    );
    assert_eq!(
        seckill_tests::load_report::verdicts(&report["load"]),
        seckill_tests::load_report::expected_with_lifecycle()
    );
    let life = &report["load"]["lifecycle"];
    let figures: Vec<(&str, i64)> = [
        "winners",
        "paid_first",
        "expired",
        "resold",
        "paid",
        "pending",
        "available_stock",
    ]
    .iter()
    .map(|k| (*k, life[k].as_i64().unwrap_or(-1)))
    .collect();
    assert_eq!(
        figures,
        vec![
            ("winners", 50),
            ("paid_first", 35),
            ("expired", 15),
            ("resold", 15),
            ("paid", 50),
            ("pending", 0),
            ("available_stock", 0)
        ]
    );
    let load = &report["load"];
    assert_eq!(
        (&load["accepted"], &load["answers"]["202"]),
        (&50.into(), &50.into())
    );
    assert_eq!(
        (&load["hostile"], &load["answers"]["403"]),
        (&10.into(), &1.into())
    );
    assert_no_key_left(&redis);
    assert_report_renders(&stdout, &report);
}

/// The default demo sells a quantity mix (up to 4 units per buyer, 3 per
/// purchase, same-key retries): exactly the sale's 50 units, every
/// invariant in units, nothing to reconcile, no key left behind.
#[test]
fn the_default_demo_sells_a_quantity_mix_of_exactly_50_units() {
    let _crowd = crate::support::crowd();
    let Demo {
        redis,
        stdout,
        report,
    } = run_demo(None);
    for said in [
        "verdict     every invariant holds",
        "reconciliation: 0 open findings",
        "PASS: sale ",
    ] {
        assert!(stdout.contains(said), "{said}: {stdout}");
    }
    let units = &report["load"]["units"];
    assert_eq!(
        (
            &units["max_per_buyer"],
            &units["max_per_purchase"],
            &units["units_accepted"],
            &units["retries_mismatched"]
        ),
        (&4.into(), &3.into(), &50.into(), &0.into()),
        "{units}"
    );
    assert_no_key_left(&redis);
}

/// The demo's last line names its HTML report; headless Chromium loads it
/// (its title in the DOM, a screenshot of the window's size) and finds
/// every chart drawn from `report`'s data: one line per series, each with
/// one point per sample or two per bucket (a step), and the sale's end (0
/// on sale, 50 reserved, ordered and paid, the queue empty) as the
/// legends' last values; and all 17 invariants `ok` in the table.
fn assert_report_renders(stdout: &str, report: &serde_json::Value) {
    let last = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    let html = last
        .strip_prefix("demo: report (HTML): ")
        .unwrap_or_else(|| panic!("the last line names report.html: {last:?}"));
    let html = Path::new(html);
    let dom = browser_support::dump_dom(html);
    let sale = &report["sale"];
    assert!(
        dom.contains(&format!("<h1>seckill demo: sale {sale}</h1>")),
        "{dom}"
    );
    let png = html.with_extension("png");
    assert_eq!(
        browser_support::screenshot(html, &png),
        browser_support::WINDOW
    );

    let t = &report["load"]["timeline"];
    let samples = t["samples"]["t_ms"].as_array().map_or(0, Vec::len);
    assert!(samples >= 2, "a sample before and after: {t}");
    // The timeline's answers add up to the crowd's.
    let answers = t["answers"].as_object().expect("timeline answers");
    let buckets = answers
        .values()
        .next()
        .and_then(|v| v.as_array())
        .map_or(0, Vec::len);
    for (status, counts) in answers {
        let sum: u64 = counts
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c.as_u64())
            .sum();
        assert_eq!(
            Some(sum),
            report["load"]["answers"][status].as_u64(),
            "{status}"
        );
    }
    let answered = (0..buckets)
        .filter(|b| answers.values().any(|v| v[*b].as_u64() > Some(0)))
        .count();
    let s = |name: &str, points: usize, last: &str| (name.to_string(), points, last.to_string());
    let drawn = browser_support::charts(&dom);
    let ids: Vec<&str> = drawn.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["progress", "answers", "latency", "queue"]);
    assert_eq!(
        drawn[0].1,
        browser_support::Drawn {
            series: vec![
                s("on sale (Redis)", samples, "0"),
                s("reserved (Redis)", samples, "50"),
                s("ordered (MySQL)", samples, "50"),
                s("paid (MySQL)", samples, "50"),
            ],
            limit: Some("stock".into()),
        }
    );
    let statuses: Vec<(String, usize)> = drawn[1]
        .1
        .series
        .iter()
        .map(|(n, p, _)| (n.clone(), *p))
        .collect();
    // A step of two points per bucket.
    let want: Vec<(String, usize)> = answers.keys().map(|k| (k.clone(), 2 * buckets)).collect();
    assert_eq!(statuses, want);
    let quantiles: Vec<(String, usize)> = drawn[2]
        .1
        .series
        .iter()
        .map(|(n, p, _)| (n.clone(), *p))
        .collect();
    assert_eq!(
        quantiles,
        [
            ("p50".to_string(), 2 * answered),
            ("p99".into(), 2 * answered),
            ("max".into(), 2 * answered)
        ]
    );
    assert_eq!(
        drawn[3].1.series,
        vec![s("queued", samples, "0"), s("processing", samples, "0")]
    );
    let rows: Vec<String> = browser_support::tags(&dom, "tr")
        .iter()
        .filter_map(|tr| browser_support::attr(tr, "class"))
        .collect();
    assert_eq!(rows, vec!["ok".to_string(); 17]);
}

/// The demo refuses a Redis that already holds sales or workers (a
/// deployment's): its workers would consume them. Exit 2, the message
/// says what to do, and the Redis keeps exactly what it held.
#[test]
fn the_demo_refuses_a_redis_that_already_holds_sales() {
    let redis = RedisServer::start();
    let _: () = redis::cmd("SADD")
        .arg("seckill:sales")
        .arg(41)
        .query(&mut redis.con())
        .unwrap();
    let out = Command::new(demo_script())
        .args(["--stock", "5", "--users", "10"])
        .env("SECKILL_REDIS_URL", redis.url())
        .output()
        .expect("run scripts/demo.sh");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("already holds seckill sales or workers (1)"),
        "{stderr}"
    );
    let mut left: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut redis.con()).unwrap();
    left.sort();
    assert_eq!(left, vec!["seckill:sales".to_string()]);
    let members: Vec<String> = redis::cmd("SMEMBERS")
        .arg("seckill:sales")
        .query(&mut redis.con())
        .unwrap();
    assert_eq!(members, vec!["41".to_string()]);
}
