"""A Redis store that keeps nothing on disk, restarted under three real ``celery beat`` processes
and a real worker (docs/design.md "Amnesia": entries, pauses and run-now requests).

Before the restart a ``beat_schedule`` entry ``held`` is paused and a store entry ``dyn`` runs
every second. The restart loses every pause, store entry and run-now request. Every beat keeps
what it knew: ``held`` stays paused (nothing of it is sent; its slots are recorded ``paused``,
saying the pause is kept from before the loss) and ``dyn`` keeps running, exactly once per slot,
once the store's memory of claims began again (its first 10 s are refused as forgotten, as for
any entry). Each beat logs the loss as an ERROR naming what it keeps and the fix.

The store is a ``redis-server`` of the test's own (benchmarks/servers.py), never a shared one; the
broker is the tests' Redis. Cost: 25-30 s (the store's 10-s forgotten window is most of it).
"""
from __future__ import annotations

import collections
import json
import re
import signal
import sys
import time

import pytest

import celery_anarchon
from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import LATENESS_TOLERANCE_MS, RunEvent

from backends import backdate_memory_start
from cluster import APPS, Cluster, read_executions
from conftest import REDIS_URL, require_server
from broker_reads import queued_messages
from schedules_cluster import BEATS, Run, cluster_env

servers = pytest.importorskip("servers")

sys.path.insert(0, APPS)
import schedules_app  # noqa: E402  (tests/support/apps: the app the processes run)

#: anarchon_sync_interval and anarchon_max_late of the beats, seconds
SYNC_S, MAX_LATE_S = 1.0, 5.0
#: the slack of a deadline past what the design allows: ticks, the worker, two busy cores
SLACK_S = 5.0
#: the store's memory of claims begins again at the restart: the slots of the next 10 s (plus
#: the slot that straddles it) are refused as forgotten, whatever the entry
FORGOTTEN_S = LATENESS_TOLERANCE_MS / 1000 + 1
#: that memory begins at the first operation after the restart: a beat that found the store down
#: backs off 0.5 s, then 1 s, ... before it asks again
FIRST_OPERATION_S = 3.0
SYNCED = re.compile(r"anarchon: synced entries version (\d+):")


def test_a_redis_restarted_without_its_data_keeps_the_pause_and_the_store_entry(
        tmp_path, namespace, capsys):
    require_server(REDIS_URL, "Redis (the broker)")
    began = time.monotonic()
    store_server = servers.RedisServer("store", str(tmp_path), persistent=False)
    store_server.start()
    url = store_server.url
    out = str(tmp_path / "executions.jsonl")
    env = cluster_env("redis", url, namespace, out, ANARCHON_SC_SYNC_INTERVAL=str(SYNC_S),
                      ANARCHON_SC_MAX_LATE=str(MAX_LATE_S), ANARCHON_SC_CLOCK="1",
                      ANARCHON_SC_ENTRIES=json.dumps({"held": 1}))
    store = open_store(url, namespace=namespace, instance_id="test")
    store.prepare(["clock", "held", "dyn"])
    backdate_memory_start(store, ["clock", "held", "dyn"], 120_000)
    api = celery_anarchon.schedules(schedules_app.make_app(env), by="tester@ops")
    api.pause("held", reason="billing freeze")
    api.add("dyn", task=schedules_app.TASK, schedule=1.0, kwargs={"phase": "before"})
    version = api.store.entries.entries_version()
    api.close()
    cluster = Cluster(str(tmp_path), env, app="schedules_app")
    run = Run(cluster, out, BEATS)
    t: dict[str, float] = {}
    try:
        cluster.worker("worker")
        for name in BEATS:
            cluster.beat(name)
        cluster.wait_log("worker", "ready.", timeout=60)
        run.synced(version, timeout=60)
        run.wait(lambda: len(run.runs("dyn")) >= 2, 10 + SLACK_S, "two runs of dyn")
        run.phase("start")

        # the restart: everything the store held is gone (no AOF, no RDB)
        t["lost"] = time.time()
        store_server.stop(signal.SIGKILL)
        store_server.start()
        t["back"] = time.time()
        run.phase("restart")
        # the pacemaker (a config entry) runs again once the store's memory of claims is 10 s
        # old; wait for five of its slots past that
        t["until"] = t["back"] + FIRST_OPERATION_S + FORGOTTEN_S + 5
        run.wait(lambda: any(x["slot"] > t["until"] * 1000 for x in run.runs("clock")),
                 FIRST_OPERATION_S + FORGOTTEN_S + 5 + 2 * SYNC_S + SLACK_S + 10,
                 "the clock entry after the restart")
        run.phase("after")
        for name in BEATS:
            cluster.stop(name)
        run.wait(lambda: not queued_messages(env["ANARCHON_SC_QUEUE"]), 15,
                 "the worker to empty the queue")
    finally:
        cluster.stop_all()
    held_history = {h.slot_ms: h for h in store.history.read("held", limit=100)}
    store.close()
    store_server.stop()
    logs = {name: cluster.text(name) for name in BEATS}
    everything = read_executions(out)
    counts = collections.Counter((x["entry"], x["slot"]) for x in everything)
    with capsys.disabled():
        print(f"\n[redis restart] {len(everything)} executions; cost (s): "
              + ", ".join(f"{k} {v:.1f}" for k, v in run.costs.items())
              + f", total {time.monotonic() - began:.1f}")
    duplicates = {r: n for r, n in counts.items() if n > 1}
    assert not duplicates, f"runs executed twice: {duplicates}\n{cluster.logs()}"

    # the paused entry was never sent, before or after the restart
    held = sorted(x["slot"] for x in everything if x["entry"] == "held")
    assert not held, (f"the paused entry ran after the store lost its pause (restart at "
                      f"{t['back']:.3f}): slots {held}\n{cluster.logs()}")
    # its slots after the restart are recorded paused, the pause kept from before the loss (in
    # the store's first 10 s, a beat that claimed before its sync saw the loss: forgotten)
    after = list(range(int(t["back"] * 1000) // 1000 * 1000 + 1000, int(t["until"] * 1000) + 1,
                       1000))
    forgetful = (t["back"] + FIRST_OPERATION_S + FORGOTTEN_S) * 1000
    wrong = {s: held_history.get(s) for s in after if s not in held_history
             or held_history[s].event not in (RunEvent.PAUSED, RunEvent.FORGOTTEN)
             or (held_history[s].event is RunEvent.FORGOTTEN and s > forgetful)}
    assert not wrong, wrong
    kept = [held_history[s] for s in after if held_history[s].event is RunEvent.PAUSED]
    assert len(kept) >= 5, kept
    for record in kept:
        assert ("paused by tester@ops: billing freeze" in record.detail
                and "kept" in record.detail), record

    # the store entry kept running: every slot once the store's memory is 10 s old, once each
    dyn = {x["slot"] for x in everything if x["entry"] == "dyn"}
    want = list(range(int(forgetful) // 1000 * 1000 + 1000, int(t["until"] * 1000) + 1, 1000))
    assert len(want) >= 4 and not [s for s in want if s not in dyn], (
        f"the store entry stopped after the restart: wanted {want}, ran "
        f"{sorted(s for s in dyn if s > t['back'] * 1000)}")

    # every beat said so, once, as an ERROR naming what it keeps and the fix
    for name, text in logs.items():
        lines = [ln for ln in text.splitlines() if "anarchon: store entries lost" in ln]
        assert len(lines) == 1, (name, lines)
        line = lines[0]
        assert "ERROR" in line, line
        for words in ("held", "dyn", "paused by tester@ops: billing freeze", "accept-loss"):
            assert words in line, (words, line)
