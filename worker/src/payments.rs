//! Owns the worker's payment consumer: a thread that takes payments from
//! the payment queue (`seckill_common::payment`) into this worker's own
//! processing list, applies each in MySQL (`lifecycle::pay`, idempotent by
//! `payment_id`) and only then removes it. On start it puts back what its
//! processing list still holds from a previous run (a crash: applied or
//! not, a repeat is one payment). A payment that fails
//! `SECKILL_WORKER_MAX_ATTEMPTS` times, or does not parse, goes to the
//! dead-letter list.

use crate::queue;
use crate::WorkerError;
use redis::Commands;
use seckill_common::lifecycle;
use seckill_common::payment::{self, PaymentMessage};
use seckill_common::{Config, Shutdown};
use std::thread::JoinHandle;
use std::time::Duration;

/// Starts the consumer of a worker configured by `config`.
///
/// Errors: [`WorkerError::Thread`] when the thread could not be created.
pub fn start(
    config: &Config,
    client: &redis::Client,
    shutdown: &Shutdown,
) -> Result<JoinHandle<()>, WorkerError> {
    let c = Consumer {
        client: client.clone(),
        config: config.clone(),
        shutdown: shutdown.clone(),
    };
    std::thread::Builder::new()
        .name("payments".into())
        .spawn(move || c.run())
        .map_err(|e| WorkerError::Thread(e.to_string()))
}

struct Consumer {
    client: redis::Client,
    config: Config,
    shutdown: Shutdown,
}

/// How long one blocking take waits.
const BLOCK: Duration = Duration::from_millis(200);

impl Consumer {
    fn run(self) {
        let mine = payment::processing(&self.config.worker_id);
        let mut redis: Option<redis::Connection> = None;
        let mut db: Option<mysql::Conn> = None;
        let mut reclaimed = false;
        while !self.shutdown.is_triggered() {
            if redis.is_none() {
                let read = self.config.redis_timeout + BLOCK;
                redis = queue::open(&self.client, self.config.redis_timeout, read).ok();
            }
            if db.is_none() {
                db = seckill_common::schema::connect(
                    &self.config.mysql_url,
                    self.config.mysql_timeout,
                )
                .ok();
            }
            let (Some(con), Some(conn)) = (redis.as_mut(), db.as_mut()) else {
                std::thread::sleep(BLOCK);
                continue;
            };
            let r = if reclaimed {
                self.one(con, conn, &mine)
            } else {
                reclaim(con, &mine).map(|()| reclaimed = true)
            };
            if let Err(e) = r {
                log::warn!("payments: {e}");
                redis = None;
                db = None;
                std::thread::sleep(BLOCK);
            }
        }
    }

    /// Takes and applies at most one payment.
    fn one(
        &self,
        con: &mut redis::Connection,
        db: &mut mysql::Conn,
        mine: &str,
    ) -> Result<(), String> {
        let raw: Option<Vec<u8>> = redis::cmd("BLMOVE")
            .arg(payment::QUEUE)
            .arg(mine)
            .arg("RIGHT")
            .arg("LEFT")
            .arg(BLOCK.as_secs_f64())
            .query(con)
            .map_err(|e| e.to_string())?;
        let Some(raw) = raw else { return Ok(()) };
        let m = match PaymentMessage::parse(&raw) {
            Ok(m) => m,
            Err(why) => return dead_letter(con, mine, &raw, &format!("unparsable: {why}")),
        };
        match lifecycle::pay(db, &m.payment()) {
            Ok(done) => {
                log::info!(
                    "payment {} for {}: {done:?}",
                    m.payment_id,
                    m.reservation_id
                );
                redis::pipe()
                    .atomic()
                    .lrem(mine, 1, &raw)
                    .hdel(payment::ATTEMPTS, &m.payment_id)
                    .query::<()>(con)
                    .map_err(|e| e.to_string())
            }
            Err(e) => {
                let n: u32 = con
                    .hincr(payment::ATTEMPTS, &m.payment_id, 1)
                    .map_err(|e| e.to_string())?;
                if n >= self.config.worker_max_attempts {
                    return dead_letter(con, mine, &raw, &e.to_string());
                }
                redis::pipe()
                    .atomic()
                    .lrem(mine, 1, &raw)
                    .lpush(payment::QUEUE, &raw)
                    .query::<()>(con)
                    .map_err(|e| e.to_string())?;
                Err(e.to_string())
            }
        }
    }
}

/// Moves everything left in this worker's processing list back to the queue.
fn reclaim(con: &mut redis::Connection, mine: &str) -> Result<(), String> {
    loop {
        let moved: Option<Vec<u8>> = redis::cmd("LMOVE")
            .arg(mine)
            .arg(payment::QUEUE)
            .arg("RIGHT")
            .arg("RIGHT")
            .query(con)
            .map_err(|e| e.to_string())?;
        if moved.is_none() {
            return Ok(());
        }
    }
}

/// Moves `raw` from the processing list to the dead letters with `reason`.
fn dead_letter(
    con: &mut redis::Connection,
    mine: &str,
    raw: &[u8],
    reason: &str,
) -> Result<(), String> {
    log::error!("payment dead-lettered: {reason}");
    let entry = payment::dead_letter_entry(raw, reason);
    redis::pipe()
        .atomic()
        .lrem(mine, 1, raw)
        .lpush(payment::DEAD_LETTERS, entry)
        .query::<()>(con)
        .map_err(|e| e.to_string())
}
