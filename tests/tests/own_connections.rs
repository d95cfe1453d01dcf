//! Specifies each binary's figures of its own connections
//! (`seckill_common::connections`) against the servers' own counts:
//!
//! - a worker with 3 consumers (none scaling) and one sale holds exactly
//!   8 Redis connections (each consumer its ordinary one, the consumer
//!   holding the sale's claim its blocking one, the housekeeping, the
//!   data-loss watch, the expiry sweep and the payments thread one each)
//!   and 3 MySQL ones (the watch, the sweep, the payments thread; a
//!   consumer opens its session at its first batch), as many as Redis's
//!   `CLIENT LIST` and MySQL's process list show; `CLIENT KILL TYPE
//!   normal` kills the 8; the threads that call Redis on every pass
//!   reconnect: `seckill_worker_reconnects_total{store="redis"}` 7 and
//!   `{store="mysql"}` 2 (the watch and the payments thread drop both
//!   their connections after a failed pass), while the expiry sweep,
//!   which calls Redis only when orders are due, still holds its dead
//!   connection (8 open, 7 in `CLIENT LIST`);
//! - killing a worker's 3 MySQL sessions (`KILL`): the data-loss watch and
//!   the expiry sweep, which read MySQL on every pass, reconnect both their
//!   connections (2 MySQL and 2 Redis reconnects); the payments thread
//!   reads MySQL only for a payment and still holds its dead connection
//!   (3 open, 2 in the process list);
//! - a gateway in round-trip mode with 6 links holds, after 6 reads, its
//!   6 links and the fitness check's connection, as `CLIENT LIST` shows;
//!   after `CLIENT KILL TYPE normal` and 6 reads (answered 200: a link
//!   retries on a fresh connection) its reconnects are the 7 killed; 3
//!   reads held by a `CLIENT PAUSE` shorter than the Redis timeout are 3
//!   connections in use at the scrape, 0 once answered.

use crate::support::gateway as gateway_support;
use crate::support::worker as worker_support;

use gateway_support::{get, open_sale, Gateway};
use mysql::prelude::Queryable;
use seckill_tests::{create_sale, wait_until, RedisServer, TestDb};
use std::time::Duration;
use worker_support::{Opts, WorkerProc};

const LONG: Duration = Duration::from_secs(30);

/// The value of `series` (name and labels, exactly as written) on `page`.
fn sample(page: &str, series: &str) -> Option<i64> {
    page.lines().find_map(|l| {
        let (s, v) = l.rsplit_once(' ')?;
        (s == series).then(|| v.parse().ok()).flatten()
    })
}

/// Clients of `redis` but the asking connection (`CLIENT LIST`).
fn redis_clients(redis: &RedisServer) -> i64 {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut redis.con())
        .expect("CLIENT LIST");
    list.lines().count() as i64 - 1
}

/// Kills every normal client of `redis` but the asking one; how many.
fn kill_redis_clients(redis: &RedisServer) -> i64 {
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query(&mut redis.con())
        .expect("CLIENT KILL")
}

/// MySQL sessions on `db`'s database but the asking one.
fn mysql_sessions(db: &TestDb) -> i64 {
    let name = db.url().rsplit('/').next().unwrap_or_default().to_string();
    let n: Option<i64> = db
        .conn()
        .exec_first(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
             WHERE DB = ? AND ID <> CONNECTION_ID()",
            (name,),
        )
        .expect("the process list");
    n.unwrap_or(0)
}

#[test]
fn a_worker_reports_the_connections_it_holds_and_its_reconnects() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    create_sale(&db, &redis, 10, -1000, 600_000);
    let opts = Opts {
        env: &[
            ("SECKILL_WORKER_CONSUMERS_MIN", "3"),
            ("SECKILL_WORKER_CONSUMERS_MAX", "3"),
        ],
        ..Opts::default()
    };
    let w = WorkerProc::start(&redis, &db, "w1", &opts);
    w.wait_metrics();
    let redis_open = r#"seckill_worker_connections{worker="w1",store="redis"}"#;
    let mysql_open = r#"seckill_worker_connections{worker="w1",store="mysql"}"#;
    let redis_again = r#"seckill_worker_reconnects_total{worker="w1",store="redis"}"#;
    let mysql_again = r#"seckill_worker_reconnects_total{worker="w1",store="mysql"}"#;
    let mut page = String::new();
    // Redis's count, plus the connections held but not used since the
    // kill (the expiry sweep's: it calls Redis only when orders are due).
    let settled = |page: &str, unnoticed: i64, again: (i64, i64)| {
        sample(page, redis_open) == Some(redis_clients(&redis) + unnoticed)
            && sample(page, mysql_open) == Some(mysql_sessions(&db))
            && (sample(page, redis_again), sample(page, mysql_again))
                == (Some(again.0), Some(again.1))
    };
    wait_until(LONG, "the worker's connections to show", || {
        page = w.metrics();
        settled(&page, 0, (0, 0)) && sample(&page, redis_open) == Some(8)
    });
    assert_eq!(sample(&page, mysql_open), Some(3), "{page}");

    let killed = kill_redis_clients(&redis);
    assert_eq!(killed, 8);
    wait_until(LONG, "every busy thread to reconnect", || {
        page = w.metrics();
        settled(&page, 1, (7, 2)) && sample(&page, redis_open) == Some(8)
    });
    // Nothing more moves: one reconnect per connection lost and used.
    std::thread::sleep(Duration::from_millis(1500));
    let page = w.metrics();
    assert_eq!(sample(&page, redis_again), Some(7), "{page}");
    assert_eq!(sample(&page, mysql_again), Some(2), "{page}");
    assert_eq!(sample(&page, redis_open), Some(redis_clients(&redis) + 1));
    assert_eq!(sample(&page, mysql_open), Some(mysql_sessions(&db)));
}

/// Reads `GET /v1/sales/1` `n` times in a row (each borrows the next link
/// of the pool), every one answered 200.
fn read_sale(port: u16, n: usize) {
    for _ in 0..n {
        assert_eq!(get(port, "/v1/sales/1").status, 200);
    }
}

#[test]
fn a_gateway_reports_its_links_open_in_use_and_reconnected() {
    let redis = RedisServer::start();
    open_sale(&redis, 1, 5);
    let g = Gateway::start(
        &redis,
        &[
            ("SECKILL_GATEWAY_THREADS", "6"),
            ("SECKILL_GATEWAY_REDIS_THREADS", "0"),
            ("SECKILL_REDIS_TIMEOUT", "5s"),
        ],
    );
    let open = r#"seckill_gateway_connections{store="redis"}"#;
    let in_use = r#"seckill_gateway_connections_in_use{store="redis"}"#;
    let again = r#"seckill_gateway_reconnects_total{store="redis"}"#;
    read_sale(g.port, 6);
    let mut page = String::new();
    wait_until(LONG, "6 links and the fitness check", || {
        page = get(g.port, "/metrics").body;
        sample(&page, open) == Some(7) && redis_clients(&redis) == 7
    });
    assert_eq!(
        (sample(&page, in_use), sample(&page, again)),
        (Some(0), Some(0)),
        "{page}"
    );

    let killed = kill_redis_clients(&redis);
    assert_eq!(killed, 7);
    read_sale(g.port, 6);
    wait_until(LONG, "the fitness check to reconnect", || {
        let page = get(g.port, "/metrics").body;
        sample(&page, again) == Some(killed) && sample(&page, open) == Some(redis_clients(&redis))
    });
    let page = get(g.port, "/metrics").body;
    assert_eq!(sample(&page, open), Some(7), "{page}");
    assert_eq!(sample(&page, again), Some(7), "{page}");

    // 3 reads held by Redis: 3 links in use at the scrape.
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1500)
        .query(&mut redis.con())
        .expect("CLIENT PAUSE");
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let port = g.port;
            std::thread::spawn(move || get(port, "/v1/sales/1").status)
        })
        .collect();
    wait_until(LONG, "3 links in use", || {
        sample(&get(g.port, "/metrics").body, in_use) == Some(3)
    });
    let answered: Vec<u16> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    assert_eq!(answered, vec![200; 3]);
    let page = get(g.port, "/metrics").body;
    assert_eq!(
        (sample(&page, in_use), sample(&page, again)),
        (Some(0), Some(7)),
        "{page}"
    );
}

/// Kills every MySQL session of `db`'s database but the asking one; how
/// many.
fn kill_mysql_sessions(db: &TestDb) -> i64 {
    let name = db.url().rsplit('/').next().unwrap_or_default().to_string();
    let mut c = db.conn();
    let ids: Vec<u64> = c
        .exec(
            "SELECT ID FROM information_schema.PROCESSLIST \
             WHERE DB = ? AND ID <> CONNECTION_ID()",
            (name,),
        )
        .expect("the process list");
    for id in &ids {
        c.query_drop(format!("KILL {id}")).expect("KILL");
    }
    ids.len() as i64
}

#[test]
fn a_worker_counts_its_mysql_reconnects_after_its_sessions_are_killed() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    create_sale(&db, &redis, 10, -1000, 600_000);
    let w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    w.wait_metrics();
    let mysql_open = r#"seckill_worker_connections{worker="w1",store="mysql"}"#;
    let redis_again = r#"seckill_worker_reconnects_total{worker="w1",store="redis"}"#;
    let mysql_again = r#"seckill_worker_reconnects_total{worker="w1",store="mysql"}"#;
    wait_until(LONG, "the worker's 3 MySQL sessions", || {
        sample(&w.metrics(), mysql_open) == Some(3) && mysql_sessions(&db) == 3
    });
    assert_eq!(kill_mysql_sessions(&db), 3);
    let mut page = String::new();
    wait_until(LONG, "the watch and the sweep to reconnect", || {
        page = w.metrics();
        (sample(&page, mysql_again), sample(&page, redis_again)) == (Some(2), Some(2))
            && mysql_sessions(&db) == 2
    });
    std::thread::sleep(Duration::from_millis(1500));
    let page = w.metrics();
    assert_eq!(sample(&page, mysql_again), Some(2), "{page}");
    assert_eq!(sample(&page, redis_again), Some(2), "{page}");
    assert_eq!(sample(&page, mysql_open), Some(3), "{page}");
    assert_eq!(mysql_sessions(&db), 2);
}
