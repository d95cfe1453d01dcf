//! `seckill-baseline`: the design most teams ship without Redis, kept for the
//! end-to-end benchmark only (`scripts/bench.sh`). The same purchase API as
//! `seckill-gateway` on tiny_http, where each purchase is one direct MySQL
//! transaction: `UPDATE sales SET available_stock = available_stock - 1
//! WHERE id = ? AND available_stock > 0` (inside the sale window), the order
//! insert and the stock ledger row. Every purchase queues on the sale's row
//! lock; that is the point of the comparison.
//!
//! Configuration: `SECKILL_LISTEN`, `SECKILL_MYSQL_URL`,
//! `SECKILL_GATEWAY_THREADS` (handler threads, one MySQL connection each;
//! default 2 × cores),
//! `SECKILL_BODY_LIMIT`, `SECKILL_MYSQL_TIMEOUT`. Exit codes: 0 after
//! SIGTERM/SIGINT, 2 bad configuration or cannot bind.
#![forbid(unsafe_code)]

use mysql::prelude::Queryable;
use mysql::{Conn, TxOpts};
use seckill_common::{Config, Shutdown};
use std::io::Read;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tiny_http::{Header, Method, Request, Response, Server};

/// MySQL's error number for a duplicate key (`ER_DUP_ENTRY`).
const ER_DUP_ENTRY: u16 = 1062;

fn main() -> ExitCode {
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("seckill-baseline: {e}");
            return ExitCode::from(2);
        }
    };
    seckill_common::shutdown::init_logging();
    let shutdown = match Shutdown::install(|| {}) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("seckill-baseline: signal handler: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&config, &shutdown) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("seckill-baseline: {e}");
            ExitCode::from(2)
        }
    }
}

/// Serves until `shutdown` is triggered. Errors: the listener cannot bind.
fn run(config: &Config, shutdown: &Shutdown) -> Result<(), String> {
    let server = Server::http(config.listen)
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    let server = Arc::new(server);
    // Its own default (2 × cores), not the gateway's link count.
    let threads = match config.gateway_threads {
        0 => std::thread::available_parallelism().map_or(4, |n| n.get() * 2),
        n => n,
    };
    log::info!(
        "seckill-baseline listening on {} with {threads} threads",
        config.listen
    );
    std::thread::scope(|s| {
        for _ in 0..threads {
            let server = Arc::clone(&server);
            s.spawn(move || {
                let mut con: Option<Conn> = None;
                while !shutdown.is_triggered() {
                    match server.recv_timeout(Duration::from_millis(200)) {
                        Ok(Some(req)) => handle(req, config, &mut con),
                        Ok(None) => {}
                        Err(e) => log::warn!("accept: {e}"),
                    }
                }
            });
        }
    });
    Ok(())
}

fn json_response(status: u16, body: String) -> Response<std::io::Cursor<Vec<u8>>> {
    let mut r = Response::from_string(body).with_status_code(status);
    if let Ok(h) = Header::from_bytes(&b"Content-Type"[..], &b"application/json"[..]) {
        r.add_header(h);
    }
    if status == 503 {
        if let Ok(h) = Header::from_bytes(&b"Retry-After"[..], &b"1"[..]) {
            r.add_header(h);
        }
    }
    r
}

fn error(status: u16, code: &str) -> (u16, String) {
    (status, format!(r#"{{"error":"{code}"}}"#))
}

fn handle(mut req: Request, config: &Config, con: &mut Option<Conn>) {
    let (status, body) = route(&mut req, config, con);
    if let Err(e) = req.respond(json_response(status, body)) {
        log::debug!("respond: {e}");
    }
}

fn route(req: &mut Request, config: &Config, con: &mut Option<Conn>) -> (u16, String) {
    let url = req.url().to_string();
    if url == "/healthz" {
        return (200, r#"{"status":"ok"}"#.to_string());
    }
    let parts: Vec<&str> = url.split('/').collect();
    let sale_id = match parts.as_slice() {
        ["", "v1", "sales", id, "purchases"] => match id.parse::<u64>() {
            Ok(id) => id,
            Err(_) => return error(404, "sale_not_found"),
        },
        _ => return error(404, "not_found"),
    };
    if *req.method() != Method::Post {
        return error(405, "method_not_allowed");
    }
    let limit = config.body_limit_bytes;
    if req.body_length().is_some_and(|n| n > limit) {
        return error(413, "payload_too_large");
    }
    let mut body = Vec::new();
    if req
        .as_reader()
        .take(limit as u64 + 1)
        .read_to_end(&mut body)
        .is_err()
    {
        return error(400, "invalid_request");
    }
    if body.len() > limit {
        return error(413, "payload_too_large");
    }
    let user = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("user_id")?.as_str().map(str::to_string));
    let Some(user) = user.filter(|u| seckill_common::is_valid_token(u)) else {
        return error(400, "invalid_request");
    };
    if con.is_none() {
        match seckill_common::schema::connect(&config.mysql_url, config.mysql_timeout) {
            Ok(c) => *con = Some(c),
            Err(e) => {
                log::warn!("mysql connect: {e}");
                return error(503, "unavailable");
            }
        }
    }
    let Some(c) = con.as_mut() else {
        return error(503, "unavailable");
    };
    match purchase(c, sale_id, &user) {
        Ok(answer) => answer,
        Err(e) => {
            log::warn!("purchase: {e}");
            *con = None;
            error(503, "unavailable")
        }
    }
}

/// One purchase as one MySQL transaction; returns the HTTP answer.
fn purchase(c: &mut Conn, sale_id: u64, user: &str) -> Result<(u16, String), mysql::Error> {
    let mut tx = c.start_transaction(TxOpts::default())?;
    tx.exec_drop(
        "UPDATE sales SET available_stock = available_stock - 1
         WHERE id = ? AND available_stock > 0
           AND UTC_TIMESTAMP(3) >= starts_at AND UTC_TIMESTAMP(3) < ends_at",
        (sale_id,),
    )?;
    if tx.affected_rows() == 0 {
        let why: Option<(i64, bool, bool)> = tx.exec_first(
            "SELECT available_stock, UTC_TIMESTAMP(3) < starts_at, UTC_TIMESTAMP(3) >= ends_at
             FROM sales WHERE id = ?",
            (sale_id,),
        )?;
        tx.rollback()?;
        return Ok(match why {
            None => error(404, "sale_not_found"),
            Some((_, true, _)) => error(403, "sale_not_started"),
            Some((_, _, true)) => error(403, "sale_ended"),
            Some(_) => error(410, "sold_out"),
        });
    }
    let rid = seckill_common::ids::new_reservation_id();
    let inserted = tx.exec_drop(
        "INSERT INTO orders (reservation_id, sale_id, user_id, quantity, status, reserved_at)
         VALUES (?, ?, ?, 1, 'confirmed', UTC_TIMESTAMP(3))",
        (&rid, sale_id, user),
    );
    match inserted {
        Ok(()) => {}
        Err(mysql::Error::MySqlError(e)) if e.code == ER_DUP_ENTRY => {
            tx.rollback()?;
            let prev: Option<String> = c.exec_first(
                "SELECT reservation_id FROM orders WHERE sale_id = ? AND user_id = ?",
                (sale_id, user),
            )?;
            return Ok((
                409,
                format!(
                    r#"{{"error":"already_purchased","reservation_id":"{}"}}"#,
                    prev.unwrap_or_default()
                ),
            ));
        }
        Err(e) => return Err(e),
    }
    tx.exec_drop(
        "INSERT INTO stock_ledger (reservation_id, sale_id, user_id, delta, reason)
         VALUES (?, ?, ?, -1, 'order')",
        (&rid, sale_id, user),
    )?;
    tx.commit()?;
    Ok((
        202,
        format!(r#"{{"reservation_id":"{rid}","status":"confirmed"}}"#),
    ))
}
