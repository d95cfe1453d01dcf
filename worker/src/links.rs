//! Owns the Redis and MySQL connections of a worker's background thread
//! (the data-loss watch, the expiry sweep): each opened when a pass needs
//! it, both dropped after a failed pass so the next one reconnects, and a
//! failure logged once until a pass succeeds (a thread that runs every
//! 200 ms must not repeat the same line five times a second).

use crate::queue;
use seckill_common::connections::{Held, Slot, Store};
use seckill_common::redis_target::{Con, Target};
use std::fmt::Display;
use std::time::Duration;

/// The two connections of one background thread, and its last failure.
pub struct Links {
    client: Target,
    redis_timeout: Duration,
    mysql_url: String,
    mysql_timeout: Duration,
    /// What the thread is, to start its log lines (`expiry sweep`).
    what: &'static str,
    redis: Option<Held<Con>>,
    db: Option<Held<mysql::Conn>>,
    /// Count a connection after the first as a reconnect
    /// (`seckill_common::connections`).
    slots: (Slot, Slot),
    last_error: String,
}

impl Links {
    /// Links to `client` (read and write timeout `redis_timeout`) and to
    /// MySQL at `mysql_url` (connect timeout `mysql_timeout`), none open yet.
    pub fn new(
        client: Target,
        redis_timeout: Duration,
        mysql_url: String,
        mysql_timeout: Duration,
        what: &'static str,
    ) -> Links {
        Links {
            client,
            redis_timeout,
            mysql_url,
            mysql_timeout,
            what,
            redis: None,
            db: None,
            slots: (Slot::new(Store::Redis), Slot::new(Store::Mysql)),
            last_error: String::new(),
        }
    }

    /// Runs `pass` with both connections, opening those that are not;
    /// `None` when one cannot be opened, or when `pass` failed (then logged
    /// once, and both connections dropped).
    pub fn run<T, E: Display>(
        &mut self,
        pass: impl FnOnce(&mut Con, &mut mysql::Conn) -> Result<T, E>,
    ) -> Option<T> {
        if self.redis.is_none() {
            self.redis = queue::open(&self.client, self.redis_timeout, self.redis_timeout)
                .ok()
                .map(|c| self.slots.0.hold(c));
        }
        if self.db.is_none() {
            self.db = seckill_common::schema::connect(&self.mysql_url, self.mysql_timeout)
                .ok()
                .map(|c| self.slots.1.hold(c));
        }
        let (Some(con), Some(conn)) = (self.redis.as_deref_mut(), self.db.as_deref_mut()) else {
            return None;
        };
        match pass(con, conn) {
            Ok(v) => {
                self.last_error.clear();
                Some(v)
            }
            Err(e) => {
                let e = format!("{}: {e}", self.what);
                if e != self.last_error {
                    log::warn!("{e}");
                    self.last_error = e;
                }
                self.redis = None;
                self.db = None;
                None
            }
        }
    }
}
