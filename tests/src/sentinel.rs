//! Owns a private Redis Sentinel deployment for the failover tests: a
//! master and a replica ([`RedisServer`]s) and three Sentinels
//! (`redis-server CONF --sentinel`, each with its own port and config
//! file) watching the master as [`MASTER_NAME`], quorum 2, a master
//! declared down after 1 s. Its [`TestRedis::url`] is the
//! `redis+sentinel://` URL the binaries take. Everything is killed on drop.

use crate::cluster::TestRedis;
use crate::{dies_with_test, free_port, redis_server_bin, wait_until, RedisServer, TempDir};
use std::process::{Child, Stdio};
use std::time::Duration;

/// The name the Sentinels monitor the master under.
pub const MASTER_NAME: &str = "seckill";

/// A master, its replica, and three Sentinels.
pub struct SentinelSet {
    /// The master Sentinel watches at the start.
    pub master: RedisServer,
    /// Its replica (`REPLICAOF` the master).
    pub replica: RedisServer,
    sentinels: Vec<(u16, Child)>,
    _dir: TempDir,
}

impl SentinelSet {
    /// Starts the servers and Sentinels and waits until the Sentinels know
    /// the replica and each other (`SENTINEL CKQUORUM` answers OK), so a
    /// failover can happen.
    pub fn start() -> SentinelSet {
        let master = RedisServer::start();
        let replica = RedisServer::start();
        let mut r = replica.con();
        redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(master.port)
            .exec(&mut r)
            .expect("REPLICAOF");
        let dir = TempDir::new();
        let mut sentinels = Vec::new();
        for i in 0..3 {
            let port = free_port();
            let conf = dir.path().join(format!("sentinel-{i}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\n\
                     sentinel monitor {MASTER_NAME} 127.0.0.1 {m} 2\n\
                     sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                     sentinel failover-timeout {MASTER_NAME} 10000\n\
                     sentinel parallel-syncs {MASTER_NAME} 1\n",
                    dir = dir.path().display(),
                    m = master.port
                ),
            )
            .expect("write the sentinel config");
            let child = dies_with_test(redis_server_bin())
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start redis-server --sentinel");
            sentinels.push((port, child));
        }
        let set = SentinelSet {
            master,
            replica,
            sentinels,
            _dir: dir,
        };
        wait_until(
            Duration::from_secs(30),
            "the Sentinels to know the replica and each other",
            || set.sentinels.iter().all(|&(port, _)| set.ckquorum(port)),
        );
        set
    }

    fn ckquorum(&self, port: u16) -> bool {
        let ok = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(1)))
            .and_then(|mut c| {
                let q: String = redis::cmd("SENTINEL")
                    .arg("CKQUORUM")
                    .arg(MASTER_NAME)
                    .query(&mut c)?;
                let replicas: Vec<redis::Value> = redis::cmd("SENTINEL")
                    .arg("REPLICAS")
                    .arg(MASTER_NAME)
                    .query(&mut c)?;
                Ok(q.starts_with("OK 3 usable") && !replicas.is_empty())
            });
        ok.unwrap_or(false)
    }

    /// Cuts the replica off once it holds every write so far (`WAIT 1`):
    /// stopped (SIGSTOP), its link closed by the master (`CLIENT KILL TYPE
    /// replica`); returns the replica's pid (SIGCONT it to let it be
    /// promoted) and a connection to the master.
    pub fn cut_off_replica(&self) -> (u32, redis::Connection) {
        let mut m = self.master.con();
        let acked: i64 = redis::cmd("WAIT")
            .arg(1)
            .arg(5000)
            .query(&mut m)
            .expect("WAIT");
        assert_eq!(acked, 1, "the replica has every write");
        let pid = self.replica.pid().expect("replica pid");
        let stopped = std::process::Command::new("kill")
            .args(["-STOP", &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(stopped, "kill -STOP {pid}");
        redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("replica")
            .exec(&mut m)
            .expect("CLIENT KILL TYPE replica");
        (pid, m)
    }

    /// The port of the master the first Sentinel names now.
    pub fn master_port(&self) -> Option<u16> {
        let (port, _) = self.sentinels.first()?;
        let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .ok()?
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()?;
        let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(MASTER_NAME)
            .query(&mut c)
            .ok()?;
        addr.map(|(_, p)| p)
    }
}

impl TestRedis for SentinelSet {
    fn url(&self) -> String {
        let nodes: Vec<String> = self
            .sentinels
            .iter()
            .map(|(p, _)| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+sentinel://{}/{MASTER_NAME}", nodes.join(","))
    }
}

impl Drop for SentinelSet {
    fn drop(&mut self) {
        for (_, c) in &mut self.sentinels {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
