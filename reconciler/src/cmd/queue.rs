//! Owns `seckill-reconciler queue show [SALE]`: what waits in the reliable
//! queues, read from Redis without changing it. Per sale (every sale in
//! `seckill:sales`, or the one given; a split sale's buckets added up): the
//! queue's length, each worker's processing list with the age of its oldest
//! message, and the dead letters counted by reason; then the same for the
//! payment queue.
//!
//! Lengths are `LLEN` (O(1)); the oldest message of a processing list is
//! its tail (`LINDEX -1`: the workers `BLMOVE` to the head); dead letters
//! are read [`LIST_CHUNK`](crate::redis_read::LIST_CHUNK) entries a call,
//! so a long list never holds Redis for long.

use crate::config::Config;
use crate::connect;
use crate::error::RunError;
use crate::output::write_stdout;
use crate::redis_read::{for_each_in_list, set_members};
use seckill_common::dead_letter::DeadLetter;
use seckill_common::keys::{worker_heartbeat, SaleKeys, SALES, WORKERS};
use seckill_common::message::OrderMessage;
use seckill_common::now_ms;
use seckill_common::payment::{self, Queued};
use seckill_common::redis_target::Con;
use std::collections::BTreeMap;
use std::io::{self, Write};

/// One reliable queue as read.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct QueueView {
    /// Messages waiting.
    pub queued: u64,
    /// Per worker that holds some: messages taken and not finished, and
    /// the time of its oldest (Unix ms, when its message parses).
    pub processing: BTreeMap<String, (u64, Option<u64>)>,
    /// Workers whose heartbeat key is present.
    pub alive: Vec<String>,
    /// Dead letters by reason.
    pub dead: BTreeMap<String, u64>,
}

impl QueueView {
    fn dead_total(&self) -> u64 {
        self.dead.values().sum()
    }
}

/// Prints the queues of `sale` (every sale Redis lists when `None`) and
/// of payments; exit code 0.
///
/// Errors: Redis failures, stdout.
pub fn run(config: &Config, sale: Option<u64>) -> Result<u8, RunError> {
    let mut con = connect::redis(&config.services)?;
    let workers = {
        let mut w = set_members(&mut con, WORKERS)?;
        w.sort();
        w
    };
    let alive = alive(&mut con, &workers)?;
    let sales = match sale {
        Some(s) => vec![s],
        None => {
            let mut ids: Vec<u64> = set_members(&mut con, SALES)?
                .iter()
                .filter_map(|s| s.parse().ok())
                .collect();
            ids.sort_unstable();
            ids
        }
    };
    let mut views = Vec::new();
    for id in &sales {
        let view = match seckill_common::buckets::count(&mut con, *id)? {
            None => None,
            Some(k) => Some((k, sale_view(&mut con, *id, k, &workers, &alive)?)),
        };
        views.push((*id, view));
    }
    let payments = payment_view(&mut con, &workers, &alive)?;
    let now = now_ms();
    write_stdout(|w| {
        if sales.is_empty() {
            writeln!(w, "no sale in Redis")?;
        }
        for (id, view) in &views {
            match view {
                None => writeln!(w, "sale {id}: not in Redis")?,
                Some((k, v)) => {
                    let buckets = if *k == 1 {
                        String::new()
                    } else {
                        format!(" ({k} buckets, added up)")
                    };
                    writeln!(w, "sale {id}{buckets}")?;
                    write_view(w, v, now)?;
                }
            }
        }
        writeln!(w, "payments")?;
        write_view(w, &payments, now)
    })
    .map_err(RunError::Output)?;
    Ok(0)
}

/// The workers among `workers` whose heartbeat is present.
fn alive(con: &mut Con, workers: &[String]) -> redis::RedisResult<Vec<String>> {
    let mut out = Vec::new();
    for w in workers {
        let present: bool = redis::cmd("EXISTS").arg(worker_heartbeat(w)).query(con)?;
        if present {
            out.push(w.clone());
        }
    }
    Ok(out)
}

/// Sale `id`'s queues over its `k` buckets.
fn sale_view(
    con: &mut Con,
    id: u64,
    k: u32,
    workers: &[String],
    alive: &[String],
) -> redis::RedisResult<QueueView> {
    let mut v = QueueView {
        alive: alive.to_vec(),
        ..QueueView::default()
    };
    for keys in seckill_common::buckets::all(id, k) {
        v.queued += llen(con, &keys.queue())?;
        for w in workers {
            let list = keys.processing(w);
            let oldest = |raw: &[u8]| OrderMessage::parse(raw).ok().map(|m| m.reserved_at_ms);
            add_processing(con, &mut v, w, &list, oldest)?;
        }
        dead_by_reason(con, &keys, &mut v)?;
    }
    Ok(v)
}

/// The payment queue's.
fn payment_view(
    con: &mut Con,
    workers: &[String],
    alive: &[String],
) -> redis::RedisResult<QueueView> {
    let mut v = QueueView {
        alive: alive.to_vec(),
        queued: llen(con, payment::QUEUE)?,
        ..QueueView::default()
    };
    for w in workers {
        let oldest = |raw: &[u8]| match Queued::parse(raw) {
            Ok(Queued::Payment(p)) => Some(p.received_ms),
            Ok(Queued::Cancel(c)) => Some(c.received_ms),
            Err(_) => None,
        };
        add_processing(con, &mut v, w, &payment::processing(w), oldest)?;
    }
    for_each_in_list(con, payment::DEAD_LETTERS, |raw| {
        let reason = serde_json::from_slice::<serde_json::Value>(raw)
            .ok()
            .and_then(|e| e["reason"].as_str().map(str::to_string))
            .unwrap_or_else(|| "(not a dead-letter entry)".to_string());
        *v.dead.entry(reason).or_default() += 1;
    })?;
    Ok(v)
}

/// Adds worker `w`'s processing list `list` to `v`; `time` reads a
/// message's time.
fn add_processing(
    con: &mut Con,
    v: &mut QueueView,
    w: &str,
    list: &str,
    time: impl Fn(&[u8]) -> Option<u64>,
) -> redis::RedisResult<()> {
    let n = llen(con, list)?;
    if n == 0 {
        return Ok(());
    }
    let tail: Option<Vec<u8>> = redis::cmd("LINDEX").arg(list).arg(-1).query(con)?;
    let at = tail.as_deref().and_then(time);
    let e = v.processing.entry(w.to_string()).or_insert((0, None));
    e.0 += n;
    e.1 = match (e.1, at) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    Ok(())
}

/// Counts bucket `keys`'s dead letters by reason into `v`.
fn dead_by_reason(con: &mut Con, keys: &SaleKeys, v: &mut QueueView) -> redis::RedisResult<()> {
    for_each_in_list(con, &keys.dead_letter(), |raw| {
        let reason = DeadLetter::parse(raw)
            .map(|d| d.reason)
            .unwrap_or_else(|| "(not a dead-letter entry)".to_string());
        *v.dead.entry(reason).or_default() += 1;
    })
}

fn llen(con: &mut Con, key: &str) -> redis::RedisResult<u64> {
    redis::cmd("LLEN").arg(key).query(con)
}

/// One queue's lines: queue, processing (per worker), dead letters by
/// reason, most first.
fn write_view(w: &mut dyn Write, v: &QueueView, now: u64) -> io::Result<()> {
    writeln!(w, "  queued        {}", v.queued)?;
    if v.processing.is_empty() {
        writeln!(w, "  processing    0")?;
    }
    for (worker, (n, oldest)) in &v.processing {
        let oldest = oldest.map_or_else(
            || "its oldest message unreadable".to_string(),
            |t| format!("oldest {} old", age(now.saturating_sub(t))),
        );
        let state = if v.alive.contains(worker) {
            "alive"
        } else {
            "no heartbeat"
        };
        writeln!(w, "  processing    {n} by {worker} ({state}), {oldest}")?;
    }
    writeln!(w, "  dead letters  {}", v.dead_total())?;
    let mut reasons: Vec<(&String, &u64)> = v.dead.iter().collect();
    reasons.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    for (reason, n) in reasons {
        writeln!(w, "    {n:>6}  {}", crate::output::one_line(reason))?;
    }
    Ok(())
}

/// `ms` as `850ms`, `42s`, `12m05s` or `3h02m`.
pub fn age(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0 => format!("{ms}ms"),
        1..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_view_prints_every_worker_and_reasons_most_first() {
        let mut v = QueueView {
            queued: 3,
            alive: vec!["w1".into()],
            ..QueueView::default()
        };
        v.processing.insert("w1".into(), (2, Some(1_000)));
        v.processing.insert("w2".into(), (1, None));
        v.dead.insert("max attempts".into(), 1);
        v.dead.insert("stock exhausted in MySQL".into(), 2);
        v.dead.insert("a\nb\u{1b}[2J".into(), 1);
        let mut out = Vec::new();
        write_view(&mut out, &v, 43_000).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "  queued        3\n\
             \x20 processing    2 by w1 (alive), oldest 42s old\n\
             \x20 processing    1 by w2 (no heartbeat), its oldest message unreadable\n\
             \x20 dead letters  4\n\
             \x20        2  stock exhausted in MySQL\n\
             \x20        1  a\\nb\\u{1b}[2J\n\
             \x20        1  max attempts\n"
        );
        assert_eq!(
            [age(850), age(42_000), age(725_000), age(10_920_000)],
            ["850ms", "42s", "12m05s", "3h02m"]
        );
    }
}
