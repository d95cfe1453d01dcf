//! Shared by the nginx installation tests: nginx installed in a private
//! prefix by running docs/OPERATIONS.md's Deployment step 6 line by line
//! (an unknown step fails), and started as systemd would start it.
//! Built on [`super::gateway`] and [`super::ops`].
//!
//! How the docs' paths map to the test's prefix (nothing under the
//! machine's /etc, /var or /run is written, and the system's nginx is
//! neither started nor reloaded):
//! - `/etc/nginx/...` -> `PREFIX/etc/nginx/...`, seeded with Debian's own
//!   `nginx.conf`, `mime.types` and `sites-available/default` (checked
//!   byte for byte against the package's recorded checksums) and
//!   `sites-enabled/default` (a copy, where Debian has a symlink);
//! - in that copy of `nginx.conf`, its absolute paths `/etc/nginx/`,
//!   `/var/log/nginx/` and `/run/nginx.pid` point into the prefix, and
//!   `conf.d/private-temp-paths.conf` moves the package's compiled-in
//!   temporary directories (`/var/lib/nginx/*`) there too;
//! - `/etc/systemd/system/...` -> `PREFIX/etc/systemd/system/...`;
//!   `systemctl daemon-reload` reads the `nginx.service.d` drop-ins' `LimitNOFILE`,
//!   and `systemctl restart nginx` starts the private nginx (master and
//!   workers, `www-data` as the main file says) under that descriptor limit
//!   (`prlimit`), or systemd's default for services, 1024 soft and 524288
//!   hard, when no drop-in sets one; either part at most the test
//!   process's hard limit (raising that needs CAP_SYS_RESOURCE, which a
//!   container may lack, and systemd there could not raise it either);
//! - the installed `conf.d/seckill.conf` listens on a free 127.0.0.1 port
//!   instead of 80, and its `upstream` names the test's gateway instead of
//!   127.0.0.1:8080; nothing else in it changes.

use crate::support::gateway::get;
use crate::support::ops::{replace_once, repo_file};
use seckill_tests::{dies_with_test, free_port, wait_until, TempDir};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where Debian installs nginx.
pub const NGINX: &str = "/usr/sbin/nginx";

/// systemd's `DefaultLimitNOFILE` for services (systemd 240 and later):
/// what nginx.service gets without a drop-in.
const SYSTEMD_DEFAULT_NOFILE: (u64, u64) = (1024, 524_288);

/// The docs' step 6: each command of the `# 6.` part of the Deployment
/// code block, `sudo ` removed, `&&` chains split, comments dropped.
fn documented_steps() -> Vec<String> {
    let ops = std::fs::read_to_string(repo_file("docs/OPERATIONS.md")).expect("docs/OPERATIONS.md");
    let start = ops
        .find("# 6. nginx in front")
        .expect("docs/OPERATIONS.md: Deployment step `# 6. nginx in front`");
    let block = &ops[start..];
    let block = &block[..block.find("```").expect("the end of the code block")];
    let mut steps = Vec::new();
    for line in block.replace("\\\n", " ").lines().skip(1) {
        let line = line.split(" #").next().unwrap_or("").trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        for cmd in line.split("&&") {
            let cmd = cmd.trim();
            steps.push(cmd.strip_prefix("sudo ").unwrap_or(cmd).trim().to_string());
        }
    }
    steps
}

/// A private copy of Debian's /etc/nginx and the directories its main
/// file names, under one temporary prefix.
struct Prefix {
    dir: TempDir,
}

impl Prefix {
    /// Debian's own files, checked against the package's checksums.
    fn debian() -> Prefix {
        let p = Prefix {
            dir: TempDir::new(),
        };
        let conffiles = Command::new("dpkg-query")
            .args(["-W", "-f=${Conffiles}\n", "nginx-common"])
            .output()
            .expect("dpkg-query (Debian's nginx-common: ./scripts/test.sh installs nginx)");
        let conffiles = String::from_utf8_lossy(&conffiles.stdout).into_owned();
        for f in ["nginx.conf", "mime.types", "sites-available/default"] {
            let sys = format!("/etc/nginx/{f}");
            let md5 = Command::new("md5sum").arg(&sys).output().expect("md5sum");
            let md5 = String::from_utf8_lossy(&md5.stdout);
            let md5 = md5.split_whitespace().next().unwrap_or("");
            assert!(
                conffiles.contains(&format!(" {sys} {md5}")),
                "{sys} differs from the file Debian's nginx-common installed \
                 (dpkg-query -W -f='${{Conffiles}}' nginx-common): the test needs the stock file"
            );
            let to = p.map(&sys);
            std::fs::create_dir_all(to.parent().expect("a parent")).expect("mkdir");
            std::fs::copy(&sys, &to).expect("copy a Debian file");
        }
        std::fs::create_dir_all(p.map("/etc/nginx/sites-enabled")).expect("mkdir");
        std::fs::copy(
            p.map("/etc/nginx/sites-available/default"),
            p.map("/etc/nginx/sites-enabled/default"),
        )
        .expect("enable the default site");
        for d in ["/etc/nginx/conf.d", "/etc/nginx/modules-enabled"] {
            std::fs::create_dir_all(p.map(d)).expect("mkdir");
        }
        for d in ["var/log/nginx", "run", "var/lib/nginx"] {
            std::fs::create_dir_all(p.dir.path().join(d)).expect("mkdir");
        }
        let main = p.map("/etc/nginx/nginx.conf");
        let mut text = std::fs::read_to_string(&main).expect("read nginx.conf");
        let root = p.dir.path().display().to_string();
        for from in ["/etc/nginx/", "/var/log/nginx/", "/run/nginx.pid"] {
            assert!(text.contains(from), "Debian's nginx.conf names no {from}");
            text = text.replace(from, &format!("{root}{from}"));
        }
        std::fs::write(&main, text).expect("write nginx.conf");
        let temp: String = ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"]
            .iter()
            .map(|t| format!("{t}_temp_path {root}/var/lib/nginx/{t};\n"))
            .collect();
        std::fs::write(p.map("/etc/nginx/conf.d/private-temp-paths.conf"), temp)
            .expect("write the temp paths");
        p
    }

    /// A documented path inside the prefix.
    fn map(&self, path: &str) -> PathBuf {
        assert!(
            ["/etc/nginx/", "/etc/systemd/system/"]
                .iter()
                .any(|from| path.starts_with(from)),
            "a documented path the test does not map: {path}"
        );
        self.dir.path().join(path.trim_start_matches('/'))
    }

    fn main_file(&self) -> PathBuf {
        self.map("/etc/nginx/nginx.conf")
    }

    fn error_log(&self) -> PathBuf {
        self.dir.path().join("var/log/nginx/error.log")
    }

    /// `-p PREFIX -c MAIN -e ERROR_LOG`: nginx's arguments for this prefix.
    fn nginx_args(&self) -> Vec<std::ffi::OsString> {
        vec![
            "-p".into(),
            self.dir.path().into(),
            "-c".into(),
            self.main_file().into(),
            "-e".into(),
            self.error_log().into(),
        ]
    }
}

/// What the docs' steps leave for the start of nginx.
struct Installed {
    prefix: Prefix,
    /// `LimitNOFILE` of the drop-ins, as (soft, hard).
    nofile: (u64, u64),
    /// `systemctl restart nginx` (or reload) was among the steps.
    started: bool,
}

/// Runs the docs' step 6 in a fresh prefix; `sized: false` leaves out the
/// steps that size nginx for a crowd (scripts/nginx-crowd.sh and the
/// nginx.service.d drop-in): the stock installation.
fn install(sized: bool, listen: u16, gateway: u16) -> Installed {
    let prefix = Prefix::debian();
    let mut nofile = None;
    let mut ran_sizing = false;
    let mut started = false;
    let mut tested = false;
    for step in documented_steps() {
        let words: Vec<&str> = step.split_whitespace().collect();
        let sizing = step.contains("nginx-crowd.sh") || step.contains("nginx.service.d");
        if sizing && !sized {
            continue;
        }
        ran_sizing |= sizing;
        match words.as_slice() {
            ["apt-get", "install", "nginx"] => {
                assert!(Path::new(NGINX).exists(), "{NGINX}: install nginx");
            }
            ["rm", path] => std::fs::remove_file(prefix.map(path)).expect("the documented rm"),
            ["install", flags @ .., src, dest] if flags.contains(&"-m") => {
                let to = prefix.map(dest);
                std::fs::create_dir_all(to.parent().expect("a parent")).expect("install -D");
                let mut text = std::fs::read_to_string(repo_file(src)).expect("a shipped file");
                if *src == "systemd/nginx-seckill.conf" {
                    text = replace_once(
                        &text,
                        "    listen 80;\n",
                        &format!("    listen 127.0.0.1:{listen};\n"),
                    );
                    text = replace_once(
                        &text,
                        "server 127.0.0.1:8080 ",
                        &format!("server 127.0.0.1:{gateway} "),
                    );
                }
                std::fs::write(&to, text).expect("install a shipped file");
            }
            [script, path] if script.ends_with("nginx-crowd.sh") => {
                let out = Command::new(repo_file(script))
                    .arg(prefix.map(path))
                    .output()
                    .expect("run scripts/nginx-crowd.sh");
                assert!(out.status.success(), "{step}: {out:?}");
            }
            ["nginx", "-t"] => {
                let out = Command::new(NGINX)
                    .args(prefix.nginx_args())
                    .arg("-t")
                    .output()
                    .expect("nginx -t");
                assert!(
                    out.status.success(),
                    "nginx -t: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                tested = true;
            }
            ["systemctl", "daemon-reload"] => nofile = drop_in_nofile(&prefix),
            ["systemctl", "restart" | "reload", "nginx"] => started = true,
            _ => panic!("a step of docs/OPERATIONS.md the test does not know: {step}"),
        }
    }
    assert!(tested, "the docs' step 6 runs no `nginx -t`");
    // Nothing but the test's port is listened on (the default site's port
    // 80 went with the documented `rm`).
    for d in ["/etc/nginx/conf.d", "/etc/nginx/sites-enabled"] {
        for entry in std::fs::read_dir(prefix.map(d)).expect("read_dir") {
            let text = std::fs::read_to_string(entry.expect("an entry").path()).expect("read");
            for l in text
                .lines()
                .map(str::trim)
                .filter(|l| l.starts_with("listen "))
            {
                assert_eq!(l, format!("listen 127.0.0.1:{listen};"), "in {d}");
            }
        }
    }
    if sized {
        assert!(ran_sizing, "the docs' step 6 has no sizing step");
        assert!(nofile.is_some(), "no drop-in sets LimitNOFILE");
    }
    Installed {
        prefix,
        nofile: nofile.unwrap_or(SYSTEMD_DEFAULT_NOFILE),
        started,
    }
}

/// `LimitNOFILE=` of the installed nginx.service.d drop-ins (`N` or `S:H`).
fn drop_in_nofile(prefix: &Prefix) -> Option<(u64, u64)> {
    let dir = prefix.map("/etc/systemd/system/nginx.service.d");
    let mut limit = None;
    for entry in std::fs::read_dir(dir).ok()? {
        let text = std::fs::read_to_string(entry.expect("a drop-in").path()).expect("read");
        for v in text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("LimitNOFILE="))
        {
            let (s, h) = v.split_once(':').unwrap_or((v, v));
            limit = Some((s.parse().expect("a number"), h.parse().expect("a number")));
        }
    }
    limit
}

/// The private nginx, stopped (SIGTERM to the master, then SIGKILL) on drop.
pub struct Nginx {
    child: Child,
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    installed: Installed,
}

impl Nginx {
    /// Installs (sized or stock) and starts nginx in front of the gateway on
    /// `gateway`; a listen port another test took first is replaced (5 tries).
    pub fn start(sized: bool, gateway: u16) -> Nginx {
        for _ in 0..5 {
            let port = free_port();
            let installed = install(sized, port, gateway);
            assert!(installed.started, "the docs' step 6 never (re)starts nginx");
            // Within this process's hard limit: raising it needs
            // CAP_SYS_RESOURCE, which a container may lack (systemd there
            // could not raise it either).
            let own_hard = own_nofile().1;
            let (soft, hard) = installed.nofile;
            let (soft, hard) = (soft.min(own_hard), hard.min(own_hard));
            let child = dies_with_test("prlimit")
                .arg(format!("--nofile={soft}:{hard}"))
                .args(["--", NGINX])
                .args(installed.prefix.nginx_args())
                .args(["-g", "daemon off; master_process on;"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("run prlimit and nginx");
            let mut n = Nginx {
                child,
                port,
                installed,
            };
            let mut exited = false;
            wait_until(Duration::from_secs(30), "nginx to proxy /healthz", || {
                if n.child.try_wait().expect("try_wait").is_some() {
                    exited = true;
                    return true;
                }
                TcpStream::connect(("127.0.0.1", port)).is_ok() && {
                    let r = get(port, "/healthz");
                    r.status == 200 && r.header("Server").is_some_and(|v| v.starts_with("nginx"))
                }
            });
            if !exited {
                return n;
            }
            let log = n.log();
            assert!(
                log.contains("Address already in use"),
                "nginx exited: {log}"
            );
        }
        panic!("nginx found no free port in 5 tries");
    }

    /// nginx's error log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.installed.prefix.error_log()).unwrap_or_default()
    }

    /// The error log's last 20 lines.
    pub fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// This process's descriptor limit, (soft, hard); "unlimited" reads as
/// `u64::MAX`.
pub fn own_nofile() -> (u64, u64) {
    let limits = std::fs::read_to_string("/proc/self/limits").expect("/proc/self/limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("Max open files");
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(3)
        .take(2)
        .map(|w| w.parse().unwrap_or(u64::MAX))
        .collect();
    (v[0], v[1])
}
