//! Specifies the command line of the two services, which take no
//! arguments (the fresh-user pass: `--help` started them on their default
//! settings): `--help` and `--version` print and exit 0, anything else is
//! exit 64 and starts nothing; and a worker whose metrics address is taken
//! exits 2 (bad configuration), as the gateway does for its listen address.

use seckill_tests::RedisServer;
use std::net::TcpListener;

fn run(name: &str, args: &[&str]) -> std::process::Output {
    seckill_tests::command(name)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {name}: {e}"))
}

#[test]
fn help_and_version_print_and_anything_else_is_refused_with_64() {
    for name in ["seckill-gateway", "seckill-worker"] {
        let help = run(name, &["--help"]);
        assert_eq!(help.status.code(), Some(0), "{name}");
        let text = String::from_utf8_lossy(&help.stdout);
        assert!(
            text.starts_with(&format!("usage: {name}\n")),
            "{name}: {text}"
        );
        let version = run(name, &["-V"]);
        assert_eq!(version.status.code(), Some(0), "{name}");
        assert!(String::from_utf8_lossy(&version.stdout).starts_with(name));
        let bad = run(name, &["--listen", "0.0.0.0:80"]);
        assert_eq!(bad.status.code(), Some(64), "{name}");
        let err = String::from_utf8_lossy(&bad.stderr);
        assert!(
            err.starts_with(&format!("{name}: unexpected argument \"--listen\"")),
            "{name}: {err}"
        );
    }
}

#[test]
fn a_worker_whose_metrics_address_is_taken_exits_2() {
    let redis = RedisServer::start();
    let taken = TcpListener::bind(("127.0.0.1", 0)).expect("bind a port");
    let port = taken.local_addr().expect("its address").port();
    let out = seckill_tests::command("seckill-worker")
        .env("SECKILL_REDIS_URL", redis.url())
        .env("SECKILL_WORKER_METRICS_LISTEN", format!("127.0.0.1:{port}"))
        .output()
        .expect("run seckill-worker");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("metrics listener"), "{err}");
}
