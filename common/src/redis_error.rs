//! Owns how a Redis error that waiting does not fix reads to an operator:
//! a refused password, with the remedy naming `SECKILL_REDIS_URL` (shared
//! by the gateway's and the worker's start and the reconciler).

use redis::{ErrorKind, RedisError};

/// What to do when Redis refuses the password of `SECKILL_REDIS_URL`.
pub const AUTH_REMEDY: &str = "check the password in SECKILL_REDIS_URL \
    (redis://:PASSWORD@host:port/, or redis://host:port/ for a Redis without one)";

/// Whether Redis refused the credentials: a wrong password
/// (`AuthenticationFailed`, `WRONGPASS`), none where one is required
/// (`NOAUTH`), or one given to a Redis that has none configured (`AUTH
/// <password> called without any password configured`).
pub fn is_auth(e: &RedisError) -> bool {
    e.kind() == ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
        || e.to_string().contains("without any password configured")
}

/// `e` as the operator reads it: the client's text without its error kind
/// (`Password authentication failed - AuthenticationFailed` names nothing
/// to fix), then [`AUTH_REMEDY`] for a refused password.
pub fn explain(e: &RedisError) -> String {
    let text = e.to_string();
    if !is_auth(e) {
        return text;
    }
    let text = text.replacen(&format!(" - {:?}", e.kind()), "", 1);
    let text = text.replacen(&format!("- {:?}", e.kind()), "", 1);
    format!("{}: {AUTH_REMEDY}", text.trim_end().trim_end_matches('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_password_reads_with_the_remedy_and_other_errors_as_they_are() {
        let auth = RedisError::from((
            ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        ));
        assert!(is_auth(&auth));
        assert_eq!(
            explain(&auth),
            format!("Password authentication failed: {AUTH_REMEDY}")
        );
        let refused: RedisError =
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into();
        assert!(!is_auth(&refused));
        assert_eq!(explain(&refused), refused.to_string());
    }
}
