"""Missed slots and a store that lost its newest writes (docs/missed-runs.md, "What is promised";
docs/design.md "Amnesia"; celery_anarchon/beat/engine/gaps.py): the runs sent between the
store's last snapshot and its restart are not in its history, and the store cannot say what ran
before its memory began again, so none of those slots is called missed. One engine on a real
store whose writes since a copy are lost and whose server epoch changed
(tests/support/engine_harness.py)."""
from __future__ import annotations

import os
import sqlite3
import time

import pytest

from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import HistoryRecord, RunEvent

from backends import backdate_memory_start
from stores_support import StoreMaker, store_url
from engine_harness import harnesses, make  # noqa: F401  (a fixture)

#: "e": every 2 s; "slow": every 60 s (no slot of it due when the new instance starts, mostly)
ENTRIES = {"e": (2, {"jitter": 0, "max_late": 2}), "slow": (60, {"jitter": 0, "max_late": 2})}
#: past the settle time of ENTRIES (their longest claim window), seconds of the monotonic clock
SETTLE_S = 60.0


def _slots(period_ms: int, lo_ms: int, hi_ms: int) -> list[int]:
    """The slots of a ``period_ms`` entry in ``(lo_ms, hi_ms]``."""
    return list(range(lo_ms - lo_ms % period_ms + period_ms, hi_ms + 1, period_ms))


def _sent(store, entry: str, slots: list[int]) -> None:
    store.history.record_many([HistoryRecord(entry, slot, RunEvent.SENT) for slot in slots])


def _copy(kind: str, maker: StoreMaker, store):
    if kind == "sqlite":
        copy = store.path + ".copy"
        with sqlite3.connect(store.path) as source, sqlite3.connect(copy) as target:
            source.backup(target)
        return copy
    return maker.snapshot()


def _restore(kind: str, maker: StoreMaker, store, copy) -> None:
    """The copy back, under another server epoch (another file, another server's id)."""
    if kind == "sqlite":
        os.replace(copy, store.path)
        for name in (store.path + "-wal", store.path + "-shm"):
            if os.path.exists(name):
                os.remove(name)
    else:
        maker.lose_writes_since(copy)


@pytest.mark.parametrize("kind", ["memory", "sqlite", "redis"])
def test_runs_sent_after_the_snapshot_a_store_came_back_from_are_not_missed(
        kind, tmp_path, namespace, harnesses):
    url = store_url(kind, str(tmp_path))
    maker = StoreMaker(kind, url, namespace)
    now_ms = int(time.time() * 1000)
    earlier = open_store(url, namespace=namespace, instance_id="earlier", options={})
    try:
        earlier.prepare(list(ENTRIES))
        backdate_memory_start(earlier, list(ENTRIES), 600_000)
        _sent(earlier, "e", _slots(2_000, now_ms - 120_000, now_ms - 60_000))
        _sent(earlier, "slow", _slots(60_000, now_ms - 600_000, now_ms - 180_000))
        copy = _copy(kind, maker, earlier)                    # the snapshot
        _sent(earlier, "e", _slots(2_000, now_ms - 60_000, now_ms - 2_000))
        _sent(earlier, "slow", _slots(60_000, now_ms - 180_000, now_ms - 2_000))
    finally:
        earlier.close()
    _restore(kind, maker, earlier, copy)                      # the crash, the restart
    h = make(harnesses, url, namespace, ENTRIES, instance="B", backdate=False)
    h.engine.tick()              # its first claims: the store notices its epoch changed
    forgotten = [r for r in h.store.history.read("e") if r.event is RunEvent.FORGOTTEN]
    assert forgotten and "epoch" in forgotten[0].detail, forgotten
    h.mono.offset += SETTLE_S
    h.engine.tick()              # settled: the check
    for name in ENTRIES:
        missed = [r for r in h.store.history.read(name) if r.event is RunEvent.MISSED]
        assert missed == [], (name, missed)
