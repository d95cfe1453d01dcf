#!/usr/bin/env bash
# Benchmarks the gateway on this machine and prints figures and ratios (not a
# test: nothing here passes or fails on a number).
#
# One run prints, with wrk (-t2 -c64, BENCH_SECONDS each, default 10):
#   1. GET /healthz                         the tiny_http ceiling here;
#   2. POST purchase, plentiful stock       a distinct user id per request (Lua);
#   3. POST purchase after the sell-out     the in-memory fast path;
# 2 is run for each Redis mode in BENCH_MODES (default "2 1 0": group commit
# over 2 or 1 pipelining Redis threads, and 0 = one round trip per purchase);
# 1-3 with SECKILL_AUTH=none (the user id of the body), then
#   5. POST purchase, plentiful stock, SECKILL_AUTH=none / HS256 / EdDSA
#      tokens, a distinct token (and user) per request, default Redis mode:
#      the cost of verifying buyer tokens (issue 12), as ratios to none;
#   4. redis-benchmark, 50 clients, EVALSHA of the same reservation script
#      with distinct users, unpipelined: the one-round-trip Redis ceiling;
# then the ratios against the issue's targets.
#
# A private redis-server (AOF on, appendfsync everysec, automatic AOF
# rewrites off: a rewrite forks Redis, and on 2 cores its child takes a
# core for seconds, which tripled the purchase p99 in the runs it hit; see
# docs/OPERATIONS.md) on a free port; the machine's Redis is never
# touched. Needs wrk and redis-server (installed
# with apt-get when missing). Usage: scripts/bench-gateway.sh
# (BENCH_GATEWAY=path measures another gateway binary, e.g. an older build.)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/services.sh

ensure_redis_server
ensure_package wrk wrk
ensure_package redis-benchmark redis-tools

SECONDS_EACH=${BENCH_SECONDS:-10}
MODES=${BENCH_MODES:-"2 1 0"}
CONNS=64
cargo build --release -q -p seckill-gateway -p seckill-reconciler
TARGET=${CARGO_TARGET_DIR:-target}
GW=${BENCH_GATEWAY:-$TARGET/release/seckill-gateway}
RECONCILER=$TARGET/release/seckill-reconciler

. scripts/lib/bench_redis.sh

# Sale 1: plentiful stock; sale 2: sold out. Open for an hour.
load_sale 1 1000000000
load_sale 2 0

start_gateway() { # REDIS_THREADS [KEY_FILE: buyer tokens; none: SECKILL_AUTH=none]
  local auth=none keys=""
  if [ -n "${2:-}" ]; then auth=jwt; keys=$2; fi
  SECKILL_LISTEN=127.0.0.1:$GPORT SECKILL_REDIS_URL=redis://127.0.0.1:$RPORT/ \
    SECKILL_AUTH=$auth SECKILL_AUTH_KEYS=$keys \
    SECKILL_GATEWAY_REDIS_THREADS=$1 RUST_LOG=warn "$GW" 2>"$WORK/gateway.log" &
  GW_PID=$!
  for _ in $(seq 100); do port_open 127.0.0.1 "$GPORT" && break; sleep 0.05; done
}
stop_gateway() {
  kill -TERM "$GW_PID"
  for _ in $(seq 100); do kill -0 "$GW_PID" 2>/dev/null || break; sleep 0.05; done
  if kill -0 "$GW_PID" 2>/dev/null; then echo "gateway did not stop within 5 s" >&2; kill -9 "$GW_PID"; fi
  wait "$GW_PID" || true
  GW_PID=""
}

cat >"$WORK/buy.lua" <<'LUA'
-- A distinct user id per request (run, wrk thread, counter). The requests
-- are formatted once per thread before the run: formatting one in
-- request() costs wrk more CPU than the gateway spends answering a
-- sold-out purchase, on the two cores wrk shares with the gateway, which
-- would measure wrk rather than the gateway. After BENCH_REQS_PER_THREAD
-- requests a thread starts over (then the same users buy again: 409s,
-- which the output shows as non-2xx).
local threads = 0
function setup(thread) thread:set("tid", threads); threads = threads + 1 end
local reqs, n, count = {}, 0, 0
function init(args)
  local run = tostring(os.time())
  count = tonumber(os.getenv("BENCH_REQS_PER_THREAD") or "600000")
  for i = 1, count do
    reqs[i] = wrk.format("POST", nil, {["Content-Type"] = "application/json"},
      '{"user_id":"b' .. run .. '-' .. tid .. '-' .. i .. '"}')
  end
end
function request()
  n = n + 1
  if n > count then n = 1 end
  return reqs[n]
end
LUA

# Tokens: one per request, read from a file (one a line) before the run;
# thread t sends lines t, t+threads, ... (distinct users, every one new).
cat >"$WORK/tokens.lua" <<'LUA'
local threads = 0
function setup(thread) thread:set("tid", threads); threads = threads + 1 end
local reqs, n, count = {}, 0, 0
function init(args)
  local i = 0
  for line in io.lines(os.getenv("BENCH_TOKENS")) do
    if i % 2 == tid then
      count = count + 1
      reqs[count] = wrk.format("POST", nil, {["Content-Type"] = "application/json",
        ["Authorization"] = "Bearer " .. line}, '{}')
    end
    i = i + 1
  end
end
function request()
  n = n + 1
  if n > count then n = 1 end
  return reqs[n]
end
LUA

# CPU time (clock ticks) of a process, and busy time of the whole machine.
proc_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
busy_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }

# run_wrk NAME URL [LUA]: prints "NAME rps p99_ms" and keeps in $WORK/NAME
# "rps p99_ms requests machine_busy_us_per_request redis_cpu_us_per_request".
run_wrk() {
  local name=$1 url=$2 lua=${3:-}
  local out b0 r0 b1 r1
  b0=$(busy_ticks); r0=$(proc_ticks "$R_PID")
  if [ -n "$lua" ]; then
    out=$(wrk -t2 -c$CONNS -d"${SECONDS_EACH}s" --latency -s "$lua" "$url")
  else
    out=$(wrk -t2 -c$CONNS -d"${SECONDS_EACH}s" --latency "$url")
  fi
  b1=$(busy_ticks); r1=$(proc_ticks "$R_PID")
  local rps p99 non2xx total
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
  total=$(awk '/requests in/ {print $1}' <<<"$out")
  p99=$(awk '$1=="99%" {v=$2; if (v ~ /us$/) {sub("us","",v); v=v/1000} else if (v ~ /ms$/) {sub("ms","",v)} else if (v ~ /s$/) {sub("s","",v); v=v*1000}; print v}' <<<"$out")
  non2xx=$(awk '/Non-2xx/ {print $5}' <<<"$out")
  printf '%-34s %10.0f req/s   p99 %7.2f ms   non-2xx/3xx %s\n' "$name" "$rps" "$p99" "${non2xx:-0}"
  awk -v rps="$rps" -v p="$p99" -v n="$total" -v b=$((b1 - b0)) -v r=$((r1 - r0)) -v hz="$TICKS" \
    'BEGIN { printf "%s %s %s %.2f %.2f\n", rps, p, n, b * 1e6 / hz / n, r * 1e6 / hz / n }' >"$WORK/$name"
}
TICKS=$(getconf CLK_TCK)

echo "bench-gateway: $(nproc) cores, wrk -t2 -c$CONNS -d${SECONDS_EACH}s, Redis $(redis-server --version | awk '{print $3}')"
first_mode=${MODES%% *}
start_gateway "$first_mode"
run_wrk healthz "http://127.0.0.1:$GPORT/healthz"
run_wrk sold_out "http://127.0.0.1:$GPORT/v1/sales/2/purchases" "$WORK/buy.lua"
stop_gateway
for m in $MODES; do
  start_gateway "$m"
  run_wrk "purchase_redis_threads_$m" "http://127.0.0.1:$GPORT/v1/sales/1/purchases" "$WORK/buy.lua"
  stop_gateway
done
# Buyer tokens: the same purchases with SECKILL_AUTH=none, HS256 and EdDSA
# tokens, a distinct token per request (no verified token is met twice,
# so every request is a signature check).
TOKENS_N=${BENCH_TOKENS_N:-$(( 45000 * SECONDS_EACH ))}
for alg in HS256 EdDSA; do
  "$RECONCILER" token keygen --alg "$alg" --kid "bench-$alg" --out "$WORK/sign-$alg.jwks" \
    --public "$WORK/gw-$alg.jwks" >/dev/null
  "$RECONCILER" token issue --user "t$alg$(date +%s)" --key "$WORK/sign-$alg.jwks" --ttl 1h \
    --count "$TOKENS_N" >"$WORK/tokens-$alg.txt"
done
start_gateway "$first_mode"
run_wrk auth_none "http://127.0.0.1:$GPORT/v1/sales/1/purchases" "$WORK/buy.lua"
stop_gateway
for alg in HS256 EdDSA; do
  start_gateway "$first_mode" "$WORK/gw-$alg.jwks"
  BENCH_TOKENS="$WORK/tokens-$alg.txt" run_wrk "auth_$alg" \
    "http://127.0.0.1:$GPORT/v1/sales/1/purchases" "$WORK/tokens.lua"
  stop_gateway
done
echo "sale 1 units reserved: $(( 1000000000 - $(rc GET 'seckill:{sale:1}:stock') ))"

# The reservation script, loaded as the gateway loads it.
lua_src=$(awk '/^pub const RESERVE_LUA: &str = r#"/{f=1; next} /^"#;/{f=0} f' common/src/reservation.rs)
sha=$(rc SCRIPT LOAD "$lua_src")
rb_out=$(redis-benchmark -p "$RPORT" -c 50 -n $(( 20000 * SECONDS_EACH )) -r 1000000000 -q \
  EVALSHA "$sha" 6 "seckill:{sale:1}:meta" "seckill:{sale:1}:stock" "seckill:{sale:1}:buyers" \
  "seckill:{sale:1}:flow" "seckill:{sale:1}:status" "seckill:{sale:1}:queue" \
  "rb-__rand_int__" "rid__rand_int__" 1 | tr '\r' '\n' | grep -v '^$' | tail -1)
rb_rps=$(grep -oE '[0-9.]+ requests per second' <<<"$rb_out" | awk '{print $1}')
rb_p99=$(grep -oE 'p50=[0-9.]+ msec' <<<"$rb_out" | head -1 || true)
printf '%-34s %10.0f req/s   (%s)\n' "redis-benchmark EVALSHA -c50" "$rb_rps" "$rb_out"

best=""; best_rps=0
for m in $MODES; do
  r=$(awk '{print $1}' "$WORK/purchase_redis_threads_$m")
  if awk -v a="$r" -v b="$best_rps" 'BEGIN{exit !(a>b)}'; then best=$m; best_rps=$r; fi
done
hz=$(awk '{print $1}' "$WORK/healthz")
so=$(awk '{print $1}' "$WORK/sold_out")
p99=$(awk '{print $2}' "$WORK/purchase_redis_threads_$best")
hz_busy=$(awk '{print $4}' "$WORK/healthz")
p_redis=$(awk '{print $5}' "$WORK/purchase_redis_threads_$best")
echo
echo "CPU per request (whole machine busy time / requests; wrk, gateway and Redis share $(nproc) cores):"
printf '  healthz, everything                %6.1f us\n' "$hz_busy"
printf '  purchase, everything               %6.1f us\n' "$(awk '{print $4}' "$WORK/purchase_redis_threads_$best")"
printf '  purchase, Redis alone              %6.1f us\n' "$p_redis"
awk -v h="$hz_busy" -v r="$p_redis" 'BEGIN {
  printf "  => a purchase does a health check'"'"'s work plus the Redis script, so on these\n"
  printf "     shared cores purchase / healthz cannot exceed %.2f / (%.2f + %.2f) = %.2f\n", h, h, r, h / (h + r)
}'
echo
echo "ratios (best purchase mode: SECKILL_GATEWAY_REDIS_THREADS=$best):"
awk -v p="$best_rps" -v h="$hz" -v s="$so" -v r="$rb_rps" -v q="$p99" 'BEGIN {
  printf "  purchase / healthz ceiling        %.2f  (target >= 0.8)\n", p/h
  printf "  purchase / redis-benchmark EVALSHA %.2f  (target >= 1.0)\n", p/r
  printf "  sold-out / healthz ceiling        %.2f  (target >= 0.9)\n", s/h
  printf "  purchase p99 at 64 connections    %.2f ms (target <= 5)\n", q
}'
an=$(awk '{print $1}' "$WORK/auth_none"); ah=$(awk '{print $1}' "$WORK/auth_HS256"); ae=$(awk '{print $1}' "$WORK/auth_EdDSA")
echo
echo "buyer tokens, a distinct token per request (SECKILL_GATEWAY_REDIS_THREADS=$first_mode):"
awk -v n="$an" -v h="$ah" -v e="$ae" 'BEGIN {
  printf "  HS256 / SECKILL_AUTH=none         %.2f  (target >= 0.9)\n", h/n
  printf "  EdDSA / SECKILL_AUTH=none         %.2f  (target >= 0.8)\n", e/n
}'
