"""What only the SQL stores promise: their URLs and options, their errors, pruning, locking under
concurrent batches, fork safety and timeouts. The store contract itself is in
test_store_contract.py; these run against the same real servers."""
from __future__ import annotations

import dataclasses
import datetime as dt
import multiprocessing
import os
import shutil
import sqlite3
import threading
import time
from collections import Counter

import pytest
import sqlalchemy as sa

from celery_anarchon.errors import ConfigError, StoreUnavailable
from celery_anarchon.stores import open_store
from celery_anarchon.stores.sql import connection as sql_connection, schema as sql_schema
from celery_anarchon.stores.base import LeaseTerms, Outcome, RunEvent, RunState, TakeoverOutcome
from celery_anarchon.stores.sql import PostgreSQLStore, SQLiteStore

from conftest import POSTGRES_URL
from stores_support import StoreMaker, new_tmpdir, store_url, wait_until
from helpers import prepared, request_run
from claim_helpers import _race, fresh_slot, req

SQL_STORES = ("sqlite", "postgresql")


@pytest.fixture
def tmpdir_path():
    path = new_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(params=SQL_STORES)
def stores(request, namespace, tmpdir_path):
    maker = StoreMaker(request.param, store_url(request.param, tmpdir_path), namespace)
    yield maker
    maker.close_all()


def _open(url, **options):
    return open_store(url, namespace="t-sql", instance_id="A", options=options)


def _rows(store, table, **where) -> int:
    """Rows of ``table`` in the store's namespace (and matching ``where``)."""
    query = sa.select(sa.func.count()).select_from(table).where(table.c.namespace == store.namespace,
                                                                *(table.c[k] == v for k, v in where.items()))
    with store.connection.engine().connect() as conn:
        return conn.execute(query).scalar_one()


# -- URLs ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scheme", ["postgresql", "postgres", "postgresql+psycopg"],
                         ids=["postgresql", "postgresql-as-postgres", "postgresql+psycopg"])
def test_postgresql_every_scheme_means_psycopg_3(scheme):
    rest = POSTGRES_URL.split("://", 1)[1]
    store = _open(f"{scheme}://{rest}")
    assert isinstance(store, PostgreSQLStore) and store.kind == "postgresql"
    assert store.engine_url.drivername == "postgresql+psycopg"
    assert store.checks_lateness and store.leases is not None


def test_postgresql_postgres_scheme_reaches_the_server():
    store_url("postgresql", "")  # skips (or fails in CI) when the server is down
    store = _open("postgres://" + POSTGRES_URL.split("://", 1)[1])
    try:
        assert abs(store.now_ms() - time.time() * 1000) < 2000
    finally:
        store.close()


def test_postgresql_query_parameters_pass_through_unchanged():
    store = _open("postgresql://u:pw@db.internal:5433/claims?sslmode=verify-full&application_name=beat")
    engine = store.connection.engine()          # builds the engine; connects only on first use
    assert engine.url.query == {"sslmode": "verify-full", "application_name": "beat"}
    assert engine.url.drivername == "postgresql+psycopg" and engine.url.port == 5433
    store.close()


def test_postgresql_sslmode_disable_works_against_the_server():
    store_url("postgresql", "")
    store = _open(POSTGRES_URL + "?sslmode=disable")
    try:
        assert store.connection.engine().url.query["sslmode"] == "disable"
        assert store.now_ms() > 0
    finally:
        store.close()


def test_sqlite_paths_relative_and_absolute(tmpdir_path, monkeypatch):
    monkeypatch.chdir(tmpdir_path)
    relative = _open("sqlite:///sub/claims.sqlite3")
    assert isinstance(relative, SQLiteStore) and relative.kind == "sqlite"
    assert relative.path == os.path.join(tmpdir_path, "sub", "claims.sqlite3")
    assert not os.path.exists(relative.path), "construction does no I/O"
    absolute = _open("sqlite:///" + os.path.join(tmpdir_path, "abs.sqlite3"))
    assert absolute.path == os.path.join(tmpdir_path, "abs.sqlite3")
    monkeypatch.chdir("/")  # the path was resolved when the store was built
    warnings = relative.prepare(["e"])
    assert os.path.isfile(os.path.join(tmpdir_path, "sub", "claims.sqlite3"))
    relative.close()
    # resolved once: the store's URL is the absolute one, and that is what every line prints
    path = os.path.join(tmpdir_path, "sub", "claims.sqlite3")
    assert relative.url == relative.safe_url == f"sqlite:///{path}"
    assert warnings == [
        f"sqlite store sqlite:///{path}: anarchon_store_url 'sqlite:///sub/claims.sqlite3' names "
        f"a relative path, resolved against this process's working directory ({tmpdir_path}): "
        "a beat, worker or command started in another directory opens another file: two beats "
        "on two files each send every run, and a worker on another file than beat's adopts none "
        "of its leased runs. Fix: give the absolute path, "
        f"anarchon_store_url = 'sqlite:///{path}' (four slashes)"]
    assert absolute.url == "sqlite:///" + os.path.join(tmpdir_path, "abs.sqlite3")
    assert absolute.prepare(["e"]) == []
    absolute.close()
    with_query = _open("sqlite:///q.sqlite3?timeout=3")       # resolved against "/" now
    assert with_query.url == "sqlite:////q.sqlite3?timeout=3"


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_sqlite_in_memory_is_refused(url):
    with pytest.raises(ConfigError, match="file"):
        _open(url)


def test_sqlite_path_under_a_regular_file_is_a_config_error(tmpdir_path):
    blocker = os.path.join(tmpdir_path, "not-a-dir")
    with open(blocker, "w") as f:
        f.write("x")
    path = os.path.join(blocker, "sub", "claims.sqlite3")
    store = _open("sqlite:///" + path)    # no I/O yet
    with pytest.raises(ConfigError) as info:
        store.prepare(["e"])
    message = str(info.value)
    assert path in message and "sqlite:////" in message, message
    store.close()


def test_sqlite_folder_as_file_is_a_config_error(tmpdir_path):
    store = _open("sqlite:///" + tmpdir_path)
    with pytest.raises(ConfigError, match="folder"):
        store.prepare(["e"])


def test_tables_are_prefixed(stores):
    store = stores("A")
    store.prepare(["e"])
    with store.connection.engine().connect() as conn:
        names = set(sa.inspect(conn).get_table_names())
    assert {t.name for t in sql_schema.metadata.sorted_tables} <= names
    assert all(t.name.startswith("anarchon_") for t in sql_schema.metadata.sorted_tables)


# -- options ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", SQL_STORES)
def test_unknown_option_is_a_config_error(kind, tmpdir_path):
    url = "sqlite:///" + os.path.join(tmpdir_path, "x.sqlite3") if kind == "sqlite" else POSTGRES_URL
    with pytest.raises(ConfigError, match="memroy"):
        _open(url, memroy=60)


@pytest.mark.parametrize("option, value", [
    ("memory", 0), ("memory", -5), ("memory", "3600"), ("memory", True), ("memory", float("nan")),
    ("memory", dt.timedelta(0)), ("history_size", 0), ("history_size", 2.5), ("history_size", True),
    ("claim_timeout", 0), ("claim_timeout", None), ("claim_timeout", float("inf")),
])
@pytest.mark.parametrize("kind", SQL_STORES)
def test_bad_option_values_are_config_errors(kind, option, value, tmpdir_path):
    url = "sqlite:///" + os.path.join(tmpdir_path, "x.sqlite3") if kind == "sqlite" else POSTGRES_URL
    with pytest.raises(ConfigError) as info:
        _open(url, **{option: value})
    assert option in str(info.value) and repr(value) in str(info.value)


def test_sqlite_durations_accept_timedelta(tmpdir_path):
    store = _open("sqlite:///" + os.path.join(tmpdir_path, "x.sqlite3"),
                  memory=dt.timedelta(minutes=5), claim_timeout=dt.timedelta(seconds=2), history_size=7)
    assert store.memory.duration_s == 300.0 and store.memory.count is None
    assert store.claim_timeout == 2.0 and store.history_size == 7


# -- errors ----------------------------------------------------------------------------------------

def test_postgresql_unreachable_is_store_unavailable_quickly_with_a_masked_url():
    url = "postgresql://anarchon:s3cret-pw@127.0.0.1:1/test"
    store = _open(url, claim_timeout=1)
    for operation in (lambda: store.claim([req("e", 1)]), store.now_ms, lambda: store.prepare(["e"]),
                      lambda: store.history.read("e"), lambda: store.leases.adopt("e", 1, "w", 1000)):
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as info:
            operation()
        assert time.monotonic() - started < 1 + 2
        message = str(info.value)
        assert "postgresql://anarchon:***@127.0.0.1:1/test" in message, message
        assert "s3cret" not in message and "refused" in message.lower(), message
    store.close()


def test_postgresql_missing_database_is_store_unavailable():
    store_url("postgresql", "")
    store = _open(POSTGRES_URL.rsplit("/", 1)[0] + "/anarchon_no_such_db")
    with pytest.raises(StoreUnavailable, match="anarchon_no_such_db"):
        store.claim([req("e", 1)])
    store.close()


def test_a_held_lock_makes_the_claim_unavailable_within_claim_timeout(stores):
    """A claim never waits longer than claim_timeout for another transaction's lock."""
    a = prepared(stores("A", claim_timeout=0.5))
    slot = fresh_slot(a)
    engine = sa.create_engine(a.engine_url)      # another client holding the entry's lock
    try:
        with engine.connect() as other:
            if a.kind == "sqlite":
                other.exec_driver_sql("BEGIN IMMEDIATE")
            else:
                other.begin()
                e = sql_schema.entries
                other.execute(sa.select(e).where(e.c.namespace == a.namespace).with_for_update())
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                a.claim([req("e", slot)])
            # claim_timeout bounds the wait (SQLite's own busy timeout would be 5 s, PostgreSQL's
            # lock wait endless): 3 s of margin for a loaded machine, still below those
            assert time.monotonic() - started < 0.5 + 3
            other.rollback()
    finally:
        engine.dispose()
    assert a.claim([req("e", slot)])[0].outcome is Outcome.WON


# -- memory and pruning ----------------------------------------------------------------------------

def test_prune_keeps_what_memory_promises(stores):
    """Claims stay until max(claim time, slot) + memory, terminal runs until their end + memory;
    runs in flight and the history are never pruned by age. (Memory 2 s: each claim below lands
    within it even when its transaction waits long for its fsync; a slot 8 s ahead is kept 10 s.)"""
    a, b = prepared(stores("A", memory=2.0)), stores("B", memory=2.0)
    now = a.now_ms()
    past, future = now - 500, now + 8_000
    assert [r.outcome for r in a.claim([req("e", past), req("e", future)])] == [Outcome.WON] * 2
    # each slot is read off the store's clock right before its claim, so that a slow fsync
    # between the claims cannot age it past the 2-s memory
    done = a.now_ms()
    assert a.claim([req("e", done, lease=LeaseTerms(60_000, overlap_allowed=True))])[0].outcome is Outcome.WON
    adopted, run = a.leases.adopt("e", done, "w1", 60_000)
    assert adopted and a.leases.release("e", done, run.token)
    long_queue = LeaseTerms(3_600_000, overlap_allowed=True)
    in_flight = max(a.now_ms(), done + 1)
    assert a.claim([req("e", in_flight, lease=long_queue)])[0].outcome is Outcome.WON
    finished = a.leases.inspect("e", done)
    assert finished.state is RunState.FINISHED

    # every claim above was made before `finished` was read: one memory later, all but the
    # future slot's have passed their keep-until time
    wait_until(lambda: a.now_ms() > finished.store_ms + 2100, 10, "the memory to pass")
    a._next_prune = 0                                 # the next claim prunes on its way out
    a.claim([req("other", a.now_ms())])
    assert _rows(a, sql_schema.claims, entry="e") == 1
    assert _rows(a, sql_schema.claims, entry="e", slot_ms=future) == 1
    assert b.claim([req("e", future)])[0].outcome is Outcome.OTHER_WON, "kept until slot + memory"
    assert b.claim([req("e", past)])[0].outcome is Outcome.FORGOTTEN
    assert a.leases.inspect("e", done) is None, "a finished run is pruned after the memory"
    assert a.leases.inspect("e", in_flight).state is RunState.QUEUED, "a run in flight is never pruned"
    assert {h.slot_ms for h in a.history.read("e")} >= {past, future, done, in_flight}, "history is kept by count"


def test_prune_runs_at_most_every_few_seconds(stores, monkeypatch):
    a = prepared(stores("A"))
    calls = []
    monkeypatch.setattr(type(a), "prune", lambda self: calls.append(1) or 0)
    for i in range(5):
        a.claim([req("e", fresh_slot(a) + i)])
    assert len(calls) == 1


# -- concurrency -----------------------------------------------------------------------------------

def test_batch_race_has_no_deadlock_and_one_winner_per_run(stores, monkeypatch):
    """3 processes claim the same 400 runs of 8 entries in batches, each in its own shuffled
    order: every batch locks several entries at once. With deadlock retries switched off, a single
    deadlock would surface as an error."""
    monkeypatch.setattr(sql_connection, "DEADLOCK_RETRIES", 0)    # inherited by the forked children
    entries = [f"e{i}" for i in range(8)]
    first = prepared(stores("setup"), *entries)
    base = fresh_slot(first) + 500
    runs = [(entry, base + i) for entry in entries for i in range(50)]
    ctx = multiprocessing.get_context("fork")
    barrier, queue = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(stores.url, stores.namespace, f"proc-{n}", runs,
                                             barrier, queue, batch))
             for n, batch in enumerate((13, 40, 100))]
    for p in procs:
        p.start()
    reports = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    errors = [err for _, _, err in reports if err]
    assert not errors, errors
    winners = Counter(run for _, won, _ in reports for run in won)
    assert set(winners) == set(runs), f"{len(set(runs) - set(winners))} runs got no winner"
    assert max(winners.values()) == 1, [run for run, n in winners.items() if n > 1][:5]


def _use_after_fork(store, slot, queue):
    try:
        queue.put(store.claim([req("e", slot)])[0].outcome.value)
    except BaseException as exc:
        queue.put(repr(exc))


def test_a_forked_child_never_reuses_the_parents_connections(stores):
    a = prepared(stores("A"))
    slot = fresh_slot(a)
    assert a.claim([req("e", slot)])[0].outcome is Outcome.WON       # the parent's pool is live
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_use_after_fork, args=(a, slot + 1, queue))
    child.start()
    assert queue.get(timeout=30) == "won"
    child.join(timeout=30)
    # the child neither closed nor used the parent's connections
    assert a.claim([req("e", slot + 2)])[0].outcome is Outcome.WON
    assert a.claim([req("e", slot + 1)])[0].outcome is Outcome.WON, "the child's claim is the same instance's"


def test_close_is_idempotent_and_the_store_reconnects(stores):
    a = prepared(stores("A"))
    a.close()
    a.close()
    assert a.claim([req("e", fresh_slot(a))])[0].outcome is Outcome.WON
    a.close()


# -- amnesia ---------------------------------------------------------------------------------------

def test_reads_recreate_missing_tables(stores):
    a = prepared(stores("A"))
    slot = fresh_slot(a)
    a.claim([req("e", slot, lease=LeaseTerms(60_000))])
    stores.wipe()
    assert a.history.read("e") == []
    assert a.leases.inspect("e", slot) is None
    assert a.leases.expired_runs(["e"]) == []
    assert a.history.load_definition("e", "fp") is None


def test_entry_operations_on_a_new_database_create_the_tables_without_an_amnesia_warning(
        namespace, tmpdir_path, caplog):
    """An admin tool may write entries before any beat prepared the store: a new database is not
    a store that forgot its data. Tables that vanish later still are (the warning, as before)."""
    maker = StoreMaker("sqlite", store_url("sqlite", tmpdir_path), namespace)
    a = maker("A")
    with caplog.at_level("WARNING"):
        assert a.entries.entries_version() == 0
        a.entries.put_entry("report", '{"task": "t"}', by="admin", create=True)
    assert not [r for r in caplog.records if "forgot" in r.getMessage()], caplog.text
    maker.wipe()
    with caplog.at_level("WARNING"):
        assert a.entries.entries_version() == 0
    assert [r for r in caplog.records if "forgot its data" in r.getMessage()]
    maker.close_all()


def test_deleted_sqlite_file_is_noticed_as_amnesia(namespace, tmpdir_path):
    maker = StoreMaker("sqlite", store_url("sqlite", tmpdir_path), namespace)
    try:
        a, b = prepared(maker("A")), prepared(maker("B"))
        slot = fresh_slot(a)
        assert a.claim([req("e", slot)])[0].outcome is Outcome.WON
        assert b.claim([req("e", slot)])[0].outcome is Outcome.OTHER_WON
        _remove_sqlite_file(a.path)
        again = b.claim([req("e", slot)])[0]
        assert again.outcome is Outcome.FORGOTTEN, again
        assert os.path.exists(a.path)
        assert a.history.read("e")[0].event is RunEvent.FORGOTTEN
    finally:
        maker.close_all()


def _remove_sqlite_file(path):
    for name in (path, path + "-wal", path + "-shm"):
        if os.path.exists(name):
            os.remove(name)


def test_sqlite_driver_errors_never_leak(tmpdir_path):
    """A SQLite file that turns into a folder after start-up: StoreUnavailable, not sqlite3's."""
    path = os.path.join(tmpdir_path, "claims.sqlite3")
    store = _open("sqlite:///" + path)
    store.prepare(["e"])
    store.close()
    _remove_sqlite_file(path)
    os.mkdir(path)
    with pytest.raises(StoreUnavailable) as info:
        store.claim([req("e", 1)])
    assert path in str(info.value)
    # the cause is SQLAlchemy's error, which wraps the driver's (.orig)
    assert isinstance(getattr(info.value.__cause__, "orig", None), sqlite3.Error), info.value.__cause__


# -- writes the store may lose (docs/design.md "Amnesia"), rules shared by every instance --------
# (the rolling change of memory, the retried claim after a takeover and the renewal of a pruned
# run are also in test_store_contract.py, on every lease store)

LEASE_FAST = LeaseTerms(queue_timeout_ms=300)


def _claim_one(store, entry, slot, **kw):
    return store.claim([req(entry, slot, **kw)])[0]


def test_rolling_memory_change_is_refused_at_prepare(stores):
    """An instance whose ``memory`` differs from the one the store recorded cannot start: the
    error names both values and the fix (docs/design.md "Amnesia")."""
    a = prepared(stores("A", memory=3.0))
    _claim_one(a, "e", fresh_slot(a), max_late_ms=1000)
    b = stores("B", memory=3600.0)
    with pytest.raises(ConfigError) as info:
        b.prepare(["e"])
    message = str(info.value)
    assert "3600" in message and "'memory'" in message and "3 s" in message, message
    assert "same value on every instance" in message, message






def test_retried_claim_whose_reply_was_lost_after_a_takeover_is_lost(namespace):
    """The same through a connection that swallows the server's reply to A's COMMIT: the claim is
    committed, A sees an error, B takes the unadopted run over, A's retry answers LOST."""
    from tcp_proxy import TCPProxy
    store_url("postgresql", "")
    target = sa.make_url(POSTGRES_URL)
    proxy = TCPProxy((target.host or "127.0.0.1", target.port or 5432)).start()
    maker = StoreMaker("postgresql", POSTGRES_URL, namespace)
    via_proxy = StoreMaker("postgresql", str(target.set(host="127.0.0.1", port=proxy.port)
                                              .render_as_string(hide_password=False)), namespace)
    try:
        a, b = prepared(via_proxy("A", claim_timeout=2)), prepared(maker("B"))
        slot = fresh_slot(a)
        sa.event.listen(a.connection.engine(), "commit",
                        lambda conn: setattr(proxy, "swallow_replies", True))
        errors = []
        worker = threading.Thread(target=lambda: _catch(errors, a.claim, [req("e", slot, lease=LEASE_FAST)]))
        worker.start()
        wait_until(lambda: b.leases.inspect("e", slot), 10, "A's claim to be committed")
        proxy.outage()
        worker.join(10)
        assert errors and isinstance(errors[0], StoreUnavailable), errors
        a.close()
        proxy.restore()
        expired = wait_until(lambda: b.leases.expired_runs(["e"]), 10, "the queue deadline to pass")
        outcome, run = b.leases.take_over("e", slot, expired[0].token, queue_timeout_ms=60_000, max_attempts=3)
        assert outcome is TakeoverOutcome.TAKEN and run.attempt == 2
        a2 = via_proxy("A", claim_timeout=2)
        retried = _claim_one(a2, "e", slot, lease=LEASE_FAST)
        assert retried.outcome is Outcome.OTHER_WON and retried.token != run.token, retried
    finally:
        maker.close_all()
        via_proxy.close_all()
        proxy.close()


def _catch(errors, fn, *args):
    try:
        fn(*args)
    except BaseException as error:   # handed to the test thread
        errors.append(error)




def test_takeover_whose_reply_was_lost_is_recognised_when_retried(stores):
    """take_over retried with the same expected token by the instance that took the run over
    answers TAKEN again with the same record; another instance's is REFUSED (docs/design.md
    "Leases": Takeover)."""
    a, b, c = prepared(stores("A")), stores("B"), stores("C")
    slot = fresh_slot(a)
    assert _claim_one(a, "e", slot, lease=LEASE_FAST).outcome is Outcome.WON
    expired = wait_until(lambda: b.leases.expired_runs(["e"]), 10, "the queue deadline to pass")
    first = b.leases.take_over("e", slot, expired[0].token, queue_timeout_ms=60_000, max_attempts=3)
    again = b.leases.take_over("e", slot, expired[0].token, queue_timeout_ms=60_000, max_attempts=3)
    assert first[0] is TakeoverOutcome.TAKEN
    assert again[0] is TakeoverOutcome.TAKEN, again
    assert (again[1].attempt, again[1].token, again[1].owner) == (2, first[1].token, "B")
    assert c.leases.take_over("e", slot, expired[0].token, queue_timeout_ms=60_000,
                       max_attempts=3)[0] is TakeoverOutcome.REFUSED


def test_new_entry_on_an_intact_store_is_not_refused_but_a_wiped_store_refuses(stores):
    """The store-wide memory start: an entry the store has never seen may claim its first slots
    when the store's memory is older; after a wipe nothing before the new memory start is won
    (docs/design.md "Amnesia")."""
    a = prepared(stores("A"))
    assert _claim_one(a, "brand-new", fresh_slot(a)).outcome is Outcome.WON
    b = stores("B")
    b.prepare(["added-later"])
    assert _claim_one(b, "added-later", fresh_slot(b)).outcome is Outcome.WON
    stores.wipe()
    refused = _claim_one(b, "another", fresh_slot(b))
    assert refused.outcome is Outcome.FORGOTTEN, refused


def test_changed_epoch_restarts_the_memory_for_every_instance(stores):
    """An epoch the store did not record (a promoted standby, a restored server) restarts the
    memory inside the claim: the recent slots are refused, naming both epochs (docs/design.md
    "Amnesia")."""
    a, b = prepared(stores("A")), stores("B")
    slot = fresh_slot(a)
    assert _claim_one(a, "e", slot + 1).outcome is Outcome.WON
    with a.connection.engine().begin() as conn:
        conn.execute(sa.update(sql_schema.stores).where(sql_schema.stores.c.namespace == a.namespace)
                     .values(epoch="old-server:1"))
    first = _claim_one(b, "e", slot)
    assert first.outcome is Outcome.FORGOTTEN and "old-server:1" in first.detail, first
    assert _claim_one(a, "other", slot).outcome is Outcome.FORGOTTEN, "every instance's claim"
    assert _claim_one(a, "e", slot + 1).outcome is Outcome.WON, "a remembered claim stays won"


def test_sqlite_commits_are_synchronous_full(namespace, tmpdir_path):
    """SQLite in WAL mode with synchronous=NORMAL may lose the last commits on a power cut;
    every connection of the store uses FULL."""
    store = _open("sqlite:///" + os.path.join(tmpdir_path, "claims.sqlite3"))
    store.prepare(["e"])
    with store.connection.engine().connect() as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2       # FULL
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    store.close()


def test_sqlite_file_restored_from_a_backup_never_rewins_a_run(namespace, tmpdir_path):
    """A SQLite file replaced by an older copy (a restored backup) lacks the newest claims: the
    copy has another inode (the store's epoch), so its first claim restarts the memory and the
    lost win is refused, never won again."""
    maker = StoreMaker("sqlite", store_url("sqlite", tmpdir_path), namespace)
    try:
        a = prepared(maker("A"))
        backup = os.path.join(tmpdir_path, "backup.sqlite3")
        with sqlite3.connect(a.path) as source, sqlite3.connect(backup) as target:
            source.backup(target)
        slot = fresh_slot(a)
        assert _claim_one(a, "e", slot).outcome is Outcome.WON
        os.replace(backup, a.path)
        for name in (a.path + "-wal", a.path + "-shm"):
            if os.path.exists(name):
                os.remove(name)
        b = maker("B")
        again = _claim_one(b, "e", slot)
        assert again.outcome is Outcome.FORGOTTEN and "inode" in again.detail, again
    finally:
        maker.close_all()


@pytest.mark.parametrize("options, words", [
    ({"durability": "sync"}, ["durability", "'sync'", "auto", "local", "standby"]),
    ({"confirm_timeout": 5, "claim_timeout": 5}, ["confirm_timeout", "5 s", "claim_timeout"]),
    ({"confirm_timeout": 0}, ["confirm_timeout", "0"]),
])
def test_postgresql_durability_options_are_validated(options, words):
    with pytest.raises(ConfigError) as info:
        _open(POSTGRES_URL, **options)
    assert all(w in str(info.value) for w in words), str(info.value)
    assert _open(POSTGRES_URL).confirm_timeout == 2.0, "as on Redis"
    store = _open(POSTGRES_URL, claim_timeout=3)
    assert store.durability == "auto" and store.confirm_timeout == 1.5


def test_sqlite_has_no_durability_option(tmpdir_path):
    with pytest.raises(ConfigError, match="durability"):
        _open("sqlite:///" + os.path.join(tmpdir_path, "x.sqlite3"), durability="standby")


def test_a_database_of_an_earlier_version_takes_run_now_requests_and_keeps_its_old_ones(stores):
    """A database written before ``anarchon_request_memory`` existed (its run-now requests in
    ``anarchon_run_requests``): a new process creates the table and finds the old requests by
    their ids (one run)."""
    a = prepared(stores("A"))
    first = request_run(a, "e", "old-1")

    def drop(conn: sa.Connection) -> None:
        conn.execute(sa.text("DROP TABLE anarchon_request_memory"))
    a.connection.run("drop the table", drop)
    b = stores("B")                                        # a new process: checks the schema
    assert request_run(b, "e", "old-1") == dataclasses.replace(first, created=False)
    assert request_run(b, "e", "new-1").created
    assert _rows(b, sql_schema.request_memory) == 1
