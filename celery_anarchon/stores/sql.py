"""SQL lease stores: :class:`PostgreSQLStore` (every host shares it) and :class:`SQLiteStore` (the
beat processes of one host share a file).

Both check lateness on their own clock and hold leases (DESIGN.md "Timing", "Leases"). The shared
implementation is :class:`~celery_anarchon.stores.sql_core.SQLStore`; this module holds only what
differs: the URL, the engine (connection settings, timeouts, transaction start) and how the driver
reports a missing table or a deadlock. Construction does no I/O.

URLs::

    postgresql://user:password@host:5432/db?sslmode=require   (also postgres://, postgresql+psycopg://)
    sqlite:///relative/path.sqlite3   sqlite:////absolute/path.sqlite3
"""
from __future__ import annotations

import importlib.util
import logging
import math
import os
import sqlite3
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy import exc as sa_exc

from celery_anarchon.errors import ConfigError, StoreUnavailable
from celery_anarchon.stores import mask_url
from celery_anarchon.stores.sql_core import SQLStore

__all__ = ["PostgreSQLStore", "SQLiteStore", "SQLStore"]

log = logging.getLogger(__name__)


def _parse(url: str, schemes: tuple[str, ...], kind: str) -> sa.URL:
    try:
        parsed = sa.make_url(url)
    except sa_exc.ArgumentError:
        raise ConfigError(f"anarchon_store_url {mask_url(url)!r} is not a valid {kind} URL") from None
    if parsed.drivername not in schemes:
        raise ConfigError(f"anarchon_store_url {mask_url(url)!r}: the {kind} store takes "
                          f"{' / '.join(s + '://' for s in schemes)} URLs")
    return parsed


def _sqlstate(error: BaseException) -> str | None:
    return getattr(getattr(error, "orig", None) or error, "sqlstate", None)


class PostgreSQLStore(SQLStore):
    """PostgreSQL through psycopg 3. Store clock: ``clock_timestamp()``.

    ``claim_timeout`` (seconds) becomes the connect timeout (libpq's minimum is 2 s), the
    ``statement_timeout`` of every session (it also bounds waiting for a lock), TCP keepalives and
    ``tcp_user_timeout`` (so a server that vanished is noticed), unless the URL sets them; other
    query parameters (``sslmode``, ...) are passed to libpq unchanged.

    :raises ConfigError: psycopg is not installed, or the URL is not a PostgreSQL URL.
    """

    kind = "postgresql"
    dialect = "postgresql"

    def _engine_url(self, url: str) -> sa.URL:
        if importlib.util.find_spec("psycopg") is None:
            raise ConfigError(f"anarchon_store_url {mask_url(url)!r} needs the Python package "
                              "'psycopg', which is not installed: pip install 'celery-anarchon[postgres]'")
        return _parse(url, ("postgresql", "postgres", "postgresql+psycopg"), "PostgreSQL").set(
            drivername="postgresql+psycopg")

    def _create_engine(self) -> sa.Engine:
        timeout_s = self.claim_timeout
        defaults: dict[str, Any] = {
            "connect_timeout": max(2, math.ceil(timeout_s)),
            "keepalives": 1, "keepalives_idle": max(1, math.ceil(timeout_s)),
            "keepalives_interval": 1, "keepalives_count": 3,
            "tcp_user_timeout": max(1000, math.ceil(timeout_s * 1000)),
        }
        connect_args = {k: v for k, v in defaults.items() if k not in self.engine_url.query}
        engine = sa.create_engine(self.engine_url, connect_args=connect_args, pool_pre_ping=True,
                                  pool_timeout=timeout_s,
                                  # the entry lock only works if each statement sees the previous
                                  # holder's commit: never run under a server default of REPEATABLE READ
                                  isolation_level="READ COMMITTED")
        statement_ms = max(1, round(timeout_s * 1000))
        # a process paused inside a transaction must not hold its entries' locks for ever
        idle_ms = max(10_000, 2 * statement_ms)

        @event.listens_for(engine, "connect")
        def _session(dbapi_conn, record) -> None:
            with dbapi_conn.cursor() as cur:
                cur.execute(f"SET statement_timeout = {statement_ms}")
                cur.execute(f"SET idle_in_transaction_session_timeout = {idle_ms}")
            dbapi_conn.commit()
        return engine

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        import psycopg
        return (psycopg.Error,)

    def _missing_table(self, error: BaseException) -> bool:
        return _sqlstate(error) == "42P01"                    # undefined_table

    def _retryable(self, error: BaseException) -> bool:
        return _sqlstate(error) in ("40P01", "40001")         # deadlock, serialization failure

    def _check_server(self, conn: sa.Connection) -> list[str]:
        version = conn.dialect.server_version_info or (0,)
        if version < (10,):
            raise ConfigError(f"{self.kind} store {self.safe_url}: PostgreSQL "
                              f"{'.'.join(map(str, version))} is too old; version 10 or later is needed")
        fsync, sync_commit = conn.execute(sa.text(
            "SELECT current_setting('fsync'), current_setting('synchronous_commit')")).one()
        warnings = []
        if fsync == "off" or sync_commit == "off":
            warnings.append(
                f"{self.kind} store {self.safe_url}: fsync={fsync}, synchronous_commit={sync_commit}: "
                "a server crash can lose the newest claims, and a run whose claim was lost can be "
                "sent again; turn both on for the claim database")
        return warnings


class SQLiteStore(SQLStore):
    """One SQLite file shared by the beat processes of one host (WAL, ``BEGIN IMMEDIATE``).

    Store clock: the host clock read inside SQLite. ``claim_timeout`` (seconds) is the
    ``busy_timeout``: how long a transaction waits for another process's write lock. A relative
    path is resolved against the working directory when the store is built. A file that is
    deleted or replaced while beat runs is noticed before the next operation: the store reconnects
    and treats it as amnesia (DESIGN.md "Amnesia").

    :raises ConfigError: not a file URL (``:memory:`` cannot be shared by processes).
    """

    kind = "sqlite"
    dialect = "sqlite"

    def __init__(self, url: str, **kwargs: Any) -> None:
        self._file_id: tuple[int, int] | None = None
        super().__init__(url, **kwargs)

    @property
    def path(self) -> str:
        """The absolute path of the SQLite file."""
        return str(self.engine_url.database)

    def _engine_url(self, url: str) -> sa.URL:
        parsed = _parse(url, ("sqlite", "sqlite+pysqlite"), "SQLite")
        database = parsed.database or ""
        in_memory = database.startswith("file:") or parsed.query.get("mode") == "memory"
        if database in ("", ":memory:") or in_memory:
            raise ConfigError(f"anarchon_store_url {mask_url(url)!r}: the SQLite store needs a file "
                              "that every beat process of the host opens, e.g. "
                              "'sqlite:////var/lib/celery/anarchon.sqlite3' (an in-memory database is "
                              "private to one process)")
        return parsed.set(drivername="sqlite+pysqlite", database=os.path.abspath(database))

    def _create_engine(self) -> sa.Engine:
        busy_ms = max(1, round(self.claim_timeout * 1000))
        engine = sa.create_engine(self.engine_url, connect_args={"timeout": self.claim_timeout},
                                  pool_timeout=self.claim_timeout)

        @event.listens_for(engine, "connect")
        def _setup(dbapi_conn, record) -> None:
            dbapi_conn.isolation_level = None     # SQLAlchemy's "begin" hook below emits BEGIN
            dbapi_conn.execute(f"PRAGMA busy_timeout = {busy_ms}")
            dbapi_conn.execute("PRAGMA journal_mode = WAL")
            dbapi_conn.execute("PRAGMA synchronous = FULL")   # a claim survives a power cut
            if self._file_id is None:
                self._file_id = self._stat()

        @event.listens_for(engine, "begin")
        def _begin(conn: sa.Connection) -> None:
            # a transaction that reads before it writes must hold the write lock from the start:
            # upgrading a read snapshot fails at once with "database is locked"
            write = conn.get_execution_options().get("anarchon_write", True)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")
        return engine

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino)

    def _engine_is_stale(self) -> bool:
        if self._file_id is None or self._stat() == self._file_id:
            return False
        log.warning("%s store %s: the file was deleted or replaced; reconnecting (the store forgot "
                    "its claims: docs/timing.md, \"Amnesia\")", self.kind, self.safe_url)
        self._file_id = None
        return True

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        return (sqlite3.Error,)

    def _missing_table(self, error: BaseException) -> bool:
        return "no such table" in str(getattr(error, "orig", None) or error)

    def prepare(self, entries) -> list[str]:
        """As :meth:`SQLStore.prepare`, creating the file's folder first.

        :raises ConfigError: the file or its folder cannot be created or opened (naming the path).
        """
        fix = ("point anarchon_store_url at a file in a folder this user can write, e.g. "
               "'sqlite:////var/lib/celery/anarchon.sqlite3' (four slashes for an absolute path)")
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
        except OSError as error:
            raise ConfigError(f"anarchon_store_url {self.safe_url!r}: cannot create the folder of the "
                              f"SQLite file {self.path!r} ({error.strerror or error}); {fix}") from None
        if os.path.isdir(self.path):
            raise ConfigError(f"anarchon_store_url {self.safe_url!r}: {self.path!r} is a folder, not "
                              f"a SQLite file; {fix}")
        try:
            return super().prepare(entries)
        except StoreUnavailable as error:
            if "unable to open database file" in str(error) or "readonly database" in str(error):
                raise ConfigError(f"anarchon_store_url {self.safe_url!r}: cannot open the SQLite file "
                                  f"{self.path!r} ({error}); {fix}") from None
            raise

    def _check_server(self, conn: sa.Connection) -> list[str]:
        if sqlite3.sqlite_version_info < (3, 24, 0):
            raise ConfigError(f"{self.kind} store: SQLite {sqlite3.sqlite_version} is too old; "
                              "3.24 or later is needed (upserts)")
        mode = conn.exec_driver_sql("PRAGMA journal_mode").scalar()
        if str(mode).lower() != "wal":
            return [f"{self.kind} store {self.safe_url}: the file is in journal mode {mode!r}, not "
                    "WAL (a network file system?): claims still work, more slowly; keep the file "
                    "on a local disk"]
        return []
