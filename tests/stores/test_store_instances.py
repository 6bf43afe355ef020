"""The instances part of the store contract
(:class:`celery_anarchon.stores.entry_store.Instances`): each live beat's heartbeat and the
fingerprint mappings it names, proved against every store of the registry that has one
(``store.instances``), on its real server.

Several store objects with their own instance ids stand for several beat instances sharing one
namespace; each test is named after the promise it proves.
"""
from __future__ import annotations

import threading

import pytest

from celery_anarchon.errors import ConfigError
from celery_anarchon.stores import open_store
from celery_anarchon.stores.entry_store import InstanceRecord, Instances

from backends import BACKENDS
from stores_support import wait_until
from claim_helpers import _maker, store_now


def _keeps_instances(backend) -> bool:
    """The store of ``backend`` has an instances part (building a store does no I/O)."""
    url = backend.url if backend.url_variable else backend.local_url("probe")
    try:
        store = open_store(url, namespace="probe", instance_id="probe", options=dict(backend.options))
    except ConfigError:          # its client library is not installed
        return False
    return isinstance(store.instances, Instances)


#: the stores that keep instance records (read from their classes)
INSTANCE_STORES = tuple(b.kind for b in BACKENDS if _keeps_instances(b))


@pytest.fixture(params=INSTANCE_STORES)
def stores(request, namespace):
    """Opens instance stores of one backend sharing one namespace (one per instance id)."""
    yield from _maker(request.param, namespace)


def _record(instance_id: str, digest: str = "d1", **changes) -> InstanceRecord:
    fields = dict(instance_id=instance_id, host="host-" + instance_id, pid=4242, version="1.0",
                  started_ms=1_000, last_tick_ms=2_000, skew_ms=-3, entries=7,
                  fingerprints_digest=digest)
    return InstanceRecord(**{**fields, **changes})


def test_instance_records_expire_on_the_store_clock(stores):
    a, b, c = stores("A"), stores("B"), stores("C")
    # a ttl of 3 s: the listing below comes well within it, even after slow writes
    a.instances.record_instance(_record("A"), ttl_ms=3_000)
    b.instances.record_instance(_record("B", digest="d2"), ttl_ms=120_000)   # a longer ttl after a shorter
    c.instances.record_instance(_record("C"), ttl_ms=3_000)                  # and a shorter after a longer
    listed = {r.instance_id: r for r in b.instances.instances()}
    assert set(listed) == {"A", "B", "C"}
    mine = listed["A"]
    assert mine == _record("A", seen_ms=mine.seen_ms, expires_ms=mine.expires_ms), \
        "every field read back as written"
    assert mine.expires_ms == mine.seen_ms + 3_000 and abs(mine.seen_ms - store_now(a)) < 5_000
    wait_until(lambda: not {"A", "C"} & {r.instance_id for r in b.instances.instances()}, 15,
               "A's and C's records to expire")
    assert store_now(b) >= mine.expires_ms, "expired by the store's clock, not before"
    assert [r.instance_id for r in a.instances.instances()] == ["B"], "the longer ttl holds"

    a.instances.record_instance(_record("A", last_tick_ms=9_000), ttl_ms=60_000)   # a heartbeat again
    back = {r.instance_id: r for r in b.instances.instances()}["A"]
    assert back.last_tick_ms == 9_000 and back.expires_ms > mine.expires_ms


def test_a_namespace_no_instance_wrote_to_lists_none(stores):
    reader = stores("R")
    assert reader.instances.instances() == []
    assert reader.instances.instances() == [], "read twice: the first read left nothing behind"


def test_remove_instance_drops_only_that_record(stores):
    a, b = stores("A"), stores("B")
    a.instances.record_instance(_record("A"), ttl_ms=60_000)
    b.instances.record_instance(_record("B"), ttl_ms=60_000)
    refreshed = _record("A", last_tick_ms=5_000, entries=8, skew_ms=None)
    a.instances.record_instance(refreshed, ttl_ms=60_000)
    rows = {r.instance_id: r for r in b.instances.instances()}
    assert len(rows) == 2 and rows["A"].last_tick_ms == 5_000 and rows["A"].entries == 8, \
        "a heartbeat replaces the instance's record"
    assert rows["A"].skew_ms is None, "an unknown skew reads back unknown"
    a.instances.remove_instance("A")
    assert [r.instance_id for r in b.instances.instances()] == ["B"]
    a.instances.remove_instance("A")                                   # twice: nothing to do
    b.instances.remove_instance("B")
    assert a.instances.instances() == []


def test_an_instance_id_any_text_is_its_own_record(stores):
    a = stores("A")
    odd = ["host.example:1:ab", "host.example:1.ab", "é/ *>", "x" * 200]
    for iid in odd:
        a.instances.record_instance(_record(iid), ttl_ms=60_000)
    assert sorted(r.instance_id for r in a.instances.instances()) == sorted(odd)


def test_fingerprints_round_trip_by_digest(stores):
    a, b = stores("A"), stores("B")
    mapping = {"report": "3f2a", "nightly": "99c1", "name with spaces / é": "00"}
    assert b.instances.load_fingerprints("digest-1") is None
    a.instances.save_fingerprints("digest-1", mapping)
    a.instances.save_fingerprints("digest-1", mapping)                  # once per digest; again is harmless
    a.instances.save_fingerprints("digest-2", {"report": "other"})
    a.instances.record_instance(_record("A", digest="digest-1"), ttl_ms=60_000)
    assert b.instances.load_fingerprints("digest-1") == mapping
    assert b.instances.load_fingerprints("digest-2") == {"report": "other"}
    assert b.instances.load_fingerprints("digest-3") is None


def test_every_store_of_the_registry_keeps_instance_records():
    assert set(INSTANCE_STORES) == {b.kind for b in BACKENDS}


def test_readers_at_the_same_time_each_see_every_record(stores):
    writers = [stores(iid) for iid in ("A", "B", "C")]
    for w in writers:
        w.instances.record_instance(_record(w.instance_id), ttl_ms=60_000)
    readers = [stores(f"R{i}") for i in range(4)]
    seen: list[list[str]] = []
    errors: list[BaseException] = []

    def read(store):
        try:
            for _ in range(5):
                seen.append([r.instance_id for r in store.instances.instances()])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=read, args=(r,)) for r in readers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert len(seen) == 20 and all(ids == ["A", "B", "C"] for ids in seen), \
        "a reader never sees a record missing while another reads"


def test_the_entries_an_instance_leaves_out_read_back_as_written(stores):
    """``InstanceRecord.refused`` (what ``status`` shows as needing attention) round-trips on
    every store; a record without it reads back without it."""
    a, b = stores("A"), stores("B")
    refused = {"row é": "django-celery-beat PeriodicTask 'row é' (id 7) is left out: ...; fix: x",
               "other": "y" * 900}
    a.instances.record_instance(_record("A", refused=refused), ttl_ms=60_000)
    b.instances.record_instance(_record("B"), ttl_ms=60_000)
    rows = {r.instance_id: r for r in b.instances.instances()}
    assert rows["A"].refused == refused and rows["B"].refused is None
