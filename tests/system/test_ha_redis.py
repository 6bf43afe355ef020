"""A replicated Redis that loses writes never lets a run be won twice (docs/design.md "Amnesia":
a failover to a lagging replica, a restart from a snapshot, a split).

Every server here is the test's own (benchmarks/ha_redis.py: a master, replicas through proxies
that can stop forwarding, Sentinels), on free loopback ports, never the shared ones. Each test
costs a few seconds: the rig starts in about 0.2 s (2.5 s with Sentinels) and every wait polls a
condition with a deadline.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import pytest

from celery_anarchon.errors import ConfigError, StoreError
from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import LATENESS_TOLERANCE_MS, ClaimRequest, Outcome, RunEvent
from celery_anarchon.stores.entry_store import Pause

from stores_support import wait_until
from backends import backdate_memory_start
from ha_support import assert_release_lost_is_never_taken_over, need
from helpers import prepared, request_run

import fsync_hold  # noqa: E402  (benchmarks/: conftest puts it on the path)
import ha_redis  # noqa: E402
RedisHA = ha_redis.RedisHA

@pytest.fixture(autouse=True)
def redis_server_binary():
    """Every test here starts servers of its own: skipped without redis-server, failed under CI."""
    need(shutil.which("redis-server") is not None, "redis-server is not installed (apt-get install "
         "redis-server): the tests here start servers of their own")


def need_redis8() -> str:
    """The Redis >= 8.6 binary of .ci/redis8.sh: the test is skipped without it, failed under CI."""
    need(ha_redis.REDIS8_BINARY is not None,
         "the Redis 8 binary of .ci/redis8.sh is not built (run .ci/redis8.sh): the idmp strategy "
         "needs Redis >= 8.6, WAITAOF >= 7.2")
    return ha_redis.REDIS8_BINARY


#: short confirmation waits keep each test to seconds (the default is 2 s)
CONFIRM = 0.4

#: every Redis strategy; idmp needs Redis >= 8.6 (the binary .ci/redis8.sh builds)
STRATEGIES = ("lease", "stream-id", "script", "idmp")


def rig(strategy: str, **kwargs) -> RedisHA:
    """A rig that runs ``strategy`` (idmp: on the Redis 8 binary, :func:`need_redis8`)."""
    if strategy == "idmp":
        kwargs["binary"] = need_redis8()
    return RedisHA(**kwargs)


def store(url, instance, namespace, **options):
    return open_store(url, namespace=namespace, instance_id=instance,
                      options={"claim_timeout": 3, **options})


def req(slot_ms, entry="e"):
    return ClaimRequest(entry=entry, slot_ms=slot_ms, max_late_ms=60_000, task_id=f"t-{slot_ms}",
                        fingerprint="fp")


def claim(s, slot_ms, entry="e"):
    return s.claim([req(slot_ms, entry)])[0]


def after_restart(s, begun_ms: int) -> int:
    """The first slot ``s`` may win once its memory (re)started at ``begun_ms`` (store clock)."""
    wait_until(lambda: s.now_ms() > begun_ms + 20, 5, "the store clock to move")
    return begun_ms + LATENESS_TOLERANCE_MS + 1


def run_id(node) -> str:
    return node.info("server")["run_id"]


# -- (a) failover to a replica that missed the claim ----------------------------------------------

@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("durability", ["auto", "none"])
def test_failover_to_lagging_replica_never_rewins(durability, strategy, namespace):
    """A wins X on the master while the replica lags; the master dies and the replica is promoted.
    B's claim of X must not win. With durability on, A was never told WON (UNCONFIRMED: it does
    not send); with durability "none" the promoted replica's new epoch makes X forgotten."""
    with rig(strategy, replicas=1) as ha:
        a = prepared(store(ha.url, "A", namespace, durability=durability, confirm_timeout=CONFIRM,
                           strategy=strategy))
        replica = ha.replicas[0]
        ha.wait_synced(replica)
        old_epoch, new_epoch = run_id(ha.master), run_id(replica)
        ha.lag(replica)
        slot = a.now_ms()
        won = claim(a, slot)
        if durability == "none":
            assert won.outcome is Outcome.WON
        else:
            assert won.outcome is Outcome.UNCONFIRMED, won
            assert "1 replica" in won.detail
            assert a.history.read("e")[0].event is RunEvent.UNCONFIRMED
        ha.kill(ha.master)
        ha.promote(replica)
        b = store(ha.url, "B", namespace, durability=durability, confirm_timeout=CONFIRM,
                  strategy=strategy)
        again = claim(b, slot)
        assert again.outcome is Outcome.FORGOTTEN, again
        assert old_epoch in again.detail and new_epoch in again.detail
        # the schedule goes on: a slot after the epoch change is won (no replica left: confirmed)
        assert claim(b, after_restart(b, again.store_ms)).outcome is Outcome.WON


# -- (b) restart from an RDB snapshot ------------------------------------------------------------------

@pytest.mark.parametrize("strategy", STRATEGIES)
def test_restart_from_an_rdb_snapshot_never_rewins(strategy, namespace):
    """``save 3600 1``, no AOF: A wins X after the last snapshot, the server crashes and restarts
    from the snapshot (which holds the memory-start notes, not X). B must not win X: the restart
    is a new epoch, so the memory restarts at B's first claim."""
    with rig(strategy, replicas=0, rdb=True) as ha:
        a = prepared(store(ha.url, "A", namespace, strategy=strategy))
        ha.snapshot()
        slot = a.now_ms()
        assert claim(a, slot).outcome is Outcome.WON
        ha.kill(ha.master)
        ha.restart(ha.master)
        b = store(ha.url, "B", namespace, strategy=strategy)
        again = claim(b, slot)
        assert again.outcome is Outcome.FORGOTTEN, again
        assert "epoch" in again.detail
        assert b.history.read("e")[0].event is RunEvent.FORGOTTEN


# -- durable claims ------------------------------------------------------------------------------------

@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_won_again_retry_confirms_on_its_own_connection(strategy, namespace):
    """WAIT covers only the writes of its connection: a retry that reads its own claim back must
    write, or a new connection would 'confirm' a claim the replica never got (spec point 2). The
    store re-confirms: UNCONFIRMED while the replica lags, WON once it has the claim."""
    with rig(strategy, replicas=1) as ha:
        a = prepared(store(ha.url, "A", namespace, confirm_timeout=CONFIRM, strategy=strategy))
        replica = ha.replicas[0]
        ha.wait_synced(replica)
        ha.lag(replica)
        slot = a.now_ms()
        assert claim(a, slot).outcome is Outcome.UNCONFIRMED
        a.close()  # the retry comes on a new connection, with no write of its own yet
        assert claim(a, slot).outcome is Outcome.UNCONFIRMED
        ha.catch_up(replica)
        a.close()
        assert claim(a, slot).outcome is Outcome.WON
        assert str(slot) in (replica.command("HGET", a.keys_of("e")["history"], str(slot)) or "")


def test_a_replica_that_is_down_does_not_stop_the_schedule(namespace):
    """durability "auto" waits for the replicas the master has connected, read per batch: a
    replica that dies costs at most one batch a wait of confirm_timeout, then claims are confirmed
    by the others; the remaining replica is still waited for. When the last one is gone too, the
    schedule pauses (unconfirmed) for at most replica_grace after replicas last confirmed claims,
    then the master goes on alone. (A grace of 6 s: the paused claim below comes about 1.5 s after
    the last confirmed one, with seconds to spare on a loaded machine.)"""
    grace = 6.0
    with RedisHA(replicas=2) as ha:
        a = prepared(store(ha.url, "A", namespace, confirm_timeout=CONFIRM, replica_grace=grace))
        strict = store(ha.url, "S", namespace, durability="replica", min_replicas=2,
                       confirm_timeout=CONFIRM)
        base = a.now_ms()
        assert claim(a, base).outcome is Outcome.WON
        ha.kill(ha.replicas[1])
        wait_until(lambda: ha.master.info("replication")["connected_slaves"] == 1, 10,
                   "the master to drop the dead replica")
        outcomes = [claim(a, base + i).outcome for i in range(1, 6)]
        assert outcomes == [Outcome.WON] * 5
        # an explicit demand for two replicas is not met: a possible miss, never a silent send
        assert claim(strict, base + 10).outcome is Outcome.UNCONFIRMED
        ha.lag(ha.replicas[0])
        assert claim(a, base + 20).outcome is Outcome.UNCONFIRMED, "the live replica is waited for"
        ha.catch_up(ha.replicas[0])  # its proxy passes the connection's end on
        ha.kill(ha.replicas[0])
        wait_until(lambda: ha.master.info("replication")["connected_slaves"] == 0, 10,
                   "the master to drop the last replica")
        paused = claim(a, base + 30)
        assert paused.outcome is Outcome.UNCONFIRMED, "within replica_grace one replica is needed"
        assert "replica_grace" in paused.detail, paused.detail
        seen = int(ha.master.command("HGET", a.store_key, "replicas_at"))
        wait_until(lambda: a.now_ms() > seen + grace * 1000, 10, "replica_grace to pass")
        assert claim(a, base + 40).outcome is Outcome.WON, "after the grace the master goes on alone"


def test_a_master_without_the_replicas_it_needs_answers_unconfirmed_without_waiting(namespace):
    """Within replica_grace a master whose replicas are gone (a replica promoted in its place, a
    failover in a Cluster) needs one that is not online: a WAIT could only time out, and waiting
    confirm_timeout on every batch stalled every beat (each chunk waited it, so chunks shrank and
    the other masters' runs went late too). Once the master says none is online, its claims
    answer UNCONFIRMED at once: no WAIT is sent for them."""
    with RedisHA(replicas=1) as ha:
        a = prepared(store(ha.url, "A", namespace, confirm_timeout=CONFIRM, replica_grace=60))
        base = a.now_ms()
        assert claim(a, base).outcome is Outcome.WON
        ha.kill(ha.replicas[0])
        wait_until(lambda: ha.master.info("replication")["connected_slaves"] == 0, 10,
                   "the master to drop its replica")

        def waits() -> int:
            return ha.master.info("commandstats").get("cmdstat_wait", {}).get("calls", 0)

        first = claim(a, base + 1)   # asks for the replica it had: the one wait that learns
        assert first.outcome is Outcome.UNCONFIRMED and "replica_grace" in first.detail, first
        before = waits()
        for i in range(2, 7):
            result = claim(a, base + i)
            assert result.outcome is Outcome.UNCONFIRMED, result
            assert "0 of 1 replica acknowledged" in result.detail, result.detail
        assert waits() == before, "no WAIT for a replica that is not online"


def test_an_old_master_that_lost_its_replicas_never_confirms_alone(namespace):
    """A split brain: the replicas leave the master (one is promoted, the other follows it) while
    the master still takes writes, and a client still on it claims. With durability "auto" the
    master has no replica to wait for, but the store recorded that replicas confirmed claims a
    moment ago: within replica_grace such a claim needs one replica, so it answers UNCONFIRMED
    (not sent: it would be lost when the old master resyncs), never WON."""
    with RedisHA(replicas=2) as ha:
        old, new, other = ha.master, ha.replicas[0], ha.replicas[1]
        a = prepared(store(ha.url, "A", namespace, confirm_timeout=CONFIRM))
        base = a.now_ms()
        assert claim(a, base).outcome is Outcome.WON, "confirmed by both replicas"
        ha.promote(new)
        other.command("REPLICAOF", "127.0.0.1", str(new.port))
        wait_until(lambda: old.info("replication")["connected_slaves"] == 0, 10,
                   "the old master to lose both replicas")
        assert old.info("replication")["role"] == "master", "it still takes writes"
        won = claim(a, base + 1)  # a's connection is still on the old master
        assert won.outcome is Outcome.UNCONFIRMED, won
        assert "0 of 1 replica" in won.detail, won.detail
        assert a.history.read("e")[0].event is RunEvent.UNCONFIRMED


def test_a_split_that_leaves_each_side_one_replica_confirms_on_neither(namespace):
    """Three replicas, then a split {M, R3} | {R1, R2}: R1 is promoted and R2 follows it, R3 stays
    with the old master M. Each side has one replica online, so counting only the replicas online
    now, both would confirm the same slot. The store recorded that 3 replicas confirmed claims a
    moment ago: within replica_grace a claim needs a majority of them (2), so both sides answer
    UNCONFIRMED (a possible miss), never WON twice."""
    with RedisHA(replicas=3) as ha:
        old, (r1, r2, r3) = ha.master, ha.replicas
        a = prepared(store(ha.url, "A", namespace, confirm_timeout=CONFIRM))
        base = a.now_ms()
        assert claim(a, base).outcome is Outcome.WON, "confirmed by the three replicas"
        for node in (r1, r2, r3):
            ha.wait_synced(node)
        ha.promote(r1)
        r2.command("REPLICAOF", "127.0.0.1", str(r1.port))
        wait_until(lambda: old.info("replication")["connected_slaves"] == 1, 10,
                   "the old master to keep only R3")
        wait_until(lambda: r1.info("replication").get("slave0", {}).get("state") == "online", 10,
                   "R2 to replicate the promoted R1")
        b = store(r1.url, "B", namespace, confirm_timeout=CONFIRM)
        backdate_memory_start(b, ["e"], 120_000)  # as once the new epoch's first 10 s have passed
        slot = base + 1
        on_old, on_new = claim(a, slot), claim(b, slot)
        assert on_old.outcome is Outcome.UNCONFIRMED, on_old
        assert on_new.outcome is Outcome.UNCONFIRMED, on_new
        for result in (on_old, on_new):
            assert "1 of 2 replicas" in result.detail and "3 replicas" in result.detail, result.detail


def test_durability_replica_without_replicas_warns_and_never_sends(namespace):
    """An explicit demand for a replica that is not there: a start-up warning, then every claim is
    UNCONFIRMED (a possible miss) rather than sent unconfirmed; "auto" warns that nothing keeps
    the newest claims (no replica, no AOF)."""
    with RedisHA(replicas=0) as ha:
        s = store(ha.url, "A", namespace, durability="replica", confirm_timeout=CONFIRM)
        text = " ".join(s.prepare(["e"]))
        assert "durability='replica'" in text and "0 connected" in text
        backdate_memory_start(s, ["e"], 120_000)
        assert claim(s, s.now_ms()).outcome is Outcome.UNCONFIRMED
        text = " ".join(store(ha.url, "B", namespace).prepare(["e"]))
        assert "no replica" in text and "appendfsync always" in text


def redis8_with_aof() -> RedisHA:
    """A Redis 8 master of the test's own, without replicas, keeping an AOF (fsync every second)."""
    return RedisHA(replicas=0, binary=need_redis8(),
                   args=("--appendonly", "yes", "--appendfsync", "everysec"))


def test_aof_durability_waits_for_the_fsync_on_redis_7_2_and_later(namespace):
    with redis8_with_aof() as ha:
        a = prepared(store(ha.url, "A", namespace, confirm_timeout=1.5))
        assert claim(a, a.now_ms()).outcome is Outcome.WON
        stats = ha.master.info("commandstats")
        assert stats["cmdstat_waitaof"]["calls"] >= 1, "auto on an AOF server waits for the fsync"
        explicit = prepared(store(ha.url, "B", namespace, durability="aof", confirm_timeout=1.5))
        assert claim(explicit, explicit.now_ms() + 5).outcome is Outcome.WON


def test_auto_durability_goes_on_when_the_aof_is_turned_off(namespace):
    """A master whose AOF is turned off at run time (CONFIG SET appendonly no, as a failover to a
    master without it would) refuses WAITAOF: with "auto" the claim is still won and the setup is
    read again, so WAITAOF is not asked again (the Cluster store: test_redis_cluster.py)."""
    with redis8_with_aof() as ha:
        a = prepared(store(ha.url, "A", namespace, confirm_timeout=1.5))

        def waitaofs() -> int:
            return ha.master.info("commandstats").get("cmdstat_waitaof", {}).get("calls", 0)

        slot = a.now_ms()
        assert claim(a, slot).outcome is Outcome.WON and waitaofs() >= 1
        ha.master.command("CONFIG", "SET", "appendonly", "no")
        assert claim(a, slot + 1).outcome is Outcome.WON
        before = waitaofs()
        assert claim(a, slot + 2).outcome is Outcome.WON
        assert waitaofs() == before, "a server without AOF is asked WAITAOF no more"


#: WAITAOF's wait: above the one second an ``appendfsync everysec`` fsync may take to come
AOF_CONFIRM = 1.5


@pytest.mark.parametrize("durability, strategy",
                         [("auto", s) for s in STRATEGIES] + [("aof", "lease")])
def test_a_claim_whose_aof_fsync_is_not_confirmed_is_unconfirmed(durability, strategy, namespace,
                                                                tmp_path):
    """WAITAOF's reply decides: the master's disk holds back its fsync (fsync_hold.FsyncHold, an
    LD_PRELOAD that blocks fsync until released; appendfsync everysec), so WAITAOF 1 0 answers
    [0, 0] after confirm_timeout. A claim is then UNCONFIRMED (never sent), and so is its retry
    (lease); an entry-store write raises StoreError (lease). Once the disk has it, the retry is
    WON (docs/design.md "Amnesia": durable claim)."""
    need(fsync_hold.compiler() is not None, "the fsync hold needs a C compiler (cc)")
    hold = fsync_hold.FsyncHold(str(tmp_path))
    with RedisHA(replicas=0, binary=need_redis8(), env=hold.env,
                 args=("--appendonly", "yes", "--appendfsync", "everysec")) as ha:
        a = prepared(store(ha.url, "A", namespace, durability=durability, strategy=strategy,
                           confirm_timeout=AOF_CONFIRM))
        hold.hold()
        try:
            slot = a.now_ms()
            result = claim(a, slot)
            assert result.outcome is Outcome.UNCONFIRMED, result
            assert "the AOF fsync was not confirmed" in result.detail, result
            assert a.history.read("e")[0].event is RunEvent.UNCONFIRMED
            if strategy == "lease":
                assert claim(a, slot).outcome is Outcome.UNCONFIRMED, "a retry is not a send"
                with pytest.raises(StoreError, match="the AOF fsync was not confirmed"):
                    pause_of(a, "e")
        finally:
            hold.release()
        assert claim(a, slot).outcome is Outcome.WON, "confirmed once the disk has it"


def test_aof_durability_on_a_server_without_waitaof_is_a_config_error(namespace):
    with RedisHA(replicas=0, args=("--appendonly", "yes")) as ha:
        version = ha.master.info("server")["redis_version"]
        if tuple(int(p) for p in version.split(".")[:2]) >= (7, 2):
            pytest.skip(f"redis-server on PATH is {version}: it has WAITAOF")
        with pytest.raises(ConfigError, match="WAITAOF.*7.2"):
            store(ha.url, "A", namespace, durability="aof").prepare(["e"])


# -- eviction ----------------------------------------------------------------------------------------

def test_an_evicting_maxmemory_policy_is_a_config_error(namespace):
    with RedisHA(replicas=0) as ha:
        ha.master.command("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
        with pytest.raises(ConfigError, match="maxmemory-policy.*allkeys-lru.*noeviction"):
            store(ha.url, "A", namespace).prepare(["e"])
        warnings = store(ha.url, "B", namespace, allow_eviction=True).prepare(["e"])
        assert any("allkeys-lru" in w for w in warnings)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_an_evicting_policy_set_after_start_up_refuses_every_claim(strategy, namespace):
    """prepare() saw noeviction; then the policy becomes allkeys-lru (CONFIG SET on a running
    server). The claim script reads the policy itself, so the next claim is refused (forgotten,
    a possible miss) with a detail naming the setting and the fix, never won over an evicted
    claim; an instance with allow_eviction=True goes on (it gave up the guarantee)."""
    with rig(strategy, replicas=0) as ha:
        a = prepared(store(ha.url, "A", namespace, strategy=strategy))
        assert claim(a, a.now_ms()).outcome is Outcome.WON
        ha.master.command("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
        refused = claim(a, a.now_ms() + 1)
        assert refused.outcome is Outcome.FORGOTTEN, refused
        for words in ("maxmemory-policy", "allkeys-lru", "noeviction", "volatile-", "allow_eviction"):
            assert words in refused.detail, refused.detail
        assert a.history.read("e")[0].event is RunEvent.FORGOTTEN
        b = store(ha.url, "B", namespace, strategy=strategy, allow_eviction=True)
        assert claim(b, b.now_ms() + 2).outcome is Outcome.WON


# -- (i) Sentinel ----------------------------------------------------------------------------------------

def test_sentinel_failover_end_to_end_through_the_store_api(namespace):
    """Stores opened with ``sentinel://`` as users configure them: a confirmed claim survives the
    master's SIGKILL and Sentinel's promotion (B reads A's win back), the new epoch refuses the
    slots around the failover, and claims go on on the new master; then once more with
    ``SENTINEL FAILOVER``."""
    with RedisHA(replicas=2, sentinels=3) as ha:
        options = {"master_name": ha.master_name, "confirm_timeout": CONFIRM}
        a = prepared(store(ha.sentinel_url, "A", namespace, **options))
        b = store(ha.sentinel_url, "B", namespace, **options)
        slot = a.now_ms()
        assert claim(a, slot).outcome is Outcome.WON
        old = ha.master
        ha.kill(old)
        ha.wait_new_master(old)
        lost = claim(b, slot)
        assert lost.outcome is Outcome.OTHER_WON and lost.winner == "A", lost
        assert claim(a, slot).outcome is Outcome.WON, "the winner's retry reads its win back"
        around = claim(b, b.now_ms())
        assert around.outcome is Outcome.FORGOTTEN and "epoch" in around.detail
        later = after_restart(b, lost.store_ms)
        assert claim(b, later).outcome is Outcome.WON
        assert claim(a, later).outcome is Outcome.OTHER_WON
        ha.failover()
        assert claim(a, later).outcome is Outcome.OTHER_WON, "a confirmed claim survives promotion"
        assert claim(b, b.now_ms()).outcome is Outcome.FORGOTTEN


def test_a_takeover_is_confirmed_like_a_claim(namespace):
    """A takeover answered TAKEN sends the next attempt: with durability on it is confirmed in the
    same round trip, and one not confirmed answers REFUSED (nothing sent); the same instance's
    retry with the same expected token is TAKEN once the replica has it."""
    from celery_anarchon.stores.base import LeaseTerms, TakeoverOutcome
    with RedisHA(replicas=1) as ha:
        a = prepared(store(ha.url, "A", namespace, confirm_timeout=CONFIRM))
        b = store(ha.url, "B", namespace, confirm_timeout=CONFIRM)
        slot = a.now_ms()
        request = ClaimRequest(entry="e", slot_ms=slot, max_late_ms=60_000, task_id="t",
                               fingerprint="fp", lease=LeaseTerms(queue_timeout_ms=200))
        assert a.claim([request])[0].outcome is Outcome.WON
        run = wait_until(lambda: a.leases.expired_runs(["e"]), 10, "the queue deadline")[0]
        ha.lag(ha.replicas[0])
        outcome, record = b.leases.take_over("e", slot, run.token, queue_timeout_ms=60_000, max_attempts=3)
        assert outcome is TakeoverOutcome.REFUSED and record.attempt == 2 and record.owner == "B"
        ha.catch_up(ha.replicas[0])
        outcome, again = b.leases.take_over("e", slot, run.token, queue_timeout_ms=60_000, max_attempts=3)
        assert outcome is TakeoverOutcome.TAKEN and again.token == record.token


# -- leases across a failover ------------------------------------------------------------------

def test_a_release_lost_in_a_failover_is_never_taken_over(namespace):
    """The runner adopts (the replica has it), then releases on the master while the replica
    lags; the master dies and the lagging replica is promoted: its record says started, and the
    lease runs out. B finds the run expired, but the store lost writes to it (a new epoch): the
    run is not taken over (recorded given up, a possible miss), so its body never runs twice."""
    from celery_anarchon.stores.base import LeaseTerms
    with RedisHA(replicas=1) as ha:
        a = prepared(store(ha.url, "A", namespace, confirm_timeout=CONFIRM))
        worker = store(ha.url, "worker", namespace, confirm_timeout=CONFIRM)
        replica = ha.replicas[0]
        slot = a.now_ms()
        request = ClaimRequest(entry="e", slot_ms=slot, max_late_ms=60_000, task_id="t",
                               fingerprint="fp", lease=LeaseTerms(queue_timeout_ms=60_000))
        assert a.claim([request])[0].outcome is Outcome.WON
        adopted, run = worker.leases.adopt("e", slot, "w1", 500)
        assert adopted
        ha.wait_synced(replica)
        ha.lag(replica)
        assert worker.leases.release("e", slot, run.token)
        ha.kill(ha.master)
        ha.promote(replica)
        b = store(ha.url, "B", namespace, confirm_timeout=CONFIRM)
        note = assert_release_lost_is_never_taken_over(b, "e", slot, run)
        assert run_id(replica) in note.detail, "the detail names the epoch change"


# -- entry-store writes: confirmed as a durable claim is ------------------------------------------

#: what an entry-store write not confirmed by the replicas raises
NOT_CONFIRMED = "may be lost if the master fails over now"


def pause_of(s, entry: str):
    return s.entries.set_pause(entry, Pause(reason="maintenance", by="ops", at_ms=0), by="ops")


def celery_cli(url: str, namespace: str, *args: str) -> subprocess.CompletedProcess:
    """``celery -A cli_app anarchon <args>`` (tests/support/apps/cli_app.py) against ``url``."""
    from paths import APPS as apps
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(apps), os.environ.get("PYTHONPATH", "")]),
           "ANARCHON_CLI_STORE": url, "ANARCHON_CLI_NAMESPACE": namespace}
    return subprocess.run([sys.executable, "-m", "celery", "-A", "cli_app", "anarchon", *args],
                          env=env, capture_output=True, text=True, timeout=60, cwd=apps)


def test_an_entry_write_the_replica_did_not_confirm_raises(namespace):
    """The break found on the store: the replica R stopped (SIGSTOP) and cut off (CLIENT KILL TYPE
    replica), a pause answered success from the master alone; the master died and R, promoted
    without it, ran the entry. Every entry-store write (add, update, remove, pause, resume,
    run-now) is confirmed as a durable claim is: not confirmed within confirm_timeout (replicas
    confirmed claims within replica_grace, so one is needed) it raises StoreError, through the
    store, the Python API and the CLI (exit 1, no traceback). With durability "none" nothing
    changes. The promoted R indeed never got the pause: the error told the truth."""
    with RedisHA(replicas=1) as ha:
        replica = ha.replicas[0]
        a = prepared(store(ha.url, "A", namespace, confirm_timeout=CONFIRM), "e3")
        assert claim(a, a.now_ms(), "e3").outcome is Outcome.WON, "confirmed by the replica"
        os.kill(replica.proc.pid, signal.SIGSTOP)
        try:
            ha.master.command("CLIENT", "KILL", "TYPE", "replica")
            wait_until(lambda: ha.master.info("replication")["connected_slaves"] == 0, 5,
                       "the master to drop its replica")
            with pytest.raises(StoreError, match=NOT_CONFIRMED) as caught:
                pause_of(a, "e3")
            for words in ("pause", "1 replica", f"{CONFIRM:g} s", "repeat it"):
                assert words in str(caught.value), str(caught.value)
            definition = json.dumps({"task": "t", "schedule": {"every": 60}})
            writes = {
                "add": lambda: a.entries.put_entry("x", definition, by="ops", create=True),
                "update": lambda: a.entries.put_entry("x", definition, by="ops", create=False),
                "run-now": lambda: request_run(a, "x", "r1", by="ops"),
                "resume": lambda: a.entries.set_pause("e3", None, by="ops"),
                "remove": lambda: a.entries.remove_entry("x", by="ops"),
            }
            for what, write in writes.items():
                with pytest.raises(StoreError, match=NOT_CONFIRMED):
                    write()
            done = celery_cli(ha.url, namespace, "pause", "config-entry")
            assert done.returncode == 1, (done.stdout, done.stderr)
            assert done.stderr.startswith("Error: ") and NOT_CONFIRMED in done.stderr, done.stderr
            assert "Traceback" not in done.stderr
            lone = store(ha.url, "L", namespace, durability="none")
            assert pause_of(lone, "other").pause is not None, "durability none: answered as before"
            ha.kill(ha.master)
        finally:
            os.kill(replica.proc.pid, signal.SIGCONT)
        ha.promote(replica)
        # durability "none": R, promoted without replicas, confirms nothing within replica_grace
        b = store(ha.url, "B", namespace, durability="none")
        stored = b.entries.load_entries().entries.get("e3")
        assert stored is None or stored.pause is None, f"R has the pause: {stored}"
        first = claim(b, b.now_ms(), "e3")
        assert first.outcome is Outcome.FORGOTTEN, first        # R's epoch: the promotion
        # ...and past the slots it refuses, R runs the entry: it never got the pause
        assert claim(b, after_restart(b, first.store_ms), "e3").outcome is Outcome.WON


def test_a_confirmed_pause_survives_a_sentinel_failover(namespace):
    """With the replica up a pause is confirmed on it before it returns (one WAIT): the replica,
    cut off right after and promoted by Sentinel once the master is killed, answers the next
    claim ``paused``."""
    with RedisHA(replicas=1, sentinels=3) as ha:
        options = {"master_name": ha.master_name, "confirm_timeout": CONFIRM}
        a = prepared(store(ha.sentinel_url, "A", namespace, **options), "e3")
        waits = ha.master.info("commandstats").get("cmdstat_wait", {}).get("calls", 0)
        assert pause_of(a, "e3").pause is not None
        assert ha.master.info("commandstats")["cmdstat_wait"]["calls"] > waits
        ha.lag(ha.replicas[0])   # nothing written after the pause returned reaches it
        old = ha.master
        ha.kill(old)
        ha.wait_new_master(old)
        b = store(ha.sentinel_url, "B", namespace, **options)
        got = claim(b, b.now_ms(), "e3")
        assert got.outcome is Outcome.PAUSED and got.detail == "paused by ops: maintenance", got


def test_an_entry_write_is_never_run_twice_when_its_confirmation_script_is_not_loaded(namespace):
    """The write and its confirmation go in one pipeline: on a server that has the write's script
    but not the confirmation's (NOSCRIPT), only the confirmation is sent again, so an add is
    answered as added, never "exists already" by its own second run."""
    with RedisHA(replicas=0) as ha:
        s = store(ha.url, "A", namespace)
        ha.master.command("SCRIPT", "LOAD", s.connection.client()[1]["entry_put"].script)
        stored = s.entries.put_entry("x", "{}", by="ops", create=True)
        assert stored.definition == "{}" and stored.version == 1
