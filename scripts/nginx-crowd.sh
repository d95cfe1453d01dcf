#!/usr/bin/env bash
# Sizes Debian's nginx main file for a sale's crowd: sets
# `worker_connections` in its `events {}` block and `worker_rlimit_nofile`
# at its main level, the two settings an `http{}`-level include
# (systemd/nginx-seckill.conf in conf.d/) cannot carry. Debian keeps
# `worker_processes auto; events { worker_connections 768; }`: 768
# connections per worker, each proxied purchase taking two of them (the
# client's and the gateway's), so a 2-core host drops clients past about
# 1,500 (docs/OPERATIONS.md, "nginx for a crowd").
#
# The rule (one nginx worker per core, `worker_processes auto`):
#   worker_connections >= clients a worker holds
#                         + one gateway connection per request in flight
#                           (at most one per client)
#                         + the idle gateway pool (`keepalive 64`)
#                         + its listening sockets.
# Workers do not share the crowd evenly (whichever wakes first accepts), so
# each is sized for 8,192 clients with a request in flight each: 16,384
# connections, or about 16,000 idle keep-alive clients. nginx allocates
# the slots at start, about 0.4 KiB each (an idle worker's RSS 4.2 MiB
# with 768, 10.8 MiB with 16,384); an open client connection costs more
# (docs/PERFORMANCE.md, "Connections one nginx worker and one gateway
# hold"). Each connection is one descriptor: `worker_rlimit_nofile` is
# worker_connections + 1,024 (logs, temporary files, listening sockets),
# so the connection limit is reached first. The workers set it as root,
# before switching to www-data; systemd/nginx.service.d/seckill.conf gives
# the service the same limit (LimitNOFILE). Raising either above the
# hard limit needs CAP_SYS_RESOURCE (a container may lack it: nginx then
# logs "setrlimit(RLIMIT_NOFILE, ...) failed" and keeps the limit it has).
#
# Edits the file in place (a copy is kept as FILE.seckill-orig the first
# time), is idempotent, and refuses a file whose shape it does not know
# (no `events {` block with exactly one `worker_connections` line). Check
# the result with `nginx -t` (docs/OPERATIONS.md, Deployment step 6).
# Exit 0: sized (or already was); 1: the file is missing or not the shape
# expected; 2: usage.
#
# usage: scripts/nginx-crowd.sh [MAIN_FILE]   (default /etc/nginx/nginx.conf)
set -euo pipefail

WORKER_CONNECTIONS=16384
RLIMIT_NOFILE=17408

usage() {
  sed -n '2,/^# usage:/s/^# \{0,1\}//p' "$0"
}

main=/etc/nginx/nginx.conf
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    -*) echo "nginx-crowd: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) main=$1 ;;
  esac
  shift
done

[ -f "$main" ] || { echo "nginx-crowd: $main: no such file (the main file of Debian's nginx: apt-get install nginx)" >&2; exit 1; }

# The `events {` block must hold exactly one worker_connections line.
n=$(awk '/^[ \t]*events[ \t]*\{/ { inside = 1; next }
         inside && /^[ \t]*\}/ { inside = 0 }
         inside && /^[ \t]*worker_connections[ \t]/ { n++ }
         END { print n + 0 }' "$main")
if [ "$n" != 1 ]; then
  echo "nginx-crowd: $main: expected one 'worker_connections N;' line inside 'events {', found $n; set 'worker_connections $WORKER_CONNECTIONS;' there and 'worker_rlimit_nofile $RLIMIT_NOFILE;' at the top level by hand" >&2
  exit 1
fi
[ -e "$main.seckill-orig" ] || cp -p "$main" "$main.seckill-orig"

tmp=$(mktemp "$main.XXXXXX")
trap 'rm -f "$tmp"' EXIT
awk -v wc="$WORKER_CONNECTIONS" -v nofile="$RLIMIT_NOFILE" '
  # Any top-level worker_rlimit_nofile is replaced by ours, placed before
  # the events block.
  /^worker_rlimit_nofile[ \t]/ { next }
  /^[ \t]*events[ \t]*\{/ {
    print "worker_rlimit_nofile " nofile ";  # scripts/nginx-crowd.sh"
    inside = 1; print; next
  }
  inside && /^[ \t]*\}/ { inside = 0 }
  inside && /^[ \t]*worker_connections[ \t]/ {
    match($0, /^[ \t]*/)
    print substr($0, 1, RLENGTH) "worker_connections " wc ";  # scripts/nginx-crowd.sh"
    next
  }
  { print }' "$main" >"$tmp"
chmod --reference="$main" "$tmp"
mv "$tmp" "$main"
trap - EXIT
echo "nginx-crowd: $main: worker_connections $WORKER_CONNECTIONS, worker_rlimit_nofile $RLIMIT_NOFILE (original kept as $main.seckill-orig)"
