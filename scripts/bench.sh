#!/usr/bin/env bash
# Every benchmark in one run, then one table (prints figures and ratios; not
# a test: nothing passes or fails on a number).
#   1. scripts/bench-gateway.sh, scripts/bench-worker.sh,
#      scripts/bench-reconciler.sh when present (their own figures);
#   2. the end-to-end race: a sale of BENCH_E2E_STOCK units (default 10,000)
#      opening in a few seconds, BENCH_E2E_USERS distinct users (default
#      200,000) over BENCH_E2E_CONNECTIONS (default 64) as fast as they can;
#      measured: time from the sale's opening to the last order committed in
#      MySQL (MAX(orders.created_at) - starts_at), for
#        - this system: seckill-gateway + 2 seckill-worker, Redis + MySQL;
#        - the baseline: seckill-baseline, the same HTTP API where each
#          purchase is one MySQL transaction (UPDATE ... available_stock > 0
#          + order insert + ledger row), BENCH_BASELINE_THREADS handler
#          threads with a connection each (default 16);
#      both runs verified by seckill-load's invariants, and drawn in
#      .demo/bench-<time>/report.html (seckill-report: the sale's units,
#      answers per second, latency and queue over time, the invariants).
# Private redis-server (AOF on, fsync every second) on a free port; MySQL:
# SECKILL_TEST_MYSQL_URL or the account scripts/test.sh sets up, in a new
# database seckill_demo_bench_<time> dropped at the end.
#
# Sizes of the others: BENCH_SECONDS (gateway), BENCH_MESSAGES (worker),
# BENCH_RECONCILER_N (reconciler, passed as its argument).
#
# usage: scripts/bench.sh [--e2e-only]     (logs: .demo/bench-<time>/)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
. scripts/lib/services.sh
. scripts/lib/private.sh

E2E_ONLY=0
[ "${1:-}" = "--e2e-only" ] && E2E_ONLY=1
STOCK=${BENCH_E2E_STOCK:-10000}
USERS=${BENCH_E2E_USERS:-200000}
CONNECTIONS=${BENCH_E2E_CONNECTIONS:-64}
BASELINE_THREADS=${BENCH_BASELINE_THREADS:-16}
# Scheduling priority (nice) of the load simulator and of the workers; see
# docs/PERFORMANCE.md ("End to end") for what each changes.
LOAD_NICE=${BENCH_LOAD_NICE:-0}
WORKER_NICE=${BENCH_WORKER_NICE:-0}
STAMP=$(date -u +%Y%m%d-%H%M%S)
OUT=$ROOT/.demo/bench-$STAMP
mkdir -p "$OUT"
ROWS=()   # "component|figure|ratio"
row() { ROWS+=("$1|$2|$3"); }

ensure_redis_server
ensure_mysql_test_account   # exports SECKILL_TEST_MYSQL_URL
ensure_package mariadb mariadb-client

echo "bench: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM," \
  "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "bench: logs in $OUT"

if [ "$E2E_ONLY" = 0 ]; then
  for b in gateway worker reconciler; do
    s=scripts/bench-$b.sh
    if [ -x "$s" ] || [ -f "$s" ]; then
      echo "=== $s"
      args=()
      [ "$b" = reconciler ] && [ -n "${BENCH_RECONCILER_N:-}" ] && args=("$BENCH_RECONCILER_N")
      if bash "$s" "${args[@]}" 2>&1 | tee "$OUT/bench-$b.txt"; then :; else
        row "$b" "bench-$b.sh failed (see $OUT/bench-$b.txt)" "-"
      fi
    else
      row "$b" "scripts/bench-$b.sh missing" "-"
    fi
  done
  # Their headline lines, as they print them.
  while IFS= read -r l; do row gateway "$(echo "$l" | sed 's/^ *//')" ""; done \
    < <(grep -E 'req/s|/ healthz|/ redis-benchmark|p99 at' "$OUT/bench-gateway.txt" 2>/dev/null || true)
  while IFS= read -r l; do row worker "$(echo "$l" | sed 's/^ *//')" ""; done \
    < <(grep -E 'orders in .* orders/s' "$OUT/bench-worker.txt" 2>/dev/null || true)
  while IFS= read -r l; do row reconciler "$(echo "$l" | sed 's/^ *//')" ""; done \
    < <(grep -E '^round' "$OUT/bench-reconciler.txt" 2>/dev/null || true)
fi

echo "=== end-to-end race: $STOCK units, $USERS users, $CONNECTIONS connections"
cargo build --release -p seckill-gateway -p seckill-worker -p seckill-reconciler \
  -p seckill-tests --bins >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 2; }
BIN=$ROOT/target/release

PIDS=()
REDIS_DIR=$OUT/redis
DB=seckill_demo_bench_$(date +%s)_$$
SERVER=${SECKILL_TEST_MYSQL_URL%/}
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  stop_pidfile "$REDIS_DIR/redis.pid"
  # shellcheck disable=SC2046
  mariadb $(mysql_client_args "$SERVER") -e "DROP DATABASE IF EXISTS \`$DB\`" 2>/dev/null || true
}
trap cleanup EXIT

RPORT=$(free_port)
start_private_redis "$REDIS_DIR" "$RPORT"
export SECKILL_REDIS_URL="redis://127.0.0.1:$RPORT/" SECKILL_MYSQL_URL="$SERVER/$DB" RUST_LOG=warn
"$BIN/seckill-reconciler" migrate >/dev/null

# json_field NAME FILE: a number from seckill-load's compact JSON report.
json_field() { grep -oE "\"$1\":-?[0-9.]+" "$2" | head -1 | cut -d: -f2; }

# race NAME URL [--baseline]: a new sale opening in 4 s, the crowd, the report.
race() {
  local name=$1 url=$2; shift 2
  local sale
  sale=$("$BIN/seckill-reconciler" sale create --sku "BENCH-$name" --stock "$STOCK" \
    --starts-at now+4s --ends-at now+1h)
  nice -n "$LOAD_NICE" "$BIN/seckill-load" --sale "$sale" --url "$url" --users "$USERS" \
    --connections "$CONNECTIONS" --duplicates 0 --hostile 0 --user-prefix "$name" \
    --wait-open --drain-timeout 600s --json "$@" >"$OUT/race-$name.json" \
    2>"$OUT/race-$name.progress" || echo "bench: $name: seckill-load exit $? (see $OUT/race-$name.json)"
}

GW_PORT=$(free_port)
# Like the baseline, which checks no token: buyers are the body's user id
# (SECKILL_AUTH=none), and the one client address of the whole crowd is not
# limited (token checks have their own figures in bench-gateway.sh).
SECKILL_LISTEN=127.0.0.1:$GW_PORT SECKILL_AUTH=none SECKILL_GATEWAY_ADDRESS_RATE=0 \
  "$BIN/seckill-gateway" 2>"$OUT/gateway.log" &
PIDS+=($!)
for w in 1 2; do
  SECKILL_WORKER_ID="bench-w$w" SECKILL_WORKER_METRICS_LISTEN="127.0.0.1:$(free_port)" \
    nice -n "$WORKER_NICE" "$BIN/seckill-worker" 2>"$OUT/worker-$w.log" &
  PIDS+=($!)
done
wait_port "$GW_PORT" 15
race system "http://127.0.0.1:$GW_PORT"
for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
PIDS=()

BL_PORT=$(free_port)
SECKILL_LISTEN=127.0.0.1:$BL_PORT SECKILL_GATEWAY_THREADS=$BASELINE_THREADS \
  "$BIN/seckill-baseline" 2>"$OUT/baseline.log" &
PIDS+=($!)
wait_port "$BL_PORT" 15
race baseline "http://127.0.0.1:$BL_PORT" --baseline

"$BIN/seckill-report" --out "$OUT/report.html" --title "seckill bench: end-to-end race" \
  "$OUT/race-system.json" "$OUT/race-baseline.json" || echo "bench: could not write report.html"

sys_ms=$(json_field open_to_last_order_ms "$OUT/race-system.json")
bl_ms=$(json_field open_to_last_order_ms "$OUT/race-baseline.json")
sys_202=$(json_field open_to_last_202_ms "$OUT/race-system.json")
bl_202=$(json_field open_to_last_202_ms "$OUT/race-baseline.json")
sold_ratio=$(awk -v a="${bl_202:-0}" -v b="${sys_202:-0}" 'BEGIN { if (b > 0) printf "%.1f x faster", a / b; else print "-" }')
sys_rps=$(json_field requests_per_s "$OUT/race-system.json")
bl_rps=$(json_field requests_per_s "$OUT/race-baseline.json")
rps_ratio=$(awk -v a="${sys_rps:-0}" -v b="${bl_rps:-0}" 'BEGIN { if (b > 0) printf "%.1f x", a / b; else print "-" }')
sys_p99=$(grep -oE '"p99":[0-9.]+' "$OUT/race-system.json" | cut -d: -f2)
bl_p99=$(grep -oE '"p99":[0-9.]+' "$OUT/race-baseline.json" | cut -d: -f2)
sys_ok=$(grep -oE '"ok":(true|false)' "$OUT/race-system.json" | head -1 | cut -d: -f2)
bl_ok=$(grep -oE '"ok":(true|false)' "$OUT/race-baseline.json" | head -1 | cut -d: -f2)
ratio=$(awk -v a="${bl_ms:-0}" -v b="${sys_ms:-0}" 'BEGIN { if (b > 0) printf "%.1f x faster", a / b; else print "-" }')
row "e2e: open -> last order committed" "system ${sys_ms:-?} ms, baseline ${bl_ms:-?} ms" "$ratio"
row "e2e: open -> sold out (last 202)" "system ${sys_202:-?} ms, baseline ${bl_202:-?} ms" "$sold_ratio"
row "e2e: requests/s over the whole crowd" "system $(printf '%.0f' "${sys_rps:-0}"), baseline $(printf '%.0f' "${bl_rps:-0}")" "$rps_ratio"
sys_drain=$(json_field drain_ms "$OUT/race-system.json" || true)
bl_drain=$(json_field drain_ms "$OUT/race-baseline.json" || true)
# The last order cannot commit before the last unit is sold, and on shared
# cores the crowd's requests take the CPU the workers and MySQL need, so the
# proposed target (docs/PERFORMANCE.md, "End to end") is that the workers
# keep up: the last order within 500 ms of the crowd's last answer.
row "e2e: crowd's last answer -> last order committed" "system ${sys_drain:-?} ms, baseline ${bl_drain:-0} ms (it commits before it answers)" "target (proposed) <= 500 ms"
row "e2e: latency p99" "system ${sys_p99:-?} ms, baseline ${bl_p99:-?} ms" ""
sys_cpu=$(json_field load_cpu_us_per_request "$OUT/race-system.json")
bl_cpu=$(json_field load_cpu_us_per_request "$OUT/race-baseline.json")
sys_load_ms=$(json_field load_cpu_ms "$OUT/race-system.json")
sys_el=$(json_field elapsed_s "$OUT/race-system.json")
# The share of the machine's cores the simulator took while sending.
share=$(awk -v c="${sys_load_ms:-0}" -v e="${sys_el:-0}" -v n="$(nproc)" \
  'BEGIN { if (e > 0) printf "%.0f %% of %d cores", c / 10 / e / n, n; else print "-" }')
row "e2e: load simulator CPU per request" "system $(printf '%.1f' "${sys_cpu:-0}") us, baseline $(printf '%.1f' "${bl_cpu:-0}") us" "system run: $share"
row "e2e: every invariant holds" "system ${sys_ok:-?}, baseline ${bl_ok:-?}" ""

echo
echo "| component | figure | ratio |"
echo "|---|---|---|"
for r in "${ROWS[@]}"; do
  IFS='|' read -r c f x <<<"$r"
  echo "| $c | $f | $x |"
done
if [ -s "$OUT/report.html" ]; then echo "bench: report (HTML): $OUT/report.html"; fi
