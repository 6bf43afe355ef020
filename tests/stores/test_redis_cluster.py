"""The Redis Cluster store on a cluster of its own (benchmarks/redis_cluster.py): failovers of a
master while two instances claim, the per-slot epoch, and the options it refuses."""
from __future__ import annotations

import os
import shutil
import signal
import threading
import time
import uuid
from collections import defaultdict

import pytest

from celery_anarchon.errors import ConfigError, StoreError, StoreUnavailable
from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import ClaimRequest, Outcome
from celery_anarchon.stores.entry_store import Pause

from backends import backdate_memory_start
from conftest import IN_CI
from stores_support import store_url, wait_until

ENTRIES = [f"entry-{i}" for i in range(12)]
#: how long a claim is retried through a failover (and its runs' max_late): the promotion of a
#: killed master's replica takes node timeout + an election (about 2 s; a failed election is
#: retried after 4 node timeouts), the rig waits 30 s for it
RETRY_S = 30


@pytest.fixture
def rig():
    if shutil.which("redis-server") is None:
        if IN_CI:
            pytest.fail("redis-server is not installed")
        pytest.skip("redis-server is not installed")
    from redis_cluster import RedisClusterRig
    with RedisClusterRig() as rig:
        yield rig


def test_a_master_failover_mid_run_never_gives_a_run_two_winners(rig):
    """Two instances claim every 200-ms slot of 12 entries (spread over the three masters) while
    one master is failed over with CLUSTER FAILOVER and another is SIGKILLed (its replica
    promoted): no run is won by two instances, no run answered unconfirmed is counted as won,
    the slots of the failed-over masters are refused for 10 s after the change (the epoch of
    those slots), and the third master's entries go on being won throughout."""
    namespace = "failover-" + uuid.uuid4().hex[:6]
    stores = {name: open_store(rig.url, namespace=namespace, instance_id=name)
              for name in ("A", "B")}
    stores["A"].prepare(ENTRIES)
    backdate_memory_start(stores["A"], ENTRIES, 120_000)
    master_of = {e: rig.master_of_slot(stores["A"].slots.slot_of_entry(e)).port for e in ENTRIES}
    assert len(set(master_of.values())) == 3, "the entries must fall on every master"
    outcomes: dict[tuple[str, int], dict[str, Outcome]] = defaultdict(dict)
    details: dict[tuple[str, int], str] = {}
    stop = threading.Event()
    errors: list[BaseException] = []

    def claimer(name: str) -> None:
        store = stores[name]
        try:
            while not stop.is_set():
                slot = int(time.time() * 1000) // 200 * 200
                requests = [ClaimRequest(entry=e, slot_ms=slot, max_late_ms=RETRY_S * 1000,
                                         task_id=f"{e}-{slot}", fingerprint="fp") for e in ENTRIES]
                deadline = time.monotonic() + RETRY_S
                while True:   # the engine's retry: the same runs again until they are answered
                    try:
                        results = store.claim(requests)
                        break
                    except StoreUnavailable:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.1)
                for r in results:
                    outcomes[(r.entry, r.slot_ms)][name] = r.outcome
                    details[(r.entry, r.slot_ms)] = r.detail
                time.sleep(0.05)
        except BaseException as exc:  # noqa: BLE001  (reported by the test thread)
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in stores]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        first = rig.master_of_slot(stores["A"].slots.slot_of_entry(ENTRIES[0]))
        failed_over_at = time.time()
        rig.failover(first)
        second = next(m for m in rig.masters() if m.port not in (first.port,)
                      and m.port in master_of.values())
        time.sleep(0.5)
        killed_at = time.time()
        rig.kill(second)
        promoted_at = time.time()
        wait_until(lambda: any(run[1] / 1000 > promoted_at + 0.5 and master_of[run[0]] == second.port
                               for run in list(outcomes)), RETRY_S, "claims answered after the promotion")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        for s in stores.values():
            s.close()
    assert not errors, errors
    twice = {run: by for run, by in outcomes.items()
             if sum(o is Outcome.WON for o in by.values()) > 1}
    assert not twice, f"runs won by two instances: {twice}"
    unconfirmed = [run for run, by in outcomes.items() if Outcome.UNCONFIRMED in by.values()]
    # an unconfirmed claim won in the store and was never sent: its record stays, so the other
    # instance is not told won, nor unconfirmed (a second winner), for that run; a master that
    # lost the record refuses the run by its new epoch
    second_winner = {run: outcomes[run] for run in unconfirmed
                     if [o.value for o in outcomes[run].values()].count("unconfirmed") > 1
                     or Outcome.WON in outcomes[run].values()}
    assert not second_winner, f"runs won by another instance than the unconfirmed one: "\
                              f"{second_winner}"
    moved = {first.port, second.port}
    after = {run for run in outcomes if run[1] / 1000 > promoted_at + 0.5}
    refused = [run for run in after if master_of[run[0]] in moved
               and Outcome.FORGOTTEN in outcomes[run].values()]
    assert refused and all("epoch changed" in details[run] for run in refused), \
        "the failed-over masters' slots are refused after the change, naming the epoch"
    third = [run for run in after if master_of[run[0]] not in moved]
    assert third and all(Outcome.WON in outcomes[run].values() for run in third), \
        "the third master's entries were still won after the failovers"
    won = sum(Outcome.WON in by.values() for by in outcomes.values())
    print(f"\n[redis-cluster failover] {len(outcomes)} runs, {won} won once, 0 twice, "
          f"{len(unconfirmed)} unconfirmed, {len(refused)} refused after the kill on the moved "
          f"masters; the kill's promotion took {promoted_at - killed_at:.1f} s, CLUSTER FAILOVER "
          f"{killed_at - failed_over_at:.1f} s before it")


def test_a_pause_is_checked_in_the_claim_on_the_entry_slot(tmp_path):
    """The pause lives in the entry's hash slot too: another instance's claim is refused at once,
    and a resume lets it win again; a newer write of the pause wins over an older one."""
    namespace = "pause-" + uuid.uuid4().hex[:6]
    url = store_url("redis-cluster", str(tmp_path))   # the tests' shared cluster
    a = open_store(url, namespace=namespace, instance_id="A")
    b = open_store(url, namespace=namespace, instance_id="B")
    try:
        a.prepare(["e"])
        backdate_memory_start(a, ["e"], 120_000)
        from celery_anarchon.stores.entry_store import Pause
        a.entries.set_pause("e", Pause(reason="maintenance", by="ops", at_ms=0), by="ops")
        slot = b.now_ms()
        got = b.claim([ClaimRequest("e", slot, 60_000, "t", "fp")])[0]
        assert got.outcome is Outcome.PAUSED and got.detail == "paused by ops: maintenance"
        a.entries.set_pause("e", None, by="ops")
        assert b.claim([ClaimRequest("e", slot + 1, 60_000, "t", "fp")])[0].outcome is Outcome.WON
        # an older version arriving late is ignored
        a.entries._slot_pause("e", 1, {"r": "stale", "b": "x", "t": "0"})
        assert b.claim([ClaimRequest("e", slot + 2, 60_000, "t", "fp")])[0].outcome is Outcome.WON
    finally:
        a.close()
        b.close()


def test_a_pause_is_confirmed_on_both_masters_slot_first_and_survives_a_failover(rig):
    """Entry-store writes are confirmed on the replicas as claims are, on each master they touch.
    The entry E falls on master M1, the namespace's record on M2. With M1's replica stopped
    (SIGSTOP, then CLIENT KILL TYPE replica) a pause raises StoreError (the entry's slot, written
    first, was not confirmed) and the namespace record is not written. With M2's replica stopped
    the pause raises too, after the entry's slot was confirmed: claims answer paused (the safe
    side); a resume then writes the namespace first, raises, and claims still answer paused. With
    every replica up the pause returns, and the replica promoted when M1 is killed answers the
    next claim paused."""
    namespace = "confirm-" + uuid.uuid4().hex[:6]
    options = {"confirm_timeout": 0.4}
    a = open_store(rig.url, namespace=namespace, instance_id="A", options=options)
    b = open_store(rig.url, namespace=namespace, instance_id="B", options=options)
    ns_slot = a.connection.client()[0].keyslot(a.namespace_keys["entries"])
    m2 = rig.master_of_slot(ns_slot)
    entry = next(e for e in (f"e{i}" for i in range(100))
                 if rig.master_of_slot(a.slots.slot_of_entry(e)).port != m2.port)
    m1 = rig.master_of_slot(a.slots.slot_of_entry(entry))
    r1, r2 = rig.replica_of(m1), rig.replica_of(m2)
    pause = Pause(reason="maintenance", by="ops", at_ms=0)
    slot = [0]

    def claimed() -> Outcome:
        slot[0] += 1
        return b.claim([ClaimRequest(entry, base + slot[0], 60_000, "t", "fp")])[0].outcome

    def stopped(replica, master):
        os.kill(replica.proc.pid, signal.SIGSTOP)
        rig.cli(master, "client", "kill", "type", "replica")

    def resumed(replica):
        os.kill(replica.proc.pid, signal.SIGCONT)
        rig.wait_ok()

    try:
        a.prepare([entry])
        backdate_memory_start(a, [entry], 120_000)
        base = a.now_ms()
        assert claimed() is Outcome.WON, "confirmed by M1's replica"
        a.entries.put_entry("x", "{}", by="ops", create=True)   # confirmed by M2's replica
        stopped(r1, m1)
        try:
            with pytest.raises(StoreError, match="may be lost if the master fails over now"):
                a.entries.set_pause(entry, pause, by="ops")
            assert entry not in a.entries.load_entries().entries, "the namespace record comes second"
        finally:
            resumed(r1)
        a.entries.set_pause(entry, None, by="ops")
        assert claimed() is Outcome.WON
        stopped(r2, m2)
        try:
            with pytest.raises(StoreError, match="may be lost"):
                a.entries.set_pause(entry, pause, by="ops")
            assert claimed() is Outcome.PAUSED, "the entry's slot is written (and confirmed) first"
            with pytest.raises(StoreError, match="may be lost"):
                a.entries.set_pause(entry, None, by="ops")
            assert claimed() is Outcome.PAUSED, "a resume lifts the claims' pause last"
        finally:
            resumed(r2)
        assert a.entries.set_pause(entry, pause, by="ops").pause is not None
        assert a.entries.load_entries().entries[entry].pause is not None
        rig.kill(m1)
        c = open_store(rig.url, namespace=namespace, instance_id="C", options=options)
        got = c.claim([ClaimRequest(entry, c.now_ms(), 60_000, "t", "fp")])[0]
        assert got.outcome is Outcome.PAUSED and got.detail == "paused by ops: maintenance", got
        c.close()
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("options, words", [
    ({"strategy": "script"}, "'lease' strategy only"),
    ({"master_name": "m"}, "sentinel:// URLs only"),
])
def test_options_a_cluster_cannot_use_are_refused(options, words):
    with pytest.raises(ConfigError, match=words):
        open_store("redis+cluster://127.0.0.1:7000/", namespace="n", instance_id="i",
                   options=options)


@pytest.mark.parametrize("url, words", [
    ("redis+cluster:///", "no startup node"),
    ("redis+cluster://127.0.0.1/", "is not host:port"),
    ("redis+cluster://127.0.0.1:7000/3", "only database 0"),
    ("redis+cluster://:secret@127.0.0.1:7000/?bogus=1", "'bogus' is not understood"),
])
def test_bad_cluster_urls_are_refused_with_the_fix(url, words):
    with pytest.raises(ConfigError, match=words) as caught:
        open_store(url, namespace="n", instance_id="i")
    assert "secret" not in str(caught.value)


def test_durability_auto_goes_on_when_a_master_turns_its_aof_off():
    """With durability "auto" a master that keeps an AOF is asked WAITAOF. One whose AOF is then
    turned off (CONFIG SET appendonly no, as a failover to a master without it would) refuses
    WAITAOF: its claims are still won, as on a single Redis, and its setup is read again, so it
    is not asked WAITAOF again; a claim is never reported unavailable for it."""
    import redis
    from ha_redis import REDIS8_BINARY
    from redis_cluster import RedisClusterRig
    if REDIS8_BINARY is None:
        if IN_CI:
            pytest.fail("the Redis 8 binary of .ci/redis8.sh is not built")
        pytest.skip("the Redis 8 binary of .ci/redis8.sh is not built")
    namespace = "aof-" + uuid.uuid4().hex[:6]
    with RedisClusterRig(binary=REDIS8_BINARY,
                         args=("--appendonly", "yes", "--appendfsync", "everysec")) as rig:
        store = open_store(rig.url, namespace=namespace, instance_id="A",
                           options={"claim_timeout": 3, "confirm_timeout": 1.5})
        try:
            store.prepare(ENTRIES)
            backdate_memory_start(store, ENTRIES, 120_000)
            masters = [redis.Redis(port=m.port) for m in rig.masters()]

            def waitaofs() -> int:
                return sum(m.info("commandstats").get("cmdstat_waitaof", {}).get("calls", 0)
                           for m in masters)

            def claim_all(slot: int) -> list[Outcome]:
                return [r.outcome for r in store.claim(
                    [ClaimRequest(e, slot, 60_000, f"t-{e}-{slot}", "fp") for e in ENTRIES])]

            slot = store.now_ms()
            assert claim_all(slot) == [Outcome.WON] * len(ENTRIES)
            assert waitaofs() >= 3, "auto on AOF masters waits for the fsync on each"
            for m in masters:
                m.config_set("appendonly", "no")
            assert claim_all(slot + 1) == [Outcome.WON] * len(ENTRIES)
            before = waitaofs()
            assert claim_all(slot + 2) == [Outcome.WON] * len(ENTRIES)
            assert waitaofs() == before, "a master without AOF is asked WAITAOF no more"
        finally:
            store.close()


def test_a_claim_whose_aof_fsync_is_not_confirmed_is_unconfirmed_on_every_master(tmp_path):
    """WAITAOF's reply decides on each master: the nodes' disk holds back its fsync
    (fsync_hold.FsyncHold; appendfsync everysec), so every master's WAITAOF 1 0 answers [0, 0]:
    every claim of the batch is UNCONFIRMED (never sent), naming the fsync. Once the disks have
    them, the retries are WON (docs/design.md "Amnesia": durable claim)."""
    import fsync_hold
    from ha_redis import REDIS8_BINARY
    from redis_cluster import RedisClusterRig
    for available, missing in ((REDIS8_BINARY is not None,
                                "the Redis 8 binary of .ci/redis8.sh is not built"),
                               (fsync_hold.compiler() is not None,
                                "the fsync hold needs a C compiler (cc)")):
        if not available:
            if IN_CI:
                pytest.fail(missing)
            pytest.skip(missing)
    hold = fsync_hold.FsyncHold(str(tmp_path))
    namespace = "aof-" + uuid.uuid4().hex[:6]
    with RedisClusterRig(binary=REDIS8_BINARY, env=hold.env,
                         args=("--appendonly", "yes", "--appendfsync", "everysec")) as rig:
        store = open_store(rig.url, namespace=namespace, instance_id="A",
                           options={"claim_timeout": 3, "confirm_timeout": 1.5})
        try:
            store.prepare(ENTRIES)
            backdate_memory_start(store, ENTRIES, 120_000)
            slot = store.now_ms()
            requests = [ClaimRequest(e, slot, 60_000, f"t-{e}-{slot}", "fp") for e in ENTRIES]
            hold.hold()
            try:
                results = store.claim(requests)
            finally:
                hold.release()
            assert [r.outcome for r in results] == [Outcome.UNCONFIRMED] * len(ENTRIES), results
            assert all("the AOF fsync was not confirmed" in r.detail for r in results), results
            assert [r.outcome for r in store.claim(requests)] == [Outcome.WON] * len(ENTRIES)
        finally:
            store.close()


def test_a_redis_url_pointed_at_a_cluster_node_says_to_use_the_cluster_store(tmp_path):
    """The plain Redis store on one node of a Cluster gets MOVED (or CROSSSLOT) replies: nothing
    is claimed, and the error names the fix (redis+cluster://)."""
    cluster = store_url("redis-cluster", str(tmp_path))   # the tests' shared cluster
    first = cluster.split("://", 1)[1].split(",", 1)[0].rstrip("/")
    store = open_store(f"redis://{first}/0", namespace="plain-" + uuid.uuid4().hex[:6],
                       instance_id="A")
    try:
        with pytest.raises(StoreUnavailable) as info:
            store.prepare([f"entry-{i}" for i in range(20)])
        assert "a node of a Redis Cluster" in str(info.value)
        assert "redis+cluster://" in str(info.value)
    finally:
        store.close()


#: ``CLUSTER NODES`` on the first node right after ``redis-cli --cluster create`` returned: the
#: replicas had been told whom to follow, but this node had not heard of it yet
TABLE_AFTER_CREATE = """\
c057f61e3f02a3bc59347d847825d349cfcc549e 127.0.0.1:15540@25540 master - 0 1796180757281 6 connected
ab5ea0715ebc3e96832305b4c6d18f768576e114 127.0.0.1:16791@26791 master - 0 1796180757583 3 connected 10923-16383
aa068daa0fda753f807c3d2857c24ae8465645d8 127.0.0.1:11453@21453 master - 0 1796180757583 2 connected 5461-10922
005023f1cf7ab2f4dfde870db8ffb29795eed775 127.0.0.1:20969@30969 master - 0 1796180757181 4 connected
52fe6e5b5a090fbf8cdfd9f0942c22a28f4af2d0 127.0.0.1:17342@27342 myself,master - 0 1796180757000 1 connected 0-5460
a4b0257e9d8a60a005e70628c819e9b8b5c14131 127.0.0.1:17238@27238 master - 0 1796180757180 5 connected
"""


def test_the_cluster_rig_is_not_ready_while_a_live_node_is_a_master_without_slots():
    """Right after ``--cluster create`` (and after a failed master comes back) a replica shows for a
    few hundred milliseconds as a master serving no slot: the rig is not ready then, or a test
    asking for a master's replica finds none. Once each live node is a master with slots or a
    replica, it is; a dead node's row does not count."""
    from redis_cluster import node_port, unsettled
    table = [line.split() for line in TABLE_AFTER_CREATE.splitlines()]
    live = {15540, 16791, 11453, 20969, 17342, 17238}
    assert unsettled(table, live) == "the node on port 15540 is a master serving no slot"
    follows = {15540: "ab5ea0715ebc3e96832305b4c6d18f768576e114",
               20969: "aa068daa0fda753f807c3d2857c24ae8465645d8",
               17238: "52fe6e5b5a090fbf8cdfd9f0942c22a28f4af2d0"}
    settled = [row[:2] + ["slave", follows[node_port(row)]] + row[4:8]
               if node_port(row) in follows else row for row in table]
    assert unsettled(settled, live) is None
    assert unsettled(table, live - {15540, 20969, 17238}) is None, "the dead nodes' rows"
