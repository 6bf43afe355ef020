"""The SQL stores (SQLite, PostgreSQL) on the tables an older version created: the first operation
of a process of the new version that needs a column or table of the new version adds it, says
so in one INFO line naming what it added, and never takes it for a store that forgot its data
(docs/design.md "Amnesia"): nothing is refused as forgotten, no memory restarts. Tables that really
vanished still are amnesia, with its warning.

Each test builds its tables in a place of its own (a SQLite file; a PostgreSQL schema of its own,
through ``search_path``), since making the tables older changes them for every namespace."""
from __future__ import annotations

import logging
import shutil
import uuid

import pytest
import sqlalchemy as sa

from celery_anarchon.stores.base import LeaseTerms, Outcome, RunEvent
from celery_anarchon.stores.sql import schema as sql_schema

from stores_support import StoreMaker, new_tmpdir, store_url
from helpers import prepared
from claim_helpers import fresh_slot, req

LEASE = LeaseTerms(queue_timeout_ms=600_000)
#: the tables the entry store added, in one version, to the lease store's
ENTRY_TABLES = ("anarchon_fingerprints", "anarchon_instances", "anarchon_run_requests",
                "anarchon_schedule_entries", "anarchon_schedule_versions")
#: the tables this version added: the older version lacks them in both cases
NEW_TABLES = ("anarchon_request_memory", "anarchon_restore_marks")
#: what a line of the upgrade says, and what a line of amnesia says
UPGRADE_WORDS = "older version"
AMNESIA_WORDS = "forgot its data"


def _engine(url: str) -> sa.Engine:
    return sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1),
                            poolclass=sa.pool.NullPool)


@pytest.fixture(params=("sqlite", "postgresql"))
def maker(request, namespace):
    """Stores of one namespace on tables of their own: a new SQLite file, or a new PostgreSQL
    schema (dropped afterwards)."""
    tmpdir = new_tmpdir()
    url = store_url(request.param, tmpdir)
    place = None
    if request.param == "postgresql":
        place = "anarchon_upgrade_" + uuid.uuid4().hex[:10]
        with _engine(url).begin() as conn:
            conn.exec_driver_sql(f"CREATE SCHEMA {place}")
        url += ("&" if "?" in url else "?") + f"options=-csearch_path%3D{place}"
    stores = StoreMaker(request.param, url, namespace)
    yield stores
    stores.close_all()
    if place is not None:
        with _engine(url).begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA {place} CASCADE")
    shutil.rmtree(tmpdir, ignore_errors=True)


def _as_the_first_version_made_them(url: str, *, entry_tables: bool = False) -> None:
    """Drop what later versions added: the columns of ``schema._ADDED_COLUMNS``, the tables of
    :data:`NEW_TABLES` and, with ``entry_tables``, the tables of the entry store."""
    with _engine(url).begin() as conn:
        for table, column, _ in sql_schema._ADDED_COLUMNS:
            conn.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN {column}")
        for table in NEW_TABLES + (ENTRY_TABLES if entry_tables else ()):
            conn.exec_driver_sql(f"DROP TABLE {table}")


def _added(entry_tables: bool) -> list[str]:
    """The columns a new version adds to the older tables (those of a dropped table come with
    it)."""
    return [f"{t}.{c}" for t, c, _ in sql_schema._ADDED_COLUMNS
            if not (entry_tables and t in ENTRY_TABLES)]


def _columns(url: str) -> set[str]:
    with _engine(url).connect() as conn:
        inspector = sa.inspect(conn)
        tables = {t for t, _, _ in sql_schema._ADDED_COLUMNS} & set(inspector.get_table_names())
        return {f"{t}.{c['name']}" for t in tables for c in inspector.get_columns(t)}


def _lines(caplog, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if words in r.getMessage()]


def _claim(store, entry):
    """A beat of the new version claims a leased run of ``entry`` on the older tables."""
    return store.claim([req(entry, fresh_slot(store), lease=LEASE)])[0]


def _adopt(store, slot):
    """A worker of the new version adopts the run the older version queued."""
    return store.leases.adopt("billing", slot, "worker-1", 60_000)


def _write_entry(store):
    """An operator's command of the new version writes a store entry."""
    store.entries.put_entry("added", '{"task": "t"}', by="admin", create=True)


@pytest.mark.parametrize("entry_tables", [False, True], ids=["columns", "columns-and-entry-tables"])
@pytest.mark.parametrize("operation", ["claim", "adopt", "entries-write"])
def test_a_new_version_on_older_tables_upgrades_them_and_forgets_nothing(maker, caplog, operation,
                                                                         entry_tables):
    """A process of the new version (a beat's claim, a worker's adopt, an operator's entries
    write) whose first statement meets the tables an older version created and no new beat has
    prepared yet: one INFO line names the columns (and tables) it added; no amnesia warning; the
    run the older version queued is adopted, the run it won stays won by it, a new slot is won,
    and the history records nothing forgotten."""
    old = prepared(maker("old"))
    old.prepare(["billing", "report"])
    queued_slot, won_slot = fresh_slot(old), fresh_slot(old) - 1
    assert old.claim([req("billing", queued_slot, lease=LEASE),
                      req("report", won_slot)])[0].outcome is Outcome.WON
    old.close()
    _as_the_first_version_made_them(maker.url, entry_tables=entry_tables)
    added = _added(entry_tables)
    assert not set(added) & _columns(maker.url)

    new = maker("new")      # a process of the new version, that prepared nothing
    with caplog.at_level(logging.INFO, logger="celery_anarchon"):
        if operation == "claim":
            assert _claim(new, "cleanup").outcome is Outcome.WON
        elif operation == "adopt":
            adopted, run = _adopt(new, queued_slot)
            assert adopted and run.attempt == 1, run
        else:
            _write_entry(new)
            assert "added" in new.entries.load_entries().entries
        # later operations of this process and of others: no second line, nothing refused
        assert set(added) <= _columns(maker.url)
        beat = maker("beat")
        again = beat.claim([req("report", won_slot)])[0]
        assert again.outcome is Outcome.OTHER_WON and again.winner == "old", again
        if operation != "adopt":
            assert _adopt(beat, queued_slot)[0], "the queued run is adopted, not forgotten"
        assert _claim(beat, "sync").outcome is Outcome.WON

    assert not _lines(caplog, AMNESIA_WORDS), caplog.text
    upgrades = _lines(caplog, UPGRADE_WORDS)
    assert len(upgrades) == 1, caplog.text
    assert all(column in upgrades[0] for column in added), upgrades[0]
    assert all(table in upgrades[0] for table in ENTRY_TABLES) is entry_tables, upgrades[0]
    assert all(table in upgrades[0] for table in NEW_TABLES), upgrades[0]
    for entry in ("billing", "report"):
        assert RunEvent.FORGOTTEN not in {r.event for r in beat.history.read(entry)}, beat.history.read(entry)


def test_a_table_lost_from_the_current_schema_is_still_amnesia(maker, caplog):
    """A table of the store's memory (here ``anarchon_claims``) missing beside the others is
    data the store lost, even though the store-wide memory start survived: the amnesia warning
    names it, the memory begins again, and the run it remembered is refused as forgotten, never
    won again (docs/design.md "Amnesia")."""
    old = prepared(maker("old"))
    slot = fresh_slot(old)
    assert old.claim([req("report", slot)])[0].outcome is Outcome.WON
    old.close()
    with _engine(maker.url).begin() as conn:
        conn.exec_driver_sql("DROP TABLE anarchon_claims")
    new = maker("new")
    with caplog.at_level(logging.INFO, logger="celery_anarchon"):
        again = new.claim([req("report", slot)])[0]
    assert again.outcome is Outcome.FORGOTTEN, again
    warnings = _lines(caplog, AMNESIA_WORDS)
    assert len(warnings) == 1 and "anarchon_claims" in warnings[0], caplog.text
    assert not _lines(caplog, UPGRADE_WORDS), caplog.text
