"""What the operator's tests share: a free port, one HTTP request, the wait for a page process,
one request to the page's ASGI app in this process, a command body run in this process, a
command run as an operator runs it (``celery -A operate_app anarchon ...``, a subprocess), the
store's entries read back by an app of the test's own, and an import of two names equal once
normalized (the import tests)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request

from paths import APPS
from stores_support import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, *, data: bytes | None = None, headers: dict | None = None) -> tuple[int, str]:
    """``(status, body)`` of one request (POST when ``data`` is given)."""
    request = urllib.request.Request(url, data=data, headers=headers or {},
                                     method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def wait_served(base: str, proc, timeout: float = 60) -> None:
    """Wait until the page process answers ``/api/status`` (it still runs)."""
    def up():
        assert proc.alive(), f"the web process exited:\n{proc.text()}"
        try:
            return http(base + "/api/status")[0] in (200, 503)
        except OSError:
            return False
    wait_until(up, timeout, f"the page at {base}", interval=0.2)


def asgi(site, method: str, path: str, query: str = "",
         headers: dict[str, str] | None = None, body: bytes = b"") -> tuple[int, dict, str]:
    """One request to the Starlette app in this process (with ``headers`` and ``body`` too;
    ``Host`` is 127.0.0.1 unless given): (status, headers, body)."""
    import asyncio
    sent = []
    given = {"host": "127.0.0.1", **{k.lower(): v for k, v in (headers or {}).items()}}

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
             "query_string": query.encode(), "headers": [
                 (k.encode(), v.encode()) for k, v in given.items()],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8765)}
    asyncio.run(site(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, body.decode()


def run_in_process(command, *args, capsys, **kwargs) -> tuple[int, str, str]:
    """Run a command's body (``cli_status.status``, ``check``, ...) here: (exit code, stdout,
    stderr)."""
    import click

    code = 0
    try:
        command(*args, **kwargs)
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except click.ClickException as exc:
        exc.show()
        code = exc.exit_code
    out, err = capsys.readouterr()
    return code, out, err


def operate(url: str, namespace: str, schedule: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``celery -A operate_app anarchon <args>`` with the beat_schedule ``schedule``."""
    path = os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "ANARCHON_OP_STORE": url,
           "ANARCHON_OP_NAMESPACE": namespace, "ANARCHON_OP_SCHEDULE": schedule}
    return subprocess.run([sys.executable, "-m", "celery", "-A", "operate_app", "anarchon", *args],
                          env=env, capture_output=True, text=True, timeout=60, cwd=APPS)


def exits(done: subprocess.CompletedProcess, code: int) -> str:
    """The stdout of ``done``, a command that exited with ``code`` (else an AssertionError with
    what it wrote)."""
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    return done.stdout


def reader_app(store_url: str, namespace: str, timezone: str = "UTC"):
    """A Celery app of the test's own (not the current app) on the store ``store_url``."""
    from celery import Celery
    app = Celery("reader", set_as_current=False)
    app.conf.update(broker_url="memory://", anarchon_store_url=store_url,
                    anarchon_namespace=namespace, timezone=timezone)
    return app


def store_entries(store_url: str, namespace: str) -> dict:
    """The store's entries read back through the schedules API: name -> (definition, pause
    reason or None)."""
    import celery_anarchon
    with celery_anarchon.schedules(reader_app(store_url, namespace)) as s:
        return {e.name: (e.definition, e.pause.reason if e.pause else None)
                for e in s.list() if e.source == "store"}


#: two spellings of one name: 'café' as one code point, and 'cafe' + U+0301 (NFC: the first)
COMPOSED, DECOMPOSED = "caf\u00e9", "cafe\u0301"


def imports_refuse_both_spellings(run_import, store_url: str, namespace: str, kept: str,
                                  source: str) -> None:
    """``run_import(*args)`` (an import command of :data:`COMPOSED`, :data:`DECOMPOSED` and
    ``kept``, read from ``source``) refuses both spellings in its dry run and in two runs, each
    with a message naming both (as written and escaped) and the fix, and writes ``kept`` only;
    the second run changes nothing."""
    dry = run_import("--dry-run")
    assert exits(dry, 6).rstrip().endswith("dry run, nothing written: 1 to add, 2 refused")
    for counts in ("1 added, 2 refused", "1 unchanged, 2 refused"):
        done = run_import()
        assert exits(done, 6).rstrip().endswith(f"imported: {counts}")
        assert set(store_entries(store_url, namespace)) == {kept}
        lines = done.stderr.splitlines()
        assert len(lines) == 2, done.stderr
        for line in lines:
            assert (f"entries {DECOMPOSED!r} and {COMPOSED!r} of {source} ('cafe\\u0301' and "
                    "'caf\\xe9') are the same name once normalized (Unicode NFC") in line
            assert f"fix: rename one of them in {source}, then import again" in line
