"""The store contract of leased runs in three corners, proved against every lease store on its
real server: a run-now request's run (never superseded by the entry's scheduled slots, nor
superseding them), a pause (it stops takeovers and adoptions of runs not started yet) and the
history of a run taken over (the dead attempt, the takeover and the new attempt's task id)."""
from __future__ import annotations

import dataclasses

from celery_anarchon.stores.base import (
    HistoryRecord, LeaseTerms, Outcome, RunEvent, RunState, TakeoverOutcome,
)
from celery_anarchon.stores.entry_store import Pause

from stores_support import wait_until
from helpers import prepared
from claim_helpers import LEASE, fresh_slot, lease_stores, req  # noqa: F401  (fixture)

SHORT = LeaseTerms(queue_timeout_ms=200)
SHORT_ALLOW = LeaseTerms(queue_timeout_ms=200, overlap_allowed=True)
ALLOW = LeaseTerms(queue_timeout_ms=60_000, overlap_allowed=True)


def requested(entry, slot_ms, *, lease=LEASE):
    """The claim of a run-now request's run."""
    return dataclasses.replace(req(entry, slot_ms, lease=lease), requested=True)


def expired(store, slot, what="the lease to run out"):
    return wait_until(lambda: [r for r in store.leases.expired_runs(["e"]) if r.slot_ms == slot], 10,
                      what)[0]


def record_of(store, slot) -> HistoryRecord:
    return {h.slot_ms: h for h in store.history.read("e")}[slot]


# -- run-now requests ---------------------------------------------------------------------------

def test_a_run_now_claim_is_never_superseded_by_a_newer_scheduled_slot(lease_stores):
    """A request's slot is the store's clock when it was made; the instances claim it at their
    next sync, after newer scheduled slots of a short interval were claimed: it runs all the same
    (it is its own run, not a slot of the schedule)."""
    a, worker = prepared(lease_stores("A")), lease_stores("worker")
    slot = fresh_slot(a)
    request_slot = slot - 1500
    assert a.claim([req("e", slot, lease=LEASE)])[0].outcome is Outcome.WON
    _, run = worker.leases.adopt("e", slot, "w1", 30_000)
    assert worker.leases.release("e", slot, run.token)
    won = a.claim([requested("e", request_slot)])[0]
    assert won.outcome is Outcome.WON, won
    assert a.leases.inspect("e", request_slot).state is RunState.QUEUED
    # its takeover is not superseded by the newer scheduled slot either
    b = lease_stores("B")
    assert b.claim([requested("e", request_slot - 10, lease=SHORT_ALLOW)])[0].outcome is Outcome.WON
    dead = expired(b, request_slot - 10, "the request's queue deadline")
    outcome, new = b.leases.take_over("e", request_slot - 10, dead.token, queue_timeout_ms=60_000,
                               max_attempts=3, task_id="t-2")
    assert outcome is TakeoverOutcome.TAKEN and new.attempt == 2, outcome


def test_a_run_now_claim_never_supersedes_the_scheduled_runs(lease_stores):
    """A requested run's claim neither supersedes a dead scheduled run (it is still taken over)
    nor makes an older scheduled slot, claimed after it, superseded."""
    a, b, worker = prepared(lease_stores("A")), lease_stores("B"), lease_stores("worker")
    slot = fresh_slot(a) - 3000
    a.claim([req("e", slot, lease=LEASE)])
    _, run = worker.leases.adopt("e", slot, "w1", 200)
    dead = expired(a, slot)
    assert a.claim([requested("e", slot + 2000, lease=ALLOW)])[0].outcome is Outcome.WON
    assert a.leases.inspect("e", slot).state is RunState.STARTED, "the dead scheduled run is not superseded"
    outcome, new = b.leases.take_over("e", slot, dead.token, queue_timeout_ms=60_000, max_attempts=3,
                               task_id="t-2")
    assert outcome is TakeoverOutcome.TAKEN, outcome
    # an older scheduled slot claimed after the request (its jitter, its sync) runs too
    between = a.claim([req("e", slot + 1000, lease=ALLOW)])[0]
    assert between.outcome is Outcome.WON, between


def test_the_overlap_rule_still_skips_a_run_now_request_and_says_so(lease_stores):
    a = prepared(lease_stores("A"))
    slot = fresh_slot(a)
    assert a.claim([req("e", slot, lease=LEASE)])[0].outcome is Outcome.WON
    skipped = a.claim([requested("e", slot - 500)])[0]      # alive: even a later scheduled run
    assert skipped.outcome is Outcome.OVERLAPPING, skipped
    assert "run-now" in skipped.detail, skipped.detail
    rec = record_of(a, slot - 500)
    assert rec.event is RunEvent.OVERLAPPING and "run-now" in rec.detail, rec
    # a live requested run makes a scheduled slot overlapping, whatever their order
    other = lease_stores("other")
    other.prepare(["f"])
    from backends import backdate_memory_start
    backdate_memory_start(other, ["f"], 120_000)
    assert other.claim([dataclasses.replace(req("f", slot + 500, lease=LEASE), requested=True)]
                       )[0].outcome is Outcome.WON
    assert other.claim([req("f", slot, lease=LEASE)])[0].outcome is Outcome.OVERLAPPING


# -- pauses ---------------------------------------------------------------------------------------

def test_a_takeover_of_a_paused_entry_answers_paused_and_ends_the_run(lease_stores):
    a, b, worker = prepared(lease_stores("A")), lease_stores("B"), lease_stores("worker")
    slot = fresh_slot(a)
    a.claim([req("e", slot, lease=LEASE)])
    _, run = worker.leases.adopt("e", slot, "w1", 200)
    pause = a.entries.set_pause("e", Pause("migration", "alice", 0), by="alice").pause
    dead = expired(b, slot)
    outcome, after = b.leases.take_over("e", slot, dead.token, queue_timeout_ms=60_000, max_attempts=3,
                                 task_id="t-2")
    assert outcome is TakeoverOutcome.PAUSED, outcome
    assert after.state is RunState.PAUSED and after.attempt == 1
    rec = record_of(a, slot)
    assert (rec.event, rec.attempt, rec.detail) == (RunEvent.PAUSED, 1, pause.describe()), rec
    # the run ended: not taken over after the resume, and its runner learns it lost its lease
    a.entries.set_pause("e", None, by="alice")
    assert not [r for r in a.leases.expired_runs(["e"]) if r.slot_ms == slot]
    assert b.leases.take_over("e", slot, dead.token, queue_timeout_ms=60_000, max_attempts=3,
                       task_id="t-2")[0] is TakeoverOutcome.REFUSED
    assert worker.leases.renew("e", slot, run.token, "w1", 30_000) is None
    assert record_of(a, slot).event is RunEvent.PAUSED, "recorded once"


def test_a_queued_run_of_a_paused_entry_is_never_adopted(lease_stores):
    a, worker = prepared(lease_stores("A")), lease_stores("worker")
    slot = fresh_slot(a)
    a.claim([req("e", slot, lease=LEASE)])
    pause = a.entries.set_pause("e", Pause("", "bob", 0), by="bob").pause
    adopted, run = worker.leases.adopt("e", slot, "w1", 30_000)
    assert not adopted and run.state is RunState.PAUSED, run
    rec = record_of(a, slot)
    assert (rec.event, rec.detail) == (RunEvent.PAUSED, pause.describe()), rec
    a.entries.set_pause("e", None, by="bob")
    assert not worker.leases.adopt("e", slot, "w1", 30_000)[0], "not caught up after the resume"
    assert not a.leases.expired_runs(["e"])


def test_a_pause_never_stops_a_started_run(lease_stores):
    a, worker = prepared(lease_stores("A")), lease_stores("worker")
    slot = fresh_slot(a)
    a.claim([req("e", slot, lease=LEASE)])
    _, run = worker.leases.adopt("e", slot, "w1", 30_000)
    a.entries.set_pause("e", Pause("", "bob", 0), by="bob")
    assert worker.leases.renew("e", slot, run.token, "w1", 30_000) is not None
    assert worker.leases.release("e", slot, run.token)
    assert a.leases.inspect("e", slot).state is RunState.FINISHED
    assert record_of(a, slot).event is RunEvent.FINISHED


# -- the history of a run taken over -----------------------------------------------------------

def test_a_taken_over_run_keeps_its_dead_attempt_and_the_takeover_in_history(lease_stores):
    a, b, worker = prepared(lease_stores("A")), lease_stores("B"), lease_stores("worker")
    slot = fresh_slot(a)
    first = a.claim([req("e", slot, lease=LEASE)])[0].request.task_id
    a.history.record("e", slot, RunEvent.SENT, task_id=first)
    _, run = worker.leases.adopt("e", slot, "w1", 200)
    dead = expired(b, slot)
    assert b.leases.take_over("e", slot, dead.token, queue_timeout_ms=60_000, max_attempts=3,
                       task_id="t-2")[0] is TakeoverOutcome.TAKEN
    rec = record_of(a, slot)
    assert (rec.event, rec.attempt, rec.task_id, rec.instance) == (
        RunEvent.TAKEN_OVER, 2, "t-2", "B"), rec
    assert [(e.event, e.attempt, e.task_id) for e in rec.earlier] == [
        (RunEvent.STARTED, 1, first)], rec.earlier
    # the new attempt's worker adopts it before beat's note of its send: the order rules hold
    _, second = worker.leases.adopt("e", slot, "w2", 30_000)
    b.history.record("e", slot, RunEvent.SENT, task_id="t-2", attempt=2)
    assert worker.leases.release("e", slot, second.token)
    rec = record_of(a, slot)
    assert (rec.event, rec.attempt, rec.task_id) == (RunEvent.FINISHED, 2, "t-2"), rec
    assert [(e.event, e.attempt, e.task_id) for e in rec.earlier] == [
        (RunEvent.STARTED, 1, first), (RunEvent.TAKEN_OVER, 2, "t-2")], rec.earlier
    assert a.history.read_many(["e"])["e"][0] == rec


def test_the_send_note_of_a_taken_over_attempt_keeps_the_takeover(lease_stores):
    """A queued run (never adopted) taken over; then beat's note of its send, as it comes at the
    end of the tick: the takeover stays in the run's record, and so does the dead attempt."""
    a, b = prepared(lease_stores("A")), lease_stores("B")
    slot = fresh_slot(a)
    a.claim([req("e", slot, lease=SHORT)])
    a.history.record_many([HistoryRecord("e", slot, RunEvent.SENT, task_id="t-1")])
    dead = expired(b, slot, "the queue deadline")
    b.leases.take_over("e", slot, dead.token, queue_timeout_ms=60_000, max_attempts=3, task_id="t-2")
    b.history.record_many([HistoryRecord("e", slot, RunEvent.SENT, task_id="t-2", attempt=2)])
    rec = record_of(a, slot)
    assert (rec.event, rec.attempt, rec.task_id) == (RunEvent.SENT, 2, "t-2"), rec
    assert [(e.event, e.attempt, e.task_id) for e in rec.earlier] == [
        (RunEvent.SENT, 1, "t-1"), (RunEvent.TAKEN_OVER, 2, "t-2")], rec.earlier


def test_the_attempts_of_a_run_leave_the_history_bound_per_entry_as_it_was(lease_stores):
    a = prepared(lease_stores("A", history_size=3))
    base = fresh_slot(a)
    a.claim([req("e", base, lease=LeaseTerms(queue_timeout_ms=100, overlap_allowed=True))])
    for _ in range(2):
        dead = expired(a, base, "the queue deadline")
        a.leases.take_over("e", base, dead.token, queue_timeout_ms=100, max_attempts=5,
                    task_id=f"t-{dead.attempt + 1}")
    for i in range(1, 4):
        a.claim([req("e", base + i, lease=ALLOW)])
    runs = a.history.read("e")
    assert [r.slot_ms for r in runs] == [base + 3, base + 2, base + 1]
