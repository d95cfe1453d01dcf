#!/usr/bin/env bash
# Redis memory per reservation (docs/OPERATIONS.md, "Watching Redis and
# MySQL", the sizing rule): on a fresh private redis-server (AOF on, as in
# production), one sale of plenty of stock, N reservations of distinct
# buyers made with the reservation script as the gateway sends it
# (EVALSHA of common/src/reservation.rs; user ids of 17 characters,
# reservation ids of 32), no worker: every message stays queued. Prints
# used_memory before and after, bytes per reservation, and per key kind
# (MEMORY USAGE ... SAMPLES 0): the queued message, the buyer, the flow
# record, the status. Figures, not a test. Usage: scripts/redis-sizing.sh
# (SIZING_RESERVATIONS, default 100000).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/services.sh
ensure_redis_server
ensure_package redis-benchmark redis-tools
N=${SIZING_RESERVATIONS:-100000}

cargo build -q -p seckill-common --example lua_script
lua_src=$("${CARGO_TARGET_DIR:-target}/debug/examples/lua_script" reserve)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
R_PID=""
cleanup() { [ -n "$R_PID" ] && kill "$R_PID" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --save "" --appendonly yes >/dev/null &
R_PID=$!
rc="redis-cli -p $port"
for _ in $(seq 600); do $rc PING >/dev/null 2>&1 && break; sleep 0.05; done
now=$(( $(date +%s%3N) - 1000 ))
k='seckill:{sale:1}'
$rc HSET "$k:meta" total_stock 1000000000 starts_at_ms "$now" ends_at_ms $(( now + 3600000 )) >/dev/null
$rc SET "$k:stock" 1000000000 >/dev/null
sha=$($rc SCRIPT LOAD "$lua_src")
mem() { $rc INFO memory | tr -d '\r' | awk -F: '$1 == "used_memory" { print $2 }'; }
usage() { $rc MEMORY USAGE "$k:$1" SAMPLES 0; }
before=$(mem)
redis-benchmark -p "$port" -c 2 -P 64 -n "$N" -r 1000000000 -q EVALSHA "$sha" 6 \
  "$k:meta" "$k:stock" "$k:buyers" "$k:flow" "$k:status" "$k:queue" \
  "user-__rand_int__" "abc__rand_int____rand_int__defgh" 1 >/dev/null
after=$(mem)
units=$(( 1000000000 - $($rc GET "$k:stock") ))
echo "redis-sizing: Redis $(redis-server --version | awk '{print $3}'), $units reservations, none applied"
echo "used_memory $before -> $after: $(( (after - before) / units )) bytes per reservation"
echo "per reservation: queued message $(( $(usage queue) / units )), buyer $(( $(usage buyers) / units )), flow record $(( $(usage flow) / units )), status $(( $(usage status) / units )) bytes"
