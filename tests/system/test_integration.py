"""Three real ``celery beat`` processes with our Scheduler and a real worker, on each lease store.

Every slot of each entry (1 s, 2 s, 5 s intervals, an every-minute crontab) runs exactly once; no
slot is missed; no instance wins three quarters of the 1-s entry (its fair share is about 42 %). One beat is killed with SIGKILL
midway: still no duplicate, and the only possible miss is a run whose claim it had won but not
yet sent (the store's history shows that claim without a send).

A duplicate can come late (a claim retried until max_late, a send retried): once every wanted run
arrived, the beats keep running for the largest jitter + max_late, then stop, and the collection
goes on until the broker's queue is empty; a message still queued when the worker stops counts as
sent too.
"""
from __future__ import annotations

import collections
import json
import os
import re
import signal
import statistics
import time
from datetime import datetime, timezone

import pytest

from celery_anarchon.schedule.plan import task_id_for
from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import RunEvent

from cluster import Cluster, read_executions
from conftest import REDIS_URL, require_server
from broker_reads import BROKER_URL, queued_messages
from stores_support import PROCESS_STORES, VARIANT_OPTIONS, store_url
from backends import backdate_memory_start

ENTRIES = {"every-1s": 1000, "every-2s": 2000, "every-5s": 5000, "every-minute": 60_000}
#: anarchon_max_late of the beats, and the largest jitter of the entries (the crontab's default 2 s):
#: a late duplicate is sent at most this long after its slot
MAX_LATE_S, MAX_JITTER_S = 5.0, 2.0


def expected_slots(start_s: float, end_s: float) -> dict[str, list[int]]:
    lo, hi = int(start_s * 1000), int(end_s * 1000)
    return {name: [s for s in range(lo - lo % period + period, hi + 1, period)]
            for name, period in ENTRIES.items()}


#: how long the worker may take to execute what was sent (a condition ends the wait earlier)
DRAIN_S = 60.0
#: the 60-s run on the Redis lease store; 20 s on every other store
SECONDS = {kind: 64 if kind == "redis" else 22 for kind in PROCESS_STORES}


def instance_of(cluster: Cluster, name: str) -> str:
    match = re.search(r"anarchon: instance (\S+),", cluster.procs[name].text())
    assert match, f"{name} never logged its instance id"
    return match.group(1)


#: every store that processes share (three beat processes and a worker)
@pytest.mark.parametrize("kind", PROCESS_STORES)
def test_three_beats_send_every_slot_exactly_once(kind, tmp_path, namespace, capsys):
    require_server(REDIS_URL, "Redis (the broker)")
    seconds = SECONDS[kind]
    url = store_url(kind, str(tmp_path))
    options = {"history_size": 500, **VARIANT_OPTIONS.get(kind, {})}
    out = str(tmp_path / "executions.jsonl")
    # a store that has been in service for a while (a new one refuses its first 10 s of slots)
    store = open_store(url, namespace=namespace, instance_id="test", options=options)
    store.prepare(list(ENTRIES))
    backdate_memory_start(store, list(ENTRIES), 120_000)
    queue = f"it-{namespace}"
    cluster = Cluster(str(tmp_path), {
        "ANARCHON_IT_BROKER": BROKER_URL, "ANARCHON_IT_STORE": url, "ANARCHON_IT_NAMESPACE": namespace,
        "ANARCHON_IT_QUEUE": queue, "ANARCHON_IT_OUT": out, "ANARCHON_IT_MAX_LATE": str(MAX_LATE_S),
        "ANARCHON_IT_STORE_OPTIONS": json.dumps(options)})
    beats = ["beat-a", "beat-b", "beat-c"]
    try:
        cluster.worker("worker")
        if kind == "sqlite":   # the three ways to start it
            cluster.beat("beat-a", "-S", "celery_anarchon:Scheduler")
            cluster.beat("beat-b", "-S", "anarchon")
            cluster.worker("beat-c", "-B", "--scheduler", "celery_anarchon:Scheduler")
        else:                  # beat_scheduler from the app's configuration
            for name in beats:
                cluster.beat(name)
        cluster.wait_log("worker", "ready.")
        start = max(cluster.wait_log(name, "anarchon: instance") for name in beats) + 1.0
        killed = instance_of(cluster, "beat-a")
        time.sleep(max(0.0, start + seconds / 2 - time.time()))
        cluster.signal("beat-a", signal.SIGKILL)
        time.sleep(max(0.0, start + seconds - time.time()))
        end = time.time()
        expected = expected_slots(start, end - 3)
        want = {(e, s) for e, slots in expected.items() for s in slots}

        def arrived():
            return want <= {(x["entry"], x["slot"]) for x in read_executions(out)}
        deadline = time.monotonic() + DRAIN_S
        while not arrived() and time.monotonic() < deadline:
            time.sleep(0.2)
        # a late duplicate of a wanted run is sent at most jitter + max_late after its slot
        last_slot_s = max(slot for _, slot in want) / 1000
        time.sleep(max(0.0, last_slot_s + MAX_JITTER_S + MAX_LATE_S + 0.5 - time.time()))
        for name in ("beat-b", "beat-c"):
            cluster.stop(name)
        # nothing is sent any more: collect until the worker emptied the queue
        deadline = time.monotonic() + DRAIN_S
        while queued_messages(queue) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        cluster.stop_all()
    left = queued_messages(queue)       # sent, never executed (the worker stopped first)

    runs = read_executions(out) + [{"entry": h.get("anarchon_entry"), "slot": h.get("anarchon_slot"),
                                     "instance": h.get("anarchon_instance"), "task_id": h.get("id"),
                                     "queued": True} for h in left]
    counts = collections.Counter((x["entry"], x["slot"]) for x in runs)
    duplicates = {run: n for run, n in counts.items() if n > 1}
    missed = sorted(run for run in want if run not in counts)
    history = {e: {h.slot_ms: h for h in store.history.read(e, limit=500)} for e in ENTRIES}
    store.close()
    in_flight = [(e, s) for e, s in missed if (h := history[e].get(s)) is not None
                 and h.event is RunEvent.CLAIMED and h.instance == killed]
    unexplained = [run for run in missed if run not in in_flight]
    lateness = [x["executed_at"] - x["slot"] / 1000 for x in runs
                if (x["entry"], x["slot"]) in want and not x.get("queued")]
    share = collections.Counter(x["instance"] for x in runs if x["entry"] == "every-1s"
                                and (x["entry"], x["slot"]) in want)
    with capsys.disabled():
        print(f"\n[{kind}] {len(want)} runs expected over {end - start:.0f} s, "
              f"{sum(1 for r in want if counts.get(r) == 1)} executed exactly once, "
              f"{len(duplicates)} duplicates, {len(missed)} missed ({len(in_flight)} in flight "
              f"at the kill), lateness p50 {statistics.median(lateness):.3f} s "
              f"max {max(lateness):.3f} s, 1-s entry wins per instance {sorted(share.values())}")
    assert not duplicates, f"runs executed twice: {duplicates}\n{cluster.logs()}"
    assert not unexplained, f"missed runs with no recorded reason: {unexplained}\n{cluster.logs()}"
    assert len(in_flight) <= len(ENTRIES), in_flight
    assert not left, f"sent but never executed (still queued when the worker stopped): {left}"
    # every run carries the task id of (namespace, entry, slot, attempt 1) and its nominal time
    wrong = [x for x in runs if not x.get("queued") and (
        x["task_id"] != task_id_for(namespace, x["entry"], x["slot"], 1)
        or x["scheduled_at"] != datetime.fromtimestamp(x["slot"] / 1000, timezone.utc).isoformat())]
    assert not wrong, wrong[:5]
    if kind == "redis":    # enough runs (about 60) for the share to mean something
        # B and C each win about 5/12 (a third before the kill, half after), a standard deviation
        # of 6 % of the runs: 3/4 is 5 deviations away, where jitter not drawn independently (one
        # instance winning nearly every run) lands
        assert max(share.values()) <= 0.75 * sum(share.values()), share


def test_two_beats_in_two_directories_with_a_relative_sqlite_path_each_name_their_own_file(
        tmp_path, namespace):
    """What a relative SQLite path (``sqlite:///rel.sqlite3``) promises, with two real beats
    started from two directories: each process resolves it once, against its own working
    directory, so the two beats use two files, and each says so. Its banner, its start-up line
    and ``status`` / ``check`` (run in that directory) name the absolute file, never the relative
    URL alone, and a warning names the relative path, the directory and the fix. Each file's
    history holds the sends of the beat that named it only, and both files hold sends of the same
    slots: the duplicates the warning speaks of."""
    entry = "clock"
    dirs = {name: tmp_path / name for name in ("a", "b")}
    for folder in dirs.values():           # stores in service for a while (no refused first 10 s)
        folder.mkdir()
        store = open_store(f"sqlite:///{folder / 'rel.sqlite3'}", namespace=namespace,
                           instance_id="test")
        store.prepare([entry])
        backdate_memory_start(store, [entry], 120_000)
        store.close()
    env = {"ANARCHON_SC_BROKER": "memory://", "ANARCHON_SC_STORE": "sqlite:///rel.sqlite3",
           "ANARCHON_SC_NAMESPACE": namespace, "ANARCHON_SC_QUEUE": f"rel-{namespace}",
           "ANARCHON_SC_OUT": str(tmp_path / "unused.jsonl"), "ANARCHON_SC_CLOCK": "1"}
    cluster = Cluster(str(tmp_path), env, app="schedules_app")
    texts = {}
    try:
        for name, folder in dirs.items():
            cluster.beat(f"beat-{name}", cwd=str(folder))

        def sends(folder):
            store = open_store(f"sqlite:///{folder / 'rel.sqlite3'}", namespace=namespace,
                               instance_id="test")
            try:
                return {(r.slot_ms, r.instance) for r in store.history.read(entry)
                        if r.event is RunEvent.SENT}
            finally:
                store.close()

        deadline = time.monotonic() + 60
        while not all(len(sends(f)) >= 3 for f in dirs.values()):
            assert time.monotonic() < deadline, f"no sends in both files\n{cluster.logs()}"
            assert all(p.alive() for p in cluster.procs.values()), cluster.logs()
            time.sleep(0.2)
        for name, command in (("status", ("status",)), ("status-json", ("status", "--json")),
                              ("check", ("check",))):
            proc = cluster.start(name, "anarchon", *command, cwd=str(dirs["a"]))
            proc.popen.wait(60)
            texts[name] = proc.text()
    finally:
        cluster.stop_all()
    instances = {}
    for name, folder in dirs.items():
        path = folder / "rel.sqlite3"
        text = cluster.text(f"beat-{name}")
        assert f". store -> sqlite:///{path} (sqlite" in text, text              # the banner
        [line] = [ln for ln in text.splitlines() if "anarchon: instance " in ln]
        assert f", store sqlite:///{path}, namespace" in line, line
        instances[name] = line.split("anarchon: instance ", 1)[1].split(",", 1)[0]
        warning = (f"sqlite store sqlite:///{path}: anarchon_store_url 'sqlite:///rel.sqlite3' "
                   "names a relative path, resolved against this process's working directory "
                   f"({folder}): a beat, worker or command started in another directory opens "
                   "another file: two beats on two files each send every run, and a worker on "
                   "another file than beat's adopts none of its leased runs. Fix: give the "
                   f"absolute path, anarchon_store_url = 'sqlite:///{path}' (four slashes)")
        assert warning in text, text
        assert text.count("sqlite:///rel.sqlite3") == text.count(warning), text
    by_file = {name: sends(folder) for name, folder in dirs.items()}
    for name in dirs:
        assert {instance for _, instance in by_file[name]} == {instances[name]}, by_file
    both = {slot for slot, _ in by_file["a"]} & {slot for slot, _ in by_file["b"]}
    assert both, by_file        # each file's beat sent the same slots: two stores, two sends

    path_a = dirs["a"] / "rel.sqlite3"
    assert f"store: sqlite:///{path_a} (sqlite)" in texts["status"], texts["status"]
    assert (f"warning: sqlite store sqlite:///{path_a}: anarchon_store_url "
            "'sqlite:///rel.sqlite3' names a relative path") in texts["status"], texts["status"]
    data = json.loads(texts["status-json"])          # what the page and /api/status show
    assert data["store"]["url"] == f"sqlite:///{path_a}"
    assert [i["instance_id"] for i in data["instances"]] == [instances["a"]]
    assert any("names a relative path" in w for w in data["store"]["warnings"]), data["store"]
    assert f"store sqlite:///{path_a} (sqlite)" in texts["check"], texts["check"]
    assert (f"warn  sqlite store sqlite:///{path_a}: anarchon_store_url 'sqlite:///rel.sqlite3' "
            "names a relative path") in texts["check"], texts["check"]
