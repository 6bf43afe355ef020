"""The engine's parts, each on its own, with injected clocks (wall and monotonic) and the memory
store on the test's clock (tests/support/engine_support.py): the heap of due runs, the claim retries, the send queue, the history notes, the outage
backoff, takeovers, skew, skip logging, definitions, counters, the sync of the store's entries and
the instance heartbeat. The whole engine against real
stores is tests/beat/test_engine.py."""
from __future__ import annotations

import collections
import contextlib
import importlib
import logging
import pkgutil
import random

import pytest

import celery_anarchon.beat.engine
from celery_anarchon._util import Memory, iso
from celery_anarchon.beat.engine.claims import ClaimRetries, claim_request
from celery_anarchon.beat.engine.counters import STATS_EVERY_S, Counters
from celery_anarchon.beat.engine.definitions import Definitions
from celery_anarchon.beat.engine.due import DueRuns
from celery_anarchon.beat.engine.instances import Heartbeat, fingerprints_digest
from celery_anarchon.beat.engine.notes import NoteBuffer
from celery_anarchon.beat.engine.outage import BACKOFF_FIRST_S, BACKOFF_MAX_S, DOWN_REPORT_EVERY_S, Outage
from celery_anarchon.beat.engine.pace import Pace
from celery_anarchon.beat.engine.sends import SEND_RETRY_S, Send, SendQueue
from celery_anarchon.beat.engine.skew import SKEW_EVERY_S, SkewCheck
from celery_anarchon.beat.engine.skips import SKIP_LOG_EVERY_S, SkipLog
from celery_anarchon.beat.engine.sync import EntrySync
from celery_anarchon.beat.engine.takeovers import TAKEOVER_RETRY_S, Takeovers, grace_s
from celery_anarchon.errors import SendOutcomeUnknown, StoreError
from celery_anarchon.stores.base import ClaimResult, Outcome, RunEvent, RunState
from celery_anarchon.stores.entry_store import InstanceRecord, Pause
from celery_anarchon.schedule.timing import LeaseSettings

import backends
from engine_support import (
    T0, ClaimsOnly, Clocks, Operator, expired_run, make_plan, memory_store, store_plans,
)

T0_MS = int(T0 * 1000)
LEASE = LeaseSettings(duration_s=6, heartbeat_s=1, queue_timeout_s=4, max_attempts=3)


class Parts:
    """The parts wired as the coordinator wires them, on fake clocks and the memory store."""

    def __init__(self, *, send=None, rng=None) -> None:
        self.clocks = Clocks()
        self.store = memory_store(self.clocks)
        self.stats: collections.Counter = collections.Counter()
        self.sent: list[tuple[str, int, int, int | None, str]] = []
        self.outage = Outage(self.store, self.clocks.mono, self.stats)
        self.notes = NoteBuffer(self.store, self.outage)
        self.skips = SkipLog(self.store, "A", self.clocks.mono, self.stats, self.notes)
        self.claims = ClaimRetries(self.store, "A", self.stats, self.notes, self.outage)
        self.due = DueRuns("ns", rng or random.Random(7), self.skips, self.claims)
        self.sends = SendQueue(send or self.record_send, self.clocks.wall, self.clocks.mono,
                               self.stats, self.notes)
        self.takeovers = Takeovers(self.store, "ns", self.clocks.mono, random.Random(7),
                                   self.stats, self.outage, self.sends)

    def record_send(self, plan, slot_ms, attempt, token, task_id):
        self.sent.append((plan.name, slot_ms, attempt, token, task_id))

    def events(self):
        return [(n.entry, n.slot_ms, n.event) for n in self.notes.pending]


@pytest.fixture
def parts():
    return Parts()


def messages(caplog, level=logging.DEBUG):
    return [r.getMessage() for r in caplog.records if r.levelno >= level]


# -- the heap of due runs ----------------------------------------------------------------------

def test_due_seeds_the_newest_slot_within_max_late(parts):
    plan = make_plan(every_s=10, max_late_s=5)
    parts.due.seed(plan, T0 + 3)                 # the slot at T0 is 3 s old: still within 5 s
    assert parts.due.next_fire() == T0
    assert [r.run for r in parts.due.pop(T0 + 3, {"e": plan})] == [("e", T0_MS)]
    assert parts.due.next_fire() == T0 + 10


def test_due_seeds_the_next_slot_when_the_last_is_past_max_late(parts):
    plan = make_plan(every_s=10, max_late_s=5)
    parts.due.seed(plan, T0 + 7)
    assert parts.due.next_fire() == T0 + 10
    assert parts.due.pop(T0 + 7, {"e": plan}) == []


def test_due_fires_at_slot_plus_jitter_drawn_from_the_rng():
    parts = Parts(rng=random.Random(3))
    plan = make_plan(every_s=10, jitter_s=2, max_late_s=5)
    parts.due.seed(plan, T0 + 0.5)
    expected = T0 + random.Random(3).uniform(0, 2)
    assert parts.due.next_fire() == pytest.approx(expected)
    assert parts.due.pop(expected - 0.001, {"e": plan}) == []
    assert [r.slot_ms for r in parts.due.pop(expected, {"e": plan})] == [T0_MS]


def test_due_skips_slots_reached_late_without_a_burst(parts, caplog):
    plan = make_plan(every_s=10, max_late_s=5)
    parts.due.seed(plan, T0)
    with caplog.at_level(logging.WARNING, "celery_anarchon"):
        due = parts.due.pop(T0 + 36, {"e": plan})   # paused 36 s: slots T0 .. T0+30 late
    assert due == []
    assert parts.stats["late_local"] == 4
    assert sorted(s for _, s, e in parts.events() if e is RunEvent.LATE_LOCAL) == [
        T0_MS, T0_MS + 10_000, T0_MS + 20_000, T0_MS + 30_000]
    assert parts.due.next_fire() == T0 + 40
    assert any("skipped as late" in m for m in messages(caplog))


def test_an_entry_whose_next_slot_is_past_the_year_9999_stops_alone(parts, caplog):
    """An interval whose anchor puts its first slot at T0 and whose period puts the next in the
    year 33658 (accepted when it was added: its next slot then was T0): its run at T0 is due,
    then it has no further run (its next slot: the year 33712), logged by name; the other entry's runs go on."""
    import dataclasses

    from celery_anarchon.schedule.slots import IntervalSlots
    far = make_plan("far", every_s=10)
    far = dataclasses.replace(far, slots=IntervalSlots(10 ** 15, T0_MS, entry="far"))
    other = make_plan("other", every_s=10)
    plans = {"far": far, "other": other}
    for plan in plans.values():
        parts.due.seed(plan, T0 - 1)
    with caplog.at_level(logging.ERROR, "celery_anarchon"):
        assert sorted(r.run for r in parts.due.pop(T0, plans)) == [("far", T0_MS), ("other", T0_MS)]
        assert [r.run for r in parts.due.pop(T0 + 10, plans)] == [("other", T0_MS + 10_000)]
    [said] = messages(caplog, logging.ERROR)
    assert said.startswith("far: no further run on this instance") and "year 33712" in said
    parts.due.seed(far, T0 + 11)                 # a re-seed (the entry changed) says it again
    assert parts.due.next_fire() == T0 + 20


def _windowed(plan, start_s=None, end_s=None):
    """``plan`` with its slots within start_at / end_at (seconds after T0)."""
    import dataclasses

    from celery_anarchon.schedule.slots.window import Window, WindowedSlots
    window = Window(None if start_s is None else T0_MS + int(start_s * 1000),
                    None if end_s is None else T0_MS + int(end_s * 1000))
    return dataclasses.replace(plan, slots=WindowedSlots(plan.name, plan.slots, window))


def test_due_waits_for_start_at_and_has_no_run_after_end_at(parts, caplog):
    plan = _windowed(make_plan(every_s=10, max_late_s=5), start_s=15, end_s=30)
    parts.due.seed(plan, T0 - 100)
    assert parts.due.next_fire() == T0 + 20, "the first slot at or after start_at"
    assert parts.due.pop(T0 + 19.9, {"e": plan}) == []
    with caplog.at_level(logging.INFO, "celery_anarchon"):
        assert [r.slot_ms for r in parts.due.pop(T0 + 20, {"e": plan})] == [T0_MS + 20_000]
        assert [r.slot_ms for r in parts.due.pop(T0 + 30, {"e": plan})] == [T0_MS + 30_000]
        assert parts.due.next_fire() is None
        assert parts.due.pop(T0 + 1000, {"e": plan}) == []
        parts.due.seed(plan, T0 + 1000)          # a re-seed of the same plan: said once
    said = [m for m in messages(caplog, logging.INFO) if "no more slots" in m]
    assert said == ["anarchon: entry e has no more slots: it ended at "
                    f"{iso(T0_MS + 30_000)} (its end_at)"]
    assert not messages(caplog, logging.ERROR)


def test_due_seeds_the_last_slot_before_end_at_while_it_is_within_max_late(parts):
    plan = _windowed(make_plan(every_s=10, max_late_s=5), end_s=30)
    parts.due.seed(plan, T0 + 33)                # T0+30, on end_at, is 3 s old
    assert [r.slot_ms for r in parts.due.pop(T0 + 33, {"e": plan})] == [T0_MS + 30_000]
    assert parts.due.next_fire() is None
    parts.due.seed(plan, T0 + 36)                # past max_late: nothing
    assert parts.due.next_fire() is None


def test_claims_waiting_whose_slot_an_update_left_out_of_the_window_are_dropped(parts):
    plan = make_plan(max_late_s=5)
    parts.claims.hold([claim_request("ns", plan, T0_MS), claim_request("ns", plan, T0_MS + 1000)])
    ended = _windowed(plan, end_s=0.5)           # the update: end_at between the two slots
    assert [r.run for r in parts.claims.due(T0 + 1.5, {"e": ended}, prepared=True)] == [
        ("e", T0_MS)]
    assert parts.events() == []


def test_due_never_repeats_a_claimed_slot_after_the_clock_went_back(parts):
    plan = make_plan(every_s=10, max_late_s=5)
    parts.due.seed(plan, T0)
    (request,) = parts.due.pop(T0, {"e": plan})
    parts.due.claimed("e", request.slot_ms)
    parts.due.forget("e")
    parts.due.seed(plan, T0 + 1)                 # re-seeded (the entry changed): the same slot
    assert parts.due.pop(T0 + 1, {"e": plan}) == []
    assert parts.due.next_fire() == T0 + 10


def test_due_reseed_never_queues_a_handled_slot_again(parts):
    """A re-seed after the entry changed queues the slot after the newest one this instance
    handled (won, unconfirmed or paused), not the newest within max_late: the store would answer
    won again to its own claim (a second send), or run a paused slot after a resume."""
    plan = make_plan(every_s=10, max_late_s=30)
    parts.due.seed(plan, T0 + 20)
    assert [r.slot_ms for r in parts.due.pop(T0 + 20, {"e": plan})] == [T0_MS + 20_000]
    parts.due.claimed("e", T0_MS + 20_000)
    changed = make_plan(every_s=10, max_late_s=31, fingerprint="f2")
    parts.due.forget("e")
    parts.due.seed(changed, T0 + 25)
    assert parts.due.next_fire() == T0 + 30
    assert parts.due.pop(T0 + 29, {"e": changed}) == []


def test_due_never_claims_a_run_now_run_as_a_scheduled_one(parts):
    plan = make_plan(every_s=10, max_late_s=5)
    parts.due.requested.add(("e", T0_MS))
    parts.due.seed(plan, T0)
    assert parts.due.pop(T0, {"e": plan}) == []
    assert parts.due.next_fire() == T0 + 10


def test_due_reseed_leaves_a_waiting_claim_in_the_retries(parts):
    plan = make_plan(every_s=10, max_late_s=5)
    parts.claims.hold([claim_request("ns", plan, T0_MS)])
    changed = make_plan(every_s=10, max_late_s=6, fingerprint="f2")
    parts.due.seed(changed, T0 + 1)
    assert parts.claims.waiting[("e", T0_MS)].fingerprint == "f2"
    assert parts.due.next_fire() == T0 + 10, "the slot after the waiting claim is queued"


def test_due_drops_removed_entries(parts):
    plan = make_plan(every_s=10)
    parts.due.seed(plan, T0)
    assert parts.due.pop(T0, {}) == []
    assert parts.due.next_fire() is None


# -- the claim retries ---------------------------------------------------------------------------

def test_claims_waiting_are_retried_only_when_the_store_may_answer(parts):
    plan = make_plan(max_late_s=5)
    parts.claims.hold([claim_request("ns", plan, T0_MS)])
    assert parts.claims.due(T0 + 1, {"e": plan}, prepared=False) == []
    parts.outage.failed(StoreError("down"), "claiming")
    assert parts.claims.due(T0 + 1, {"e": plan}, prepared=True) == [], "in the backoff"
    parts.clocks.advance(BACKOFF_FIRST_S)
    assert [r.run for r in parts.claims.due(T0 + 1, {"e": plan}, prepared=True)] == [("e", T0_MS)]
    parts.claims.answered(("e", T0_MS))
    assert not parts.claims


def test_claims_past_max_late_are_given_up_and_recorded(parts, caplog):
    plan = make_plan(max_late_s=5)
    parts.claims.hold([claim_request("ns", plan, T0_MS)])
    with caplog.at_level(logging.ERROR, "celery_anarchon"):
        assert parts.claims.due(T0 + 5.001, {"e": plan}, prepared=True) == []
    assert parts.events() == [("e", T0_MS, RunEvent.UNREACHABLE)]
    assert parts.stats["store_unreachable"] == 1 and not parts.claims
    assert any("could not be reached until their max_late" in m for m in messages(caplog))


def test_claims_of_removed_entries_are_dropped(parts):
    parts.claims.hold([claim_request("ns", make_plan(), T0_MS)])
    assert parts.claims.due(T0 + 1, {}, prepared=True) == [] and not parts.claims
    assert parts.events() == []


# -- the send queue -----------------------------------------------------------------------------

def test_a_send_is_counted_and_noted(parts):
    plan = make_plan()
    parts.sends.send(Send(plan, T0_MS, 1, None, "tid"))
    assert parts.sent == [("e", T0_MS, 1, None, "tid")]
    assert parts.stats["sent"] == 1 and parts.events() == [("e", T0_MS, RunEvent.SENT)]


def test_a_failed_send_is_retried_every_second_and_logged_once(caplog):
    failures = [2]

    def flaky(*args):
        if failures[0]:
            failures[0] -= 1
            raise ConnectionError("broker down")
        parts.sent.append(args)

    parts = Parts(send=flaky)
    parts.clocks.advance(1)
    with caplog.at_level(logging.ERROR, "celery_anarchon"):
        parts.sends.send(Send(make_plan(max_late_s=5), T0_MS, 1, None, "tid"))
        parts.sends.retry(parts.clocks.wall())
        assert failures == [1], "retried before its second"
        parts.clocks.advance(SEND_RETRY_S)
        parts.sends.retry(parts.clocks.wall())
        parts.clocks.advance(SEND_RETRY_S)
        parts.sends.retry(parts.clocks.wall())
    assert len(parts.sent) == 1 and not parts.sends
    assert sum("won but the send failed" in m for m in messages(caplog)) == 1


def test_a_send_failing_until_max_late_is_recorded_failed():
    def broken(*args):
        raise ConnectionError("broker down")

    parts = Parts(send=broken)
    parts.sends.send(Send(make_plan(max_late_s=2), T0_MS, 1, None, "tid"))
    parts.clocks.advance(2.5)
    parts.sends.retry(parts.clocks.wall())
    assert parts.stats["send_failed"] == 1 and not parts.sends
    assert parts.events() == [("e", T0_MS, RunEvent.SEND_FAILED)]
    assert parts.notes.pending[0].detail == "ConnectionError: broker down"


def test_a_takeovers_send_gives_up_on_the_monotonic_clock():
    """A wall clock set back does not keep a taken-over attempt's retries alive."""
    def broken(*args):
        raise ConnectionError("broker down")

    parts = Parts(send=broken)
    give_up_at = parts.clocks.mono() + 3
    parts.sends.send(Send(make_plan(max_late_s=3, lease=LEASE), T0_MS, 2, 12, "tid",
                          give_up_at=give_up_at))
    parts.clocks.mono.advance(3.5)
    parts.clocks.wall.advance(-3600)
    parts.sends.retry(parts.clocks.wall())
    assert parts.stats["send_failed"] == 1 and not parts.sends


def test_a_publish_that_broke_off_is_never_published_again():
    calls = []

    def broke_off(*args):
        calls.append(args)
        raise SendOutcomeUnknown("ConnectionError: Connection closed by server.")

    parts = Parts(send=broke_off)
    parts.sends.send(Send(make_plan(), T0_MS, 1, None, "tid"))
    parts.clocks.advance(SEND_RETRY_S * 3)
    parts.sends.retry(parts.clocks.wall())
    assert len(calls) == 1 and parts.stats["send_unknown"] == 1 and not parts.sends
    assert parts.events() == [("e", T0_MS, RunEvent.SEND_UNKNOWN)]


@pytest.mark.parametrize("leased", [False, True], ids=["plain", "leased"])
def test_a_run_won_after_max_late_is_not_sent_unless_leased(parts, leased):
    plan = make_plan(max_late_s=5, lease=LEASE if leased else None)
    parts.clocks.advance(6)
    parts.sends.send(Send(plan, T0_MS, 1, 7 if leased else None, "tid"))
    if leased:
        assert len(parts.sent) == 1
        return
    assert parts.sent == [] and parts.stats["send_failed"] == 1
    assert [n.detail for n in parts.notes.pending] == [
        "won after max_late: the claim answered too late"]


def test_a_stopped_send_queue_sends_nothing(parts, caplog):
    parts.sends.stop()
    with caplog.at_level(logging.WARNING, "celery_anarchon"):
        parts.sends.send(Send(make_plan(), T0_MS, 1, None, "tid"))
    assert parts.sent == [] and any("beat is shutting down" in m for m in messages(caplog))


def test_a_fault_injected_through_the_send_callback_leaves_the_claim_without_a_send():
    """The fault the process tests inject (a beat exiting between its claim and its send) goes
    through the send callback: whatever it raises that is not an Exception escapes the engine,
    with nothing recorded as sent."""
    class Exit(BaseException):
        pass

    def exits(*args):
        raise Exit()

    parts = Parts(send=exits)
    with pytest.raises(Exit):
        parts.sends.send(Send(make_plan(), T0_MS, 1, None, "tid"))
    assert parts.stats["sent"] == 0 and parts.events() == []



class Batches:
    """A send batch as the scheduler provides one: what is published inside it is written when
    it ends; ``enter_fails`` / ``write_fails`` make the start or the write fail."""

    def __init__(self) -> None:
        self.events: list = []
        self.enter_fails: Exception | None = None
        self.write_fails: Exception | None = None

    @contextlib.contextmanager
    def __call__(self, size):
        if self.enter_fails is not None:
            raise self.enter_fails
        self.events.append(("begin", size))
        yield
        if self.write_fails is not None:
            raise self.write_fails
        self.events.append(("written", size))


def batched_parts(batches):
    parts = Parts()
    parts.sends = SendQueue(parts.record_send, parts.clocks.wall, parts.clocks.mono, parts.stats,
                            parts.notes, batch=batches)
    return parts


def jobs(n):
    return [Send(make_plan(f"e{i}"), T0_MS, 1, None, f"tid{i}") for i in range(n)]


def test_the_won_runs_of_a_chunk_are_recorded_sent_once_their_batch_is_written():
    batches = Batches()
    parts = batched_parts(batches)
    parts.sends.send_many(jobs(3))
    assert batches.events == [("begin", 3), ("written", 3)]
    assert [s[0] for s in parts.sent] == ["e0", "e1", "e2"]
    assert parts.stats["sent"] == 3
    assert [(e, ev) for e, _, ev in parts.events()] == [(f"e{i}", RunEvent.SENT) for i in range(3)]


def test_a_batch_whose_write_broke_off_is_never_published_again():
    """Every run buffered in a batch whose write broke off may be on the broker: each is recorded
    as a publish that broke off, and no retry publishes it a second time."""
    batches = Batches()
    batches.write_fails = SendOutcomeUnknown("the batch's write broke off: ConnectionError")
    parts = batched_parts(batches)
    parts.sends.send_many(jobs(3))
    assert len(parts.sent) == 3 and not parts.sends, "nothing kept for a retry"
    assert parts.stats["send_unknown"] == 3 and parts.stats["sent"] == 0
    assert {ev for _, _, ev in parts.events()} == {RunEvent.SEND_UNKNOWN}
    parts.clocks.advance(SEND_RETRY_S * 3)
    parts.sends.retry(parts.clocks.wall())
    assert len(parts.sent) == 3


def test_a_batch_that_cannot_start_retries_each_run():
    """The broker cannot be reached before anything is published: each run is retried."""
    batches = Batches()
    batches.enter_fails = ConnectionError("broker down")
    parts = batched_parts(batches)
    parts.sends.send_many(jobs(2))
    assert parts.sent == [] and len(parts.sends.retrying) == 2
    batches.enter_fails = None
    parts.clocks.advance(SEND_RETRY_S)
    parts.sends.retry(parts.clocks.wall())
    assert [s[0] for s in parts.sent] == ["e0", "e1"] and parts.stats["sent"] == 2


def test_a_run_that_fails_alone_in_a_batch_is_retried_and_the_others_are_sent():
    batches = Batches()
    parts = batched_parts(batches)

    def one_fails(plan, *args):
        if plan.name == "e1":
            raise ConnectionError("cannot encode")
        parts.sent.append((plan.name, *args))

    parts.sends.send_fn = one_fails
    parts.sends.send_many(jobs(3))
    assert [s[0] for s in parts.sent] == ["e0", "e2"] and list(parts.sends.retrying) == [
        ("e1", T0_MS)]


def test_a_beat_exiting_inside_a_batch_leaves_its_runs_claimed_without_a_send():
    class Exit(BaseException):
        pass

    batches = Batches()
    parts = batched_parts(batches)

    def exits(plan, *args):
        if plan.name == "e1":
            raise Exit()

    parts.sends.send_fn = exits
    with pytest.raises(Exit):
        parts.sends.send_many(jobs(3))
    assert ("written", 3) not in batches.events, "a batch left by an exit is not written"
    assert parts.stats["sent"] == 0 and parts.events() == []


def test_the_claim_chunk_is_what_the_instance_claims_and_sends_in_its_time_ahead():
    clocks = Clocks()
    pace = Pace(clocks.mono, ahead_s=0.05, least=10, most=1000, first=50)
    assert pace.size() == 50
    pace.measured(50, 0.0)                       # a clock that does not move: no change
    assert pace.size() == 50
    pace.measured(50, 0.025)                     # 0.5 ms a run: 100 in 50 ms
    assert pace.size() == 100
    for _ in range(30):
        pace.measured(100, 1.0)                  # 10 ms a run (a loaded machine)
    assert pace.size() == 10, "never below least"
    for _ in range(60):
        pace.measured(1000, 0.001)
    assert pace.size() == 1000, "never above most"

# -- the history notes ----------------------------------------------------------------------------

def test_notes_are_written_in_one_call(parts):
    parts.notes.add("e", T0_MS, RunEvent.SENT)
    parts.notes.add("e", T0_MS + 10_000, RunEvent.SENT)
    parts.notes.flush()
    assert parts.store.calls["record_many"] == 1 and len(parts.store.recorded) == 2
    assert not parts.notes
    parts.notes.flush()
    assert parts.store.calls["record_many"] == 1, "nothing to write: no call"


def test_notes_are_kept_in_order_while_the_store_is_down(parts):
    parts.notes.add("e", 1, RunEvent.SENT)
    parts.store.fail = StoreError("down")
    parts.notes.flush()
    parts.notes.add("e", 2, RunEvent.SENT)
    parts.notes.flush()
    assert parts.store.calls["record_many"] == 1, "not asked again during the backoff"
    assert parts.stats["store_errors"] == 1
    parts.store.fail = None
    parts.clocks.mono.advance(BACKOFF_FIRST_S)
    parts.notes.flush()
    assert [n.slot_ms for n in parts.store.recorded] == [1, 2]


def test_notes_are_bounded_per_entry_by_the_history_the_store_keeps(parts):
    """Each entry keeps its newest history_size notes (the store keeps no more); one entry's
    many notes never push out another's few."""
    store = memory_store(parts.clocks, history_size=3)
    notes = NoteBuffer(store, parts.outage, compact_at=6)
    notes.add("quiet", 100, RunEvent.SENT)
    for slot in range(5):
        notes.add("busy", slot, RunEvent.LATE_LOCAL)
    assert [(n.entry, n.slot_ms) for n in notes.pending] == [
        ("quiet", 100), ("busy", 2), ("busy", 3), ("busy", 4)]
    for slot in range(5, 12):
        notes.add("busy", slot, RunEvent.LATE_LOCAL)
    assert len(notes.pending) <= 2 * 6, "bounded, whatever comes"
    assert [n.slot_ms for n in notes.pending if n.entry == "busy"][-3:] == [9, 10, 11]


def test_runs_given_up_as_unreachable_are_kept_as_slots_bounded_per_entry(parts):
    store = memory_store(parts.clocks, history_size=3)
    notes = NoteBuffer(store, parts.outage)
    for slot in range(10):
        notes.add_unreachable("busy", slot, "A could not reach the store")
    notes.add_unreachable("quiet", 100, "A could not reach the store")
    assert [(n.entry, n.slot_ms, n.event, n.detail) for n in notes.pending] == [
        ("busy", s, RunEvent.UNREACHABLE, "A could not reach the store") for s in (7, 8, 9)] + [
        ("quiet", 100, RunEvent.UNREACHABLE, "A could not reach the store")]
    assert len(notes._unreachable["busy"]) < 2 * 3, "trimmed as it grows"
    notes.flush()
    assert [(n.entry, n.slot_ms) for n in store.recorded] == [
        ("busy", 7), ("busy", 8), ("busy", 9), ("quiet", 100)] and not notes


def test_notes_are_written_a_bounded_batch_a_call_in_order_and_kept_when_it_fails(parts):
    notes = NoteBuffer(parts.store, parts.outage, write_at_once=3)
    for slot in range(4):
        notes.add_unreachable("a", slot, "down")
    notes.add("b", 9, RunEvent.SENT)
    parts.store.fail = StoreError("down")
    notes.flush()
    assert [(n.entry, n.slot_ms) for n in notes.pending] == [
        ("b", 9), ("a", 0), ("a", 1), ("a", 2), ("a", 3)], "kept, each entry's in order"
    parts.store.fail = None
    parts.clocks.mono.now = parts.outage.retry_at
    notes.flush()
    notes.flush()
    assert [(n.entry, n.slot_ms) for n in parts.store.recorded] == [
        ("b", 9), ("a", 0), ("a", 1), ("a", 2), ("a", 3)]
    assert parts.store.calls["record_many"] == 3 and not notes


# -- the outage backoff -----------------------------------------------------------------------------

def test_outage_backs_off_doubling_up_to_ten_seconds(parts):
    waits = []
    for _ in range(7):
        parts.outage.failed(StoreError("down"), "claiming")
        waits.append(parts.outage.retry_at - parts.clocks.mono())
        assert not parts.outage.may_try()
        parts.clocks.mono.now = parts.outage.retry_at
        assert parts.outage.may_try()
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, BACKOFF_MAX_S, BACKOFF_MAX_S]
    assert parts.stats["store_errors"] == 7


def test_outage_is_logged_once_then_every_minute_then_its_end(parts, caplog):
    with caplog.at_level(logging.WARNING, "celery_anarchon"):
        parts.outage.failed(StoreError("down"), "claiming")
        parts.clocks.mono.advance(DOWN_REPORT_EVERY_S - 1)
        parts.outage.failed(StoreError("down"), "claiming")
        assert sum("unreachable" in m for m in messages(caplog)) == 1
        parts.clocks.mono.advance(1)
        parts.outage.failed(StoreError("down"), "claiming")
        assert any("still unreachable after 60 s" in m for m in messages(caplog))
        parts.clocks.mono.advance(5)
        parts.outage.recovered()
    assert any("reachable again after 65 s" in m for m in messages(caplog))
    assert parts.outage.ok and parts.outage.may_try() and parts.outage.backoff == BACKOFF_FIRST_S


def test_outage_is_timed_on_the_monotonic_clock(parts):
    parts.outage.failed(StoreError("down"), "claiming")
    parts.clocks.wall.advance(-3600)
    parts.clocks.mono.advance(BACKOFF_FIRST_S)
    assert parts.outage.may_try(), "a wall clock set back does not freeze the retries"


def test_a_store_refusing_the_configuration_waits_the_longest_backoff(parts, caplog):
    with caplog.at_level(logging.CRITICAL, "celery_anarchon"):
        parts.outage.refused(Exception("Redis too old"))
    assert not parts.outage.ok
    assert parts.outage.retry_at == parts.clocks.mono() + BACKOFF_MAX_S
    assert any("cannot serve this configuration" in m for m in messages(caplog))


# -- takeovers -----------------------------------------------------------------------------------

def test_takeovers_send_an_expired_run_again_as_the_next_attempt(parts, caplog):
    plan = make_plan(lease=LEASE)
    run = expired_run(parts.store, parts.clocks)
    with caplog.at_level(logging.WARNING, "celery_anarchon"):
        parts.takeovers.check({"e": plan})
    assert parts.store.calls_of("take_over") == [("e", T0_MS, run.token)]
    new = parts.store.leases.inspect("e", T0_MS)
    assert [(s[1], s[2], s[3]) for s in parts.sent] == [(T0_MS, 2, new.token)]
    assert parts.stats["takeover_taken"] == 1
    assert any("taken over as attempt 2" in m and "presumed dead" in m for m in messages(caplog))


def test_takeovers_check_every_heartbeat_at_a_random_offset(parts):
    plan = make_plan(lease=LEASE)
    parts.takeovers.check({"e": plan})
    now = parts.clocks.mono()
    assert now < parts.takeovers.next_check <= now + 2 * LEASE.heartbeat_s
    parts.takeovers.check({"e": make_plan()})    # no leased entry
    assert parts.takeovers.next_check == parts.clocks.mono() + 60


def test_takeovers_of_a_started_run_wait_a_grace_after_a_store_error(parts):
    plan = make_plan(lease=LEASE)
    expired_run(parts.store, parts.clocks)
    parts.outage.last_error_at = parts.clocks.mono()
    parts.takeovers.check({"e": plan})
    assert parts.store.calls_of("take_over") == [] and parts.stats["takeover_deferred"] == 1
    parts.clocks.mono.advance(grace_s(plan))
    parts.takeovers.check({"e": plan})
    assert len(parts.sent) == 1


def test_takeovers_of_a_queued_run_do_not_wait_the_grace(parts, caplog):
    plan = make_plan(lease=LEASE)
    expired_run(parts.store, parts.clocks, state=RunState.QUEUED)
    parts.outage.last_error_at = parts.clocks.mono()
    with caplog.at_level(logging.ERROR, "celery_anarchon"):
        parts.takeovers.check({"e": plan})
    assert len(parts.sent) == 1
    assert any("queued past its deadline" in m for m in messages(caplog, logging.ERROR))


def test_a_takeover_whose_answer_was_lost_is_asked_again_and_sent_once(parts):
    plan = make_plan(lease=LEASE)
    run = expired_run(parts.store, parts.clocks, state=RunState.QUEUED)
    parts.store.fail_next("take_over", StoreError("reply lost"))
    parts.takeovers.check({"e": plan})
    assert parts.sent == [] and parts.takeovers.pending
    assert parts.outage.last_error_at == parts.clocks.mono()
    parts.takeovers.check({"e": plan})           # the pending one is asked by retry() only
    assert parts.store.calls["take_over"] == 1
    parts.clocks.mono.advance(TAKEOVER_RETRY_S)
    parts.takeovers.retry({"e": plan})
    assert parts.store.calls_of("take_over") == [("e", T0_MS, run.token)] * 2, \
        "the same expected token"
    assert len(parts.sent) == 1 and not parts.takeovers.pending
    parts.takeovers._take_over(plan, run)        # the store answers TAKEN again: the same record
    assert parts.store.calls_of("take_over")[-1] == ("e", T0_MS, run.token)
    assert len(parts.sent) == 1, "one attempt is never sent twice"


def test_a_takeover_unanswered_until_its_queue_deadline_is_given_up(parts, caplog):
    plan = make_plan(lease=LEASE)
    expired_run(parts.store, parts.clocks, state=RunState.QUEUED)
    parts.store.fail_next("take_over", StoreError("down"))
    parts.takeovers.check({"e": plan})
    parts.clocks.mono.advance(LEASE.queue_timeout_s + 0.1)
    with caplog.at_level(logging.WARNING, "celery_anarchon"):
        parts.takeovers.retry({"e": plan})
    assert not parts.takeovers.pending and parts.stats["takeover_unanswered"] == 1
    assert parts.store.calls["take_over"] == 1, "not asked again past its queue deadline"
    assert any("got no answer from the store until its queue deadline" in m
               for m in messages(caplog))


def test_takeovers_of_removed_entries_are_forgotten(parts):
    plan = make_plan(lease=LEASE)
    expired_run(parts.store, parts.clocks, state=RunState.QUEUED)
    parts.store.fail_next("take_over", StoreError("down"))
    parts.takeovers.check({"e": plan})
    assert parts.takeovers.pending
    parts.takeovers.forget_removed({})
    assert not parts.takeovers.pending


def test_a_run_given_up_after_max_attempts_is_logged(parts, caplog):
    plan = make_plan(lease=LEASE)
    expired_run(parts.store, parts.clocks, attempt=3)
    with caplog.at_level(logging.ERROR, "celery_anarchon"):
        parts.takeovers.check({"e": plan})
    assert parts.store.leases.inspect("e", T0_MS).state is RunState.GIVEN_UP
    assert parts.sent == [] and parts.stats["takeover_given_up"] == 1
    assert any("after 3 attempts" in m for m in messages(caplog, logging.ERROR))


def test_a_stopped_engine_takes_nothing_over(parts):
    expired_run(parts.store, parts.clocks)
    parts.sends.stop()
    parts.takeovers.check({"e": make_plan(lease=LEASE)})
    assert parts.store.calls_of("take_over") == []


def test_a_lease_check_that_fails_counts_for_the_grace(parts):
    parts.store.fail = StoreError("down")
    parts.takeovers.check({"e": make_plan(lease=LEASE)})
    assert parts.outage.last_error_at == parts.clocks.mono()
    assert parts.stats["store_errors"] == 0, "a lease check does not start an outage backoff"


# -- skew ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("store_ahead_s, level, says", [
    (0.2, logging.INFO, "behind the store's clock"),
    (-1.6, logging.WARNING, "; run NTP"),
    (40.0, logging.ERROR, "more than half of max_late (30 s)"),
])
def test_skew_is_measured_against_the_store_clock(caplog, store_ahead_s, level, says):
    clocks = Clocks()
    store = memory_store(store_clock=lambda: int((clocks.wall() + store_ahead_s) * 1000))
    skew = SkewCheck(store, clocks.wall, clocks.mono)
    with caplog.at_level(logging.INFO, "celery_anarchon"):
        skew.check([make_plan(max_late_s=60)])
    (record,) = [r for r in caplog.records if "this instance's clock is" in r.getMessage()]
    assert record.levelno == level and says in record.getMessage()
    assert f"{abs(store_ahead_s):.3f} s" in record.getMessage()
    assert skew.next_check == clocks.mono() + SKEW_EVERY_S


def test_skew_is_not_measured_on_a_store_without_a_clock_nor_when_it_fails(caplog):
    clocks = Clocks()
    store = memory_store(clocks, no_clock=True)     # as a store without a clock (RabbitMQ, NATS)
    skew = SkewCheck(store, clocks.wall, clocks.mono)
    with caplog.at_level(logging.INFO, "celery_anarchon"):
        skew.check([make_plan()])
        store.fail = StoreError("down")
        skew.check([make_plan()])
    assert not [m for m in messages(caplog, logging.INFO) if "clock is" in m]
    assert skew.next_check == clocks.mono() + SKEW_EVERY_S


# -- skip logging ---------------------------------------------------------------------------------

def refused(outcome: Outcome, slot_ms: int = T0_MS, detail: str = "") -> ClaimResult:
    return ClaimResult(claim_request("ns", make_plan(), slot_ms), outcome, detail=detail)


def test_skips_of_one_kind_are_logged_once_a_minute_with_the_count_hidden(parts, caplog):
    plan = make_plan()
    with caplog.at_level(logging.DEBUG, "celery_anarchon"):
        parts.skips.refused(plan, refused(Outcome.LATE, T0_MS, "store clock"))
        parts.clocks.mono.advance(SKIP_LOG_EVERY_S - 1)
        parts.skips.refused(plan, refused(Outcome.LATE, T0_MS + 10_000))
        parts.skips.refused(plan, refused(Outcome.EARLY, T0_MS + 20_000))  # another kind
        parts.clocks.mono.advance(1)
        parts.skips.refused(plan, refused(Outcome.LATE, T0_MS + 30_000))
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 3
    assert "late on the store's clock" in warned[0] and "(store clock)" in warned[0]
    assert "early on the store's clock" in warned[1]
    assert "1 more slot(s) of this entry skipped so in the last minute" in warned[2]
    assert sum(r.levelno == logging.DEBUG and "skipped:" in r.getMessage()
               for r in caplog.records) == 1


def test_paused_runs_are_info_once_per_run(parts, caplog):
    with caplog.at_level(logging.INFO, "celery_anarchon"):
        for slot in (T0_MS, T0_MS + 10_000):
            parts.skips.refused(make_plan(), refused(Outcome.PAUSED, slot, "paused by ops: disk"))
    logged = [r for r in caplog.records if "paused" in r.getMessage()]
    assert [r.levelno for r in logged] == [logging.INFO] * 2
    assert "skipped: the entry is paused (paused by ops: disk)" in logged[0].getMessage()


def test_overlapping_and_superseded_skips_are_info(parts, caplog):
    with caplog.at_level(logging.DEBUG, "celery_anarchon"):
        parts.skips.refused(make_plan(), refused(Outcome.OVERLAPPING))
        parts.skips.refused(make_plan(), refused(Outcome.SUPERSEDED))
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.INFO]


def test_late_local_skips_are_logged_counted_and_noted_up_to_the_history_size(caplog):
    parts = Parts()
    parts.store.history_size = 2
    with caplog.at_level(logging.WARNING, "celery_anarchon"):
        parts.skips.late_local(make_plan(), [1, 2, 3], 30_000)
    assert parts.stats["late_local"] == 3
    assert [s for _, s, _ in parts.events()] == [2, 3]
    assert parts.notes.pending[0].detail == "A reached it 30.000 s late"
    assert any("3 slots from" in m for m in messages(caplog))


# -- definitions ----------------------------------------------------------------------------------

def test_a_different_definition_is_named_once(caplog):
    store = memory_store()
    store.history.save_definition("e", "theirs", '{"definition": "theirs"}')
    definitions = Definitions(store)
    ours = make_plan(fingerprint="ours")
    result = ClaimResult(claim_request("ns", ours, T0_MS), Outcome.OTHER_WON, winner="B",
                         winner_fingerprint="theirs")
    with caplog.at_level(logging.WARNING, "celery_anarchon"):
        definitions.check(ours, result)
        definitions.check(ours, result)
        definitions.check(ours, ClaimResult(result.request, Outcome.OTHER_WON, winner="B",
                                            winner_fingerprint="ours"))
    (message,) = messages(caplog, logging.WARNING)
    assert "different definition" in message and '"theirs"' in message and "ours" in message


def test_saving_a_definition_is_quiet_unless_asked(parts):
    definitions = Definitions(parts.store)
    parts.store.fail = StoreError("down")
    definitions.save(make_plan())
    with pytest.raises(StoreError):
        definitions.save(make_plan(), quiet=False)


# -- counters ---------------------------------------------------------------------------------------

def test_counters_are_logged_every_five_minutes_when_there_are_any(caplog):
    clocks = Clocks()
    counters = Counters(clocks.mono)
    with caplog.at_level(logging.INFO, "celery_anarchon"):
        counters.report_if_due(clocks.mono())          # nothing counted yet: nothing logged
        counters.counts["sent"] += 1
        counters.report_if_due(clocks.mono())
        clocks.mono.advance(STATS_EVERY_S)
        counters.report_if_due(clocks.mono())
        clocks.mono.advance(STATS_EVERY_S)
        counters.report_if_due(clocks.mono())
    assert messages(caplog) == ["anarchon counters: {'sent': 1}"] * 2


# -- loggers -----------------------------------------------------------------------------------------

def test_every_engine_module_logs_under_its_own_name():
    for info in pkgutil.iter_modules(celery_anarchon.beat.engine.__path__):
        module = importlib.import_module(f"celery_anarchon.beat.engine.{info.name}")
        if hasattr(module, "logger"):
            assert module.logger.name == module.__name__


# -- the sync of the store's entries -------------------------------------------------------------

SYNC_S = 5.0


class Synced:
    """An entry sync on the memory store (written by ``operator``), fake clocks and the outage
    part."""

    def __init__(self, build=store_plans, **store_options) -> None:
        self.clocks = Clocks()
        self.store = memory_store(self.clocks, **store_options)
        self.operator = Operator(self.store, self.clocks.store)
        self.stats: collections.Counter = collections.Counter()
        self.outage = Outage(self.store, self.clocks.mono, self.stats)
        self.requested: set = set()
        self.sync = EntrySync(self.store, build, SYNC_S, "ns", self.clocks.mono, self.outage,
                              self.requested)


def test_sync_reads_the_version_every_interval_and_loads_only_when_it_moved():
    s = Synced()
    s.operator.put("a", "fa")
    assert s.sync.due() and s.sync.follow(), "the first sync loads"
    assert set(s.sync.store_plans) == {"a"}
    assert not s.sync.due()
    s.clocks.mono.advance(SYNC_S - 0.001)
    assert not s.sync.due()
    s.clocks.mono.advance(0.001)
    assert s.sync.due() and not s.sync.follow(), "the version did not move: nothing loaded"
    assert (s.store.calls["entries_epoch"], s.store.calls["load_entries"]) == (2, 1)
    s.operator.put("b", "fb")
    s.clocks.wall.advance(-3600)                     # the wall clock does not time the sync
    s.clocks.mono.advance(SYNC_S)
    assert s.sync.follow() and set(s.sync.store_plans) == {"a", "b"}
    assert s.sync.version == s.operator.store.entries.entries_version()
    assert s.store.calls["load_entries"] == 2


def test_sync_logs_each_version_it_loads_with_what_changed(caplog):
    s = Synced()
    s.operator.put("a", "fa")
    s.operator.put("b", "fb")
    with caplog.at_level(logging.INFO, "celery_anarchon"):
        s.sync.follow()
        s.operator.put("a", "fa2")
        s.operator.remove("b")
        s.operator.put("c", "fc")
        s.clocks.mono.advance(SYNC_S)
        s.sync.follow()
    assert messages(caplog, logging.INFO) == [
        "anarchon: synced entries version 2: +2 -0 ~0 (2 store entries)",
        "anarchon: synced entries version 5: +1 -1 ~1 (2 store entries)"]


def test_sync_merges_the_config_plans_which_win_a_name_clash(caplog):
    s = Synced()
    s.operator.put("shared", "from-store")
    s.operator.put("mine", "fm")
    s.sync.follow()
    config = {"shared": make_plan("shared", fingerprint="from-config")}
    with caplog.at_level(logging.WARNING, "celery_anarchon"):
        merged = s.sync.merge(config)
        s.sync.merge(config)
    assert merged["shared"].fingerprint == "from-config" and set(merged) == {"shared", "mine"}
    (message,) = messages(caplog, logging.WARNING)
    assert "store entry 'shared' has the name of a beat_schedule entry" in message


def test_sync_without_a_callback_follows_pauses_and_requests_only():
    s = Synced(build=None)
    s.operator.put("a", "fa")
    assert s.sync.follow() and s.sync.store_plans == {}


def test_sync_logs_a_pause_once_and_its_resume(caplog):
    s = Synced()
    with caplog.at_level(logging.INFO, "celery_anarchon"):
        s.operator.put("a", "fa", Pause("disk full", "ops", 1))
        s.operator.pause("cfg", Pause("", "alice", 2))      # a config entry: a pause only
        s.sync.follow()
        s.operator.put("b", "fb")                           # another change: the pauses stay
        s.clocks.mono.advance(SYNC_S)
        s.sync.follow()
        s.operator.pause("a", None, by="bob")
        s.clocks.mono.advance(SYNC_S)
        s.sync.follow()
    pauses = [m for m in messages(caplog, logging.INFO) if "synced" not in m]
    assert pauses == ["anarchon: entry a is paused by ops: disk full",
                      "anarchon: entry cfg is paused by alice",
                      "anarchon: entry a is resumed by bob"]


def test_a_failed_sync_backs_off_and_is_retried(caplog):
    s = Synced()
    s.operator.put("a", "fa")
    s.store.fail = StoreError("down")
    with caplog.at_level(logging.ERROR, "celery_anarchon"):
        assert not s.sync.follow()
    assert "unreachable while syncing the store's entries" in messages(caplog)[0]
    assert not s.sync.due(), "in the backoff"
    assert s.sync.next_try() == s.clocks.mono() + BACKOFF_FIRST_S
    s.store.fail = None
    s.clocks.mono.advance(BACKOFF_FIRST_S)
    assert s.sync.due() and s.sync.follow() and set(s.sync.store_plans) == {"a"}
    assert s.outage.ok


def test_run_now_requests_are_claimed_once_with_a_max_late_covering_two_syncs():
    s = Synced()
    s.operator.put("a", "fa")
    slot = T0_MS + 4_321                                 # between two scheduled slots
    s.operator.request("a", "r1", slot)
    s.operator.request("gone", "r2", slot)                  # an entry this instance does not run
    s.sync.follow()
    plans = s.sync.merge({})
    (claim,) = s.sync.requests_due(T0 + 4.5, plans)
    assert claim.run == ("a", slot) and claim.fingerprint == "fa"
    assert claim.max_late_ms == 2 * 5_000 + 5_000, "max(max_late 5 s, 2 x sync + 5 s)"
    assert s.sync.requests_due(T0 + 4.5, plans) == [], "asked once"
    assert ("a", slot) in s.requested
    long_late = {"a": make_plan("a", max_late_s=60, fingerprint="fa")}
    s.requested.clear()
    assert s.sync.requests_due(T0 + 4.5, long_late)[0].max_late_ms == 60_000


def test_run_now_requests_a_count_limited_memory_cannot_cover_are_refused_and_logged(caplog):
    """A store that remembers 3 runs of an entry every 10 s (30 s) covers one request's 15 s
    (2 x sync + 5 s), and each of the entry's requests within those 15 s before it takes one of
    the 3: the third request in 3 s is refused (logged once, never claimed), as on every
    instance that loaded it; a request 27 s later is claimed again."""
    s = Synced()
    s.store.memory = Memory(duration_s=300, count=3, setting="duration", count_setting="max_size")
    s.operator.put("a", "fa")
    for i, slot in enumerate((T0_MS + 1_100, T0_MS + 2_200, T0_MS + 3_300)):
        s.operator.request("a", f"r{i}", slot)
    s.sync.follow()
    with caplog.at_level(logging.ERROR, "celery_anarchon"):
        claims = s.sync.requests_due(T0 + 3.5, s.sync.merge({}))
        assert s.sync.requests_due(T0 + 3.5, s.sync.merge({})) == [], "asked once"
    assert [c.slot_ms for c in claims] == [T0_MS + 1_100, T0_MS + 2_200]
    (error,) = messages(caplog, logging.ERROR)
    assert error.startswith("anarchon: entry a: run-now request r2 by t is not claimed"), error
    assert "2 other run-now request(s) of the entry made in the last 15 s" in error, error
    assert ("a", T0_MS + 3_300) in s.requested
    s.operator.request("a", "r3", T0_MS + 30_500)
    s.clocks.mono.advance(SYNC_S)
    s.sync.follow()
    assert [c.slot_ms for c in s.sync.requests_due(T0 + 31, s.sync.merge({}))] == [T0_MS + 30_500]


def test_run_now_requests_past_their_max_late_or_on_a_scheduled_slot_are_let_pass():
    s = Synced(memory=25)                               # run-now requests younger are loaded
    s.operator.put("a", "fa")
    s.operator.request("a", "old", T0_MS + 1)
    s.operator.request("a", "on-the-schedule", T0_MS + 20_000)
    s.sync.follow()
    assert s.sync.requests_due(T0 + 20, s.sync.merge({})) == []
    assert s.requested == {("a", T0_MS + 1), ("a", T0_MS + 20_000)}
    s.clocks.store.advance(10_000)                      # "old" is past the store's memory
    s.operator.put("b", "fb")                           # and a write raises the version
    s.clocks.mono.advance(SYNC_S)
    s.sync.follow()
    assert s.requested == {("a", T0_MS + 20_000)}, "kept only while the store holds it"


def test_an_engine_on_a_store_that_cannot_hold_entries_follows_nothing():
    from celery_anarchon.beat.engine import Engine
    store = ClaimsOnly(memory_store())
    engine = Engine(store, {"e": make_plan()}, instance_id="A", namespace="ns", send=None,
                    sync_interval_s=SYNC_S, build_store_plans=store_plans)
    assert engine.sync is None and engine.heartbeat is None
    engine.close()
    assert not store.calls, "no store I/O"


# -- the instance heartbeat ----------------------------------------------------------------------

class Beating:
    """Two heartbeats (this instance "A" and another "B") on one memory store."""

    def __init__(self) -> None:
        self.clocks = Clocks()
        self.store = memory_store(self.clocks)
        self.stats: collections.Counter = collections.Counter()
        self.outage = Outage(self.store, self.clocks.mono, self.stats)
        self.skew = SkewCheck(self.store, self.clocks.wall, self.clocks.mono)
        self.a = Heartbeat(self.store, "A", self.clocks.wall, 15_000, self.outage, self.skew)
        self.b = Heartbeat(self.store, "B", self.clocks.wall, 15_000, self.outage, self.skew)

    def records(self) -> dict[str, InstanceRecord]:
        """The instance records the store holds (live ones), by instance id."""
        return {r.instance_id: r for r in self.store.held().instances.values()
                if r.expires_ms >= self.clocks.store()}


def config(**fingerprints):
    return {name: make_plan(name, fingerprint=fp) for name, fp in fingerprints.items()}


def test_heartbeat_saves_its_fingerprints_again_once_the_store_lost_them():
    """A store that lost its data (a restart without its disk, a flush) no longer holds this
    instance's mapping: the next heartbeat that finds its own record gone saves it again, so the
    status does not say "its entries are not saved yet" for as long as the beat lives and a
    disagreement with another instance is seen again."""
    h = Beating()
    mine = config(e="f1", g="g1")
    h.a.beat(mine, entries=2)
    backends.wipe("memory", h.store.url)
    h.clocks.advance(5)
    h.a.beat(mine, entries=2)
    digest = fingerprints_digest({"e": "f1", "g": "g1"})
    assert h.store.instances.load_fingerprints(digest) == {"e": "f1", "g": "g1"}
    assert h.records()["A"].fingerprints_digest == digest
    h.clocks.advance(5)
    h.a.beat(mine, entries=2)
    assert h.store.calls["save_fingerprints"] == 2, "saved again once, not at every heartbeat"


def test_heartbeat_records_the_instance_and_saves_its_fingerprints_once():
    h = Beating()
    h.clocks.advance(1)
    h.a.beat(config(e="f1", g="g1"), entries=3)
    h.clocks.advance(5)
    h.a.beat(config(e="f1", g="g1"), entries=3)
    record = h.records()["A"]
    digest = fingerprints_digest({"e": "f1", "g": "g1"})
    assert isinstance(record, InstanceRecord) and record.fingerprints_digest == digest
    assert record.entries == 3 and record.started_ms == T0_MS
    assert record.last_tick_ms == T0_MS + 6_000 and record.expires_ms - record.seen_ms == 15_000
    held = {d: mapping for d, (mapping, _) in h.store.held().fingerprints.items()}
    assert held == {digest: {"e": "f1", "g": "g1"}}
    assert h.store.calls["save_fingerprints"] == 1 and h.store.calls["record_instance"] == 2
    h.a.beat(config(e="f2", g="g1"), entries=3)
    assert h.store.calls["save_fingerprints"] == 2, "a new digest is saved"
    h.a.leave()
    assert "A" not in h.records()


def test_fingerprints_digest_ignores_order():
    assert fingerprints_digest({"a": "1", "b": "2"}) == fingerprints_digest({"b": "2", "a": "1"})
    assert fingerprints_digest({"a": "1"}) != fingerprints_digest({"a": "2"})


def test_a_disagreement_is_logged_once_and_again_when_it_changes(caplog):
    h = Beating()
    h.store.history.save_definition("e", "f2", '{"definition": "f2"}')
    with caplog.at_level(logging.WARNING, "celery_anarchon"):
        h.b.beat(config(e="f2", other="o"), entries=2)    # B runs another definition of e
        h.a.beat(config(e="f1", g="g1"), entries=2)
        first = messages(caplog, logging.ERROR)
        h.a.beat(config(e="f1", g="g1"), entries=2)    # the same set: not logged again
        assert messages(caplog, logging.ERROR) == first
        h.b.beat(config(e="f2", g="g2"), entries=2)     # B also disagrees on g now
        h.a.beat(config(e="f1", g="g1"), entries=2)
        h.b.beat(config(e="f1", g="g1"), entries=2)     # B deployed the same code as A
        h.a.beat(config(e="f1", g="g1"), entries=2)
    (one,) = first
    assert one.startswith("anarchon: instances disagree on entry 'e': this instance (")
    assert 'runs f1: {"definition": "f1"}' in one and 'runs f2: {"definition": "f2"}' in one
    errors = [(m.split("'")[1], m.split(" runs ")[1][:2]) for m in messages(caplog, logging.ERROR)]
    assert errors == [("e", "f1"),                        # A, once
                      ("e", "f2"), ("g", "g2"),            # B, when it disagreed on g too
                      ("e", "f1"), ("g", "g1")], "A again, when the set changed"
    assert messages(caplog, logging.WARNING)[-2:] == [
        "anarchon: the live instances agree again on every beat_schedule entry"] * 2


def test_a_disagreement_on_a_followed_entry_is_reported_once_it_outlasts_the_ttl(caplog):
    """Entries each instance follows at run time from a database (django-celery-beat's rows)
    differ between instances for a poll or two after a change: only a disagreement that
    outlasts a record's ttl (15 s here) is reported; the others at once, as before."""
    h = Beating()
    h.a.followed = frozenset({"row"})
    with caplog.at_level(logging.WARNING, "celery_anarchon"):
        h.b.beat(config(row="r2", e="f2"), entries=2)        # B read the row's change first
        h.a.beat(config(row="r1", e="f1"), entries=2)
        assert {d[0] for d in h.a.reported} == {"e"}
        h.clocks.advance(10)
        h.b.beat(config(row="r2", e="f2"), entries=2)
        h.a.beat(config(row="r1", e="f1"), entries=2)
        assert {d[0] for d in h.a.reported} == {"e"}, "within the ttl: not reported"
        h.clocks.advance(6)
        h.b.beat(config(row="r2", e="f2"), entries=2)
        h.a.beat(config(row="r1", e="f1"), entries=2)
        assert {d[0] for d in h.a.reported} == {"e", "row"}, "past the ttl: reported"
        h.b.beat(config(row="r1", e="f1"), entries=2)         # A read it too (and e agrees)
        h.a.beat(config(row="r1", e="f1"), entries=2)
    assert h.a.reported == frozenset()
    assert messages(caplog, logging.WARNING)[-1] == (
        "anarchon: the live instances agree again on every beat_schedule entry")


def test_a_heartbeat_that_fails_backs_off_and_a_fingerprint_not_yet_saved_waits():
    h = Beating()
    h.store.instances.record_instance(InstanceRecord("C", "h", 1, "v", 0, 0, None, 1, "not-saved-yet"),
                            ttl_ms=60_000)
    h.a.beat(config(e="f1"), entries=1)
    assert h.a.reported == frozenset(), "an unknown digest is compared at the next heartbeat"
    h.store.fail = StoreError("down")
    h.a.beat(config(e="f1"), entries=1)
    assert not h.outage.may_try() and h.stats["store_errors"] == 1
    calls = sum(h.store.calls.values())
    h.a.beat(config(e="f1"), entries=1)
    assert sum(h.store.calls.values()) == calls, "not asked during the backoff"
    h.a.leave()                                         # quiet on a store error


def test_skips_hidden_by_the_rate_limit_are_logged_a_minute_later_without_a_new_skip(parts, caplog):
    """The rate limit hides skips of one kind for a minute; if no skip of that kind follows, the
    ones hidden are still logged at WARNING once the minute has passed (the newest named)."""
    plan = make_plan()
    with caplog.at_level(logging.WARNING, "celery_anarchon"):
        parts.skips.refused(plan, refused(Outcome.FORGOTTEN, T0_MS))
        parts.clocks.mono.advance(10)
        parts.skips.refused(plan, refused(Outcome.FORGOTTEN, T0_MS + 5_000, "memory restarted"))
        parts.skips.refused(plan, refused(Outcome.FORGOTTEN, T0_MS + 10_000, "memory restarted"))
        parts.skips.flush()
        assert len(caplog.records) == 1, "not before the minute has passed"
        parts.clocks.mono.advance(SKIP_LOG_EVERY_S - 10)
        parts.skips.flush()
        parts.skips.flush()
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2, warned
    assert "2 more slot(s) skipped in the last minute" in warned[1]
    assert "the store does not remember that far back" in warned[1]
    assert "newest " + iso(T0_MS + 10_000) in warned[1] and "(memory restarted)" in warned[1]
