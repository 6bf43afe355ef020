"""NATS JetStream servers of their own, to break at will: one server, or a cluster of three.

Never the shared server on 4222: every server here listens on free loopback ports and keeps its
JetStream files in a temporary folder that :meth:`NatsCluster.close` removes.

The whole API::

    from ha_nats import NatsCluster

    with NatsCluster(3) as cluster:          # three servers n1..n3, routes on loopback; healthy
        cluster.url                          # "nats://127.0.0.1:P1,nats://127.0.0.1:P2,..."
        cluster.servers[0].url               # one server's client URL
        leader = cluster.stream_leader("S")  # the NatsServer that leads stream S now
        leader.kill()                        # SIGKILL: a crash
        cluster.stream_leader("S", not_on=leader)   # waits for the new leader
        leader.start()                       # the same name, ports and store folder; healthy
        cluster.wait_ready()                 # JetStream takes new streams again

    with NatsCluster(1) as single:           # one server, no cluster
        disk = single.servers[0].freeze_disk()   # a copy of what its files hold now
        ...                                  # writes the "disk" will lose
        single.servers[0].kill()
        single.servers[0].restore_disk(disk)     # the files as they were: the newest writes lost
        single.servers[0].start()

Start-up cost, measured on the 2-core test machine: a cluster of three is healthy (JetStream meta
leader elected, every server's ``/healthz`` ok) in about 1.5 s; one server in about 0.1 s; a
killed cluster member restarted is healthy again in about 1 s (figures printed by
``python benchmarks/ha_nats.py``).

Needs ``nats-server`` (2.9 or later) on the PATH or at ``/usr/sbin/nats-server``.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request

from servers import Rig, free_port, stop_server, wait_for

NATS_SERVER = shutil.which("nats-server") or "/usr/sbin/nats-server"

#: seconds to wait for a Raft election after a leader was killed. A follower waits 4 to 9 s
#: (nats-server's minElectionTimeoutDefault..maxElectionTimeoutDefault, server/raft.go) before
#: it campaigns, and a round whose vote is refused (the other follower's log is longer, or both
#: campaigned at once) costs another such wait: 20 s, two rounds, was once too short under load.
#: Measured here: 12 kills of a stream leader elected a new one after 4.1 to 8.2 s.
#: It bounds a server's or the cluster's start too: /healthz and a stream's creation wait for the
#: meta group's leader, elected the same way after a restart.
ELECTION_S = 45


def available() -> bool:
    """True when a ``nats-server`` binary is there."""
    return os.path.exists(NATS_SERVER)


class NatsServer:
    """One ``nats-server`` with JetStream, on free loopback ports (client, cluster, monitor).

    :param jetstream: False for a server without JetStream (no ``-js``).
    :param args: more ``nats-server`` arguments, last (e.g. ``--tls``, ``--tlscert``, ...).
    """

    def __init__(self, name: str, folder: str, *, cluster: NatsCluster | None = None,
                 jetstream: bool = True, args: tuple[str, ...] = ()) -> None:
        self.name = name
        self.jetstream = jetstream
        self.args = tuple(args)
        self.port = free_port()
        self.cluster_port = free_port() if cluster is not None else None
        self.monitor_port = free_port()
        self.store_dir = os.path.join(folder, f"{name}-js")
        self.log = os.path.join(folder, f"{name}.log")
        self._cluster = cluster
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """This server's client URL."""
        return f"nats://127.0.0.1:{self.port}"

    def _args(self) -> list[str]:
        args = [NATS_SERVER, "-a", "127.0.0.1", "-p", str(self.port), "-m", str(self.monitor_port),
                *(("-js", "-sd", self.store_dir) if self.jetstream else ()),
                "-n", self.name, "-l", self.log]
        if self._cluster is not None:
            routes = ",".join(f"nats://127.0.0.1:{s.cluster_port}" for s in self._cluster.servers)
            args += ["--cluster_name", self._cluster.name,
                     "--cluster", f"nats://127.0.0.1:{self.cluster_port}", "--routes", routes]
        return args + list(self.args)

    def start(self, *, wait: bool = True, timeout: float = ELECTION_S) -> None:
        """Start (or restart) the server with the same name, ports and store folder.

        :param wait: wait until its ``/healthz`` says ok (JetStream ready and caught up).
        :raises RuntimeError: not healthy within ``timeout`` seconds.
        """
        if self.alive():
            return
        self.proc = subprocess.Popen(self._args(), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        if wait:
            self.wait_healthy(timeout)

    def healthy(self) -> bool:
        """``/healthz`` of the monitoring port answers ok."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor_port}/healthz",
                                        timeout=1) as reply:
                return json.loads(reply.read()).get("status") == "ok"
        except (OSError, ValueError):
            return False

    def wait_healthy(self, timeout: float = ELECTION_S) -> None:
        """:raises RuntimeError: the server died or was not healthy within ``timeout`` s."""
        def up() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"nats-server {self.name} exited ({self.proc.returncode}); "
                                   f"see {self.log}")
            return self.healthy()
        wait_for(up, timeout, f"nats-server {self.name} to be healthy (see {self.log})")

    def kill(self) -> None:
        """SIGKILL (a crash); returns once the client port is closed."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM (a clean shutdown: JetStream writes its files out)."""
        self._signal(signal.SIGTERM)

    def _signal(self, sig: int) -> None:
        stop_server(self.proc, sig, self.port, f"nats-server {self.name}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def freeze_disk(self) -> str:
        """A copy of the server's store folder as it is now (the server paused meanwhile, so the
        copy is consistent): what a disk that has synced nothing since would hold. Returns the
        copy's path, for :meth:`restore_disk`."""
        copy = tempfile.mkdtemp(prefix=f"{self.name}-disk-", dir=os.path.dirname(self.store_dir))
        os.rmdir(copy)
        if self.alive():
            self.proc.send_signal(signal.SIGSTOP)
        try:
            shutil.copytree(self.store_dir, copy)
        finally:
            if self.alive():
                self.proc.send_signal(signal.SIGCONT)
        return copy

    def restore_disk(self, copy: str) -> None:
        """Put a :meth:`freeze_disk` copy back (the server must be down): the writes made after
        the copy are lost, as after a host crash with unsynced files."""
        if self.alive():
            raise RuntimeError(f"nats-server {self.name} is running; kill it first")
        shutil.rmtree(self.store_dir, ignore_errors=True)
        shutil.copytree(copy, self.store_dir)


class NatsCluster(Rig):
    """``size`` JetStream servers ``n1..n<size>``; with ``size`` > 1 a cluster with routes between
    every pair (module docstring). A context manager: started on enter, removed on exit."""

    def __init__(self, size: int = 3, *, name: str = "anarchon") -> None:
        if size < 1:
            raise ValueError("size must be >= 1")
        self.name = name
        self.folder = tempfile.mkdtemp(prefix="anarchon-ha-nats-")
        self.servers: list[NatsServer] = []
        clustered = self if size > 1 else None
        for i in range(size):
            self.servers.append(NatsServer(f"n{i + 1}", self.folder, cluster=clustered))

    @property
    def url(self) -> str:
        """Every server's client URL, comma separated (the store's URL form)."""
        return ",".join(s.url for s in self.servers)

    def by_name(self, name: str) -> NatsServer:
        for server in self.servers:
            if server.name == name:
                return server
        raise KeyError(name)

    def start(self, timeout: float = ELECTION_S) -> NatsCluster:
        """Start every server, then wait until each one is healthy.

        :raises RuntimeError: a server exited or was not healthy in ``timeout`` seconds.
        """
        for server in self.servers:
            server.start(wait=False)
        deadline = time.monotonic() + timeout
        for server in self.servers:
            server.wait_healthy(max(0.1, deadline - time.monotonic()))
        self.wait_ready(max(0.1, deadline - time.monotonic()))
        return self

    def wait_ready(self, timeout: float = ELECTION_S) -> None:
        """Wait until JetStream takes a stream with as many replicas as there are live servers
        (up to 3): a meta leader is elected and enough peers are current. Call it after a
        restart, before anything that creates streams. Creates and deletes ``RIG_READY``.

        :raises RuntimeError: not ready within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        for server in self.servers:
            if server.alive():
                server.wait_healthy(max(0.1, deadline - time.monotonic()))
        replicas = min(3, sum(s.alive() for s in self.servers))
        config = {"name": "RIG_READY", "subjects": ["rig.ready"], "storage": "memory",
                  "num_replicas": replicas}
        wait_for(lambda: self.request("$JS.API.STREAM.CREATE.RIG_READY", config) is not None,
                 max(0.1, deadline - time.monotonic()), f"JetStream of {self.url} to be ready",
                 interval=0.1)
        self.request("$JS.API.STREAM.DELETE.RIG_READY")

    def request(self, subject: str, body: dict | None = None, timeout: float = 2) -> dict | None:
        """One JetStream API request through any live server: the JSON reply, or ``None`` when
        nobody answered in ``timeout`` seconds or the reply is an error."""
        urls = [s.url for s in self.servers if s.alive()]

        async def ask():
            import nats
            nc = await nats.connect(servers=urls, connect_timeout=timeout, allow_reconnect=False)
            try:
                payload = b"" if body is None else json.dumps(body).encode()
                msg = await nc.request(subject, payload, timeout=timeout)
                return json.loads(msg.data)
            finally:
                await nc.close()
        try:
            data = asyncio.run(ask())
        except Exception:  # noqa: BLE001  (no responders, timeouts, refused: not known now)
            return None
        return None if "error" in data else data

    def stream_info(self, stream: str, timeout: float = 2) -> dict | None:
        """``$JS.API.STREAM.INFO`` of ``stream`` asked through any live server; ``None`` when no
        server answered (no leader, the stream missing)."""
        return self.request(f"$JS.API.STREAM.INFO.{stream}", timeout=timeout)

    def stream_leader(self, stream: str, *, not_on: NatsServer | None = None,
                      timeout: float = ELECTION_S) -> NatsServer:
        """The live server leading ``stream``, waiting (for an election) until one does, and is
        not ``not_on``.

        :raises RuntimeError: no such leader within ``timeout`` seconds.
        """
        def leader() -> NatsServer | None:
            name = ((self.stream_info(stream) or {}).get("cluster") or {}).get("leader")
            if not name:
                return None
            server = self.by_name(name) if len(self.servers) > 1 else self.servers[0]
            return server if server.alive() and server is not not_on else None
        return wait_for(leader, timeout, f"a leader of stream {stream}")

    def close(self) -> None:
        """SIGKILL every server and remove the folder."""
        for server in self.servers:
            server.kill()
        shutil.rmtree(self.folder, ignore_errors=True)


def main() -> None:
    """Print the rig's start-up and restart costs."""
    started = time.monotonic()
    with NatsCluster(1):
        single = time.monotonic() - started
    started = time.monotonic()
    with NatsCluster(3) as cluster:
        three = time.monotonic() - started
        cluster.servers[0].kill()
        started = time.monotonic()
        cluster.servers[0].start()
        again = time.monotonic() - started
    print(f"one server healthy in {single:.2f} s; a cluster of three in {three:.2f} s; "
          f"a killed member healthy again in {again:.2f} s")


if __name__ == "__main__":
    main()
