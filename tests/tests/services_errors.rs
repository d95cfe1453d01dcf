//! Specifies what the services say when Redis or MySQL cannot be used: a
//! worker that MySQL refuses for good (access denied, unknown database,
//! missing tables) exits 2 within seconds naming `SECKILL_MYSQL_URL` and
//! the remedy, while one whose MySQL or Redis is down waits and names the
//! address; every connection error names the address and its variable,
//! and a password in a URL never appears in any output; `/readyz` names
//! why it is not ready.

use crate::support::gateway as gateway_support;

use gateway_support::{get, signal, Gateway};
use mysql::prelude::Queryable;
use seckill_tests::{free_port, RedisServer, TempDir, TestDb};
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A password that must never be printed.
const SECRET: &str = "n0t-for-logs";

/// Starts a worker with `redis_url` and `mysql_url`, its stderr into a file
/// of `dir` (returned with the child).
fn worker(dir: &TempDir, redis_url: &str, mysql_url: &str) -> (Child, std::path::PathBuf) {
    let log = dir.path().join(format!("worker-{}.log", free_port()));
    let file = std::fs::File::create(&log).expect("create the log file");
    let child = seckill_tests::command("seckill-worker")
        .env("SECKILL_REDIS_URL", redis_url)
        .env("SECKILL_MYSQL_URL", mysql_url)
        .env("SECKILL_WORKER_ID", "w-errors")
        .env(
            "SECKILL_WORKER_METRICS_LISTEN",
            format!("127.0.0.1:{}", free_port()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::from(file))
        .spawn()
        .expect("start seckill-worker");
    (child, log)
}

/// Waits at most `within` for `child` to exit.
fn exit_within(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Some(s) = child.try_wait().expect("try_wait") {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

fn read(log: &std::path::Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

/// The MySQL server of the tests with `user:password@` and database `db`.
fn mysql_url(user_info: &str, db: &str) -> String {
    let server = std::env::var("SECKILL_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/".to_string());
    let host = server
        .trim_start_matches("mysql://")
        .rsplit_once('@')
        .map_or(server.trim_start_matches("mysql://"), |(_, h)| h)
        .trim_end_matches('/')
        .to_string();
    format!("mysql://{user_info}@{host}/{db}")
}

/// Runs a worker against `mysql` (Redis healthy) and returns its exit code
/// and what it printed; fails when it is still running after 15 s.
fn refused_worker(mysql: &str) -> (Option<i32>, String) {
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let (mut child, log) = worker(&dir, &redis.url(), mysql);
    let status = exit_within(&mut child, Duration::from_secs(15));
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the worker still runs after 15 s:\n{}", read(&log));
    }
    (status.and_then(|s| s.code()), read(&log))
}

#[test]
fn a_worker_pointed_at_a_database_that_does_not_exist_exits_2_naming_the_variable_and_the_remedy() {
    let db = TestDb::create();
    let missing = format!("{}_absent", db.name);
    let (code, err) = refused_worker(&mysql_url("root", &missing));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("ERROR 1049"), "{err}");
    assert!(err.contains("(SECKILL_MYSQL_URL)"), "{err}");
    assert!(err.contains(&missing), "{err}");
    assert!(err.contains("seckill-reconciler migrate"), "{err}");
    assert!(!err.contains("MySqlError {"), "{err}");
}

#[test]
fn a_reconciler_command_names_the_mysql_address_its_variable_and_the_remedy() {
    let db = TestDb::create();
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let run_on = |mysql: &str, args: &[&str]| {
        let out = seckill_tests::command("seckill-reconciler")
            .args(args)
            .env("SECKILL_REDIS_URL", redis.url())
            .env("SECKILL_MYSQL_URL", mysql)
            .env("SECKILL_REVIEW_DB", dir.path().join("review.sqlite3"))
            .output()
            .expect("run seckill-reconciler");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.code(), err)
    };
    let run = |mysql: &str| run_on(mysql, &["sale", "list"]);
    // A database that does not exist: its name, the variable, `migrate`.
    let missing = format!("{}_absent", db.name);
    let (code, err) = run(&mysql_url("root", &missing));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("ERROR 1049"), "{err}");
    assert!(err.contains("(SECKILL_MYSQL_URL)"), "{err}");
    assert!(err.contains(&missing), "{err}");
    assert!(err.contains("seckill-reconciler migrate"), "{err}");
    assert!(!err.contains("MySqlError {"), "{err}");
    // The same through `sale show`'s own connection.
    let (code, err2) = run_on(&mysql_url("root", &missing), &["sale", "show", "1"]);
    assert_eq!((code, err2.as_str()), (Some(2), err.as_str()));
    // Nothing listening: the address and the variable, no driver's Debug.
    let port = free_port();
    let (code, err) = run(&format!("mysql://root:{SECRET}@127.0.0.1:{port}/x"));
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "mysql at mysql://root:***@127.0.0.1:{port}/x (SECKILL_MYSQL_URL): "
        )),
        "{err}"
    );
    assert!(!err.contains("DriverError {"), "{err}");
    assert!(!err.contains(SECRET), "{err}");
}

#[test]
fn a_worker_with_a_wrong_mysql_password_exits_2_and_never_prints_the_password() {
    let db = TestDb::create();
    let (code, err) = refused_worker(&mysql_url(&format!("root:{SECRET}"), &db.name));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("ERROR 1045"), "{err}");
    assert!(err.contains("root:***@"), "{err}");
    assert!(
        err.contains("fix the user or password in SECKILL_MYSQL_URL"),
        "{err}"
    );
    assert!(!err.contains(SECRET), "{err}");
}

#[test]
fn a_worker_whose_user_mysql_refuses_without_a_password_check_exits_2_with_the_remedy() {
    // MariaDB answers ERROR 1698 for a user that does not exist (or logs
    // in only by unix_socket); MySQL answers 1045: neither passes by waiting.
    let db = TestDb::create();
    let (code, err) = refused_worker(&mysql_url(&format!("nobody:{SECRET}"), &db.name));
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("ERROR 1698") || err.contains("ERROR 1045"),
        "{err}"
    );
    assert!(err.contains("nobody:***@"), "{err}");
    assert!(err.contains("(SECKILL_MYSQL_URL)"), "{err}");
    assert!(err.contains("in SECKILL_MYSQL_URL"), "{err}");
    assert!(!err.contains("waiting for mysql"), "{err}");
    assert!(!err.contains(SECRET), "{err}");
}

#[test]
fn a_mysql_url_without_a_database_is_refused_at_start_asking_for_its_name() {
    let url = mysql_url(&format!("root:{SECRET}"), "");
    let (code, err) = refused_worker(&url);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("SECKILL_MYSQL_URL"), "{err}");
    assert!(
        err.contains("write the database name: mysql://user[:password]@host:port/DATABASE"),
        "{err}"
    );
    assert!(!err.contains("waiting for mysql"), "{err}");
    assert!(!err.contains(SECRET), "{err}");
    let out = seckill_tests::command("seckill-reconciler")
        .args(["sale", "list"])
        .env("SECKILL_MYSQL_URL", &url)
        .output()
        .expect("run seckill-reconciler");
    let rerr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{rerr}");
    assert!(rerr.contains("host:port/DATABASE"), "{rerr}");
}

#[test]
fn a_reconciler_whose_user_mysql_refuses_without_a_password_check_names_the_remedy() {
    let db = TestDb::create();
    let out = seckill_tests::command("seckill-reconciler")
        .args(["sale", "list"])
        .env("SECKILL_MYSQL_URL", mysql_url("nobody", &db.name))
        .output()
        .expect("run seckill-reconciler");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("ERROR 1698") || err.contains("ERROR 1045"),
        "{err}"
    );
    assert!(err.contains("in SECKILL_MYSQL_URL"), "{err}");
}

#[test]
fn a_worker_on_a_database_without_the_tables_exits_2_asking_for_migrate() {
    let db = TestDb::create();
    let empty = db.sibling("_empty");
    db.conn()
        .query_drop(format!("CREATE DATABASE `{}`", empty.name))
        .expect("create an empty database");
    let (code, err) = refused_worker(&mysql_url("root", &empty.name));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("ERROR 1146"), "{err}");
    assert!(err.contains("seckill-reconciler migrate"), "{err}");
}

#[test]
fn a_worker_whose_redis_and_mysql_are_down_waits_naming_each_address_without_its_password() {
    let dir = TempDir::new();
    let (redis_port, mysql_port) = (free_port(), free_port());
    let redis_url = format!("redis://:{SECRET}@127.0.0.1:{redis_port}/");
    let mysql_url = format!("mysql://root:{SECRET}@127.0.0.1:{mysql_port}/seckill");
    let (mut child, log) = worker(&dir, &redis_url, &mysql_url);
    // Transient: still waiting after 3 s.
    assert_eq!(exit_within(&mut child, Duration::from_secs(3)), None);
    signal(child.id(), "TERM");
    let status = exit_within(&mut child, Duration::from_secs(10));
    let err = read(&log);
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{err}");
    assert!(
        err.contains(&format!(
            "waiting for redis at redis://:***@127.0.0.1:{redis_port}/ (SECKILL_REDIS_URL): "
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "waiting for mysql at mysql://root:***@127.0.0.1:{mysql_port}/seckill (SECKILL_MYSQL_URL): "
        )),
        "{err}"
    );
    assert!(!err.contains(SECRET), "{err}");
    assert!(!err.contains("DriverError {"), "{err}");
}

#[test]
fn a_gateway_at_a_closed_redis_port_names_the_address_and_readyz_says_unreachable() {
    let dir = TempDir::new();
    let port = free_port();
    let redis_port = free_port();
    let log = dir.path().join("gateway.log");
    let file = std::fs::File::create(&log).expect("create the log file");
    let mut child = seckill_tests::command("seckill-gateway")
        .env("SECKILL_LISTEN", format!("127.0.0.1:{port}"))
        .env(
            "SECKILL_REDIS_URL",
            format!("redis://:{SECRET}@127.0.0.1:{redis_port}/"),
        )
        .env("SECKILL_GATEWAY_THREADS", "2")
        .stdout(Stdio::null())
        .stderr(Stdio::from(file))
        .spawn()
        .expect("start seckill-gateway");
    seckill_tests::wait_until(Duration::from_secs(10), "the gateway to listen", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let r = get(port, "/readyz");
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(
        r.json(),
        serde_json::json!({"error": "unavailable", "reason": "redis_unreachable"})
    );
    signal(child.id(), "TERM");
    let _ = exit_within(&mut child, Duration::from_secs(10));
    let _ = child.kill();
    let _ = child.wait();
    let err = read(&log);
    assert!(
        err.contains(&format!(
            "redis at redis://:***@127.0.0.1:{redis_port}/ (SECKILL_REDIS_URL): connect: "
        )),
        "{err}"
    );
    assert!(!err.contains(SECRET), "{err}");
}

#[test]
fn readyz_names_an_eviction_policy_apart_from_a_redis_that_is_down() {
    let mut redis = RedisServer::start();
    let g = Gateway::start(&redis, &[]);
    assert_eq!(get(g.port, "/readyz").status, 200);
    let set_policy = |redis: &RedisServer, p: &str| {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory-policy")
            .arg(p)
            .exec(&mut redis.con())
            .expect("CONFIG SET");
    };
    set_policy(&redis, "allkeys-lru");
    let r = get(g.port, "/readyz");
    assert_eq!(
        (r.status, r.json()),
        (
            503,
            serde_json::json!({"error": "unavailable", "reason": "redis_eviction_policy"})
        )
    );
    assert_eq!(r.header("Retry-After"), Some("1"));
    set_policy(&redis, "noeviction");
    seckill_tests::wait_until(Duration::from_secs(5), "ready again", || {
        get(g.port, "/readyz").status == 200
    });
    redis.stop();
    let r = get(g.port, "/readyz");
    assert_eq!(
        (r.status, r.json()),
        (
            503,
            serde_json::json!({"error": "unavailable", "reason": "redis_unreachable"})
        )
    );
}

/// A Redis that requires a password, and `redis://:WRONG@…` for it.
fn redis_with_password() -> (RedisServer, String) {
    let redis = RedisServer::start();
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("the-right-one")
        .query::<()>(&mut redis.con())
        .expect("set requirepass");
    let url = format!("redis://:{SECRET}@127.0.0.1:{}/", redis.port);
    (redis, url)
}

/// The remedy every service prints for a refused Redis password.
const REDIS_REMEDY: &str = "check the password in SECKILL_REDIS_URL";

#[test]
fn a_redis_that_refuses_the_password_stops_the_worker_and_the_gateway_with_the_remedy() {
    let (_redis, url) = redis_with_password();
    let db = TestDb::create();
    let dir = TempDir::new();
    // The worker: exit 2 at start, naming the address without the password.
    let (mut child, log) = worker(&dir, &url, &db.url());
    let status = exit_within(&mut child, Duration::from_secs(15));
    let err = read(&log);
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{err}");
    let at = url.replace(SECRET, "***");
    assert!(
        err.contains(&format!("redis at {at} (SECKILL_REDIS_URL): ")),
        "{err}"
    );
    assert!(err.contains(REDIS_REMEDY), "{err}");
    assert!(!err.contains("- AuthenticationFailed"), "{err}");
    assert!(!err.contains("waiting for redis"), "{err}");
    assert!(!err.contains(SECRET), "{err}");
    // The gateway: exit 2 at start too.
    let glog = dir.path().join("gateway.log");
    let file = std::fs::File::create(&glog).expect("create the log file");
    let mut gw = seckill_tests::command("seckill-gateway")
        .env("SECKILL_LISTEN", format!("127.0.0.1:{}", free_port()))
        .env("SECKILL_REDIS_URL", &url)
        .env("SECKILL_GATEWAY_THREADS", "2")
        .stdout(Stdio::null())
        .stderr(Stdio::from(file))
        .spawn()
        .expect("start seckill-gateway");
    let status = exit_within(&mut gw, Duration::from_secs(15));
    let err = read(&glog);
    if status.is_none() {
        let _ = gw.kill();
        let _ = gw.wait();
    }
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{err}");
    assert!(
        err.contains(&format!("redis at {at} (SECKILL_REDIS_URL): ")),
        "{err}"
    );
    assert!(err.contains(REDIS_REMEDY), "{err}");
    assert!(!err.contains(SECRET), "{err}");
}

#[test]
fn a_reconciler_command_that_redis_refuses_the_password_names_the_remedy() {
    let (_redis, url) = redis_with_password();
    let db = TestDb::create();
    let dir = TempDir::new();
    let out = seckill_tests::command("seckill-reconciler")
        .args(["sale", "list"])
        .env("SECKILL_REDIS_URL", &url)
        .env("SECKILL_MYSQL_URL", db.url())
        .env("SECKILL_REVIEW_DB", dir.path().join("review.sqlite3"))
        .output()
        .expect("run seckill-reconciler");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(REDIS_REMEDY), "{err}");
    assert!(!err.contains("- AuthenticationFailed"), "{err}");
    assert!(!err.contains(SECRET), "{err}");
}
