"""The life of a run on one instance (docs/design.md "One run, in time"), against real stores.

The engine's clock is real time plus an offset the test moves (a clock jump), or pinned where a
verdict depends on what is due at one instant (then only the test moves it); the store's clock is
the real one. Sends go to a list.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import multiprocessing
import random
import re
import time

import pytest
from celery import Celery
from celery.beat import ScheduleEntry
from celery.schedules import crontab

from celery_anarchon.schedule import definition as entry_json
from celery_anarchon.beat.engine import Engine
from celery_anarchon.beat.engine.claims import claim_request
from celery_anarchon.beat.engine.instances import host_pid
from celery_anarchon.errors import SendOutcomeUnknown, StoreUnavailable
from celery_anarchon.schedule.plan import build_plans
from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import RunEvent, RunState
from celery_anarchon.stores.entry_store import Pause
from celery_anarchon.settings import Settings

from conftest import REDIS_URL, require_server
from stores_support import LEASE_STORES, VARIANT_OPTIONS, store_url, wait_until
from tcp_proxy import TCPProxy, redis_address
from backends import backdate_memory_start
from helpers import request_run
from engine_harness import Clock, _definition, harnesses, make  # noqa: F401  (a fixture)


@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite:///{tmp_path}/claims.sqlite3"


def test_start_up_claims_only_the_newest_slot_within_max_late(sqlite_url, namespace, harnesses):
    h = make(harnesses, sqlite_url, namespace, {"e": (10, {"jitter": 0})})
    now_ms = int(h.clock.pin(time.time()) * 1000)
    h.engine.tick()
    assert len(h.sent) == 1
    name, slot, attempt = h.sent[0]
    assert slot == now_ms - now_ms % 10_000 and attempt == 1


def test_jitter_never_blocks_the_tick(sqlite_url, namespace, harnesses):
    """The tick at a slot with a jitter to wait hands the wait back (beat sleeps it) instead of
    sleeping in the tick: nothing is claimed yet, and the delay is exactly the wait."""
    h = make(harnesses, sqlite_url, namespace, {"e": (60, {"jitter": 2})})
    now = h.pin(60)                              # the tick comes right at the slot
    delay = h.engine.tick()
    fire = h.engine.next_fire()
    assert h.sent == [] and fire is not None and now < fire <= now + 2
    assert delay == pytest.approx(fire - now)


def test_runs_due_by_a_tick_are_claimed_in_one_batch(sqlite_url, namespace, harnesses):
    h = make(harnesses, sqlite_url, namespace, {f"e{i}": (1, {"jitter": 0}) for i in range(5)})
    batches = []
    claim = h.store.claim
    h.store.claim = lambda requests: (batches.append(len(requests)), claim(requests))[1]
    start = h.pin(1, after_s=0.05)               # early in a second: one slot due per entry
    h.engine.tick()                              # start-up: one catch-up run per entry
    assert batches == [5]
    batches.clear()
    assert {slot for _, slot, _ in h.sent} == {int(start * 1000)}
    h.advance(1.0)                               # the next slot, not two
    h.engine.tick()
    assert batches == [5]
    assert len({slot for _, slot, _ in h.sent}) == 2 and len(h.sent) == 10


def test_a_paused_instance_skips_late_slots_logs_and_records_them(sqlite_url, namespace, harnesses, caplog):
    h = make(harnesses, sqlite_url, namespace, {"e": (1, {"jitter": 0, "max_late": 1})})
    start = int(h.pin(1, after_s=0.5) * 1000)   # half a second past a slot
    h.engine.tick()
    h.advance(3.2)                               # "paused" for three slots
    with caplog.at_level(logging.WARNING, "celery_anarchon"):
        h.engine.tick()
    sent_slots = [slot for _, slot, _ in h.sent]
    late = [s for s, rec in h.history("e").items() if rec.event is RunEvent.LATE_LOCAL]
    assert sorted(late) == [start + 1000, start + 2000], late
    assert any("skipped as late" in r.getMessage() for r in caplog.records)
    assert sent_slots == [start, start + 3000], "a pause never causes a burst of sends"


def test_a_clock_jump_forward_makes_the_skipped_slots_late(sqlite_url, namespace, harnesses, caplog):
    h = make(harnesses, sqlite_url, namespace, {"e": (1, {"jitter": 0, "max_late": 2})})
    h.engine.tick()
    h.clock.offset = 30
    with caplog.at_level(logging.WARNING, "celery_anarchon"):
        h.engine.tick()
    assert len(h.sent) == 1
    late = [rec for rec in h.history("e").values() if rec.event is RunEvent.LATE_LOCAL]
    assert len(late) >= 25
    assert any("slots from" in r.getMessage() and "skipped as late" in r.getMessage()
               for r in caplog.records)


def test_a_clock_jump_back_never_repeats_a_claimed_run(sqlite_url, namespace, harnesses):
    h = make(harnesses, sqlite_url, namespace, {"e": (1, {"jitter": 0, "max_late": 5})})
    h.run_for(1.5)
    newest = max(slot for _, slot, _ in h.sent)
    h.clock.offset = -4
    h.run_for(2.5)
    slots = [slot for _, slot, _ in h.sent]
    assert len(slots) == len(set(slots)), "no run sent twice"
    assert all(s > newest for s in slots[slots.index(newest) + 1:])


def test_the_store_decides_lateness_on_its_own_clock(sqlite_url, namespace, harnesses):
    """This instance's clock runs 40 s behind: its claims arrive late on the store's clock."""
    h = make(harnesses, sqlite_url, namespace, {"e": (1, {"jitter": 0, "max_late": 20})})
    h.clock.offset = -40
    h.engine.tick()
    assert h.sent == []
    assert any(rec.event is RunEvent.LATE for rec in h.history("e").values())


def test_sleep_never_exceeds_sixty_seconds(sqlite_url, namespace, harnesses):
    h = make(harnesses, sqlite_url, namespace, {"daily": (crontab(minute=0, hour=4), {})})
    assert 0 < h.engine.tick() <= 60


def test_losing_a_claim_is_normal_and_quiet(sqlite_url, namespace, harnesses, caplog):
    a = make(harnesses, sqlite_url, namespace, {"e": (10, {"jitter": 0})}, instance="A")
    b = make(harnesses, sqlite_url, namespace, {"e": (10, {"jitter": 0})}, instance="B", backdate=False)
    b.clock.pin(a.clock.pin(time.time()))        # both at the same instant: the same slot due
    a.engine.tick()
    with caplog.at_level(logging.DEBUG, "celery_anarchon"):
        b.engine.tick()
    assert len(a.sent) == 1 and b.sent == []
    assert b.engine.stats["claim_other_won"] == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_different_definition_is_named_in_the_log(sqlite_url, namespace, harnesses, caplog):
    a = make(harnesses, sqlite_url, namespace, {"e": (10, {"jitter": 0, "max_late": 30})}, instance="A")
    b = make(harnesses, sqlite_url, namespace, {"e": (10, {"jitter": 0})}, instance="B", backdate=False)
    b.clock.pin(a.clock.pin(time.time()))        # both at the same instant: the same slot due
    a.engine.tick()
    with caplog.at_level(logging.WARNING, "celery_anarchon"):
        b.engine.tick()
    messages = [r.getMessage() for r in caplog.records if "different definition" in r.getMessage()]
    assert len(messages) == 1
    assert a.plans["e"].fingerprint in messages[0] and b.plans["e"].fingerprint in messages[0]
    assert '"max_late_s": 30.0' in messages[0] and '"max_late_s": 60.0' in messages[0]


def test_a_failed_send_is_retried_by_the_winner_until_it_succeeds(sqlite_url, namespace, harnesses):
    failures = [2]

    def flaky(plan, slot_ms, attempt, token, task_id):
        if failures[0]:
            failures[0] -= 1
            raise ConnectionError("broker down")
        h.sent.append((plan.name, slot_ms, attempt))

    h = make(harnesses, sqlite_url, namespace, {"e": (60, {"jitter": 0})}, send=flaky)
    h.engine.tick()
    assert h.sent == []
    wait_until(lambda: (h.engine.tick(), h.sent)[1], 10, "the send to succeed", interval=0.2)
    slot = h.sent[0][1]
    assert h.history("e")[slot].event is RunEvent.SENT
    assert len(h.sent) == 1



def test_a_burst_is_claimed_in_chunks_each_sent_before_the_next_is_claimed(sqlite_url, namespace,
                                                                            harnesses):
    """250 runs due at once: claimed in chunks of the pace's size, and every won run of a chunk
    is sent before the next chunk is claimed (an instance dying in a burst takes at most one
    chunk's won runs with it)."""
    claims: list[int] = []
    sent_after: dict[str, int] = {}

    def send(plan, slot_ms, attempt, token, task_id):
        sent_after[plan.name] = len(claims)
        h.sent.append((plan.name, slot_ms, attempt))

    h = make(harnesses, sqlite_url, namespace,
             {f"e{i:03d}": (60, {"jitter": 0}) for i in range(250)}, send=send)
    claim = h.store.claim

    def counted(requests):
        claims.append(len(requests))
        return claim(requests)

    h.store.claim = counted
    h.engine.pace.most = h.engine.pace.least = 40          # whatever the machine's speed
    h.engine.pace._size = 40
    h.engine.tick()
    assert len(h.sent) == 250 and sum(claims) == 250
    assert max(claims) <= 40 and len(claims) >= 7, claims
    chunk_of, start = {}, 0
    order = sorted(h.plans)                               # one slot each: the heap's order
    for n, size in enumerate(claims, 1):
        for name in order[start:start + size]:
            chunk_of[name] = n
        start += size
    assert all(sent_after[name] == chunk_of[name] for name in h.plans), \
        "a won run waited for a later chunk's claim"

def test_a_send_failing_until_max_late_is_recorded(sqlite_url, namespace, harnesses, caplog):
    def broken(*args):
        raise ConnectionError("broker down")

    h = make(harnesses, sqlite_url, namespace, {"e": (10, {"jitter": 0, "max_late": 1})},
             send=broken)
    slot = int(h.pin(10) * 1000)                 # the tick comes right at the slot
    with caplog.at_level(logging.ERROR, "celery_anarchon"):
        h.engine.tick()
        for _ in range(5):                       # retried every second until max_late, and past
            h.advance(0.5)
            h.engine.tick()
    assert {s: rec.event for s, rec in h.history("e").items()} == {slot: RunEvent.SEND_FAILED}
    assert any("kept failing until max_late" in r.getMessage() for r in caplog.records)


def test_a_publish_that_broke_off_is_not_published_again(sqlite_url, namespace, harnesses, caplog):
    calls = []

    def broke_off(plan, slot_ms, attempt, token, task_id):
        calls.append((plan.name, slot_ms, attempt))
        raise SendOutcomeUnknown("ConnectionError: Connection closed by server.")

    h = make(harnesses, sqlite_url, namespace, {"e": (2, {"jitter": 0, "max_late": 5})},
             send=broke_off)
    with caplog.at_level(logging.ERROR, "celery_anarchon"):
        h.engine.tick()                          # start-up: the newest slot, always within 5 s
        assert len(calls) == 1
        slot = calls[0][1]
        for _ in range(3):
            h.advance(1.5)                       # past the engine's send retry interval (1 s)
            h.engine.tick()
    assert [c for c in calls if c[1] == slot] == [("e", slot, 1)], \
        "a publish that may have reached the broker was published again"
    assert h.history("e")[slot].event is RunEvent.SEND_UNKNOWN
    assert h.engine.stats["send_unknown"] == len(calls)
    assert any("publish broke off" in r.getMessage() for r in caplog.records)


def test_a_send_refused_before_anything_was_written_fails_alone_and_delays_no_other(
        sqlite_url, namespace):
    """A real Redis broker and store, beat's own send and send batch: three runs due in one
    tick, the middle one's options name a queue Celery refuses before it publishes anything
    (task_create_missing_queues off). The other two go out in that tick's batch (on the broker,
    recorded sent); the middle one is not recorded send_unknown (nothing was published): it is
    tried again alone and, once max_late passed, recorded send_failed."""
    from kombu import Queue

    from celery_anarchon import Scheduler
    require_server(REDIS_URL, "Redis")
    queue = f"q-{namespace}"
    app = Celery("proj", set_as_current=False)
    app.conf.update(
        broker_url=REDIS_URL.rsplit("/", 1)[0] + "/8", anarchon_store_url=sqlite_url,
        anarchon_namespace=namespace, task_create_missing_queues=False,
        task_queues=[Queue(queue)], task_default_queue=queue,
        beat_schedule={name: {"task": "proj.t", "schedule": 60.0, "options": {
            **options, "anarchon": {"jitter": 0, "max_late": 120}}}
            for name, options in (("a", {}), ("b", {"queue": "nowhere"}), ("c", {}))})
    scheduler = Scheduler(app)
    backdate_memory_start(scheduler.store, ["a", "b", "c"], 120_000)
    clock, mono = Clock(), Clock(time.monotonic)
    engine = Engine(scheduler.store, scheduler.engine.plans, instance_id="A", namespace=namespace,
                    send=scheduler.publisher.send, send_batch=scheduler.publisher.send_batch, clock=clock,
                    monotonic=mono, rng=random.Random(7))
    try:
        engine.tick()                      # start-up: each entry's newest slot, in one batch
        history = {name: scheduler.store.history.read(name) for name in "abc"}
        slot = history["a"][0].slot_ms
        with app.connection_for_read() as conn:
            delivered = []
            consumer = conn.SimpleQueue(queue)
            while True:
                try:
                    message = consumer.get(timeout=0.5)
                except consumer.Empty:
                    break
                message.ack()
                delivered.append(message.headers["anarchon_entry"])
            consumer.close()
        assert sorted(delivered) == ["a", "c"]
        assert [h.event for h in history["a"]] == [RunEvent.SENT]
        assert [h.event for h in history["c"]] == [RunEvent.SENT], "a bad send delayed another"
        assert [h.event for h in history["b"]] == [RunEvent.CLAIMED], "nothing was published"
        assert engine.stats["send_unknown"] == 0 and engine.stats["sent"] == 2
        assert list(engine.sends.retrying) == [("b", slot)]
        clock.offset += 121                 # max_late passed: the send failed for good
        mono.offset += 121
        engine.tick()
        [failed] = [h for h in scheduler.store.history.read("b") if h.slot_ms == slot]
        assert failed.event is RunEvent.SEND_FAILED and "nowhere" in failed.detail
    finally:
        scheduler.close()


def test_a_stopped_engine_sends_nothing_more_it_wins(sqlite_url, namespace, harnesses):
    """close() in the middle of a tick's sends (beat's SIGTERM handler): the rest is not sent."""
    def send_then_stop(plan, slot_ms, attempt, token, task_id):
        h.sent.append((plan.name, slot_ms, attempt))
        h.engine.stop()

    h = make(harnesses, sqlite_url, namespace, {"a": (2, {"jitter": 0, "max_late": 5}),
                                                "b": (2, {"jitter": 0, "max_late": 5})},
             send=send_then_stop)
    assert h.engine.tick() == 60
    assert len(h.sent) == 1, "the engine went on sending after stop()"
    h.engine.tick()
    assert len(h.sent) == 1


def test_a_run_sent_before_a_stop_is_recorded_sent_when_the_engine_closes(sqlite_url, namespace,
                                                                           harnesses):
    """close() in the middle of a tick, after a send (beat's SIGTERM handler): the tick ends
    without writing its history; beat's second close() writes it, so the history says "sent",
    not "claimed", for the run that was published."""
    def send_then_stop(plan, slot_ms, attempt, token, task_id):
        h.sent.append((plan.name, slot_ms, attempt))
        h.engine.stop()

    h = make(harnesses, sqlite_url, namespace, {"a": (2, {"jitter": 0, "max_late": 5})},
             send=send_then_stop)
    h.engine.tick()
    [(name, slot_ms, _)] = h.sent
    h.engine.close()
    assert h.history(name)[slot_ms].event is RunEvent.SENT, h.history(name)


@pytest.mark.parametrize("leased", [False, True], ids=["plain", "leased"])
def test_a_run_whose_claim_answers_after_max_late_is_not_sent(sqlite_url, namespace, harnesses,
                                                              leased):
    """A plain run is not sent; a leased one is (its record is queued in the store, and a
    takeover would send it later anyway)."""
    opts = {"jitter": 0, "max_late": 5}
    if leased:
        opts["lease"] = {"duration": 6, "heartbeat": 1, "queue_timeout": 4}
    h = make(harnesses, sqlite_url, namespace, {"e": (2, opts)})
    claim = h.store.claim

    def slow_claim(requests):
        results = claim(requests)
        h.clock.offset += 6                      # the answer came 6 s later, past max_late
        return results

    h.store.claim = slow_claim
    h.engine.tick()
    if leased:
        assert len(h.sent) == 1
        return
    assert h.sent == []
    records = h.history("e")
    assert [(r.event, r.detail) for r in records.values()] == [
        (RunEvent.SEND_FAILED, "won after max_late: the claim answered too late")]


@pytest.mark.parametrize("offset_s, level, says", [
    (-1.6, logging.WARNING, "; run NTP"),
    (40.0, logging.ERROR, "more than half of max_late (30 s)"),
])
def test_the_skew_to_the_store_clock_is_measured_and_logged(sqlite_url, namespace, harnesses, caplog,
                                                            offset_s, level, says):
    # slots half an hour away from now: nothing is due at the first tick, only the measurement
    anchor = int(time.time() + 1800) % 3600
    h = make(harnesses, sqlite_url, namespace, {"e": (3600, {"max_late": 60, "anchor": anchor})})
    h.clock.offset = offset_s                     # this instance's clock is off; the store's is not
    with caplog.at_level(logging.INFO, "celery_anarchon"):
        h.engine.tick()                           # the first tick prepares the store and measures
    found = [r for r in caplog.records if "this instance's clock is" in r.getMessage()]
    assert len(found) == 1 and found[0].levelno == level, [r.getMessage() for r in found]
    message = found[0].getMessage()
    measured = float(re.search(r"clock is ([0-9.]+) s", message).group(1))
    round_trip_s = float(re.search(r"round trip ([0-9.]+) ms", message).group(1)) / 1000
    # the store's reading lies between the two of this clock: off by half the round trip at most
    assert abs(measured - abs(offset_s)) <= round_trip_s / 2 + 0.002, message
    assert says in message and ("behind" if offset_s < 0 else "ahead of") in message


def test_a_lease_that_ran_out_during_a_store_outage_is_not_taken_over_at_once(sqlite_url, namespace,
                                                                            harnesses):
    """Right after a store error the runner's renewals probably failed too: beat gives it
    2 heartbeats + 1 s to renew before presuming it dead."""
    lease = {"duration": 6, "heartbeat": 1, "queue_timeout": 4}
    h = make(harnesses, sqlite_url, namespace, {"e": (2, {"jitter": 0, "max_late": 5, "lease": lease})})
    h.engine.tick()
    (_, slot, _), = h.sent
    adopted, _ = h.store.leases.adopt("e", slot, "runner", 50)        # a lease of 50 ms, never renewed
    assert adopted
    wait_until(lambda: h.store.leases.expired_runs(["e"]), 5, "the lease to run out")
    h.engine.outage.last_error_at = h.mono()                   # the store just failed for us
    h.engine.takeovers.check(h.engine.plans)
    assert h.store.leases.inspect("e", slot).attempt == 1 and h.engine.stats["takeover_deferred"] == 1
    h.advance(3.5)                                               # past the grace: 2 x 1 s + 1 s
    h.engine.takeovers.check(h.engine.plans)
    assert h.store.leases.inspect("e", slot).attempt == 2, "a runner silent past the grace is taken over"


@pytest.fixture
def redis_proxy():
    require_server(REDIS_URL, "Redis")
    proxy = TCPProxy(redis_address()).start()
    yield proxy
    proxy.close()


def test_an_unreachable_store_means_no_sends_until_it_answers(redis_proxy, namespace, harnesses, caplog):
    url = redis_proxy.url("redis", "/9")
    h = make(harnesses, url, namespace, {"e": (1, {"jitter": 0, "max_late": 3})},
             store_options={"claim_timeout": 0.5})
    h.engine.tick()
    before = len(h.sent)
    redis_proxy.outage()
    with caplog.at_level(logging.ERROR, "celery_anarchon"):
        h.run_for(1.5)
    assert len(h.sent) == before, "never sent blind"
    assert sum("unreachable" in r.getMessage() for r in caplog.records) == 1, "logged once per outage"
    redis_proxy.restore()
    wait_until(lambda: (h.engine.tick(), len(h.sent) > before)[1], 15, "sends after the outage",
               interval=0.1)
    slots = [slot for _, slot, _ in h.sent]
    assert len(slots) == len(set(slots))


def test_a_claim_whose_answer_was_lost_is_recognised_as_won(redis_proxy, namespace, harnesses):
    url = redis_proxy.url("redis", "/9")
    entries = {"e": (2, {"jitter": 0, "max_late": 5})}
    h = make(harnesses, url, namespace, entries, store_options={"claim_timeout": 0.5})
    other = make(harnesses, REDIS_URL, namespace, entries, instance="B", backdate=False)
    h.pin(2, after_s=0.05)
    other.clock.pin(h.clock())                   # both at the same instant: the same slot due
    h.engine.tick()
    other.engine.tick()
    assert len(h.sent) + len(other.sent) == 1
    sent_before = len(h.sent)
    h.advance(2)                                 # the next slot
    other.advance(2)
    redis_proxy.swallow_replies = True
    h.engine.tick()                              # the claim reaches Redis; its answer does not
    assert len(h.sent) == sent_before
    lost = other.engine.stats["claim_other_won"]
    other.engine.tick()                          # another instance finds the run taken
    assert other.engine.stats["claim_other_won"] == lost + 1
    redis_proxy.restore()
    wait_until(lambda: (h.engine.tick(), len(h.sent) > sent_before)[1], 10, "the retried claim",
               interval=0.05)
    slots = [slot for _, slot, _ in h.sent + other.sent]
    assert len(slots) == len(set(slots)) == 2


def _draw(engine, queue):
    queue.put([engine.rng.uniform(0, 1) for _ in range(5)])


def test_forked_processes_draw_independent_jitter(sqlite_url, namespace, harnesses):
    h = make(harnesses, sqlite_url, namespace, {"e": (60, {})})
    h.engine.rng = Engine(h.store, {}, instance_id="x", namespace="n", send=None).rng
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_draw, args=(h.engine, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    draws = [queue.get(timeout=10) for _ in procs]
    for p in procs:
        p.join()
    assert draws[0] != draws[1]


def test_a_store_down_at_start_up_holds_the_runs_until_it_answers(redis_proxy, namespace, harnesses, caplog):
    """Runs that come due while the store was never reached wait (never sent blind); those still
    within max_late are claimed once it answers, the others are recorded as store_unreachable."""
    url = redis_proxy.url("redis", "/9")
    h = make(harnesses, url, namespace, {"e": (1, {"jitter": 0, "max_late": 2})},
             store_options={"claim_timeout": 0.5})
    redis_proxy.outage()
    with caplog.at_level(logging.ERROR, "celery_anarchon"):
        h.run_for(4.5)
    assert h.sent == []
    assert any("could not be reached until their max_late" in r.getMessage() for r in caplog.records)
    redis_proxy.restore()
    wait_until(lambda: (h.engine.tick(), h.sent)[1], 15, "sends once the store answers", interval=0.1)
    h.engine.tick()
    events = collections.Counter(rec.event for rec in h.history("e").values())
    assert events[RunEvent.UNREACHABLE] >= 1
    slots = [slot for _, slot, _ in h.sent]
    assert len(slots) == len(set(slots))


def test_every_run_missed_in_a_long_outage_is_recorded_once_the_store_answers(
        redis_proxy, namespace, harnesses, request):
    """300 entries every second, the store down for 45 s: 13,500 runs are given up
    (store_unreachable), more than any fixed bound on the notes a beat keeps meanwhile. Once the
    store answers, every entry's history has a record of each of its missed runs (as many as the
    store keeps: history_size), the oldest included; none was dropped for another entry's."""
    url = redis_proxy.url("redis", "/9")
    entries = {f"e{i:03d}": (1, {"jitter": 0, "max_late": 1}) for i in range(300)}
    # the clock is the real one plus what the test advances: on a slow machine more slots pass
    # than the 45 advanced. A history longer than the slots of the longest run this test may take
    # (its pytest timeout, plus the 45 s advanced) keeps every slot of the outage.
    timeout_s = int(float(request.config.getoption("timeout", None)
                          or request.config.getini("timeout") or 300))
    h = make(harnesses, url, namespace, entries,
             store_options={"claim_timeout": 0.5, "history_size": timeout_s + 45 + 60})
    h.engine.tick()
    redis_proxy.outage()
    first = (int(h.clock() * 1000) // 1000 + 1) * 1000
    for _ in range(45):
        h.advance(1.0)
        h.engine.tick()
    last = (int(h.clock() * 1000) // 1000 - 2) * 1000   # given up by now (max_late 1 s)
    redis_proxy.restore()
    wait_until(lambda: (h.engine.tick(), not h.engine.notes)[1], 30, "the notes written",
               interval=0.1)
    missing = {}
    for name in entries:
        history = h.history(name)
        gone = [(slot, history[slot].event if slot in history else None)
                for slot in range(first, last + 1, 1000) if history.get(slot) is None
                or history[slot].event not in (RunEvent.UNREACHABLE, RunEvent.LATE_LOCAL)]
        if gone:
            missing[name] = gone
    assert not missing, f"{len(missing)} entries miss records, e.g. {next(iter(missing.items()))}"
    assert not [run for run in h.sent if first <= run[1] <= last], "never sent blind"


def _changed_plans(h, entries):
    """The plans of ``entries`` on ``h``'s store: a schedule changed at run time."""
    schedule = {name: ScheduleEntry(name=name, task="proj.t", schedule=sched,
                                    options={"anarchon": opts}, app=h.app)
                for name, (sched, opts) in entries.items()}
    return build_plans(schedule, app=h.app, settings=Settings.from_app(h.app), store=h.store)


def _recording_claims(h):
    """Wrap the real store's claim to keep the runs of every batch it was asked."""
    batches: list[list[tuple[str, int]]] = []
    claim = h.store.claim

    def recording(requests):
        batches.append([r.run for r in requests])
        return claim(requests)
    h.store.claim = recording
    return batches


def test_a_run_waiting_for_the_store_and_reseeded_is_claimed_and_sent_once(redis_proxy, namespace,
                                                                           harnesses):
    """A store blip leaves slot S in the claim retries; a schedule change re-seeds the entry with
    S; the next batch must carry S once (the store answers won to each copy)."""
    url = redis_proxy.url("redis", "/9")
    h = make(harnesses, url, namespace, {"e": (2, {"jitter": 0, "max_late": 10})},
             store_options={"claim_timeout": 0.5})
    slot = int(h.pin(2, after_s=0.05) * 1000) + 2000
    h.engine.tick()                              # start-up: the newest slot, sent
    assert len(h.sent) == 1
    batches = _recording_claims(h)
    h.advance(2)                                 # the next slot, S
    redis_proxy.outage()
    h.engine.tick()                              # S's claim fails: it waits for the store
    assert len(h.sent) == 1 and batches == [[("e", slot)]]
    h.engine.update_plans(_changed_plans(h, {"e": (2, {"jitter": 0, "max_late": 9})}))
    redis_proxy.restore()
    wait_until(lambda: (h.engine.tick(), len(h.sent) > 1)[1], 10,  # past the backoff (0.5 s)
               "the claim retried once the store answers", interval=0.05)
    h.engine.tick()
    assert [s for _, s, _ in h.sent].count(slot) == 1, f"slot sent {h.sent}; batches {batches}"
    assert all(len(b) == len(set(b)) for b in batches), f"a run twice in one batch: {batches}"


def test_a_run_due_in_the_heap_and_waiting_in_the_retries_is_claimed_once_by_the_coordinator(
        sqlite_url, namespace, harnesses):
    """The coordinator's own rule, whatever the heap does (engine/due.py keeps a re-seed from
    queueing a waiting run, test_engine_parts.py::test_due_reseed_leaves_a_waiting_claim_in_the_retries):
    a run that reaches one tick both from the heap and from the claim retries is claimed once,
    with the heap's copy (the current plan's), and sent once. A store answers won to every copy
    of its own claim, so a second copy in the batch would be a second send."""
    h = make(harnesses, sqlite_url, namespace, {"e": (10, {"jitter": 0, "max_late": 5})})
    batches = []
    claim = h.store.claim

    def recording(requests):
        batches.append([(r.run, r.task_id) for r in requests])
        return claim(requests)
    h.store.claim = recording
    slot = int(h.pin(10, after_s=-0.5) * 1000)                   # the engine: just before it
    h.engine.tick()                                                # seeds the slot (9.5 s late before)
    assert not h.sent and h.engine.next_fire() == slot / 1000
    stale = dataclasses.replace(claim_request(namespace, h.plans["e"], slot), task_id="stale-copy")
    h.engine.claims.hold([stale])                                  # the same run, waiting
    h.advance(0.6)
    h.engine.tick()
    assert h.sent == [("e", slot, 1)], h.sent
    heap_copy = claim_request(namespace, h.plans["e"], slot).task_id
    assert batches == [[(("e", slot), heap_copy)]], batches
    assert ("e", slot) not in h.engine.claims, "the waiting copy was answered too"


def test_a_wall_clock_stepped_back_still_retries_the_store(redis_proxy, namespace, harnesses):
    """Backoff is measured on the monotonic clock: a wall clock set back an hour during an
    outage does not freeze the retries (the store judges lateness on its own clock)."""
    url = redis_proxy.url("redis", "/9")
    h = make(harnesses, url, namespace, {"e": (2, {"jitter": 0, "max_late": 10})},
             store_options={"claim_timeout": 0.5})
    h.pin(2, after_s=0.05)
    h.engine.tick()
    assert len(h.sent) == 1
    h.advance(2)                                 # the next slot
    redis_proxy.outage()
    h.engine.tick()                              # the claim fails: retried after the backoff
    assert len(h.sent) == 1
    redis_proxy.restore()
    h.clock.offset -= 3600
    wait_until(lambda: (h.engine.tick(), len(h.sent) == 2)[1], 5,
               "the claim retried after the wall clock went back an hour", interval=0.05)


def test_a_wall_clock_stepped_back_still_takes_over_a_dead_runner_on_time(sqlite_url, namespace,
                                                                         harnesses):
    """Lease checks are timed on the monotonic clock: a dead runner is still replaced within
    two heartbeats when the wall clock was set back an hour."""
    lease = {"duration": 6, "heartbeat": 1, "queue_timeout": 4}
    h = make(harnesses, sqlite_url, namespace, {"e": (2, {"jitter": 0, "max_late": 5, "lease": lease})})
    h.engine.tick()
    (_, slot, _), = h.sent
    adopted, _ = h.store.leases.adopt("e", slot, "runner", 50)        # a lease of 50 ms, never renewed
    assert adopted
    wait_until(lambda: h.store.leases.expired_runs(["e"]), 5, "the lease to run out")
    h.clock.offset = -3600
    # within two heartbeats of the engine's monotonic clock (a check every heartbeat at a random
    # offset), plus 1 s: the test moves that clock, so the bound holds however slow the machine
    h.mono.pin(time.monotonic())
    moved = 0.0
    while (h.engine.tick(), ("e", slot, 2) not in h.sent)[1]:
        assert moved < 2 * lease["heartbeat"] + 1, "no takeover after the wall clock went back"
        h.mono.offset += 0.05
        moved += 0.05
    assert h.store.leases.inspect("e", slot).attempt == 2


def test_a_run_answered_unconfirmed_is_never_sent_nor_claimed_again(sqlite_url, namespace,
                                                                   harnesses, caplog):
    """UNCONFIRMED (won, not durable in time) is a skip: not sent, logged, counted, and this
    instance never asks for that run again (a re-seed after a schedule change, a clock set back),
    since a store that reads its own claim back would answer won."""
    from celery_anarchon.stores.base import Outcome
    h = make(harnesses, sqlite_url, namespace, {"e": (2, {"jitter": 0, "max_late": 5})})
    batches = _recording_claims(h)
    claim = h.store.claim
    answered: set = set()

    def unconfirmed_once(requests):              # the first answer for a run: not confirmed
        results = []
        for result in claim(requests):
            if result.outcome is Outcome.WON and result.request.run not in answered:
                answered.add(result.request.run)
                result = dataclasses.replace(result, outcome=Outcome.UNCONFIRMED,
                                             detail="WAIT: 0 of 1 replicas in 100 ms")
            results.append(result)
        return results
    h.store.claim = unconfirmed_once
    h.pin(2, after_s=0.5)                        # every re-seed below finds the same newest slot
    with caplog.at_level(logging.WARNING, "celery_anarchon"):
        h.engine.tick()                          # start-up: the newest slot, answered unconfirmed
    (slot,), = [[s for _, s in b] for b in batches]
    assert h.sent == [] and h.engine.stats["claim_unconfirmed"] == 1
    assert any("did not confirm the claim durable" in r.getMessage() and "WAIT" in r.getMessage()
               for r in caplog.records)
    h.engine.update_plans(_changed_plans(h, {"e": (2, {"jitter": 0, "max_late": 6})}))
    h.engine.tick()                              # the re-seeded entry's newest slot is S again
    h.clock.offset = -1.0                        # and the clock went back a little
    h.engine.update_plans(_changed_plans(h, {"e": (2, {"jitter": 0, "max_late": 7})}))
    h.clock.offset = 0.0
    h.engine.tick()
    assert ("e", slot) not in [run for b in batches[1:] for run in b], batches
    assert not [s for s in h.sent if s[1] == slot], h.sent


def test_a_takeover_whose_reply_was_lost_is_retried_and_sent_once(redis_proxy, namespace, harnesses):
    """The takeover reached Redis and committed, its reply did not come back: the engine asks
    again with the same expected token, the store recognises its own takeover (TAKEN again, the
    same record), and attempt 2 is sent once; no attempt is burned."""
    url = redis_proxy.url("redis", "/9")
    lease = {"duration": 6, "heartbeat": 1, "queue_timeout": 4}
    anchor = int(time.time() - 1) % 3600                       # the start-up slot: 1 s ago
    h = make(harnesses, url, namespace,
             {"e": (3600, {"jitter": 0, "max_late": 5, "anchor": anchor, "lease": lease})},
             store_options={"claim_timeout": 0.5})
    direct = open_store(REDIS_URL, namespace=namespace, instance_id="runner")
    try:
        h.engine.tick()
        (_, slot, _), = h.sent
        adopted, _ = direct.leases.adopt("e", slot, "runner", 50)   # a lease of 50 ms, never renewed
        assert adopted
        wait_until(lambda: direct.leases.expired_runs(["e"]), 5, "the lease to run out")
        take_over, calls = h.store.leases.take_over, []

        def reply_lost(*args, **kwargs):        # the first takeover's reply never comes back
            calls.append(args)
            redis_proxy.swallow_replies = len(calls) == 1
            try:
                return take_over(*args, **kwargs)
            finally:
                redis_proxy.swallow_replies = False
        h.store.leases.take_over = reply_lost
        h.engine.takeovers.check(h.engine.plans)  # the takeover commits; its reply is lost
        assert len(calls) == 1
        assert h.sent == [("e", slot, 1)]
        assert direct.leases.inspect("e", slot).attempt == 2, "the takeover reached the store"
        redis_proxy.restore()
        # asked again after the grace for a started run (2 heartbeats + 1 s) of the engine's
        # monotonic clock, which the test moves: well before attempt 2's queue deadline (4 s
        # after the takeover on the store's clock), past which any instance takes it over anew
        h.mono.pin(time.monotonic())
        moved = 0.0
        while (h.engine.tick(), not h.sent[1:])[1]:
            assert moved < lease["queue_timeout"], "the takeover was not asked again"
            h.mono.offset += 0.05
            moved += 0.05
        assert h.sent == [("e", slot, 1), ("e", slot, 2)], "an attempt was burned"
        adopted, _ = direct.leases.adopt("e", slot, "runner-2", 60_000)  # a worker takes attempt 2
        assert adopted
        for _ in range(30):                       # three heartbeats of lease checks
            h.mono.offset += 0.1
            h.engine.tick()
        assert h.sent == [("e", slot, 1), ("e", slot, 2)], "attempt 2 was sent twice"
        assert direct.leases.inspect("e", slot).attempt == 2
    finally:
        direct.close()


def test_a_run_not_taken_over_after_the_store_lost_writes_is_logged_as_such(namespace, harnesses,
                                                                            caplog):
    """A takeover the store refuses because it may have lost writes to the run's record (an epoch
    change since the claim: recorded lost at attempt 1 of 3) is logged with that reason, not as
    "recorded lost after 1 attempts" (which reads as max_attempts)."""
    require_server(REDIS_URL, "Redis")
    lease = {"duration": 6, "heartbeat": 1, "queue_timeout": 4, "max_attempts": 3}
    anchor = int(time.time() - 1) % 3600                       # the start-up slot: 1 s ago
    h = make(harnesses, REDIS_URL, namespace,
             {"e": (3600, {"jitter": 0, "max_late": 5, "anchor": anchor, "lease": lease})})
    h.engine.tick()
    (_, slot, _), = h.sent
    adopted, _ = h.store.leases.adopt("e", slot, "runner", 50)        # a lease of 50 ms, never renewed
    assert adopted
    wait_until(lambda: h.store.leases.expired_runs(["e"]), 5, "the lease to run out")
    # the server's identity changes under the store (a failover): its writes may be lost
    h.store.connection.client()[0].hset(h.store.store_key, "epoch", "an-older-server")
    h.advance(3.5)                                               # past the takeover grace
    with caplog.at_level(logging.WARNING, "celery_anarchon"):
        h.engine.takeovers.check(h.engine.plans)
    assert h.store.leases.inspect("e", slot).state is RunState.GIVEN_UP and h.sent == [("e", slot, 1)]
    messages = [r.getMessage() for r in caplog.records if "recorded lost" in r.getMessage()
                or "not taken over" in r.getMessage()]
    assert len(messages) == 1, messages
    assert "after 1 attempts" not in messages[0], messages[0]
    assert "lost writes" in messages[0] and "an-older-server" in messages[0], messages[0]


# -- the store's entries (docs/schedules.md): SQLite, an entry store ------------------------------

def _info(caplog, start=""):
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.INFO and r.getMessage().startswith(start)]


def test_a_store_entry_runs_follows_an_update_and_a_removal_and_no_slot_is_claimed_twice(
        sqlite_url, namespace, harnesses, caplog):
    """The store answers won again to its own claim: a re-seed after an update (the newest slot
    within max_late is the one just sent) must not claim it again, or it is sent twice."""
    h = make(harnesses, sqlite_url, namespace, {"cfg": (3600, {"jitter": 0})}, sync_s=1)
    batches = _recording_claims(h)
    h.store.entries.put_entry("s", _definition(jitter=0, max_late=10), by="test", create=True)
    h.pin(2, after_s=0.5)                        # the tick and its sync see the same instant
    with caplog.at_level(logging.INFO, "celery_anarchon"):
        h.engine.tick()                          # start-up: the sync loads "s", its newest slot
        (slot,) = [s for n, s, _ in h.sent if n == "s"]
        h.store.entries.put_entry("s", _definition(jitter=0, max_late=9), by="test", create=False)
        h.sync()                                 # the wall clock stays: slot is still the newest
        assert h.engine.plans["s"].timing.max_late_s == 9
        h.store.entries.remove_entry("s", by="test")
        h.sync()
    assert [s for n, s, _ in h.sent if n == "s"].count(slot) == 1, h.sent
    assert [run for b in batches for run in b].count(("s", slot)) == 1, batches
    assert "s" not in h.engine.plans and "cfg" in h.engine.plans
    synced = _info(caplog, "anarchon: synced entries version")
    assert [m.split(": ", 2)[2] for m in synced] == [
        "+1 -0 ~0 (1 store entries)", "+0 -0 ~1 (1 store entries)", "+0 -1 ~0 (0 store entries)"]


def test_an_update_never_runs_a_slot_older_than_one_another_instance_already_ran(
        sqlite_url, namespace, harnesses):
    """A re-seed after an update starts after the newest slot this instance saw decided, its own
    or another's: the new schedule's newest slot within max_late may be older than the slot the
    old one just ran elsewhere, and running it would send the entry's runs out of order."""
    a = make(harnesses, sqlite_url, namespace, {}, instance="A", sync_s=1)
    b = make(harnesses, sqlite_url, namespace, {}, instance="B", sync_s=1)
    now = time.time()

    def hourly(ago_s):                           # every hour, the newest slot ago_s seconds ago
        return entry_json.canonical({"task": "proj.t", "schedule": {"every": 3600}, "anarchon": {
            "jitter": 0, "max_late": 300, "anchor": int(now - ago_s) % 3600}})
    a.store.entries.put_entry("s", hourly(10), by="test", create=True)
    backdate_memory_start(a.store, ["s"], 120_000)
    a.engine.tick()                              # A wins the old schedule's newest slot
    b.engine.tick()                              # B: claimed by A
    (old,) = [slot for name, slot, _ in a.sent if name == "s"]
    assert not b.sent
    a.store.entries.put_entry("s", hourly(40), by="test", create=False)   # its newest slot: 30 s older
    b.sync()
    a.sync()
    assert [slot for name, slot, _ in a.sent + b.sent if name == "s"] == [old], (a.sent, b.sent)


def test_a_sync_counts_a_change_of_the_kwargs_alone_as_a_change(sqlite_url, namespace, harnesses,
                                                                  caplog):
    h = make(harnesses, sqlite_url, namespace, {}, sync_s=1)
    entry = {"task": "proj.t", "schedule": {"every": 3600}, "kwargs": {"x": 1}}
    h.store.entries.put_entry("s", entry_json.canonical(entry), by="test", create=True)
    with caplog.at_level(logging.INFO, "celery_anarchon"):
        h.engine.tick()
        h.store.entries.put_entry("s", entry_json.canonical(dict(entry, kwargs={"x": 3})), by="test",
                          create=False)
        h.sync()
    assert h.engine.plans["s"].entry.kwargs == {"x": 3}
    synced = _info(caplog, "anarchon: synced entries version")
    assert [m.split(": ", 2)[2] for m in synced] == ["+1 -0 ~0 (1 store entries)",
                                                      "+0 -0 ~1 (1 store entries)"]


def test_a_paused_entry_is_skipped_at_info_once_and_its_slot_not_claimed_after_resume(
        sqlite_url, namespace, harnesses, caplog):
    h = make(harnesses, sqlite_url, namespace, {"e": (2, {"jitter": 0, "max_late": 10})}, sync_s=1)
    batches = _recording_claims(h)
    h.pin(2, after_s=0.5)                        # the re-seed finds the paused slot again
    h.store.entries.set_pause("e", Pause("maintenance", "ops", 0), by="ops")
    with caplog.at_level(logging.INFO, "celery_anarchon"):
        h.engine.tick()                          # the pause is decided inside the claim
        ((_, paused),) = batches[0]
        h.store.entries.set_pause("e", None, by="ops")
        h.engine.update_plans(_changed_plans(h, {"e": (2, {"jitter": 0, "max_late": 9})}))
        h.sync()                                 # resumed, re-seeded: the paused slot is newest
    assert [run for b in batches for run in b].count(("e", paused)) == 1, batches
    assert ("e", paused, 1) not in h.sent
    assert h.history("e")[paused].event is RunEvent.PAUSED
    assert "anarchon: entry e is paused by ops: maintenance" in _info(caplog)
    assert _info(caplog, "anarchon: entry e is resumed"), "(by whom: when the store kept the name)"
    (skip,) = [m for m in _info(caplog, "e: slot") if "paused" in m]
    assert skip.endswith("skipped: the entry is paused (paused by ops: maintenance)")


def test_a_held_plans_runs_are_never_claimed_and_recorded_paused_while_the_pause_holds(
        sqlite_url, namespace, harnesses):
    """A held plan (a django-celery-beat row disabled and paused: EntryPlan.held) records each
    slot its pause holds, as a paused entry's claim does, and claims none: resumed while held,
    its slots are neither sent nor recorded."""
    h = make(harnesses, sqlite_url, namespace, {"e": (2, {"jitter": 0, "max_late": 10})}, sync_s=1)
    h.engine.update_plans({"e": dataclasses.replace(h.plans["e"], held=True)})
    batches = _recording_claims(h)
    start = h.pin(2, after_s=0.5) * 1000
    h.store.entries.set_pause("e", Pause("disabled in django-celery-beat", "ops", 0), by="ops")
    h.sync()
    for _ in range(2):
        h.advance(2)
        h.engine.tick()
    held = h.history("e")
    assert sorted(held) == [start, start + 2000, start + 4000], held
    assert {(r.event, r.detail) for r in held.values()} == {
        (RunEvent.PAUSED, "paused by ops: disabled in django-celery-beat")}
    h.store.entries.set_pause("e", None, by="ops")
    h.sync()
    h.advance(2)
    h.engine.tick()
    assert batches == [] and h.sent == []
    assert sorted(h.history("e")) == [start, start + 2000, start + 4000]


def test_a_run_now_request_is_claimed_at_once_and_sent_once(sqlite_url, namespace, harnesses,
                                                           caplog):
    anchor = int(time.time() + 1800) % 3600       # the scheduled slots are half an hour away
    entries = {"e": (3600, {"max_late": 5, "anchor": anchor})}
    a = make(harnesses, sqlite_url, namespace, entries, instance="A", sync_s=1)
    b = make(harnesses, sqlite_url, namespace, entries, instance="B", backdate=False, sync_s=1)
    a.engine.tick()
    b.engine.tick()
    batches = _recording_claims(a)
    slot = request_run(a.store, "e", "r1").slot_ms
    assert request_run(a.store, "e", "r1").slot_ms == slot, "one request"
    with caplog.at_level(logging.INFO, "celery_anarchon"):
        a.sync()
        b.sync()
    assert a.sent == [("e", slot, 1)] and b.sent == []
    assert b.engine.stats["claim_other_won"] == 1
    assert batches == [[("e", slot)]]
    assert a.history("e")[slot].event is RunEvent.SENT
    assert any(m.startswith("anarchon: entry e: run-now request r1 by test") for m in _info(caplog))
    second = request_run(a.store, "e", "r2").slot_ms      # the version moves again
    a.sync()
    assert a.sent == [("e", slot, 1), ("e", second, 1)], "r1 is not claimed again"
    assert batches[1:] == [[("e", second)]]


def test_a_run_now_request_beyond_a_count_limited_memory_is_refused_never_sent_twice(
        tmp_path, namespace, harnesses, caplog):
    """idmp with ``max_size=5`` and an entry every second remembers about 5 s of its runs; a
    run-now request is claimed up to 2 x anarchon_sync_interval + 5 s = 15 s after its slot.
    Instance A claims the request at once and then 5 scheduled runs; B syncs later, within the
    15 s: its claim would win the run a second time (the store forgot A's). So every instance
    refuses the request of such an entry: never sent, logged (ERROR, naming the entry, the
    values and the fix) and recorded in the history as forgotten."""
    url = store_url("redis-idmp", str(tmp_path))
    options = {**VARIANT_OPTIONS["redis-idmp"], "max_size": 5}
    entries = {"e": (1, {"jitter": 0, "max_late": 3})}
    a = make(harnesses, url, namespace, entries, instance="A", sync_s=5, store_options=options)
    b = make(harnesses, url, namespace, entries, instance="B", backdate=False, sync_s=5,
             store_options=options)
    a.engine.tick()
    b.engine.tick()
    now = a.store.now_ms()
    seconds = frozenset(range((now // 1000 - 10) * 1000, (now // 1000 + 70) * 1000, 1000))
    slot = request_run(a.store, "e", "r1", scheduled=seconds).slot_ms
    with caplog.at_level(logging.INFO, "celery_anarchon"):
        a.sync(5.0)                                     # A claims the request at once
        for _ in range(6):                              # then a scheduled run a second
            a.advance(1.0)
            a.engine.tick()
        b.sync(5.0)                                     # B syncs 6 s after the slot
    sends = [s for s in a.sent + b.sent if s[1] == slot]
    assert sends == [], f"the run-now run was sent {len(sends)} time(s): {sends}"
    assert max(s for _, s, _ in a.sent) > slot + 5_000, "the schedule runs on"
    record = a.history("e")[slot]
    assert record.event is RunEvent.FORGOTTEN and "'max_size'" in record.detail, record
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2, errors                     # once per instance
    for message in errors:
        assert message.startswith("anarchon: entry e: run-now request r1 by test is not claimed"), message
        assert "at most 5 runs" in message and "at least 32" in message, message


def test_instances_with_other_definitions_of_an_entry_both_log_it_and_leave_at_close(
        sqlite_url, namespace, harnesses, caplog):
    a = make(harnesses, sqlite_url, namespace, {"e": (10, {"jitter": 0, "max_late": 30})},
             instance="A", sync_s=1)
    b = make(harnesses, sqlite_url, namespace, {"e": (10, {"jitter": 0})}, instance="B",
             backdate=False, sync_s=1)
    with caplog.at_level(logging.ERROR, "celery_anarchon"):
        a.engine.tick()
        b.engine.tick()                          # B finds A at start-up
        a.sync()                                 # A finds B at its next heartbeat
        b.sync()                                 # the same disagreement: not logged again
    errors = [r.getMessage() for r in caplog.records
              if r.getMessage().startswith("anarchon: instances disagree on entry 'e'")]
    assert len(errors) == 2, errors
    for message in errors:
        assert a.plans["e"].definition in message and b.plans["e"].definition in message
        assert host_pid() in message
    assert {i.instance_id for i in a.store.instances.instances()} == {"A", "B"}
    a.engine.close()
    assert {i.instance_id for i in b.store.instances.instances()} == {"B"}


def test_on_a_store_without_entries_the_heartbeat_alone_is_written_every_sync_interval(
        namespace, harnesses, caplog, tmp_path):
    url = store_url("nats", str(tmp_path))         # an instance store that keeps no entries
    a = make(harnesses, url, namespace, {"e": (10, {"jitter": 0, "max_late": 30})},
             instance="A", sync_s=1)
    b = make(harnesses, url, namespace, {"e": (10, {"jitter": 0})}, instance="B",
             backdate=False, sync_s=1)
    assert a.engine.sync is None and a.engine.heartbeat is not None
    with caplog.at_level(logging.ERROR, "celery_anarchon"):
        a.engine.tick()
        b.engine.tick()                          # B finds A at start-up
        a.engine.tick()                          # within the interval: no second heartbeat
        assert a.engine.heartbeat.reported == frozenset(), "A has not looked again yet"
        a.sync()                                 # A finds B at its next heartbeat
    errors = [r.getMessage() for r in caplog.records
              if r.getMessage().startswith("anarchon: instances disagree on entry 'e'")]
    assert len(errors) == 2, errors
    records = {i.instance_id: i for i in b.store.instances.instances()}
    assert set(records) == {"A", "B"}
    mine = records["A"]
    assert f"{mine.host}:{mine.pid}" == host_pid() and mine.entries == 1
    assert mine.expires_ms - mine.seen_ms == 3_000, "three sync intervals, on the server's clock"
    a.engine.close()
    assert {i.instance_id for i in b.store.instances.instances()} == {"B"}


def test_a_store_error_while_syncing_backs_off_and_never_stops_beat(sqlite_url, namespace,
                                                                   harnesses, caplog):
    h = make(harnesses, sqlite_url, namespace, {"cfg": (3600, {"jitter": 0})}, sync_s=1)
    load, failures = h.store.entries.load_entries, [StoreUnavailable("database is locked")]

    def flaky():
        if failures:
            raise failures.pop()
        return load()
    h.store.entries.load_entries = flaky
    h.store.entries.put_entry("s", _definition(jitter=0, max_late=10), by="test", create=True)
    with caplog.at_level(logging.ERROR, "celery_anarchon"):
        assert 0 < h.engine.tick() <= 60
    assert "s" not in h.engine.plans
    assert any("unreachable while syncing the store's entries" in r.getMessage()
               for r in caplog.records)
    wait_until(lambda: (h.engine.tick(), "s" in h.engine.plans)[1], 5,
               "the sync after the backoff", interval=0.05)


# -- leased runs: run-now requests, pauses, takeovers' history (every lease store) ----------------

@pytest.fixture(params=LEASE_STORES)
def lease_url(request, tmp_path):
    return store_url(request.param, str(tmp_path))


def test_a_run_now_request_of_a_leased_entry_runs_though_newer_slots_were_claimed(
        lease_url, namespace, harnesses):
    """A leased entry every 2 s, the sync every 3 s: the request's slot (the store's clock when
    it was made) is older than the scheduled slot claimed before the sync saw it. It is its own
    run: claimed and sent, never refused as superseded."""
    lease = {"duration": 6, "heartbeat": 1, "queue_timeout": 4, "overlap": "allow"}
    h = make(harnesses, lease_url, namespace, {"e": (2, {"jitter": 0, "max_late": 5, "lease": lease})},
             sync_s=3)
    h.engine.tick()                                     # the start-up slot, and the first sync
    slot = request_run(h.store, "e", "r1").slot_ms
    h.advance(2.0)
    h.engine.tick()                                     # the next scheduled slot, newer than it
    assert max(s for _, s, _ in h.sent) > slot, h.sent
    h.sync(3.0)
    assert ("e", slot, 1) in h.sent, (h.sent, h.history("e").get(slot))
    assert h.engine.stats["claim_superseded"] == 0
    assert h.store.leases.inspect("e", slot).state is RunState.QUEUED


@pytest.mark.parametrize("kind", ["redis-stream-id", "redis-script", "redis-idmp"])
def test_a_run_now_request_runs_though_newer_slots_were_claimed_on_every_redis_strategy(
        kind, tmp_path, namespace, harnesses):
    """The same on the Redis strategies without leases (stream-id: scheduled ids only grow):
    the request's run is claimed and sent though a newer scheduled slot was claimed before the
    sync saw it, never refused as superseded, and the scheduled slots after it still run."""
    h = make(harnesses, store_url(kind, str(tmp_path)), namespace,
             {"e": (2, {"jitter": 0, "max_late": 5})}, sync_s=3,
             store_options=VARIANT_OPTIONS[kind])
    h.engine.tick()                                     # the start-up slot, and the first sync
    slot = request_run(h.store, "e", "r1").slot_ms
    h.advance(2.0)
    h.engine.tick()                                     # the next scheduled slot, newer than it
    newer = max(s for _, s, _ in h.sent)
    assert newer > slot, h.sent
    h.sync(3.0)
    assert ("e", slot, 1) in h.sent, (h.sent, h.history("e").get(slot))
    assert h.engine.stats["claim_superseded"] == 0
    h.advance(2.0)
    h.engine.tick()
    assert max(s for _, s, _ in h.sent) > newer, "the schedule goes on after the request's run"
    assert RunEvent.SUPERSEDED not in {r.event for r in h.history("e").values()}


def test_a_leased_run_claimed_before_a_pause_is_not_taken_over_while_paused(
        lease_url, namespace, harnesses, caplog):
    # the queue deadline is long enough that the first tick's own takeover check never passes it
    # on a slow machine, and max_late outlasts a slow set-up: only the pause may stop the takeover
    lease = {"duration": 6, "heartbeat": 1, "queue_timeout": 3}
    anchor = int(time.time() - 1) % 3600                       # the start-up slot: 1 s ago
    h = make(harnesses, lease_url, namespace,
             {"e": (3600, {"jitter": 0, "max_late": 60, "anchor": anchor, "lease": lease})})
    h.engine.tick()
    (_, slot, _), = h.sent                                     # no worker adopts it
    pause = h.store.entries.set_pause("e", Pause("migration", "ops", 0), by="ops").pause
    wait_until(lambda: h.store.leases.expired_runs(["e"]), lease["queue_timeout"] + 10,
               "the queue deadline")
    with caplog.at_level(logging.WARNING, "celery_anarchon"):
        h.engine.takeovers.check(h.engine.plans)
    assert h.sent == [("e", slot, 1)], "not sent again while paused"
    assert h.engine.stats["takeover_paused"] == 1
    assert h.store.leases.inspect("e", slot).state is RunState.PAUSED
    record = h.history("e")[slot]
    assert (record.event, record.detail) == (RunEvent.PAUSED, pause.describe()), record
    assert any("not taken over: the entry is paused" in r.getMessage() for r in caplog.records)
    h.store.entries.set_pause("e", None, by="ops")
    h.advance(2.0)
    h.engine.takeovers.check(h.engine.plans)
    assert h.sent == [("e", slot, 1)], "not caught up after the resume"


def test_a_taken_over_run_records_the_new_attempts_task_id_and_the_dead_attempt(
        lease_url, namespace, harnesses):
    lease = {"duration": 6, "heartbeat": 1, "queue_timeout": 4}
    anchor = int(time.time() - 1) % 3600
    tasks = []
    h = make(harnesses, lease_url, namespace,
             {"e": (3600, {"jitter": 0, "max_late": 5, "anchor": anchor, "lease": lease})},
             send=lambda plan, slot, attempt, token, task_id: tasks.append((attempt, task_id)))
    h.engine.tick()
    h.engine.tick()                                             # its send note
    (_, slot), = [(1, s) for s in h.history("e")]
    adopted, _ = h.store.leases.adopt("e", slot, "runner", 50)        # a lease of 50 ms, never renewed
    assert adopted
    wait_until(lambda: h.store.leases.expired_runs(["e"]), 5, "the lease to run out")
    h.advance(3.5)
    h.engine.takeovers.check(h.engine.plans)
    h.engine.tick()
    assert [a for a, _ in tasks] == [1, 2], tasks
    record = h.history("e")[slot]
    assert (record.event, record.attempt, record.task_id) == (RunEvent.SENT, 2, tasks[1][1]), record
    assert [(e.event, e.attempt, e.task_id) for e in record.earlier] == [
        (RunEvent.STARTED, 1, tasks[0][1]), (RunEvent.TAKEN_OVER, 2, tasks[1][1])], record.earlier
