"""How long a killed runner of a leased run takes to be replaced, on each lease store, measured.

The promise (docs/leases.md "Choosing the timings", docs/design.md "Leases": Takeover): a dead
runner's lease runs out within ``duration`` of its death (its last renewal came before it), and
every beat instance checks the leased runs every ``heartbeat`` at a random offset within one
heartbeat, so two checks are at most 2 heartbeats apart: the run is **taken over within
duration + 2 x heartbeat** of the death. The new attempt then waits in the broker's queue for a
worker: that part is the broker's and the worker's, reported here, never promised.

For each store: two real ``celery beat`` processes and one prefork worker (concurrency 2) of
benchmarks/takeover_app.py, one leased entry every ``gap`` seconds; for each of ``--kills`` slots,
the pool child running attempt 1 is killed with SIGKILL and the benchmark measures, from the kill:

* ``expiry``: when the dead runner's lease ran out (its record, read just after the kill);
* ``takeover``: when the run was taken over (the store's ``taken_over`` history record, written in
  the takeover's own transaction), the figure the promise bounds;
* ``start``: when attempt 2's body started in the worker (its own clock).

Store times are put on this machine's clock with the offset seen when the record was read (half a
round trip of uncertainty), so a store on another host is measured fairly. It prints, per store,
n, min / median / max of each figure, the bound, how many takeovers exceeded it, and whether the
safety held (exactly one takeover per killed run, attempts 1 and 2 only). It exits 1 when a
takeover came later than the bound + ``--margin`` (default 1 s: a beat tick, woken at the check's
time, first does what else is due, then asks the store for the expired runs and takes one over:
two round trips on a loaded machine), or a run was not taken over exactly once.

    python benchmarks/takeover_bound.py                        # every lease store, 5 kills each
    python benchmarks/takeover_bound.py --stores sqlite,redis --kills 3 --duration 6 --heartbeat 1

Servers: the ``ANARCHON_TEST_*`` variables (``eval "$(/work/devenv/sandbox.sh N)"``) or their
defaults; the broker is the Redis of ``ANARCHON_TEST_REDIS_URL`` (db 8); the Redis Cluster is
``ANARCHON_TEST_REDIS_CLUSTER_URL``, else six nodes of our own (benchmarks/redis_cluster.py).
Each run has its own namespace and queue. Standard library, the package and Celery.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field

from celery_anarchon._util import LATENESS_TOLERANCE_MS
from celery_anarchon.stores import RunEvent, open_store

from procs import CeleryProcs, read_records
from servers import wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
ENTRY = "held"
REDIS_URL = os.environ.get("ANARCHON_TEST_REDIS_URL", "redis://127.0.0.1:6379/9")
#: lease store kind -> (the variable naming its server, its default URL; None: a file of ours)
STORES: dict[str, tuple[str | None, str | None]] = {
    "sqlite": (None, None),
    "postgresql": ("ANARCHON_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"),
    "redis": ("ANARCHON_TEST_REDIS_URL", "redis://127.0.0.1:6379/9"),
    "redis-cluster": ("ANARCHON_TEST_REDIS_CLUSTER_URL", None),
}


@dataclass
class Kill:
    """One killed runner: local epoch seconds of the kill and of what followed (None: not seen)."""

    slot_ms: int
    killed: float
    expiry: float | None = None
    takeover: float | None = None
    start: float | None = None
    takeovers: int = 0            #: "taken over" lines of this slot in both beats' logs
    attempts: list[int] = field(default_factory=list)   #: attempts whose body started


@dataclass
class StoreResult:
    kind: str
    bound_s: float
    kills: list[Kill]
    error: str | None = None


def store_url(kind: str, workdir: str, stack: list) -> str:
    """The URL of ``kind``'s server: its variable, its default, a file in ``workdir`` (SQLite) or
    a Redis Cluster started now (closed by the caller through ``stack``)."""
    variable, default = STORES[kind]
    if variable and os.environ.get(variable):
        return os.environ[variable]
    if kind == "sqlite":
        return "sqlite:///" + os.path.join(workdir, "takeover.sqlite3")
    if kind == "redis-cluster":
        from redis_cluster import RedisClusterRig
        rig = RedisClusterRig().__enter__()
        stack.append(rig)
        return rig.url
    return default


def store_offset_s(store, slot_ms: int):
    """(the run's record, the store's clock minus ours in seconds), read now."""
    before = time.time()
    run = store.leases.inspect(ENTRY, slot_ms)
    after = time.time()
    return run, (run.store_ms / 1000 - (before + after) / 2) if run else 0.0


def taken_over_ms(store, slot_ms: int) -> int | None:
    """The store's time of the ``taken_over`` record of ``slot_ms`` (the run's latest record, or
    one of its earlier ones once attempt 2 recorded more)."""
    for record in store.history.read(ENTRY):
        if record.slot_ms == slot_ms:
            for r in (record, *record.earlier):
                if r.event is RunEvent.TAKEN_OVER:
                    return r.store_ms
    return None


def measure_store(kind: str, args, lease: dict, workdir: str) -> StoreResult:
    """Start the beats and the worker on ``kind``, kill ``args.kills`` runners, measure each."""
    bound_s = lease["duration"] + 2 * lease["heartbeat"]
    stack: list = []
    namespace = f"takeover-{kind}-{uuid.uuid4().hex[:8]}"
    folder = os.path.join(workdir, kind)
    os.makedirs(folder)
    url = store_url(kind, folder, stack)
    store = open_store(url, namespace=namespace, instance_id="takeover-bench")
    result = StoreResult(kind, bound_s, [])
    procs = None
    try:
        if store.leases is None:
            raise SystemExit(f"{kind}: {type(store).__name__} holds no leases")
        store.prepare([ENTRY])
        # a fresh store's memory refuses slots within LATENESS_TOLERANCE_MS of its start (and
        # never takes over a run claimed that early): the first slot comes after it
        gap = args.gap or math.ceil(bound_s + args.hold_later + 6)
        anchor = math.ceil(time.time() + LATENESS_TOLERANCE_MS / 1000 + 3)
        out = os.path.join(folder, "events.jsonl")
        queue = f"tb-{namespace}"
        procs = CeleryProcs(folder, env={
            "TB_BROKER": args.broker, "TB_STORE": url, "TB_NAMESPACE": namespace,
            "TB_QUEUE": queue, "TB_ENTRY": ENTRY, "TB_EVERY": str(gap),
            "TB_ANCHOR": str(anchor), "TB_LEASE": json.dumps(lease), "TB_OUT": out,
            "TB_HOLD": str(10 * gap), "TB_HOLD_LATER": str(args.hold_later)},
            app="takeover_app", pythonpath=(HERE,))
        procs.worker("w1", "-Q", queue, pool="prefork", concurrency=2)
        procs.wait_log("w1", "ready.")
        for name in ("b1", "b2"):
            procs.beat(name)
        for name in ("b1", "b2"):
            procs.wait_log(name, "anarchon: instance")
        seen: set[int] = set()
        for n in range(args.kills):
            first = wait_for(lambda: next((e for e in read_records(out) if e["event"] == "start"
                                           and e["attempt"] == 1 and e["slot"] not in seen), None),
                             max(anchor + (n + 1) * gap + 60 - time.time(), 1), f"{kind}: attempt 1 of slot {n + 1}")
            seen.add(first["slot"])
            # a steady state (the runner has renewed), then a kill at any phase of its heartbeat
            time.sleep(args.settle + random.uniform(0, lease["heartbeat"]))
            os.kill(first["pid"], signal.SIGKILL)
            kill = Kill(first["slot"], time.time())
            result.kills.append(kill)
            run, offset = store_offset_s(store, kill.slot_ms)
            if run is not None and run.attempt == 1 and run.lease_expires_ms is not None:
                kill.expiry = run.lease_expires_ms / 1000 - offset
            second = wait_for(lambda: next((e for e in read_records(out) if e["event"] == "start"
                                            and e["slot"] == kill.slot_ms and e["attempt"] >= 2), None),
                              bound_s + args.margin + 60, f"{kind}: attempt 2 of slot {kill.slot_ms}")
            kill.start = second["time"]
            _, offset = store_offset_s(store, kill.slot_ms)
            taken_ms = taken_over_ms(store, kill.slot_ms)
            kill.takeover = None if taken_ms is None else taken_ms / 1000 - offset
            print(f"  {kind} kill {n + 1}: taken over after {_fmt(kill.takeover, kill.killed)} s, "
                  f"attempt 2 started after {_fmt(kill.start, kill.killed)} s", flush=True)
        # each run's attempts and takeovers, once the last attempt 2 had time to end
        wait_for(lambda: sum(e["event"] == "end" for e in read_records(out)) >= len(result.kills),
                 args.hold_later + 30, f"{kind}: the attempts 2 to end")
        time.sleep(2 * lease["heartbeat"] + 1)      # lease checks after the ends: no late takeover
        logs = procs.text("b1") + procs.text("b2")
        events = read_records(out)
        for kill in result.kills:
            iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(kill.slot_ms / 1000))
            kill.takeovers = len(re.findall(rf"{ENTRY}: slot {re.escape(iso)}\S* attempt \d+ taken over",
                                            logs))
            kill.attempts = sorted(e["attempt"] for e in events
                                   if e["event"] == "start" and e["slot"] == kill.slot_ms)
    except (AssertionError, RuntimeError) as exc:
        result.error = f"{exc}\n{procs.logs() if procs else ''}"[-6000:]
    finally:
        if procs is not None:
            procs.stop_all()
        store.close()
        for rig in stack:
            rig.close()
    return result


def _fmt(when: float | None, since: float) -> str:
    return "?" if when is None else f"{when - since:.2f}"


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def report(result: StoreResult, margin: float) -> bool:
    """Print one store's figures; True when every takeover kept the bound (+ margin) and every
    killed run was taken over exactly once, its attempts 1 and 2 only."""
    kills = result.kills
    expiry = [k.expiry - k.killed for k in kills if k.expiry is not None]
    takeover = [k.takeover - k.killed for k in kills if k.takeover is not None]
    beat_part = [k.takeover - k.expiry for k in kills if k.takeover is not None and k.expiry is not None]
    start = [k.start - k.killed for k in kills if k.start is not None]
    over = sum(t > result.bound_s for t in takeover)
    over_margin = sum(t > result.bound_s + margin for t in takeover)
    unseen = sum(k.takeover is None for k in kills)
    unsafe = [k for k in kills if k.takeovers != 1 or k.attempts != [1, 2]]
    print(f"{result.kind}: n = {len(kills)}   (seconds, min / median / max)")
    print(f"  kill -> lease expiry       {_spread(expiry)}")
    print(f"  lease expiry -> takeover   {_spread(beat_part)}")
    print(f"  kill -> takeover           {_spread(takeover)}   bound (duration + 2 x heartbeat) "
          f"{result.bound_s:g}: {over} over it, {over_margin} over it + {margin:g} s margin"
          + (f", {unseen} without a taken_over record" if unseen else ""))
    print(f"  kill -> attempt 2 starts   {_spread(start)}   (+ the queue and the worker: not bounded)")
    for k in unsafe:
        print(f"  UNSAFE: slot {k.slot_ms}: {k.takeovers} takeovers logged, attempts started {k.attempts}")
    if result.error:
        print(f"  FAILED: {result.error}")
    return not (over_margin or unseen or unsafe or result.error)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", default=",".join(STORES),
                        help=f"comma-separated, of {', '.join(STORES)} (default: all)")
    parser.add_argument("--kills", type=int, default=5, help="runners killed per store (default 5)")
    parser.add_argument("--duration", type=float, default=6, help="lease duration, s (default 6)")
    parser.add_argument("--heartbeat", type=float, default=1, help="lease heartbeat, s (default 1)")
    parser.add_argument("--margin", type=float, default=1.0,
                        help="tolerated lateness past the bound for beat's tick, s (default 1)")
    parser.add_argument("--gap", type=float, default=0,
                        help="the entry's interval, s (default: bound + hold-later + 6)")
    parser.add_argument("--hold-later", type=float, default=1,
                        help="how long attempt 2 holds its run, s (default 1)")
    parser.add_argument("--settle", type=float, default=1.5,
                        help="wait after attempt 1 starts before the kill, s, plus a random part of a "
                             "heartbeat (default 1.5)")
    parser.add_argument("--broker", default=REDIS_URL.rsplit("/", 1)[0] + "/8")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs)")
    args = parser.parse_args()
    kinds = [k.strip() for k in args.stores.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in STORES]
    if unknown:
        parser.error(f"--stores: unknown {', '.join(unknown)}; known: {', '.join(STORES)}")
    if args.margin < 0 or args.kills < 1:
        parser.error("--margin must be 0 or more, --kills 1 or more")
    if args.heartbeat * 2 >= args.duration:
        parser.error("--heartbeat must be less than half of --duration (the lease's own rule)")
    lease = {"duration": args.duration, "heartbeat": args.heartbeat}
    workdir = tempfile.mkdtemp(prefix="anarchon-takeover-")
    print(f"lease {args.duration:g} s / heartbeat {args.heartbeat:g} s; {args.kills} kills per "
          f"store; work folder {workdir}", flush=True)
    results = [measure_store(kind, args, lease, workdir) for kind in kinds]
    print()
    ok = all([report(r, args.margin) for r in results])
    if args.keep or not ok:
        print(f"logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
