"""The whole engine on one instance against a real store (tests/beat/test_engine.py, and the
amnesia tests of tests/beat/test_amnesia_entries.py): a Celery app with the schedule's plans, the
engine's clocks (real time plus an offset the test moves, or pinned), and the sends in a list.

    h = make(harnesses, url, namespace, {"e": (2, {"jitter": 0, "max_late": 10})})
"""
from __future__ import annotations

import random
import time

import pytest
from celery import Celery
from celery.beat import ScheduleEntry

from celery_anarchon import install
from celery_anarchon.schedule import definition as entry_json
from celery_anarchon.beat.engine import Engine
from celery_anarchon.schedule.plan import build_plan, build_plans
from celery_anarchon.stores import open_store
from celery_anarchon.settings import Settings

from backends import backdate_memory_start


class Clock:
    """Real time plus ``offset`` seconds (``time.time`` for the wall clock, ``time.monotonic``
    for the engine's clock of elapsed time)."""

    def __init__(self, source=time.time):
        self.source = source
        self.offset = 0.0

    def __call__(self):
        return self.source() + self.offset

    def pin(self, at: float) -> float:
        """Stop the clock at ``at`` (the source's unit): from now on it moves only by ``offset``,
        as the test moves it, however long the machine takes. Returns ``at``."""
        self.source, self.offset = (lambda: at), 0.0
        return at


class Harness:
    """One instance's engine on the store at ``url``, with ``entries`` (name -> (schedule,
    ``anarchon`` options)) as its beat_schedule; ``backdate``: the store has been in service for
    a while (its memory start two minutes back); ``sync_s``: the interval of the sync of the
    store's entries (None: no sync)."""

    def __init__(self, url, namespace, entries, *, instance="A", store_options=None, send=None,
                 backdate=True, sync_s=None):
        self.app = Celery("proj", set_as_current=False)
        self.app.conf.broker_url = "memory://"
        if any("lease" in opts for _, opts in entries.values()):
            install(self.app)
        self.store = open_store(url, namespace=namespace, instance_id=instance,
                                options=store_options or {})
        schedule = {name: ScheduleEntry(name=name, task="proj.t", schedule=sched,
                                        options={"anarchon": opts}, app=self.app)
                    for name, (sched, opts) in entries.items()}
        self.plans = build_plans(schedule, app=self.app, settings=Settings.from_app(self.app),
                                 store=self.store)
        if backdate:
            self.store.prepare(list(self.plans))
            backdate_memory_start(self.store, list(self.plans), 120_000)
        self.sent: list[tuple[str, int, int]] = []
        self.clock = Clock()
        self.mono = Clock(time.monotonic)
        self.engine = Engine(self.store, self.plans, instance_id=instance, namespace=namespace,
                             send=send or self.record_send, clock=self.clock, rng=random.Random(7),
                             monotonic=self.mono, sync_interval_s=sync_s,
                             build_store_plans=self.store_plans)

    def store_plans(self, snapshot):
        """Store entries -> plans, as the scheduler builds them (entry_json, then build_plan)."""
        settings = Settings.from_app(self.app)
        return {name: build_plan(name, entry_json.parse(name, stored.definition, app=self.app),
                                 app=self.app, settings=settings, store=self.store)
                for name, stored in snapshot.entries.items() if stored.definition is not None}

    def sync(self, seconds=1.0):
        """The next sync comes (only the monotonic clock moves), and a tick does it."""
        self.mono.offset += seconds
        self.engine.tick()

    def advance(self, seconds: float):
        """Time passes (both clocks move), without waiting for it."""
        self.clock.offset += seconds
        self.mono.offset += seconds

    def pin(self, period_s: float, after_s: float = 0.0) -> float:
        """Pin the wall clock ``after_s`` past the slot boundary of ``period_s`` nearest to real
        time (at most half a period from the store's clock, whose lateness and early limits are
        10 s past max_late and 10 s ahead). Returns the boundary, epoch seconds."""
        boundary = round(time.time() / period_s) * period_s
        self.clock.pin(boundary + after_s)
        return boundary

    def record_send(self, plan, slot_ms, attempt, token, task_id):
        self.sent.append((plan.name, slot_ms, attempt))

    def run_for(self, seconds: float):
        """Tick as beat would, sleeping what the engine asks, for ``seconds`` of real time."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            delay = self.engine.tick()
            assert 0 < delay <= 60
            time.sleep(min(delay, max(0.0, end - time.monotonic())))

    def history(self, entry):
        return {h.slot_ms: h for h in self.store.history.read(entry)}

    def close(self):
        self.store.close()


@pytest.fixture
def harnesses():
    """The harnesses a test made (:func:`make`), closed after it."""
    made = []
    yield made
    for h in made:
        h.close()


def make(harnesses, *args, **kwargs) -> Harness:
    """A :class:`Harness` (``Harness(*args, **kwargs)``) closed after the test."""
    h = Harness(*args, **kwargs)
    harnesses.append(h)
    return h


def _definition(**anarchon):
    """A store entry's definition: ``proj.t`` every 2 s with these ``anarchon`` options."""
    return entry_json.canonical({"task": "proj.t", "schedule": {"every": 2}, "anarchon": anarchon})
