# nginx installed as docs/OPERATIONS.md (Deployment, step 6) installs it,
# in a scratch prefix, for the benchmarks (sourced; tests/tests/ops_nginx_crowd.rs
# runs the documented steps themselves). The machine's /etc/nginx is only
# read: Debian's nginx.conf, mime.types and the default site are copied,
# their absolute paths (/etc/nginx/, /var/log/nginx/, /run/nginx.pid)
# pointed into the prefix, the package's compiled-in temporary directories
# moved there by a conf.d file, and the default site removed as the docs do.
#
# nginx_install_private DIR LISTEN_PORT GATEWAY_PORT SIZED: builds the tree
# under DIR. SIZED=1 runs the sizing steps (scripts/nginx-crowd.sh on the
# main file, the nginx.service.d drop-in's LimitNOFILE); SIZED=0 is Debian's
# stock main file. The shipped include listens on 127.0.0.1:LISTEN_PORT,
# names the gateway on GATEWAY_PORT, and loses its per-address limits
# (limit_conn, limit_req): a bench's whole crowd comes from 127.0.0.1.
# Sets NGINX_NOFILE to the descriptor limit systemd would give nginx (the
# drop-in's, or systemd's default 1024:524288), each part at most this
# shell's hard limit (raising it needs CAP_SYS_RESOURCE, which a container
# may lack).
#
# nginx_start_private DIR: starts that nginx (master and workers, daemon
# off) in the background under NGINX_NOFILE; sets NGINX_PID (the master).
nginx_install_private() {
  local dir=$1 listen=$2 gw=$3 sized=$4 f
  mkdir -p "$dir/etc/nginx/conf.d" "$dir/etc/nginx/modules-enabled" "$dir/etc/nginx/sites-enabled" \
    "$dir/etc/nginx/sites-available" "$dir/var/log/nginx" "$dir/run" "$dir/var/lib/nginx"
  for f in nginx.conf mime.types sites-available/default; do cp "/etc/nginx/$f" "$dir/etc/nginx/$f"; done
  sed -i -e "s|/etc/nginx/|$dir/etc/nginx/|g" -e "s|/var/log/nginx/|$dir/var/log/nginx/|g" \
    -e "s|/run/nginx.pid|$dir/run/nginx.pid|g" "$dir/etc/nginx/nginx.conf"
  for f in client_body proxy fastcgi uwsgi scgi; do echo "${f}_temp_path $dir/var/lib/nginx/$f;"; done \
    >"$dir/etc/nginx/conf.d/private-temp-paths.conf"
  sed -e "s|server 127.0.0.1:8080 |server 127.0.0.1:$gw |" \
    -e "s|^    listen 80;|    listen 127.0.0.1:$listen;|" \
    -e '/^    limit_conn seckill_conn/d' -e '/^    limit_req zone=/d' \
    systemd/nginx-seckill.conf >"$dir/etc/nginx/conf.d/seckill.conf"
  NGINX_NOFILE=1024:524288
  if [ "$sized" = 1 ]; then
    scripts/nginx-crowd.sh "$dir/etc/nginx/nginx.conf" >/dev/null
    NGINX_NOFILE=$(sed -n 's/^LimitNOFILE=//p' systemd/nginx.service.d/seckill.conf)
    case $NGINX_NOFILE in *:*) ;; *) NGINX_NOFILE=$NGINX_NOFILE:$NGINX_NOFILE ;; esac
  fi
  local hard soft
  hard=$(ulimit -Hn) soft=${NGINX_NOFILE%%:*}
  [ "$hard" = unlimited ] || NGINX_NOFILE=$(( soft < hard ? soft : hard )):$(( ${NGINX_NOFILE##*:} < hard ? ${NGINX_NOFILE##*:} : hard ))
}

nginx_start_private() {
  local dir=$1 nginx
  nginx=$(command -v nginx || echo /usr/sbin/nginx)
  prlimit --nofile="$NGINX_NOFILE" -- "$nginx" -p "$dir" -c "$dir/etc/nginx/nginx.conf" \
    -e "$dir/var/log/nginx/error.log" -g 'daemon off; master_process on;' 2>"$dir/stderr.log" &
  NGINX_PID=$!
}
