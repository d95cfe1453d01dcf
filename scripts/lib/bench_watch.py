#!/usr/bin/env python3
"""The server's own count for the gateway benchmarks (so that a rate the
load tool overstates shows as a MISMATCH): samples, every 20 ms until SIGTERM, the gateway's
request counters (`/metrics` over one keep-alive connection) and the units
reserved in Redis (`GET` of a sale's stock, over one RESP connection), then
prints, for each quantity that moved, one line

    NAME DELTA FIRST_S LAST_S

DELTA the quantity's change over the run, FIRST_S/LAST_S the server-side
interval in which it moved (seconds on this clock: half-way between the last
sample before the first change and the sample that saw it; likewise for the
last change), so DELTA / (LAST_S - FIRST_S) is the server's rate, whatever
the load tool thinks its own clock said. Names: `gw:ROUTE:STATUS` (from
`seckill_gateway_requests_total`), `gw:pipelined` and `gw:pipelines` (the
group commit's purchases and round trips), `units` (stock taken from the
sale: decreases of its stock counter).

Usage: bench_watch.py GATEWAY_PORT|- REDIS_PORT STOCK_KEY OUT_FILE
(a gateway port of `-`: Redis only). Its own cost: about 50 requests a
second to each server.
"""

import http.client
import re
import signal
import socket
import sys
import time

INTERVAL_S = 0.02
SERIES = re.compile(
    r'^seckill_gateway_requests_total\{route="([a-z_]+)",status="([0-9a-z]+)"\} ([0-9.e+]+)'
)
PLAIN = {
    "seckill_gateway_pipelined_purchases_total": "gw:pipelined",
    "seckill_gateway_redis_pipelines_total": "gw:pipelines",
}


def gateway_counts(con):
    con.request("GET", "/metrics")
    page = con.getresponse().read().decode()
    out = {}
    for line in page.splitlines():
        m = SERIES.match(line)
        if m:
            out["gw:%s:%s" % (m.group(1), m.group(2))] = float(m.group(3))
            continue
        name, _, value = line.partition(" ")
        if name in PLAIN:
            out[PLAIN[name]] = float(value)
    return out


class Redis:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.buf = b""

    def get_int(self, key):
        k = key.encode()
        self.sock.sendall(b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(k), k))
        while True:
            head, sep, rest = self.buf.partition(b"\r\n")
            if sep:
                if head.startswith(b"$-1"):
                    self.buf = rest
                    return 0
                if head.startswith(b"$"):
                    n = int(head[1:])
                    if len(rest) >= n + 2:
                        self.buf = rest[n + 2:]
                        return int(rest[:n])
                elif head:
                    raise RuntimeError("redis: %r" % head)
            self.buf += self.sock.recv(65536)


def main():
    gport, rport, stock_key, out_file = sys.argv[1:5]
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    con = None if gport == "-" else http.client.HTTPConnection("127.0.0.1", int(gport))
    redis = Redis(int(rport))
    samples = []  # (t, {name: value})
    while not stop:
        t0 = time.monotonic()
        values = {}
        if con is not None:
            try:
                values.update(gateway_counts(con))
                values["gw:up"] = 1
            except (OSError, http.client.HTTPException):
                con.close()
        values["units"] = -redis.get_int(stock_key)
        samples.append(((t0 + time.monotonic()) / 2, values))
        left = INTERVAL_S - (time.monotonic() - t0)
        if left > 0:
            time.sleep(left)
    names = set()
    for _, v in samples:
        names.update(v)
    names.discard("gw:up")
    # A gateway series appears with its first request: 0 before that.
    for _, v in samples:
        if "gw:up" in v:
            for name in names:
                if name.startswith("gw:"):
                    v.setdefault(name, 0)
    with open(out_file, "w") as f:
        for name in sorted(names):
            series = [(t, v[name]) for t, v in samples if name in v]
            if len(series) < 2:
                continue
            first_v, last_v = series[0][1], series[-1][1]
            if last_v == first_v:
                continue
            start = next(i for i, (_, v) in enumerate(series) if v != first_v)
            end = next(i for i, (_, v) in enumerate(series) if v == last_v)
            t_first = (series[start - 1][0] + series[start][0]) / 2
            t_last = (series[end - 1][0] + series[end][0]) / 2
            f.write("%s %d %.4f %.4f\n" % (name, last_v - first_v, t_first, t_last))


if __name__ == "__main__":
    main()
