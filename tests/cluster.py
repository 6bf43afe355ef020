"""Real ``celery beat`` and ``celery worker`` processes for multi-process tests."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

APPS = os.path.join(os.path.dirname(__file__), "apps")
CELERY = [sys.executable, "-m", "celery"]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: str

    def text(self) -> str:
        with open(self.log, encoding="utf-8", errors="replace") as f:
            return f.read()


@dataclass
class Cluster:
    """Processes of one test, sharing an environment; every process is stopped by :meth:`stop`."""

    tmpdir: str
    env: dict
    app: str = "integration_app"
    procs: dict[str, Proc] = field(default_factory=dict)

    def start(self, name: str, *args: str, env: dict | None = None) -> Proc:
        log = os.path.join(self.tmpdir, f"{name}.log")
        env = {**os.environ, **self.env, **(env or {})}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [APPS, env.get("PYTHONPATH", "")]))
        handle = open(log, "wb")
        popen = subprocess.Popen([*CELERY, "-A", self.app, *args], env=env, cwd=self.tmpdir,
                                 stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
        handle.close()
        self.procs[name] = proc = Proc(name, popen, log)
        return proc

    def beat(self, name: str, *extra: str, env: dict | None = None) -> Proc:
        return self.start(name, "beat", "-l", "info", "--schedule",
                          os.path.join(self.tmpdir, f"{name}-unused-schedule"), *extra, env=env)

    def worker(self, name: str, *extra: str, pool: str = "threads", concurrency: int = 8) -> Proc:
        return self.start(name, "worker", "-l", "info", "-P", pool, "-c", str(concurrency),
                          "--without-gossip", "--without-mingle", "--without-heartbeat",
                          "-n", f"{name}@%h", *extra)

    def wait_log(self, name: str, text: str, timeout: float = 30) -> float:
        """Wait until ``text`` appears in the log of ``name``; returns when (epoch seconds)."""
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
        os.killpg(self.procs[name].popen.pid, sig)

    def stop(self, name: str, timeout: float = 15) -> None:
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

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)

    def logs(self) -> str:
        return "\n".join(f"----- {p.name}\n{p.text()[-4000:]}" for p in self.procs.values())


def read_executions(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
