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

from paths import ROOT
CHAOS = str(ROOT / "benchmarks" / "chaos.py")
SEED = 20261130
#: runs executed exactly once, at least, of the runs a store restart does not make the store forget
#: (a new epoch refuses every slot up to 10 s after the restart: this seed's 3.6 s crash costs 290
#: to 415 runs, recorded forgotten, each within the restart's window). This seed's 60 s reached
#: 82 % and 77 % of the rest (928 of 1136, 783 of 1011; a 22 s broker outage costs most of the
#: others, send_failed) and 86 % before the epoch. The floor only shows that the run ran (a
#: loaded machine executes fewer in time: a liveness figure, never a verdict on the guarantee)
EXECUTED_FLOOR = 0.5


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


def _verdict_of_one_miss(folder, *, event: str, beat: str, faults: list[dict],
                         entry: str = "e-00", killed: bool = False) -> dict:
    """The chaos verdict on one run that did not run: its history says ``event``, recorded by
    ``beat`` (of two beats, beat-1 and beat-2), with ``faults`` injected (``beat`` and times
    relative to the slot, in seconds)."""
    import chaos_analysis
    slot = 1_800_000_000_000
    folder.mkdir()
    instances = []
    for n in (1, 2):
        log = folder / f"beat-{n}.0.log"
        log.write_text(f"anarchon: instance vm:{n}:x, ...\n")
        instances.append({"beat": f"beat-{n}", "log": str(log),
                          "ended_by": "SIGKILL" if killed and f"beat-{n}" == beat else None})
    (folder / "instances.jsonl").write_text("".join(json.dumps(i) + "\n" for i in instances))
    (folder / "executions.jsonl").write_text("")
    (folder / "history.jsonl").write_text(json.dumps(
        {"entry": entry, "slot_ms": slot, "event": event, "instance": f"vm:{beat[-1]}:x",
         "store_ms": slot + 1000, "task_id": "t", "attempt": 1, "detail": ""}) + "\n")
    (folder / "faults.jsonl").write_text("".join(json.dumps(
        {"kind": f["kind"], "target": f.get("target", ""), "started": slot / 1000 + f["start"],
         "ended": slot / 1000 + f["end"]}) + "\n" for f in faults))
    return chaos_analysis.analyse(str(folder), {entry: 3_600_000},
                                  {entry} if entry.startswith("lease") else set(), slot - 1, slot)


#: (history event, the fault kind that can cause it, its target, the entry): one of each window
NEAR_AND_FAR = [
    ("send_failed", "broker-outage", "", "e-00"),
    ("store_unreachable", "store-restart", "", "e-00"),
    ("forgotten", "store-restart", "", "e-00"),
    ("late_local", "pause", "beat-1", "e-00"),
    ("overlapping", "pause-runner", "", "lease-00"),
    ("superseded", "pause-runner", "", "lease-00"),
]


@pytest.mark.parametrize("event, kind, target, entry", NEAR_AND_FAR)
def test_a_fault_explains_a_miss_only_around_its_slot(tmp_path, event, kind, target, entry):
    """A missed run whose history names a reason is explained by a fault that can cause it when
    the fault was on around its slot; the same fault 60 s before or after the slot does not
    excuse it (benchmarks/chaos_causes.py: the window of each reason)."""
    def verdict(name, start, end):
        return _verdict_of_one_miss(tmp_path / name, event=event, beat="beat-1", entry=entry,
                                    faults=[{"kind": kind, "target": target, "start": start,
                                             "end": end}])
    near = verdict("near", 1, 3)
    assert (near["explained"], near["unexplained"]) == (1, 0), near
    before = verdict("before", -64, -60)        # ended 60 s before the slot
    assert (before["explained"], before["unexplained"]) == (0, 1), before
    assert before["reasons_without_fault"] == {event: 1}, before
    after = verdict("after", 60, 64)            # began 60 s after the slot
    assert (after["explained"], after["unexplained"]) == (0, 1), after


@pytest.mark.parametrize("event, kind, killed", [("late_local", "pause", False),
                                                 ("send_failed", "pause", False),
                                                 ("claimed", "kill", True)])
def test_a_fault_of_one_beat_explains_only_what_that_beat_recorded(tmp_path, event, kind, killed):
    """A kill or a pause of beat-2 at the slot does not explain a reason beat-1 recorded (beat-1
    was neither stopped nor paused); the same fault on beat-1 does."""
    def verdict(target):
        return _verdict_of_one_miss(tmp_path / target, event=event, beat="beat-1", killed=killed,
                                    faults=[{"kind": kind, "target": target, "start": 0.5,
                                             "end": 4}])
    assert verdict("beat-1")["explained"] == 1
    other = verdict("beat-2")
    assert (other["explained"], other["unexplained"]) == (0, 1), other


def test_a_rerun_is_allowed_only_when_its_runner_was_paused_while_it_ran(tmp_path):
    """Two bodies of a leased run: the first one's release found its lease taken over. That is a
    rerun the guarantee allows when the leased worker was paused (pause-runner) while the first
    body ran, and a duplicate when the pause came 60 s later."""
    import chaos_analysis
    slot = 1_800_000_000_000

    def verdict(name, pause_at):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "instances.jsonl").write_text("")
        (folder / "history.jsonl").write_text("")
        (folder / "worker-leases.log").write_text(
            f"lease-00: slot {slot} attempt 1 finished, but its lease had been taken over\n")
        bodies = [{"kind": "start", "entry": "lease-00", "slot": slot, "attempt": attempt,
                   "task_id": f"t{attempt}", "time": slot / 1000 + at}
                  for attempt, at in ((1, 1), (2, 15))]
        ends = [{"kind": "end", "entry": "lease-00", "slot": slot, "attempt": 1, "task_id": "t1",
                 "time": slot / 1000 + 12}]
        (folder / "executions.jsonl").write_text(
            "".join(json.dumps(e) + "\n" for e in bodies + ends))
        (folder / "faults.jsonl").write_text(json.dumps(
            {"kind": "pause-runner", "target": "runner", "started": slot / 1000 + pause_at,
             "ended": slot / 1000 + pause_at + 8}) + "\n")
        return chaos_analysis.analyse(str(folder), {"lease-00": 3_600_000}, {"lease-00"},
                                      slot - 1, slot)

    paused = verdict("paused", 2)
    assert (paused["lease_lost_reruns"], paused["duplicates"]) == (1, 0), paused
    later = verdict("later", 62)
    assert (later["lease_lost_reruns"], later["duplicates"]) == (0, 1), later
