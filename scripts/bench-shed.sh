#!/usr/bin/env bash
# Benchmarks load shedding (docs/PERFORMANCE.md, "Performance: shedding an
# overload") and prints
# figures (not a test: nothing here passes or fails on a number).
#
# Offered load is counted in purchases in flight: seckill-shed-bench runs N
# keep-alive connections that each buy as fast as they are answered (a
# distinct user per purchase; a shed purchase is sent again after
# BENCH_SHED_BACKOFF_MS). First the capacity is measured: against a gateway
# with no bound in the way, connections 4, 8, 16, ... 128 (BENCH_SHED_SWEEP);
# the capacity is the most purchases in flight whose p99 still meets the
# latency objective BENCH_SHED_SLO_MS (default 5 ms, the p99 target at
# 64 connections): a server's capacity is the load it carries within its
# objective, and beyond it more in flight buys a little throughput (larger
# group commits) for a queueing delay that doubles with every step of the
# sweep. BENCH_SHED_CAPACITY=N skips the sweep. Then 1x, 2x and 5x that
# many connections against a gateway whose in-flight bound
# (SECKILL_GATEWAY_PURCHASES_IN_FLIGHT) is the capacity, and 5x against no
# bound. For each it prints admitted purchases/s, p50 and p99 of the
# admitted (202) purchases, and the share shed (503 overloaded); then p99 at
# 5x / p99 at 1x (target <= 2).
# Rate limits are off (a rate of 0) so that only shedding acts, and the
# buyer is the body's user id (SECKILL_AUTH=none: token checks are
# bench-gateway.sh's figure, not this one's).
#
# A private redis-server (AOF everysec, no rewrites) on a free port; the
# machine's Redis is never touched. Usage: scripts/bench-shed.sh
# (BENCH_SECONDS each run, default 10; BENCH_SHED_BACKOFF_MS: how long a shed
# client waits before its retry, default 20; 0 = a retry storm, where
# clients ignore Retry-After: 1 altogether; BENCH_PIN=1 below).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/services.sh

ensure_redis_server
SECONDS_EACH=${BENCH_SECONDS:-10}
SWEEP=${BENCH_SHED_SWEEP:-"4 8 16 32 64 128"}
SLO_MS=${BENCH_SHED_SLO_MS:-5}
export BENCH_SHED_BACKOFF_MS=${BENCH_SHED_BACKOFF_MS:-20}
cargo build --release -q -p seckill-gateway -p seckill-tests --bin seckill-gateway --bin seckill-shed-bench
BIN=${CARGO_TARGET_DIR:-target}/release

# BENCH_PIN=1: the gateway and Redis on CPU 0, the load generator on CPU 1,
# so that the generator's own growth (5x the connections, its retries) does
# not take CPU from the server being measured: the crowd on another machine.
PIN_SERVER="" PIN_LOAD=""
if [ "${BENCH_PIN:-0}" = 1 ]; then PIN_SERVER="taskset -c 0"; PIN_LOAD="taskset -c 1"; fi
REDIS_PIN=$PIN_SERVER
. scripts/lib/bench_redis.sh
load_sale 1 1000000000

start_gateway() { # IN_FLIGHT_BOUND
  SECKILL_LISTEN=127.0.0.1:$GPORT SECKILL_REDIS_URL=redis://127.0.0.1:$RPORT/ \
    SECKILL_GATEWAY_PURCHASES_IN_FLIGHT=$1 SECKILL_GATEWAY_BUYER_RATE=0 \
    SECKILL_GATEWAY_ADDRESS_RATE=0 SECKILL_AUTH=none RUST_LOG=warn $PIN_SERVER "$BIN/seckill-gateway" &
  GW_PID=$!
  for _ in $(seq 100); do port_open 127.0.0.1 "$GPORT" && break; sleep 0.05; done
}
stop_gateway() {
  kill -TERM "$GW_PID"; wait "$GW_PID" || true; GW_PID=""
}
run() { # NAME CONNECTIONS -> prints and stores "admitted/s p50 p99 shed other"
  local out
  out=$($PIN_LOAD "$BIN/seckill-shed-bench" "127.0.0.1:$GPORT" 1 "$2" "$SECONDS_EACH" "$1-$(date +%s)")
  echo "$out" >"$WORK/$1"
  read -r rps p50 p99 shed other <<<"$out"
  printf '%-26s %4d conns  %8.0f admitted/s   p50 %7.2f ms   p99 %7.2f ms   shed %5.1f %%   other %s\n' \
    "$1" "$2" "$rps" "$p50" "$p99" "$(awk -v s="$shed" 'BEGIN{print s*100}')" "$other"
}

echo "bench-shed: $(nproc) cores, ${SECONDS_EACH}s each, shed clients retry after ${BENCH_SHED_BACKOFF_MS} ms, pinned: ${BENCH_PIN:-0}"
start_gateway 1000000
if [ -n "${BENCH_SHED_CAPACITY:-}" ]; then
  CAP=$BENCH_SHED_CAPACITY
  echo "capacity taken as $CAP purchases in flight (BENCH_SHED_CAPACITY)"
else
  for c in $SWEEP; do run "sweep_$c" "$c"; done
  CAP=$(for c in $SWEEP; do echo "$c $(awk '{print $3}' "$WORK/sweep_$c")"; done | awk -v slo="$SLO_MS" '
    NR == 1 { cap = $1 } $2 <= slo { cap = $1 } END { print cap }')
  echo "capacity: $CAP purchases in flight (the most whose p99 is within ${SLO_MS} ms)"
fi
run 5x_unbounded $(( CAP * 5 ))
stop_gateway
start_gateway "$CAP"
run 1x_bound "$CAP"
run 2x_bound $(( CAP * 2 ))
run 5x_bound $(( CAP * 5 ))
stop_gateway
p1=$(awk '{print $3}' "$WORK/1x_bound"); p5=$(awk '{print $3}' "$WORK/5x_bound")
pu=$(awk '{print $3}' "$WORK/5x_unbounded")
echo
awk -v a="$p1" -v b="$p5" -v u="$pu" 'BEGIN {
  printf "p99 at 5x / p99 at 1x, bound %d: %.2f (target <= 2); without the bound: %.2f\n", '"$CAP"', b/a, u/a
}'
