"""The cluster of schedules_app (tests/support/apps): three beats and a worker of real Celery
processes following a store's entries, shared by the tests of store entries at run time
(tests/operate/test_schedules_cluster.py), of the status page (test_web.py) and of a store
that lost its data (tests/system/test_amnesia_cluster.py)."""
from __future__ import annotations

import json
import re
import time

from celery_anarchon.stores import open_store

from backends import backdate_memory_start
from broker_reads import BROKER_URL
from cluster import Cluster, read_executions
from stores_support import VARIANT_OPTIONS

#: anarchon_sync_interval of the beats, seconds
SYNC_S = 1.0
#: the names of the beat processes
BEATS = ("beat-a", "beat-b", "beat-c")
#: a beat's log line when it followed the store's entries at a version
SYNCED = re.compile(r"anarchon: synced entries version (\d+):")


class Run:
    """One cluster's processes, its executions file and the test's clock of phases."""

    def __init__(self, cluster: Cluster, out: str, beats: tuple[str, ...]) -> None:
        self.cluster, self.out, self.beats = cluster, out, beats
        self.costs: dict[str, float] = {}
        self._began = time.monotonic()

    def start(self, timeout: float = 60) -> None:
        """Start the worker and the beats; return once the worker is ready and every beat
        followed the store's entries."""
        self.cluster.worker("worker")
        for name in self.beats:
            self.cluster.beat(name)
        self.cluster.wait_log("worker", "ready.", timeout=timeout)
        self.synced(0, timeout=timeout)

    def phase(self, name: str) -> None:
        """Close the phase that ran since the last call (its cost, seconds)."""
        now = time.monotonic()
        self.costs[name] = now - self._began
        self._began = now

    def wait(self, predicate, timeout: float, what: str):
        """Poll ``predicate`` until it returns a true value (every process still running).

        :raises AssertionError: ``timeout`` passed, or a process exited (with the logs).
        """
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            dead = [p.name for p in self.cluster.procs.values() if not p.alive()]
            if dead or time.monotonic() > deadline:
                why = f"{dead} exited" if dead else f"timed out after {timeout} s"
                raise AssertionError(f"{why} waiting for {what}\n{self.cluster.logs()}")
            time.sleep(0.05)

    def synced(self, version: int, timeout: float = SYNC_S + 10) -> float:
        """Wait until every beat logged a sync at ``version`` or later; returns when the last one
        was seen (epoch seconds: after every instance switched)."""
        def all_synced():
            return all(any(int(v) >= version for v in SYNCED.findall(self.cluster.text(b)))
                       for b in self.beats)
        self.wait(all_synced, timeout, f"every beat to sync entries version {version}")
        return time.time()

    def runs(self, entry: str = "dyn") -> list[dict]:
        """What the worker executed of ``entry``, oldest first (one dict a run)."""
        return [x for x in read_executions(self.out) if x["entry"] == entry]


def cluster_env(kind: str, url: str, namespace: str, out: str, **more: str) -> dict:
    """The environment of schedules_app's processes: the broker, the store at ``url`` (a
    ``kind`` of tests/support/backends.py, with its variant's options), ``namespace``, the queue
    and the executions file ``out``; ``more``: other ``ANARCHON_SC_*`` settings."""
    return {"ANARCHON_SC_BROKER": BROKER_URL, "ANARCHON_SC_STORE": url,
            "ANARCHON_SC_NAMESPACE": namespace, "ANARCHON_SC_QUEUE": f"sc-{namespace}",
            "ANARCHON_SC_OUT": out,
            "ANARCHON_SC_STORE_OPTIONS": json.dumps(VARIANT_OPTIONS.get(kind, {})), **more}


def store_in_service(kind: str, url: str, namespace: str, entries: list[str],
                     by_ms: int = 120_000):
    """The store of ``kind`` at ``url`` (its variant's options) for the test process, as one in
    service for a while: the memory of ``entries`` began ``by_ms`` ago (a new store refuses the
    slots of its first 10 s). The caller closes it."""
    store = open_store(url, namespace=namespace, instance_id="test",
                       options=dict(VARIANT_OPTIONS.get(kind, {})))
    store.prepare(entries)
    backdate_memory_start(store, entries, by_ms)
    return store
