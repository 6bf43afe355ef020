"""The store contract, proved against every lease store on its real server.

One suite, parametrized over the backends: each test is named after the promise it proves.
"""
from __future__ import annotations

import dataclasses
import multiprocessing
import queue
import re
import threading
import time
import types
from collections import Counter

import pytest

from celery_anarchon.stores.base import (
    LATENESS_TOLERANCE_MS, HistoryRecord, LeaseTerms, Outcome, RunEvent, RunState,
    TakeoverOutcome,
)
from celery_anarchon.stores.entry_store import Entries, Instances
from celery_anarchon.stores.parts import History, Leases

from stores_support import (
    ALL_STORES, LATENESS_STORES, PROCESS_STORES, VARIANT_OPTIONS, StoreMaker, wait_until,
)
from helpers import prepared
from claim_helpers import (  # noqa: F401  (lease_stores: a fixture)
    LEASE, MAX_LATE_MS, _maker, _race, after_memory_restart, fresh_slot, lease_stores, req,
    store_now,
)


@pytest.fixture(params=ALL_STORES)
def stores(request, namespace):
    """Every store: what every backend promises."""
    yield from _maker(request.param, namespace)


@pytest.fixture(params=LATENESS_STORES)
def lateness_stores(request, namespace):
    """Stores that check lateness on their own clock and remember runs for ``memory``."""
    yield from _maker(request.param, namespace)


# -- several processes ---------------------------------------------------------------------------

def racers(kind):
    """What the racers of a store run in: processes (fork), or threads for a store that lives in
    one process (memory://), with the same Barrier, Queue and Process (start, join)."""
    if kind in PROCESS_STORES:
        return multiprocessing.get_context("fork")
    return types.SimpleNamespace(Barrier=threading.Barrier, Queue=queue.Queue,
                                 Process=threading.Thread)


#: stores on which an older slot is refused once a newer one is claimed (docs/design.md memory table,
#: Redis stream-id: "recorded as superseded"); their racers claim in slot order, as beat does
IN_SLOT_ORDER = ("redis-stream-id",)


def test_a_stores_capabilities_are_its_parts(stores):
    """Every store has a history and instance records; leases and entries are a part or None,
    and a store with leases checks lateness on its own clock."""
    store = stores("A")
    assert isinstance(store.history, History) and isinstance(store.instances, Instances)
    assert store.leases is None or isinstance(store.leases, Leases)
    assert store.entries is None or isinstance(store.entries, Entries)
    assert store.holds_leases is (store.leases is not None)
    assert store.checks_lateness or store.leases is None


def test_one_winner_per_run_across_processes(stores):
    """Several processes claiming the same runs at once: exactly one winner per run."""
    first = prepared(stores("setup"), "a", "b", "c")
    base = fresh_slot(first) + 500
    runs = [(entry, base + i) for entry in ("a", "b", "c") for i in range(100)]
    ctx = racers(stores.kind)
    barrier, answers = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(stores.url, stores.namespace, f"proc-{n}", runs,
                                             barrier, answers, batch,
                                             VARIANT_OPTIONS.get(stores.kind, {}),
                                             stores.kind in IN_SLOT_ORDER))
             for n, batch in enumerate((1, 7, 50))]
    for p in procs:
        p.start()
    reports = [answers.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    errors = [err for _, _, err in reports if err]
    assert not errors, errors
    winners = Counter(run for _, won, _ in reports for run in won)
    assert set(winners) == set(runs), f"{len(set(runs) - set(winners))} runs got no winner"
    assert max(winners.values()) == 1, [run for run, n in winners.items() if n > 1][:5]


# -- who won --------------------------------------------------------------------------------------

def test_winner_is_recognised_on_retry(stores):
    """A claim retried by its winner (after a timeout, say) is WON again; others see LOST and
    learn who won and with which definition."""
    a, b = prepared(stores("A")), stores("B")
    slot = fresh_slot(a)
    assert a.claim([req("e", slot)])[0].outcome is Outcome.WON
    again = a.claim([req("e", slot)])[0]
    other = b.claim([req("e", slot, fingerprint="fp2")])[0]
    if not a.recognises_winner:
        # the store cannot read the winner back: an unknown outcome is a loss, never a win
        assert again.outcome in (Outcome.UNKNOWN, Outcome.OTHER_WON)
        assert other.outcome in (Outcome.UNKNOWN, Outcome.OTHER_WON)
        return
    assert again.outcome is Outcome.WON and again.winner == "A"
    assert other.outcome is Outcome.OTHER_WON
    assert other.winner == "A" and other.winner_fingerprint == "fp1"


def test_a_run_now_claim_is_its_own_run_whatever_the_scheduled_slots(stores):
    """A run-now request's claim (``requested``) has a slot of its own, the store's clock when it
    was made: it is won once though a newer scheduled slot was claimed before it (never refused as
    superseded), and, newer than the scheduled slots, it supersedes none of them (stream-id:
    scheduled ids only grow, yet a run-now run moves no id). One (entry, slot) is one run,
    whichever kind claims it."""
    a, b = prepared(stores("A")), stores("B")
    now = fresh_slot(a)
    assert a.claim([req("e", now)])[0].outcome is Outcome.WON            # scheduled, newer
    request = dataclasses.replace(req("e", now - 500), requested=True)
    first = a.claim([request])[0]
    assert first.outcome is Outcome.WON, first
    later = b.claim([dataclasses.replace(req("e", now + 1000), requested=True)])[0]
    assert later.outcome is Outcome.WON, later
    scheduled = b.claim([req("e", now + 500)])[0]
    assert scheduled.outcome is Outcome.WON, "a run-now run supersedes no scheduled slot"
    other = b.claim([request])[0]
    same_run = a.claim([dataclasses.replace(req("e", now + 500), requested=True)])[0]
    assert RunEvent.SUPERSEDED not in {h.event for h in a.history.read("e")}, a.history.read("e")
    if not a.recognises_winner:
        assert other.outcome in (Outcome.UNKNOWN, Outcome.OTHER_WON)
        assert same_run.outcome in (Outcome.UNKNOWN, Outcome.OTHER_WON)
        return
    assert (other.outcome, other.winner) == (Outcome.OTHER_WON, "A"), other
    assert a.claim([request])[0].outcome is Outcome.WON, "the winner's retry reads its win back"
    assert (same_run.outcome, same_run.winner) == (Outcome.OTHER_WON, "B"), same_run


def test_claim_batch_answers_in_request_order(stores):
    a, b = prepared(stores("A"), "x", "y"), stores("B")
    now = fresh_slot(a)
    a.claim([req("x", now)])
    requests = [req("y", now), req("x", now), req("x", now + 1000)]
    if a.checks_lateness:
        requests.append(req("y", now - MAX_LATE_MS - 30_000))
    results = b.claim(requests)
    assert [r.request for r in results] == requests
    assert [r.outcome for r in results][:3] == [Outcome.WON, Outcome.OTHER_WON, Outcome.WON]
    if a.checks_lateness:
        assert results[3].outcome is Outcome.LATE


def test_namespaces_never_collide(stores):
    a = prepared(stores("A"))
    other_ns = StoreMaker(stores.kind, stores.url, stores.namespace + "-other")
    b = prepared(other_ns("B"))
    slot = fresh_slot(a)
    try:
        assert a.claim([req("e", slot)])[0].outcome is Outcome.WON
        assert b.claim([req("e", slot)])[0].outcome is Outcome.WON
    finally:
        other_ns.close_all()


@pytest.mark.parametrize("names", [("a:b", "a"), ("x}", "{x"), ("it's", 'say "hi"'),
                                   ("with space", "with_space"), ("café", "cafe"), ("%3A", ":")])
def test_entry_names_never_collide(stores, names):
    """Names with ':', braces, quotes, spaces or non-ASCII map to their own runs."""
    a = prepared(stores("A"), *names)
    slot = fresh_slot(a)
    results = a.claim([req(names[0], slot), req(names[1], slot)])
    assert [r.outcome for r in results] == [Outcome.WON, Outcome.WON]
    a.history.record(names[0], slot, RunEvent.SENT, task_id="t0")
    assert [h.entry for h in a.history.read(names[0])] == [names[0]]
    assert a.history.read(names[1])[0].event is RunEvent.CLAIMED


# -- the store's clock ------------------------------------------------------------------------------

def test_store_clock_is_close_to_ours(stores):
    store = stores("A")
    if store.now_ms() is None:
        pytest.skip(f"the {store.kind} store has no clock")
    assert abs(store_now(store) - time.time() * 1000) < 2000


def test_late_claim_refused_on_store_clock(lateness_stores):
    """A claim whose slot is older than max_late + 10 s on the store's clock is refused as late,
    one more than 10 s ahead as early; within both it is won. The slot is offset, not the clock."""
    a = prepared(lateness_stores("A"))
    now = store_now(a)
    max_late = 500
    assert a.claim([req("e", now - max_late - LATENESS_TOLERANCE_MS + 1000, max_late_ms=max_late)])[0].outcome is Outcome.WON
    late = a.claim([req("e", now - max_late - LATENESS_TOLERANCE_MS - 1000, max_late_ms=max_late)])[0]
    assert late.outcome is Outcome.LATE
    early = a.claim([req("e", now + LATENESS_TOLERANCE_MS + 2000)])[0]
    assert early.outcome is Outcome.EARLY
    assert a.claim([req("e", now + LATENESS_TOLERANCE_MS - 2000)])[0].outcome is Outcome.WON
    events = {h.slot_ms: h.event for h in a.history.read("e")}
    assert events[now - max_late - LATENESS_TOLERANCE_MS - 1000] is RunEvent.LATE
    assert events[now + LATENESS_TOLERANCE_MS + 2000] is RunEvent.EARLY


def test_already_claimed_is_checked_before_late(lateness_stores):
    """The history of a claimed run never says late: a late retry sees the claim first."""
    a, b = prepared(lateness_stores("A"), "e", "control"), lateness_stores("B")
    # 15 s ago on the store's clock: in time for A's max_late of 60 s, but 5 s past slot +
    # max_late + tolerance for a claim with max_late 0
    slot = store_now(a) - LATENESS_TOLERANCE_MS - 5_000
    assert a.claim([req("e", slot, max_late_ms=60_000)])[0].outcome is Outcome.WON
    # the same claim of an unclaimed run is late: so the order of the checks matters below
    assert b.claim([req("control", slot, max_late_ms=0)])[0].outcome is Outcome.LATE
    assert b.claim([req("e", slot, max_late_ms=0)])[0].outcome is Outcome.OTHER_WON
    assert a.claim([req("e", slot, max_late_ms=0)])[0].outcome is Outcome.WON
    assert a.history.read("e")[0].event is RunEvent.CLAIMED


def test_skip_is_recorded_once_not_per_instance(lateness_stores):
    a, b = prepared(lateness_stores("A")), lateness_stores("B")
    slot = store_now(a) - LATENESS_TOLERANCE_MS - 2500
    assert a.claim([req("e", slot, max_late_ms=0)])[0].outcome is Outcome.LATE
    assert b.claim([req("e", slot, max_late_ms=0)])[0].outcome is Outcome.LATE
    records = [h for h in a.history.read("e") if h.slot_ms == slot]
    assert len(records) == 1 and records[0].instance == "A"


# -- memory ------------------------------------------------------------------------------------------

def test_memory_outlasts_jitter_plus_max_late(stores):
    """A run claimed at its slot is still remembered at slot + jitter + max_late."""
    a, b = prepared(stores("A")), stores("B")
    slot = store_now(a) - MAX_LATE_MS
    assert a.claim([req("e", slot)])[0].outcome is Outcome.WON
    assert b.claim([req("e", slot, max_late_ms=MAX_LATE_MS)])[0].outcome is Outcome.OTHER_WON
    slot = fresh_slot(a)
    assert a.claim([req("e", slot)])[0].outcome is Outcome.WON
    # b claims "at slot + max_late": same slot, the store must still say LOST
    assert b.claim([req("e", slot, max_late_ms=MAX_LATE_MS)])[0].outcome is Outcome.OTHER_WON


def test_memory_outlasts_jitter_plus_max_late_on_the_store_clock(lateness_stores):
    memory_ms, max_late_ms, jitter_ms = 4_000, 1_000, 500       # jitter + max_late < memory
    a = prepared(lateness_stores("A", memory=memory_ms / 1000))
    b = lateness_stores("B", memory=memory_ms / 1000)
    # a slot already past jitter + max_late on the store's clock (a claims it late, within the
    # store's 10-s tolerance): b's claim comes at once, 2.4 s before the memory ends
    slot = store_now(a) - jitter_ms - max_late_ms - 100
    assert a.claim([req("e", slot, max_late_ms=max_late_ms)])[0].outcome is Outcome.WON
    claimed = store_now(a)                       # the claim is kept a memory past its own time
    assert b.claim([req("e", slot, max_late_ms=max_late_ms)])[0].outcome is Outcome.OTHER_WON
    wait_until(lambda: store_now(a) > claimed + memory_ms + 500, 10,
               "the memory to pass on the store's clock")
    assert b.claim([req("e", slot, max_late_ms=max_late_ms)])[0].outcome is Outcome.FORGOTTEN


def test_claim_older_than_memory_is_never_won_again(lateness_stores):
    """Past the memory a repeated claim is refused (forgotten), never won a second time. (Memory
    2 s: both claims come within it even when each transaction waits long for its fsync.)"""
    a, b = prepared(lateness_stores("A", memory=2.0)), lateness_stores("B", memory=2.0)
    slot = fresh_slot(a)
    assert a.claim([req("e", slot)])[0].outcome is Outcome.WON
    assert b.claim([req("e", slot)])[0].outcome is Outcome.OTHER_WON
    wait_until(lambda: store_now(a) > slot + 2500, 10, "the memory to pass")
    again = b.claim([req("e", slot)])[0]
    assert again.outcome is Outcome.FORGOTTEN


# -- history -------------------------------------------------------------------------------------------

def test_history_keeps_newest_runs_with_their_facts(stores):
    a = prepared(stores("A", history_size=5))
    base = fresh_slot(a)
    for i in range(8):
        slot = base + i * 10
        assert a.claim([req("e", slot)])[0].outcome is Outcome.WON
        a.history.record("e", slot, RunEvent.SENT, task_id=f"id-{i}")
    records = a.history.read("e")
    assert [r.slot_ms for r in records] == [base + i * 10 for i in range(7, 2, -1)]
    newest = records[0]
    assert newest.event is RunEvent.SENT and newest.instance == "A" and newest.task_id == "id-7"
    assert abs(newest.store_ms - store_now(a)) < 5000
    assert len(a.history.read("e", limit=2)) == 2


def test_read_many_reads_every_entry_as_read_does(stores, monkeypatch):
    """The batch read gives each entry what its own read gives, across batches (two names a
    round trip here), for names given twice, with no runs, and with a limit."""
    for module in ("redis.history", "redis.cluster", "sql.history"):
        monkeypatch.setattr(f"celery_anarchon.stores.{module}.HISTORY_BATCH", 2)
    a = prepared(stores("A", history_size=5), "e", "f", "g")
    base = fresh_slot(a)
    for entry, count in (("e", 7), ("f", 2)):
        for i in range(count):
            slot = base + i * 10
            assert a.claim([req(entry, slot)])[0].outcome is Outcome.WON
            a.history.record(entry, slot, RunEvent.SENT, task_id=f"{entry}-{i}")
    got = a.history.read_many(["e", "f", "g", "e"], limit=3)
    assert list(got) == ["e", "f", "g"]
    assert got == {"e": a.history.read("e", limit=3), "f": a.history.read("f"), "g": []}
    assert [r.task_id for r in got["e"]] == ["e-6", "e-5", "e-4"]
    assert a.history.read_many(["f", "e"]) == {"f": a.history.read("f"), "e": a.history.read("e")}
    assert len(a.history.read_many(["e"])["e"]) == 5
    assert a.history.read_many(["e", "f"], limit=0) == {"e": [], "f": []}
    assert a.history.read_many([]) == {}


def test_skip_events_never_overwrite_a_claim(stores):
    a, b = prepared(stores("A")), stores("B")
    slot = fresh_slot(a)
    a.claim([req("e", slot)])
    a.history.record("e", slot, RunEvent.SENT, task_id="x")
    b.history.record("e", slot, RunEvent.LATE_LOCAL)
    assert a.history.read("e")[0].event is RunEvent.SENT
    b.history.record("e", slot + 1, RunEvent.LATE_LOCAL, detail="paused")
    rec = a.history.read("e")[0]
    assert (rec.slot_ms, rec.event, rec.instance, rec.detail) == (slot + 1, RunEvent.LATE_LOCAL, "B", "paused")


def test_a_late_sent_note_never_hides_what_the_worker_or_a_takeover_recorded(lease_stores):
    """Beat writes its `sent` notes at the end of a tick, so a fast worker can adopt and finish
    the run first: that note must not replace `started` or `finished` of its attempt, nor a
    newer attempt's record (`taken_over`); it still replaces `claimed`."""
    a, b, worker = prepared(lease_stores("A")), lease_stores("B"), lease_stores("worker")
    slot = fresh_slot(a)
    task = a.claim([req("e", slot, lease=LEASE)])[0].request.task_id
    _, run = worker.leases.adopt("e", slot, "w1", 30_000)
    assert worker.leases.release("e", slot, run.token)
    a.history.record("e", slot, RunEvent.SENT, task_id=task)
    assert a.history.read("e")[0].event is RunEvent.FINISHED

    other = slot + 1000
    a.claim([req("e", other, lease=LeaseTerms(queue_timeout_ms=200, overlap_allowed=True))])
    a.history.record("e", other, RunEvent.SENT, task_id="t-1")
    assert {h.slot_ms: h for h in a.history.read("e")}[other].event is RunEvent.SENT, "replaces claimed"
    queued = wait_until(lambda: [r for r in b.leases.expired_runs(["e"]) if r.slot_ms == other], 10,
                        "the queue deadline")[0]
    assert b.leases.take_over("e", other, queued.token, queue_timeout_ms=60_000,
                       max_attempts=3)[0] is TakeoverOutcome.TAKEN
    a.history.record("e", other, RunEvent.SENT, task_id="t-1", attempt=1)
    record = {h.slot_ms: h for h in a.history.read("e")}[other]
    assert (record.event, record.attempt) == (RunEvent.TAKEN_OVER, 2), record
    b.history.record("e", other, RunEvent.SENT, task_id="t-2", attempt=2)
    record = {h.slot_ms: h for h in a.history.read("e")}[other]
    assert (record.event, record.attempt) == (RunEvent.SENT, 2), "its own attempt's send"
    # a tick's notes in one call, as beat writes them: the same rule for each
    third = other + 1000
    a.claim([req("e", third, lease=LeaseTerms(60_000, overlap_allowed=True))])
    a.history.record_many([HistoryRecord("e", slot, RunEvent.SENT, task_id=task),
                   HistoryRecord("e", third, RunEvent.SENT, task_id="t-3"),
                   HistoryRecord("e", third + 1, RunEvent.LATE_LOCAL)])
    events = {h.slot_ms: h.event for h in a.history.read("e")}
    assert (events[slot], events[third], events[third + 1]) == (
        RunEvent.FINISHED, RunEvent.SENT, RunEvent.LATE_LOCAL)


def test_definitions_are_kept_by_fingerprint(lease_stores):
    a, b = prepared(lease_stores("A")), lease_stores("B")
    a.history.save_definition("e", "fp1", "task=t schedule=every 1 s")
    a.history.save_definition("e", "fp1", "task=t schedule=every 1 s")
    assert b.history.load_definition("e", "fp1") == "task=t schedule=every 1 s"
    assert b.history.load_definition("e", "nope") is None


# -- amnesia -------------------------------------------------------------------------------------------

def test_store_that_forgot_refuses_old_runs(stores):
    """After the store lost its data, a claim for a run claimed before is refused as forgotten,
    not won again (docs/design.md "Amnesia")."""
    a, b = prepared(stores("A")), stores("B")
    slot = fresh_slot(a)
    assert a.claim([req("e", slot)])[0].outcome is Outcome.WON
    stores.wipe()
    again = b.claim([req("e", slot)])[0]
    assert again.outcome is Outcome.FORGOTTEN, again
    assert any(h.event is RunEvent.FORGOTTEN for h in b.history.read("e"))
    # runs after the memory began again are claimable, early ones included
    assert b.claim([req("e", after_memory_restart(b))])[0].outcome is Outcome.WON


# -- leases ---------------------------------------------------------------------------------------------

def test_leased_claim_creates_a_queued_record_with_a_token(lease_stores):
    a = prepared(lease_stores("A"))
    slot = fresh_slot(a)
    won = a.claim([req("e", slot, lease=LEASE)])[0]
    assert won.outcome is Outcome.WON and won.token and won.attempt == 1
    again = a.claim([req("e", slot, lease=LEASE)])[0]
    assert again.outcome is Outcome.WON and again.token == won.token
    run = a.leases.inspect("e", slot)
    assert run.state is RunState.QUEUED and run.attempt == 1 and run.token == won.token
    assert run.queue_deadline_ms - run.store_ms == pytest.approx(60_000, abs=2000)
    assert not run.expired


def test_lease_adopt_renew_release(lease_stores):
    a, worker = prepared(lease_stores("A")), lease_stores("worker")
    slot = fresh_slot(a)
    token0 = a.claim([req("e", slot, lease=LEASE)])[0].token
    adopted, run = worker.leases.adopt("e", slot, "w1", 30_000)
    assert adopted and run.state is RunState.STARTED and run.owner == "w1" and run.token > token0
    again, same = worker.leases.adopt("e", slot, "w2", 30_000)
    assert not again and same.owner == "w1", "a live lease is never adopted twice"
    renewed = worker.leases.renew("e", slot, run.token, "w1", 30_000)
    assert renewed and renewed.lease_expires_ms >= run.lease_expires_ms
    assert worker.leases.renew("e", slot, run.token - 1, "w1", 30_000) is None
    assert not worker.leases.release("e", slot, run.token - 1)
    assert worker.leases.release("e", slot, run.token)
    assert a.leases.inspect("e", slot).state is RunState.FINISHED
    assert not worker.leases.adopt("e", slot, "w3", 30_000)[0], "a finished run is never adopted"
    assert a.history.read("e")[0].event is RunEvent.FINISHED


def test_expired_lease_is_taken_over_exactly_once(lease_stores):
    a, b, worker = prepared(lease_stores("A")), lease_stores("B"), lease_stores("worker")
    slot = fresh_slot(a)
    a.claim([req("e", slot, lease=LEASE)])
    _, run = worker.leases.adopt("e", slot, "w1", 300)
    wait_until(lambda: any(r.slot_ms == slot for r in a.leases.expired_runs(["e"])), 10, "lease expiry")
    expired = [r for r in a.leases.expired_runs(["e"]) if r.slot_ms == slot][0]
    assert expired.state is RunState.STARTED and expired.token == run.token
    outcomes = [s.leases.take_over("e", slot, expired.token, queue_timeout_ms=60_000, max_attempts=3)
                for s in (a, b)]
    taken = [o for o in outcomes if o[0] is TakeoverOutcome.TAKEN]
    assert len(taken) == 1
    new = taken[0][1]
    assert new.state is RunState.QUEUED and new.attempt == 2 and new.token > run.token
    # the paused old runner learns it lost the lease, and cannot extend the new one
    assert worker.leases.renew("e", slot, run.token, "w1", 30_000) is None
    assert not worker.leases.release("e", slot, run.token)
    assert a.leases.inspect("e", slot).token == new.token
    # the new attempt's message adopts it
    adopted, run2 = worker.leases.adopt("e", slot, "w2", 30_000)
    assert adopted and run2.attempt == 2 and run2.token > new.token


def test_queued_run_past_its_deadline_is_taken_over(lease_stores):
    a, b = prepared(lease_stores("A")), lease_stores("B")
    slot = fresh_slot(a)
    a.claim([req("e", slot, lease=LeaseTerms(queue_timeout_ms=200))])
    wait_until(lambda: a.leases.expired_runs(["e"]), 10, "queue deadline")
    run = a.leases.expired_runs(["e"])[0]
    assert run.state is RunState.QUEUED
    outcome, new = a.leases.take_over("e", slot, run.token, queue_timeout_ms=60_000, max_attempts=3)
    assert outcome is TakeoverOutcome.TAKEN and new.attempt == 2
    # another instance with the old token is refused (A's own retry is TAKEN again: spec point 8)
    assert b.leases.take_over("e", slot, run.token, queue_timeout_ms=60_000, max_attempts=3)[0] is TakeoverOutcome.REFUSED


def test_run_is_lost_after_max_attempts(lease_stores):
    a = prepared(lease_stores("A"))
    slot = fresh_slot(a)
    a.claim([req("e", slot, lease=LeaseTerms(queue_timeout_ms=100))])
    outcome = None
    for _ in range(5):
        run = wait_until(lambda: a.leases.expired_runs(["e"]), 10, "queue deadline")[0]
        outcome, new = a.leases.take_over("e", slot, run.token, queue_timeout_ms=100, max_attempts=2)
        if outcome is not TakeoverOutcome.TAKEN:
            break
    assert outcome is TakeoverOutcome.GIVEN_UP
    assert a.leases.inspect("e", slot).state is RunState.GIVEN_UP
    assert a.history.read("e")[0].event is RunEvent.GIVEN_UP


def test_overlap_skip_and_allow(lease_stores):
    a = prepared(lease_stores("A"))
    slot = fresh_slot(a)
    assert a.claim([req("e", slot, lease=LEASE)])[0].outcome is Outcome.WON
    skipped = a.claim([req("e", slot + 1000, lease=LEASE)])[0]
    assert skipped.outcome is Outcome.OVERLAPPING
    assert {h.slot_ms: h.event for h in a.history.read("e")}[slot + 1000] is RunEvent.OVERLAPPING
    allowed = a.claim([req("e", slot + 2000, lease=LeaseTerms(60_000, overlap_allowed=True))])[0]
    assert allowed.outcome is Outcome.WON
    assert a.leases.inspect("e", slot).state is RunState.QUEUED, "a live earlier run is not superseded"


def test_newer_slot_supersedes_a_dead_run(lease_stores):
    a, worker = prepared(lease_stores("A")), lease_stores("worker")
    slot = fresh_slot(a)
    a.claim([req("e", slot, lease=LEASE)])
    _, run = worker.leases.adopt("e", slot, "w1", 200)
    wait_until(lambda: a.leases.expired_runs(["e"]), 10, "lease expiry")
    assert a.claim([req("e", slot + 1000, lease=LEASE)])[0].outcome is Outcome.WON
    assert a.leases.inspect("e", slot).state is RunState.SUPERSEDED
    assert worker.leases.renew("e", slot, run.token, "w1", 30_000) is None


def test_take_over_is_superseded_by_a_newer_claimed_slot(lease_stores):
    a = prepared(lease_stores("A"))
    slot = fresh_slot(a)
    a.claim([req("e", slot, lease=LeaseTerms(queue_timeout_ms=200))])
    a.claim([req("e", slot + 1000, lease=LeaseTerms(60_000, overlap_allowed=True))])
    run = wait_until(lambda: [r for r in a.leases.expired_runs(["e"]) if r.slot_ms == slot], 10, "deadline")[0]
    outcome, _ = a.leases.take_over("e", slot, run.token, queue_timeout_ms=60_000, max_attempts=3)
    assert outcome is TakeoverOutcome.SUPERSEDED
    assert a.leases.inspect("e", slot).state is RunState.SUPERSEDED


def test_requeue_keeps_the_attempt_and_moves_the_deadline(lease_stores):
    a, worker = prepared(lease_stores("A")), lease_stores("worker")
    slot = fresh_slot(a)
    a.claim([req("e", slot, lease=LEASE)])
    _, run = worker.leases.adopt("e", slot, "w1", 1000)
    assert worker.leases.requeue("e", slot, run.token, delay_ms=120_000, queue_timeout_ms=1000)
    queued = a.leases.inspect("e", slot)
    assert queued.state is RunState.QUEUED and queued.attempt == 1
    assert queued.queue_deadline_ms - queued.store_ms == pytest.approx(121_000, abs=2000)
    assert not a.leases.expired_runs(["e"])
    adopted, again = worker.leases.adopt("e", slot, "w1", 30_000)
    assert adopted and again.attempt == 1


def test_fencing_tokens_grow_even_after_the_store_forgot(lease_stores):
    a, worker = prepared(lease_stores("A")), lease_stores("worker")
    slot = fresh_slot(a)
    first = a.claim([req("e", slot, lease=LEASE)])[0].token
    _, run = worker.leases.adopt("e", slot, "w1", 30_000)
    lease_stores.wipe()
    a2 = lease_stores("A2")
    a2.prepare(["e"])
    token = a2.claim([req("e", after_memory_restart(a2), lease=LEASE)])[0].token
    assert token > run.token > first


def test_live_runner_recreates_a_forgotten_record(lease_stores):
    a, worker = prepared(lease_stores("A")), lease_stores("worker")
    slot = fresh_slot(a)
    a.claim([req("e", slot, lease=LEASE)])
    _, run = worker.leases.adopt("e", slot, "w1", 30_000)
    lease_stores.wipe()
    renewed = worker.leases.renew("e", slot, run.token, "w1", 30_000)
    assert renewed and renewed.token == run.token and renewed.state is RunState.STARTED
    assert a.leases.inspect("e", slot).owner == "w1"


@pytest.mark.parametrize("loss", ["amnesia", "epoch"])
def test_a_release_the_store_forgot_records_the_run_finished(lease_stores, loss):
    """The store forgets a started run (it comes back empty, or from an older copy with another
    epoch) and its runner, whose body is done, releases before any heartbeat re-created the
    record: the release succeeds and records the run finished with the runner's token (history:
    finished), so the run is neither reported taken over nor, once its lease would have run out,
    given up as a possible miss; a heartbeat arriving after the release does not start it again."""
    a, b, worker = prepared(lease_stores("A")), lease_stores("B"), lease_stores("worker")
    older = lease_stores.snapshot() if loss == "epoch" else None
    slot = fresh_slot(a)
    a.claim([req("e", slot, lease=LEASE)])
    _, run = worker.leases.adopt("e", slot, "w1", 300)
    if loss == "epoch":
        lease_stores.lose_writes_since(older)
    else:
        lease_stores.wipe()
    assert worker.leases.release("e", slot, run.token), "the runner's release is not refused"
    record = b.leases.inspect("e", slot)
    assert record.state is RunState.FINISHED and record.token == run.token, record
    assert worker.leases.renew("e", slot, run.token, "w1", 300) is None, "a late heartbeat: not restarted"
    assert b.leases.inspect("e", slot).state is RunState.FINISHED
    begun = store_now(b)
    wait_until(lambda: store_now(b) > begun + 400, 5, "the runner's lease to run out")
    assert not [r for r in b.leases.expired_runs(["e"]) if r.slot_ms == slot]
    events = [h.event for h in b.history.read("e") if h.slot_ms == slot]
    assert RunEvent.FINISHED in events and RunEvent.GIVEN_UP not in events, events


def _take_over_race(url, namespace, instance_id, slot, token, barrier, queue):
    from celery_anarchon.stores import open_store
    store = open_store(url, namespace=namespace, instance_id=instance_id)
    try:
        barrier.wait(timeout=30)
        outcome, _ = store.leases.take_over("e", slot, token, queue_timeout_ms=60_000, max_attempts=5)
        queue.put(outcome.value)
    except BaseException as exc:
        queue.put(repr(exc))
    finally:
        store.close()


def test_two_processes_finding_the_same_expired_lease_take_it_over_once(lease_stores):
    a = prepared(lease_stores("A"))
    slot = fresh_slot(a)
    a.claim([req("e", slot, lease=LeaseTerms(queue_timeout_ms=100))])
    run = wait_until(lambda: a.leases.expired_runs(["e"]), 10, "deadline")[0]
    ctx = racers(lease_stores.kind)
    barrier, replies = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_take_over_race, args=(lease_stores.url, lease_stores.namespace, f"p{i}", slot,
                                                      run.token, barrier, replies)) for i in range(3)]
    for p in procs:
        p.start()
    answers = sorted(replies.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    assert answers == ["refused", "refused", "taken"]


# -- losing writes: the rules every lease store keeps (docs/design.md "Amnesia") --------------------

def test_rolling_change_of_memory_never_rewins(lease_stores):
    """memory is a store-wide setting: A runs with memory 3 s / max_late 1 s, B with 3600 s /
    60 s (each passes its own start-up rule). B is refused at prepare, naming both values, and a
    claim of A's run 3.5 s after A won it (past A's memory) is not won: answered forgotten."""
    from celery_anarchon.errors import ConfigError
    a = prepared(lease_stores("A", memory=3))
    b = lease_stores("B", memory=3600)
    slot = fresh_slot(a)
    assert a.claim([req("e", slot, max_late_ms=1000)])[0].outcome is Outcome.WON
    with pytest.raises(ConfigError) as caught:
        b.prepare(["e"])
    text = str(caught.value)
    # both values, as each side's memory: "['memory'] is 3600 s" and "recorded 'memory' = 3 s"
    # (SQL), "memory=3600s" and "memory=3s" (Redis)
    assert re.search(r"memory'?\]?(?: is |\s?=\s?)3 ?s\b", text), text
    assert re.search(r"memory'?\]?(?: is |\s?=\s?)3600 ?s\b", text), text
    assert "same value" in text, text
    wait_until(lambda: store_now(a) > slot + 3500, 10, "A's memory to pass on the store clock")
    again = b.claim([req("e", slot)])[0]
    assert again.outcome is Outcome.FORGOTTEN, again
    assert "3600" in again.detail


def test_an_entry_new_to_a_store_with_intact_memory_is_not_refused(lease_stores):
    """The store-wide memory start covers an entry the store has never seen (it cannot have lost
    claims of it): its first run is won, not refused for 10 s as on a brand-new store."""
    a = prepared(lease_stores("A"), "e")
    assert a.claim([req("new", fresh_slot(a))])[0].outcome is Outcome.WON
    fresh = StoreMaker(lease_stores.kind, lease_stores.url, lease_stores.namespace + "-new")
    try:
        brand_new = fresh("B")
        brand_new.prepare(["e"])
        assert brand_new.claim([req("e", fresh_slot(brand_new))])[0].outcome is Outcome.FORGOTTEN
    finally:
        fresh.close_all()


def test_a_retried_claim_answers_won_only_for_its_own_attempt(lease_stores):
    """queue_timeout below max_late: A's claim commits but its reply is lost; B takes the unadopted
    run over as attempt 2; A's retried claim is LOST (winner B, taken over as attempt 2), never
    WON with attempt 2's token."""
    a, b = prepared(lease_stores("A")), lease_stores("B")
    slot = fresh_slot(a)
    terms = LeaseTerms(queue_timeout_ms=200)
    a.claim([req("e", slot, lease=terms)])  # its reply is "lost": A never reads it
    run = wait_until(lambda: a.leases.expired_runs(["e"]), 10, "the queue deadline")[0]
    outcome, taken = b.leases.take_over("e", slot, run.token, queue_timeout_ms=60_000, max_attempts=3)
    assert outcome is TakeoverOutcome.TAKEN and taken.attempt == 2
    again = a.claim([req("e", slot, lease=terms)])[0]
    assert again.outcome is Outcome.OTHER_WON, again
    assert again.winner == "B" and "attempt 2" in again.detail
    assert again.token != taken.token


def test_a_renewal_never_recreates_a_pruned_finished_run(lease_stores):
    """A runner paused past lease + run + memory renews after its finished record was pruned:
    the store still remembers the entry (its memory is intact), so the renewal answers None (lease
    lost) and the run is not brought back to life."""
    a, worker = prepared(lease_stores("A", memory=1)), lease_stores("worker", memory=1)
    slot = fresh_slot(a)
    a.claim([req("e", slot, lease=LEASE)])
    _, run = worker.leases.adopt("e", slot, "w1", 30_000)
    assert worker.leases.release("e", slot, run.token)
    released = store_now(a)
    wait_until(lambda: store_now(a) > released + 1500, 10, "the memory to pass")
    assert a.claim([req("e", fresh_slot(a), lease=LeaseTerms(60_000, overlap_allowed=True))])[0] \
        .outcome is Outcome.WON  # prunes what is past the memory
    assert a.leases.inspect("e", slot) is None, "the finished record was pruned"
    assert worker.leases.renew("e", slot, run.token, "w1", 30_000) is None
    assert a.leases.inspect("e", slot) is None, "the renewal did not re-create it"


def test_a_takeover_whose_reply_was_lost_is_recognised(lease_stores):
    """take_over retried with the same expected token by the instance whose takeover committed
    answers TAKEN again with the same record (its first reply was lost), not REFUSED; another
    instance is still refused."""
    a, b, c = prepared(lease_stores("A")), lease_stores("B"), lease_stores("C")
    slot = fresh_slot(a)
    a.claim([req("e", slot, lease=LeaseTerms(queue_timeout_ms=200))])
    run = wait_until(lambda: a.leases.expired_runs(["e"]), 10, "the queue deadline")[0]
    first = b.leases.take_over("e", slot, run.token, queue_timeout_ms=60_000, max_attempts=3)
    assert first[0] is TakeoverOutcome.TAKEN
    again = b.leases.take_over("e", slot, run.token, queue_timeout_ms=60_000, max_attempts=3)
    assert again[0] is TakeoverOutcome.TAKEN, again
    assert (again[1].token, again[1].attempt) == (first[1].token, 2)
    assert c.leases.take_over("e", slot, run.token, queue_timeout_ms=60_000,
                       max_attempts=3)[0] is TakeoverOutcome.REFUSED


# -- lease records the store may have lost writes to (an epoch change, amnesia) -----------------

def _expired_run(store, slot):
    return wait_until(lambda: [r for r in store.leases.expired_runs(["e"]) if r.slot_ms == slot], 10,
                      "the run to show expired")[0]


def _refused_takeover(store, other, slot, run):
    """take_over of ``run`` by ``store`` is refused for good: the record becomes lost, its history
    says why (once), expired_runs no longer returns it and a second takeover is refused."""
    outcome, record = store.leases.take_over("e", slot, run.token, queue_timeout_ms=60_000, max_attempts=3)
    assert outcome is TakeoverOutcome.GIVEN_UP, (outcome, record)
    assert record.state is RunState.GIVEN_UP and record.attempt == run.attempt
    assert not [r for r in store.leases.expired_runs(["e"]) if r.slot_ms == slot]
    assert other.leases.take_over("e", slot, run.token, queue_timeout_ms=60_000,
                           max_attempts=3)[0] is TakeoverOutcome.REFUSED
    assert other.leases.inspect("e", slot).state is RunState.GIVEN_UP
    [note] = [h for h in store.history.read("e") if h.slot_ms == slot]
    assert note.event is RunEvent.GIVEN_UP and "not taken over" in note.detail, note
    return note


def test_a_run_whose_release_the_store_lost_is_never_taken_over(lease_stores):
    """The runner adopts and releases; the store loses the release (it comes back from an older
    copy with another epoch: a promoted replica, a snapshot restart). The record says started and
    its lease expires, but the store may have lost writes to it: the run is not taken over (a
    possible miss), because its body already ran (docs/design.md "Leases": at most one body runs)."""
    a, b, worker = prepared(lease_stores("A")), lease_stores("B"), lease_stores("worker")
    slot = fresh_slot(a)
    a.claim([req("e", slot, lease=LEASE)])
    _, run = worker.leases.adopt("e", slot, "w1", 300)
    older = lease_stores.snapshot()
    assert worker.leases.release("e", slot, run.token)
    lease_stores.lose_writes_since(older)
    expired = _expired_run(b, slot)
    assert expired.state is RunState.STARTED and expired.token == run.token, "the release was lost"
    note = _refused_takeover(b, a, slot, expired)
    assert "epoch" in note.detail and "stale" in note.detail, note


def test_a_queued_run_from_before_an_epoch_change_is_never_taken_over(lease_stores):
    """A run queued (never adopted, as far as the store knows) before the epoch changed passes its
    queue deadline: its first message may still be in the broker (or its adoption was lost), so a
    takeover could run it twice: refused, and the history says so."""
    a, b = prepared(lease_stores("A")), lease_stores("B")
    slot = fresh_slot(a)
    a.claim([req("e", slot, lease=LeaseTerms(queue_timeout_ms=300))])
    lease_stores.lose_writes_since(lease_stores.snapshot())
    expired = _expired_run(b, slot)
    assert expired.state is RunState.QUEUED
    note = _refused_takeover(b, a, slot, expired)
    assert "epoch" in note.detail and "broker" in note.detail, note


def test_a_runner_recreates_its_record_after_an_epoch_change_but_is_never_taken_over(
        lease_stores):
    """The store comes back without the run (an older copy, another epoch): its live runner
    renews, re-creating the record with its token, and keeps renewing and can release. Once such
    a runner dies, its run is not taken over: the store cannot tell what it lost."""
    a, b, worker = prepared(lease_stores("A")), lease_stores("B"), lease_stores("worker")
    older = lease_stores.snapshot()
    done, dies = fresh_slot(a), fresh_slot(a) + 1000
    a.claim([req("e", done, lease=LeaseTerms(60_000, overlap_allowed=True)),
             req("e", dies, lease=LeaseTerms(60_000, overlap_allowed=True))])
    _, finishing = worker.leases.adopt("e", done, "w1", 30_000)
    _, dying = worker.leases.adopt("e", dies, "w2", 30_000)
    lease_stores.lose_writes_since(older)
    assert a.leases.inspect("e", done) is None and a.leases.inspect("e", dies) is None
    renewed = worker.leases.renew("e", done, finishing.token, "w1", 30_000)
    assert renewed and renewed.state is RunState.STARTED and renewed.token == finishing.token
    assert worker.leases.renew("e", done, finishing.token, "w1", 30_000), "it keeps renewing"
    assert worker.leases.release("e", done, finishing.token)
    assert worker.leases.renew("e", dies, dying.token, "w2", 300)
    note = _refused_takeover(b, a, dies, _expired_run(b, dies))
    assert "epoch" in note.detail, note
    assert a.leases.inspect("e", done).state is RunState.FINISHED
