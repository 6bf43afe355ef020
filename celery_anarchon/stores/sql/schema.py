"""Tables and clock expressions of the SQL lease stores (:mod:`celery_anarchon.stores.sql`).

Every table name starts with ``anarchon_`` and every row carries its ``namespace``, so two apps
can share one database. Instants are UTC integer milliseconds (``*_ms``); fencing tokens are
integers derived from the store's clock in microseconds (docs/design.md "Words": fencing token).

* ``anarchon_entries``: one row per entry: when the store's memory of it began (``born_ms``,
  docs/design.md "Amnesia"), the last fencing token issued and the newest slot claimed for a leased
  run. Never pruned. Every writing operation locks the rows of its entries first, in the order of
  their names: that row lock is what serializes claims and lease changes of one entry.
* ``anarchon_claims``: one row per claimed run: the winner, its fingerprint, the store time of the
  claim and ``keep_until_ms`` = max(claim time, slot) + memory, after which it is pruned.
* ``anarchon_history``: the newest ``history_size`` runs of each entry (trimmed on write); a
  run's row keeps the records of its earlier attempts (``earlier``, JSON) after a takeover.
* ``anarchon_runs``: the record of each leased run (docs/design.md "Leases"); ``keep_until_ms`` is set
  when the run reaches a terminal state (now + memory) and it is pruned after that; ``requested``
  marks the run of a run-now request (never superseded by a scheduled slot).
* ``anarchon_definitions``: fingerprint -> the text of the entry definition it stands for.
* ``anarchon_stores``: one row per namespace: the store-wide memory start (``born_ms``), the
  server's epoch it was noted under (PostgreSQL: system identifier and timeline; SQLite: the
  inode), the OIDs of the database and of the memory tables it was noted under (``tables``,
  PostgreSQL; NULL before they were recorded), the epoch before the last change, and the recorded
  ``memory`` with the last time a claim used it (docs/design.md "Amnesia"). Never pruned.
* ``anarchon_restore_marks`` (PostgreSQL): one row per namespace, holding the id of the
  transaction that wrote it (``txid_current()``): a row put back by a restore (``COPY``) has
  another ``xmin``, so restored rows are seen even in tables that kept their OIDs
  (docs/stores.md "Restores"). Written only by this version and later; never pruned.

The entry store (:mod:`celery_anarchon.stores.entry_store`, :mod:`.entries`):

* ``anarchon_schedule_entries``: one row per name that holds a store entry's definition
  (canonical JSON text, ``NULL`` for a pause of a config entry) and/or a pause (``pause_at_ms``
  set), with the name's version (the namespace's entries version of its last change); a resume
  or a removal leaves it cleared (neither), pruned after ``CLEARED_KEEP_MS``.
* ``anarchon_schedule_versions``: one row per namespace: the entries version, raised in the
  transaction of every write to entries, pauses or run-now requests; the entries epoch (an id,
  when it began and the server's epoch it was written under: renewed when that changed) and the
  last accepted loss (docs/design.md "Amnesia").
* ``anarchon_run_requests``: run-now requests, one per (entry, request id), pruned by age after
  the ``anarchon_request_retention`` of the caller that writes the next request (+ the lateness
  tolerance); the engine reads only those younger than the store's memory (by
  ``requested_ms``).
* ``anarchon_request_memory``: one row per namespace: ``pruned_ms``, the newest "now - retention"
  of a prune of run-now requests: a request id made before it may have been pruned, so one that
  carries its time is refused (with the store-wide memory start, ``anarchon_stores.born_ms``).
* ``anarchon_instances``: each live beat's heartbeat (JSON fields), until ``expires_ms``.
* ``anarchon_fingerprints``: digest -> JSON mapping entry -> fingerprint; ``used_ms`` is
  refreshed by each heartbeat naming the digest, and it is pruned a day after its last use.
"""
from __future__ import annotations

import dataclasses
import logging
import threading

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from celery_anarchon._util import LATENESS_TOLERANCE_MS, mask_url

log = logging.getLogger(__name__)

#: Run states of a leased run that is still in flight (anarchon_runs.state).
OPEN_STATES = ("queued", "started")

metadata = sa.MetaData()

_TEXT = sa.Text()
_MS = sa.BigInteger()


def _key(*extra: sa.Column) -> list[sa.Column]:
    return [sa.Column("namespace", _TEXT, primary_key=True),
            sa.Column("entry", _TEXT, primary_key=True), *extra]


entries = sa.Table(
    "anarchon_entries", metadata,
    *_key(),
    sa.Column("born_ms", _MS, nullable=False),           # store time the memory of it began
    sa.Column("last_token", _MS, nullable=False),        # last fencing token issued (0: none)
    sa.Column("newest_slot", _MS, nullable=True),        # newest slot claimed for a leased run
)

claims = sa.Table(
    "anarchon_claims", metadata,
    *_key(sa.Column("slot_ms", _MS, primary_key=True)),
    sa.Column("winner", _TEXT, nullable=False),
    sa.Column("fingerprint", _TEXT, nullable=False),
    sa.Column("claimed_ms", _MS, nullable=False),
    sa.Column("keep_until_ms", _MS, nullable=False),
    sa.Index("anarchon_claims_keep_until", "keep_until_ms"),
)

history = sa.Table(
    "anarchon_history", metadata,
    # the primary key (namespace, entry, slot_ms) also serves the newest-first reads and the trim
    *_key(sa.Column("slot_ms", _MS, primary_key=True)),
    sa.Column("event", _TEXT, nullable=False),
    sa.Column("instance", _TEXT, nullable=False),
    sa.Column("store_ms", _MS, nullable=False),
    sa.Column("task_id", _TEXT, nullable=False),
    sa.Column("attempt", sa.Integer(), nullable=False),
    sa.Column("detail", _TEXT, nullable=False),
    # JSON list of the earlier attempts' records the run's record keeps (NULL: none)
    sa.Column("earlier", _TEXT, nullable=True),
)

runs = sa.Table(
    "anarchon_runs", metadata,
    *_key(sa.Column("slot_ms", _MS, primary_key=True)),
    sa.Column("state", _TEXT, nullable=False),
    sa.Column("attempt", sa.Integer(), nullable=False),
    sa.Column("token", _MS, nullable=False),
    sa.Column("owner", _TEXT, nullable=False),
    sa.Column("lease_expires_ms", _MS, nullable=True),
    sa.Column("queue_deadline_ms", _MS, nullable=True),
    sa.Column("keep_until_ms", _MS, nullable=True),      # set once terminal: pruned after it
    sa.Column("prev_token", _MS, nullable=True),         # the token a takeover replaced
    sa.Column("requested", sa.Integer(), nullable=True),  # 1: a run-now request's run
)
#: ``state IN ('queued', 'started')`` with literal values, so that PostgreSQL's generic plans
#: can prove the partial index below applies
open_run = runs.c.state.in_([sa.literal_column(f"'{state}'") for state in OPEN_STATES])
# runs in flight, per entry: the overlap check of a claim and expired_runs() read only these
sa.Index("anarchon_runs_open", runs.c.namespace, runs.c.entry, runs.c.slot_ms,
         postgresql_where=open_run, sqlite_where=open_run)
sa.Index("anarchon_runs_keep_until", runs.c.keep_until_ms,
         postgresql_where=runs.c.keep_until_ms.isnot(None),
         sqlite_where=runs.c.keep_until_ms.isnot(None))

definitions = sa.Table(
    "anarchon_definitions", metadata,
    *_key(sa.Column("fingerprint", _TEXT, primary_key=True)),
    sa.Column("text", _TEXT, nullable=False),
    sa.Column("saved_ms", _MS, nullable=False),
)

schedule_entries = sa.Table(
    "anarchon_schedule_entries", metadata,
    sa.Column("namespace", _TEXT, primary_key=True),
    sa.Column("name", _TEXT, primary_key=True),
    sa.Column("definition", _TEXT, nullable=True),       # canonical JSON; NULL: a pause only
    sa.Column("pause_reason", _TEXT, nullable=True),
    sa.Column("pause_by", _TEXT, nullable=True),
    sa.Column("pause_at_ms", _MS, nullable=True),        # set while paused (store clock)
    sa.Column("version", _MS, nullable=False),           # the entries version of its last change
    sa.Column("updated_ms", _MS, nullable=False),
    sa.Column("updated_by", _TEXT, nullable=False),
)

schedule_versions = sa.Table(
    "anarchon_schedule_versions", metadata,
    sa.Column("namespace", _TEXT, primary_key=True),
    sa.Column("version", _MS, nullable=False),
    sa.Column("epoch", _TEXT, nullable=True),            # the entries epoch (NULL: none yet)
    sa.Column("epoch_ms", _MS, nullable=True),           # when it began (store clock)
    sa.Column("server_epoch", _TEXT, nullable=True),     # the server's epoch it was written under
    sa.Column("accepted_ms", _MS, nullable=True),        # the last accepted loss (store clock)
    sa.Column("accepted_by", _TEXT, nullable=True),
)

run_requests = sa.Table(
    "anarchon_run_requests", metadata,
    sa.Column("namespace", _TEXT, primary_key=True),
    sa.Column("entry", _TEXT, primary_key=True),
    sa.Column("request_id", _TEXT, primary_key=True),
    sa.Column("slot_ms", _MS, nullable=False),
    sa.Column("requested_by", _TEXT, nullable=False),
    sa.Column("requested_ms", _MS, nullable=False),
    sa.Index("anarchon_run_requests_requested", "namespace", "requested_ms"),
)

request_memory = sa.Table(
    "anarchon_request_memory", metadata,
    sa.Column("namespace", _TEXT, primary_key=True),
    sa.Column("pruned_ms", _MS, nullable=False),         # request ids made before may be pruned
)

instances = sa.Table(
    "anarchon_instances", metadata,
    sa.Column("namespace", _TEXT, primary_key=True),
    sa.Column("instance_id", _TEXT, primary_key=True),
    sa.Column("fields", _TEXT, nullable=False),          # JSON of the InstanceRecord's fields
    sa.Column("seen_ms", _MS, nullable=False),
    sa.Column("expires_ms", _MS, nullable=False),
)

fingerprints = sa.Table(
    "anarchon_fingerprints", metadata,
    sa.Column("namespace", _TEXT, primary_key=True),
    sa.Column("digest", _TEXT, primary_key=True),
    sa.Column("mapping", _TEXT, nullable=False),         # JSON: entry name -> fingerprint
    sa.Column("used_ms", _MS, nullable=False),           # saved, or named by a heartbeat
)

stores = sa.Table(
    "anarchon_stores", metadata,
    sa.Column("namespace", _TEXT, primary_key=True),
    sa.Column("born_ms", _MS, nullable=False),           # store-wide memory start
    sa.Column("epoch", _TEXT, nullable=False),           # server epoch born_ms was noted under
    sa.Column("prev_epoch", _TEXT, nullable=False),      # the epoch before the last change ("")
    sa.Column("memory_ms", _MS, nullable=False),         # the recorded memory setting
    sa.Column("memory_used_ms", _MS, nullable=False),    # last claim made with it (1 s steps)
    sa.Column("tables", _TEXT, nullable=True),           # the tables' OIDs it was noted under
)

restore_marks = sa.Table(
    "anarchon_restore_marks", metadata,
    sa.Column("namespace", _TEXT, primary_key=True),
    sa.Column("xid", _MS, nullable=False),               # txid_current() of the writing transaction
)

#: columns added after a table's first release: (table, column, SQL type), added when missing
_ADDED_COLUMNS = (("anarchon_runs", "prev_token", "BIGINT"), ("anarchon_runs", "requested", "INTEGER"),
                  ("anarchon_history", "earlier", "TEXT"), ("anarchon_stores", "tables", "TEXT"),
                  ("anarchon_schedule_versions", "epoch", "TEXT"),
                  ("anarchon_schedule_versions", "epoch_ms", "BIGINT"),
                  ("anarchon_schedule_versions", "server_epoch", "TEXT"),
                  ("anarchon_schedule_versions", "accepted_ms", "BIGINT"),
                  ("anarchon_schedule_versions", "accepted_by", "TEXT"))
#: tables added after the first release, in the groups one version added together (the entry
#: store's): the database of an older version lacks a whole group; any other table that is
#: missing beside existing ones was lost (docs/design.md "Amnesia")
_ADDED_TABLES = (frozenset({"anarchon_schedule_entries", "anarchon_schedule_versions",
                            "anarchon_run_requests", "anarchon_instances", "anarchon_fingerprints"}),
                 frozenset({"anarchon_request_memory"}), frozenset({"anarchon_restore_marks"}))
#: the tables of the store's memory of claimed runs: losing one restarts the memory
MEMORY_TABLES = frozenset({"anarchon_entries", "anarchon_claims", "anarchon_runs"})


def clock_us(dialect_name: str) -> sa.ColumnElement:
    """The store's clock as an SQL expression, UTC microseconds since the epoch.

    PostgreSQL: ``clock_timestamp()``, the real time when evaluated (``now()`` is frozen at the
    start of the transaction). SQLite: the host clock read inside SQLite, at its millisecond
    resolution (``julianday('now')``; ``unixepoch('subsec')`` needs SQLite 3.42).
    """
    if dialect_name == "postgresql":
        epoch = sa.func.extract("epoch", sa.func.clock_timestamp())
        return sa.cast(sa.func.floor(epoch * sa.literal_column("1000000", sa.BigInteger)), sa.BigInteger)
    days = sa.func.julianday(sa.literal_column("'now'")) - sa.literal_column("2440587.5")
    ms = sa.func.round(days * sa.literal_column("86400000.0"))
    return sa.cast(ms, sa.BigInteger) * sa.literal_column("1000", sa.BigInteger)


def clock_ms(dialect_name: str) -> sa.ColumnElement:
    """The store's clock as an SQL expression, UTC milliseconds (see :func:`clock_us`)."""
    return clock_us(dialect_name) // sa.literal_column("1000", sa.BigInteger)


def insert(dialect_name: str, table: sa.Table):
    """``INSERT`` with ``ON CONFLICT`` support for the dialect (PostgreSQL or SQLite)."""
    return (postgresql.insert if dialect_name == "postgresql" else sqlite.insert)(table)


@dataclasses.dataclass(frozen=True)
class SchemaChange:
    """What :func:`create_schema` changed in the database.

    :param existed: some of the store's tables were there before (False: a new database, or
        one whose tables were all dropped).
    :param lost: the tables it re-created that an older version's database has too, while
        others existed: data the store lost (docs/design.md "Amnesia").
    :param upgraded: what it added to the tables of an older version: ``"table.column"``
        columns, and the tables of a group (``_ADDED_TABLES``) that was missing whole.
    """

    existed: bool
    lost: tuple[str, ...] = ()
    upgraded: tuple[str, ...] = ()


def create_schema(conn: sa.Connection) -> SchemaChange:
    """Create every missing table and index, inside the caller's transaction, and add to older
    tables the columns later versions added.

    On PostgreSQL a transaction-scoped advisory lock keeps several instances that find the
    tables missing at once from racing on the catalog; on SQLite the caller's ``BEGIN
    IMMEDIATE`` does the same. What it did is told, once the transaction commits:

    * an upgrade (columns, or a group of tables, that an older version's tables lack) in one
      INFO line naming them, once per process and database: nothing is lost or refused;
    * a table lost beside existing ones in a WARNING naming it; when it held the memory of
      claimed runs (:data:`MEMORY_TABLES`), the memory start of every namespace (``anarchon_stores``)
      becomes now, so no run won before is won again (docs/design.md "Amnesia").

    :returns: what changed (:class:`SchemaChange`); a new database is neither loss nor upgrade.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(
            sa.func.hashtext(sa.literal("celery_anarchon schema")))))
    ours = set(metadata.tables)
    missing = ours - set(sa.inspect(conn).get_table_names())
    metadata.create_all(conn, checkfirst=True)
    inspector = sa.inspect(conn)
    added = []
    for table, column, sql_type in _ADDED_COLUMNS:
        if table not in missing and column not in {c["name"] for c in inspector.get_columns(table)}:
            conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {column} {sql_type}")
            added.append(f"{table}.{column}")
    existed = missing != ours
    whole = set().union(*(group for group in _ADDED_TABLES if group <= missing))
    lost = tuple(sorted(missing - whole)) if existed else ()
    upgraded = tuple(added) + (tuple(sorted(whole)) if existed and not lost else ())
    if MEMORY_TABLES & set(lost):
        conn.execute(sa.update(stores).values(born_ms=clock_ms(conn.dialect.name)))
    change = SchemaChange(existed=existed, lost=lost, upgraded=upgraded)
    if lost or upgraded:
        sa.event.listen(conn, "commit", lambda _conn: _tell(conn, change), once=True)
    return change


#: (database, what was upgraded) pairs already told in this process
_TOLD: set[tuple[str, tuple[str, ...]]] = set()
_TOLD_LOCK = threading.Lock()


def _tell(conn: sa.Connection, change: SchemaChange) -> None:
    """Log what :func:`create_schema` changed (after the commit that made it so)."""
    url = conn.engine.url
    url = url.set(drivername=url.get_backend_name()).render_as_string(hide_password=False)
    where = f"{conn.dialect.name} store {mask_url(url)}"
    if change.lost:
        memory = ("its memory of claimed runs begins again now (slots before now + "
                  f"{LATENESS_TOLERANCE_MS // 1000} s are refused as forgotten)"
                  if MEMORY_TABLES & set(change.lost) else "they held no claimed run")
        log.warning("%s: tables missing beside the others (%s): the store forgot its data; "
                    "re-created them; %s (docs/timing.md, \"Amnesia\")", where,
                    ", ".join(change.lost), memory)
    if change.upgraded:
        with _TOLD_LOCK:
            if (where, change.upgraded) in _TOLD:
                return
            _TOLD.add((where, change.upgraded))
        columns = [name for name in change.upgraded if "." in name]
        tables = [name for name in change.upgraded if "." not in name]
        added = " and ".join(f"the {what} {', '.join(names)}" for what, names in
                             (("columns", columns), ("tables", tables)) if names)
        log.info("%s: the tables were made by an older version of celery_anarchon: added %s "
                 "(an upgrade: no data lost, no run refused)", where, added)
