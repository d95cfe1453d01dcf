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
#   5. POST purchase, plentiful stock, SECKILL_AUTH=none / HS256 / EdDSA /
#      RS256 / ES256 tokens (the last two as an identity provider signs
#      them: gateway/examples/provider_tokens.rs), a distinct token (and
#      user) per request, default Redis mode:
#      the cost of verifying buyer tokens, as ratios to none; and with
#      HS256 / EdDSA tokens the sold-out sale and a sale not yet open, in
#      a fresh gateway (none of the tokens is verified there), as ratios
#      to that gateway's own health check;
#   6. RS256 as a provider signs them: the first wave, a crowd of distinct
#      buyers on a sale of 100,000 units (every request verified); the same
#      crowd's retries with the tokens of buyers who bought (each token in
#      the gateway's memory: no signature check); the same tokens on the
#      sold-out sale (no check) beside that gateway's health check; and
#      each algorithm's verify cost (gateway CPU per purchase minus
#      SECKILL_AUTH=none's) beside `openssl speed`'s verify on this
#      machine, as a ratio;
#   4. redis-benchmark, 50 clients, EVALSHA of the same reservation script
#      with distinct users, unpipelined: the one-round-trip Redis ceiling;
# then the ratios against the targets (docs/PERFORMANCE.md).
#
# Honest figures: every wrk thread formats its requests before
# any thread sends (a barrier in the Lua script), and every rate printed is
# printed twice: by the load tool, and by the server's own count over the
# server-side interval (scripts/lib/bench_watch.py samples the gateway's
# request counters and the units taken in Redis every 20 ms). A figure whose
# two rates differ by more than 5 % is reported as a MISMATCH and the script
# exits 1 at the end. The ratios are computed from the server's counts. Each
# purchase row also prints the reservations per Redis round trip (group
# commit) and Redis's own microseconds per EVALSHA (INFO commandstats).
#
# A private redis-server (AOF on, appendfsync everysec, automatic AOF
# rewrites off: a rewrite forks Redis, and on 2 cores its child takes a
# core for seconds, which tripled the purchase p99 in the runs it hit; see
# docs/OPERATIONS.md) on a free port; the machine's Redis is never
# touched. Needs wrk, redis-server and python3 (the first two installed
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
cargo build --release -q -p seckill-gateway -p seckill-reconciler -p seckill-common --bins --example lua_script
TARGET=${CARGO_TARGET_DIR:-target}
GW=${BENCH_GATEWAY:-$TARGET/release/seckill-gateway}
RECONCILER=$TARGET/release/seckill-reconciler

. scripts/lib/bench_redis.sh

# Sale 1: plentiful stock; sale 2: sold out. Open for an hour. Sale 3:
# opens in an hour (not yet open).
load_sale 1 1000000000
load_sale 2 0
rc HSET "seckill:{sale:3}:meta" total_stock 100 starts_at_ms "$end_ms" \
  ends_at_ms "$(( end_ms + 3600000 ))" >/dev/null
rc SET "seckill:{sale:3}:stock" 100 >/dev/null
rc SADD seckill:sales 3 >/dev/null
# Sale 4: the first wave's 100,000 units.
load_sale 4 100000

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

. scripts/lib/wrk_buy.sh
write_wrk_buy "$WORK"
# Tokens: one per request, read from a file (one a line); thread t sends
# lines t, t+threads, ... (distinct users, every one new).
{ cat <<'LUA'
function fill(reqs)
  local i, count, total = 0, 0, tonumber(os.getenv("BENCH_WRK_THREADS"))
  for line in io.lines(os.getenv("BENCH_TOKENS")) do
    if i % total == tid then
      count = count + 1
      reqs[count] = wrk.format("POST", nil, {["Content-Type"] = "application/json",
        ["Authorization"] = "Bearer " .. line}, '{}')
    end
    i = i + 1
  end
  return count
end
LUA
  cat "$WORK/barrier.lua"; } >"$WORK/tokens.lua"
export BENCH_WRK_THREADS=2
export BENCH_REQS_PER_THREAD=${BENCH_REQS_PER_THREAD:-$(( 40000 * SECONDS_EACH ))}

# CPU time (clock ticks) of a process, and of this shell's finished
# children (wrk, the watcher): `times` must run in this shell, not in $(...).
proc_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# Context switches (voluntary: a thread went to sleep, to be woken) of all
# threads of a process: the gateway's wake-ups.
ctx_switches() {
  cat /proc/"$1"/task/*/status 2>/dev/null | awk '/^voluntary_ctxt_switches/ { s += $2 } END { print s + 0 }'
}
children_times() { times >"$WORK/times"; }
times_us() {
  awk 'NR == 2 { t = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); t += a[1] * 60 + a[2] }; printf "%.0f\n", t * 1e6 }' "$WORK/times"
}

# The server's own count (scripts/lib/bench_watch.py) around a run:
# watch_start [GATEWAY_PORT|-]; ...; watch_stop -> $WORK/watch, lines
# "NAME DELTA FIRST_S LAST_S".
watch_start() {
  python3 scripts/lib/bench_watch.py "${1:-$GPORT}" "$RPORT" "seckill:{sale:${BENCH_WATCH_SALE:-1}}:stock" "$WORK/watch" &
  WATCH_PID=$!
  sleep 0.3
}
watch_stop() {
  sleep 0.1
  kill -TERM "$WATCH_PID"; wait "$WATCH_PID" || true
}
# watched NAME: "DELTA RATE_PER_S" of that quantity over its server-side
# interval (0 0 when it did not move).
watched() {
  awk -v n="$1" '$1 == n { d = $2; r = $2 / ($4 - $3) } END { printf "%d %.0f\n", d, r }' "$WORK/watch"
}
# Redis's own cost of the reservation script since the last RESETSTAT:
# "X us per EVALSHA, Y us per reservation" (a group-commit call carries
# every buyer of its batch's bucket; UNITS: the units taken meanwhile).
evalsha_usec() {
  rc INFO commandstats | tr -d '\r' | awk -F'[=,]' -v u="$1" '/^cmdstat_evalsha:/ {
    printf "%s us per EVALSHA, %.2f us per reservation", $6, (u > 0 ? $4 / u : 0) }'
}
MISMATCHES=0
# check WHAT TOOL_RATE SERVER_RATE: the two within 5 %, else a loud line and
# a failed run at the end.
check() {
  if ! awk -v a="$2" -v b="$3" 'BEGIN { exit !(b > 0 && a / b <= 1.05 && a / b >= 0.95) }'; then
    echo "  !!! MISMATCH: $1: $2/s by the load tool, $3/s by the server's count (> 5 % apart)" >&2
    MISMATCHES=$(( MISMATCHES + 1 ))
  fi
}

# run_wrk NAME URL SERIES [LUA]: runs wrk, checks its rate against the
# gateway's count of SERIES (gw:ROUTE:STATUS) and, for a purchase (202),
# the units taken in Redis; prints "NAME rps p99_ms" and keeps in $WORK/NAME
# "rps p99_ms answers cpu_us_per_answer redis_cpu_us_per_answer server_rps
# reservations_per_round_trip gateway_cpu_us_per_answer" (answers and rates
# by the server's count).
run_wrk() {
  local name=$1 url=$2 series=$3 lua=${4:-}
  local out b0 r0 b1 r1
  export BENCH_BARRIER=$WORK/barrier-$name
  mkdir -p "$BENCH_BARRIER"
  rc CONFIG RESETSTAT >/dev/null
  watch_start
  local c0 c1 g0 g1
  children_times; c0=$(times_us)
  local w0 w1
  g0=$(proc_ticks "$GW_PID"); r0=$(proc_ticks "$R_PID"); w0=$(ctx_switches "$GW_PID")
  if [ -n "$lua" ]; then
    out=$(wrk -t$BENCH_WRK_THREADS -c"${WRK_CONNS:-$CONNS}" -d"${SECONDS_EACH}s" --latency -s "$lua" "$url")
  else
    out=$(wrk -t$BENCH_WRK_THREADS -c"${WRK_CONNS:-$CONNS}" -d"${SECONDS_EACH}s" --latency "$url")
  fi
  g1=$(proc_ticks "$GW_PID"); r1=$(proc_ticks "$R_PID"); w1=$(ctx_switches "$GW_PID")
  watch_stop
  children_times; c1=$(times_us)
  local rps p99 non2xx total srv_n srv_rps units_n units_rps batch
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
  total=$(awk '/requests in/ {print $1}' <<<"$out")
  p99=$(awk '$1=="99%" {v=$2; if (v ~ /us$/) {sub("us","",v); v=v/1000} else if (v ~ /ms$/) {sub("ms","",v)} else if (v ~ /s$/) {sub("s","",v); v=v*1000}; print v}' <<<"$out")
  non2xx=$(awk '/Non-2xx/ {print $5}' <<<"$out")
  read -r srv_n srv_rps <<<"$(watched "$series")"
  batch=$(awk '$1 == "gw:pipelined" { p = $2 } $1 == "gw:pipelines" { n = $2 }
    END { if (n > 0) printf "%.1f", p / n; else print "-" }' "$WORK/watch")
  printf '%-34s %10.0f req/s   p99 %7.2f ms   non-2xx/3xx %s\n' "$name" "$rps" "$p99" "${non2xx:-0}"
  printf '%-34s %10.0f req/s   server: %s answers %s, %.2f gateway wake-ups per answer\n' "" "$srv_rps" "$srv_n" "$series" \
    "$(awk -v w=$((w1 - w0)) -v n="$srv_n" 'BEGIN { print (n > 0 ? w / n : 0) }')"
  check "$name" "$rps" "$srv_rps"
  if [ "${series##*:}" = 202 ]; then
    read -r units_n units_rps <<<"$(watched units)"
    printf '%-34s %10.0f units/s in Redis (%s units), %s reservations per Redis round trip, %s\n' \
      "" "$units_rps" "$units_n" "$batch" "$(evalsha_usec "$units_n")"
    check "$name (units in Redis)" "$rps" "$units_rps"
  fi
  # CPU per answer: gateway + Redis + wrk (and the watcher), by their own
  # CPU times, so other work on the machine does not count.
  awk -v rps="$rps" -v p="$p99" -v n="$srv_n" -v g=$((g1 - g0)) -v r=$((r1 - r0)) -v hz="$TICKS" \
    -v c=$((c1 - c0)) -v s="$srv_rps" -v bt="$batch" \
    'BEGIN { printf "%s %s %s %.2f %.2f %s %s %.2f\n", rps, p, n, ((g + r) * 1e6 / hz + c) / n, r * 1e6 / hz / n, s, bt, g * 1e6 / hz / n }' >"$WORK/$name"
}
TICKS=$(getconf CLK_TCK)

echo "bench-gateway: $(nproc) cores, wrk -t2 -c$CONNS -d${SECONDS_EACH}s, Redis $(redis-server --version | awk '{print $3}')"
first_mode=${MODES%% *}
start_gateway "$first_mode"
run_wrk healthz "http://127.0.0.1:$GPORT/healthz" gw:healthz:200
run_wrk sold_out "http://127.0.0.1:$GPORT/v1/sales/2/purchases" gw:purchase:410 "$WORK/buy.lua"
stop_gateway
for m in $MODES; do
  start_gateway "$m"
  run_wrk "purchase_redis_threads_$m" "http://127.0.0.1:$GPORT/v1/sales/1/purchases" gw:purchase:202 "$WORK/buy.lua"
  stop_gateway
done
# Many connections (the p99 target at 1,000 keep-alive connections; tiny_http
# runs a thread per connection): the gateway's RSS with MANY idle
# connections open, per connection, then purchases over MANY connections.
MANY=${BENCH_MANY_CONNS:-1000}
start_gateway "$first_mode"
rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
rss0=$(rss_kb "$GW_PID")
coproc IDLE { exec python3 scripts/lib/bench_idle.py "$GPORT" "$MANY"; }
read -r _ <&"${IDLE[0]}"
sleep 0.5
rss1=$(rss_kb "$GW_PID")
kill -TERM "$IDLE_PID"; wait "$IDLE_PID" 2>/dev/null || true
printf '%-34s %10.1f KiB RSS per idle keep-alive connection (%d open: %d -> %d KiB)\n' \
  "idle_connections_$MANY" "$(awk -v a="$rss0" -v b="$rss1" -v n="$MANY" 'BEGIN { print (b - a) / n }')" \
  "$MANY" "$rss0" "$rss1"
WRK_CONNS=$MANY run_wrk "purchase_${MANY}_connections" "http://127.0.0.1:$GPORT/v1/sales/1/purchases" gw:purchase:202 "$WORK/buy.lua"
# The same MANY connections, each buying at a pace instead of as fast as it
# is answered: all of them together offer BENCH_PACED_SHARE (default 0.5) of
# the purchase rate measured at 64 connections above. Each connection waits
# a random 0-2P ms (mean P) before each of its purchases, the first one
# included, so they do not start in one burst. As fast as answered, MANY
# connections are MANY purchases always in flight, and by Little's law
# their mean latency is MANY / the rate (1,000 / 10,000 per s = 100 ms),
# whatever the gateway does; paced, the latency is the gateway's own.
cap_rps=$(awk '{ print $6 }' "$WORK/purchase_redis_threads_$first_mode")
pace_ms=$(awk -v n="$MANY" -v r="$cap_rps" -v s="${BENCH_PACED_SHARE:-0.5}" 'BEGIN { printf "%d", n * 1000 / (r * s) }')
{ cat "$WORK/buy.lua"; echo "function delay() return math.random(0, 2 * $pace_ms) end"; } >"$WORK/paced.lua"
echo "paced: $MANY connections, each one purchase every ${pace_ms} ms on average (offered $(awk -v n="$MANY" -v p="$pace_ms" 'BEGIN { printf "%.0f", n * 1000 / p }')/s)"
WRK_CONNS=$MANY run_wrk "purchase_${MANY}_connections_paced" "http://127.0.0.1:$GPORT/v1/sales/1/purchases" gw:purchase:202 "$WORK/paced.lua"
stop_gateway
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
# RS256 and ES256 as an identity provider signs them (token keygen makes
# no RSA or EC key): a fixed key of the gateway's examples, the public
# JWKS as the gateway's key file. 30,000 per second of a run: more than
# the gateway takes (an RS256 signature costs the signer about a
# millisecond, so the tokens take a while to make). A token met twice is a
# 409 (the buyer bought), which the MISMATCH check reports;
# BENCH_PROVIDER_TOKENS_N sets the count.
PROVIDER_N=${BENCH_PROVIDER_TOKENS_N:-$(( 30000 * SECONDS_EACH ))}
for alg in RS256 ES256; do
  cargo run --release -q -p seckill-gateway --example provider_tokens -- \
    "$alg" "$PROVIDER_N" "t$alg$(date +%s)" "$WORK/gw-$alg.jwks" >"$WORK/tokens-$alg.txt"
done
start_gateway "$first_mode"
run_wrk auth_none "http://127.0.0.1:$GPORT/v1/sales/1/purchases" gw:purchase:202 "$WORK/buy.lua"
stop_gateway
for alg in RS256 ES256; do
  start_gateway "$first_mode" "$WORK/gw-$alg.jwks"
  BENCH_TOKENS="$WORK/tokens-$alg.txt" run_wrk "auth_$alg" \
    "http://127.0.0.1:$GPORT/v1/sales/1/purchases" gw:purchase:202 "$WORK/tokens.lua"
  stop_gateway
done
for alg in HS256 EdDSA; do
  start_gateway "$first_mode" "$WORK/gw-$alg.jwks"
  BENCH_TOKENS="$WORK/tokens-$alg.txt" run_wrk "auth_$alg" \
    "http://127.0.0.1:$GPORT/v1/sales/1/purchases" gw:purchase:202 "$WORK/tokens.lua"
  stop_gateway
  # The crowd after the sell-out, and before the opening, with tokens: a
  # fresh gateway (no token in its memory), a distinct token per request,
  # beside the health check of the same gateway process. These answers
  # are public facts: no signature is checked (but by the first purchase
  # of sale 3, verified before the gateway has read its window).
  start_gateway "$first_mode" "$WORK/gw-$alg.jwks"
  run_wrk "healthz_$alg" "http://127.0.0.1:$GPORT/healthz" gw:healthz:200
  BENCH_TOKENS="$WORK/tokens-$alg.txt" run_wrk "sold_out_$alg" \
    "http://127.0.0.1:$GPORT/v1/sales/2/purchases" gw:purchase:410 "$WORK/tokens.lua"
  BENCH_TOKENS="$WORK/tokens-$alg.txt" run_wrk "not_open_$alg" \
    "http://127.0.0.1:$GPORT/v1/sales/3/purchases" gw:purchase:403 "$WORK/tokens.lua"
  stop_gateway
done
# The paced purchases at MANY connections again, with EdDSA tokens (a
# distinct token per request of new buyers, every one verified), offered
# BENCH_PACED_SHARE of the EdDSA purchase rate measured above.
ed_rps=$(awk '{ print $6 }' "$WORK/auth_EdDSA")
pace_ed=$(awk -v n="$MANY" -v r="$ed_rps" -v s="${BENCH_PACED_SHARE:-0.5}" 'BEGIN { printf "%d", n * 1000 / (r * s) }')
{ cat "$WORK/tokens.lua"; echo "function delay() return math.random(0, 2 * $pace_ed) end"; } >"$WORK/paced-tokens.lua"
echo "paced, EdDSA tokens: $MANY connections, each one purchase every ${pace_ed} ms on average (offered $(awk -v n="$MANY" -v p="$pace_ed" 'BEGIN { printf "%.0f", n * 1000 / p }')/s)"
"$RECONCILER" token issue --user "p$(date +%s)" --key "$WORK/sign-EdDSA.jwks" --ttl 1h \
  --count "$(( 10000 * SECONDS_EACH ))" >"$WORK/tokens-EdDSA-paced.txt"
start_gateway "$first_mode" "$WORK/gw-EdDSA.jwks"
BENCH_TOKENS="$WORK/tokens-EdDSA-paced.txt" WRK_CONNS=$MANY run_wrk "purchase_${MANY}_connections_paced_EdDSA" \
  "http://127.0.0.1:$GPORT/v1/sales/1/purchases" gw:purchase:202 "$WORK/paced-tokens.lua"
stop_gateway
# RS256's first wave: distinct buyers on sale 4 (100,000 units), every
# request verified; then the retries of buyers who bought, with the same
# tokens (the first 1,000, all sent in the first wave): answered 409 with
# each token from the gateway's memory; then, in a fresh gateway, its health
# check and the same crowd on the sold-out sale 2 (no check). The buyers'
# rate limit is off in the first gateway, so that every retry reaches the
# sale (409) rather than the limit (429).
SECKILL_GATEWAY_BUYER_RATE=0 start_gateway "$first_mode" "$WORK/gw-RS256.jwks"
BENCH_WATCH_SALE=4 BENCH_TOKENS="$WORK/tokens-RS256.txt" run_wrk first_wave_RS256 \
  "http://127.0.0.1:$GPORT/v1/sales/4/purchases" gw:purchase:202 "$WORK/tokens.lua"
head -n 1000 "$WORK/tokens-RS256.txt" >"$WORK/retry-RS256.txt"
BENCH_WATCH_SALE=4 BENCH_TOKENS="$WORK/retry-RS256.txt" run_wrk retry_RS256 \
  "http://127.0.0.1:$GPORT/v1/sales/4/purchases" gw:purchase:409 "$WORK/tokens.lua"
stop_gateway
start_gateway "$first_mode" "$WORK/gw-RS256.jwks"
run_wrk healthz_RS256 "http://127.0.0.1:$GPORT/healthz" gw:healthz:200
BENCH_TOKENS="$WORK/tokens-RS256.txt" run_wrk sold_out_RS256 \
  "http://127.0.0.1:$GPORT/v1/sales/2/purchases" gw:purchase:410 "$WORK/tokens.lua"
stop_gateway
# openssl speed's verify on this machine, µs (its own CPU time), for the
# ratios below.
openssl_us() { # rsa2048|ecdsap256|ed25519
  openssl speed -seconds "${BENCH_OPENSSL_SECONDS:-3}" "$1" 2>/dev/null |
    awk '/verify\/s/ { getline; printf "%.2f\n", 1e6 / $NF; exit }'
}
OSSL_RSA=$(openssl_us rsa2048); OSSL_EC=$(openssl_us ecdsap256); OSSL_ED=$(openssl_us ed25519)
OSSL_RSA=${OSSL_RSA:--}; OSSL_EC=${OSSL_EC:--}; OSSL_ED=${OSSL_ED:--}
echo "sale 1 units reserved: $(( 1000000000 - $(rc GET 'seckill:{sale:1}:stock') ))"

# The reservation script, loaded as the gateway loads it.
lua_src=$("$TARGET/release/examples/lua_script" reserve)
sha=$(rc SCRIPT LOAD "$lua_src")
rc CONFIG RESETSTAT >/dev/null
watch_start -
rb_out=$(redis-benchmark -p "$RPORT" -c 50 -n $(( 20000 * SECONDS_EACH )) -r 1000000000 -q \
  EVALSHA "$sha" 6 "seckill:{sale:1}:meta" "seckill:{sale:1}:stock" "seckill:{sale:1}:buyers" \
  "seckill:{sale:1}:flow" "seckill:{sale:1}:status" "seckill:{sale:1}:queue" \
  "rb-__rand_int__" "rid__rand_int__" 1 | tr '\r' '\n' | grep -v '^$' | tail -1)
watch_stop
rb_rps=$(grep -oE '[0-9.]+ requests per second' <<<"$rb_out" | awk '{print $1}')
read -r rb_units rb_srv <<<"$(watched units)"
printf '%-34s %10.0f req/s   (%s)\n' "redis-benchmark EVALSHA -c50" "$rb_rps" "$rb_out"
printf '%-34s %10.0f units/s in Redis (%s units), %s\n' "" "$rb_srv" "$rb_units" "$(evalsha_usec "$rb_units")"
check "redis-benchmark EVALSHA (units in Redis)" "$rb_rps" "$rb_srv"

best=""; best_rps=0
for m in $MODES; do
  r=$(awk '{print $6}' "$WORK/purchase_redis_threads_$m")
  if awk -v a="$r" -v b="$best_rps" 'BEGIN{exit !(a>b)}'; then best=$m; best_rps=$r; fi
done
hz=$(awk '{print $6}' "$WORK/healthz")
so=$(awk '{print $6}' "$WORK/sold_out")
p99=$(awk '{print $2}' "$WORK/purchase_redis_threads_$best")
hz_busy=$(awk '{print $4}' "$WORK/healthz")
p_redis=$(awk '{print $5}' "$WORK/purchase_redis_threads_$best")
echo
echo "CPU per answer (CPU time of wrk + gateway + Redis / the server's count; they share $(nproc) cores):"
printf '  healthz, everything                %6.1f us (gateway alone %.1f us)\n' "$hz_busy" "$(awk '{print $8}' "$WORK/healthz")"
printf '  sold-out, everything               %6.1f us (gateway alone %.1f us)\n' "$(awk '{print $4}' "$WORK/sold_out")" "$(awk '{print $8}' "$WORK/sold_out")"
printf '  purchase, everything               %6.1f us (gateway alone %.1f us)\n' "$(awk '{print $4}' "$WORK/purchase_redis_threads_$best")" "$(awk '{print $8}' "$WORK/purchase_redis_threads_$best")"
printf '  purchase, Redis alone              %6.1f us\n' "$p_redis"
bound=$(awk -v h="$hz_busy" -v r="$p_redis" 'BEGIN { printf "%.3f", h / (h + r) }')
awk -v h="$hz_busy" -v r="$p_redis" -v b="$bound" 'BEGIN {
  printf "  => a purchase does a health check'"'"'s work plus the Redis script, so on these\n"
  printf "     shared cores purchase / healthz cannot exceed %.2f / (%.2f + %.2f) = %.2f\n", h, h, r, b
}'
echo
echo "ratios of the server's counts (best purchase mode: SECKILL_GATEWAY_REDIS_THREADS=$best):"
# What a purchase can reach against redis-benchmark on these cores: at most
# every core busy with a health check's work plus Redis's share of one
# reservation, nothing else (NCPU x 1e6 / (healthz_cpu + redis_cpu)).
rbb=$(awk -v h="$hz_busy" -v r="$p_redis" -v n="$(nproc)" -v rb="$rb_srv" 'BEGIN { printf "%.3f", (rb > 0 ? n * 1e6 / (h + r) / rb : 0) }')
awk -v h="$hz_busy" -v r="$p_redis" -v n="$(nproc)" -v rb="$rb_srv" -v b="$rbb" 'BEGIN {
  printf "  => and purchase / redis-benchmark cannot exceed %d x 1e6 / (%.2f + %.2f) / %.0f = %.2f\n", n, h, r, rb, b
}'
# The bound above takes a purchase to cost the load tool what a health
# check costs it. wrk costs more per purchase (its Lua request() per
# request, which the health check does without, and fewer answers per
# wake-up at a purchase's lower rate): the bound counting wrk's own extra
# CPU per purchase too, from the same rows (wrk = everything - gateway -
# Redis), so that what is left is the gateway's.
p_all=$(awk '{print $4}' "$WORK/purchase_redis_threads_$best")
p_gw=$(awk '{print $8}' "$WORK/purchase_redis_threads_$best")
hz_gw=$(awk '{print $8}' "$WORK/healthz")
bound_wrk=$(awk -v h="$hz_busy" -v r="$p_redis" -v pa="$p_all" -v pg="$p_gw" -v hg="$hz_gw" 'BEGIN {
  x = (pa - pg - r) - (h - hg); if (x < 0) x = 0; printf "%.3f", h / (h + r + x) }')
awk -v h="$hz_busy" -v r="$p_redis" -v pa="$p_all" -v pg="$p_gw" -v hg="$hz_gw" -v b="$bound_wrk" 'BEGIN {
  wp = pa - pg - r; wh = h - hg
  printf "  => wrk itself: %.1f us per purchase, %.1f us per health check; counting its\n", wp, wh
  printf "     extra %.1f us too: %.2f / (%.2f + %.2f + %.2f) = %.2f\n", wp - wh, h, h, r, wp - wh, b
}'
awk -v p="$best_rps" -v h="$hz" -v s="$so" -v r="$rb_srv" -v q="$p99" -v b="$bound" -v rbb="$rbb" -v bw="$bound_wrk" \
  -v r1="$(awk '{print $6}' "$WORK/sold_out_HS256")" -v r2="$(awk '{print $6}' "$WORK/sold_out_EdDSA")" \
  -v r3="$(awk '{print $6}' "$WORK/not_open_HS256")" -v r4="$(awk '{print $6}' "$WORK/not_open_EdDSA")" \
  -v h1="$(awk '{print $6}' "$WORK/healthz_HS256")" -v h2="$(awk '{print $6}' "$WORK/healthz_EdDSA")" 'BEGIN {
  split("sold-out, HS256 tokens|sold-out, EdDSA tokens|not yet open, HS256 tokens|not yet open, EdDSA tokens", rows, "|")
  rates[1] = r1; rates[2] = r2; rates[3] = r3; rates[4] = r4
  hzs[1] = h1; hzs[2] = h2; hzs[3] = h1; hzs[4] = h2
  printf "  purchase / healthz ceiling        %.2f  = %.2f x the bound %.2f (target >= 0.9 x the bound)\n", p/h, p/h/b, b
  printf "                                          = %.2f x the bound %.2f counting wrk'"'"'s extra CPU\n", p/h/bw, bw
  printf "  purchase / redis-benchmark EVALSHA %.2f  (target >= 1.3; bound here %.2f, below)\n", (r > 0 ? p/r : 0), rbb
  printf "                                          (bound %.2f counting wrk'"'"'s extra CPU per purchase)\n", rbb * bw / b
  printf "  sold-out / healthz ceiling        %.2f  (target >= 0.9)\n", s/h
  for (i = 1; i <= 4; i++) printf "  %-33s %.2f  (its gateway'"'"'s health check %.0f/s)\n", rows[i] " / healthz", rates[i] / hzs[i], hzs[i]
  printf "  purchase p99 at 64 connections    %.2f ms (target <= 5)\n", q
}'
awk -v q="$(awk '{print $2}' "$WORK/purchase_${MANY}_connections")" -v n="$MANY" \
  -v r="$(awk '{print $6}' "$WORK/purchase_${MANY}_connections")" \
  -v pq="$(awk '{print $2}' "$WORK/purchase_${MANY}_connections_paced")" \
  -v pr="$(awk '{print $6}' "$WORK/purchase_${MANY}_connections_paced")" 'BEGIN {
  printf "  purchase p99 at %d connections  %.2f ms, as fast as answered (Little: mean >= %d / %.0f/s = %.1f ms)\n", n, q, n, r, n * 1000 / r
  printf "  purchase p99 at %d connections  %.2f ms, paced at %.0f/s (target <= 10)\n", n, pq, pr
}'
awk -v q="$(awk '{print $2}' "$WORK/purchase_${MANY}_connections_paced_EdDSA")" -v n="$MANY" \
  -v r="$(awk '{print $6}' "$WORK/purchase_${MANY}_connections_paced_EdDSA")" 'BEGIN {
  printf "  purchase p99 at %d connections  %.2f ms, paced at %.0f/s, EdDSA tokens (target <= 10)\n", n, q, r
}'
an=$(awk '{print $6}' "$WORK/auth_none"); ah=$(awk '{print $6}' "$WORK/auth_HS256"); ae=$(awk '{print $6}' "$WORK/auth_EdDSA")
ar=$(awk '{print $6}' "$WORK/auth_RS256"); as=$(awk '{print $6}' "$WORK/auth_ES256")
echo
echo "buyer tokens, a distinct token per request (SECKILL_GATEWAY_REDIS_THREADS=$first_mode):"
# The same ratios from CPU per purchase (wrk + gateway + Redis), which the
# container's drift between runs moves less than the rates.
cn=$(awk '{print $4}' "$WORK/auth_none"); ch=$(awk '{print $4}' "$WORK/auth_HS256"); ce=$(awk '{print $4}' "$WORK/auth_EdDSA")
cr=$(awk '{print $4}' "$WORK/auth_RS256"); cs=$(awk '{print $4}' "$WORK/auth_ES256")
printf '  gateway alone, CPU per purchase: none %.1f us, HS256 %.1f us, EdDSA %.1f us, RS256 %.1f us, ES256 %.1f us\n' \
  "$(awk '{print $8}' "$WORK/auth_none")" "$(awk '{print $8}' "$WORK/auth_HS256")" "$(awk '{print $8}' "$WORK/auth_EdDSA")" \
  "$(awk '{print $8}' "$WORK/auth_RS256")" "$(awk '{print $8}' "$WORK/auth_ES256")"
awk -v n="$an" -v h="$ah" -v e="$ae" -v r="$ar" -v s="$as" -v cn="$cn" -v ch="$ch" -v ce="$ce" -v cr="$cr" -v cs="$cs" 'BEGIN {
  printf "  HS256 / SECKILL_AUTH=none         %.2f  (target >= 0.9); by CPU per purchase %.1f / %.1f us = %.2f\n", h/n, cn, ch, cn/ch
  printf "  EdDSA / SECKILL_AUTH=none         %.2f  (target >= 0.58); by CPU per purchase %.1f / %.1f us = %.2f\n", e/n, cn, ce, cn/ce
  printf "  RS256 / SECKILL_AUTH=none         %.2f  (target >= 0.6); by CPU per purchase %.1f / %.1f us = %.2f\n", r/n, cn, cr, cn/cr
  printf "  ES256 / SECKILL_AUTH=none         %.2f  (target >= 0.4); by CPU per purchase %.1f / %.1f us = %.2f\n", s/n, cn, cs, cn/cs
}'
# Each algorithm's verify cost: the gateway's CPU per purchase with a
# distinct token minus without a token, beside openssl speed's verify.
gn=$(awk '{print $8}' "$WORK/auth_none")
echo "verify cost (gateway CPU per purchase - SECKILL_AUTH=none's) beside openssl speed's verify, this machine:"
for row in "HS256 - auth_HS256" "EdDSA $OSSL_ED auth_EdDSA" "RS256 $OSSL_RSA auth_RS256" \
  "ES256 $OSSL_EC auth_ES256" "RS256-first-wave $OSSL_RSA first_wave_RS256"; do
  set -- $row
  awk -v a="$1" -v o="$2" -v g="$(awk '{print $8}' "$WORK/$3")" -v n="$gn" 'BEGIN {
    v = g - n
    if (o == "-" || o == "") printf "  %-17s %7.1f us\n", a, v
    else printf "  %-17s %7.1f us   openssl %6.1f us   ratio %.2f (target <= 1.5 for RS256, ES256)\n", a, v, o, v / o
  }'
done
fw=$(awk '{print $6}' "$WORK/first_wave_RS256")
awk -v fw="$fw" -v n="$an" -v rt="$(awk '{print $8}' "$WORK/retry_RS256")" -v hs="$(awk '{print $8}' "$WORK/auth_HS256")" \
  -v so="$(awk '{print $6}' "$WORK/sold_out_RS256")" -v hz="$(awk '{print $6}' "$WORK/healthz_RS256")" 'BEGIN {
  printf "  RS256 first wave (100,000 units) / SECKILL_AUTH=none  %.2f  (%.0f/s)\n", fw / n, fw
  printf "  RS256 retry (token in memory), gateway CPU per answer %.1f us vs HS256 distinct %.1f us: %.2f (target <= 1)\n", rt, hs, rt / hs
  printf "  sold-out, RS256 tokens / healthz  %.2f  (target >= 0.9; its gateway'"'"'s health check %.0f/s)\n", so / hz, hz
}'
if [ "$MISMATCHES" -gt 0 ]; then
  echo "bench-gateway: $MISMATCHES figure(s) of the load tool disagree with the server's count by more than 5 %: not trustworthy" >&2
  exit 1
fi
