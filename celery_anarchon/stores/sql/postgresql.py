"""The PostgreSQL store (every host shares it): :class:`PostgreSQLStore` and its connection,
:class:`PostgreSQLConnection` (psycopg 3).

It checks lateness on its own clock and holds leases (docs/design.md "Timing", "Leases"). The
shared implementation is :class:`~celery_anarchon.stores.sql.store.SQLStore` on
:class:`~celery_anarchon.stores.sql.connection.SQLConnection`; this module holds only what differs:
the URL, the engine (connection settings, timeouts, how a commit waits for the standbys), the
epoch, how the driver reports a missing table or a deadlock, and the server's checks at start-up.
Construction does no I/O.

URL::

    postgresql://user:password@host:5432/db?sslmode=require   (also postgres://, postgresql+psycopg://)
"""
from __future__ import annotations

import datetime as dt
import importlib.util
import logging
import math
import threading
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import postgresql

from celery_anarchon.errors import ConfigError
from celery_anarchon._util import mask_url
from celery_anarchon.stores.sql import options as sql_options
from celery_anarchon.stores.sql.connection import SQLConnection, parse_url
from celery_anarchon.stores.sql.options import POSTGRESQL_OPTIONS
from celery_anarchon.stores.sql.schema import MEMORY_TABLES, stores
from celery_anarchon.stores.sql.store import SQLStore

log = logging.getLogger(__name__)


def _sqlstate(error: BaseException) -> str | None:
    return getattr(getattr(error, "orig", None) or error, "sqlstate", None)


class PostgreSQLStore(SQLStore):
    """PostgreSQL through psycopg 3. Store clock: ``clock_timestamp()``.

    ``claim_timeout`` (seconds) becomes the connect timeout (libpq's minimum is 2 s), the
    ``statement_timeout`` of every session (it also bounds waiting for a lock), TCP keepalives and
    ``tcp_user_timeout`` (so a server that vanished is noticed), unless the URL sets them; other
    query parameters (``sslmode``, ...) are passed to libpq unchanged.

    Durability (docs/design.md "Amnesia": durable claim, docs/stores.md "PostgreSQL"): every
    writing transaction sets
    ``synchronous_commit`` for itself. ``durability="auto"`` (default): ``on`` when the primary's
    ``synchronous_standby_names`` is set (the commit waits until a synchronous standby flushed
    it), else ``local`` (the primary's disk; a promoted asynchronous standby is caught by the
    epoch below when the primary died first, not in a split brain: an old primary still serving
    some instances can win the same runs; see docs/stores.md). ``"local"``: always ``local``.
    ``"standby"``: always ``on``, and prepare() refuses a primary without synchronous standbys. A commit that waits longer than
    ``confirm_timeout`` seconds (default 2, or half of claim_timeout if lower, as on Redis; it
    must be below claim_timeout) is cancelled:
    PostgreSQL then keeps it locally and only warns, so its won claims answer UNCONFIRMED and
    are never sent. (``statement_timeout`` does not bound that wait: PostgreSQL disables it
    before committing; the store sends a cancel request.)

    Epoch (docs/design.md "Amnesia"): the system identifier (``pg_control_system()``, read once per
    connection) and the timeline of the current WAL file (``pg_walfile_name(pg_current_wal_lsn())``,
    which follows a promotion at once, unlike ``pg_control_checkpoint()``), read inside every
    claim and lease operation. Both functions are executable by PUBLIC on PostgreSQL 10 to 17.
    With them, in the same statement: the OIDs of the database and of the memory tables
    (:meth:`PostgreSQLConnection.tables_sql`: tables re-created by ``pg_restore --clean``) and the
    ``xmin`` of the namespace's ``anarchon_restore_marks`` row against the transaction id written
    into it (rows put back by a data-only restore); see docs/stores.md "PostgreSQL", "Restores".

    :raises ConfigError: psycopg is not installed, the URL is not a PostgreSQL URL, or
        ``durability`` / ``confirm_timeout`` is invalid (naming the value and the choices).
    """

    kind = "postgresql"
    own_options = POSTGRESQL_OPTIONS

    def __init__(self, url: str, *, durability: str = "auto",
                 confirm_timeout: float | dt.timedelta | None = None, **kwargs: Any) -> None:
        #: "auto", "local" or "standby" (see the class docstring)
        self.durability = sql_options.durability(durability)
        self._confirm_timeout = confirm_timeout
        super().__init__(url, **kwargs)

    def _connect(self, url: str) -> PostgreSQLConnection:
        #: seconds a commit may wait for the synchronous standbys before it counts as unconfirmed
        self.confirm_timeout = sql_options.confirm_timeout(self._confirm_timeout,
                                                           self.claim_timeout)
        return PostgreSQLConnection(url, kind=self.kind, safe_url=self.safe_url,
                                    claim_timeout=self.claim_timeout, durability=self.durability,
                                    confirm_timeout=self.confirm_timeout)

    def _check_server(self, conn: sa.Connection) -> list[str]:
        version = conn.dialect.server_version_info or (0,)
        if version < (10,):
            raise ConfigError(f"{self.kind} store {self.safe_url}: PostgreSQL "
                              f"{'.'.join(map(str, version))} is too old; version 10 or later is needed")
        fsync, sync_commit, names, in_recovery = conn.execute(sa.text(
            "SELECT current_setting('fsync'), current_setting('synchronous_commit'), "
            "current_setting('synchronous_standby_names'), pg_is_in_recovery()")).one()
        where = f"{self.kind} store {self.safe_url}"
        warnings = []
        if in_recovery:
            raise ConfigError(f"{where}: the server is a standby (in recovery): point "
                              "anarchon_store_url at the primary")
        if fsync == "off":
            warnings.append(
                f"{where}: fsync=off: a server crash can lose the newest claims (the store cannot "
                "notice it), and a run whose claim was lost can be sent again; turn fsync on")
        if sync_commit == "off":
            warnings.append(
                f"{where}: synchronous_commit=off on the server: the store's own transactions set it "
                f"for themselves (durability={self.durability!r}), other writes to this database are "
                "not crash-safe")
        standbys = [tuple(r) for r in conn.execute(sa.text(
            "SELECT coalesce(application_name, ''), coalesce(sync_state, 'unknown') "
            "FROM pg_stat_replication ORDER BY 1"))]
        # without pg_read_all_stats (pg_monitor) a user sees the standbys' names, not their state
        hidden = [name or "?" for name, state in standbys if state == "unknown"]
        asynchronous = [name or "?" for name, state in standbys
                        if state not in ("sync", "quorum") and not (state == "unknown" and names.strip())]
        if self.durability == "standby" and not names.strip():
            raise ConfigError(
                f"{where}: durability='standby' needs a synchronous standby, but the primary's "
                "synchronous_standby_names is empty: set it (e.g. synchronous_standby_names = "
                "'FIRST 1 (standby1)', or 'ANY 1 (standby1, standby2)' so that one standby may be "
                "down) or use durability='auto'")
        if asynchronous and (not names.strip() or self.durability == "local"):
            warnings.append(
                f"{where}: {len(asynchronous)} standby(s) ({', '.join(asynchronous)}) replicate "
                f"asynchronously{' for the claims (durability=local)' if names.strip() else ''}: a "
                "promoted standby may lack the newest claims. When the primary died before the "
                "promotion, the store notices it (a new timeline) and refuses the runs of the 10 s "
                "after it as forgotten (possible misses). That does not cover a split brain: an old "
                "primary still serving some instances after a promotion and the promoted standby "
                "can both win the same run (sent twice). Set synchronous_standby_names = "
                "'FIRST 1 (name)' (or 'ANY 1 (a, b)': one may be down) on the primary and keep "
                "durability='auto' (or 'standby'): claims then wait for the standby, so an old "
                "primary cut off from it answers unconfirmed; and fence the old primary at a "
                "failover (stop it or cut it off; failover tooling does it). Never start an old "
                "primary again as a primary without resyncing it (pg_rewind or a new base backup): "
                "it can win runs again, undetected")
        elif asynchronous and self.durability != "local":
            warnings.append(
                f"{where}: standby(s) {', '.join(asynchronous)} are not synchronous (state "
                f"{', '.join(s for _, s in standbys if s not in ('sync', 'quorum'))}); claims wait for "
                f"the synchronous ones named in synchronous_standby_names = {names!r}; promote only "
                "a synchronous standby (a promotion of another after the primary died is caught by "
                "the timeline: a few possible misses) and fence the old primary at a failover")
        if hidden and names.strip() and self.durability != "local":
            warnings.append(
                f"{where}: this user cannot see whether standby(s) {', '.join(hidden)} are "
                "synchronous (pg_stat_replication.sync_state needs pg_read_all_stats); claims wait "
                f"for synchronous_standby_names = {names!r}; GRANT pg_monitor TO this user for the check")
        if conn.info.get("anarchon_sysid") is None:
            warnings.append(
                f"{where}: pg_control_system() is not executable by this user: the store's epoch is "
                "the timeline alone, so a claim database replaced by another server on the same "
                "timeline goes unnoticed; GRANT EXECUTE ON FUNCTION pg_control_system() TO this user")
        return warnings


class PostgreSQLConnection(SQLConnection):
    """The PostgreSQL store's engine and transactions (see :class:`PostgreSQLStore`).

    :param durability: ``"auto"``, ``"local"`` or ``"standby"``: how a writing transaction's
        commit waits for the synchronous standbys.
    :param confirm_timeout: seconds a commit may wait for them before it counts as unconfirmed.
    :raises ConfigError: psycopg is not installed, or the URL is not a PostgreSQL URL.
    """

    dialect = "postgresql"

    def __init__(self, url: str, *, kind: str, safe_url: str, claim_timeout: float,
                 durability: str, confirm_timeout: float) -> None:
        super().__init__(url, kind=kind, safe_url=safe_url, claim_timeout=claim_timeout)
        self.durability = durability
        self.confirm_timeout = confirm_timeout

    def _engine_url(self, url: str) -> sa.URL:
        if importlib.util.find_spec("psycopg") is None:
            raise ConfigError(f"anarchon_store_url {mask_url(url)!r} needs the Python package "
                              "'psycopg', which is not installed: pip install 'celery-anarchon[postgres]'")
        return parse_url(url, ("postgresql", "postgres", "postgresql+psycopg"), "PostgreSQL").set(
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
            import psycopg
            notices: list[tuple[str, str]] = []
            record.info["anarchon_notices"] = notices
            dbapi_conn.add_notice_handler(
                lambda diag: notices.append((diag.severity_nonlocalized or "", diag.message_primary or "")))
            with dbapi_conn.cursor() as cur:
                cur.execute(f"SET statement_timeout = {statement_ms}")
                cur.execute(f"SET idle_in_transaction_session_timeout = {idle_ms}")
            dbapi_conn.commit()
            try:
                with dbapi_conn.cursor() as cur:
                    cur.execute("SELECT system_identifier::text FROM pg_control_system()")
                    record.info["anarchon_sysid"] = cur.fetchone()[0]
            except psycopg.Error:          # EXECUTE revoked: the epoch is the timeline alone
                record.info["anarchon_sysid"] = None
            dbapi_conn.rollback()
            with dbapi_conn.cursor() as cur:
                cur.execute("SELECT oid::text FROM pg_database WHERE datname = current_database()")
                record.info["anarchon_database"] = cur.fetchone()[0]
            dbapi_conn.rollback()
        return engine

    # -- epoch and durability ---------------------------------------------------------------
    def epoch_sql(self, conn: sa.Connection) -> sa.ColumnElement:
        return sa.func.substr(sa.func.pg_walfile_name(sa.func.pg_current_wal_lsn()), 1, 8)

    def epoch_text(self, conn: sa.Connection, value: Any) -> str:
        sysid = conn.info.get("anarchon_sysid")
        timeline = int(value, 16)
        return f"system {sysid} timeline {timeline}" if sysid else f"timeline {timeline}"

    def tables_sql(self, conn: sa.Connection) -> sa.ColumnElement:
        """``database <oid> tables <oid> ...``: the OIDs of the database (read once per connection)
        and of the store's memory tables and ``anarchon_stores`` as the statements' search_path
        finds them (``to_regclass``, in the order of their names). A table dropped and re-created
        (``pg_restore --clean``, a lost table) or a copy of the database has others; VACUUM FULL,
        CLUSTER and TRUNCATE do not change them."""
        oids = [sa.cast(sa.func.to_regclass(sa.literal(name)), postgresql.OID)
                for name in sorted(MEMORY_TABLES | {stores.name})]
        return sa.func.concat(sa.literal(f"database {conn.info.get('anarchon_database')} tables "),
                              sa.func.concat_ws(" ", *oids))

    def _start_write(self, conn: sa.Connection, durable: bool) -> None:
        if not durable or self.durability == "local":
            mode = "'local'"
        elif self.durability == "standby":
            mode = "'on'"
        else:
            mode = "CASE WHEN current_setting('synchronous_standby_names') = '' THEN 'local' ELSE 'on' END"
        waits, names = conn.exec_driver_sql(
            f"SELECT set_config('synchronous_commit', {mode}, true), "
            "current_setting('synchronous_standby_names')").one()
        conn.info["anarchon_waits"] = waits == "on" and bool(names.strip())
        # "standby" without a synchronous standby cannot be confirmed (prepare() refuses it; the
        # setting may have been changed since)
        conn.info["anarchon_unconfirmable"] = durable and self.durability == "standby" and not names.strip()

    def _commit(self, conn: sa.Connection, trans: sa.RootTransaction) -> bool:
        """Commit; a wait for the synchronous standbys longer than ``confirm_timeout`` is
        cancelled (a cancel request: the commit stays, PostgreSQL only warns) and reported as
        not confirmed. A connection whose cancel request went out is not reused: a late cancel
        must not hit its next statement."""
        if not conn.info.get("anarchon_waits"):
            trans.commit()
            return not conn.info.get("anarchon_unconfirmable")
        notices = conn.info["anarchon_notices"]
        dbapi = conn.connection.dbapi_connection
        fired = threading.Event()

        def cancel() -> None:
            fired.set()
            try:
                dbapi.cancel()
            except Exception as error:  # the server is gone: the commit fails on its own
                log.debug("cancel request failed: %s", error)
        timer = threading.Timer(self.confirm_timeout, cancel)
        timer.daemon = True
        del notices[:]
        timer.start()
        try:
            trans.commit()
        finally:
            timer.cancel()
        warned = [text for severity, text in notices if severity == "WARNING"]
        if fired.is_set():
            conn.invalidate()
        if warned or fired.is_set():
            log.debug("%s store %s: commit not confirmed by a synchronous standby: %s", self.kind,
                      self.safe_url, "; ".join(warned) or "cancel request sent")
            return False
        return True

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        import psycopg
        return (psycopg.Error,)

    def _isolation(self, purpose: str | None) -> str | None:
        # a snapshot of several statements; one statement needs no transaction around it
        return {"snapshot": "REPEATABLE READ", "single": "AUTOCOMMIT"}.get(purpose or "")

    def _missing_table(self, error: BaseException) -> bool:
        return _sqlstate(error) in ("42P01", "42703")         # undefined_table, undefined_column

    def _retryable(self, error: BaseException) -> bool:
        return _sqlstate(error) in ("40P01", "40001")         # deadlock, serialization failure
