#!/usr/bin/env python3
"""Redis side of scripts/bench-reconciler.sh --backlog (prints figures; not a
test), over one plain RESP connection each:

  fill PORT SHA SALE FIRST COUNT   COUNT real reservations through the
      reservation script (the gateway's batch form, 1,000 buyers a call):
      users qFIRST.., reservation ids FIRST.. as 32 hex digits; RESP on stdout
      for `redis-cli --pipe`
  probe PORT SHA SALE BASE MS STOPFILE   one purchase (the reservation
      script, one buyer, as the gateway calls it; users pBASE+1..,
      reservation ids BASE+1..) every MS ms until STOPFILE exists; prints
      "n p50 p99 max", µs of the round trips
  clients PORT   the address of every connected client, one a line
  slowlog PORT CLIENTSFILE   Redis's SLOWLOG of the clients not in
      CLIENTSFILE (the reconciler's): per command, calls, p50, p99 and max µs
"""

import os
import socket
import sys
import time


def keys(sale):
    tag = "seckill:{sale:%s}:" % sale
    return [tag + k for k in ("meta", "stock", "buyers", "flow", "status", "queue")]


def resp(args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", int(port)))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.f = self.s.makefile("rb")

    def call(self, *args):
        self.s.sendall(resp(args))
        return self.read()

    def read(self):
        line = self.f.readline()
        kind, rest = line[:1], line[1:-2]
        if kind in (b"+", b":"):
            return int(rest) if kind == b":" else rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.f.read(n + 2)[:-2]
            return data.decode(errors="replace")
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise RuntimeError("unexpected reply %r" % line)


def fill(port, sha, sale, first, count):
    k = keys(sale)
    out = sys.stdout.buffer
    i, end = int(first), int(first) + int(count)
    while i < end:
        j = min(i + 1000, end)
        args = ["EVALSHA", sha, 6] + k
        for n in range(i, j):
            args += ["q%d" % n, "%032x" % n]
            if n == i:
                args.append(sale)
        out.write(resp(args))
        i = j


def pct(v, q):
    return v[min(len(v) - 1, (len(v) - 1) * q // 100)] if v else 0


def probe(port, sha, sale, base, ms, stop):
    c = Conn(port)
    k = keys(sale)
    lat = []
    n = 0
    nxt = time.monotonic()
    while not os.path.exists(stop):
        n += 1
        t0 = time.monotonic()
        b = int(base) + n
        r = c.call("EVALSHA", sha, 6, *k, "p%d" % b, "%032x" % b, sale)
        lat.append(int((time.monotonic() - t0) * 1e6))
        if not r.startswith("reserved"):
            sys.exit("probe: %s" % r)
        nxt += ms / 1000
        time.sleep(max(0, nxt - time.monotonic()))
    lat.sort()
    print(len(lat), pct(lat, 50), pct(lat, 99), lat[-1] if lat else 0)


def clients(port):
    for line in Conn(port).call("CLIENT", "LIST").splitlines():
        for f in line.split(" "):
            if f.startswith("addr="):
                print(f[5:])


def slowlog(port, clients_file):
    with open(clients_file) as f:
        before = set(line.strip() for line in f)
    by = {}
    for e in Conn(port).call("SLOWLOG", "GET", 10000000):
        us, args, addr = e[2], e[3], e[4]
        # SLOWLOG: the bench's own reset; BLMOVE: a worker's connection
        # opened during the run (the reconciler sends neither).
        if addr in before or addr == "?:0" or args[0].upper() in ("SLOWLOG", "BLMOVE"):
            continue
        by.setdefault(args[0].upper(), []).append(us)
    worst = 0
    for name in sorted(by):
        v = sorted(by[name])
        worst = max(worst, v[-1])
        print("  %s: %d calls, p50 %d µs, p99 %d µs, max %d µs"
              % (name, len(v), pct(v, 50), pct(v, 99), v[-1]))
    print("  slowest reconciler command: %d µs" % worst)


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    {"fill": fill, "probe": probe, "clients": clients, "slowlog": slowlog}[cmd](
        *[int(a) if cmd == "probe" and i == 4 else a for i, a in enumerate(args)])


if __name__ == "__main__":
    main()
