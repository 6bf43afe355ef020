"""Missed slots (docs/design.md "One run, in time", step 7; celery_anarchon/beat/engine/gaps.py):
every slot that no instance claimed in time is recorded ``missed`` once, by the first instance
that can tell, bounded per entry, and counted once across instances.

The engines run against every store (real servers); the gap is made by writing
the history an earlier instance would have left, then starting engines on the real clock (the
store's), and moving only their monotonic clock past the settle time.
"""
from __future__ import annotations

import dataclasses
import logging
import time

import pytest

from celery_anarchon.beat.engine.gaps import (
    DETAIL, MAX_RECORDED, Found, claim_window_ms, summary_of,
)
from celery_anarchon.beat.engine.observe import Observer
from celery_anarchon.errors import StoreUnavailable
from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import HistoryRecord, RunEvent
from celery_anarchon.stores.entry_store import Pause, pause_span_detail, pause_span_of

from backends import kinds_whose_store
from stores_support import ALL_STORES, store_url
from engine_harness import harnesses, make  # noqa: F401  (a fixture)

#: the entry of these tests: every 2 s, no jitter, max_late 2 s
PERIOD_MS = 2_000
ENTRY = {"e": (PERIOD_MS / 1000, {"jitter": 0, "max_late": 2})}
#: past the settle time of ENTRY (its claim window), seconds of the monotonic clock
SETTLE_S = 60.0


class Missed(Observer):
    """Counts what the engine tells of missed slots."""

    def __init__(self):
        self.counts: dict[str, int] = {}

    def missed(self, entry, count):
        self.counts[entry] = self.counts.get(entry, 0) + count


#: the stores that hold pauses (an entries part)
PAUSE_STORES = kinds_whose_store(lambda store: store.entries is not None)


@pytest.fixture(params=ALL_STORES)
def url(request, tmp_path):
    return store_url(request.param, str(tmp_path))


@pytest.fixture(params=PAUSE_STORES)
def pause_url(request, tmp_path):
    return store_url(request.param, str(tmp_path))


def _ran_until(url, namespace, newest_ms: int, count: int = 10) -> None:
    """The history an earlier instance left: ``count`` slots of ENTRY sent, the newest at
    ``newest_ms``."""
    store = open_store(url, namespace=namespace, instance_id="earlier", options={})
    try:
        store.prepare(["e"])
        store.history.record_many([HistoryRecord("e", newest_ms - i * PERIOD_MS, RunEvent.SENT)
                                   for i in range(count)])
    finally:
        store.close()


def _gap_before(seconds: float) -> int:
    """The newest slot of ENTRY ``seconds`` ago (the last run before a gap), UTC ms."""
    ms = int((time.time() - seconds) * 1000)
    return ms - ms % PERIOD_MS


def _settle(h, observer=None):
    """A tick once the engine has settled (its monotonic clock moved past the settle time)."""
    if observer is not None:
        h.engine.gaps.observer = observer
    h.mono.offset += SETTLE_S
    h.engine.tick()


def _missed(h) -> dict[int, HistoryRecord]:
    return {slot: r for slot, r in h.history("e").items() if r.event is RunEvent.MISSED}


def test_a_gap_is_recorded_once_by_two_instances_and_counted_once(url, namespace, harnesses):
    last = _gap_before(40)
    _ran_until(url, namespace, last)
    a = make(harnesses, url, namespace, ENTRY, instance="A")
    b = make(harnesses, url, namespace, ENTRY, instance="B")
    seen_a, seen_b = Missed(), Missed()
    for h in (a, b):
        h.engine.tick()                             # start-up: the newest slot within max_late
    assert _missed(a) == {}                         # not settled: nothing is called missed yet
    before_ms = int(time.time() * 1000)
    _settle(a, seen_a)
    _settle(b, seen_b)
    after_ms = int(time.time() * 1000)
    missed = _missed(a)
    window = claim_window_ms(a.plans["e"])
    newest = max(missed)
    assert before_ms - window - PERIOD_MS < newest <= after_ms - window
    assert sorted(missed) == list(range(last + PERIOD_MS, newest + 1, PERIOD_MS))
    assert all(r.detail == DETAIL and r.instance in ("A", "B") for r in missed.values())
    assert seen_a.counts.get("e", 0) + seen_b.counts.get("e", 0) == len(missed)
    assert seen_a.counts["e"] == sum(r.instance == "A" for r in missed.values())
    assert a.sent and all(slot > newest for _, slot, _ in a.sent + b.sent)


def test_past_the_bound_one_record_counts_the_rest(url, namespace, harnesses, caplog):
    last = _gap_before(120)
    _ran_until(url, namespace, last)
    a = make(harnesses, url, namespace, ENTRY, instance="A")
    seen = Missed()
    a.engine.tick()
    with caplog.at_level(logging.WARNING, "celery_anarchon"):
        _settle(a, seen)
    missed = _missed(a)
    assert len(missed) == MAX_RECORDED + 1
    slots = sorted(missed)
    assert slots == list(range(last + PERIOD_MS, slots[-1] + 1, PERIOD_MS))
    rest, up_to = summary_of(missed[slots[-1]])
    assert all(summary_of(missed[slot]) is None for slot in slots[:-1])
    assert up_to == slots[-1] + rest * PERIOD_MS
    assert seen.counts == {"e": MAX_RECORDED + 1 + rest}
    assert any(r.levelno == logging.WARNING and f"e: {MAX_RECORDED + 1 + rest} slot(s) from"
               in r.getMessage() and "were missed" in r.getMessage() for r in caplog.records)
    # a later check (another instance, after the counted ones) counts nothing twice
    b = make(harnesses, url, namespace, ENTRY, instance="B")
    again = Missed()
    b.engine.tick()
    _settle(b, again)
    assert sum(again.counts.values()) == len(_missed(b)) - len(missed)
    assert all(slot > up_to for slot in set(_missed(b)) - set(missed))


def test_a_schedule_made_denser_at_a_restart_is_not_missed_back_through_the_old_one(
        url, namespace, harnesses):
    # the entry ran every 20 s for ten minutes, the last run 30 s before this restart, which
    # brings it every 2 s: the old runs' history is no record of the new slots between them
    last = _gap_before(30)
    last -= last % (10 * PERIOD_MS)
    store = open_store(url, namespace=namespace, instance_id="earlier", options={})
    try:
        store.prepare(["e"])
        store.history.record_many([HistoryRecord("e", last - i * 10 * PERIOD_MS, RunEvent.SENT)
                                   for i in range(30)])
    finally:
        store.close()
    a = make(harnesses, url, namespace, ENTRY, instance="A")
    a.engine.tick()
    _settle(a)
    missed = _missed(a)
    assert missed and min(missed) > last        # only the gap since the last run before it


def test_an_entry_with_no_history_has_no_gap(url, namespace, harnesses):
    a = make(harnesses, url, namespace, ENTRY, instance="A")
    seen = Missed()
    a.engine.tick()
    _settle(a, seen)
    assert _missed(a) == {} and seen.counts == {}


def test_a_paused_entry_is_not_checked(pause_url, namespace, harnesses):
    url = pause_url
    _ran_until(url, namespace, _gap_before(40))
    a = make(harnesses, url, namespace, ENTRY, instance="A", sync_s=1)
    a.store.entries.set_pause("e", Pause("maintenance", "ops", 0), by="ops")
    a.engine.tick()
    _settle(a)
    assert _missed(a) == {}


def test_a_held_entry_is_not_checked(url, namespace, harnesses):
    """A held plan (a disabled django-celery-beat row: EntryPlan.held) is run by nobody, paused
    or not: its slots are no gap."""
    _ran_until(url, namespace, _gap_before(40))
    a = make(harnesses, url, namespace, ENTRY, instance="A")
    a.engine.update_plans({"e": dataclasses.replace(a.plans["e"], held=True)})
    a.engine.tick()
    _settle(a)
    assert _missed(a) == {} and a.sent == []


def test_an_entry_a_settled_live_instance_runs_is_left_to_it(url, namespace, harnesses):
    _ran_until(url, namespace, _gap_before(50))   # the last run before B started, 30 s ago
    b = make(harnesses, url, namespace, ENTRY, instance="B", sync_s=1)
    b.engine.gaps.started_ms -= 30_000          # B has run (and settled) for a while
    b.engine.heartbeat.started_ms -= 30_000
    b.engine.tick()                              # B's heartbeat
    a = make(harnesses, url, namespace, ENTRY, instance="A", sync_s=1)
    seen_a, seen_b = Missed(), Missed()
    a.engine.tick()
    _settle(a, seen_a)
    assert _missed(a) == {} and seen_a.counts == {}
    _settle(b, seen_b)                           # B's own check covers the gap
    assert _missed(b) and seen_b.counts == {"e": len(_missed(b))}


def test_a_store_error_during_the_check_is_retried_and_never_stops_beat(url, namespace,
                                                                         harnesses, caplog):
    _ran_until(url, namespace, _gap_before(40))
    a = make(harnesses, url, namespace, ENTRY, instance="A")
    read, failures = a.store.history.read_many, [StoreUnavailable("database is locked")]

    def flaky(*args, **kwargs):
        if failures:
            raise failures.pop()
        return read(*args, **kwargs)
    a.store.history.read_many = flaky
    a.engine.tick()
    with caplog.at_level(logging.ERROR, "celery_anarchon"):
        _settle(a)
    assert _missed(a) == {} and not failures
    assert any("while looking for missed slots" in r.getMessage() for r in caplog.records)
    a.mono.offset += 11                          # past the longest backoff
    a.engine.tick()
    assert _missed(a)


def test_the_check_runs_again_after_an_outage(url, namespace, harnesses):
    a = make(harnesses, url, namespace, ENTRY, instance="A")
    a.engine.tick()
    _settle(a)                                   # the start-up check: no history, no gap
    _ran_until(url, namespace, _gap_before(40))  # a gap appears (as if all were down)
    _settle(a)
    assert _missed(a) == {}                      # checked once; no outage since
    a.engine.outage.failed(StoreUnavailable("gone"), "a test")
    a.engine.outage.recovered()                  # the store answers again
    a.engine.tick()
    assert _missed(a) == {}                      # not settled again yet
    _settle(a)
    assert _missed(a)


def test_found_counts_only_the_records_of_its_own_instance():
    gap = Found("e", [1000 * i for i in range(1, 30)])
    notes = gap.notes()
    assert len(notes) == MAX_RECORDED + 1
    mine = [HistoryRecord(n.entry, n.slot_ms, n.event, instance="A", detail=n.detail)
            for n in notes[:5]] + [HistoryRecord(notes[-1].entry, notes[-1].slot_ms,
                                                 RunEvent.MISSED, instance="A",
                                                 detail=notes[-1].detail)]
    theirs = [HistoryRecord(n.entry, n.slot_ms, n.event, instance="B", detail=n.detail)
              for n in notes[5:-1]]
    assert gap.mine(mine + theirs, "A") == 5 + 1 + (29 - MAX_RECORDED - 1)
    assert gap.mine(mine + theirs, "B") == MAX_RECORDED - 5


def test_instances_started_together_never_leave_the_gap_to_each_other(url, namespace, harnesses):
    """Two instances that started together a while ago check after an outage of the store: each
    has settled by now, but neither before the other started, so both check (a rule on
    "settled by now" alone would have each leave the gap to the other)."""
    _ran_until(url, namespace, _gap_before(50))   # the last run before they started, 30 s ago
    a = make(harnesses, url, namespace, ENTRY, instance="A", sync_s=1)
    b = make(harnesses, url, namespace, ENTRY, instance="B", sync_s=1)
    seen_a, seen_b = Missed(), Missed()
    for h in (a, b):
        h.engine.gaps.started_ms -= 30_000
        h.engine.heartbeat.started_ms -= 30_000
        h.engine.tick()                          # both heartbeats written
    _settle(a, seen_a)
    _settle(b, seen_b)
    missed = _missed(a)
    assert missed and seen_a.counts.get("e", 0) + seen_b.counts.get("e", 0) == len(missed)


def test_slots_of_a_pause_made_and_lifted_while_every_beat_was_down_are_not_missed(
        url, namespace, harnesses, caplog):
    """A resume records the span its pause held (:func:`~celery_anarchon.stores.entry_store.
    pause_span_detail`): an operator's pause is not a missed run, whether or not a beat ran."""
    last = _gap_before(80)
    _ran_until(url, namespace, last)
    # paused 10 s after the last run, resumed 10 s ago (within the claim window of the start)
    since, until = last + 5 * PERIOD_MS + 500, last + 35 * PERIOD_MS + 500
    store = open_store(url, namespace=namespace, instance_id="ops", options={})
    try:
        store.history.record("e", until - 500, RunEvent.PAUSED,
                             detail=pause_span_detail(Pause("upgrade", "ops", since), until))
    finally:
        store.close()
    a = make(harnesses, url, namespace, ENTRY, instance="A")
    seen = Missed()
    a.engine.tick()
    with caplog.at_level(logging.WARNING, "celery_anarchon"):
        _settle(a, seen)
    missed = sorted(_missed(a))
    assert missed == list(range(last + PERIOD_MS, since, PERIOD_MS))     # before the pause only
    assert seen.counts == {"e": len(missed)}
    paused = [r for r in a.store.history.read("e") if r.event is RunEvent.PAUSED]
    assert len(paused) == 1 and pause_span_of(paused[0]) == (since, until)
