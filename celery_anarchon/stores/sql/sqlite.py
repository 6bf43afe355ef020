"""The SQLite store (the beat processes of one host share a file): :class:`SQLiteStore` and its
connection, :class:`SQLiteConnection`.

It checks lateness on its own clock and holds leases (docs/design.md "Timing", "Leases"). The
shared implementation is :class:`~celery_anarchon.stores.sql.store.SQLStore` on
:class:`~celery_anarchon.stores.sql.connection.SQLConnection`; this module holds only what differs:
the file (its path, its folder, a file replaced under the store), the engine (WAL, ``BEGIN
IMMEDIATE``), the epoch and how the driver reports a missing table. Construction does no I/O.

URLs::

    sqlite:///relative/path.sqlite3   sqlite:////absolute/path.sqlite3
"""
from __future__ import annotations

import logging
import os
import sqlite3
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy import exc as sa_exc

from celery_anarchon.errors import ConfigError, StoreUnavailable
from celery_anarchon._util import mask_url
from celery_anarchon.stores.sql.connection import SQLConnection, parse_url
from celery_anarchon.stores.sql.store import SQLStore

log = logging.getLogger(__name__)


def absolute_sqlite_url(url: str) -> str:
    """``url`` (``sqlite:///path``) with its path made absolute against the working directory
    (``sqlite:////abs/path``, query kept); an absolute path's URL, and any URL SQLAlchemy cannot
    read or without a file (the store refuses those), as given.

    The one place a relative SQLite path is resolved: a relative path names another file in each
    directory a process starts in, so it is resolved once, when the store is built, and only the
    absolute URL is used and printed after that.
    """
    try:
        parsed = sa.make_url(url)
    except sa_exc.ArgumentError:
        return url
    database = parsed.database or ""
    if (database in ("", ":memory:") or database.startswith("file:") or os.path.isabs(database)
            or parsed.query.get("mode") == "memory"):
        return url
    return parsed.set(database=os.path.abspath(database)).render_as_string(hide_password=False)


class SQLiteStore(SQLStore):
    """One SQLite file shared by the beat processes of one host (WAL, ``BEGIN IMMEDIATE``).

    Store clock: the host clock read inside SQLite. ``claim_timeout`` (seconds) is the
    ``busy_timeout``: how long a transaction waits for another process's write lock. A relative
    path is resolved once, against the working directory when the store is built
    (:func:`absolute_sqlite_url`): :attr:`url` and :attr:`safe_url` are the absolute URL (every
    banner, log, ``check``, ``status`` and page line names that file), and :meth:`prepare` (and
    the worker side, when it opens its store) warns that another directory would mean another
    file (:meth:`relative_warning`). A file that is
    deleted or replaced while beat runs is noticed before the next operation: the store reconnects
    and treats it as amnesia (docs/design.md "Amnesia"). Every commit is ``synchronous = FULL`` (in WAL
    mode, NORMAL may lose the last commits on a power cut).

    Epoch: the file's inode number. A file put in the place of the store's file (a backup
    restored with ``mv`` or ``cp`` to a new name, a copy from another disk) has another inode, so
    its first claim restarts the memory (docs/design.md "Amnesia"); a backup copied *over* the file in
    place keeps the inode and is not noticed (docs/stores.md: delete the file instead).

    :raises ConfigError: not a file URL (``:memory:`` cannot be shared by processes).
    """

    kind = "sqlite"

    def __init__(self, url: str, **kwargs: Any) -> None:
        absolute = absolute_sqlite_url(url)
        #: (the URL as given, the working directory it was resolved against) when it named a
        #: relative path, else None
        self.relative: tuple[str, str] | None = (url, os.getcwd()) if absolute != url else None
        super().__init__(absolute, **kwargs)

    def _connect(self, url: str) -> SQLiteConnection:
        return SQLiteConnection(url, kind=self.kind, safe_url=self.safe_url,
                                claim_timeout=self.claim_timeout)

    @property
    def path(self) -> str:
        """The absolute path of the SQLite file."""
        return str(self.engine_url.database)

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
            warning = self.relative_warning()
            return super().prepare(entries) + ([warning] if warning else [])
        except StoreUnavailable as error:
            if "unable to open database file" in str(error) or "readonly database" in str(error):
                raise ConfigError(f"anarchon_store_url {self.safe_url!r}: cannot open the SQLite file "
                                  f"{self.path!r} ({error}); {fix}") from None
            raise

    def exists(self) -> bool:
        """As :meth:`SQLStore.exists`; a missing file is not created (False)."""
        return os.path.isfile(self.path) and super().exists()

    def relative_warning(self) -> str | None:
        """The warning of a store URL that named a relative path, or None: the one text beat
        (prepare), ``check``, ``status``, the page and the worker side give (docs/stores.md
        "SQLite")."""
        if self.relative is None:
            return None
        given, folder = self.relative
        return (f"{self.kind} store {self.safe_url}: anarchon_store_url {mask_url(given)!r} names "
                f"a relative path, resolved against this process's working directory ({folder}): "
                "a beat, worker or command started in another directory opens another file: two "
                "beats on two files each send every run, and a worker on another file than "
                "beat's adopts none of its leased runs. Fix: give the absolute path, "
                f"anarchon_store_url = {self.safe_url!r} (four slashes)")

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


class SQLiteConnection(SQLConnection):
    """The SQLite store's engine and transactions (see :class:`SQLiteStore`): WAL, ``busy_timeout``
    = ``claim_timeout``, ``BEGIN IMMEDIATE`` for every writing transaction, the file's inode as
    the epoch, and a new engine when the file was deleted or replaced.

    :raises ConfigError: not a file URL.
    """

    dialect = "sqlite"

    def __init__(self, url: str, *, kind: str, safe_url: str, claim_timeout: float) -> None:
        self._file_id: tuple[int, int] | None = None
        super().__init__(url, kind=kind, safe_url=safe_url, claim_timeout=claim_timeout)

    @property
    def path(self) -> str:
        """The absolute path of the SQLite file."""
        return str(self.engine_url.database)

    def _engine_url(self, url: str) -> sa.URL:
        parsed = parse_url(url, ("sqlite", "sqlite+pysqlite"), "SQLite")
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

    def epoch_sql(self, conn: sa.Connection) -> sa.ColumnElement:
        return sa.literal(f"file inode {self._file_id[1]}" if self._file_id else "")

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
        text = str(getattr(error, "orig", None) or error)
        return "no such table" in text or "no such column" in text or "has no column named" in text
