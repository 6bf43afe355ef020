"""The stores, apps and read surfaces the properties share."""
from __future__ import annotations

import asyncio
import atexit
import itertools
import json
import logging
import os
import shutil
import tempfile
import traceback
import uuid
from urllib.parse import quote, unquote

import click
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner

from celery_anarchon import limits
from celery_anarchon.errors import ConfigError

_FOLDER = tempfile.mkdtemp(prefix="anarchon-fuzz-")
atexit.register(shutil.rmtree, _FOLDER, True)
SQLITE_URL = "sqlite:///" + os.path.join(_FOLDER, "fuzz.sqlite3")
REDIS_URL = os.environ.get("ANARCHON_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
#: a prefix of this process's namespaces (the Redis keys are deleted at exit)
RUN = "fz-" + uuid.uuid4().hex[:8]
_NUMBERS = itertools.count()
STORES = ("sqlite", "redis")


def url_of(kind: str) -> str:
    return {"sqlite": SQLITE_URL, "redis": REDIS_URL}[kind]


def require(kind: str) -> None:
    if kind == "redis":
        from conftest import require_server
        require_server(REDIS_URL, "Redis")


def _wipe_redis() -> None:
    try:
        import redis
        client = redis.Redis.from_url(REDIS_URL, socket_timeout=5)
        keys = list(client.scan_iter(match=f"*{RUN}*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i:i + 500])
    except Exception:  # the server is down: nothing of ours to delete
        pass


atexit.register(_wipe_redis)


def new_namespace() -> str:
    return f"{RUN}-{next(_NUMBERS)}"


def make_app(kind: str, beat_schedule=None, **conf) -> Celery:
    """An app on a namespace of its own, with the config entry ``cfg`` and the task ``fuzz.t``."""
    app = Celery("fuzz", set_as_current=False)
    app.conf.update({"broker_url": "memory://", "anarchon_store_url": url_of(kind),
                     "anarchon_namespace": new_namespace(), "timezone": "UTC",
                     "beat_schedule": {"cfg": {"task": "fuzz.t", "schedule": 60.0}}
                     if beat_schedule is None else beat_schedule, **conf})
    app.task(name="fuzz.t", shared=False)(_task)
    return app


def _task(*args, **kwargs):
    """The body of ``fuzz.t`` (never run)."""


def state(store) -> tuple:
    """What a write changes: the entries version, every entry (definition, pause), the
    run-now requests."""
    snap = store.entries.load_entries()
    return (snap.version, {n: (e.definition, e.pause) for n, e in snap.entries.items()},
            snap.requests)


def is_ours(exc: BaseException) -> bool:
    return isinstance(exc, ConfigError)


def describe(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


# -- the command line ---------------------------------------------------------------------------

def cli(app, args: list) -> click.testing.Result:
    """``celery -A app anarchon ARGS`` in this process."""
    from celery_anarchon.operate.cli import anarchon
    runner = CliRunner()
    return runner.invoke(anarchon, args, obj=CLIContext(app=app, no_color=True, workdir=None),
                         catch_exceptions=True)


def cli_ok(result, args, codes=(0,)) -> None:
    """No traceback; an exit code of ``codes``; a failure is one ``Error:`` line."""
    shown = f"args={args!r} exit={result.exit_code}\nstdout={result.stdout[-3000:]}\n" \
            f"stderr={result.stderr[-3000:]}"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"traceback: {shown}\n{describe(result.exception)}")
    assert "Traceback" not in result.stdout + result.stderr, shown
    assert result.exit_code in codes, shown
    if result.exit_code != 0 and result.exit_code in (2, 3, 4):
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1, shown


# -- the page -------------------------------------------------------------------------------------

def asgi(site, method: str, path: str, query: str = "", body: bytes = b"",
         headers: list | None = None) -> tuple[int, dict, str]:
    """One request to the Starlette app in this process: (status, headers, body)."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)
    raw = quote(path.encode("utf-8", "surrogatepass"), safe="/")   # as a client sends it
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": unquote(raw), "raw_path": raw.encode("ascii"),
             "root_path": "",
             "query_string": query.encode(), "headers": [(b"host", b"127.0.0.1"), *(headers or [])],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8765)}
    asyncio.run(site(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    out = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, \
        out.decode("utf-8", "replace")


class ErrorLog(logging.Handler):
    """The ERROR records of celery_anarchon's loggers while it is attached."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    def __enter__(self):
        logging.getLogger("celery_anarchon").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("celery_anarchon").removeHandler(self)

    def text(self) -> str:
        return "\n".join(self.format(r) + (describe(r.exc_info[1]) if r.exc_info else "")
                         for r in self.records)


# -- every read surface ----------------------------------------------------------------------------

def read_everything(app, *, since: str = "1h", runs: int = 3) -> dict:
    """Every read surface on ``app``: the API's list and get, the commands list, list --json,
    status, status --json, status --runs N, history --since, next, next --after (``since``: a
    duration or instant text, fuzzed), check, and the page's /, /api/status and each entry's
    page and its JSON. Asserts none answers with a traceback; returns the ``/api/status`` entries by
    name."""
    from celery_anarchon import schedules
    from celery_anarchon.operate.web import StatusSource, create_app
    with schedules(app) as s:
        listed = s.list()
        for entry in listed:
            got = s.get(entry.name)
            assert got.name == entry.name
            json.dumps(got.as_json())
    names = [e.name for e in listed]
    #: a name the store holds only a pause of (no definition): next and history know no entry
    bare = {e.name for e in listed if e.source == "unknown"}
    for args, codes in ((["list"], (0,)), (["list", "--json"], (0,)), (["status"], (0,)),
                        (["status", "--json"], (0,)), (["status", "--runs", str(runs)], (0,)),
                        (["check"], (0, 1)), (["check", "--no-store"], (0, 1))):
        result = cli(app, args)
        cli_ok(result, args, codes)
        if args == ["list", "--json"]:
            assert sorted(e["name"] for e in json.loads(result.stdout)) == sorted(names)
    for name in names:
        for args in (["history", name, "--since", since], ["next", name, "-n", "3"],
                     ["next", name, "-n", "2", "--after", since]):
            # 2: a since the command refuses, a problem entry; 3: a pause without an entry
            cli_ok(cli(app, args), args, (0, 2, 3) if name in bare else (0, 2))
    source = StatusSource(app, runs=runs)
    try:
        site = create_app(source, token=None, refresh_s=5.0)
        status, _, body = asgi(site, "GET", "/api/status")
        assert status == 200, body[:3000]
        entries = {e["name"]: e for e in json.loads(body)["entries"]}
        status, _, page = asgi(site, "GET", "/", "per_page=1000")
        assert status == 200, page[:3000]
        for name in names:   # each entry's page (a path cannot carry a lone surrogate: 404)
            for path in ("/entries/", "/api/entries/"):
                status, _, body = asgi(site, "GET", path + name, "limit=2")
                assert status == 200 or (status == 404 and limits.undecodable(name)), \
                    (path, name, status, body[:3000])
    finally:
        source.close()
    assert set(names) <= set(entries), (names, list(entries))
    return entries


# -- raw writes: what a hand edit, a restore or another version leaves in the store ---------------

def write_raw(kind: str, app, name: str, raw: bytes, role: str = "entries") -> None:
    """Overwrite what the store holds for entry ``name`` with ``raw`` bytes: SQLite's definition
    column (``role`` "entries"; "pauses": its pause reason), a Redis hash field of ``role``."""
    namespace = app.conf.anarchon_namespace
    if kind == "sqlite":
        import sqlite3
        column = "definition" if role == "entries" else "pause_reason"
        with sqlite3.connect(SQLITE_URL.removeprefix("sqlite:///")) as conn:
            conn.execute(f"UPDATE anarchon_schedule_entries SET {column} = CAST(? AS TEXT) "
                         "WHERE namespace = ? AND name = ?", (raw, namespace, name))
        return
    write_raw_redis(REDIS_URL, namespace, name, raw, role)


def write_raw_redis(url: str, namespace: str, name: str, raw: bytes, role: str = "entries") -> None:
    """Write ``raw`` as the field ``name`` of the namespace's ``role`` hash (a Redis store)."""
    import redis
    client = redis.Redis.from_url(url)
    try:
        keys = [k for k in client.scan_iter(f"*{{{namespace}}}:{role}")
                if k.endswith(f":{role}".encode())]
        for key in keys:
            client.hset(key, name.encode("utf-8", "surrogatepass"), raw)
    finally:
        client.close()
