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
//! message taken off the queue, its dead letters archived with this action
//! (`dead_letter_archive.rs`, as for a rollback). Stock = total −
//! orders − reservations kept in flight; the sequence = the larger of Redis's
//! and MySQL's mark. All Redis writes are one `MULTI`. Refused (nothing
//! written, exit 1) while a worker holds messages of the sale in its
//! processing list: run it again when they are settled.
//!
//! Idempotent: a second repair finds every order restored and no duplicate,
//! and writes the same state again. Audited: see [`repair`].

use crate::cli::RepairArgs;
use crate::dead_letter_archive::{archive_entries_of, SettledBy};
use crate::error::RunError;
use crate::lock::{RunLock, LOCK_WAIT};
use crate::output::outln;
use crate::review::findings::{FindingState, Kind};
use crate::review::{ActionKind, ActionStatus, PendingAction, Review};
use crate::run_cmd::redis_connect;
use crate::sale_cmd::fetch_sale;
use crate::settle::Outcome;
use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::data_loss;
use seckill_common::keys::PurchaseStatus;
use seckill_common::keys::{self, SaleKeys};
use seckill_common::message::{OrderMessage, MESSAGE_VERSION};
use seckill_common::redis_target::Con;
use seckill_common::sale::Sale;
use seckill_common::Config;
use std::collections::{HashMap, HashSet};

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

/// `sale repair ID --by NAME`; returns the exit code: 0 repaired (or
/// nothing to repair), 1 refused (no open `redis_data_loss` finding yet:
/// run `run` first; or a worker holds messages of the sale), 2 no such sale
/// in MySQL.
///
/// Audited like `resolve`: the `repair` action on the sale's
/// `redis_data_loss` finding is written ahead (`settle.rs`); the rebuild,
/// the end of the pause in Redis and the action's mark in the meta hash
/// (`repaired_by`) are one `MULTI`, so an interrupted repair is recorded
/// as done exactly when that `MULTI` ran.
///
/// Errors: Redis, MySQL or SQLite failures (nothing or all of the Redis
/// state was written; run it again).
pub fn repair(config: &Config, args: &RepairArgs) -> Result<u8, RunError> {
    let id = args.sale_id;
    let mut db = seckill_common::schema::connect(&config.mysql_url, config.mysql_timeout)?;
    let Some(sale) = fetch_sale(&mut db, id).map_err(|e| RunError::Refused(e.to_string()))? else {
        eprintln!("seckill-reconciler: no sale {id} in MySQL");
        return Ok(2);
    };
    let mut redis = redis_connect(config)?;
    // The repair knows one bucket's keys (bucket 0): on a split sale it
    // would size that bucket as the whole sale (the hostile pass: Redis
    // then offered units MySQL no longer had). Refused until it knows
    // buckets.
    if seckill_common::buckets::count(&mut redis, id)?.is_some_and(|k| k > 1)
        || seckill_common::buckets::split_elsewhere(&mut redis, id)?
    {
        eprintln!(
            "seckill-reconciler: sale {id} is split over buckets: `sale repair` does not \
             support split sales yet (docs/OPERATIONS.md); nothing changed"
        );
        return Ok(1);
    }
    let paused_in_redis: Option<String> = redis.hget(SaleKeys::new(id).meta(), "paused")?;
    if data_loss::mysql_state(&mut db, id)?.paused.is_none() && paused_in_redis.is_none() {
        outln!("sale {id} is not paused; nothing to repair");
        return Ok(0);
    }
    let review = Review::open(&config.review_db)?;
    crate::settle::complete_pending(&review, || redis_connect(config))?;
    let Some(finding) = review
        .list_findings(Some(FindingState::Open), Some(id))?
        .into_iter()
        .find(|f| f.kind == Kind::RedisDataLoss)
    else {
        eprintln!(
            "seckill-reconciler: sale {id} is paused but has no open redis_data_loss finding \
             yet; run `seckill-reconciler run` first (the repair is recorded on that finding)"
        );
        return Ok(1);
    };
    let lock = RunLock::acquire(redis_connect(config)?, LOCK_WAIT)?;
    let outcome = crate::settle::written_ahead(
        &review,
        &mut redis,
        &finding,
        ActionKind::Repair,
        &args.by,
        args.note.as_deref(),
        &format!("rebuild sale {id}'s Redis state from MySQL and resume it"),
        |con, started| rebuild(con, &mut db, &sale, started),
    );
    let released = lock.release();
    let outcome = outcome?;
    released?;
    if outcome.status == ActionStatus::Done {
        // A worker's watch that read the pause just before it ended may
        // set it again in Redis; take such a late pause back.
        std::thread::sleep(data_loss::WATCH_EVERY * 2);
        if data_loss::mysql_state(&mut db, id)?.paused.is_none() {
            redis.hdel::<_, _, ()>(SaleKeys::new(id).meta(), "paused")?;
        }
    }
    outln!("{}", outcome.text);
    Ok(if outcome.settles() { 0 } else { 1 })
}

/// The effect: reads MySQL and Redis, refuses while a worker holds
/// messages of the sale, resumes the sale in MySQL with the repaired marks,
/// then writes the rebuilt Redis state, the end of the pause and `mark` in
/// one `MULTI`.
fn rebuild(
    con: &mut Con,
    db: &mut mysql::Conn,
    sale: &Sale,
    started: &PendingAction,
) -> Result<Outcome, RunError> {
    let mark = started.mark();
    let id = sale.id;
    let k = SaleKeys::new(id);
    let workers: Vec<String> = con.smembers(keys::WORKERS)?;
    let mut held = 0usize;
    for w in &workers {
        held += con.llen::<_, usize>(k.processing(w))?;
    }
    if held > 0 {
        return Ok(Outcome::refused(format!(
            "workers hold {held} messages of sale {id} in their processing lists; nothing \
             changed, run the repair again in a few seconds"
        )));
    }
    let orders: Vec<(String, String, Option<i64>)> = db.exec(
        "SELECT reservation_id, user_id, CAST(UNIX_TIMESTAMP(reserved_at) * 1000 AS SIGNED)
         FROM orders WHERE sale_id = ?",
        (id,),
    )?;
    let marks = data_loss::mysql_state(db, id)?;
    let flows: HashMap<String, String> = con.hgetall(k.flow())?;
    let queue: Vec<String> = con.lrange(k.queue(), 0, -1)?;
    let (redis_seq, redis_ck) = redis_marks(con, &k)?;

    let mut pipe = redis::pipe();
    pipe.atomic();
    let (mut out, mut duplicates) = restore(&mut pipe, &k, &orders, &flows, &queue);
    let taken = (out.orders + out.in_flight) as i64;
    out.stock = (sale.total_stock as i64 - taken).max(0);
    // The sequence (total − stock + releases) must not go back behind
    // either mark: `releases` makes up the difference.
    let target = redis_seq.max(marks.seq_high);
    let releases = target.saturating_sub(sale.total_stock - out.stock as u64);
    out.seq = seckill_common::reservation::sequence(sale.total_stock, out.stock, releases);
    let checkpoint = redis_ck.unwrap_or(0).max(marks.checkpoint_high);
    pipe.hset_multiple(
        k.meta(),
        &[
            ("total_stock", sale.total_stock.to_string()),
            ("starts_at_ms", sale.starts_at_ms.to_string()),
            ("ends_at_ms", sale.ends_at_ms.to_string()),
            ("releases", releases.to_string()),
            ("checkpoint", checkpoint.to_string()),
            (REPAIRED_BY, mark.clone()),
        ],
    )
    .ignore();
    pipe.hdel(k.meta(), "paused").ignore();
    pipe.set(k.stock(), out.stock).ignore();
    // MySQL first: a Redis that still says paused keeps the sale paused
    // (the watch leaves a pause only Redis holds alone) until this MULTI.
    data_loss::resume_mysql(db, id, out.seq, checkpoint).map_err(watch_error)?;
    pipe.query::<()>(con)?;
    // Apart from the MULTI (another cluster slot than the sale's keys);
    // a repeat of the repair adds it again.
    con.sadd::<_, _, ()>(keys::SALES, id)?;
    // The released duplicates' dead letters go to the archive with this
    // action, as for a rollback (each moved atomically; a repeat moves the
    // rest).
    let at = seckill_common::timefmt::format_ms(seckill_common::now_ms());
    let by = SettledBy {
        action: ActionKind::Repair.as_str(),
        actor: &started.actor,
        finding_id: started.finding_id,
        action_id: started.id,
        at: &at,
    };
    for rid in &duplicates {
        archive_entries_of(con, id, rid, &by)?;
    }
    duplicates.sort();
    let listed = if duplicates.is_empty() {
        String::new()
    } else {
        format!(" ({})", duplicates.join(", "))
    };
    Ok(Outcome::done(format!(
        "repaired sale {id}: {} orders restored, {} duplicate reservations released{listed}, \
         {} reservations in flight kept, stock {}, sequence {}; sale resumed",
        out.orders, out.released, out.in_flight, out.stock, out.seq
    )))
}

/// The sale's reservation sequence and checkpoint as Redis holds them now,
/// read leniently: a field that is not a number (the damage being
/// repaired, perhaps) counts as 0, and is overwritten by the repair.
///
/// Errors: Redis failures.
fn redis_marks(con: &mut Con, k: &SaleKeys) -> redis::RedisResult<(u64, Option<u64>)> {
    let (total, releases_now, ck): (Option<String>, Option<String>, Option<String>) =
        redis::cmd("HMGET")
            .arg(k.meta())
            .arg("total_stock")
            .arg("releases")
            .arg("checkpoint")
            .query(con)?;
    let stock_now: Option<String> = con.get(k.stock())?;
    let num = |v: &Option<String>| v.as_deref().and_then(|v| v.parse::<i64>().ok());
    let redis_seq = seckill_common::reservation::sequence(
        num(&total).unwrap_or(0).max(0) as u64,
        num(&stock_now).unwrap_or(0),
        num(&releases_now).unwrap_or(0).max(0) as u64,
    );
    let redis_ck = num(&ck).map(|c| c.max(0) as u64);
    Ok((redis_seq, redis_ck))
}

/// Adds to `pipe` the writes that restore every order of `orders`
/// (reservation id, user, reserved at ms) in Redis (flow record unless
/// Redis has it, buyer, status `confirmed`) and release every flow record
/// without order whose user holds an order of another reservation (a
/// duplicate: flow record removed, status `failed`, message taken off the
/// queue). Returns the counts (stock and sequence not yet set) and the
/// duplicates' reservation ids.
fn restore(
    pipe: &mut redis::Pipeline,
    k: &SaleKeys,
    orders: &[(String, String, Option<i64>)],
    flows: &HashMap<String, String>,
    queue: &[String],
) -> (Repaired, Vec<String>) {
    let ordered: HashSet<&str> = orders.iter().map(|(r, _, _)| r.as_str()).collect();
    let holder: HashSet<&str> = orders.iter().map(|(_, u, _)| u.as_str()).collect();
    let mut out = Repaired::default();
    let mut duplicates: Vec<String> = Vec::new();
    for (rid, user, at) in orders {
        // Keep Redis's own flow record when it has one (same content).
        if !flows.contains_key(rid) {
            let msg = OrderMessage {
                v: MESSAGE_VERSION,
                reservation_id: rid.clone(),
                sale_id: k.sale_id,
                user_id: user.clone(),
                reserved_at_ms: at.unwrap_or(0).max(0) as u64,
            };
            pipe.hset(k.flow(), rid, msg.to_json()).ignore();
        }
        pipe.hset(k.buyers(), user, rid).ignore();
        pipe.hset(k.status(), rid, PurchaseStatus::Confirmed.as_str())
            .ignore();
        out.orders += 1;
    }
    for (rid, raw) in flows {
        if ordered.contains(rid.as_str()) {
            continue;
        }
        let user = OrderMessage::parse(raw.as_bytes())
            .map(|m| m.user_id)
            .unwrap_or_default();
        if holder.contains(user.as_str()) {
            // A duplicate: its user holds an order of another reservation.
            pipe.hdel(k.flow(), rid).ignore();
            pipe.hset(k.status(), rid, PurchaseStatus::Failed.as_str())
                .ignore();
            if queue.contains(raw) {
                pipe.lrem(k.queue(), 0, raw).ignore();
            }
            duplicates.push(rid.clone());
            out.released += 1;
        } else {
            out.in_flight += 1;
        }
    }
    (out, duplicates)
}

/// The meta field that holds the mark of the repair that last rebuilt the
/// sale (how an interrupted repair is known to have happened).
pub const REPAIRED_BY: &str = "repaired_by";

fn watch_error(e: data_loss::WatchError) -> RunError {
    match e {
        data_loss::WatchError::Redis(e) => RunError::Redis(e),
        data_loss::WatchError::Mysql(e) => RunError::Mysql(e),
        other => RunError::Refused(other.to_string()),
    }
}
