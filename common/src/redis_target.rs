//! Owns the one Redis connection type every component uses: [`Con`], a
//! connection to one Redis or to a Redis Cluster, as `SECKILL_REDIS_URL`
//! names it ([`crate::config::parse_redis_target`]).
//!
//! On a cluster, single commands, scripts (`EVALSHA` routed by their first
//! key) and pipelines or `MULTI` blocks whose keys share one slot go
//! through the redis crate's `ClusterConnection`, which follows `MOVED`
//! and `ASK` and refreshes its slot map. Commands the crate would send to
//! every master and merge (`INFO`, a keyless `EVAL`) are sent to each
//! master on a connection of its own ([`Con::each_master`]), and a pipeline
//! whose commands belong to different slots (the gateway's group commit)
//! is split per master ([`Con::pipeline_by_slot`], `slot_router.rs`).

use crate::config::{parse_redis_target, RedisTarget};
use crate::slot_router::{Packed, Replies, SlotRouter};
use redis::cluster::{ClusterClient, ClusterConnection};
use redis::{Cmd, Connection, ConnectionLike, RedisError, RedisResult, Value};
use std::time::Duration;

/// Retries of one command on a cluster while a slot moves or a master
/// fails over (the crate waits between them); small, so a caller's own
/// timeout and 503 decide, as with one Redis.
pub const CLUSTER_RETRIES: u32 = 2;

/// What opens connections: one Redis or a cluster's seed nodes. Cheap to
/// clone.
#[derive(Clone)]
pub enum Target {
    /// One Redis.
    Single(redis::Client),
    /// A Redis Cluster and its seed URLs (`redis://host:port/`).
    Cluster(ClusterClient, Vec<String>),
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
        match parsed {
            RedisTarget::Single(u) => Ok(Target::Single(redis::Client::open(u)?)),
            RedisTarget::Cluster(seeds) => Ok(Target::Cluster(
                ClusterClient::builder(seeds.clone())
                    .retries(CLUSTER_RETRIES)
                    .min_retry_wait(50)
                    .max_retry_wait(500)
                    .build()?,
                seeds,
            )),
        }
    }

    /// True for a cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Target::Cluster(..))
    }

    /// A connection with `timeout` for connect, reads and writes.
    ///
    /// Errors: no node reachable within `timeout`, or (cluster) no node
    /// answered with a slot map.
    pub fn connect(&self, timeout: Duration) -> RedisResult<Con> {
        match self {
            Target::Single(client) => {
                let c = client.get_connection_with_timeout(timeout)?;
                c.set_read_timeout(Some(timeout))?;
                c.set_write_timeout(Some(timeout))?;
                Ok(Con::Single(c))
            }
            Target::Cluster(_, seeds) => {
                // A client per connection: the builder's timeouts are the
                // caller's.
                let client = ClusterClient::builder(seeds.clone())
                    .retries(CLUSTER_RETRIES)
                    .min_retry_wait(50)
                    .max_retry_wait(500)
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    .build()?;
                let con = client.get_connection()?;
                con.set_read_timeout(Some(timeout))?;
                con.set_write_timeout(Some(timeout))?;
                Ok(Con::Cluster(Box::new(ClusterCon {
                    con,
                    router: SlotRouter::new(seeds.clone(), timeout),
                })))
            }
        }
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
    /// Single-slot commands, scripts and `MULTI` blocks.
    con: ClusterConnection,
    /// Per-master pipelines and per-master server commands.
    router: SlotRouter,
}

impl Con {
    /// Sets the read timeout (on every node of a cluster).
    ///
    /// Errors: a zero duration.
    pub fn set_read_timeout(&self, d: Option<Duration>) -> RedisResult<()> {
        match self {
            Con::Single(c) => c.set_read_timeout(d),
            Con::Cluster(c) => c.con.set_read_timeout(d),
        }
    }

    /// Sets the write timeout (on every node of a cluster).
    ///
    /// Errors: a zero duration.
    pub fn set_write_timeout(&self, d: Option<Duration>) -> RedisResult<()> {
        match self {
            Con::Single(c) => c.set_write_timeout(d),
            Con::Cluster(c) => c.con.set_write_timeout(d),
        }
    }

    /// True on a cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Con::Cluster(_))
    }

    /// Runs `f` on each master on a plain connection (the one Redis for
    /// [`Con::Single`]), for server commands such as `INFO` or a keyless
    /// `EVAL`; returns the results in master order.
    ///
    /// Errors: the slot map could not be read or a master not reached,
    /// or what `f` returns.
    pub fn each_master<T, E: From<RedisError>>(
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
    pub fn each_reachable_master<T, E: From<RedisError>>(
        &mut self,
        f: impl FnMut(&mut Connection) -> Result<T, E>,
    ) -> Result<Vec<T>, E> {
        self.masters_do(true, f)
    }

    /// Both of the above: `skip_unreachable` leaves out (and logs) a master
    /// whose connect fails, unless none connects.
    fn masters_do<T, E: From<RedisError>>(
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
            match c.router.node(&m) {
                Ok(node) => out.push(f(node)?),
                Err(e) if skip_unreachable => {
                    log::warn!("redis: master {m} not reached: {e}");
                    last = Some(e);
                }
                Err(e) => return Err(e.into()),
            }
        }
        match last {
            Some(e) if out.is_empty() => Err(e.into()),
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
    /// commands (`Replies::reached`).
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
                Ok(Replies {
                    replicated: vec![acked; values.len()],
                    reached: vec![true; values.len()],
                    values,
                })
            }
            Con::Cluster(c) => c.router.pipeline(cmds, ack),
        }
    }

    /// The inner connection of a cluster's single-slot commands.
    fn like(&mut self) -> &mut dyn ConnectionLike {
        match self {
            Con::Single(c) => c,
            Con::Cluster(c) => &mut c.con,
        }
    }
}

impl ConnectionLike for Con {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        self.like().req_packed_command(cmd)
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        self.like().req_packed_commands(cmd, offset, count)
    }

    fn req_command(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        self.like().req_command(cmd)
    }

    fn get_db(&self) -> i64 {
        match self {
            Con::Single(c) => c.get_db(),
            Con::Cluster(c) => c.con.get_db(),
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
        self.like().check_connection()
    }

    fn is_open(&self) -> bool {
        match self {
            Con::Single(c) => c.is_open(),
            Con::Cluster(c) => c.con.is_open(),
        }
    }
}
