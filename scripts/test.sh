#!/usr/bin/env bash
# Runs every test against real Redis and MariaDB.
#
# Ensures what the tests need, installing Debian packages when missing:
#   - redis-server (each test starts its own private instance on a free port);
#   - a MariaDB/MySQL server on 127.0.0.1:3306 (started when nothing listens);
#   - an account that can log in over TCP (see scripts/lib/services.sh);
#   - mariadb-install-db and mariadbd (mariadb-server: the replica and
#     failover tests start private MariaDB servers on free ports, whatever
#     serves 127.0.0.1:3306);
#   - systemd-analyze (for the unit-file checks);
#   - setpriv (util-linux: every spawned server dies with its test; its
#     prlimit gives tests/tests/ops_nginx_crowd.rs's nginx systemd's
#     descriptor limit);
#   - promtool (Debian's `prometheus`, for tests/tests/metrics_promtool.rs;
#     installed without starting the Prometheus service, see
#     scripts/lib/services.sh; its `prometheus` server is run privately by
#     tests/tests/ops_prometheus.rs);
#   - prometheus-node-exporter (Debian; tests/tests/ops_prometheus.rs runs
#     one privately to export the reconciler's metrics file; installed
#     without starting the system's exporter);
#   - prometheus-redis-exporter and prometheus-mysqld-exporter (Debian;
#     tests/tests/ops_exporters.rs runs one of each privately against its
#     own Redis and MariaDB; installed without starting the system's
#     exporters);
#   - nginx (for tests/tests/ops_nginx.rs and ops_nginx_crowd.rs, which
#     copies Debian's /etc/nginx files into a private prefix; installed
#     without starting the system's nginx);
#   - chromium (Debian; tests/tests/e2e_demo.rs renders the demo's
#     report.html in it, headless);
#   - cargo-deb (crates.io, the version services.sh pins, `cargo install
#     --locked` into cargo's bin directory) and lintian (Debian): for
#     tests/tests/ops_package.rs, which builds the package with
#     scripts/package.sh, installs and purges it on this machine (as root);
#   - schemathesis (PyPI, the version services.sh pins, for
#     tests/tests/api_contract.rs) in a virtual environment under the build
#     directory, `${CARGO_TARGET_DIR:-target}/venv-schemathesis`, with
#     Debian's python3-venv when python3 lacks venv; its `st` is exported as
#     SECKILL_SCHEMATHESIS.
# Checks that vendor/tiny_http is tiny_http 0.12.0 plus its patch files
# (vendor/tiny_http/check-patches.sh; skipped with a message when crates.io
# cannot be reached). Then builds and tests the workspace with the worker's
# test-only crash points (`--features seckill-worker/crash-points`: the
# crash tests need them; no release build has them), and the worker's unit
# tests once more without them (a build without the feature must ignore
# SECKILL_WORKER_CRASH_AT). Exits non-zero on any failure. Extra arguments
# go to the workspace's `cargo test` (e.g. a test name filter).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/services.sh

ensure_redis_server
ensure_mysql_test_account   # exports SECKILL_TEST_MYSQL_URL
ensure_package mariadb-install-db mariadb-server
ensure_package systemd-analyze systemd
ensure_package setpriv util-linux
ensure_promtool
ensure_node_exporter
ensure_store_exporters
ensure_nginx
ensure_chromium
ensure_package lintian lintian
ensure_cargo_deb
ensure_schemathesis
ensure_pyjwt

echo "test.sh: MySQL for tests: ${SECKILL_TEST_MYSQL_URL%%@*}@... ; redis-server: $(command -v redis-server); promtool: $(command -v promtool); nginx: $(command -v nginx || echo /usr/sbin/nginx); chromium: $(command -v chromium); schemathesis: $SECKILL_SCHEMATHESIS"
vendor/tiny_http/check-patches.sh
features=(--features seckill-worker/crash-points)
cargo build --workspace --all-targets "${features[@]}"
cargo test --workspace "${features[@]}" "$@"
cargo test -p seckill-worker --lib
