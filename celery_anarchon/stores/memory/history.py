"""The history of a memory store: one record per run, the newest ``history_size`` runs of each
entry (:meth:`celery_anarchon.stores.parts.History.record`), written by the rules every store
keeps (the SQL stores: :mod:`celery_anarchon.stores.sql.history`; Redis: its Lua), and the texts
of definitions: the store's ``history`` part, :class:`MemoryHistory`.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager

from celery_anarchon.stores.base import (
    AFTER_SEND, MAX_EARLIER, SEND_NOTES, SKIP_EVENTS, HistoryRecord, RunEvent, keeps_earlier,
)
from celery_anarchon.stores.memory.state import Server, Space
from celery_anarchon.stores.parts import History

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


class MemoryHistory(History):
    """The ``history`` part of :class:`~celery_anarchon.stores.memory.store.MemoryStore`, each
    operation under the server's lock.

    :param operation: ``operation(what)``: the store's lock held for one operation, as a context
        of ``(server, space, now)``.
    """

    def __init__(self, *, instance_id: str, history_size: int,
                 operation: Callable[[str], AbstractContextManager[tuple[Server, Space, int]]]
                 ) -> None:
        self.instance_id = instance_id
        self.history_size = history_size
        self.operation = operation

    def record(self, entry: str, slot_ms: int, event: RunEvent, *, task_id: str = "",
               attempt: int = 1, detail: str = "") -> None:
        """:meth:`record_many` of one note."""
        self.record_many([HistoryRecord(entry, slot_ms, event, task_id=task_id, attempt=attempt,
                                        detail=detail)])

    def record_many(self, notes: Sequence[HistoryRecord]) -> None:
        """Each note as this instance at the store's time, by the rules of :func:`write`;
        consecutive notes written the same way are one group, chained (earlier records kept)
        when one of them is of a later attempt, as in SQL."""
        if not notes:
            return
        with self.operation("record") as (_, space, now):
            for how, group in itertools.groupby(notes, key=lambda n: how_written(n.event)):
                group = list(group)
                chained = any(n.attempt > 1 for n in group)
                for n in group:
                    write(space, HistoryRecord(n.entry, n.slot_ms, n.event, self.instance_id, now,
                                               n.task_id, n.attempt, n.detail),
                          how=how, chained=chained)
            trim(space, {n.entry for n in notes}, self.history_size)

    def read(self, entry: str, limit: int | None = None) -> list[HistoryRecord]:
        """The entry's newest runs, newest slot first (at most ``limit`` or ``history_size``)."""
        with self.operation("read history") as (_, space, _now):
            return newest(space, entry, limit or self.history_size)

    def read_many(self, entries: Iterable[str],
                  limit: int | None = None) -> dict[str, list[HistoryRecord]]:
        """:meth:`read` of each of ``entries`` in one operation."""
        names = list(dict.fromkeys(entries))
        limit = self.history_size if limit is None else int(limit)
        with self.operation("read history") as (_, space, _now):
            return {name: newest(space, name, limit) if limit >= 1 else [] for name in names}

    def save_definition(self, entry: str, fingerprint: str, text: str) -> None:
        """Remember the text of ``fingerprint`` (replacing an older text of it)."""
        self.save_definitions([(entry, fingerprint, text)])

    def save_definitions(self, definitions: Iterable[tuple[str, str, str]]) -> None:
        """:meth:`save_definition` of each ``(entry, fingerprint, text)``, in one operation."""
        with self.operation("save definitions") as (_, space, _now):
            for entry, fingerprint, text in definitions:
                space.definitions[(entry, fingerprint)] = text

    def load_definition(self, entry: str, fingerprint: str) -> str | None:
        """The text saved for ``fingerprint``, or ``None``."""
        with self.operation("load a definition") as (_, space, _now):
            return space.definitions.get((entry, fingerprint))
