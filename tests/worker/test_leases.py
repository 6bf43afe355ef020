"""Leases with real processes: two beats, real prefork workers, on every lease store.

Each test starts a small cluster of ``lease_app`` (tests/support/apps/lease_app.py), whose tasks append
one line per event (start, end, lost) to a file, and then breaks something: SIGKILL the child
running a leased task, SIGSTOP a worker, kill a beat between its claim and its send, purge the
queue, a task that kills its worker every time. The guarantee it checks is docs/design.md's: at most
one attempt's body runs unless a runner was paused past its lease, and then it learns it lost.
"""
from __future__ import annotations

import collections
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest
from celery import Celery

from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import RunEvent, RunState
from celery_anarchon.stores.entry_store import Pause

from cluster import Cluster, read_executions
from conftest import REDIS_URL, require_server
from stores_support import LEASE_STORES, PROCESS_STORES, store_url, wait_until
from backends import backdate_memory_start

REDIS_BASE = REDIS_URL.rsplit("/", 1)[0]
FAST = {"duration": 6, "heartbeat": 1, "queue_timeout": 4}
#: a dead runner is replaced within duration + 2 x heartbeat, plus the time the new message takes
#: to reach a worker and start (that part is the machine's: measured and printed, never asserted;
#: beat's own part, the next lease check within 2 heartbeats, is asserted on a clock the test
#: moves in test_engine_parts.py; the whole figure, per store, by benchmarks/takeover_bound.py)
REPLACED_WITHIN_S = FAST["duration"] + 2 * FAST["heartbeat"] + 2


class LeaseCluster:
    """Beats and workers of lease_app on one store, and what their tasks recorded."""

    def __init__(self, tmp_path, kind, namespace, entries, *, acks_late=False):
        require_server(REDIS_URL, "Redis (broker and results)")
        self.url = store_url(kind, str(tmp_path))
        self.namespace = namespace
        self.queue = f"lt-{namespace}"
        self.out = str(tmp_path / "events.jsonl")
        self.anchor = int(time.time())
        schedule = {name: {"every": 3600, "anchor": self.anchor, "queue": self.queue, **spec}
                    for name, spec in entries.items()}
        self.store = open_store(self.url, namespace=namespace, instance_id="test")
        self.store.prepare(list(schedule))
        backdate_memory_start(self.store, list(schedule), 120_000)
        self.cluster = Cluster(str(tmp_path), {
            "ANARCHON_LT_BROKER": REDIS_BASE + "/8", "ANARCHON_LT_BACKEND": REDIS_BASE + "/7",
            "ANARCHON_LT_STORE": self.url, "ANARCHON_LT_NAMESPACE": namespace,
            "ANARCHON_LT_OUT": self.out, "ANARCHON_LT_ACKS_LATE": "1" if acks_late else "0",
            "ANARCHON_LT_SCHEDULE": json.dumps(schedule)}, app="lease_app")
        self.client = Celery("lease_client", broker=REDIS_BASE + "/8", backend=REDIS_BASE + "/7",
                             set_as_current=False)

    def slot(self, entry: str = "long") -> int:
        return self.anchor * 1000

    def worker(self, name="w1", concurrency=2, env=None):
        self.cluster.start(name, "worker", "-l", "info", "-P", "prefork", "-c", str(concurrency),
                           "--without-gossip", "--without-mingle", "--without-heartbeat",
                           "-n", f"{name}@%h", "-Q", self.queue, env=env)
        self.cluster.wait_log(name, "ready.")

    def beat(self, name, env=None, wait=True):
        self.cluster.beat(name, env=env)
        if wait:
            self.cluster.wait_log(name, "anarchon: instance")

    def events(self, event=None, **match):
        return [e for e in read_executions(self.out)
                if (event is None or e["event"] == event) and all(e.get(k) == v for k, v in match.items())]

    def wait_event(self, event, timeout=60, **match):
        return wait_until(lambda: self.events(event, **match), timeout,
                          f"{event} {match}\n{self.cluster.logs()}", interval=0.05)[0]

    def logs(self, *names):
        return "".join(self.cluster.procs[n].text() for n in names)

    def command(self, *args: str) -> str:
        """``celery -A lease_app anarchon *args`` as an operator runs it; its standard output."""
        done = subprocess.run([sys.executable, "-m", "celery", "-A", "lease_app", "anarchon", *args],
                              env=self.cluster.environment(), cwd=self.cluster.workdir,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
        return done.stdout

    def stop(self):
        self.cluster.stop_all()
        self.store.close()


#: the Redis Cluster runs one worker test of this file (below): its lease operations are proved
#: by the contract suite; every test of this file there would cost about 2 minutes
CLUSTER = "redis-cluster"


#: the workers are processes of their own: a store of one process (memory://) is left out
@pytest.fixture(params=[k for k in LEASE_STORES if k != CLUSTER and k in PROCESS_STORES])
def kind(request):
    return request.param


@pytest.fixture
def make_cluster(tmp_path, namespace):
    made = []

    def make(kind, entries, **kwargs):
        c = LeaseCluster(tmp_path, kind, namespace, entries, **kwargs)
        made.append(c)
        return c
    yield make
    for c in made:
        c.stop()


def long_entry(seconds, **lease):
    return {"task": "lease_app.sleepy", "args": [seconds], "lease": {**FAST, **lease}}


@pytest.mark.parametrize("acks_late", [False, True], ids=["default-acks", "acks-late"])
def test_a_killed_runner_is_replaced_once(kind, acks_late, make_cluster, capsys):
    c = make_cluster(kind, {"long": long_entry(4)}, acks_late=acks_late)
    c.worker()
    c.beat("b1")
    c.beat("b2")
    first = c.wait_event("start", attempt=1)
    killed_at = time.time()
    os.kill(first["pid"], signal.SIGKILL)
    second = c.wait_event("start", timeout=REPLACED_WITHIN_S + 60, attempt=2)
    replaced_after = second["time"] - killed_at
    with capsys.disabled():
        print(f"\n[{kind}, {'acks_late' if acks_late else 'default acks'}] SIGKILLed runner replaced "
              f"after {replaced_after:.2f} s (bound: duration + 2 x heartbeat = "
              f"{FAST['duration'] + 2 * FAST['heartbeat']} s, plus the queue and the worker's start)")
    c.wait_event("end", attempt=2)
    if acks_late:   # the killed attempt's message comes back and is dropped
        c.cluster.wait_log("w1", "dropped a message", timeout=20)
    # the pool parent reports the dead child (after worker_lost_wait = 2 s): from then on a
    # release by the WorkerLostError (which would let the run be taken over again) would show
    c.cluster.wait_log("w1", "WorkerLostError", timeout=20)
    starts = c.events("start")
    assert [e["attempt"] for e in starts] == [1, 2], starts
    assert len(c.events("end")) == 1
    assert c.logs("b1", "b2").count("taken over as attempt 2") == 1
    result = c.client.AsyncResult(second["task_id"])
    assert result.get(timeout=10) == "done" and result.state == "SUCCESS"
    assert first["task_id"] != second["task_id"]
    assert c.store.leases.inspect("long", c.slot()).state is RunState.FINISHED
    # the history keeps the dead attempt, the takeover and the new attempt's task id
    record = {h.slot_ms: h for h in c.store.history.read("long")}[c.slot()]
    assert (record.event, record.attempt, record.task_id) == (
        RunEvent.FINISHED, 2, second["task_id"]), record
    assert [(e.event, e.attempt, e.task_id) for e in record.earlier] == [
        (RunEvent.STARTED, 1, first["task_id"]), (RunEvent.TAKEN_OVER, 2, second["task_id"])
    ], record.earlier
    if not acks_late:    # as operators read it: `history`, `status --json` (/api/status), the page
        _operators_see_both_attempts(c, first["task_id"], second["task_id"])


def _operators_see_both_attempts(c, first_task, second_task):
    from celery_anarchon.operate.web import render_page

    table = c.command("history", "long").splitlines()
    rows = [line.split() for line in table[1:]]
    assert [(r[1], r[3], r[4]) for r in rows[:3]] == [
        ("finished", "2", second_task), ("taken_over", "2", second_task),
        ("started", "1", first_task)], table
    (run,) = [r for r in json.loads(c.command("history", "long", "--json"))
              if r["task_id"] == second_task]
    assert [(e["event"], e["attempt"], e["task_id"]) for e in run["earlier"]] == [
        ("started", 1, first_task), ("taken_over", 2, second_task)]
    status = json.loads(c.command("status", "--json"))
    (entry,) = [e for e in status["entries"] if e["name"] == "long"]
    assert entry["runs"][0] == run, "status --json and /api/status give the same record"
    assert "before: attempt 1 started" in c.command("status")
    page = render_page(status)
    assert "before: attempt 2 taken_over by" in page and first_task in page


@pytest.mark.skipif(CLUSTER not in LEASE_STORES, reason="the Redis Cluster store is not installed")
def test_a_killed_runner_is_replaced_once_on_the_redis_cluster(make_cluster, capsys):
    test_a_killed_runner_is_replaced_once(CLUSTER, False, make_cluster, capsys)


def test_a_run_claimed_before_a_pause_is_neither_taken_over_nor_run_while_paused(kind, make_cluster):
    """Two runs claimed and sent before their entries were paused: one whose message waits in a
    queue nobody consumes (beat finds it past its queue deadline: the takeover answers paused),
    one whose worker starts after the pause (its adoption is refused). Neither body runs, no
    attempt 2 is sent, each run is recorded paused once, and a resume does not catch them up."""
    probe_queue = f"nobody-{uuid.uuid4().hex[:8]}"
    c = make_cluster(kind, {"long": long_entry(1, queue_timeout=60),
                            "probe": {"task": "lease_app.sleepy", "args": [1], "lease": FAST,
                                      "queue": probe_queue}})
    c.beat("b1")
    try:
        for name in ("long", "probe"):
            c.cluster.wait_log("b1", f"Sending due task {name}")
        pauses = {name: c.store.entries.set_pause(name, Pause("migration", "ops", 0), by="ops").pause
                  for name in ("long", "probe")}
        wait_until(lambda: c.store.leases.inspect("probe", c.slot()).state is RunState.PAUSED,
                   FAST["queue_timeout"] + 4 * FAST["heartbeat"] + 10,
                   f"the probe's takeover to answer paused\n{c.cluster.logs()}", interval=0.2)
        c.worker()
        c.cluster.wait_log("w1", "the entry is paused", timeout=20)
        assert c.store.leases.inspect("long", c.slot()).state is RunState.PAUSED
        for name in ("long", "probe"):
            record = {h.slot_ms: h for h in c.store.history.read(name)}[c.slot()]
            assert (record.event, record.attempt, record.detail) == (
                RunEvent.PAUSED, 1, pauses[name].describe()), record
            c.store.entries.set_pause(name, None, by="ops")
        time.sleep(3 * FAST["heartbeat"])        # lease checks after the resume
        assert c.store.leases.inspect("probe", c.slot()).state is RunState.PAUSED
    finally:
        with c.client.connection_for_write() as conn:
            conn.default_channel.queue_delete(probe_queue)
    assert not c.events("start"), "no body ran"
    assert "probe: slot" in c.logs("b1") and "not taken over: the entry is paused" in c.logs("b1")
    assert "taken over as attempt" not in c.logs("b1")


@pytest.mark.parametrize("acks_late", [False, True], ids=["default-acks", "acks-late"])
def test_a_duplicate_delivery_while_the_run_runs_is_dropped(kind, acks_late, make_cluster):
    c = make_cluster(kind, {"long": long_entry(4)}, acks_late=acks_late)
    c.worker(concurrency=3)
    c.beat("b1")
    first = c.wait_event("start", attempt=1)
    headers = {"anarchon_namespace": c.namespace, "anarchon_entry": "long", "anarchon_slot": c.slot(),
               "anarchon_instance": "test", "anarchon_attempt": 1, "anarchon_token": 1,
               "anarchon_lease": FAST}
    c.client.send_task("lease_app.sleepy", args=[4], task_id=first["task_id"], headers=headers,
                       queue=c.queue)
    c.cluster.wait_log("w1", "dropped a message", timeout=15)
    c.wait_event("end", attempt=1)
    assert len(c.events("start")) == 1


@pytest.mark.parametrize("acks_late", [False, True], ids=["default-acks", "acks-late"])
def test_a_runner_paused_past_its_lease_learns_it_lost(kind, acks_late, make_cluster):
    c = make_cluster(kind, {"long": long_entry(9)}, acks_late=acks_late)
    c.worker("w1", concurrency=1)
    c.worker("w2", concurrency=1)
    c.beat("b1")
    first = c.wait_event("start", attempt=1)
    group = os.getpgid(first["pid"])
    os.killpg(group, signal.SIGSTOP)
    try:
        second = c.wait_event("start", timeout=REPLACED_WITHIN_S + 60, attempt=2)
    finally:
        os.killpg(group, signal.SIGCONT)
    c.wait_event("lost", timeout=10, attempt=1)
    run = c.store.leases.inspect("long", c.slot())
    assert run.token == second["token"] and run.attempt == 2
    # the old runner's last word to the store: its release by the old token, refused
    wait_until(lambda: "attempt 1 finished, but its lease had been taken over" in c.logs("w1", "w2"),
               15, "the old runner's refused release")
    after = c.store.leases.inspect("long", c.slot())
    assert after.token == second["token"] and after.owner == run.owner, "the old runner took nothing back"


def test_a_healthy_runner_pausing_less_than_its_lease_keeps_it(kind, make_cluster):
    c = make_cluster(kind, {"long": long_entry(6, duration=12)})
    c.worker("w1", concurrency=1)
    c.beat("b1")
    first = c.wait_event("start", attempt=1)
    group = os.getpgid(first["pid"])
    os.killpg(group, signal.SIGSTOP)
    paused = c.store.leases.inspect("long", c.slot()).lease_expires_ms
    time.sleep(3)                  # 3 s: well under duration - heartbeat (11 s), whatever the load
    os.killpg(group, signal.SIGCONT)
    # the heartbeat renews after the pause (the lease outlasts the body: this proves it renews)
    wait_until(lambda: c.store.leases.inspect("long", c.slot()).lease_expires_ms >= paused + 2_000, 30,
               "a renewal after the pause")
    c.wait_event("end", attempt=1)
    assert [e["attempt"] for e in c.events("start")] == [1]
    assert not c.events("lost")
    assert "taken over" not in c.logs("b1")


def test_a_beat_killed_between_claim_and_send_is_replaced(kind, make_cluster):
    c = make_cluster(kind, {"long": long_entry(1)})
    c.worker()
    c.beat("b1", env={"ANARCHON_LT_EXIT_BEFORE_SEND": "long"}, wait=False)
    wait_until(lambda: c.cluster.procs["b1"].popen.poll() is not None, 30, "b1 to exit after its claim")
    history = {h.slot_ms: h for h in c.store.history.read("long")}
    assert history[c.slot()].event is RunEvent.CLAIMED, "the claim without a send"
    c.beat("b2")
    second = c.wait_event("start", timeout=30)
    assert second["attempt"] == 2
    c.wait_event("end")
    assert len(c.events("start")) == 1
    assert "queued past its deadline" in c.logs("b2")


def test_a_message_lost_from_the_broker_is_replaced(kind, make_cluster):
    c = make_cluster(kind, {"long": long_entry(1)})
    c.beat("b1")
    wait_until(lambda: c.store.leases.inspect("long", c.slot()), 20, "the claim")
    c.cluster.wait_log("b1", "Sending due task long")
    with c.client.connection_for_write() as conn:
        wait_until(lambda: conn.default_channel.queue_purge(c.queue), 10, "the message to purge")
    c.worker()
    second = c.wait_event("start", timeout=30)
    assert second["attempt"] == 2
    c.wait_event("end")
    assert len(c.events("start")) == 1


def test_a_retry_longer_than_the_lease_keeps_its_run(kind, make_cluster):
    c = make_cluster(kind, {"long": {"task": "lease_app.retrying", "args": [FAST["duration"] + 2],
                                     "lease": FAST}})
    c.worker()
    c.beat("b1")
    c.wait_event("end", timeout=40)
    starts = c.events("start")
    assert [(e["retries"], e["attempt"]) for e in starts] == [(0, 1), (1, 1)]
    assert "taken over" not in c.logs("b1")
    # the body wrote "end" and returned; the worker releases the run right after
    run = wait_until(lambda: (r := c.store.leases.inspect("long", c.slot())) and r.state is RunState.FINISHED
                     and r, 10, f"the run to be released\n{c.cluster.logs()}", interval=0.1)
    assert run.attempt == 1


@pytest.mark.parametrize("acks_late", [False, True], ids=["default-acks", "acks-late"])
def test_a_task_that_fails_for_good_releases_its_run(kind, acks_late, make_cluster):
    # "probe": the same slot, sent to a queue nobody consumes, so beat takes it over at each
    # queue deadline (4 s) until it is recorded lost after 3 attempts: proof that beat's lease
    # checks went on past the time the released run would have been taken over
    probe_queue = f"nobody-{uuid.uuid4().hex[:8]}"
    c = make_cluster(kind, {"long": {"task": "lease_app.failing", "lease": FAST},
                            "probe": {"task": "lease_app.sleepy", "args": [1], "lease": FAST,
                                      "queue": probe_queue}}, acks_late=acks_late)
    c.worker()
    c.beat("b1")
    first = c.wait_event("start", attempt=1)
    run = wait_until(lambda: (r := c.store.leases.inspect("long", c.slot())) and r.state is RunState.FINISHED
                     and r, 15, f"the failed run to be released\n{c.cluster.logs()}", interval=0.1)
    assert run.attempt == 1
    result = c.client.AsyncResult(first["task_id"])
    with pytest.raises(ValueError):
        result.get(timeout=10)
    try:
        wait_until(lambda: (r := c.store.leases.inspect("probe", c.slot())) and r.state is RunState.GIVEN_UP,
                   30, f"the probe run to be recorded lost\n{c.cluster.logs()}", interval=0.2)
    finally:
        with c.client.connection_for_write() as conn:
            conn.default_channel.queue_delete(probe_queue)
    assert time.time() > first["time"] + REPLACED_WITHIN_S, "the probe proves nothing this early"
    # a released run is never taken over
    run = c.store.leases.inspect("long", c.slot())
    assert run.state is RunState.FINISHED and run.attempt == 1, run
    assert [e["attempt"] for e in c.events("start")] == [1]
    assert not re.search(r"long: slot \S+ attempt \d+ taken over", c.logs("b1"))


def test_a_task_that_kills_its_worker_is_tried_max_attempts_then_lost(kind, make_cluster):
    c = make_cluster(kind, {"long": {"task": "lease_app.suicidal", "lease": {
        "duration": 3, "heartbeat": 0.5, "queue_timeout": 4, "max_attempts": 3}}})
    c.worker(concurrency=1)
    c.beat("b1")
    c.beat("b2")
    wait_until(lambda: (r := c.store.leases.inspect("long", c.slot())) and r.state is RunState.GIVEN_UP, 60,
               f"the run to be recorded lost\n{c.cluster.logs()}", interval=0.2)
    assert [e["attempt"] for e in c.events("start")] == [1, 2, 3]
    assert c.store.history.read("long")[0].event is RunEvent.GIVEN_UP
    assert "recorded lost after 3 attempts" in c.logs("b1", "b2")


@pytest.mark.parametrize("overlap", ["skip", "allow"])
def test_overlap_skip_and_allow(kind, overlap, make_cluster):
    lease = {**FAST, "overlap": overlap}
    # the run spans two slots: the one after its start is claimed (at most 3.75 s after the
    # slot) seconds before its end (6 s after its start): a slow tick or worker does not blur them
    c = make_cluster(kind, {"long": {"task": "lease_app.sleepy", "args": [6], "every": 3,
                                     "lease": lease}})
    c.worker(concurrency=3)
    c.beat("b1")
    first = c.wait_event("start")
    base = first["slot"]
    if overlap == "skip":
        end = c.wait_event("end", slot=base)["time"] * 1000
        jitter_ms = 3000 / 4
        # the first slot whose claim may come after the run ended (claims come at slot + jitter);
        # the release lands a moment after the body wrote its end, so a claim in between is
        # refused as overlapping, and the next slot runs
        first_free = base + 3000 * (int((end - jitter_ms - base) // 3000) + 1)
        allowed = {first_free, first_free + 3000}
        later = wait_until(lambda: [e["slot"] for e in c.events("start") if e["slot"] > base], 20,
                           "a run after the long one")
        nxt = min(later)
        history = {h.slot_ms: h.event for h in c.store.history.read("long")}
        started = collections.Counter(e["slot"] for e in c.events("start"))
        assert nxt in allowed, "sent once the previous run finished, not before"
        skipped = list(range(base + 3000, nxt, 3000))
        assert skipped, "the run spanned at least one slot"
        for slot in skipped:
            assert slot not in started, "not sent while the previous run was alive"
            assert history[slot] is RunEvent.OVERLAPPING
    else:
        wait_until(lambda: c.events("start", slot=base + 3000), 20, "the next slot")
        first_end = c.events("end", slot=base)
        second = c.events("start", slot=base + 3000)[0]
        assert not first_end or first_end[0]["time"] > second["time"], "the runs overlapped"
        assert second["token"] != first["token"], "each run under its own lease"
        started = collections.Counter(e["slot"] for e in c.events("start"))
    assert max(started.values()) == 1


def test_a_worker_whose_module_forgot_install_gets_the_worker_side(make_cluster):
    """The `celery` command installs the worker side for an app that uses celery_anarchon but
    whose module forgot install(app), and says so: a duplicate delivery is still dropped."""
    c = make_cluster("sqlite", {"long": long_entry(3)})
    c.worker(concurrency=3, env={"ANARCHON_LT_NO_INSTALL": "1"})
    assert "does not call celery_anarchon.install(app)" in c.logs("w1")
    c.beat("b1")
    first = c.wait_event("start", attempt=1)
    assert first["token"] is not None, "the run was adopted under a lease"
    headers = {"anarchon_namespace": c.namespace, "anarchon_entry": "long", "anarchon_slot": c.slot(),
               "anarchon_instance": "test", "anarchon_attempt": 1, "anarchon_token": 1,
               "anarchon_lease": FAST}
    c.client.send_task("lease_app.sleepy", args=[3], task_id=first["task_id"], headers=headers,
                       queue=c.queue)
    c.cluster.wait_log("w1", "dropped a message", timeout=15)
    c.wait_event("end", attempt=1)
    assert len(c.events("start")) == 1


def test_a_release_blocked_longer_than_the_lease_still_lands(namespace, caplog):
    """A finished body whose release cannot reach the store keeps trying past its lease (a lease
    that ran out during the outage would let beat run the finished run again); the heartbeat
    that fires meanwhile does not call the lease lost."""
    import threading

    from celery_anarchon.worker import leases
    from celery_anarchon.stores.base import ClaimRequest, LeaseTerms
    from tcp_proxy import TCPProxy, redis_address

    require_server(REDIS_URL, "Redis")
    proxy = TCPProxy(redis_address()).start()
    app = Celery("proj", set_as_current=False)
    app.conf.update(broker_url="memory://", anarchon_store_url=proxy.url("redis", "/0"),
                    anarchon_store_options={"claim_timeout": 0.5})
    beat_store = open_store(f"{REDIS_URL.rsplit('/', 1)[0]}/0", namespace=namespace, instance_id="b")
    try:
        beat_store.prepare(["e"])
        backdate_memory_start(beat_store, ["e"], 120_000)
        slot = int(time.time() * 1000) // 1000 * 1000
        won = beat_store.claim([ClaimRequest("e", slot, 60_000, lease=LeaseTerms(10_000))])[0]
        assert won.token is not None
        worker_store = leases._store(app, namespace)
        adopted, run = worker_store.leases.adopt("e", slot, "w1", 1_000)
        assert adopted
        lease = leases.Lease("e", slot, run.attempt, run.token, "w1", 1.0, 0.3,
                             run.lease_expires_ms or 0)
        heartbeat = leases._Heartbeat(app, namespace, lease)
        heartbeat.start()
        before = dict(leases.counters)
        proxy.outage()
        with caplog.at_level(logging.WARNING, "celery_anarchon"):
            releasing = threading.Thread(target=heartbeat.release)
            releasing.start()
            expires = run.lease_expires_ms
            wait_until(lambda: beat_store.now_ms() > expires + 1_000, 10, "the lease to run out")
            assert releasing.is_alive(), "the release gave up while the store was unreachable"
            proxy.restore()
            releasing.join(timeout=20)
        assert not releasing.is_alive()
        assert leases.counters["released"] == before.get("released", 0) + 1
        assert beat_store.leases.inspect("e", slot).state is RunState.FINISHED
        assert not lease.lost and "lost its lease" not in caplog.text
        assert "released after" in caplog.text
    finally:
        proxy.close()
        beat_store.close()


@pytest.mark.parametrize("relative", [True, False], ids=["relative-path", "absolute-path"])
def test_the_worker_side_names_its_store_and_resolves_a_relative_sqlite_path_as_beat_does(
        tmp_path, monkeypatch, namespace, caplog, relative):
    """The worker's store (adopt, heartbeat, release) opened on a relative SQLite path is the file
    in the worker's working directory, resolved once, as beat's: the worker logs the absolute URL
    it uses, once per process, and (relative path) beat's warning naming the path, the directory
    and the fix; a later change of directory changes nothing."""
    from celery_anarchon.worker import leases
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "rel.sqlite3"
    app = Celery("proj", set_as_current=False)
    app.conf.update(broker_url="memory://",
                    anarchon_store_url="sqlite:///rel.sqlite3" if relative else f"sqlite:///{path}")
    monkeypatch.setattr(leases, "_stores", {})
    with caplog.at_level(logging.INFO, "celery_anarchon"):
        store = leases._store(app, namespace)
        monkeypatch.chdir("/")
        assert leases._store(app, namespace) is store
        leases._store(app, namespace + "-other").close()
    store.close()
    assert store.path == str(path)
    lines = [r for r in caplog.records if f"sqlite:///{path}" in r.getMessage()]
    named = [r for r in lines if r.levelno == logging.INFO]
    assert len(named) == 1 and "worker" in named[0].getMessage(), caplog.text
    warned = [r.getMessage() for r in lines if r.levelno == logging.WARNING]
    if not relative:
        assert not warned and "relative path" not in caplog.text, caplog.text
        return
    assert len(warned) == 1, caplog.text
    assert ("'sqlite:///rel.sqlite3' names a relative path, resolved against this process's "
            f"working directory ({tmp_path})") in warned[0], warned[0]
    assert "worker" in warned[0] and f"anarchon_store_url = 'sqlite:///{path}'" in warned[0]


def test_a_worker_in_another_directory_than_beat_names_its_own_sqlite_file(tmp_path, namespace):
    """A real beat and a real prefork worker started from two directories with
    ``sqlite:///rel.sqlite3``: each resolves the path against its own directory, so the worker
    adopts in another file than the one beat claimed in (the run is unknown there, and dropped).
    The worker says which file it uses and gives beat's warning, naming its directory and the
    fix; its drop names the file."""
    require_server(REDIS_URL, "Redis (broker and results)")
    dirs = {name: tmp_path / name for name in ("beat", "worker")}
    for folder in dirs.values():
        folder.mkdir()
    store = open_store(f"sqlite:///{dirs['beat'] / 'rel.sqlite3'}", namespace=namespace,
                       instance_id="test")
    store.prepare(["long"])
    backdate_memory_start(store, ["long"], 120_000)
    store.close()
    queue = f"lt-{namespace}"
    schedule = {"long": {"every": 3600, "anchor": int(time.time()), "queue": queue,
                         **long_entry(1)}}
    cluster = Cluster(str(tmp_path), {
        "ANARCHON_LT_BROKER": REDIS_BASE + "/8", "ANARCHON_LT_BACKEND": REDIS_BASE + "/7",
        "ANARCHON_LT_STORE": "sqlite:///rel.sqlite3", "ANARCHON_LT_NAMESPACE": namespace,
        "ANARCHON_LT_OUT": str(tmp_path / "events.jsonl"), "ANARCHON_LT_ACKS_LATE": "0",
        "ANARCHON_LT_SCHEDULE": json.dumps(schedule)}, app="lease_app")
    worker_file = dirs["worker"] / "rel.sqlite3"
    try:
        cluster.start("w1", "worker", "-l", "info", "-P", "prefork", "-c", "1",
                      "--without-gossip", "--without-mingle", "--without-heartbeat",
                      "-n", "w1@%h", "-Q", queue, cwd=str(dirs["worker"]))
        cluster.wait_log("w1", "ready.")
        cluster.beat("b1", cwd=str(dirs["beat"]))
        cluster.wait_log("w1", f"unknown to the store sqlite:///{worker_file}", timeout=30)
    finally:
        cluster.stop_all()
    text = cluster.text("w1")
    assert (f"the worker side adopts, renews and releases leased runs in the sqlite store "
            f"sqlite:///{worker_file}") in text, text
    warning = (f"sqlite store sqlite:///{worker_file}: anarchon_store_url 'sqlite:///rel.sqlite3' "
               "names a relative path, resolved against this process's working directory "
               f"({dirs['worker']}): a beat, worker or command started in another directory opens "
               "another file")
    assert text.count(warning) == 1, text
    assert f"sqlite:///{dirs['beat'] / 'rel.sqlite3'}" in cluster.text("b1")
    assert not read_executions(str(tmp_path / "events.jsonl")), "no body ran in the wrong file"
