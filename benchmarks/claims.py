"""Claims per second for every store, next to the server's raw rate for a comparable primitive.

    .venv/bin/python benchmarks/claims.py [--runs 10000] [--batch 100] [--stores redis,nats,...]
    .venv/bin/python benchmarks/claims.py --pg-confirmation   # PostgreSQL: standby wait off / on

For each store it measures, on the local servers (see DEVELOPERS.md):

* one instance claiming ``--runs`` runs in batches of ``--batch`` (one store call per batch);
* one instance claiming runs one call at a time (the slow path of a single due run);
* three processes racing on the same ``--runs`` runs, batched (every run must get one winner);
* the server's raw rate for a comparable primitive, one operation at a time, in the same run:
  a plain ``SET NX`` for Redis, a single-row INSERT for PostgreSQL and SQLite, a confirmed
  publish for RabbitMQ and NATS; the ratio shows our overhead on a single claim.

It prints a table (the figures in docs/performance.md come from it). Speed is measured here, never
in the tests.

    .venv/bin/python benchmarks/claims.py --confirmation [--runs 10000] [--batch 100]

measures instead the price of a durable claim on Redis (``durability``): a master with one replica
of its own (benchmarks/ha_redis.py), claims/s batched and one at a time with ``durability="none"``
and with the default ``"auto"`` (one WAIT per batch, pipelined with the claim script).
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "support"))

from celery_anarchon.stores import open_store  # noqa: E402
from celery_anarchon.stores.base import ClaimRequest, Outcome  # noqa: E402

from backends import BY_KIND, backdate_memory_start  # noqa: E402

#: options of the benchmark over each test backend's own (tests/support/backends.py gives the URL and
#: the options that pick the variant)
BENCH_OPTIONS = {
    "redis-script": {"history_size": 20_000},
    "redis-idmp": {"max_size": 10_000},
    "rabbitmq": {"slot_ttl": 60},
}
#: kind -> (server URL, or None for a SQLite file of the run's own; store options), for every
#: store that processes share (the race runs three processes)
STORES = {kind: (backend.url if backend.url_variable else None,
                 {**backend.options, **BENCH_OPTIONS.get(kind, {})})
          for kind, backend in BY_KIND.items() if backend.shared_by_processes}
#: RabbitMQ creates one durable queue per run (about 3-4 ms each): fewer runs keep it bearable
RUNS_CAP = {"rabbitmq": 2000}
ENTRIES = 10


def runs_for(n: int, now_ms: int) -> list[tuple[str, int]]:
    """``n`` runs over ENTRIES entries, slots 1 ms apart around now (all within max_late)."""
    per = n // ENTRIES
    return [(f"bench-{e}", now_ms - 5_000 + i) for i in range(per) for e in range(ENTRIES)]


def request(entry, slot) -> ClaimRequest:
    return ClaimRequest(entry=entry, slot_ms=slot, max_late_ms=60_000, task_id="t", fingerprint="f")


def open_for(kind, url, options, namespace, instance):
    return open_store(url, namespace=namespace, instance_id=instance, options=options)


def prepared(kind, url, options, namespace):
    store = open_for(kind, url, options, namespace, "bench")
    entries = [f"bench-{e}" for e in range(ENTRIES)]
    store.prepare(entries)
    backdate_memory_start(store, entries, 120_000)
    return store


def claim_all(store, runs, batch) -> dict:
    outcomes = {}
    for i in range(0, len(runs), batch):
        for result in store.claim([request(e, s) for e, s in runs[i:i + batch]]):
            outcomes[result.request.run] = result.outcome
    return outcomes


def _racer(kind, url, options, namespace, instance, runs, batch, barrier, queue):
    store = open_for(kind, url, options, namespace, instance)
    store.now_ms()
    barrier.wait(60)
    started = time.perf_counter()
    outcomes = claim_all(store, runs, batch)
    queue.put((instance, time.perf_counter() - started,
               [run for run, o in outcomes.items() if o is Outcome.WON]))
    store.close()


def raw_rate(kind, url, n) -> float | None:
    """One-at-a-time rate of the server's comparable primitive (operations per second); ``None``
    for a store without one here (a new backend needs no row in this file)."""
    key = uuid.uuid4().hex
    if kind.startswith("redis"):
        import redis
        r = redis.Redis.from_url(url)
        start = time.perf_counter()
        for i in range(n):
            r.set(f"bench:{key}:{i}", "x", nx=True, px=60_000)
        return n / (time.perf_counter() - start)
    if kind in ("sqlite", "postgresql"):
        import sqlalchemy as sa
        engine_url = url.replace("postgresql://", "postgresql+psycopg://", 1)
        engine = sa.create_engine(engine_url, isolation_level="AUTOCOMMIT")
        table = f"bench_raw_{key[:8]}"
        with engine.connect() as conn:
            conn.execute(sa.text(f"CREATE TABLE {table} (k TEXT PRIMARY KEY)"))
            start = time.perf_counter()
            for i in range(n):
                conn.execute(sa.text(f"INSERT INTO {table} VALUES (:k)"), {"k": str(i)})
            rate = n / (time.perf_counter() - start)
            conn.execute(sa.text(f"DROP TABLE {table}"))
        engine.dispose()
        return rate
    if kind == "rabbitmq":
        import kombu
        with kombu.Connection(url, transport_options={"confirm_publish": True}) as conn:
            channel = conn.channel()
            queue = kombu.Queue(f"bench.raw.{key}", durable=True, auto_delete=True)
            queue.bind(channel).declare()
            producer = kombu.Producer(channel)
            start = time.perf_counter()
            for i in range(n):
                producer.publish(b"x", routing_key=queue.name, delivery_mode=2, retry=False)
            rate = n / (time.perf_counter() - start)
            queue.bind(channel).delete()
        return rate
    if kind == "nats":
        import asyncio

        import nats

        async def go():
            nc = await nats.connect(url)
            js = nc.jetstream()
            name = f"BENCH_RAW_{key[:8].upper()}"
            await js.add_stream(name=name, subjects=[f"bench.raw.{key}"])
            start = time.perf_counter()
            for i in range(n):
                await js.publish(f"bench.raw.{key}", b"x", headers={"Nats-Msg-Id": str(i)})
            rate = n / (time.perf_counter() - start)
            await js.delete_stream(name)
            await nc.close()
            return rate
        return asyncio.run(go())
    return None


def bench(kind, n_runs, batch) -> dict:
    url, options = STORES[kind]
    tmp = None
    if url is None:
        tmp = tempfile.mkdtemp(prefix="anarchon-bench-")
        url = f"sqlite:///{tmp}/claims.sqlite3"
    n = min(n_runs, RUNS_CAP.get(kind, n_runs))
    row = {"store": kind, "runs": n}

    namespace = "bench-" + uuid.uuid4().hex[:8]
    store = prepared(kind, url, options, namespace)
    runs = runs_for(n, int(time.time() * 1000))
    start = time.perf_counter()
    outcomes = claim_all(store, runs, batch)
    row["batched"] = n / (time.perf_counter() - start)
    assert all(o is Outcome.WON for o in outcomes.values()), "a fresh run was not won"

    namespace = "bench-" + uuid.uuid4().hex[:8]
    store = prepared(kind, url, options, namespace)
    single = runs_for(min(n, 1000), int(time.time() * 1000))
    start = time.perf_counter()
    claim_all(store, single, 1)
    row["single"] = len(single) / (time.perf_counter() - start)
    store.close()

    namespace = "bench-" + uuid.uuid4().hex[:8]
    prepared(kind, url, options, namespace).close()
    runs = runs_for(n, int(time.time() * 1000))
    ctx = multiprocessing.get_context("fork")
    barrier, queue = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(kind, url, options, namespace, f"p{i}", runs, batch,
                                              barrier, queue)) for i in range(3)]
    for p in procs:
        p.start()
    reports = [queue.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    wall = max(seconds for _, seconds, _ in reports)
    winners = [run for _, _, won in reports for run in won]
    row["race_attempts"] = 3 * n / wall
    row["race_runs"] = n / wall
    row["race_ok"] = len(winners) == len(set(winners)) == n
    row["raw"] = raw_rate(kind, url, min(n, 2000))
    return row


def bench_confirmation(n_runs: int, batch: int) -> None:
    """Claims/s on a Redis master with one replica (rig of our own), confirmation off and on."""
    from ha_redis import RedisHA
    print(f"Redis {'master + 1 replica (loopback)'}: {n_runs} runs ({ENTRIES} entries), batches of "
          f"{batch}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}\n")
    header = f"{'durability':<12}{'batched/s':>11}{'single/s':>10}{'unconfirmed':>13}"
    print(header)
    print("-" * len(header))
    with RedisHA(replicas=1, proxies=False) as ha:
        for durability in ("none", "auto", "replica"):
            options = {"durability": durability}
            row = {}
            unconfirmed = 0
            for name, n, size in (("batched", n_runs, batch), ("single", min(n_runs, 1000), 1)):
                namespace = "bench-" + uuid.uuid4().hex[:8]
                store = prepared("redis", ha.url, options, namespace)
                runs = runs_for(n, int(time.time() * 1000))
                start = time.perf_counter()
                outcomes = claim_all(store, runs, size)
                row[name] = len(runs) / (time.perf_counter() - start)
                unconfirmed += sum(o is Outcome.UNCONFIRMED for o in outcomes.values())
                store.close()
            print(f"{durability:<12}{row['batched']:>11.0f}{row['single']:>10.0f}{unconfirmed:>13}",
                  flush=True)


def bench_pg_confirmation(n_runs: int, batch: int) -> None:
    """Claims/s on a PostgreSQL primary with one streaming standby (rig of our own,
    benchmarks/ha_postgres.py): the claim waiting for the primary's disk only, then for a
    synchronous standby (synchronous_standby_names = 'FIRST 1 (standby0)', durability "auto")."""
    from ha_postgres import PostgresHA
    print(f"PostgreSQL primary + 1 streaming standby (loopback, fsync on): {n_runs} runs ({ENTRIES} "
          f"entries), batches of {batch}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}\n")
    header = f"{'standby wait':<34}{'batched/s':>11}{'single/s':>10}{'unconfirmed':>13}"
    print(header)
    print("-" * len(header))
    with PostgresHA(standbys=1) as ha:
        for label, sync_names, options in (
                ("none (durability=local)", "", {"durability": "local"}),
                ("synchronous standby (auto, 'on')", "FIRST 1 (standby0)", {})):
            ha.set_synchronous(sync_names)
            row, unconfirmed = {}, 0
            for name, n, size in (("batched", n_runs, batch), ("single", min(n_runs, 1000), 1)):
                store = prepared("postgresql", ha.url(), options, "bench-" + uuid.uuid4().hex[:8])
                runs = runs_for(n, int(time.time() * 1000))
                start = time.perf_counter()
                outcomes = claim_all(store, runs, size)
                row[name] = len(runs) / (time.perf_counter() - start)
                unconfirmed += sum(o is Outcome.UNCONFIRMED for o in outcomes.values())
                store.close()
            print(f"{label:<34}{row['batched']:>11.0f}{row['single']:>10.0f}{unconfirmed:>13}",
                  flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument("--confirmation", action="store_true",
                        help="Redis only: claims/s with durable claims off and on (own servers)")
    parser.add_argument("--pg-confirmation", action="store_true",
                        help="PostgreSQL only: claims/s without and with the synchronous standby wait "
                             "(own primary and standby)")
    args = parser.parse_args()
    if args.pg_confirmation:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        bench_pg_confirmation(args.runs, args.batch)
        return
    if args.confirmation:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        bench_confirmation(args.runs, args.batch)
        return
    print(f"{args.runs} runs ({ENTRIES} entries), batches of {args.batch}, 3 racing processes; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}\n")
    header = (f"{'store':<16}{'runs':>7}{'batched/s':>11}{'single/s':>10}{'raw/s':>9}"
              f"{'single/raw':>11}{'race attempts/s':>17}{'one winner each':>17}")
    print(header)
    print("-" * len(header))
    for kind in args.stores.split(","):
        try:
            r = bench(kind, args.runs, args.batch)
        except Exception as exc:  # a server that is down: say so, go on with the others
            print(f"{kind:<16}  failed: {type(exc).__name__}: {exc}")
            continue
        raw, ratio = (f"{r['raw']:.0f}", f"{r['single'] / r['raw']:.2f}") if r["raw"] else ("-", "-")
        print(f"{r['store']:<16}{r['runs']:>7}{r['batched']:>11.0f}{r['single']:>10.0f}{raw:>9}"
              f"{ratio:>11}{r['race_attempts']:>17.0f}"
              f"{'yes' if r['race_ok'] else 'NO':>17}", flush=True)


if __name__ == "__main__":
    main()
