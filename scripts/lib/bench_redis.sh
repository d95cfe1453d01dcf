# Shared by the gateway benchmarks (bench-gateway.sh, bench-shed.sh): a
# private redis-server on a free port (AOF on, appendfsync everysec,
# automatic AOF rewrites off: a rewrite forks Redis and its child takes a
# core for seconds), a scratch directory removed on exit with the Redis and
# any gateway ($GW_PID), `rc` for redis-cli on it, and `load_sale ID STOCK`
# for a sale open for the next hour. The machine's Redis is never touched.
# Source it after `set -euo pipefail`; it sets WORK, RPORT, GPORT, GW_PID,
# R_PID, now_ms, end_ms.

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
WORK=$(mktemp -d)
RPORT=$(free_port)
GPORT=$(free_port)
GW_PID=""
cleanup() {
  [ -n "$GW_PID" ] && kill "$GW_PID" 2>/dev/null || true
  [ -n "${R_PID:-}" ] && kill "$R_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

${REDIS_PIN:-} redis-server --port "$RPORT" --bind 127.0.0.1 --dir "$WORK" --save "" \
  --appendonly yes --appendfsync everysec --auto-aof-rewrite-percentage 0 \
  --daemonize no --loglevel warning >/dev/null &
R_PID=$!
rc() { redis-cli -p "$RPORT" "$@"; }
for _ in $(seq 100); do rc PING >/dev/null 2>&1 && break; sleep 0.05; done

now_ms=$(( $(date +%s%3N) - 1000 )); end_ms=$(( now_ms + 3600000 ))
load_sale() { # ID STOCK
  rc HSET "seckill:{sale:$1}:meta" total_stock "$2" starts_at_ms "$now_ms" ends_at_ms "$end_ms" >/dev/null
  rc SET "seckill:{sale:$1}:stock" "$2" >/dev/null
  rc SADD seckill:sales "$1" >/dev/null
}
