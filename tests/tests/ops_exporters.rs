//! Runs the shipped watch on Redis and MySQL themselves: promtool checks
//! `ops/prometheus/stores.rules.yml` and passes its unit tests
//! (`ops/prometheus/tests/stores/*.yml`, one per alert, each alert also in
//! docs/OPERATIONS.md); then the real exporters of Debian's
//! `prometheus-redis-exporter` and `prometheus-mysqld-exporter` watch a
//! private Redis Sentinel set (master, replica, three Sentinels) and a
//! private MariaDB primary and replica, scraped by a private Prometheus on
//! the stores' part of `ops/prometheus/prometheus.yml` (targets, intervals
//! and the rule file's path replaced, 1 s intervals) with the shipped
//! rules. The MySQL exporters log in with the least-privilege account
//! docs/OPERATIONS.md creates. While healthy every rule evaluates, nothing
//! is pending and every query of the dashboard's Redis and MySQL rows
//! returns data; then Redis filled to 90 % of a small `maxmemory`, an
//! eviction policy on the replica and the MariaDB replica's SQL thread
//! stopped fire exactly their three alerts, pending first and firing
//! within their `for` (1 min) plus a margin.

use crate::support::ops::{
    dashboard_panels, panel_exprs, prometheus_dir, promtool, replace_once, repo_file,
};
use crate::support::prometheus::Prometheus;
use mysql::prelude::Queryable;
use seckill_tests::cluster::TestRedis;
use seckill_tests::mariadb::MariaDb;
use seckill_tests::sentinel::SentinelSet;
use seckill_tests::{create_sale, dies_with_test, free_port, wait_until, TempDir};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(60);

/// The `for` of the three alerts the test fires.
const FOR: Duration = Duration::from_secs(60);

/// The exporter's MySQL account, as docs/OPERATIONS.md creates it.
const EXPORTER_GRANTS: &str = "CREATE USER 'exporter'@'127.0.0.1' IDENTIFIED BY 'exporter-secret' \
     WITH MAX_USER_CONNECTIONS 3; \
     GRANT PROCESS, REPLICATION CLIENT, SLAVE MONITOR ON *.* TO 'exporter'@'127.0.0.1'";

/// The alert names of `stores.rules.yml`, in file order.
fn store_alerts() -> Vec<String> {
    let rules = std::fs::read_to_string(prometheus_dir().join("stores.rules.yml"))
        .expect("read stores.rules.yml");
    rules
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("- alert: "))
        .map(str::to_string)
        .collect()
}

#[test]
fn promtool_checks_the_store_rules_and_passes_a_test_per_alert_each_in_the_runbook() {
    let (code, said) = promtool(&["check", "rules", "stores.rules.yml"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("SUCCESS: 9 rules found"), "{said}");
    let alerts = store_alerts();
    assert_eq!(alerts.len(), 9, "{alerts:?}");
    let dir = prometheus_dir().join("tests/stores");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".yml"))
        .map(|n| format!("tests/stores/{n}"))
        .collect();
    files.sort();
    assert_eq!(files.len(), alerts.len(), "{files:?}");
    // Each file tests the alert it is named after.
    for f in &files {
        let text = std::fs::read_to_string(prometheus_dir().join(f)).expect("read a test file");
        assert!(
            alerts
                .iter()
                .any(|a| text.contains(&format!("alertname: {a}\n"))),
            "{f} tests none of {alerts:?}"
        );
    }
    let mut args = vec!["test", "rules"];
    args.extend(files.iter().map(String::as_str));
    let (code, said) = promtool(&args);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(said.matches("SUCCESS").count(), alerts.len(), "{said}");
    let ops = std::fs::read_to_string(repo_file("docs/OPERATIONS.md")).expect("OPERATIONS.md");
    for a in &alerts {
        assert!(
            ops.contains(&format!("\n#### {a}\n")),
            "{a} has no runbook entry"
        );
    }
}

/// A child process killed and reaped on drop.
struct KillOnDrop(Child);

impl KillOnDrop {
    /// Spawns `cmd` (stdout and stderr to `log`) and waits until `port`
    /// answers `/metrics` with 200.
    fn spawn(mut cmd: Command, name: &'static str, port: u16, log: &Path) -> KillOnDrop {
        let err = std::fs::File::create(log).expect("exporter log");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run {name} ({e}): install Debian's package `{name}` \
                     (./scripts/test.sh does this when it is missing)"
                )
            });
        let mut k = KillOnDrop(child);
        wait_until(LONG, &format!("{name} on {port}"), || {
            assert!(
                k.0.try_wait().expect("try_wait").is_none(),
                "{name} exited: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
            matches!(
                crate::support::ops::http_get(port, "/metrics"),
                Some((200, _))
            )
        });
        k
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// prometheus-redis-exporter as docs/OPERATIONS.md runs it (no Redis of
/// its own: /scrape?target=…, the sales' keys checked); (port, process).
fn redis_exporter(dir: &TempDir) -> (u16, KillOnDrop) {
    let port = free_port();
    let mut cmd = dies_with_test("prometheus-redis-exporter");
    cmd.arg("-redis.addr=")
        .arg("-check-keys=seckill:{sale:*")
        .arg(format!("-web.listen-address=127.0.0.1:{port}"));
    let log = dir.path().join("redis_exporter.log");
    let k = KillOnDrop::spawn(cmd, "prometheus-redis-exporter", port, &log);
    (port, k)
}

/// prometheus-mysqld-exporter for the server `db`, logging in with the
/// exporter's account through a my.cnf file; (port, process).
fn mysqld_exporter(dir: &TempDir, db: &MariaDb) -> (u16, KillOnDrop) {
    let cnf = dir.path().join(format!("exporter-{}.cnf", db.port));
    std::fs::write(
        &cnf,
        format!(
            "[client]\nuser=exporter\npassword=exporter-secret\nhost=127.0.0.1\nport={}\n",
            db.port
        ),
    )
    .expect("write my.cnf");
    let port = free_port();
    let mut cmd = dies_with_test("prometheus-mysqld-exporter");
    cmd.arg(format!("--config.my-cnf={}", cnf.display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"));
    let log = dir.path().join(format!("mysqld_exporter-{}.log", db.port));
    let k = KillOnDrop::spawn(cmd, "prometheus-mysqld-exporter", port, &log);
    (port, k)
}

/// The stores' part of the shipped `prometheus.yml` with the test's
/// targets: Redis `redis` (master, replica), Sentinels `sentinels`, the
/// Redis exporter on `redis_exporter`, MySQL exporters on `mysql`.
fn prometheus_conf(
    redis: [u16; 2],
    sentinels: &[u16],
    redis_exporter: u16,
    mysql: [u16; 2],
) -> String {
    let shipped = std::fs::read_to_string(repo_file("ops/prometheus/prometheus.yml"))
        .expect("read ops/prometheus/prometheus.yml");
    let (head, stores) = crate::support::ops::split_store_jobs(&shipped);
    // Global settings and rule files, without the services' jobs.
    let at = head.find("scrape_configs:\n").expect("scrape_configs") + "scrape_configs:\n".len();
    let mut conf = format!("{}{}", &head[..at], stores);
    conf = replace_once(&conf, "scrape_interval: 15s", "scrape_interval: 1s");
    conf = replace_once(&conf, "evaluation_interval: 15s", "evaluation_interval: 1s");
    conf = replace_once(&conf, "  - /etc/prometheus/seckill.rules.yml\n", "");
    let rules = repo_file("ops/prometheus/stores.rules.yml");
    conf = replace_once(
        &conf,
        "/etc/prometheus/stores.rules.yml",
        &rules.display().to_string(),
    );
    let list = |addrs: Vec<String>| format!("[{}]", addrs.join(", "));
    let redis_urls = |ports: &[u16]| {
        list(
            ports
                .iter()
                .map(|p| format!("'redis://127.0.0.1:{p}'"))
                .collect(),
        )
    };
    conf = replace_once(
        &conf,
        "['redis://10.0.0.11:6379', 'redis://10.0.0.12:6379']",
        &redis_urls(&redis),
    );
    conf = replace_once(
        &conf,
        "['redis://10.0.0.31:7000', 'redis://10.0.0.32:7001', 'redis://10.0.0.33:7002']",
        "[]",
    );
    conf = replace_once(
        &conf,
        "['redis://10.0.0.1:26379', 'redis://10.0.0.2:26379', 'redis://10.0.0.3:26379']",
        &redis_urls(sentinels),
    );
    conf = replace_once(
        &conf,
        "'127.0.0.1:9121'",
        &format!("'127.0.0.1:{redis_exporter}'"),
    );
    replace_once(
        &conf,
        "['10.0.0.21:9104', '10.0.0.22:9104']",
        &list(mysql.iter().map(|p| format!("'127.0.0.1:{p}'")).collect()),
    )
}

/// The Sentinels' ports, from the set's `redis+sentinel://` URL.
fn sentinel_ports(set: &SentinelSet) -> Vec<u16> {
    let url = set.url();
    let hosts = url
        .trim_start_matches("redis+sentinel://")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_string();
    hosts
        .split(',')
        .filter_map(|h| h.rsplit(':').next()?.parse().ok())
        .collect()
}

/// `INFO memory`'s `used_memory` of `con`.
fn used_memory(con: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query(con)
        .expect("INFO memory");
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory in INFO memory")
}

/// Sets `maxmemory` to used memory plus 2 MiB and writes 4 KiB values
/// until Redis uses 90 % of it; returns (used, maxmemory).
fn fill_to_90_percent(con: &mut redis::Connection) -> (u64, u64) {
    let max = used_memory(con) + 2 * 1024 * 1024;
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(max)
        .exec(con)
        .expect("CONFIG SET maxmemory");
    let value = vec![b'x'; 4096];
    let mut i = 0u32;
    while used_memory(con) * 10 < max * 9 {
        redis::cmd("SET")
            .arg(format!("filler:{i}"))
            .arg(&value)
            .exec(con)
            .expect("SET below maxmemory");
        i += 1;
    }
    (used_memory(con), max)
}

/// Waits until every target is up, every rule evaluates, nothing is
/// pending and every query of the dashboard's stores' rows has data.
fn assert_healthy(p: &Prometheus, targets: usize) {
    wait_until(LONG, "every target up", || {
        let up = p.query("up");
        up.len() == targets && up.iter().all(|s| s["value"][1] == "1")
    });
    let (_services, stores) = dashboard_panels();
    let rows: Vec<&str> = stores
        .iter()
        .filter(|x| x["type"] == "row")
        .filter_map(|x| x["title"].as_str())
        .collect();
    assert_eq!(
        rows,
        [
            "Redis (prometheus-redis-exporter)",
            "MySQL (prometheus-mysqld-exporter)"
        ]
    );
    let exprs = panel_exprs(&stores);
    assert_eq!((stores.len(), exprs.len()), (12, 22));
    for e in &exprs {
        wait_until(LONG, &format!("data for {e}"), || !p.query(e).is_empty());
    }
    wait_until(LONG, "every rule evaluated", || {
        let rules = p.rules();
        rules.len() == 9 && rules.iter().all(|r| r["health"] == "ok")
    });
    // The exporters' own view: each MySQL collector ran with the account's
    // privileges, and no Redis scrape failed.
    for e in [
        "mysql_exporter_last_scrape_error",
        "redis_exporter_last_scrape_error",
    ] {
        let r = p.query(e);
        assert!(
            !r.is_empty() && r.iter().all(|s| s["value"][1] == "0"),
            "{e}: {r:?}"
        );
    }
    wait_until(LONG, "no alert while healthy", || {
        p.alerts_by("instance").is_empty()
    });
}

#[test]
fn the_real_exporters_fire_the_memory_policy_and_replica_alerts_within_their_for() {
    let set = SentinelSet::start();
    let (primary, replica) = MariaDb::primary_and_replica();
    let db = primary.test_db();
    let sale = create_sale(&db, &set.master, 100, -1000, 600_000);
    assert!(sale > 0);
    primary
        .conn()
        .query_drop(EXPORTER_GRANTS)
        .expect("the exporter's account");
    wait_until(LONG, "the account on the replica", || {
        let n: Option<i64> = replica
            .conn()
            .query_first("SELECT COUNT(*) FROM mysql.user WHERE user = 'exporter'")
            .expect("count accounts");
        n == Some(1)
    });
    let dir = TempDir::new();
    let (rport, _rx) = redis_exporter(&dir);
    let (mport1, _mx1) = mysqld_exporter(&dir, &primary);
    let (mport2, _mx2) = mysqld_exporter(&dir, &replica);
    let sentinels = sentinel_ports(&set);
    assert_eq!(sentinels.len(), 3);
    let conf = prometheus_conf(
        [set.master.port, set.replica.port],
        &sentinels,
        rport,
        [mport1, mport2],
    );
    let p = Prometheus::start(&conf);
    assert_healthy(&p, 7);

    // Redis at 90 % of maxmemory, the replica on allkeys-lru, the MariaDB
    // replica's SQL thread stopped.
    let (used, max) = fill_to_90_percent(&mut set.master.con());
    assert!(used * 10 >= max * 9 && used < max, "{used} of {max}");
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .exec(&mut set.replica.con())
        .expect("CONFIG SET maxmemory-policy");
    replica.exec("STOP SLAVE SQL_THREAD");
    let started = Instant::now();
    let redis_at = |port: u16| format!("127.0.0.1:{port}");
    let want = |state: &str| {
        let mut v = vec![
            (
                "SeckillMySQLReplicaStopped".to_string(),
                state.to_string(),
                redis_at(mport2),
            ),
            (
                "SeckillRedisEvictionPolicy".to_string(),
                state.to_string(),
                redis_at(set.replica.port),
            ),
            (
                "SeckillRedisMemoryHigh".to_string(),
                state.to_string(),
                redis_at(set.master.port),
            ),
        ];
        v.sort();
        v
    };
    wait_until(LONG, "the three alerts pending", || {
        p.alerts_by("instance") == want("pending")
    });
    let deadline = FOR + Duration::from_secs(45);
    wait_until(deadline, "the three alerts firing", || {
        p.alerts_by("instance") == want("firing")
    });
    let took = started.elapsed();
    assert!(took >= FOR, "fired after {took:?}, before their for");
    eprintln!("the three alerts fired {took:?} after their conditions began");
    for a in p.api("alerts")["alerts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        eprintln!(
            "{} {}: {}",
            a["labels"]["alertname"], a["labels"]["severity"], a["annotations"]["summary"]
        );
    }
    let stopped = p.query("mysql_slave_status_slave_sql_running == 0");
    assert_eq!(stopped.len(), 1, "{stopped:?}");
}
