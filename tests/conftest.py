"""Shared fixtures: real servers only (no mocks of a store or a broker).

A test that needs a server that is not reachable skips with the reason on a developer machine,
and fails when ``CI`` is set (CI must never pass by skipping).
"""
from __future__ import annotations

import os
import socket
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest

#: the rigs, servers, apps and shared helpers of the tests (tests/support), and the server rigs
#: they share with the benchmarks (benchmarks/servers.py, benchmarks/ha_*.py), importable from
#: every folder of tests/; a test module never imports another test module (what two share is in
#: tests/support), so no folder of tests/ is put on the path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

from backends import url_of  # noqa: E402  (tests/support/backends.py: one row per store)
import worker_servers  # noqa: E402

#: under pytest-xdist, each worker's own servers, before any URL is read (tests/support/worker_servers.py)
worker_servers.isolate()

REDIS_URL = url_of("redis")
POSTGRES_URL = url_of("postgresql")
REDIS8_URL = url_of("redis-idmp")
AMQP_URL = url_of("rabbitmq")
NATS_URL = url_of("nats")

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def reachable(url: str, timeout: float = 1.0) -> bool:
    """True when a TCP connection to ``url``'s host and port succeeds (the first host of a
    list, as in ``redis+cluster://h1:p1,h2:p2/``)."""
    parts = urlsplit(url)
    if "," in parts.netloc:
        parts = urlsplit(url.replace(parts.netloc, parts.netloc.split(",")[0], 1))
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port), timeout=timeout):
            return True
    except OSError:
        return False


def require_server(url: str, what: str) -> None:
    """Skip (developer machine) or fail (CI) when the server behind ``url`` is down."""
    if reachable(url):
        return
    where = urlsplit(url).netloc.rpartition("@")[2].split(",")[0]
    message = (f"{what} is not reachable at {where}; start it "
               "(see .ci/run) or point the ANARCHON_TEST_* variables at one")
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def _shared_task_name(constructor) -> str:
    """The task a Celery shared-task constructor makes (its ``name`` option, else its function)."""
    code, cells = getattr(constructor, "__code__", None), getattr(constructor, "__closure__", None)
    found = dict(zip(code.co_freevars, (c.cell_contents for c in cells))) if code and cells else {}
    fun, opts = found.get("fun"), found.get("opts") or {}
    if opts.get("name"):
        return opts["name"]
    return f"{fun.__module__}.{fun.__qualname__}" if fun is not None else repr(constructor)


@pytest.fixture(autouse=True)
def no_shared_celery_task():
    """Fail a test that registers a Celery shared task (``@app.task`` or ``@shared_task`` without
    ``shared=False``): Celery adds such a task to every app finalized later in the process, so
    it leaks into the apps of the tests that run after it, and their verdicts then depend on the
    order of the tests."""
    from celery import _state
    import celery.app.builtins  # noqa: F401  (Celery's own shared tasks, registered once)
    finalizers = getattr(_state, "_on_app_finalizers", None)
    before = set(finalizers) if finalizers is not None else set()
    yield
    added = set(finalizers) - before if finalizers is not None else set()
    if added:
        finalizers.difference_update(added)   # the next tests' apps stay clean
        where = sorted(_shared_task_name(c) for c in added)
        pytest.fail(f"the test registered {len(added)} Celery shared task(s) ({', '.join(where)}): "
                    "every app made after it gets them; pass shared=False to app.task",
                    pytrace=False)


@pytest.fixture
def namespace() -> str:
    """A namespace of its own for each test, so tests sharing a server never see each other."""
    return "t-" + uuid.uuid4().hex[:12]


def pytest_unconfigure(config) -> None:
    """An xdist worker's own servers stop with it (tests/support/worker_servers.py)."""
    worker_servers.stop()


def pytest_terminal_summary(terminalreporter, config) -> None:
    """The random order's seed again at the end (the header has it, but not under ``-q``, and a
    long log's end is where a failure is read): ``--randomly-seed`` replays the order."""
    seed = getattr(config.option, "randomly_seed", None)
    if config.pluginmanager.hasplugin("randomly") and isinstance(seed, int):
        terminalreporter.write_line(f"tests ran in random order: --randomly-seed={seed} replays it "
                                    "(-p no:randomly: in file order)")
