"""The NATS store on servers of its own that the tests break (benchmarks/ha_nats.py): a
three-server JetStream cluster whose stream leader is SIGKILLed during claims, and one server
restarted after losing its newest writes. The shared NATS on 4222 is never touched.

Each test names the promise; the rule is docs/design.md "Amnesia and partial loss": a run that any
instance was told it won is never won again (a possible miss, never a duplicate).
"""
from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest

from celery_anarchon.errors import ConfigError, StoreUnavailable
from celery_anarchon.stores.base import Outcome

from backends import backdate_memory_start
from ha_support import need, opened_stores, rig_fixture, until_answered
from helpers import prepared, req
from stores_support import wait_until

import ha_nats  # noqa: E402  (benchmarks/: conftest puts it on the path)


def _need_server():
    need(ha_nats.available(), f"nats-server is missing ({ha_nats.NATS_SERVER})")


#: one three-server cluster for the module; each test leaves every server running
cluster = rig_fixture(lambda: ha_nats.NatsCluster(3), scope="module", needs=_need_server)
single = rig_fixture(lambda: ha_nats.NatsCluster(1), needs=_need_server)
opened = opened_stores()


@pytest.fixture
def healed(cluster):
    """The cluster, with every server it killed started again afterwards."""
    yield cluster
    for server in cluster.servers:
        server.start(wait=False)
    cluster.wait_ready()


def claim_until_answered(store, requests, within_s: float):
    """Claim, retrying a StoreUnavailable (a leader election) for ``within_s`` seconds."""
    return until_answered(lambda: store.claim(requests), within_s)


def test_stream_leader_killed_during_claims_never_gives_a_run_two_winners(healed, opened, namespace):
    """Three instances, each on another server of the cluster, claim the same runs while the
    claims stream's leader is SIGKILLed: every run has exactly one winner, before, during and
    after the kill, and after the killed server came back; the runs won before the kill are
    lost to their winner on every instance afterwards (R3: the quorum kept them)."""
    # a short claim_timeout: a claim waiting on the election gives up and is retried sooner
    stores = [opened(s.url, namespace, f"I{i}", claim_timeout=2) for i, s in enumerate(healed.servers)]
    prepared(stores[0])
    for store in stores[1:]:
        store.prepare(["e"])
    now = stores[0].now_ms()
    winners: dict[int, set[str]] = defaultdict(set)
    lock = threading.Lock()

    def note(results):
        with lock:
            for r in results:
                if r.outcome is Outcome.WON:
                    winners[r.request.slot_ms].add(r.winner)
                else:
                    assert r.outcome is Outcome.OTHER_WON, r

    before = [now - 60_000 + i for i in range(30)]
    for store in stores:
        note(store.claim([req("e", s) for s in before]))
    assert all(len(winners[s]) == 1 for s in before), "one winner per run before the kill"
    first_winners = {s: next(iter(winners[s])) for s in before}

    during = [now - 30_000 + i for i in range(60)]
    # the claims before the kill take a few seconds; after it, one election (a few rounds)
    stop = time.monotonic() + 30 + ha_nats.ELECTION_S
    errors, retries = [], []
    leader = healed.stream_leader(stores[0].stream)
    started = threading.Barrier(len(stores) + 1, timeout=30)

    def racer(store):
        try:
            for k in range(0, len(during), 5):
                if k == 10:
                    started.wait()  # two batches done: the leader dies now, under the rest
                batch = [req("e", s) for s in during[k:k + 5]]
                while True:
                    try:
                        note(store.claim(batch))
                        break
                    except StoreUnavailable:
                        retries.append(store.instance_id)
                        if time.monotonic() > stop:
                            raise
                        time.sleep(0.1)
        except BaseException as exc:  # noqa: BLE001  (reported by the main thread)
            errors.append(exc)
    threads = [threading.Thread(target=racer, args=(store,)) for store in stores]
    for t in threads:
        t.start()
    started.wait()
    leader.kill()
    for t in threads:
        t.join(max(0.0, stop - time.monotonic()) + 30)
    assert not [t for t in threads if t.is_alive()], "a racer still claiming after the election"
    assert not errors, errors
    assert retries, "the kill came while claims were in flight (some waited for the election)"
    healed.stream_leader(stores[0].stream, not_on=leader)
    # the runs won before the kill: lost to their winners on every instance that is still there
    survivors = [s for s, server in zip(stores, healed.servers) if server is not leader]
    for store in survivors:
        note(claim_until_answered(store, [req("e", s) for s in before], ha_nats.ELECTION_S))
    leader.start()
    for store in stores:
        note(claim_until_answered(store, [req("e", s) for s in before + during],
                                  ha_nats.ELECTION_S))
    twice = {s: w for s, w in winners.items() if len(w) > 1}
    assert not twice, f"runs won by two instances: {twice}"
    assert all(len(winners[s]) == 1 for s in during), "every run got its one winner"
    assert {s: next(iter(winners[s])) for s in before} == first_winners


def _replicas(cluster, stream):
    return cluster.stream_info(stream)["config"]["num_replicas"]


def test_claim_streams_have_three_replicas_by_default_on_a_cluster(cluster, opened, namespace):
    """Leaving ``replicas`` out on a cluster of three gives every stream of the store three
    copies: a publish is acknowledged once two servers stored it."""
    store = opened(cluster.servers[1].url, namespace, "A")
    warnings = store.prepare(["e"])
    assert store.replicas == 3
    for stream in (store.stream, store.history.kv_stream, store.epoch_stream):
        assert _replicas(cluster, stream) == 3, stream
    assert not any("replica" in w for w in warnings), warnings
    backdate_memory_start(store, ["e"], 120_000)
    assert store.claim([req("e", store.now_ms())])[0].outcome is Outcome.WON


def test_r1_stream_on_a_cluster_is_warned_at_start_up(cluster, opened, namespace):
    store = opened(cluster.url, namespace, "A", replicas=1)
    warnings = store.prepare(["e"])
    assert _replicas(cluster, store.stream) == 1
    [warning] = [w for w in warnings if "1 replica" in w]
    assert "single point of failure" in warning and "cluster 'anarchon'" in warning
    assert "['replicas'] = 3" in warning and "host crash" in warning


def test_an_r1_stream_of_an_older_start_is_raised_to_three_replicas(healed, opened, namespace):
    """A stream created with one replica (an older version, or replicas=1) is raised at the
    next start-up with the default; the claims it holds stay claimed after its leader dies."""
    old = prepared(opened(healed.url, namespace, "OLD", replicas=1))
    slot = old.now_ms()
    assert old.claim([req("e", slot)])[0].outcome is Outcome.WON
    new = opened(healed.servers[2].url, namespace, "NEW")
    warnings = new.prepare(["e"])
    assert any("had 1 replica(s); raised to 3" in w for w in warnings), warnings
    assert _replicas(healed, new.stream) == 3
    keeps = opened(healed.url, namespace, "KEEP", replicas=1)
    assert any("has 3 replicas" in w and "kept" in w for w in keeps.prepare(["e"]))
    assert _replicas(healed, new.stream) == 3, "never lowered"
    wait_until(lambda: all(r.get("current")
                           for r in healed.stream_info(new.stream)["cluster"]["replicas"]),
               ha_nats.ELECTION_S, "the new replicas to catch up")
    leader = healed.stream_leader(new.stream)
    leader.kill()
    healed.stream_leader(new.stream, not_on=leader)
    other = [s for s in healed.servers if s is not leader][0]
    late = opened(other.url, namespace, "LATE")
    # the other streams of the store (epoch, history) may still be electing their leaders
    until_answered(lambda: late.prepare(["e"]), ha_nats.ELECTION_S)
    lost = claim_until_answered(late, [req("e", slot)], ha_nats.ELECTION_S)[0]
    assert lost.outcome is Outcome.OTHER_WON and lost.winner == "OLD", lost


def test_replicas_are_validated(cluster, opened, namespace):
    for bad in (0, 6, "3", True, 2.5):
        with pytest.raises(ConfigError, match="replicas.*1 to 5"):
            opened(cluster.url, namespace, "A", replicas=bad)
    too_many = opened(cluster.url, namespace, "A", replicas=5)
    with pytest.raises(ConfigError, match="5 replicas cannot be placed on cluster 'anarchon'"):
        too_many.prepare(["e"])


def test_single_server_restarted_after_losing_its_newest_writes_never_rewins(single, opened,
                                                                             namespace):
    """A wins X1, the disk keeps it; A wins X2, the disk does not (JetStream had not synced it);
    the server crashes and restarts from that disk. X2's claim is gone from the stream, but the
    server's restart is seen (the store's epoch marker lived in memory): B's claim of X2 is
    refused as forgotten, never won; so is B's claim of X1, which the disk kept: the memory
    restarts at the epoch change for every slot before it + 10 s (docs/stores.md, "The epoch")."""
    server = single.servers[0]
    a = prepared(opened(single.url, namespace, "A"))
    now = a.now_ms()
    x1, x2 = now - 5000, now - 4000
    assert a.claim([req("e", x1)])[0].outcome is Outcome.WON
    disk = server.freeze_disk()
    assert a.claim([req("e", x2)])[0].outcome is Outcome.WON
    server.kill()
    server.restore_disk(disk)
    server.start()
    b = opened(single.url, namespace, "B")
    b.prepare(["e"])
    again = claim_until_answered(b, [req("e", x2)], ha_nats.ELECTION_S)[0]
    assert again.outcome is not Outcome.WON, f"X2 won twice: by A, then by B ({again})"
    assert again.outcome is Outcome.FORGOTTEN and "epoch" in again.detail, again
    retried = claim_until_answered(a, [req("e", x2)], ha_nats.ELECTION_S)[0]
    assert retried.outcome is Outcome.FORGOTTEN, retried
    kept = b.claim([req("e", x1)])[0]
    assert kept.outcome is Outcome.FORGOTTEN and again.detail == kept.detail, (kept, again)


def test_whole_cluster_restart_is_an_epoch_change_for_every_instance(healed, opened, namespace):
    """Every server of the cluster SIGKILLed and started again (a power loss of all hosts):
    their memory is gone, so is the epoch marker, and the first claim of any instance after it
    refuses the slots before the new marker + 10 s, naming both epochs; a run won before stays
    unwon by anyone else."""
    a = prepared(opened(healed.servers[0].url, namespace, "A"))
    b = opened(healed.servers[1].url, namespace, "B")
    b.prepare(["e"])
    now = a.now_ms()
    assert a.claim([req("e", now - 2000)])[0].outcome is Outcome.WON
    for server in healed.servers:
        server.kill()
    for server in healed.servers:
        server.start(wait=False)
    for server in healed.servers:
        server.wait_healthy()
    fresh = claim_until_answered(b, [req("e", now - 1000)], ha_nats.ELECTION_S)[0]
    assert fresh.outcome is Outcome.FORGOTTEN and "epoch changed" in fresh.detail, fresh
    again = claim_until_answered(b, [req("e", now - 2000)], ha_nats.ELECTION_S)[0]
    assert again.outcome is Outcome.FORGOTTEN and again.detail == fresh.detail, (again, fresh)
