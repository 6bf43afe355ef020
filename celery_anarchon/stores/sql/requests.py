"""Run-now requests of the SQL stores
(:meth:`~celery_anarchon.stores.entry_store.Entries.request_run` and its reads, following the rules of :mod:`celery_anarchon.stores.run_now`): a part of
:class:`~.entries.SQLEntries`, given what it needs of the store.

Tables ``anarchon_run_requests`` (every request id, kept for the caller's retention) and
``anarchon_request_memory`` (the newest prune of request ids):
:mod:`celery_anarchon.stores.sql.schema`. A request is written in the transaction that locks the
entry's row (its claims' lock) and raises the entries version last, the lock order of every
write (:mod:`.entries`). Instants are UTC ms on the store's clock.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from celery_anarchon._util import LATENESS_TOLERANCE_MS
from celery_anarchon.stores.entry_store import DEFAULT_REQUEST_RETENTION_S, RunRequest
from celery_anarchon.stores.run_now import (
    RequestClock, SlotWindow, SlotWindowPassed, no_free_slot, request_id_ms, request_refusal,
)
from celery_anarchon.stores.sql import schema


def request_of(row: Any, created: bool = False) -> RunRequest:
    """A row of ``anarchon_run_requests`` as a :class:`RunRequest`."""
    return RunRequest(entry=row.entry, request_id=row.request_id, slot_ms=row.slot_ms,
                      by=row.requested_by, requested_ms=row.requested_ms, created=created)


class SQLRequests:
    """request_clock, find_request, request_run of one namespace (see
    :class:`~celery_anarchon.stores.entry_store.Entries`).

    :param insert: ``insert(table)``: the dialect's INSERT (with ON CONFLICT).
    :param run: ``run(what, work, *, write=True)``: ``work(conn)`` in one transaction of the
        store, driver errors turned into StoreUnavailable.
    :param lock_entries: ``lock_entries(conn, names)``: lock the entries' rows (claim order).
    :param now_us: ``now_us(conn)``: the store's clock, UTC microseconds.
    :param note_store: ``note_store(conn, claiming=False)``: the namespace's store-wide note
        (:meth:`.memory.SQLMemory.note_store`; its ``born_ms`` begins the memory of requests).
    :param bump: ``bump(conn)``: raise the entries version (and write the entries epoch), the
        last row a write locks.
    """

    def __init__(self, *, namespace: str, insert: Callable[[sa.Table], Any],
                 run: Callable[..., Any], lock_entries: Callable[..., Any],
                 now_us: Callable[[sa.Connection], int], note_store: Callable[..., Any],
                 bump: Callable[[sa.Connection], int]) -> None:
        self.namespace = namespace
        self._insert = insert
        self._run = run
        self._lock_entries = lock_entries
        self._now_us = now_us
        self._note_store = note_store
        self._bump = bump

    def _request_clock(self, conn: sa.Connection, *, born: int | None = None,
                       lock: bool = False) -> RequestClock:
        """The namespace's memory start (``born``, else noted now by
        :meth:`.memory.SQLMemory.note_store`: a new or wiped store, a new epoch begin it now), its
        prune mark (``lock``: its row locked) and the clock."""
        mem = schema.request_memory
        if born is None:
            born = self._note_store(conn, claiming=False).born_ms
        query = sa.select(mem.c.pruned_ms).where(mem.c.namespace == self.namespace)
        pruned = conn.execute(query.with_for_update() if lock else query).scalar()
        return RequestClock(self._now_us(conn) // 1000, born, pruned or 0)

    def request_clock(self) -> RequestClock:
        """:meth:`Entries.request_clock`, in one transaction."""
        return self._run("read the clock for a request id", self._request_clock)

    def find_request(self, entry: str, request_id: str) -> RunRequest | None:
        """:meth:`Entries.find_request`: one SELECT by the table's key."""
        rq = schema.run_requests

        def work(conn: sa.Connection) -> RunRequest | None:
            found = conn.execute(sa.select(rq).where(
                rq.c.namespace == self.namespace, rq.c.entry == entry,
                rq.c.request_id == request_id)).first()
            return None if found is None else request_of(found)
        return self._run("find a run-now request", work, write=False)

    def request_run(self, entry: str, request_id: str, window: SlotWindow, *, by: str,
                    retention_ms: int = int(DEFAULT_REQUEST_RETENTION_S * 1000)) -> RunRequest:
        """:meth:`Entries.request_run` in one transaction that notes the store-wide memory
        start, locks the entry's row (the lock its claims take: two requests of one entry are
        serialized), then the namespace's row of ``anarchon_request_memory``, and raises the
        entries version last (the lock order of every write)."""
        rq, mem = schema.run_requests, schema.request_memory
        retention_ms = int(retention_ms)
        id_ms = request_id_ms(request_id)
        key = (rq.c.namespace == self.namespace, rq.c.entry == entry)

        def work(conn: sa.Connection) -> RunRequest:
            born = self._note_store(conn, claiming=False).born_ms     # lock order: first
            self._lock_entries(conn, [entry])
            found = conn.execute(sa.select(rq).where(*key, rq.c.request_id == request_id)).first()
            if found is not None:
                return request_of(found)
            clock = self._request_clock(conn, born=born, lock=True)
            now = clock.now_ms
            why = None if id_ms is None else clock.refusal(id_ms, retention_ms)
            if why is not None:
                raise request_refusal(entry, request_id, why, id_ms=id_ms, clock=clock,
                                      retention_ms=retention_ms)
            if not window.covers(now):
                raise SlotWindowPassed(f"run-now of {entry!r}: the store's clock {now} is outside "
                                       f"the window {window.start_ms}..{window.end_ms}")
            conn.execute(sa.delete(rq).where(
                rq.c.namespace == self.namespace,
                rq.c.requested_ms < now - retention_ms - LATENESS_TOLERANCE_MS))
            if clock.pruned_ms < now - retention_ms:
                ins = self._insert(mem).values(namespace=self.namespace, pruned_ms=now - retention_ms)
                conn.execute(ins.on_conflict_do_update(index_elements=("namespace",),
                                                       set_={"pruned_ms": ins.excluded.pruned_ms}))
            taken = set(conn.execute(sa.select(rq.c.slot_ms).where(
                *key, rq.c.slot_ms.between(now, window.end_ms))).scalars())
            slot = window.choose(now, taken)
            if slot is None:
                raise no_free_slot(entry)
            conn.execute(sa.insert(rq).values(namespace=self.namespace, entry=entry,
                                              request_id=request_id, slot_ms=slot,
                                              requested_by=by, requested_ms=now))
            self._bump(conn)
            return RunRequest(entry, request_id, slot, by, now, created=True)
        return self._run("request a run", work)
