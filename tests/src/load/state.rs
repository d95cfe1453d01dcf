//! Owns what the load simulator reads from Redis and MySQL: the sale before
//! the run (with its per-buyer and per-purchase limits), the wait for the
//! workers to drain the queue, the state the invariants are checked against
//! afterwards, and the figures the report's timeline samples meanwhile
//! ([`Progress`]).
//!
//! A sale split over buckets (`sale create --shards K`) is read whole:
//! every Redis figure is summed (or merged) over the K buckets that bucket
//! 0's meta names (`seckill_common::buckets`), each buyer's entry found in
//! their home bucket. A Redis read that fails (a restart, a timeout) drops
//! the connection, which the next read opens again, and is counted
//! ([`Store::redis_failures`]); the waits and [`Store::retrying`] warn and
//! read again instead of ending the run.

use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::allowance::{Held, MAX_PER_BUYER_FIELD, MAX_PER_PURCHASE_FIELD};
use seckill_common::keys::{self, SaleKeys};
use seckill_common::redis_target::{Con, Target};
use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

/// Pause between two reads of a wait, and before a failed read is tried
/// again.
const POLL: Duration = Duration::from_millis(50);

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

/// A sale's limits as bucket 0's Redis meta holds them
/// (`seckill_common::allowance`): `L` units per buyer (absent: 1) and `Q`
/// units per purchase (absent: `L`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `max_per_buyer`, L.
    pub per_buyer: u32,
    /// `max_per_purchase`, Q.
    pub per_purchase: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            per_buyer: 1,
            per_purchase: 1,
        }
    }
}

impl Limits {
    /// The limits from the meta fields' values (absent or not a number:
    /// L = 1, Q = L).
    pub fn from_meta(per_buyer: Option<&str>, per_purchase: Option<&str>) -> Limits {
        let l = per_buyer
            .and_then(|v| v.parse().ok())
            .unwrap_or(1u32)
            .max(1);
        let q = per_purchase
            .and_then(|v| v.parse().ok())
            .unwrap_or(l)
            .clamp(1, l);
        Limits {
            per_buyer: l,
            per_purchase: q,
        }
    }
}

/// The sale's orders by lifecycle status, as MySQL holds them (orders and,
/// `*_units`, the units they hold: `SUM(quantity)`).
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
    /// Units of the paid orders.
    pub paid_units: u64,
    /// Units of the pending orders.
    pub pending_units: u64,
    /// Units the ledger's `release` rows gave back (sum of their deltas).
    pub released_units: u64,
}

/// The sale's figures at one instant, for the report's timeline
/// (`timeline.rs`); the Redis ones are `None` for the baseline (no Redis).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// Redis's stock counters: units still on sale.
    pub stock_left: Option<i64>,
    /// Redis's flow records: reservations made and not released (units
    /// of them when the store counts units, [`Store::count_units`]).
    pub reserved: Option<u64>,
    /// Messages in the sale's queues.
    pub queued: Option<u64>,
    /// Messages in the workers' processing lists of the sale.
    pub processing: Option<u64>,
    /// MySQL orders holding a unit (not expired or cancelled), or their
    /// units.
    pub ordered: u64,
    /// Of those, the paid ones.
    pub paid: u64,
}

/// The Redis side of a [`Store`]: what opens a connection, and the
/// connection while it works.
struct RedisLink {
    target: Target,
    timeout: Duration,
    con: Option<Con>,
}

/// Redis and MySQL connections for one run.
pub struct Store {
    sale_id: u64,
    redis: Option<RedisLink>,
    mysql: mysql::Conn,
    redis_failures: u64,
    units: bool,
}

/// An order as MySQL holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderRow {
    /// `orders.user_id`.
    pub user_id: String,
    /// `orders.quantity`.
    pub quantity: u32,
}

/// Redis figures of the sale (gateway mode), summed over its buckets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisState {
    /// The stock counters (units left), with the units of transfers
    /// between buckets not yet taken in.
    pub stock: i64,
    /// user id -> buyers-hash value: the reservation id (L = 1) or the
    /// list of reservations held (`RID:Q,...`, L > 1).
    pub buyers: HashMap<String, String>,
    /// Flow records.
    pub flow_records: u64,
    /// Units of the flow records (their messages' `quantity`).
    pub flow_units: u64,
    /// Messages still in the sale's queues.
    pub queued: u64,
    /// Messages in any worker's processing list for the sale.
    pub processing: u64,
    /// Dead-letter entries.
    pub dead_letters: u64,
    /// Buckets read.
    pub buckets: u32,
}

impl RedisState {
    /// Reservations the buyers hash holds: one per buyer (L = 1), or the
    /// entries of every buyer's list.
    pub fn held_reservations(&self, limits: Limits) -> u64 {
        if limits.per_buyer <= 1 {
            return self.buyers.len() as u64;
        }
        self.buyers
            .values()
            .map(|v| Held::parse(v).map_or(0, |h| h.0.len() as u64))
            .sum()
    }
}

/// MySQL figures of the sale.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MysqlState {
    /// `sales.available_stock`.
    pub available_stock: i64,
    /// reservation id -> its order.
    pub orders: HashMap<String, OrderRow>,
    /// Users holding more than one order.
    pub users_with_two_orders: u64,
    /// Users whose orders holding units (not expired or cancelled) add up
    /// to more units than the sale's limit L.
    pub users_over_limit: u64,
    /// `stock_ledger` rows of reason `order`.
    pub ledger_order_rows: u64,
    /// Sum of every ledger row's delta (negative: units deducted).
    pub ledger_delta_sum: i64,
    /// Latest `orders.created_at` in Unix ms.
    pub last_order_ms: Option<i64>,
}

impl MysqlState {
    /// Units of every order (`SUM(quantity)`).
    pub fn ordered_units(&self) -> u64 {
        self.orders.values().map(|o| u64::from(o.quantity)).sum()
    }
}

/// The messages' `quantity` of flow records (absent: 1; a record that is
/// not JSON counts 1 too: the reconciler reports it, not this tool).
pub fn flow_units<'a>(records: impl IntoIterator<Item = &'a String>) -> u64 {
    records
        .into_iter()
        .map(|v| {
            serde_json::from_str::<serde_json::Value>(v)
                .ok()
                .and_then(|j| j.get("quantity").and_then(serde_json::Value::as_u64))
                .unwrap_or(1)
        })
        .sum()
}

/// The units bucket `k` gave away that their destination has not taken in
/// yet: its open transfer records (`{"to":B,"units":N,...}`) whose id the
/// destination's `transfers:in` does not hold (`transfer.rs`: the source
/// forgets a record only after the destination took it in).
fn in_transit(con: &mut Con, k: &SaleKeys) -> redis::RedisResult<i64> {
    let open: HashMap<String, String> = con.hgetall(k.transfers_open())?;
    let mut units = 0i64;
    for (id, rec) in open {
        let Ok(j) = serde_json::from_str::<serde_json::Value>(&rec) else {
            continue;
        };
        let (Some(to), Some(n)) = (
            j.get("to").and_then(serde_json::Value::as_u64),
            j.get("units").and_then(serde_json::Value::as_i64),
        ) else {
            continue;
        };
        let dest = SaleKeys::bucket(k.sale_id, to as u32);
        if !con.hexists::<_, _, bool>(dest.transfers_in(), &id)? {
            units += n;
        }
    }
    Ok(units)
}

/// The keys of every bucket of `sale_id` as bucket 0's meta names them
/// (one bucket when Redis does not hold the sale).
fn bucket_keys(con: &mut Con, sale_id: u64) -> redis::RedisResult<Vec<SaleKeys>> {
    let k = seckill_common::buckets::count(con, sale_id)?.unwrap_or(1);
    Ok(seckill_common::buckets::all(sale_id, k))
}

/// Queue, processing, dead letters and flow records of every bucket.
fn in_flight_of(con: &mut Con, sale_id: u64) -> redis::RedisResult<(u64, u64, u64, u64)> {
    let workers: Vec<String> = con.smembers(keys::WORKERS)?;
    let (mut queued, mut processing, mut dlq, mut flow) = (0u64, 0u64, 0u64, 0u64);
    for k in bucket_keys(con, sale_id)? {
        queued += con.llen::<_, u64>(k.queue())?;
        for w in &workers {
            processing += con.llen::<_, u64>(k.processing(w))?;
        }
        dlq += con.llen::<_, u64>(k.dead_letter())?;
        flow += con.hlen::<_, u64>(k.flow())?;
    }
    Ok((queued, processing, dlq, flow))
}

/// The units on sale in every bucket, and the units of every bucket's
/// meta `total_stock` (live reservations are the difference).
fn stock_of(con: &mut Con, sale_id: u64) -> redis::RedisResult<(i64, i64)> {
    let (mut stock, mut total) = (0i64, 0i64);
    for k in bucket_keys(con, sale_id)? {
        stock += con.get::<_, Option<i64>>(k.stock())?.unwrap_or(0);
        total += con
            .hget::<_, _, Option<i64>>(k.meta(), "total_stock")?
            .unwrap_or(0);
    }
    Ok((stock, total))
}

impl Store {
    /// Connects to MySQL and, unless `redis_url` is `None`, to Redis.
    ///
    /// Errors: either cannot be reached (at the start a Redis that does
    /// not answer ends the run: there is nothing to measure).
    pub fn open(
        sale_id: u64,
        redis_url: Option<&str>,
        mysql_url: &str,
        timeout: Duration,
    ) -> Result<Store, StateError> {
        let redis = match redis_url {
            Some(url) => {
                // One Redis or a cluster (`redis_target.rs` sets the timeouts).
                let target = Target::open(url)?;
                let con = Some(target.connect(timeout)?);
                Some(RedisLink {
                    target,
                    timeout,
                    con,
                })
            }
            None => None,
        };
        let mysql = seckill_common::schema::connect(mysql_url, timeout)
            .map_err(|e| StateError::Mysql(e.to_string()))?;
        Ok(Store {
            sale_id,
            redis,
            mysql,
            redis_failures: 0,
            units: false,
        })
    }

    /// Makes [`Store::progress`] count units (Redis `total_stock − stock`,
    /// MySQL `SUM(quantity)`) rather than reservations and orders.
    pub fn count_units(&mut self, units: bool) {
        self.units = units;
    }

    /// Redis reads that failed so far (each dropped the connection).
    pub fn redis_failures(&self) -> u64 {
        self.redis_failures
    }

    /// Runs `f` on the Redis connection (opened again first if a failure
    /// dropped it); `None` without Redis (the baseline). A failure drops
    /// the connection and is counted.
    fn with_redis<T>(
        &mut self,
        f: impl FnOnce(&mut Con, u64) -> redis::RedisResult<T>,
    ) -> Result<Option<T>, StateError> {
        let sale_id = self.sale_id;
        let Some(link) = self.redis.as_mut() else {
            return Ok(None);
        };
        let res = match link.con.as_mut() {
            Some(con) => f(con, sale_id),
            None => link
                .target
                .connect(link.timeout)
                .and_then(|con| f(link.con.insert(con), sale_id)),
        };
        match res {
            Ok(v) => Ok(Some(v)),
            Err(e) => {
                link.con = None;
                self.redis_failures += 1;
                Err(StateError::Redis(e))
            }
        }
    }

    /// `read` until it succeeds, at most `within`: a Redis failure is
    /// told on stderr (naming `what`) and read again after a pause; a
    /// MySQL failure, or a Redis one past `within`, is the error.
    pub fn retrying<T>(
        &mut self,
        what: &str,
        within: Duration,
        mut read: impl FnMut(&mut Store) -> Result<T, StateError>,
    ) -> Result<T, StateError> {
        let start = Instant::now();
        loop {
            match read(self) {
                Err(StateError::Redis(e)) if start.elapsed() < within => {
                    eprintln!(
                        "load: warning: reading {what} from Redis failed ({e}); reading again"
                    );
                    std::thread::sleep(POLL);
                }
                other => return other,
            }
        }
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

    /// The sale's limits from bucket 0's Redis meta; L = Q = 1 without
    /// Redis (the baseline sells one unit per buyer).
    pub fn limits(&mut self) -> Result<Limits, StateError> {
        let read = self.with_redis(|con, sale| {
            redis::cmd("HMGET")
                .arg(SaleKeys::new(sale).meta())
                .arg(MAX_PER_BUYER_FIELD)
                .arg(MAX_PER_PURCHASE_FIELD)
                .query::<(Option<String>, Option<String>)>(con)
        })?;
        Ok(read.map_or_else(Limits::default, |(l, q)| {
            Limits::from_meta(l.as_deref(), q.as_deref())
        }))
    }

    /// Units already reserved before the run: Redis buyers of every bucket
    /// (with L > 1, the units of their lists: `limits`), or MySQL orders
    /// for the baseline.
    pub fn reserved_so_far(&mut self, limits: Limits) -> Result<u64, StateError> {
        let read = self.with_redis(|con, sale| {
            let mut n = 0u64;
            for k in bucket_keys(con, sale)? {
                if limits.per_buyer <= 1 {
                    n += con.hlen::<_, u64>(k.buyers())?;
                } else {
                    let lists: Vec<String> = con.hvals(k.buyers())?;
                    n += lists
                        .iter()
                        .map(|v| Held::parse(v).map_or(0, |h| h.units()))
                        .sum::<u64>();
                }
            }
            Ok(n)
        })?;
        match read {
            Some(n) => Ok(n),
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
        Ok(self.with_redis(in_flight_of)?.unwrap_or((0, 0, 0, 0)))
    }

    /// Waits until the queues and processing lists are empty and MySQL
    /// holds one order per flow record, a dead-letter entry appears, or
    /// `timeout` passes. Returns whether it drained, and how long the wait
    /// took. A Redis read that fails is told on stderr and read again
    /// (counted in [`Store::redis_failures`]).
    ///
    /// Errors: MySQL cannot be read.
    pub fn wait_drained(&mut self, timeout: Duration) -> Result<(bool, Duration), StateError> {
        let start = Instant::now();
        loop {
            match self.in_flight() {
                Ok((queued, processing, dlq, flow)) => {
                    let drained = queued == 0
                        && processing == 0
                        && (self.redis.is_none() || self.order_count()? >= flow);
                    if drained {
                        return Ok((true, start.elapsed()));
                    }
                    if dlq > 0 {
                        return Ok((false, start.elapsed()));
                    }
                }
                Err(StateError::Redis(e)) => {
                    eprintln!(
                        "load: warning: reading the queues from Redis failed ({e}); reading again"
                    );
                }
                Err(e) => return Err(e),
            }
            if start.elapsed() >= timeout {
                return Ok((false, start.elapsed()));
            }
            std::thread::sleep(POLL);
        }
    }

    /// The sale's Redis figures (gateway mode), or `None` for the baseline.
    pub fn redis_state(&mut self) -> Result<Option<RedisState>, StateError> {
        self.with_redis(|con, sale| {
            let (queued, processing, dead_letters, flow_records) = in_flight_of(con, sale)?;
            let mut s = RedisState {
                flow_records,
                queued,
                processing,
                dead_letters,
                ..RedisState::default()
            };
            for k in bucket_keys(con, sale)? {
                s.buckets += 1;
                s.stock += con.get::<_, Option<i64>>(k.stock())?.unwrap_or(0);
                s.stock += in_transit(con, &k)?;
                let buyers: HashMap<String, String> = con.hgetall(k.buyers())?;
                s.buyers.extend(buyers);
                let flow: Vec<String> = con.hvals(k.flow())?;
                s.flow_units += flow_units(&flow);
            }
            Ok(s)
        })
    }

    /// The sale's orders by lifecycle status, in one statement.
    pub fn lifecycle_counts(&mut self) -> Result<LifecycleCounts, StateError> {
        let id = self.sale_id;
        type Row = (i64, u64, u64, u64, u64, u64, u64, u64, i64);
        let row: Option<Row> = self.mysql.exec_first(
            "SELECT s.available_stock,
                    (SELECT COUNT(*) FROM orders WHERE sale_id = s.id AND status = 'paid'),
                    (SELECT COUNT(*) FROM orders WHERE sale_id = s.id AND status = 'pending_payment'),
                    (SELECT COUNT(*) FROM orders WHERE sale_id = s.id AND status = 'expired'),
                    (SELECT COUNT(*) FROM stock_ledger WHERE sale_id = s.id AND reason = 'release'),
                    (SELECT COUNT(*) FROM payments WHERE sale_id = s.id),
                    (SELECT CAST(COALESCE(SUM(quantity), 0) AS UNSIGNED) FROM orders
                      WHERE sale_id = s.id AND status = 'paid'),
                    (SELECT CAST(COALESCE(SUM(quantity), 0) AS UNSIGNED) FROM orders
                      WHERE sale_id = s.id AND status = 'pending_payment'),
                    (SELECT CAST(COALESCE(SUM(delta), 0) AS SIGNED) FROM stock_ledger
                      WHERE sale_id = s.id AND reason = 'release')
             FROM sales s WHERE s.id = ?",
            (id,),
        )?;
        let (available, paid, pending, expired, released, payments, pu, pe, ru) =
            row.ok_or(StateError::UnknownSale(id))?;
        Ok(LifecycleCounts {
            available,
            paid,
            pending,
            expired,
            released,
            payments,
            paid_units: pu,
            pending_units: pe,
            released_units: ru.max(0) as u64,
        })
    }

    /// The sale's [`Progress`] now: a few Redis reads per bucket (no hash
    /// or list read whole) and one MySQL statement.
    pub fn progress(&mut self) -> Result<Progress, StateError> {
        let (queued, processing, _, flow) = self.in_flight()?;
        let stocks = self.with_redis(stock_of)?;
        let units = self.units;
        let sql = match units {
            true => {
                "SELECT CAST(COALESCE(SUM(quantity), 0) AS UNSIGNED),
                            CAST(COALESCE(SUM(IF(status = 'paid', quantity, 0)), 0) AS UNSIGNED)"
            }
            false => "SELECT COUNT(*), CAST(COALESCE(SUM(status = 'paid'), 0) AS UNSIGNED)",
        };
        let row: Option<(u64, u64)> = self.mysql.exec_first(
            format!(
                "{sql} FROM orders WHERE sale_id = ? AND status NOT IN {}",
                seckill_common::order::RELEASED_SQL
            ),
            (self.sale_id,),
        )?;
        let (ordered, paid) = row.unwrap_or((0, 0));
        let reserved = match units {
            true => stocks.map(|(stock, total)| (total - stock).max(0) as u64),
            false => stocks.map(|_| flow),
        };
        let some = |v: u64| stocks.map(|_| v);
        Ok(Progress {
            stock_left: stocks.map(|s| s.0),
            reserved,
            queued: some(queued),
            processing: some(processing),
            ordered,
            paid,
        })
    }

    /// The sale's Redis stock, every bucket's (0 without Redis or without
    /// the keys).
    pub fn redis_stock(&mut self) -> Result<i64, StateError> {
        Ok(self.with_redis(stock_of)?.map_or(0, |s| s.0))
    }

    /// The sale's MySQL figures; `limit` is the sale's L (the units one
    /// buyer may hold).
    pub fn mysql_state(&mut self, limit: u32) -> Result<MysqlState, StateError> {
        let id = self.sale_id;
        let available_stock: Option<i64> = self
            .mysql
            .exec_first("SELECT available_stock FROM sales WHERE id = ?", (id,))?;
        let rows: Vec<(String, String, u32)> = self.mysql.exec(
            "SELECT reservation_id, user_id, quantity FROM orders WHERE sale_id = ?",
            (id,),
        )?;
        let dup: Option<u64> = self.mysql.exec_first(
            "SELECT COUNT(*) FROM (SELECT user_id FROM orders WHERE sale_id = ?
             GROUP BY user_id HAVING COUNT(*) > 1) d",
            (id,),
        )?;
        let over: Option<u64> = self.mysql.exec_first(
            format!(
                "SELECT COUNT(*) FROM (SELECT user_id FROM orders
                 WHERE sale_id = ? AND status NOT IN {}
                 GROUP BY user_id HAVING SUM(quantity) > ?) d",
                seckill_common::order::RELEASED_SQL
            ),
            (id, limit),
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
        let orders = rows
            .into_iter()
            .map(|(rid, user_id, quantity)| (rid, OrderRow { user_id, quantity }))
            .collect();
        Ok(MysqlState {
            available_stock: available_stock.unwrap_or(0),
            orders,
            users_with_two_orders: dup.unwrap_or(0),
            users_over_limit: over.unwrap_or(0),
            ledger_order_rows,
            ledger_delta_sum,
            last_order_ms: last.flatten(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_default_to_one_unit_and_q_to_l() {
        assert_eq!(Limits::from_meta(None, None), Limits::default());
        let l = |a, b| {
            let x = Limits::from_meta(a, b);
            (x.per_buyer, x.per_purchase)
        };
        assert_eq!(l(Some("4"), None), (4, 4));
        assert_eq!(l(Some("4"), Some("3")), (4, 3));
        assert_eq!(l(Some("x"), Some("9")), (1, 1), "Q never above L");
    }

    #[test]
    fn flow_records_count_their_units() {
        let recs = [
            r#"{"reservation_id":"a","reserved_at_ms":1}"#.to_string(),
            r#"{"reservation_id":"b","reserved_at_ms":1,"quantity":3}"#.to_string(),
            "not json".to_string(),
        ];
        assert_eq!(flow_units(&recs), 5);
    }

    #[test]
    fn held_reservations_are_buyers_or_list_entries() {
        let a = "0123456789abcdef0123456789abcdef";
        let b = "fedcba9876543210fedcba9876543210";
        let mut s = RedisState::default();
        s.buyers.insert("u-1".into(), format!("{a}:2,{b}:1"));
        s.buyers.insert("u-2".into(), format!("{b}:3"));
        let four = Limits::from_meta(Some("4"), None);
        assert_eq!(s.held_reservations(four), 3);
        assert_eq!(s.held_reservations(Limits::default()), 2);
    }
}
