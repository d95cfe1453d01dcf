//! Owns `seckill-reconciler sale repair ID`: rebuilds a sale's Redis state
//! from MySQL after Redis lost data of it (issue 10 §4, the pause in
//! `seckill_common::data_loss`), releases the duplicate reservations made
//! before the pause, and resumes the sale.
//!
//! MySQL is the system of record. For every order: the buyer's mark, the
//! flow record (the order message rebuilt from the row) and the status
//! `confirmed`. A flow record Redis holds without an order is kept when it is
//! still on its way (queued; the worker will apply it), and released when
//! its user already holds an order of another reservation (a duplicate made
//! between the loss and the pause): flow record removed, status `failed`,
//! message taken off the queue and the dead-letter list. Stock = total −
//! orders − reservations kept in flight; the sequence = the larger of Redis's
//! and MySQL's mark. All Redis writes are one `MULTI`. Refused (nothing
//! written, exit 1) while a worker holds messages of the sale in its
//! processing list: run it again when they are settled.
//!
//! Idempotent: a second repair finds every order restored and no duplicate,
//! and writes the same state again.

use crate::output::outln;
use crate::sale_cmd::{fetch_sale, redis_con};
use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::data_loss;
use seckill_common::keys::{self, SaleKeys};
use seckill_common::message::{OrderMessage, MESSAGE_VERSION};
use seckill_common::Config;
use std::collections::{HashMap, HashSet};
use std::error::Error;

type Res<T> = Result<T, Box<dyn Error>>;

/// What a repair did, for its one-line report.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Repaired {
    /// Orders whose buyer mark, flow record and status were written.
    pub orders: usize,
    /// Duplicate reservations released.
    pub released: usize,
    /// Reservations without an order kept (still on their way).
    pub in_flight: usize,
    /// Units on sale after the repair.
    pub stock: i64,
    /// The reservation sequence after the repair.
    pub seq: u64,
}

/// `sale repair ID`; returns the exit code (0 repaired, 1 refused: a worker
/// holds messages of the sale; 2 no such sale in MySQL).
///
/// Errors: Redis or MySQL failures (nothing or all of the Redis state was
/// written; run it again).
pub fn repair(config: &Config, id: u64) -> Res<u8> {
    let mut db = seckill_common::schema::connect(&config.mysql_url, config.mysql_timeout)?;
    let Some(sale) = fetch_sale(&mut db, id)? else {
        eprintln!("seckill-reconciler: no sale {id} in MySQL");
        return Ok(2);
    };
    let mut con = redis_con(config)?;
    let k = SaleKeys::new(id);
    let workers: Vec<String> = con.smembers(keys::WORKERS)?;
    let mut held = 0usize;
    for w in &workers {
        held += con.llen::<_, usize>(k.processing(w))?;
    }
    if held > 0 {
        eprintln!(
            "seckill-reconciler: workers hold {held} messages of sale {id} in their processing \
             lists; nothing changed, run the repair again in a few seconds"
        );
        return Ok(1);
    }
    let orders: Vec<(String, String, Option<i64>)> = db.exec(
        "SELECT reservation_id, user_id, CAST(UNIX_TIMESTAMP(reserved_at) * 1000 AS SIGNED)
         FROM orders WHERE sale_id = ?",
        (id,),
    )?;
    let marks = data_loss::mysql_state(&mut db, id)?;
    let flows: HashMap<String, String> = con.hgetall(k.flow())?;
    let queue: Vec<String> = con.lrange(k.queue(), 0, -1)?;
    let dead: Vec<String> = con.lrange(k.dead_letter(), 0, -1)?;
    let (redis_seq, redis_ck): (Option<u64>, Option<u64>) = redis::cmd("HMGET")
        .arg(k.meta())
        .arg("seq")
        .arg("checkpoint")
        .query(&mut con)?;

    let ordered: HashSet<&str> = orders.iter().map(|(r, _, _)| r.as_str()).collect();
    let holder: HashMap<&str, &str> = orders
        .iter()
        .map(|(r, u, _)| (u.as_str(), r.as_str()))
        .collect();
    let mut pipe = redis::pipe();
    pipe.atomic();
    let mut out = Repaired::default();
    for (rid, user, at) in &orders {
        let msg = OrderMessage {
            v: MESSAGE_VERSION,
            reservation_id: rid.clone(),
            sale_id: id,
            user_id: user.clone(),
            reserved_at_ms: at.unwrap_or(0).max(0) as u64,
        };
        // Keep Redis's own flow record when it has one (same content).
        if !flows.contains_key(rid) {
            pipe.hset(k.flow(), rid, msg.to_json()).ignore();
        }
        pipe.hset(k.buyers(), user, rid).ignore();
        pipe.hset(k.status(), rid, "confirmed").ignore();
        out.orders += 1;
    }
    for (rid, raw) in &flows {
        if ordered.contains(rid.as_str()) {
            continue;
        }
        let user = OrderMessage::parse(raw.as_bytes())
            .map(|m| m.user_id)
            .unwrap_or_default();
        if holder.contains_key(user.as_str()) {
            // A duplicate: its user holds an order of another reservation.
            pipe.hdel(k.flow(), rid).ignore();
            pipe.hset(k.status(), rid, "failed").ignore();
            if queue.contains(raw) {
                pipe.lrem(k.queue(), 0, raw).ignore();
            }
            for d in dead.iter().filter(|d| d.contains(rid.as_str())) {
                pipe.lrem(k.dead_letter(), 0, d).ignore();
            }
            out.released += 1;
        } else {
            out.in_flight += 1;
        }
    }
    let taken = (out.orders + out.in_flight) as i64;
    out.stock = (sale.total_stock as i64 - taken).max(0);
    out.seq = redis_seq.unwrap_or(0).max(marks.seq_high);
    let checkpoint = redis_ck.unwrap_or(0).max(marks.checkpoint_high);
    pipe.hset_multiple(
        k.meta(),
        &[
            ("total_stock", sale.total_stock.to_string()),
            ("starts_at_ms", sale.starts_at_ms.to_string()),
            ("ends_at_ms", sale.ends_at_ms.to_string()),
            ("seq", out.seq.to_string()),
            ("checkpoint", checkpoint.to_string()),
        ],
    )
    .ignore();
    pipe.set(k.stock(), out.stock).ignore();
    pipe.sadd(keys::SALES, id).ignore();
    pipe.query::<()>(&mut con)?;
    data_loss::resume(&mut con, &mut db, id, out.seq, checkpoint)?;
    // A worker's watch that read the pause just before it ended may set it
    // again in Redis; take such a late pause back (MySQL is resumed).
    std::thread::sleep(data_loss::WATCH_EVERY * 2);
    if data_loss::mysql_state(&mut db, id)?.paused.is_none() {
        con.hdel::<_, _, ()>(k.meta(), "paused")?;
    }
    outln!(
        "repaired sale {id}: {} orders restored, {} duplicate reservations released, \
         {} reservations in flight kept, stock {}, sequence {}; sale resumed",
        out.orders,
        out.released,
        out.in_flight,
        out.stock,
        out.seq
    );
    Ok(0)
}
