//! Specifies two start-up refusals of a worker that waiting does not fix:
//! its MySQL account lacks a privilege on one table of its database (MySQL
//! answers 1142 to its start-up check, `SELECT` on `schema_migrations`):
//! exit 2 at once naming `SECKILL_MYSQL_URL`, the server's error and the
//! grant to make, as on 1045, 1698 and 1046; and a `SECKILL_MYSQL_TIMEOUT`
//! below the session limits its heartbeat TTL sets: exit 2 naming both
//! variables.

use mysql::prelude::Queryable;
use seckill_tests::{free_port, RedisServer, TempDir, TestDb};
use std::process::Stdio;
use std::time::{Duration, Instant};

const PASSWORD: &str = "grants-test-pw";

#[test]
fn a_worker_without_select_on_schema_migrations_exits_2_with_the_grant_to_make() {
    let db = TestDb::create();
    let redis = RedisServer::start();
    let dir = TempDir::new();
    // Every privilege on every table of the database but schema_migrations.
    let user = format!("g{}", &db.name[db.name.len().saturating_sub(20)..]);
    let mut root = db.conn();
    root.query_drop(format!("DROP USER IF EXISTS '{user}'@'%'"))
        .unwrap();
    root.query_drop(format!(
        "CREATE USER '{user}'@'%' IDENTIFIED BY '{PASSWORD}'"
    ))
    .unwrap();
    let tables: Vec<String> = root
        .exec(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = ?
               AND table_name <> 'schema_migrations'",
            (&db.name,),
        )
        .unwrap();
    assert!(tables.len() > 5, "{tables:?}");
    for t in &tables {
        root.query_drop(format!(
            "GRANT ALL PRIVILEGES ON `{}`.`{t}` TO '{user}'@'%'",
            db.name
        ))
        .unwrap();
    }
    let url = db
        .url()
        .replacen("mysql://root@", &format!("mysql://{user}:{PASSWORD}@"), 1);
    assert_ne!(
        url,
        db.url(),
        "the tests' MySQL URL names root: {}",
        db.url()
    );
    let log = dir.path().join("worker.log");
    let mut child = seckill_tests::command("seckill-worker")
        .env("SECKILL_REDIS_URL", redis.url())
        .env("SECKILL_MYSQL_URL", &url)
        .env("SECKILL_WORKER_ID", "w-grants")
        .env(
            "SECKILL_WORKER_METRICS_LISTEN",
            format!("127.0.0.1:{}", free_port()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let err = std::fs::read_to_string(&log).unwrap_or_default();
    root.query_drop(format!("DROP USER IF EXISTS '{user}'@'%'"))
        .unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{err}");
    assert!(err.contains("ERROR 1142"), "{err}");
    assert!(err.contains("schema_migrations"), "{err}");
    assert!(err.contains("(SECKILL_MYSQL_URL)"), "{err}");
    assert!(
        err.contains("GRANT ALL PRIVILEGES ON database.* TO the user"),
        "{err}"
    );
    assert!(!err.contains(PASSWORD), "{err}");
}

#[test]
fn a_mysql_timeout_below_the_session_limits_stops_the_worker_naming_both_variables() {
    let out = seckill_tests::command("seckill-worker")
        .env("SECKILL_MYSQL_TIMEOUT", "5s")
        .env("SECKILL_WORKER_HEARTBEAT_TTL", "20s")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("SECKILL_MYSQL_TIMEOUT=\"5s\": expected at least 10s")
            && err.contains("SECKILL_WORKER_HEARTBEAT_TTL=20s"),
        "{err}"
    );
}
