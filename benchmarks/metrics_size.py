"""The size of beat's /metrics and the time of a scrape with many entries under the label cap.

    python benchmarks/metrics_size.py --entries 10000 --max-entries 500 --scrapes 20

Feeds a :class:`~celery_anarchon.beat.metrics.PrometheusObserver` what an engine tells it for
``--entries`` entries (a next slot, a slot that came, a run, a claim answer and a send each, a few
failures and skips), then prints: the series served, the bytes of one /metrics page (text format,
as prometheus_client serves it), the memory the observer holds (tracemalloc, after the entries
and the events), and the time of ``generate_latest`` (the exporter's work per scrape: median and
worst of ``--scrapes``) and of one scrape over HTTP.
"""
from __future__ import annotations

import argparse
import socket
import statistics
import time
import tracemalloc
import urllib.request

from prometheus_client import generate_latest

from celery_anarchon import exporter
from celery_anarchon.beat.metrics import PrometheusObserver

T0_MS = 1_700_000_000_000


def fill(observer: PrometheusObserver, entries: int) -> None:
    """What an engine tells about ``entries`` entries: each one's slots, a run, a claim, a send;
    every tenth a skip and a failure."""
    names = [f"entry-{i:05d}" for i in range(entries)]
    observer.entries(names)
    for i, name in enumerate(names):
        observer.slot_came(name, T0_MS)
        observer.next_slot(name, T0_MS + 60_000)
        observer.claimed(name, "won" if i % 3 == 0 else "other_won")
        observer.ran(name, T0_MS)
        observer.sent(name, 1, 0.05)
        if i % 10 == 0:
            observer.claimed(name, "late_local")
            observer.send_failed(name)
    for event in ("started", "taken_over", "lost"):
        observer.lease(event)
    observer.store_round_trip("claim", 0.002)
    observer.store_reachable(True)
    observer.ticked(T0_MS / 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--max-entries", type=int, default=500)
    parser.add_argument("--scrapes", type=int, default=20)
    args = parser.parse_args()

    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    observer = PrometheusObserver(args.max_entries, instance_id="bench", namespace="bench")
    fill(observer, args.entries)
    held = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()

    page = generate_latest(observer.registry)
    series = sum(1 for line in page.decode().splitlines() if line and not line.startswith("#"))
    times = []
    for _ in range(args.scrapes):
        started = time.perf_counter()
        generate_latest(observer.registry)
        times.append(time.perf_counter() - started)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = exporter.serve(observer.registry, port=port, addr="127.0.0.1",
                            setting="anarchon_metrics_port")
    try:
        started = time.perf_counter()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
            served = len(response.read())
        http_s = time.perf_counter() - started
    finally:
        server.shutdown()

    print(f"entries {args.entries}, labelled {min(args.entries, args.max_entries)} + (other)")
    print(f"series served        {series}")
    print(f"/metrics page        {len(page) / 1024:.0f} KiB ({served} bytes over HTTP)")
    print(f"observer memory      {held / 1024 / 1024:.1f} MiB (tracemalloc, entries and events)")
    print(f"generate_latest      median {statistics.median(times) * 1000:.1f} ms, "
          f"worst {max(times) * 1000:.1f} ms ({args.scrapes} scrapes)")
    print(f"one scrape over HTTP {http_s * 1000:.1f} ms")


if __name__ == "__main__":
    main()
