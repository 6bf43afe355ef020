"""The faults of the chaos run: a schedule drawn from the seed, and the threads that inject it.

The schedule is a pure function of (seed, length of the run, store): the same command line breaks
the same things at the same moments (relative to the start of the measured window), for the same
durations. Every kind the store supports comes once (a long pause first, the others shuffled),
spread over the first part of the run; then faults arrive at random (exponential gaps, mean ``MEAN_GAP_S``). A fault
whose target is busy when its moment comes (its beat already stopped or paused, the store already
down) is skipped and recorded as skipped; at most ``MAX_BEATS_DOWN`` beats are killed or paused at
once, so some instance is always there to record what happens to each run.
"""
from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import math
import random
import signal
import threading
import time
from typing import Callable

#: every kind of fault, and for which stores (the clock skew is not here: one beat runs skewed for
#: the whole run, see chaos.py)
KINDS = {
    "kill": "SIGKILL of a beat instance, restarted after 0.5-8 s",
    "pause": "SIGSTOP of a beat instance, then SIGCONT: 0.1 s to max_late (log-uniform), or "
             "(the first one, then one in three) max_late to max_late + 5 s",
    "store-restart": "the store server stopped (SIGTERM or SIGKILL; PostgreSQL: pg_ctl stop -m "
                     "fast or immediate) and started again after 0.5-5 s",
    "store-lock": "SQLite: another process holds the database's exclusive lock for 0.5 s to "
                  "max_late + 5 s (there is no server to restart)",
    "broker-outage": "the broker (a redis-server of its own) shut down for 2 s to max_late + 10 s",
    "latency": "0-2 s added to every chunk on the store connection (TCP proxy) for 5-25 s",
    "pause-runner": "SIGSTOP of the worker running the leased tasks for 0.5-12 s (log-uniform; "
                    "the first one 7-12 s: past the 6 s lease)",
    "skew": "one beat (beat-5) restarted with its clock 5 s ahead or behind (libfaketime) for "
            "20-60 s, then restarted with a true clock",
    # the replicated store (--store redis-sentinel: a master, two replicas, three Sentinels)
    "master-kill": "Sentinel rig: SIGKILL of the master; Sentinel fails over on its own; the old "
                   "master restarted (empty) as a replica of the new one 0.5-5 s later",
    "failover": "Sentinel rig: SENTINEL FAILOVER (the old master stays up and is demoted)",
    "lag-failover": "Sentinel rig: one replica stops receiving the master's writes for 0.5-4 s, "
                    "the other replica is stopped (SIGSTOP), and SENTINEL FAILOVER promotes the "
                    "lagging one: the writes it missed are lost",
    "pause-failover": "Sentinel rig: SIGSTOP of a beat for 3-25 s, with a failover (SENTINEL "
                      "FAILOVER, or SIGKILL of the master) while it is stopped",
}
STORE_KINDS = {
    "redis": ("kill", "pause", "store-restart", "broker-outage", "latency", "pause-runner", "skew"),
    "redis-aof": ("kill", "pause", "store-restart", "broker-outage", "latency", "pause-runner",
                  "skew"),
    "postgresql": ("kill", "pause", "store-restart", "broker-outage", "latency", "pause-runner",
                   "skew"),
    "sqlite": ("kill", "pause", "store-lock", "broker-outage", "pause-runner"),
    # no latency fault: clients reach the master at the address Sentinel gives them (no proxy)
    "redis-sentinel": ("kill", "pause", "broker-outage", "pause-runner", "skew", "master-kill",
                       "failover", "lag-failover", "pause-failover"),
}
WEIGHTS = {"kill": 3, "pause": 3, "store-restart": 2, "store-lock": 2, "broker-outage": 2,
           "latency": 2, "pause-runner": 1, "skew": 1,
           "master-kill": 2, "failover": 2, "lag-failover": 2, "pause-failover": 2}
MEAN_GAP_S = 12.0
#: Debian's faketime package (apt-get install faketime), on any architecture: the skew fault
FAKETIME_LIB = next(iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))),
                    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
MAX_BEATS_DOWN = 2
#: fault kinds that hold a beat and the store at once
BEAT_AND_STORE = ("pause-failover",)
#: faults start this long after the measured window opens, and end this long before it closes
LEAD_S, TAIL_S = 3.0, 12.0


@dataclasses.dataclass
class Fault:
    at: float               #: seconds after the window opened
    kind: str
    duration: float         #: seconds the fault lasts
    target: str = ""        #: the beat of kill / pause
    param: str = ""         #: latency seconds, or how a server is stopped
    # filled in when it runs
    started: float | None = None
    ended: float | None = None
    skipped: str = ""
    detail: str = ""

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def plan(seed: int, seconds: float, store: str, beats: list[str], max_late: float) -> list[Fault]:
    """The fault schedule of a run (see the module docstring)."""
    rng = random.Random(f"chaos-faults:{seed}:{store}:{seconds}")
    kinds = list(STORE_KINDS[store])
    last = seconds - TAIL_S
    # the long pause first, so that even a one-minute run has room for it; then a shuffle
    first_round = [k for k in kinds if k != "pause"]
    rng.shuffle(first_round)
    first_round.insert(0, "pause")
    # the first round: evenly spread over the first part of the run (all of it for a short run)
    span = min(last - LEAD_S, max(45.0, len(kinds) * MEAN_GAP_S))
    times = [LEAD_S + span * (i + rng.uniform(0.1, 0.6)) / len(kinds) for i in range(len(kinds))]
    faults = [_draw(rng, kind, at, beats, max_late, first=True)
              for kind, at in zip(first_round, times)]
    at = times[-1]
    weights = [WEIGHTS[k] for k in kinds]
    while True:
        at += rng.expovariate(1 / MEAN_GAP_S)
        if at >= last - 1:
            break
        faults.append(_draw(rng, rng.choices(kinds, weights)[0], at, beats, max_late))
    for fault in faults:     # every fault is over before the tail of the window
        fault.duration = round(max(0.1, min(fault.duration, last - fault.at)), 3)
    return faults


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def _draw(rng: random.Random, kind: str, at: float, beats: list[str], max_late: float,
          first: bool = False) -> Fault:
    """One fault; the first of each kind is the harsher one (a pause longer than max_late, a
    runner stopped past its lease), so that even a short run shows what the guarantee allows."""
    fault = Fault(at=round(at, 3), kind=kind, duration=0.0)
    if kind == "kill":
        fault.target, fault.duration = rng.choice(beats), rng.uniform(0.5, 8)
    elif kind == "pause":
        fault.target = rng.choice(beats)
        if first or rng.random() < 1 / 3:
            fault.duration = rng.uniform(max_late, max_late + 5)
        else:
            fault.duration = _log_uniform(rng, 0.1, max_late)
    elif kind == "store-restart":
        fault.duration, fault.param = rng.uniform(0.5, 5), rng.choice(["graceful", "crash"])
    elif kind == "store-lock":
        fault.duration = _log_uniform(rng, 0.5, max_late + 5)
    elif kind == "broker-outage":
        fault.duration = rng.uniform(2, max_late + 10)
    elif kind == "latency":
        fault.duration, fault.param = rng.uniform(5, 25), f"{rng.uniform(0, 2):.3f}"
    elif kind == "pause-runner":
        fault.duration = rng.uniform(7, 12) if first else _log_uniform(rng, 0.5, 12)
    elif kind == "skew":
        fault.duration, fault.param = rng.uniform(20, 60), rng.choice(["+5s", "-5s"])
    elif kind == "master-kill":         # duration: from the promotion to the old master's restart
        fault.duration = rng.uniform(0.5, 5)
    elif kind == "failover":
        fault.duration = 0.1            # as long as the failover takes
    elif kind == "lag-failover":        # duration: the lag before the failover; param: which replica
        fault.duration, fault.param = rng.uniform(0.5, 4), rng.choice(["first", "second"])
    elif kind == "pause-failover":      # duration: the beat's pause; param: how the master goes
        fault.target, fault.duration = rng.choice(beats), rng.uniform(3, 25)
        fault.param = rng.choice(["failover", "kill"])
    return fault


class FaultRunner:
    """Injects a schedule into a running harness (see chaos.py's ``Harness`` for the operations).

    Each fault runs in a thread of its own at ``t0 + fault.at``; what happened is appended to
    ``log_path`` (JSON lines) and kept in :attr:`faults`.
    """

    def __init__(self, harness, faults: list[Fault], t0: float, log_path: str,
                 say: Callable[[str], None]) -> None:
        self.h = harness
        self.faults = faults
        self.t0 = t0
        self.log_path = log_path
        self.say = say
        self.lock = threading.Lock()
        self.beats_down: set[str] = set()
        self.busy: set[str] = set()     # "store", "broker", "runner", "latency"
        self.threads: list[threading.Thread] = []
        self.errors: list[str] = []

    def start(self) -> None:
        thread = threading.Thread(target=self._dispatch, daemon=True, name="chaos-dispatch")
        thread.start()
        self.threads.append(thread)

    def join(self) -> None:
        for thread in list(self.threads):
            thread.join()

    def _dispatch(self) -> None:
        for fault in sorted(self.faults, key=lambda f: f.at):
            delay = self.t0 + fault.at - time.time()
            if delay > 0:
                time.sleep(delay)
            thread = threading.Thread(target=self._run, args=(fault,), daemon=True,
                                      name=f"chaos-{fault.kind}")
            thread.start()
            self.threads.append(thread)

    def _claim(self, fault: Fault) -> bool:
        """Reserve the fault's target; False (and the fault skipped) when it is busy, or when
        the fault cannot be injected here (clock skew without libfaketime): a skipped fault is
        never counted as injected."""
        if fault.kind == "skew" and not self.h.can_skew():
            fault.skipped = "libfaketime is missing (apt-get install faketime)"
            return False
        with self.lock:
            if fault.kind in BEAT_AND_STORE and "store" in self.busy:
                fault.skipped = "the store fault before it is still on"
                return False
            if fault.target:
                if fault.target in self.beats_down:
                    fault.skipped = f"{fault.target} is already stopped or paused"
                elif len(self.beats_down) >= MAX_BEATS_DOWN:
                    fault.skipped = f"{MAX_BEATS_DOWN} beats are already stopped or paused"
                else:
                    self.beats_down.add(fault.target)
                    if fault.kind in BEAT_AND_STORE:
                        self.busy.add("store")
                    return True
                return False
            resource = {"store-restart": "store", "store-lock": "store", "latency": "latency",
                        "broker-outage": "broker", "pause-runner": "runner",
                        "skew": "clock", "master-kill": "store", "failover": "store",
                        "lag-failover": "store"}[fault.kind]
            if resource in self.busy:
                fault.skipped = f"the {resource} fault before it is still on"
                return False
            self.busy.add(resource)
            fault.target = resource
            return True

    def _release(self, fault: Fault) -> None:
        with self.lock:
            self.beats_down.discard(fault.target)
            self.busy.discard(fault.target)
            if fault.kind in BEAT_AND_STORE:
                self.busy.discard("store")

    def _run(self, fault: Fault) -> None:
        if not self._claim(fault):
            self._write(fault)
            self.say(f"fault at +{fault.at:.1f} s: {fault.kind} skipped ({fault.skipped})")
            return
        fault.started = time.time()
        try:
            getattr(self, "_" + fault.kind.replace("-", "_"))(fault)
        except Exception as exc:  # report it: a harness failure must not pass silently
            self.errors.append(f"{fault.kind} at +{fault.at:.1f} s: {type(exc).__name__}: {exc}")
            fault.detail += f" harness error: {exc}"
        finally:
            fault.ended = time.time()
            self._release(fault)
            self._write(fault)
        self.say(f"fault at +{fault.started - self.t0:.1f} s: {fault.kind} {fault.target} "
                 f"{fault.param} for {fault.ended - fault.started:.1f} s {fault.detail}".rstrip())

    def _write(self, fault: Fault) -> None:
        with self.lock, open(self.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(fault.as_dict()) + "\n")

    # -- the faults --------------------------------------------------------------------------
    def _kill(self, fault: Fault) -> None:
        fault.detail = f"instance {self.h.kill_beat(fault.target)}"
        time.sleep(fault.duration)
        restarted = self.h.start_beat(fault.target)
        if restarted:
            fault.detail += f"; restarted {restarted}"

    def _pause(self, fault: Fault) -> None:
        self.h.signal_beat(fault.target, signal.SIGSTOP)
        try:
            time.sleep(fault.duration)
        finally:
            self.h.signal_beat(fault.target, signal.SIGCONT)

    def _store_restart(self, fault: Fault) -> None:
        self.h.store_down(fault.param)
        time.sleep(fault.duration)
        self.h.store_up()

    def _store_lock(self, fault: Fault) -> None:
        self.h.lock_store(fault.duration)

    def _broker_outage(self, fault: Fault) -> None:
        self.h.broker_down()
        time.sleep(fault.duration)
        self.h.broker_up()

    def _latency(self, fault: Fault) -> None:
        fault.param = fault.param or "1"
        self.h.set_latency(float(fault.param))
        try:
            time.sleep(fault.duration)
        finally:
            self.h.set_latency(0.0)

    def _skew(self, fault: Fault) -> None:
        with self._beat_quiet(self.h.SKEWED):
            fault.detail = f"restarted with {self.h.set_skew(fault.param)}"
        time.sleep(fault.duration)
        with self._beat_quiet(self.h.SKEWED):
            fault.detail += f"; restarted with {self.h.set_skew('')}"

    @contextlib.contextmanager
    def _beat_quiet(self, beat: str):
        """Wait until no other fault holds ``beat`` (killed or paused), and hold it meanwhile."""
        while True:
            with self.lock:
                if beat not in self.beats_down:
                    self.beats_down.add(beat)
                    break
            time.sleep(0.1)
        try:
            yield
        finally:
            with self.lock:
                self.beats_down.discard(beat)

    def _pause_runner(self, fault: Fault) -> None:
        self.h.signal_runner(signal.SIGSTOP)
        try:
            time.sleep(fault.duration)
        finally:
            self.h.signal_runner(signal.SIGCONT)

    # -- the replicated store (Sentinel rig) ----------------------------------------------------
    def _master_kill(self, fault: Fault) -> None:
        fault.detail = self.h.master_kill(fault.duration)

    def _failover(self, fault: Fault) -> None:
        fault.detail = self.h.sentinel_failover()

    def _lag_failover(self, fault: Fault) -> None:
        fault.detail = self.h.lag_failover(fault.duration, 0 if fault.param == "first" else 1)

    def _pause_failover(self, fault: Fault) -> None:
        start = time.time()
        self.h.signal_beat(fault.target, signal.SIGSTOP)
        try:
            time.sleep(min(1.0, fault.duration / 3))
            fault.detail = (self.h.sentinel_failover() if fault.param == "failover"
                            else self.h.master_kill(None))
            time.sleep(max(0.0, start + fault.duration - time.time()))
        finally:
            self.h.signal_beat(fault.target, signal.SIGCONT)
        fault.detail += self.h.finish_failover()
