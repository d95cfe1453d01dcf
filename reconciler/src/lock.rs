//! Owns the run lock: one `run` at a time across machines (the timer and a
//! person), held in Redis (`seckill:reconcile:lock`, `SET NX PX` with a
//! random token) so it expires by itself if the holder dies. It is refreshed
//! while the run works and released only by its holder (compare-and-delete
//! script). Compensation stays idempotent in MySQL anyway (the ledger's
//! `UNIQUE(reservation_id, reason)`), so even a lock lost to a long pause
//! cannot deduct twice.

use redis::Commands;
use seckill_common::keys::RECONCILE_LOCK;
use seckill_common::owned_key;
use seckill_common::redis_target::Con;
use std::fmt;
use std::time::{Duration, Instant};

/// Lifetime of the lock without a refresh. A run refreshes it every
/// [`LOCK_REFRESH`], so only a dead or paused holder loses it; shorter than
/// [`LOCK_WAIT`], so the command after a killed one (a `run`, a `sale
/// repair` killed with -9) waits the lock out instead of failing (it was
/// 60 s: the next command waited 45 s and exited 2).
pub const LOCK_TTL: Duration = Duration::from_secs(30);
/// How often a running holder extends the lock.
pub const LOCK_REFRESH: Duration = Duration::from_secs(10);
/// How long a second run waits for the lock before giving up (exit 2): long
/// enough for a normal run to finish, short of the timer's 1-minute period.
pub const LOCK_WAIT: Duration = Duration::from_secs(45);

/// Why the lock could not be taken or kept.
#[derive(Debug)]
#[non_exhaustive]
pub enum LockError {
    /// Another run held the lock for the whole [`LOCK_WAIT`].
    Busy(String),
    /// The lock expired and someone else took it: stop writing.
    Lost,
    /// Redis failed.
    Redis(redis::RedisError),
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockError::Busy(holder) => write!(
                f,
                "run lock: another run holds {RECONCILE_LOCK} ({holder}) after waiting {}s",
                LOCK_WAIT.as_secs()
            ),
            LockError::Lost => write!(f, "run lock: lost (expired while this run worked)"),
            LockError::Redis(e) => write!(f, "run lock: redis: {e}"),
        }
    }
}

impl std::error::Error for LockError {}

impl From<redis::RedisError> for LockError {
    fn from(e: redis::RedisError) -> Self {
        LockError::Redis(e)
    }
}

/// The held lock. Release it with [`RunLock::release`]; if the process dies
/// it expires after [`LOCK_TTL`].
pub struct RunLock {
    con: Con,
    token: String,
    refreshed: Instant,
}

impl RunLock {
    /// Takes the lock, waiting up to `wait` while another run holds it.
    ///
    /// Errors: [`LockError::Busy`] after the wait, or Redis failures.
    pub fn acquire(mut con: Con, wait: Duration) -> Result<RunLock, LockError> {
        let token = format!(
            "{}:{}:{}",
            hostname(),
            std::process::id(),
            seckill_common::ids::new_reservation_id()
        );
        let deadline = Instant::now() + wait;
        loop {
            let got: Option<String> = redis::cmd("SET")
                .arg(RECONCILE_LOCK)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(LOCK_TTL.as_millis() as u64)
                .query(&mut con)?;
            if got.is_some() {
                return Ok(RunLock {
                    con,
                    token,
                    refreshed: Instant::now(),
                });
            }
            if Instant::now() >= deadline {
                let holder: Option<String> = con.get(RECONCILE_LOCK)?;
                return Err(LockError::Busy(holder.unwrap_or_default()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Extends the lock when [`LOCK_REFRESH`] has passed since the last time.
    /// Call it often; it is one clock read when nothing is due.
    ///
    /// Errors: [`LockError::Lost`] when the lock is no longer ours.
    pub fn keep(&mut self) -> Result<(), LockError> {
        if self.refreshed.elapsed() < LOCK_REFRESH {
            return Ok(());
        }
        let ttl_ms = LOCK_TTL.as_millis() as u64;
        if !owned_key::extend(&mut self.con, RECONCILE_LOCK, &self.token, ttl_ms)? {
            return Err(LockError::Lost);
        }
        self.refreshed = Instant::now();
        Ok(())
    }

    /// Releases the lock if it is still ours.
    pub fn release(mut self) -> Result<(), LockError> {
        owned_key::release(&mut self.con, RECONCILE_LOCK, &self.token)?;
        Ok(())
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "host".to_string())
}
