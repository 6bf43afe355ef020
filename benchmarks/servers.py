"""Servers of our own, for the benchmarks (chaos.py, dispatch.py, the HA rigs ha_*.py) and the tests
that use them: they may be stopped, killed and restarted at will, unlike the shared ones (Redis
6379, PostgreSQL 5432, ...), which are never touched. The Celery processes that talk to them are
started by benchmarks/procs.py.

* :class:`RedisServer`: a ``redis-server`` on a free port, with its own directory; ``persistent``
  gives ``appendonly yes`` with ``appendfsync always`` (a write acknowledged to a client is on
  disk, so even a SIGKILL loses nothing acknowledged), otherwise it keeps nothing (no AOF, no RDB).
* :class:`PostgresServer`: a PostgreSQL cluster of its own (``initdb`` in a temporary directory,
  ``pg_ctl`` on a free port, run as the ``postgres`` user), restarted with ``pg_ctl stop -m
  immediate`` (a crash: the WAL replays committed transactions) or ``-m fast``.
* What the rigs share: :func:`wait_for` (the one wait for a condition), :func:`wait_port`,
  :func:`stop_server`, :func:`postgres_bin_dir` and :func:`as_postgres`, and :class:`Rig` (a
  context manager that leaves nothing running when its start fails).
"""
from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def free_port() -> int:
    """A TCP port nobody listens on now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for(predicate: Callable[[], T], timeout: float, what: str, *, interval: float = 0.05,
             ignore: tuple[type[BaseException], ...] = ()) -> T:
    """Poll ``predicate()`` every ``interval`` seconds until it returns a true value, and return
    that value: the one wait of the servers and rigs (a wait for a condition, not a retry).

    :param ignore: exceptions of ``predicate`` that count as "not yet" (a server still starting).
    :raises RuntimeError: ``timeout`` seconds passed (naming ``what``); or what ``predicate``
        raised that is not in ``ignore`` (a server that exited, say).
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except ignore:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def wait_port(port: int, up: bool, timeout: float, what: str) -> None:
    """Until ``port`` of 127.0.0.1 accepts connections (``up``) or refuses them.

    :raises RuntimeError: not within ``timeout`` seconds."""
    wait_for(lambda: port_open(port) == up, timeout,
             f"{what} on port {port} to come {'up' if up else 'down'}")


class Rig:
    """Servers started together (the HA rigs): a context manager that calls ``start()`` on enter,
    ``close()`` if that fails (nothing is left running), and ``close()`` on exit. A subclass
    gives ``start() -> self`` and an idempotent ``close()``."""

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc) -> None:
        self.close()


def stop_server(proc: subprocess.Popen | None, sig: int, port: int, what: str) -> None:
    """``sig`` to a server we started (SIGTERM: a clean shutdown; SIGKILL: a crash), SIGKILL if it
    is still running after 20 s; returns once its port is closed."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    wait_port(port, False, 10, what)


class RedisServer:
    """A ``redis-server`` of our own on a free port (see the module docstring)."""

    def __init__(self, name: str, folder: str, *, persistent: bool, args: tuple[str, ...] = (),
                 binary: str = "redis-server", port: int | None = None,
                 env: dict[str, str] | None = None) -> None:
        """:param args: more ``redis-server`` arguments, after the persistence ones (a later
            directive wins: ``("--save", "3600 1")`` gives RDB snapshots, ``("--replicaof", ...)``).
        :param binary: the ``redis-server`` to run (another version, e.g. Redis 8).
        :param port: a fixed port (default: a free one).
        :param env: more environment variables for the server (e.g. fsync_hold.FsyncHold.env)."""
        self.name = name
        self.persistent = persistent
        self.args = tuple(args)
        self.binary = binary
        self.env = dict(env or {})
        self.port = free_port() if port is None else port
        self.dir = os.path.join(folder, f"{name}-data")
        os.makedirs(self.dir, exist_ok=True)
        self.log = os.path.join(folder, f"{name}.log")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        persistence = (["--appendonly", "yes", "--appendfsync", "always", "--save", ""]
                       if self.persistent else ["--appendonly", "no", "--save", ""])
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
             "--logfile", self.log, "--daemonize", "no", *persistence, *self.args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, **self.env} if self.env else None)
        wait_port(self.port, True, 20, f"redis-server {self.name}")
        # the port answers before an AOF is loaded: wait until PING works
        wait_for(self._pong, 20, f"redis-server {self.name} to answer PING")

    def _pong(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"redis-server {self.name} exited; see {self.log}")
        out = subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True,
                             text=True)
        return out.stdout.strip() == "PONG"

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """SIGTERM: Redis shuts down cleanly (flushes its AOF); SIGKILL: a crash."""
        stop_server(self.proc, sig, self.port, f"redis-server {self.name}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def postgres_bin_dir() -> str:
    """The folder of the newest PostgreSQL server binaries (``/usr/lib/postgresql/*/bin``).

    :raises RuntimeError: none installed."""
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not bins:
        raise RuntimeError("PostgreSQL server binaries (pg_ctl, initdb) not found")
    return os.path.dirname(bins[-1])


def as_postgres(*args: str, cwd: str = "/tmp", check: bool = True) -> subprocess.CompletedProcess:
    """Run ``args`` as the ``postgres`` user (``runuser``), output captured.

    :raises RuntimeError: it failed and ``check`` (naming the command, its code and stderr)."""
    out = subprocess.run(["runuser", "-u", "postgres", "--", *args], capture_output=True, text=True,
                         cwd=cwd)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
    return out


class PostgresServer:
    """A PostgreSQL cluster of our own (see the module docstring); never the shared one on 5432."""

    def __init__(self, name: str, folder: str) -> None:
        self.name = name
        self.port = free_port()
        self.folder = folder
        self.bin = postgres_bin_dir()
        self.root = tempfile.mkdtemp(prefix="anarchon-chaos-pg-")  # postgres must reach it
        self.data = os.path.join(self.root, "data")
        self.log = os.path.join(self.root, "postgresql.log")
        shutil.chown(self.root, "postgres", "postgres")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/chaos"

    def _as_postgres(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return as_postgres(*args, check=check, cwd=self.root)

    def create(self) -> None:
        self._as_postgres(os.path.join(self.bin, "initdb"), "-D", self.data, "-A", "trust",
                          "-U", "postgres", "--no-sync")
        self.start()
        self._as_postgres(os.path.join(self.bin, "createdb"), "-h", "127.0.0.1", "-p",
                          str(self.port), "-U", "postgres", "chaos")

    def start(self) -> None:
        opts = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} "
                "-c max_connections=200 -c fsync=on")
        self._as_postgres(os.path.join(self.bin, "pg_ctl"), "-D", self.data, "-l", self.log,
                          "-o", opts, "-w", "-t", "60", "start")
        wait_port(self.port, True, 30, "postgres")

    def stop(self, mode: str = "fast") -> None:
        """``immediate``: a crash (recovery replays the WAL); ``fast``: a clean shutdown."""
        self._as_postgres(os.path.join(self.bin, "pg_ctl"), "-D", self.data, "-m", mode, "-w",
                          "-t", "60", "stop", check=False)
        wait_port(self.port, False, 30, "postgres")

    def destroy(self, keep_log_in: str | None = None) -> None:
        self.stop("fast")
        if keep_log_in and os.path.exists(self.log):
            shutil.copy(self.log, os.path.join(keep_log_in, f"{self.name}.log"))
        shutil.rmtree(self.root, ignore_errors=True)
