"""A store that lost its entries, pauses or run-now requests (docs/design.md "Amnesia"), seen by
one engine following a real store: SQLite replaced by an older copy, PostgreSQL's tables dropped
or rolled back to an older copy, Redis flushed or rolled back to an older copy.

An instance that sees the store lose what it knew keeps it: a paused entry stays paused (never
claimed here, recorded ``paused`` with a detail saying the pause is kept from before the loss), a
store entry keeps running, and the loss is an ERROR naming what is kept and the fix. It follows
the store again for a name once an operator writes that name again (a pause, a resume, an add),
and for every name once an operator accepts the loss.
"""
from __future__ import annotations

import logging
import os
import sqlite3

import pytest

from celery_anarchon.stores.base import RunEvent
from celery_anarchon.stores.entry_store import Pause

import backends
from backends import backdate_memory_start
from stores_support import StoreMaker, store_url
from test_engine import _definition, harnesses, make  # noqa: F401  (a fixture)

#: how each store loses its entries: (store kind, "restored" (an older copy: the same entries
#: epoch, an older version) or "wiped" (nothing left))
LOSSES = [("sqlite", "restored"), ("postgresql", "wiped"), ("postgresql", "restored"),
          ("redis", "wiped"), ("redis", "restored")]

CFG = {"cfg": (2, {"jitter": 0, "max_late": 10})}


class Loss:
    """Takes a copy of the store (:meth:`backup`) and makes it lose what was written since
    (:meth:`lose`): the copy put back, or everything wiped."""

    def __init__(self, kind: str, how: str, url: str, namespace: str) -> None:
        self.kind, self.how, self.url, self.namespace = kind, how, url, namespace
        self.maker = StoreMaker(kind, url, namespace)
        self.copy = None

    def backup(self, store) -> None:
        if self.how != "restored":
            return
        if self.kind == "sqlite":
            self.copy = store.path + ".backup"
            with sqlite3.connect(store.path) as source, sqlite3.connect(self.copy) as target:
                source.backup(target)
        else:
            self.copy = self.maker.snapshot()

    def lose(self, store) -> None:
        if self.how == "wiped":
            backends.wipe(self.kind, self.url, self.namespace)
        elif self.kind == "sqlite":
            os.replace(self.copy, store.path)
            for name in (store.path + "-wal", store.path + "-shm"):
                if os.path.exists(name):
                    os.remove(name)
        else:
            # the copy back, as the same server (the entries epoch of the copy is the same as
            # the store's: only its version is older)
            self.maker.lose_writes_since(self.copy)


def _slots(period_ms: int, lo_s: float, hi_s: float) -> list[int]:
    first = int(lo_s * 1000) // period_ms * period_ms + period_ms
    return list(range(first, int(hi_s * 1000) + 1, period_ms))


@pytest.mark.parametrize("kind, how", LOSSES)
def test_an_instance_keeps_the_pauses_and_store_entries_its_store_lost(
        kind, how, tmp_path, namespace, harnesses, caplog):
    url = store_url(kind, str(tmp_path))
    loss = Loss(kind, how, url, namespace)
    h = make(harnesses, url, namespace, CFG, sync_s=1)
    h.store.set_pause("other", Pause("", "ops", 0), by="ops")   # the copy holds entries data
    loss.backup(h.store)
    h.store.set_pause("cfg", Pause("maintenance", "ops", 0), by="ops")
    h.store.put_entry("s", _definition(jitter=0, max_late=10), by="ops", create=True)
    h.engine.tick()
    assert "s" in h.engine.plans

    loss.lose(h.store)
    backdate_memory_start(h.store, ["cfg", "s"], 120_000)   # claims would be won now
    lost_at = h.clock()
    with caplog.at_level(logging.INFO, "celery_anarchon"):
        for _ in range(2):
            h.advance(2)
            h.engine.tick()
    slots = _slots(2000, lost_at, h.clock())
    assert len(slots) == 2, slots
    sent = [slot for name, slot, _ in h.sent if name == "cfg"]
    assert not [s for s in slots if s in sent], (
        f"the paused entry was sent after the store lost its pause: {sent}, {h.sent}")
    history = h.history("cfg")
    for slot in slots:
        record = history.get(slot)
        assert record is not None and record.event is RunEvent.PAUSED, (slot, record)
        assert record.detail.startswith("paused by ops: maintenance") and "kept" in record.detail
    assert "s" in h.engine.plans, "the store entry stopped when the store lost it"
    assert [s for s in slots if ("s", s, 1) in h.sent] == slots, h.sent
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    (line,) = [m for m in errors if "anarchon: store entries lost" in m]
    for words in ("cfg (paused by ops: maintenance)", "store entries (they keep running): s",
                  "accept-loss", "pause cfg --reason maintenance"):
        assert words in line, (words, line)

    # an operator resumes the entry: the store holds the name again, it runs
    h.store.set_pause("cfg", None, by="ops")
    h.advance(2)
    h.engine.tick()
    (nxt,) = _slots(2000, h.clock() - 2, h.clock())
    assert ("cfg", nxt, 1) in h.sent, h.sent
    assert "s" in h.engine.plans
    # and accepts the loss: the store entry it lost is no longer run
    with caplog.at_level(logging.INFO, "celery_anarchon"):
        h.store.accept_loss(by="ops")
        h.sync()
    assert "s" not in h.engine.plans
    assert not h.engine.sync.kept
