//! Specifies the Debian package of `scripts/package.sh` on this machine, as
//! an operator uses it (docs/OPERATIONS.md, "Install the package",
//! "Upgrading"): installed with apt-get, its units verified by
//! `systemd-analyze verify` where it put them, a service started on the
//! shipped env file naming what to set; its binaries started from /usr/bin
//! with the installed env file and unit environment (plus the test's Redis,
//! database and ports) sell a sale across an upgrade to version N+1 in the
//! middle of it (orders = reservations, nothing dead-lettered, the edited
//! env file kept); removal keeps /etc/seckill and the review file, purge
//! removes what the package made and nothing else. And lintian on it.
//!
//! Needs root, dpkg and apt-get (CI runs as root; no systemd as PID 1, so
//! the maintainer scripts' systemctl steps are skipped as they are in any
//! container) and cargo-deb (scripts/test.sh installs it). The package is
//! purged at the end, also on failure (`support::package::Machine`).

use crate::support::gateway::Client;
use crate::support::lifecycle_http::{self, PRICE};
use crate::support::package::{self as pkg, Machine, ENV_FILE, STATE_DIR, WORKER_ENV};
use crate::support::worker;
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_tests::{free_port, RedisServer, TempDir, TestDb};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// The sale: its stock, the buyers before the upgrade with the worker
/// running, those queued while no worker runs, and after the upgrade.
const STOCK: usize = 30;
const BEFORE: usize = 10;
const QUEUED: usize = 5;

#[test]
fn the_package_installs_sells_through_an_upgrade_then_removes_and_purges() {
    let started = Instant::now();
    let (v1, v2) = pkg::debs();
    let built = started.elapsed();
    let machine = Machine::claim();
    pkg::apt_ok(&["install", v1.to_str().unwrap()]);
    assert_installed(&pkg::version(1));
    verify_installed_units();
    let world = World::new();
    an_unconfigured_worker_names_the_variable_and_the_file(&world);
    machine.operator_file(
        WORKER_ENV,
        &format!("SECKILL_WORKER_METRICS_LISTEN=127.0.0.1:{}\n", free_port()),
    );
    std::fs::create_dir(STATE_DIR).unwrap();
    machine.operator_file(&format!("{STATE_DIR}/mark"), "");
    let edited = world.sell_across_the_upgrade(v2);
    remove_then_purge(&edited);
    eprintln!(
        "ops_package: packages ready after {:.1} s, the whole test {:.1} s",
        built.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn lintian_reports_nothing_the_package_does_not_override_with_its_reason() {
    let (v1, _) = pkg::debs();
    let out = std::process::Command::new("lintian")
        .args([
            "--fail-on",
            "error,warning,info,pedantic",
            "--info",
            "--pedantic",
        ])
        .arg(v1)
        .output()
        .expect("lintian (Debian package lintian; scripts/test.sh installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.trim().is_empty(),
        "lintian: {}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// dpkg's record of the installed package: the version, the conffile, the
/// paths and modes the package promises.
fn assert_installed(version: &str) {
    assert_eq!(
        pkg::status(),
        Some(("install ok installed".into(), version.to_string()))
    );
    let conffiles = std::process::Command::new("dpkg-query")
        .args(["-W", "-f", "${Conffiles}", pkg::PACKAGE])
        .output()
        .unwrap();
    let conffiles = String::from_utf8_lossy(&conffiles.stdout);
    let listed: Vec<&str> = conffiles
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(listed, [ENV_FILE], "{conffiles}");
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &str| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    for b in ["seckill-gateway", "seckill-worker", "seckill-reconciler"] {
        assert_eq!(mode(&format!("/usr/bin/{b}")), 0o755, "{b}");
    }
    assert_eq!(mode(ENV_FILE), 0o640);
    assert_eq!(mode("/etc/seckill"), 0o755);
    assert_eq!(mode("/usr/share/seckill/nginx/nginx-crowd.sh"), 0o755);
    for f in [
        "/usr/share/seckill/nginx/seckill.conf",
        "/usr/share/seckill/nginx/nginx.service.d/seckill.conf",
        "/usr/share/seckill/prometheus/seckill.rules.yml",
        "/usr/share/seckill/prometheus/prometheus.yml",
        "/usr/share/seckill/prometheus/tests/dead_letters.yml",
        "/usr/share/seckill/grafana/seckill.json",
        "/usr/share/doc/seckill/README.md",
        "/usr/share/doc/seckill/docs/OPERATIONS.md",
        "/usr/share/doc/seckill/copyright",
    ] {
        assert!(Path::new(f).is_file(), "{f} missing");
    }
    let shipped = std::fs::read_to_string(crate::support::ops::repo_file("systemd/seckill.env"));
    assert_eq!(
        std::fs::read_to_string(ENV_FILE).ok(),
        shipped.ok(),
        "one source"
    );
    let env = pkg::env_file(&std::fs::read_to_string(ENV_FILE).unwrap());
    for (k, v) in &env {
        assert!(
            k != "SECKILL_PAYMENT_SECRET" && !v.contains(":change-me@"),
            "no secret shipped: {k}={v}"
        );
    }
}

/// `systemd-analyze verify` on each unit at its installed path: the
/// binaries it names exist there, no warning.
fn verify_installed_units() {
    for unit in [
        "seckill-gateway.service",
        "seckill-worker@w1.service",
        "seckill-reconciler.service",
        "seckill-reconciler.timer",
    ] {
        let file = unit.replace("@w1.", "@.");
        let text = std::fs::read_to_string(format!("/lib/systemd/system/{file}")).unwrap();
        let exec: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("ExecStart="))
            .collect();
        assert!(
            exec.iter()
                .all(|l| l.starts_with("ExecStart=/usr/bin/seckill-")),
            "{unit}: {exec:?}"
        );
        let out = std::process::Command::new("systemd-analyze")
            .args(["verify", &format!("/lib/systemd/system/{unit}")])
            .output()
            .expect("systemd-analyze (Debian package systemd)");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && err.trim().is_empty(),
            "{unit}: {err}"
        );
    }
}

/// The test's own servers and files: a private Redis, a database the
/// installed `migrate` creates, the buyer-token key file.
struct World {
    redis: RedisServer,
    db: TestDb,
    _db_guard: TestDb,
    tmp: TempDir,
}

impl World {
    fn new() -> World {
        let guard = TestDb::create();
        // Dropped with the world; created by the installed `migrate`.
        let db = guard.sibling("_pkg");
        World {
            redis: RedisServer::start(),
            db,
            _db_guard: guard,
            tmp: TempDir::new(),
        }
    }

    /// What the test puts over the installed environment: its servers,
    /// free ports, its key file and a metrics file of its own.
    fn overrides(&self) -> Vec<(String, String)> {
        [
            ("SECKILL_REDIS_URL", self.redis.url()),
            ("SECKILL_MYSQL_URL", self.db.url()),
            (
                "SECKILL_AUTH_KEYS",
                seckill_tests::auth::gateway_key_file()
                    .display()
                    .to_string(),
            ),
            (
                "SECKILL_RECONCILER_METRICS_FILE",
                self.tmp
                    .path()
                    .join("reconciler.prom")
                    .display()
                    .to_string(),
            ),
            ("SECKILL_RECONCILE_GRACE", "0s".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// The environment `unit` (instance `w1` for the worker) gives its
    /// service, then the test's overrides.
    fn env(&self, unit: &str) -> Vec<(String, String)> {
        let mut env = pkg::unit_env(unit, "w1");
        env.extend(self.overrides());
        env
    }

    /// `seckill-reconciler ARGS` from /usr/bin as the reconciler unit runs.
    fn reconciler(&self, args: &[&str]) -> (i32, String) {
        let out = pkg::installed(
            "seckill-reconciler",
            &self.env("seckill-reconciler.service"),
        )
        .args(args)
        .output()
        .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code().unwrap_or(-1), text)
    }

    fn gateway(&self, port: u16) -> Child {
        let mut env = self.env("seckill-gateway.service");
        env.push(("SECKILL_LISTEN".into(), format!("127.0.0.1:{port}")));
        let child = pkg::installed("seckill-gateway", &env)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        pkg::wait_ready(port);
        child
    }

    fn worker(&self) -> Child {
        pkg::installed("seckill-worker", &self.env("seckill-worker@.service"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }
}

/// The shipped env file as it is (the test's Redis only): MySQL refuses
/// the user without a password, and the worker says where to set it.
fn an_unconfigured_worker_names_the_variable_and_the_file(world: &World) {
    let mut env = pkg::unit_env("seckill-worker@.service", "w1");
    let url = env
        .iter()
        .find(|(k, _)| k == "SECKILL_MYSQL_URL")
        .unwrap()
        .1
        .clone();
    let server = std::env::var("SECKILL_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/".into());
    let host = server.rsplit('@').next().unwrap().trim_end_matches('/');
    // The shipped user and database on the test's server.
    let url = url.replacen("127.0.0.1:3306", host, 1);
    env.push(("SECKILL_MYSQL_URL".into(), url));
    env.push(("SECKILL_REDIS_URL".into(), world.redis.url()));
    env.push((
        "SECKILL_WORKER_METRICS_LISTEN".into(),
        format!("127.0.0.1:{}", free_port()),
    ));
    let out = pkg::installed("seckill-worker", &env).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("SECKILL_MYSQL_URL gives no password") && err.contains(ENV_FILE),
        "{err}"
    );
}

/// SIGTERM to `child`; its exit code and standard error (`None` code: it
/// outlived 30 s and was killed).
fn stop(mut child: Child) -> (Option<i32>, String) {
    crate::support::gateway::signal(child.id(), "TERM");
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Buys one unit for each of `users` through the gateway on `port`;
/// returns the statuses.
fn buy(port: u16, sale: u64, users: std::ops::Range<usize>) -> Vec<u16> {
    let mut c = Client::connect(port);
    users
        .map(|i| c.buy(sale, &format!("pkg-{i}")).status)
        .collect()
}

/// The reservation id `user`'s purchase of `sale` was answered with (its
/// second click is answered 409 with it).
fn reservation_of(port: u16, sale: u64, user: &str) -> String {
    let r = Client::connect(port).buy(sale, user);
    assert_eq!(r.status, 409, "{r:?}");
    let id = r.json()["reservation_id"].as_str().map(str::to_string);
    id.expect("a reservation id")
}

/// The sale's books at the end: every reservation one order of one unit
/// (`paid` paid, the others awaiting payment), one ledger row each, MySQL
/// stock 0; no order message or payment queued, in flight or
/// dead-lettered.
fn assert_books(world: &World, sale: u64, paid: &str) {
    let n = |sql: &str| world.db.count(&format!("{sql} WHERE sale_id = {sale}"));
    assert_eq!(n("SELECT COUNT(*) FROM orders"), STOCK as i64);
    assert_eq!(n("SELECT SUM(quantity) FROM orders"), STOCK as i64);
    assert_eq!(n("SELECT COUNT(*) FROM stock_ledger"), STOCK as i64);
    let paid_rows = world.db.count(&format!(
        "SELECT COUNT(*) FROM orders WHERE sale_id = {sale} AND status = 'paid' \
         AND reservation_id = '{paid}'"
    ));
    assert_eq!(paid_rows, 1);
    let available = format!("SELECT available_stock FROM sales WHERE id = {sale}");
    assert_eq!(world.db.count(&available), 0);
    let flow: usize = world.redis.con().hlen(SaleKeys::new(sale).flow()).unwrap();
    assert_eq!(flow, STOCK, "reservations in Redis");
    worker::wait_drained(&world.redis, sale, Duration::from_secs(30));
    assert!(worker::dead_letters(&world.redis, sale).is_empty());
    let mut con = world.redis.con();
    let payments: (usize, usize) = (
        con.llen(seckill_common::payment::QUEUE).unwrap(),
        con.llen(seckill_common::payment::DEAD_LETTERS).unwrap(),
    );
    assert_eq!(payments, (0, 0), "payments queued, dead-lettered");
}

impl World {
    /// The sale across the upgrade; returns the env file as the operator
    /// left it (a payment secret set), which the upgrade must keep.
    fn sell_across_the_upgrade(&self, v2: &Path) -> String {
        let (code, out) = self.reconciler(&["migrate"]);
        assert_eq!(code, 0, "{out}");
        let stock = STOCK.to_string();
        let (code, out) = self.reconciler(&[
            "sale",
            "create",
            "--sku",
            "PKG-1",
            "--stock",
            &stock,
            "--starts-at",
            "now",
            "--ends-at",
            "now+1h",
            "--price-cents",
            "1999",
            "--payment-window",
            "1h",
        ]);
        assert_eq!(code, 0, "{out}");
        let sale: u64 = out
            .lines()
            .find_map(|l| l.trim().parse().ok())
            .expect("sale id");
        let port = free_port();
        let gateway = self.gateway(port);
        let w1 = self.worker();
        assert_eq!(buy(port, sale, 0..BEFORE), vec![202; BEFORE]);
        worker::wait_orders(&self.db, sale, BEFORE as i64, Duration::from_secs(30));
        assert_eq!(stop(w1).0, Some(0));
        // No worker: these wait in the queue across the upgrade.
        assert_eq!(buy(port, sale, BEFORE..BEFORE + QUEUED), vec![202; QUEUED]);
        let queued: usize = self.redis.con().llen(SaleKeys::new(sale).queue()).unwrap();
        assert_eq!(queued, QUEUED);

        // The operator sets the payment secret, then upgrades.
        let mut edited = std::fs::read_to_string(ENV_FILE).unwrap();
        edited.push_str(&format!(
            "SECKILL_PAYMENT_SECRET={}\n",
            lifecycle_http::SECRET
        ));
        std::fs::write(ENV_FILE, &edited).unwrap();
        pkg::apt_ok(&["install", v2.to_str().unwrap()]);
        assert_installed_kept(&edited);

        // Gateway first (the old one still answered), then the worker.
        let (code, err) = stop(gateway);
        assert_eq!(code, Some(0), "{err}");
        assert!(
            err.contains("SECKILL_PAYMENT_SECRET is not set") && err.contains(ENV_FILE),
            "{err}"
        );
        let gateway = self.gateway(port);
        let rest = STOCK - BEFORE - QUEUED;
        assert_eq!(buy(port, sale, BEFORE + QUEUED..STOCK), vec![202; rest]);
        assert_eq!(buy(port, sale, STOCK..STOCK + 3), vec![410; 3]);
        // A payment while no worker runs: queued, applied by the new worker.
        let paid = reservation_of(port, sale, "pkg-0");
        lifecycle_http::pay(port, &paid, "pkg-pay-0", PRICE);
        let w1 = self.worker();
        worker::wait_orders(&self.db, sale, STOCK as i64, Duration::from_secs(30));
        let paid_sql =
            format!("SELECT COUNT(*) FROM orders WHERE sale_id = {sale} AND status = 'paid'");
        seckill_tests::wait_until(Duration::from_secs(30), "the payment applied", || {
            self.db.count(&paid_sql) == 1
        });
        assert_books(self, sale, &paid);
        let (code, out) = self.reconciler(&["run"]);
        assert_eq!(code, 0, "{out}");
        assert!(
            Path::new(&format!("{STATE_DIR}/review.sqlite3")).is_file(),
            "{out}"
        );
        assert_eq!(stop(w1).0, Some(0));
        let (code, err) = stop(gateway);
        assert_eq!(code, Some(0), "{err}");
        assert!(!err.contains("SECKILL_PAYMENT_SECRET is not set"), "{err}");
        edited
    }
}

/// After the upgrade: version N+1, the edited conffile as it was.
fn assert_installed_kept(edited: &str) {
    assert_eq!(
        pkg::status(),
        Some(("install ok installed".into(), pkg::version(2)))
    );
    assert_eq!(std::fs::read_to_string(ENV_FILE).unwrap(), edited);
    assert!(!Path::new(&format!("{ENV_FILE}.dpkg-dist")).exists());
    assert!(!Path::new(&format!("{ENV_FILE}.dpkg-old")).exists());
}

/// `apt-get remove`: binaries, units and shared files gone, /etc/seckill
/// and the review file kept. `apt-get purge`: the conffile gone too, the
/// operator's file and the review file still there.
fn remove_then_purge(edited: &str) {
    pkg::apt_ok(&["remove", pkg::PACKAGE]);
    assert_eq!(
        pkg::status().map(|(s, _)| s),
        Some("deinstall ok config-files".into())
    );
    let gone = [
        "/usr/bin/seckill-gateway",
        "/usr/bin/seckill-worker",
        "/usr/bin/seckill-reconciler",
        "/lib/systemd/system/seckill-gateway.service",
        "/lib/systemd/system/seckill-worker@.service",
        "/lib/systemd/system/seckill-reconciler.service",
        "/lib/systemd/system/seckill-reconciler.timer",
        "/usr/share/seckill",
        "/usr/share/doc/seckill",
    ];
    for p in gone {
        assert!(!Path::new(p).exists(), "{p} stayed after remove");
    }
    assert_eq!(std::fs::read_to_string(ENV_FILE).unwrap(), edited);
    let review = format!("{STATE_DIR}/review.sqlite3");
    assert!(Path::new(&review).is_file());
    assert!(Path::new(WORKER_ENV).is_file());

    pkg::apt_ok(&["purge", pkg::PACKAGE]);
    assert_eq!(pkg::status(), None);
    assert!(
        !Path::new(ENV_FILE).exists(),
        "the conffile stayed after purge"
    );
    let mut left: Vec<String> = std::fs::read_dir("/etc/seckill")
        .unwrap()
        .map(|e| e.unwrap().path().display().to_string())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [WORKER_ENV],
        "/etc/seckill holds only the operator's file"
    );
    assert!(Path::new(&review).is_file(), "purge keeps the audit log");
    for p in gone {
        assert!(!Path::new(p).exists(), "{p} after purge");
    }
}
