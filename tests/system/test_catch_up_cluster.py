"""``catch_up="all"`` with real processes: three ``celery beat`` processes and a worker on a SQLite
store run an entry every second (window 60 s); all three beats stop for 20 s (an outage), three
start again, and one of them is killed (SIGKILL) in the middle of the catch-up. Every slot of the
outage is then executed by the worker exactly once and recorded sent, none missed (the killed
beat was sending them: the others, whose walks lagged behind, send the rest), and no slot of the
whole run twice; the one exception is the run whose claim the killed beat had won when it died:
the store's history shows that claim without a send, and the run is missed if the beat died
before it published the message, executed if it died after.

The waits end on conditions, with deadlines from the settings: the catch-up of a beat starts at
the oldest slot of its window and claims one slot a pace, gaining gap - pace on the schedule at
each step, so it reaches the present within window x pace / (gap - pace) of its start, and sends
every slot of the window within window / pace."""
from __future__ import annotations

import collections
import json
import re
import signal
import time

from celery_anarchon.schedule.catch_up import pace_s
from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import RunEvent

from backends import backdate_memory_start
from broker_reads import BROKER_URL, queued_messages, wait_drained
from cluster import Cluster, read_executions
from conftest import REDIS_URL, require_server

ENTRY, EVERY_S = "catch-1s", 1.0
WINDOW_S, MAX_LATE_S = 60.0, 5.0
PACE_S = pace_s(EVERY_S)                 # 0.5 s
OUTAGE_S = 20.0                          # less than the window, with the beats' start-up
#: how long beats and the worker may take to start and log their first line here
START_S = 60.0
#: how long the worker may take to execute what was sent
DRAIN_S = 60.0
#: a catch-up reaches the present within this after its beat's first tick
CATCH_UP_S = WINDOW_S * PACE_S / (EVERY_S - PACE_S)


def instance_of(cluster: Cluster, name: str) -> str:
    match = re.search(r"anarchon: instance (\S+),", cluster.procs[name].text())
    assert match, f"{name} never logged its instance id"
    return match.group(1)


def test_three_beats_catch_up_an_outage_each_slot_once_with_one_killed(tmp_path, namespace,
                                                                       capsys):
    require_server(REDIS_URL, "Redis (the broker)")
    began = time.monotonic()
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    out = str(tmp_path / "executions.jsonl")
    store = open_store(url, namespace=namespace, instance_id="test", options={})
    store.prepare([ENTRY])
    backdate_memory_start(store, [ENTRY], 120_000)   # in service for a while already
    queue = f"cu-{namespace}"
    cluster = Cluster(str(tmp_path), {
        "ANARCHON_IT_BROKER": BROKER_URL, "ANARCHON_IT_STORE": url,
        "ANARCHON_IT_NAMESPACE": namespace, "ANARCHON_IT_QUEUE": queue, "ANARCHON_IT_OUT": out,
        "ANARCHON_IT_MAX_LATE": str(MAX_LATE_S), "ANARCHON_IT_ENTRIES": json.dumps({ENTRY: EVERY_S}),
        "ANARCHON_IT_ENTRY_OPTIONS": json.dumps({"catch_up": "all", "catch_up_window": WINDOW_S})})

    def slots() -> list[int]:
        return [x["slot"] for x in read_executions(out) if x["entry"] == ENTRY]

    def wait(predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            dead = [p.name for p in cluster.procs.values()
                    if not p.alive() and p.name not in stopped]
            assert not dead and time.monotonic() < deadline, (
                f"{dead or 'timed out'} waiting for {what}\n{cluster.logs()}")
            time.sleep(0.1)

    stopped: set[str] = set()
    first, again = ("beat-a", "beat-b", "beat-c"), ("beat-a2", "beat-b2", "beat-c2")
    try:
        cluster.worker("worker")
        for name in first:
            cluster.beat(name)
        cluster.wait_log("worker", "ready.", timeout=START_S)
        wait(lambda: len(slots()) >= 3, START_S, "three runs before the outage")
        for name in first:                     # the outage: no beat anywhere
            cluster.stop(name)
            stopped.add(name)
        down_at = time.time()
        time.sleep(max(0.0, down_at + OUTAGE_S - time.time()))   # the outage itself
        up_at = time.time()
        for name in again:
            cluster.beat(name)
        # the slots no beat could claim: after the last one exited, before the first started
        outage = list(range(int(down_at) * 1000 + 1000, int(up_at) * 1000 + 1, 1000))
        started = max(cluster.wait_log(name, "anarchon: instance", timeout=START_S)
                      for name in again)
        names = {instance_of(cluster, name): name for name in again}
        wait(lambda: len(set(outage) & set(slots())) >= 5, START_S + WINDOW_S / PACE_S,
             "the catch-up to send five slots of the outage")
        # in the middle of the catch-up, the beat that sent its newest slot so far
        killed = max((x for x in read_executions(out) if x["slot"] in set(outage)),
                     key=lambda x: x["slot"])["instance"]
        cluster.kill(names[killed])
        stopped.add(names[killed])
        killed_after = len(set(outage) & set(slots()))
        wait(lambda: set(outage) <= set(slots()) or len(set(outage) - set(slots())) <= 1
             and time.time() > started + WINDOW_S / PACE_S,
             START_S + WINDOW_S / PACE_S, "every slot of the outage")
        # a beat lagging behind claims the outage's slots until its catch-up reached the present
        time.sleep(max(0.0, started + CATCH_UP_S + 1.0 - time.time()))
        caught_up_logs = {n: cluster.text(n) for n in again}
        for name in set(again) - stopped:
            cluster.stop(name)
            stopped.add(name)
        wait_drained(queue, DRAIN_S)
    finally:
        cluster.stop_all()
    left = queued_messages(queue)
    runs = [x for x in read_executions(out) if x["entry"] == ENTRY]
    counts = collections.Counter(x["slot"] for x in runs)
    duplicates = {slot: n for slot, n in counts.items() if n > 1}
    missed = [slot for slot in outage if slot not in counts]
    history = {h.slot_ms: h for h in store.history.read(ENTRY, limit=500)}
    store.close()
    # the claims the killed beat won and never recorded sent: killed before it published (the
    # run is missed) or after, before its record of the send (the run was executed)
    in_flight = [s for s in outage if (h := history.get(s)) is not None
                 and h.event is RunEvent.CLAIMED and h.instance == killed]
    senders = collections.Counter(x["instance"] for x in runs if x["slot"] in set(outage))
    cost = time.monotonic() - began
    with capsys.disabled():
        print(f"\n[catch-up] outage of {len(outage)} slots, {len(outage) - len(missed)} executed "
              f"exactly once ({killed_after} before the kill), {len(missed)} missed "
              f"({len(in_flight)} in flight at the kill), {len(duplicates)} duplicates of "
              f"{len(counts)} runs; senders {sorted(senders.values())}; {cost:.0f} s")
    assert not duplicates, f"runs executed twice: {duplicates}\n{cluster.logs()}"
    assert set(missed) <= set(in_flight) and len(in_flight) <= 1, (
        missed, in_flight, cluster.logs())
    assert not left, f"sent but never executed: {left}"
    # caught up within its window, no slot of the outage is called missed
    events = collections.Counter(h.event for s, h in history.items() if s in set(outage))
    assert events == {RunEvent.SENT: len(outage) - len(in_flight), **(
        {RunEvent.CLAIMED: len(in_flight)} if in_flight else {})}, events
    assert any("catching up" in text and "(catch_up='all', window 60 s), one every 0.5 s" in text
               for text in caught_up_logs.values())
