"""Catch-up by policy on one or two instances (docs/design.md "One run, in time", step 7;
docs/timing.md "Catch-up after an outage"), with the engine harness on real stores: what the
seed queues for ``none``, ``newest`` and ``all``; for ``all``, the slots within the window are
claimed oldest first, one every pace (asserted on the fire times the engine asks for), each as
its own run, so two instances or a restart send each slot once; slots older than the window are
skipped as late here.

The engine's wall clock is pinned a few seconds before real time and moved by the test; the
store's clock is the real one, so every slot claimed stays within its lateness and early limits
(window + 10 s late, 10 s early)."""
from __future__ import annotations

import logging
import math
import time

import pytest
from celery.beat import ScheduleEntry

from celery_anarchon._util import iso
from celery_anarchon.errors import StoreUnavailable
from celery_anarchon.schedule.plan import build_plans
from celery_anarchon.settings import Settings
from celery_anarchon.stores.base import HistoryRecord, RunEvent

from stores_support import VARIANT_OPTIONS, store_url
from engine_harness import harnesses, make  # noqa: F401  (a fixture)

EVERY_S = 4          # the entry's interval: pace = min(1 s, 4 s / 2) = 1 s
WINDOW_S = 20        # catch_up_window: 5 slots of 4 s
ALL = {"jitter": 0, "max_late": 3, "catch_up": "all", "catch_up_window": WINDOW_S}


@pytest.fixture(params=["memory", "sqlite", "redis-stream-id"])
def store(request, tmp_path):
    """The store's URL and options: memory, SQLite, and Redis ``stream-id``, which refuses an
    older slot once a newer one is claimed (a catch-up walks oldest first)."""
    return store_url(request.param, str(tmp_path)), VARIANT_OPTIONS.get(request.param, {})


def engine(harnesses, store, namespace, entries, **kwargs):
    url, options = store
    return make(harnesses, url, namespace, entries, store_options=options, **kwargs)


def pinned_boundary(h) -> int:
    """Pin the harness's wall clock 0.5 s past a slot boundary B that lies 4 to 8 s before real
    time; returns B in ms. The store's clock then reads B + 4 to B + 8 s."""
    b = (math.floor(time.time() / EVERY_S) - 1) * EVERY_S
    h.clock.pin(b + 0.5)
    return b * 1000


def fire_and_tick(*hs) -> float:
    """Move every harness's clocks to the earliest fire time any of them asks for, then tick
    each; returns that fire time (epoch seconds)."""
    fire = min(h.engine.next_fire() for h in hs)
    for h in hs:
        h.advance(fire - h.clock())
    for h in hs:
        h.engine.tick()
    return fire


def slots_sent(*hs) -> list[int]:
    return sorted(slot for h in hs for _, slot, _ in h.sent)


def test_none_claims_nothing_older_than_now(store, namespace, harnesses):
    h = engine(harnesses, store, namespace, {"e": (EVERY_S, {"jitter": 0, "max_late": 3,
                                                         "catch_up": "none"})})
    b = pinned_boundary(h)
    h.engine.tick()
    assert h.sent == [] and h.engine.next_fire() == (b + 4000) / 1000
    fire_and_tick(h)
    assert slots_sent(h) == [b + 4000]


def test_newest_claims_the_newest_slot_within_max_late(store, namespace, harnesses):
    h = engine(harnesses, store, namespace, {"e": (EVERY_S, {"jitter": 0, "max_late": 3})})
    b = pinned_boundary(h)
    h.engine.tick()
    assert slots_sent(h) == [b] and h.engine.next_fire() == (b + 4000) / 1000


def test_all_claims_every_slot_of_the_window_oldest_first_one_every_pace(
        store, namespace, harnesses, caplog):
    caplog.set_level(logging.INFO, "celery_anarchon")
    h = engine(harnesses, store, namespace, {"e": (EVERY_S, ALL)})
    b = pinned_boundary(h)
    start = h.clock()
    h.engine.tick()                              # the seed: the oldest slot within 20 s
    assert slots_sent(h) == [b - 16_000]
    fires = [start] + [fire_and_tick(h) for _ in range(6)]
    # B-16 .. B+4 paced one second apart from the start; B+8 at its own time
    assert fires == [start + i for i in range(6)] + [(b + 8000) / 1000]
    assert [s for _, s, _ in h.sent] == [b + i * 4000 for i in range(-4, 3)]
    assert {a for _, _, a in h.sent} == {1}
    history = h.history("e")
    assert all(history[b + i * 4000].event is RunEvent.SENT for i in range(-4, 3))
    [line] = [r.getMessage() for r in caplog.records if "catching up" in r.getMessage()]
    assert line == (f"e: catching up 5 slot(s) from {iso(b - 16_000)} to {iso(b)} "
                    f"(catch_up='all', window 20 s), one every 1 s; each is claimed as its own "
                    "run, so one already sent is not sent again")


def test_slots_older_than_the_window_are_skipped_late_the_rest_caught_up(
        store, namespace, harnesses):
    h = engine(harnesses, store, namespace, {"e": (EVERY_S, ALL)})
    b = pinned_boundary(h)
    h.engine.tick()                              # sends B-16; B-12 waits for B+1.5
    h.advance(12.0)                              # paused: now B+12.5; B-12 and B-8 past 20 s
    h.engine.tick()
    assert h.engine.stats["late_local"] == 2
    history = h.history("e")
    assert history[b - 12_000].event is RunEvent.LATE_LOCAL
    assert history[b - 8000].event is RunEvent.LATE_LOCAL
    fires = [fire_and_tick(h) for _ in range(4)]
    assert fires == [b / 1000 + 13.5 + i for i in range(4)]
    assert slots_sent(h) == [b - 16_000, b - 4000, b, b + 4000, b + 8000]


def test_two_instances_catching_up_the_same_window_send_each_slot_once(
        store, namespace, harnesses):
    a = engine(harnesses, store, namespace, {"e": (EVERY_S, ALL)}, instance="A")
    c = engine(harnesses, store, namespace, {"e": (EVERY_S, ALL)}, instance="C", backdate=False)
    b = pinned_boundary(a)
    c.clock.pin(a.clock())
    c.engine.tick()                              # C first: it wins the oldest slot
    a.engine.tick()
    for _ in range(6):
        fire_and_tick(c, a)
    assert slots_sent(a, c) == [b + i * 4000 for i in range(-4, 3)]   # each once
    assert c.sent and a.engine.stats["claim_other_won"] >= 1


def test_a_restart_in_the_middle_of_a_catch_up_sends_nothing_twice(store, namespace, harnesses):
    first = engine(harnesses, store, namespace, {"e": (EVERY_S, ALL)}, instance="host:1:aa")
    b = pinned_boundary(first)
    first.engine.tick()
    fire_and_tick(first)
    assert slots_sent(first) == [b - 16_000, b - 12_000]
    # the process dies; a new one (a new instance id) starts a second later
    again = engine(harnesses, store, namespace, {"e": (EVERY_S, ALL)}, instance="host:2:bb",
                 backdate=False)
    again.clock.pin(first.clock() + 1.0)
    again.engine.tick()                          # the seed: B-16 again, run by the first
    assert again.sent == []
    for _ in range(6):
        fire_and_tick(again)
    assert slots_sent(again) == [b + i * 4000 for i in range(-2, 3)]
    # the first's runs are in the history: the new one never claims them (nor anything older)
    assert again.engine.stats["claim_won"] == 5 and again.engine.stats["claim_other_won"] == 0
    assert slots_sent(first, again) == [b + i * 4000 for i in range(-4, 3)]


def test_runs_held_while_the_store_did_not_answer_are_claimed_oldest_first_one_every_pace(
        store, namespace, harnesses):
    h = engine(harnesses, store, namespace, {"e": (EVERY_S, ALL)})
    b = pinned_boundary(h)
    h.engine.tick()                              # B-16 sent
    claim, down = h.store.claim, [True]

    def claim_unless_down(requests):             # the store does not answer (fault injection)
        if down[0]:
            raise StoreUnavailable("the test's store outage")
        return claim(requests)
    h.store.claim = claim_unless_down
    for _ in range(3):                           # B-12, B-8, B-4 come due: held
        fire_and_tick(h)
    assert slots_sent(h) == [b - 16_000] and len(h.engine.claims.waiting) == 3
    down[0] = False
    sends = []                                   # (wall clock, slot) of each send
    for _ in range(1000):                        # ticks as beat makes them
        if len(h.sent) == 6:
            break
        now, delay = h.clock(), h.engine.tick()
        sends += [(now, s) for _, s, _ in h.sent[1 + len(sends):]]
        h.advance(delay)                         # beat sleeps what the engine asks
    assert [s for _, s in sends] == [b - 12_000, b - 8000, b - 4000, b, b + 4000]
    gaps = [later - earlier for (earlier, _), (later, _) in zip(sends, sends[1:])]
    assert min(gaps) >= 1.0 - 1e-6, gaps


def test_an_entry_changed_in_the_middle_of_a_catch_up_never_claims_a_handled_slot_again(
        store, namespace, harnesses):
    """A re-seed (the entry's definition changed at run time) starts the walk again from the
    oldest slot of the window, but never at a slot this instance handled: a store that reads its
    own claim back would answer won again, a second send."""
    h = engine(harnesses, store, namespace, {"e": (EVERY_S, ALL)})
    b = pinned_boundary(h)
    h.engine.tick()
    fire_and_tick(h)
    assert slots_sent(h) == [b - 16_000, b - 12_000]
    entry = ScheduleEntry(name="e", task="proj.t", schedule=EVERY_S, app=h.app,
                          options={"anarchon": {**ALL, "catch_up_window": WINDOW_S - 1}})
    changed = build_plans({"e": entry}, app=h.app, settings=Settings.from_app(h.app),
                          store=h.store)
    assert changed["e"].fingerprint != h.plans["e"].fingerprint
    h.engine.update_plans(changed)               # re-seeded: B-16 is in the window again
    for _ in range(5):
        fire_and_tick(h)
    assert [s for _, s, _ in h.sent] == [b + i * 4000 for i in range(-4, 3)]   # each once


def test_a_slot_skipped_while_its_entry_was_paused_is_not_caught_up_after_the_resume(
        store, namespace, harnesses):
    """A pause holds for the slots it covered: they were answered paused (no claim holds them),
    and a catch-up that walks the window after the resume must not send them."""
    h = engine(harnesses, store, namespace, {"e": (EVERY_S, ALL)})
    b = pinned_boundary(h)
    h.store.history.record_many([
        HistoryRecord("e", slot, RunEvent.PAUSED, detail="paused by ops: maintenance")
        for slot in (b - 16_000, b - 12_000)])
    h.engine.tick()
    for _ in range(6):
        fire_and_tick(h)
    assert slots_sent(h) == [b + i * 4000 for i in range(-2, 3)]
    history = h.history("e")
    assert [history[b + i * 4000].event for i in (-4, -3)] == [RunEvent.PAUSED] * 2


def test_a_catch_up_reaches_back_no_further_than_the_entrys_last_run_before_it(
        store, namespace, harnesses):
    """The schedule changed at a restart (a run of the old one at B-14 s, not a slot of the new
    4-s one): the slots of the new schedule before that run came while the old one ran, so they
    are no gap to catch up; only those after it are."""
    h = engine(harnesses, store, namespace, {"e": (EVERY_S, ALL)})
    b = pinned_boundary(h)
    h.store.history.record_many([HistoryRecord("e", b - 14_000, RunEvent.SENT)])
    h.engine.tick()
    for _ in range(6):
        fire_and_tick(h)
    assert slots_sent(h) == [b + i * 4000 for i in range(-3, 3)]


def test_slots_answered_paused_are_not_caught_up_even_past_the_history_it_keeps(
        store, namespace, harnesses):
    """The history keeps two runs of the entry here: the oldest paused slot is gone from it,
    and is still not caught up (the newest paused slot bounds the catch-up)."""
    url, options = store
    h = make(harnesses, url, namespace, {"e": (EVERY_S, ALL)},
             store_options={**options, "history_size": 2})
    b = pinned_boundary(h)
    h.store.history.record_many([
        HistoryRecord("e", slot, RunEvent.PAUSED, detail="paused by ops: maintenance")
        for slot in (b - 16_000, b - 12_000, b - 8000)])
    assert b - 16_000 not in h.history("e")
    h.engine.tick()
    for _ in range(6):
        fire_and_tick(h)
    assert slots_sent(h) == [b + i * 4000 for i in range(-1, 3)]


def test_the_slots_a_pause_decided_are_logged_once_per_catch_up(
        store, namespace, harnesses, caplog):
    """The catch-up's slots before the newest paused run come due one a pace: one INFO line
    names them all (those sent before the pause too, which it does not call missed), not one
    line per slot."""
    h = engine(harnesses, store, namespace, {"e": (EVERY_S, ALL)})
    b = pinned_boundary(h)
    h.store.history.record_many(
        [HistoryRecord("e", b - 16_000, RunEvent.SENT)]
        + [HistoryRecord("e", slot, RunEvent.PAUSED, detail="paused by ops: maintenance")
           for slot in (b - 12_000, b - 8000)])
    caplog.set_level(logging.INFO, "celery_anarchon")
    h.engine.tick()
    for _ in range(6):
        fire_and_tick(h)
    assert slots_sent(h) == [b + i * 4000 for i in range(-1, 3)]
    lines = [r.getMessage() for r in caplog.records if "not caught up" in r.getMessage()]
    assert lines == [
        f"e: slots up to {iso(b - 8000)} not caught up (catch_up='all'): the entry's history "
        f"records paused for slot {iso(b - 8000)}, so they were decided while an instance ran it "
        "(sent, skipped or paused) and none is sent again; the catch-up goes on after it"]
