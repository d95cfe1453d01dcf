//! Owns how a MySQL error reads to an operator: the server's code and text
//! without the driver's wrapping, and the remedy for the errors waiting does
//! not fix (shared by the worker's start-up check and the reconciler).

/// Server error codes that waiting does not fix, with what to do: 1044
/// access denied to a database, 1045 access denied for a user (wrong
/// password), 1046 no database selected (a URL without one), 1049 unknown
/// database, 1146 table doesn't exist, 1142 a command denied to the user
/// on a table (a grant short of the database's every privilege) (MySQL
/// reference manual, "Server Error Message Reference"), 1698 access denied without a password check
/// (MariaDB: a user that does not exist, or one that logs in by
/// `unix_socket` such as Debian's root). Every other error
/// (connection refused, 1040 too many connections, 2013 lost connection, a
/// timeout) may pass by itself.
const PERMANENT: &[(u16, &str)] = &[
    (
        1044,
        "grant this user access to the database, or fix the user in SECKILL_MYSQL_URL",
    ),
    (1045, "fix the user or password in SECKILL_MYSQL_URL"),
    (
        1046,
        "write the database name in SECKILL_MYSQL_URL: mysql://user@host:port/DATABASE",
    ),
    (
        1049,
        "create the database and its tables with `seckill-reconciler migrate`, or fix its name in SECKILL_MYSQL_URL",
    ),
    (
        1146,
        "create the tables with `seckill-reconciler migrate` (same SECKILL_MYSQL_URL)",
    ),
    (
        1142,
        "grant the user of SECKILL_MYSQL_URL every privilege on its database: GRANT ALL \
         PRIVILEGES ON database.* TO the user (docs/OPERATIONS.md, Install the units, step 2)",
    ),
    (
        1698,
        "name in SECKILL_MYSQL_URL a user that logs in with a password over TCP \
         (this one does not exist, or logs in only by unix_socket): create one with \
         CREATE USER and GRANT ALL PRIVILEGES ON its database (docs/OPERATIONS.md, \
         Install the units, step 2)",
    ),
];

/// `e` as an operator reads it: `ERROR 1049 (42000): Unknown database 'x'`
/// for a server error, the driver's or the socket's own text otherwise (the
/// crate's `Display` of its error wraps them in `DriverError { ... }`).
pub fn describe(e: &mysql::Error) -> String {
    match e {
        mysql::Error::MySqlError(se) => {
            format!("ERROR {} ({}): {}", se.code, se.state, se.message)
        }
        mysql::Error::DriverError(d) => d.to_string(),
        mysql::Error::IoError(io) => io.to_string(),
        mysql::Error::CodecError(c) => {
            codec_io(c).map_or_else(|| c.to_string(), |io| io.to_string())
        }
        other => other.to_string(),
    }
}

/// The socket error inside a codec error, if that is what it is.
fn codec_io<'a>(c: &'a (dyn std::error::Error + 'static)) -> Option<&'a std::io::Error> {
    c.source()?.downcast_ref::<std::io::Error>()
}

/// Whether `e` is a timeout: the socket's read, write or connect timed
/// out (`SECKILL_MYSQL_TIMEOUT`): a hung server, or a network that drops
/// packets. The driver reports it as an I/O or codec error of kind
/// `WouldBlock` ("Resource temporarily unavailable") or `TimedOut`.
pub fn is_timeout(e: &mysql::Error) -> bool {
    let slow = |io: &std::io::Error| {
        matches!(
            io.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        )
    };
    match e {
        mysql::Error::IoError(io) => slow(io),
        mysql::Error::CodecError(c) => codec_io(c).is_some_and(slow),
        mysql::Error::DriverError(mysql::DriverError::ConnectTimeout) => true,
        _ => false,
    }
}

/// [`describe`], a timeout said as one: `timeout: no answer within 10s
/// (SECKILL_MYSQL_TIMEOUT; the server hangs or the network drops packets):
/// Resource temporarily unavailable (os error 11)`.
pub fn describe_within(e: &mysql::Error, timeout: std::time::Duration) -> String {
    if is_timeout(e) {
        format!(
            "timeout: no answer within {} (SECKILL_MYSQL_TIMEOUT; the server hangs or the \
             network drops packets): {}",
            humantime::format_duration(timeout),
            describe(e)
        )
    } else {
        describe(e)
    }
}
/// 1045 when the URL gave no password (the server says `using password:
/// NO`): the env file the package installs names the user, not its password.
const NO_PASSWORD: &str = "SECKILL_MYSQL_URL gives no password: set this user's password in it \
     (mysql://USER:PASSWORD@HOST:PORT/DATABASE) in the env file, /etc/seckill/seckill.env \
     for the installed units";

/// What to do about `e` when waiting does not fix it; `None` otherwise.
pub fn remedy(e: &mysql::Error) -> Option<&'static str> {
    match e {
        mysql::Error::MySqlError(se)
            if se.code == 1045 && se.message.contains("using password: NO") =>
        {
            Some(NO_PASSWORD)
        }
        mysql::Error::MySqlError(se) => PERMANENT
            .iter()
            .find(|(c, _)| *c == se.code)
            .map(|(_, r)| *r),
        _ => None,
    }
}

/// [`describe`], then the [`remedy`] when there is one.
pub fn explain(e: &mysql::Error) -> String {
    match remedy(e) {
        Some(r) => format!("{}: {r}", describe(e)),
        None => describe(e),
    }
}

/// [`explain`] for the replica that `SECKILL_MYSQL_REPLICA_URL` names: its
/// database and tables come from the primary by replication, so the
/// remedies name that variable and replication, never `migrate`.
pub fn explain_replica(e: &mysql::Error) -> String {
    let code = match e {
        mysql::Error::MySqlError(se) => se.code,
        _ => return describe(e),
    };
    let r = match code {
        1044 => "grant this user access to the database on the replica, or fix the user in SECKILL_MYSQL_REPLICA_URL",
        1045 => "fix the user or password in SECKILL_MYSQL_REPLICA_URL",
        1698 => "name in SECKILL_MYSQL_REPLICA_URL a user that logs in with a password over TCP (this one does not exist, or logs in only by unix_socket)",
        1046 => "write the database name in SECKILL_MYSQL_REPLICA_URL: mysql://user@host:port/DATABASE",
        1049 | 1146 => "name the primary's database in SECKILL_MYSQL_REPLICA_URL, and check that the replica replicates it (SHOW SLAVE STATUS on the replica)",
        _ => return describe(e),
    };
    format!("{}: {r}", describe(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: u16, message: &str) -> mysql::Error {
        mysql::Error::MySqlError(mysql::MySqlError {
            state: "42000".into(),
            message: message.into(),
            code,
        })
    }

    #[test]
    fn access_denied_without_a_password_says_where_to_set_it() {
        let e = server(
            1045,
            "Access denied for user 'seckill'@'localhost' (using password: NO)",
        );
        let r = remedy(&e).unwrap();
        assert!(r.starts_with("SECKILL_MYSQL_URL gives no password"), "{r}");
        assert!(r.contains("/etc/seckill/seckill.env"), "{r}");
        let wrong = server(
            1045,
            "Access denied for user 'seckill'@'localhost' (using password: YES)",
        );
        assert_eq!(
            remedy(&wrong),
            Some("fix the user or password in SECKILL_MYSQL_URL")
        );
    }

    #[test]
    fn a_replica_error_names_the_replica_variable_and_never_migrate() {
        let e = server(1049, "Unknown database 'nosuchdb'");
        assert!(explain(&e).contains("migrate"));
        let r = explain_replica(&e);
        assert!(r.starts_with("ERROR 1049 (42000): Unknown database 'nosuchdb': "));
        assert!(r.contains("SECKILL_MYSQL_REPLICA_URL") && r.contains("SHOW SLAVE STATUS"));
        assert!(!r.contains("migrate") && !r.contains("SECKILL_MYSQL_URL,"));
        for code in [1044, 1045, 1046, 1146, 1698] {
            let r = explain_replica(&server(code, "x"));
            assert!(r.contains("SECKILL_MYSQL_REPLICA_URL"), "{code}: {r}");
        }
        for code in [1046, 1698] {
            assert!(remedy(&server(code, "x")).is_some_and(|r| r.contains("SECKILL_MYSQL_URL")));
        }
        assert_eq!(
            explain_replica(&server(1040, "Too many")),
            describe(&server(1040, "Too many"))
        );
    }
}
