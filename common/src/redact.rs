//! Owns how a service URL is shown in a message or a log line: without its
//! password, so an error naming the address an operator must fix never
//! leaks the secret held in `SECKILL_REDIS_URL` or `SECKILL_MYSQL_URL`.

/// `url` with the password of its user part replaced by `***`
/// (`mysql://app:pw@db:3306/shop` → `mysql://app:***@db:3306/shop`,
/// `redis://:pw@h:6379/` → `redis://:***@h:6379/`); a URL without a
/// password, or anything that is not a URL, is returned as given.
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let Some((user_info, host)) = authority.rsplit_once('@') else {
        return url.to_string();
    };
    match user_info.split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***@{host}{tail}"),
        None => url.to_string(),
    }
}

/// The password of `url`'s user part (`mysql://app:pw@db:3306/shop` →
/// `pw`), to keep it out of a message that may repeat it; `None` for a URL
/// without one, or anything that is not a URL.
pub fn password(url: &str) -> Option<&str> {
    let (_, rest) = url.split_once("://")?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (user_info, _) = rest[..end].rsplit_once('@')?;
    let (_, password) = user_info.split_once(':')?;
    Some(password).filter(|p| !p.is_empty())
}

/// The address of a Redis or MySQL URL for a message: `url` redacted,
/// then the variable that sets it (`redis://127.0.0.1:6390/
/// (SECKILL_REDIS_URL)`).
pub fn address(url: &str, variable: &str) -> String {
    format!("{} ({variable})", redacted(url))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_is_replaced_and_everything_else_kept() {
        assert_eq!(
            redacted("mysql://app:s3cret@db:3306/shop"),
            "mysql://app:***@db:3306/shop"
        );
        assert_eq!(
            redacted("redis://:s3cret@10.0.0.1:6379/2"),
            "redis://:***@10.0.0.1:6379/2"
        );
        // A password holding '@' or ':' is hidden whole.
        assert_eq!(
            redacted("mysql://app:p@ss:w@db/shop"),
            "mysql://app:***@db/shop"
        );
        assert_eq!(redacted("redis://h:1"), "redis://h:1");
        assert_eq!(redacted("mysql://root@h:3306/x"), "mysql://root@h:3306/x");
        assert_eq!(
            redacted("redis+cluster://h:1,h:2/"),
            "redis+cluster://h:1,h:2/"
        );
        assert_eq!(redacted("not a url"), "not a url");
        assert_eq!(password("mysql://app:p@ss:w@db/shop"), Some("p@ss:w"));
        assert_eq!(password("redis://:s3cret@h:1/"), Some("s3cret"));
        assert_eq!(password("redis://h:1/"), None);
        assert_eq!(password("mysql://root:@h/x"), None);
        assert_eq!(
            address("redis://u:pw@h:1/", "SECKILL_REDIS_URL"),
            "redis://u:***@h:1/ (SECKILL_REDIS_URL)"
        );
    }
}
