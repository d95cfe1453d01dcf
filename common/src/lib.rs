//! Shared pieces of the seckill flash-sale backend; every binary links this.
//!
//! # Data flow
//!
//! ```text
//! HTTP client -> seckill-gateway -> Redis: reservation script (reservation.rs)
//!     takes a unit, writes the flow record, LPUSHes the order message
//!   -> sale queue -> seckill-worker (BLMOVE into its processing list)
//!     -> MySQL: orders + stock ledger + sales.available_stock (schema.rs)
//!   -> seckill-reconciler: flow records vs stock ledger vs orders
//!     -> SQLite review file (findings for a person, audit log)
//! ```
//!
//! # Layout
//!
//! - [`backoff`]: the capped exponential backoff of every retry loop.
//! - [`config`]: the raw environment ([`Env`]), the settings every binary shares ([`Services`]), the gateway's shared part ([`Config`]) and the parsers each binary resolves its own settings with.
//! - [`keys`]: the Redis key schema (one hash tag per sale).
//! - [`lua`]: the key-type guard every writing script runs first.
//! - [`reservation`]: the atomic reservation script and its typed outcome.
//! - [`reserve_units`]: the reservation of several units in one purchase,
//!   keyed by its `Idempotency-Key` (the second script).
//! - [`ids`]: reservation ids, the idempotency key into MySQL (and the id
//!   a purchase's `Idempotency-Key` stands for).
//! - [`allowance`]: a sale's per-buyer and per-purchase limits and the
//!   units a buyer holds.
//! - [`in_flight`]: whether order messages sit in a sale's queue or
//!   processing lists (one atomic check).
//! - [`message`]: the versioned JSON order message.
//! - [`data_loss`]: detecting that Redis lost a sale's reservations, the pause;
//!   [`load_record`]: MySQL's record that a sale was loaded into Redis;
//!   [`bucket_marks`]: the MySQL marks of each bucket of a split sale.
//! - [`dead_letter`]: the entry the worker writes to a dead-letter list.
//! - [`draw`]: the lottery of a draw sale as a pure computation anyone can
//!   repeat (commitment, buyer hashes, entries digest, order, units).
//! - [`metrics`]: bucket bounds and the Prometheus text rendering shared on top of `prometheus-client`.
//! - [`connections`]: the process's figures of its own Redis and MySQL
//!   connections (open, in use, reconnects), by store.
//! - [`schema`]: MySQL tables, migrations, connection options.
//! - [`sale`]: a sale and the load script that never overwrites live stock;
//!   [`archive`]: the Redis side of archiving an ended sale (every key
//!   removed, one tombstone left).
//! - [`sale_admin`]: an operator's pause, end, extension or added stock:
//!   decided once in MySQL, followed in every bucket in Redis.
//! - [`buckets`]: a sale split over K buckets (hash tags, the buyer's home
//!   bucket, shares, loading); [`transfer`]: moving units between buckets
//!   with a record on each side, and the sold-out decision over all of them.
//! - [`redis_target`]: a connection to one Redis, a cluster, or the master
//!   Sentinels name ([`sentinel`]);
//!   [`slot_router`]: a cluster's slot map and per-master pipelines;
//!   [`quarantine`]: the masters that failed, held back for a while.
//! - [`redact`]: a service URL shown without its password.
//! - [`mysql_error`]: a MySQL error as an operator reads it, with its remedy.
//! - [`mysql_replica`]: reading from a MariaDB replica once it has caught up
//!   with the primary's GTID position; [`mysql_writable`]: the promoted
//!   primary of several servers named in `SECKILL_MYSQL_URL` (fencing an old
//!   primary back writable, skipping a hung one).
//! - [`process_metrics`]: the process figures of a `/metrics` page (memory,
//!   descriptors, threads), read from `/proc/self` at each scrape.
//! - [`redis_server`]: the check of the Redis server on every connect
//!   (eviction policy, persistence, writability).
//! - [`reliable_queue`]: the atomic take and reclaim moves of the reliable queue.
//! - [`release`]: the release (rollback) script that puts a reserved unit back on sale.
//! - [`owned_key`]: extend or delete a lock key only while it holds our token.
//! - [`reorder`]: the operator's "queue this order message again" script.
//! - [`order`]: an order's lifecycle states and the ledger reason `release`;
//!   [`buyer_units`]: the units a buyer's orders of a sale hold in MySQL.
//! - [`lifecycle`]: the transitions out of `pending_payment` (expire, cancel,
//!   pay) in MySQL and the Redis step that puts a released unit back on sale.
//! - [`payment`]: the payment service's signed message (HMAC-SHA256 over
//!   timestamp and body) and the durable payment queue in Redis;
//!   [`receipt`]: the record of when a payment was received, which the
//!   expiry sweep's closing of a reservation respects; [`early_payment`]:
//!   a payment that came before its order, decided again once the order
//!   exists; [`dropped_payment`]: the MySQL record of a payment an operator
//!   dropped, which keeps every later path from applying it.
//! - [`status_write`]: the worker's status write after its MySQL commit
//!   (`confirmed` or `pending_payment`, never over a later status).
//! - [`notify`]: systemd readiness (`sd_notify`) for `Type=notify` units.
//! - [`shutdown`]: the SIGINT/SIGTERM flag and logging set-up.
//! - [`start`]: the start-up and exit codes every binary shares.
//! - [`trusted`]: the trusted proxies whose `X-Forwarded-For` the gateway believes.
//! - [`timefmt`]: RFC 3339 / `now+30s` parsing and formatting of Unix ms.
//! - [`token`]: buyer tokens: the JWKS key file, key generation, minting.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod allowance;
pub mod archive;
pub mod backoff;
pub mod bucket_marks;
pub mod buckets;
pub mod buyer_units;
pub mod config;
pub mod connections;
pub mod data_loss;
pub mod dead_letter;
pub mod draw;
pub mod dropped_payment;
pub mod early_payment;
pub mod ids;
pub mod in_flight;
pub mod keys;
pub mod lifecycle;
pub mod load_record;
pub mod lua;
pub mod message;
pub mod metrics;
pub mod mysql_error;
pub mod mysql_replica;
pub mod mysql_writable;
pub mod notify;
pub mod order;
pub mod owned_key;
pub mod payment;
pub mod process_metrics;
pub mod quarantine;
pub mod receipt;
pub mod redact;
pub mod redis_error;
pub mod redis_server;
pub mod redis_target;
pub mod release;
pub mod reliable_queue;
pub mod reorder;
pub mod reservation;
pub mod reserve_units;
pub mod sale;
pub mod sale_admin;
pub mod schema;
pub mod sentinel;
pub mod shutdown;
pub mod slot_router;
pub mod start;
pub mod status_write;
pub mod timefmt;
pub mod token;
pub mod transfer;
pub mod trusted;

pub use config::{Config, ConfigError, Env, Services};
pub use shutdown::Shutdown;

/// The rule [`is_valid_token`] checks, as a literal, so that messages can
/// `concat!` it (see [`TOKEN_RULE`]).
#[macro_export]
macro_rules! token_rule {
    () => {
        "1-64 characters of A-Z a-z 0-9 _ . -"
    };
}

/// The rule [`is_valid_token`] checks, as told to people (error messages).
pub const TOKEN_RULE: &str = token_rule!();

/// Whether `s` is a valid user or worker id: 1-64 characters of
/// `A-Z a-z 0-9 _ . -` (the gateway API's rule for `user_id`).
pub fn is_valid_token(s: &str) -> bool {
    (1..=64).contains(&s.len()) && s.bytes().all(|b| TOKEN_BYTE[usize::from(b)])
}

/// Which bytes a token may hold (`A-Z a-z 0-9 _ . -`), one lookup per byte:
/// the rule runs on every purchase (docs/PERFORMANCE.md, "Instructions per
/// request").
const TOKEN_BYTE: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        t[i] = b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-';
        i += 1;
    }
    t
};

/// Whether `e` is an error reply of the server (`WRONGTYPE`, `OOM`, `ERR`,
/// `NOSCRIPT`...: the connection is fine and the command ran or was
/// refused) rather than a failure to talk to it (I/O, timeout, parse).
/// redis-rs files replies it has no kind for (e.g. `WRONGTYPE`) under
/// `ErrorKind::Extension`, so the kind alone does not tell; the code does.
pub fn is_error_reply(e: &redis::RedisError) -> bool {
    matches!(e.kind(), redis::ErrorKind::Server(_)) || e.code().is_some()
}

/// Current Unix time in ms from this machine's clock (used only for
/// bookkeeping such as heartbeats and reports, never for the sale window).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
