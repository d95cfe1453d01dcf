//! Owns `SECKILL_MYSQL_URL` naming several servers
//! (`mysql://user:pw@db-a:3306,db-b:3306/seckill`): a connection goes to the
//! first of them, in the order given, that answers and is writable
//! (`@@read_only = 0`). After the primary fails and an operator promotes
//! the replica (docs/OPERATIONS.md, "A MySQL failover"), every component's
//! next connect reaches the new primary, without a restart.
//! `schema::connect` and `schema::mysql_opts` hand such a URL here.

use mysql::prelude::Queryable;
use mysql::Conn;
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

/// A connection to the first writable server of `urls` (each tried with
/// `timeout`).
///
/// Errors: [`crate::schema::SchemaError`]: a bad URL, or an I/O error
/// ("connection refused") naming each server and why it was passed over
/// (unreachable, or read-only: no primary promoted yet), so callers retry
/// as for a server that is down.
pub fn connect_writable(
    urls: &[String],
    timeout: Duration,
) -> Result<Conn, crate::schema::SchemaError> {
    let mut why = Vec::with_capacity(urls.len());
    for url in urls {
        let at = crate::redact::redacted(url);
        let opts = crate::schema::mysql_opts(url, timeout)?;
        match Conn::new(opts) {
            Ok(mut c) => match c.query_first::<u8, _>("SELECT @@read_only") {
                Ok(Some(0)) => return Ok(c),
                Ok(_) => why.push(format!("{at}: read-only")),
                Err(e) => why.push(format!("{at}: {e}")),
            },
            Err(e) => why.push(format!("{at}: {e}")),
        }
    }
    Err(crate::schema::SchemaError::Mysql(mysql::Error::IoError(
        std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            format!(
                "no writable server in SECKILL_MYSQL_URL ({}): promote the replica \
                 (docs/OPERATIONS.md, \"A MySQL failover\")",
                why.join("; ")
            ),
        ),
    )))
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
