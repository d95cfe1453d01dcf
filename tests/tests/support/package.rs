//! The Debian package of `scripts/package.sh` on this machine: two versions
//! (N and N+1) packaged from one release build, installed, upgraded,
//! removed and purged with apt-get as an operator does it, the installed
//! binaries started with the installed env file and unit environment, and
//! [`Machine`], the guard that leaves the machine as it found it.

use seckill_tests::{dies_with_test, wait_until};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// The package's name (`[package.metadata.deb]` in reconciler/Cargo.toml).
pub const PACKAGE: &str = "seckill";
/// The env file the package installs as a conffile.
pub const ENV_FILE: &str = "/etc/seckill/seckill.env";
/// An operator's file beside the conffile (a worker's own settings, as the
/// worker unit reads them): neither removal nor purge may touch it.
pub const WORKER_ENV: &str = "/etc/seckill/worker-w1.env";
/// The reconciler unit's state directory (`StateDirectory=seckill`), which
/// systemd makes on the first run; the test makes it as systemd would.
pub const STATE_DIR: &str = "/var/lib/seckill";
/// The first line of every file the test makes outside the package: an
/// interrupted run's leftovers are recognised by it.
const MARK: &str = "# made by tests/tests/ops_package.rs";
/// The suffix of the test's package versions.
const TEST_VERSION: &str = "+pkgtest";

/// The workspace's version with the test's suffix: `N` is 1, `N+1` is 2.
pub fn version(n: u32) -> String {
    format!("{}{TEST_VERSION}{n}", env!("CARGO_PKG_VERSION"))
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The build directory this test binary was built in (`.../debug/deps/it-*`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    exe.ancestors()
        .nth(3)
        .expect("the target directory")
        .to_path_buf()
}

fn run(cmd: &mut Command, what: &str) -> Output {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The packages of versions N and N+1, built once per test binary: the
/// release build `scripts/demo.sh` makes (nothing to do when the demo's test
/// built it), then `scripts/package.sh --no-build --deb-version` twice.
pub fn debs() -> &'static (PathBuf, PathBuf) {
    static DEBS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    DEBS.get_or_init(|| {
        let target = target_dir();
        run(
            Command::new("cargo")
                .current_dir(repo())
                .env("CARGO_TARGET_DIR", &target)
                .args(["build", "--release", "-q", "-p", "seckill-gateway"])
                .args(["-p", "seckill-worker", "-p", "seckill-reconciler"])
                .args(["-p", "seckill-tests", "--bins"]),
            "cargo build --release (as scripts/demo.sh)",
        );
        let out = target.join("debian-pkgtest");
        let _ = std::fs::remove_dir_all(&out);
        let arch = run(
            Command::new("dpkg").arg("--print-architecture"),
            "dpkg --print-architecture",
        );
        let arch = String::from_utf8_lossy(&arch.stdout).trim().to_string();
        let build = |n: u32| {
            let v = version(n);
            run(
                Command::new(repo().join("scripts/package.sh"))
                    .env("CARGO_TARGET_DIR", &target)
                    .args(["--no-build", "--deb-version", &v, "--output"])
                    .arg(&out),
                "scripts/package.sh",
            );
            let deb = out.join(format!("{PACKAGE}_{v}_{arch}.deb"));
            assert!(deb.is_file(), "{} is missing", deb.display());
            deb
        };
        (build(1), build(2))
    })
}

/// `apt-get -y ARGS` as root, never prompting (standard input closed: a
/// conffile question would fail it), waiting up to 10 minutes for another
/// apt or dpkg on the machine to finish.
pub fn apt(args: &[&str]) -> Output {
    Command::new("apt-get")
        .args(["-y", "-q", "--no-install-recommends"])
        .args(["-o", "DPkg::Lock::Timeout=600"])
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .output()
        .expect("apt-get (Debian)")
}

/// [`apt`] that must succeed.
pub fn apt_ok(args: &[&str]) {
    let out = apt(args);
    assert!(
        out.status.success(),
        "apt-get {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// dpkg's status and version of the package (`install ok installed`,
/// `deinstall ok config-files`), `None` when dpkg does not know it.
pub fn status() -> Option<(String, String)> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f", "${Status}\t${Version}", PACKAGE])
        .output()
        .expect("dpkg-query");
    let text = String::from_utf8_lossy(&out.stdout);
    let (s, v) = text.split_once('\t')?;
    (out.status.success() && s != "unknown ok not-installed")
        .then(|| (s.to_string(), v.to_string()))
}

/// The machine while the test owns the package: claimed only where no
/// seckill is installed and none of its paths exist (the leftovers of an
/// interrupted run of this test excepted, which it clears); on drop,
/// however the test ended, the package is purged and the files the test
/// made are removed.
pub struct Machine(());

impl Machine {
    pub fn claim() -> Machine {
        let uid = run(Command::new("id").arg("-u"), "id -u");
        assert_eq!(
            String::from_utf8_lossy(&uid.stdout).trim(),
            "0",
            "installing a package needs root (CI runs as root)"
        );
        if let Some((s, v)) = status() {
            assert!(
                v.contains(TEST_VERSION),
                "{PACKAGE} {v} ({s}) is on this machine: this test installs and purges its own"
            );
            apt_ok(&["purge", PACKAGE]);
        }
        clear_leftovers();
        for p in [
            "/etc/seckill",
            STATE_DIR,
            "/usr/share/seckill",
            "/usr/share/doc/seckill",
        ] {
            assert!(!Path::new(p).exists(), "{p} exists: not this test's");
        }
        Machine(())
    }

    /// Writes an operator's file (`path` in /etc/seckill or the state
    /// directory), marked as the test's.
    pub fn operator_file(&self, path: &str, body: &str) {
        std::fs::write(path, format!("{MARK}\n{body}")).expect("write an operator's file");
    }
}

/// Files an interrupted run of this test left, recognised by [`MARK`].
fn clear_leftovers() {
    let marked = |p: &str| std::fs::read_to_string(p).is_ok_and(|t| t.starts_with(MARK));
    if marked(WORKER_ENV) {
        let _ = std::fs::remove_file(WORKER_ENV);
        let _ = std::fs::remove_dir("/etc/seckill");
    }
    if marked(&format!("{STATE_DIR}/mark")) {
        let _ = std::fs::remove_dir_all(STATE_DIR);
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        if status().is_some() {
            let out = apt(&["purge", PACKAGE]);
            if !out.status.success() {
                eprintln!(
                    "ops_package: apt-get purge {PACKAGE} failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        clear_leftovers();
    }
}

/// `KEY=VALUE` lines of an env file as systemd's `EnvironmentFile=` reads
/// them (comments and blank lines skipped).
pub fn env_file(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// The environment an installed unit gives its service: its
/// `EnvironmentFile=` files in order (a `-` one only when it exists), then
/// its `Environment=` lines, `%i` being `instance`.
pub fn unit_env(unit: &str, instance: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(format!("/lib/systemd/system/{unit}"))
        .unwrap_or_else(|e| panic!("the installed {unit}: {e}"));
    let mut env = Vec::new();
    for line in text.lines() {
        if let Some(file) = line.strip_prefix("EnvironmentFile=") {
            let file = file.replace("%i", instance);
            match (file.strip_prefix('-'), std::fs::read_to_string(&file)) {
                (Some(optional), _) => {
                    if let Ok(t) = std::fs::read_to_string(optional) {
                        env.extend(env_file(&t));
                    }
                }
                (None, Ok(t)) => env.extend(env_file(&t)),
                (None, Err(e)) => panic!("{unit}'s {file}: {e}"),
            }
        }
    }
    for line in text.lines() {
        if let Some((k, v)) = line
            .strip_prefix("Environment=")
            .and_then(|kv| kv.split_once('='))
        {
            env.push((k.to_string(), v.replace("%i", instance)));
        }
    }
    env
}

/// The installed binary `/usr/bin/NAME` from a cleared environment (only
/// `PATH`), then `env` in order (a later value wins), dying with the test's
/// thread.
pub fn installed(name: &str, env: &[(String, String)]) -> Command {
    let mut c = dies_with_test(format!("/usr/bin/{name}"));
    c.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// Waits until the gateway on `port` answers `GET /readyz` with 200.
pub fn wait_ready(port: u16) {
    wait_until(Duration::from_secs(30), "the gateway to be ready", || {
        crate::support::ops::http_get(port, "/readyz").is_some_and(|(s, _)| s == 200)
    });
}
