//! Shared by the `quantity_*` tests: sales of several units per buyer made
//! by the real `seckill-reconciler sale create --max-per-buyer`, and
//! reservations of N units written into Redis as the reservation script
//! writes them (the flow record and the queued message with their
//! quantity, status `queued`, stock − N, the buyer's `RID:N` entry), so
//! the worker, the lifecycle and the reconciler are tested on their own.

use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_common::message::OrderMessage;
use seckill_tests::cluster::TestRedis;
use seckill_tests::TestDb;
use std::path::Path;

/// The price every sale here is created with, in cents.
pub const PRICE: u64 = 1999;

/// The terms of a sale made by [`create`].
pub struct Terms<'a> {
    /// Units on sale.
    pub stock: u64,
    /// `--max-per-buyer`.
    pub per_buyer: u32,
    /// `--max-per-purchase`.
    pub per_purchase: u32,
    /// `--payment-window`, if any.
    pub window: Option<&'a str>,
    /// `--rebuy-after-release`.
    pub rebuy: bool,
}

impl Terms<'static> {
    /// The terms most tests sell under: `stock` units, at most 4 per buyer
    /// and 3 per purchase, no payment window, no buying again after a
    /// release (`Terms { window: Some("1h"), ..Terms::of(10) }` for
    /// others).
    pub fn of(stock: u64) -> Terms<'static> {
        Terms {
            stock,
            per_buyer: 4,
            per_purchase: 3,
            window: None,
            rebuy: false,
        }
    }
}

/// Runs `seckill-reconciler sale create` of a sale of `stock` units open
/// now for an hour at [`PRICE`], with the further arguments `extra`
/// (`seckill_tests::sale_create`); returns its exit code and output.
pub fn sale_create(
    redis: &impl TestRedis,
    db: &TestDb,
    review: &Path,
    stock: u64,
    extra: &[&str],
) -> (i32, String) {
    seckill_tests::sale_create(redis, db, review, "QTY-1", stock, extra)
}

/// Creates a sale open now for an hour at [`PRICE`] with `terms`, through
/// `seckill-reconciler sale create`; returns its id.
pub fn create(redis: &impl TestRedis, db: &TestDb, review: &Path, terms: &Terms<'_>) -> u64 {
    let (l, q) = (terms.per_buyer.to_string(), terms.per_purchase.to_string());
    let mut args = vec!["--max-per-buyer", &l, "--max-per-purchase", &q];
    if let Some(w) = terms.window {
        args.extend(["--payment-window", w]);
    }
    if terms.rebuy {
        args.push("--rebuy-after-release");
    }
    seckill_tests::sale_created(redis, db, review, "QTY-1", terms.stock, &args).0
}

/// Reserves `n` units of `sale` for `user` under idempotency key `key` as
/// the reservation script would (one `MULTI`): returns the reservation id.
pub fn reserve(redis: &impl TestRedis, sale: u64, user: &str, key: &str, n: u32) -> String {
    let rid = seckill_common::ids::keyed_reservation_id(sale, user, key);
    let json = OrderMessage {
        v: 1,
        reservation_id: rid.clone(),
        sale_id: sale,
        user_id: user.to_string(),
        reserved_at_ms: seckill_common::now_ms(),
        quantity: n,
    }
    .to_json();
    let k = SaleKeys::new(sale);
    let mut con = redis.target_con();
    let held: Option<String> = con.hget(k.buyers(), user).unwrap();
    let list = match held {
        Some(h) if !h.is_empty() => format!("{h},{rid}:{n}"),
        _ => format!("{rid}:{n}"),
    };
    let () = redis::pipe()
        .atomic()
        .decr(k.stock(), n)
        .ignore()
        .hset(k.buyers(), user, list)
        .ignore()
        .hset(k.flow(), &rid, &json)
        .ignore()
        .hset(k.status(), &rid, "queued")
        .ignore()
        .lpush(k.queue(), &json)
        .ignore()
        .query(&mut con)
        .unwrap();
    rid
}

/// One integer from MySQL.
pub fn num(db: &TestDb, sql: &str) -> i64 {
    db.count(sql)
}

/// Sale `sale`'s Redis stock (-1 when absent).
pub fn redis_stock(redis: &impl TestRedis, sale: u64) -> i64 {
    redis
        .target_con()
        .get::<_, Option<i64>>(SaleKeys::new(sale).stock())
        .unwrap()
        .unwrap_or(-1)
}

/// A meta field of sale `sale` as an integer (-1 when absent).
pub fn meta(redis: &impl TestRedis, sale: u64, field: &str) -> i64 {
    redis
        .target_con()
        .hget::<_, _, Option<i64>>(SaleKeys::new(sale).meta(), field)
        .unwrap()
        .unwrap_or(-1)
}

/// `buyer`'s entry in the buyers hash of `sale` (`None`: no field).
pub fn held(redis: &impl TestRedis, sale: u64, buyer: &str) -> Option<String> {
    redis
        .target_con()
        .hget(SaleKeys::new(sale).buyers(), buyer)
        .unwrap()
}

/// MySQL's books of `sale` in units: `(orders holding units, their units,
/// −SUM(ledger delta), available_stock)`.
pub fn books(db: &TestDb, sale: u64) -> (i64, i64, i64, i64) {
    (
        num(db, &format!("SELECT COUNT(*) FROM orders WHERE sale_id = {sale} AND status NOT IN ('expired','cancelled')")),
        num(db, &format!("SELECT COALESCE(SUM(quantity), 0) FROM orders WHERE sale_id = {sale} AND status NOT IN ('expired','cancelled')")),
        num(db, &format!("SELECT COALESCE(-SUM(delta), 0) FROM stock_ledger WHERE sale_id = {sale}")),
        num(db, &format!("SELECT available_stock FROM sales WHERE id = {sale}")),
    )
}

/// The findings of a `run` on `review` as `(kind, subject, severity)`,
/// sorted.
pub fn findings(
    redis: &impl TestRedis,
    db: &TestDb,
    review: &Path,
) -> Vec<(String, String, String)> {
    let (code, out) = seckill_tests::reconciler(redis, db, review, &["run"]);
    assert!(code == 0 || code == 1, "reconciler run: {out}");
    let (code, json) =
        seckill_tests::reconciler(redis, db, review, &["findings", "--state", "all", "--json"]);
    assert_eq!(code, 0, "{json}");
    let v: serde_json::Value = serde_json::from_str(json.trim()).expect("findings json");
    let mut out: Vec<(String, String, String)> = v
        .as_array()
        .expect("a list")
        .iter()
        .map(|f| {
            let s = |k: &str| f[k].as_str().unwrap_or_default().to_string();
            (s("kind"), s("subject"), s("severity"))
        })
        .collect();
    out.sort();
    out
}
