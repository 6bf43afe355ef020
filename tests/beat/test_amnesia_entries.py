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

import collections
import json
import logging
import os
import sqlite3
import time

import pytest

from celery_anarchon.beat.engine.outage import Outage
from celery_anarchon.beat.engine.sync import EntrySync
from celery_anarchon.stores.base import RunEvent
from celery_anarchon.stores.entry_store import Pause

import backends
from backends import backdate_memory_start
from engine_support import Clocks, Operator, make_plan, memory_store, store_plans
from stores_support import StoreMaker, store_url
from engine_harness import _definition, harnesses, make  # noqa: F401  (a fixture)

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
    h.store.entries.set_pause("other", Pause("", "ops", 0), by="ops")   # the copy holds entries data
    loss.backup(h.store)
    h.store.entries.set_pause("cfg", Pause("maintenance", "ops", 0), by="ops")
    h.store.entries.put_entry("s", _definition(jitter=0, max_late=10), by="ops", create=True)
    h.engine.tick()
    assert "s" in h.engine.plans
    handled = h.engine.due._last_claimed["cfg"]     # the newest slot decided before the loss

    loss.lose(h.store)
    backdate_memory_start(h.store, ["cfg", "s"], 120_000)   # claims would be won now
    with caplog.at_level(logging.INFO, "celery_anarchon"):
        for _ in range(2):
            h.advance(2)
            h.engine.tick()
    reached = h.engine.due._last_claimed["cfg"]
    slots = _slots(2000, handled / 1000, reached / 1000)   # every one decided after the loss
    assert len(slots) >= 2, slots
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
    h.store.entries.set_pause("cfg", None, by="ops")
    h.advance(2)
    h.engine.tick()
    assert [slot for name, slot, _ in h.sent if name == "cfg" and slot > reached], h.sent
    assert "s" in h.engine.plans
    # and accepts the loss: the store entry it lost is no longer run
    with caplog.at_level(logging.INFO, "celery_anarchon"):
        h.store.entries.accept_loss(by="ops")
        h.sync()
    assert "s" not in h.engine.plans
    assert not h.engine.sync.kept


# -- the rules, on the memory store (tests/support/engine_support.py) -------------------------------------

SYNC_S = 5.0


class Synced:
    """An entry sync on the memory store (written by ``operator``) and fake clocks."""

    def __init__(self, **kwargs) -> None:
        self.clocks = Clocks()
        self.store = memory_store(self.clocks)
        self.operator = Operator(self.store, self.clocks.store)
        self.outage = Outage(self.store, self.clocks.mono, collections.Counter())
        self.requested: set = set()
        self.sync = EntrySync(self.store, store_plans, SYNC_S, "ns", self.clocks.mono,
                              self.outage, self.requested, **kwargs)

    def follow(self) -> bool:
        self.clocks.advance(SYNC_S)
        return self.sync.follow()


def test_a_run_now_run_handled_here_is_never_claimed_again_after_the_store_lost_it():
    """The store loses a request this instance claimed, then an older copy brings it back (a
    failback to the old master): the run is not claimed a second time."""
    s = Synced()
    plans = {"cfg": make_plan("cfg", every_s=3600)}
    slot = int(time.time() * 1000) // 3600_000 * 3600_000 + 1       # never an hourly slot
    slot = max(slot, int(time.time() * 1000) - 1000)
    s.operator.request("cfg", "r1", slot)
    s.follow()
    assert [c.run for c in s.sync.requests_due(time.time(), plans)] == [("cfg", slot)]
    s.operator.lose_everything()
    s.follow()
    s.operator.request("cfg", "r1", slot)                             # the older copy is back
    s.follow()
    assert s.sync.requests_due(time.time(), plans) == [], "a run claimed here claimed again"


def test_a_new_epoch_that_lost_nothing_is_no_error(caplog):
    s = Synced(clock=Clocks().wall)
    s.operator.pause("cfg", Pause("why", "ops", 1))
    s.follow()
    first = s.store.entries.entries_epoch().epoch
    s.operator.restart()                   # a restart that kept everything: a new epoch
    s.operator.put("s", "fs")
    second = s.store.entries.entries_epoch().epoch
    with caplog.at_level(logging.INFO, "celery_anarchon"):
        s.follow()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.records
    (line,) = [r.getMessage() for r in caplog.records if "entries epoch changed" in r.getMessage()]
    assert "nothing more is kept" in line and f"{first} to {second}" in line, line
    assert not s.sync.kept and s.sync.pause_detail("cfg") is None


def test_what_is_kept_follows_the_newer_record_of_each_name(caplog):
    """After a loss, each name follows the newer of the record this instance knew and the store's
    (store clock): an older copy's records never win over newer ones known here, a record written
    after the loss always wins, and an accepted loss wins over every record older than it."""
    s = Synced(clock=Clocks().wall)
    s.operator.put("old", "f-old")                         # in the copy, unchanged since
    s.operator.put("gone", "f-gone")                       # in the copy, removed since
    copy = s.operator.copy()
    s.operator.put("cfg", None, Pause("deploy", "ops", 1))  # written after the copy
    s.operator.put("s", "f-s")
    s.operator.put("gone", None)                           # removed: a cleared record
    s.follow()
    assert set(s.sync.store_plans) == {"old", "s"}
    s.operator.put_back(copy)                           # the copy put back: the version goes back
    with caplog.at_level(logging.INFO, "celery_anarchon"):
        s.follow()
    assert set(s.sync.store_plans) == {"old", "s"}, "gone stays removed, s keeps running"
    assert s.sync.pause_detail("cfg").startswith("paused by ops: deploy; the pause is kept by")
    record = s.sync.kept.record()
    assert (record["pauses"], record["entries"], record["withheld"]) == (
        {"cfg": "paused by ops: deploy"}, ["s"], ["gone"])
    (error,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "version went back from 5 to 2" in error and "withheld" not in error, error
    assert "removed before the loss that the store brought back (not run): gone" in error

    s.operator.put("s", "f-s2")                            # written again after the loss: followed
    s.follow()
    assert s.sync.store_plans["s"].fingerprint == "f-s2" and "s" not in s.sync.kept.record()["entries"]
    s.operator.accept_loss(by="ops")                       # every older record: the store's
    with caplog.at_level(logging.INFO, "celery_anarchon"):
        s.follow()
    assert not s.sync.kept and s.sync.kept.record() is None
    assert set(s.sync.store_plans) == {"old", "gone", "s"}, "the store as it is"
    assert s.sync.pause_detail("cfg") is None


def test_a_second_loss_keeps_what_the_first_kept_and_an_accept_seen_late_still_counts():
    s = Synced(clock=Clocks().wall)
    s.operator.put("cfg", None, Pause("deploy", "ops", 1))
    s.follow()
    s.operator.lose_everything()
    s.follow()
    assert s.sync.pause_detail("cfg")
    s.operator.restart()
    s.operator.put("other", "f-other")
    s.operator.lose_everything()                           # again, before anyone wrote cfg
    s.follow()
    assert s.sync.pause_detail("cfg"), "the pause is still kept"
    s.operator.accept_loss(by="ops")                      # accepted...
    s.operator.lose_everything()                          # ...and lost again before this sync
    s.operator.accept_loss(by="ops")
    s.follow()
    assert not s.sync.kept, "the accept is newer than every record kept"


def test_status_the_page_and_the_metrics_show_what_an_instance_keeps(tmp_path, namespace,
                                                                     harnesses):
    """``status`` (its data and text), the page and the metrics: which instance keeps which
    pause and store entry since when and why, with the fix; nothing once the loss is accepted."""
    pytest.importorskip("prometheus_client")
    pytest.importorskip("jinja2")
    from celery_anarchon.beat.metrics import PrometheusObserver
    from celery_anarchon.operate.overview import LOST_FIX, lost_lines, overview
    from celery_anarchon.operate.web import render_page
    url = store_url("sqlite", str(tmp_path))
    h = make(harnesses, url, namespace, CFG, sync_s=1)
    h.app.conf.update(beat_schedule={"cfg": {"task": "proj.t", "schedule": 2.0}},
                      anarchon_namespace=namespace, anarchon_store_url=url)
    observer = PrometheusObserver(instance_id="A", namespace=namespace)
    h.engine.sync.kept.observer = observer
    h.store.entries.set_pause("cfg", Pause("maintenance", "ops", 0), by="ops")
    h.store.entries.put_entry("s", _definition(jitter=0, max_late=10), by="ops", create=True)
    h.engine.tick()
    backends.wipe("sqlite", url, namespace)
    h.sync()

    def metric(name, **labels):
        return observer.registry.get_sample_value(name, labels)
    assert metric("anarchon_entries_lost_total") == 1
    assert (metric("anarchon_entries_kept", kind="pause"), metric("anarchon_entries_kept",
                                                                   kind="entry")) == (1, 1)
    data = overview(h.app, h.store)
    (lost,) = data["lost"]
    assert lost["instance_id"] == "A" and lost["pauses"] == {"cfg": "paused by ops: maintenance"}
    assert lost["entries"] == ["s"] and "gone" in lost["why"] and lost["since"]
    (cfg,) = [e for e in data["entries"] if e["name"] == "cfg"]
    assert cfg["state"] == "kept" and cfg["paused"] is None
    assert cfg["kept"] == [{"instance": lost["instance"], "what": "pause",
                            "detail": "paused by ops: maintenance"}]
    text = "\n".join(lost_lines(data))
    for words in ("ERROR: the store lost entries data", f"{lost['instance']} since",
                  "pause kept (no run claimed there): cfg (paused by ops: maintenance)",
                  "store entries kept running: s", LOST_FIX):
        assert words in text, (words, text)
    page = render_page(data)
    assert "the store lost entries data" in page and "paused (kept)" in page
    buttons = render_page(data, actions=True)       # a kept pause is lifted by a resume
    assert 'data-action="resume" data-entry="cfg"' in buttons

    h.store.entries.accept_loss(by="ops")
    h.sync()
    assert overview(h.app, h.store)["lost"] == []
    assert metric("anarchon_entries_kept", kind="pause") == 0


def test_status_names_what_each_instance_keeps_and_accept_loss_records_the_operators_word(
        tmp_path, namespace):
    """``celery -A proj anarchon status`` and ``accept-loss`` as an operator runs them."""
    from celery_anarchon.stores import open_store
    from celery_anarchon.stores.entry_store import InstanceRecord
    from operate_support import exits, operate
    url = store_url("sqlite", str(tmp_path))
    store = open_store(url, namespace=namespace, instance_id="beat-a:7:aa", options={})
    now = int(time.time() * 1000)
    kept = {"since": now - 5_000, "why": "its entries epoch 3f9a is gone (...)",
            "pauses": {"every-2s": "paused by ops: freeze"}, "entries": ["dyn"], "withheld": [],
            "counts": {"pauses": 1, "entries": 1, "withheld": 0}, "requests": 0}
    try:
        store.prepare([])
        store.instances.record_instance(InstanceRecord("beat-a:7:aa", "beat-a", 7, "0.1.0", now - 60_000,
                                             now, 0, 3, "d", kept=kept), ttl_ms=600_000)
        out = exits(operate(url, namespace, "good", "status"), 0)
        for words in ("ERROR: the store lost entries data; these instances keep what they knew:",
                      "beat-a:7 since", "its entries epoch 3f9a is gone",
                      "pause kept (no run claimed there): every-2s (paused by ops: freeze)",
                      "store entries kept running: dyn", "-A operate_app anarchon accept-loss",
                      "paused (kept by beat-a:7)"):
            assert words in out, (words, out)
        done = json.loads(exits(operate(url, namespace, "good", "accept-loss", "--by", "ops",
                                        "--json"), 0))
        assert done["by"] == "ops" and done["accepted"]
        loaded = store.entries.load_entries()
        assert loaded.accepted_by == "ops" and loaded.accepted_ms > now - 60_000
    finally:
        store.close()


def test_a_store_that_forgot_runs_is_synced_before_the_next_claim(tmp_path, namespace, harnesses):
    """With a long sync interval, an instance whose claims the store answers forgotten (its
    memory began again: it lost its data) looks at the store's entries before it claims again,
    so a paused entry is never won once the store's first 10 s have passed."""
    url = store_url("sqlite", str(tmp_path))
    h = make(harnesses, url, namespace, CFG, sync_s=3600)
    h.store.entries.set_pause("cfg", Pause("maintenance", "ops", 0), by="ops")
    h.engine.tick()                                   # the first sync: cfg is paused
    backends.wipe("sqlite", url, namespace)
    h.advance(2)
    h.engine.tick()                                   # claimed: forgotten (a new memory)
    assert h.engine.stats["claim_forgotten"] >= 1, h.engine.stats   # (two slots, late in one)
    backdate_memory_start(h.store, ["cfg"], 120_000)  # the store's first 10 s are over
    h.advance(2)
    h.engine.tick()
    assert not [s for name, s, _ in h.sent if name == "cfg"], h.sent
    assert h.engine.sync.pause_detail("cfg"), "the loss was seen before the claim"


def test_a_store_error_makes_the_next_sync_come_before_the_next_claims():
    """A store that could not be reached may come back empty: the sync after it comes at once,
    not an interval later."""
    s = Synced(clock=Clocks().wall)
    s.follow()
    s.clocks.advance(1)
    assert not s.sync.due()
    s.outage.failed(RuntimeError("connection refused"), "claiming 1 run(s)")
    assert not s.sync.due(), "the backoff first"
    s.clocks.advance(1)
    assert s.sync.due() and s.sync.next_try() <= s.clocks.mono()
    s.sync.follow()
    assert not s.sync.due()
