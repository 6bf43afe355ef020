"""PostgreSQL with streaming standbys (benchmarks/ha_postgres.py, servers of the test's own):
a promotion never reopens a won run, and with a synchronous standby a claim is sent only once the
standby has it (docs/stores.md, "PostgreSQL"; docs/design.md "Amnesia": durable claim, epoch).

Each test starts its own primary and standby (about 1.5 s) and breaks them."""
from __future__ import annotations

import time

import pytest

from celery_anarchon.stores.base import Outcome, RunEvent

from ha_support import (
    assert_release_lost_is_never_taken_over, need, opened_stores, rig_fixture,
)
from stores_support import wait_until
from helpers import prepared
from claim_helpers import after_memory_restart, fresh_slot, req

import ha_postgres  # noqa: E402  (benchmarks/: conftest puts it on the path)


@pytest.fixture(autouse=True)
def rig_binaries():
    """Every test here starts servers of its own: skipped without them, failed under CI."""
    need(ha_postgres.available(), "the PostgreSQL rig needs the server binaries, runuser and root")


opened = opened_stores()
async_rig = rig_fixture(lambda: ha_postgres.PostgresHA(standbys=1))
sync_rig = rig_fixture(lambda: ha_postgres.PostgresHA(standbys=1, synchronous="FIRST 1 (standby0)"))


def test_promoted_lagging_standby_never_rewins_a_won_run(async_rig, opened, namespace):
    """A wins X on the primary while the asynchronous standby lags; the primary crashes and the
    standby is promoted without X. B's claim of X through the promoted standby is refused
    (forgotten: the timeline changed), never won (docs/design.md "Amnesia": a promoted
    asynchronous standby)."""
    ha = async_rig
    a = opened(ha.url(), namespace, "A")
    warnings = a.prepare(["e"])
    assert any("asynchronous" in w and "synchronous_standby_names" in w for w in warnings), warnings
    # it protects against a promotion after the primary died, not against a split brain
    (warning,) = [w for w in warnings if "asynchronous" in w]
    assert "split brain" in warning and "fence the old primary" in warning, warning
    assert "never a second run" not in warning, warning
    prepared(a)
    ha.wait_replayed()                    # the standby has the store's notes, not what follows
    ha.pause_replication()
    slot = fresh_slot(a)
    assert a.claim([req("e", slot)])[0].outcome is Outcome.WON
    a.close()
    ha.kill_primary()
    ha.promote()

    b = opened(ha.url(), namespace, "B")
    again = b.claim([req("e", slot)])[0]
    assert again.outcome is not Outcome.WON, again
    assert again.outcome is Outcome.FORGOTTEN and "timeline" in again.detail, again
    # the memory began again at the promotion: later runs are claimed as usual
    assert b.claim([req("e", after_memory_restart(b))])[0].outcome is Outcome.WON


def test_claim_tables_restored_on_a_new_server_on_the_same_timeline_never_rewin_a_run(
        opened, namespace):
    """The claim tables are backed up (pg_dump), A wins X, then the server is lost and the backup
    is restored on a new one (another initdb: another system identifier, on timeline 1 like the
    old server). The restored tables lack X and their memory start is old; the timeline alone
    cannot tell the servers apart. B's claim of X is refused (forgotten: the system identifier
    changed), never won (docs/design.md "Amnesia": epoch)."""
    with ha_postgres.PostgresHA(standbys=0) as ha:
        a = opened(ha.url(), namespace, "A")
        prepared(a)
        assert a.claim([req("e", fresh_slot(a))])[0].outcome is Outcome.WON
        dump = ha.dump_tables()
        slot = fresh_slot(a) + 1
        assert a.claim([req("e", slot)])[0].outcome is Outcome.WON
        old_system, old_timeline = ha.epoch()
        a.close()
        ha.restore_on_new_server(dump)
        new_system, new_timeline = ha.epoch()
        assert new_timeline == old_timeline and new_system != old_system, (
            "the rig must give another server on the same timeline")

        b = opened(ha.url(), namespace, "B")
        again = b.claim([req("e", slot)])[0]
        assert again.outcome is Outcome.FORGOTTEN, again
        assert new_system in again.detail and old_system in again.detail, again
        # the memory began again when B noticed the new server: later runs are claimed as usual
        assert b.claim([req("e", after_memory_restart(b))])[0].outcome is Outcome.WON


def test_claim_waits_for_the_synchronous_standby_and_a_cancelled_wait_is_unconfirmed(
        sync_rig, opened, namespace):
    """With synchronous_standby_names set (durability "auto"), a claim commits only once the
    standby has it; when the wait is cancelled (confirm_timeout) PostgreSQL keeps the commit
    locally and only warns: the claim is UNCONFIRMED, never WON, and its retry is confirmed again
    before it answers WON. A WON claim survives a crash of the primary and a promotion."""
    ha = sync_rig
    a = opened(ha.url(), namespace, "A", claim_timeout=3, confirm_timeout=1)
    warnings = prepared(a).prepare(["e"])
    assert not any("asynchronous" in w for w in warnings), warnings
    slot = fresh_slot(a)
    ha.pause_replication()
    started = time.monotonic()
    result = a.claim([req("e", slot)])[0]
    waited = time.monotonic() - started
    assert result.outcome is Outcome.UNCONFIRMED, result
    assert result.token is None and waited >= 1.0, (result, waited)
    assert a.history.read("e")[0].event is RunEvent.UNCONFIRMED
    assert a.claim([req("e", slot)])[0].outcome is Outcome.UNCONFIRMED, "a retry is not a send"

    ha.resume_replication()
    assert a.claim([req("e", slot)])[0].outcome is Outcome.WON, "confirmed once the standby has it"
    durable = slot + 1
    assert a.claim([req("e", durable)])[0].outcome is Outcome.WON
    a.close()
    ha.pause_replication()                # nothing more reaches the standby
    ha.kill_primary()
    ha.promote()
    b = opened(ha.url(), namespace, "B")
    survivor = b.claim([req("e", durable)])[0]
    assert survivor.outcome is Outcome.OTHER_WON and survivor.winner == "A", survivor


def test_durability_standby_needs_a_synchronous_standby(async_rig, opened, namespace):
    """durability="standby" on a primary without synchronous_standby_names cannot be kept: beat
    refuses to start, naming the setting."""
    from celery_anarchon.errors import ConfigError
    a = opened(async_rig.url(), namespace, "A", durability="standby")
    with pytest.raises(ConfigError, match="synchronous_standby_names"):
        a.prepare(["e"])


def test_standby_down_blocks_claims_and_any_1_of_2_keeps_the_schedule(opened, namespace):
    """With FIRST 1 (standby0) and standby0 down, commits wait for it: the claim is UNCONFIRMED
    after confirm_timeout and nothing is sent. With ANY 1 (standby0, standby1) one standby down
    is fine: the claim is WON (after the other standby has it)."""
    with ha_postgres.PostgresHA(standbys=2, synchronous="FIRST 1 (standby0)") as ha:
        a = opened(ha.url(), namespace, "A", claim_timeout=2, confirm_timeout=0.5)
        prepared(a)
        ha.stop(ha.standbys[0], "immediate")
        slot = fresh_slot(a)
        assert a.claim([req("e", slot)])[0].outcome is Outcome.UNCONFIRMED
        ha.set_synchronous("ANY 1 (standby0, standby1)")
        assert a.claim([req("e", slot + 1)])[0].outcome is Outcome.WON


def test_unconfirmed_takeover_is_retried_and_recognised(sync_rig, opened, namespace):
    """A takeover whose commit the synchronous standby did not confirm in time is not answered
    TAKEN (StoreUnavailable: nothing is sent); its retry with the same expected token, once the
    standby is back, answers TAKEN with the same record (docs/design.md "Amnesia": durable
    claim; "Leases": Takeover)."""
    from celery_anarchon.errors import StoreUnavailable
    from celery_anarchon.stores.base import LeaseTerms, TakeoverOutcome
    ha = sync_rig
    a = opened(ha.url(), namespace, "A", claim_timeout=3, confirm_timeout=1)
    b = opened(ha.url(), namespace, "B", claim_timeout=3, confirm_timeout=1)
    prepared(a)
    slot = fresh_slot(a)
    assert a.claim([req("e", slot, lease=LeaseTerms(queue_timeout_ms=200))])[0].outcome is Outcome.WON
    expired = wait_until(lambda: b.leases.expired_runs(["e"]), 10, "the queue deadline to pass")
    ha.pause_replication()
    with pytest.raises(StoreUnavailable, match="synchronous standby"):
        b.leases.take_over("e", slot, expired[0].token, queue_timeout_ms=60_000, max_attempts=3)
    ha.resume_replication()
    outcome, run = b.leases.take_over("e", slot, expired[0].token, queue_timeout_ms=60_000, max_attempts=3)
    assert outcome is TakeoverOutcome.TAKEN and (run.attempt, run.owner) == (2, "B"), (outcome, run)


def test_a_release_lost_in_a_promotion_is_never_taken_over(async_rig, opened, namespace):
    """The runner adopts (the standby has it), then releases on the primary while the
    asynchronous standby lags; the primary crashes and the standby is promoted: its record says
    started, and the lease runs out. B finds the run expired, but the timeline changed (the store
    may have lost writes to it): the run is not taken over (recorded given up, a possible miss),
    so its body never runs twice."""
    from celery_anarchon.stores.base import LeaseTerms
    ha = async_rig
    a = opened(ha.url(), namespace, "A")
    worker = opened(ha.url(), namespace, "worker")
    prepared(a)
    slot = fresh_slot(a)
    won = a.claim([req("e", slot, lease=LeaseTerms(queue_timeout_ms=60_000))])[0]
    assert won.outcome is Outcome.WON
    adopted, run = worker.leases.adopt("e", slot, "w1", 500)
    assert adopted
    ha.wait_replayed()
    ha.pause_replication()
    assert worker.leases.release("e", slot, run.token)
    a.close()
    worker.close()
    ha.kill_primary()
    ha.promote()

    note = assert_release_lost_is_never_taken_over(opened(ha.url(), namespace, "B"), "e", slot, run)
    assert "timeline" in note.detail, note


def test_rig_close_stops_an_old_primary_left_running_by_a_promotion():
    """The rig's close() stops every server it started, whatever was promoted since: here the
    standby is promoted while the old primary still runs (a split brain), and after close() no
    postgres of the rig's folder is left (its postmaster.pid processes are gone, its ports shut)."""
    import os
    import signal
    from servers import port_open
    ha = ha_postgres.PostgresHA(standbys=1).start()
    servers = {}                                  # pid -> (node name, port), from postmaster.pid
    try:
        old = ha.primary
        ha.promote()
        assert port_open(old.port), "the old primary still runs"
        for node in (old, ha.primary):
            with open(os.path.join(node.data, "postmaster.pid")) as pid_file:
                servers[int(pid_file.readline())] = (node.name, node.port)
    finally:
        ha.close()

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as stat:     # a zombie waiting for its parent is gone too
                return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
        except (ProcessLookupError, FileNotFoundError):
            return False

    left = {pid: what for pid, what in servers.items() if alive(pid) or port_open(what[1])}
    for pid in left:                              # clean up what the rig leaked (its own only)
        os.kill(pid, signal.SIGKILL)
    assert not left, f"postgres left running after close(): {left} (folder {ha.root})"


def test_rig_template_folder_is_deleted_when_the_process_exits():
    """The initdb template a process makes for its rigs is deleted at its exit (about 40 MB a
    test process otherwise, left in /tmp)."""
    import os
    import subprocess
    import sys
    from paths import BENCHMARKS
    benchmarks = str(BENCHMARKS)
    script = (f"import runpy, sys; sys.path.insert(0, {benchmarks!r}); "
              f"print(runpy.run_path({ha_postgres.__file__!r})['_template']())")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    template = out.stdout.strip()
    assert template.endswith("/data"), template
    assert not os.path.exists(os.path.dirname(template)), f"{template} left behind"
