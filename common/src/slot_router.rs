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

use redis::{Cmd, Connection, RedisError, RedisResult, ServerErrorKind, Value};
use std::collections::HashMap;
use std::time::Duration;

/// Most redirect rounds per pipeline: each round follows the redirects the
/// previous one got (a slot moves once per resharding step or failover).
pub const MAX_REDIRECTS: usize = 3;

/// The cluster slot of `key`: CRC16 of its hash tag (the part between the
/// first `{` and the next `}`, when not empty) modulo 16384, per the Redis
/// Cluster specification.
pub fn slot_of(key: &str) -> u16 {
    let b = key.as_bytes();
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
    /// Open connections by `"host:port"`.
    nodes: HashMap<String, Connection>,
}

impl SlotRouter {
    /// A router that reads the slot map on first use.
    pub fn new(seeds: Vec<String>, timeout: Duration) -> SlotRouter {
        SlotRouter {
            seeds,
            timeout,
            ranges: Vec::new(),
            nodes: HashMap::new(),
        }
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
    /// answers `CLUSTER SLOTS`.
    ///
    /// Errors: the last failure when none answered.
    pub fn refresh(&mut self) -> RedisResult<()> {
        let mut candidates: Vec<String> = self.nodes.keys().cloned().collect();
        candidates.extend(self.seeds.iter().map(|s| addr_of_url(s).to_string()));
        let mut last = None;
        for addr in candidates {
            let reply = self
                .node(&addr)
                .and_then(|c| redis::cmd("CLUSTER").arg("SLOTS").query::<Value>(c));
            match reply.and_then(|v| parse_slots(&v)) {
                Ok(ranges) if !ranges.is_empty() => {
                    self.ranges = ranges;
                    return Ok(());
                }
                Ok(_) => {}
                Err(e) => {
                    self.nodes.remove(&addr);
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

    /// The connection to `addr` (`"host:port"`), opened if needed.
    ///
    /// Errors: the connect failed.
    pub fn node(&mut self, addr: &str) -> RedisResult<&mut Connection> {
        if !self.nodes.contains_key(addr) {
            let client = redis::Client::open(format!("redis://{addr}/"))?;
            let c = client.get_connection_with_timeout(self.timeout)?;
            c.set_read_timeout(Some(self.timeout))?;
            c.set_write_timeout(Some(self.timeout))?;
            self.nodes.insert(addr.to_string(), c);
        }
        self.nodes
            .get_mut(addr)
            .ok_or_else(|| RedisError::from((redis::ErrorKind::Io, "connection vanished")))
    }

    /// Sends `cmds` (each with the slot of all its keys) as one pipeline per
    /// master and returns one reply per command, in order; error replies
    /// stay values (`Value::ServerError`), as with `Pipeline::ignore_errors`.
    /// `MOVED` refreshes the map and resends that command to its new master,
    /// `ASK` sends it once with `ASKING` to the node named, for at most
    /// [`MAX_REDIRECTS`] rounds.
    ///
    /// A master that cannot be reached, or whose connection breaks, fails
    /// only its own commands (`reached[i]` false, value `Nil`; such a
    /// command may still have run when the connection broke after the
    /// write): the other masters' commands keep their replies, so a
    /// failover costs only the purchases of the buckets on that master.
    /// Its connection is dropped and the slot map read again next time.
    ///
    /// Errors: no command reached its master (every group failed, or the
    /// slot map could not be read), so the caller may reconnect and send
    /// again (commands may have run: send only commands safe to repeat).
    ///
    /// With `ack` (replicas, timeout), each master's pipeline ends with
    /// `WAIT replicas timeout_ms`, and `replicated[i]` says whether the
    /// master of command `i` had that many replicas confirm.
    pub fn pipeline(
        &mut self,
        cmds: &Packed,
        ack: Option<(usize, Duration)>,
    ) -> RedisResult<Replies> {
        let mut replies = vec![Value::Nil; cmds.len()];
        let mut replicated = vec![ack.is_none(); cmds.len()];
        let mut reached = vec![false; cmds.len()];
        let mut last_error = None;
        // (command index, Some(node) after ASK)
        let mut todo: Vec<(usize, Option<String>)> = (0..cmds.len()).map(|i| (i, None)).collect();
        for round in 0..=MAX_REDIRECTS {
            if self.ranges.is_empty() {
                // Cleared by a failed master in the previous round.
                if let Err(e) = self.refresh() {
                    last_error = Some(e);
                    break;
                }
            }
            let mut groups: HashMap<(String, bool), Vec<usize>> = HashMap::new();
            for (i, ask) in &todo {
                let key = match ask {
                    Some(node) => (node.clone(), true),
                    None => match self.master_of(cmds.slot(*i)) {
                        Some(m) => (m.to_string(), false),
                        None => {
                            // No master serves the slot (a master lost
                            // without a replica): this command only.
                            last_error = Some(uncovered(cmds.slot(*i)));
                            continue;
                        }
                    },
                };
                groups.entry(key).or_default().push(*i);
            }
            let mut next = Vec::new();
            let mut moved = false;
            for ((addr, asking), idx) in groups {
                let got = self
                    .node(&addr)
                    .and_then(|c| send(c, cmds, Some(&idx), asking, ack));
                let (got, acked) = match got {
                    Ok(v) => v,
                    Err(e) => {
                        // This master's commands fail; the others go on.
                        self.nodes.remove(&addr);
                        self.ranges.clear();
                        for &i in &idx {
                            replicated[i] = false;
                        }
                        last_error = Some(e);
                        continue;
                    }
                };
                for (&i, v) in idx.iter().zip(got) {
                    reached[i] = true;
                    replicated[i] = acked;
                    match redirect(&v) {
                        Some((ServerErrorKind::Moved, _)) if round < MAX_REDIRECTS => {
                            moved = true;
                            next.push((i, None));
                        }
                        Some((ServerErrorKind::Ask, to)) if round < MAX_REDIRECTS => {
                            next.push((i, Some(to)));
                        }
                        _ => replies[i] = v,
                    }
                }
            }
            if next.is_empty() {
                break;
            }
            // A redirected command did not run: not reached until resent.
            for (i, _) in &next {
                reached[*i] = false;
            }
            if moved {
                if let Err(e) = self.refresh() {
                    last_error = Some(e);
                    break;
                }
            }
            todo = next;
        }
        if let Some(e) = last_error {
            if !reached.iter().any(|&r| r) {
                return Err(e);
            }
        }
        Ok(Replies {
            values: replies,
            replicated,
            reached,
        })
    }
}

/// What [`SlotRouter::pipeline`] got back.
#[derive(Debug)]
pub struct Replies {
    /// One reply per command, in order (error replies as values).
    pub values: Vec<Value>,
    /// Per command: its master's `WAIT` was answered with at least the
    /// replicas asked for (always true without a `WAIT`).
    pub replicated: Vec<bool>,
    /// Per command: its master answered it (false: that master could not
    /// be reached or its connection broke; the value is `Nil`).
    pub reached: Vec<bool>,
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

/// `(MOVED or ASK, "host:port")` when `v` is a redirect reply.
fn redirect(v: &Value) -> Option<(ServerErrorKind, String)> {
    let Value::ServerError(e) = v else {
        return None;
    };
    let kind = e.kind()?;
    if kind != ServerErrorKind::Moved && kind != ServerErrorKind::Ask {
        return None;
    }
    // details: "SLOT host:port"
    let to = e.details()?.split_whitespace().nth(1)?.to_string();
    Some((kind, to))
}

fn uncovered(slot: u16) -> RedisError {
    RedisError::from((
        redis::ErrorKind::Server(ServerErrorKind::ClusterDown),
        "slot not served by any master",
        slot.to_string(),
    ))
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
}
