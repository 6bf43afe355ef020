"""Runtime schedules at scale: 10,000 store entries followed by N real ``celery beat`` processes.

    .venv/bin/python benchmarks/schedules_sync.py [--stores sqlite,postgresql,redis]
        [--entries 10000] [--instances 3] [--sync-interval 5] [--changes 5] [--idle 60]

For each store, on a server of its own (benchmarks/servers.py: a ``redis-server``, a PostgreSQL
cluster with ``pg_stat_statements``; SQLite: a file), so that nothing else talks to it:

1. **seed**: ``--entries`` store entries written through the store API (``put_entry``, from
   threads; SQLite from one), each a daily crontab twelve hours away: nothing comes due;
2. **start-up**: ``--instances`` beats (tests/support/apps/schedules_app.py, ``anarchon_sync_interval``
   ``--sync-interval``) started at once; from each process's start, and from its engine's start
   (the ``anarchon: instance`` line), to its first sync log line (every entry loaded and
   checked into a plan), and the CPU each process used until then (Python and Celery's start-up
   included: about 0.7 s with a few hundred entries);
3. **propagation**: ``--changes`` times each of add, update (kwargs) and pause through
   ``schedules(app)``, each after a random wait of up to one sync interval (a random phase
   against the instances' sync ticks): from the moment the call returned (the write committed)
   to each instance's ``synced entries version`` log line at that version (celery's log
   timestamps, ms), and the CPU each instance used from the write until every instance synced
   (a change reloads every entry; a plan is built again only for a changed definition);
4. **idle**: over ``--idle`` seconds with nothing due, the CPU of each beat process (utime +
   stime in /proc, % of one core) and its resident memory, and the store round trips: Redis
   through ``MONITOR`` (commands sent by clients, a MULTI ... EXEC block counted once, commands
   run inside scripts not counted), PostgreSQL through ``pg_stat_statements`` (statements,
   BEGIN and COMMIT included) and ``pg_stat_database`` (transactions); SQLite is a file in each
   process: no round trip to count.

It prints a table; the figures in docs/performance.md "Propagation" come from it. The broker (the
shared Redis, db 8) is never used: nothing is sent.
"""
from __future__ import annotations

import argparse
import datetime
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
APPS = os.path.join(HERE, "..", "tests", "support", "apps")
sys.path[:0] = [os.path.join(HERE, "..", "tests", "support"), APPS]

import celery_anarchon  # noqa: E402
from celery_anarchon.schedule import definition as entry_json  # noqa: E402
from celery_anarchon.stores import open_store  # noqa: E402
from celery_anarchon.schedule.timing import DEFAULT_SYNC_INTERVAL_S  # noqa: E402

import schedules_app  # noqa: E402
from backends import url_of  # noqa: E402
from procs import CeleryProcs  # noqa: E402
from servers import PostgresServer, RedisServer, wait_for  # noqa: E402

KINDS = ("sqlite", "postgresql", "redis")
BROKER_URL = url_of("redis").rsplit("/", 1)[0] + "/8"
#: celery's log line prefix: local time with milliseconds
LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): ")
SYNCED = re.compile(r"anarchon: synced entries version (\d+): .*\((\d+) store entries\)")
CLOCK_TICK = os.sysconf("SC_CLK_TCK")


def log_lines(path: str, pattern: re.Pattern) -> list[tuple[float, re.Match]]:
    """(epoch seconds, match) of every line of a celery log that ``pattern`` finds."""
    found = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            stamp, match = LOG_TIME.match(line), pattern.search(line)
            if stamp and match:
                when = datetime.datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f")
                found.append((when.timestamp(), match))
    return found


def until(predicate, timeout: float, what: str, procs: CeleryProcs):
    """``servers.wait_for(predicate)``, stopped by a beat that exited.

    :raises RuntimeError: ``timeout`` passed or a beat exited (with the logs)."""
    def check():
        dead = [p.name for p in procs.procs.values() if not p.alive()]
        if dead:
            raise RuntimeError(f"{dead} exited while waiting for {what}\n{procs.logs()}")
        return predicate()
    return wait_for(check, timeout, what)


def daily(i: int, hour: int) -> dict:
    """A daily crontab at ``hour`` (UTC), minute ``i % 60``, as data."""
    return {"crontab": {"minute": str(i % 60), "hour": str(hour), "day_of_week": "*",
                        "day_of_month": "*", "month_of_year": "*"}}


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICK


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


# -- the stores' servers and how their round trips are counted ---------------------------------

class SqliteRig:
    """A SQLite file: no server, no round trip to count."""

    def __init__(self, folder: str) -> None:
        self.url = "sqlite:///" + os.path.join(folder, "entries.sqlite3")
        self.threads = 1               # one writer at a time

    def start_counting(self) -> None:
        pass

    def stop_counting(self) -> dict:
        return {}

    def close(self) -> None:
        pass


class RedisRig:
    """A ``redis-server`` of our own; round trips counted with ``MONITOR`` (redis-cli)."""

    def __init__(self, folder: str) -> None:
        self.server = RedisServer("sync-redis", folder, persistent=False)
        self.server.start()
        self.url = self.server.url
        self.threads = 8
        self.monitor_log = os.path.join(folder, "monitor.log")
        self.monitor: subprocess.Popen | None = None

    def start_counting(self) -> None:
        with open(self.monitor_log, "wb") as out:
            self.monitor = subprocess.Popen(["redis-cli", "-p", str(self.server.port), "monitor"],
                                            stdout=out, stderr=subprocess.DEVNULL)

    def stop_counting(self) -> dict:
        self.monitor.send_signal(signal.SIGTERM)
        self.monitor.wait(10)
        sent, commands, in_multi = 0, {}, set()
        line_re = re.compile(r'^\d+\.\d+ \[\d+ ([^\]]+)\] "([^"]+)"')
        with open(self.monitor_log, encoding="utf-8", errors="replace") as f:
            for line in f:
                match = line_re.match(line)
                if not match or match.group(1) == "lua":
                    continue               # "OK", or a command run inside a script
                client, command = match.group(1), match.group(2).upper()
                commands[command] = commands.get(command, 0) + 1
                if command == "MULTI":
                    in_multi.add(client)
                elif command in ("EXEC", "DISCARD"):
                    in_multi.discard(client)
                    sent += 1
                elif client not in in_multi:
                    sent += 1
        return {"round_trips": sent, "commands": commands}

    def close(self) -> None:
        self.server.stop()


class PostgresRig:
    """A PostgreSQL cluster of our own with ``pg_stat_statements``."""

    def __init__(self, folder: str) -> None:
        import psycopg
        self.server = PostgresServer("sync-pg", folder)
        self.server.create()
        self.url = self.server.url
        self.threads = 8
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        self.server.stop("fast")
        self.server.start()
        with self._conn() as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
        self._before: tuple[int, int] = (0, 0)

    def _conn(self):
        import psycopg
        return psycopg.connect(self.url, autocommit=True)

    def _read(self) -> tuple[int, int]:
        with self._conn() as conn:
            statements = conn.execute(
                "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s JOIN pg_database d "
                "ON d.oid = s.dbid WHERE d.datname = 'chaos' AND s.query NOT ILIKE '%pg_stat%'"
            ).fetchone()[0]
            xacts = conn.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                                 "WHERE datname = 'chaos'").fetchone()[0]
        return int(statements), int(xacts)

    def start_counting(self) -> None:
        self._before = self._read()

    def stop_counting(self) -> dict:
        time.sleep(0.6)   # pg_stat_database is flushed by the backends at most every 500 ms
        after = self._read()
        # the first read's two statements are two transactions (autocommit)
        return {"round_trips": after[0] - self._before[0],
                "transactions": after[1] - self._before[1] - 2}

    def close(self) -> None:
        self.server.destroy()


RIGS = {"sqlite": SqliteRig, "postgresql": PostgresRig, "redis": RedisRig}


# -- one store ----------------------------------------------------------------------------------

def seed(url: str, namespace: str, entries: int, hour: int, threads: int) -> float:
    """Write ``entries`` store entries through the store API; returns the seconds it took."""
    texts = [(f"e{i:05d}", entry_json.canonical({
        "task": schedules_app.TASK, "schedule": daily(i, hour), "args": [], "kwargs": {"n": i},
        "options": {}})) for i in range(entries)]
    stores = [open_store(url, namespace=namespace, instance_id=f"seed-{k}", options={})
              for k in range(threads)]
    stores[0].prepare(())
    began = time.monotonic()

    def write(k: int) -> None:
        for name, text in texts[k::threads]:
            stores[k].entries.put_entry(name, text, by="bench", create=True)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(write, range(threads)))
    took = time.monotonic() - began
    for store in stores:
        store.close()
    return took


def bench_store(kind: str, args: argparse.Namespace, folder: str) -> dict:
    """Every measurement of one store (see the module docstring)."""
    rig = RIGS[kind](folder)
    namespace = "bench-" + uuid.uuid4().hex[:8]
    hour = (datetime.datetime.now(datetime.timezone.utc).hour + 12) % 24
    env = {"ANARCHON_SC_BROKER": BROKER_URL, "ANARCHON_SC_STORE": rig.url,
           "ANARCHON_SC_NAMESPACE": namespace, "ANARCHON_SC_QUEUE": f"bench-{namespace}",
           "ANARCHON_SC_OUT": os.path.join(folder, "executions.jsonl")}
    if args.sync_interval is not None:
        env["ANARCHON_SC_SYNC_INTERVAL"] = str(args.sync_interval)
    procs = CeleryProcs(folder, env, "schedules_app", (APPS,))
    result: dict = {"kind": kind}
    api = None
    try:
        result["seed_s"] = seed(rig.url, namespace, args.entries, hour, rig.threads)
        beats = [f"beat-{i}" for i in range(args.instances)]
        started = {}
        for name in beats:
            started[name] = time.time()
            procs.beat(name)

        def first_sync(name: str):
            lines = log_lines(procs.procs[name].log, SYNCED)
            return lines[0] if lines else None
        until(lambda: all(first_sync(b) for b in beats), 600, "the first syncs", procs)
        engine = {b: log_lines(procs.procs[b].log, re.compile(r"anarchon: instance "))[0][0]
                  for b in beats}
        loaded = {b: first_sync(b) for b in beats}
        bad = {b: m.group(2) for b, (_, m) in loaded.items() if int(m.group(2)) != args.entries}
        assert not bad, f"first syncs did not load {args.entries} entries: {bad}"
        result["startup_s"] = [loaded[b][0] - started[b] for b in beats]
        result["load_s"] = [loaded[b][0] - engine[b] for b in beats]

        pids = {b: procs.procs[b].pid for b in beats}
        result["startup_cpu_s"] = [cpu_seconds(p) for p in pids.values()]
        api = celery_anarchon.schedules(schedules_app.make_app(env), by="bench")
        result["propagation"], result["call_s"], result["change_cpu_s"] = {}, {}, []
        interval = args.sync_interval or DEFAULT_SYNC_INTERVAL_S
        rng = random.Random(args.seed)
        for what in ("add", "update", "pause"):
            delays, calls = [], []
            for k in range(args.changes):
                # a random phase against the instances' sync ticks (a change right after the
                # last sync would wait a whole interval every time)
                time.sleep(rng.uniform(0, interval))
                cpu = {b: cpu_seconds(p) for b, p in pids.items()}
                began = time.time()
                if what == "add":
                    api.add(f"new-{k}", task=schedules_app.TASK, schedule=daily(k, hour))
                elif what == "update":
                    api.update(f"e{k:05d}", kwargs={"n": -k})
                else:
                    api.pause(f"e{k:05d}", reason="benchmark")
                written = time.time()
                calls.append(written - began)
                version = api.entries.entries_version()

                def synced(name: str):
                    return next((when for when, m in log_lines(procs.procs[name].log, SYNCED)
                                 if int(m.group(1)) >= version), None)
                until(lambda: all(synced(b) for b in beats), 3 * interval + 120,
                         f"every beat to sync {what}", procs)
                delays += [synced(b) - written for b in beats]
                result["change_cpu_s"] += [cpu_seconds(p) - cpu[b] for b, p in pids.items()]
            result["propagation"][what], result["call_s"][what] = delays, calls

        cpu0 = {b: cpu_seconds(p) for b, p in pids.items()}
        rig.start_counting()
        window_began = time.monotonic()
        time.sleep(args.idle)                     # the measurement window itself
        counted = rig.stop_counting()
        window = time.monotonic() - window_began
        result["cpu_pct"] = [100 * (cpu_seconds(p) - cpu0[b]) / window for b, p in pids.items()]
        result["rss_mb"] = [rss_mb(p) for p in pids.values()]
        if counted:
            per = window / interval * args.instances
            result["round_trips_per_interval"] = counted["round_trips"] / per
            if "transactions" in counted:
                result["transactions_per_interval"] = counted["transactions"] / per
            if "commands" in counted:
                result["commands"] = counted["commands"]
    finally:
        if api is not None:
            api.close()
        procs.stop_all()
        rig.close()
    return result


# -- output -------------------------------------------------------------------------------------

def spread(values: list[float]) -> str:
    """``median / max`` with 2 decimals."""
    return f"{statistics.median(values):.2f} / {max(values):.2f}"


def table(results: list[dict], args: argparse.Namespace) -> str:
    names = {"sqlite": "SQLite", "postgresql": "PostgreSQL", "redis": "Redis (lease)"}
    head = ("| store | seed (s) | start-up to loaded (s) | first load (s) | CPU to loaded (s) "
            "| add (s) | update (s) | pause (s) | CPU per change (s) | idle CPU % of a core "
            "| RSS (MB) | store round trips / interval |")
    rows = [head, "| " + " | ".join(["---"] * 12) + " |"]
    for r in results:
        trips = r.get("round_trips_per_interval")
        trips = "n/a (a file)" if trips is None else f"{trips:.1f}" + (
            f" ({r['transactions_per_interval']:.1f} transactions)"
            if "transactions_per_interval" in r else "")
        rows.append("| " + " | ".join([
            names[r["kind"]], f"{r['seed_s']:.1f}", spread(r["startup_s"]), spread(r["load_s"]),
            spread(r["startup_cpu_s"]),
            *(spread(r["propagation"][w]) for w in ("add", "update", "pause")),
            spread(r["change_cpu_s"]), spread(r["cpu_pct"]), f"{max(r['rss_mb']):.0f}",
            trips]) + " |")
    sync = args.sync_interval or DEFAULT_SYNC_INTERVAL_S
    return (f"{args.entries} store entries, {args.instances} beats, sync interval {sync:g} s, "
            f"{args.changes} changes of each kind, idle window {args.idle:g} s; figures are "
            "median / max over the instances (and changes)\n" + "\n".join(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default=",".join(KINDS))
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--sync-interval", type=float, default=None,
                        help="anarchon_sync_interval, seconds (default: the setting's default, 5)")
    parser.add_argument("--changes", type=int, default=5, help="changes of each kind")
    parser.add_argument("--seed", type=int, default=1, help="of the random phases of the changes")
    parser.add_argument("--idle", type=float, default=60.0, help="idle window, seconds")
    args = parser.parse_args()
    results = []
    print(f"load average at the start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    for kind in args.stores.split(","):
        with tempfile.TemporaryDirectory(prefix=f"anarchon-sync-{kind}-") as folder:
            print(f"[{kind}] ...", flush=True)
            r = bench_store(kind, args, folder)
            results.append(r)
            print(f"[{kind}] {r}", flush=True)
    print(table(results, args))


if __name__ == "__main__":
    main()
