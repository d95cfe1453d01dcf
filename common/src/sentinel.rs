//! Owns finding the master of a standalone Redis watched by Redis Sentinel
//! (`SECKILL_REDIS_URL=redis+sentinel://host:port,host:port/NAME`), as the
//! Sentinel client spec describes it: ask each Sentinel in turn for the
//! master's address (`SENTINEL GET-MASTER-ADDR-BY-NAME`), connect to it and
//! check that it says it is a master (`ROLE`). `redis_target.rs` calls
//! [`connect_master`] at every connect, so a component that reconnects after
//! a failover reaches the master Sentinel elected, without a restart.
//!
//! Every call is bounded by the caller's timeout (connect and read): the
//! redis crate's own `sentinel` module connects without one, and a stalled
//! Sentinel would hold a gateway's link forever.

use redis::{Connection, RedisError, RedisResult};
use std::time::Duration;

/// Connects to the master the Sentinels at `sentinels` (`host:port` each)
/// name for `name`, with `timeout` for every connect and read.
///
/// Errors: `Io` naming each Sentinel's answer when no Sentinel names a
/// reachable master (no master known: a failover in progress, the
/// Sentinels down, or a wrong master name).
pub fn connect_master(
    sentinels: &[String],
    name: &str,
    timeout: Duration,
) -> RedisResult<Connection> {
    let mut why = Vec::with_capacity(sentinels.len());
    for s in sentinels {
        match master_via(s, name, timeout) {
            Ok(con) => return Ok(con),
            Err(e) => why.push(format!("sentinel {s}: {e}")),
        }
    }
    Err(RedisError::from((
        redis::ErrorKind::Io,
        "no Redis master known to the Sentinels",
        format!("master name {name:?}: {}", why.join("; ")),
    )))
}

/// One connection with `timeout` for connect, reads and writes.
fn open(addr: &str, timeout: Duration) -> RedisResult<Connection> {
    let c =
        redis::Client::open(format!("redis://{addr}/"))?.get_connection_with_timeout(timeout)?;
    c.set_read_timeout(Some(timeout))?;
    c.set_write_timeout(Some(timeout))?;
    Ok(c)
}

/// The master one Sentinel names, connected and checked.
fn master_via(sentinel: &str, name: &str, timeout: Duration) -> RedisResult<Connection> {
    let mut s = open(sentinel, timeout)?;
    let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(name)
        .query(&mut s)?;
    let Some((host, port)) = addr else {
        return Err(RedisError::from((
            redis::ErrorKind::Io,
            "does not monitor this master name",
        )));
    };
    let addr = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let mut m = open(&addr, timeout).map_err(|e| {
        RedisError::from((
            redis::ErrorKind::Io,
            "names a master that does not answer",
            format!("{addr}: {e}"),
        ))
    })?;
    let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut m)?;
    match role.first() {
        Some(redis::Value::BulkString(r)) if r.as_slice() == b"master" => Ok(m),
        _ => Err(RedisError::from((
            redis::ErrorKind::Io,
            "names a server that is not a master (a failover in progress)",
            addr,
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::process::{Command, Stdio};

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(0)
    }

    /// A Sentinel that answers while the master it names is down: the
    /// error names that master's address, not the Sentinel as refusing.
    #[test]
    fn a_dead_master_is_named_apart_from_the_sentinel_that_named_it() {
        let (port, master) = (free_port(), free_port());
        let dir =
            std::env::temp_dir().join(format!("seckill-sentinel-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor seckill 127.0.0.1 {master} 2\n",
                dir.display()
            ),
        )
        .unwrap();
        let server = std::env::var("SECKILL_TEST_REDIS_SERVER").unwrap_or("redis-server".into());
        let mut child = Command::new(server)
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let sentinel = format!("127.0.0.1:{port}");
        let mut last = String::new();
        for _ in 0..100 {
            match connect_master(
                std::slice::from_ref(&sentinel),
                "seckill",
                Duration::from_secs(1),
            ) {
                Ok(_) => panic!("no master runs at port {master}"),
                Err(e) => last = e.to_string(),
            }
            if last.contains("names a master") {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            last.contains(&format!(
                "sentinel {sentinel}: names a master that does not answer"
            )) && last.contains(&format!("127.0.0.1:{master}: ")),
            "{last}"
        );
    }
}
