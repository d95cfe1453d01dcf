#!/usr/bin/env bash
# Redis's own cost of one reservation (docs/PERFORMANCE.md, "Redis's cost
# per reservation"): microseconds per call of the reservation script by `INFO
# commandstats` (usec_per_call), for the script as the gateway sends it and
# for prototypes that exist only here, so their gain can be weighed before
# anyone changes the key schema (other work builds on it):
#   evalsha   common/src/reservation.rs RESERVE_LUA, EVALSHA (as shipped);
#   fcall     the same body as a Redis Function (FUNCTION LOAD + FCALL);
#   merged    a prototype schema: the buyer, the flow record and the status
#             in one hash (fields u:USER, f:RID, s:RID), so the writes are
#             DECR + one HSET + LPUSH instead of DECR + three HSETs + LPUSH,
#             with the same guards (key types, pause, integer stock, OOM
#             undo) and the same reply;
#   merged_fcall  that prototype as a Function;
#   batch8, batch32  the shipped script in its batch form (the group commit's
#             one call per bucket, reservation::write_calls) with 8 or 32
#             buyers per call: its figure is per reservation (per call / N),
#             over the same number of reservations.
# Each: `redis-benchmark -c 2 -P 64` of distinct users on a fresh private
# redis-server with AOF everysec (as the gateway bench), one sale of plenty
# of stock. Figures, not a test. Usage: scripts/bench-redis-script.sh
# (BENCH_CALLS per variant, default 300000; BENCH_CALLGRIND=1: Redis runs
# under callgrind and the figure is instructions per call of the whole
# Redis process, which machine load does not move; use ~20000 calls).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/services.sh
ensure_redis_server
ensure_package redis-benchmark redis-tools
CALLS=${BENCH_CALLS:-300000}

cargo build --release -q -p seckill-common --example lua_script
lua_src=$("${CARGO_TARGET_DIR:-target}/release/examples/lua_script" reserve)
# The merged prototype: KEYS meta, stock, sale hash (u:/f:/s: fields), queue.
read -r -d '' merged_src <<'LUA' || true
local function refused(key, r)
  return redis.error_reply(r['err'] .. ' (' .. key .. ')')
end
local w = redis.pcall('HMGET', KEYS[1], 'starts_at_ms', 'ends_at_ms', 'total_stock', 'releases', 'paused')
if w['err'] then return refused(KEYS[1], w) end
if w[5] then return 'paused 0 ' .. w[5] end
local starts = tonumber(w[1])
local ends = tonumber(w[2])
local total = tonumber(w[3])
if not starts or not ends or not total then return 'unknown_sale 0 ' end
local releases = tonumber(w[4] or '0')
if not releases then
  return redis.error_reply('ERR ' .. KEYS[1] .. ' field releases is not an integer')
end
local user = ARGV[1]
if #user < 1 or #user > 64 or not string.find(user, '^[A-Za-z0-9_.-]+$') then
  return redis.error_reply('ERR invalid user id')
end
local left = redis.pcall('GET', KEYS[2])
if type(left) == 'table' then return refused(KEYS[2], left) end
if left and not string.find(left, '^-?%d+$') then
  return redis.error_reply('ERR ' .. KEYS[2] .. ' is not an integer')
end
local stock = tonumber(left or '0')
local seq = string.format('%d', total - stock + releases)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now < starts then return 'not_started ' .. seq .. ' ' end
if now >= ends then return 'ended ' .. seq .. ' ' end
local prev = redis.pcall('HGET', KEYS[3], 'u:' .. user)
if type(prev) == 'table' then return refused(KEYS[3], prev) end
if prev then return 'already_purchased ' .. seq .. ' ' .. prev end
if not left or stock < 1 then return 'sold_out ' .. seq .. ' ' end
local msg = '{"v":1,"reservation_id":"' .. ARGV[2] .. '","sale_id":' .. ARGV[3] ..
  ',"user_id":"' .. user .. '","reserved_at_ms":' .. string.format('%d', now) .. '}'
redis.call('DECR', KEYS[2])
redis.call('HSET', KEYS[3], 'u:' .. user, ARGV[2], 'f:' .. ARGV[2], msg, 's:' .. ARGV[2], 'queued')
local r = redis.pcall('LPUSH', KEYS[4], msg)
if type(r) == 'table' then
  redis.call('HDEL', KEYS[3], 'u:' .. user, 'f:' .. ARGV[2], 's:' .. ARGV[2])
  redis.call('INCR', KEYS[2])
  return refused(KEYS[4], r)
end
return string.format('reserved %d ', total - stock + 1 + releases) .. ARGV[2]
LUA

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
WORK=$(mktemp -d)
R_PID=""
cleanup() { [ -n "$R_PID" ] && kill "$R_PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

# run NAME COMMAND NUMKEYS-AND-KEYS...: a fresh Redis, one sale, the calls.
run() {
  local name=$1; shift
  local port; port=$(free_port)
  rm -rf "$WORK/r"; mkdir -p "$WORK/r"
  local under=()
  [ -n "${BENCH_CALLGRIND:-}" ] && under=(valgrind --tool=callgrind --compress-strings=no --compress-pos=no --callgrind-out-file="$WORK/r/cg.out")
  "${under[@]}" redis-server --port "$port" --bind 127.0.0.1 --dir "$WORK/r" --save "" \
    --appendonly yes --appendfsync everysec --auto-aof-rewrite-percentage 0 \
    --daemonize no --loglevel warning >/dev/null 2>&1 &
  R_PID=$!
  local rc="redis-cli -p $port"
  for _ in $(seq 600); do $rc PING >/dev/null 2>&1 && break; sleep 0.05; done
  local now; now=$(( $(date +%s%3N) - 1000 ))
  $rc HSET 'seckill:{sale:1}:meta' total_stock 1000000000 starts_at_ms "$now" \
    ends_at_ms $(( now + 3600000 )) >/dev/null
  $rc SET 'seckill:{sale:1}:stock' 1000000000 >/dev/null
  local call
  case $name in
    evalsha|batch*) call=(EVALSHA "$($rc SCRIPT LOAD "$lua_src")") ;;
    merged) call=(EVALSHA "$($rc SCRIPT LOAD "$merged_src")") ;;
    fcall)
      $rc FUNCTION LOAD "$(printf '#!lua name=seckill\nlocal function reserve(KEYS, ARGV)\n%s\nend\nredis.register_function("reserve", reserve)' "$lua_src")" >/dev/null
      call=(FCALL reserve) ;;
    merged_fcall)
      $rc FUNCTION LOAD "$(printf '#!lua name=seckill\nlocal function reserve(KEYS, ARGV)\n%s\nend\nredis.register_function("reserve", reserve)' "$merged_src")" >/dev/null
      call=(FCALL reserve) ;;
  esac
  $rc CONFIG RESETSTAT >/dev/null
  [ -n "${BENCH_CALLGRIND:-}" ] && callgrind_control -z "$R_PID" >/dev/null 2>&1
  # batchN: N buyers per call, CALLS / N calls (as many reservations).
  local per=1 more=()
  case $name in batch*) per=${name#batch} ;; esac
  for _ in $(seq 2 "$per"); do more+=("rb-__rand_int__" "rid__rand_int__"); done
  local out
  out=$(redis-benchmark -p "$port" -c 2 -P 64 -n $(( CALLS / per )) -r 1000000000 -q "${call[@]}" "$@" \
    "rb-__rand_int__" "rid__rand_int__" 1 "${more[@]}" | tr '\r' '\n' | grep 'requests per second' | tail -1)
  local ir=""
  if [ -n "${BENCH_CALLGRIND:-}" ]; then
    callgrind_control -d "$R_PID" >/dev/null 2>&1
    ir=$(awk '/^summary:/ { print $2; exit }' "$(ls -t "$WORK/r/cg.out".* | head -1)")
    [ -n "${BENCH_KEEP:-}" ] && mkdir -p "$BENCH_KEEP" && cp "$(ls -t "$WORK/r/cg.out".* | head -1)" "$BENCH_KEEP/redis-$name.callgrind"
  fi
  local stats units
  stats=$($rc INFO commandstats | tr -d '\r' | awk -F'[:=,]' -v c="cmdstat_$(tr 'A-Z' 'a-z' <<<"${call[0]}")" '$1 == c { print $3, $7 }')
  units=$(( 1000000000 - $($rc GET 'seckill:{sale:1}:stock') ))
  read -r calls usec <<<"$stats"
  if [ -n "$ir" ]; then
    usec=$(( ir / calls / per ))
    printf '%-14s %8d instructions per reservation (all of Redis)   %s calls, %s units\n' "$name" "$usec" "$calls" "$units"
  else
    usec=$(awk -v u="$usec" -v n="$per" 'BEGIN { printf "%.2f", u / n }')
    printf '%-14s %8.2f us per reservation   %s calls, %s units   (%s)\n' "$name" "$usec" "$calls" "$units" \
      "$(grep -oE '[0-9.]+ requests per second' <<<"$out")"
  fi
  echo "$usec" >"$WORK/$name.usec"
  kill "$R_PID"; wait "$R_PID" 2>/dev/null || true; R_PID=""
}

six=(6 'seckill:{sale:1}:meta' 'seckill:{sale:1}:stock' 'seckill:{sale:1}:buyers'
  'seckill:{sale:1}:flow' 'seckill:{sale:1}:status' 'seckill:{sale:1}:queue')
four=(4 'seckill:{sale:1}:meta' 'seckill:{sale:1}:stock' 'seckill:{sale:1}:sale'
  'seckill:{sale:1}:queue')
echo "bench-redis-script: Redis $(redis-server --version | awk '{print $3}'), $CALLS calls each, redis-benchmark -c 2 -P 64, AOF everysec"
run evalsha "${six[@]}"
run fcall "${six[@]}"
run merged "${four[@]}"
run merged_fcall "${four[@]}"
run batch8 "${six[@]}"
run batch32 "${six[@]}"
awk -v e="$(cat "$WORK/evalsha.usec")" -v f="$(cat "$WORK/fcall.usec")" \
  -v m="$(cat "$WORK/merged.usec")" -v mf="$(cat "$WORK/merged_fcall.usec")" \
  -v b8="$(cat "$WORK/batch8.usec")" -v b32="$(cat "$WORK/batch32.usec")" 'BEGIN {
  printf "ratios to one buyer per call (evalsha): fcall %.2f, merged %.2f, merged_fcall %.2f, batch8 %.2f, batch32 %.2f (target <= 0.6)\n", f / e, m / e, mf / e, b8 / e, b32 / e
}'
