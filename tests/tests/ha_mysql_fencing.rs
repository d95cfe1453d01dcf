//! Fencing a MySQL failover: a primary and a GTID replica started by the
//! test (`seckill_tests::mariadb`), `SECKILL_MYSQL_URL` naming both, the
//! old primary listed first. After the runbook's promotion (which raises
//! `primary_generation`), the old primary restarted writable with its own
//! config is never read by `run` nor written by a restarted worker or
//! `migrate` (`mysql_writable.rs`); two writable servers at one generation
//! are refused, both named. A primary that hangs (SIGSTOP: TCP connects,
//! no handshake) costs one timeout, named and said as one, then is skipped
//! while the worker drains into the promoted replica. `migrate` on a fresh
//! pair creates the database on the primary.

use crate::support::mysql_pair::{count, Worker};
use crate::support::worker as worker_support;

use seckill_tests::mariadb::MariaDb;
use seckill_tests::{create_sale, RedisServer, TempDir};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use worker_support::reserve_users;

fn wait_count(server: &MariaDb, db: &str, sql: &str, n: i64) {
    seckill_tests::wait_until(Duration::from_secs(60), &format!("{sql} = {n}"), || {
        count(server, db, sql) == n
    });
}

/// The runbook's promotion (docs/OPERATIONS.md, "A MySQL failover"): stop
/// replicating, raise the generation, then writable.
fn promote(replica: &MariaDb, db: &str) {
    replica.exec(&format!(
        "STOP SLAVE; RESET SLAVE ALL; \
         UPDATE `{db}`.primary_generation SET generation = generation + 1, \
         promoted_at = UTC_TIMESTAMP(3) WHERE id = 1; \
         SET GLOBAL read_only = 0"
    ));
}

/// `seckill-reconciler ARGS` with `SECKILL_MYSQL_URL` = `url`: exit code
/// and stdout + stderr.
fn reconciler(redis: &RedisServer, url: &str, review: &Path, args: &[&str]) -> (i32, String) {
    let out = seckill_tests::command("seckill-reconciler")
        .env("SECKILL_REDIS_URL", redis.url())
        .env("SECKILL_MYSQL_URL", url)
        .env("SECKILL_REVIEW_DB", review)
        .env("SECKILL_RECONCILE_GRACE", "0s")
        .env("SECKILL_MYSQL_TIMEOUT", "2s")
        .env(
            "SECKILL_RECONCILER_METRICS_FILE",
            review.with_extension("prom"),
        )
        .args(args)
        .output()
        .expect("run seckill-reconciler");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// A pair, a migrated database on it (the replica read-only), a Redis, a
/// sale of `stock`, the two-server URL (old primary first).
struct Pair {
    primary: MariaDb,
    replica: MariaDb,
    name: String,
    redis: RedisServer,
    dir: TempDir,
    sale: u64,
    both: String,
    orders: String,
    _db: seckill_tests::TestDb,
}

impl Pair {
    fn new(stock: u64) -> Pair {
        let (primary, replica) = MariaDb::primary_and_replica();
        replica.exec("SET GLOBAL read_only = 1");
        let db = primary.test_db();
        let name = db.name.clone();
        let redis = RedisServer::start();
        let sale = create_sale(&db, &redis, stock, -1000, 3_600_000);
        let both = format!(
            "mysql://root@127.0.0.1:{},127.0.0.1:{}/{name}",
            primary.port, replica.port
        );
        Pair {
            primary,
            replica,
            name,
            redis,
            dir: TempDir::new(),
            sale,
            both,
            orders: format!("SELECT COUNT(*) FROM orders WHERE sale_id = {sale}"),
            _db: db,
        }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    fn run(&self) -> (i32, String) {
        reconciler(
            &self.redis,
            &self.both,
            &self.path("review.sqlite3"),
            &["run"],
        )
    }

    /// The last run's `seckill_reconciler_mysql_refused_writable_servers`.
    fn refused(&self) -> String {
        let prom = std::fs::read_to_string(self.path("review.prom")).unwrap_or_default();
        prom.lines()
            .find_map(|l| l.strip_prefix("seckill_reconciler_mysql_refused_writable_servers "))
            .unwrap_or_default()
            .to_string()
    }

    fn findings(&self) -> usize {
        let (code, listed) = reconciler(
            &self.redis,
            &self.both,
            &self.path("review.sqlite3"),
            &["findings", "--state", "all", "--json"],
        );
        assert_eq!(code, 0, "{listed}");
        let start = listed.find('[').unwrap_or(0);
        let v: Vec<serde_json::Value> =
            serde_json::from_str(&listed[start..]).expect("findings JSON");
        v.len()
    }
}

#[test]
fn an_old_primary_back_writable_is_never_read_nor_written() {
    let mut p = Pair::new(1_000);
    let w = Worker::start(&p.redis, &p.both, "2s", &p.path("w1.log"));
    reserve_users(&p.redis, p.sale, "a", 100);
    wait_count(&p.primary, &p.name, &p.orders, 100);
    wait_count(&p.replica, &p.name, &p.orders, 100);

    p.primary.kill();
    promote(&p.replica, &p.name);
    reserve_users(&p.redis, p.sale, "b", 100);
    wait_count(&p.replica, &p.name, &p.orders, 200);

    // A reboot with its own config: back, writable, listed first.
    p.primary.restart();
    assert_eq!(count(&p.primary, &p.name, "SELECT @@read_only"), 0);
    assert_eq!(count(&p.primary, &p.name, &p.orders), 100);

    let (code, out) = p.run();
    println!("{out}");
    assert_eq!(code, 0, "{out}");
    assert_eq!(p.findings(), 0, "no false finding");
    assert_eq!(p.refused(), "1.0", "paged");
    let old = format!("127.0.0.1:{}", p.primary.port);
    assert!(
        out.lines().any(|l| l.contains(&old)
            && l.contains("is writable at primary generation 1, older than")
            && l.contains("'s 2: an old primary back writable, refused")),
        "{out}"
    );

    // A restarted worker, and a sale: every order on the promoted primary.
    drop(w);
    let _w = Worker::start(&p.redis, &p.both, "2s", &p.path("w2.log"));
    reserve_users(&p.redis, p.sale, "c", 100);
    wait_count(&p.replica, &p.name, &p.orders, 300);
    worker_support::wait_drained(&p.redis, p.sale, Duration::from_secs(30));
    assert_eq!(
        count(&p.primary, &p.name, &p.orders),
        100,
        "none on the old"
    );
    let (code, out) = reconciler(&p.redis, &p.both, &p.path("m.sqlite3"), &["migrate"]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = p.run();
    assert_eq!(code, 0, "{out}");
    assert_eq!(p.findings(), 0);

    // Two writable at one generation (a promotion that did not raise it):
    // both refused, both named; nothing recorded.
    p.primary.exec(&format!(
        "UPDATE `{}`.primary_generation SET generation = 2",
        p.name
    ));
    let (code, out) = p.run();
    println!("{out}");
    assert_eq!(code, 2, "{out}");
    assert_eq!(p.refused(), "2.0", "both refused");
    let new = format!("127.0.0.1:{}", p.replica.port);
    assert!(
        out.contains("two writable servers in SECKILL_MYSQL_URL at the same primary generation 2")
            && out.contains(&old)
            && out.contains(&new),
        "{out}"
    );
    assert_eq!(count(&p.primary, &p.name, &p.orders), 100);
}

#[test]
fn a_hung_primary_costs_one_timeout_named_then_is_skipped() {
    let p = Pair::new(1_000);
    let log = p.path("w1.log");
    let _w = Worker::start(&p.redis, &p.both, "3s", &log);
    reserve_users(&p.redis, p.sale, "a", 100);
    wait_count(&p.primary, &p.name, &p.orders, 100);
    wait_count(&p.replica, &p.name, &p.orders, 100);

    // Hung: TCP connects, no handshake ever comes.
    p.primary.signal("STOP");
    reserve_users(&p.redis, p.sale, "b", 200);
    let text = |l: &Path| std::fs::read_to_string(l).unwrap_or_default();
    let old = format!("127.0.0.1:{}", p.primary.port);
    seckill_tests::wait_until(
        Duration::from_secs(60),
        "the worker to report the hung server",
        || {
            text(&log)
                .lines()
                .any(|l| l.contains(&old) && l.contains("timeout: no answer within 3s"))
        },
    );
    let said = text(&log);
    let connect = said
        .lines()
        .find(|l| l.contains("timeout: no answer within 3s"))
        .unwrap_or_default();
    println!("worker's reconnect: {connect}");
    promote(&p.replica, &p.name);
    let promoted = Instant::now();
    wait_count(&p.replica, &p.name, &p.orders, 300);
    println!(
        "hung primary: 200 queued orders on the promoted replica {} ms after the promotion",
        promoted.elapsed().as_millis()
    );
    worker_support::wait_drained(&p.redis, p.sale, Duration::from_secs(30));
    let said = text(&log);
    let line = said
        .lines()
        .find(|l| l.contains(&old) && l.contains("timeout"))
        .unwrap_or_default();
    println!("worker: {line}");
    assert!(line.contains("SECKILL_MYSQL_TIMEOUT"), "{said}");

    // A run while it hangs: one timeout, then the promoted primary.
    let started = Instant::now();
    let (code, out) = p.run();
    println!(
        "run with a hung server listed: {} ms\n{out}",
        started.elapsed().as_millis()
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(p.findings(), 0);
    assert_eq!(count(&p.replica, &p.name, &p.orders), 300);
    p.primary.signal("CONT");
}

#[test]
fn migrate_on_a_fresh_pair_creates_the_database_on_the_primary() {
    let (primary, replica) = MariaDb::primary_and_replica();
    replica.exec("SET GLOBAL read_only = 1");
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let name = format!("fresh_{}", seckill_tests::free_port());
    let both = format!(
        "mysql://root@127.0.0.1:{},127.0.0.1:{}/{name}",
        primary.port, replica.port
    );
    let review = dir.path().join("review.sqlite3");
    let (code, out) = reconciler(&redis, &both, &review, &["migrate"]);
    println!("{out}");
    assert_eq!(code, 0, "{out}");
    let applied = seckill_common::schema::MIGRATIONS.len() as i64;
    let versions = "SELECT COUNT(*) FROM schema_migrations";
    assert_eq!(count(&primary, &name, versions), applied);
    wait_count(&replica, &name, versions, applied);
    assert_eq!(
        count(&primary, &name, "SELECT generation FROM primary_generation"),
        1
    );
    let (code, out) = reconciler(&redis, &both, &review, &["migrate"]);
    assert_eq!(code, 0, "{out}");
}
