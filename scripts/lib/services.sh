# Shared shell functions of scripts/*.sh: find or install and start the
# services the project needs. Sourced, not run.

apt_updated=0
# ensure_package COMMAND PACKAGE...: installs PACKAGEs with apt-get when
# COMMAND is not on the PATH (Debian/Ubuntu; as root or with sudo).
ensure_package() {
  local cmd=$1; shift
  if command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ]; then return 0; fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "missing $cmd and no apt-get to install $*: install it by hand" >&2
    return 1
  fi
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  if [ "$apt_updated" -eq 0 ]; then
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    apt_updated=1
  fi
  echo "installing $* (for $cmd)" >&2
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}

ensure_redis_server() {
  ensure_package redis-server redis-server
}

# ensure_package_unstarted COMMAND SERVICE PACKAGE...: like ensure_package,
# but the services the packages ship are not started: a policy-rc.d that
# refuses every service start is put in place for the install (the one
# found is restored), and the unit SERVICE is disabled afterwards where
# systemd runs. The tests start their own private instances.
ensure_package_unstarted() {
  local cmd=$1 service=$2; shift 2
  if command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ]; then return 0; fi
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  local policy=/usr/sbin/policy-rc.d saved=""
  if [ -e "$policy" ]; then
    saved=$(mktemp)
    $sudo cp -p "$policy" "$saved"
  fi
  printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
  $sudo chmod 755 "$policy"
  local rc=0
  ensure_package "$cmd" "$@" || rc=$?
  if [ -n "$saved" ]; then $sudo mv "$saved" "$policy"; else $sudo rm -f "$policy"; fi
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    $sudo systemctl disable --now "$service" >/dev/null 2>&1 || true
  fi
  return "$rc"
}

# ensure_promtool: installs Debian's `prometheus` (promtool's package, which
# also ships the `prometheus` server that tests/tests/ops_prometheus.rs
# runs privately) when promtool is missing, without its recommended
# exporters and without starting the system's Prometheus service.
ensure_promtool() {
  ensure_package_unstarted promtool prometheus --no-install-recommends prometheus
}

# ensure_node_exporter: installs Debian's `prometheus-node-exporter` (its
# textfile collector exports the reconciler's metrics file;
# tests/tests/ops_prometheus.rs runs one privately) without starting the
# system's exporter.
ensure_node_exporter() {
  ensure_package_unstarted prometheus-node-exporter prometheus-node-exporter \
    --no-install-recommends prometheus-node-exporter
}

# ensure_store_exporters: installs Debian's `prometheus-redis-exporter` and
# `prometheus-mysqld-exporter` (tests/tests/ops_exporters.rs runs one of each
# privately against its own Redis and MariaDB) without starting the system's
# exporters.
ensure_store_exporters() {
  ensure_package_unstarted prometheus-redis-exporter prometheus-redis-exporter \
    --no-install-recommends prometheus-redis-exporter
  ensure_package_unstarted prometheus-mysqld-exporter prometheus-mysqld-exporter \
    --no-install-recommends prometheus-mysqld-exporter
}

# ensure_nginx: installs Debian's `nginx` (for tests/tests/ops_nginx.rs,
# which runs its own private nginx) without starting the system's nginx.
ensure_nginx() {
  ensure_package_unstarted nginx nginx --no-install-recommends nginx
}

# ensure_chromium: installs Debian's `chromium` (tests/tests/e2e_demo.rs
# renders the demo's report.html in it, headless) when missing.
ensure_chromium() {
  ensure_package chromium chromium
}

# The cargo-deb release scripts/package.sh builds the package with
# (crates.io).
CARGO_DEB_VERSION=3.8.0

# ensure_cargo_deb: installs cargo-deb $CARGO_DEB_VERSION with `cargo install
# --locked` (into cargo's bin directory, ${CARGO_HOME:-~/.cargo}/bin, kept
# across builds) when `cargo deb` is missing or another version.
ensure_cargo_deb() {
  if [ "$(cargo deb --version 2>/dev/null)" = "cargo-deb $CARGO_DEB_VERSION" ]; then return 0; fi
  echo "installing cargo-deb $CARGO_DEB_VERSION (for scripts/package.sh)" >&2
  # Its own build directory: not the workspace's CARGO_TARGET_DIR.
  env -u CARGO_TARGET_DIR cargo install --locked --version "$CARGO_DEB_VERSION" cargo-deb >&2
}

# port_open HOST PORT: whether something accepts TCP connections there.
port_open() {
  (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
}

# ensure_mariadb_running: installs mariadb-server when missing and starts the
# system instance when nothing listens on 127.0.0.1:3306.
ensure_mariadb_running() {
  if port_open 127.0.0.1 3306; then return 0; fi
  ensure_package mariadbd mariadb-server mariadb-client
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo mkdir -p /run/mysqld
  $sudo chown mysql:mysql /run/mysqld 2>/dev/null || true
  if [ ! -d /var/lib/mysql/mysql ]; then
    $sudo mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
  fi
  echo "starting MariaDB (nothing listened on 127.0.0.1:3306)" >&2
  $sudo start-stop-daemon --start --oknodo --background \
    --exec /usr/sbin/mariadbd -- --user=mysql --bind-address=127.0.0.1 --port=3306
  local i
  for i in $(seq 1 100); do
    port_open 127.0.0.1 3306 && return 0
    sleep 0.2
  done
  echo "MariaDB did not start on 127.0.0.1:3306" >&2
  return 1
}

# mysql_tcp_ok USER PASSWORD: whether USER can log in over TCP to 127.0.0.1.
mysql_tcp_ok() {
  mariadb --protocol=TCP -h127.0.0.1 -P3306 -u"$1" ${2:+-p"$2"} -e 'SELECT 1' >/dev/null 2>&1
}

# ensure_mysql_test_account: exports SECKILL_TEST_MYSQL_URL for an account
# that can create and drop databases over TCP. Uses the variable when set,
# else root with an empty password when that works over TCP, else creates
# (through the root Unix socket) the account seckill_test/seckill_test with
# rights on databases named seckill_test_* only. Root is never changed.
ensure_mysql_test_account() {
  if [ -n "${SECKILL_TEST_MYSQL_URL:-}" ]; then return 0; fi
  ensure_mariadb_running
  ensure_package mariadb mariadb-client
  if mysql_tcp_ok root ""; then
    export SECKILL_TEST_MYSQL_URL="mysql://root@127.0.0.1:3306/"
    return 0
  fi
  if ! mysql_tcp_ok seckill_test seckill_test; then
    echo "root cannot log in over TCP (Debian's unix_socket default): creating account seckill_test" >&2
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo mariadb -uroot <<'SQL'
CREATE USER IF NOT EXISTS 'seckill_test'@'localhost' IDENTIFIED BY 'seckill_test';
CREATE USER IF NOT EXISTS 'seckill_test'@'127.0.0.1' IDENTIFIED BY 'seckill_test';
GRANT ALL PRIVILEGES ON `seckill\_test\_%`.* TO 'seckill_test'@'localhost';
GRANT ALL PRIVILEGES ON `seckill\_test\_%`.* TO 'seckill_test'@'127.0.0.1';
GRANT ALL PRIVILEGES ON `seckill\_demo\_%`.* TO 'seckill_test'@'localhost';
GRANT ALL PRIVILEGES ON `seckill\_demo\_%`.* TO 'seckill_test'@'127.0.0.1';
FLUSH PRIVILEGES;
SQL
  fi
  export SECKILL_TEST_MYSQL_URL="mysql://seckill_test:seckill_test@127.0.0.1:3306/"
}

# The schemathesis release tests/tests/api_contract.rs runs (PyPI).
SCHEMATHESIS_VERSION=4.32.5
# PyJWT (and the cryptography it brings for RS256 and ES256), pinned like
# schemathesis: ensure_pyjwt.
PYJWT_VERSION=2.15.1

# ensure_schemathesis: installs schemathesis $SCHEMATHESIS_VERSION in a
# virtual environment under the build directory
# (${CARGO_TARGET_DIR:-target}/venv-schemathesis) when it is missing or
# another version, installing Debian's python3-venv first when needed, and
# exports SECKILL_SCHEMATHESIS (its `st`) for the contract test.
ensure_schemathesis() {
  local venv
  venv="$(realpath -m "${CARGO_TARGET_DIR:-target}")/venv-schemathesis"
  local st="$venv/bin/st"
  if [ -x "$st" ] && [ "$("$st" --version 2>/dev/null)" = "st, version $SCHEMATHESIS_VERSION" ]; then
    export SECKILL_SCHEMATHESIS="$st"
    return 0
  fi
  make_venv "$venv" "schemathesis==$SCHEMATHESIS_VERSION" tests/tests/api_contract.rs
  export SECKILL_SCHEMATHESIS="$st"
}

# ensure_pyjwt: installs PyJWT $PYJWT_VERSION with its `crypto` extra
# (cryptography, for RS256 and ES256) in a virtual environment under the
# build directory (${CARGO_TARGET_DIR:-target}/venv-pyjwt) when it is missing
# or another version, and exports SECKILL_PYJWT_PYTHON (its python) for
# tests/tests/gateway_provider_keys.rs: tokens minted by an independent JWT
# library, as a shop's identity provider mints them.
ensure_pyjwt() {
  local venv
  venv="$(realpath -m "${CARGO_TARGET_DIR:-target}")/venv-pyjwt"
  local py="$venv/bin/python"
  if [ -x "$py" ] && [ "$("$py" -c 'import jwt, cryptography; print(jwt.__version__)' 2>/dev/null)" = "$PYJWT_VERSION" ]; then
    export SECKILL_PYJWT_PYTHON="$py"
    return 0
  fi
  make_venv "$venv" "pyjwt[crypto]==$PYJWT_VERSION" tests/tests/gateway_provider_keys.rs
  export SECKILL_PYJWT_PYTHON="$py"
}

# make_venv DIR REQUIREMENT USER: a new Python virtual environment at DIR
# (replacing what is there) with pip's REQUIREMENT installed; python3 and its
# venv module come from Debian when missing. USER names what needs it, for
# the message.
make_venv() {
  local venv=$1 requirement=$2 user=$3
  ensure_package python3 python3
  if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    ensure_package no-such-command-venv python3-venv
  fi
  echo "installing $requirement in $venv (for $user)" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "$requirement" >&2
}
