#!/usr/bin/python3
"""Peer for bench_store: torch.distributed.TCPStore (Debian torch 1.13) doing the same work as the C
benchmark in the same run, so the C side can print a ratio. Prints `bench=... peer=torch_tcpstore ...`.

  setget:  N client stores, one thread each, SET+GET pairs on a private key for S seconds.
  barrier: N client stores, one thread each, one ADD+WAIT barrier, timed from a common start."""
import argparse
import datetime
import resource
import threading
import time

from torch.distributed import TCPStore

TIMEOUT = datetime.timedelta(seconds=120)


def clients(port, n):
    return [TCPStore("127.0.0.1", port, None, False, timeout=TIMEOUT) for _ in range(n)]


def bench_setget(port, n, seconds):
    stores = clients(port, n)
    counts = [0] * n
    start = threading.Barrier(n + 1)
    stop = threading.Event()
    value = b"x" * 16

    def run(i):
        s, key = stores[i], "k/%d" % i
        s.set(key, value)  # warm-up outside the timed window
        s.get(key)
        start.wait()
        c = 0
        while not stop.is_set():
            s.set(key, value)
            s.get(key)
            c += 1
        counts[i] = c

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.monotonic()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    dt = time.monotonic() - t0
    print("bench=store_setget peer=torch_tcpstore clients=%d pairs_per_s=%.0f" % (n, sum(counts) / dt),
          flush=True)


def bench_barrier(port, n):
    stores = clients(port, n)
    start = threading.Barrier(n + 1)
    ends = [0.0] * n

    def run(i):
        s = stores[i]
        start.wait()
        if s.add("barrier/count", 1) == n:
            s.set("barrier/done", "1")
        s.wait(["barrier/done"])
        ends[i] = time.monotonic()

    threading.stack_size(256 * 1024)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.monotonic()
    for t in threads:
        t.join()
    print("bench=store_barrier peer=torch_tcpstore clients=%d time_ms=%.1f" % (n, (max(ends) - t0) * 1e3),
          flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["setget", "barrier"])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    server = TCPStore("127.0.0.1", 0, None, True, timeout=TIMEOUT, wait_for_workers=False)
    if a.mode == "setget":
        bench_setget(server.port, a.clients, a.seconds)
    else:
        bench_barrier(server.port, a.clients)


if __name__ == "__main__":
    main()
