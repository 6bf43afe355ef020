"""The status of a namespace at scale: ``overview()``, ``status``, ``status --json``, the status
page and ``/api/status`` with 10,000 ``beat_schedule`` entries.

    .venv/bin/python benchmarks/overview_scale.py [--stores redis,postgresql] [--entries 10000]
        [--history 5] [--repeat 3] [--redis-url URL] [--postgres-url URL]

For each store (the shared servers: Redis db 5, the PostgreSQL database ``test``; a namespace of
its own, removed at the end):

1. **seed**: an app whose ``beat_schedule`` holds ``--entries`` entries (nine in ten a daily
   crontab at a random minute, one in ten an interval of 5 to 60 minutes); ``--history`` history
   records per entry (daily slots of the past days, ``sent``; one entry in 50 ``late`` on its
   newest slot) written through the store (Redis: ``record_many``; PostgreSQL: the history
   part's batch insert, one transaction); 20 entries paused through ``Schedules.pause``;
2. **measure**, each ``--repeat`` times, median wall time and store round trips of one call:

   * ``overview()`` on a fresh store (its start-up checks included), and again on the same
     store (the page's case: it keeps its store open and reads every ``--refresh`` seconds);
   * ``status`` (``--runs 5``, text) and ``status --json``, in this process as the command runs
     them (open the store, ``overview``, print, close), the output thrown away;
   * ``GET /`` and ``GET /api/status`` of the page (``create_app``, ``--runs 20``), called in
     this process through ASGI (no socket, no uvicorn), the page's store already open.

Round trips are counted in the client: Redis, each ``send_packed_command`` of redis-py (a
pipeline or a script call is one); PostgreSQL, each statement SQLAlchemy sends
(``before_cursor_execute``; BEGIN and COMMIT are not statements and are not counted). It prints
a table; the figures in docs/performance.md "Status at 10,000 entries" come from it.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import random
import statistics
import sys
import time
import uuid

import click
import redis
import redis.connection
import sqlalchemy as sa
from celery import Celery
from celery.schedules import crontab

from celery_anarchon.operate.cli import reports as cli_status
from celery_anarchon.operate.overview import overview
from celery_anarchon.operate.schedules import Schedules
from celery_anarchon.stores.base import HistoryRecord, RunEvent
from celery_anarchon.settings import Settings, open_app_store
from celery_anarchon.operate.web import StatusSource, create_app

DAY_MS = 86_400_000
URLS = {"redis": "redis://127.0.0.1:6379/5",
        "postgresql": "postgresql://postgres@127.0.0.1:5432/test"}


class RoundTrips:
    """Store round trips counted in this process (see the module's docstring)."""

    def __init__(self) -> None:
        self.count = 0
        original = redis.connection.AbstractConnection.send_packed_command

        def counted(conn, command, check_health=True):
            self.count += 1
            return original(conn, command, check_health)
        redis.connection.AbstractConnection.send_packed_command = counted
        sa.event.listen(sa.engine.Engine, "before_cursor_execute", self._statement)

    def _statement(self, *args, **kwargs) -> None:
        self.count += 1


def make_app(kind: str, url: str, namespace: str, entries: int) -> Celery:
    rnd = random.Random(7)
    schedule = {}
    for i in range(entries):
        name = f"job-{i:05d}"
        if i % 10 == 9:
            schedule[name] = {"task": "bench.task", "schedule": 300.0 + rnd.randrange(12) * 300}
        else:
            schedule[name] = {"task": "bench.task",
                              "schedule": crontab(minute=rnd.randrange(60), hour=rnd.randrange(24))}
    app = Celery(f"overview_{kind}", set_as_current=False)
    app.conf.update(broker_url="memory://", timezone="UTC", anarchon_store_url=url,
                    anarchon_namespace=namespace, beat_schedule=schedule)
    return app


def seed(app: Celery, kind: str, history: int) -> float:
    """The history records and pauses of the module's docstring; seconds taken."""
    started = time.perf_counter()
    store = open_app_store(Settings.from_app(app), instance_id="bench-seed")
    try:
        names = sorted(app.conf.beat_schedule)
        store.prepare(names)
        today = store.now_ms() // DAY_MS * DAY_MS
        notes = [HistoryRecord(entry=n, slot_ms=today - d * DAY_MS,
                               event=RunEvent.LATE if d == 1 and i % 50 == 0 else RunEvent.SENT,
                               instance="bench-seed", store_ms=0, task_id=f"{n}-{d}")
                 for i, n in enumerate(names) for d in range(1, history + 1)]
        if kind == "redis":
            for start in range(0, len(notes), 5000):
                store.history.record_many(notes[start:start + 5000])
        else:
            part = store.history
            rows = [part.row(r.entry, r.slot_ms, r.event, today, task_id=r.task_id) for r in notes]
            store.connection.run("seed history", lambda conn: part.write(conn, rows, replace=True, trim=False))
    finally:
        store.close()
    with Schedules(app) as s:
        for name in names[::len(names) // 20][:20]:
            s.pause(name, "benchmark", by="bench")
    return time.perf_counter() - started


def clean(kind: str, url: str, namespace: str) -> None:
    if kind == "redis":
        client = redis.Redis.from_url(url)
        keys = list(client.scan_iter(match=f"*{namespace}*", count=5000))
        for start in range(0, len(keys), 5000):
            client.delete(*keys[start:start + 5000])
        return
    from celery_anarchon.stores.sql import schema
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        for table in schema.metadata.sorted_tables:
            if "namespace" in table.c:
                conn.execute(sa.delete(table).where(table.c.namespace == namespace))
    engine.dispose()


def asgi(site, path: str) -> tuple[int, int]:
    """One GET to the Starlette app in this process: (status, body bytes)."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
             "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
             "query_string": b"", "headers": [(b"host", b"127.0.0.1")],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8765)}
    asyncio.run(site(scope, receive, send))
    status = next(m for m in sent if m["type"] == "http.response.start")["status"]
    return status, sum(len(m.get("body", b"")) for m in sent if m["type"] == "http.response.body")


def timed(trips: RoundTrips, call, repeat: int) -> tuple[float, int, object]:
    """Median seconds and round trips of ``call()`` over ``repeat`` calls, and its last result."""
    seconds, counts, result = [], [], None
    for _ in range(repeat):
        before = trips.count
        started = time.perf_counter()
        result = call()
        seconds.append(time.perf_counter() - started)
        counts.append(trips.count - before)
    return statistics.median(seconds), int(statistics.median(counts)), result


def bench_store(kind: str, url: str, args, trips: RoundTrips) -> list[tuple]:
    namespace = f"bench-overview-{uuid.uuid4().hex[:8]}"
    app = make_app(kind, url, namespace, args.entries)
    rows = []
    try:
        seeded = seed(app, kind, args.history)
        print(f"{kind}: seeded {args.entries} entries x {args.history} runs in {seeded:.1f} s",
              file=sys.stderr)
        settings = Settings.from_app(app)

        def fresh():
            store = open_app_store(settings, instance_id="bench-overview")
            try:
                return overview(app, store, settings)
            finally:
                store.close()
        t, n, data = timed(trips, fresh, args.repeat)
        assert data["store"]["reachable"] and len(data["entries"]) >= args.entries, data["store"]
        rows.append((kind, "overview(), fresh store", t, n, ""))
        store = open_app_store(settings, instance_id="bench-overview")
        overview(app, store, settings)
        t, n, _ = timed(trips, lambda: overview(app, store, settings), args.repeat)
        store.close()
        rows.append((kind, "overview(), store kept open", t, n, ""))
        for label, as_json in (("status", False), ("status --json", True)):
            def command(as_json=as_json):
                out = io.StringIO()
                with contextlib.redirect_stdout(out):
                    try:
                        cli_status.status(app, 5, as_json)
                    except click.exceptions.Exit:
                        pass
                return len(out.getvalue())
            t, n, size = timed(trips, command, args.repeat)
            rows.append((kind, label, t, n, f"{size / 1e6:.1f} MB"))
        source = StatusSource(app, runs=20)
        try:
            site = create_app(source, token=None, refresh_s=5.0)
            asgi(site, "/api/status")
            for label, path in (("page GET /", "/"), ("GET /api/status", "/api/status")):
                t, n, (status, size) = timed(trips, lambda path=path: asgi(site, path), args.repeat)
                assert status == 200, (path, status)
                rows.append((kind, label, t, n, f"{size / 1e6:.1f} MB"))
        finally:
            source.close()
    finally:
        clean(kind, url, namespace)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stores", default="redis,postgresql")
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--history", type=int, default=5, help="history records per entry")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--redis-url", default=URLS["redis"])
    parser.add_argument("--postgres-url", default=URLS["postgresql"])
    args = parser.parse_args()
    urls = {"redis": args.redis_url, "postgresql": args.postgres_url}
    trips = RoundTrips()
    rows = []
    for kind in args.stores.split(","):
        rows += bench_store(kind, urls[kind], args, trips)
    print(f"{args.entries} entries, {args.history} history records each, median of "
          f"{args.repeat}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print("| store | call | wall (s) | round trips | output |")
    print("| --- | --- | --- | --- | --- |")
    for kind, label, seconds, count, size in rows:
        print(f"| {kind} | {label} | {seconds:.2f} | {count} | {size} |")


if __name__ == "__main__":
    main()
