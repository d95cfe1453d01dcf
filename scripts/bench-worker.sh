#!/usr/bin/env bash
# Benchmark of the worker (prints figures; not a test): preloads
# BENCH_MESSAGES order messages (default 100000) into one sale's queue on a
# private redis-server, then times one release-built seckill-worker draining
# them into MariaDB with batch sizes BENCH_BATCHES (default "1 16 256"),
# printing orders/s and the ratio to batch size 1 (one transaction per order).
# Before each drain it times the raw rate of the same MariaDB taking the same
# rows (order + ledger row per message, multi-row INSERTs of one batch, one
# commit per batch; at most 2,000 commits, so batch 1 stays quick) and
# prints worker / raw (target: >= 0.5), and
# Redis's server time per order by command (INFO commandstats).
# BENCH_WORKER_BIN runs another worker binary (e.g. a build of another
# commit, to compare two builds on the same machine and data).
# BENCH_PER_BUYER=L (default 1) sells L units per buyer (each buyer buys
# one): the worker then checks each buyer's units in MySQL per batch.
#
# --consumers: what more consumers buy instead. For each count of sales in
# BENCH_SALES (default "1,4") and of consumers in BENCH_CONSUMERS (default
# "1,2,4"), BENCH_MESSAGES (default 40000 here) messages spread evenly over
# the sales are drained by one worker process running that many consumers
# (SECKILL_WORKER_CONSUMERS_MIN = _MAX); BENCH_CONSUMERS_BY=processes runs
# that many worker processes of one consumer each instead.
#
# MySQL: SECKILL_TEST_MYSQL_URL (server URL, no database) when set, else the
# account scripts/test.sh sets up. The database seckill_demo_bench_worker is
# dropped and recreated for each run. Target: batch 256 at
# least 20 x batch 1 on the same machine.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/services.sh

ensure_redis_server
ensure_mysql_test_account   # exports SECKILL_TEST_MYSQL_URL

consumers=
if [ "${1:-}" = --consumers ]; then consumers=1; shift; fi
if [ $# -gt 0 ]; then echo "usage: $0 [--consumers]" >&2; exit 64; fi
if [ -n "$consumers" ]; then
  messages=${BENCH_MESSAGES:-40000}
else
  messages=${BENCH_MESSAGES:-100000}
fi
batches=${BENCH_BATCHES:-1 16 256}

cargo build --release -p seckill-worker --bin seckill-worker --example bench_worker \
  --example bench_consumers

tmp=$(mktemp -d)
port=$(( 20000 + RANDOM % 20000 ))
redis-server --port "$port" --bind 127.0.0.1 --dir "$tmp" --save "" \
  --appendonly yes --appendfsync everysec --daemonize no --loglevel warning \
  >/dev/null 2>&1 &
redis_pid=$!
trap 'kill "$redis_pid" 2>/dev/null; wait "$redis_pid" 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 1 100); do port_open 127.0.0.1 "$port" && break; sleep 0.1; done

if [ -n "$consumers" ]; then
  echo "bench-worker --consumers: $messages messages, sales ${BENCH_SALES:-1,4}," \
    "consumers ${BENCH_CONSUMERS:-1,2,4} (${BENCH_CONSUMERS_BY:-one process}); $(nproc) cores"
  target/release/examples/bench_consumers "${BENCH_WORKER_BIN:-target/release/seckill-worker}" \
    "redis://127.0.0.1:$port/" "$SECKILL_TEST_MYSQL_URL" "$messages" \
    "${BENCH_SALES:-1,4}" "${BENCH_CONSUMERS:-1,2,4}"
  exit 0
fi
echo "bench-worker: $messages messages, batch sizes: $batches; $(nproc) cores;" \
  "MariaDB $(mariadb --protocol=TCP -h127.0.0.1 -P3306 -uroot -N -e 'SELECT VERSION()' 2>/dev/null || echo '?')"
# shellcheck disable=SC2086 # batch sizes are separate arguments
BENCH_MYSQL_PID=$(pidof mariadbd mysqld 2>/dev/null | awk '{print $1}') \
BENCH_REDIS_PID=$redis_pid \
  target/release/examples/bench_worker "${BENCH_WORKER_BIN:-target/release/seckill-worker}" \
  "redis://127.0.0.1:$port/" "$SECKILL_TEST_MYSQL_URL" "$messages" $batches
