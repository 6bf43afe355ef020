"""The chaos run (benchmarks/chaos.py) for 60 s on the Redis lease store, inside ``make test``.

Five beats, fifty entries, two real workers, and a fault schedule drawn from a fixed seed: every
kind of fault the Redis store supports comes once (SIGKILL and restart of a beat, SIGSTOP of a
beat, a restart of the store server, a broker outage, latency on the store connection, a stopped
worker under leased tasks), and one beat runs with its clock skewed by 5 s. The store and the
broker are redis-servers of the run's own, on free ports, that keep their data (AOF): no port is
shared with the other tests, and no shared server is stopped. Zero duplicates, zero misses without
a recorded reason tied to an injected fault that can cause it, broker-side losses within their
bounds, every fault kind of the store injected, and most runs executed. Without libfaketime the
skew fault is skipped (never counted as injected); under ``CI=true`` that fails the test. The
run's files stay in the test's tmp_path for a post-mortem.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from chaos_faults import FAKETIME_LIB, STORE_KINDS
from conftest import IN_CI

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHAOS = os.path.join(ROOT, "benchmarks", "chaos.py")
SEED = 20261130
#: runs executed exactly once, at least, of the runs a store restart does not make the store forget
#: (a new epoch refuses every slot up to 10 s after the restart: this seed's 3.6 s crash costs 290
#: to 415 runs, recorded forgotten, each within the restart's window). This seed's 60 s reached
#: 82 % and 77 % of the rest (928 of 1136, 783 of 1011; a 22 s broker outage costs most of the
#: others, send_failed) and 86 % before the epoch; the margin is for a loaded machine.
EXECUTED_FLOOR = 0.72


def test_sixty_seconds_of_chaos_on_redis_send_every_run_once_or_record_why_not(tmp_path, capsys):
    if shutil.which("redis-server") is None:
        message = ("redis-server is not installed: the chaos run starts servers of its own "
                   "(apt-get install redis-server)")
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    has_faketime = os.path.exists(FAKETIME_LIB)
    if not has_faketime and IN_CI:
        pytest.fail(f"libfaketime is missing ({FAKETIME_LIB}): the clock skew fault cannot be "
                    "injected (.ci/run installs Debian's faketime)")
    out = tmp_path / "chaos"
    proc = subprocess.run([sys.executable, CHAOS, "--store", "redis-aof", "--minutes", "1",
                           "--seed", str(SEED), "--out", str(out)],
                          capture_output=True, text=True, timeout=280)
    with capsys.disabled():
        print("\n" + proc.stdout[-6000:])
    assert proc.returncode == 0, f"chaos.py exited {proc.returncode}; files in {out}\n" \
                                 f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["duplicates"] == 0, summary["duplicate_runs"]
    assert summary["unexplained"] == 0, summary["unexplained_runs"]
    assert summary["harness_errors"] == []
    assert summary["broker_losses_ok"], (summary["sent_lost_by_broker_verdict"],
                                         summary["sent_unacked_by_worker_verdict"])
    # the run did run: most runs executed, and every fault kind of the store was injected
    forgotten = summary["explained_by_reason"].get("forgotten", 0)
    assert summary["executed_once"] >= EXECUTED_FLOOR * (summary["expected"] - forgotten), summary
    injected = {f["kind"] for f in summary["faults"] if not f["skipped"]}
    wanted = set(STORE_KINDS["redis-aof"]) - (set() if has_faketime else {"skew"})
    assert wanted <= injected, f"never injected: {sorted(wanted - injected)}; {summary['faults']}"
    skew = [f for f in summary["faults"] if f["kind"] == "skew"]
    assert has_faketime or all(f["skipped"] for f in skew), "a skew without libfaketime counted"


def test_a_leased_run_not_taken_over_after_a_failover_is_an_explained_miss(tmp_path):
    """A leased run the store refused to take over because it may have lost writes to its record
    (history ``lost``, detail "not taken over ... lost writes") is an explained miss, reason
    ``not_taken_over``, when a failover was on around its slot; without such a fault it is not."""
    import chaos_analysis

    slot = 1_800_000_000_000
    log = tmp_path / "beat-1.0.log"
    log.write_text("anarchon: instance vm:1:a, ...\n")
    (tmp_path / "instances.jsonl").write_text(json.dumps({"log": str(log)}) + "\n")
    (tmp_path / "executions.jsonl").write_text("")
    (tmp_path / "history.jsonl").write_text(json.dumps(
        {"entry": "lease-00", "slot_ms": slot, "event": "lost", "instance": "vm:1:a",
         "store_ms": slot + 9000, "task_id": "t", "attempt": 1,
         "detail": "not taken over: its lease record may be stale after the store lost writes "
                   "(a possible miss; the server epoch changed)"}) + "\n")

    def verdict(kind):
        (tmp_path / "faults.jsonl").write_text(json.dumps(
            {"kind": kind, "started": slot / 1000 + 2, "ended": slot / 1000 + 3}) + "\n")
        return chaos_analysis.analyse(str(tmp_path), {"lease-00": 3_600_000}, {"lease-00"},
                                      slot - 1, slot)

    summary = verdict("failover")
    assert summary["explained_by_reason"] == {"not_taken_over": 1}, summary
    assert summary["unexplained"] == 0
    assert verdict("skew")["unexplained"] == 1, "a skew cannot make the store lose writes"
