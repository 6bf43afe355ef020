"""A new store's first refusals against a store that lost its data, in beat's log
(celery_anarchon/beat/engine/skips.py): the slots of a new store's first 10 s are refused as
forgotten (docs/design.md "Amnesia") and logged as one INFO line per beat; a store that forgot
runs this instance already handled, or whose epoch changed, is a WARNING per entry. One engine on
a real store (tests/support/engine_harness.py)."""
from __future__ import annotations

import logging
import os
import sqlite3

import pytest

from celery_anarchon.stores.base import RunEvent, memory_began_ms

import backends
from stores_support import store_url
from engine_harness import harnesses, make  # noqa: F401  (a fixture)

ENTRIES = {name: (2, {"jitter": 0, "max_late": 10}) for name in ("a", "b", "c")}


def _said(caplog, level: int) -> list[str]:
    """What the skip log said at ``level`` (the store's own start-up warnings aside)."""
    return [r.getMessage() for r in caplog.records
            if r.levelno == level and r.name == "celery_anarchon.beat.engine.skips"]


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_new_stores_first_refusals_are_one_info_line_and_a_history_note_each(
        kind, tmp_path, namespace, harnesses, caplog):
    h = make(harnesses, store_url(kind, str(tmp_path)), namespace, ENTRIES, backdate=False)
    h.pin(2, after_s=0.5)                # both ticks in the same slot, however long they take
    with caplog.at_level(logging.DEBUG, "celery_anarchon"):
        h.engine.tick()
        assert h.engine.stats["claim_forgotten"] == 3, h.engine.stats
        h.engine.tick()
        assert not _said(caplog, logging.WARNING)
        assert not [m for m in _said(caplog, logging.INFO) if m.startswith("new store")]
        h.advance(16)                    # the store's first 10 s and the settling time passed
        h.engine.skips.flush()
        h.engine.skips.flush()
    [line] = [m for m in _said(caplog, logging.INFO) if m.startswith("new store")]
    assert line.startswith("new store: 3 entries' slots before "), line
    assert "refused (a new store refuses the slots of its first 10 s as forgotten" in line, line
    assert not _said(caplog, logging.WARNING)
    for name in ENTRIES:
        [record] = h.history(name).values()
        assert record.event is RunEvent.FORGOTTEN and memory_began_ms(record.detail), record


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_store_that_forgot_runs_this_beat_handled_still_warns_per_entry(
        kind, tmp_path, namespace, harnesses, caplog):
    url = store_url(kind, str(tmp_path))
    h = make(harnesses, url, namespace, ENTRIES)
    h.engine.tick()
    assert sorted(name for name, _, _ in h.sent) == ["a", "b", "c"], h.sent
    backends.wipe(kind, url, namespace)
    h.advance(2)
    with caplog.at_level(logging.DEBUG, "celery_anarchon"):
        h.engine.tick()
        h.advance(16)
        h.engine.skips.flush()
    warned = [m for m in _said(caplog, logging.WARNING) if "does not remember" in m]
    assert sorted(m.split(":")[0] for m in warned) == ["a", "b", "c"], warned
    assert not [m for m in _said(caplog, logging.INFO) if m.startswith("new store")]


def test_a_new_instance_on_a_store_whose_epoch_changed_warns_per_entry(
        tmp_path, namespace, harnesses, caplog):
    """The store says its epoch changed (an SQLite file replaced by a copy: another inode): not
    a new store, though this instance never ran an entry."""
    url = store_url("sqlite", str(tmp_path))
    first = make(harnesses, url, namespace, ENTRIES)
    first.close()
    path = first.store.path
    with sqlite3.connect(path) as source, sqlite3.connect(path + ".copy") as target:
        source.backup(target)
    os.replace(path + ".copy", path)
    h = make(harnesses, url, namespace, ENTRIES, instance="B", backdate=False)
    with caplog.at_level(logging.DEBUG, "celery_anarchon"):
        h.engine.tick()
        h.advance(16)
        h.engine.skips.flush()
    assert h.engine.stats["claim_forgotten"] == 3, h.engine.stats
    warned = [m for m in _said(caplog, logging.WARNING) if "does not remember" in m]
    assert len(warned) == 3 and all("epoch changed" in m for m in warned), warned
    assert not [m for m in _said(caplog, logging.INFO) if m.startswith("new store")]
