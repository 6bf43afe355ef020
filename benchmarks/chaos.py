"""Chaos run: five beat instances, fifty entries, real workers, random faults; is every run sent
exactly once, or missed for a recorded reason?

    python benchmarks/chaos.py --store redis-aof --minutes 10 --seed 1 --out /tmp/chaos-redis-aof

Five ``celery beat`` processes with our Scheduler (tests/support/apps/chaos_app.py: 15 entries every
second, 12 every 2 s, 12 every 5 s, 6 every-minute crontabs, 5 leased entries with a 6 s lease
and 1 s heartbeat whose task works 2-4 s; max_late 15 s), a threads worker for the plain entries
and a prefork worker for the leased ones, for ``--minutes``, while benchmarks/chaos_faults.py
breaks things at moments drawn from ``--seed``: SIGKILL and restart of a beat, SIGSTOP / SIGCONT of
a beat (0.1 s to longer than max_late), a restart of the store server, a broker outage, 0-2 s of
latency on the store connection, a stopped worker under leased tasks, and one beat (beat-5)
restarted with its clock 5 s ahead or behind (libfaketime) for a while.

``--store redis-sentinel --beats 3``: the store is benchmarks/ha_redis.py's RedisHA (a master, two
replicas, three Sentinels; nothing kept on disk), reached through ``sentinel://`` with
``master_name`` by the beats, the workers and the harness's own history reads; its faults are
SIGKILL of the master (Sentinel fails over on its own), ``SENTINEL FAILOVER``, a replica lagging
when it is promoted (the writes it missed are lost), and beats stopped across a failover, besides
the beat and broker faults (no latency fault: clients reach the master Sentinel names, without a
proxy). ``--beats`` sets how many beats run (default 5); the last one is the skewed one.

Servers of its own, on free ports: the broker is a redis-server that keeps its data (AOF,
``appendfsync always``); ``--store redis-aof`` a redis-server that keeps its data, ``--store redis``
one that keeps nothing (its restart is amnesia: the store must turn it into recorded misses,
``forgotten``, never duplicates); ``--store postgresql`` a PostgreSQL cluster of its own (initdb +
pg_ctl, restarted with ``-m fast`` or ``-m immediate``); ``--store sqlite`` a file (no server to
restart: the store fault is another process holding the database's exclusive lock, and there is
no clock skew, since SQLite coordinates the processes of one host, which share one clock). The
shared servers (Redis 6379, PostgreSQL 5432, ...) are never touched.

It prints runs expected, executed exactly once, duplicates, lease reruns the guarantee allows,
misses explained by a recorded reason (by reason), unexplained misses, the faults with their
times and the lateness distribution, and exits 1 on any duplicate or unexplained miss (2 when the
harness itself failed). Everything lands in ``--out``: summary.json, executions.jsonl,
history.jsonl, faults.jsonl, instances.jsonl, runs.jsonl (every run that did not run exactly
once, with its history and log reasons) and the logs of every process and server.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
APPS = os.path.join(ROOT, "tests", "support", "apps")
for path in (HERE, os.path.join(ROOT, "tests", "support"), APPS, ROOT):
    if path not in sys.path:
        sys.path.insert(0, path)

import chaos_app  # noqa: E402  (tests/support/apps: the schedule, also loaded by every process)
from chaos_analysis import analyse  # noqa: E402
from chaos_faults import FAKETIME_LIB, KINDS, STORE_KINDS, Fault, FaultRunner, plan  # noqa: E402
from procs import CeleryProcs  # noqa: E402
from servers import PostgresServer, RedisServer  # noqa: E402
from ha_redis import RedisHA  # noqa: E402
from tcp_proxy import TCPProxy  # noqa: E402

from celery_anarchon.stores import open_store  # noqa: E402
from backends import backdate_memory_start  # noqa: E402

STORES = tuple(STORE_KINDS)
BEATS = [f"beat-{n}" for n in range(1, 6)]
SKEWED = "beat-5"
#: CI=true: a fault that cannot be injected (libfaketime missing) fails the run instead
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
MAX_LATE_S = 15.0
#: after the window closes, beats keep running this long so that late claims and takeovers of the
#: window's last runs can still happen
DRAIN_S = MAX_LATE_S + 15
HISTORY_SIZE = 600
#: what a run writes into --out (besides beat-* and claims.sqlite3*), removed before a new run
OUR_FILES = {"summary.json", "summary.txt", "executions.jsonl", "history.jsonl", "faults.jsonl",
             "instances.jsonl", "runs.jsonl", "worker-plain.log", "worker-leases.log", "broker.log",
             "store.log", "postgresql.log", "broker-data", "store-data", "store-ha"}
DUMP_EVERY_S = 15.0


def say(text: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {text}", flush=True)


class Harness:
    """The processes and servers of one run, and the operations the faults use."""

    SKEWED = SKEWED

    def __init__(self, store: str, out: str, seed: int) -> None:
        self.kind = store
        self.out = out
        self.namespace = f"chaos-{seed}-{uuid.uuid4().hex[:6]}"
        self.queue = f"chaos-{self.namespace}"
        self.procs: dict[str, subprocess.Popen] = {}
        #: the Celery processes (benchmarks/procs.py); ``procs`` holds their Popen by name
        self.celery = CeleryProcs(out, app="chaos_app")
        self.incarnation: dict[str, int] = {}
        self.instances: list[dict] = []
        self.lock = threading.Lock()
        self.history: dict[tuple, dict] = {}
        self.store_server = self.pg = self.proxy = None
        #: --store redis-sentinel: the rig, and a killed master to restart when a fault ends
        self.ha: RedisHA | None = None
        self.pending_rejoin = None
        self.broker = RedisServer("broker", out, persistent=True)
        #: SKEWED's clock offset (libfaketime's FAKETIME) for its next start, "" for none
        self.skew = ""
        self.skew_windows: list[list] = []
        #: workers that exited on their own during the run (a crash: restarted, as a supervisor would)
        self.worker_restarts: list[dict] = []
        self.stopping = False

    # -- servers -----------------------------------------------------------------------------
    def start_servers(self) -> None:
        self.broker.start()
        if self.kind in ("redis", "redis-aof"):
            self.store_server = RedisServer("store", self.out, persistent=self.kind == "redis-aof")
            self.store_server.start()
            self.direct_url = self.store_server.url
            target = self.store_server.port
        elif self.kind == "redis-sentinel":    # clients go where Sentinel says: no proxy
            self.ha = RedisHA(replicas=2, sentinels=3,
                              folder=os.path.join(self.out, "store-ha")).start()
            self.direct_url = self.ha.sentinel_url
            target = None
        elif self.kind == "postgresql":
            self.pg = PostgresServer("postgresql", self.out)
            self.pg.create()
            self.direct_url = self.pg.url
            target = self.pg.port
        else:
            self.direct_url = "sqlite:///" + os.path.join(self.out, "claims.sqlite3")
            target = None
        if target is not None:      # everybody but the harness reaches the store through the proxy
            self.proxy = TCPProxy(("127.0.0.1", target)).start()
            self.store_url = self.direct_url.replace(f":{target}/", f":{self.proxy.port}/")
        else:
            self.store_url = self.direct_url
        self.store = open_store(self.direct_url, namespace=self.namespace, instance_id="chaos",
                                options=self.store_options())
        entries = list(chaos_app.SCHEDULE)
        self.store.prepare(entries)
        # a store in service for a while (a brand-new one refuses its first 10 s of slots)
        backdate_memory_start(self.store, entries, 120_000)

    def store_options(self) -> dict:
        if self.kind == "redis-sentinel":
            return {"history_size": HISTORY_SIZE, "master_name": RedisHA.master_name}
        return {"history_size": HISTORY_SIZE}

    def env(self) -> dict:
        env = dict(os.environ)
        env.update({
            "PYTHONPATH": os.pathsep.join(filter(None, [APPS, ROOT, env.get("PYTHONPATH", "")])),
            "PYTHONUNBUFFERED": "1",
            "CHAOS_BROKER": self.broker.url, "CHAOS_STORE": self.store_url,
            "CHAOS_STORE_OPTIONS": json.dumps(self.store_options()),
            "CHAOS_NAMESPACE": self.namespace, "CHAOS_QUEUE": self.queue,
            "CHAOS_MAX_LATE": str(MAX_LATE_S), "CHAOS_OUT": os.path.join(self.out, "executions.jsonl"),
        })
        if self.kind == "redis-sentinel":   # see tests/support/apps/chaos_app.py
            env["CHAOS_LOG_EVERY_SKIP"] = "1"
        return env

    # -- processes ---------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str], env: dict, log: str) -> subprocess.Popen:
        return self.celery.start(name, *args, env=env, log=log, append=True).popen

    WORKERS = {
        "worker-plain": ["-P", "threads", "-c", "16"],
        "worker-leases": ["-P", "prefork", "-c", "4"],
    }

    def start_workers(self) -> None:
        for name in self.WORKERS:
            self._start_worker(name)

    def _start_worker(self, name: str) -> None:
        queue = self.queue + ("-leases" if name == "worker-leases" else "")
        label = name.split("-", 1)[1]
        self.procs[name] = self._spawn(
            name, ["worker", *self.WORKERS[name], "-Q", queue, "-n", f"{label}-{self.namespace}@%h",
                   "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "info"],
            self.env(), os.path.join(self.out, f"{name}.log"))

    def supervise_loop(self, stop: threading.Event) -> None:
        """Restart a worker that exited on its own (Celery's worker can die of a broker outage:
        kombu's Redis transport raised AttributeError in one of these runs), as systemd or
        supervisord would; the restart is reported, and the messages the dead worker had
        reserved are counted apart (see chaos_analysis)."""
        while not stop.wait(0.5):
            for name in self.WORKERS:
                proc = self.procs.get(name)
                if proc is None or proc.poll() is None or self.stopping:
                    continue
                self.worker_restarts.append({"worker": name, "exit": proc.returncode,
                                             "at": time.time()})
                say(f"{name} exited on its own (exit {proc.returncode}; see {name}.log); restarted")
                self._start_worker(name)

    def start_beat(self, name: str) -> str:
        """Start (or restart) beat ``name`` (SKEWED under libfaketime, see :meth:`set_skew`)."""
        n = self.incarnation.get(name, -1) + 1
        self.incarnation[name] = n
        env = self.env()
        detail = ""
        if name == SKEWED and self.skew:
            # a constant offset of every clock of the process (its monotonic clock too, which
            # stays monotonic); FAKETIME_DONT_FAKE_MONOTONIC breaks Python's time.sleep (EINVAL)
            env.update(LD_PRELOAD=FAKETIME_LIB, FAKETIME=self.skew, FAKETIME_DONT_RESET="1")
            detail = f"clock {self.skew}"
        log = os.path.join(self.out, f"{name}.{n}.log")
        schedule = os.path.join(self.out, f"{name}-unused-schedule")
        proc = self._spawn(name, ["beat", "-l", "info", "--schedule", schedule], env, log)
        with self.lock:
            self.procs[name] = proc
            self.instances.append({"beat": name, "incarnation": n, "log": log, "pid": proc.pid,
                                   "started": time.time(), "skew": detail, "ended_by": None})
        return detail

    def _current(self, name: str) -> dict:
        return [i for i in self.instances if i["beat"] == name][-1]

    def kill_beat(self, name: str) -> str:
        proc = self.celery.kill(name).popen
        with self.lock:
            inst = self._current(name)
            inst.update(ended=time.time(), ended_by="SIGKILL")
        return f"{name}.{inst['incarnation']} (pid {proc.pid})"

    def signal_beat(self, name: str, sig: int) -> None:
        self.celery.signal(name, sig)

    def signal_runner(self, sig: int) -> None:
        self.celery.signal("worker-leases", sig)

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        waiting = {"worker-plain": "ready.", "worker-leases": "ready.",
                   **{b: "anarchon: instance" for b in BEATS}}
        while waiting and time.monotonic() < deadline:
            for name, text in list(waiting.items()):
                log = (self._current(name)["log"] if name in BEATS
                       else os.path.join(self.out, f"{name}.log"))
                with open(log, encoding="utf-8", errors="replace") as f:
                    if text in f.read():
                        del waiting[name]
                if self.procs[name].poll() is not None:
                    raise RuntimeError(f"{name} exited at start-up; see {log}")
            time.sleep(0.2)
        if waiting:
            raise RuntimeError(f"not ready after {timeout} s: {sorted(waiting)}")

    # -- store and broker faults -------------------------------------------------------------------
    def store_down(self, how: str) -> None:
        self.dump_history()          # a Redis without persistence forgets its history too
        if self.pg is not None:
            self.pg.stop("immediate" if how == "crash" else "fast")
        else:
            self.store_server.stop(signal.SIGKILL if how == "crash" else signal.SIGTERM)

    def store_up(self) -> None:
        if self.pg is not None:
            self.pg.start()
        else:
            self.store_server.start()

    def lock_store(self, seconds: float) -> None:
        conn = sqlite3.connect(self.direct_url[len("sqlite:///"):], timeout=30,
                               isolation_level=None)
        try:
            conn.execute("BEGIN EXCLUSIVE")
            time.sleep(seconds)
            conn.execute("ROLLBACK")
        finally:
            conn.close()

    def broker_down(self) -> None:
        self.broker.stop(signal.SIGTERM)

    def broker_up(self) -> None:
        self.broker.start()

    def can_skew(self) -> bool:
        return os.path.exists(FAKETIME_LIB) and self.kind != "sqlite"

    def set_skew(self, offset: str) -> str:
        """Restart SKEWED (SIGTERM, then start) with its clock at ``offset`` ("+5s", "-5s") from
        the true time, or with a true clock (``""``). Returns what was done."""
        self.skew = offset
        if offset:
            self.skew_windows.append([time.time(), None, offset])
        elif self.skew_windows:
            self.skew_windows[-1][1] = time.time()
        proc = self.procs[SKEWED]
        how = ""
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            how = "SIGTERM"
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:   # seen: a SIGTERM during a store call is swallowed
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
                how = "SIGTERM ignored for 15 s, then SIGKILL"
            with self.lock:
                self._current(SKEWED).update(ended=time.time(), ended_by="SIGTERM", how=how)
        return (self.start_beat(SKEWED) or "true clock") + (f" (old one: {how})" if how else "")

    def set_latency(self, seconds: float) -> None:
        self.proxy.delay_s = seconds

    # -- the replicated store (--store redis-sentinel) ------------------------------------------
    def _rejoin(self, node) -> None:
        """Start a killed node again (empty: the rig keeps nothing on disk) as a replica of the
        current master, as an operator would."""
        args = list(node.args)
        if "--replicaof" in args:
            at = args.index("--replicaof")
            del args[at:at + 3]
        node.args = (*args, "--replicaof", "127.0.0.1", str(self._sync_master().port))
        self.ha.restart(node)

    def _sync_master(self, timeout: float = 30):
        """The master the Sentinels name now, once it answers as master (it becomes the rig's
        ``master``). Sentinel may fail over again on its own (a new master slow to answer within
        down-after, 1 s, is failed over too): the rig's idea of the master can be stale."""
        deadline = time.monotonic() + timeout
        while True:
            port = self.ha._sentinel_master_port()
            node = next((n for n in self.ha.nodes if n.port == port), None)
            try:
                if node is not None and node.info("replication")["role"] == "master":
                    self.ha.master = node
                    return node
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"no master named by the Sentinels answers as one after {timeout:g} s")
            time.sleep(0.1)

    def _wait_demoted(self, old, since: float, timeout: float = 30) -> str:
        """Until the old master (alive) answers as a replica: how long it was still a master."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if old.info("replication")["role"] == "slave":
                    return f"{old.name} a replica {time.time() - since:.1f} s after the failover began"
            except Exception:
                pass
            time.sleep(0.1)
        return f"{old.name} still a master {timeout:g} s after the failover"

    def master_kill(self, restart_after: float | None) -> str:
        """SIGKILL the master and wait until Sentinel promotes a replica; ``restart_after``
        seconds later restart the old master as a replica (None: :meth:`finish_failover` does).
        Returns what happened."""
        self.dump_history()     # a lost write may take history records with it
        old = self._sync_master()
        began = time.time()
        self.ha.kill(old)
        new = self.ha.wait_new_master(old, timeout=60)
        detail = (f"{old.name} (:{old.port}) killed; Sentinel promoted {new.name} (:{new.port}) "
                  f"after {time.time() - began:.1f} s")
        if restart_after is None:
            self.pending_rejoin = old
            return detail
        time.sleep(restart_after)
        self._rejoin(old)
        return detail + f"; {old.name} restarted as its replica"

    def sentinel_failover(self) -> str:
        """``SENTINEL FAILOVER``; waits for the promotion and for the old master's demotion."""
        self.dump_history()
        old = self._sync_master()
        began = time.time()
        new = self.ha.failover(timeout=60)
        return (f"SENTINEL FAILOVER {old.name} -> {new.name} in {time.time() - began:.1f} s; "
                + self._wait_demoted(old, began))

    def lag_failover(self, lag_s: float, which: int) -> str:
        """Replica ``which`` (0 or 1 of the two that are not the master) stops receiving the
        master's writes (its replication is routed through a TCP proxy that stops forwarding),
        ``lag_s`` later the other replica is stopped (SIGSTOP; Sentinel then sees it down) and
        ``SENTINEL FAILOVER`` promotes the lagging one: the writes it missed are lost, the old
        master and the other replica resync from it. (The rig's own proxies do not serve here:
        Sentinel points every replica at the master's own address about 10 s after it sees it
        replicate from elsewhere, and a failover re-points them too; this route lives < 10 s.)"""
        self.dump_history()
        old = self._sync_master()
        candidates = [n for n in self.ha.nodes if n is not old and n.alive()
                      and n.info("replication")["role"] == "slave"]
        if len(candidates) != 2:
            raise RuntimeError(f"lag-failover needs two live replicas, has {len(candidates)}")
        lagging, other = candidates[which], candidates[1 - which]
        proxy = TCPProxy(("127.0.0.1", old.port)).start()
        stopped = False
        try:
            lagging.command("REPLICAOF", "127.0.0.1", str(proxy.port))
            deadline = time.monotonic() + 20
            while True:
                info = lagging.info("replication")
                if info.get("master_port") == proxy.port and info.get("master_link_status") == "up":
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{lagging.name} did not resync through the lag proxy")
                time.sleep(0.05)
            proxy.pause()
            time.sleep(lag_s)
            os.kill(other.proc.pid, signal.SIGSTOP)
            stopped = True
            sentinel = self.ha.sentinels[0]
            deadline = time.monotonic() + 15
            while not any(r["port"] == other.port and r["is_sdown"] for r in
                          redis_sentinel_replicas(sentinel.port, self.ha.master_name)):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{sentinel.name} never saw {other.name} down")
                time.sleep(0.1)
            behind = (old.info("replication")["master_repl_offset"]
                      - lagging.info("replication").get("slave_repl_offset", 0))
            began = time.time()
            new = self.ha.failover(timeout=60)
        finally:
            if stopped:
                os.kill(other.proc.pid, signal.SIGCONT)
            proxy.close()
        return (f"{lagging.name} lagging {lag_s:.1f} s ({behind} bytes behind {old.name}), "
                f"{other.name} stopped; SENTINEL FAILOVER promoted {new.name} in "
                f"{time.time() - began:.1f} s; " + self._wait_demoted(old, began))

    def finish_failover(self) -> str:
        """The end of a fault that left a killed master down: restart it as a replica."""
        if self.pending_rejoin is None:
            return ""
        node, self.pending_rejoin = self.pending_rejoin, None
        self._rejoin(node)
        return f"; {node.name} restarted as a replica"

    # -- history ----------------------------------------------------------------------------------
    def dump_history(self) -> None:
        """Keep every distinct history record seen (a restart without persistence wipes them)."""
        try:
            for entry in chaos_app.SCHEDULE:
                for rec in self.store.history.read(entry, limit=HISTORY_SIZE):
                    key = (rec.entry, rec.slot_ms, rec.event.value, rec.instance, rec.attempt)
                    if key not in self.history:
                        self.history[key] = {"entry": rec.entry, "slot_ms": rec.slot_ms,
                                             "event": rec.event.value, "instance": rec.instance,
                                             "store_ms": rec.store_ms, "task_id": rec.task_id,
                                             "attempt": rec.attempt, "detail": rec.detail}
        except Exception as exc:  # the store is down or slow: the next dump catches up
            say(f"history dump failed ({type(exc).__name__}: {exc}); the next one catches up")

    def dump_loop(self, stop: threading.Event) -> None:
        while not stop.wait(DUMP_EVERY_S):
            self.dump_history()

    # -- the end -------------------------------------------------------------------------------------
    def stop_all(self) -> None:
        self.stopping = True
        for name in BEATS + ["worker-leases", "worker-plain"]:
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            try:   # workers: a warm shutdown of the parent lets running tasks finish
                os.killpg(proc.pid, signal.SIGCONT)
                os.kill(proc.pid, signal.SIGTERM)
                proc.wait(20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if name in BEATS:
                with self.lock:
                    inst = self._current(name)
                    if inst["ended_by"] is None:
                        inst.update(ended=time.time(), ended_by="end of run")

    def close_servers(self) -> None:
        try:
            self.store.close()
        except Exception:
            pass
        if self.proxy is not None:
            self.proxy.close()
        if self.store_server is not None:
            self.store_server.stop()
        if self.pg is not None:
            self.pg.destroy(keep_log_in=self.out)
        if self.ha is not None:
            self.ha.close()      # its folder (logs) stays in --out
        self.broker.stop()

    def write_files(self) -> None:
        with open(os.path.join(self.out, "instances.jsonl"), "w", encoding="utf-8") as f:
            for inst in self.instances:
                f.write(json.dumps(inst) + "\n")
        with open(os.path.join(self.out, "history.jsonl"), "w", encoding="utf-8") as f:
            for rec in sorted(self.history.values(), key=lambda r: (r["entry"], r["slot_ms"])):
                f.write(json.dumps(rec) + "\n")


def redis_sentinel_replicas(port: int, master_name: str) -> list[dict]:
    """``SENTINEL REPLICAS`` of the Sentinel on ``port``, as redis-py parses it (dicts)."""
    import redis
    with redis.Redis(port=port, decode_responses=True, socket_timeout=5) as client:
        return client.sentinel_slaves(master_name)


def use_beats(count: int) -> None:
    """Run ``count`` beats, beat-1 to beat-<count>; the last one is the skewed one. At least 3:
    up to MAX_BEATS_DOWN (2) are stopped at once, and one must always be there."""
    global BEATS, SKEWED
    if count < 3:
        raise SystemExit(f"--beats {count}: at least 3 (up to 2 are stopped at once)")
    BEATS = [f"beat-{n}" for n in range(1, count + 1)]
    SKEWED = Harness.SKEWED = BEATS[-1]


def fmt_s(value) -> str:
    return "-" if value is None else f"{value:.3f} s"


def report(summary: dict, faults: list, t0: float) -> str:
    lines = [
        f"store {summary['store']}, seed {summary['seed']}, {summary['minutes']:g} min, "
        f"window {summary['window_s']:.0f} s, {len(BEATS)} beats, {summary['entries']} entries",
        f"runs expected:            {summary['expected']}",
        f"executed exactly once:    {summary['executed_once']}",
        f"duplicates:               {summary['duplicates']}",
        f"lease reruns allowed:     {summary['lease_lost_reruns']} (a runner paused past its lease "
        f"learned it lost it, and another attempt ran)",
        f"missed, explained:        {summary['explained']}  "
        + ", ".join(f"{k} {v}" for k, v in summary["explained_by_reason"].items())
        + ("  (claimed: the winner was killed between its claim and its send)"
           if "claimed" in summary["explained_by_reason"] else ""),
        f"missed, unexplained:      {summary['unexplained']}"
        + (f"  (reasons logged without a fault that can cause them: "
           + ", ".join(f"{k} {v}" for k, v in summary["reasons_without_fault"].items()) + ")"
           if summary.get("reasons_without_fault") else ""),
        f"sent, lost by the broker: {summary.get('sent_lost_by_broker', 0)} (the broker's AOF shows "
        f"a worker popped the message and the broker stopped before it was recorded unacked; "
        f"bound {summary.get('sent_lost_by_broker_verdict', {}).get('bound', '-')})",
        f"sent, never acknowledged: {summary.get('sent_unacked_by_worker', 0)} (the broker's AOF "
        f"shows a worker took the message and never acknowledged it; kombu gives it back after its "
        f"visibility timeout, 1 h; bound "
        f"{summary.get('sent_unacked_by_worker_verdict', {}).get('bound', '-')})",
        f"workers that died: {len(summary.get('worker_crashes', []))} (restarted "
        f"{len(summary.get('worker_restarts', []))} time(s))",
    ]
    for line in summary.get("worker_crashes", [])[:5]:
        lines.append(f"  worker crash: {line}")
    for run in summary["unexplained_runs"][:10]:
        lines.append(f"  unexplained: {run[0]} slot {run[1]}" + (f" (broker: {run[2]})" if len(run) > 2 else ""))
    lines.append(f"leases: {summary['takeovers']} takeovers, {summary['dropped_messages']} "
                 f"messages dropped by the worker, {summary['leases_lost']} bodies saw their lease "
                 f"lost or their release refused; {summary['spurious_lost_warnings']} 'lost its "
                 f"lease' warnings about runs released normally")
    for key, name in (("lateness_s", "all runs"), ("lateness_plain_s", "plain entries"),
                      ("lateness_unskewed_s", "runs sent by a beat with a true clock")):
        d = summary[key]
        lines.append(f"lateness ({name}, first body start - slot): p50 {fmt_s(d['p50'])}, "
                     f"p90 {fmt_s(d['p90'])}, p99 {fmt_s(d['p99'])}, max {fmt_s(d['max'])}, "
                     f"min {fmt_s(d['min'])}")
    lines.append(f"clock skew of {SKEWED}: {summary['skew']}; a skewed instance sent the first "
                 f"body of {summary['sent_by_skewed']} runs")
    lines.append(f"faults ({sum(1 for f in faults if not f.skipped)} injected, "
                 f"{sum(1 for f in faults if f.skipped)} skipped):")
    for f in sorted(faults, key=lambda f: f.at):
        when = f.started - t0 if f.started else f.at
        if f.skipped:
            lines.append(f"  +{when:6.1f} s  {f.kind:14s} skipped: {f.skipped}")
        else:
            lasted = (f.ended or f.started) - f.started
            lines.append(f"  +{when:6.1f} s  {f.kind:14s} {f.target:8s} {f.param:9s} "
                         f"{lasted:5.1f} s  {f.detail.strip()}")
    counts: dict[str, int] = {}
    for f in faults:
        if not f.skipped:
            counts[f.kind] = counts.get(f.kind, 0) + 1
    lines.append("faults by kind: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if summary.get("fault_kinds_missing"):
        lines.append("fault kinds never injected: " + ", ".join(summary["fault_kinds_missing"]))
    return "\n".join(lines)


def run(store: str, minutes: float, seed: int, out: str, beats: int = 5) -> int:
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(out):     # the files of an earlier run in this folder, and only those
        path = os.path.join(out, name)
        if fnmatch.fnmatch(name, "beat-*") or name in OUR_FILES or name.startswith("claims.sqlite3"):
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    if shutil.which("redis-server") is None:
        say("redis-server is not installed (the broker, and the Redis stores, are servers of "
            "this run's own): apt-get install redis-server")
        return 2
    seconds = minutes * 60
    use_beats(beats)
    h = Harness(store, out, seed)
    if store == "sqlite":
        say("clock skew: not injected on SQLite (one host, one clock: the store's clock is the "
            "claiming process's own)")
    elif not h.can_skew():
        if IN_CI:
            say(f"clock skew cannot be injected: libfaketime is missing ({FAKETIME_LIB}); CI=true "
                "needs every fault kind (.ci/run installs Debian's faketime)")
            return 2
        say(f"clock skew: skipped, libfaketime is missing ({FAKETIME_LIB}; apt-get install faketime)")
    faults = plan(seed, seconds, store, BEATS, MAX_LATE_S)
    runner = None
    stop_dumps = threading.Event()
    try:
        h.start_servers()
        say(f"store {store}: {h.direct_url} (clients through {h.store_url}); broker {h.broker.url}; "
            f"namespace {h.namespace}; out {out}")
        h.start_workers()
        for name in BEATS:
            h.start_beat(name)
        h.wait_ready()
        t0 = time.time() + 2.0
        t1 = t0 + seconds
        say(f"all up; measured window {seconds:g} s from {time.strftime('%H:%M:%S', time.localtime(t0))}"
            f"; {len(faults)} faults planned")
        threading.Thread(target=h.dump_loop, args=(stop_dumps,), daemon=True).start()
        threading.Thread(target=h.supervise_loop, args=(stop_dumps,), daemon=True).start()
        runner = FaultRunner(h, faults, t0, os.path.join(out, "faults.jsonl"), say)
        runner.start()
        time.sleep(max(0.0, t1 - time.time()))
        runner.join()
        say(f"window closed; {DRAIN_S:g} s more for late claims and takeovers")
        time.sleep(DRAIN_S)
        h.stop_all()
        time.sleep(1)
        stop_dumps.set()
        h.dump_history()
    except BaseException as exc:
        say(f"harness failure: {type(exc).__name__}: {exc}")
        h.stop_all()
        raise
    finally:
        stop_dumps.set()
        h.write_files()
        h.close_servers()

    summary = analyse(out, chaos_app.ENTRY_PERIODS_MS, set(chaos_app.LEASED_ENTRIES),
                      int(t0 * 1000), int(t1 * 1000), worker_restarts=h.worker_restarts)
    summary.update(t0_ms=int(t0 * 1000), t1_ms=int(t1 * 1000), skew_windows=h.skew_windows,
                   worker_restarts=h.worker_restarts)
    return finish(out, summary, store, seed, minutes, faults, runner.errors, t0)


def finish(out: str, summary: dict, store: str, seed: int, minutes: float, faults: list,
           errors: list, t0: float) -> int:
    """Write summary.json and summary.txt, print the report, and return the exit status."""
    seconds = minutes * 60
    summary.update(store=store, seed=seed, minutes=minutes, window_s=seconds, beats=len(BEATS),
                   entries=len(chaos_app.SCHEDULE), skew=(
                       ", ".join(f"{o} from +{a - t0:.0f} s to +{b - t0:.0f} s"
                                 for a, b, o in summary["skew_windows"] if b) or "none"),
                   faults=[f.as_dict() for f in faults], harness_errors=errors,
                   faults_injected=sum(1 for f in faults if not f.skipped))
    injected = {f.kind for f in faults if not f.skipped}
    required = set(STORE_KINDS[store])
    if "skew" in required and not os.path.exists(FAKETIME_LIB) and not IN_CI:
        required.discard("skew")         # said at the start; CI=true refuses to run without it
        summary["fault_kinds_not_required"] = ["skew (libfaketime is missing)"]
    summary["fault_kinds_missing"] = sorted(required - injected)
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    text = report(summary, faults, t0)
    with open(os.path.join(out, "summary.txt"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print(text, flush=True)
    if errors:
        say("harness errors: " + "; ".join(errors))
        return 2
    if summary["duplicates"] or summary["unexplained"]:
        say(f"FAILED: {summary['duplicates']} duplicates, {summary['unexplained']} unexplained "
            f"misses; see {os.path.join(out, 'runs.jsonl')}")
        return 1
    if not summary["broker_losses_ok"]:
        say(f"FAILED: broker-side losses beyond what the broker outages explain: popped and lost "
            f"{summary['sent_lost_by_broker_verdict']}, never acknowledged "
            f"{summary['sent_unacked_by_worker_verdict']}")
        return 1
    if summary["fault_kinds_missing"]:
        say(f"FAILED: fault kinds of the {store} store never injected: "
            f"{', '.join(summary['fault_kinds_missing'])} (the run tested less than it claims)")
        return 1
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="faults:\n" + "\n".join(f"  {k}: {v}" for k, v in KINDS.items()))
    parser.add_argument("--store", choices=STORES, default="redis-aof")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--beats", type=int, default=len(BEATS),
                        help="beat instances (default %(default)s; at least 3)")
    parser.add_argument("--out", default=None,
                        help="results folder (default: /tmp/anarchon-chaos-<store>-<seed>)")
    parser.add_argument("--reanalyse", action="store_true",
                        help="do not run: analyse the files of a finished run in --out again")
    args = parser.parse_args(argv)
    out = os.path.abspath(args.out or os.path.join("/tmp", f"anarchon-chaos-{args.store}-{args.seed}"))
    if args.reanalyse:
        return reanalyse(out)
    return run(args.store, args.minutes, args.seed, out, beats=args.beats)


def reanalyse(out: str) -> int:
    """Analyse a finished run's files again (after a change to chaos_analysis.py)."""
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        old = json.load(f)
    use_beats(old.get("beats", 5))
    summary = analyse(out, chaos_app.ENTRY_PERIODS_MS, set(chaos_app.LEASED_ENTRIES),
                      old["t0_ms"], old["t1_ms"], worker_restarts=old.get("worker_restarts", []))
    summary.update(t0_ms=old["t0_ms"], t1_ms=old["t1_ms"], skew_windows=old["skew_windows"],
                   worker_restarts=old.get("worker_restarts", []))
    faults = [Fault(**d) for d in old["faults"]]
    return finish(out, summary, old["store"], old["seed"], old["minutes"], faults,
                  old["harness_errors"], old["t0_ms"] / 1000)


if __name__ == "__main__":
    sys.exit(main())
