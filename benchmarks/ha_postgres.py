"""A replicated PostgreSQL of its own: a primary and streaming standbys, for tests and benchmarks
that break it (lag, crash, promotion). Never the shared server on 5432.

    with PostgresHA(standbys=1) as ha:          # initdb + pg_basebackup -R, asynchronous
        url = ha.url(ha.primary)                 # postgresql://postgres@127.0.0.1:PORT/ha
        ha.wait_replayed()                       # every standby has replayed the primary's WAL
        ha.pause_replication()                   # standbys stop receiving: they miss what follows
        ...                                      # commits on the primary the standby never sees
        ha.kill_primary()                        # pg_ctl stop -m immediate (a crash)
        ha.promote()                             # pg_ctl promote the first standby: a new timeline
        url_b = ha.url(ha.primary)               # the promoted standby is the primary now

Every node runs as the ``postgres`` user (``runuser``) from ``/usr/lib/postgresql/*/bin``, on a
free loopback port, in its own temporary folder, with ``trust`` authentication. Each standby
reaches the primary through a :class:`ReplicationRelay` (a TCP relay in this process) so a test
can hold back the WAL stream: on loopback the lag is sub-millisecond, so a standby that misses
the newest commits has to be made. ``synchronous`` sets ``synchronous_standby_names`` on the
primary (``"FIRST 1 (standby0)"``, ``"ANY 1 (standby0, standby1)"``, ...).

Start-up: ``initdb`` runs once per process into a template folder that later rigs copy; a
primary plus one standby takes about 1.5 s on the 2-core CI machine (measured: see
docs/reliability.md).
"""
from __future__ import annotations

import atexit
import glob
import os
import select
import shutil
import socket
import subprocess
import tempfile
import threading
import time

from servers import free_port, wait_port

_TEMPLATE: str | None = None
_TEMPLATE_LOCK = threading.Lock()


def _bin_dir() -> str:
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not bins:
        raise RuntimeError("PostgreSQL server binaries (pg_ctl, initdb) not found")
    return os.path.dirname(bins[-1])


def available() -> bool:
    """True when the server binaries and ``runuser`` are there and we may become ``postgres``."""
    try:
        _bin_dir()
    except RuntimeError:
        return False
    return shutil.which("runuser") is not None and os.geteuid() == 0


def _as_postgres(*args: str, cwd: str = "/tmp", check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(["runuser", "-u", "postgres", "--", *args], capture_output=True, text=True,
                         cwd=cwd)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
    return out


def _template() -> str:
    """A freshly initdb'd data folder, made once per process (initdb is the slow step) and
    deleted when the process exits."""
    global _TEMPLATE
    with _TEMPLATE_LOCK:
        if _TEMPLATE is None or not os.path.isdir(_TEMPLATE):
            root = tempfile.mkdtemp(prefix="anarchon-ha-pg-template-")
            shutil.chown(root, "postgres", "postgres")
            data = os.path.join(root, "data")
            atexit.register(shutil.rmtree, root, True)     # about 40 MB a process otherwise
            _as_postgres(os.path.join(_bin_dir(), "initdb"), "-D", data, "-A", "trust", "-U",
                         "postgres", "--no-sync", "--no-instructions")
            _TEMPLATE = data
        return _TEMPLATE


class ReplicationRelay:
    """A TCP relay from a loopback port to ``target`` that can hold back its traffic.

    :meth:`pause` stops forwarding in both directions (bytes wait in kernel buffers, so the
    standby behind it receives nothing more); :meth:`resume` forwards them; :meth:`cut` drops
    every open connection with whatever it held (new connections are accepted again).
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port: int = self.listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name=f"relay-{self.port}").start()

    def pause(self) -> None:
        """Stop forwarding (both directions) until :meth:`resume` or :meth:`cut`."""
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def cut(self) -> None:
        """Close every open connection, dropping what was held; then forward again."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for s in pair:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
        self._flowing.set()

    def close(self) -> None:
        self._closed = True
        self.cut()
        self.listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            for s in (client, server):      # no Nagle: a commit's WAL must not wait for an ACK
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._pairs.append((client, server))
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        sockets = [client, server]
        try:
            while not self._closed:
                if not self._flowing.wait(0.2):
                    continue
                readable, _, _ = select.select(sockets, [], [], 0.1)
                for source in readable:
                    if not self._flowing.is_set():
                        break
                    data = source.recv(65536)
                    if not data:
                        return
                    (server if source is client else client).sendall(data)
        except (OSError, ValueError):     # cut: the sockets were closed under us
            return
        finally:
            for s in sockets:
                try:
                    s.close()
                except OSError:
                    pass


class Node:
    """One PostgreSQL server of the rig: a data folder, a port and (standbys) a relay."""

    def __init__(self, name: str, root: str) -> None:
        self.name = name
        self.port = free_port()
        self.data = os.path.join(root, name)
        self.log = os.path.join(root, f"{name}.log")
        self.relay: ReplicationRelay | None = None

    def __repr__(self) -> str:
        return f"Node({self.name!r}, port={self.port})"


class PostgresHA:
    """A primary and ``standbys`` streaming standbys (see the module docstring).

    :param standbys: how many standbys (0 or more), named ``standby0``, ``standby1``, ...
    :param synchronous: ``synchronous_standby_names`` of the primary ("" = asynchronous).
    :param database: the database created on the primary (replicated to the standbys).
    :raises RuntimeError: a server could not be created or started (the message names the step).
    """

    def __init__(self, standbys: int = 1, *, synchronous: str = "", database: str = "ha") -> None:
        self.bin = _bin_dir()
        self.root = tempfile.mkdtemp(prefix="anarchon-ha-pg-")
        shutil.chown(self.root, "postgres", "postgres")
        self.database = database
        self.synchronous = synchronous
        self.primary = Node("primary", self.root)
        self.standbys = [Node(f"standby{i}", self.root) for i in range(standbys)]
        # every node of the rig, whatever its role now: close() stops them all (an old primary
        # left running by a promotion is in neither primary nor standbys any more)
        self.nodes: list[Node] = [self.primary, *self.standbys]
        self.timings: dict[str, float] = {}    # step -> seconds, for the start-up cost

    # -- life cycle -----------------------------------------------------------------------
    def __enter__(self) -> PostgresHA:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> PostgresHA:
        """initdb (copied from the per-process template), start the primary, create the database,
        pg_basebackup -R each standby through its relay and start it; returns when every standby
        streams. :raises RuntimeError:"""
        t0 = time.monotonic()
        template = _template()
        self.timings["initdb"] = time.monotonic() - t0
        t1 = time.monotonic()
        _as_postgres("cp", "-a", template, self.primary.data)
        with open(os.path.join(self.primary.data, "postgresql.auto.conf"), "a") as conf:
            conf.write("wal_level = replica\nmax_wal_senders = 10\nmax_replication_slots = 10\n")
        self._start(self.primary)
        self._psql(self.primary, f"CREATE DATABASE {self.database}", db="postgres")
        self.timings["primary"] = time.monotonic() - t1
        t2 = time.monotonic()
        for node in self.standbys:
            self._add_standby(node)
        self.wait_streaming()
        if self.synchronous:        # only now: a commit would wait for a standby not yet there
            self.set_synchronous(self.synchronous)
        self.timings["standbys"] = time.monotonic() - t2
        self.timings["total"] = time.monotonic() - t0
        return self

    def _add_standby(self, node: Node) -> None:
        node.relay = ReplicationRelay(("127.0.0.1", self.primary.port))
        _as_postgres(os.path.join(self.bin, "pg_basebackup"), "-h", "127.0.0.1", "-p",
                     str(node.relay.port), "-U", "postgres", "-D", node.data, "-R",
                     "--checkpoint=fast", "--no-sync", "-X", "stream")
        with open(os.path.join(node.data, "postgresql.auto.conf"), "a") as conf:
            conf.write(f"primary_conninfo = 'host=127.0.0.1 port={node.relay.port} user=postgres "
                       f"application_name={node.name}'\n"
                       "wal_retrieve_retry_interval = '100ms'\nsynchronous_standby_names = ''\n")
        self._start(node)

    def _start(self, node: Node) -> None:
        opts = (f"-p {node.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=on "
                "-c max_connections=50 -c shared_buffers=16MB")
        _as_postgres(os.path.join(self.bin, "pg_ctl"), "-D", node.data, "-l", node.log, "-o", opts,
                     "-w", "-t", "60", "start", cwd=self.root)
        wait_port(node.port, True, 30, f"postgres {node.name}")

    def stop(self, node: Node, mode: str = "fast") -> None:
        """``pg_ctl stop -m mode`` (``immediate``: a crash; the node can be started again)."""
        _as_postgres(os.path.join(self.bin, "pg_ctl"), "-D", node.data, "-m", mode, "-w", "-t", "60",
                     "stop", check=False)
        wait_port(node.port, False, 30, f"postgres {node.name}")

    def start_node(self, node: Node) -> None:
        """Start a node stopped with :meth:`stop` again."""
        self._start(node)

    def close(self) -> None:
        """Stop every server the rig started (immediately), whatever was promoted or stopped since
        (an old primary still running after :meth:`promote` too), and delete the rig's folder.
        The folder is kept when a server could not be stopped, so that it can still be found
        (``postmaster.pid``) and stopped by hand. :raises RuntimeError: a server still runs."""
        for node in self.nodes:
            if node.relay is not None:
                node.relay.close()
        running = []
        for node in self.nodes:
            if os.path.exists(os.path.join(node.data, "postmaster.pid")):
                self.stop(node, "immediate")
                if os.path.exists(os.path.join(node.data, "postmaster.pid")):
                    running.append(node)
        if running:
            raise RuntimeError(f"PostgresHA.close(): {running} still running in {self.root}")
        shutil.rmtree(self.root, ignore_errors=True)

    # -- faults ---------------------------------------------------------------------------
    def pause_replication(self, *nodes: Node) -> None:
        """Hold back the WAL stream to ``nodes`` (default: every standby)."""
        for node in nodes or self.standbys:
            node.relay.pause()

    def resume_replication(self, *nodes: Node) -> None:
        for node in nodes or self.standbys:
            node.relay.resume()

    def kill_primary(self) -> None:
        """Crash the primary (``pg_ctl stop -m immediate``: no shutdown checkpoint, no WAL sent
        after the crash) and drop what the relays still held, so the standbys never get it."""
        self.stop(self.primary, "immediate")
        for node in self.standbys:
            node.relay.cut()

    def promote(self, node: Node | None = None) -> Node:
        """``pg_ctl promote`` ``node`` (default: the first standby) and make it :attr:`primary`;
        returns once it accepts writes. :raises RuntimeError:"""
        node = node or self.standbys[0]
        _as_postgres(os.path.join(self.bin, "pg_ctl"), "-D", node.data, "-w", "-t", "60", "promote")
        self.standbys.remove(node)
        self.primary = node
        return node

    def set_synchronous(self, names: str) -> None:
        """Set ``synchronous_standby_names`` on the primary (``ALTER SYSTEM`` + reload)."""
        self.synchronous = names
        self._psql(self.primary, f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
        self._psql(self.primary, "SELECT pg_reload_conf()")
        want = names or ""
        self._wait(lambda: self._psql(self.primary, "SHOW synchronous_standby_names") == want,
                   10, "synchronous_standby_names to be reloaded")

    # -- reading --------------------------------------------------------------------------
    def url(self, node: Node | None = None) -> str:
        """The URL of ``node`` (default: the current primary) for the store."""
        node = node or self.primary
        return f"postgresql://postgres@127.0.0.1:{node.port}/{self.database}"

    def _psql(self, node: Node, sql: str, db: str | None = None) -> str:
        out = _as_postgres("psql", "-h", "127.0.0.1", "-p", str(node.port), "-U", "postgres", "-d",
                           db or self.database, "-Atqc", sql, cwd=self.root)
        return out.stdout.strip()

    def query(self, node: Node, sql: str) -> str:
        """Run ``sql`` on ``node`` with psql; its unaligned output. :raises RuntimeError:"""
        return self._psql(node, sql)

    @staticmethod
    def _wait(predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
            time.sleep(0.05)

    def wait_streaming(self, timeout: float = 30) -> None:
        """Wait until every standby is connected and streaming (``pg_stat_replication``)."""
        want = len(self.standbys)
        self._wait(lambda: int(self._psql(self.primary, "SELECT count(*) FROM pg_stat_replication "
                                          "WHERE state = 'streaming'") or 0) >= want,
                   timeout, f"{want} standby(s) to stream")

    def wait_replayed(self, timeout: float = 30) -> None:
        """Wait until every standby has replayed the primary's WAL up to now."""
        lsn = self._psql(self.primary, "SELECT pg_current_wal_lsn()")
        for node in self.standbys:
            self._wait(lambda: self._psql(node, f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'") == "t",
                       timeout, f"{node.name} to replay {lsn}")


if __name__ == "__main__":       # measure the start-up cost
    for n in (1, 2):
        started = time.monotonic()
        with PostgresHA(standbys=1) as ha:
            print(f"rig {n}: {ha.timings}")
            ha.pause_replication()
            ha.kill_primary()
            t = time.monotonic()
            ha.promote()
            print(f"  promote {time.monotonic() - t:.2f} s; timeline "
                  f"{ha.query(ha.primary, 'SELECT pg_walfile_name(pg_current_wal_lsn())')}")
        print(f"  with teardown {time.monotonic() - started:.2f} s")
