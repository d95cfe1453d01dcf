//! Specifies `seckill-load --outage`: a crowd bought through an outage
//! (Redis refusing writes for 800 ms, `CLIENT PAUSE WRITE`, with the
//! gateway giving up after 300 ms) is judged on its books: the 503 answers
//! are counted apart instead of failing `purchases_answered`, each buyer
//! answered only 503 holds nothing (`unavailable_reserved_nothing`), and
//! every other invariant holds as in a run without an outage.

use crate::support::gateway as gateway_support;
use crate::support::worker as worker_support;

use gateway_support::Gateway;
use seckill_tests::{create_sale, load_report, RedisServer, TestDb};
use std::time::Duration;
use worker_support::{Opts, WorkerProc};

#[test]
fn an_outage_run_allows_503s_and_still_checks_the_books() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 5_000, -1_000, 600_000);
    let gw = Gateway::start(&redis, &[("SECKILL_REDIS_TIMEOUT", "300ms")]);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let key = seckill_tests::auth::signing_key_file();
    let load = seckill_tests::command("seckill-load")
        .args([
            "--sale",
            &sale.to_string(),
            "--url",
            &format!("http://127.0.0.1:{}", gw.port),
            "--users",
            "400",
            "--connections",
            "4",
            "--hostile",
            "0",
            "--key",
            key.to_str().expect("a UTF-8 path"),
            "--outage",
            "--json",
        ])
        .env("SECKILL_REDIS_URL", redis.url())
        .env("SECKILL_MYSQL_URL", db.url())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run seckill-load");
    // The outage, once the crowd is buying.
    seckill_tests::wait_until(Duration::from_secs(30), "the first orders", || {
        db.count(&format!(
            "SELECT COUNT(*) FROM orders WHERE sale_id = {sale}"
        )) >= 50
    });
    redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(800)
        .arg("WRITE")
        .exec(&mut redis.con())
        .expect("CLIENT PAUSE");
    let out = load.wait_with_output().expect("seckill-load's report");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("a JSON report");
    let said = |name: &str| {
        report["invariants"]
            .as_array()
            .and_then(|l| l.iter().find(|c| c["name"] == name))
            .map(|c| c["detail"].to_string())
            .unwrap_or_default()
    };
    println!(
        "outage run: {} x 202, {} x 503, answers {}; {}: {}; purchases_answered: {}",
        report["accepted"],
        report["unavailable"],
        report["answers"],
        load_report::OUTAGE,
        said(load_report::OUTAGE),
        said("purchases_answered")
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(report["unavailable"].as_u64().unwrap_or(0) > 0, "{stdout}");
    let mut expected = load_report::expected(&[]);
    expected.insert(1, (load_report::OUTAGE.to_string(), true));
    assert_eq!(load_report::verdicts(&report), expected);
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM orders WHERE sale_id = {sale}"
        )),
        report["accepted"].as_i64().unwrap_or(-1)
    );
}
