# Shared shell functions of scripts/demo.sh and scripts/bench.sh: pick free
# loopback ports, start a private redis-server or mariadbd in a directory of
# our own, stop what was started. Sourced after scripts/lib/services.sh, not
# run. Nothing here touches the machine's own Redis or MariaDB data.

# ephemeral_low: the lowest port of the kernel's range for outgoing
# connections (32768 when it cannot be read). Ports are picked below it:
# one inside it may be the local end of an open outgoing connection, which
# a connect test does not see, and the bind then fails (the fresh-user
# pass: 3 of 6 demo runs on a busy machine).
ephemeral_low() {
  local low _
  read -r low _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || low=32768
  echo "${low:-32768}"
}

# free_port: prints a TCP port on 127.0.0.1 that nothing listens on, from
# 10000 up to below the kernel's outgoing range.
free_port() {
  local p i low
  low=$(ephemeral_low)
  for i in $(seq 1 200); do
    p=$(( 10000 + (RANDOM * 32768 + RANDOM) % (low - 10000) ))
    if ! port_open 127.0.0.1 "$p"; then echo "$p"; return 0; fi
  done
  echo "no free port found" >&2
  return 1
}

# wait_port PORT SECONDS: waits until 127.0.0.1:PORT accepts connections.
wait_port() {
  local i
  for i in $(seq 1 $(( $2 * 10 ))); do
    port_open 127.0.0.1 "$1" && return 0
    sleep 0.1
  done
  return 1
}

# redis_answers URL: whether a Redis server answers PING at redis://HOST:PORT/.
redis_answers() {
  local hostport=${1#redis://}
  hostport=${hostport%%/*}
  hostport=${hostport##*@}
  local host=${hostport%:*} port=${hostport##*:}
  [ "$host" = "$hostport" ] && port=6379
  command -v redis-cli >/dev/null 2>&1 || return 1
  [ "$(redis-cli -h "$host" -p "$port" ping 2>/dev/null)" = "PONG" ]
}

# empty_redis_db PORT: prints the highest logical database (15..1) of the
# Redis server on 127.0.0.1:PORT that holds no key, so a demo never shares
# keys (sale discovery, worker lists) with whatever uses the server.
empty_redis_db() {
  local n size
  for n in $(seq 15 -1 1); do
    size=$(redis-cli -p "$1" -n "$n" dbsize 2>/dev/null) || continue
    if [ "$size" = "0" ]; then echo "$n"; return 0; fi
  done
  return 1
}

# start_private_redis DIR PORT: redis-server with AOF on (fsync every
# second) on 127.0.0.1:PORT, data and log in DIR; pid in DIR/redis.pid.
start_private_redis() {
  ensure_redis_server
  mkdir -p "$1"
  redis-server --port "$2" --bind 127.0.0.1 --dir "$1" --save '' \
    --appendonly yes --appendfsync everysec --daemonize no \
    --logfile "$1/redis.log" >/dev/null 2>&1 &
  echo $! > "$1/redis.pid"
  wait_port "$2" 10 || { echo "private redis-server did not start: see $1/redis.log" >&2; return 1; }
}

# free_cluster_port: a free loopback port whose cluster bus port (+10000)
# is free too, both below the kernel's outgoing range (see ephemeral_low).
free_cluster_port() {
  local p i low
  low=$(ephemeral_low)
  for i in $(seq 1 200); do
    p=$(( 10000 + (RANDOM * 32768 + RANDOM) % (low - 20000) ))
    if ! port_open 127.0.0.1 "$p" && ! port_open 127.0.0.1 $((p + 10000)); then echo "$p"; return 0; fi
  done
  echo "no free port found" >&2
  return 1
}

# start_private_cluster DIR PORT...: a throw-away Redis Cluster, one
# redis-server per PORT (six: 3 masters, 3 replicas; cluster-enabled, AOF
# on), each in DIR/PORT with its pid in DIR/PORT/redis.pid, joined with
# redis-cli --cluster create and waited for until cluster_state:ok.
start_private_cluster() {
  ensure_redis_server
  local dir=$1 p nodes=() i
  shift
  for p in "$@"; do
    mkdir -p "$dir/$p"
    redis-server --port "$p" --bind 127.0.0.1 --dir "$dir/$p" --save '' \
      --appendonly yes --appendfsync everysec --daemonize no \
      --cluster-enabled yes --cluster-config-file nodes.conf \
      --logfile "$dir/$p/redis.log" >/dev/null 2>&1 &
    echo $! > "$dir/$p/redis.pid"
    nodes+=("127.0.0.1:$p")
  done
  for p in "$@"; do
    wait_port "$p" 10 || { echo "private redis-server did not start: see $dir/$p/redis.log" >&2; return 1; }
  done
  redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes \
    >"$dir/create.log" 2>&1 || { echo "redis-cli --cluster create failed: see $dir/create.log" >&2; return 1; }
  for i in $(seq 1 100); do
    redis-cli -p "$1" cluster info 2>/dev/null | grep -q '^cluster_state:ok' && return 0
    sleep 0.1
  done
  echo "the private cluster did not reach cluster_state:ok: see $dir/create.log" >&2
  return 1
}

# start_private_mariadb DIR PORT: a throw-away MariaDB (mariadb-install-db,
# root without password over TCP) on 127.0.0.1:PORT; pid in DIR/mariadb.pid.
start_private_mariadb() {
  ensure_package mariadbd mariadb-server mariadb-client
  local user
  user=$(id -un)
  mkdir -p "$1/data"
  mariadb-install-db --no-defaults --datadir="$1/data" --user="$user" \
    --auth-root-authentication-method=normal --skip-test-db >"$1/install.log" 2>&1 \
    || { echo "mariadb-install-db failed: see $1/install.log" >&2; return 1; }
  local mariadbd=mariadbd
  command -v mariadbd >/dev/null 2>&1 || mariadbd=/usr/sbin/mariadbd
  "$mariadbd" --no-defaults --datadir="$1/data" --user="$user" \
    --bind-address=127.0.0.1 --port="$2" --socket="$1/mysqld.sock" \
    --pid-file="$1/mariadbd.pid" --log-error="$1/mariadb.err" \
    --innodb-buffer-pool-size=128M --innodb-flush-log-at-trx-commit=1 \
    --skip-name-resolve >/dev/null 2>&1 &
  echo $! > "$1/mariadb.pid"
  wait_port "$2" 60 || { echo "private mariadbd did not start: see $1/mariadb.err" >&2; return 1; }
}

# stop_pidfile FILE [SECONDS]: SIGTERM to the pid in FILE, SIGKILL when it
# still runs after SECONDS (default 20); removes FILE.
stop_pidfile() {
  [ -f "$1" ] || return 0
  local pid i
  pid=$(cat "$1")
  rm -f "$1"
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in $(seq 1 $(( ${2:-20} * 10 ))); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

# mysql_client_args URL: `mariadb` client arguments for
# mysql://USER[:PASSWORD]@HOST[:PORT][/DB] (TCP, never the root socket).
mysql_client_args() {
  local re='^mysql://([^:@/]+)(:([^@/]*))?@([^:/]+)(:([0-9]+))?'
  [[ "$1" =~ $re ]] || return 1
  echo "--protocol=TCP -h${BASH_REMATCH[4]} -P${BASH_REMATCH[6]:-3306} -u${BASH_REMATCH[1]} ${BASH_REMATCH[3]:+-p${BASH_REMATCH[3]}}"
}
