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

    with PostgresHA(standbys=0) as ha:          # a backup restored on another server
        dump = ha.dump_tables()                  # pg_dump -t 'anarchon_*' of the primary
        ...                                      # commits the backup does not have
        ha.restore_on_new_server(dump)           # a new cluster (initdb: another system
                                                 # identifier, timeline 1) on the same port
        ha.epoch()                               # (system identifier, timeline) of the primary

Every node runs as the ``postgres`` user (``runuser``) from ``/usr/lib/postgresql/*/bin``, on a
free loopback port, in its own temporary folder, with ``trust`` authentication. Each standby
reaches the primary through its own TCP proxy (tests/support/tcp_proxy.py, in this process) so a test
can hold back the WAL stream (``pause``) and drop what it held (``cut``): on loopback the lag is
sub-millisecond, so a standby that misses the newest commits has to be made. ``synchronous``
sets ``synchronous_standby_names`` on the primary (``"FIRST 1 (standby0)"``,
``"ANY 1 (standby0, standby1)"``, ...).

Start-up: ``initdb`` runs once per process into a template folder that later rigs copy; a
primary plus one standby takes about 1.5 s on the 2-core CI machine (measured: see
docs/reliability.md).
"""
from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import threading
import time

from servers import Rig, as_postgres, free_port, postgres_bin_dir, wait_for, wait_port

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "support"))
from tcp_proxy import TCPProxy  # noqa: E402

_TEMPLATE: str | None = None
_TEMPLATE_LOCK = threading.Lock()


def available() -> bool:
    """True when the server binaries and ``runuser`` are there and we may become ``postgres``."""
    try:
        postgres_bin_dir()
    except RuntimeError:
        return False
    return shutil.which("runuser") is not None and os.geteuid() == 0


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
            as_postgres(os.path.join(postgres_bin_dir(), "initdb"), "-D", data, "-A", "trust", "-U",
                        "postgres", "--no-sync", "--no-instructions")
            _TEMPLATE = data
        return _TEMPLATE


class Node:
    """One PostgreSQL server of the rig: a data folder, a port and (standbys) the proxy its WAL
    stream goes through."""

    def __init__(self, name: str, root: str) -> None:
        self.name = name
        self.port = free_port()
        self.data = os.path.join(root, name)
        self.log = os.path.join(root, f"{name}.log")
        self.proxy: TCPProxy | None = None

    def __repr__(self) -> str:
        return f"Node({self.name!r}, port={self.port})"


class PostgresHA(Rig):
    """A primary and ``standbys`` streaming standbys (see the module docstring).

    :param standbys: how many standbys (0 or more), named ``standby0``, ``standby1``, ...
    :param synchronous: ``synchronous_standby_names`` of the primary ("" = asynchronous).
    :param database: the database created on the primary (replicated to the standbys).
    :raises RuntimeError: a server could not be created or started (the message names the step).
    """

    def __init__(self, standbys: int = 1, *, synchronous: str = "", database: str = "ha") -> None:
        self.bin = postgres_bin_dir()
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
    def start(self) -> PostgresHA:
        """initdb (copied from the per-process template), start the primary, create the database,
        pg_basebackup -R each standby through its proxy and start it; returns when every standby
        streams. :raises RuntimeError:"""
        t0 = time.monotonic()
        template = _template()
        self.timings["initdb"] = time.monotonic() - t0
        t1 = time.monotonic()
        as_postgres("cp", "-a", template, self.primary.data)
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
        node.proxy = TCPProxy(("127.0.0.1", self.primary.port), nodelay=True).start()
        as_postgres(os.path.join(self.bin, "pg_basebackup"), "-h", "127.0.0.1", "-p",
                    str(node.proxy.port), "-U", "postgres", "-D", node.data, "-R",
                    "--checkpoint=fast", "--no-sync", "-X", "stream")
        with open(os.path.join(node.data, "postgresql.auto.conf"), "a") as conf:
            conf.write(f"primary_conninfo = 'host=127.0.0.1 port={node.proxy.port} user=postgres "
                       f"application_name={node.name}'\n"
                       "wal_retrieve_retry_interval = '100ms'\nsynchronous_standby_names = ''\n")
        self._start(node)

    def _start(self, node: Node) -> None:
        opts = (f"-p {node.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=on "
                "-c max_connections=50 -c shared_buffers=16MB")
        as_postgres(os.path.join(self.bin, "pg_ctl"), "-D", node.data, "-l", node.log, "-o", opts,
                    "-w", "-t", "60", "start", cwd=self.root)
        wait_port(node.port, True, 30, f"postgres {node.name}")

    def stop(self, node: Node, mode: str = "fast") -> None:
        """``pg_ctl stop -m mode`` (``immediate``: a crash; the node can be started again)."""
        as_postgres(os.path.join(self.bin, "pg_ctl"), "-D", node.data, "-m", mode, "-w", "-t", "60",
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
            if node.proxy is not None:
                node.proxy.close()
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
            node.proxy.pause()

    def resume_replication(self, *nodes: Node) -> None:
        for node in nodes or self.standbys:
            node.proxy.resume()

    def kill_primary(self) -> None:
        """Crash the primary (``pg_ctl stop -m immediate``: no shutdown checkpoint, no WAL sent
        after the crash) and drop what the proxies still held, so the standbys never get it."""
        self.stop(self.primary, "immediate")
        for node in self.standbys:
            node.proxy.cut()

    def promote(self, node: Node | None = None) -> Node:
        """``pg_ctl promote`` ``node`` (default: the first standby) and make it :attr:`primary`;
        returns once it accepts writes. :raises RuntimeError:"""
        node = node or self.standbys[0]
        as_postgres(os.path.join(self.bin, "pg_ctl"), "-D", node.data, "-w", "-t", "60", "promote")
        self.standbys.remove(node)
        self.primary = node
        return node

    def dump_tables(self, pattern: str = "anarchon_*") -> str:
        """A backup of the primary's tables whose names match ``pattern`` (``pg_dump -t``, plain
        SQL), written into the rig's folder; returns its path. :raises RuntimeError:"""
        path = os.path.join(self.root, f"dump-{time.monotonic_ns()}.sql")
        as_postgres(os.path.join(self.bin, "pg_dump"), "-h", "127.0.0.1", "-p",
                    str(self.primary.port), "-U", "postgres", "-d", self.database, "-t", pattern,
                    "--no-owner", "-f", path, cwd=self.root)
        return path

    def restore_on_new_server(self, dump: str) -> Node:
        """A backup restored on another server at the same address: crash the primary, ``initdb``
        a new cluster (never the per-process template: a new cluster has a system identifier of
        its own, and starts on timeline 1 as every new cluster does, the primary's own timeline
        when nothing was promoted), start it on the old primary's port, create the database and
        replay ``dump`` into it (psql). The new server becomes :attr:`primary`; returns it.
        :raises RuntimeError:"""
        old = self.primary
        self.stop(old, "immediate")
        node = Node(f"restored{len(self.nodes)}", self.root)
        node.port = old.port
        as_postgres(os.path.join(self.bin, "initdb"), "-D", node.data, "-A", "trust", "-U",
                    "postgres", "--no-sync", "--no-instructions")
        with open(os.path.join(node.data, "postgresql.auto.conf"), "a") as conf:
            conf.write("wal_level = replica\nmax_wal_senders = 10\nmax_replication_slots = 10\n")
        self.nodes.append(node)
        self._start(node)
        self._psql(node, f"CREATE DATABASE {self.database}", db="postgres")
        as_postgres("psql", "-h", "127.0.0.1", "-p", str(node.port), "-U", "postgres", "-d",
                    self.database, "-q", "-v", "ON_ERROR_STOP=1", "-f", dump, cwd=self.root)
        self.primary = node
        return node

    def set_synchronous(self, names: str) -> None:
        """Set ``synchronous_standby_names`` on the primary (``ALTER SYSTEM`` + reload)."""
        self.synchronous = names
        self._psql(self.primary, f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
        self._psql(self.primary, "SELECT pg_reload_conf()")
        want = names or ""
        wait_for(lambda: self._psql(self.primary, "SHOW synchronous_standby_names") == want,
                 10, "synchronous_standby_names to be reloaded")

    # -- reading --------------------------------------------------------------------------
    def url(self, node: Node | None = None) -> str:
        """The URL of ``node`` (default: the current primary) for the store."""
        node = node or self.primary
        return f"postgresql://postgres@127.0.0.1:{node.port}/{self.database}"

    def _psql(self, node: Node, sql: str, db: str | None = None) -> str:
        out = as_postgres("psql", "-h", "127.0.0.1", "-p", str(node.port), "-U", "postgres", "-d",
                          db or self.database, "-Atqc", sql, cwd=self.root)
        return out.stdout.strip()

    def epoch(self, node: Node | None = None) -> tuple[str, int]:
        """(system identifier, timeline of the current WAL file) of ``node`` (default: the
        primary): what the PostgreSQL store's epoch is made of."""
        sysid, wal = self._psql(node or self.primary, "SELECT system_identifier::text, "
                                "pg_walfile_name(pg_current_wal_lsn()) FROM pg_control_system()"
                                ).split("|")
        return sysid, int(wal[:8], 16)

    def query(self, node: Node, sql: str) -> str:
        """Run ``sql`` on ``node`` with psql; its unaligned output. :raises RuntimeError:"""
        return self._psql(node, sql)

    def wait_streaming(self, timeout: float = 30) -> None:
        """Wait until every standby is connected and streaming (``pg_stat_replication``)."""
        want = len(self.standbys)
        wait_for(lambda: int(self._psql(self.primary, "SELECT count(*) FROM pg_stat_replication "
                                        "WHERE state = 'streaming'") or 0) >= want,
                 timeout, f"{want} standby(s) to stream")

    def wait_replayed(self, timeout: float = 30) -> None:
        """Wait until every standby has replayed the primary's WAL up to now."""
        lsn = self._psql(self.primary, "SELECT pg_current_wal_lsn()")
        for node in self.standbys:
            wait_for(lambda: self._psql(node, f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'") == "t",
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
