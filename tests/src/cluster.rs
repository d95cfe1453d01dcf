//! Owns the tests' real Redis Cluster ([`RedisCluster`]: six `redis-server`
//! processes, three masters and three replicas, on free loopback ports)
//! and [`TestRedis`], what a test parametrized over one Redis or a cluster
//! needs of either.

use crate::{dies_with_test, free_port, RedisServer, TempDir};
use seckill_common::redis_target::{Con, Target};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Nodes of a test cluster: 3 masters, each with one replica.
pub const NODES: usize = 6;

/// `cluster-node-timeout` of the test cluster, ms: how long a master may
/// be unreachable before its replica is promoted (short, for the failover
/// test; the default 15 s would make it slow).
pub const NODE_TIMEOUT_MS: u64 = 1_000;

/// What a test needs of its Redis, one server or a cluster: the URL the
/// binaries get (`SECKILL_REDIS_URL`) and a connection for its own reads.
pub trait TestRedis {
    /// `SECKILL_REDIS_URL` for the binaries.
    fn url(&self) -> String;

    /// A connection of the kind the binaries use (routed on a cluster).
    fn target_con(&self) -> Con {
        Target::open(&self.url())
            .and_then(|t| t.connect(Duration::from_secs(5)))
            .expect("connect to the test redis")
    }
}

impl TestRedis for RedisServer {
    fn url(&self) -> String {
        RedisServer::url(self)
    }
}

/// One node of a [`RedisCluster`].
struct Node {
    port: u16,
    /// Holds `nodes.conf` and `appendonlydir/`.
    _dir: TempDir,
    child: Option<Child>,
}

/// A real Redis Cluster for one test, torn down (every process killed) on
/// drop.
pub struct RedisCluster {
    nodes: Vec<Node>,
    /// The extra `redis-server` options of every node.
    options: Vec<(String, String)>,
}

impl RedisCluster {
    /// Starts [`NODES`] servers (`cluster-enabled yes`, `appendonly yes`,
    /// each in its own directory), joins them with `redis-cli --cluster
    /// create … --cluster-replicas 1 --cluster-yes`, and waits until every
    /// node says `cluster_state:ok` and its slot map covers all 16384
    /// slots with a replica for every master.
    ///
    /// Panics when that does not happen within 20 s (a test harness).
    pub fn start() -> RedisCluster {
        RedisCluster::start_with(&[])
    }

    /// [`RedisCluster::start`] with more `redis-server` options on every
    /// node (`("cluster-require-full-coverage", "no")`: the other masters
    /// keep serving their slots while one has none).
    pub fn start_with(options: &[(&str, &str)]) -> RedisCluster {
        let options: Vec<(String, String)> = options
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut nodes = Vec::with_capacity(NODES);
        for _ in 0..NODES {
            let dir = TempDir::new();
            let port = cluster_port();
            let child = spawn_node(port, &dir, &options);
            nodes.push(Node {
                port,
                _dir: dir,
                child: Some(child),
            });
        }
        let c = RedisCluster { nodes, options };
        for n in &c.nodes {
            c.wait_for("a node to answer PING", || {
                node_con(n.port)
                    .and_then(|mut k| redis::cmd("PING").query::<String>(&mut k))
                    .is_ok()
            });
        }
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &c.nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        c.wait_for(
            "cluster_state:ok and all slots served on every node",
            || c.ports().iter().all(|&p| node_ready(p)),
        );
        c
    }

    /// `redis+cluster://` with every node as a seed.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self
            .ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+cluster://{}/", seeds.join(","))
    }

    /// The nodes' ports, in start order.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// The port of the master serving `key`'s slot, from `CLUSTER SLOTS`
    /// of the first node that answers.
    pub fn master_of(&self, key: &str) -> Option<u16> {
        let slot = seckill_common::slot_router::slot_of(key);
        self.slots()
            .into_iter()
            .find_map(|(a, b, port, _)| (a..=b).contains(&slot).then_some(port))
    }

    /// The port of one replica of the master serving `key`'s slot.
    pub fn replica_of(&self, key: &str) -> Option<u16> {
        let slot = seckill_common::slot_router::slot_of(key);
        self.slots()
            .into_iter()
            .find_map(|(a, b, _, r)| (a..=b).contains(&slot).then_some(r).flatten())
    }

    /// Kills the node on `port` with SIGKILL and waits for it to exit.
    pub fn kill(&mut self, port: u16) {
        if let Some(n) = self.nodes.iter_mut().find(|n| n.port == port) {
            if let Some(mut c) = n.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    /// Starts the node on `port` again (after [`RedisCluster::kill`]) on
    /// its port and directory: its `nodes.conf` and AOF, so it comes back
    /// as the same node with its data.
    pub fn restart(&mut self, port: u16) {
        let options = self.options.clone();
        let n = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("a node of this cluster");
        assert!(n.child.is_none(), "node {port} is running");
        n.child = Some(spawn_node(port, &n._dir, &options));
    }

    /// Sends `signal` (`STOP`, `CONT`) to the node on `port`: a stopped
    /// replica misses the writes its master acknowledges meanwhile.
    pub fn signal(&self, port: u16, signal: &str) {
        let n = self
            .nodes
            .iter()
            .find(|n| n.port == port)
            .expect("a node of this cluster");
        let pid = n.child.as_ref().expect("a running node").id();
        let ok = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{signal} {pid}");
    }

    /// A connection to the master on `master` (with no cluster routing)
    /// after its replica on `replica` has every write so far (`WAIT 1`) and
    /// is then cut off from it: the replica is stopped and the master
    /// closes its link (what a stopped process has in its socket buffer it
    /// would still read once let go), so the writes the master
    /// acknowledges from now on are not replicated.
    pub fn cut_off_replica(&self, master: u16, replica: u16) -> redis::Connection {
        let mut m = node_con(master).expect("the master");
        let acked: i64 = redis::cmd("WAIT")
            .arg(1)
            .arg(5000)
            .query(&mut m)
            .expect("WAIT");
        assert_eq!(acked, 1, "the replica on {replica} has every write");
        self.signal(replica, "STOP");
        redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("replica")
            .exec(&mut m)
            .expect("CLIENT KILL TYPE replica");
        m
    }

    /// `(first, last, master port, replica port)` rows of `CLUSTER SLOTS`.
    fn slots(&self) -> Vec<(u16, u16, u16, Option<u16>)> {
        for n in self.nodes.iter().filter(|n| n.child.is_some()) {
            let Ok(mut k) = node_con(n.port) else {
                continue;
            };
            let Ok(rows) = redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query::<Vec<Vec<redis::Value>>>(&mut k)
            else {
                continue;
            };
            let num = |v: Option<&redis::Value>| -> Option<u16> {
                v.and_then(|p| redis::from_redis_value_ref::<u16>(p).ok())
            };
            // A row: first, last, [master ip, port, id], [replica ...]...
            let port = |v: Option<&redis::Value>| -> Option<u16> {
                match v {
                    Some(redis::Value::Array(node)) => num(node.get(1)),
                    _ => None,
                }
            };
            return rows
                .iter()
                .filter_map(|r| {
                    Some((
                        num(r.first())?,
                        num(r.get(1))?,
                        port(r.get(2))?,
                        port(r.get(3)),
                    ))
                })
                .collect();
        }
        Vec::new()
    }

    /// Waits (up to 20 s) until `ok` holds; panics naming `what` after.
    pub fn wait_for(&self, what: &str, mut ok: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !ok() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl TestRedis for RedisCluster {
    fn url(&self) -> String {
        RedisCluster::url(self)
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut c) = n.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Starts one cluster node on `port` in `dir` with `options`.
fn spawn_node(port: u16, dir: &TempDir, options: &[(String, String)]) -> Child {
    dies_with_test(crate::redis_server_bin())
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .arg("--dir")
        .arg(dir.path())
        .args(["--cluster-enabled", "yes"])
        .args(["--cluster-config-file", "nodes.conf"])
        .args(["--cluster-node-timeout", &NODE_TIMEOUT_MS.to_string()])
        .args([
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
        ])
        .args(["--daemonize", "no", "--loglevel", "warning"])
        .args(
            options
                .iter()
                .flat_map(|(k, v)| [format!("--{k}"), v.clone()]),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start redis-server (scripts/test.sh installs it)")
}

/// A free loopback port whose cluster bus port (`port + 10000`) is free
/// too; Redis refuses a cluster node above 55535 (its bus port would not
/// fit).
fn cluster_port() -> u16 {
    loop {
        let p = free_port();
        if p <= 55_535 && std::net::TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok() {
            return p;
        }
    }
}

/// A plain connection to one node.
fn node_con(port: u16) -> redis::RedisResult<redis::Connection> {
    redis::Client::open(format!("redis://127.0.0.1:{port}/"))?
        .get_connection_with_timeout(Duration::from_secs(1))
}

/// Whether the node on `port` says `cluster_state:ok` and its slot map
/// covers every slot, each range with a replica.
fn node_ready(port: u16) -> bool {
    let Ok(mut k) = node_con(port) else {
        return false;
    };
    let info: String = redis::cmd("CLUSTER")
        .arg("INFO")
        .query(&mut k)
        .unwrap_or_default();
    if !info.lines().any(|l| l.trim() == "cluster_state:ok") {
        return false;
    }
    let Ok(rows) = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query::<Vec<Vec<redis::Value>>>(&mut k)
    else {
        return false;
    };
    let mut covered = 0u32;
    for r in &rows {
        let (Some(a), Some(b)) = (r.first(), r.get(1)) else {
            return false;
        };
        let (Ok(a), Ok(b)) = (
            redis::from_redis_value_ref::<u32>(a),
            redis::from_redis_value_ref::<u32>(b),
        ) else {
            return false;
        };
        if r.len() < 4 {
            return false;
        }
        covered += b - a + 1;
    }
    covered == 16_384
}
