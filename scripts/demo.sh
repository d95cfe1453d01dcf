#!/usr/bin/env bash
# A whole flash sale end to end on this machine, with real Redis, MariaDB and
# SQLite:
#   1. builds the release binaries;
#   2. uses Redis and MySQL from SECKILL_REDIS_URL / SECKILL_MYSQL_URL when
#      set, else the ones reachable at the defaults (Redis 127.0.0.1:6379 in
#      an empty logical database; MariaDB 127.0.0.1:3306 as root without
#      password or as the seckill_test account of scripts/test.sh), else
#      starts private ones on free loopback ports (redis-server with AOF on,
#      mariadbd set up by mariadb-install-db), installing Debian packages
#      when missing;
#   3. migrates a new database seckill_demo_<time>_<pid> and creates a sale
#      (a new sale id every run) that opens 5 s later;
#   4. makes a new Ed25519 key for buyer tokens (the signing file for the
#      simulator, the public half for the gateway: SECKILL_AUTH_KEYS), starts
#      the gateway and two workers;
#   5. runs the load simulator (seckill-load): distinct users as fast as
#      they can, each with its signed token, 5 % clicking twice, 10 hostile
#      requests mixed in (3 of them with a forged, an expired and another
#      user's token: 401, 401, 403);
#   6. waits for the queue to drain; then the order lifecycle: a simulated
#      payment service pays 70 % of the winners (signed POST /v1/payments),
#      the rest let the payment window (15 s) pass, their units go back on
#      sale and buyers who were told sold out buy and pay for them; runs
#      the reconciler;
#   7. prints the report (and writes it as JSON to .demo/run-*/demo.json,
#      and as a page with charts to .demo/run-*/report.html: seckill-report),
#      with the crowd's request rate beside the rate of a burst of
#      GET /healthz at the same gateway over the same connections (what it
#      answers when an answer costs nothing), and exits 0 only if every
#      invariant holds;
#   8. stops everything it started and tells where the logs and the review
#      file are (.demo/run-<time>-<pid>/); its last line names report.html.
# The machine's existing data are never touched: the demo database is new
# (and dropped at the end unless --keep-db), the Redis keys live in an empty
# logical database, a private server or SECKILL_REDIS_URL's. On a Redis it
# did not start, the run removes exactly what it created at the end (also
# on failure or interrupt): its sale's keys seckill:{sale:ID}:* (SCAN MATCH),
# the id in seckill:sales, demo-w1/demo-w2 in seckill:workers and their
# heartbeats. With --keep-db it keeps them (and the database) and prints the
# commands that remove them.
#
# usage: scripts/demo.sh [--stock N] [--users N] [--connections N] [--keep-db]
#                        [--private] [--pay-share F] [--payment-window DUR]
# (or SECKILL_DEMO_STOCK, SECKILL_DEMO_USERS, SECKILL_DEMO_CONNECTIONS,
# SECKILL_DEMO_PAY_SHARE (0.7), SECKILL_DEMO_PAYMENT_WINDOW (15s: longer
# than the crowd and the drain, or the payers would be late));
# --private (or SECKILL_DEMO_PRIVATE=1): always start private servers.
# The crowd buys a quantity mix: the sale sells up to 4 units per buyer and
# 3 per purchase (sale create --max-per-buyer 4 --max-per-purchase 3); each
# purchase asks 1, 2 or 3 units (70/20/10 %) with an Idempotency-Key, half
# the users retry with the same key, a quarter buy again with a new one
# (seckill-load --quantities 70:20:10 --retry-same-key 0.5 --duplicates
# 0.25); every invariant in units. SECKILL_DEMO_QUANTITIES=0: one unit per
# buyer instead (5 % clicking twice).
# SECKILL_DEMO_HEALTHZ_BURST (20000): the GET /healthz sent after the sale
# (seckill-load --healthz-burst) for the rate printed beside the crowd's.
# SECKILL_DEMO_CLUSTER=1: run on a private Redis Cluster (six redis-server,
# 3 masters and 3 replicas, SECKILL_REDIS_URL=redis+cluster://...) instead.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
. scripts/lib/services.sh
. scripts/lib/private.sh
. scripts/lib/redis_keys.sh

STOCK=${SECKILL_DEMO_STOCK:-1000}
USERS=${SECKILL_DEMO_USERS:-50000}
CONNECTIONS=${SECKILL_DEMO_CONNECTIONS:-64}
KEEP_DB=0
PAY_SHARE=${SECKILL_DEMO_PAY_SHARE:-0.7}
PAYMENT_WINDOW=${SECKILL_DEMO_PAYMENT_WINDOW:-15s}
PRIVATE=${SECKILL_DEMO_PRIVATE:-0}
QUANTITIES=${SECKILL_DEMO_QUANTITIES:-1}
case "$QUANTITIES" in
  0|1) ;;
  *) echo "demo.sh: SECKILL_DEMO_QUANTITIES must be 1 (a quantity mix, the default) or 0 (one unit per buyer), not '$QUANTITIES'" >&2; exit 64 ;;
esac
HEALTHZ_BURST=${SECKILL_DEMO_HEALTHZ_BURST:-20000}
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
needs_value() { # OPTION REST_COUNT
  if [ "$2" -lt 2 ]; then echo "demo.sh: $1 needs a value" >&2; usage >&2; exit 64; fi
}
while [ $# -gt 0 ]; do
  case "$1" in
    --stock) needs_value "$1" $#; STOCK=$2; shift 2 ;;
    --users) needs_value "$1" $#; USERS=$2; shift 2 ;;
    --connections) needs_value "$1" $#; CONNECTIONS=$2; shift 2 ;;
    --keep-db) KEEP_DB=1; shift ;;
    --pay-share) needs_value "$1" $#; PAY_SHARE=$2; shift 2 ;;
    --payment-window) needs_value "$1" $#; PAYMENT_WINDOW=$2; shift 2 ;;
    --private) PRIVATE=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "demo.sh: unknown argument $1" >&2; usage >&2; exit 64 ;;
  esac
done
for v in "$STOCK" "$USERS" "$CONNECTIONS"; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "demo.sh: $v is not a positive integer" >&2; exit 64; }
done

STAMP=$(date -u +%Y%m%d-%H%M%S)
RUN=$ROOT/.demo/run-$STAMP-$$
mkdir -p "$RUN"
say() { echo "demo: $*"; }
PIDS=()            # gateway and workers, our children
PRIVATE_MYSQL=""   # directory of a private mariadbd, if started
PRIVATE_REDIS=""   # directory of a private redis-server, if started
PRIVATE_CLUSTER="" # directory of a private Redis Cluster, if started
DB_ADMIN_URL=""    # server URL to drop the demo database with
DB_NAME=""
REDIS_DB=""        # logical database chosen on the machine's Redis, if any
REDIS_URL=""       # the Redis the run uses, once chosen
SALE=""            # the demo's sale id, once created
WORKER_IDS=()      # ids of the workers started (their registrations)
STOPPED=0

stop_services() {
  [ "$STOPPED" = 1 ] && return 0
  STOPPED=1
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  STOP_CODES=""
  for pid in "${PIDS[@]}"; do
    local code=0
    wait "$pid" || code=$?
    STOP_CODES="$STOP_CODES $code"
  done
  if [ -n "$DB_NAME" ] && [ -n "$DB_ADMIN_URL" ] && [ "$KEEP_DB" = 0 ] && [ -z "$PRIVATE_MYSQL" ]; then
    # shellcheck disable=SC2046
    mariadb $(mysql_client_args "$DB_ADMIN_URL") -e "DROP DATABASE IF EXISTS \`$DB_NAME\`" 2>/dev/null \
      && say "dropped database $DB_NAME" || say "could not drop database $DB_NAME"
  fi
  if [ -n "$REDIS_URL" ] && [ -z "$PRIVATE_REDIS" ] && [ -z "$PRIVATE_CLUSTER" ]; then
    if [ "$KEEP_DB" = 0 ]; then
      # Exactly the run's keys, not a pattern sweep: another run or
      # application may share this server (or even this logical database).
      local out rc=0
      out=$(remove_run_keys "$REDIS_URL" "$SALE" "${WORKER_IDS[@]}" 2>&1) || rc=$?
      [ -z "$out" ] || sed 's/^/demo: redis: /' <<<"$out"
      if [ "$rc" != 0 ]; then
        say "could not remove the demo's Redis keys from $REDIS_URL; remove them with:"
        print_run_keys_removal "$REDIS_URL" "$SALE" "${WORKER_IDS[@]}"
      fi
    fi
  fi
  [ -n "$PRIVATE_REDIS" ] && stop_pidfile "$PRIVATE_REDIS/redis.pid"
  if [ -n "$PRIVATE_CLUSTER" ]; then
    for f in "$PRIVATE_CLUSTER"/*/redis.pid; do stop_pidfile "$f"; done
  fi
  if [ -n "$PRIVATE_MYSQL" ]; then
    stop_pidfile "$PRIVATE_MYSQL/mariadb.pid" 60
    [ "$KEEP_DB" = 0 ] && rm -rf "$PRIVATE_MYSQL/data"
  fi
  [ "$KEEP_DB" = 1 ] && print_kept
  return 0
}

# print_kept: with --keep-db, what the run left in MySQL and Redis and the
# commands that remove it.
print_kept() {
  if [ -n "$PRIVATE_MYSQL" ] && [ -n "$DB_NAME" ]; then
    say "kept (--keep-db): database $DB_NAME in the private MariaDB data directory $PRIVATE_MYSQL/data (server stopped); remove with:"
    echo "  rm -rf '$PRIVATE_MYSQL/data'"
  elif [ -n "$DB_NAME" ] && [ -n "$DB_ADMIN_URL" ]; then
    local args
    # The password, if any, is asked for instead of printed.
    args=$(mysql_client_args "$DB_ADMIN_URL" | sed -E 's/ -p[^ ]*/ -p/; s/ +$//')
    say "kept (--keep-db): MySQL database $DB_NAME on ${DB_ADMIN_URL##*@}; remove with:"
    echo "  mariadb $args -e 'DROP DATABASE \`$DB_NAME\`'"
  fi
  if [ -n "$PRIVATE_REDIS" ]; then
    say "kept (--keep-db): the private Redis's append-only file in $PRIVATE_REDIS (server stopped)"
  elif [ -n "$PRIVATE_CLUSTER" ]; then
    say "kept (--keep-db): the private cluster's append-only files in $PRIVATE_CLUSTER (servers stopped)"
  elif [ -n "$REDIS_URL" ] && { [ -n "$SALE" ] || [ ${#WORKER_IDS[@]} -gt 0 ]; }; then
    local what=""
    [ -z "$SALE" ] || what="the keys seckill:{sale:$SALE}:* and $SALE in seckill:sales; "
    say "kept (--keep-db) on $REDIS_URL: ${what}workers ${WORKER_IDS[*]:-none} (a worker that stopped cleanly has already left seckill:workers and deleted its heartbeat); remove with:"
    print_run_keys_removal "$REDIS_URL" "$SALE" "${WORKER_IDS[@]}"
  fi
}
# The last line names the HTML report when there is one.
trap 'stop_services; say "logs and review file: $RUN"; if [ -s "$RUN/report.html" ]; then say "report (HTML): $RUN/report.html"; fi' EXIT
trap 'exit 130' INT TERM

say "step 1/8: building the release binaries (log: $RUN/build.log)"
if ! command -v cargo >/dev/null 2>&1; then
  echo "demo.sh: needs a Rust toolchain (1.85 or newer): https://rustup.rs" >&2
  exit 2
fi
cargo build --release -p seckill-gateway -p seckill-worker -p seckill-reconciler \
  -p seckill-tests --bins >"$RUN/build.log" 2>&1 \
  || { tail -20 "$RUN/build.log" >&2; exit 2; }
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release

# The quantity mix (the default): the sale's limits and the crowd's
# options; one unit each with SECKILL_DEMO_QUANTITIES=0 (5 % clicking twice).
SALE_LIMITS=()
CROWD=(--duplicates 0.05)
CROWD_SAYS="5 % click twice"
if [ "$QUANTITIES" = 1 ]; then
  if ! "$BIN/seckill-reconciler" sale create --help 2>/dev/null | grep -q -- --max-per-buyer; then
    echo "demo.sh: SECKILL_DEMO_QUANTITIES=1 needs seckill-reconciler sale create --max-per-buyer" \
      "(not in this build)" >&2
    exit 2
  fi
  SALE_LIMITS=(--max-per-buyer 4 --max-per-purchase 3)
  CROWD=(--duplicates 0.25 --quantities 70:20:10 --retry-same-key 0.5)
  CROWD_SAYS="1, 2 or 3 units each (70/20/10 %, at most 4 per buyer), half retry with the same Idempotency-Key, a quarter buy again"
fi

say "step 2/8: finding Redis and MySQL"
if [ "$PRIVATE" = 1 ]; then
  unset SECKILL_REDIS_URL SECKILL_MYSQL_URL
fi
if [ "${SECKILL_DEMO_CLUSTER:-0}" = 1 ]; then
  PRIVATE_CLUSTER=$RUN/redis-cluster
  ports=()
  for _ in 1 2 3 4 5 6; do ports+=("$(free_cluster_port)"); done
  start_private_cluster "$PRIVATE_CLUSTER" "${ports[@]}"
  REDIS_URL="redis+cluster://$(printf '127.0.0.1:%s,' "${ports[@]}" | sed 's/,$//')/"
  REDIS_FROM="a private Redis Cluster (3 masters, 3 replicas, AOF on) in $PRIVATE_CLUSTER"
elif [ -n "${SECKILL_REDIS_URL:-}" ]; then
  REDIS_URL=$SECKILL_REDIS_URL
  REDIS_FROM="SECKILL_REDIS_URL"
  # The demo's workers consume every sale in seckill:sales, and other
  # workers would consume the demo's sale: refuse a Redis database that
  # already holds sales or workers (say, a deployment's).
  if command -v redis-cli >/dev/null 2>&1; then
    held=$(redis-cli -u "$REDIS_URL" eval \
      "return redis.call('SCARD', KEYS[1]) + redis.call('SCARD', KEYS[2])" \
      2 seckill:sales seckill:workers 2>/dev/null || echo "?")
    if [ "$held" != "0" ]; then
      echo "demo.sh: $REDIS_URL already holds seckill sales or workers ($held):" \
        "the demo's workers would consume them. Point SECKILL_REDIS_URL at an" \
        "empty logical database (e.g. redis://host:6379/15), or use --private." >&2
      exit 2
    fi
  fi
elif [ "$PRIVATE" = 0 ] && redis_answers redis://127.0.0.1:6379/ && REDIS_DB=$(empty_redis_db 6379); then
  REDIS_URL="redis://127.0.0.1:6379/$REDIS_DB"
  REDIS_FROM="the machine's Redis, empty logical database $REDIS_DB"
else
  PRIVATE_REDIS=$RUN/redis
  port=$(free_port)
  start_private_redis "$PRIVATE_REDIS" "$port"
  REDIS_URL="redis://127.0.0.1:$port/"
  REDIS_FROM="a private redis-server (AOF on) in $PRIVATE_REDIS"
fi
say "  redis: $REDIS_URL ($REDIS_FROM)"

DB_NAME="seckill_demo_$(date +%s)_$$"
# migrate_on SERVER_URL: creates and migrates the demo database there.
migrate_on() {
  SECKILL_MYSQL_URL="$1/$DB_NAME" SECKILL_REDIS_URL="$REDIS_URL" RUST_LOG=warn \
    "$BIN/seckill-reconciler" migrate >>"$RUN/reconciler.log" 2>&1
}
MYSQL_SERVER=""
if [ -n "${SECKILL_MYSQL_URL:-}" ]; then
  server=${SECKILL_MYSQL_URL%/*}
  [ "$server" = "mysql:/" ] && server=$SECKILL_MYSQL_URL
  migrate_on "$server" && MYSQL_SERVER=$server MYSQL_FROM="SECKILL_MYSQL_URL's server"
elif [ "$PRIVATE" = 0 ] && port_open 127.0.0.1 3306; then
  for server in "mysql://root@127.0.0.1:3306" "mysql://seckill_test:seckill_test@127.0.0.1:3306"; do
    if migrate_on "$server"; then
      MYSQL_SERVER=$server MYSQL_FROM="the machine's MariaDB as ${server#mysql://}"
      break
    fi
  done
fi
if [ -z "$MYSQL_SERVER" ]; then
  PRIVATE_MYSQL=$RUN/mariadb
  port=$(free_port)
  say "  starting a private mariadbd on port $port (mariadb-install-db in $PRIVATE_MYSQL)"
  start_private_mariadb "$PRIVATE_MYSQL" "$port"
  MYSQL_SERVER="mysql://root@127.0.0.1:$port"
  MYSQL_FROM="a private mariadbd in $PRIVATE_MYSQL"
  migrate_on "$MYSQL_SERVER" || { tail -5 "$RUN/reconciler.log" >&2; exit 2; }
fi
DB_ADMIN_URL=$MYSQL_SERVER
MYSQL_URL="$MYSQL_SERVER/$DB_NAME"
say "  mysql: database $DB_NAME ($MYSQL_FROM)"
export SECKILL_REDIS_URL=$REDIS_URL SECKILL_MYSQL_URL=$MYSQL_URL

say "step 3/8: creating a sale of $STOCK units opening in 5 s"
ensure_package mariadb mariadb-client
# A new sale id every run (not 1 again), so Redis keys of an earlier run can
# never be mistaken for this sale's.
# shellcheck disable=SC2046
mariadb $(mysql_client_args "$MYSQL_SERVER") "$DB_NAME" \
  -e "ALTER TABLE sales AUTO_INCREMENT = $(( $(date +%s) * 1000 + $$ % 1000 ))"
SALE=$(RUST_LOG=warn "$BIN/seckill-reconciler" sale create --sku "DEMO-$STAMP" \
  --title "Demo phone" --price-cents 49900 --stock "$STOCK" \
  --starts-at now+5s --ends-at now+1h --payment-window "$PAYMENT_WINDOW" \
  ${SALE_LIMITS[@]+"${SALE_LIMITS[@]}"} 2>>"$RUN/reconciler.log")
say "  sale $SALE"

say "step 4/8: starting the gateway and two workers"
# The secret the simulated payment service signs its webhooks with.
SECKILL_PAYMENT_SECRET=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')
export SECKILL_PAYMENT_SECRET
# Buyer tokens: the simulator signs with the private key, the gateway holds
# only the public half (docs/IDENTITY.md).
KID=$(RUST_LOG=warn "$BIN/seckill-reconciler" token keygen --alg EdDSA --kid "demo-$STAMP" \
  --out "$RUN/signing-keys.jwks" --public "$RUN/gateway-keys.jwks" 2>>"$RUN/reconciler.log")
say "  buyer token key $KID (EdDSA): $RUN/gateway-keys.jwks"
GW_PORT=$(free_port)
SECKILL_AUTH_KEYS="$RUN/gateway-keys.jwks" SECKILL_LISTEN=127.0.0.1:$GW_PORT \
  "$BIN/seckill-gateway" >"$RUN/gateway.log" 2>&1 &
PIDS+=($!)
for w in 1 2; do
  SECKILL_WORKER_ID="demo-w$w" SECKILL_WORKER_METRICS_LISTEN="127.0.0.1:$(free_port)" \
    "$BIN/seckill-worker" >"$RUN/worker-$w.log" 2>&1 &
  PIDS+=($!)
  WORKER_IDS+=("demo-w$w")
done
# Each service must be up (a port taken, say, ends it at once): the
# gateway answering, both workers still running after their start.
for i in $(seq 1 150); do
  port_open 127.0.0.1 "$GW_PORT" && break
  kill -0 "${PIDS[0]}" 2>/dev/null || break
  sleep 0.1
done
if ! port_open 127.0.0.1 "$GW_PORT"; then
  echo "demo.sh: the gateway did not start: $(tail -n 1 "$RUN/gateway.log")" \
    "(see $RUN/gateway.log)" >&2
  exit 2
fi
sleep 0.5
for w in 1 2; do
  if ! kill -0 "${PIDS[$w]}" 2>/dev/null; then
    echo "demo.sh: worker demo-w$w did not start: $(tail -n 1 "$RUN/worker-$w.log")" \
      "(see $RUN/worker-$w.log)" >&2
    exit 2
  fi
done
say "  gateway http://127.0.0.1:$GW_PORT, workers demo-w1 and demo-w2"

say "step 5/8: $USERS users with signed tokens over $CONNECTIONS connections ($CROWD_SAYS, 10 hostile requests: 3 with bad tokens)"
say "step 6/8: the simulator then waits for the queue to drain, pays $PAY_SHARE of the winners, lets the rest expire ($PAYMENT_WINDOW) and sells their units again"
set +e
"$BIN/seckill-load" --sale "$SALE" --url "http://127.0.0.1:$GW_PORT" \
  --users "$USERS" --connections "$CONNECTIONS" "${CROWD[@]}" --hostile 10 \
  --key "$RUN/signing-keys.jwks" --healthz-burst "$HEALTHZ_BURST" \
  --user-prefix demo --wait-open --drain-timeout 300s \
  --report-json "$RUN/load-report.json" --pay-share "$PAY_SHARE" | tee "$RUN/load-report.txt"
LOAD_RC=${PIPESTATUS[0]}
say "  running the reconciler (grace 0 s; review file $RUN/review.sqlite3)"
SECKILL_RECONCILE_GRACE=0s SECKILL_REVIEW_DB="$RUN/review.sqlite3" RUST_LOG=warn \
  "$BIN/seckill-reconciler" run >"$RUN/reconcile.txt" 2>>"$RUN/reconciler.log"
REC_RC=$?
set -e
sed 's/^/  reconciler  /' "$RUN/reconcile.txt"

say "step 7/8: report"
case "$REC_RC" in
  0) FINDINGS="0 open findings" ;;
  1) FINDINGS="OPEN FINDINGS (seckill-reconciler findings; review file below)" ;;
  *) FINDINGS="the reconciler could not run (exit $REC_RC, see $RUN/reconciler.log)" ;;
esac
say "  invariants: $([ "$LOAD_RC" = 0 ] && echo "every one holds" || echo "VIOLATED (seckill-load exit $LOAD_RC)")"
# The crowd's rate beside the same gateway's health-check rate (the
# simulator's "requests" and "healthz" lines).
CROWD_RATE=$(sed -n 's/^  requests .* = \([0-9]*\) req\/s;.*/\1/p' "$RUN/load-report.txt" | head -1)
HEALTHZ_RATE=$(sed -n 's/^  healthz .* = \([0-9]*\) req\/s;.*/\1/p' "$RUN/load-report.txt" | head -1)
if [ -n "$CROWD_RATE" ] && [ -n "$HEALTHZ_RATE" ] && [ "$HEALTHZ_RATE" -gt 0 ]; then
  say "  rates: the crowd $CROWD_RATE req/s; GET /healthz of the same gateway $HEALTHZ_RATE req/s" \
    "(the crowd at $(( 100 * CROWD_RATE / HEALTHZ_RATE )) % of it)"
fi
say "  reconciliation: $FINDINGS"

say "step 8/8: stopping the gateway and the workers (SIGTERM)"
stop_services
say "  exit codes after SIGTERM (gateway, worker 1, worker 2):$STOP_CODES"
say "  logs: $RUN/{gateway,worker-1,worker-2,reconciler}.log; report: $RUN/load-report.txt"
say "  review file: $RUN/review.sqlite3"
CLEAN_STOP=1
for c in $STOP_CODES; do [ "$c" = 0 ] || CLEAN_STOP=0; done
PASSED=false
if [ "$LOAD_RC" = 0 ] && [ "$REC_RC" = 0 ] && [ "$CLEAN_STOP" = 1 ]; then PASSED=true; fi
# The same verdict for programs: the simulator's JSON report (its
# invariants by name) with the reconciler's exit and the stop codes.
LOAD_JSON=null
[ -s "$RUN/load-report.json" ] && LOAD_JSON=$(cat "$RUN/load-report.json")
printf '{"sale":%s,"load_exit":%s,"reconciler_exit":%s,"stop_codes":[%s],"pass":%s,"load":%s}\n' \
  "$SALE" "$LOAD_RC" "$REC_RC" "$(echo $STOP_CODES | tr ' ' ',')" "$PASSED" "$LOAD_JSON" \
  >"$RUN/demo.json"
say "  report (JSON): $RUN/demo.json"
# The same as a page with charts (self-contained: open it in any browser).
"$BIN/seckill-report" --out "$RUN/report.html" --title "seckill demo: sale $SALE" "$RUN/demo.json" \
  || say "  could not write the HTML report (see above)"
if [ "$PASSED" = true ]; then
  say "PASS: sale $SALE sold exactly what it reserved, nothing lost, nothing doubled"
  exit 0
fi
WHY=()
[ "$LOAD_RC" = 0 ] || WHY+=("invariants violated (seckill-load exit $LOAD_RC)")
[ "$REC_RC" = 0 ] || WHY+=("reconciler exit $REC_RC")
[ "$CLEAN_STOP" = 1 ] || WHY+=("a service did not stop cleanly (exit codes$STOP_CODES; see its log)")
say "FAIL: ${WHY[*]}"
exit 1
