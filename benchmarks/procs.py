"""Real ``celery beat`` and ``celery worker`` processes, for the tests, the benchmarks and the demo.

One harness: each process runs in a session of its own (so a signal reaches its whole group: a
prefork worker's children, ``worker -B``'s beat), with the environment of the harness plus its
own, its output in one log file, and stop / kill / pause / resume by name. Standard library only:
``make demo`` imports it on a fresh machine (example_project/demo.py), the tests through
tests/support/cluster.py, the benchmarks directly. The servers these processes talk to are started by
benchmarks/servers.py.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

CELERY = [sys.executable, "-m", "celery"]


def append_record(path: str, record: dict) -> None:
    """Append ``record`` to ``path`` as one JSON line, in one ``write`` with ``O_APPEND``: the
    lines of processes writing at once never interleave (an app's task noting what it did)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def read_records(path: str) -> list[dict]:
    """The records :func:`append_record` wrote to ``path``, oldest first ([] before the first).
    A last line without its newline is a record still being written (a reader can see part of
    another process's write): it is read the next time, whole."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.endswith("\n") and line.strip()]


@dataclass
class Proc:
    """One started process: its name, its ``Popen`` and its log file."""

    name: str
    popen: subprocess.Popen
    log: str

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def text(self) -> str:
        with open(self.log, encoding="utf-8", errors="replace") as f:
            return f.read()


@dataclass
class CeleryProcs:
    """The Celery processes of one run, sharing an environment and a working directory.

    :param workdir: the processes' working directory, and where their logs go by default.
    :param env: variables every process gets, over this process's environment.
    :param app: the ``-A`` argument.
    :param pythonpath: folders put first on every process's ``PYTHONPATH`` (the app's module).
    """

    workdir: str
    env: dict = field(default_factory=dict)
    app: str = "proj"
    pythonpath: tuple = ()
    procs: dict[str, Proc] = field(default_factory=dict)

    def environment(self, env: dict | None = None) -> dict:
        """The environment of a process: ours, the harness's, then ``env``."""
        merged = {**os.environ, **self.env, **(env or {})}
        merged["PYTHONPATH"] = os.pathsep.join(filter(None, [*self.pythonpath,
                                                             merged.get("PYTHONPATH", "")]))
        return merged

    def start(self, name: str, *args: str, env: dict | None = None, log: str | None = None,
              append: bool = False, cwd: str | None = None) -> Proc:
        """Start ``celery -A app *args`` as ``name`` (a name started again replaces the old one).

        :param log: the log file (default ``workdir/name.log``); ``append`` keeps what it holds.
        :param cwd: the process's working directory (default ``workdir``).
        """
        log = log or os.path.join(self.workdir, f"{name}.log")
        with open(log, "ab" if append else "wb") as handle:
            popen = subprocess.Popen([*CELERY, "-A", self.app, *args], env=self.environment(env),
                                     cwd=cwd or self.workdir, stdout=handle,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = proc = Proc(name, popen, log)
        return proc

    def beat(self, name: str, *extra: str, env: dict | None = None, loglevel: str = "info",
             log: str | None = None, append: bool = False, cwd: str | None = None) -> Proc:
        """``celery beat`` (Celery's shelve file, unused by our scheduler, kept in the workdir)."""
        return self.start(name, "beat", "-l", loglevel, "--schedule",
                          os.path.join(self.workdir, f"{name}-unused-schedule"), *extra, env=env,
                          log=log, append=append, cwd=cwd)

    def worker(self, name: str, *extra: str, pool: str = "threads", concurrency: int = 8,
               node: str | None = None, env: dict | None = None, loglevel: str = "info",
               log: str | None = None, append: bool = False) -> Proc:
        """``celery worker`` without gossip, mingle and heartbeat, node ``node`` (default
        ``name@%h``)."""
        return self.start(name, "worker", "-l", loglevel, "-P", pool, "-c", str(concurrency),
                          "--without-gossip", "--without-mingle", "--without-heartbeat",
                          "-n", node or f"{name}@%h", *extra, env=env, log=log, append=append)

    def text(self, name: str) -> str:
        return self.procs[name].text()

    def wait_log(self, name: str, text: str, timeout: float = 60) -> float:
        """Wait until ``text`` appears in the log of ``name``; returns when (epoch seconds).

        :raises AssertionError: the process exited first, or ``timeout`` passed (with its log).
        """
        proc = self.procs[name]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in proc.text():
                return time.time()
            if proc.popen.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.popen.returncode}:\n{proc.text()[-3000:]}")
            time.sleep(0.1)
        raise AssertionError(f"{name} did not log {text!r} within {timeout} s:\n{proc.text()[-3000:]}")

    def signal(self, name: str, sig: int) -> None:
        """``sig`` to the whole process group of ``name``."""
        os.killpg(self.procs[name].popen.pid, sig)

    def kill(self, name: str, timeout: float = 10) -> Proc:
        """SIGKILL to the group of ``name``, then wait for it."""
        proc = self.procs[name]
        os.killpg(proc.popen.pid, signal.SIGKILL)
        proc.popen.wait(timeout)
        return proc

    def pause(self, name: str) -> None:
        self.signal(name, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        self.signal(name, signal.SIGCONT)

    def stop(self, name: str, timeout: float = 15) -> None:
        """SIGTERM to the group of ``name``; SIGKILL if it is still running after ``timeout``."""
        proc = self.procs[name]
        if proc.popen.poll() is None:
            try:
                os.killpg(proc.popen.pid, signal.SIGTERM)
                proc.popen.wait(timeout)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(proc.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.popen.wait(5)

    def stop_all(self, timeout: float = 15) -> None:
        for name in list(self.procs):
            self.stop(name, timeout)

    def logs(self) -> str:
        """The end of every process's log, for an assertion message."""
        return "\n".join(f"----- {p.name}\n{p.text()[-4000:]}" for p in self.procs.values())
