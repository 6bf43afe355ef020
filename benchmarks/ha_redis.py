"""A replicated Redis of our own for tests and chaos runs: a master, replicas and Sentinels, on
free loopback ports in a temporary folder. Every server here may be lagged, killed, promoted and
restarted at will (never the shared servers on 6379 / 6390).

    with RedisHA(replicas=2, sentinels=3) as ha:      # started; stopped and removed on exit
        store = open_store(ha.sentinel_url, ..., options={"master_name": ha.master_name})
        ha.lag(ha.replicas[0])       # that replica stops receiving the master's writes
        ha.kill(ha.master)           # SIGKILL: a crash
        ha.promote(ha.replicas[0])   # REPLICAOF NO ONE: what Sentinel does, on the replica we choose
        ha.failover()                # or: SENTINEL FAILOVER, waiting until a replica took over

The API, all of it (times in seconds; each wait raises ``RuntimeError`` naming what it waited for):

* :class:`RedisHA` ``(replicas=2, sentinels=0, rdb=False, binary=...)``: ``start()``,
  ``close()``, ``master`` (the node that is master now), ``replicas`` (the nodes started as
  replicas, in order), ``sentinels``, ``url`` (``redis://`` of the current master),
  ``sentinel_url`` and ``master_name`` (for ``sentinel://`` stores).
* ``lag(node)`` / ``catch_up(node)``: every replica reaches its master through its own TCP proxy
  (``tests/support/tcp_proxy.py``); ``lag`` stops that proxy forwarding (the replica misses every write
  from now on, while both ends see a live connection), ``catch_up`` forwards again.
* ``wait_synced(node)``: the replica has every write the master has (offsets equal).
* ``kill(node)`` (SIGKILL), ``stop(node)`` (SIGTERM), ``restart(node)`` (same port, same folder:
  with ``rdb=True`` it loads its last snapshot, ``save 3600 1``, no AOF), ``snapshot(node)`` (SAVE).
* ``promote(node)``: ``REPLICAOF NO ONE`` on that replica; it becomes ``master``.
* ``failover()``: ``SENTINEL FAILOVER``; ``wait_new_master(old)``: until the Sentinels name another
  master than ``old`` (after ``kill(master)``, Sentinel fails over on its own within about 2 s:
  down-after 1000 ms).

Sentinel rewrites its configuration file, so each has a writable one in the folder. Replicas use
``repl-diskless-sync-delay 0`` (a full sync takes milliseconds, not Redis's default 5 s).
"""
from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import redis

from servers import RedisServer, Rig, free_port, wait_for, wait_port

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "support"))
from tcp_proxy import TCPProxy  # noqa: E402

#: The Redis >= 7.2 binary built by .ci/redis8.sh (it has WAITAOF), or None when not built.
REDIS8_BINARY = next(iter(sorted(glob.glob(os.path.join(
    os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
    "celery-anarchon", "redis-8", "redis-server")))), None)

#: Sentinel's settings: a master is down after DOWN_AFTER_MS without an answer; a failover that did
#: not complete (a split vote among the Sentinels, a promotion that did not take) is tried again
#: after 2 x FAILOVER_TIMEOUT_MS (Redis's Sentinel documentation, "failover-timeout")
DOWN_AFTER_MS, FAILOVER_TIMEOUT_MS = 1000, 10_000
#: how long to wait for the Sentinels to promote a replica: the detection, two failed attempts and
#: a third that completes (about 2 s when the first one does)
FAILOVER_S = (DOWN_AFTER_MS + 2 * 2 * FAILOVER_TIMEOUT_MS) / 1000 + 10

#: what every server of the rig runs with (fast full syncs, loopback only)
_COMMON = ("--repl-diskless-sync-delay", "0", "--repl-ping-replica-period", "1")


def _wait(predicate, timeout: float, what: str):
    """:func:`servers.wait_for`, a Redis error counting as "not yet" (a server still starting)."""
    return wait_for(predicate, timeout, what, interval=0.02,
                    ignore=(redis.exceptions.RedisError, OSError))


class Node(RedisServer):
    """One ``redis-server`` of the rig; ``proxy`` is the TCP proxy it replicates through."""

    def __init__(self, name: str, folder: str, args: tuple[str, ...], binary: str,
                 env: dict[str, str] | None = None) -> None:
        super().__init__(name, folder, persistent=False, args=args, binary=binary, env=env)
        self.proxy: TCPProxy | None = None

    def client(self) -> redis.Redis:
        """A new client of this node (close it after use)."""
        return redis.Redis(port=self.port, decode_responses=True, socket_timeout=5)

    def command(self, *args):
        """Run one command on this node."""
        with self.client() as c:
            return c.execute_command(*args)

    def info(self, section: str) -> dict:
        with self.client() as c:
            return c.info(section)


class SentinelNode:
    """One ``redis-server --sentinel`` with its own writable configuration file."""

    def __init__(self, name: str, folder: str, binary: str) -> None:
        self.name = name
        self.port = free_port()
        self.conf = os.path.join(folder, f"{name}.conf")
        self.log = os.path.join(folder, f"{name}.log")
        self.binary = binary
        self.proc: subprocess.Popen | None = None

    def start(self, master_name: str, master_port: int) -> None:
        with open(self.conf, "w") as f:
            f.write(f"port {self.port}\nbind 127.0.0.1\ndaemonize no\nlogfile {self.log}\n"
                    f"sentinel monitor {master_name} 127.0.0.1 {master_port} 2\n"
                    f"sentinel down-after-milliseconds {master_name} {DOWN_AFTER_MS}\n"
                    f"sentinel failover-timeout {master_name} {FAILOVER_TIMEOUT_MS}\n"
                    f"sentinel parallel-syncs {master_name} 2\n")
        self.proc = subprocess.Popen([self.binary, self.conf, "--sentinel"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        wait_port(self.port, True, 20, f"sentinel {self.name}")

    def command(self, *args):
        with redis.Redis(port=self.port, decode_responses=True, socket_timeout=5) as c:
            return c.execute_command(*args)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class RedisHA(Rig):
    """A master, ``replicas`` replicas (each through its own proxy) and ``sentinels`` Sentinels.

    :param replicas: how many replicas (0 or more).
    :param sentinels: how many Sentinels (0, or 3 for a quorum of 2).
    :param rdb: every server snapshots (``save 3600 1``, no AOF) and loads it on restart;
        otherwise nothing is kept on disk.
    :param binary: the ``redis-server`` to run (default: the one on PATH; :data:`REDIS8_BINARY`
        for WAITAOF).
    :param args: more ``redis-server`` arguments for every data node (e.g. ``("--appendonly",
        "yes")``).
    :param folder: where everything lives (default: a new temporary folder, removed by close).
    :param proxies: replicas reach the master through their own proxy (needed by :meth:`lag`);
        False: directly (benchmarks: the Python proxy adds latency to every replicated byte).
    :param env: more environment variables for every data node (e.g. a
        :class:`fsync_hold.FsyncHold`'s, a disk whose fsync the test holds back).
    """

    master_name = "mymaster"

    def __init__(self, *, replicas: int = 2, sentinels: int = 0, rdb: bool = False,
                 binary: str = "redis-server", args: tuple[str, ...] = (),
                 folder: str | None = None, proxies: bool = True,
                 env: dict[str, str] | None = None) -> None:
        self.folder = folder or tempfile.mkdtemp(prefix="anarchon-ha-redis-")
        self._own_folder = folder is None
        base = (*_COMMON, *(("--save", "3600 1") if rdb else ()), *args)
        self.binary = binary
        self.master = Node("master", self.folder, base, binary, env)
        self.replicas = [Node(f"replica{i + 1}", self.folder, base, binary, env)
                         for i in range(replicas)]
        self.sentinels = [SentinelNode(f"sentinel{i + 1}", self.folder, binary)
                          for i in range(sentinels)]
        self.nodes = [self.master, *self.replicas]
        self.proxies = proxies

    # -- life cycle -------------------------------------------------------------------------------
    def start(self) -> RedisHA:
        """Start every server; return once each replica is in sync and each Sentinel knows the
        replicas and the other Sentinels."""
        try:
            self.master.start()
            for node in self.replicas:
                port = self.master.port
                if self.proxies:
                    node.proxy = TCPProxy(("127.0.0.1", self.master.port)).start()
                    port = node.proxy.port
                node.args = (*node.args, "--replicaof", "127.0.0.1", str(port))
                node.start()
            for node in self.replicas:
                self.wait_synced(node)
            for s in self.sentinels:
                s.start(self.master_name, self.master.port)
            for s in self.sentinels:
                _wait(lambda: self._sentinel_knows_everyone(s), 30,
                      f"{s.name} to find {len(self.replicas)} replicas and the other Sentinels")
        except BaseException:
            self.close()
            raise
        return self

    def _sentinel_knows_everyone(self, s: SentinelNode) -> bool:
        info = s.command("SENTINEL", "MASTER", self.master_name)  # redis-py answers a dict
        if isinstance(info, list):
            info = dict(zip(info[::2], info[1::2]))
        return (int(info["num-slaves"]) == len(self.replicas)
                and int(info["num-other-sentinels"]) == len(self.sentinels) - 1)

    def close(self) -> None:
        """Stop everything (SIGKILL: nothing to flush) and remove the folder."""
        for s in self.sentinels:
            s.stop()
        for node in self.nodes:
            if node.proxy is not None:
                node.proxy.close()
            node.stop(signal.SIGKILL)
        if self._own_folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    # -- addresses --------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """``redis://`` of the node that is master now (db 0)."""
        return self.master.url

    @property
    def sentinel_url(self) -> str:
        """``sentinel://127.0.0.1:P1;sentinel://127.0.0.1:P2;...`` (as Celery's broker takes it)."""
        return ";".join(f"sentinel://127.0.0.1:{s.port}/0" for s in self.sentinels)

    # -- faults -----------------------------------------------------------------------------------
    def lag(self, node: Node) -> None:
        """From now on ``node`` receives none of its master's writes (its proxy stops forwarding;
        the connection stays up, so the master still counts it connected until repl-timeout)."""
        if node.proxy is None:
            raise RuntimeError(f"{node.name} replicates without a proxy (RedisHA(proxies=False))")
        node.proxy.pause()

    def catch_up(self, node: Node) -> None:
        """Undo :meth:`lag`: the held-back writes flow again."""
        node.proxy.resume()

    def wait_synced(self, node: Node, timeout: float = 20) -> None:
        """Until replica ``node`` is online and has every write of the master (equal offsets)."""
        def synced():
            mine = node.info("replication")
            if mine.get("master_link_status") != "up":
                return False
            theirs = self.master.info("replication")["master_repl_offset"]
            return mine.get("slave_repl_offset") == theirs
        _wait(synced, timeout, f"{node.name} to catch up with the master")

    def kill(self, node: Node) -> None:
        """SIGKILL ``node``: a crash (with ``rdb``, what was written after the last snapshot is
        lost on restart)."""
        node.stop(signal.SIGKILL)

    def stop(self, node: Node) -> None:
        """SIGTERM: a clean shutdown (Redis saves its snapshot when ``rdb``)."""
        node.stop(signal.SIGTERM)

    def restart(self, node: Node) -> None:
        """Start ``node`` again on its port and folder (it loads its snapshot, if any)."""
        node.start()
        _wait(lambda: node.info("persistence").get("loading") == 0, 20, f"{node.name} to load")

    def snapshot(self, node: Node | None = None) -> None:
        """``SAVE`` on ``node`` (default: the master): what a restart will load."""
        (node or self.master).command("SAVE")

    def promote(self, node: Node) -> None:
        """``REPLICAOF NO ONE`` on replica ``node`` (what Sentinel does); it becomes the master."""
        node.command("REPLICAOF", "NO", "ONE")
        _wait(lambda: node.info("replication")["role"] == "master", 10, f"{node.name} promoted")
        self.master = node

    def _sentinel_master_port(self) -> int | None:
        for s in self.sentinels:
            try:
                return int(s.command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name)[1])
            except (redis.exceptions.RedisError, OSError, TypeError, IndexError):
                continue
        return None

    def wait_new_master(self, old: Node, timeout: float = FAILOVER_S) -> Node:
        """Until the Sentinels name a master other than ``old`` and it answers as master; it
        becomes ``master``."""
        def moved():
            port = self._sentinel_master_port()
            if port is None or port == old.port:
                return None
            node = next(n for n in self.nodes if n.port == port)
            return node if node.info("replication")["role"] == "master" else None
        self.master = _wait(moved, timeout, f"the Sentinels to promote a replica of {old.name}")
        return self.master

    def failover(self, timeout: float = FAILOVER_S) -> Node:
        """``SENTINEL FAILOVER``: the Sentinels promote a replica; returns the new master."""
        old = self.master
        _wait(lambda: self.sentinels[0].command("SENTINEL", "FAILOVER", self.master_name), 10,
              "SENTINEL FAILOVER to be accepted")
        return self.wait_new_master(old, timeout)
