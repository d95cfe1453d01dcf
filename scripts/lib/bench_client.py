#!/usr/bin/env python3
"""A fixed number of requests for scripts/bench-instructions.sh: N requests
of one kind over C keep-alive connections (one thread each), counted by
status; prints "STATUS COUNT ..." and exits 1 when any answer is not the
expected status. Its own speed does not matter: the gateway it loads runs
under valgrind, and only the gateway's instructions are counted.

Usage: bench_client.py PORT KIND N C EXPECTED [TOKEN_FILE]
KIND: healthz (GET /healthz), buy:SALE (POST /v1/sales/SALE/purchases with
a distinct user id each, SECKILL_AUTH=none), token:SALE (the same with `{}`
and the next token of TOKEN_FILE, one a line, each used once).
"""

import collections
import http.client
import os
import sys
import threading


def main():
    port, kind, n, conns, expected = sys.argv[1:6]
    n, conns, expected = int(n), int(conns), int(expected)
    tokens = []
    if len(sys.argv) > 6:
        with open(sys.argv[6]) as f:
            tokens = [line.strip() for line in f if line.strip()]
    run = "%d-%d" % (os.getpid(), int.from_bytes(os.urandom(4), "big"))
    counts = collections.Counter()
    lock = threading.Lock()

    def request(i):
        if kind == "healthz":
            return "GET", "/healthz", None, {}
        what, sale = kind.split(":")
        path = "/v1/sales/%s/purchases" % sale
        headers = {"Content-Type": "application/json"}
        if what == "buy":
            return "POST", path, '{"user_id":"i%s-%d"}' % (run, i), headers
        headers["Authorization"] = "Bearer " + tokens[i]
        return "POST", path, "{}", headers

    def worker(t):
        con = http.client.HTTPConnection("127.0.0.1", int(port), timeout=60)
        local = collections.Counter()
        for i in range(t, n, conns):
            method, path, body, headers = request(i)
            con.request(method, path, body=body, headers=headers)
            r = con.getresponse()
            r.read()
            local[r.status] += 1
        con.close()
        with lock:
            counts.update(local)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(" ".join("%d %d" % kv for kv in sorted(counts.items())))
    sys.exit(0 if counts[expected] == n else 1)


if __name__ == "__main__":
    main()
