//! Owns what the load simulator reads from Redis and MySQL: the sale before
//! the run, the wait for the workers to drain the queue, the state the
//! invariants are checked against afterwards, and the figures the report's
//! timeline samples meanwhile ([`Progress`]).

use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::keys::{self, SaleKeys};
use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

/// Why Redis or MySQL could not be read.
#[derive(Debug)]
#[non_exhaustive]
pub enum StateError {
    /// A Redis call failed.
    Redis(redis::RedisError),
    /// A MySQL call failed or the connection could not be opened.
    Mysql(String),
    /// The sale is not in MySQL's `sales` table.
    UnknownSale(u64),
}

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StateError::Redis(e) => write!(f, "redis: {e}"),
            StateError::Mysql(e) => write!(f, "mysql: {e}"),
            StateError::UnknownSale(id) => write!(f, "unknown sale: {id} is not in MySQL"),
        }
    }
}

impl std::error::Error for StateError {}

impl From<redis::RedisError> for StateError {
    fn from(e: redis::RedisError) -> Self {
        StateError::Redis(e)
    }
}

impl From<mysql::Error> for StateError {
    fn from(e: mysql::Error) -> Self {
        StateError::Mysql(e.to_string())
    }
}

/// The sale as MySQL holds it, with MySQL's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaleRow {
    /// `sales.total_stock`.
    pub total_stock: u64,
    /// `sales.price_cents`.
    pub price_cents: u64,
    /// `sales.payment_window_ms` (`None`: orders are final at creation).
    pub payment_window_ms: Option<u64>,
    /// `sales.starts_at` in Unix ms.
    pub starts_at_ms: i64,
    /// MySQL's `NOW(3)` in Unix ms when read.
    pub mysql_now_ms: i64,
}

/// The sale's orders by lifecycle status, as MySQL holds them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LifecycleCounts {
    /// `sales.available_stock`.
    pub available: i64,
    /// Orders `paid`.
    pub paid: u64,
    /// Orders `pending_payment`.
    pub pending: u64,
    /// Orders `expired`.
    pub expired: u64,
    /// Stock ledger rows with reason `release`.
    pub released: u64,
    /// Rows of `payments` for the sale.
    pub payments: u64,
}

/// The sale's figures at one instant, for the report's timeline
/// (`timeline.rs`); the Redis ones are `None` for the baseline (no Redis).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// Redis's stock counter: units still on sale.
    pub stock_left: Option<i64>,
    /// Redis's flow records: units reserved and not released.
    pub reserved: Option<u64>,
    /// Messages in the sale's queue.
    pub queued: Option<u64>,
    /// Messages in the workers' processing lists of the sale.
    pub processing: Option<u64>,
    /// MySQL orders holding a unit (not expired or cancelled).
    pub ordered: u64,
    /// Of those, the paid ones.
    pub paid: u64,
}

/// Redis and MySQL connections for one run.
pub struct Store {
    sale_id: u64,
    redis: Option<seckill_common::redis_target::Con>,
    mysql: mysql::Conn,
}

/// Redis figures of the sale (gateway mode only).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisState {
    /// The stock counter (units left).
    pub stock: i64,
    /// user id -> reservation id.
    pub buyers: HashMap<String, String>,
    /// Flow records.
    pub flow_records: u64,
    /// Messages still in the sale's queue.
    pub queued: u64,
    /// Messages in any worker's processing list for the sale.
    pub processing: u64,
    /// Dead-letter entries.
    pub dead_letters: u64,
}

/// MySQL figures of the sale.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MysqlState {
    /// `sales.available_stock`.
    pub available_stock: i64,
    /// reservation id -> user id of every order.
    pub orders: HashMap<String, String>,
    /// Users holding more than one order.
    pub users_with_two_orders: u64,
    /// `stock_ledger` rows of reason `order`.
    pub ledger_order_rows: u64,
    /// Sum of every ledger row's delta (negative: units deducted).
    pub ledger_delta_sum: i64,
    /// Latest `orders.created_at` in Unix ms.
    pub last_order_ms: Option<i64>,
}

impl Store {
    /// Connects to MySQL and, unless `redis_url` is `None`, to Redis.
    pub fn open(
        sale_id: u64,
        redis_url: Option<&str>,
        mysql_url: &str,
        timeout: Duration,
    ) -> Result<Store, StateError> {
        let redis = match redis_url {
            Some(url) => {
                // One Redis or a cluster (`redis_target.rs` sets the timeouts).
                Some(seckill_common::redis_target::Target::open(url)?.connect(timeout)?)
            }
            None => None,
        };
        let mysql = seckill_common::schema::connect(mysql_url, timeout)
            .map_err(|e| StateError::Mysql(e.to_string()))?;
        Ok(Store {
            sale_id,
            redis,
            mysql,
        })
    }

    /// The sale's row. Errors: [`StateError::UnknownSale`].
    pub fn sale(&mut self) -> Result<SaleRow, StateError> {
        let row: Option<(u64, i64, i64, u64, Option<u64>)> = self.mysql.exec_first(
            "SELECT total_stock,
                    CAST(ROUND(UNIX_TIMESTAMP(starts_at) * 1000) AS SIGNED),
                    CAST(ROUND(UNIX_TIMESTAMP(NOW(3)) * 1000) AS SIGNED),
                    price_cents, payment_window_ms
             FROM sales WHERE id = ?",
            (self.sale_id,),
        )?;
        let (total_stock, starts_at_ms, mysql_now_ms, price_cents, payment_window_ms) =
            row.ok_or(StateError::UnknownSale(self.sale_id))?;
        Ok(SaleRow {
            total_stock,
            price_cents,
            payment_window_ms,
            starts_at_ms,
            mysql_now_ms,
        })
    }

    /// Units already reserved before the run: Redis buyers, or MySQL orders
    /// for the baseline.
    pub fn reserved_so_far(&mut self) -> Result<u64, StateError> {
        let k = SaleKeys::new(self.sale_id);
        match self.redis.as_mut() {
            Some(r) => Ok(r.hlen(k.buyers())?),
            None => self.order_count(),
        }
    }

    fn order_count(&mut self) -> Result<u64, StateError> {
        let n: Option<u64> = self.mysql.exec_first(
            "SELECT COUNT(*) FROM orders WHERE sale_id = ?",
            (self.sale_id,),
        )?;
        Ok(n.unwrap_or(0))
    }

    fn in_flight(&mut self) -> Result<(u64, u64, u64, u64), StateError> {
        let k = SaleKeys::new(self.sale_id);
        let Some(r) = self.redis.as_mut() else {
            return Ok((0, 0, 0, 0));
        };
        let queued: u64 = r.llen(k.queue())?;
        let workers: Vec<String> = r.smembers(keys::WORKERS)?;
        let mut processing = 0u64;
        for w in &workers {
            let n: u64 = r.llen(k.processing(w))?;
            processing += n;
        }
        let dlq: u64 = r.llen(k.dead_letter())?;
        let flow: u64 = r.hlen(k.flow())?;
        Ok((queued, processing, dlq, flow))
    }

    /// Waits until the queue and processing lists are empty and MySQL holds
    /// one order per flow record, a dead-letter entry appears, or `timeout`
    /// passes. Returns whether it drained, and how long the wait took.
    pub fn wait_drained(&mut self, timeout: Duration) -> Result<(bool, Duration), StateError> {
        let start = Instant::now();
        loop {
            let (queued, processing, dlq, flow) = self.in_flight()?;
            let drained = queued == 0
                && processing == 0
                && (self.redis.is_none() || self.order_count()? >= flow);
            if drained {
                return Ok((true, start.elapsed()));
            }
            if dlq > 0 || start.elapsed() >= timeout {
                return Ok((false, start.elapsed()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The sale's Redis figures (gateway mode), or `None` for the baseline.
    pub fn redis_state(&mut self) -> Result<Option<RedisState>, StateError> {
        let (queued, processing, dead_letters, flow_records) = self.in_flight()?;
        let k = SaleKeys::new(self.sale_id);
        let Some(r) = self.redis.as_mut() else {
            return Ok(None);
        };
        let stock: Option<i64> = r.get(k.stock())?;
        let buyers: HashMap<String, String> = r.hgetall(k.buyers())?;
        Ok(Some(RedisState {
            stock: stock.unwrap_or(0),
            buyers,
            flow_records,
            queued,
            processing,
            dead_letters,
        }))
    }

    /// The sale's orders by lifecycle status, in one statement.
    pub fn lifecycle_counts(&mut self) -> Result<LifecycleCounts, StateError> {
        let id = self.sale_id;
        let row: Option<(i64, u64, u64, u64, u64, u64)> = self.mysql.exec_first(
            "SELECT s.available_stock,
                    (SELECT COUNT(*) FROM orders WHERE sale_id = s.id AND status = 'paid'),
                    (SELECT COUNT(*) FROM orders WHERE sale_id = s.id AND status = 'pending_payment'),
                    (SELECT COUNT(*) FROM orders WHERE sale_id = s.id AND status = 'expired'),
                    (SELECT COUNT(*) FROM stock_ledger WHERE sale_id = s.id AND reason = 'release'),
                    (SELECT COUNT(*) FROM payments WHERE sale_id = s.id)
             FROM sales s WHERE s.id = ?",
            (id,),
        )?;
        let (available, paid, pending, expired, released, payments) =
            row.ok_or(StateError::UnknownSale(id))?;
        Ok(LifecycleCounts {
            available,
            paid,
            pending,
            expired,
            released,
            payments,
        })
    }

    /// The sale's [`Progress`] now: a few Redis reads (no hash or list
    /// read whole) and one MySQL statement.
    pub fn progress(&mut self) -> Result<Progress, StateError> {
        let (queued, processing, _, reserved) = self.in_flight()?;
        let redis = self.redis.is_some();
        let stock_left = match redis {
            true => Some(self.redis_stock()?),
            false => None,
        };
        let row: Option<(u64, u64)> = self.mysql.exec_first(
            format!(
                "SELECT COUNT(*), CAST(COALESCE(SUM(status = 'paid'), 0) AS UNSIGNED)
                 FROM orders WHERE sale_id = ? AND status NOT IN {}",
                seckill_common::order::RELEASED_SQL
            ),
            (self.sale_id,),
        )?;
        let (ordered, paid) = row.unwrap_or((0, 0));
        let some = |v: u64| redis.then_some(v);
        Ok(Progress {
            stock_left,
            reserved: some(reserved),
            queued: some(queued),
            processing: some(processing),
            ordered,
            paid,
        })
    }

    /// The sale's Redis stock (0 without Redis or without the key).
    pub fn redis_stock(&mut self) -> Result<i64, StateError> {
        let k = SaleKeys::new(self.sale_id);
        match self.redis.as_mut() {
            Some(r) => Ok(r.get::<_, Option<i64>>(k.stock())?.unwrap_or(0)),
            None => Ok(0),
        }
    }

    /// The sale's MySQL figures.
    pub fn mysql_state(&mut self) -> Result<MysqlState, StateError> {
        let id = self.sale_id;
        let available_stock: Option<i64> = self
            .mysql
            .exec_first("SELECT available_stock FROM sales WHERE id = ?", (id,))?;
        let rows: Vec<(String, String)> = self.mysql.exec(
            "SELECT reservation_id, user_id FROM orders WHERE sale_id = ?",
            (id,),
        )?;
        let dup: Option<u64> = self.mysql.exec_first(
            "SELECT COUNT(*) FROM (SELECT user_id FROM orders WHERE sale_id = ?
             GROUP BY user_id HAVING COUNT(*) > 1) d",
            (id,),
        )?;
        let ledger: Option<(u64, i64)> = self.mysql.exec_first(
            "SELECT CAST(COALESCE(SUM(reason = 'order'), 0) AS UNSIGNED),
                    CAST(COALESCE(SUM(delta), 0) AS SIGNED)
             FROM stock_ledger WHERE sale_id = ?",
            (id,),
        )?;
        let last: Option<Option<i64>> = self.mysql.exec_first(
            "SELECT CAST(ROUND(UNIX_TIMESTAMP(MAX(created_at)) * 1000) AS SIGNED)
             FROM orders WHERE sale_id = ?",
            (id,),
        )?;
        let (ledger_order_rows, ledger_delta_sum) = ledger.unwrap_or((0, 0));
        Ok(MysqlState {
            available_stock: available_stock.unwrap_or(0),
            orders: rows.into_iter().collect(),
            users_with_two_orders: dup.unwrap_or(0),
            ledger_order_rows,
            ledger_delta_sum,
            last_order_ms: last.flatten(),
        })
    }
}
