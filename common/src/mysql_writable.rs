//! Owns `SECKILL_MYSQL_URL` naming several servers
//! (`mysql://user:pw@db-a:3306,db-b:3306/seckill`): a connection goes to the
//! promoted primary among them. Every listed server is asked at once
//! (`@@read_only`, and the database's `primary_generation` row, migration
//! 11); of the writable ones, the one with the highest generation is the
//! primary. The promotion step (docs/OPERATIONS.md, "A MySQL failover")
//! raises the generation on the replica it promotes, so an old primary
//! that comes back writable (a reboot with its own config) holds an older
//! generation: it is refused and named in a warning, never written to.
//! Two writable servers with the same generation (a promotion that did not
//! raise it) are both refused: nobody can tell which one is current. A
//! process also refuses a server older than the newest generation it has
//! seen. After a promotion every component's next connect reaches the new
//! primary, without a restart.
//!
//! A server that does not answer within the timeout (a hung host: TCP
//! connects, the handshake never comes) is remembered as hung: the next
//! connects skip it, while one background probe at a time asks it again
//! and forgets it once it answers. So only the first connect after a hang
//! waits `SECKILL_MYSQL_TIMEOUT` for it.
//! `schema::connect` and `schema::mysql_opts` hand such a URL here.

use crate::redact::redacted;
use crate::schema::SchemaError;
use mysql::prelude::Queryable;
use mysql::Conn;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// The one-server URLs of a URL naming several (`host:port` list between
/// the `@` (or the scheme) and the path); `None` for a one-server URL.
pub fn servers(url: &str) -> Option<Vec<String>> {
    let (scheme, rest) = url.split_once("://")?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), authority),
    };
    if !hosts.contains(',') {
        return None;
    }
    Some(
        hosts
            .split(',')
            .map(|h| format!("{scheme}://{user}{h}{tail}"))
            .collect(),
    )
}

/// Servers that timed out, by URL: whether a background probe is asking
/// it again now.
static HUNG: Mutex<Option<HashMap<String, Hung>>> = Mutex::new(None);

/// The newest primary generation this process has connected to.
static NEWEST: AtomicU64 = AtomicU64::new(0);

/// Writable servers the last connect refused (see [`refused_writable`]).
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// How many writable servers of `SECKILL_MYSQL_URL` this process's last
/// connect refused: an old primary back writable, or both of two at one
/// generation (0 when every server but the primary is read-only or down).
/// The reconciler exports it for the alert `SeckillMysqlOldPrimaryWritable`.
pub fn refused_writable() -> u64 {
    REFUSED.load(Ordering::Relaxed)
}

struct Hung {
    probing: bool,
}

/// What one server answered.
enum Probe {
    /// Writable, with its database's primary generation (0: no row, no
    /// table or no database yet).
    Writable(Conn, u64),
    /// `@@read_only = 1`: a replica, or a demoted primary.
    ReadOnly,
    /// It could not be asked: why, its address first.
    Failed(String),
}

/// A connection to the promoted primary of `urls` (see the module doc),
/// each server asked with `timeout`; with `server_level`, the connection
/// selects no database (for `migrate`, before the database exists), the
/// generation is still read from the URLs' database when it exists.
///
/// Errors: [`SchemaError`]: a bad URL, or an I/O error naming each server
/// and why it was passed over (unreachable, timeout, read-only: no primary
/// promoted yet, two writable with one generation, an older generation),
/// so callers retry as for a server that is down.
pub fn connect_primary(
    urls: &[String],
    timeout: Duration,
    server_level: bool,
) -> Result<Conn, SchemaError> {
    connect_primary_at(urls, timeout, server_level).map(|(c, _)| c)
}

/// [`connect_primary`], with the chosen server's address (password
/// hidden), for the errors of the connection's later statements.
///
/// Errors: as [`connect_primary`].
pub fn connect_primary_at(
    urls: &[String],
    timeout: Duration,
    server_level: bool,
) -> Result<(Conn, String), SchemaError> {
    for url in urls {
        crate::schema::mysql_opts(url, timeout)?;
    }
    let skipped: Vec<bool> = urls.iter().map(|u| skip_hung(u, timeout)).collect();
    let probes: Vec<Probe> = std::thread::scope(|s| {
        let handles: Vec<_> = urls
            .iter()
            .zip(&skipped)
            .map(|(url, skip)| (!*skip).then(|| s.spawn(move || probe(url, timeout, server_level))))
            .collect();
        handles
            .into_iter()
            .zip(urls)
            .map(|(h, url)| match h {
                None => Probe::Failed(format!(
                    "{}: skipped: timed out earlier, hung (asked again in the background)",
                    redacted(url)
                )),
                Some(h) => h
                    .join()
                    .unwrap_or_else(|_| Probe::Failed(format!("{}: probe failed", redacted(url)))),
            })
            .collect()
    });
    choose(urls, probes)
}

/// [`connect_primary`] with the URLs' database selected.
///
/// Errors: as [`connect_primary`].
pub fn connect_writable(urls: &[String], timeout: Duration) -> Result<Conn, SchemaError> {
    connect_primary(urls, timeout, false)
}

/// The primary among the answers, or why there is none.
fn choose(urls: &[String], probes: Vec<Probe>) -> Result<(Conn, String), SchemaError> {
    let mut why = Vec::with_capacity(urls.len());
    let mut writable: Vec<(Conn, u64, String)> = Vec::new();
    for (url, p) in urls.iter().zip(probes) {
        match p {
            Probe::Writable(c, g) => writable.push((c, g, redacted(url))),
            Probe::ReadOnly => why.push(format!("{}: read-only", redacted(url))),
            Probe::Failed(e) => why.push(e),
        }
    }
    writable.sort_by_key(|w| std::cmp::Reverse(w.1));
    let newest_seen = NEWEST.load(Ordering::Relaxed);
    let mut rest = writable.into_iter();
    let Some((conn, generation, at)) = rest.next() else {
        REFUSED.store(0, Ordering::Relaxed);
        return Err(refused(format!(
            "no writable server in SECKILL_MYSQL_URL ({}): promote the replica \
             (docs/OPERATIONS.md, \"A MySQL failover\")",
            why.join("; ")
        )));
    };
    let others: Vec<(u64, String)> = rest.map(|(_, g, a)| (g, a)).collect();
    REFUSED.store(others.len() as u64, Ordering::Relaxed);
    if let Some((_, tie)) = others.iter().find(|(g, _)| *g == generation) {
        REFUSED.store(others.len() as u64 + 1, Ordering::Relaxed);
        return Err(refused(format!(
            "two writable servers in SECKILL_MYSQL_URL at the same primary generation \
             {generation}: {at} and {tie}; nothing is written until one is made read-only \
             (SET GLOBAL read_only = 1 on the old primary, docs/OPERATIONS.md, \"A MySQL failover\")"
        )));
    }
    if generation < newest_seen {
        REFUSED.store(others.len() as u64 + 1, Ordering::Relaxed);
        return Err(refused(format!(
            "the only writable server in SECKILL_MYSQL_URL, {at}, is at primary generation \
             {generation}, older than {newest_seen} this process wrote to: an old primary; \
             make it read-only (docs/OPERATIONS.md, \"A MySQL failover\"); {}",
            why.join("; ")
        )));
    }
    for (g, old) in &others {
        log::warn!(
            "{old} (SECKILL_MYSQL_URL) is writable at primary generation {g}, older than \
             {at}'s {generation}: an old primary back writable, refused; make it read-only \
             (docs/OPERATIONS.md, \"A MySQL failover\")"
        );
    }
    NEWEST.fetch_max(generation, Ordering::Relaxed);
    Ok((conn, at))
}

fn refused(message: String) -> SchemaError {
    SchemaError::Mysql(mysql::Error::IoError(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        message,
    )))
}

/// Asks one server: connect, `@@read_only`, the generation.
fn probe(url: &str, timeout: Duration, server_level: bool) -> Probe {
    let at = redacted(url);
    let failed = |e: &mysql::Error| {
        if crate::mysql_error::is_timeout(e) {
            remember_hung(url);
        } else {
            forget_hung(url);
        }
        Probe::Failed(format!(
            "{at}: {}",
            crate::mysql_error::describe_within(e, timeout)
        ))
    };
    let opts = match crate::schema::mysql_opts(url, timeout) {
        Ok(o) if server_level => o.db_name(None::<String>),
        Ok(o) => o,
        Err(e) => return Probe::Failed(format!("{at}: {e}")),
    };
    let mut c = match Conn::new(opts) {
        Ok(c) => c,
        Err(e) => return failed(&e),
    };
    forget_hung(url);
    match c.query_first::<u8, _>("SELECT @@read_only") {
        Ok(Some(0)) => {}
        Ok(_) => return Probe::ReadOnly,
        Err(e) => return failed(&e),
    }
    match generation(&mut c, url) {
        Ok(g) => Probe::Writable(c, g),
        Err(e) => failed(&e),
    }
}

/// The primary generation recorded in the database `url` names; 0 when
/// there is no such database, table or row (before `migrate`).
///
/// Errors: MySQL failures other than those.
fn generation(c: &mut Conn, url: &str) -> Result<u64, mysql::Error> {
    let Some(db) = crate::schema::database_name(url) else {
        return Ok(0);
    };
    let sql = format!(
        "SELECT generation FROM `{}`.primary_generation WHERE id = 1",
        db.replace('`', "``")
    );
    match c.query_first::<u64, _>(sql) {
        Ok(g) => Ok(g.unwrap_or(0)),
        // 1049 unknown database, 1146 no such table.
        Err(mysql::Error::MySqlError(e)) if e.code == 1049 || e.code == 1146 => Ok(0),
        Err(e) => Err(e),
    }
}

fn with_hung<T>(f: impl FnOnce(&mut HashMap<String, Hung>) -> T) -> T {
    let mut g = HUNG.lock().unwrap_or_else(PoisonError::into_inner);
    f(g.get_or_insert_with(HashMap::new))
}

fn remember_hung(url: &str) {
    with_hung(|m| {
        let probing = m.get(url).is_some_and(|h| h.probing);
        m.insert(url.to_string(), Hung { probing });
    });
}

fn forget_hung(url: &str) {
    with_hung(|m| m.remove(url));
}

/// Whether `url` is remembered as hung; if so, and no probe asks it now,
/// starts one in the background (its answer updates the memory; its
/// connection is dropped).
fn skip_hung(url: &str, timeout: Duration) -> bool {
    let start_probe = with_hung(|m| match m.get_mut(url) {
        None => None,
        Some(h) if h.probing => Some(false),
        Some(h) => {
            h.probing = true;
            Some(true)
        }
    });
    match start_probe {
        None => false,
        Some(false) => true,
        Some(true) => {
            let owned = url.to_string();
            let spawned = std::thread::Builder::new()
                .name("mysql-hung-probe".into())
                .spawn(move || {
                    let _ = probe(&owned, timeout, true);
                    with_hung(|m| {
                        if let Some(h) = m.get_mut(&owned) {
                            h.probing = false;
                        }
                    });
                });
            if spawned.is_err() {
                with_hung(|m| {
                    if let Some(h) = m.get_mut(url) {
                        h.probing = false;
                    }
                });
            }
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_of_servers_is_one_url_per_server() {
        assert_eq!(servers("mysql://app:pw@db:3306/shop"), None);
        assert_eq!(
            servers("mysql://app:pw@db-a:3306,db-b:3307/shop?x=1"),
            Some(vec![
                "mysql://app:pw@db-a:3306/shop?x=1".to_string(),
                "mysql://app:pw@db-b:3307/shop?x=1".to_string()
            ])
        );
        assert_eq!(
            servers("mysql://a:1,b:2/s"),
            Some(vec![
                "mysql://a:1/s".to_string(),
                "mysql://b:2/s".to_string()
            ])
        );
    }
}
