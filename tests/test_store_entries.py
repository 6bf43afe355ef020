"""The entry store contract (:mod:`celery_anarchon.stores.entry_store`), proved against every store
of the registry whose class is an EntryStore, on its real server.

Several store objects with their own instance ids stand for several beat instances sharing one
namespace; each test is named after the promise it proves.
"""
from __future__ import annotations

import threading

import pytest

from celery_anarchon.errors import ConfigError, EntryExists, UnknownEntry
from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import LeaseStore, LeaseTerms, Outcome, RunEvent
from celery_anarchon.stores.entry_store import (
    ENTRY_STORE_NAMES, EntryStore, InstanceRecord, Pause, entry_store,
)

from backends import BACKENDS, kinds_whose_store
from helpers import prepared
from stores_support import require_client
from test_store_contract import _maker, fresh_slot, req, store_now

DEFINITION = '{"schedule":{"every":60},"task":"proj.tasks.report"}'
OTHER_DEFINITION = '{"schedule":{"every":30},"task":"proj.tasks.report"}'


#: the stores that hold entries, pauses and run-now requests (read from their classes; a store
#: whose client library is missing is in both lists: its tests skip, or fail under CI)
ENTRY_STORES = kinds_whose_store(lambda store: isinstance(store, EntryStore))
#: the others: entry_store() refuses them
OTHER_STORES = kinds_whose_store(lambda store: not isinstance(store, EntryStore))


@pytest.fixture(params=ENTRY_STORES)
def stores(request, namespace):
    """Opens entry stores of one backend sharing one namespace (one per instance id)."""
    yield from _maker(request.param, namespace)


def _record(instance_id: str, digest: str = "d1", **changes) -> InstanceRecord:
    fields = dict(instance_id=instance_id, host="host-" + instance_id, pid=4242, version="1.0",
                  started_ms=1_000, last_tick_ms=2_000, skew_ms=-3, entries=7,
                  fingerprints_digest=digest)
    return InstanceRecord(**{**fields, **changes})


def _history_of(store, entry: str, slot: int):
    return [h for h in store.history(entry) if h.slot_ms == slot]


# -- entries -----------------------------------------------------------------------------------------

def test_add_update_remove_with_their_errors(stores):
    a, b = stores("A"), stores("B")
    added = a.put_entry("report", DEFINITION, by="alice", create=True)
    assert (added.name, added.definition, added.pause, added.updated_by) == (
        "report", DEFINITION, None, "alice")
    with pytest.raises(EntryExists, match="report"):
        b.put_entry("report", OTHER_DEFINITION, by="bob", create=True)
    with pytest.raises(UnknownEntry, match="nightly"):
        b.put_entry("nightly", DEFINITION, by="bob", create=False)

    updated = b.put_entry("report", OTHER_DEFINITION, by="bob", create=False)
    assert updated.definition == OTHER_DEFINITION and updated.updated_by == "bob"
    assert updated.version > added.version, "a name's version grows with its changes"
    assert updated.updated_ms >= added.updated_ms
    assert a.load_entries().entries["report"].definition == OTHER_DEFINITION

    assert a.remove_entry("report", by="alice") is True
    assert "report" not in b.load_entries().entries
    assert b.remove_entry("report", by="bob") is False, "nothing left to remove"
    with pytest.raises(UnknownEntry):
        a.put_entry("report", DEFINITION, by="alice", create=False)
    again = a.put_entry("report", DEFINITION, by="alice", create=True)
    assert again.version > updated.version, "a name added again never reuses an old version"


def test_entries_version_grows_with_every_write_and_is_stable_otherwise(stores):
    a, b = prepared(stores("A"), "report", "cfg"), stores("B")
    assert a.entries_version() == b.entries_version() == 0, "0 before any change"
    seen = [0]

    def grew(what):
        version = b.entries_version()
        assert version > seen[-1], f"{what} did not raise the version ({seen[-1]} -> {version})"
        assert a.entries_version() == version, "every instance reads the same version"
        seen.append(version)

    def stable(what):
        assert a.entries_version() == seen[-1], f"{what} changed the version"

    a.put_entry("report", DEFINITION, by="alice", create=True)
    grew("add")
    b.put_entry("report", OTHER_DEFINITION, by="bob", create=False)
    grew("update")
    a.set_pause("cfg", Pause("deploy", "alice", 0), by="alice")
    grew("pause of a config entry")
    b.set_pause("report", Pause("", "bob", 0), by="bob")
    grew("pause of a store entry")
    a.set_pause("report", None, by="alice")
    grew("resume")
    b.request_run("report", "req-1", fresh_slot(b), by="bob")
    grew("run-now request")
    a.remove_entry("report", by="alice")
    grew("remove")

    a.put_entry("cfg2", DEFINITION, by="a", create=True)
    grew("add")
    with pytest.raises(UnknownEntry):
        b.put_entry("nope", DEFINITION, by="b", create=False)
    stable("a refused update")
    with pytest.raises(EntryExists):
        b.put_entry("cfg2", DEFINITION, by="b", create=True)
    stable("a refused add")
    assert a.remove_entry("nope", by="a") is False
    stable("removing a name without a definition")
    b.request_run("cfg2", "req-2", fresh_slot(b), by="b")
    grew("run-now request")
    b.request_run("cfg2", "req-2", fresh_slot(b), by="b")
    stable("the same request again")
    a.load_entries(), b.instances(), a.load_fingerprints("x"), b.history("cfg")
    a.record_instance(_record("A"), 60_000)
    a.save_fingerprints("d1", {"cfg": "fp"})
    a.claim([req("cfg", fresh_slot(a))])
    a.claim([req("report", fresh_slot(a))])
    stable("reads, heartbeats, fingerprints and claims")
    assert a.load_entries().version == seen[-1]


def test_load_entries_is_one_consistent_read(stores):
    """While one instance writes (adds and run-now requests, alternately), every snapshot another
    instance loads is one of the states between two writes: its version is the version after k
    writes and it holds exactly the first k writes."""
    writer, reader = stores("W"), stores("R")
    slot = fresh_slot(writer)
    after = {writer.entries_version(): 0}          # version -> writes done
    done = threading.Event()
    failures: list[BaseException] = []

    def write() -> None:
        try:
            for i in range(40):
                if i % 2 == 0:
                    writer.put_entry(f"e{i:02}", DEFINITION, by="w", create=True)
                else:
                    writer.request_run(f"e{i - 1:02}", f"r{i:02}", slot + i, by="w")
                after[writer.entries_version()] = i + 1
        except BaseException as error:  # reported below, never a hang
            failures.append(error)
        finally:
            done.set()

    thread = threading.Thread(target=write)
    snapshots = []
    thread.start()
    while not done.is_set() or not snapshots:
        snapshots.append(reader.load_entries())
    thread.join(timeout=60)
    snapshots.append(reader.load_entries())
    assert not failures, failures
    assert len(after) == 41, "every write raised the version"
    for snap in snapshots:
        assert snap.version in after, f"snapshot at version {snap.version} matches no state"
        k = after[snap.version]
        assert sorted(snap.entries) == [f"e{i:02}" for i in range(0, k, 2)], (snap.version, k)
        assert sorted(r.request_id for r in snap.requests) == [f"r{i:02}" for i in range(1, k, 2)]
    assert after[snapshots[-1].version] == 40
    assert {r.request_id: r.slot_ms for r in snapshots[-1].requests}["r39"] == slot + 39


# -- pauses --------------------------------------------------------------------------------------------

def test_a_pause_refuses_the_claim_at_once_even_on_an_instance_that_never_synced(stores):
    a = prepared(stores("A"), "report", "leased")
    paused = a.set_pause("report", Pause("migrating the reports table", "alice", 0), by="alice")
    assert paused.pause.reason == "migrating the reports table" and paused.pause.by == "alice"
    assert paused.definition is None, "a pause of a config entry holds no definition"
    assert abs(paused.pause.at_ms - store_now(a)) < 5_000, "the pause's time is the store's clock"
    detail = paused.pause.describe()
    assert detail == "paused by alice: migrating the reports table"

    b = stores("B")                      # a fresh instance: never read the entries or the version
    slot = fresh_slot(b)
    result = b.claim([req("report", slot)])[0]
    assert result.outcome is Outcome.PAUSED and result.detail == detail, result
    assert result.winner is None and result.token is None
    assert a.claim([req("report", slot)])[0].outcome is Outcome.PAUSED, "the same on every instance"
    if isinstance(b, LeaseStore):
        b.set_pause("leased", Pause("", "bob", 0), by="bob")
        lease = LeaseTerms(queue_timeout_ms=60_000)
        assert b.claim([req("leased", slot, lease=lease)])[0].outcome is Outcome.PAUSED
        assert b.inspect("leased", slot) is None, "a paused leased run has no lease record"
    stored = a.load_entries().entries["report"]
    assert stored.pause == paused.pause and stored.definition is None


def test_a_claim_won_before_the_pause_is_won_again_by_its_retry(stores):
    a, b = prepared(stores("A"), "report"), stores("B")
    slot = fresh_slot(a)
    first = a.claim([req("report", slot)])[0]
    assert first.outcome is Outcome.WON
    b.set_pause("report", Pause("too late for this one", "bob", 0), by="bob")
    retry = a.claim([req("report", slot)])[0]
    assert retry.outcome is Outcome.WON and retry.token == first.token, "already claimed comes first"
    other = b.claim([req("report", slot)])[0]
    assert other.outcome is Outcome.OTHER_WON and other.winner == "A"
    assert b.claim([req("report", slot + 1)])[0].outcome is Outcome.PAUSED, "the next slot is paused"
    assert [h.event for h in _history_of(a, "report", slot)] == [RunEvent.CLAIMED], \
        "a pause never overwrites a claimed run's record"


def test_resume_lets_the_next_slot_win(stores):
    a, b = prepared(stores("A"), "report"), stores("B")
    a.set_pause("report", Pause("", "alice", 0), by="alice")
    slot = fresh_slot(a)
    assert b.claim([req("report", slot)])[0].outcome is Outcome.PAUSED
    resumed = a.set_pause("report", None, by="alice")
    assert resumed.pause is None
    assert "report" not in a.load_entries().entries, "a resumed config entry leaves nothing behind"
    nxt = b.claim([req("report", slot + 1)])[0]
    assert nxt.outcome is Outcome.WON and nxt.winner == "B"

    a.put_entry("store-entry", DEFINITION, by="alice", create=True)
    prepared(a, "store-entry")
    a.set_pause("store-entry", Pause("", "alice", 0), by="alice")
    assert b.claim([req("store-entry", slot + 2)])[0].outcome is Outcome.PAUSED
    back = b.set_pause("store-entry", None, by="bob")
    assert back.pause is None and back.definition == DEFINITION, "resume keeps the definition"
    assert a.claim([req("store-entry", slot + 3)])[0].outcome is Outcome.WON


def test_a_paused_run_is_recorded_once_with_who_paused_and_why(stores):
    a, b = prepared(stores("A"), "report"), stores("B")
    first = a.set_pause("report", Pause("backfill", "alice", 0), by="alice").pause
    slot = fresh_slot(a)
    assert b.claim([req("report", slot)])[0].outcome is Outcome.PAUSED
    second = a.set_pause("report", Pause("still backfilling", "carol", 0), by="carol").pause
    answer = a.claim([req("report", slot)])[0]
    assert answer.outcome is Outcome.PAUSED and answer.detail == second.describe()
    records = _history_of(a, "report", slot)
    assert [(h.event, h.detail, h.instance) for h in records] == [
        (RunEvent.PAUSED, first.describe(), "B")], "recorded once: the first paused claim's record"
    assert records == _history_of(b, "report", slot)


def test_a_store_entry_keeps_its_pause_when_updated_and_loses_it_when_removed(stores):
    a, b = stores("A"), stores("B")
    a.put_entry("report", DEFINITION, by="alice", create=True)
    pause = a.set_pause("report", Pause("why", "alice", 0), by="alice").pause
    updated = b.put_entry("report", OTHER_DEFINITION, by="bob", create=False)
    assert updated.pause == pause and updated.definition == OTHER_DEFINITION
    assert b.remove_entry("report", by="bob") is True
    assert "report" not in a.load_entries().entries, "the pause went with the entry"
    readded = a.put_entry("report", DEFINITION, by="alice", create=True)
    assert readded.pause is None


# -- run-now requests --------------------------------------------------------------------------

def test_the_same_request_id_twice_is_one_request_with_the_first_slot(stores):
    a, b = stores("A"), stores("B")
    slot = fresh_slot(a)
    first = a.request_run("report", "deploy-42", slot, by="alice")
    assert (first.entry, first.request_id, first.slot_ms, first.by) == ("report", "deploy-42", slot,
                                                                        "alice")
    assert abs(first.requested_ms - store_now(a)) < 5_000, "requested on the store's clock"
    again = b.request_run("report", "deploy-42", slot + 1000, by="bob")
    assert again == first, "the first request is returned, whoever asks again"
    other = b.request_run("report", "deploy-43", slot + 1000, by="bob")
    assert other.slot_ms == slot + 1000 and other.by == "bob"
    same_id_other_entry = b.request_run("nightly", "deploy-42", slot + 2000, by="bob")
    assert same_id_other_entry.slot_ms == slot + 2000, "request ids are per entry"
    loaded = sorted((r.entry, r.request_id, r.slot_ms) for r in a.load_entries().requests)
    assert loaded == [("nightly", "deploy-42", slot + 2000), ("report", "deploy-42", slot),
                      ("report", "deploy-43", slot + 1000)]


# -- the capability check ----------------------------------------------------------------------

def test_entry_store_returns_an_entry_store(stores):
    store = stores("A")
    assert entry_store(store) is store


@pytest.mark.parametrize("kind", OTHER_STORES)
def test_a_store_that_cannot_hold_entries_is_a_config_error_naming_those_that_can(kind):
    require_client(kind)
    backend = next(b for b in BACKENDS if b.kind == kind)
    store = open_store(backend.url, namespace="probe", instance_id="probe",
                       options=dict(backend.options))
    with pytest.raises(ConfigError) as info:
        entry_store(store)
    assert ENTRY_STORE_NAMES in str(info.value) and store.kind in str(info.value)
