//! Specifies `seckill-load`'s documented exit codes (its `--help`): 0 every
//! invariant holds, 1 an invariant failed (and the report names which),
//! 2 could not run, 64 bad command line.

use crate::support::gateway as gateway_support;

use gateway_support::Gateway;
use seckill_tests::{create_sale, load_report, RedisServer, TestDb};
use std::process::Output;

fn load(args: &[&str], env: &[(&str, String)]) -> Output {
    seckill_tests::command("seckill-load")
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("run seckill-load")
}

#[test]
fn help_exits_0_with_the_usage() {
    let out = load(&["--help"], &[]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("usage: seckill-load --sale ID"));
}

#[test]
fn seckill_report_help_exits_0_with_its_usage_and_a_bad_option_64() {
    let run = |args: &[&str]| {
        seckill_tests::command("seckill-report")
            .args(args)
            .output()
            .expect("run seckill-report")
    };
    let out = run(&["--help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.starts_with("usage: seckill-report --out FILE"),
        "{text}"
    );
    assert!(text.contains("Exit codes: 0 written"), "{text}");
    let out = run(&["--frobnicate"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(err.contains("frobnicate"), "{err}");
}

#[test]
fn a_bad_command_line_exits_64_and_names_the_problem() {
    for (args, says) in [
        (&[][..], "--sale"),
        (&["--sale", "x"][..], "--sale"),
        (&["--sale", "1", "--users", "many"][..], "--users"),
        (&["--sale", "1", "--duplicates", "2"][..], "--duplicates"),
        (&["--sale", "1", "--frobnicate"][..], "frobnicate"),
    ] {
        let out = load(args, &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        assert!(
            err.starts_with("seckill-load: ") && err.contains(says),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn a_gateway_that_cannot_be_reached_exits_2() {
    let out = load(
        &[
            "--sale",
            "1",
            "--url",
            "http://127.0.0.1:1",
            "--users",
            "5",
            "--no-verify",
        ],
        &[],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.starts_with("seckill-load: "), "{err}");
}

/// No worker runs: every purchase is reserved in Redis and none becomes an
/// order, so exactly the three invariants about orders fail, and the rest
/// hold.
#[test]
fn a_failed_invariant_exits_1_and_the_report_names_it() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 10, -1_000, 600_000);
    let gw = Gateway::start(&redis, &[]);
    let key = seckill_tests::auth::signing_key_file();
    let out = load(
        &[
            "--sale",
            &sale.to_string(),
            "--url",
            &format!("http://127.0.0.1:{}", gw.port),
            "--users",
            "30",
            "--connections",
            "4",
            "--duplicates",
            "0",
            "--hostile",
            "0",
            "--key",
            key.to_str().expect("a UTF-8 path"),
            "--drain-timeout",
            "1s",
            "--json",
        ],
        &[
            ("SECKILL_REDIS_URL", redis.url()),
            ("SECKILL_MYSQL_URL", db.url()),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("a JSON report");
    assert_eq!(report["ok"], false);
    assert_eq!(report["accepted"], 10);
    assert_eq!(
        load_report::verdicts(&report),
        load_report::expected(&[
            "queues_drained",
            "orders_match_reservations",
            "every_202_has_its_order",
        ])
    );
}
