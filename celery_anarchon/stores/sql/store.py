"""The implementation shared by the SQL lease stores (:mod:`celery_anarchon.stores.sql`).

SQLAlchemy Core, no ORM; the dialects differ only in how they connect, their clock
(:func:`~celery_anarchon.stores.sql.schema.clock_us`) and how they lock (the connection layer,
:mod:`.connection`, with one subclass per server in :mod:`.postgresql` and :mod:`.sqlite`):

* PostgreSQL (psycopg 3, READ COMMITTED): every writing transaction first locks the rows of its
  entries in ``anarchon_entries`` (``INSERT ... ON CONFLICT DO NOTHING`` then ``SELECT ... ORDER
  BY entry FOR UPDATE``), always in the order of the entry names, so concurrent instances queue on
  the same rows in the same order: they neither deadlock nor both win. Each statement after the
  lock sees what the previous holder committed. Deadlocks and serialization failures (which the
  ordering avoids, but a server configured for SERIALIZABLE could raise) are retried here.
* SQLite (WAL, ``busy_timeout`` = claim_timeout): every writing transaction starts with ``BEGIN
  IMMEDIATE``, which takes the file's write lock before anything is read.

Before it locks its entries, every claim and lease operation reads the namespace's row of
``anarchon_stores`` in the same transaction (docs/design.md "Amnesia"): the server's epoch is
compared with the recorded one (a change restarts the store-wide memory at that moment), the
instance's ``memory`` with the recorded one, and the store-wide memory start becomes part of each
entry's effective memory start = max(entry's, store-wide). That row is only ever locked before
entry rows, so the lock order stays deadlock-free.

:class:`SQLStore` joins the parts, each a module given what it needs of the store: the
store-wide note and the entries' fences (:mod:`.memory`), the claim decisions (:mod:`.claims`),
history and definitions (:mod:`.history`), the lease operations (:mod:`.leases`), store entries
and pauses (:mod:`.entries`, with run-now requests: :mod:`.requests`) and instance records
(:mod:`.instances`).

Tables: :mod:`celery_anarchon.stores.sql.schema`. Rules: docs/design.md "Who won", "Amnesia",
"Timing" and "Leases". Units: instants
are UTC integer ms (``*_ms``), durations given to a store are ms, options are seconds.
"""
from __future__ import annotations

import datetime as dt
import logging
import math
import time
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import sqlalchemy as sa

from celery_anarchon._util import positive_int, seconds
from celery_anarchon.errors import ConfigError, StoreUnavailable
from celery_anarchon.stores._common import reject_unknown_options
from celery_anarchon.stores.sql import options as sql_options, schema
from celery_anarchon.stores.base import (
    DEFAULT_CLAIM_TIMEOUT_S, DEFAULT_HISTORY_SIZE, DEFAULT_MEMORY_S,
    ClaimRequest, ClaimResult, ClaimStore, Memory,
)
from celery_anarchon.stores.sql.claims import SQLClaims
from celery_anarchon.stores.sql.connection import SQLConnection
from celery_anarchon.stores.sql.entries import SQLEntries
from celery_anarchon.stores.sql.history import SQLHistory
from celery_anarchon.stores.sql.instances import SQLInstances
from celery_anarchon.stores.sql.leases import SQLLeases
from celery_anarchon.stores.sql.memory import SQLMemory

log = logging.getLogger(__name__)

#: Seconds between two prunes of expired claims and terminal runs, per process.
PRUNE_INTERVAL_S = 5.0


class SQLStore(ClaimStore):
    """The shared implementation of :class:`~.postgresql.PostgreSQLStore` and
    :class:`~.sqlite.SQLiteStore`, with every part: ``history`` (:class:`~.history.SQLHistory`),
    ``leases`` (:class:`~.leases.SQLLeases`),
    ``entries`` (store entries, pauses, run-now requests: :class:`~.entries.SQLEntries`) and
    ``instances`` (instance records: :class:`~.instances.SQLInstances`).

    Options (``anarchon_store_options``): ``memory`` (seconds a claimed run is remembered, default
    3600, docs/design.md "Timing"; recorded in the store: every instance must use the same value),
    ``history_size`` (runs kept per entry, default 100) and ``claim_timeout`` (seconds one round
    trip may take, default 5). PostgreSQL adds ``durability`` and ``confirm_timeout``.

    :raises ConfigError: an unknown option, a bad option value or an unusable URL (no I/O is done).
    """

    checks_lateness = True
    #: options a subclass takes itself (named in the unknown-option error)
    own_options: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, url: str, *, namespace: str, instance_id: str,
                 memory: float | dt.timedelta = DEFAULT_MEMORY_S,
                 history_size: int = DEFAULT_HISTORY_SIZE,
                 claim_timeout: float | dt.timedelta = DEFAULT_CLAIM_TIMEOUT_S, **options: Any) -> None:
        reject_unknown_options(self.kind, options, {*sql_options.OPTIONS, *self.own_options})
        memory_s = seconds("memory", memory)
        timeout_s = seconds("claim_timeout", claim_timeout)
        super().__init__(url, namespace=namespace, instance_id=instance_id,
                         history_size=positive_int("history_size", history_size),
                         claim_timeout=timeout_s)
        #: how long a claimed run is remembered, seconds and ms
        self.memory_s = memory_s
        self.memory_ms = math.ceil(memory_s * 1000)
        #: the engine and its transactions (the server's own subclass)
        self.connection = self._connect(url)
        #: the SQLAlchemy URL the engine is built from
        self.engine_url = self.connection.engine_url
        self._next_prune = 0.0
        self._parts()

    def _connect(self, url: str) -> SQLConnection:
        """The server's connection for ``url`` (with the options it takes itself).

        :raises ConfigError: an unusable URL or option value (no I/O is done).
        """
        raise NotImplementedError

    def _parts(self) -> None:
        """The parts, each given what it needs of this store and its connection."""
        c = self.connection
        ns, me, dialect = self.namespace, self.instance_id, c.dialect
        #: the store-wide note and the entries' fences
        self._memory = SQLMemory(namespace=ns, kind=self.kind, safe_url=self.safe_url,
                                 dialect=dialect, memory_s=self.memory_s, memory_ms=self.memory_ms,
                                 insert=c.insert, epoch_sql=c.epoch_sql, epoch_text=c.epoch_text,
                                 tables_sql=c.tables_sql)
        note, lock, fences = (self._memory.note_store, self._memory.lock_entries,
                              self._memory.save_fences)
        #: the history of runs and the texts of definitions
        self.history = SQLHistory(namespace=ns, instance_id=me, history_size=self.history_size,
                                   dialect=dialect, insert=c.insert, run=c.run,
                                   lock_entries=lock, now_us=c.now_us)
        #: entries, pauses, run-now requests; instance records
        self.entries = SQLEntries(namespace=ns, memory_ms=self.memory_ms, insert=c.insert,
                                   run=c.run_with_schema, lock_entries=lock, now_us=c.now_us,
                                   server_epoch=self._memory.server_epoch, note_store=note)
        self.instances = SQLInstances(namespace=ns, insert=c.insert, run=c.run_with_schema,
                                       now_us=c.now_us)
        #: the claim decisions of a batch
        self._claims = SQLClaims(
            namespace=ns, instance_id=me, memory_s=self.memory_s, memory_ms=self.memory_ms,
            insert=c.insert, note_store=note, lock_entries=lock, pauses=self.entries.pauses,
            save_fences=fences, now_us=c.now_us, history=self.history)
        #: the records of leased runs
        self.leases = SQLLeases(
            namespace=ns, instance_id=me, memory_ms=self.memory_ms, kind=self.kind,
            safe_url=self.safe_url, run=c.run, lock_entries=lock, note_store=note,
            save_fences=fences, now_us=c.now_us, history_row=self.history.row,
            write_history=self.history.write, pauses=self.entries.pauses)

    def _check_server(self, conn: sa.Connection) -> list[str]:
        """Versions and settings at prepare(): warnings, or ConfigError when it cannot serve."""
        return []

    # -- identity -------------------------------------------------------------------------
    @property
    def memory(self) -> Memory:
        """``memory`` seconds, pruned by age only (docs/design.md, store memory table)."""
        return Memory(duration_s=self.memory_s, count=None, setting="memory")

    # -- life cycle -----------------------------------------------------------------------
    def close(self) -> None:
        """Dispose of the connection pool. Idempotent; the next operation reconnects."""
        self.connection.close()

    def prepare(self, entries: Iterable[str]) -> list[str]:
        """Create missing tables, note the store-wide memory start, epoch and ``memory`` when the
        namespace has none (docs/design.md "Amnesia"), and the memory start of entries without
        one: the store-wide one (an intact store need not refuse a new entry's first slots).

        :returns: warnings for the operator (e.g. a PostgreSQL with ``fsync`` off, or with
            asynchronous standbys).
        :raises StoreUnavailable: the store cannot be reached.
        :raises ConfigError: the server is too old, (SQLite) the file cannot be created, or the
            store recorded another ``memory`` that is still in use (naming both values).
        """
        names = sorted(set(entries))

        def work(conn: sa.Connection) -> list[str]:
            warnings = self._check_server(conn)
            schema.create_schema(conn)
            note = self._memory.note_store(conn, claiming=False)
            if note.conflict is not None:
                raise ConfigError(f"{self.kind} store {self.safe_url}: {note.conflict}")
            self._memory.lock_entries(conn, names)
            return warnings
        return self.connection.run("prepare", work)

    def exists(self) -> bool:
        """Whether the namespace has its row of ``anarchon_stores`` (the memory-start note),
        read without creating a table or a row (:meth:`ClaimStore.exists`)."""
        stores = schema.stores

        def work(conn: sa.Connection) -> bool:
            if not sa.inspect(conn).has_table(stores.name):
                return False
            return conn.execute(sa.select(stores.c.namespace)
                                .where(stores.c.namespace == self.namespace)).first() is not None
        return self.connection.run("read whether the store exists", work, write=False,
                                   needs_schema=False)

    def now_ms(self) -> int:
        """The store's clock, UTC ms (PostgreSQL ``clock_timestamp()``; SQLite: the host's)."""
        return self.connection.run("read the clock", lambda conn: self.connection.now_us(conn) // 1000,
                                   write=False, needs_schema=False)

    # -- claims ---------------------------------------------------------------------------
    def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimResult]:
        """Claim ``requests`` in one transaction; results in request order.

        Checks per run, in order (docs/design.md "Who won", "Amnesia", "One run, in time" 3, "Leases"):
        already claimed (``WON`` again for this instance, with the run's token; else ``LOST``),
        forgotten, late, early, then for leased runs superseded and overlapping; else ``WON``.
        A claim committed but not confirmed durable answers UNCONFIRMED
        (:meth:`.SQLClaims.unconfirmed`).

        :raises StoreUnavailable: the outcome is unknown; retry with the same requests.
        """
        if not requests:
            return []
        def unconfirmed(results: list[ClaimResult]) -> list[ClaimResult]:
            return self._claims.unconfirmed(
                results, run=self.connection.run, kind=self.kind, safe_url=self.safe_url,
                confirm_timeout=getattr(self, "confirm_timeout", 0))
        results = self.connection.run(
            "claim", lambda conn: self._claims.decide(conn, list(requests)),
            unconfirmed=unconfirmed)
        self._maybe_prune()
        return results

    # -- pruning --------------------------------------------------------------------------
    def _maybe_prune(self) -> None:
        """At most every PRUNE_INTERVAL_S (or half the memory, if shorter) per process: delete
        claims past their keep-until time and terminal runs past the memory. Best effort: a
        failure only delays it."""
        if time.monotonic() < self._next_prune:
            return
        # a short memory is pruned as often as it passes, so what it no longer promises goes soon
        self._next_prune = time.monotonic() + min(PRUNE_INTERVAL_S, self.memory_s / 2)
        try:
            self.prune()
        except StoreUnavailable as error:
            log.debug("prune skipped: %s", error)

    def prune(self) -> int:
        """Delete what the store no longer promises to remember (claims past ``max(claim time,
        slot) + memory``, terminal runs past their end + memory). :returns: rows deleted.

        :raises StoreUnavailable: the store cannot be reached.
        """
        def work(conn: sa.Connection) -> int:
            now = self.connection.now_us(conn) // 1000
            deleted = 0
            for table in (schema.claims, schema.runs):
                deleted += conn.execute(sa.delete(table).where(table.c.keep_until_ms < now)).rowcount
            return deleted + self.entries.prune(conn, now) + self.instances.prune(conn, now)
        return self.connection.run("prune", work)
