"""Dispatch benchmark: Celery's default beat, RedBeat and celery_anarchon on the same beat_schedule.

    .venv/bin/python benchmarks/dispatch.py [--quick] [--workloads 1s,1m] [--systems ...]
        [--idle 10000,100000] [--idle-systems celery-1,redbeat-1,anarchon-1]
        [--json results.json] [--plot docs/dispatch-lateness.png] [--profile] [--keep]
    .venv/bin/python benchmarks/dispatch.py --replot results.json --plot docs/dispatch-lateness.png

Needs ``pip install -e '.[bench]'`` (celery-redbeat and matplotlib; py-spy for ``--profile``) and a
``redis-server`` binary. It starts its own Redis on ``--port`` (6431; no persistence), flushes it
before each run and stops it at the end; no other server is touched. The beat_schedule is
benchmarks/dispatch_app.py: N interval entries, one task, the entry's name as argument.

Systems, one after another, each on a flushed Redis (broker db 0, celery_anarchon's store db 1,
RedBeat db 2):

* ``celery-1``: Celery's default beat (``PersistentScheduler``), one instance;
* ``celery-3``: the same, three instances: each sends every run (its duplicates);
* ``redbeat-3``: celery-redbeat with its defaults (lock timeout 5 x beat's max interval = 1500 s),
  three instances; the leader (the instance whose messages arrive) is killed with SIGKILL;
* ``anarchon-3``: ``celery_anarchon:Scheduler`` with its defaults, Redis ``lease`` store, three
  instances; one is killed with SIGKILL.
* ``anarchon-cluster-3``: the same on the Redis Cluster store (``redis+cluster://``): a private
  six-node cluster (benchmarks/redis_cluster.py: three masters with a replica each, on free
  loopback ports) started once for the invocation when a cluster system is asked for, every
  master flushed before the run, stopped at the end; the broker stays the single Redis (db 0).
  Its ``redis CPU`` is the broker's plus the six nodes'.

The kill comes at the window's middle slot plus 40 % of an interval (at most 1 s), while that
slot's runs are being claimed and sent.

Workloads: ``1s`` = 1,000 entries every second, a 60-s window; ``1m`` = 10,000 entries every
minute, a 180-s window (``--quick``: 20 s and 60 s).

There is no Celery worker: a consumer process drains the broker's ``celery`` list (RPOP in
batches, BRPOP when it is empty) and records, per message, its arrival time, entry, sending
process (``origin`` header: ``gen<pid>@host``) and, for celery_anarchon, the slot
(``anarchon_slot`` header).

What the figures mean (docs/performance.md explains them at length):

* **nominal time** of a message, what its scheduler meant: celery_anarchon: its slot (a fixed UTC
  grid, the same on every instance). Celery beat and RedBeat run an interval entry one interval
  after its previous send (``last_run_at`` is set when a run is sent), so the nominal time of a
  message is the arrival of the previous message of that entry plus the interval: the previous
  message from the same instance for Celery beat, from any instance for RedBeat (its
  ``last_run_at`` lives in Redis). The first message of an entry has no previous one: every entry
  is created at start-up and first due one interval later. For RedBeat with the 1-minute workload
  its first due time is read from RedBeat's schedule in Redis 40 s after the start (storing 10,000
  entries takes seconds); otherwise it is taken as the arrival of the first message the instance
  (RedBeat: the cluster) sent at all (Celery beat creates its entries in memory within a fraction
  of a second).
* **window** ``[T0, T0 + duration)``: ``T0`` comes after a warm-up (15 s; for the 1-minute
  workload, the first minute boundary at least 75 s after the start), which leaves out start-up
  and, for celery_anarchon, the store's refusal of slots in its first 10 s.
* **runs sent / expected**: distinct runs whose nominal time is in the window and that arrived by
  the end of collection (window + 5 s, or + 15 s for the 1-minute workload) / entries x duration /
  interval. A run of celery_anarchon is (entry, slot); for the others the window is cut into
  interval-long periods from ``T0`` and a run is (entry, period of its nominal time), so a
  scheduler that drifts later leaves periods empty.
* **duplicates**: messages of those runs beyond one per run.
* **longest gap**: the longest time between two consecutive messages of one entry (any instance),
  from the last message before ``T0`` to the end of collection; ``>=`` marks a gap still open at
  the end (nothing sent since).
* **lateness**: arrival at the consumer - nominal time, for every message that arrived during the
  window (a scheduler far behind sends, during the window, runs that were due before it).
* **beat CPU / 1k runs**: utime + stime (children included) of every beat process from ``T0`` to
  the end of the window (a killed one: until its kill), per 1,000 distinct runs sent during the
  window; ``redis CPU`` is the same for the Redis server (broker and stores).
* **peak RSS**: the largest VmHWM among the beat processes.
* **lost with the killed instance** (celery_anarchon): the runs of the window the store's history
  shows claimed by the killed instance and never sent (the guarantee's "winner dying between its
  claim and its send"), and their share of one slot's runs: the kill falls in the burst of one
  slot (``1m``: the minute's 10,000 runs).
* ``--profile``: py-spy on one surviving celery_anarchon beat: for ``1m`` the burst only (from
  0.5 s before the minute, 6 s), for ``1s`` the whole window; where its wall time went.

The idle table, in the same invocation (``--idle ''`` leaves it out): one beat per scheduler
(``celery-1``, ``redbeat-1`` up to 10,000 entries, ``anarchon-1`` on the Redis ``lease`` store)
with 10,000 and 100,000 daily crontabs that never come due during the run (six to eighteen hours
away, 720 distinct times; dispatch_app.py ``DISPATCH_KIND=daily``), each on a flushed Redis:

* **start-up**: from the process's start to the end of its first tick (the scheduler built, the
  store prepared, every entry's next run known), and the process's CPU until then;
* **idle CPU**: the process's CPU over a 60-s window (``--quick``: 20 s) after a 5-s settle, as a
  share of one core; **RSS**: VmRSS at the end of that window (peak: VmHWM).
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import multiprocessing
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import redis

from procs import CeleryProcs
from servers import RedisServer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CLK_TCK = os.sysconf("SC_CLK_TCK")
QUEUE = "celery"
#: the consumer pops at most this many messages at once (all stamped with the same arrival time)
BATCH = 200
TASK = "dispatch_app.noop"

#: name -> (scheduler, instances, kill one halfway, nominal time from: "slot" | "instance" | "shared")
SYSTEMS = {
    "celery-1": ("default", 1, False, "instance"),
    "celery-3": ("default", 3, False, "instance"),
    "redbeat-3": ("redbeat", 3, True, "shared"),
    "anarchon-3": ("anarchon", 3, True, "slot"),
    "anarchon-cluster-3": ("anarchon", 3, True, "slot"),
}
LABELS = {"celery-1": "Celery beat x1", "celery-3": "Celery beat x3",
          "redbeat-3": "RedBeat x3 (leader killed)", "anarchon-3": "celery_anarchon x3 (one killed)",
          "anarchon-cluster-3": "celery_anarchon x3 on Redis Cluster (one killed)"}
#: systems whose claim store is the benchmark's Redis Cluster (six nodes of its own), not db 1
CLUSTER_SYSTEMS = {"anarchon-cluster-3"}
#: name -> (entries, interval s, window s, quick window s, grace s)
WORKLOADS = {
    "1s": (1_000, 1.0, 60, 20, 5),
    "1m": (10_000, 60.0, 180, 60, 15),
}
#: seconds of the 1-minute workload's burst profiled by --profile (from 0.5 s before the minute)
BURST_PROFILE_S = 6

WORKLOAD_LABELS = {"1s": "1,000 entries every second", "1m": "10,000 entries every minute"}


# -- the Redis server of the benchmark ------------------------------------------------------------

class OwnRedis(RedisServer):
    """The benchmark's redis-server (benchmarks/servers.py) on ``port``, without persistence, with
    four databases (broker, store, RedBeat), and a client to flush it and read its version."""

    def __init__(self, port: int, workdir: str) -> None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                raise SystemExit(f"port {port} is in use: pick another with --port")
        if not shutil.which("redis-server"):
            raise SystemExit("redis-server not found (apt-get install redis-server)")
        super().__init__("redis", workdir, persistent=False, port=port, args=("--databases", "4"))
        try:
            self.start()
        except RuntimeError as exc:
            raise SystemExit(f"{exc}; see {self.log}") from exc
        self.client = redis.Redis(host="127.0.0.1", port=port)
        self.version = self.client.info("server")["redis_version"]

    def db(self, n: int) -> str:
        return f"redis://127.0.0.1:{self.port}/{n}"

    def flush(self) -> None:
        self.client.flushall()


# -- /proc ----------------------------------------------------------------------------------------

def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()   # fields from 3 (state) on


def _descendants(pid: int) -> list[int]:
    children = collections.defaultdict(list)
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat_fields(int(name))
            if fields:
                children[int(fields[1])].append(int(name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def cpu_seconds(pid: int) -> float | None:
    """utime + stime + cutime + cstime of ``pid`` and its live descendants, seconds."""
    total, seen = 0.0, False
    for p in _descendants(pid):
        fields = _stat_fields(p)
        if fields:                                   # utime stime cutime cstime: fields 14-17
            total += sum(int(x) for x in fields[11:15]) / CLK_TCK
            seen = True
    return total if seen else None


def peak_rss_mb(pid: int) -> float:
    """VmHWM of ``pid`` and its live descendants, MB."""
    total = 0
    for p in _descendants(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


# -- the consumer ---------------------------------------------------------------------------------

def consume(url: str, stop, ready, last_pid, out_path: str) -> None:
    """Drain the broker's queue until ``stop`` is set and it is empty; pickle the records.

    A record is ``(arrival s, entry number, sender pid, slot ms or -1)``. kombu's Redis transport
    LPUSHes, so the oldest message is at the right: RPOP in batches, BRPOP when empty.
    """
    client = redis.Redis.from_url(url)
    records, other, largest = [], 0, 0
    ready.set()
    while True:
        msgs = client.rpop(QUEUE, BATCH)
        if msgs:
            now = time.time()
        else:
            if stop.is_set():
                break
            got = client.brpop([QUEUE], timeout=0.05)
            if not got:
                continue
            now = time.time()
            msgs = [got[1]]
        largest = max(largest, len(msgs))
        pid = 0
        for raw in msgs:
            headers = json.loads(raw)["headers"]
            if headers.get("task") != TASK:
                other += 1
                continue
            entry = headers.get("anarchon_entry") or headers["argsrepr"].strip("[]()'\", ")
            pid = int(headers["origin"].split("@", 1)[0][3:])      # gen<pid>@host
            records.append((now, int(entry[1:]), pid, int(headers.get("anarchon_slot", -1))))
        if pid:
            last_pid.value = pid
    fields = _stat_fields(os.getpid())
    cpu = sum(int(x) for x in fields[11:13]) / CLK_TCK if fields else None
    with open(out_path, "wb") as f:
        pickle.dump({"records": records, "other": other, "cpu": cpu, "largest_batch": largest}, f)


# -- one run --------------------------------------------------------------------------------------

class Run:
    """One system on one workload: beats, consumer, timeline, raw observations."""

    def __init__(self, server: OwnRedis, workdir: str, system: str, workload: str, quick: bool,
                 profile: bool, cluster=None) -> None:
        self.server, self.system, self.workload = server, system, workload
        #: the RedisClusterRig whose store this system claims in (CLUSTER_SYSTEMS), else None
        self.cluster = cluster if system in CLUSTER_SYSTEMS else None
        self.store_url = self.cluster.url if self.cluster else server.db(1)
        self.scheduler, self.instances, self.kills, self.nominal_from = SYSTEMS[system]
        self.entries, self.interval, window, quick_window, self.grace = WORKLOADS[workload]
        self.duration = quick_window if quick else window
        self.profile = profile
        self.dir = os.path.join(workdir, f"{workload}-{system}")
        os.makedirs(self.dir, exist_ok=True)
        self.beats: list[subprocess.Popen] = []
        self.celery = CeleryProcs(self.dir, app="dispatch_app")
        self.cpu0: dict[int, float] = {}
        self.cpu1: dict[int, float] = {}
        self.rss: dict[int, float] = {}
        self.killed: int | None = None
        self.stopped: dict = {}
        self.load_after = (float("nan"),) * 3
        self.kill_at: float | None = None

    def env(self) -> dict:
        env = dict(os.environ)
        env.update(DISPATCH_BROKER=self.server.db(0), DISPATCH_SCHEDULER=self.scheduler,
                   DISPATCH_ENTRIES=str(self.entries), DISPATCH_INTERVAL=repr(self.interval),
                   DISPATCH_STORE=self.store_url, DISPATCH_REDBEAT=self.server.db(2),
                   PYTHONPATH=os.pathsep.join(filter(None, [HERE, env.get("PYTHONPATH", "")])))
        return env

    def redis_pids(self) -> list[int]:
        """The Redis servers this run's CPU is counted on: the broker's, and the cluster's nodes."""
        pids = [self.server.proc.pid]
        if self.cluster:
            pids += [n.proc.pid for n in self.cluster.nodes if n.alive()]
        return pids

    def redis_cpu(self) -> float | None:
        values = [cpu_seconds(pid) for pid in self.redis_pids()]
        return None if any(v is None for v in values) else sum(values)

    def start_beat(self, n: int) -> subprocess.Popen:
        return self.celery.start(f"beat-{n}", "beat", "-l", "warning", "--pidfile=", "-s",
                                 os.path.join(self.dir, f"beat-{n}-schedule"), env=self.env()).popen

    def sample_cpu(self, into: dict, pids) -> None:
        for pid in pids:
            cpu = cpu_seconds(pid)
            if cpu is not None:
                into[pid] = cpu

    def sample_rss(self, pids) -> None:
        for pid in pids:
            rss = peak_rss_mb(pid)
            if rss:
                self.rss[pid] = rss

    def alive(self) -> list[int]:
        return [p.pid for p in self.beats if p.poll() is None]

    def kill_time(self, t0: float) -> float:
        """The middle slot of the window plus 40 % of an interval (at most 1 s): while the runs of
        that slot are being claimed and sent, not in the quiet time between two slots."""
        periods = round(self.duration / self.interval)
        return t0 + (periods // 2) * self.interval + min(0.4 * self.interval, 1.0)

    def victim(self, last_pid) -> int:
        pids = self.alive()
        if self.scheduler == "redbeat":          # the leader: the instance whose messages arrive
            if last_pid.value in pids:
                return last_pid.value
            busiest = {pid: (cpu_seconds(pid) or 0) - self.cpu0.get(pid, 0) for pid in pids}
            return max(busiest, key=busiest.get)
        return pids[0]

    def execute(self) -> dict:
        self.server.flush()
        if self.cluster:
            flush_cluster(self.cluster)
        load = os.getloadavg()
        ctx = multiprocessing.get_context("fork")
        stop, ready, last_pid = ctx.Event(), ctx.Event(), ctx.Value("i", 0)
        out = os.path.join(self.dir, "messages.pickle")
        consumer = ctx.Process(target=consume, args=(self.server.db(0), stop, ready, last_pid, out))
        consumer.start()
        ready.wait(10)
        started = time.time()
        self.beats = [self.start_beat(n) for n in range(self.instances)]
        pids = [p.pid for p in self.beats]
        if self.interval >= 60:
            t0 = math.ceil((started + 75) / self.interval) * self.interval
        else:
            t0 = math.ceil(started + 15)
        t1 = t0 + self.duration
        end = t1 + self.grace
        redis_cpu = {}
        profiler = None
        first_due = None
        try:
            if self.scheduler == "redbeat" and self.interval >= 60:
                sleep_until(started + 40)
                first_due = self.redbeat_first_due()
            if self.profile and self.scheduler == "anarchon":
                # the 1-minute workload: the burst only (from 0.5 s before the minute), where
                # the time goes; the 1-second one: the whole window
                burst = self.interval >= 60
                sleep_until(t0 - 0.5 if burst else t0)
                profiler = start_profiler(self.beats[-1].pid,
                                          BURST_PROFILE_S if burst else self.duration, self.dir)
            sleep_until(t0)
            self.check_alive()
            self.sample_cpu(self.cpu0, pids)
            redis_cpu["t0"] = self.redis_cpu()
            if self.kills:
                sleep_until(self.kill_time(t0))
                self.check_alive()
                victim = self.victim(last_pid)
                self.sample_cpu(self.cpu1, [victim])
                self.sample_rss([victim])
                os.killpg(victim, signal.SIGKILL)
                self.killed, self.kill_at = victim, time.time()
            sleep_until(t1)
            survivors = self.alive()
            self.sample_cpu(self.cpu1, survivors)
            redis_cpu["t1"] = self.redis_cpu()
            sleep_until(end)
            self.sample_rss(self.alive())
            self.load_after = os.getloadavg()
        finally:
            self.stopped = stop_processes(self.beats)
            stop.set()
            consumer.join(120)
            if profiler is not None:
                profiler.wait(60)
        with open(out, "rb") as f:
            consumed = pickle.load(f)
        undeliverable = sum(self.server.client.llen(k) for k in self.server.client.keys("*undeliver*"))
        history = self.anarchon_history(consumed["records"], t0, t1) if self.scheduler == "anarchon" else None
        return {
            "system": self.system, "workload": self.workload, "entries": self.entries,
            "store": "redis+cluster (3 masters, 3 replicas)" if self.cluster else "redis",
            "interval": self.interval, "duration": self.duration, "instances": self.instances,
            "started": started, "t0": t0, "t1": t1, "end": end, "load_before": load, "load_after": self.load_after,
            "killed": self.killed, "kill_at": self.kill_at, "pids": pids,
            "sigterm_exit_s": self.stopped,
            "cpu0": self.cpu0, "cpu1": self.cpu1, "rss": self.rss, "redis_cpu": redis_cpu,
            "records": consumed["records"], "first_due": first_due, "other_messages": consumed["other"],
            "consumer_cpu": consumed["cpu"], "consumer_largest_batch": consumed["largest_batch"],
            "undeliverable": undeliverable, "banner": self.banner(),
            "log_warnings": self.log_summary(), "anarchon_history": history,
            "profile": os.path.join(self.dir, "py-spy.txt") if profiler is not None else None,
        }

    def redbeat_first_due(self) -> dict:
        """entry -> when RedBeat will first run it (its schedule's scores), read after every
        instance stored the entries and before the first is due: each entry's last_run_at is the
        moment it was first stored, and storing 10,000 entries takes seconds."""
        client = redis.Redis.from_url(self.server.db(2), decode_responses=True)
        scores = client.zrange("redbeat::schedule", 0, -1, withscores=True)
        client.close()
        return {int(key.rsplit(":", 1)[-1][1:]): score for key, score in scores
                if key.rsplit(":", 1)[-1].startswith("e")}

    def check_alive(self) -> None:
        for n, proc in enumerate(self.beats):
            if proc.poll() is not None and proc.pid != self.killed:
                with open(os.path.join(self.dir, f"beat-{n}.log"), errors="replace") as f:
                    tail = f.read()[-3000:]
                raise SystemExit(f"{self.system}: beat {n} exited with {proc.returncode}:\n{tail}")

    def banner(self) -> list[str]:
        """The scheduler's lines of beat's start-up banner (e.g. RedBeat's lock timeout)."""
        with open(os.path.join(self.dir, "beat-0.log"), errors="replace") as f:
            lines = f.read().splitlines()[:30]
        return [line.strip() for line in lines if line.strip().startswith(
            (". scheduler", ". lock", ". maxinterval", ". store", ". timing", ". redis"))]

    def log_summary(self) -> dict:
        """Counts of WARNING/ERROR lines per beat log, by their first words."""
        counts = collections.Counter()
        for n in range(self.instances):
            with open(os.path.join(self.dir, f"beat-{n}.log"), errors="replace") as f:
                for line in f:
                    if "WARNING/" in line or "ERROR/" in line or "CRITICAL/" in line:
                        text = line.split("] ", 1)[-1]
                        text = re.sub(r"\be\d{5}\b", "<entry>", text)
                        text = re.sub(r"\d{4}-\d\d-\d\dT[\d:.]+\+00:00", "<slot>", text)
                        text = re.sub(r"\d+(\.\d+)?", "<n>", text)
                        counts[" ".join(text.split()[:12])] += 1
        return dict(counts.most_common(12))

    def anarchon_history(self, records, t0, t1) -> dict:
        """For every run of the window that never arrived: what the store's history says."""
        from celery_anarchon.stores import open_store
        got = {(e, s) for _, e, _, s in records}
        step = int(self.interval * 1000)
        missing = [(e, s) for e in range(self.entries)
                   for s in range(int(t0 * 1000), int(t1 * 1000), step) if (e, s) not in got]
        store = open_store(self.store_url, namespace="dispatch_app", instance_id="bench-reader")
        reasons = collections.Counter()
        for entry in sorted({e for e, _ in missing}):
            name = f"e{entry:05d}"
            by_slot = {h.slot_ms: h for h in store.history.read(name, limit=500)}
            for e, s in missing:
                if e != entry:
                    continue
                h = by_slot.get(s)
                if h is None:
                    reasons["no record"] += 1
                else:
                    pid = h.instance.split(":")[1] if h.instance.count(":") >= 2 else "?"
                    who = "the killed instance" if str(self.killed) == pid else "a live instance"
                    reasons[f"{h.event.value} by {who}"] += 1
        store.close()
        return dict(reasons)


def flush_cluster(rig) -> None:
    """FLUSHALL on every master of the benchmark's cluster (its replicas follow), and wait until
    the replicas are in step again."""
    for master in rig.masters():
        client = redis.Redis(host="127.0.0.1", port=master.port)
        client.flushall()
        client.close()
    rig.wait_ok()


# -- many entries at idle ---------------------------------------------------------------------------

#: name -> (scheduler, label); one instance each, entries that never come due during the run
IDLE_SYSTEMS = {
    "celery-1": ("default", "Celery beat x1"),
    "redbeat-1": ("redbeat", "RedBeat x1"),
    "anarchon-1": ("anarchon", "celery_anarchon x1"),
}
#: entry counts of the idle table; RedBeat only up to REDBEAT_IDLE_MAX (it writes every entry to
#: Redis one round trip at a time at start-up: minutes at 100,000)
IDLE_SIZES = (10_000, 100_000)
REDBEAT_IDLE_MAX = 10_000
#: idle measurement after the first tick: settle, then the window (seconds; --quick: 20 s)
IDLE_SETTLE_S, IDLE_WINDOW_S, IDLE_QUICK_WINDOW_S = 5, 60, 20
#: a beat that has not ended its first tick by then is reported as not started
IDLE_START_TIMEOUT_S = 600


class IdleRun:
    """One scheduler with ``entries`` daily crontabs that never come due during the run: the
    start-up (from the process's start to the end of its first tick: the scheduler built, the
    store prepared, every entry's next run known), then the CPU and memory of one idle window."""

    def __init__(self, server: OwnRedis, workdir: str, system: str, entries: int,
                 quick: bool) -> None:
        self.server, self.system, self.entries = server, system, entries
        self.scheduler, self.label = IDLE_SYSTEMS[system]
        self.window = IDLE_QUICK_WINDOW_S if quick else IDLE_WINDOW_S
        self.dir = os.path.join(workdir, f"idle-{entries}-{system}")
        os.makedirs(self.dir, exist_ok=True)
        self.celery = CeleryProcs(self.dir, app="dispatch_app")
        self.ready_file = os.path.join(self.dir, "ready")

    def execute(self) -> dict:
        self.server.flush()
        load = os.getloadavg()
        env = dict(os.environ)
        env.update(DISPATCH_BROKER=self.server.db(0), DISPATCH_SCHEDULER=self.scheduler,
                   DISPATCH_ENTRIES=str(self.entries), DISPATCH_KIND="daily",
                   DISPATCH_HOUR=str(time.gmtime().tm_hour), DISPATCH_STORE=self.server.db(1),
                   DISPATCH_REDBEAT=self.server.db(2), DISPATCH_READY=self.ready_file,
                   PYTHONPATH=os.pathsep.join(filter(None, [HERE, env.get("PYTHONPATH", "")])))
        started = time.time()
        proc = self.celery.start("beat", "beat", "-l", "warning", "--pidfile=", "-s",
                                 os.path.join(self.dir, "beat-schedule"), env=env).popen
        out = {"system": self.system, "entries": self.entries, "window": self.window,
               "load_before": load, "started": None}
        try:
            deadline = time.monotonic() + IDLE_START_TIMEOUT_S
            while not os.path.exists(self.ready_file) or not open(self.ready_file).read().strip():
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = self.celery.text("beat")[-2000:]
                    out["error"] = f"no first tick (exit {proc.poll()}): {tail}"
                    return out
                time.sleep(0.05)
            ready_at, ready_cpu = map(float, open(self.ready_file).read().split())
            out.update(started=ready_at - started, startup_cpu=ready_cpu)
            time.sleep(IDLE_SETTLE_S)
            cpu0 = cpu_seconds(proc.pid)
            time.sleep(self.window)
            cpu1 = cpu_seconds(proc.pid)
            out.update(idle_cpu_pct=(cpu1 - cpu0) / self.window * 100, rss=rss_mb(proc.pid),
                       peak_rss=peak_rss_mb(proc.pid), load_after=os.getloadavg())
        finally:
            stop_processes([proc])
        return out


def rss_mb(pid: int) -> float:
    """VmRSS of ``pid`` and its live descendants, MB."""
    total = 0
    for p in _descendants(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            pass
    return total / 1024


def idle_table(results: list[dict], markdown: bool = False) -> str:
    """Start-up, idle CPU and memory per entry count and scheduler, with the ratio to Celery's
    beat of the same entry count."""
    head = ["entries", "system", "start-up (s)", "CPU to first tick (s)", "idle CPU, % of a core",
            "RSS (MB)", "peak RSS (MB)", "start-up / Celery's", "RSS / Celery's"]
    celery = {r["entries"]: r for r in results if r["system"] == "celery-1" and r.get("started")}
    rows = []
    for r in results:
        if not r.get("started"):
            rows.append([f"{r['entries']:,}", IDLE_SYSTEMS[r["system"]][1], "did not start"]
                        + ["-"] * (len(head) - 3))
            continue
        base = celery.get(r["entries"])
        rows.append([f"{r['entries']:,}", IDLE_SYSTEMS[r["system"]][1], f"{r['started']:.1f}",
                     f"{r['startup_cpu']:.1f}", f"{r['idle_cpu_pct']:.2f}", f"{r['rss']:.0f}",
                     f"{r['peak_rss']:.0f}",
                     f"{r['started'] / base['started']:.2f}" if base else "-",
                     f"{r['rss'] / base['rss']:.2f}" if base else "-"])
    return _render(head, rows, markdown)


def _render(head: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths)),
           "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(out)


def start_profiler(pid: int, duration: float, directory: str):
    """py-spy on one surviving beat for the window (collapsed stacks, a ``raw`` file)."""
    binary = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(binary):
        print("  (py-spy is not installed: pip install py-spy; no profile)")
        return None
    return subprocess.Popen([binary, "record", "--pid", str(pid), "--duration", str(int(duration)),
                             "--rate", "100", "--format", "raw", "--idle", "--nonblocking",
                             "-o", os.path.join(directory, "py-spy.txt")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_processes(procs: list[subprocess.Popen], timeout: float = 15) -> dict:
    """SIGTERM to every live process at once; SIGKILL to any still alive after ``timeout``.

    :returns: pid -> seconds it took to exit after SIGTERM, or None when it had to be killed.
    """
    asked = {}
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                asked[proc.pid] = time.monotonic()
            except ProcessLookupError:
                pass
    took = {}
    deadline = time.monotonic() + timeout
    for proc in procs:
        if proc.pid not in asked:
            continue
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
            took[proc.pid] = time.monotonic() - asked[proc.pid]
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(5)
            took[proc.pid] = None
    return took


def sleep_until(t: float) -> None:
    while (left := t - time.time()) > 0:
        time.sleep(min(left, 1.0))


# -- figures --------------------------------------------------------------------------------------

def analyse(raw: dict) -> dict:
    """The table's figures from one run's raw observations (see the module docstring)."""
    interval, t0, t1, end = raw["interval"], raw["t0"], raw["t1"], raw["end"]
    entries, nominal_from = raw["entries"], SYSTEMS[raw["system"]][3]
    periods = round(raw["duration"] / interval)
    records = sorted(raw["records"])
    messages = []                                   # (arrival, entry, nominal or None, run key)
    if nominal_from == "slot":
        for arrival, entry, _pid, slot in records:
            messages.append((arrival, entry, slot / 1000, slot / 1000))
    else:
        first_of: dict = {}                         # instance (or cluster) -> its first arrival
        previous: dict = {}                         # (instance or cluster, entry) -> last arrival
        first_due = {int(e): due for e, due in (raw.get("first_due") or {}).items()}
        for arrival, entry, pid, _ in records:
            who = pid if nominal_from == "instance" else 0
            first_of.setdefault(who, arrival)
            before = previous.get((who, entry))
            if before is not None:
                nominal = before + interval
            else:
                nominal = first_due.get(entry, first_of[who])
            previous[(who, entry)] = arrival
            messages.append((arrival, entry, nominal, math.floor((nominal - t0) / interval + 1e-9)))

    def in_window(nominal):
        return t0 - 1e-6 <= nominal < t1 - 1e-6

    window = [m for m in messages if in_window(m[2])]
    runs = collections.Counter((m[1], m[3]) for m in window)
    lateness = sorted(m[0] - m[2] for m in messages if t0 <= m[0] < t1)

    gap, gap_open = 0.0, False                      # the longest gap; still open at the end?
    by_entry = collections.defaultdict(list)
    for arrival, entry, _, _ in messages:
        by_entry[entry].append(arrival)
    for entry in range(entries):
        times = by_entry.get(entry, [])
        before = [t for t in times if t < t0]
        series = ([before[-1]] if before else [t0]) + [t for t in times if t0 <= t <= end]
        for a, b in zip(series, series[1:]):
            if b - a > gap:
                gap, gap_open = b - a, False
        if end - series[-1] > gap:
            gap, gap_open = end - series[-1], True

    cpu = sum(raw["cpu1"][pid] - raw["cpu0"][pid] for pid in raw["cpu1"] if pid in raw["cpu0"])
    sent = len(runs)
    sent_during = len({(m[1], m[3]) for m in messages if t0 <= m[0] < t1})
    redis_cpu = raw["redis_cpu"]
    return {
        "expected": entries * periods,
        "sent": sent,
        "duplicates": sum(runs.values()) - sent,
        "missed": entries * periods - sent,
        "gap": gap, "gap_open": gap_open,
        "p50": percentile(lateness, 50), "p99": percentile(lateness, 99),
        "max": lateness[-1] if lateness else float("nan"),
        "lateness": lateness,
        "sent_during": sent_during,
        "cpu": cpu, "cpu_per_1k": cpu / sent_during * 1000 if sent_during else float("nan"),
        "cpu_pct": cpu / raw["duration"] * 100,
        "redis_per_1k": ((redis_cpu["t1"] - redis_cpu["t0"]) / sent_during * 1000
                         if sent_during and redis_cpu.get("t1") is not None else float("nan")),
        "rss": max(raw["rss"].values()) if raw["rss"] else float("nan"),
    }


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile of sorted ``values``."""
    if not values:
        return float("nan")
    return values[min(len(values) - 1, max(0, math.ceil(p / 100 * len(values)) - 1))]


def share(part: int, whole: int) -> str:
    """``part / whole`` as a percentage with the decimals it needs: a share that is not the whole
    never prints as 100.0 % (19,990 / 20,000 is 99.95 %)."""
    for digits in (1, 2, 3, 4):
        text = f"{part / whole:.{digits}%}"
        if part == whole or not text.startswith("100."):
            return text
    return f"{part / whole:.4%}"


def fmt_s(seconds: float) -> str:
    if seconds != seconds:
        return "-"
    if abs(seconds) < 1:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.2f} s" if abs(seconds) < 10 else f"{seconds:.0f} s"


def table(results: list[dict], markdown: bool = False) -> str:
    head = ["workload", "system", "sent / expected", "dup", "longest gap", "late p50", "p99", "max",
            "lost with the killed instance", "beat CPU s / 1k runs", "redis CPU s / 1k",
            "peak RSS"]
    rows = []
    for r in results:
        f = r["figures"]
        rows.append([
            WORKLOAD_LABELS[r["workload"]] + ("" if r["duration"] == WORKLOADS[r["workload"]][2]
                                              else f" ({r['duration']} s)"),
            LABELS[r["system"]],
            f"{f['sent']:,} / {f['expected']:,}" + (f" ({share(f['sent'], f['expected'])})"
                                                    if f["sent"] != f["expected"] else ""),
            f"{f['duplicates']:,}",
            (">= " if f["gap_open"] else "") + fmt_s(f["gap"]),
            fmt_s(f["p50"]), fmt_s(f["p99"]), fmt_s(f["max"]), lost_on_kill(r),
            f"{f['cpu_per_1k']:.2f}", f"{f['redis_per_1k']:.2f}", f"{f['rss']:.0f} MB",
        ])
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths)),
           "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(out)


def lost_on_kill(r: dict) -> str:
    """celery_anarchon: the runs the store's history shows claimed by the killed instance and
    never sent, and their share of one slot's runs (the burst the kill fell in)."""
    history = r.get("anarchon_history")
    if history is None:
        return "-"
    lost = sum(n for why, n in history.items() if why.endswith("by the killed instance"))
    return f"{lost:,} ({lost / r['entries']:.2%} of a slot)"


def notes(r: dict) -> str:
    f, bits = r["figures"], []
    if r["killed"]:
        bits.append(f"killed pid {r['killed']} at T0+{r['kill_at'] - r['t0']:.1f} s")
    if r.get("anarchon_history"):
        bits.append("missed runs per the store's history: " + ", ".join(
            f"{n} {why}" for why, n in sorted(r["anarchon_history"].items())))
    bits.append(f"{f['sent_during']:,} distinct runs sent during the window")
    bits.append(f"beat CPU {f['cpu']:.1f} s in the window ({f['cpu_pct']:.0f} % of one core)")
    bits.append(f"load average {r['load_before'][0]:.2f} before, {r['load_after'][0]:.2f} at the end")
    if r["system"] == "redbeat-3":
        bits.append("banner: " + ", ".join(b for b in r["banner"] if "lock" in b or "maxinterval" in b))
    bits.append(f"consumer CPU {r['consumer_cpu']:.1f} s, largest batch {r['consumer_largest_batch']}")
    stuck = [pid for pid, took in r["sigterm_exit_s"].items() if took is None]
    if stuck:
        bits.append(f"{len(stuck)} beat(s) still running 15 s after SIGTERM (SIGKILLed)")
    if r["undeliverable"] or r["other_messages"]:
        bits.append(f"undeliverable {r['undeliverable']}, other messages {r['other_messages']}")
    if r["log_warnings"]:
        top = list(r["log_warnings"].items())[:3]
        bits.append("log: " + "; ".join(f"{n}x {text!r}" for text, n in top))
    return f"  {r['workload']} {r['system']}: " + "; ".join(bits)


def plot(results: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    workloads = list(dict.fromkeys(r["workload"] for r in results))
    fig, axes = plt.subplots(1, len(workloads), figsize=(6.2 * len(workloads), 4.4), squeeze=False)
    colors = {"celery-1": "#1f77b4", "celery-3": "#17becf", "redbeat-3": "#d62728",
              "anarchon-3": "#2ca02c", "anarchon-cluster-3": "#9467bd"}
    for ax, workload in zip(axes[0], workloads):
        for r in results:
            if r["workload"] != workload:
                continue
            values = [max(v, 1e-3) for v in r["figures"]["lateness"]]
            if not values:
                continue
            n = len(values)
            ys = [(i + 1) / n for i in range(n)]
            ax.step(values, ys, where="post", color=colors[r["system"]],
                    label=f"{LABELS[r['system']]} ({n:,} messages)")
        ax.set_xscale("log")
        ax.set_xlabel("lateness: arrival - nominal time (s, log; below 1 ms drawn at 1 ms)")
        ax.set_ylabel("fraction of messages")
        ax.set_title(WORKLOAD_LABELS[workload])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle("Lateness of every message in the window (empirical CDF)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


#: functions whose inclusive share of the profiled beat's wall time is printed, in this order
PROFILE_FUNCTIONS = [
    ("Service.start", "beat's loop (everything)"),
    ("time.sleep", "  sleeping between ticks"),
    ("Scheduler.tick", "  Scheduler.tick"),
    ("Scheduler._follow_schedule_changes", "    comparing beat_schedule with its last copy"),
    ("DueRuns.pop", "    popping due runs, building claim requests"),
    ("RedisLeaseStore.claim", "    claiming (one EVALSHA per chunk)"),
    ("SendQueue.send_many", "    sending won runs (one send batch per chunk)"),
    ("Task.apply_async", "      of which building and buffering messages (apply_async)"),
    ("PublishBatch.flush", "      of which kombu's batch write (pipelined LPUSH)"),
    ("NoteBuffer.flush", "    writing history notes"),
    ("RedisHistory.record_many", "      of which one pipelined EVALSHA per note"),
    ("SocketBuffer._read_from_socket", "waiting for a Redis reply (any)"),
]


def summarise_profile(path: str, top: int = 12) -> str:
    """Where one beat's wall time went, from a py-spy ``raw`` file recorded with ``--idle``."""
    own, incl, total = collections.Counter(), collections.Counter(), 0
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            if not stack:
                continue
            n = int(count)
            total += n
            frames = [frame.split(" (")[0] for frame in stack.split(";")]
            own[frames[-1]] += n
            for frame in set(frames):
                incl[frame] += n
            if "time.sleep" not in frames and frames[-1] == "Service.start":
                incl["time.sleep"] += n                   # time.sleep is C: its caller is the leaf
    if not total:
        return "(no samples)"
    lines = [f"py-spy, {total} samples of one surviving beat (wall time, idle included):"]
    lines += [f"  {incl[name] / total:6.1%}  {label}" for name, label in PROFILE_FUNCTIONS]
    lines.append("  top functions by own samples:")
    lines += [f"  {n / total:6.1%}  {frame}" for frame, n in own.most_common(top)]
    return "\n".join(lines)


def git_revision() -> str:
    """The commit of the celery_anarchon under test, ``+dirty`` when celery_anarchon/ has changes."""
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "celery_anarchon"],
                               capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version
    out = {"python": sys.version.split()[0]}
    for name in ("celery", "kombu", "redis", "celery-redbeat"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


# -- main -----------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 s and 60 s windows instead of 60 s and 180 s")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--port", type=int, default=6431)
    parser.add_argument("--json", help="write every figure and raw observation here")
    parser.add_argument("--plot", help="write the lateness plot (PNG) here")
    parser.add_argument("--profile", action="store_true",
                        help="py-spy one surviving celery_anarchon beat during its window")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument("--replot", help="only redraw --plot and the table from a --json file")
    parser.add_argument("--idle", default=",".join(str(n) for n in IDLE_SIZES),
                        help="entry counts of the idle table ('' for none)")
    parser.add_argument("--idle-systems", default=",".join(IDLE_SYSTEMS))
    args = parser.parse_args()

    if args.replot:
        with open(args.replot) as f:
            results = json.load(f)["results"]
        for raw in results:
            raw["figures"] = analyse(raw)
        print(table(results))
        print()
        print(table(results, markdown=True))
        if args.plot:
            plot(results, args.plot)
        return

    workdir = tempfile.mkdtemp(prefix="anarchon-dispatch-")
    server = OwnRedis(args.port, workdir)
    revision = git_revision()
    print(f"{os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"redis-server {server.version} on port {args.port}; celery_anarchon {revision}; "
          f"work directory {workdir}")
    results, idle = [], []
    cluster = None
    try:
        workloads = list(filter(None, args.workloads.split(",")))
        if workloads and CLUSTER_SYSTEMS & set(args.systems.split(",")):
            from redis_cluster import RedisClusterRig
            cluster = RedisClusterRig(folder=os.path.join(workdir, "cluster"))
            cluster.start()                         # stopped in the finally below, started or not
            print(f"Redis Cluster of our own: {cluster.url}", flush=True)
        for workload in workloads:
            for system in args.systems.split(","):
                if workload not in WORKLOADS or system not in SYSTEMS:
                    raise SystemExit(f"unknown workload or system: {workload} {system}")
                run = Run(server, workdir, system, workload, args.quick, args.profile, cluster)
                print(f"{workload} {system}: {run.entries:,} entries every {run.interval:g} s, "
                      f"{run.instances} instance(s), window {run.duration} s ...", flush=True)
                raw = run.execute()
                raw["figures"] = analyse(raw)
                results.append(raw)
                print(notes(raw), flush=True)
                if raw["profile"] and os.path.exists(raw["profile"]):
                    print(summarise_profile(raw["profile"]))
        for entries in (int(n) for n in filter(None, args.idle.split(","))):
            for system in args.idle_systems.split(","):
                if system not in IDLE_SYSTEMS:
                    raise SystemExit(f"unknown idle system: {system}")
                if system == "redbeat-1" and entries > REDBEAT_IDLE_MAX:
                    continue
                print(f"idle {system}: {entries:,} daily crontabs ...", flush=True)
                out = IdleRun(server, workdir, system, entries, args.quick).execute()
                idle.append(out)
                print(f"  {out}", flush=True)
    finally:
        if cluster is not None:
            cluster.close()
        server.stop()
    print()
    if results:
        print(table(results))
        print()
        for r in results:
            print(notes(r))
        print()
        print(table(results, markdown=True))
    if idle:
        print()
        print(idle_table(idle))
        print()
        print(idle_table(idle, markdown=True))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpus": os.cpu_count(), "redis": server.version, "argv": sys.argv,
                       "revision": revision, "versions": versions(),
                       "results": results, "idle": idle}, f)
    if args.plot and results:
        plot(results, args.plot)
    if args.keep:
        print(f"logs: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
