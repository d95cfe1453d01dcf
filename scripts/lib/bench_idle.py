#!/usr/bin/env python3
"""Holds N idle keep-alive connections to the gateway for
scripts/bench-gateway.sh (the RSS per idle connection): connects N
sockets, sends one GET /healthz on each and reads its answer (so the
connection's thread is started and has served a request), then keeps them
open, sending nothing, until SIGTERM. Prints "ready" once all are open.

Usage: bench_idle.py PORT N
"""

import signal
import socket
import sys
import time


def main():
    port, n = int(sys.argv[1]), int(sys.argv[2])
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        socks.append(s)
    for s in socks:
        got = b""
        while b"\r\n\r\n" not in got:
            got += s.recv(4096)
    print("ready", flush=True)
    while not stop:
        time.sleep(0.05)


if __name__ == "__main__":
    main()
