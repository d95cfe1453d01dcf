# Shared shell functions of scripts/demo.sh: find and remove exactly the
# Redis keys one run created (one sale's `seckill:{sale:ID}:*` keys, the
# payment receipts `seckill:{payments}:receipt:RID` of its reservations, its id in
# `seckill:sales`, its worker ids in `seckill:workers` and their heartbeats)
# on a Redis it did not start, so a shared server is left as it was. Keys
# are found with SCAN MATCH on the sale's exact hash-tag prefix: never KEYS,
# never FLUSHDB. Key names as in common/src/keys.rs. Sourced, not run.

# rcli URL ARGS...: redis-cli on URL (redis://[user:pass@]host:port/db).
rcli() {
  local url=$1; shift
  redis-cli -u "$url" --no-auth-warning "$@"
}

# redis_sale_keys URL SALE: prints every key of sale SALE, one a line.
redis_sale_keys() {
  rcli "$1" --scan --pattern "seckill:{sale:$2}:*"
}

# redis_set_members URL KEY: prints the members of set KEY, one a line
# (SSCAN, never SMEMBERS on an unbounded set).
redis_set_members() {
  local cursor=0 out
  while :; do
    out=$(rcli "$1" sscan "$2" "$cursor" COUNT 1000) || return 1
    cursor=$(head -n 1 <<<"$out")
    tail -n +2 <<<"$out" | grep -v '^$' || true
    [ "$cursor" = 0 ] && return 0
    [[ "$cursor" =~ ^[0-9]+$ ]] || return 1
  done
}

# redis_hash_fields URL KEY: prints the fields of hash KEY, one a line
# (HSCAN, never HKEYS on an unbounded hash).
redis_hash_fields() {
  local cursor=0 out
  while :; do
    out=$(rcli "$1" hscan "$2" "$cursor" COUNT 1000) || return 1
    cursor=$(head -n 1 <<<"$out")
    tail -n +2 <<<"$out" | awk 'NR % 2 == 1' | grep -v '^$' || true
    [ "$cursor" = 0 ] && return 0
    [[ "$cursor" =~ ^[0-9]+$ ]] || return 1
  done
}

# redis_worker_holds URL WORKER: prints how many messages WORKER's
# processing lists hold over every sale in seckill:sales. A worker holding
# any must stay in seckill:workers: removing it would leave them for no one
# to reclaim.
redis_worker_holds() {
  local sales
  sales=$(redis_set_members "$1" seckill:sales) || return 1
  [ -n "$sales" ] || { echo 0; return 0; }
  local s
  for s in $sales; do
    printf 'LLEN "seckill:{sale:%s}:processing:%s"\n' "$s" "$2"
  done | rcli "$1" | awk '{ n += $1 } END { print n + 0 }'
}

# remove_run_keys URL SALE WORKER...: removes what one demo run created on
# the Redis at URL: the keys of sale SALE (empty: none), SALE in
# seckill:sales, each WORKER in seckill:workers (unless its processing lists
# of another sale still hold messages: then it stays, with a warning) and
# each WORKER's heartbeat. Prints one line per kind of key removed.
remove_run_keys() {
  local url=$1 sale=$2; shift 2
  local n w held gone=()
  if [ -n "$sale" ]; then
    # The payment receipts of its reservations (common/src/receipt.rs): an
    # expired order's closing mark outlives the sale by an hour.
    n=$(redis_sale_keys "$url" "$sale" | grep ':status$' \
      | while read -r k; do redis_hash_fields "$url" "$k" || exit 1; done \
      | sed 's/^/seckill:{payments}:receipt:/' \
      | xargs -r -d '\n' -n 100 redis-cli -u "$url" --no-auth-warning unlink \
      | awk '{ n += $1 } END { print n + 0 }') || return 1
    echo "removed the $n payment receipts of its reservations"
    n=$(redis_sale_keys "$url" "$sale" \
      | xargs -r -d '\n' -n 100 redis-cli -u "$url" --no-auth-warning unlink \
      | awk '{ n += $1 } END { print n + 0 }') || return 1
    rcli "$url" srem seckill:sales "$sale" >/dev/null || return 1
    echo "removed the $n keys seckill:{sale:$sale}:* and $sale from seckill:sales"
  fi
  for w in "$@"; do
    rcli "$url" del "seckill:worker:$w:heartbeat" >/dev/null || return 1
    held=$(redis_worker_holds "$url" "$w") || return 1
    if [ "$held" = 0 ]; then
      rcli "$url" srem seckill:workers "$w" >/dev/null || return 1
      gone+=("$w")
    else
      echo "kept $w in seckill:workers: its processing lists still hold $held messages of other sales (other workers reclaim them)" >&2
    fi
  done
  [ $# -gt 0 ] && echo "deleted the heartbeats of $*; removed ${gone[*]:-none of them} from seckill:workers"
  return 0
}

# print_run_keys_removal URL SALE WORKER...: prints ready-to-paste commands
# that remove what remove_run_keys would.
print_run_keys_removal() {
  local url=$1 sale=$2; shift 2
  local r="redis-cli -u '$url'"
  if [ -n "$sale" ]; then
    echo "  $r --raw hkeys 'seckill:{sale:$sale}:status' | sed 's/^/seckill:{payments}:receipt:/' | xargs -r -d '\\n' $r unlink"
    echo "  $r --scan --pattern 'seckill:{sale:$sale}:*' | xargs -r -d '\\n' $r unlink"
    echo "  $r srem seckill:sales $sale"
  fi
  if [ $# -gt 0 ]; then
    echo "  $r srem seckill:workers $*"
    local w hb=""
    for w in "$@"; do hb="$hb seckill:worker:$w:heartbeat"; done
    echo "  $r del$hb"
  fi
}
