"""The implementation shared by the SQL lease stores (:mod:`celery_anarchon.stores.sql`).

SQLAlchemy Core, no ORM; the dialects differ only in how they connect, their clock
(:func:`~celery_anarchon.stores.sql.schema.clock_us`) and how they lock:

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

Tables: :mod:`celery_anarchon.stores.sql.schema`. Rules: docs/design.md "Who won", "Amnesia",
"Timing" and "Leases". Units: instants
are UTC integer ms (``*_ms``), durations given to a store are ms, options are seconds.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from celery_anarchon._util import positive_int, seconds
from celery_anarchon.errors import ConfigError, StoreUnavailable
from celery_anarchon.stores._common import reject_unknown_options, retrying, translated
from celery_anarchon.stores.sql import schema
from celery_anarchon.stores.base import (
    DEFAULT_CLAIM_TIMEOUT_S, DEFAULT_HISTORY_SIZE, DEFAULT_MEMORY_S,
    ClaimRequest, ClaimResult, HistoryRecord, LeasedRun, LeaseStore, Memory, Outcome, RunEvent,
    TakeoverOutcome,
)
from celery_anarchon.stores.entry_store import (
    EntryStore,
)
from celery_anarchon.stores.sql.claims import SQLClaims
from celery_anarchon.stores.sql.entries import SQLEntries
from celery_anarchon.stores.sql.history import SQLHistory
from celery_anarchon.stores.sql.leases import Fence, SQLLeases
from celery_anarchon.stores.sql.memory import SQLMemory, StoreNote

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Seconds between two prunes of expired claims and terminal runs, per process.
PRUNE_INTERVAL_S = 5.0
#: How often a transaction that was chosen as a deadlock victim (or hit a serialization failure)
#: is run again before the operation raises StoreUnavailable.
DEADLOCK_RETRIES = 5


class SQLStore(LeaseStore, EntryStore):
    """The shared implementation of :class:`PostgreSQLStore` and :class:`SQLiteStore`: a lease
    store and an entry store (store entries, pauses, run-now requests, instance records:
    :class:`~.entries.SQLEntries`).

    Options (``anarchon_store_options``): ``memory`` (seconds a claimed run is remembered, default
    3600, docs/design.md "Timing"; recorded in the store: every instance must use the same value),
    ``history_size`` (runs kept per entry, default 100) and ``claim_timeout`` (seconds one round
    trip may take, default 5). PostgreSQL adds ``durability`` and ``confirm_timeout``.

    :raises ConfigError: an unknown option, a bad option value or an unusable URL (no I/O is done).
    """

    checks_lateness = True
    #: the dialect name SQLAlchemy reports ("postgresql" / "sqlite")
    dialect: ClassVar[str] = ""
    #: options a subclass takes itself (named in the unknown-option error)
    own_options: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, url: str, *, namespace: str, instance_id: str,
                 memory: float | dt.timedelta = DEFAULT_MEMORY_S,
                 history_size: int = DEFAULT_HISTORY_SIZE,
                 claim_timeout: float | dt.timedelta = DEFAULT_CLAIM_TIMEOUT_S, **options: Any) -> None:
        reject_unknown_options(self.kind, options, {"memory", *self.own_options})
        memory_s = seconds("memory", memory)
        timeout_s = seconds("claim_timeout", claim_timeout)
        super().__init__(url, namespace=namespace, instance_id=instance_id,
                         history_size=positive_int("history_size", history_size),
                         claim_timeout=timeout_s)
        #: how long a claimed run is remembered, seconds and ms
        self.memory_s = memory_s
        self.memory_ms = math.ceil(memory_s * 1000)
        #: the SQLAlchemy URL the engine is built from
        self.engine_url = self._engine_url(url)
        self._engine: sa.Engine | None = None
        self._engine_pid: int | None = None
        self._engine_lock = threading.Lock()
        self._lock_pid = os.getpid()
        self._next_prune = 0.0
        #: the store-wide note and the entries' fences, a part given what it needs of this store
        self._memory = SQLMemory(namespace=self.namespace, kind=self.kind, safe_url=self.safe_url,
                                 dialect=self.dialect, memory_s=memory_s, memory_ms=self.memory_ms,
                                 insert=self._insert, epoch_sql=self._epoch_sql,
                                 epoch_text=self._epoch_text)
        #: history and definitions, a part given what it needs of this store
        self._history = SQLHistory(
            namespace=self.namespace, instance_id=self.instance_id, history_size=self.history_size,
            dialect=self.dialect, insert=self._insert, run=self._run,
            lock_entries=self._lock_entries, now_us=self._now_us)
        #: entries, pauses, run-now requests, instance records, a part given what it needs
        self._entries = SQLEntries(namespace=self.namespace, memory_ms=self.memory_ms,
                                   insert=self._insert, run=self._run,
                                   lock_entries=self._lock_entries, now_us=self._now_us,
                                   server_epoch=self._memory.server_epoch,
                                   note_store=self._note_store)
        #: the claim decisions of a batch, a part given what it needs of this store
        self._claims = SQLClaims(
            namespace=self.namespace, instance_id=self.instance_id, memory_s=self.memory_s,
            memory_ms=self.memory_ms, insert=self._insert, note_store=self._note_store,
            lock_entries=self._lock_entries, pauses=self._entries.pauses,
            save_fences=self._save_fences, now_us=self._now_us, history=self._history)
        #: the lease operations, a part given what it needs of this store
        self._leases = SQLLeases(
            namespace=self.namespace, instance_id=self.instance_id, memory_ms=self.memory_ms,
            kind=self.kind, safe_url=self.safe_url, run=self._run, lock_entries=self._lock_entries,
            note_store=self._note_store, save_fences=self._save_fences, now_us=self._now_us,
            history_row=self._history.row, write_history=self._history.write,
            pauses=self._entries.pauses)

    # -- dialect hooks ----------------------------------------------------------------------
    def _engine_url(self, url: str) -> sa.URL:
        raise NotImplementedError

    def _create_engine(self) -> sa.Engine:
        raise NotImplementedError

    def _engine_is_stale(self) -> bool:
        """True when the pooled connections no longer reach the store (SQLite: file replaced)."""
        return False

    def _missing_table(self, error: BaseException) -> bool:
        raise NotImplementedError

    def _retryable(self, error: BaseException) -> bool:
        return False

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        return ()

    def _check_server(self, conn: sa.Connection) -> list[str]:
        """Versions and settings at prepare(): warnings, or ConfigError when it cannot serve."""
        return []

    def _epoch_sql(self, conn: sa.Connection) -> sa.ColumnElement:
        """The server's epoch as an SQL expression, read inside the transaction ("" : none)."""
        return sa.literal("")

    def _epoch_text(self, conn: sa.Connection, value: Any) -> str:
        """The epoch as recorded, from the value of :meth:`_epoch_sql`."""
        return str(value or "")

    def _isolation(self, purpose: str | None) -> str | None:
        """The isolation level of a read (``"snapshot"``: several statements that must agree;
        ``"single"``: one statement), or None for the engine's."""
        return None

    def _start_write(self, conn: sa.Connection, durable: bool) -> None:
        """First statement of a writing transaction (PostgreSQL: how its commit waits)."""

    def _commit(self, conn: sa.Connection, trans: sa.RootTransaction) -> bool:
        """Commit; :returns: False when the commit happened but was not confirmed durable
        (PostgreSQL: the wait for a synchronous standby was cancelled)."""
        trans.commit()
        return True

    # -- identity -------------------------------------------------------------------------
    @property
    def memory(self) -> Memory:
        """``memory`` seconds, pruned by age only (docs/design.md, store memory table)."""
        return Memory(duration_s=self.memory_s, count=None, setting="memory")

    # -- connections ----------------------------------------------------------------------
    def _get_engine(self) -> sa.Engine:
        """This process's engine, created on first use. A child process never reuses its
        parent's pool: it drops it without closing the parent's connections (``close=False``)."""
        pid = os.getpid()
        if self._lock_pid != pid:  # forked: never wait on a lock a parent's thread was holding
            self._engine_lock, self._lock_pid = threading.Lock(), pid
        with self._engine_lock:
            if self._engine is not None and self._engine_pid != pid:
                self._engine.dispose(close=False)
                self._engine = None
            elif self._engine is not None and self._engine_is_stale():
                self._engine.dispose()
                self._engine = None
            if self._engine is None:
                self._engine = self._create_engine()
                self._engine_pid = pid
            return self._engine

    def close(self) -> None:
        """Dispose of the connection pool. Idempotent; the next operation reconnects."""
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.dispose(close=self._engine_pid == os.getpid())

    @contextlib.contextmanager
    def _transaction(self, write: bool, state: dict | None = None, durable: bool = True,
                     isolation: str | None = None):
        with self._get_engine().connect() as conn:
            level = self._isolation(isolation)
            conn.execution_options(anarchon_write=write, **({"isolation_level": level} if level else {}))
            with conn.begin() as trans:
                if write:
                    self._start_write(conn, durable)
                yield conn
                confirmed = self._commit(conn, trans) if write else (trans.commit() or True)
                if state is not None:
                    state["confirmed"] = confirmed

    def _cause(self, error: BaseException) -> str:
        """The end of a StoreUnavailable message: the driver's error, its first line, with the
        URL's password masked."""
        cause = getattr(error, "orig", None) or error
        text = (str(cause).strip().splitlines() or [""])[0]
        if self.engine_url.password:
            text = text.replace(str(self.engine_url.password), "***")
        return f" failed: {type(cause).__name__}: {text}"

    def _once(self, what: str, work: Callable[[sa.Connection], T], write: bool, durable: bool,
              unconfirmed: Callable[[T], T] | None, isolation: str | None) -> T:
        state: dict = {}
        with self._transaction(write, state, durable, isolation) as conn:
            result = work(conn)
        if state.get("confirmed", True):
            return result
        if unconfirmed is not None:
            return unconfirmed(result)
        log.warning("%s store %s: %s committed on the primary, but no synchronous standby "
                    "confirmed it within confirm_timeout", self.kind, self.safe_url, what)
        return result

    def _run(self, what: str, work: Callable[[sa.Connection], T], *, write: bool = True,
             needs_schema: bool = True, durable: bool = True,
             unconfirmed: Callable[[T], T] | None = None, isolation: str | None = None) -> T:
        """Run ``work(conn)`` in one transaction. Creates what the tables lack once, then runs it
        again (:func:`~.schema.create_schema`): tables an older version made get the new columns
        (an upgrade, told once at INFO); tables that vanished are amnesia (a warning; the memory
        then begins now). Re-runs deadlock victims (``DEADLOCK_RETRIES``), and
        turns every driver error into StoreUnavailable naming the masked URL and the cause
        (:func:`~celery_anarchon.stores._common.translated`).

        :param durable: the commit waits for what the store's durability setting asks
            (PostgreSQL: synchronous standbys); False: the local disk only.
        :param unconfirmed: called with the result when the commit was not confirmed durable;
            its return value is the answer (default: a warning, and the result).
        :param isolation: a read's purpose for :meth:`_isolation` ("snapshot", "single").
        """
        errors = (sa_exc.SQLAlchemyError, *self._driver_errors())

        def attempts() -> T:
            return retrying(self._retryable, attempts=DEADLOCK_RETRIES + 1, wait_s=0.01,
                            max_wait_s=0.2)(self._once, what, work, write, durable, unconfirmed,
                                             isolation)
        with translated(self.kind, self.safe_url, what, errors, cause=self._cause):
            try:
                return attempts()
            except errors as error:
                if not (needs_schema and self._missing_table(error)):
                    raise
            change = self._run("create the schema", schema.create_schema, needs_schema=False)
            if not change.existed:   # create_schema tells a partial loss and an upgrade itself
                log.warning("%s store %s: tables missing during %s: the store forgot its data; "
                            "re-created them (docs/timing.md, \"Amnesia\")", self.kind,
                            self.safe_url, what)
            return attempts()

    def _now_us(self, conn: sa.Connection) -> int:
        return int(conn.execute(sa.select(schema.clock_us(self.dialect))).scalar_one())

    def _insert(self, table: sa.Table):
        return schema.insert(self.dialect, table)

    # -- life cycle -----------------------------------------------------------------------
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
            note = self._note_store(conn, claiming=False)
            if note.conflict is not None:
                raise ConfigError(f"{self.kind} store {self.safe_url}: {note.conflict}")
            self._lock_entries(conn, names)
            return warnings
        return self._run("prepare", work)

    def now_ms(self) -> int:
        """The store's clock, UTC ms (PostgreSQL ``clock_timestamp()``; SQLite: the host's)."""
        return self._run("read the clock", lambda conn: self._now_us(conn) // 1000,
                         write=False, needs_schema=False)

    def _note_store(self, conn: sa.Connection, *, claiming: bool) -> StoreNote:
        """The namespace's store-wide note, brought up to date (:meth:`.SQLMemory.note_store`)."""
        return self._memory.note_store(conn, claiming=claiming)

    def _lock_entries(self, conn: sa.Connection, names: Iterable[str],
                      note: StoreNote | None = None) -> dict[str, Fence]:
        """Create and lock the entries' rows, in name order (:meth:`.SQLMemory.lock_entries`)."""
        return self._memory.lock_entries(conn, names, note)

    def _save_fences(self, conn: sa.Connection, fences: dict[str, Fence]) -> None:
        self._memory.save_fences(conn, fences)

    # -- claims ---------------------------------------------------------------------------
    def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimResult]:
        """Claim ``requests`` in one transaction; results in request order.

        Checks per run, in order (docs/design.md "Who won", "Amnesia", "One run, in time" 3, "Leases"):
        already claimed (``WON`` again for this instance, with the run's token; else ``LOST``),
        forgotten, late, early, then for leased runs superseded and overlapping; else ``WON``.

        :raises StoreUnavailable: the outcome is unknown; retry with the same requests.
        """
        if not requests:
            return []
        results = self._run("claim", lambda conn: self._claims.decide(conn, list(requests)),
                            unconfirmed=self._unconfirmed)
        self._maybe_prune()
        return results

    def _unconfirmed(self, results: list[ClaimResult]) -> list[ClaimResult]:
        """The claim committed, but not durably as the store's durability asks: every win is
        UNCONFIRMED (never sent; docs/design.md "Amnesia": durable claim) and its history says
        so (best effort). A retry of the same claim is confirmed again (its commit waits again)
        before it answers WON."""
        detail = ("committed on the primary, but no synchronous standby confirmed it within "
                  f"confirm_timeout {getattr(self, 'confirm_timeout', 0):g} s")
        answers = [dataclasses.replace(r, outcome=Outcome.UNCONFIRMED, token=None, detail=detail)
                   if r.outcome is Outcome.WON else r for r in results]
        rows = {r.request.run: r for r in answers if r.outcome is Outcome.UNCONFIRMED}
        log.warning("%s store %s: %d won claim(s) not confirmed durable in time: not sent",
                    self.kind, self.safe_url, len(rows))

        def work(conn: sa.Connection) -> None:
            self._lock_entries(conn, {entry for entry, _ in rows})
            now = self._now_us(conn) // 1000
            self._history.write(conn, [
                self._history.row(r.entry, r.slot_ms, RunEvent.UNCONFIRMED, now,
                                  task_id=r.request.task_id, attempt=r.attempt, detail=detail)
                for r in rows.values()], replace=True)
        if rows:
            try:
                self._run("record unconfirmed claims", work, durable=False)
            except StoreUnavailable as error:
                log.warning("%s", error)
        return answers

    # -- history and definitions (:class:`~.history.SQLHistory`) ----------------------------
    def record(self, entry: str, slot_ms: int, event: RunEvent, *, task_id: str = "",
               attempt: int = 1, detail: str = "") -> None:
        self._history.record(entry, slot_ms, event, task_id=task_id, attempt=attempt, detail=detail)

    def record_many(self, notes: Sequence[HistoryRecord]) -> None:
        """Every note in one transaction (:meth:`.SQLHistory.record_many`)."""
        self._history.record_many(notes)

    def history(self, entry: str, limit: int | None = None) -> list[HistoryRecord]:
        return self._history.history(entry, limit)

    def history_many(self, entries: Iterable[str],
                     limit: int | None = None) -> dict[str, list[HistoryRecord]]:
        return self._history.history_many(entries, limit)

    def save_definition(self, entry: str, fingerprint: str, text: str) -> None:
        self._history.save_definition(entry, fingerprint, text)

    def load_definition(self, entry: str, fingerprint: str) -> str | None:
        return self._history.load_definition(entry, fingerprint)

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
            now = self._now_us(conn) // 1000
            deleted = 0
            for table in (schema.claims, schema.runs):
                deleted += conn.execute(sa.delete(table).where(table.c.keep_until_ms < now)).rowcount
            return deleted + self._entries.prune(conn, now)
        return self._run("prune", work)

    # -- leases (docs/design.md "Leases"; :class:`~.leases.SQLLeases`) ----------------------------
    def inspect(self, entry: str, slot_ms: int) -> LeasedRun | None:
        return self._leases.inspect(entry, slot_ms)

    def expired_runs(self, entries: Iterable[str]) -> list[LeasedRun]:
        return self._leases.expired_runs(entries)

    def take_over(self, entry: str, slot_ms: int, expected_token: int, *,
                  queue_timeout_ms: int, max_attempts: int,
                  task_id: str = "") -> tuple[TakeoverOutcome, LeasedRun | None]:
        return self._leases.take_over(entry, slot_ms, expected_token,
                                      queue_timeout_ms=queue_timeout_ms, max_attempts=max_attempts,
                                      task_id=task_id)

    def adopt(self, entry: str, slot_ms: int, owner: str, duration_ms: int) -> tuple[bool, LeasedRun | None]:
        return self._leases.adopt(entry, slot_ms, owner, duration_ms)

    def renew(self, entry: str, slot_ms: int, token: int, owner: str, duration_ms: int) -> LeasedRun | None:
        return self._leases.renew(entry, slot_ms, token, owner, duration_ms)

    def release(self, entry: str, slot_ms: int, token: int) -> bool:
        return self._leases.release(entry, slot_ms, token)

    def requeue(self, entry: str, slot_ms: int, token: int, *, delay_ms: int,
                queue_timeout_ms: int) -> bool:
        return self._leases.requeue(entry, slot_ms, token, delay_ms=delay_ms,
                                    queue_timeout_ms=queue_timeout_ms)

    # -- entries, pauses, requests, instances (:class:`~.entries.SQLEntries`) -----------------
    @property
    def entry_ops(self):
        """The entry operations (EntryStore), a part in :mod:`.entries`."""
        return self._entries
