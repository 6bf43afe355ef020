"""Catch-up of store entries (docs/timing.md "Catch-up after an outage"; docs/schedules.md, what
a change does): a store entry added or updated at run time with ``catch_up='all'`` catches up
no slot from before the change (the store's clock at the write), apart from the newest slot
still within max_late (the start-up rule of ``add``). The engine harness on real stores, its
wall clock pinned half a second after the write, the store's clock the real one."""
from __future__ import annotations

import logging

import pytest

from celery_anarchon.schedule import definition as entry_json

from backends import backdate_memory_start
from stores_support import VARIANT_OPTIONS, store_url
from engine_harness import harnesses, make  # noqa: F401  (a fixture)

EVERY_S = 4
MAX_LATE_S = 3
ALL = {"jitter": 0, "max_late": MAX_LATE_S, "catch_up": "all", "catch_up_window": 20}


@pytest.fixture(params=["memory", "sqlite", "redis-stream-id"])
def store(request, tmp_path):
    return store_url(request.param, str(tmp_path)), VARIANT_OPTIONS.get(request.param, {})


def definition(**anarchon) -> str:
    return entry_json.canonical({"task": "proj.t", "schedule": {"every": EVERY_S},
                                 "anarchon": {**ALL, **anarchon}})


def fire_and_tick(h) -> None:
    h.advance(h.engine.next_fire() - h.clock())
    h.engine.tick()


def expected_slots(written_ms: int, now_ms: int, count: int) -> list[int]:
    """The slots sent: the newest slot within max_late at ``now_ms`` if there is one, else the
    first at or after the write; then each next slot."""
    step = EVERY_S * 1000
    newest = now_ms // step * step
    first = newest if now_ms - newest <= MAX_LATE_S * 1000 else -(-written_ms // step) * step
    first = min(first, -(-written_ms // step) * step)
    return [first + i * step for i in range(count)]


@pytest.mark.parametrize("change", ["add", "update"])
def test_a_store_entry_catches_up_nothing_from_before_it_was_written(
        store, namespace, harnesses, change, caplog):
    url, options = store
    h = make(harnesses, url, namespace, {}, store_options=options, sync_s=1)
    backdate_memory_start(h.store, ["s"], 120_000)      # the store has been in service a while
    written = h.store.entries.put_entry("s", definition(), by="ops", create=True)
    if change == "update":
        written = h.store.entries.put_entry("s", definition(catch_up_window=19), by="ops",
                                            create=False)
    now = h.clock.pin(written.updated_ms / 1000 + 0.5)
    with caplog.at_level(logging.INFO, "celery_anarchon"):
        h.engine.tick()                                 # the sync loads "s" and seeds it
        while len(h.sent) < 3:
            fire_and_tick(h)
    assert [slot for _, slot, _ in h.sent] == expected_slots(written.updated_ms,
                                                             int(now * 1000), 3)
    assert not [r for r in caplog.records if "catching up" in r.getMessage()]
