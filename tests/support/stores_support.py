"""Helpers to open every store against its real server, and to wipe one (amnesia tests)."""
from __future__ import annotations

import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

import pytest

from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import ClaimStore

import backends
from backends import (  # noqa: F401  (re-exported: the lists the tests parametrize over)
    ALL_STORES, LATENESS_STORES, LEASE_STORES, PROCESS_STORES, VARIANT_OPTIONS,
    backdate_memory_start,
)
from conftest import IN_CI, require_server


@dataclass
class StoreMaker:
    """Opens stores of one backend that share one namespace, as several instances would."""

    kind: str
    url: str
    namespace: str
    opened: list[ClaimStore] = field(default_factory=list)

    def __call__(self, instance_id: str | None = None, **options) -> ClaimStore:
        options = {**VARIANT_OPTIONS.get(self.kind, {}), **options}
        store = open_store(self.url, namespace=self.namespace,
                           instance_id=instance_id or "inst-" + uuid.uuid4().hex[:6], options=options)
        self.opened.append(store)
        return store

    def wipe(self) -> None:
        """Make the server forget everything of this store (a Redis restarted without
        persistence, a dropped database): the amnesia case (the registry's wipe of the kind)."""
        backends.wipe(self.kind, self.url, self.namespace)

    def snapshot(self) -> object:
        """Lease stores: a copy of everything this namespace holds in the store, for
        :meth:`lose_writes_since`."""
        if self.kind == "memory":
            return backends.memory_snapshot(self.url, self.namespace)
        if self.kind == "redis":
            import redis
            client = redis.Redis.from_url(self.url)
            try:
                return {key: client.dump(key) for key in client.scan_iter(self._redis_pattern())}
            finally:
                client.close()
        if self.kind == "redis-cluster":   # per master, pipelined (16384 slot notes)
            client = backends.cluster_client(self.url)
            try:
                copy = {}
                for node in client.get_primaries():
                    server = client.get_redis_connection(node)
                    keys = list(server.scan_iter(self._redis_pattern(), count=1000))
                    pipe = server.pipeline(transaction=False)
                    for key in keys:
                        pipe.dump(key)
                    copy.update(zip(keys, pipe.execute()))
                return copy
            finally:
                client.close()
        from celery_anarchon.stores.sql import schema
        with self._sql_engine().connect() as conn:
            return {table.name: [dict(row) for row in conn.execute(
                        table.select().where(table.c.namespace == self.namespace)).mappings()]
                    for table in schema.metadata.sorted_tables}

    def lose_writes_since(self, snapshot: object) -> None:
        """Lease stores: the server comes back with what :meth:`snapshot` copied and another
        identity, as a Redis restarted from an older snapshot or a promoted replica (or standby)
        that missed the newest writes would: the namespace's data goes back to the snapshot
        (later writes are lost) and the epoch recorded in it is not the server's (an epoch
        change, which the store notices at its next operation)."""
        older = "an-older-server"
        if self.kind == "memory":
            backends.memory_restore(self.url, self.namespace, snapshot, older)
            return
        if self.kind in ("redis", "redis-cluster"):
            import redis
            client = (redis.Redis.from_url(self.url) if self.kind == "redis"
                      else backends.cluster_client(self.url))
            nodes = ([client] if self.kind == "redis" else
                     [client.get_redis_connection(n) for n in client.get_primaries()])
            try:
                if self.kind == "redis-cluster":
                    self._cluster_restore(client, nodes, snapshot, older)
                    return
                for key in [k for node in nodes for k in node.scan_iter(self._redis_pattern())]:
                    client.delete(key)
                for key, value in snapshot.items():
                    client.restore(key, 0, value, replace=True)
                    if key.endswith(b":store"):
                        client.hset(key, "epoch", older)
            finally:
                client.close()
            return
        from celery_anarchon.stores.sql import schema
        with self._sql_engine().begin() as conn:
            for table in reversed(schema.metadata.sorted_tables):
                conn.execute(table.delete().where(table.c.namespace == self.namespace))
            for table in schema.metadata.sorted_tables:
                if snapshot[table.name]:
                    conn.execute(table.insert(), snapshot[table.name])
            conn.execute(schema.stores.update().where(schema.stores.c.namespace == self.namespace)
                         .values(epoch=older))

    def _cluster_restore(self, client, nodes, snapshot: dict, older: str) -> None:
        """:meth:`lose_writes_since` on a Redis Cluster: per master, pipelined."""
        for server in nodes:
            pipe = server.pipeline(transaction=False)
            for key in server.scan_iter(self._redis_pattern(), count=1000):
                pipe.delete(key)
            pipe.execute()
        by_node: dict = {}
        for key, value in snapshot.items():
            by_node.setdefault(client.get_node_from_key(key).name, []).append((key, value))
        for name, items in by_node.items():
            pipe = client.get_redis_connection(client.get_node(node_name=name)).pipeline(
                transaction=False)
            for key, value in items:
                pipe.restore(key, 0, value, replace=True)
                if key.endswith(b":store"):
                    pipe.hset(key, "epoch", older)
            pipe.execute()

    def _redis_pattern(self) -> str:
        from urllib.parse import quote
        return f"anarchon:{{{quote(self.namespace, safe='')}[:}}]*"

    def _sql_engine(self):
        import sqlalchemy as sa
        return sa.create_engine(self.url.replace("postgresql://", "postgresql+psycopg://", 1),
                                poolclass=sa.pool.NullPool)

    def close_all(self) -> None:
        for store in self.opened:
            store.close()


def require_client(kind: str) -> None:
    """Skip (developer machine) or fail (CI) a test of ``kind`` whose client library is not
    installed (the kind stays in the parametrization: backends.kinds_whose_store)."""
    missing = backends.BY_KIND[kind].missing_client
    if missing is None:
        return
    if IN_CI:
        pytest.fail(f"{kind}: {missing}", pytrace=False)
    pytest.skip(f"{kind}: {missing}")


def store_url(kind: str, tmpdir: str) -> str:
    """The URL of a real server (or file) for ``kind``; skips/fails when the server is down or
    the store's client library is not installed."""
    require_client(kind)
    backend = backends.BY_KIND[kind]
    if backend.url_variable is None:
        return backend.local_url(tmpdir)
    require_server(backend.url, backend.server)
    return backend.url


def wait_until(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.02):
    """Poll ``predicate`` until it returns a true value; fail with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def new_tmpdir() -> str:
    return tempfile.mkdtemp(prefix="anarchon-test-")
