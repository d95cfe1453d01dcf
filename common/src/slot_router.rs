//! Owns the per-master pipelines on a Redis Cluster: the slot map (from
//! `CLUSTER SLOTS`), one plain connection per master, and a pipeline of
//! single-slot commands split into one pipeline per master, with `MOVED`
//! and `ASK` replies followed.
//!
//! Why not the redis crate's cluster pipeline: its synchronous one refuses
//! `EVALSHA`, and a plain pipeline sent through its `ClusterConnection`
//! goes to the node of the first command and turns the first error reply
//! into an error for the whole pipeline, so one `NOSCRIPT` or `MOVED` would
//! hide the outcomes of the purchases that did run. Here each command keeps
//! its own reply, and a command that was redirected is sent again where the
//! reply says: a `MOVED`/`ASK` reply means the command did not run.

use crate::quarantine::Quarantine;
use redis::{Cmd, Connection, RedisError, RedisResult, ServerErrorKind, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Most redirect rounds per pipeline: each round follows the redirects the
/// previous one got (a slot moves once per resharding step or failover).
pub const MAX_REDIRECTS: usize = 3;

/// The first wait before a command answered `TRYAGAIN` is sent again; each
/// further wait doubles, up to [`TRYAGAIN_MAX_WAIT`].
pub const TRYAGAIN_FIRST_WAIT: Duration = Duration::from_millis(2);

/// The longest wait between two tries of a command answered `TRYAGAIN`.
pub const TRYAGAIN_MAX_WAIT: Duration = Duration::from_millis(25);

/// After a master failed some commands, the slot map is read again (to
/// send them to a promoted replica at once) at most this often.
pub const LOST_REFRESH_EVERY: Duration = Duration::from_millis(10);

/// While a node is held in quarantine, the slot map is read again at most
/// this often (each read is one `CLUSTER SLOTS` on a node that answers),
/// so a promoted replica gets its slots' commands within this much of the
/// promotion.
pub const REFRESH_EVERY: Duration = Duration::from_millis(100);

/// The cluster slot of `key`: CRC16 of its hash tag (the part between the
/// first `{` and the next `}`, when not empty) modulo 16384, per the Redis
/// Cluster specification.
pub fn slot_of(key: &str) -> u16 {
    slot_of_bytes(key.as_bytes())
}

/// [`slot_of`] of a key that may not be UTF-8.
pub fn slot_of_bytes(b: &[u8]) -> u16 {
    let tagged = b.iter().position(|&c| c == b'{').and_then(|open| {
        let len = b[open + 1..].iter().position(|&c| c == b'}')?;
        (len > 0).then(|| &b[open + 1..open + 1 + len])
    });
    crc16_xmodem(tagged.unwrap_or(b)) % 16384
}

/// CRC16-CCITT (XModem: polynomial 0x1021, initial 0), the cluster's key
/// hash (the specification's appendix; bitwise, since a slot is computed
/// once per purchase).
fn crc16_xmodem(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The slot map and the masters' connections of one cluster, owned by one
/// thread.
pub struct SlotRouter {
    /// `redis://host:port/` seed URLs, tried when no known master answers.
    seeds: Vec<String>,
    /// Connect, read and write timeout of every connection.
    timeout: Duration,
    /// `(first slot, last slot, "host:port" of its master)`, as
    /// `CLUSTER SLOTS` last said; empty before the first refresh.
    ranges: Vec<(u16, u16, String)>,
    /// When `ranges` was last read.
    refreshed: Option<Instant>,
    /// Open connections by `"host:port"`.
    nodes: HashMap<String, Connection>,
    /// Nodes that failed and are not tried until their hold ends, shared
    /// with every router of the same `Target`.
    quarantine: Arc<Mutex<Quarantine>>,
}

impl SlotRouter {
    /// A router that reads the slot map on first use, sharing
    /// `quarantine` with the other routers of the same cluster.
    pub fn new(
        seeds: Vec<String>,
        timeout: Duration,
        quarantine: Arc<Mutex<Quarantine>>,
    ) -> SlotRouter {
        SlotRouter {
            seeds,
            timeout,
            ranges: Vec::new(),
            refreshed: None,
            nodes: HashMap::new(),
            quarantine,
        }
    }

    /// The shared quarantine (a poisoned lock is taken over: a hold is
    /// only a hint).
    fn held(&self) -> MutexGuard<'_, Quarantine> {
        self.quarantine.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The `"host:port"` of the master serving `slot`, from the map.
    pub fn master_of(&self, slot: u16) -> Option<&str> {
        self.ranges
            .iter()
            .find(|(a, b, _)| (*a..=*b).contains(&slot))
            .map(|(_, _, m)| m.as_str())
    }

    /// Every master's `"host:port"`, reading the slot map first if needed.
    ///
    /// Errors: no node answered `CLUSTER SLOTS`.
    pub fn masters(&mut self) -> RedisResult<Vec<String>> {
        if self.ranges.is_empty() {
            self.refresh()?;
        }
        let mut m: Vec<String> = self.ranges.iter().map(|r| r.2.clone()).collect();
        m.sort();
        m.dedup();
        Ok(m)
    }

    /// Reads the slot map again, from the first known node or seed that
    /// answers `CLUSTER SLOTS`; a node held in quarantine is not asked (it
    /// would cost a timeout), one that fails is put there.
    ///
    /// Errors: the last failure when none answered.
    pub fn refresh(&mut self) -> RedisResult<()> {
        let mut candidates: Vec<String> = self.nodes.keys().cloned().collect();
        candidates.extend(self.seeds.iter().map(|s| addr_of_url(s).to_string()));
        let mut last = None;
        let mut asked = Vec::with_capacity(candidates.len());
        for addr in candidates {
            if asked.contains(&addr) {
                continue;
            }
            asked.push(addr.clone());
            let c = match self.node(&addr) {
                Ok(c) => c,
                // Held, or the connect failed (and it is held now).
                Err(e) => {
                    last = Some(e);
                    continue;
                }
            };
            let started = Instant::now();
            let reply = redis::cmd("CLUSTER").arg("SLOTS").query::<Value>(c);
            match reply.and_then(|v| parse_slots(&v)) {
                Ok(ranges) if !ranges.is_empty() => {
                    let mut q = self.held();
                    q.answered(&addr);
                    q.retain(|held| ranges.iter().any(|r| r.2 == held));
                    drop(q);
                    self.ranges = ranges;
                    self.refreshed = Some(Instant::now());
                    return Ok(());
                }
                Ok(_) => {}
                Err(e) => {
                    if !crate::is_error_reply(&e) {
                        self.failed(&addr, started);
                    }
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| {
            RedisError::from((
                redis::ErrorKind::Io,
                "no cluster node answered CLUSTER SLOTS",
            ))
        }))
    }

    /// Whether the slot map should be read before routing: never read, or
    /// a node failed since and the last read is [`REFRESH_EVERY`] old (a
    /// failover promotes a replica: its slots move).
    fn map_is_due(&self) -> bool {
        match self.refreshed {
            None => true,
            Some(_) if self.ranges.is_empty() => true,
            Some(t) => t.elapsed() >= REFRESH_EVERY && self.held().any(),
        }
    }

    /// The connection to `addr` (`"host:port"`), opened if needed.
    ///
    /// Errors: `addr` is held in quarantine (at once, a
    /// [`redis::ErrorKind::ClusterConnectionNotFound`] saying so, see
    /// [`stays_on_its_node`]; an open connection to it is dropped: another
    /// router found it failing), or the connect failed (`addr` is then
    /// held).
    pub fn node(&mut self, addr: &str) -> RedisResult<&mut Connection> {
        let now = Instant::now();
        let held = self.held().try_node(addr, now);
        if let Some(left) = held {
            self.nodes.remove(addr);
            return Err(RedisError::from((
                redis::ErrorKind::ClusterConnectionNotFound,
                "node held after a failure",
                format!("{addr} is not tried for {} ms more", left.as_millis()),
            )));
        }
        if !self.nodes.contains_key(addr) {
            let opened = redis::Client::open(format!("redis://{addr}/")).and_then(|client| {
                let c = client.get_connection_with_timeout(self.timeout)?;
                c.set_read_timeout(Some(self.timeout))?;
                c.set_write_timeout(Some(self.timeout))?;
                Ok(c)
            });
            match opened {
                Ok(c) => {
                    self.nodes.insert(addr.to_string(), c);
                }
                Err(e) => {
                    let hold = self.held().failed(addr, now.elapsed(), Instant::now());
                    crate::quarantine::watch(&self.quarantine, addr, self.timeout);
                    log::warn!("redis: node {addr}: {e}; not tried for {hold:?}");
                    return Err(e);
                }
            }
        }
        self.nodes
            .get_mut(addr)
            .ok_or_else(|| RedisError::from((redis::ErrorKind::Io, "connection vanished")))
    }

    /// Records that talking to `addr` failed after starting at `started`
    /// (a broken connection or a timeout, not an error reply): its
    /// connection is dropped (a reply may still be on its way) and the
    /// node held in quarantine ([`Quarantine::failed`]).
    pub fn failed(&mut self, addr: &str, started: Instant) {
        self.nodes.remove(addr);
        let now = Instant::now();
        let hold = self
            .held()
            .failed(addr, now.saturating_duration_since(started), now);
        crate::quarantine::watch(&self.quarantine, addr, self.timeout);
        log::warn!("redis: node {addr} failed; not tried for {hold:?}");
    }

    /// Records that `addr` answered (ends a quarantine).
    pub fn answered(&mut self, addr: &str) {
        self.held().answered(addr);
    }

    /// Sends `cmds` (each with the slot of all its keys) as one pipeline per
    /// master and returns one reply per command, in order; error replies
    /// stay values (`Value::ServerError`), as with `Pipeline::ignore_errors`.
    /// `MOVED` refreshes the map and resends that command to its new master,
    /// `ASK` sends it once with `ASKING` to the node named, for at most
    /// [`MAX_REDIRECTS`] rounds. `TRYAGAIN` (a multi-key command on a slot
    /// being migrated, some of its keys moved: it did not run) sends it
    /// again to the slot's master after a short wait
    /// ([`TRYAGAIN_FIRST_WAIT`], doubling up to [`TRYAGAIN_MAX_WAIT`]) for
    /// as long as the router's timeout allows from the call's start; past
    /// that the `TRYAGAIN` reply is the command's reply.
    ///
    /// A master that cannot be reached, or whose connection breaks or
    /// times out, fails only its own commands (`Reply::reached` false, value
    /// `Nil`; such a command may still have run when the connection broke
    /// after the write): the other masters' commands keep their replies, so
    /// a failover or a stalled master costs only the purchases of the
    /// buckets on that master. Its connection is dropped and it is held in
    /// quarantine (`quarantine.rs`): until the hold ends its commands fail
    /// at once, without waiting on it, and the slot map is read again every
    /// [`REFRESH_EVERY`] to find a promoted replica. A connection that had
    /// been in use and broke (not a timeout: typically the master
    /// restarted) is opened again and its commands sent once more, so a
    /// restart costs no 503 (commands may run twice: send only commands
    /// safe to repeat, such as reservations with their ids).
    ///
    /// Errors: the slot map could not be read (no node answered) and no
    /// command reached its master; the caller may reconnect later.
    ///
    /// With `ack` (replicas, timeout), each master's pipeline ends with
    /// `WAIT replicas timeout_ms`, and `Reply::replicated` says whether
    /// the master of each command had that many replicas confirm.
    pub fn pipeline(
        &mut self,
        cmds: &Packed,
        ack: Option<(usize, Duration)>,
    ) -> RedisResult<Replies> {
        let mut out: Replies = (0..cmds.len())
            .map(|_| Reply {
                value: Value::Nil,
                replicated: ack.is_none(),
                reached: false,
            })
            .collect();
        let mut no_map = None;
        // (command index, Some(node) after ASK)
        let mut todo: Vec<(usize, Option<String>)> = (0..cmds.len()).map(|i| (i, None)).collect();
        let started = Instant::now();
        let mut wait = TRYAGAIN_FIRST_WAIT;
        let mut round = 0;
        loop {
            if self.map_is_due() {
                if let Err(e) = self.refresh() {
                    if self.ranges.is_empty() {
                        no_map = Some(e);
                        break;
                    }
                    // The map read before still routes the others.
                }
            }
            let groups = self.group_by_master(cmds, &todo);
            let Round {
                mut next,
                again,
                moved,
                lost,
            } = self.send_round(cmds, groups, ack, round, &mut out);
            // A master that failed may have been replaced (a failover this
            // router's map has not seen yet): such a command goes again.
            if !lost.is_empty() && round < MAX_REDIRECTS {
                next.extend(self.moved_masters(cmds, lost));
            }
            // `TRYAGAIN`: the command did not run; once more after a wait
            // while the timeout allows (its reply stays `TRYAGAIN` else).
            let redirected = !next.is_empty();
            let retry_again = !again.is_empty() && started.elapsed() + wait < self.timeout;
            if retry_again {
                std::thread::sleep(wait);
                wait = (wait * 2).min(TRYAGAIN_MAX_WAIT);
                next.extend(again.into_iter().map(|i| (i, None)));
            }
            if next.is_empty() {
                break;
            }
            // A redirected command did not run: not reached until resent.
            for (i, _) in &next {
                out[*i].reached = false;
            }
            if moved && self.refresh().is_err() {
                break;
            }
            // Rounds of `TRYAGAIN` only are bounded by the timeout, not
            // counted as redirect rounds.
            if redirected {
                round += 1;
            }
            todo = next;
        }
        if let Some(e) = no_map {
            if !out.iter().any(|r| r.reached) {
                return Err(e);
            }
        }
        Ok(out)
    }

    /// The commands of `todo` by the node to send them to (the master of
    /// their slot, or the node an `ASK` named, with `true`); a command whose
    /// slot no master serves (a master lost without a replica) is left out.
    fn group_by_master(
        &self,
        cmds: &Packed,
        todo: &[(usize, Option<String>)],
    ) -> HashMap<(String, bool), Vec<usize>> {
        let mut groups: HashMap<(String, bool), Vec<usize>> = HashMap::new();
        for (i, ask) in todo {
            let key = match ask {
                Some(node) => (node.clone(), true),
                // None: no master serves the slot (a master lost
                // without a replica): this command only.
                None => match self.master_of(cmds.slot(*i)) {
                    Some(m) => (m.to_string(), false),
                    None => continue,
                },
            };
            groups.entry(key).or_default().push(*i);
        }
        groups
    }

    /// Sends each group of commands to its node (round `round` of
    /// redirects), writing their replies into `out`, and sorts what must go
    /// again: redirected, `TRYAGAIN`, or sent to a master that failed.
    fn send_round(
        &mut self,
        cmds: &Packed,
        groups: HashMap<(String, bool), Vec<usize>>,
        ack: Option<(usize, Duration)>,
        round: usize,
        out: &mut Replies,
    ) -> Round {
        let mut r = Round::default();
        for ((addr, asking), idx) in groups {
            let Ok((got, acked)) = self.send_to(&addr, cmds, &idx, asking, ack) else {
                // This master's commands fail; the others go on.
                for &i in &idx {
                    out[i].replicated = false;
                    if !asking {
                        r.lost.push((i, addr.clone()));
                    }
                }
                continue;
            };
            for (&i, v) in idx.iter().zip(got) {
                out[i].reached = true;
                out[i].replicated = acked;
                match redirect(&v) {
                    Some((ServerErrorKind::Moved, _)) if round < MAX_REDIRECTS => {
                        r.moved = true;
                        r.next.push((i, None));
                    }
                    Some((ServerErrorKind::Ask, to)) if round < MAX_REDIRECTS => {
                        r.next.push((i, Some(to)));
                    }
                    Some((ServerErrorKind::TryAgain, _)) => {
                        r.again.push(i);
                        out[i].value = v;
                    }
                    _ => out[i].value = v,
                }
            }
        }
        r
    }

    /// The commands of `lost` (each with the master that failed it) whose
    /// slot the map, read again, gives to another master: they go there in
    /// the next round (they did not run, or ran on a master that has lost
    /// its slots). The map is read at most once per [`LOST_REFRESH_EVERY`];
    /// none when it is not read.
    fn moved_masters(
        &mut self,
        cmds: &Packed,
        lost: Vec<(usize, String)>,
    ) -> Vec<(usize, Option<String>)> {
        let stale = self
            .refreshed
            .is_none_or(|t| t.elapsed() >= LOST_REFRESH_EVERY);
        if !stale || self.refresh().is_err() {
            return Vec::new();
        }
        lost.into_iter()
            .filter(|(i, was)| self.master_of(cmds.slot(*i)).is_some_and(|m| m != was))
            .map(|(i, _)| (i, None))
            .collect()
    }

    /// One read-only command (`cmd`, RESP-encoded, its key in `slot`; see
    /// [`read_slot`]) sent to the slot's master through [`SlotRouter::pipeline`]:
    /// a master held in quarantine fails it at once.
    ///
    /// Errors: the slot map could not be read, or the master was not
    /// reached ([`redis::ErrorKind::ClusterConnectionNotFound`] naming the
    /// slot: its master is held or its connection was dropped, so nothing
    /// is left to read on this router; see [`stays_on_its_node`]).
    pub fn read(&mut self, slot: u16, cmd: &[u8]) -> RedisResult<Value> {
        let mut p = Packed::with_capacity(1, cmd.len());
        p.push(slot, |b| b.extend_from_slice(cmd));
        match self.pipeline(&p, None)?.into_iter().next() {
            Some(Reply {
                reached: true,
                value,
                ..
            }) => Ok(value),
            _ => Err(not_reached(slot)),
        }
    }

    /// [`send`] of the commands `idx` of `cmds` to `addr`, with the
    /// quarantine kept: a held node fails at once, one that answers ends
    /// its hold, one that fails is held; a connection that had been in use
    /// and broke with anything but a timeout is opened again and the
    /// commands sent once more.
    ///
    /// Errors: `addr` held, not reached, or failed (it is held then).
    fn send_to(
        &mut self,
        addr: &str,
        cmds: &Packed,
        idx: &[usize],
        asking: bool,
        ack: Option<(usize, Duration)>,
    ) -> RedisResult<(Vec<Value>, bool)> {
        let started = Instant::now();
        let was_open = self.nodes.contains_key(addr);
        let mut got = self
            .node(addr)
            .and_then(|c| send(c, cmds, Some(idx), asking, ack));
        if let Err(e) = &got {
            if was_open && !e.is_timeout() {
                self.nodes.remove(addr);
                got = self
                    .node(addr)
                    .and_then(|c| send(c, cmds, Some(idx), asking, ack));
            }
        }
        match &got {
            Ok(_) => self.held().answered(addr),
            // Not open: held, or its connect failed (held by `node`).
            Err(_) if self.nodes.contains_key(addr) => self.failed(addr, started),
            Err(_) => {}
        }
        got
    }
}

/// The error of a command whose master was not reached
/// (`Reply::reached` false): see [`stays_on_its_node`].
pub fn not_reached(slot: u16) -> RedisError {
    RedisError::from((
        redis::ErrorKind::ClusterConnectionNotFound,
        "the slot's master was not reached",
        format!("slot {slot}"),
    ))
}

/// Whether `e` is [`not_reached`] ([`SlotRouter::read`]'s "the slot's
/// master was not reached") or a held node's error ([`SlotRouter::node`]:
/// `/readyz`'s check of every master): the router has already dropped
/// that master's connection and held it, the connection `e` came through
/// is sound (nothing is left unread on it), so a caller keeps it instead
/// of reconnecting, which would only fail the same way (a new slot map,
/// every master's checks and script load, per read of a held master's
/// keys or per `/readyz` poll).
pub fn stays_on_its_node(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::ClusterConnectionNotFound
}

/// What [`SlotRouter::pipeline`] got back: one [`Reply`] per command, in
/// order.
pub type Replies = Vec<Reply>;

/// What one round of [`SlotRouter::pipeline`] leaves to do.
#[derive(Default)]
struct Round {
    /// Commands to send again (`Some(node)` after `ASK`).
    next: Vec<(usize, Option<String>)>,
    /// Commands answered `TRYAGAIN`.
    again: Vec<usize>,
    /// Whether a `MOVED` came back (the map is read again).
    moved: bool,
    /// Commands whose master failed, with its address.
    lost: Vec<(usize, String)>,
}

/// What one command of a pipeline got back.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// Its reply (an error reply as a value; `Nil` when not reached).
    pub value: Value,
    /// Its master's `WAIT` was answered with at least the replicas asked
    /// for (always true without a `WAIT`).
    pub replicated: bool,
    /// Its master answered it (false: that master could not be reached or
    /// its connection broke).
    pub reached: bool,
}

/// Commands already encoded in RESP, one after the other in one buffer,
/// each with the cluster slot of its keys: a group commit's batch
/// (`reservation::write_call` writes each purchase's `EVALSHA` straight
/// into it; no command object or copy per purchase). Sent whole to one
/// Redis, or split per master on a cluster ([`SlotRouter::pipeline`]).
#[derive(Debug, Default)]
pub struct Packed {
    buf: Vec<u8>,
    /// (slot, start, end) of each command in `buf`.
    cmds: Vec<(u16, usize, usize)>,
}

impl Packed {
    /// No commands; `bytes` of buffer reserved.
    pub fn with_capacity(commands: usize, bytes: usize) -> Packed {
        Packed {
            buf: Vec::with_capacity(bytes),
            cmds: Vec::with_capacity(commands),
        }
    }

    /// Appends one command whose keys are in `slot`: `write` appends its
    /// RESP encoding (one complete command) to the buffer.
    pub fn push(&mut self, slot: u16, write: impl FnOnce(&mut Vec<u8>)) {
        let start = self.buf.len();
        write(&mut self.buf);
        self.cmds.push((slot, start, self.buf.len()));
    }

    /// [`Packed::push`] of a `redis::Cmd` (tests, rare commands).
    pub fn push_cmd(&mut self, slot: u16, cmd: &Cmd) {
        self.push(slot, |b| cmd.write_packed_command(b));
    }

    /// How many commands.
    pub fn len(&self) -> usize {
        self.cmds.len()
    }

    /// No commands.
    pub fn is_empty(&self) -> bool {
        self.cmds.is_empty()
    }

    /// The slot of command `i` (`i < len()`).
    pub fn slot(&self, i: usize) -> u16 {
        self.cmds[i].0
    }

    /// The RESP bytes of command `i` (`i < len()`).
    pub fn bytes(&self, i: usize) -> &[u8] {
        let (_, a, b) = self.cmds[i];
        &self.buf[a..b]
    }
}

/// Sends commands of `cmds` as one pipeline on `c`: those at `which`, or
/// all of them (`None`), each preceded by `ASKING` when `asking`, then
/// `WAIT n t` when `ack` is `Some((n, t))`. Returns their replies in order,
/// an error reply as `Value::ServerError` in its place (`ASKING`'s and
/// `WAIT`'s replies left out), and whether `WAIT` saw `n` replicas (true
/// without `ack`). All of a batch with nothing added is sent from its own
/// buffer, with no copy.
///
/// The replies are read one at a time and the first failed read ends the
/// call: a Redis that stalls (stopped, partitioned) costs one
/// `SECKILL_REDIS_TIMEOUT`, not one per command (the redis crate's
/// `req_packed_commands` reads every reply, each with its own timeout).
///
/// Errors: the connection failed; some commands may have run.
pub(crate) fn send(
    c: &mut Connection,
    cmds: &Packed,
    which: Option<&[usize]>,
    asking: bool,
    ack: Option<(usize, Duration)>,
) -> RedisResult<(Vec<Value>, bool)> {
    let n = which.map_or(cmds.len(), <[usize]>::len);
    let count = n * if asking { 2 } else { 1 } + usize::from(ack.is_some());
    let mut all = if which.is_none() && !asking && ack.is_none() {
        read_replies(c, &cmds.buf, count)?
    } else {
        const ASKING: &[u8] = b"*1\r\n$6\r\nASKING\r\n";
        let mut packed = Vec::with_capacity(cmds.buf.len() + n * ASKING.len() + 64);
        let mut one = |i: usize| {
            if asking {
                packed.extend_from_slice(ASKING);
            }
            packed.extend_from_slice(cmds.bytes(i));
        };
        match which {
            Some(idx) => idx.iter().for_each(|&i| one(i)),
            None => (0..cmds.len()).for_each(one),
        }
        if let Some((n, t)) = ack {
            redis::cmd("WAIT")
                .arg(n)
                .arg(t.as_millis().max(1) as u64)
                .write_packed_command(&mut packed);
        }
        read_replies(c, &packed, count)?
    };
    let acked = match ack {
        Some((n, _)) => matches!(all.pop(), Some(Value::Int(got)) if got >= n as i64),
        None => true,
    };
    if asking {
        all = all.into_iter().skip(1).step_by(2).collect();
    }
    Ok((all, acked))
}

/// Writes `packed` (`count` commands) and reads their `count` replies, an
/// error reply as a value; RESP3 push messages between them are skipped.
///
/// Errors: the write or a read failed (a timeout included): at once, the
/// replies not yet read left unread (the caller drops the connection).
fn read_replies(c: &mut Connection, packed: &[u8], count: usize) -> RedisResult<Vec<Value>> {
    c.send_packed_command(packed)?;
    let mut replies = Vec::with_capacity(count);
    while replies.len() < count {
        match c.recv_response()? {
            Value::Push { .. } => {}
            v => replies.push(v),
        }
    }
    Ok(replies)
}

/// Read-only commands of one key whose key is their first argument: the
/// ones [`read_slot`] routes (safe to send again after a broken link).
/// Anything else (writes, scripts, blocking and keyless commands, several
/// keys) is left to the redis crate's cluster connection.
pub const ROUTED_READS: &[&str] = &[
    "EXISTS",
    "GET",
    "HEXISTS",
    "HGET",
    "HGETALL",
    "HKEYS",
    "HLEN",
    "HMGET",
    "HVALS",
    "LINDEX",
    "LLEN",
    "LRANGE",
    "PTTL",
    "SCARD",
    "SISMEMBER",
    "SMEMBERS",
    "STRLEN",
    "TTL",
    "TYPE",
    "XLEN",
    "ZCARD",
    "ZRANGE",
    "ZSCORE",
];

/// The slot of a RESP-encoded command (`*N` then `$len` arguments) when
/// it is one of [`ROUTED_READS`] with exactly one key; `None` for anything
/// else or a malformed encoding.
pub fn read_slot(cmd: &[u8]) -> Option<u16> {
    let mut rest = cmd.strip_prefix(b"*")?;
    let (n, r) = resp_number(rest)?;
    rest = r;
    // EXISTS with several keys would span slots.
    if n < 2 {
        return None;
    }
    let (name, r) = resp_bulk(rest)?;
    let known = ROUTED_READS
        .iter()
        .any(|c| c.as_bytes().eq_ignore_ascii_case(name));
    if !known || (name.eq_ignore_ascii_case(b"EXISTS") && n != 2) {
        return None;
    }
    let (key, _) = resp_bulk(r)?;
    Some(slot_of_bytes(key))
}

/// `<digits>\r\n` at the start of `b`: the number and what follows.
fn resp_number(b: &[u8]) -> Option<(usize, &[u8])> {
    let end = b.iter().position(|&c| c == b'\r')?;
    let n = std::str::from_utf8(&b[..end]).ok()?.parse().ok()?;
    Some((n, b.get(end + 2..)?))
}

/// `$<len>\r\n<bytes>\r\n` at the start of `b`: the bytes and what follows.
fn resp_bulk(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, r) = resp_number(b.strip_prefix(b"$")?)?;
    Some((r.get(..len)?, r.get(len + 2..)?))
}

/// `(MOVED or ASK, "host:port")` when `v` is a redirect reply;
/// `(TRYAGAIN, "")` for a `TRYAGAIN` reply.
fn redirect(v: &Value) -> Option<(ServerErrorKind, String)> {
    let Value::ServerError(e) = v else {
        return None;
    };
    let kind = e.kind()?;
    if kind == ServerErrorKind::TryAgain {
        return Some((kind, String::new()));
    }
    if kind != ServerErrorKind::Moved && kind != ServerErrorKind::Ask {
        return None;
    }
    // details: "SLOT host:port"
    let to = e.details()?.split_whitespace().nth(1)?.to_string();
    Some((kind, to))
}

/// `"host:port"` of a `redis://host:port/` URL.
fn addr_of_url(url: &str) -> &str {
    let rest = url.strip_prefix("redis://").unwrap_or(url);
    rest.split('/').next().unwrap_or(rest)
}

/// Parses a `CLUSTER SLOTS` reply into `(first, last, "host:port")`.
fn parse_slots(v: &Value) -> RedisResult<Vec<(u16, u16, String)>> {
    let bad = || RedisError::from((redis::ErrorKind::Parse, "unexpected CLUSTER SLOTS reply"));
    let Value::Array(rows) = v else {
        return Err(bad());
    };
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let Value::Array(f) = row else {
            return Err(bad());
        };
        let (Some(Value::Int(a)), Some(Value::Int(b)), Some(Value::Array(m))) =
            (f.first(), f.get(1), f.get(2))
        else {
            return Err(bad());
        };
        let host: String = redis::from_redis_value_ref(m.first().ok_or_else(bad)?)?;
        let port: i64 = redis::from_redis_value_ref(m.get(1).ok_or_else(bad)?)?;
        out.push((*a as u16, *b as u16, format!("{host}:{port}")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_one_sale_share_a_slot_and_known_slots_match_the_spec() {
        // The specification's example: "123456789" hashes to 12739.
        assert_eq!(slot_of("123456789"), 12739);
        assert_eq!(slot_of("{123456789}:anything"), 12739);
        assert_eq!(slot_of("a{}b"), crc16_xmodem(b"a{}b") % 16384);
        let k = crate::keys::SaleKeys::new(7);
        assert_eq!(slot_of(&k.stock()), slot_of(&k.queue()));
        assert_eq!(addr_of_url("redis://127.0.0.1:7000/"), "127.0.0.1:7000");
    }

    #[test]
    fn only_one_key_reads_are_routed_by_their_key() {
        let packed = |c: &Cmd| c.get_packed_command();
        let k = crate::keys::SaleKeys::new(7);
        let hmget = redis::cmd("HMGET").arg(k.meta()).arg("a").arg("b").clone();
        assert_eq!(read_slot(&packed(&hmget)), Some(slot_of(&k.meta())));
        let hget = redis::cmd("hget").arg("{x}:buyers").arg("u").clone();
        assert_eq!(read_slot(&packed(&hget)), Some(slot_of("x")));
        assert_eq!(
            read_slot(&packed(redis::cmd("EXISTS").arg("k1"))),
            Some(slot_of("k1"))
        );
        for not_routed in [
            redis::cmd("EXISTS").arg("k1").arg("k2").clone(),
            redis::cmd("SET").arg("k").arg("v").clone(),
            redis::cmd("EVALSHA").arg("abc").arg(1).arg("k").clone(),
            redis::cmd("BLMOVE")
                .arg("a")
                .arg("b")
                .arg("LEFT")
                .arg("RIGHT")
                .arg(1)
                .clone(),
            redis::cmd("PING").clone(),
            redis::cmd("GET").clone(),
        ] {
            assert_eq!(read_slot(&packed(&not_routed)), None, "{not_routed:?}");
        }
        assert_eq!(read_slot(b"*2\r\n$3\r\nGET\r\n$5\r\nab"), None);
        assert_eq!(read_slot(b"GET k\r\n"), None);
        assert_eq!(read_slot(b"*2\r\n$3\r\nGET\r\n$x\r\n"), None);
    }
}
