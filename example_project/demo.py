"""``make demo``: three beat instances and one worker of ``proj``, for about a minute.

No server is needed: the broker is kombu's SQLAlchemy transport on a SQLite file and the claims go
to the embedded SQLite store. Set ANARCHON_DEMO_BROKER / ANARCHON_DEMO_STORE to use Redis or
PostgreSQL instead (see README). Midway one beat is killed with SIGKILL: the others carry on.
It prints every run as the worker executes it, then a summary; it exits 1 on any duplicate or any
miss that the store's history does not explain.
"""
from __future__ import annotations

import collections
import json
import os
import re
import shutil
import signal
import sys
import time
from datetime import datetime

HERE = os.path.dirname(os.path.abspath(__file__))
# the process harness shared with the tests and the benchmarks (standard library only)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))
from procs import CeleryProcs  # noqa: E402
RUN = os.path.join(HERE, ".run")
SECONDS = float(os.environ.get("ANARCHON_DEMO_SECONDS", "60"))
BEATS = ("beat-1", "beat-2", "beat-3")


def hhmmss(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s).strftime("%H:%M:%S.%f")[:-3]


class Demo:
    """The processes of one demo in a fresh run folder (``RUN``), and its live view of the runs.

    :param run: the run folder (emptied first): the logs, the SQLite files, executions.jsonl.
    :param app: the ``-A`` of the processes; ``env``: the variables they get besides
        ``ANARCHON_DEMO_DIR``.
    """

    def __init__(self, run: str = RUN, app: str = "proj", env: dict | None = None) -> None:
        shutil.rmtree(run, ignore_errors=True)
        os.makedirs(run)
        self.run_dir = run
        self.celery = CeleryProcs(run, {"ANARCHON_DEMO_DIR": run, **(env or {})}, app=app,
                                  pythonpath=(HERE,))
        self.names: dict[str, str] = {}        # instance id -> beat name
        self.seen = 0
        self.window = (0.0, float("inf"))   # the slots the summary counts (seconds)

    def wait_ready(self, name: str, marker: str, timeout: float = 90) -> float:
        try:
            ready = self.celery.wait_log(name, marker, timeout)
        except AssertionError as exc:
            sys.exit(str(exc))
        match = re.search(r"anarchon: instance (\S+),", self.celery.text(name))
        if match:
            self.names[match.group(1)] = name
        return ready

    def executions(self) -> list[dict]:
        path = os.path.join(self.run_dir, "executions.jsonl")
        if not os.path.exists(path):
            return []
        with open(path, encoding="utf-8") as f:     # a line without its newline: still written
            return [json.loads(line) for line in f if line.endswith("\n") and line.strip()]

    def show_new(self) -> None:
        runs = self.executions()
        for run in runs[self.seen:]:
            who = self.names.get(run["instance"], run["instance"])
            counted = self.window[0] <= run["slot"] / 1000 <= self.window[1]
            print(f"  {hhmmss(run['slot'] / 1000)}  {run['entry']:<24} sent by {who:<7} "
                  f"ran {run['executed_at'] - run['slot'] / 1000:6.3f} s after its slot"
                  f"{'' if counted else '  (outside the counted window)'}", flush=True)
        self.seen = len(runs)

    def wait(self, until: float) -> None:
        while time.time() < until:
            self.show_new()
            time.sleep(0.2)

    def run(self) -> int:
        os.environ["ANARCHON_DEMO_DIR"] = RUN
        sys.path.insert(0, HERE)
        from proj import app

        from celery_anarchon._util import mask_url
        from celery_anarchon.settings import Settings

        settings = Settings.from_app(app)
        url, options = settings.store_url, settings.store_options
        print(f"broker: {mask_url(app.conf.broker_url)}\nstore:  {mask_url(url)}\n"
              f"starting a worker and three beat instances ({', '.join(BEATS)}) ...", flush=True)
        try:
            self.celery.worker("worker", pool="threads", concurrency=4)
            for name in BEATS:
                self.celery.beat(name)
            self.wait_ready("worker", "ready.")
            ready = [self.wait_ready(name, "anarchon: instance") for name in BEATS]
            # a store that has just been created refuses runs of its first 10 s: it cannot tell
            # a new store from one that lost its data (docs/design.md "Amnesia")
            start = min(ready) + 11
            self.window = (start, start + SECONDS - 1)   # as summary() counts them
            print(f"all running. A new store refuses its first 10 s of runs; counting runs from "
                  f"{hhmmss(start)} for {SECONDS:.0f} s.\n", flush=True)
            self.wait(start + SECONDS / 2)
            victim = BEATS[0]
            self.celery.signal(victim, signal.SIGKILL)
            print(f"\n  >>> {hhmmss(time.time())}  {victim} killed with SIGKILL; the other beats "
                  "carry on <<<\n", flush=True)
            end = start + SECONDS
            self.wait(end)
            self.wait(time.time() + 3)      # let the last runs reach the worker
        finally:
            self.celery.stop_all()
        self.show_new()
        return self.summary(app, url, options, settings, start, end - 1)

    def summary(self, app, url, options, settings, start, end) -> int:
        from celery.beat import ScheduleEntry

        from celery_anarchon.schedule.slots import slots_for
        from celery_anarchon.stores import open_store

        counts = collections.Counter((r["entry"], r["slot"]) for r in self.executions())
        store = open_store(url, namespace=settings.namespace, instance_id="demo", options=options)
        killed = [i for i, n in self.names.items() if n == BEATS[0]]
        expected = once = duplicates = 0
        missed, explained = [], []
        print(f"\n{'entry':<26}{'expected':>9}{'once':>6}{'twice+':>8}{'missed':>8}")
        for name, item in app.conf.beat_schedule.items():
            entry = ScheduleEntry(name=name, app=app, **item)
            slots = slots_for(entry.schedule, entry=name, app_timezone=app.timezone)
            history = {h.slot_ms: h for h in store.history.read(name, limit=1000)}
            want, s = [], slots.next_after(int(start * 1000) - 1)
            while s <= end * 1000:
                want.append(s)
                s = slots.next_after(s)
            row_once = sum(1 for s in want if counts[(name, s)] == 1)
            row_dup = sum(1 for (e, _), n in counts.items() if e == name and n > 1)
            row_missed = [s for s in want if counts[(name, s)] == 0]
            for s in row_missed:
                h = history.get(s)
                reason = f"{h.event.value} by {self.names.get(h.instance, h.instance)}" if h else None
                (explained if reason else missed).append((name, s, reason))
            expected, once, duplicates = expected + len(want), once + row_once, duplicates + row_dup
            print(f"{name:<26}{len(want):>9}{row_once:>6}{row_dup:>8}{len(row_missed):>8}")
        store.close()
        print(f"\nruns expected: {expected}   sent exactly once: {once}   duplicates: {duplicates}   "
              f"misses: {len(missed) + len(explained)}")
        for name, s, reason in explained:
            print(f"  missed {name} {hhmmss(s / 1000)}: the store's history says {reason!r}"
                  + (" (claimed just before it was killed)" if reason and reason.startswith("claimed") else ""))
        for name, s, _ in missed:
            print(f"  missed {name} {hhmmss(s / 1000)}: NO recorded reason")
        if killed:
            print(f"{BEATS[0]} ({killed[0]}) was killed midway; the other two carried on.")
        return 1 if duplicates or missed else 0


if __name__ == "__main__":
    sys.exit(Demo().run())
