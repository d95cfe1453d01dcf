//! Tests of the harness's own isolation: a spawned server or
//! binary dies with the thread that started it, so a killed test runner
//! leaves nothing running that a later test could reach.

use seckill_tests::{dies_with_test, RedisServer};
use std::os::unix::process::ExitStatusExt;
use std::process::Child;
use std::time::{Duration, Instant};

/// SIGKILL's number on Linux.
const SIGKILL: i32 = 9;

/// Waits (bounded) for `child` to end; its exit status.
fn wait_bounded(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the child outlived the thread that spawned it");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_child_dies_with_the_thread_that_spawned_it() {
    let mut child = std::thread::spawn(|| {
        let child = dies_with_test("sleep")
            .arg("600")
            .spawn()
            .expect("spawn sleep");
        // The signal is armed when setpriv runs, before it execs: wait for
        // the exec, as a test waits for its server to answer.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(format!("/proc/{}/comm", child.id()))
            .map(|c| c.trim() != "sleep")
            .unwrap_or(true)
        {
            assert!(Instant::now() < deadline, "sleep never started");
            std::thread::sleep(Duration::from_millis(5));
        }
        child
    })
    .join()
    .expect("spawning thread");
    let status = wait_bounded(&mut child);
    assert_eq!(status.signal(), Some(SIGKILL), "{status:?}");
}

#[test]
fn a_test_redis_dies_with_its_thread_without_its_drop() {
    // The server is leaked (no Drop runs), as when a runner is killed.
    let pid = std::thread::spawn(|| {
        let r = RedisServer::start();
        let pid = r.pid().expect("redis-server running");
        std::mem::forget(r);
        pid
    })
    .join()
    .expect("spawning thread");
    let deadline = Instant::now() + Duration::from_secs(20);
    // Not our child any more once the harness value is forgotten: it is
    // reaped by nobody, so "gone" is a zombie or no /proc entry.
    loop {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit(')').next().map(|r| r.trim().chars().next()))
            .flatten();
        if matches!(state, None | Some('Z')) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "redis-server {pid} outlived its thread"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A binary older than a workspace source it was built from (its cargo
/// dep-info file names the sources) is refused by `bin`: `cargo test
/// --test it` after an edit would otherwise test the old binary without a
/// word. A source outside the workspace (the registry)
/// or older than the binary is not.
#[test]
fn a_binary_older_than_its_sources_is_found() {
    use std::time::SystemTime;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    let dir = root
        .join("target")
        .join(format!("harness-stale-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (bin, src) = (dir.join("fake bin"), dir.join("src.rs"));
    let set = |p: &std::path::Path, secs: u64| {
        std::fs::write(p, b"x").unwrap();
        let f = std::fs::File::options().write(true).open(p).unwrap();
        f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
            .unwrap();
    };
    let escaped = |p: &std::path::Path| p.display().to_string().replace(' ', "\\ ");
    std::fs::write(
        bin.with_extension("d"),
        format!(
            "{}: /nonexistent/registry/lib.rs {}\n",
            escaped(&bin),
            escaped(&src)
        ),
    )
    .unwrap();
    set(&src, 1_000);
    set(&bin, 2_000);
    assert_eq!(seckill_tests::newer_source(&bin), None);
    set(&src, 3_000);
    assert_eq!(
        seckill_tests::newer_source(&bin),
        Some(src.display().to_string())
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
