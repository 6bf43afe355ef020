"""History and definitions of the SQL stores (``anarchon_history``, ``anarchon_definitions``): a
part of :class:`~celery_anarchon.stores.sql.store.SQLStore`, given what it needs of the store.
Instants are UTC ms on the store's clock.
"""
from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from celery_anarchon.stores.base import (
    AFTER_SEND, MAX_EARLIER, SEND_NOTES, SKIP_EVENTS, HistoryRecord, RunEvent, keeps_earlier,
)
from celery_anarchon.stores.parts import History
from celery_anarchon.stores.sql import schema

_RUN_KEY = ("namespace", "entry", "slot_ms")
#: ``read_many`` names at most this many entries in one query
HISTORY_BATCH = 1000
#: runs read per statement by a write that keeps earlier attempts' records
_LOOKUP_CHUNK = 500
#: the fields of a record kept in ``earlier`` (JSON)
_EARLIER_FIELDS = ("event", "instance", "store_ms", "task_id", "attempt", "detail")
_AFTER_SEND = {e.value for e in AFTER_SEND}


def _records(r: Any) -> HistoryRecord:
    """A row of ``anarchon_history`` as a record, with the earlier attempts' records it keeps."""
    earlier = tuple(HistoryRecord(entry=r.entry, slot_ms=r.slot_ms, event=RunEvent(e["event"]),
                                  instance=e["instance"], store_ms=e["store_ms"],
                                  task_id=e["task_id"], attempt=e["attempt"], detail=e["detail"])
                    for e in json.loads(r.earlier or "[]"))
    return HistoryRecord(entry=r.entry, slot_ms=r.slot_ms, event=RunEvent(r.event),
                         instance=r.instance, store_ms=r.store_ms, task_id=r.task_id,
                         attempt=r.attempt, detail=r.detail, earlier=earlier)


class SQLHistory(History):
    """The ``history`` part of the SQL stores: one record per run, the newest ``history_size``
    runs of each entry, and definitions.

    :param insert: ``insert(table)``: the dialect's INSERT (with ON CONFLICT).
    :param run: ``run(what, work, *, write=True)``: ``work(conn)`` in one transaction of the store.
    :param lock_entries: ``lock_entries(conn, names)``: lock the entries' rows.
    :param now_us: ``now_us(conn)``: the store's clock, UTC microseconds.
    """

    def __init__(self, *, namespace: str, instance_id: str, history_size: int, dialect: str,
                 insert: Callable[[sa.Table], Any], run: Callable[..., Any],
                 lock_entries: Callable[..., Any], now_us: Callable[[sa.Connection], int]) -> None:
        self.namespace = namespace
        self.instance_id = instance_id
        self.history_size = history_size
        self.dialect = dialect
        self._insert = insert
        self._run = run
        self._lock_entries = lock_entries
        self._now_us = now_us

    def row(self, entry: str, slot_ms: int, event: RunEvent, now: int, *,
                     task_id: str = "", attempt: int = 1, detail: str = "") -> dict:
        return {"namespace": self.namespace, "entry": entry, "slot_ms": slot_ms,
                "event": event.value, "instance": self.instance_id, "store_ms": now,
                "task_id": task_id, "attempt": attempt, "detail": detail}

    def write(self, conn: sa.Connection, rows: list[dict], *, replace: bool,
                       keep_task_id: bool = False, trim: bool = True,
                       send_notes: bool = False, chained: bool = False) -> None:
        """Fill (``replace=False``) or replace history records (``keep_task_id``: an existing
        record keeps its task id; ``send_notes``: the rows are :data:`SEND_NOTES`, which replace
        neither a later attempt's record nor one of :data:`AFTER_SEND` of their own attempt),
        then trim their entries.

        ``chained``: the rows may replace a record of another attempt (lease events, the notes of
        a taken-over attempt): each replaced record is read first and kept in ``earlier`` when
        :func:`~celery_anarchon.stores.base.keeps_earlier` says so (as the Lua of the Redis
        stores does). The other replacements keep ``earlier`` as it is."""
        if not rows:
            return
        h = schema.history
        ins = self._insert(h)
        if replace and chained:
            rows = self._chain(conn, rows, keep_task_id=keep_task_id, send_notes=send_notes)
            columns = [*_EARLIER_FIELDS, "earlier"]
            stmt = ins.on_conflict_do_update(index_elements=_RUN_KEY,
                                             set_={k: ins.excluded[k] for k in columns})
        elif replace:
            columns = ["event", "instance", "store_ms", "attempt", "detail"]
            if not keep_task_id:
                columns.append("task_id")
            # one comparison per event, not IN (...): an expanding list cannot go in executemany
            after_send = sa.or_(*(h.c.event == e.value for e in sorted(AFTER_SEND)))
            later = sa.or_(h.c.attempt > ins.excluded.attempt,
                           sa.and_(h.c.attempt == ins.excluded.attempt, after_send))
            stmt = ins.on_conflict_do_update(index_elements=_RUN_KEY,
                                             set_={k: ins.excluded[k] for k in columns},
                                             where=sa.not_(later) if send_notes else None)
        else:
            stmt = ins.on_conflict_do_nothing(index_elements=_RUN_KEY)
        if rows:
            conn.execute(stmt, rows)
        if trim:
            self.trim(conn, {r["entry"] for r in rows})

    def _chain(self, conn: sa.Connection, rows: list[dict], *, keep_task_id: bool,
               send_notes: bool) -> list[dict]:
        """The rows to write in place of ``rows`` (one per run, in their order's result): each
        replaces the run's current record by :meth:`write`'s rules, keeping the earlier attempts'
        records (at most :data:`~celery_anarchon.stores.base.MAX_EARLIER`)."""
        h = schema.history
        runs = sorted({(r["entry"], r["slot_ms"]) for r in rows})
        current: dict[tuple[str, int], dict] = {}
        for i in range(0, len(runs), _LOOKUP_CHUNK):
            for row in conn.execute(sa.select(h).where(
                    h.c.namespace == self.namespace,
                    sa.tuple_(h.c.entry, h.c.slot_ms).in_(runs[i:i + _LOOKUP_CHUNK]))).mappings():
                current[(row["entry"], row["slot_ms"])] = dict(row)
        out: dict[tuple[str, int], dict] = {}
        for row in rows:
            run = (row["entry"], row["slot_ms"])
            old, new = current.get(run), {**row, "earlier": None}
            if old is not None:
                if send_notes and (old["attempt"] > row["attempt"] or (
                        old["attempt"] == row["attempt"] and old["event"] in _AFTER_SEND)):
                    continue
                if keep_task_id:
                    new["task_id"] = old["task_id"]
                earlier = json.loads(old["earlier"] or "[]")
                if keeps_earlier(old["event"], row["event"]):
                    earlier = [*earlier, {k: old[k] for k in _EARLIER_FIELDS}][-MAX_EARLIER:]
                new["earlier"] = json.dumps(earlier) if earlier else None
            current[run] = out[run] = new
        return list(out.values())

    def trim(self, conn: sa.Connection, names: set[str]) -> None:
        """Keep the newest ``history_size`` runs of each entry of ``names``."""
        if not names:
            return
        h = schema.history
        newest = (sa.select(h.c.slot_ms)
                  .where(h.c.namespace == sa.bindparam("b_ns"), h.c.entry == sa.bindparam("b_entry"))
                  .order_by(h.c.slot_ms.desc()).limit(1).offset(self.history_size - 1).scalar_subquery())
        conn.execute(sa.delete(h).where(h.c.namespace == sa.bindparam("b_ns"),
                                        h.c.entry == sa.bindparam("b_entry"), h.c.slot_ms < newest),
                     [{"b_ns": self.namespace, "b_entry": e} for e in sorted(names)])

    def record(self, entry: str, slot_ms: int, event: RunEvent, *, task_id: str = "",
               attempt: int = 1, detail: str = "") -> None:
        """Write an event of a run, as this instance, at the store's time. SKIP_EVENTS only fill
        a run without a record; other events replace it. Keeps the newest ``history_size`` runs.

        :raises StoreUnavailable: the store cannot be reached.
        """
        self.record_many([HistoryRecord(entry, slot_ms, event, task_id=task_id, attempt=attempt,
                                        detail=detail)])

    def record_many(self, notes: Sequence[HistoryRecord]) -> None:
        """:meth:`record` of each note, in one transaction: consecutive notes of one kind (fill,
        replace, send note) in one statement, in their order; each entry trimmed once.

        :raises StoreUnavailable: the store cannot be reached (nothing is written).
        """
        if not notes:
            return

        def kind(note: HistoryRecord) -> str:
            return ("fill" if note.event in SKIP_EVENTS
                    else "send" if note.event in SEND_NOTES else "replace")

        def work(conn: sa.Connection) -> None:
            self._lock_entries(conn, sorted({n.entry for n in notes}))
            now = self._now_us(conn) // 1000
            for how, group in itertools.groupby(notes, key=kind):
                rows = [self.row(n.entry, n.slot_ms, n.event, now, task_id=n.task_id,
                                 attempt=n.attempt, detail=n.detail) for n in group]
                # a later attempt's note may replace a takeover's record: keep it (chained)
                self.write(conn, rows, replace=how != "fill", send_notes=how == "send", trim=False,
                           chained=any(r["attempt"] > 1 for r in rows))
            self.trim(conn, {n.entry for n in notes})
        self._run("record", work)

    def read(self, entry: str, limit: int | None = None) -> list[HistoryRecord]:
        """The entry's newest runs, newest slot first (at most ``limit`` or ``history_size``).

        :raises StoreUnavailable: the store cannot be reached.
        """
        h = schema.history
        query = (sa.select(h).where(h.c.namespace == self.namespace, h.c.entry == entry)
                 .order_by(h.c.slot_ms.desc()).limit(limit or self.history_size))
        rows = self._run("read history", lambda conn: conn.execute(query).all(), write=False)
        known = {e.value for e in RunEvent}
        return [_records(r) for r in rows if r.event in known]

    def read_many(self, entries: Iterable[str],
                  limit: int | None = None) -> dict[str, list[HistoryRecord]]:
        """:meth:`read` of each of ``entries`` in one transaction: one query per
        :data:`HISTORY_BATCH` names, each entry's newest rows picked by a window function.

        :returns: ``{entry: runs newest slot first}`` for every name given.
        :raises StoreUnavailable: the store cannot be reached.
        """
        names = list(dict.fromkeys(entries))
        limit = self.history_size if limit is None else int(limit)
        out: dict[str, list[HistoryRecord]] = {name: [] for name in names}
        if limit < 1 or not names:
            return out
        h = schema.history
        rank = sa.func.row_number().over(partition_by=h.c.entry,
                                         order_by=h.c.slot_ms.desc()).label("rank")
        ranked = (sa.select(h, rank).where(h.c.namespace == self.namespace,
                                           h.c.entry.in_(sa.bindparam("names", expanding=True)))
                  .subquery())
        query = (sa.select(ranked).where(ranked.c.rank <= limit)
                 .order_by(ranked.c.entry, ranked.c.slot_ms.desc()))

        def work(conn: sa.Connection) -> list:
            return [row for start in range(0, len(names), HISTORY_BATCH)
                    for row in conn.execute(query, {"names": names[start:start + HISTORY_BATCH]})]
        known = {e.value for e in RunEvent}
        for r in self._run("read history", work, write=False):
            if r.event in known:
                out[r.entry].append(_records(r))
        return out

    def save_definition(self, entry: str, fingerprint: str, text: str) -> None:
        """Remember the text of ``fingerprint`` (replaces an older text of the same fingerprint).

        :raises StoreUnavailable: the store cannot be reached.
        """
        d = schema.definitions

        def work(conn: sa.Connection) -> None:
            ins = self._insert(d).values(namespace=self.namespace, entry=entry, fingerprint=fingerprint,
                                         text=text, saved_ms=schema.clock_ms(self.dialect))
            conn.execute(ins.on_conflict_do_update(
                index_elements=("namespace", "entry", "fingerprint"),
                set_={"text": ins.excluded.text, "saved_ms": ins.excluded.saved_ms}))
        self._run("save a definition", work)

    def load_definition(self, entry: str, fingerprint: str) -> str | None:
        """The text saved for ``fingerprint``, or None. :raises StoreUnavailable:"""
        d = schema.definitions
        query = sa.select(d.c.text).where(d.c.namespace == self.namespace, d.c.entry == entry,
                                          d.c.fingerprint == fingerprint)
        return self._run("load a definition", lambda conn: conn.execute(query).scalar(), write=False)
