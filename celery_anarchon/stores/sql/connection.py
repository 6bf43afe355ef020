"""The connection layer of the SQL stores: each process's engine, and one transaction per
operation (:meth:`SQLConnection.run`) that creates what the tables lack, runs deadlock victims
again and turns every driver error into StoreUnavailable.

SQLAlchemy Core, no ORM. :class:`SQLConnection` is what the dialects share; what differs per
server (the URL, the engine's settings, how a transaction starts and commits, the server's epoch,
how the driver reports a missing table or a deadlock) are its hooks, which
:class:`~.postgresql.PostgreSQLConnection` and :class:`~.sqlite.SQLiteConnection` override.
Construction does no I/O.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from celery_anarchon._util import mask_url
from celery_anarchon.errors import ConfigError
from celery_anarchon.stores._common import retrying, translated
from celery_anarchon.stores.sql import schema

log = logging.getLogger(__name__)
T = TypeVar("T")

#: How often a transaction that was chosen as a deadlock victim (or hit a serialization failure)
#: is run again before the operation raises StoreUnavailable.
DEADLOCK_RETRIES = 5


class SQLConnection:
    """The engine of one store and its transactions.

    :param url: the store's URL (``anarchon_store_url``).
    :param kind: the store's name in messages ("postgresql", "sqlite").
    :param safe_url: the URL with its password masked, for messages.
    :param claim_timeout: seconds one round trip may take.
    :raises ConfigError: an unusable URL, or the driver is not installed (no I/O is done).
    """

    #: the dialect name SQLAlchemy reports ("postgresql" / "sqlite")
    dialect: ClassVar[str] = ""

    def __init__(self, url: str, *, kind: str, safe_url: str, claim_timeout: float) -> None:
        self.kind = kind
        self.safe_url = safe_url
        self.claim_timeout = claim_timeout
        #: the SQLAlchemy URL the engine is built from
        self.engine_url = self._engine_url(url)
        self._engine: sa.Engine | None = None
        self._engine_pid: int | None = None
        self._engine_lock = threading.Lock()
        self._lock_pid = os.getpid()
        self._schema_checked = False

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

    def epoch_sql(self, conn: sa.Connection) -> sa.ColumnElement:
        """The server's epoch as an SQL expression, read inside the transaction ("" : none)."""
        return sa.literal("")

    def epoch_text(self, conn: sa.Connection, value: Any) -> str:
        """The epoch as recorded, from the value of :meth:`epoch_sql`."""
        return str(value or "")

    def tables_sql(self, conn: sa.Connection) -> sa.ColumnElement:
        """Which tables the store's statements reach, as an SQL text expression read inside the
        transaction (PostgreSQL: the database's and the memory tables' OIDs, new when a table is
        re-created); ``""``: not told (docs/design.md "Amnesia": epoch)."""
        return sa.literal("")

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

    # -- the engine ---------------------------------------------------------------------------
    def engine(self) -> sa.Engine:
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

    # -- transactions -------------------------------------------------------------------------
    @contextlib.contextmanager
    def _transaction(self, write: bool, state: dict | None = None, durable: bool = True,
                     isolation: str | None = None):
        with self.engine().connect() as conn:
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

    def run(self, what: str, work: Callable[[sa.Connection], T], *, write: bool = True,
            needs_schema: bool = True, durable: bool = True,
            unconfirmed: Callable[[T], T] | None = None, isolation: str | None = None) -> T:
        """Run ``work(conn)`` in one transaction. Creates what the tables lack once, then runs it
        again (:func:`~.schema.create_schema`): tables an older version made get the new columns
        (an upgrade, told once at INFO); tables that vanished are amnesia (a warning; the memory
        then begins now). Re-runs deadlock victims (``DEADLOCK_RETRIES``), and
        turns every driver error into StoreUnavailable naming the masked URL and the cause
        (:func:`~celery_anarchon.stores._common.translated`).

        :param what: the operation, for messages (``"claim"``).
        :param write: a writing transaction (PostgreSQL: its commit waits as ``durable`` says;
            SQLite: ``BEGIN IMMEDIATE``); False: a read.
        :param needs_schema: create missing tables and run ``work`` again on a missing table.
        :param durable: the commit waits for what the store's durability setting asks
            (PostgreSQL: synchronous standbys); False: the local disk only.
        :param unconfirmed: called with the result when the commit was not confirmed durable;
            its return value is the answer (default: a warning, and the result).
        :param isolation: a read's purpose for :meth:`_isolation` ("snapshot", "single").
        :raises StoreUnavailable: the store cannot be reached, or a driver error.
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
            change = self.run("create the schema", schema.create_schema, needs_schema=False)
            if not change.existed:   # create_schema tells a partial loss and an upgrade itself
                log.warning("%s store %s: tables missing during %s: the store forgot its data; "
                            "re-created them (docs/timing.md, \"Amnesia\")", self.kind,
                            self.safe_url, what)
            return attempts()

    def run_with_schema(self, what: str, work: Callable[[sa.Connection], T], **options: Any) -> T:
        """:meth:`run`, after creating missing tables once per process: an admin tool may write
        entries or read instance records before any beat prepared the store, and a new database
        is no amnesia (tables that vanish later are: :meth:`run` re-creates them with its
        warning)."""
        if not self._schema_checked:
            self.run("create the schema", schema.create_schema, needs_schema=False)
            self._schema_checked = True
        return self.run(what, work, **options)

    def now_us(self, conn: sa.Connection) -> int:
        """The store's clock inside ``conn``'s transaction, UTC microseconds."""
        return int(conn.execute(sa.select(schema.clock_us(self.dialect))).scalar_one())

    def insert(self, table: sa.Table):
        """The dialect's INSERT of ``table`` (with ON CONFLICT)."""
        return schema.insert(self.dialect, table)


def parse_url(url: str, schemes: tuple[str, ...], kind: str) -> sa.URL:
    """``url`` as SQLAlchemy reads it, one of ``schemes``.

    :raises ConfigError: not a valid URL, or another scheme (naming the masked URL and ``kind``).
    """
    try:
        parsed = sa.make_url(url)
    except sa_exc.ArgumentError:
        raise ConfigError(f"anarchon_store_url {mask_url(url)!r} is not a valid {kind} URL") from None
    if parsed.drivername not in schemes:
        raise ConfigError(f"anarchon_store_url {mask_url(url)!r}: the {kind} store takes "
                          f"{' / '.join(s + '://' for s in schemes)} URLs")
    return parsed
