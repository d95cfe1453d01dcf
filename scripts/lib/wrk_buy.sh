# Shared by the gateway benchmarks (bench-gateway.sh, bench-cluster.sh):
# `write_wrk_buy DIR` writes DIR/barrier.lua (every wrk thread formats its
# requests before any thread sends) and DIR/buy.lua (a purchase with a
# distinct user id per request). Needs BENCH_BARRIER, BENCH_WRK_THREADS and
# BENCH_REQS_PER_THREAD in wrk's environment.

write_wrk_buy() { # DIR
local WORK=$1
# wrk runs each thread's init() on its main thread, one thread after the
# other, and starts thread 0 before thread 1's init: a thread whose requests
# are formatted in init() would send while the next one is still formatting,
# before wrk's clock starts (a "5 s" run then sells for 7-8 s and wrk
# overstates its rate by 30 %). So every thread formats its
# requests in init(), marks itself ready in $BENCH_BARRIER, and sends its
# first request only once every thread is ready: all of them start
# together, at wrk's clock start. (wrk also calls thread 0's request() once
# on the main thread to check it; that call must not wait.)
cat >"$WORK/barrier.lua" <<'LUA'
local threads = 0
function setup(thread) thread:set("tid", threads); threads = threads + 1 end
local reqs, n, count, calls, released = {}, 0, 0, 0, false
local function ready(i) return io.open(os.getenv("BENCH_BARRIER") .. "/ready-" .. i, "r") end
local function wait_all()
  local total = tonumber(os.getenv("BENCH_WRK_THREADS"))
  for i = 0, total - 1 do
    while true do
      local f = ready(i)
      if f then f:close(); break end
      os.execute("sleep 0.002")
    end
  end
end
function init(args)
  count = fill(reqs)
  local f = io.open(os.getenv("BENCH_BARRIER") .. "/ready-" .. tid, "w"); f:close()
end
function request()
  calls = calls + 1
  if not released and (tid ~= 0 or calls > 1) then wait_all(); released = true end
  n = n + 1
  if n > count then n = 1 end
  return reqs[n]
end
LUA
# A distinct user id per request (run, wrk thread, counter). After
# BENCH_REQS_PER_THREAD requests a thread starts over (then the same users
# buy again: 409s, shown as non-2xx, and the Redis cross-check fails).
{ cat <<'LUA'
function fill(reqs)
  local run = tostring(os.time())
  local count = tonumber(os.getenv("BENCH_REQS_PER_THREAD"))
  for i = 1, count do
    reqs[i] = wrk.format("POST", nil, {["Content-Type"] = "application/json"},
      '{"user_id":"b' .. run .. '-' .. tid .. '-' .. i .. '"}')
  end
  return count
end
LUA
  cat "$WORK/barrier.lua"; } >"$WORK/buy.lua"
}
