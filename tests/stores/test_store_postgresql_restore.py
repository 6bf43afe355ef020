"""A logical backup (``pg_dump``) restored into the same PostgreSQL server lacks the claims won
after the dump, on the same system identifier and timeline: the re-created tables (new OIDs) are
a new epoch, and so are rows put back by a data-only restore into tables that kept them (the
``xmin`` of ``anarchon_restore_marks``): those runs are refused as forgotten, never won again
(docs/design.md "Amnesia": epoch; docs/stores.md "PostgreSQL", "Restores"). Each test uses a
database of its own on the shared server (ANARCHON_TEST_POSTGRES_URL), dropped at the end."""
from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import pytest
import sqlalchemy as sa

from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import Outcome

from conftest import POSTGRES_URL
from ha_support import need
from helpers import prepared
from claim_helpers import after_memory_restart, fresh_slot, req
from stores_support import new_tmpdir

#: seconds pg_dump / pg_restore may take on a small database
TOOL_TIMEOUT_S = 60


def _tool(name: str) -> str:
    path = shutil.which(name)
    need(path is not None, f"{name} is not on this host (the PostgreSQL client tools)")
    return path


def _run(*args: str) -> None:
    done = subprocess.run(args, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    assert done.returncode == 0, (args[0], done.stdout, done.stderr)


@pytest.fixture
def own_database():
    """A database of its own on the shared server: its libpq URL (dropped afterwards)."""
    name = "anarchon_restore_" + uuid.uuid4().hex[:10]
    admin = _engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    try:
        yield sa.make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.dispose()


@pytest.fixture
def dump_path():
    folder = new_tmpdir()
    yield os.path.join(folder, "claims.dump")
    shutil.rmtree(folder, ignore_errors=True)


def _claim(store, entry, slot):
    return store.claim([req(entry, slot)])[0]


def _engine(url: str, **kw) -> sa.Engine:
    return sa.create_engine(sa.make_url(url).set(drivername="postgresql+psycopg"), **kw)


def _sql(url: str, *statements: str) -> None:
    engine = _engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            for statement in statements:
                conn.exec_driver_sql(statement)
    finally:
        engine.dispose()


def _tables(url: str) -> list[str]:
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            return sorted(name for name in sa.inspect(conn).get_table_names()
                          if name.startswith("anarchon_"))
    finally:
        engine.dispose()


@pytest.fixture
def opened(own_database, namespace):
    """``opened(instance_id)``: a store on the test's database (closed afterwards)."""
    stores = []

    def open_one(instance_id: str):
        stores.append(open_store(own_database, namespace=namespace, instance_id=instance_id))
        return stores[-1]
    yield open_one
    for store in stores:
        store.close()


def _refused_after_restore(b, *, lost: int, kept: int, words: str, entries=("e",)) -> None:
    """B's claims of the runs won after the dump are refused (forgotten, the detail holding
    ``words``); the run in the dump stays A's; a run after the new memory start is won."""
    b.prepare(list(entries))
    for entry in entries:
        again = _claim(b, entry, lost)
        assert again.outcome is Outcome.FORGOTTEN and words in again.detail, again
    assert _claim(b, "e", kept).outcome is Outcome.OTHER_WON, "the dump's claim stays A's"
    assert _claim(b, "e", after_memory_restart(b)).outcome is Outcome.WON


def test_dump_restored_clean_into_the_same_server_never_rewins_a_run(own_database, dump_path,
                                                                     opened):
    """A wins a run, the database is dumped (pg_dump -Fc), A wins a run of two entries, then the
    dump is restored with --clean (tables dropped and re-created) into the same database. B's
    claims of the runs won after the dump are refused (forgotten, naming the tables' OIDs)."""
    pg_dump, pg_restore = _tool("pg_dump"), _tool("pg_restore")
    a = prepared(opened("A"))
    kept = fresh_slot(a)
    assert _claim(a, "e", kept).outcome is Outcome.WON
    _run(pg_dump, "-Fc", "-f", dump_path, own_database)
    lost = kept + 1
    assert _claim(a, "e", lost).outcome is Outcome.WON
    assert _claim(a, "f", lost).outcome is Outcome.WON
    a.close()
    _run(pg_restore, "--clean", "-d", own_database, dump_path)
    _refused_after_restore(opened("B"), lost=lost, kept=kept, words="tables", entries=("e", "f"))


def test_tables_emptied_then_restored_data_only_never_rewin_a_run(own_database, dump_path, opened):
    """The tables keep their OIDs when emptied by hand and filled again by ``pg_restore
    --data-only``; the rows the restore wrote have another ``xmin`` than the transaction id the
    store wrote into ``anarchon_restore_marks``: the run won after the dump is refused. VACUUM FULL
    and CLUSTER (rows moved, same xmin, same OIDs) restart nothing."""
    pg_dump, pg_restore = _tool("pg_dump"), _tool("pg_restore")
    a = prepared(opened("A"))
    kept = fresh_slot(a)
    assert _claim(a, "e", kept).outcome is Outcome.WON
    _sql(own_database, "VACUUM FULL", "CLUSTER anarchon_claims USING anarchon_claims_pkey")
    assert _claim(a, "e", kept + 1).outcome is Outcome.WON, "maintenance is no epoch change"
    _run(pg_dump, "-Fc", "-f", dump_path, own_database)
    lost = kept + 2
    assert _claim(a, "e", lost).outcome is Outcome.WON
    a.close()
    _sql(own_database, f"TRUNCATE {', '.join(_tables(own_database))}")
    _run(pg_restore, "--data-only", "-d", own_database, dump_path)
    _refused_after_restore(opened("B"), lost=lost, kept=kept, words="a restore")
