//! Specifies migrations and the `sale` operator commands on real MariaDB and
//! Redis, through the real `seckill-reconciler` binary.

use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_common::reservation::{reserve, ReserveOutcome};
use seckill_tests::{RedisServer, TestDb};
use std::process::Output;
use std::time::Duration;

fn reconciler(db: &TestDb, redis: &RedisServer, args: &[&str]) -> Output {
    seckill_tests::command("seckill-reconciler")
        .args(args)
        .env("SECKILL_MYSQL_URL", db.url())
        .env("SECKILL_REDIS_URL", redis.url())
        .env("RUST_LOG", "warn")
        .output()
        .expect("run seckill-reconciler")
}

fn schema_fingerprint(db: &TestDb) -> Vec<(String, String)> {
    let mut c = db.conn();
    let mut out = Vec::new();
    for t in ["schema_migrations", "sales", "orders", "stock_ledger"] {
        let row: Option<(String, String)> =
            c.query_first(format!("SHOW CREATE TABLE {t}")).unwrap();
        out.push(row.unwrap());
    }
    let versions: Vec<(u32, String)> = c
        .query("SELECT version, CAST(applied_at AS CHAR) FROM schema_migrations ORDER BY version")
        .unwrap();
    out.push(("versions".into(), format!("{versions:?}")));
    out
}

#[test]
fn migrating_twice_changes_nothing() {
    let db = TestDb::create(); // migrated once here
    let redis = RedisServer::start();
    let before = schema_fingerprint(&db);
    let applied = seckill_common::schema::migrate(&db.url(), Duration::from_secs(5)).unwrap();
    assert!(applied.is_empty());
    let out = reconciler(&db, &redis, &["migrate"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "schema is current; nothing to apply"
    );
    assert_eq!(before, schema_fingerprint(&db));
    assert_eq!(db.count("SELECT COUNT(*) FROM schema_migrations"), 11);
}

#[test]
fn migrate_creates_a_missing_database() {
    let db = TestDb::create();
    // Dropped by its guard even if an assertion below fails.
    let fresh_db = db.sibling("_new");
    let (fresh, name) = (fresh_db.url(), fresh_db.name.clone());
    let applied = seckill_common::schema::migrate(&fresh, Duration::from_secs(5)).unwrap();
    assert_eq!(applied, vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
    let mut c = db.conn();
    let n: Option<i64> = c
        .exec_first(
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = ?",
            (&name,),
        )
        .unwrap();
    // sales, orders, stock_ledger, sale_redis_state, payments,
    // sale_bucket_marks, payment_conflicts, sale_changes, primary_generation,
    // schema_migrations
    assert_eq!(n, Some(10));
}

#[test]
fn sale_create_writes_mysql_and_redis_and_sells() {
    let db = TestDb::create();
    let redis = RedisServer::start();
    let out = reconciler(
        &db,
        &redis,
        &[
            "sale",
            "create",
            "--sku",
            "PHONE-1",
            "--stock",
            "3",
            "--starts-at",
            "now",
            "--ends-at",
            "now+1h",
            "--price-cents",
            "49900",
            "--title",
            "Phone",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert_eq!(
        db.count(&format!("SELECT total_stock FROM sales WHERE id = {id}")),
        3
    );
    assert_eq!(
        db.count(&format!(
            "SELECT available_stock FROM sales WHERE id = {id}"
        )),
        3
    );
    assert_eq!(
        db.count(&format!("SELECT price_cents FROM sales WHERE id = {id}")),
        49900
    );
    let mut con = redis.con();
    let stock: i64 = con.get(SaleKeys::new(id).stock()).unwrap();
    assert_eq!(stock, 3);
    let member: bool = con.sismember(seckill_common::keys::SALES, id).unwrap();
    assert!(member);
    assert!(matches!(
        reserve(&mut con, id, "u1").unwrap(),
        ReserveOutcome::Reserved(_)
    ));
}

#[test]
fn sale_create_rejects_bad_input_and_writes_nothing() {
    let db = TestDb::create();
    let redis = RedisServer::start();
    for args in [
        vec![
            "sale",
            "create",
            "--sku",
            "X",
            "--stock",
            "0",
            "--starts-at",
            "now",
            "--ends-at",
            "now+1h",
        ],
        vec![
            "sale",
            "create",
            "--sku",
            "X",
            "--stock",
            "5",
            "--starts-at",
            "now+2h",
            "--ends-at",
            "now+1h",
        ],
        vec![
            "sale",
            "create",
            "--sku",
            "X",
            "--stock",
            "99999999999",
            "--starts-at",
            "now",
            "--ends-at",
            "now+1h",
        ],
        vec![
            "sale",
            "create",
            "--sku",
            "X",
            "--stock",
            "5",
            "--starts-at",
            "soon",
            "--ends-at",
            "now+1h",
        ],
    ] {
        let out = reconciler(&db, &redis, &args);
        assert_eq!(out.status.code(), Some(64), "{args:?}");
        assert!(!out.stderr.is_empty());
    }
    assert_eq!(db.count("SELECT COUNT(*) FROM sales"), 0);
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut redis.con()).unwrap();
    assert!(keys.is_empty(), "{keys:?}");
}

#[test]
fn sale_load_never_overwrites_live_stock() {
    let db = TestDb::create();
    let redis = RedisServer::start();
    let id = seckill_tests::create_sale(&db, &redis, 10, -1000, 3_600_000);
    let mut con = redis.con();
    for u in ["a", "b", "c"] {
        assert!(matches!(
            reserve(&mut con, id, u).unwrap(),
            ReserveOutcome::Reserved(_)
        ));
    }
    for _ in 0..2 {
        let out = reconciler(&db, &redis, &["sale", "load", &id.to_string()]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stock: i64 = con.get(SaleKeys::new(id).stock()).unwrap();
        assert_eq!(stock, 7, "a load put sold stock back on sale");
    }
}

#[test]
fn sale_load_after_redis_data_loss_keeps_ordered_units_sold() {
    let db = TestDb::create();
    let redis = RedisServer::start();
    let id = seckill_tests::create_sale(&db, &redis, 10, -1000, 3_600_000);
    // Two orders already in MySQL, then Redis loses everything.
    db.conn()
        .exec_drop(
            "INSERT INTO orders (reservation_id, sale_id, user_id) VALUES
             ('0000000000000000000000000000000a', ?, 'x'), ('0000000000000000000000000000000b', ?, 'y')",
            (id, id),
        )
        .unwrap();
    let _: () = redis::cmd("FLUSHALL").query(&mut redis.con()).unwrap();
    let out = reconciler(&db, &redis, &["sale", "load", &id.to_string()]);
    assert_eq!(out.status.code(), Some(0));
    let stock: i64 = redis.con().get(SaleKeys::new(id).stock()).unwrap();
    assert_eq!(stock, 8);
}

#[test]
fn sale_show_prints_both_sides_and_unknown_sale_fails() {
    let db = TestDb::create();
    let redis = RedisServer::start();
    let id = seckill_tests::create_sale(&db, &redis, 10, -1000, 3_600_000);
    reserve(&mut redis.con(), id, "a").unwrap();
    // MySQL's total changed after the load: the Redis column shows Redis's own.
    db.conn()
        .exec_drop("UPDATE sales SET total_stock = 12 WHERE id = ?", (id,))
        .unwrap();
    let out = reconciler(&db, &redis, &["sale", "show", &id.to_string()]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("total stock       12           10"), "{text}");
    assert!(text.contains("available/stock   10           9"), "{text}");
    assert!(text.contains("reservations      -            1"), "{text}");
    assert_eq!(
        text.lines().next(),
        Some(format!("sale {id}  sku SKU-TEST  \"test sale\"").as_str())
    );
    // A sale created without --title: no empty quotes after the SKU.
    db.conn()
        .exec_drop("UPDATE sales SET title = '' WHERE id = ?", (id,))
        .unwrap();
    let out = reconciler(&db, &redis, &["sale", "show", &id.to_string()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.lines().next(),
        Some(format!("sale {id}  sku SKU-TEST").as_str())
    );
    let out = reconciler(&db, &redis, &["sale", "show", "999999"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn unreachable_services_exit_2_with_a_message() {
    let db = TestDb::create();
    let mut redis = RedisServer::start();
    redis.stop();
    let out = reconciler(
        &db,
        &redis,
        &[
            "sale",
            "create",
            "--sku",
            "X",
            "--stock",
            "5",
            "--starts-at",
            "now",
            "--ends-at",
            "now+1h",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(!out.stderr.is_empty());
    assert_eq!(db.count("SELECT COUNT(*) FROM sales"), 0);
}

fn create_args(stock: &str, starts: &'static str, ends: &'static str) -> Vec<String> {
    [
        "sale",
        "create",
        "--sku",
        "PHONE-1",
        "--stock",
        stock,
        "--starts-at",
        starts,
        "--ends-at",
        ends,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[test]
fn sale_create_refuses_a_sale_id_redis_holds_for_another_database() {
    let redis = RedisServer::start();
    let (db1, db2) = (TestDb::create(), TestDb::create());
    let args = create_args("5", "now", "now+1h");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = reconciler(&db1, &redis, &args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1");
    let mut con = redis.con();
    assert!(matches!(
        reserve(&mut con, 1, "u1").unwrap(),
        ReserveOutcome::Reserved(_)
    ));

    // A second fresh database on the same Redis also starts at sale id 1.
    let args = create_args("50", "now+1h", "now+2h");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = reconciler(&db2, &redis, &args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(out.stdout.is_empty());
    assert!(
        err.contains("Redis already holds a live sale 1 (stock 4, total 5, window "),
        "{err}"
    );
    assert!(
        err.contains(
            "probably from another database: sale ids must be unique per Redis; \
             the new MySQL sale row 1 was removed again: nothing was created"
        ),
        "{err}"
    );
    assert_eq!(db2.count("SELECT COUNT(*) FROM sales"), 0);
    // The first database's sale is untouched in Redis.
    let stock: i64 = con.get(SaleKeys::new(1).stock()).unwrap();
    assert_eq!(stock, 4);
    let total: String = con.hget(SaleKeys::new(1).meta(), "total_stock").unwrap();
    assert_eq!(total, "5");
}

/// `sale create`'s `created sale` line names the payment window when the
/// sale has one, and says nothing of it otherwise.
#[test]
fn the_created_sale_line_names_the_payment_window() {
    let db = TestDb::create();
    let redis = RedisServer::start();
    let dir = seckill_tests::TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let created = |sku: &str, extra: &[&str]| {
        let (code, out) = seckill_tests::sale_create(&redis, &db, &review, sku, 5, extra);
        assert_eq!(code, 0, "{out}");
        out.lines()
            .find(|l| l.starts_with("created sale "))
            .unwrap_or_default()
            .to_string()
    };
    let line = created("W-1", &["--payment-window", "15m"]);
    assert!(line.ends_with(", payment window 15m"), "{line}");
    let line = created("W-2", &[]);
    assert!(line.contains(" units of W-2 from "), "{line}");
    assert!(!line.contains("payment window"), "{line}");
}
