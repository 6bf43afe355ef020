"""Every beat stopped for a minute, then started (multi-process: two real ``celery beat``
processes, a worker, a SQLite store, the test Redis as broker): while they are down
``check --overdue`` exits 5; once they are back and settled, every slot of the stopped minute is
recorded ``missed`` exactly once (``history`` and ``status --json`` show it), no slot is sent
twice, and ``anarchon_missed_runs_total``
summed over the beats (read over HTTP) counts each missed slot once
(celery_anarchon/beat/engine/gaps.py; docs/production.md "Missed slots")."""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from celery_anarchon._util import LATENESS_TOLERANCE_MS, iso
from celery_anarchon.beat.engine.gaps import MARGIN_MS
from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import RunEvent

from backends import backdate_memory_start
from broker_reads import BROKER_URL
from cluster import APPS, Cluster, read_executions
from conftest import REDIS_URL, require_server
from operate_support import free_port
from stores_support import store_url, wait_until

ENTRY, GAP_S, MAX_LATE_S, JITTER_S, SYNC_S = "every-5s", 5, 2.0, 0.5, 1.0
#: how long every beat is down
STOPPED_S = 60.0
#: how long after a beat starts it looks for missed slots (the entry's claim window)
SETTLE_S = MAX_LATE_S + JITTER_S + (LATENESS_TOLERANCE_MS + MARGIN_MS) / 1000
BEATS = ("beat-a", "beat-b")


def scrape(port: int) -> dict[tuple[str, str], float]:
    """``{(metric, entry label): value}`` of a beat's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {(s.name, s.labels.get("entry", "")): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def anarchon(env: dict, *args: str) -> subprocess.CompletedProcess:
    """``celery -A integration_app anarchon <args>`` with the cluster's environment."""
    path = os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "celery", "-A", "integration_app", "anarchon",
                           *args], env={**os.environ, **env, "PYTHONPATH": path},
                          capture_output=True, text=True, timeout=60, cwd=APPS)


def test_a_minute_with_every_beat_stopped_is_recorded_missed_once_and_counted_once(
        tmp_path, namespace):
    require_server(REDIS_URL, "Redis (the broker)")
    began = time.monotonic()
    url = store_url("sqlite", str(tmp_path))
    store = open_store(url, namespace=namespace, instance_id="test", options={})
    store.prepare([ENTRY])
    backdate_memory_start(store, [ENTRY], 120_000)          # a store in service for a while
    out = str(tmp_path / "executions.jsonl")
    env = {"ANARCHON_IT_BROKER": BROKER_URL, "ANARCHON_IT_STORE": url,
           "ANARCHON_IT_NAMESPACE": namespace, "ANARCHON_IT_QUEUE": f"missed-{namespace}",
           "ANARCHON_IT_OUT": out, "ANARCHON_IT_ENTRIES": f'{{"{ENTRY}": {GAP_S}}}',
           "ANARCHON_IT_MAX_LATE": str(MAX_LATE_S), "ANARCHON_IT_JITTER": str(JITTER_S),
           "ANARCHON_IT_SYNC": str(SYNC_S)}
    cluster = Cluster(str(tmp_path), env)
    ports = {name: free_port() for name in BEATS}

    def start(suffix: str) -> float:
        for name in BEATS:
            cluster.beat(name + suffix, env={"ANARCHON_METRICS_PORT": str(ports[name])})
        return max(cluster.wait_log(name + suffix, "anarchon: instance") for name in BEATS)

    def history() -> dict[int, RunEvent]:
        return {r.slot_ms: r.event for r in store.history.read(ENTRY)}
    try:
        cluster.worker("worker")
        cluster.wait_log("worker", "ready.")
        start("")
        wait_until(lambda: sum(e is RunEvent.SENT for e in history().values()) >= 3,
                   3 * GAP_S + SETTLE_S, "three runs sent before the stop", interval=0.2)
        for name in BEATS:
            cluster.stop(name)
        stopped = time.time()
        # down: the entry's newest due slot has no record, and check --overdue says so
        overdue = wait_until(lambda: (done := anarchon(env, "check", "--overdue")).returncode
                             == 5 and done, GAP_S + JITTER_S + MAX_LATE_S + 30,
                             "check --overdue to exit 5 while every beat is down", interval=0.5)
        assert f"OVERDUE  {ENTRY}" in overdue.stdout
        time.sleep(max(0.0, stopped + STOPPED_S - time.time()))     # the minute of the outage
        restarted = start("-again")
        restarted_ms = int(restarted * 1000)

        def accounted():
            runs = history()
            first = min(runs)
            return all(slot in runs for slot in range(first, restarted_ms, GAP_S * 1000))
        wait_until(accounted, SETTLE_S + 3 * GAP_S + 30,
                   "every slot up to the restart recorded", interval=0.5)
        runs = history()
        missed = sorted(slot for slot, event in runs.items() if event is RunEvent.MISSED)
        assert missed, runs
        before = max(s for s, e in runs.items() if e is not RunEvent.MISSED and s < missed[0])
        after = min(s for s, e in runs.items() if e is not RunEvent.MISSED and s > missed[0])
        assert missed == list(range(before + GAP_S * 1000, after, GAP_S * 1000)), runs
        assert before <= stopped * 1000 and after >= stopped * 1000 + STOPPED_S * 1000 - GAP_S * 1000
        assert len(missed) >= STOPPED_S / GAP_S - 1

        def counted():
            found = {name: scrape(port) for name, port in ports.items()}
            total = sum(f.get(("anarchon_missed_runs_total", ENTRY), 0) for f in found.values())
            return found if total == len(missed) else None
        found = wait_until(counted, 10, "the beats' missed-run counters to add up", interval=0.2)
        now = time.time()
        for name, metrics in found.items():
            last_run = metrics[("anarchon_last_run_timestamp_seconds", ENTRY)]
            next_slot = metrics[("anarchon_next_slot_timestamp_seconds", ENTRY)]
            assert after / 1000 <= last_run <= now, name
            assert now - GAP_S - 1 <= next_slot <= now + GAP_S + 1, name
        text = anarchon(env, "history", ENTRY)
        assert text.returncode == 0 and text.stdout.count("missed") >= len(missed), text.stdout
        status = anarchon(env, "status", "--json", "--runs", "100")
        assert status.returncode == 0, status.stderr
        [row] = [e for e in json.loads(status.stdout)["entries"] if e["name"] == ENTRY]
        assert sorted(r["slot"] for r in row["runs"] if r["event"] == "missed") == [
            iso(slot) for slot in missed]
    finally:
        cluster.stop_all()
        store.close()
    executed = collections.Counter(int(x["slot"]) for x in read_executions(out)
                                   if x["entry"] == ENTRY)
    assert executed and all(n == 1 for n in executed.values()), executed
    assert not set(executed) & set(missed)
    print(f"{len(missed)} slots missed; the test took {time.monotonic() - began:.1f} s")
