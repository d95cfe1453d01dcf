//! Specifies the `Type=notify` protocol of the real binaries (README
//! "Deployment", `common/src/notify.rs`): each sends `READY=1` to
//! `$NOTIFY_SOCKET` once, only when its dependencies answer, and
//! `STOPPING=1` once on SIGTERM, then exits 0 — nothing else.

use crate::support::gateway as gateway_support;

use gateway_support::signal;
use seckill_tests::{free_port, RedisServer, TempDir, TestDb};
use std::os::unix::net::UnixDatagram;
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The socket systemd would hold: a datagram socket bound in a temporary
/// directory, read with `timeout` per message.
struct NotifySocket {
    sock: UnixDatagram,
    path: std::path::PathBuf,
    _dir: TempDir,
}

impl NotifySocket {
    fn bind() -> NotifySocket {
        let dir = TempDir::new();
        let path = dir.path().join("notify.sock");
        let sock = UnixDatagram::bind(&path).expect("bind the notify socket");
        NotifySocket {
            sock,
            path,
            _dir: dir,
        }
    }

    /// The next message, or `None` when none came within `within`.
    fn next(&self, within: Duration) -> Option<String> {
        self.sock
            .set_read_timeout(Some(within))
            .expect("set the read timeout");
        let mut buf = [0u8; 4096];
        match self.sock.recv(&mut buf) {
            Ok(n) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(_) => None,
        }
    }
}

/// Waits (at most 20 s) for `child` to exit.
fn exit_of(child: &mut Child) -> ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(s) = child.try_wait().expect("wait") {
            return s;
        }
        assert!(Instant::now() < deadline, "the process did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A worker `id` on `redis` reporting to `notify` (its MySQL: the dead
/// port `command` sets, unless the caller sets one).
fn worker(redis: &RedisServer, notify: &NotifySocket, id: &str) -> std::process::Command {
    let mut c = seckill_tests::command("seckill-worker");
    c.env("SECKILL_REDIS_URL", redis.url())
        .env("SECKILL_WORKER_ID", id)
        .env("SECKILL_WORKER_BLOCK", "200ms")
        .env(
            "SECKILL_WORKER_METRICS_LISTEN",
            format!("127.0.0.1:{}", free_port()),
        )
        .env("NOTIFY_SOCKET", &notify.path)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

/// How long a message that must come may take (a bound, not a measure).
const MUST_COME: Duration = Duration::from_secs(20);

#[test]
fn the_gateway_is_ready_only_once_redis_answers_and_says_stopping_on_sigterm() {
    let mut redis = RedisServer::start();
    redis.stop();
    let notify = NotifySocket::bind();
    let mut gw = seckill_tests::command("seckill-gateway")
        .env("SECKILL_LISTEN", format!("127.0.0.1:{}", free_port()))
        .env("SECKILL_REDIS_URL", redis.url())
        .env("NOTIFY_SOCKET", &notify.path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start seckill-gateway");
    // Redis is down: the gateway runs but is not ready.
    assert_eq!(notify.next(Duration::from_millis(1500)), None);
    assert!(gw.try_wait().expect("wait").is_none(), "the gateway exited");
    redis.restart();
    assert_eq!(notify.next(MUST_COME).as_deref(), Some("READY=1"));
    signal(gw.id(), "TERM");
    assert_eq!(notify.next(MUST_COME).as_deref(), Some("STOPPING=1"));
    assert_eq!(exit_of(&mut gw).code(), Some(0));
    assert_eq!(notify.next(Duration::from_millis(200)), None);
}

#[test]
fn the_worker_is_ready_once_redis_and_mysql_answer_and_says_stopping_on_sigterm() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let notify = NotifySocket::bind();
    let mut worker = worker(&redis, &notify, "notify-w1")
        .env("SECKILL_MYSQL_URL", db.url())
        .spawn()
        .expect("start seckill-worker");
    assert_eq!(notify.next(MUST_COME).as_deref(), Some("READY=1"));
    signal(worker.id(), "TERM");
    assert_eq!(notify.next(MUST_COME).as_deref(), Some("STOPPING=1"));
    assert_eq!(exit_of(&mut worker).code(), Some(0));
    assert_eq!(notify.next(Duration::from_millis(200)), None);
}

#[test]
fn the_worker_is_not_ready_while_mysql_is_down_and_stops_cleanly_on_sigterm() {
    let redis = RedisServer::start();
    let notify = NotifySocket::bind();
    let mut worker = worker(&redis, &notify, "notify-w2")
        .env("SECKILL_MYSQL_TIMEOUT", "1s")
        // Session limits of 1 s: a 1 s client timeout is not below them.
        .env("SECKILL_WORKER_HEARTBEAT_TTL", "2s")
        .spawn()
        .expect("start seckill-worker");
    // SECKILL_MYSQL_URL is the dead port `command` sets.
    assert_eq!(notify.next(Duration::from_millis(1500)), None);
    signal(worker.id(), "TERM");
    assert_eq!(notify.next(MUST_COME).as_deref(), Some("STOPPING=1"));
    assert_eq!(exit_of(&mut worker).code(), Some(0));
    assert_eq!(notify.next(Duration::from_millis(200)), None);
}
