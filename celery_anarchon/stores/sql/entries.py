"""Store entries and pauses of the SQL stores (the
:class:`~celery_anarchon.stores.entry_store.Entries` contract, with the run-now requests of
:mod:`.requests`, a part of this one): a part of :class:`~celery_anarchon.stores.sql.store.SQLStore`,
given what it needs of the store. The instance records are :mod:`.instances`.

Every write is one transaction that locks the name's row of ``anarchon_entries`` first (the row
every claim of the entry locks, so a pause and a claim of the same entry are serialized: a pause
committed before a claim took the row always holds), then writes, then raises the namespace's
entries version (``anarchon_schedule_versions``, always the last row a transaction locks, so the
lock order stays deadlock-free). A name's version is the entries version of its last change.

The same statement that raises the version writes the entries epoch when the namespace has none
or when the server's epoch changed since it was written (docs/design.md "Amnesia"). A resume and a
removal leave the name's row cleared (no definition, no pause), pruned after
:data:`~celery_anarchon.stores.entry_store.CLEARED_KEEP_MS`.

Tables: :mod:`celery_anarchon.stores.sql.schema`. Instants are UTC ms on the store's clock.
Definitions are JSON text, stored as text: nothing is pickled or evaluated.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import sqlalchemy as sa

from celery_anarchon.errors import EntryExists, UnknownEntry
from celery_anarchon.stores.entry_store import (
    CLEARED_KEEP_MS, DEFAULT_REQUEST_RETENTION_S, EntriesEpoch, Entries, EntrySnapshot, Pause,
    RunRequest, StoredEntry, new_epoch_id,
)
from celery_anarchon.stores.run_now import RequestClock, SlotWindow
from celery_anarchon.stores.sql import schema
from celery_anarchon.stores.sql.requests import SQLRequests, request_of

T = TypeVar("T")


def _text(value: str | bytes | None) -> str | None:
    """A text column as :func:`_entry_columns` reads it: bytes (SQLite) decoded as UTF-8, each
    byte that is not UTF-8 kept as a lone surrogate (``surrogateescape``), which the checks of a
    definition and a name refuse by name (:func:`celery_anarchon.limits.undecodable`)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return value


def _stored(row: Any) -> StoredEntry:
    pause = (Pause(reason=_text(row.pause_reason) or "", by=_text(row.pause_by) or "",
                   at_ms=row.pause_at_ms) if row.pause_at_ms is not None else None)
    return StoredEntry(name=_text(row.name), definition=_text(row.definition), pause=pause,
                       version=row.version, updated_ms=row.updated_ms,
                       updated_by=_text(row.updated_by))


def _entry_columns(conn: sa.Connection) -> list:
    """The columns of ``anarchon_schedule_entries`` as :class:`SQLEntries` reads them (every
    entry, or one name's row before a write). SQLite keeps whatever bytes a hand edit or another program wrote in a text column, and
    its driver raises on text that is not UTF-8 (the whole read failed, as a store outage): there
    the text columns are read as bytes, for :func:`_text`. (PostgreSQL checks the encoding of
    what it stores.)"""
    table = schema.schedule_entries
    if conn.dialect.name != "sqlite":
        return list(table.c)
    return [sa.cast(c, sa.LargeBinary).label(c.name) if isinstance(c.type, sa.Text) else c
            for c in table.c]


class SQLEntries(Entries):
    """The entry operations of one namespace (the ``entries`` part).

    :param memory_ms: the store's memory, ms: run-now requests older than it are not loaded
        (their ids are kept for the retention :meth:`request_run` is given).
    :param insert: ``insert(table)``: the dialect's INSERT (with ON CONFLICT).
    :param run: ``run(what, work, *, write=True, isolation=None)``: ``work(conn)`` in one
        transaction of the store, driver errors turned into StoreUnavailable, after creating
        missing tables once (:meth:`.connection.SQLConnection.run_with_schema`: an admin tool
        may write entries before any beat prepared the store).
    :param lock_entries: ``lock_entries(conn, names)``: lock the entries' rows (claim order).
    :param now_us: ``now_us(conn)``: the store's clock, UTC microseconds.
    :param server_epoch: ``server_epoch(conn)``: the server's epoch now (the entries epoch is
        written anew when it changed).
    :param note_store: ``note_store(conn, claiming=False)``: the namespace's store-wide note
        (:meth:`.memory.SQLMemory.note_store`; its ``born_ms`` begins the memory of requests).
    """

    def __init__(self, *, namespace: str, memory_ms: int, insert: Callable[[sa.Table], Any],
                 run: Callable[..., Any], lock_entries: Callable[..., Any],
                 now_us: Callable[[sa.Connection], int],
                 server_epoch: Callable[[sa.Connection], str],
                 note_store: Callable[..., Any]) -> None:
        self.namespace = namespace
        self.memory_ms = memory_ms
        self._insert = insert
        self._run = run
        self._lock_entries = lock_entries
        self._now_us = now_us
        self._server_epoch = server_epoch
        #: the run-now requests, a part given what it needs (their writes raise the version)
        self.requests = SQLRequests(namespace=namespace, insert=insert, run=run,
                                    lock_entries=lock_entries, now_us=now_us,
                                    note_store=note_store, bump=self._bump)

    # -- inside other transactions -------------------------------------------------------------
    def pauses(self, conn: sa.Connection, names: Iterable[str]) -> dict[str, Pause]:
        """The pauses of ``names`` (the claim reads them after locking the entries' rows)."""
        names = sorted(set(names))
        if not names:
            return {}
        t = schema.schedule_entries
        rows = conn.execute(sa.select(t.c.name, t.c.pause_reason, t.c.pause_by, t.c.pause_at_ms)
                            .where(t.c.namespace == self.namespace, t.c.name.in_(names),
                                   t.c.pause_at_ms.isnot(None)))
        return {r.name: Pause(r.pause_reason or "", r.pause_by or "", r.pause_at_ms) for r in rows}

    def prune(self, conn: sa.Connection, now: int) -> int:
        """Delete cleared records older than CLEARED_KEEP_MS (run-now requests are pruned by
        :meth:`request_run`, after their retention). :returns: rows deleted."""
        t = schema.schedule_entries
        cleared = sa.and_(t.c.definition.is_(None), t.c.pause_at_ms.is_(None),
                          t.c.updated_ms < now - CLEARED_KEEP_MS)
        return conn.execute(sa.delete(t).where(cleared)).rowcount

    def _bump(self, conn: sa.Connection) -> int:
        """Raise the namespace's entries version (the last row the transaction locks), and write
        a new entries epoch when it has none or the server's epoch changed since."""
        v = schema.schedule_versions
        ns = v.c.namespace == self.namespace
        ins = self._insert(v).values(namespace=self.namespace, version=1)
        conn.execute(ins.on_conflict_do_update(index_elements=("namespace",),
                                               set_={"version": v.c.version + 1}))
        row = conn.execute(sa.select(v.c.version, v.c.epoch, v.c.server_epoch).where(ns)).one()
        server = self._server_epoch(conn)
        if row.epoch is None or row.server_epoch != server:
            conn.execute(sa.update(v).where(ns).values(
                epoch=new_epoch_id(), epoch_ms=self._now_us(conn) // 1000, server_epoch=server))
        return row.version

    def _read(self, conn: sa.Connection, name: str) -> Any:
        t = schema.schedule_entries
        return conn.execute(sa.select(*_entry_columns(conn))
                            .where(t.c.namespace == self.namespace, t.c.name == name)).first()

    def _write(self, what: str, name: str, op: Callable[[sa.Connection, Any, int], T]) -> T:
        """``op(conn, row_or_None, now_ms)`` with the entry's row of ``anarchon_entries`` locked."""
        def work(conn: sa.Connection):
            self._lock_entries(conn, [name])
            return op(conn, self._read(conn, name), self._now_us(conn) // 1000)
        return self._run(what, work)

    # -- the contract ----------------------------------------------------------------------------
    def entries_version(self) -> int:
        """The namespace's entries version (``0`` before any change): one read."""
        v = schema.schedule_versions
        query = sa.select(v.c.version).where(v.c.namespace == self.namespace)
        return self._run("read the entries version",
                         lambda conn: conn.execute(query).scalar() or 0, write=False,
                         isolation="single")

    def entries_epoch(self) -> EntriesEpoch:
        """The namespace's entries epoch and version: one read."""
        v = schema.schedule_versions
        query = sa.select(v.c.version, v.c.epoch).where(v.c.namespace == self.namespace)

        def work(conn: sa.Connection) -> EntriesEpoch:
            row = conn.execute(query).first()
            return EntriesEpoch(epoch=(row.epoch or "") if row else "",
                                version=row.version if row else 0)
        return self._run("read the entries epoch", work, write=False, isolation="single")

    def load_entries(self) -> EntrySnapshot:
        """Every entry, pause and cleared record, the requests younger than the memory, and the
        version, epoch and last accepted loss, read in one snapshot (PostgreSQL: REPEATABLE READ;
        SQLite: one read transaction)."""
        t, rq, v = schema.schedule_entries, schema.run_requests, schema.schedule_versions

        def work(conn: sa.Connection) -> EntrySnapshot:
            head = conn.execute(sa.select(v.c.version, v.c.epoch, v.c.accepted_ms, v.c.accepted_by)
                                .where(v.c.namespace == self.namespace)).first()
            now = self._now_us(conn) // 1000
            entries = {stored.name: stored for stored in map(_stored, conn.execute(
                sa.select(*_entry_columns(conn)).where(t.c.namespace == self.namespace)
                .order_by(t.c.name)))}
            requests = tuple(request_of(r) for r in conn.execute(
                sa.select(rq).where(rq.c.namespace == self.namespace,
                                    rq.c.requested_ms >= now - self.memory_ms)
                .order_by(rq.c.requested_ms, rq.c.entry, rq.c.request_id)))
            if head is None:
                return EntrySnapshot(version=0, entries=entries, requests=requests)
            return EntrySnapshot(version=head.version, entries=entries, requests=requests,
                                 epoch=head.epoch or "", accepted_ms=head.accepted_ms or 0,
                                 accepted_by=head.accepted_by or "")
        return self._run("load the entries", work, write=False, isolation="snapshot")

    def accept_loss(self, *, by: str) -> int:
        """Record the accepted loss (now, ``by``) and raise the entries version."""
        v = schema.schedule_versions

        def work(conn: sa.Connection) -> int:
            self._bump(conn)
            now = self._now_us(conn) // 1000
            conn.execute(sa.update(v).where(v.c.namespace == self.namespace)
                         .values(accepted_ms=now, accepted_by=by))
            return now
        return self._run("accept the loss", work)

    def put_entry(self, name: str, definition: str, *, by: str, create: bool) -> StoredEntry:
        """Add (``create``) or update a store entry's definition, keeping its pause.

        :raises EntryExists: ``create`` and the name holds a definition.
        :raises UnknownEntry: not ``create`` and the name holds none.
        """
        t = schema.schedule_entries

        def op(conn: sa.Connection, row: Any, now: int) -> StoredEntry:
            if create and row is not None and row.definition is not None:
                raise EntryExists(f"entry {name!r} exists already in the store (namespace "
                                  f"{self.namespace!r}): update it, or remove it first")
            if not create and (row is None or row.definition is None):
                raise UnknownEntry(f"entry {name!r} is not in the store (namespace "
                                   f"{self.namespace!r}): add it first")
            values = {"definition": definition, "version": self._bump(conn), "updated_ms": now,
                      "updated_by": by}
            if row is None:
                conn.execute(sa.insert(t).values(namespace=self.namespace, name=name, **values))
            else:
                conn.execute(sa.update(t).where(t.c.namespace == self.namespace, t.c.name == name)
                             .values(**values))
            return _stored(self._read(conn, name))
        return self._write("write an entry", name, op)

    def remove_entry(self, name: str, *, by: str) -> bool:
        """Remove a store entry's definition and its pause, leaving the row cleared; ``False``
        (nothing written) when the name holds no definition."""
        t = schema.schedule_entries

        def op(conn: sa.Connection, row: Any, now: int) -> bool:
            if row is None or row.definition is None:
                return False
            conn.execute(sa.update(t).where(t.c.namespace == self.namespace, t.c.name == name)
                         .values(definition=None, pause_reason=None, pause_by=None,
                                 pause_at_ms=None, version=self._bump(conn), updated_ms=now,
                                 updated_by=by))
            return True
        return self._write("remove an entry", name, op)

    def set_pause(self, name: str, pause: Pause | None, *, by: str) -> StoredEntry:
        """Pause or resume (``None``) ``name``; the pause's time is the store's clock. A resume
        of a name without a definition leaves its row cleared (written even when there was no
        row: instances that keep a pause from before a loss see it)."""
        t = schema.schedule_entries

        def op(conn: sa.Connection, row: Any, now: int) -> StoredEntry:
            version = self._bump(conn)
            values = {"pause_reason": pause.reason if pause else None,
                      "pause_by": pause.by if pause else None,
                      "pause_at_ms": now if pause else None,
                      "version": version, "updated_ms": now, "updated_by": by}
            if row is None:
                conn.execute(sa.insert(t).values(namespace=self.namespace, name=name,
                                                 definition=None, **values))
            else:
                conn.execute(sa.update(t).where(t.c.namespace == self.namespace, t.c.name == name)
                             .values(**values))
            return _stored(self._read(conn, name))
        return self._write("pause an entry" if pause else "resume an entry", name, op)

    # -- run-now requests (:class:`~.requests.SQLRequests`) ------------------------------------
    def request_clock(self) -> RequestClock:
        """:meth:`.SQLRequests.request_clock`."""
        return self.requests.request_clock()

    def find_request(self, entry: str, request_id: str) -> RunRequest | None:
        """:meth:`.SQLRequests.find_request`."""
        return self.requests.find_request(entry, request_id)

    def request_run(self, entry: str, request_id: str, window: SlotWindow, *, by: str,
                    retention_ms: int = int(DEFAULT_REQUEST_RETENTION_S * 1000)) -> RunRequest:
        """:meth:`.SQLRequests.request_run`."""
        return self.requests.request_run(entry, request_id, window, by=by,
                                         retention_ms=retention_ms)
