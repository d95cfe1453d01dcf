#!/usr/bin/env bash
# Benchmarks purchases over many client connections, directly and through
# the reverse proxy, and how many connections an nginx worker and a gateway
# hold and at what memory; prints figures (not a test: nothing here passes
# or fails on a number).
#
# tiny_http runs one thread per connection, so 1,000 client connections
# straight to the gateway are 1,000 gateway threads on the machine's cores.
# The deployment puts nginx in front (systemd/nginx-seckill.conf): nginx
# holds the client connections (epoll, no thread each) and sends their
# requests over its pool of kept-alive upstream connections (`keepalive
# 64` idle ones per worker), so the gateway runs a connection thread per
# request in flight, not per client. Paced rows: wrk -t2 with BENCH_MANY
# connections (default 1000), each connection waiting a random 0-2P ms
# (mean P) before each purchase, P set so that all of them offer each rate
# of BENCH_RATES (purchases/s, default "2000 4000 6000"); a distinct user
# per purchase (SECKILL_AUTH=none, limits off). For each: wrk's rate, p50,
# p99, socket errors, and the gateway's own count of 202s. Rows:
#   direct        BENCH_MANY connections straight to the gateway;
#   via_nginx     through the shipped include in a main file of the bench's
#                 own (one worker, worker_connections 4096);
#   via_installed through nginx installed as docs/OPERATIONS.md installs it
#                 (Debian's main file sized by scripts/nginx-crowd.sh,
#                 `worker_processes auto`: one worker per core;
#                 scripts/lib/nginx_installed.sh);
#   direct_64     64 connections straight to the gateway.
# Then connections held: BENCH_HOLD (default 5000) idle keep-alive
# connections (one GET /healthz each, then nothing;
# scripts/lib/bench_idle.py) to a fresh installed nginx, then straight to
# the gateway: RSS before and after (nginx: the sum of its workers, and the
# sockets each worker holds), per connection. (A crowd through Debian's
# stock main file and the installed one, every connection checked:
# tests/tests/ops_nginx_crowd.rs.)
#
# In every nginx the per-address limits (limit_conn, limit_req) are taken
# out, since the whole crowd comes from 127.0.0.1 (the gateway's own
# address limits are off here too), the upstream is the bench's gateway and
# it listens on a free local port.
#
# A private redis-server (AOF everysec) and nginx with every path in a
# scratch directory; the machine's Redis and nginx are never touched.
# Needs wrk, nginx, redis-server (installed with apt-get when missing).
# Usage: scripts/bench-nginx.sh (BENCH_SECONDS each run, default 8).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/services.sh

ensure_redis_server
ensure_package wrk wrk
ensure_package nginx nginx
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

SECONDS_EACH=${BENCH_SECONDS:-8}
MANY=${BENCH_MANY:-1000}
RATES=${BENCH_RATES:-"2000 4000 6000"}
cargo build --release -q -p seckill-gateway
GW=${CARGO_TARGET_DIR:-target}/release/seckill-gateway

. scripts/lib/bench_redis.sh
. scripts/lib/wrk_buy.sh
. scripts/lib/nginx_installed.sh
load_sale 1 1000000000
write_wrk_buy "$WORK"
export BENCH_WRK_THREADS=2 BENCH_REQS_PER_THREAD=$(( 10000 * SECONDS_EACH ))

SECKILL_LISTEN=127.0.0.1:$GPORT SECKILL_REDIS_URL=redis://127.0.0.1:$RPORT/ \
  SECKILL_AUTH=none SECKILL_GATEWAY_BUYER_RATE=0 SECKILL_GATEWAY_ADDRESS_RATE=0 \
  RUST_LOG=error "$GW" &
GW_PID=$!
for _ in $(seq 100); do port_open 127.0.0.1 "$GPORT" && break; sleep 0.05; done

NPORT=$(free_port)
mkdir -p "$WORK/nginx"
sed -e "s|server 127.0.0.1:8080 |server 127.0.0.1:$GPORT |" \
  -e "s|^    listen 80;|    listen 127.0.0.1:$NPORT;|" \
  -e '/^    limit_conn seckill_conn/d' -e '/^    limit_req zone=/d' \
  systemd/nginx-seckill.conf >"$WORK/nginx/seckill.conf"
N=$WORK/nginx
cat >"$N/nginx.conf" <<EOF
worker_processes 1;
pid $N/nginx.pid;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $N/body; proxy_temp_path $N/proxy;
    fastcgi_temp_path $N/fastcgi; uwsgi_temp_path $N/uwsgi; scgi_temp_path $N/scgi;
    include $N/seckill.conf;
}
EOF
"$NGINX" -p "$N" -c "$N/nginx.conf" -e "$N/error.log" -g "daemon off;" 2>"$N/stderr.log" &
NGINX_PID=$!
ONE_WORKER_PID=$NGINX_PID
# nginx_up DIR PORT: waits for the private nginx of DIR on PORT.
nginx_up() {
  for _ in $(seq 100); do port_open 127.0.0.1 "$2" && return 0; sleep 0.05; done
  cat "$1"/stderr.log "$1"/error.log "$1"/var/log/nginx/error.log 2>/dev/null >&2; exit 1
}
nginx_up "$N" "$NPORT"
IPORT=$(free_port)
nginx_install_private "$WORK/installed" "$IPORT" "$GPORT" 1
nginx_start_private "$WORK/installed"
INSTALLED_PID=$NGINX_PID
trap 'kill "$ONE_WORKER_PID" "$INSTALLED_PID" 2>/dev/null || true; cleanup' EXIT
nginx_up "$WORK/installed" "$IPORT"

accepted() { curl -s "http://127.0.0.1:$GPORT/metrics" |
  awk '/^seckill_gateway_requests_total\{.*route="purchase".*status="202"/ { n += $2 } END { print n + 0 }'; }

# paced NAME PORT CONNECTIONS RATE: one wrk run; prints a row.
paced() {
  local name=$1 port=$2 conns=$3 rate=$4 pace out a0 a1
  pace=$(awk -v n="$conns" -v r="$rate" 'BEGIN { printf "%d", n * 1000 / r }')
  { cat "$WORK/buy.lua"; echo "function delay() return math.random(0, 2 * $pace) end"; } >"$WORK/paced.lua"
  export BENCH_BARRIER=$WORK/barrier-$name-$rate
  mkdir -p "$BENCH_BARRIER"
  a0=$(accepted)
  out=$(wrk -t2 -c"$conns" -d"${SECONDS_EACH}s" --latency -s "$WORK/paced.lua" "http://127.0.0.1:$port/v1/sales/1/purchases")
  a1=$(accepted)
  awk -v name="$name" -v c="$conns" -v r="$rate" -v acc=$((a1 - a0)) -v s="$SECONDS_EACH" '
    function ms(v) { if (v ~ /us$/) { sub("us", "", v); return v / 1000 } if (v ~ /ms$/) { sub("ms", "", v); return v } sub("s", "", v); return v * 1000 }
    $1 == "50%" { p50 = ms($2) } $1 == "99%" { p99 = ms($2) } /^Requests\/sec:/ { rps = $2 }
    /Non-2xx/ { bad = $5 }
    /Socket errors:/ { gsub(",", ""); errs = $4 + $6 + $8 + $10 }
    END { printf "%-14s %5d conns  offered %6d/s  wrk %7.0f/s  gateway 202s %7.0f/s  p50 %7.2f ms  p99 %7.2f ms  non-2xx %d  socket errors %d\n",
      name, c, r, rps, acc / s, p50, p99, bad + 0, errs + 0 }' <<<"$out"
}

echo "bench-nginx: $(nproc) cores, ${SECONDS_EACH}s each, $($NGINX -v 2>&1 | sed 's/.*version: //'), wrk -t2 paced"
for rate in $RATES; do
  paced direct "$GPORT" "$MANY" "$rate"
  paced via_nginx "$NPORT" "$MANY" "$rate"
  paced via_installed "$IPORT" "$MANY" "$rate"
  paced direct_64 "$GPORT" 64 "$rate"
done
echo "gateway threads now: $(ls /proc/$GW_PID/task | wc -l) (nginx keeps at most 64 idle upstream connections per worker)"

HOLD=${BENCH_HOLD:-5000}
# A fresh installed nginx for the idle connections: a worker keeps the
# memory a crowd made it take, which would hide the cost of new ones.
HPORT=$(free_port)
nginx_install_private "$WORK/held" "$HPORT" "$GPORT" 1
nginx_start_private "$WORK/held"
HELD_PID=$NGINX_PID
trap 'kill "$ONE_WORKER_PID" "$INSTALLED_PID" "$HELD_PID" 2>/dev/null || true; cleanup' EXIT
nginx_up "$WORK/held" "$HPORT"
rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
workers() { cat "/proc/$HELD_PID/task/$HELD_PID/children"; }
workers_rss() { local w t=0; for w in $(workers); do t=$(( t + $(rss_kb "$w") )); done; echo "$t"; }
sockets() { find "/proc/$1/fd" -lname 'socket:*' 2>/dev/null | wc -l; }
# hold NAME PORT RSS_FN: BENCH_HOLD idle connections to PORT; prints RSS
# before and after (RSS_FN), per connection.
hold() {
  local name=$1 port=$2 rss=$3 r0 r1 per w
  r0=$($rss)
  coproc IDLE { exec python3 scripts/lib/bench_idle.py "$port" "$HOLD"; }
  read -r _ <&"${IDLE[0]}"
  sleep 1
  r1=$($rss)
  per=$(awk -v a="$r0" -v b="$r1" -v n="$HOLD" 'BEGIN { printf "%.1f", (b - a) / n }')
  printf '%-14s %6d idle connections held: RSS %d -> %d KiB, %s KiB per connection\n' "$name" "$HOLD" "$r0" "$r1" "$per"
  if [ "$name" = held_nginx ]; then
    for w in $(workers); do echo "  worker $w: $(sockets "$w") sockets, RSS $(rss_kb "$w") KiB"; done
  else
    echo "  gateway: $(ls "/proc/$GW_PID/task" | wc -l) threads"
  fi
  kill -TERM "$IDLE_PID"; wait "$IDLE_PID" 2>/dev/null || true
}
gw_rss() { rss_kb "$GW_PID"; }
sleep 2
hold held_nginx "$HPORT" workers_rss
sleep 2
hold held_gateway "$GPORT" gw_rss
