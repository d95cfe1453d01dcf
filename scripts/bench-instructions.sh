#!/usr/bin/env bash
# Counts the gateway's instructions per request (docs/PERFORMANCE.md,
# "Instructions per request"; counts do not drift with load): the release gateway runs under `valgrind
# --tool=callgrind`, and for a fixed number of requests of each kind
# (BENCH_REQUESTS, default 2000, over BENCH_CONNS keep-alive connections, default 4, from
# scripts/lib/bench_client.py) the instructions the whole gateway process
# executed (every thread: connection threads, group-commit Redis threads)
# are read from a callgrind dump taken right after them, then divided by
# the requests. Kinds: GET /healthz; a purchase with plentiful stock
# (SECKILL_AUTH=none, a distinct user each, group commit); a purchase
# answered sold-out from memory; then, on a gateway with SECKILL_AUTH=jwt,
# the same purchase with a distinct HS256 and a distinct EdDSA token each.
# Prints instructions per request of each kind and the ratios (target:
# purchase <= 1.5 x health check). Then the release worker under callgrind
# drains the order messages those purchases queued, into a database
# seckill_demo_bench_instructions (dropped before and after; the account of
# scripts/test.sh), and its instructions per message are printed. Machine
# load does not move these
# figures (wall-clock benches do on 2 shared cores): they are the
# regression guard quoted with every performance change.
#
# A private redis-server (scripts/lib/bench_redis.sh); the machine's Redis
# is never touched. Needs valgrind (installed with apt-get when missing).
# Usage: scripts/bench-instructions.sh (BENCH_GATEWAY=path: another build;
# BENCH_KEEP=dir keeps each kind's dump there, for callgrind_annotate).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/services.sh

ensure_redis_server
ensure_package valgrind valgrind
ensure_package redis-cli redis-tools

N=${BENCH_REQUESTS:-2000}
CONNS=${BENCH_CONNS:-4}
WARM=100
cargo build --release -q -p seckill-gateway -p seckill-reconciler -p seckill-worker
TARGET=${CARGO_TARGET_DIR:-target}
GW=${BENCH_GATEWAY:-$TARGET/release/seckill-gateway}
RECONCILER=$TARGET/release/seckill-reconciler

. scripts/lib/bench_redis.sh
. scripts/lib/private.sh
# Sale 1 in MySQL too (its messages are the worker's phase), loaded into
# the private Redis by `sale create`; sale 2 sold out, in Redis only.
ensure_mysql_test_account   # exports SECKILL_TEST_MYSQL_URL
DB=seckill_demo_bench_instructions
export SECKILL_MYSQL_URL="${SECKILL_TEST_MYSQL_URL%/}/$DB"
export SECKILL_REDIS_URL="redis://127.0.0.1:$RPORT/"
# shellcheck disable=SC2046 # the client's arguments are separate words
mysql_bench() { mariadb $(mysql_client_args "$SECKILL_TEST_MYSQL_URL") -N "$@"; }
mysql_bench -e "DROP DATABASE IF EXISTS $DB"
"$RECONCILER" migrate >/dev/null
"$RECONCILER" sale create --sku bench --stock 100000000 --starts-at now --ends-at now+2h >/dev/null 2>&1
load_sale 2 0

start_gateway() { # NAME [KEY_FILE]
  local auth=none keys=""
  if [ -n "${2:-}" ]; then auth=jwt; keys=$2; fi
  SECKILL_LISTEN=127.0.0.1:$GPORT SECKILL_REDIS_URL=redis://127.0.0.1:$RPORT/ \
    SECKILL_AUTH=$auth SECKILL_AUTH_KEYS=$keys RUST_LOG=warn \
    valgrind --tool=callgrind --compress-strings=no --compress-pos=no \
    --callgrind-out-file="$WORK/cg-$1.out" "$GW" \
    2>"$WORK/valgrind-$1.log" &
  GW_PID=$!
  for _ in $(seq 600); do port_open 127.0.0.1 "$GPORT" && break; sleep 0.1; done
  CG_NAME=$1
}
stop_gateway() {
  kill -TERM "$GW_PID"; wait "$GW_PID" || true; GW_PID=""
}
# The instructions (Ir) of the last dump of the running gateway.
last_dump_ir() {
  local f
  f=$(ls -t "$WORK/cg-$CG_NAME.out".* | head -1)
  awk '/^(summary|totals):/ { print $2; exit }' "$f"
}
# phase NAME KIND EXPECTED_STATUS [TOKEN_FILE]: warms up (WARM requests of
# KIND, not counted), zeroes callgrind's counters, sends N requests, dumps,
# and prints and keeps in $WORK/ir-NAME the instructions per request.
phase() {
  local name=$1 kind=$2 status=$3 tokens=${4:-}
  local warm_tokens="" main_tokens=""
  if [ -n "$tokens" ]; then
    head -n "$WARM" "$tokens" >"$WORK/warm-$name"; warm_tokens=$WORK/warm-$name
    tail -n +"$(( WARM + 1 ))" "$tokens" >"$WORK/main-$name"; main_tokens=$WORK/main-$name
  fi
  python3 scripts/lib/bench_client.py "$GPORT" "$kind" "$WARM" "$CONNS" "$status" $warm_tokens >/dev/null
  callgrind_control -z "$GW_PID" >/dev/null 2>&1
  local answers
  answers=$(python3 scripts/lib/bench_client.py "$GPORT" "$kind" "$N" "$CONNS" "$status" $main_tokens)
  callgrind_control -d "$GW_PID" >/dev/null 2>&1
  local ir
  ir=$(last_dump_ir)
  echo $(( ir / N )) >"$WORK/ir-$name"
  if [ -n "${BENCH_KEEP:-}" ]; then
    mkdir -p "$BENCH_KEEP"; cp "$(ls -t "$WORK/cg-$CG_NAME.out".* | head -1)" "$BENCH_KEEP/$name.callgrind"
  fi
  printf '%-36s %12d instructions per request   (statuses: %s)\n' "$name" $(( ir / N )) "$answers"
}

echo "bench-instructions: valgrind $(valgrind --version | sed 's/valgrind-//'), $N requests of each kind over $CONNS connections"
start_gateway none
phase healthz healthz 200
phase purchase buy:1 202
pipelined() { curl -s "http://127.0.0.1:$GPORT/metrics" | awk -v n="$1" '$1 == n { print $2 }'; }
printf '%-36s %12s\n' "  reservations per Redis round trip" \
  "$(awk -v p="$(pipelined seckill_gateway_pipelined_purchases_total)" \
     -v n="$(pipelined seckill_gateway_redis_pipelines_total)" 'BEGIN { printf "%.1f", p / n }')"
phase sold_out buy:2 410
stop_gateway

for alg in HS256 EdDSA; do
  "$RECONCILER" token keygen --alg "$alg" --kid "bench-$alg" --out "$WORK/sign-$alg.jwks" \
    --public "$WORK/gw-$alg.jwks" >/dev/null
  "$RECONCILER" token issue --user "i$alg$(date +%s)" --key "$WORK/sign-$alg.jwks" --ttl 1h \
    --count $(( N + WARM )) >"$WORK/tokens-$alg.txt"
done
python3 -c 'import json, sys; print(json.dumps({"keys": [k for f in sys.argv[1:] for k in json.load(open(f))["keys"]]}))' \
  "$WORK/gw-HS256.jwks" "$WORK/gw-EdDSA.jwks" >"$WORK/gw-both.jwks"
start_gateway jwt "$WORK/gw-both.jwks"
phase purchase_hs256 token:1 202 "$WORK/tokens-HS256.txt"
phase purchase_eddsa token:1 202 "$WORK/tokens-EdDSA.txt"
stop_gateway

# The worker per message: the messages every purchase phase queued are
# set aside, the release worker starts under callgrind on an empty queue,
# its counters are zeroed, the messages come back, and the dump is taken
# once MySQL holds every order (batches of SECKILL_WORKER_BATCH, default).
WORKER=$TARGET/release/seckill-worker
Q='seckill:{sale:1}:queue'
M=$(rc LLEN "$Q")
rc RENAME "$Q" 'seckill:{sale:1}:held' >/dev/null
WPORT=$(free_port)
SECKILL_WORKER_ID=instructions SECKILL_WORKER_METRICS_LISTEN=127.0.0.1:$WPORT RUST_LOG=warn \
  valgrind --tool=callgrind --compress-strings=no --compress-pos=no \
  --callgrind-out-file="$WORK/cg-worker.out" "$WORKER" 2>"$WORK/valgrind-worker.log" &
W_PID=$!
for _ in $(seq 600); do port_open 127.0.0.1 "$WPORT" && break; sleep 0.1; done
sleep 2
callgrind_control -z "$W_PID" >/dev/null 2>&1
rc RENAME 'seckill:{sale:1}:held' "$Q" >/dev/null
orders=0
for _ in $(seq 1200); do
  orders=$(mysql_bench -e "SELECT COUNT(*) FROM $DB.orders")
  [ "$orders" -ge "$M" ] && break
  sleep 0.1
done
callgrind_control -d "$W_PID" >/dev/null 2>&1
CG_NAME=worker
w_ir=$(last_dump_ir)
kill -TERM "$W_PID"; wait "$W_PID" || true
echo $(( w_ir / M )) >"$WORK/ir-worker"
printf '%-36s %12d instructions per message   (%d messages, %d orders)\n' "worker" $(( w_ir / M )) "$M" "$orders"
mysql_bench -e "DROP DATABASE IF EXISTS $DB"

ir() { cat "$WORK/ir-$1"; }
echo
echo "ratios:"
awk -v h="$(ir healthz)" -v p="$(ir purchase)" -v s="$(ir sold_out)" \
  -v hs="$(ir purchase_hs256)" -v ed="$(ir purchase_eddsa)" 'BEGIN {
  printf "  purchase / healthz                 %.2f  (target <= 1.5)\n", p / h
  printf "  sold-out / healthz                 %.2f\n", s / h
  printf "  purchase HS256 / purchase none     %.2f\n", hs / p
  printf "  purchase EdDSA / purchase none     %.2f\n", ed / p
  printf "  token check, HS256 / EdDSA         %d / %d instructions\n", hs - p, ed - p
}'
awk -v w="$(ir worker)" -v p="$(ir purchase)" 'BEGIN {
  printf "  worker per message / purchase      %.2f\n", w / p
}'
