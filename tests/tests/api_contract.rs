//! Checks the API contract, `docs/openapi.yaml`, against the real gateway
//! on a real private Redis with schemathesis (PyPI): every check it has
//! (`--checks all`: no server error, documented status codes, content
//! types, body schemas and headers, 405 with `Allow` for undocumented
//! methods, 401 when the token is left out, negative data refused, ...)
//! over every operation, in its examples, coverage, fuzzing and stateful
//! phases (the OpenAPI links: purchase → `/purchases/me`, sale →
//! purchase), with a valid buyer token, a bounded number of examples and a
//! fixed seed. Redis stays healthy throughout, so a 5xx is a failure.
//!
//! The gateway has a payment secret (`SECKILL_PAYMENT_SECRET`), so
//! `POST /v1/payments` is served rather than 503 `payments_not_configured`;
//! schemathesis does not know the secret, so every payment it sends is 401
//! `bad_signature` or `signature_expired` (the signature is checked before
//! the body), and nothing reaches the payment queue.
//!
//! schemathesis is found at `SECKILL_SCHEMATHESIS` (set by
//! `scripts/test.sh`, which installs it in a virtual environment under the
//! target directory when missing), else at
//! `<target>/venv-schemathesis/bin/st`; without it the test fails, saying
//! how to install it: a contract that cannot be checked must not pass.

use crate::support::gateway as gateway_support;

use gateway_support::{get, load_sale, open_sale, Gateway};
use seckill_common::keys::SaleKeys;
use seckill_tests::RedisServer;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The buyer of the run: the name the document's examples use, so that
/// the examples phase makes a real purchase.
const BUYER: &str = "alice";
/// Test cases per operation and phase (`--max-examples`).
const MAX_EXAMPLES: &str = "50";
/// The fixed seed of the data generation, so that a failure reproduces.
const SEED: &str = "15";
/// The gateway's payment secret (at least 16 bytes); schemathesis is not
/// told it.
const PAYMENT_SECRET: &str = "contract-test-secret-0123";
/// A run still going after this long has hung: it is killed and fails.
const HANG: Duration = Duration::from_secs(600);

/// The schemathesis CLI to run; panics with the install command when it is
/// not there.
fn schemathesis() -> PathBuf {
    let path = match std::env::var_os("SECKILL_SCHEMATHESIS") {
        Some(p) => PathBuf::from(p),
        None => {
            // target/debug/deps/api_contract-xxxx -> target/
            let exe = std::env::current_exe().expect("current exe");
            let target = exe
                .ancestors()
                .nth(3)
                .expect("the target directory")
                .to_path_buf();
            target.join("venv-schemathesis/bin/st")
        }
    };
    assert!(
        path.is_file(),
        "schemathesis is missing at {}: run ./scripts/test.sh (it installs it), or \
         `python3 -m venv <target>/venv-schemathesis && \
         <target>/venv-schemathesis/bin/pip install schemathesis==<SCHEMATHESIS_VERSION of scripts/lib/services.sh>`, \
         or set SECKILL_SCHEMATHESIS to an `st` executable",
        path.display()
    );
    path
}

/// The contract, `docs/openapi.yaml`.
fn contract() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.yaml")
}

/// The value of the series `series` (exactly as written) on a metrics page.
fn sample(page: &str, series: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// The sum of every `seckill_gateway_requests_total` series whose status
/// label starts with `class` (e.g. `"5"`).
fn requests_of_class(page: &str, class: &str) -> f64 {
    page.lines()
        .filter(|l| l.starts_with("seckill_gateway_requests_total{"))
        .filter(|l| l.contains(&format!("status=\"{class}")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn every_answer_conforms_to_the_contract() {
    let st = schemathesis();
    let redis = RedisServer::start();
    // Sales in every state a request can meet (paused is left out: its
    // 503 would be a server error by design).
    open_sale(&redis, 1, 1000);
    open_sale(&redis, 2, 0);
    load_sale(&redis, 3, 10, 3_600_000, 600_000);
    load_sale(&redis, 4, 10, -7_200_000, 3_600_000);
    let gw = Gateway::start(&redis, &[("SECKILL_PAYMENT_SECRET", PAYMENT_SECRET)]);
    let token = seckill_tests::auth::token_for(BUYER);
    let work = seckill_tests::TempDir::new();
    let (out_path, err_path) = (work.path().join("stdout"), work.path().join("stderr"));

    let started = Instant::now();
    let mut child = Command::new(&st)
        .arg("--config-file")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("schemathesis.toml"))
        .arg("run")
        .arg(contract())
        .args(["--url", &format!("http://127.0.0.1:{}", gw.port)])
        .args(["--header", &format!("Authorization: Bearer {token}")])
        .args(["--checks", "all"])
        .args(["--phases", "examples,coverage,fuzzing,stateful"])
        .args(["--max-examples", MAX_EXAMPLES, "--seed", SEED])
        .args(["--workers", "1", "--generation-database", "none"])
        .args(["--request-timeout", "30", "--no-color"])
        .args(["--suppress-health-check", "all"])
        .current_dir(work.path())
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).expect("create stdout file"))
        .stderr(File::create(&err_path).expect("create stderr file"))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", st.display()));
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for schemathesis") {
            break Some(s);
        }
        if started.elapsed() > HANG {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let said = format!("{}{}", read(&out_path), read(&err_path));
    println!(
        "schemathesis ran {:.1} s:\n{said}",
        started.elapsed().as_secs_f64()
    );
    let code = status.and_then(|s| s.code());
    assert_eq!(
        code,
        Some(0),
        "schemathesis failed (None: killed after {HANG:?}):\n{said}"
    );
    // The stateful phase followed links (its summary line, e.g.
    // `API Links:    4 covered / 6 selected / 6 total`).
    let covered = said
        .lines()
        .find_map(|l| l.trim().strip_prefix("API Links:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<u32>().ok());
    assert!(
        covered.is_some_and(|n| n > 0),
        "the stateful phase followed no link:\n{said}"
    );

    // What the run did, from the gateway's own counters: no 5xx at all,
    // exactly one reservation (the buyer's, in sale 1), its status read
    // back through a link, its cancellation refused (still `queued`: no
    // worker runs), payments refused for their signature, and nothing
    // queued on the payment queue (no payment, no cancellation).
    let page = get(gw.port, "/metrics").body;
    let answered: Vec<&str> = page
        .lines()
        .filter(|l| l.starts_with("seckill_gateway_requests_total{"))
        .collect();
    println!("the gateway's answers:\n{}", answered.join("\n"));
    assert_eq!(requests_of_class(&page, "5"), 0.0, "{page}");
    assert_eq!(
        sample(
            &page,
            r#"seckill_gateway_purchases_total{outcome="reserved"}"#
        ),
        1.0,
        "{page}"
    );
    assert!(
        sample(
            &page,
            r#"seckill_gateway_requests_total{route="purchase_status",status="200"}"#
        ) >= 1.0,
        "no status read found the reservation:\n{page}"
    );
    assert!(
        sample(
            &page,
            r#"seckill_gateway_requests_total{route="cancel",status="409"}"#
        ) >= 1.0,
        "no cancellation met the reservation:\n{page}"
    );
    assert!(
        sample(
            &page,
            r#"seckill_gateway_requests_total{route="payment",status="401"}"#
        ) >= 1.0,
        "no payment reached the signature check:\n{page}"
    );
    let queued: u64 = redis::cmd("LLEN")
        .arg(seckill_common::payment::QUEUE)
        .query(&mut redis.con())
        .expect("LLEN payments");
    assert_eq!(queued, 0);
    let buyers: Vec<String> = redis::cmd("HKEYS")
        .arg(SaleKeys::new(1).buyers())
        .query(&mut redis.con())
        .expect("HKEYS buyers");
    assert_eq!(buyers, vec![BUYER.to_string()]);
}
