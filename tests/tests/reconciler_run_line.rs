//! Specifies `run`'s one line for the journal on real Redis, MariaDB and
//! SQLite: it counts the flow records the grace period skipped (`young`),
//! and a finding an operator dismissed, still there, leaves its
//! `observed [...]` list (it stays closed, so it is no news).

use crate::support::reconciler as support;

use support::{ok, World};

/// `run` with grace `grace`: its exit code and its line without the
/// trailing seconds (and the program's name).
fn run_line(w: &World, grace: &str) -> (i32, String) {
    let out = w.cmd(grace, &["run"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let line = err
        .trim_end()
        .strip_prefix("seckill-reconciler: ")
        .and_then(|l| l.rsplit_once(", "))
        .map(|(l, secs)| {
            assert!(secs.ends_with('s'), "{err}");
            l.to_string()
        })
        .unwrap_or_else(|| panic!("no run line: {err}"));
    (out.status.code().unwrap_or(-1), line)
}

#[test]
fn the_run_line_counts_young_records_and_leaves_dismissed_findings_out() {
    let w = World::new(5);
    let rids = w.reserve(&["ann", "bob"]);
    for rid in &rids {
        w.lose_message(rid);
    }
    assert_eq!(
        run_line(&w, "60s"),
        (
            0,
            "run 1: 1 sales checked, observed [], 0 new, 0 reopened, 0 auto-fixed, 0 open, \
             2 young"
                .to_string()
        )
    );
    assert_eq!(
        run_line(&w, "0s"),
        (
            1,
            "run 2: 1 sales checked, observed [flow_without_order 2], 2 new, 0 reopened, \
             0 auto-fixed, 2 open, 0 young"
                .to_string()
        )
    );
    let ann = w
        .findings()
        .into_iter()
        .find(|f| f["reservation_id"] == rids[0].as_str())
        .expect("ann's finding");
    let id = ann["id"].as_i64().unwrap().to_string();
    ok(&w.cmd(
        "0s",
        &[
            "resolve",
            &id,
            "--dismiss",
            "--by",
            "alice",
            "--note",
            "refunded",
        ],
    ));
    assert_eq!(
        run_line(&w, "0s"),
        (
            1,
            "run 3: 1 sales checked, observed [flow_without_order 1], 0 new, 0 reopened, \
             0 auto-fixed, 1 open, 0 young"
                .to_string()
        )
    );
    assert_eq!(
        w.review_count("SELECT COUNT(*) FROM findings WHERE state = 'resolved'"),
        1
    );
}
