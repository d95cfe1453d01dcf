//! Owns the one Redis connection type every component uses: [`Con`], a
//! connection to one Redis or to a Redis Cluster, as `SECKILL_REDIS_URL`
//! names it ([`crate::config::parse_redis_target`]). One Redis may be
//! named by its Sentinels: each connect then asks them for the master
//! (`sentinel.rs`), so reconnecting after a failover reaches the new one.
//!
//! On a cluster, single commands, scripts (`EVALSHA` routed by their first
//! key) and pipelines or `MULTI` blocks whose keys share one slot go
//! through the redis crate's `ClusterConnection`, which follows `MOVED`
//! and `ASK` and refreshes its slot map; a single command answered
//! `TRYAGAIN` (a slot half-moved) is sent again after a short wait within
//! the read timeout ([`Con`]'s `again_while_tryagain`). Commands the crate would send to
//! every master and merge (`INFO`, a keyless `EVAL`) are sent to each
//! master on a connection of its own ([`Con::each_master`]), and a pipeline
//! whose commands belong to different slots (the gateway's group commit)
//! is split per master ([`Con::pipeline_by_slot`], `slot_router.rs`).

use crate::config::{parse_redis_target, RedisTarget};
use crate::quarantine::Quarantine;
use crate::slot_router::{Packed, Replies, Reply, SlotRouter};
use redis::cluster::{ClusterClient, ClusterConnection};
use redis::{Cmd, Connection, ConnectionLike, RedisError, RedisResult, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Retries of one command on a cluster while a slot moves or a master
/// fails over (the crate waits between them); small, so a caller's own
/// timeout and 503 decide, as with one Redis.
pub const CLUSTER_RETRIES: u32 = 2;

/// What opens connections: one Redis or a cluster's seed nodes, and the
/// address to name in messages. Cheap to clone.
#[derive(Clone)]
pub struct Target {
    nodes: Nodes,
    /// `SECKILL_REDIS_URL` without its password, then the variable's name
    /// (`crate::redact::address`): what every connect error names.
    address: Arc<str>,
}

/// The nodes a [`Target`] connects to.
#[derive(Clone)]
enum Nodes {
    /// One Redis.
    Single(redis::Client),
    /// A Redis Cluster, its seed URLs (`redis://host:port/`) and the
    /// quarantine of its nodes shared by all connections opened from this
    /// target and its clones (`quarantine.rs`).
    Cluster(Vec<String>, Arc<Mutex<Quarantine>>),
    /// One Redis whose master the Sentinels (`host:port`) name, asked at
    /// every connect (`sentinel.rs`); its connections are [`Con::Single`].
    Sentinel(Arc<[String]>, Arc<str>),
}

impl Target {
    /// Parses `url` (`SECKILL_REDIS_URL`'s forms) into a target; connects
    /// to nothing yet.
    ///
    /// Errors: `InvalidClientConfig` when the URL is not one of those forms.
    pub fn open(url: &str) -> RedisResult<Target> {
        let parsed = parse_redis_target(url).map_err(|e| {
            RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "bad SECKILL_REDIS_URL",
                e.to_string(),
            ))
        })?;
        let nodes = match parsed {
            RedisTarget::Single(u) => Nodes::Single(redis::Client::open(u)?),
            RedisTarget::Cluster(seeds) => {
                // Built once here to refuse unusable seeds now; each
                // connection builds its own with the caller's timeouts.
                ClusterClient::builder(seeds.clone()).build()?;
                Nodes::Cluster(seeds, Arc::default())
            }
            RedisTarget::Sentinel { sentinels, master } => {
                Nodes::Sentinel(sentinels.into(), master.into())
            }
        };
        Ok(Target {
            nodes,
            address: crate::redact::address(url, "SECKILL_REDIS_URL").into(),
        })
    }

    /// True for a cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.nodes, Nodes::Cluster(..))
    }

    /// The URL without its password and the variable that sets it, for
    /// messages: `redis://127.0.0.1:6379/ (SECKILL_REDIS_URL)`.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// A connection with `timeout` for connect, reads and writes.
    ///
    /// Errors: no node reachable within `timeout`, or (cluster) no node
    /// answered with a slot map.
    pub fn connect(&self, timeout: Duration) -> RedisResult<Con> {
        match &self.nodes {
            Nodes::Single(client) => {
                let c = client.get_connection_with_timeout(timeout)?;
                c.set_read_timeout(Some(timeout))?;
                c.set_write_timeout(Some(timeout))?;
                Ok(Con::Single(c))
            }
            Nodes::Sentinel(sentinels, master) => Ok(Con::Single(crate::sentinel::connect_master(
                sentinels, master, timeout,
            )?)),
            Nodes::Cluster(seeds, quarantine) => {
                // A client per connection: the builder's timeouts are the
                // caller's.
                let client = ClusterClient::builder(seeds.clone())
                    .retries(CLUSTER_RETRIES)
                    .min_retry_wait(50)
                    .max_retry_wait(500)
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    .build()?;
                let mut router = SlotRouter::new(seeds.clone(), timeout, quarantine.clone());
                router.refresh()?;
                Ok(Con::Cluster(Box::new(ClusterCon {
                    client,
                    con: None,
                    timeouts: (Some(timeout), Some(timeout)),
                    router,
                    routes_reads: false,
                })))
            }
        }
    }
}

/// An error of a call to one node ([`Con::each_master`]'s `f`): says
/// whether the link failed (I/O, a timeout) rather than the node answering
/// with an error or a refusal.
pub trait NodeError: From<RedisError> + std::fmt::Display {
    /// True when the link failed.
    fn is_link_failure(&self) -> bool;
}

impl NodeError for RedisError {
    fn is_link_failure(&self) -> bool {
        self.is_io_error() || self.is_connection_dropped()
    }
}

/// A connection to one Redis ([`Con::Single`]) or to a cluster
/// ([`Con::Cluster`]); both run every `redis::cmd`, script and pipeline
/// the components send (see the module doc for what a cluster allows).
pub enum Con {
    /// One Redis.
    Single(Connection),
    /// A cluster (boxed: it is much larger than a single connection).
    Cluster(Box<ClusterCon>),
}

/// The two halves of a cluster connection.
pub struct ClusterCon {
    /// What opens `con`.
    client: ClusterClient,
    /// Single-slot commands, scripts and `MULTI` blocks; opened on first
    /// use ([`ClusterCon::con`]): opening it pings every node, a stalled
    /// one for a whole timeout, and a gateway's group commit never needs it.
    con: Option<ClusterConnection>,
    /// (read, write) timeouts `con` gets, as last set.
    timeouts: (Option<Duration>, Option<Duration>),
    /// Per-master pipelines and per-master server commands.
    router: SlotRouter,
    /// One-key reads go through `router` ([`Con::route_reads`]).
    routes_reads: bool,
}

impl ClusterCon {
    /// The crate's cluster connection, opened with the timeouts set.
    ///
    /// Errors: no node answered with a slot map.
    fn con(&mut self) -> RedisResult<&mut ClusterConnection> {
        if self.con.is_none() {
            let con = self.client.get_connection()?;
            con.set_read_timeout(self.timeouts.0)?;
            con.set_write_timeout(self.timeouts.1)?;
            self.con = Some(con);
        }
        self.con
            .as_mut()
            .ok_or_else(|| RedisError::from((redis::ErrorKind::Io, "connection vanished")))
    }
}

impl Con {
    /// Sets the read timeout (on every node of a cluster).
    ///
    /// Errors: a zero duration.
    pub fn set_read_timeout(&mut self, d: Option<Duration>) -> RedisResult<()> {
        match self {
            Con::Single(c) => c.set_read_timeout(d),
            Con::Cluster(c) => {
                if d.is_some_and(|d| d.is_zero()) {
                    return Err(zero_timeout());
                }
                c.timeouts.0 = d;
                c.con.as_ref().map_or(Ok(()), |con| con.set_read_timeout(d))
            }
        }
    }

    /// Sets the write timeout (on every node of a cluster).
    ///
    /// Errors: a zero duration.
    pub fn set_write_timeout(&mut self, d: Option<Duration>) -> RedisResult<()> {
        match self {
            Con::Single(c) => c.set_write_timeout(d),
            Con::Cluster(c) => {
                if d.is_some_and(|d| d.is_zero()) {
                    return Err(zero_timeout());
                }
                c.timeouts.1 = d;
                c.con
                    .as_ref()
                    .map_or(Ok(()), |con| con.set_write_timeout(d))
            }
        }
    }

    /// True on a cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Con::Cluster(_))
    }

    /// From now on, on a cluster, single read-only commands of one key
    /// (`slot_router::ROUTED_READS`: `HGET`, `HMGET`, `GET`...) go to their
    /// master through the slot router, whose quarantine skips a master
    /// that stalled (`quarantine.rs`), instead of through the redis
    /// crate's cluster connection, whose (re)connect pings every node and
    /// waits out a stalled one. The gateway's links do this: a stalled
    /// master then costs only its own buckets' purchases. Nothing changes
    /// on one Redis.
    pub fn route_reads(&mut self) {
        if let Con::Cluster(c) = self {
            c.routes_reads = true;
        }
    }

    /// Runs `f` on each master on a plain connection (the one Redis for
    /// [`Con::Single`]), for server commands such as `INFO` or a keyless
    /// `EVAL`; returns the results in master order.
    ///
    /// Errors: the slot map could not be read or a master not reached,
    /// or what `f` returns.
    pub fn each_master<T, E: NodeError>(
        &mut self,
        f: impl FnMut(&mut Connection) -> Result<T, E>,
    ) -> Result<Vec<T>, E> {
        self.masters_do(false, f)
    }

    /// [`Con::each_master`] over the masters that accept a connection: a
    /// master that cannot be reached (killed, its replica not yet promoted)
    /// is left out, as it costs only the commands of its own slots
    /// (`SlotRouter::pipeline`), so a component connecting during a
    /// failover still serves the other masters' sales.
    ///
    /// Errors: the slot map could not be read, no master accepted a
    /// connection, or what `f` returns.
    pub fn each_reachable_master<T, E: NodeError>(
        &mut self,
        f: impl FnMut(&mut Connection) -> Result<T, E>,
    ) -> Result<Vec<T>, E> {
        self.masters_do(true, f)
    }

    /// Both of the above: `skip_unreachable` leaves out (and logs) a master
    /// that is held in quarantine, whose connect fails, or whose link fails
    /// under `f` (a timeout: a stalled master), unless none is left. A
    /// link that fails under `f` is dropped and its node held either way
    /// (`SlotRouter::failed`), so no later call reads its late reply.
    fn masters_do<T, E: NodeError>(
        &mut self,
        skip_unreachable: bool,
        mut f: impl FnMut(&mut Connection) -> Result<T, E>,
    ) -> Result<Vec<T>, E> {
        let c = match self {
            Con::Single(c) => return Ok(vec![f(c)?]),
            Con::Cluster(c) => c,
        };
        let masters = c.router.masters()?;
        let mut out = Vec::with_capacity(masters.len());
        let mut last = None;
        for m in masters {
            let started = std::time::Instant::now();
            let e = match c.router.node(&m) {
                Ok(node) => match f(node) {
                    Ok(v) => {
                        c.router.answered(&m);
                        out.push(v);
                        continue;
                    }
                    Err(e) => {
                        if !e.is_link_failure() {
                            return Err(e);
                        }
                        c.router.failed(&m, started);
                        e
                    }
                },
                Err(e) => E::from(e),
            };
            if !skip_unreachable {
                return Err(e);
            }
            log::warn!("redis: master {m} not reached: {e}");
            last = Some(e);
        }
        match last {
            Some(e) if out.is_empty() => Err(e),
            _ => Ok(out),
        }
    }

    /// `SCRIPT LOAD`s `script` on the one Redis, or on every master of a
    /// cluster that accepts a connection ([`Con::each_reachable_master`]:
    /// a master down during a failover must not stop the others' sales;
    /// its replica, once promoted, answers `NOSCRIPT` and gets it then).
    ///
    /// Errors: no master reached, or a master refused the script.
    pub fn load_script(&mut self, script: &redis::Script) -> RedisResult<()> {
        self.each_reachable_master(|c| script.prepare_invoke().load(c).map(|_| ()))
            .map(|_| ())
    }

    /// Sends `cmds` (each with the cluster slot of all its keys, see
    /// `slot_router::slot_of`; ignored on one Redis) as one pipeline per
    /// master and returns one reply per command in order, error replies as
    /// `Value::ServerError` values.
    ///
    /// With `ack` (replicas, timeout) each master's pipeline ends with
    /// `WAIT` (`SECKILL_REDIS_REPLICAS_ACK`), see `SlotRouter::pipeline`.
    ///
    /// On a cluster a master that cannot be reached fails only its own
    /// commands (`Reply::reached`).
    ///
    /// Errors: the connection failed (on a cluster: no command reached its
    /// master; commands may have run: send only commands safe to repeat).
    pub fn pipeline_by_slot(
        &mut self,
        cmds: &Packed,
        ack: Option<(usize, Duration)>,
    ) -> RedisResult<Replies> {
        match self {
            Con::Single(c) => {
                let (values, acked) = crate::slot_router::send(c, cmds, None, false, ack)?;
                Ok(values
                    .into_iter()
                    .map(|value| Reply {
                        value,
                        replicated: acked,
                        reached: true,
                    })
                    .collect())
            }
            Con::Cluster(c) => c.router.pipeline(cmds, ack),
        }
    }

    /// The inner connection of a cluster's single-slot commands.
    ///
    /// Errors: (cluster) it could not be opened.
    fn like(&mut self) -> RedisResult<&mut dyn ConnectionLike> {
        match self {
            Con::Single(c) => Ok(c),
            Con::Cluster(c) => Ok(c.con()?),
        }
    }
}

fn zero_timeout() -> RedisError {
    RedisError::from((
        redis::ErrorKind::InvalidClientConfig,
        "Duration should be None or non-zero.",
    ))
}

/// True for a `TRYAGAIN` error: a multi-key command on a slot being
/// migrated, some of its keys already moved; it did not run.
fn is_tryagain(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain)
}

impl Con {
    /// `f` once, and again after a short wait (the router's backoff:
    /// `slot_router::TRYAGAIN_FIRST_WAIT` doubling up to
    /// `TRYAGAIN_MAX_WAIT`) while a cluster answers `TRYAGAIN` and the read
    /// timeout allows from the first try: a slot moved key by key
    /// (`redis-cli --cluster reshard`) answers a script whose keys are
    /// split between the two masters that way until the last key moved.
    /// One command only: it did not run, so it never runs twice.
    fn again_while_tryagain<T>(
        &mut self,
        mut f: impl FnMut(&mut Con) -> RedisResult<T>,
    ) -> RedisResult<T> {
        let limit = match self {
            Con::Single(_) => return f(self),
            Con::Cluster(c) => c.timeouts.0.unwrap_or(Duration::from_secs(1)),
        };
        let started = std::time::Instant::now();
        let mut wait = crate::slot_router::TRYAGAIN_FIRST_WAIT;
        loop {
            match f(self) {
                Err(e) if is_tryagain(&e) && started.elapsed() + wait < limit => {
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(crate::slot_router::TRYAGAIN_MAX_WAIT);
                }
                r => return r,
            }
        }
    }
}

impl ConnectionLike for Con {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        if let Con::Cluster(c) = self {
            if c.routes_reads {
                if let Some(slot) = crate::slot_router::read_slot(cmd) {
                    return c.router.read(slot, cmd);
                }
            }
        }
        self.again_while_tryagain(|c| c.like()?.req_packed_command(cmd))
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        self.like()?.req_packed_commands(cmd, offset, count)
    }

    fn req_command(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        if let Con::Cluster(c) = self {
            if c.routes_reads {
                return self.req_packed_command(&cmd.get_packed_command());
            }
        }
        self.again_while_tryagain(|c| c.like()?.req_command(cmd))
    }

    fn get_db(&self) -> i64 {
        match self {
            Con::Single(c) => c.get_db(),
            Con::Cluster(_) => 0,
        }
    }

    /// True on a cluster too: the crate's `ClusterConnection` sends a
    /// plain pipeline (or `MULTI` block) to the master of its first
    /// command's slot, which is right when all its keys share that slot
    /// (the crate says false because it cannot check that).
    fn supports_pipelining(&self) -> bool {
        true
    }

    fn check_connection(&mut self) -> bool {
        self.like().is_ok_and(|c| c.check_connection())
    }

    fn is_open(&self) -> bool {
        match self {
            Con::Single(c) => c.is_open(),
            // Not opened yet: nothing is broken.
            Con::Cluster(c) => c.con.as_ref().is_none_or(|c| c.is_open()),
        }
    }
}
