"""Each pytest-xdist worker's own servers: under ``pytest -n N`` the workers run tests at the same
time, and a test may wipe what its store kind wrote on the whole server (the amnesia tests flush
the Redis db, drop the ``anarchon_*`` tables, delete every ``ANARCHON_*`` stream and every queue of
the vhost), or start Celery processes on the Redis broker db 8. So a worker shares no server state
with another:

================  =================================================================================
Redis             a ``redis-server`` of the worker's own on a free port (``benchmarks/servers.py``),
                  db 9 the store; the tests' other dbs (8 the broker, 7 the results, ...) are
                  then the worker's too
Redis 8 (idmp)    db ``1 + N`` of the shared Redis 8 server (``gwN``; db 0 is the serial run's)
PostgreSQL        the database ``test_gwN`` of the shared server, created when missing
RabbitMQ          the vhost ``test_gwN`` of the shared broker (``rabbitmqctl add_vhost``), guest
                  allowed everything on it
NATS              a ``nats-server -js`` of the worker's own on a free port, its JetStream files in a
                  temporary folder
Redis Cluster     already the process's own (tests/support/cluster_rig.py)
================  =================================================================================

Each applies only when its ``ANARCHON_TEST_*`` variable is unset: a developer's variable wins (and
the workers then share that server: point each at a server of its own, or run ``-n 0``). The URLs
are put into the variables, so the Celery processes a test starts reach the same servers. Nothing
happens outside a worker (``PYTEST_XDIST_WORKER`` unset: the serial run and xdist's controller).
The shared servers' processes are never touched; the worker's own servers stop with the worker.
"""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from urllib.parse import urlsplit, urlunsplit

import backends

_started: list = []


def _with_path(url: str, path: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=path))


def _own_redis(folder: str) -> str | None:
    if shutil.which("redis-server") is None:
        return None
    from servers import RedisServer
    server = RedisServer("redis", folder, persistent=False)
    server.start()
    _started.append(server)
    return _with_path(server.url, "/9")


def _own_nats(folder: str) -> str | None:
    import ha_nats
    if not ha_nats.available():
        return None
    server = ha_nats.NatsServer("nats", folder)
    server.start()
    _started.append(server)
    return server.url


def _own_postgres_database(default: str, name: str) -> str:
    """The database ``name`` on the server of ``default``, created when missing. A server that
    is down is left to the tests (they skip, or fail under CI)."""
    import psycopg
    try:
        with psycopg.connect(_with_path(default, "/postgres"), autocommit=True,
                             connect_timeout=5) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
                try:
                    conn.execute(f'CREATE DATABASE "{name}"')
                except psycopg.errors.DuplicateDatabase:
                    pass                                  # another run created it meanwhile
    except psycopg.OperationalError:
        pass
    return _with_path(default, "/" + name)


def _own_vhost(default: str, name: str) -> str:
    """The vhost ``name`` of the broker of ``default`` (on this host), guest allowed everything on it. A broker
    that is down is left to the tests (they skip, or fail under CI).

    :raises RuntimeError: the broker is up but ``rabbitmqctl`` cannot add the vhost."""
    from servers import port_open
    url = _with_path(default, "/" + name)
    if not port_open(urlsplit(default).port or 5672):
        return url
    tool = shutil.which("rabbitmqctl")
    steps = (["add_vhost", name], ["set_permissions", "-p", name, urlsplit(default).username
                                   or "guest", ".*", ".*", ".*"])
    for step in steps:
        done = (subprocess.run([tool, "-q", *step], capture_output=True, text=True, timeout=60)
                if tool else None)
        if done is None or (done.returncode != 0 and "already exists" not in done.stderr):
            why = done.stderr.strip() if done else "rabbitmqctl is not on this host"
            raise RuntimeError(
                f"the RabbitMQ vhost {name!r} of this xdist worker could not be made ({why}): "
                "set ANARCHON_TEST_AMQP_URL to a vhost of your own, or run the tests with -n 0")
    return url


def isolate() -> None:
    """Give this xdist worker its own servers (see the module docstring); a no-op outside one.

    :raises RuntimeError: a server of the worker's own did not start, or its vhost could not be
        made."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    index = int(worker.removeprefix("gw"))
    folder = tempfile.mkdtemp(prefix=f"anarchon-{worker}-")
    _started.append(folder)                       # removed last, after the servers in it stopped
    atexit.register(stop)
    own = {
        "redis": lambda: _own_redis(folder),
        "redis-idmp": lambda: _with_path(backends.BY_KIND["redis-idmp"].default_url, f"/{1 + index}"),
        "postgresql": lambda: _own_postgres_database(backends.BY_KIND["postgresql"].default_url,
                                                     f"test_{worker}"),
        "rabbitmq": lambda: _own_vhost(backends.BY_KIND["rabbitmq"].default_url, f"test_{worker}"),
        "nats": lambda: _own_nats(folder),
    }
    for kind, make in own.items():
        variable = backends.BY_KIND[kind].url_variable
        if not os.environ.get(variable):
            url = make()
            if url is not None:
                os.environ[variable] = url


def stop() -> None:
    """Stop the worker's own servers and remove their folder (idempotent)."""
    while _started:
        thing = _started.pop()
        if isinstance(thing, str):
            shutil.rmtree(thing, ignore_errors=True)
        else:
            thing.stop()
