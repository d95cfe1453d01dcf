//! Owns how a MySQL error reads to an operator: the server's code and text
//! without the driver's wrapping, and the remedy for the errors waiting does
//! not fix (shared by the worker's start-up check and the reconciler).

/// Server error codes that waiting does not fix, with what to do: 1044
/// access denied to a database, 1045 access denied for a user (wrong
/// password), 1049 unknown database, 1146 table doesn't exist (MySQL
/// reference manual, "Server Error Message Reference"). Every other error
/// (connection refused, 1040 too many connections, 2013 lost connection, a
/// timeout) may pass by itself.
const PERMANENT: &[(u16, &str)] = &[
    (
        1044,
        "grant this user access to the database, or fix the user in SECKILL_MYSQL_URL",
    ),
    (1045, "fix the user or password in SECKILL_MYSQL_URL"),
    (
        1049,
        "create the database and its tables with `seckill-reconciler migrate`, or fix its name in SECKILL_MYSQL_URL",
    ),
    (
        1146,
        "create the tables with `seckill-reconciler migrate` (same SECKILL_MYSQL_URL)",
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
        other => other.to_string(),
    }
}

/// What to do about `e` when waiting does not fix it; `None` otherwise.
pub fn remedy(e: &mysql::Error) -> Option<&'static str> {
    match e {
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
