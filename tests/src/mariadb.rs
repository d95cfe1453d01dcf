//! Owns private MariaDB servers for the replication tests: each
//! [`MariaDb`] is a `mariadbd` of its own (data directory initialised by
//! `mariadb-install-db`, its own socket, pid file, free port, server id and
//! binary log), killed on drop; [`MariaDb::replicate_from`] makes one a GTID
//! replica of another (`CHANGE MASTER TO … MASTER_USE_GTID=slave_pos`).
//!
//! Servers run as the test's user (`--user=root` when that is root, as
//! `mariadbd` otherwise refuses), with small buffers: a test starts two.

use crate::{dies_with_test, free_port, TempDir, TestDb};
use mysql::prelude::Queryable;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One private `mariadbd`.
pub struct MariaDb {
    /// Its TCP port on 127.0.0.1.
    pub port: u16,
    /// Its `--server-id`.
    pub server_id: u32,
    /// Whether it writes a binary log (`--log-bin`).
    binlog: bool,
    dir: TempDir,
    child: Option<Child>,
}

impl MariaDb {
    /// Initialises a data directory and starts a server with `server_id`
    /// and a binary log, and waits until it answers (up to 60 s).
    pub fn start(server_id: u32) -> MariaDb {
        let mut m = MariaDb::init(server_id);
        m.start_initialised();
        m
    }

    /// [`MariaDb::start`] without a binary log (MariaDB's default): its
    /// `@@gtid_binlog_pos` stays empty.
    pub fn start_without_binlog(server_id: u32) -> MariaDb {
        let mut m = MariaDb::init(server_id);
        m.binlog = false;
        m.start_initialised();
        m
    }

    /// Starts a primary (server id 1) and a replica (server id 2)
    /// replicating from it; both data directories are initialised at once
    /// (the servers are started from the calling thread, with whose end
    /// they die).
    pub fn primary_and_replica() -> (MariaDb, MariaDb) {
        let replica = std::thread::spawn(|| MariaDb::init(2));
        let mut primary = MariaDb::init(1);
        let mut replica = replica.join().expect("initialise the replica");
        primary.start_initialised();
        replica.start_initialised();
        replica.replicate_from(&primary);
        (primary, replica)
    }

    /// A data directory initialised by `mariadb-install-db`; no server yet.
    fn init(server_id: u32) -> MariaDb {
        let dir = TempDir::new();
        let data = dir.path().join("data");
        let tmp = dir.path().join("tmp");
        std::fs::create_dir_all(&tmp).expect("the server's tmpdir");
        // Its own tmpdir: two bootstraps at once collide in /tmp's
        // temporary table names.
        let out = Command::new(install_db_bin())
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--tmpdir={}", tmp.display()))
            .arg(format!("--user={}", user()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .expect("run mariadb-install-db (is mariadb-server installed?)");
        assert!(
            out.status.success(),
            "mariadb-install-db: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        MariaDb {
            port: 0,
            server_id,
            binlog: true,
            dir,
            child: None,
        }
    }

    /// Starts the server on a free port, trying another one when the port
    /// was taken meanwhile (up to 5).
    fn start_initialised(&mut self) {
        for attempt in 0..5 {
            self.port = free_port();
            match self.launch() {
                Ok(()) => return,
                Err(e) if attempt < 4 => eprintln!("{e}; trying another port"),
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// `mysql://root@127.0.0.1:PORT/`.
    pub fn server_url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/", self.port)
    }

    /// `mysql://root@127.0.0.1:PORT/DB`.
    pub fn url(&self, db: &str) -> String {
        format!("{}{db}", self.server_url())
    }

    /// A new connection with no database selected.
    pub fn conn(&self) -> mysql::Conn {
        seckill_common::schema::connect(&self.server_url(), Duration::from_secs(10))
            .expect("connect to the private mariadbd")
    }

    /// Runs `sql` (statements without results).
    pub fn exec(&self, sql: &str) {
        self.conn()
            .query_drop(sql)
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// A fresh migrated database on this server ([`TestDb::create_on`]).
    pub fn test_db(&self) -> TestDb {
        TestDb::create_on(&self.server_url())
    }

    /// Makes this server a GTID replica of `primary` (as root, no
    /// password) and waits until both replication threads run.
    pub fn replicate_from(&self, primary: &MariaDb) {
        self.exec(&format!(
            "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={}, MASTER_USER='root', \
             MASTER_PASSWORD='', MASTER_CONNECT_RETRY=1, MASTER_USE_GTID=slave_pos",
            primary.port
        ));
        self.exec("START SLAVE");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (io, sql) = self.slave_running();
            if io == "Yes" && sql == "Yes" {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "replication did not start: io {io}, sql {sql}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `(Slave_IO_Running, Slave_SQL_Running)` of `SHOW SLAVE STATUS`.
    pub fn slave_running(&self) -> (String, String) {
        let row: Option<mysql::Row> = self
            .conn()
            .query_first("SHOW SLAVE STATUS")
            .expect("status");
        let get = |r: &mysql::Row, col: &str| -> String {
            r.get_opt::<String, _>(col)
                .and_then(Result::ok)
                .unwrap_or_default()
        };
        row.map_or((String::new(), String::new()), |r| {
            (get(&r, "Slave_IO_Running"), get(&r, "Slave_SQL_Running"))
        })
    }

    /// The server's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the killed server again on its port, with the same options
    /// (as a reboot with its own config does: writable unless told).
    pub fn restart(&mut self) {
        self.kill();
        if let Err(e) = self.launch() {
            panic!("restart mariadbd on {}: {e}", self.port);
        }
    }

    /// Sends `signal` (`STOP`, `CONT`) to the server: stopped, it accepts
    /// TCP connections (the kernel's backlog) and never answers.
    pub fn signal(&self, signal: &str) {
        let pid = self.pid().expect("the server runs");
        let ok = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{signal} {pid}");
    }

    fn launch(&mut self) -> Result<(), String> {
        let d = self.dir.path();
        let log = std::fs::File::create(d.join("mariadbd.log")).map_err(|e| e.to_string())?;
        let child = dies_with_test(mariadbd_bin())
            .arg("--no-defaults")
            .arg(format!("--datadir={}", d.join("data").display()))
            .arg(format!("--tmpdir={}", d.join("tmp").display()))
            .arg(format!("--socket={}", d.join("mysqld.sock").display()))
            .arg(format!("--pid-file={}", d.join("mysqld.pid").display()))
            .arg(format!("--port={}", self.port))
            .arg(format!("--server-id={}", self.server_id))
            .arg(if self.binlog {
                format!("--log-bin={}", d.join("data").join("binlog").display())
            } else {
                "--skip-log-bin".to_string()
            })
            .arg(format!("--user={}", user()))
            .args([
                "--bind-address=127.0.0.1",
                "--skip-name-resolve",
                "--innodb-buffer-pool-size=32M",
                "--innodb-log-file-size=16M",
                "--max-connections=200",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("start mariadbd: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return Err(format!(
                    "mariadbd on port {} exited ({status}): {}",
                    self.port,
                    tail(&d.join("mariadbd.log"))
                ));
            }
            if let Ok(mut c) =
                seckill_common::schema::connect(&self.server_url(), Duration::from_secs(2))
            {
                // Our own server must answer (the port may have been taken).
                let id: Option<u32> = c.query_first("SELECT @@server_id").ok().flatten();
                if id == Some(self.server_id) {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(format!("mariadbd did not start on {}", self.port));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for MariaDb {
    fn drop(&mut self) {
        self.kill();
    }
}

fn tail(p: &Path) -> String {
    let s = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

fn user() -> String {
    std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "root".to_string())
}

fn mariadbd_bin() -> String {
    for p in ["/usr/sbin/mariadbd", "/usr/sbin/mysqld"] {
        if Path::new(p).exists() {
            return p.to_string();
        }
    }
    "mariadbd".to_string()
}

fn install_db_bin() -> String {
    if Path::new("/usr/bin/mariadb-install-db").exists() {
        "mariadb-install-db".to_string()
    } else {
        "mysql_install_db".to_string()
    }
}
