#!/usr/bin/env bash
# Benchmarks purchases on one Redis against a Redis Cluster
# (docs/PERFORMANCE.md, "Scaling over a cluster") and prints figures and
# ratios (not a test: nothing here passes or fails on a number).
#
# In one run, each with wrk -t2 -c64 for BENCH_SECONDS (default 10), a
# distinct user id per request (SECKILL_AUTH=none: the token cost is
# bench-gateway.sh's), one release gateway:
#   1. one Redis (AOF on, appendfsync everysec);
#   2. a cluster of 3 masters with a replica each (six redis-servers, the
#      same persistence), the sale in one bucket;
#   3. the same cluster, the sale split over 3 buckets, one per master.
# Each row prints purchases per second (wrk, and the gateway's own count of
# 202s over the server-side interval; more than 5 % apart is a MISMATCH and
# exit 1), then per master: reservations (EVALSHA calls, INFO
# commandstats), Redis's own µs per call, and the master's CPU time (INFO
# cpu, user + sys) per reservation; the replicas' CPU per reservation; the
# gateway's CPU per purchase. Then the ratios to one Redis, and the scaling
# model's inputs (docs/PERFORMANCE.md, "Scaling over a cluster") with what a
# peak of BENCH_PEAK purchases per second (default 100000) needs.
#
# On this machine everything shares 2 cores, so the cluster's rates say
# little about a cluster of machines; the CPU per reservation of each
# master is what the model scales. Private servers on free ports; the
# machine's Redis is never touched. Needs redis-server, redis-cli, wrk,
# python3 (the first three installed with apt-get when missing).
# Usage: scripts/bench-cluster.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/services.sh

ensure_redis_server
ensure_package wrk wrk
ensure_package redis-cli redis-tools

SECONDS_EACH=${BENCH_SECONDS:-10}
CONNS=64
STOCK=1000000000
cargo build --release -q -p seckill-gateway
TARGET=${CARGO_TARGET_DIR:-target}
GW=$TARGET/release/seckill-gateway

. scripts/lib/bench_redis.sh
. scripts/lib/wrk_buy.sh
write_wrk_buy "$WORK"
export BENCH_WRK_THREADS=2
export BENCH_REQS_PER_THREAD=${BENCH_REQS_PER_THREAD:-$(( 40000 * SECONDS_EACH ))}
TICKS=$(getconf CLK_TCK)

# --- the cluster -----------------------------------------------------------
. scripts/lib/private.sh
CPORTS=()
for i in 1 2 3 4 5 6; do
  p=$(free_cluster_port)
  # Taken now, so that the next pick cannot return it.
  CPORTS+=("$p")
done
cluster_cleanup() {
  for p in "${CPORTS[@]}"; do stop_pidfile "$WORK/cluster/$p/redis.pid" 5; done
  cleanup
}
trap cluster_cleanup EXIT
start_private_cluster "$WORK/cluster" "${CPORTS[@]}"
# As the single Redis: no automatic AOF rewrite (its fork takes a core).
for p in "${CPORTS[@]}"; do redis-cli -p "$p" CONFIG SET auto-aof-rewrite-percentage 0 >/dev/null; done
for _ in $(seq 200); do
  ok=0
  for p in "${CPORTS[@]}"; do
    redis-cli -p "$p" CLUSTER INFO | tr -d '\r' | grep -q '^cluster_state:ok' && ok=$((ok + 1))
  done
  [ "$ok" = 6 ] && break
  sleep 0.1
done
CURL="redis+cluster://$(printf '127.0.0.1:%s,' "${CPORTS[@]}" | sed 's/,$//')/"
crc() { redis-cli -c -p "${CPORTS[0]}" "$@"; }
# master_of KEY: the port of the master serving KEY's slot (from each
# master's own line of CLUSTER NODES: its slot ranges "a-b" or "a").
master_of() {
  local slot p
  slot=$(redis-cli -p "${CPORTS[0]}" CLUSTER KEYSLOT "$1")
  for p in "${CPORTS[@]}"; do
    redis-cli -p "$p" CLUSTER NODES | awk -v s="$slot" -v p="$p" '/myself/ && /master/ {
      for (i = 9; i <= NF; i++) { n = split($i, r, "-"); a = r[1]; b = (n == 2 ? r[2] : r[1]);
        if (s >= a && s <= b) print p } }'
  done
}
role_is() { # ROLE: the cluster's ports whose ROLE is ROLE (master, slave)
  local p
  for p in "${CPORTS[@]}"; do
    if [ "$(redis-cli -p "$p" ROLE | head -1)" = "$1" ]; then echo "$p"; fi
  done
}
# A bucket's keys as buckets::load_into_redis writes them (share, K in
# bucket 0's meta); bucket 0 last, then the sales set.
tag() { if [ "$2" = 0 ]; then echo "{sale:$1}"; else echo "{sale:$1:b$2}"; fi; }
load_cluster_sale() { # ID K
  local b share
  for b in $(seq $(( $2 - 1 )) -1 0); do
    share=$(( STOCK / $2 ))
    crc HSET "seckill:$(tag "$1" "$b"):meta" total_stock "$share" share "$share" \
      starts_at_ms "$now_ms" ends_at_ms "$end_ms" >/dev/null
    if [ "$b" = 0 ]; then crc HSET "seckill:$(tag "$1" 0):meta" buckets "$2" >/dev/null; fi
    crc SET "seckill:$(tag "$1" "$b"):stock" "$share" >/dev/null
  done
  crc SADD seckill:sales "$1" >/dev/null
}
# A split sale whose 3 buckets are on 3 different masters.
SPLIT=""
for id in $(seq 2 200); do
  m=$(for b in 0 1 2; do master_of "seckill:$(tag "$id" "$b"):stock"; done | sort -u | wc -l)
  if [ "$m" = 3 ]; then SPLIT=$id; break; fi
done
[ -n "$SPLIT" ] || { echo "bench-cluster: no sale id 2..200 puts 3 buckets on 3 masters" >&2; exit 1; }
load_sale 1 "$STOCK"
load_cluster_sale 1 1
load_cluster_sale "$SPLIT" 3

# --- one run -----------------------------------------------------------------
proc_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# cpu_us PORT: used_cpu_user + used_cpu_sys of a redis-server, µs.
cpu_us() { redis-cli -p "$1" INFO cpu | tr -d '\r' | awk -F: '/^used_cpu_(user|sys):/ { s += $2 } END { printf "%.0f\n", s * 1e6 }'; }
evalsha() { # PORT -> "calls usec_per_call"
  redis-cli -p "$1" INFO commandstats | tr -d '\r' |
    awk -F'[=,:]' '/^cmdstat_evalsha:/ { c = $3; u = $7 } END { printf "%d %s\n", c, (u == "" ? 0 : u) }'
}
MISMATCHES=0
# run NAME SALE URL PORTS...: wrk against a fresh gateway on URL; PORTS the
# Redis servers to read (masters first, then replicas with a leading r).
run() {
  local name=$1 sale=$2 url=$3; shift 3
  local p ports=("$@")
  SECKILL_LISTEN=127.0.0.1:$GPORT SECKILL_REDIS_URL=$url SECKILL_AUTH=none \
    SECKILL_GATEWAY_BUYER_RATE=0 SECKILL_GATEWAY_ADDRESS_RATE=0 RUST_LOG=warn "$GW" 2>"$WORK/gateway-$name.log" &
  GW_PID=$!
  for _ in $(seq 100); do port_open 127.0.0.1 "$GPORT" && break; sleep 0.05; done
  declare -A cpu0
  for p in "${ports[@]}"; do
    redis-cli -p "${p#r}" CONFIG RESETSTAT >/dev/null
    cpu0[$p]=$(cpu_us "${p#r}")
  done
  export BENCH_BARRIER=$WORK/barrier-$name
  mkdir -p "$BENCH_BARRIER"
  python3 scripts/lib/bench_watch.py "$GPORT" "$RPORT" 'seckill:{sale:0}:stock' "$WORK/watch-$name" &
  local watch=$!
  sleep 0.3
  local g0 g1 out rps p99 srv
  g0=$(proc_ticks "$GW_PID")
  out=$(wrk -t$BENCH_WRK_THREADS -c$CONNS -d"${SECONDS_EACH}s" --latency -s "$WORK/buy.lua" \
    "http://127.0.0.1:$GPORT/v1/sales/$sale/purchases")
  g1=$(proc_ticks "$GW_PID")
  sleep 0.1; kill -TERM "$watch"; wait "$watch" || true
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {v=$2; if (v ~ /us$/) {sub("us","",v); v=v/1000} else if (v ~ /ms$/) {sub("ms","",v)} else if (v ~ /s$/) {sub("s","",v); v=v*1000}; print v}' <<<"$out")
  read -r n srv <<<"$(awk '$1 == "gw:purchase:202" { printf "%d %.0f\n", $2, $2 / ($4 - $3) }' "$WORK/watch-$name")"
  printf '%-24s %9.0f req/s (wrk)  %9.0f 202/s (gateway count, %s)  p99 %7.2f ms  gateway %.1f us CPU/purchase\n' \
    "$name" "$rps" "${srv:-0}" "${n:-0}" "$p99" "$(awk -v g=$((g1 - g0)) -v hz="$TICKS" -v n="${n:-1}" 'BEGIN { print g * 1e6 / hz / n }')"
  if ! awk -v a="$rps" -v b="${srv:-0}" 'BEGIN { exit !(b > 0 && a / b <= 1.05 && a / b >= 0.95) }'; then
    echo "  !!! MISMATCH: $name: $rps/s by wrk, ${srv:-0}/s by the gateway's count (> 5 % apart)" >&2
    MISMATCHES=$(( MISMATCHES + 1 ))
  fi
  local calls usec cpu total_cpu=0 total_calls=0 rep_cpu=0
  for p in "${ports[@]}"; do
    cpu=$(( $(cpu_us "${p#r}") - ${cpu0[$p]} ))
    if [ "${p:0:1}" = r ]; then rep_cpu=$(( rep_cpu + cpu )); continue; fi
    read -r calls usec <<<"$(evalsha "$p")"
    total_cpu=$(( total_cpu + cpu )); total_calls=$(( total_calls + calls ))
    [ "$calls" -gt 0 ] || continue
    printf '  master %-6s %9d reservations  %6.2f us per EVALSHA  %6.2f us CPU per reservation\n' \
      "$p" "$calls" "$usec" "$(awk -v c="$cpu" -v n="$calls" 'BEGIN { print c / n }')"
  done
  awk -v c="$total_cpu" -v r="$rep_cpu" -v n="$total_calls" -v rps="${srv:-0}" -v name="$name" 'BEGIN {
    printf "  all masters: %.2f us CPU per reservation", c / n
    if (r > 0) printf "; replicas: %.2f us CPU per reservation", r / n
    printf "\n"
  }'
  echo "$name ${srv:-0} $(awk -v c="$total_cpu" -v n="$total_calls" 'BEGIN { print c / n }') $(awk -v g=$((g1 - g0)) -v hz="$TICKS" -v n="${n:-1}" 'BEGIN { print g * 1e6 / hz / n }')" >>"$WORK/rows"
  kill -TERM "$GW_PID"; wait "$GW_PID" || true; GW_PID=""
}

echo "bench-cluster: $(nproc) cores, wrk -t2 -c$CONNS -d${SECONDS_EACH}s, Redis $(redis-server --version | awk '{print $3}'), split sale $SPLIT"
M=($(role_is master)); R=($(role_is slave))
run one_redis 1 "redis://127.0.0.1:$RPORT/" "$RPORT"
run cluster_1_bucket 1 "$CURL" "${M[@]}" $(printf 'r%s ' "${R[@]}")
run cluster_3_buckets "$SPLIT" "$CURL" "${M[@]}" $(printf 'r%s ' "${R[@]}")

echo
echo "ratios to one Redis (the gateway's counts; everything shares $(nproc) cores here):"
awk '{ rps[$1] = $2; cpu[$1] = $3; gw[$1] = $4 } END {
  for (n in rps) if (n != "one_redis")
    printf "  %-22s purchases %.2f x, Redis CPU per reservation %.2f x\n", n, rps[n] / rps["one_redis"], cpu[n] / cpu["one_redis"]
  m = cpu["cluster_3_buckets"]; g = gw["cluster_3_buckets"]
  printf "\nscaling model inputs (one core per master, docs/PERFORMANCE.md):\n"
  printf "  one master takes at most 1e6 / %.2f = %.0f reservations/s\n", m, 1e6 / m
  printf "  one gateway core takes at most 1e6 / %.1f = %.0f purchases/s\n", g, 1e6 / g
  printf "  a peak of %d purchases/s needs %d masters (buckets) and %d gateway cores, each at most 70 %% busy\n", \
    peak, int(peak * m / 1e6 / 0.7) + 1, int(peak * g / 1e6 / 0.7) + 1
}' peak="${BENCH_PEAK:-100000}" "$WORK/rows"
if [ "$MISMATCHES" -gt 0 ]; then
  echo "bench-cluster: $MISMATCHES figure(s) of wrk disagree with the gateway's count by more than 5 %" >&2
  exit 1
fi
