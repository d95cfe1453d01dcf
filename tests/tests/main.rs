//! The integration tests: one test binary, `it`, whose modules are the
//! test files of this folder (one file per area and topic, named
//! `AREA_TOPIC.rs`) and the harness's helpers in `support/`. One binary
//! links once where one per file linked the workspace's dependencies
//! seventy times; its tests run in parallel (`--test-threads`, default
//! one per core), and a test's path keeps its file's name:
//! `cargo test --features seckill-worker/crash-points --test it gateway_limits::`
//! runs `gateway_limits.rs`, `... --test it gateway_limits::a_bot` one test.
//!
//! Adding a test file: create `tests/tests/AREA_TOPIC.rs` and add
//! `mod AREA_TOPIC;` below; it reaches the helpers as
//! `use crate::support::gateway;` (or `worker`, `reconciler`, ...).
//! Cargo builds no other file of this folder alone (`autotests = false` in
//! `tests/Cargo.toml`), and `every_test_file_is_a_module_of_this_binary`
//! fails for a file no `mod` line names.
//!
//! # Layout
//!
//! - `support/`: the helpers the test files share (its own `# Layout`).
//! - `AREA_TOPIC.rs`: the tests, by area: `api_*`, `cluster_*`, `e2e_*`,
//!   `gateway_*`, `ha_*` (replicas, Sentinel, failover), `harness_*`, `load_*`, `metrics_*`, `ops_*`,
//!   `order_lifecycle*`, `quantity_*` (several units per purchase), `reconciler_*`, `redis_*`, `reservation`,
//!   `sale_*`, `schema_*`, `script_*`, `services_*`, `systemd_*`,
//!   `tidy` (conventions of the sources and docs), `tiny_http_*`, `worker_*`.
#![forbid(unsafe_code)]

mod api_contract;
mod cluster_failover;
mod cluster_failover_buckets;
mod cluster_master_down;
mod cluster_operator;
mod cluster_quarantine;
mod cluster_replicas_ack;
mod cluster_reshard;
mod cluster_scripts;
mod e2e_demo;
mod e2e_pipeline;
mod gateway_api;
mod gateway_broken_link;
mod gateway_burst;
mod gateway_documented;
mod gateway_failed_status;
mod gateway_fd_limit;
mod gateway_hostile;
mod gateway_identity;
mod gateway_lifecycle;
mod gateway_limits;
mod gateway_memory;
mod gateway_pipelining;
mod gateway_provider_keys;
mod gateway_public_answers;
mod gateway_pull_answers;
mod gateway_raw_http;
mod gateway_redis_timeout;
mod gateway_token_fuzz;
mod gateway_token_rules;
mod gateway_units;
mod gateway_winners;
mod ha_mysql_failover;
mod ha_mysql_fencing;
mod ha_mysql_replica;
mod ha_mysql_replica_checked;
mod ha_mysql_semi_sync;
mod ha_redis_sentinel;
mod harness_isolation;
mod load_cli;
mod load_outage;
mod load_quantities;
mod load_state;
mod metrics_promtool;
mod ops_exporters;
mod ops_nginx;
mod ops_nginx_crowd;
mod ops_package;
mod ops_prometheus;
mod ops_rules;
mod order_lifecycle;
mod order_lifecycle_deadline;
mod order_lifecycle_dropped_payment;
mod order_lifecycle_http;
mod order_lifecycle_payments;
mod order_lifecycle_race;
mod own_connections;
mod quantity_buckets;
mod quantity_buckets_hostile;
mod quantity_cancel;
mod quantity_hostile;
mod quantity_lifecycle;
mod quantity_reconciler;
mod quantity_worker;
mod reconciler_backlog;
mod reconciler_cli;
mod reconciler_documented;
mod reconciler_hostile;
mod reconciler_ledger;
mod reconciler_queues;
mod reconciler_resolve;
mod reconciler_resolve_all;
mod reconciler_review_file;
mod reconciler_run;
mod reconciler_run_line;
mod reconciler_sale_dead_letter_drop;
mod redis_data_loss;
mod redis_data_loss_buckets;
mod redis_data_loss_unseen;
mod redis_failover_loss_scope;
mod redis_fitness;
mod redis_fitness_window;
mod redis_loss_ended;
mod redis_master_change_hold;
mod redis_partial_loss;
mod redis_repair_lifecycle;
mod reservation;
mod reservation_units;
mod sale_admin;
mod sale_admin_ended;
mod sale_archive;
mod sale_buckets;
mod sale_buckets_lifecycle;
mod sale_draw;
mod sale_end_exact;
mod schema_and_sales;
mod script_guards;
mod services_cli;
mod services_errors;
mod services_worker_grants;
mod support;
mod systemd_notify;
mod systemd_units;
mod tidy;
mod tiny_http_respond_now;
mod worker_autoscale;
mod worker_crash;
mod worker_documented;
mod worker_fence;
mod worker_frozen;
mod worker_identity;
mod worker_metrics;
mod worker_mysql;
mod worker_queue;
mod worker_statement_retry;

/// Every `.rs` file of this folder is a module of this binary: Cargo
/// builds none alone, so a file no `mod` line names would never run.
#[test]
fn every_test_file_is_a_module_of_this_binary() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let main = std::fs::read_to_string(dir.join("main.rs")).expect("read tests/tests/main.rs");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("read tests/tests") {
        let path = entry.expect("a directory entry").path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        let is_rs = path.extension().is_some_and(|e| e == "rs");
        if is_rs && stem != "main" && !main.contains(&format!("\nmod {stem};\n")) {
            missing.push(format!("tests/tests/{stem}.rs"));
        }
    }
    assert!(
        missing.is_empty(),
        "add `mod NAME;` to tests/tests/main.rs for: {}",
        missing.join(", ")
    );
}
