#!/usr/bin/env bash
# Benchmark of `seckill-reconciler run` (prints figures; not a test).
#
# Builds a sale of N reservations (default 1,000,000), all confirmed: N flow
# records in a private redis-server, N orders and N ledger rows in a fresh
# MySQL database. Then times, against the same data:
#   - `bench_read ID` (reconciler/examples/bench_read.rs): merely reading the
#     three data sets
#     (flow records by HSCAN, ledger rows and orders by streamed SELECT);
#   - `seckill-reconciler run`: the whole reconciliation, with peak RSS;
# each with its CPU time (the client's, MySQL's and Redis's: on 2 shared
# cores wall time drifts with other work, CPU much less), BENCH_ROUNDS
# rounds (default 2). BENCH_COMPARE_BIN: another build (say, of another
# commit) measured first in each round on the same data.
# Targets: run <= 1.3 x the bare read's time, memory bounded.
#
# --backlog: a run during a queue backlog. A sale of N reservations (default
# 5,000,000) of which Q (BENCH_QUEUED, default 1,000,000) are still queued,
# made by the real reservation script, one of them lost (deleted from the
# middle of the queue); two release-built seckill-workers drain while a
# purchase probe (the reservation script, one buyer, every 20 ms) times
# purchases for BENCH_QUIET_S seconds (default 15) without, then during one
# `seckill-reconciler run` (grace 0); once drained, a second run of the quiet
# sale. Prints the run's time, peak RSS and findings beside the quiet run's,
# Redis's SLOWLOG of the run's commands (every command logged) and the probe's
# p50/p99 with and without. Targets: findings as on the quiet sale, no
# reconciler command near 10 ms, p99 with <= 2 x p99 without, memory bounded.
# BENCH_REDIS_RT=1 puts Redis and the probe in the real-time class (chrt -f;
# root), so that SLOWLOG and the probe time Redis's work and not the waits of
# a loaded machine's scheduler. BENCH_WORKER_BATCH: the workers' batch
# (default 16: they drain for longer than the run takes).
# BENCH_RECONCILER_BIN / BENCH_WORKER_BIN / BENCH_READ_BIN /
# BENCH_LUA_SCRIPT_BIN: release binaries already built (no cargo build; the
# defaults are under target/release/, the last two examples/bench_read and
# examples/lua_script, common/examples/lua_script.rs, which prints the
# reservation script as the gateway sends it).
#
# Usage: scripts/bench-reconciler.sh [N]
#        scripts/bench-reconciler.sh --backlog [N]
# MySQL server: SECKILL_TEST_MYSQL_URL (default mysql://root@127.0.0.1:3306/).
set -euo pipefail
cd "$(dirname "$0")/.."
BACKLOG=""
[ "${1:-}" = --backlog ] && { BACKLOG=1; shift; }
N=${1:-$([ -n "$BACKLOG" ] && echo 5000000 || echo 1000000)}
Q=$([ -n "$BACKLOG" ] && echo "${BENCH_QUEUED:-1000000}" || echo 0)
# Units left on sale for the probe's purchases.
SPARE=$([ -n "$BACKLOG" ] && echo 100000 || echo 0)
CONFIRMED=$(( N - Q ))
TOTAL=$(( N + SPARE ))
SERVER_URL=${SECKILL_TEST_MYSQL_URL:-mysql://root@127.0.0.1:3306/}
SERVER_URL=${SERVER_URL%/}/
DB=seckill_bench_recon_$$
WORK=$(mktemp -d)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
REDIS_PID=""
WORKER_PIDS=()

cleanup() {
  for p in "${WORKER_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -n "$REDIS_PID" ] && kill "$REDIS_PID" 2>/dev/null || true
  mysql_cmd -e "DROP DATABASE IF EXISTS $DB" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
[ -n "${BENCH_KEEP:-}" ] && trap - EXIT

# mysql_cmd ARGS: the mysql client against the server of SERVER_URL.
mapfile -t MYSQL_ARGS < <(python3 -c '
import sys, urllib.parse
u = urllib.parse.urlparse(sys.argv[1])
print("-h" + (u.hostname or "127.0.0.1")); print("-P" + str(u.port or 3306))
print("-u" + urllib.parse.unquote(u.username or "root"))
if u.password: print("-p" + urllib.parse.unquote(u.password))' "$SERVER_URL")
mysql_cmd() { mysql "${MYSQL_ARGS[@]}" "$@"; }

command -v /usr/bin/time >/dev/null || { echo "install the package 'time' for peak RSS" >&2; exit 1; }
if [ -n "${BENCH_RECONCILER_BIN:-}" ]; then
  BIN=$BENCH_RECONCILER_BIN
elif [ -n "$BACKLOG" ]; then
  cargo build --release -q -p seckill-reconciler -p seckill-worker -p seckill-common --bins --example lua_script
  BIN=target/release/seckill-reconciler
else
  cargo build --release -q -p seckill-reconciler --bin seckill-reconciler --example bench_read
  BIN=target/release/seckill-reconciler
fi
READ_BIN=${BENCH_READ_BIN:-target/release/examples/bench_read}
WORKER_BIN=${BENCH_WORKER_BIN:-target/release/seckill-worker}
# lua_script NAME: a shipped Redis script as the binaries send it
# (common/examples/lua_script.rs).
lua_script() { "${BENCH_LUA_SCRIPT_BIN:-target/release/examples/lua_script}" "$1"; }

redis-server --port "$PORT" --bind 127.0.0.1 --dir "$WORK" --save "" --appendonly no \
  --daemonize no --loglevel warning >/dev/null 2>&1 &
REDIS_PID=$!
until redis-cli -p "$PORT" ping >/dev/null 2>&1; do sleep 0.1; done

export SECKILL_REDIS_URL="redis://127.0.0.1:$PORT/"
export SECKILL_MYSQL_URL="${SERVER_URL}${DB}"
export SECKILL_REVIEW_DB="$WORK/review.sqlite3"
export SECKILL_RECONCILE_GRACE=0s
export SECKILL_REDIS_TIMEOUT=10s
export SECKILL_MYSQL_TIMEOUT=60s
export RUST_LOG=warn
"$BIN" migrate >/dev/null

NOW_MS=$(( $(date +%s) * 1000 ))
RESERVED_MS=$(( NOW_MS - 3600000 ))
echo "building a sale of $N reservations ($CONFIRMED confirmed, $Q queued)..." >&2
t0=$(date +%s.%N)
mysql_cmd "$DB" <<SQL
INSERT INTO sales (id, sku, title, price_cents, total_stock, available_stock, starts_at, ends_at)
VALUES (1, 'BENCH', 'bench', 100, $TOTAL, $(( TOTAL - CONFIRMED )), UTC_TIMESTAMP() - INTERVAL 2 HOUR, UTC_TIMESTAMP() + INTERVAL 1 HOUR);
INSERT INTO orders (reservation_id, sale_id, user_id, quantity, status, reserved_at)
SELECT LOWER(LPAD(HEX(seq), 32, '0')), 1, CONCAT('u', seq), 1, 'confirmed',
       FROM_UNIXTIME($RESERVED_MS / 1000) FROM seq_1_to_$CONFIRMED;
INSERT INTO stock_ledger (reservation_id, sale_id, user_id, delta, reason)
SELECT LOWER(LPAD(HEX(seq), 32, '0')), 1, CONCAT('u', seq), -1, 'order' FROM seq_1_to_$CONFIRMED;
SQL
FILL='
for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do
  local rid = string.format("%032x", i)
  local user = "u" .. i
  redis.call("HSET", KEYS[1], rid, "{\"v\":1,\"reservation_id\":\"" .. rid ..
    "\",\"sale_id\":1,\"user_id\":\"" .. user .. "\",\"reserved_at_ms\":" .. ARGV[3] .. "}")
  redis.call("HSET", KEYS[2], user, rid)
  redis.call("HSET", KEYS[3], rid, "confirmed")
end
return 1'
for ((s = 1; s <= CONFIRMED; s += 100000)); do
  e=$(( s + 99999 )); [ "$e" -gt "$CONFIRMED" ] && e=$CONFIRMED
  redis-cli -p "$PORT" EVAL "$FILL" 3 'seckill:{sale:1}:flow' 'seckill:{sale:1}:buyers' \
    'seckill:{sale:1}:status' "$s" "$e" "$RESERVED_MS" >/dev/null
done
redis-cli -p "$PORT" HSET 'seckill:{sale:1}:meta' total_stock "$TOTAL" starts_at_ms "$NOW_MS" \
  ends_at_ms $(( NOW_MS + 3600000 )) >/dev/null
redis-cli -p "$PORT" SET 'seckill:{sale:1}:stock' $(( TOTAL - CONFIRMED )) >/dev/null
redis-cli -p "$PORT" SADD seckill:sales 1 >/dev/null
if [ -n "$BACKLOG" ]; then
  SHA=$(redis-cli -p "$PORT" SCRIPT LOAD "$(lua_script reserve)")
  python3 scripts/lib/bench_backlog.py fill "$PORT" "$SHA" 1 $(( CONFIRMED + 1 )) "$Q" |
    redis-cli -p "$PORT" --pipe >/dev/null
  # The lost message: the one finding of the quiet sale.
  LOST=$(printf '%032x' $(( CONFIRMED + Q / 2 )))
  redis-cli -p "$PORT" LREM 'seckill:{sale:1}:queue' 1 \
    "$(redis-cli -p "$PORT" HGET 'seckill:{sale:1}:flow' "$LOST")" >/dev/null
fi
echo "built in $(echo "$(date +%s.%N) - $t0" | bc) s" >&2

if [ -n "$BACKLOG" ]; then
  rc() { redis-cli -p "$PORT" "$@"; }
  queued() { rc LLEN 'seckill:{sale:1}:queue'; }
  backlog_py() { python3 scripts/lib/bench_backlog.py "$@"; }
  free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
  # probe BASE: purchases every 20 ms into $WORK/probe-BASE.txt until
  # $WORK/stop-BASE exists; its process id in PROBE_PID.
  probe() { $RT python3 scripts/lib/bench_backlog.py probe "$PORT" "$SHA" 1 "$1" 20 "$WORK/stop-$1" \
    >"$WORK/probe-$1.txt" & PROBE_PID=$!; }
  # findings FILE: the kind and subject of each finding of review store FILE.
  findings() {
    SECKILL_REVIEW_DB=$1 "$BIN" findings --json |
      python3 -c 'import json, sys; [print(f["kind"], f["subject"]) for f in json.load(sys.stdin)]' | sort
  }
  RT=""
  if [ -n "${BENCH_REDIS_RT:-}" ]; then chrt -a -f -p 1 "$REDIS_PID"; RT="chrt -f 1"; fi
  rc CONFIG SET slowlog-log-slower-than 0 slowlog-max-len 3000000 >/dev/null
  for w in 1 2; do
    SECKILL_WORKER_ID=bench-w$w SECKILL_WORKER_BATCH=${BENCH_WORKER_BATCH:-16} SECKILL_WORKER_METRICS_LISTEN=127.0.0.1:$(free_port) \
      RUST_LOG=warn "$WORKER_BIN" >"$WORK/worker$w.log" 2>&1 &
    WORKER_PIDS+=($!)
  done
  sleep 2
  echo "workers draining, $(queued) queued; purchases without a run for ${BENCH_QUIET_S:-15} s..." >&2
  probe 1000000000
  sleep "${BENCH_QUIET_S:-15}"
  touch "$WORK/stop-1000000000"
  wait "$PROBE_PID"
  rc SLOWLOG RESET >/dev/null
  probe 2000000000
  sleep 1
  q0=$(queued)
  backlog_py clients "$PORT" >"$WORK/clients.txt"
  echo "run during the backlog ($q0 queued)..." >&2
  SECKILL_REVIEW_DB=$WORK/review-backlog.sqlite3 /usr/bin/time -v "$BIN" run \
    >/dev/null 2>"$WORK/time.txt" || true
  touch "$WORK/stop-2000000000"
  backlog_py slowlog "$PORT" "$WORK/clients.txt" >"$WORK/slowlog.txt"
  q1=$(queued)
  wait "$PROBE_PID"
  echo "draining the rest ($q1 queued)..." >&2
  while [ "$(queued)" != 0 ] || [ "$(rc LLEN 'seckill:{sale:1}:processing:bench-w1')" != 0 ] ||
    [ "$(rc LLEN 'seckill:{sale:1}:processing:bench-w2')" != 0 ]; do sleep 1; done
  SECKILL_REVIEW_DB=$WORK/review-quiet.sqlite3 /usr/bin/time -v "$BIN" run \
    >/dev/null 2>"$WORK/time-quiet.txt" || true
  # time_field FILE NAME: one field of /usr/bin/time -v's report.
  time_field() { sed -n "s/.*$2: //p" "$1"; }
  wall_ms() { time_field "$1" 'Elapsed (wall clock) time (h:mm:ss or m:ss)' |
    awk -F: '{ if (NF == 3) print int(($1 * 3600 + $2 * 60 + $3) * 1000); else print int(($1 * 60 + $2) * 1000) }'; }
  read -r n1 p50a p99a maxa <"$WORK/probe-1000000000.txt"
  read -r n2 p50b p99b maxb <"$WORK/probe-2000000000.txt"
  during=$(findings "$WORK/review-backlog.sqlite3")
  quiet=$(findings "$WORK/review-quiet.sqlite3")
  printf 'backlog: N=%d reservations, %d queued at the run start, %d at its end; %d cores, load %s\n' \
    "$N" "$q0" "$q1" "$(nproc)" "$(cut -d' ' -f1 /proc/loadavg)"
  for f in time.txt time-quiet.txt; do
    printf '%s run: %d ms, peak RSS %d MiB, exit %s\n' "$([ $f = time.txt ] && echo backlog || echo quiet)" \
      "$(wall_ms "$WORK/$f")" $(( $(time_field "$WORK/$f" 'Maximum resident set size (kbytes)') / 1024 )) \
      "$(time_field "$WORK/$f" 'Exit status')"
    echo "  $(grep 'seckill-reconciler: run' "$WORK/$f" || true)"
  done
  echo "findings during the backlog: ${during:-none}"
  echo "findings of the quiet sale:   ${quiet:-none}"
  echo "  same: $([ "$during" = "$quiet" ] && echo yes || echo NO)"
  echo "Redis SLOWLOG of the run's commands (every command):"
  cat "$WORK/slowlog.txt"
  printf 'purchase probe, µs: without a run n=%d p50 %d p99 %d max %d; during the run n=%d p50 %d p99 %d max %d\n' \
    "$n1" "$p50a" "$p99a" "$maxa" "$n2" "$p50b" "$p99b" "$maxb"
  printf '  p99 with / without: %.2f (target <= 2)\n' "$(echo "$p99b / $p99a" | bc -l)"
  exit 0
fi

# cpu_ticks PID: utime + stime of a process in clock ticks (0 when gone).
cpu_ticks() { awk '{ sub(/.*\) /, ""); print $12 + $13 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
MYSQLD_PID=$(pidof mariadbd mysqld 2>/dev/null | awk '{print $1}')
TICK=$(getconf CLK_TCK)
# servers_ticks: MySQL's and this Redis's ticks together.
servers_ticks() { echo $(( $(cpu_ticks "${MYSQLD_PID:-0}") + $(cpu_ticks "$REDIS_PID") )); }
# client_ms FILE: user + system time from /usr/bin/time -v, in ms.
client_ms() { awk -F': ' '/User time|System time/ { s += $2 } END { printf "%d", s * 1000 }' "$1"; }

for round in $(seq 1 "${BENCH_ROUNDS:-2}"); do
for RUN_BIN in ${BENCH_COMPARE_BIN:-} "$BIN"; do
  s0=$(servers_ticks)
  /usr/bin/time -v "$READ_BIN" 1 >"$WORK/read.txt" 2>"$WORK/read-time.txt"
  s1=$(servers_ticks)
  read_ms=$(sed -n 's/.*read_ms=\([0-9]*\).*/\1/p' "$WORK/read.txt")
  read_cpu=$(( $(client_ms "$WORK/read-time.txt") + (s1 - s0) * 1000 / TICK ))
  /usr/bin/time -v "$RUN_BIN" run 2>"$WORK/time.txt" >/dev/null || true
  s2=$(servers_ticks)
  run_cpu=$(( $(client_ms "$WORK/time.txt") + (s2 - s1) * 1000 / TICK ))
  code=$(sed -n 's/.*Exit status: //p' "$WORK/time.txt")
  wall=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$WORK/time.txt")
  rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$WORK/time.txt")
  run_ms=$(echo "$wall" | awk -F: '{ if (NF == 3) print int(($1 * 3600 + $2 * 60 + $3) * 1000); else print int(($1 * 60 + $2) * 1000) }')
  summary=$(grep 'seckill-reconciler: run' "$WORK/time.txt" || true)
  [ -n "${BENCH_COMPARE_BIN:-}" ] && echo "  ($RUN_BIN)"
  printf 'round %d: N=%d  bare read %d ms  run %d ms  ratio %.2f  peak RSS %d MiB  exit %s\n' \
    "$round" "$N" "$read_ms" "$run_ms" "$(echo "$run_ms / $read_ms" | bc -l)" $(( rss / 1024 )) "$code"
  printf '  CPU (client + MySQL + Redis): bare read %d ms  run %d ms  ratio %.2f\n' \
    "$read_cpu" "$run_cpu" "$(echo "$run_cpu / $read_cpu" | bc -l)"
  echo "  $summary"
done
done
