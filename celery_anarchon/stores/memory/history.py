"""The history of a memory store: one record per run, the newest ``history_size`` runs of each
entry (:meth:`celery_anarchon.stores.base.ClaimStore.record`), written by the rules every store
keeps (the SQL stores: :mod:`celery_anarchon.stores.sql.history`; Redis: its Lua).
"""
from __future__ import annotations

import dataclasses

from celery_anarchon.stores.base import (
    AFTER_SEND, MAX_EARLIER, SEND_NOTES, SKIP_EVENTS, HistoryRecord, RunEvent, keeps_earlier,
)
from celery_anarchon.stores.memory.state import Space

#: how a record is written (:func:`write`)
FILL, REPLACE, SEND = "fill", "replace", "send"


def how_written(event: RunEvent) -> str:
    """:data:`FILL` for the skips (:data:`~celery_anarchon.stores.base.SKIP_EVENTS`), :data:`SEND`
    for a beat's notes of its publish (:data:`~celery_anarchon.stores.base.SEND_NOTES`), else
    :data:`REPLACE`."""
    return FILL if event in SKIP_EVENTS else SEND if event in SEND_NOTES else REPLACE


def _later(old: HistoryRecord, note: HistoryRecord) -> bool:
    """``old`` records a later step than the send note ``note``: a later attempt, or what
    happened to ``note``'s own attempt after its message was published."""
    return old.attempt > note.attempt or (old.attempt == note.attempt and old.event in AFTER_SEND)


def write(space: Space, record: HistoryRecord, *, how: str = REPLACE, keep_task_id: bool = False,
          chained: bool = False) -> None:
    """Write ``record`` (its instance and store time set) as its run's record:

    1. a run with no record gets it, whatever ``how``;
    2. :data:`FILL` (a skip) never overwrites a record: a claimed run's history never says late;
    3. :data:`SEND` never replaces a later attempt's record, nor one of
       :data:`~celery_anarchon.stores.base.AFTER_SEND` of its own attempt (a worker or a
       takeover may have recorded the run's next step before beat's note of its publish);
    4. otherwise it replaces the record, keeping its task id (``keep_task_id``) and its earlier
       records, to which a ``chained`` write (lease events, a later attempt's notes) adds the
       replaced record when :func:`~celery_anarchon.stores.base.keeps_earlier` says so (at most
       :data:`~celery_anarchon.stores.base.MAX_EARLIER`, the newest).
    """
    runs = space.history.setdefault(record.entry, {})
    old = runs.get(record.slot_ms)
    if old is None:                                            # 1.
        runs[record.slot_ms] = record
        return
    if how == FILL or (how == SEND and _later(old, record)):   # 2., 3.
        return
    earlier = old.earlier                                      # 4.
    if chained and keeps_earlier(old.event, record.event):
        earlier = (*earlier, dataclasses.replace(old, earlier=()))[-MAX_EARLIER:]
    runs[record.slot_ms] = dataclasses.replace(
        record, task_id=old.task_id if keep_task_id else record.task_id, earlier=earlier)


def trim(space: Space, entries: set[str], history_size: int) -> None:
    """Keep the newest ``history_size`` runs (by slot) of each of ``entries``."""
    for entry in entries:
        runs = space.history.get(entry, {})
        for slot in sorted(runs, reverse=True)[history_size:]:
            del runs[slot]


def newest(space: Space, entry: str, limit: int) -> list[HistoryRecord]:
    """The entry's records, newest slot first, at most ``limit``."""
    runs = space.history.get(entry, {})
    return [runs[slot] for slot in sorted(runs, reverse=True)[:limit]]
