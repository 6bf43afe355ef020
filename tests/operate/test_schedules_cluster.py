"""Store entries changed at run time, followed by three real ``celery beat`` processes and a real
worker, on SQLite, PostgreSQL and Redis (one cluster per store, every scenario in sequence, sync
interval 1 s), and two beats that disagree on a ``beat_schedule`` entry (default sync interval).

The scenario on one entry ``dyn`` (the worker records every execution, as integration_app does):

1. **add** (every 1 s) through ``schedules(app)``: its first run comes within the sync interval
   plus one period (and is no older than one period before the add: the start-up rule), then
   every slot runs exactly once;
2. **update** to every 1.5 s with other kwargs: once every instance logged the sync, every slot
   is one of the new schedule (a 1-s slot left on one instance would be won and sent: nobody else
   claims it) with the new kwargs, none is missed, none runs twice;
3. **pause** (reason, who): no slot after the pause was written runs (decided inside the claim, on
   every instance, synced or not), and the paused slots are in the history as ``paused`` with
   the reason and who paused;
4. **resume**: every slot after the resume was written runs;
5. **run_now** twice with one request id (and once more after it ran, and every instance synced
   again for another request): one request, one slot of its own, exactly one execution;
6. **remove**: no slot after every instance logged the sync runs.

A duplicate can come late (a claim or a send retried until max_late): the checks are made at the
end, on what the worker executed plus what the broker still holds once the beats stopped.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import socket
import sys
import threading
import time

import pytest

import celery_anarchon
from celery_anarchon.stores.base import RunEvent

from cluster import APPS, Cluster, read_executions
from conftest import REDIS_URL, require_server
from stores_support import store_url
from broker_reads import queued_messages
from schedules_cluster import BEATS, SYNC_S, Run, cluster_env, store_in_service

sys.path.insert(0, APPS)
import schedules_app  # noqa: E402  (tests/support/apps: the app the processes run)

#: the stores of the must-show (Redis: its default strategy)
KINDS = ("sqlite", "postgresql", "redis")
#: anarchon_max_late of the beats, seconds (their sync interval: SYNC_S)
MAX_LATE_S = 5.0
#: the slack of a wait past what the design allows: ticks, the worker, two busy cores (a wait
#: ends as soon as its condition holds; no verdict depends on it)
SLACK_S = 10.0
#: the periods of ``dyn`` before and after the update, ms (slots: multiples since the epoch)
FIRST_MS, SECOND_MS = 1000, 1500
#: the jitter of a 1-s and a 1.5-s entry (a quarter of the gap), seconds
JITTER_S = 0.375
#: a slot this long before a change was claimed before it (jitter, and a tick's delay)
CLAIMED_BY_S = 1.0


def socket_host() -> str:
    """This host's name, as an instance record names it (the beats run here)."""
    return socket.gethostname()


def slots_between(period_ms: int, lo_ms: float, hi_ms: float) -> list[int]:
    """The slots of an interval entry (anchor 0) in ``(lo_ms, hi_ms]``."""
    first = int(lo_ms) // period_ms * period_ms + period_ms
    return list(range(first, int(hi_ms) + 1, period_ms))


@pytest.mark.parametrize("kind", KINDS)
def test_three_beats_follow_store_entries(kind, tmp_path, namespace, capsys):
    require_server(REDIS_URL, "Redis (the broker)")
    began = time.monotonic()
    url = store_url(kind, str(tmp_path))
    out = str(tmp_path / "executions.jsonl")
    env = cluster_env(kind, url, namespace, out, ANARCHON_SC_SYNC_INTERVAL=str(SYNC_S),
                      ANARCHON_SC_MAX_LATE=str(MAX_LATE_S), ANARCHON_SC_CLOCK="1")
    # a store that has been in service for a while (a new one refuses its first 10 s of slots)
    store = store_in_service(kind, url, namespace, ["clock", "dyn"])
    api = celery_anarchon.schedules(schedules_app.make_app(env), by="tester@ops")
    cluster = Cluster(str(tmp_path), env, app="schedules_app")
    run = Run(cluster, out, BEATS)
    t: dict[str, float] = {}
    try:
        run.start()
        run.phase("start")

        # 1. add: runs within the sync interval plus one period, then every slot
        t["add"] = time.time()
        api.add("dyn", task=schedules_app.TASK, schedule=FIRST_MS / 1000, kwargs={"phase": "add"})
        t["added"] = time.time()
        t["add_synced"] = run.synced(api.store.entries.entries_version())
        run.wait(lambda: len(run.runs()) >= 3, SYNC_S + 3 + SLACK_S + 3, "three runs of dyn")
        run.phase("add")

        # 2. update: 1 s -> 1.5 s and new kwargs, on every instance
        t["update"] = time.time()
        api.update("dyn", schedule=SECOND_MS / 1000, kwargs={"phase": "update"})
        t["update_synced"] = run.synced(api.store.entries.entries_version())
        run.wait(lambda: len([x for x in run.runs() if x["slot"] > t["update_synced"] * 1000]) >= 3,
                 3 * SECOND_MS / 1000 + SLACK_S + 3, "three runs of the updated dyn")
        run.phase("update")

        # 3. pause: holds at once, recorded in the history as paused with reason and who
        t["pause"] = time.time()
        api.pause("dyn", reason="maintenance window")
        t["paused"] = time.time()

        def paused_slots():
            found = [h for h in store.history.read("dyn", limit=100)
                     if h.event is RunEvent.PAUSED and h.slot_ms > t["paused"] * 1000]
            return found if len(found) >= 3 else None
        paused = run.wait(paused_slots, 3 * SECOND_MS / 1000 + SLACK_S + 3,
                          "three paused slots in the history")
        for name in BEATS:   # each instance noticed the pause at its sync (logged once)
            cluster.wait_log(name, "entry dyn is paused by tester@ops: maintenance window", 10)
        run.phase("pause")

        # 4. resume: the next slots run again
        t["resume"] = time.time()
        api.resume("dyn")
        t["resumed"] = time.time()
        run.wait(lambda: len([x for x in run.runs() if x["slot"] > t["resumed"] * 1000]) >= 2,
                 2 * SECOND_MS / 1000 + SLACK_S + 3, "two runs after the resume")
        run.phase("resume")

        # 5. run_now twice with one request id (and again after it ran): one run
        first = api.run_now("dyn", request_id="ticket-4711")
        second = api.run_now("dyn", request_id="ticket-4711")
        run.wait(lambda: any(x["slot"] == first.slot_ms for x in run.runs()),
                 2 * SYNC_S + 5 + SLACK_S, "the run-now run")
        for name in BEATS:   # every instance claimed it (one won)
            cluster.wait_log(name, "run-now request ticket-4711", 10)
        third = api.run_now("dyn", request_id="ticket-4711")
        # another request: every instance syncs again (and looks at ticket-4711 again) before
        # the removal
        other = api.run_now("dyn", request_id="ticket-4712")
        run.synced(api.store.entries.entries_version())
        run.wait(lambda: any(x["slot"] == other.slot_ms for x in run.runs()),
                 2 * SYNC_S + 5 + SLACK_S, "the second run-now run")
        run.phase("run_now")

        # 6. remove: nothing runs once every instance synced
        t["remove"] = time.time()
        api.remove("dyn")
        t["remove_synced"] = run.synced(api.store.entries.entries_version())
        # the pacemaker: once the clock entry ran a slot two periods later, a run of dyn due
        # meanwhile would have been sent before it (one queue, FIFO)
        run.wait(lambda: any(x["slot"] > (t["remove_synced"] + 2 * SECOND_MS / 1000 + JITTER_S)
                             * 1000 for x in run.runs("clock")),
                 2 * SECOND_MS / 1000 + SLACK_S + 5, "the clock entry's runs after the removal")
        run.phase("remove")
        for name in BEATS:
            cluster.stop(name)
        queue = env["ANARCHON_SC_QUEUE"]
        run.wait(lambda: not queued_messages(queue), 60, "the worker to empty the queue")
    finally:
        cluster.stop_all()
        api.close()
    left = queued_messages(env["ANARCHON_SC_QUEUE"])
    run.phase("stop")
    history = {h.slot_ms: h for h in store.history.read("dyn", limit=500)}
    store.close()

    everything = read_executions(out) + [{"entry": h.get("anarchon_entry"),
                                          "slot": h.get("anarchon_slot"), "kwargs": {},
                                          "queued": True} for h in left]
    counts = collections.Counter((x["entry"], x["slot"]) for x in everything)
    duplicates = {r: n for r, n in counts.items() if n > 1}
    dyn = sorted((x for x in everything if x["entry"] == "dyn"), key=lambda x: x["slot"])
    by_slot = {x["slot"]: x for x in dyn}
    ms = {k: v * 1000 for k, v in t.items()}
    scheduled = [x for x in dyn if x["slot"] not in (first.slot_ms, other.slot_ms)]
    with capsys.disabled():
        print(f"\n[{kind}] {len(dyn)} runs of dyn, {len(everything)} executions, "
              f"{len(duplicates)} duplicates; cost (s): "
              + ", ".join(f"{k} {v:.1f}" for k, v in run.costs.items())
              + f", total {time.monotonic() - began:.1f}")
    logs = cluster.logs()
    assert not duplicates, f"runs executed twice: {duplicates}\n{logs}"
    assert not left, f"sent, never executed: {left}"

    # 1. add: the first run within sync interval + period (+ jitter, slack); nothing older than
    # one period before the add (start-up rule); then every slot up to the update
    head = scheduled[0]
    assert head["kwargs"] == {"phase": "add"}
    # (how soon it came, sync interval + period + jitter by design, is the machine's: printed)
    print(f"[{kind}] first run executed {head['executed_at'] - t['added']:.2f} s after the add")
    assert head["slot"] > ms["add"] - FIRST_MS, head
    want = slots_between(FIRST_MS, ms["add_synced"], ms["update"] - CLAIMED_BY_S * 1000)
    assert [s for s in want if s not in by_slot] == [], (want, sorted(by_slot))

    # 2. update: after every instance synced, only the new schedule and kwargs; none missed
    after = [x for x in scheduled if ms["update_synced"] < x["slot"] <= ms["pause"]]
    wrong = [x for x in after if x["slot"] % SECOND_MS or x["kwargs"] != {"phase": "update"}]
    assert not wrong, f"runs of the old definition after every instance synced: {wrong}"
    want = slots_between(SECOND_MS, ms["update_synced"], ms["pause"] - CLAIMED_BY_S * 1000)
    assert len(want) >= 2 and [s for s in want if s not in by_slot] == [], (want, sorted(by_slot))

    # 3. pause: no slot after the pause was written ran until the resume (a slot just before
    # the resume is claimed after it, and runs); paused in the history with reason and who
    window = (ms["paused"], ms["resume"] - SECOND_MS)
    ran = [x for x in scheduled if window[0] < x["slot"] < window[1]]
    assert not ran, (f"runs of slots after the pause was written: {ran}, times {t}, history "
                     f"{[history.get(x['slot']) for x in ran]}\n{logs}")
    for record in paused:
        assert record.detail == "paused by tester@ops: maintenance window", record
    assert len(slots_between(SECOND_MS, *window)) >= 2, window
    for slot in slots_between(SECOND_MS, *window):
        assert slot in history and history[slot].event is RunEvent.PAUSED, (slot, history.get(slot))

    # 4. resume: every slot after the resume was written ran (up to the removal)
    want = slots_between(SECOND_MS, ms["resumed"], ms["remove"] - CLAIMED_BY_S * 1000)
    assert len(want) >= 1 and [s for s in want if s not in by_slot] == [], (want, sorted(by_slot))

    # 5. run_now: one request (the same slot for the same id), a slot of its own, one execution
    assert first.created and not second.created and not third.created
    assert second == third == dataclasses.replace(first, created=False), (first, second, third)
    assert first.slot_ms % SECOND_MS != 0 and other.slot_ms != first.slot_ms, (first, other)
    assert counts[("dyn", first.slot_ms)] == 1 and counts[("dyn", other.slot_ms)] == 1

    # 6. remove: nothing after every instance synced
    late = [x for x in dyn if x["slot"] > ms["remove_synced"]]
    assert not late, f"runs after every instance synced the removal: {late}"
    assert all(x["instance"] for x in scheduled if not x.get("queued"))


#: callers that ask run-now at the same moments, and how many times each, in the cluster test
RACERS, ROUNDS = 4, 5


@pytest.mark.parametrize("kind", ("postgresql", "redis"))
def test_concurrent_run_now_requests_each_run_exactly_once(kind, tmp_path, namespace, capsys):
    """Three beats and a worker run a 1-s store entry ``dyn``; RACERS callers, each with its own
    connection, ask run-now of it at the same moments, ROUNDS times, each with its own request id:
    every request gets a slot of its own (neither another request's nor a scheduled one), every
    requested slot is executed exactly once, and asking again with each id is no new run."""
    require_server(REDIS_URL, "Redis (the broker)")
    began = time.monotonic()
    url = store_url(kind, str(tmp_path))
    out = str(tmp_path / "executions.jsonl")
    env = cluster_env(kind, url, namespace, out, ANARCHON_SC_SYNC_INTERVAL=str(SYNC_S),
                      ANARCHON_SC_MAX_LATE=str(MAX_LATE_S))
    store = store_in_service(kind, url, namespace, ["dyn"])
    apis = [celery_anarchon.schedules(schedules_app.make_app(env), by=f"racer-{i}")
            for i in range(RACERS)]
    cluster = Cluster(str(tmp_path), env, app="schedules_app")
    run = Run(cluster, out, BEATS)
    told: list[list] = [[] for _ in range(RACERS)]
    barrier = threading.Barrier(RACERS)

    def racer(i: int) -> None:
        for r in range(ROUNDS):
            barrier.wait(timeout=60)
            told[i].append(apis[i].run_now("dyn", request_id=f"race-{r}-{i}"))
            time.sleep(0.3)
    try:
        cluster.worker("worker")
        for name in BEATS:
            cluster.beat(name)
        cluster.wait_log("worker", "ready.", timeout=60)
        apis[0].add("dyn", task=schedules_app.TASK, schedule=FIRST_MS / 1000)
        run.synced(apis[0].store.entries.entries_version(), timeout=60)
        run.wait(lambda: len(run.runs()) >= 2, SYNC_S + 3 + SLACK_S, "two runs of dyn")
        run.phase("start")
        threads = [threading.Thread(target=racer, args=(i,)) for i in range(RACERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        requests = [q for qs in told for q in qs]
        assert len(requests) == RACERS * ROUNDS, "every racer finished"
        slots = {q.slot_ms for q in requests}
        run.wait(lambda: slots <= {x["slot"] for x in run.runs()}, 2 * SYNC_S + 5 + SLACK_S + 5,
                 "every run-now run")
        run.phase("run_now")
        again = [apis[0].run_now("dyn", request_id=q.request_id) for q in requests]
        for name in BEATS:
            cluster.stop(name)
        run.wait(lambda: not queued_messages(env["ANARCHON_SC_QUEUE"]), 15,
                 "the worker to empty the queue")
        run.phase("stop")
    finally:
        cluster.stop_all()
        for api in apis:
            api.close()
        store.close()
    counts = collections.Counter(x["slot"] for x in run.runs())
    with capsys.disabled():
        print(f"\n[{kind}] {len(requests)} run-now requests, {len(counts)} runs of dyn; cost (s): "
              + ", ".join(f"{k} {v:.1f}" for k, v in run.costs.items())
              + f", total {time.monotonic() - began:.1f}")
    assert len(slots) == len(requests), sorted((q.slot_ms, q.request_id) for q in requests)
    assert not [s for s in slots if s % FIRST_MS == 0], "a scheduled slot"
    assert {s: counts[s] for s in slots} == {s: 1 for s in slots}, cluster.logs()
    assert [n for n in counts.values() if n > 1] == [], "a run executed twice"
    assert [q.created for q in again] == [False] * len(requests)
    assert [dataclasses.replace(q, created=True) for q in again] == requests


def test_two_beats_with_different_definitions_both_log_it(tmp_path, namespace):
    """Two instances with different ``beat_schedule`` definitions of ``drift`` (as in a rolling
    deploy), at the default sync interval: each logs an error naming the entry, both definitions
    and the other's host:pid; once one stops (its record removed, or expired), the other logs
    that they agree again."""
    began = time.monotonic()
    url = store_url("sqlite", str(tmp_path))
    env = cluster_env("sqlite", url, namespace, str(tmp_path / "executions.jsonl"))
    cluster = Cluster(str(tmp_path), env, app="schedules_app")
    try:
        one = cluster.beat("beat-a", env={"ANARCHON_SC_DRIFT_EVERY": "3600"})
        two = cluster.beat("beat-b", env={"ANARCHON_SC_DRIFT_EVERY": "7200"})
        # the default interval: the second sees the first at once, the first within 5 s
        for name, other in (("beat-a", two), ("beat-b", one)):
            cluster.wait_log(name, "anarchon: instances disagree on entry 'drift'", 30)
            line = next(ln for ln in cluster.text(name).splitlines()
                        if "instances disagree on entry 'drift'" in ln)
            assert f":{other.pid} run" in line, line                   # the other's host:pid
            assert f":{cluster.procs[name].pid})" in line, line        # this instance's
            for period in ("period_ms=3600000", "period_ms=7200000"):  # both definitions
                assert period in line, line
        cluster.stop("beat-b")
        cluster.wait_log("beat-a", "the live instances agree again", 3 * 5 + 10)
    finally:
        cluster.stop_all()
    print(f"disagreement test: {time.monotonic() - began:.1f} s")



@pytest.mark.parametrize("kind", KINDS)
def test_a_store_entry_here_and_a_beat_schedule_entry_there_is_reported_by_both(
        kind, tmp_path, namespace):
    """``drift`` is a store entry (every 3600 s), and beat-b also has a ``beat_schedule`` entry
    ``drift`` (every 7200 s): beat-b runs its own (a config entry wins on the host that has
    both), beat-a runs the store's, so the union of both schedules is sent. Each logs the
    disagreement, naming the entry, both definitions, where each comes from and the other's
    host:pid; ``status`` (from an app without the config entry, as on beat-a's host) lists it
    with both definitions, their sources and hosts, and does not say beat-a leaves ``drift``
    unrun; once beat-b stops, beat-a logs that the clash is over."""
    began = time.monotonic()
    url = store_url(kind, str(tmp_path))
    env = cluster_env(kind, url, namespace, str(tmp_path / "executions.jsonl"),
                      ANARCHON_SC_SYNC_INTERVAL="1")
    with celery_anarchon.schedules(schedules_app.make_app(env), by="ops") as api:
        api.add("drift", task=schedules_app.TASK, schedule=3600)
    cluster = Cluster(str(tmp_path), env, app="schedules_app")
    try:
        one = cluster.beat("beat-a")
        two = cluster.beat("beat-b", env={"ANARCHON_SC_DRIFT_EVERY": "7200"})
        here_store = "anarchon: entry 'drift' is a store entry here and a beat_schedule entry"
        here_config = "anarchon: entry 'drift' is a beat_schedule entry here and a store entry"
        for name, text, other in (("beat-a", here_store, two), ("beat-b", here_config, one)):
            cluster.wait_log(name, text, 30)
            line = next(ln for ln in cluster.text(name).splitlines() if text in ln)
            assert "ERROR" in line, line
            assert f":{other.pid} run" in line, line                   # the other's host:pid
            assert f":{cluster.procs[name].pid})" in line, line        # this instance's
            for period in ("period_ms=3600000", "period_ms=7200000"):  # both definitions
                assert period in line, line
            assert "anarchon remove drift" in line, line               # the fix
        status = cluster.start("status", "anarchon", "status", "--json")
        status.popen.wait(60)
        text = cluster.start("status-text", "anarchon", "status")
        text.popen.wait(60)
        cluster.stop("beat-b")
        cluster.wait_log("beat-a", "anarchon: entry 'drift': no live instance runs another "
                         "definition of it any more", 3 + 10)
    finally:
        cluster.stop_all()
    data = json.loads(status.text())
    who = {p.name: f"{socket_host()}:{p.pid}" for p in (one, two)}
    assert not [p for p in data["partial"] if p["entry"] == "drift"], data["partial"]
    [clash] = [d for d in data["disagreements"] if d["entry"] == "drift"]
    by_source = {d["source"]: d for d in clash["definitions"]}
    assert by_source["store"]["instances"] == [who["beat-a"]], clash
    assert by_source["config"]["instances"] == [who["beat-b"]], clash
    assert "period_ms=3600000" in by_source["store"]["definition"], clash
    assert "period_ms=7200000" in by_source["config"]["definition"], clash
    out = text.text()
    assert "drift:" in out and f"(store entry) on {who['beat-a']}" in out, out
    assert f"(beat_schedule) on {who['beat-b']}" in out, out
    print(f"store/config clash test ({kind}): {time.monotonic() - began:.1f} s")
