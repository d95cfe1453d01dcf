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
# Usage: scripts/bench-reconciler.sh [N]
# MySQL server: SECKILL_TEST_MYSQL_URL (default mysql://root@127.0.0.1:3306/).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000000}
SERVER_URL=${SECKILL_TEST_MYSQL_URL:-mysql://root@127.0.0.1:3306/}
SERVER_URL=${SERVER_URL%/}/
DB=seckill_bench_recon_$$
WORK=$(mktemp -d)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
REDIS_PID=""

cleanup() {
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
cargo build --release -q -p seckill-reconciler --bin seckill-reconciler --example bench_read
BIN=target/release/seckill-reconciler
READ_BIN=target/release/examples/bench_read

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
echo "building a sale of $N confirmed reservations..." >&2
t0=$(date +%s.%N)
mysql_cmd "$DB" <<SQL
INSERT INTO sales (id, sku, title, price_cents, total_stock, available_stock, starts_at, ends_at)
VALUES (1, 'BENCH', 'bench', 100, $N, 0, UTC_TIMESTAMP() - INTERVAL 2 HOUR, UTC_TIMESTAMP() + INTERVAL 1 HOUR);
INSERT INTO orders (reservation_id, sale_id, user_id, quantity, status, reserved_at)
SELECT LOWER(LPAD(HEX(seq), 32, '0')), 1, CONCAT('u', seq), 1, 'confirmed',
       FROM_UNIXTIME($RESERVED_MS / 1000) FROM seq_1_to_$N;
INSERT INTO stock_ledger (reservation_id, sale_id, user_id, delta, reason)
SELECT LOWER(LPAD(HEX(seq), 32, '0')), 1, CONCAT('u', seq), -1, 'order' FROM seq_1_to_$N;
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
for ((s = 1; s <= N; s += 100000)); do
  e=$(( s + 99999 )); [ "$e" -gt "$N" ] && e=$N
  redis-cli -p "$PORT" EVAL "$FILL" 3 'seckill:{sale:1}:flow' 'seckill:{sale:1}:buyers' \
    'seckill:{sale:1}:status' "$s" "$e" "$RESERVED_MS" >/dev/null
done
redis-cli -p "$PORT" HSET 'seckill:{sale:1}:meta' total_stock "$N" starts_at_ms "$NOW_MS" \
  ends_at_ms $(( NOW_MS + 3600000 )) >/dev/null
redis-cli -p "$PORT" SET 'seckill:{sale:1}:stock' 0 >/dev/null
redis-cli -p "$PORT" SADD seckill:sales 1 >/dev/null
echo "built in $(echo "$(date +%s.%N) - $t0" | bc) s" >&2

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
