"""Helpers to open every store against its real server, and to wipe one (amnesia tests)."""
from __future__ import annotations

import os
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import Store

from conftest import AMQP_URL, NATS_URL, POSTGRES_URL, REDIS8_URL, REDIS_URL, require_server

#: the lease stores of DESIGN.md (they check lateness on their own clock and hold leases)
LEASE_STORES = ("sqlite", "postgresql", "redis")
#: the other stores of DESIGN.md's memory table, by backend module
REDIS_STRATEGY_STORES = ("redis-stream-id", "redis-script", "redis-idmp")
RABBITMQ_STORES = ("rabbitmq",)
NATS_STORES = ("nats",)
#: every store: the contract suite runs on each
ALL_STORES = LEASE_STORES + REDIS_STRATEGY_STORES + RABBITMQ_STORES + NATS_STORES
#: stores that refuse late and early claims on their own clock
LATENESS_STORES = LEASE_STORES

#: store options that select a variant of a backend (kind -> options)
VARIANT_OPTIONS: dict[str, dict] = {
    "redis-stream-id": {"strategy": "stream-id"},
    "redis-script": {"strategy": "script"},
    "redis-idmp": {"strategy": "idmp"},
}


@dataclass
class StoreMaker:
    """Opens stores of one backend that share one namespace, as several instances would."""

    kind: str
    url: str
    namespace: str
    opened: list[Store] = field(default_factory=list)

    def __call__(self, instance_id: str | None = None, **options) -> Store:
        options = {**VARIANT_OPTIONS.get(self.kind, {}), **options}
        store = open_store(self.url, namespace=self.namespace,
                           instance_id=instance_id or "inst-" + uuid.uuid4().hex[:6], options=options)
        self.opened.append(store)
        return store

    def wipe(self) -> None:
        """Make the server forget everything of this store (a Redis restarted without
        persistence, a dropped database): the amnesia case."""
        if self.kind == "rabbitmq":
            from rabbitmq_tools import queue_names  # rabbitmqctl: AMQP cannot list queues
            self("wiper")._forget_everything(queue_names)
        elif self.kind == "nats":
            store = self("wiper")
            store._forget_everything()
        elif self.kind.startswith("redis"):
            import redis
            redis.Redis.from_url(self.url).flushdb()
        else:
            import sqlalchemy as sa
            url = self.url.replace("postgresql://", "postgresql+psycopg://", 1)
            engine = sa.create_engine(url)
            with engine.begin() as conn:
                meta = sa.MetaData()
                meta.reflect(conn)
                for table in reversed(meta.sorted_tables):
                    if table.name.startswith("anarchon_"):
                        table.drop(conn)
            engine.dispose()

    def snapshot(self) -> object:
        """Lease stores: a copy of everything this namespace holds in the store, for
        :meth:`lose_writes_since`."""
        if self.kind == "redis":
            import redis
            client = redis.Redis.from_url(self.url)
            try:
                return {key: client.dump(key) for key in client.scan_iter(self._redis_pattern())}
            finally:
                client.close()
        from celery_anarchon.stores import sql_schema as schema
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
        if self.kind == "redis":
            import redis
            client = redis.Redis.from_url(self.url)
            try:
                for key in client.scan_iter(self._redis_pattern()):
                    client.delete(key)
                for key, value in snapshot.items():
                    client.restore(key, 0, value, replace=True)
                    if key.endswith(b":store"):
                        client.hset(key, "epoch", older)
            finally:
                client.close()
            return
        from celery_anarchon.stores import sql_schema as schema
        with self._sql_engine().begin() as conn:
            for table in reversed(schema.metadata.sorted_tables):
                conn.execute(table.delete().where(table.c.namespace == self.namespace))
            for table in schema.metadata.sorted_tables:
                if snapshot[table.name]:
                    conn.execute(table.insert(), snapshot[table.name])
            conn.execute(schema.stores.update().where(schema.stores.c.namespace == self.namespace)
                         .values(epoch=older))

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


def store_url(kind: str, tmpdir: str) -> str:
    """The URL of a real server (or file) for ``kind``; skips/fails when the server is down."""
    if kind == "sqlite":
        return "sqlite:///" + os.path.join(tmpdir, "claims.sqlite3")
    if kind == "postgresql":
        require_server(POSTGRES_URL, "PostgreSQL")
        return POSTGRES_URL
    if kind == "redis-idmp":
        require_server(REDIS8_URL, "Redis >= 8.6 (built and started by .ci/run)")
        return REDIS8_URL
    if kind.startswith("redis"):
        require_server(REDIS_URL, "Redis")
        return REDIS_URL
    if kind == "rabbitmq":
        require_server(AMQP_URL, "RabbitMQ")
        return AMQP_URL
    if kind == "nats":
        require_server(NATS_URL, "NATS JetStream")
        return NATS_URL
    raise ValueError(kind)


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
