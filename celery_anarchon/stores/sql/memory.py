"""The store's memory in the SQL stores (docs/design.md "Amnesia"): the
namespace's row of ``anarchon_stores`` (the store-wide memory start, the server's epoch, the
recorded ``memory``) and the entries' rows of ``anarchon_entries`` (each entry's memory start and
fence), locked in that order by every writing transaction. A part of
:class:`~celery_anarchon.stores.sql.store.SQLStore`, given what it needs of the store. Instants are
UTC ms on the store's clock.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from typing import Any

import sqlalchemy as sa

from celery_anarchon.stores.base import LATENESS_TOLERANCE_MS
from celery_anarchon.stores.sql import schema

log = logging.getLogger(__name__)

_TOL = LATENESS_TOLERANCE_MS
_ENTRY_KEY = ("namespace", "entry")
#: the recorded memory's "last used" time is refreshed at most this often (ms); the replacement
#: rule adds it, so a coarse refresh never lets a value be replaced early
MEMORY_USE_STEP_MS = 1000


@dataclasses.dataclass
class Fence:
    """An entry's row of ``anarchon_entries``, locked by the current transaction."""

    born_ms: int                 #: store time the memory of the entry began (docs/design.md "Amnesia")
    last_token: int              #: last fencing token issued for the entry (0: none)
    newest_slot: int | None      #: newest slot claimed for a leased run
    changed: bool = False
    store_born_ms: int = 0       #: the store-wide memory start (anarchon_stores), when read
    memory_detail: str = ""      #: why the store-wide memory began then (an epoch change)

    @property
    def memory_start_ms(self) -> int:
        """The entry's effective memory start: max(entry's, store-wide) (docs/design.md "Amnesia")."""
        return max(self.born_ms, self.store_born_ms)

    def issue_token(self, now_us: int) -> int:
        """The next fencing token: ``max(last + 1, store clock in us)``, so tokens keep growing
        even after the store lost its data (docs/design.md "Words": fencing token)."""
        self.last_token = max(self.last_token + 1, now_us)
        self.changed = True
        return self.last_token


@dataclasses.dataclass
class StoreNote:
    """The namespace's row of ``anarchon_stores`` as one transaction saw it (docs/design.md "Amnesia").

    :param born_ms: the store-wide memory start, store clock ms.
    :param epoch: the server's epoch now (``""`` for SQLite).
    :param detail: why the memory began when it did (an epoch change names both), for refusals.
    :param conflict: set when this instance's ``memory`` differs from the recorded value that is
        still in use: the detail its claims are refused (forgotten) with.
    """

    born_ms: int
    epoch: str
    detail: str = ""
    conflict: str | None = None


#: transaction ids: ``xmin`` holds ``txid_current()`` modulo this (32 bits, without the epoch)
_XIDS = 2 ** 32


def _mark_columns() -> tuple[sa.ColumnElement, ...]:
    """PostgreSQL: the namespace's ``anarchon_restore_marks`` row: the transaction id it holds
    and the ``xmin`` of the row (the transaction that wrote it, or a restore's ``COPY``)."""
    xmin = sa.literal_column(f"{schema.restore_marks.name}.xmin")
    return (schema.restore_marks.c.xid.label("mark_xid"),
            sa.cast(sa.cast(xmin, sa.Text), sa.BigInteger).label("mark_xmin"))


def _full(epoch: str, tables: str | None) -> str:
    """The epoch as told: the server's epoch and, when recorded, its tables."""
    return f"{epoch} {tables}" if tables else epoch


class SQLMemory:
    """Reads and brings up to date the store-wide note, and locks the entries' rows.

    :param memory_s: this instance's ``memory`` option, seconds (``memory_ms`` in ms).
    :param insert: ``insert(table)``: the dialect's INSERT (with ON CONFLICT).
    :param epoch_sql: ``epoch_sql(conn)``: the server's epoch as an SQL expression.
    :param epoch_text: ``epoch_text(conn, value)``: the epoch as recorded, from that value.
    :param tables_sql: ``tables_sql(conn)``: which tables the statements reach, as an SQL text
        expression (PostgreSQL: their OIDs; ``""``: not told), part of the epoch.
    """

    def __init__(self, *, namespace: str, kind: str, safe_url: str, dialect: str, memory_s: float,
                 memory_ms: int, insert: Callable[[sa.Table], Any],
                 epoch_sql: Callable[[sa.Connection], sa.ColumnElement],
                 epoch_text: Callable[[sa.Connection, Any], str],
                 tables_sql: Callable[[sa.Connection], sa.ColumnElement]) -> None:
        self.namespace = namespace
        self.kind = kind
        self.safe_url = safe_url
        self.dialect = dialect
        self.memory_s = memory_s
        self.memory_ms = memory_ms
        self._insert = insert
        self._epoch_sql = epoch_sql
        self._epoch_text = epoch_text
        self._tables_sql = tables_sql

    def server_epoch(self, conn: sa.Connection) -> str:
        """The server's epoch now, as :meth:`note_store` records it (PostgreSQL: system
        identifier and timeline; SQLite: the file's inode)."""
        return self._epoch_text(conn, conn.execute(sa.select(self._epoch_sql(conn))).scalar())

    def note_store(self, conn: sa.Connection, *, claiming: bool) -> StoreNote:
        """Read the namespace's row of ``anarchon_stores`` with the server's epoch, in one
        statement, and bring it up to date (docs/design.md "Amnesia"):

        * no row (a new or wiped store): noted now, with this epoch and this ``memory``;
        * another epoch (PostgreSQL: a promotion, a restored or replaced server), or other
          tables (PostgreSQL: re-created, as by ``pg_restore --clean``, or another database): the
          store-wide memory start becomes now, so every entry refuses the slots before now +
          tolerance; a row without tables (written by an earlier version) only records them;
        * another ``memory``: replaced when the recorded one was last used more than the new
          memory + 2 x LATENESS_TOLERANCE_MS ago, else :attr:`StoreNote.conflict`;
        * ``claiming``: the recorded memory's last use becomes now (at most every second).

        Call it before locking any entry row (lock order). :raises ConfigError: never;
        conflicts are returned.
        """
        st, mk = schema.stores, schema.restore_marks
        ns = self.namespace
        clock = schema.clock_ms(self.dialect)
        one = sa.select(sa.literal(1).label("one")).subquery()
        joined = one.outerjoin(st, st.c.namespace == ns)
        marks = self.dialect == "postgresql"
        if marks:
            joined = joined.outerjoin(mk, mk.c.namespace == ns)
        row = conn.execute(
            sa.select(clock.label("now"), self._epoch_sql(conn).label("epoch_now"),
                      self._tables_sql(conn).label("tables_now"), st.c.born_ms, st.c.epoch,
                      st.c.prev_epoch, st.c.memory_ms, st.c.memory_used_ms, st.c.tables,
                      *(_mark_columns() if marks else ()))
            .select_from(joined)).one()
        now, epoch = int(row.now), self._epoch_text(conn, row.epoch_now)
        tables = row.tables_now or None
        mark_xid, mark_xmin = (row.mark_xid, row.mark_xmin) if marks else (None, None)
        rewritten = mark_xid is not None and int(mark_xmin) != mark_xid % _XIDS

        def reread():
            return conn.execute(sa.select(st).where(st.c.namespace == ns)).one()
        if row.born_ms is None:
            conn.execute(self._insert(st).values(
                namespace=ns, born_ms=clock, epoch=epoch, prev_epoch="", memory_ms=self.memory_ms,
                memory_used_ms=clock, tables=tables).on_conflict_do_nothing(index_elements=("namespace",)))
            row = reread()
        if row.epoch != epoch or (row.tables and tables and row.tables != tables) or rewritten:
            prev = _full(row.epoch, row.tables)
            if rewritten:
                prev += f", its rows written again by transaction {mark_xmin} (a restore)"
            changed = conn.execute(sa.update(st).where(
                st.c.namespace == ns, st.c.epoch == row.epoch, st.c.born_ms == row.born_ms,
                st.c.tables.is_(None) if row.tables is None else st.c.tables == row.tables,
            ).values(born_ms=clock, epoch=epoch, prev_epoch=prev, tables=tables)).rowcount
            if changed and marks:
                conn.execute(sa.update(mk).where(mk.c.namespace == ns)
                             .values(xid=sa.func.txid_current()))
            if changed:
                log.warning("%s store %s: the server's epoch changed from %r to %r (a promoted "
                            "standby, a restored or replaced server, tables re-created by a restore "
                            "or another database): it may have lost the newest claims; the store's "
                            "memory begins again now, and the runs of the next %d s are refused as "
                            "forgotten", self.kind, self.safe_url, prev, _full(epoch, tables),
                            _TOL // 1000)
            row = reread()
        elif tables and not row.tables:     # noted by an earlier version: nothing to compare with
            conn.execute(sa.update(st).where(st.c.namespace == ns, st.c.tables.is_(None))
                         .values(tables=tables))
            row = reread()
        if marks and mark_xid is None:  # new, or noted by an earlier version: marked from now on
            conn.execute(self._insert(mk).values(namespace=ns, xid=sa.func.txid_current())
                         .on_conflict_do_nothing(index_elements=("namespace",)))
        detail = ""
        if row.prev_epoch:
            detail = (f" (the server's epoch changed from {row.prev_epoch!r} to "
                      f"{_full(row.epoch, row.tables)!r})")
        conflict = None
        if row.memory_ms != self.memory_ms:
            idle = now - row.memory_used_ms
            wait_ms = self.memory_ms + 2 * _TOL + MEMORY_USE_STEP_MS
            if idle > wait_ms:
                replaced = conn.execute(sa.update(st).where(
                    st.c.namespace == ns, st.c.memory_ms == row.memory_ms,
                    st.c.memory_used_ms == row.memory_used_ms,
                ).values(memory_ms=self.memory_ms, memory_used_ms=clock)).rowcount
                if replaced:
                    log.warning("%s store %s: the recorded 'memory' %g s (unused for %d s) is replaced "
                                "by this instance's %g s", self.kind, self.safe_url,
                                row.memory_ms / 1000, idle // 1000, self.memory_s)
                row = reread()
            if row.memory_ms != self.memory_ms:
                recorded = row.memory_ms / 1000
                conflict = (
                    f"anarchon_store_options['memory'] is {self.memory_s:g} s on this instance, but the "
                    f"store recorded 'memory' = {recorded:g} s, last used by a claim "
                    f"{max(0, now - row.memory_used_ms) / 1000:.1f} s ago: use the same value on every "
                    f"instance; to change it, stop every instance using {recorded:g} s and wait "
                    f"{self.memory_s:g} s + {2 * _TOL // 1000} s ({wait_ms / 1000:g} s after their "
                    "last claim), or use another anarchon_namespace")
        elif claiming and now - row.memory_used_ms >= MEMORY_USE_STEP_MS:
            conn.execute(sa.update(st).where(st.c.namespace == ns, st.c.memory_used_ms < now)
                         .values(memory_used_ms=now))
        return StoreNote(born_ms=row.born_ms, epoch=epoch, detail=detail, conflict=conflict)

    def lock_entries(self, conn: sa.Connection, names: Iterable[str],
                      note: StoreNote | None = None) -> dict[str, Fence]:
        """Create the missing entries and lock every entry row, in the order of their names. A
        new entry's memory starts at the store-wide memory start when the namespace has one
        (its memory is intact: nothing of the entry can have been lost), else now.

        :param note: the transaction's :meth:`note_store`, copied into the fences.
        :returns: entry -> its fence."""
        names = sorted(set(names))
        if not names:
            return {}
        e, st = schema.entries, schema.stores
        born = sa.func.coalesce(
            sa.select(st.c.born_ms).where(st.c.namespace == self.namespace).scalar_subquery(),
            schema.clock_ms(self.dialect))
        conn.execute(self._insert(e).values(
            [{"namespace": self.namespace, "entry": n, "born_ms": born, "last_token": 0,
              "newest_slot": None} for n in names]).on_conflict_do_nothing(index_elements=_ENTRY_KEY))
        rows = conn.execute(
            sa.select(e.c.entry, e.c.born_ms, e.c.last_token, e.c.newest_slot)
            .where(e.c.namespace == self.namespace, e.c.entry.in_(names))
            .order_by(e.c.entry).with_for_update())
        fences = {r.entry: Fence(r.born_ms, r.last_token, r.newest_slot) for r in rows}
        if note is not None:
            for fence in fences.values():
                fence.store_born_ms, fence.memory_detail = note.born_ms, note.detail
        return fences

    def save_fences(self, conn: sa.Connection, fences: dict[str, Fence]) -> None:
        rows = [{"b_ns": self.namespace, "b_entry": name, "b_token": f.last_token,
                 "b_newest": f.newest_slot} for name, f in fences.items() if f.changed]
        if rows:
            e = schema.entries
            conn.execute(sa.update(e).where(e.c.namespace == sa.bindparam("b_ns"),
                                            e.c.entry == sa.bindparam("b_entry"))
                         .values(last_token=sa.bindparam("b_token"),
                                 newest_slot=sa.bindparam("b_newest")), rows)
