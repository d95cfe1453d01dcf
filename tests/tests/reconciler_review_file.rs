//! Specifies the one review file: `systemd/seckill.env` sets
//! `SECKILL_REVIEW_DB` for every command (the reconciler unit sets none of
//! its own), and every audited command refuses (exit 2, naming the
//! variable, nothing changed, no file made) when the variable is unset or
//! its file is missing, as `findings` does; once `run` made the file, an
//! audited command's rows and `run`'s findings are in that one file.

use mysql::prelude::Queryable;
use seckill_tests::{create_sale, RedisServer, TempDir, TestDb};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;

fn repo_file(name: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(name))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The variables `systemd/seckill.env` sets.
fn env_file() -> BTreeMap<String, String> {
    repo_file("systemd/seckill.env")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// `seckill-reconciler ARGS` run in `cwd` with the env file's variables,
/// the test's Redis and MySQL, and `SECKILL_REVIEW_DB` = `review` (`None`:
/// unset).
fn with_env_file(
    redis: &RedisServer,
    db: &TestDb,
    cwd: &Path,
    review: Option<&Path>,
    args: &[&str],
) -> Output {
    let mut c = seckill_tests::command("seckill-reconciler");
    c.envs(env_file())
        .env_remove("SECKILL_REVIEW_DB")
        .env("SECKILL_REDIS_URL", redis.url())
        .env("SECKILL_MYSQL_URL", db.url())
        .env("SECKILL_RECONCILE_GRACE", "0s")
        .env("RUST_LOG", "warn")
        .current_dir(cwd)
        .args(args);
    if let Some(r) = review {
        c.env("SECKILL_REVIEW_DB", r);
    }
    c.output().expect("run seckill-reconciler")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Every audited command on sale `s`.
fn audited(s: &str) -> Vec<Vec<&str>> {
    vec![
        vec!["sale", "pause", s, "--reason", "test", "--by", "oncall"],
        vec!["sale", "resume", s, "--by", "oncall"],
        vec!["sale", "end", s, "--by", "oncall"],
        vec!["sale", "extend", s, "--ends-at", "now+2h", "--by", "oncall"],
        vec!["sale", "add-stock", s, "3", "--by", "oncall"],
        vec!["sale", "archive", s, "--by", "oncall"],
        vec!["sale", "repair", s, "--by", "oncall"],
        vec!["resolve", "1", "--dismiss", "--by", "oncall"],
        vec!["dead-letter", "requeue", "payments", "x", "--by", "oncall"],
        vec![
            "dead-letter",
            "drop",
            "payments",
            "x",
            "--by",
            "oncall",
            "--note",
            "n",
        ],
    ]
}

/// MySQL's (total_stock, ends_at ms, paused_reason) of sale `id`.
fn sale_row(db: &TestDb, id: u64) -> (u64, u64, Option<String>) {
    db.conn()
        .exec_first(
            "SELECT total_stock, CAST(UNIX_TIMESTAMP(ends_at) * 1000 AS UNSIGNED),
                    paused_reason FROM sales WHERE id = ?",
            (id,),
        )
        .unwrap()
        .unwrap()
}

#[test]
fn the_env_file_sets_the_review_file_once_for_every_command() {
    assert_eq!(
        env_file().get("SECKILL_REVIEW_DB").map(String::as_str),
        Some("/var/lib/seckill/review.sqlite3")
    );
    let unit = repo_file("systemd/seckill-reconciler.service");
    assert!(
        !unit.lines().any(|l| l.contains("SECKILL_REVIEW_DB=")),
        "the unit sets its own review file: {unit}"
    );
}

#[test]
fn every_audited_command_refuses_without_the_review_file_and_makes_none() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let id = create_sale(&db, &redis, 5, -1000, 3_600_000);
    let s = id.to_string();
    let before = sale_row(&db, id);
    let missing = dir.path().join("review.sqlite3");
    for (review, shown) in [
        (None, "./seckill-review.sqlite3".to_string()),
        (Some(missing.as_path()), missing.display().to_string()),
    ] {
        for args in audited(&s) {
            let out = with_env_file(&redis, &db, dir.path(), review, &args);
            assert_eq!(
                out.status.code(),
                Some(2),
                "{args:?}: {}",
                text(&out.stderr)
            );
            assert_eq!(
                text(&out.stderr),
                format!(
                    "seckill-reconciler: no review file at {shown}: set SECKILL_REVIEW_DB \
                     (the reconciler's `run` creates it)\n"
                ),
                "{args:?}"
            );
            assert_eq!(text(&out.stdout), "", "{args:?}");
            let made: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
            assert!(made.is_empty(), "{args:?} made {made:?}");
            assert_eq!(sale_row(&db, id), before, "{args:?} changed the sale");
        }
    }

    // `run` makes the file; the pause's rows and the findings are in it.
    let review = Some(missing.as_path());
    let out = with_env_file(&redis, &db, dir.path(), review, &["run"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let pause = &audited(&s)[0];
    let out = with_env_file(&redis, &db, dir.path(), review, pause);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("done: pause sale"),
        "{}",
        text(&out.stdout)
    );
    let out = with_env_file(&redis, &db, dir.path(), review, &["findings"]);
    assert_eq!(
        (out.status.code(), text(&out.stdout)),
        (Some(0), "no findings\n".to_string())
    );
    let c = rusqlite::Connection::open(&missing).unwrap();
    let rows: Vec<(String, String, String)> = c
        .prepare("SELECT actor, action, result FROM actions WHERE sale_id = ?1 ORDER BY id")
        .unwrap()
        .query_map([id as i64], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let row = |a: &str, r: &str| ("oncall".to_string(), a.to_string(), r.to_string());
    assert_eq!(rows, [row("pause", "started"), row("pause", "done")]);
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".sqlite3"))
        .collect();
    assert_eq!(files, ["review.sqlite3"]);
}
