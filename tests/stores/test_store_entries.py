"""The entries part of the store contract (:mod:`celery_anarchon.stores.entry_store`), proved
against every store of the registry that has one (``store.entries``), on its real server.

Several store objects with their own instance ids stand for several beat instances sharing one
namespace; each test is named after the promise it proves.
"""
from __future__ import annotations

import dataclasses
import threading
import uuid

import pytest

from celery_anarchon._util import LATENESS_TOLERANCE_MS, iso
from celery_anarchon.errors import ConfigError, EntryExists, RequestRefused, UnknownEntry
from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import LeaseTerms, Outcome, RunEvent, entry_store
from celery_anarchon.stores.entry_store import (
    CLEARED_KEEP_MS, ENTRY_STORE_NAMES, Entries, EntriesEpoch, InstanceRecord, Pause,
)
from celery_anarchon.stores.run_now import (
    SlotWindow, SlotWindowPassed, new_request_id, request_id_ms,
)

import backends
from backends import BACKENDS, kinds_whose_store
from helpers import prepared, request_run
from stores_support import require_client, wait_until
from claim_helpers import _maker, fresh_slot, req, store_now

DEFINITION = '{"schedule":{"every":60},"task":"proj.tasks.report"}'
OTHER_DEFINITION = '{"schedule":{"every":30},"task":"proj.tasks.report"}'


#: the stores that hold entries, pauses and run-now requests (read from their classes; a store
#: whose client library is missing is in both lists: its tests skip, or fail under CI)
ENTRY_STORES = kinds_whose_store(lambda store: store.entries is not None)
#: the others: entry_store() refuses them
OTHER_STORES = kinds_whose_store(lambda store: store.entries is None)


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
    return [h for h in store.history.read(entry) if h.slot_ms == slot]


# -- entries -----------------------------------------------------------------------------------------

def test_add_update_remove_with_their_errors(stores):
    a, b = stores("A"), stores("B")
    added = a.entries.put_entry("report", DEFINITION, by="alice", create=True)
    assert (added.name, added.definition, added.pause, added.updated_by) == (
        "report", DEFINITION, None, "alice")
    with pytest.raises(EntryExists, match="report"):
        b.entries.put_entry("report", OTHER_DEFINITION, by="bob", create=True)
    with pytest.raises(UnknownEntry, match="nightly"):
        b.entries.put_entry("nightly", DEFINITION, by="bob", create=False)

    updated = b.entries.put_entry("report", OTHER_DEFINITION, by="bob", create=False)
    assert updated.definition == OTHER_DEFINITION and updated.updated_by == "bob"
    assert updated.version > added.version, "a name's version grows with its changes"
    assert updated.updated_ms >= added.updated_ms
    assert a.entries.load_entries().entries["report"].definition == OTHER_DEFINITION

    assert a.entries.remove_entry("report", by="alice") is True
    removed = b.entries.load_entries().entries["report"]
    assert removed.cleared and removed.updated_by == "alice", "a removal leaves a cleared record"
    assert b.entries.remove_entry("report", by="bob") is False, "nothing left to remove"
    with pytest.raises(UnknownEntry):
        a.entries.put_entry("report", DEFINITION, by="alice", create=False)
    again = a.entries.put_entry("report", DEFINITION, by="alice", create=True)
    assert again.version > updated.version, "a name added again never reuses an old version"


def test_entries_version_grows_with_every_write_and_is_stable_otherwise(stores):
    a, b = prepared(stores("A"), "report", "cfg"), stores("B")
    assert a.entries.entries_version() == b.entries.entries_version() == 0, "0 before any change"
    seen = [0]

    def grew(what):
        version = b.entries.entries_version()
        assert version > seen[-1], f"{what} did not raise the version ({seen[-1]} -> {version})"
        assert a.entries.entries_version() == version, "every instance reads the same version"
        seen.append(version)

    def stable(what):
        assert a.entries.entries_version() == seen[-1], f"{what} changed the version"

    a.entries.put_entry("report", DEFINITION, by="alice", create=True)
    grew("add")
    b.entries.put_entry("report", OTHER_DEFINITION, by="bob", create=False)
    grew("update")
    a.entries.set_pause("cfg", Pause("deploy", "alice", 0), by="alice")
    grew("pause of a config entry")
    b.entries.set_pause("report", Pause("", "bob", 0), by="bob")
    grew("pause of a store entry")
    a.entries.set_pause("report", None, by="alice")
    grew("resume")
    request_run(b, "report", "req-1", by="bob")
    grew("run-now request")
    a.entries.remove_entry("report", by="alice")
    grew("remove")

    a.entries.put_entry("cfg2", DEFINITION, by="a", create=True)
    grew("add")
    with pytest.raises(UnknownEntry):
        b.entries.put_entry("nope", DEFINITION, by="b", create=False)
    stable("a refused update")
    with pytest.raises(EntryExists):
        b.entries.put_entry("cfg2", DEFINITION, by="b", create=True)
    stable("a refused add")
    assert a.entries.remove_entry("nope", by="a") is False
    stable("removing a name without a definition")
    request_run(b, "cfg2", "req-2", by="b")
    grew("run-now request")
    request_run(b, "cfg2", "req-2", by="b")
    stable("the same request again")
    a.entries.load_entries(), b.instances.instances(), a.instances.load_fingerprints("x"), b.history.read("cfg")
    a.instances.record_instance(_record("A"), 60_000)
    a.instances.save_fingerprints("d1", {"cfg": "fp"})
    a.claim([req("cfg", fresh_slot(a))])
    a.claim([req("report", fresh_slot(a))])
    stable("reads, heartbeats, fingerprints and claims")
    assert a.entries.load_entries().version == seen[-1]


def test_load_entries_is_one_consistent_read(stores):
    """While one instance writes (adds and run-now requests, alternately), every snapshot another
    instance loads is one of the states between two writes: its version is the version after k
    writes and it holds exactly the first k writes."""
    writer, reader = stores("W"), stores("R")
    slots: dict[str, int] = {}
    after = {writer.entries.entries_version(): 0}          # version -> writes done
    done = threading.Event()
    failures: list[BaseException] = []

    def write() -> None:
        try:
            for i in range(40):
                if i % 2 == 0:
                    writer.entries.put_entry(f"e{i:02}", DEFINITION, by="w", create=True)
                else:
                    made = request_run(writer, f"e{i - 1:02}", f"r{i:02}", by="w")
                    slots[made.request_id] = made.slot_ms
                after[writer.entries.entries_version()] = i + 1
        except BaseException as error:  # reported below, never a hang
            failures.append(error)
        finally:
            done.set()

    thread = threading.Thread(target=write)
    snapshots = []
    thread.start()
    while not done.is_set() or not snapshots:
        snapshots.append(reader.entries.load_entries())
    thread.join(timeout=60)
    snapshots.append(reader.entries.load_entries())
    assert not failures, failures
    assert len(after) == 41, "every write raised the version"
    for snap in snapshots:
        assert snap.version in after, f"snapshot at version {snap.version} matches no state"
        k = after[snap.version]
        assert sorted(snap.entries) == [f"e{i:02}" for i in range(0, k, 2)], (snap.version, k)
        assert sorted(r.request_id for r in snap.requests) == [f"r{i:02}" for i in range(1, k, 2)]
    assert after[snapshots[-1].version] == 40
    assert {r.request_id: r.slot_ms for r in snapshots[-1].requests} == slots


# -- pauses --------------------------------------------------------------------------------------------

def test_a_pause_refuses_the_claim_at_once_even_on_an_instance_that_never_synced(stores):
    a = prepared(stores("A"), "report", "leased")
    paused = a.entries.set_pause("report", Pause("migrating the reports table", "alice", 0), by="alice")
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
    if b.leases is not None:
        b.entries.set_pause("leased", Pause("", "bob", 0), by="bob")
        lease = LeaseTerms(queue_timeout_ms=60_000)
        assert b.claim([req("leased", slot, lease=lease)])[0].outcome is Outcome.PAUSED
        assert b.leases.inspect("leased", slot) is None, "a paused leased run has no lease record"
    stored = a.entries.load_entries().entries["report"]
    assert stored.pause == paused.pause and stored.definition is None


def test_a_claim_won_before_the_pause_is_won_again_by_its_retry(stores):
    a, b = prepared(stores("A"), "report"), stores("B")
    slot = fresh_slot(a)
    first = a.claim([req("report", slot)])[0]
    assert first.outcome is Outcome.WON
    b.entries.set_pause("report", Pause("too late for this one", "bob", 0), by="bob")
    retry = a.claim([req("report", slot)])[0]
    assert retry.outcome is Outcome.WON and retry.token == first.token, "already claimed comes first"
    other = b.claim([req("report", slot)])[0]
    assert other.outcome is Outcome.OTHER_WON and other.winner == "A"
    assert b.claim([req("report", slot + 1)])[0].outcome is Outcome.PAUSED, "the next slot is paused"
    assert [h.event for h in _history_of(a, "report", slot)] == [RunEvent.CLAIMED], \
        "a pause never overwrites a claimed run's record"


def test_resume_lets_the_next_slot_win(stores):
    a, b = prepared(stores("A"), "report"), stores("B")
    a.entries.set_pause("report", Pause("", "alice", 0), by="alice")
    slot = fresh_slot(a)
    assert b.claim([req("report", slot)])[0].outcome is Outcome.PAUSED
    resumed = a.entries.set_pause("report", None, by="alice")
    assert resumed.pause is None
    left = a.entries.load_entries().entries["report"]
    assert left.cleared and left.updated_ms >= resumed.updated_ms > 0, \
        "a resumed config entry leaves a cleared record (instances that saw a loss read it)"
    nxt = b.claim([req("report", slot + 1)])[0]
    assert nxt.outcome is Outcome.WON and nxt.winner == "B"

    a.entries.put_entry("store-entry", DEFINITION, by="alice", create=True)
    prepared(a, "store-entry")
    a.entries.set_pause("store-entry", Pause("", "alice", 0), by="alice")
    assert b.claim([req("store-entry", slot + 2)])[0].outcome is Outcome.PAUSED
    back = b.entries.set_pause("store-entry", None, by="bob")
    assert back.pause is None and back.definition == DEFINITION, "resume keeps the definition"
    assert a.claim([req("store-entry", slot + 3)])[0].outcome is Outcome.WON


def test_a_paused_run_is_recorded_once_with_who_paused_and_why(stores):
    a, b = prepared(stores("A"), "report"), stores("B")
    first = a.entries.set_pause("report", Pause("backfill", "alice", 0), by="alice").pause
    slot = fresh_slot(a)
    assert b.claim([req("report", slot)])[0].outcome is Outcome.PAUSED
    second = a.entries.set_pause("report", Pause("still backfilling", "carol", 0), by="carol").pause
    answer = a.claim([req("report", slot)])[0]
    assert answer.outcome is Outcome.PAUSED and answer.detail == second.describe()
    records = _history_of(a, "report", slot)
    assert [(h.event, h.detail, h.instance) for h in records] == [
        (RunEvent.PAUSED, first.describe(), "B")], "recorded once: the first paused claim's record"
    assert records == _history_of(b, "report", slot)


def test_a_store_entry_keeps_its_pause_when_updated_and_loses_it_when_removed(stores):
    a, b = stores("A"), stores("B")
    a.entries.put_entry("report", DEFINITION, by="alice", create=True)
    pause = a.entries.set_pause("report", Pause("why", "alice", 0), by="alice").pause
    updated = b.entries.put_entry("report", OTHER_DEFINITION, by="bob", create=False)
    assert updated.pause == pause and updated.definition == OTHER_DEFINITION
    assert b.entries.remove_entry("report", by="bob") is True
    assert a.entries.load_entries().entries["report"].cleared, "the pause went with the entry"
    readded = a.entries.put_entry("report", DEFINITION, by="alice", create=True)
    assert readded.pause is None


# -- run-now requests --------------------------------------------------------------------------

def test_the_same_request_id_twice_is_one_request_with_the_first_slot(stores):
    a, b = stores("A"), stores("B")
    first = request_run(a, "report", "deploy-42", by="alice")
    assert (first.entry, first.request_id, first.by, first.created) == (
        "report", "deploy-42", "alice", True)
    assert abs(first.requested_ms - store_now(a)) < 5_000, "requested on the store's clock"
    assert first.requested_ms <= first.slot_ms, "the slot is the store's clock at the request"
    version = a.entries.entries_version()
    again = request_run(b, "report", "deploy-42", by="bob")
    assert again == dataclasses.replace(first, created=False), "the first request, whoever asks"
    assert a.entries.entries_version() == version, "found: nothing written"
    other = request_run(b, "report", "deploy-43", by="bob")
    assert other.created and other.slot_ms != first.slot_ms and other.by == "bob"
    same_id_other_entry = request_run(b, "nightly", "deploy-42", by="bob")
    assert same_id_other_entry.created, "request ids are per entry"
    loaded = sorted((r.entry, r.request_id, r.slot_ms) for r in a.entries.load_entries().requests)
    assert loaded == sorted((r.entry, r.request_id, r.slot_ms)
                            for r in (first, other, same_id_other_entry))


def test_a_request_is_found_by_its_entry_and_id_with_the_longest_name_and_id(stores):
    """find_request reads what request_run's first step finds, writing nothing: the request of
    that entry and id (the longest of both: 200 characters of 4 bytes each), none for another
    entry, id or spelling (a space and a percent sign stay themselves in the Redis field)."""
    a, b = stores("A"), stores("B")
    name, request_id = "\U0001d11e" * 200, "\U0001d120" * 200
    assert a.entries.find_request(name, request_id) is None
    first = request_run(a, name, request_id, by="alice")
    odd = request_run(a, name, "a b%20c", by="alice")
    version = a.entries.entries_version()
    assert b.entries.find_request(name, request_id) == dataclasses.replace(first, created=False)
    assert b.entries.find_request(name, "a b%20c") == dataclasses.replace(odd, created=False)
    for entry, other in ((name, "a b c"), (name, "a%20b%20c"), (name, request_id[:-1]),
                         ("report", request_id), (name[:-1], request_id)):
        assert b.entries.find_request(entry, other) is None, (entry[:3], other[:10])
    assert a.entries.entries_version() == version, "a read"
    assert request_run(b, name, request_id, by="bob") == dataclasses.replace(first, created=False)


def test_a_run_now_slot_skips_the_scheduled_slots_and_the_other_requests_slots(stores):
    """The store chooses the slot in its write: its clock's now, 1 ms later while it is one of
    the window's scheduled slots or the slot of another request of the entry."""
    a = stores("A")
    now = store_now(a)
    busy = range(now - SlotWindow.BEFORE_MS, now + 300)   # every ms up to 300 ms from now
    window = SlotWindow(now - SlotWindow.BEFORE_MS, now + SlotWindow.AFTER_MS, frozenset(busy))
    made = [a.entries.request_run("e", f"r{i}", window, by="t") for i in range(3)]
    taken: set[int] = set()
    for q in made:
        assert q.slot_ms == window.choose(q.requested_ms, taken), (q, taken)
        assert q.slot_ms not in busy and q.slot_ms not in taken
        taken.add(q.slot_ms)
    other = a.entries.request_run("other", "r0", window, by="t")
    assert other.slot_ms == window.choose(other.requested_ms, set()), "per entry"


def test_a_request_with_no_free_slot_or_outside_its_window_writes_nothing(stores):
    a = stores("A")
    request_run(a, "e", "r0")
    version, now = a.entries.entries_version(), store_now(a)
    start, end = now - SlotWindow.BEFORE_MS, now + SlotWindow.AFTER_MS
    every_ms = SlotWindow(start, end, frozenset(range(start, end + 1)))
    with pytest.raises(ConfigError, match="'e': no millisecond within 1000 ms of now is free"):
        a.entries.request_run("e", "r1", every_ms, by="t")
    with pytest.raises(SlotWindowPassed, match="outside the window"):
        a.entries.request_run("e", "r1", SlotWindow(now - 120_000, now - 60_000), by="t")
    assert a.entries.entries_version() == version
    assert [r.request_id for r in a.entries.load_entries().requests] == ["r0"]


def test_a_request_id_that_carries_its_time_is_refused_once_the_store_cannot_vouch_for_it(stores):
    """A UUIDv7 made more than the retention ago, before a new store's memory began (+ the 10-s
    tolerance of an id made ahead), or more than that tolerance ahead of the store's clock:
    RequestRefused naming the id, when it was made, why and the fix; nothing written. One the
    store holds is found whatever its age; an opaque id is never refused; the ids the store's
    clock makes (RequestClock.new_id) are taken, even in the new memory's first 10 s."""
    a = stores("A")
    clock = a.entries.request_clock()                       # a new store: its memory begins now
    assert clock.now_ms - 5_000 < clock.born_ms <= clock.now_ms and clock.pruned_ms == 0
    version = a.entries.entries_version()
    cases = {"8 days ago": (clock.now_ms - 8 * 86_400_000, "more than anarchon_request_retention"),
             "before the memory began": (clock.born_ms - 1, "before the store's memory of run-now "
                                                            "requests began"),
             "made ahead, before it began + 10 s": (clock.born_ms + LATENESS_TOLERANCE_MS - 1,
                                                    "+ 10 s for an id made ahead"),
             "ahead of the clock": (store_now(a) + 60_000, "after the store's clock")}
    for what, (made_ms, words) in cases.items():
        request_id = new_request_id(made_ms)
        assert request_id_ms(request_id) == made_ms
        with pytest.raises(RequestRefused) as refused:
            request_run(a, "e", request_id)
        assert words in str(refused.value) and request_id in str(refused.value), (what, refused.value)
        assert iso(made_ms) in str(refused.value), "when it was made"
        fix = "new_request_id()" if what == "ahead of the clock" else "celery anarchon history e"
        assert fix in str(refused.value), refused.value
    assert a.entries.entries_version() == version, "nothing written"
    fresh = a.entries.request_clock().new_id()
    first = request_run(a, "e", fresh)
    assert first.created and request_run(a, "e", fresh) == dataclasses.replace(first, created=False)
    assert request_run(a, "e", "ticket-4711").created, "an opaque id"


def test_a_prune_by_a_shorter_retention_moves_the_start_of_what_the_store_vouches_for(stores):
    """A process with a retention of 1 s writes a request: the store may have pruned the ids
    made more than 1 s before, so a UUIDv7 made then is refused for every process, whatever its
    own retention; one the store still holds is found."""
    a = prepared(stores("A"))                       # in service for two minutes
    held = a.entries.request_clock().new_id()
    first = request_run(a, "e", held)
    made = store_now(a)
    wait_until(lambda: store_now(a) > made + 1_500, 10, "1.5 s on the store's clock")
    request_run(a, "e", "short", retention_ms=1_000)
    assert a.entries.request_clock().pruned_ms > made
    with pytest.raises(RequestRefused, match="the store pruned the request ids made before then"):
        request_run(a, "e", new_request_id(made))
    assert request_run(a, "e", held) == dataclasses.replace(first, created=False)


def test_a_request_id_made_before_the_store_lost_its_data_is_refused_never_run_again(stores):
    """Amnesia (docs/design.md): the store forgot every request; its memory of requests begins
    again at its next operation, so a UUIDv7 request id made before is refused (it may have run),
    while an opaque id is a new request (one run while the store holds it: the documented bound)."""
    a = stores("A")
    clock = a.entries.request_clock()
    made = clock.new_id()
    assert request_run(a, "e", made).created
    # the loss comes after the memory began, on the store's clock (a store answering within the
    # same millisecond would begin its new memory at the same instant, and vouch for the id)
    wait_until(lambda: store_now(a) > clock.born_ms, 5, "the store's clock to move")
    stores.wipe()
    b = stores("B")
    with pytest.raises(RequestRefused, match="before the store's memory of run-now requests began"):
        request_run(b, "e", made)
    assert b.entries.load_entries().requests == ()
    assert request_run(b, "e", "ticket-4711").created
    assert request_run(b, "e", b.entries.request_clock().new_id()).created, "a new id runs"


def test_request_ids_are_uuid7_with_the_time_they_were_made():
    made = {new_request_id(1_796_000_000_123) for _ in range(100)}
    assert len(made) == 100, "random bits"
    for text in made:
        value = uuid.UUID(text)
        assert (value.version, value.variant, str(value)) == (7, uuid.RFC_4122, text)
        assert request_id_ms(text) == request_id_ms(text.upper()) == 1_796_000_000_123
    for opaque in ("ticket-4711", uuid.uuid4().hex, str(uuid.uuid4()), "", text + "x"):
        assert request_id_ms(opaque) is None, opaque


# -- the capability check ----------------------------------------------------------------------

def test_entry_store_returns_the_stores_entries_part(stores):
    store = stores("A")
    assert entry_store(store) is store.entries and isinstance(store.entries, Entries)


@pytest.mark.parametrize("kind", OTHER_STORES)
def test_a_store_that_cannot_hold_entries_is_a_config_error_naming_those_that_can(kind):
    require_client(kind)
    backend = next(b for b in BACKENDS if b.kind == kind)
    store = open_store(backend.url, namespace="probe", instance_id="probe",
                       options=dict(backend.options))
    with pytest.raises(ConfigError) as info:
        entry_store(store)
    assert ENTRY_STORE_NAMES in str(info.value) and store.kind in str(info.value)


# -- amnesia: the entries epoch, cleared records, an accepted loss (docs/design.md "Amnesia") -------

def _written_under_another_server(store) -> None:
    """Make the entries epoch look written under another server epoch (a restart, a failover)."""
    if store.kind in ("sqlite", "postgresql"):
        import sqlalchemy as sa
        from celery_anarchon.stores.sql import schema
        v = schema.schedule_versions
        store.connection.run("age the epoch", lambda conn: conn.execute(
            sa.update(v).where(v.c.namespace == store.namespace)
            .values(server_epoch="an-older-server")))
    elif store.kind == "memory":
        backends.memory_entries_under(store, "an-older-server")
    else:
        store.connection.client()[0].hset(store.namespace_keys["entries:epoch"], "server", "an-older-server")


def _age_cleared(store, name: str, by_ms: int) -> None:
    """Move the time of ``name``'s cleared record ``by_ms`` into the past."""
    if store.kind in ("sqlite", "postgresql"):
        import sqlalchemy as sa
        from celery_anarchon.stores.sql import schema
        t = schema.schedule_entries
        store.connection.run("age a record", lambda conn: conn.execute(
            sa.update(t).where(t.c.namespace == store.namespace, t.c.name == name)
            .values(updated_ms=t.c.updated_ms - by_ms)))
    elif store.kind == "memory":
        backends.memory_age_cleared(store, name, by_ms)
    else:
        store.connection.client()[0].zincrby(store.namespace_keys["entries:cleared"], -by_ms, name)


def test_the_entries_epoch_comes_with_the_first_write_and_is_gone_after_a_wipe(stores):
    a, b = stores("A"), stores("B")
    assert a.entries.entries_epoch() == EntriesEpoch("", 0), "a new store holds no entries epoch"
    a.entries.set_pause("cfg", Pause("", "alice", 0), by="alice")
    first = b.entries.entries_epoch()
    assert first.epoch and first.version == 1 == b.entries.entries_version()
    a.entries.put_entry("report", DEFINITION, by="alice", create=True)
    assert b.entries.entries_epoch() == EntriesEpoch(first.epoch, 2), "one epoch while the data is kept"
    loaded = b.entries.load_entries()
    assert (loaded.epoch, loaded.version, loaded.accepted_ms) == (first.epoch, 2, 0)
    stores.wipe()
    assert a.entries.entries_epoch() == EntriesEpoch("", 0), "the wiped store holds no epoch"
    assert a.entries.load_entries().epoch == ""
    a.entries.set_pause("cfg", Pause("", "alice", 0), by="alice")
    again = b.entries.entries_epoch()
    assert again.epoch not in ("", first.epoch) and again.version == 1, (first, again)


def test_a_write_under_another_server_epoch_starts_a_new_entries_epoch(stores):
    """The entries epoch is written anew by the first write after the server's own epoch
    changed (a restart, a failover, a replaced file: writes may have been lost); a read never
    writes it."""
    a = stores("A")
    a.entries.set_pause("cfg", Pause("", "alice", 0), by="alice")
    first = a.entries.entries_epoch()
    a.entries.put_entry("report", DEFINITION, by="alice", create=True)
    assert a.entries.entries_epoch().epoch == first.epoch, "the same server: the same epoch"
    _written_under_another_server(a)
    assert a.entries.entries_epoch() == EntriesEpoch(first.epoch, 2), "reading never writes the epoch"
    a.entries.load_entries()
    a.entries.set_pause("cfg", None, by="alice")
    now = a.entries.entries_epoch()
    assert now.epoch not in ("", first.epoch) and now.version == 3, (first, now)


def test_a_run_now_request_writes_the_entries_epoch_as_every_entry_write_does(stores):
    """A request raises the entries version, so it writes the entries epoch as a pause does: into
    a namespace that holds none, and anew after the server's own epoch changed. A request that
    raised the version under the old epoch would hide a loss: an instance that knew (epoch,
    version) before a failover that lost its last write sees the same pair again after the
    request (a lost write, one new), so it loads neither the loss nor the request."""
    a, b = stores("A"), stores("B")
    request_run(a, "cfg", "r1")
    first = b.entries.entries_epoch()
    assert first.epoch and first.version == 1, "the namespace's first write writes an epoch"
    request_run(a, "cfg", "r2")
    assert b.entries.entries_epoch() == EntriesEpoch(first.epoch, 2), "the same server: the same epoch"
    _written_under_another_server(a)
    assert not request_run(a, "cfg", "r1").created
    assert b.entries.entries_epoch() == EntriesEpoch(first.epoch, 2), "a request found writes nothing"
    request_run(a, "cfg", "r3")
    now = b.entries.entries_epoch()
    assert now.epoch not in ("", first.epoch) and now.version == 3, (first, now)
    assert b.entries.load_entries().epoch == now.epoch


def test_a_resume_or_a_removal_leaves_a_record_newer_than_what_it_cleared(stores):
    """So that an instance that keeps a pause or a store entry from before a loss can tell the
    operator's resume or removal written since from the loss itself."""
    a, b = prepared(stores("A"), "cfg"), stores("B")
    paused = a.entries.set_pause("cfg", Pause("why", "alice", 0), by="alice")
    resumed = b.entries.set_pause("cfg", None, by="bob")
    record = a.entries.load_entries().entries["cfg"]
    assert record.cleared and record == resumed, (record, resumed)
    assert (record.updated_by, record.version > paused.version) == ("bob", True)
    assert record.updated_ms >= paused.updated_ms
    assert b.entries.set_pause("never-paused", None, by="bob").cleared
    assert a.entries.load_entries().entries["never-paused"].cleared, "written even where nothing was"
    added = a.entries.put_entry("report", DEFINITION, by="alice", create=True)
    assert b.entries.remove_entry("report", by="bob")
    gone = a.entries.load_entries().entries["report"]
    assert gone.cleared and gone.updated_by == "bob" and gone.version > added.version
    again = a.entries.put_entry("report", DEFINITION, by="alice", create=True)
    assert again.definition == DEFINITION and not again.cleared, "a cleared name can be added"
    assert a.entries.set_pause("cfg", Pause("", "alice", 0), by="alice").pause is not None
    assert a.claim([req("cfg", fresh_slot(a))])[0].outcome is Outcome.PAUSED


def test_cleared_records_are_pruned_after_a_week(stores):
    a = stores("A")
    a.entries.set_pause("old", None, by="alice")
    a.entries.set_pause("young", None, by="alice")
    a.entries.set_pause("paused", Pause("", "alice", 0), by="alice")
    _age_cleared(a, "old", CLEARED_KEEP_MS + 60_000)
    if a.leases is not None and a.kind in ("sqlite", "postgresql"):
        a.prune()
    else:
        a.entries.set_pause("another", None, by="alice")       # Redis: the next write prunes
    assert sorted(a.entries.load_entries().entries) == sorted(
        ["young", "paused"] + ([] if a.kind in ("sqlite", "postgresql") else ["another"]))


def test_an_accepted_loss_is_recorded_with_who_and_when_and_raises_the_version(stores):
    a, b = stores("A"), stores("B")
    before = a.entries.entries_version()
    at = a.entries.accept_loss(by="ops")
    loaded = b.entries.load_entries()
    assert (loaded.accepted_ms, loaded.accepted_by) == (at, "ops")
    assert loaded.version > before and loaded.epoch, "an entries write like any other"
    assert abs(at - store_now(b)) < 5_000, "the store's clock"
