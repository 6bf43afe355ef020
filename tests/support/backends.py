"""The test backends: one row per store the tests and benchmarks run against.

A row says how to reach the store (``kind``, the environment variable that points at a server and
its default URL), the store options that pick the variant, how to wipe the server (the amnesia
case) and how to backdate a store's memory start (a brand-new store refuses the slots of its first
``LATENESS_TOLERANCE_MS``). The hooks know the backend's internals; production code has none.

Which stores hold leases or check lateness is read from the store classes themselves (a store is
built without I/O), never listed by hand. Adding a store: its module under
``celery_anarchon/stores/``, one row of :data:`BACKENDS` (and its scheme in the URL table).
"""
from __future__ import annotations

import copy
import dataclasses
import os
import uuid
from collections.abc import Callable, Iterable

from celery_anarchon.errors import ConfigError
from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import ClaimStore


# -- how to wipe a server (the amnesia case) --------------------------------------------------------

def _flush_redis(url: str, open_one: Callable[[], ClaimStore]) -> None:
    import redis
    redis.Redis.from_url(url).flushdb()


def cluster_client(url: str):
    """A redis-py ``RedisCluster`` on the startup nodes of a ``redis+cluster://`` URL."""
    from redis.cluster import ClusterNode, RedisCluster
    from celery_anarchon.stores.redis.cluster_keys import parse_cluster_url
    nodes, kwargs = parse_cluster_url(url)
    return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in nodes], **kwargs)


def _flush_redis_cluster(url: str, open_one: Callable[[], ClaimStore]) -> None:
    client = cluster_client(url)
    try:
        for node in client.get_primaries():
            client.get_redis_connection(node).flushdb()
    finally:
        client.close()


def _start_redis_cluster() -> str | None:
    from cluster_rig import cluster_url  # tests/: three masters of our own, once per process
    return cluster_url()


def _drop_sql_tables(url: str, open_one: Callable[[], ClaimStore]) -> None:
    import sqlalchemy as sa
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        meta = sa.MetaData()
        meta.reflect(conn)
        for table in reversed(meta.sorted_tables):
            if table.name.startswith("anarchon_"):
                table.drop(conn)
    engine.dispose()


def _delete_nats_streams(url: str, open_one: Callable[[], ClaimStore]) -> None:
    """Delete every stream and bucket of this store kind, in every namespace."""
    from celery_anarchon.stores.nats.connection import API, STREAM_NOT_FOUND, ApiError
    import json
    store = open_one()

    async def step(session, nc):
        names, offset = [], 0
        while True:
            page = await session.api(nc, f"{API}.STREAM.NAMES", {"offset": offset})
            names += page.get("streams") or []
            offset += len(page.get("streams") or [])
            if not page.get("streams") or offset >= int(page.get("total", 0)):
                break
        ours = [n for n in names if n.startswith(("ANARCHON_", "KV_ANARCHON_"))]
        for msg in await session.pipeline(nc, [(f"{API}.STREAM.DELETE.{n}", b"", None) for n in ours]):
            with_error = json.loads(msg.data or b"{}").get("error")
            if with_error and with_error.get("err_code") != STREAM_NOT_FOUND:
                raise ApiError("STREAM.DELETE", with_error)
    store._call("forget everything", step)
    store._streams.ready.clear()


def forget_rabbitmq_queues(store, queue_names: Callable[[str], Iterable[str]] | None = None) -> None:
    """Delete every queue of this store kind (any namespace, this prefix), as a broker that lost
    its data would. AMQP cannot list queues: ``queue_names(vhost)`` gives the broker's queue
    names (``rabbitmq_tools.queue_names`` asks ``rabbitmqctl list_queues``).

    :raises RuntimeError: ``queue_names`` not given.
    """
    import kombu
    from celery_anarchon.stores.rabbitmq.store import DECLARE_CHANNELS
    if queue_names is None:
        raise RuntimeError("forgetting a RabbitMQ store needs queue_names(vhost): AMQP "
                           "cannot list queues (tests pass rabbitmq_tools.queue_names)")
    with store._using("forgetting everything") as s:
        s.connect()
        vhost = s.conn.virtual_host or "/"
        ours = [n.strip() for n in queue_names(vhost) if store.names.is_ours(n.strip())]
        ours.sort(key=lambda name: ".claim." in name)  # the memory starts first
        # thousands of claim queues may be alive: pipelined over a few channels of a
        # connection that waits long enough for them all
        with kombu.Connection(store.url, ssl=store.ssl, connect_timeout=store.claim_timeout,
                              transport_options={"read_timeout": 300}) as conn:
            channels = [conn.channel() for _ in range(DECLARE_CHANNELS)]
            for i, name in enumerate(ours):
                channels[i % len(channels)].queue_delete(name, nowait=True)
            for ch in channels:
                ch.basic_qos(0, 0, False)  # synchronous: every delete before it is done
        s.reset()
    store._uncertain.clear()
    store._undelivered.clear()


def _delete_rabbitmq_queues(url: str, open_one: Callable[[], ClaimStore]) -> None:
    from rabbitmq_tools import queue_names  # rabbitmqctl: AMQP cannot list queues
    forget_rabbitmq_queues(open_one(), queue_names)


def memory_server(url: str):
    """The memory server a ``memory://`` URL names, in this process."""
    from celery_anarchon.stores.memory.state import server_named
    return server_named(url.split("://", 1)[1])


def _forget_memory(url: str, open_one: Callable[[], ClaimStore]) -> None:
    """Every namespace of the memory server is gone; the server keeps its epoch (a flush)."""
    server = memory_server(url)
    with server.lock:
        server.spaces.clear()


def memory_snapshot(url: str, namespace: str):
    """A copy of what the memory server holds for ``namespace``."""
    server = memory_server(url)
    with server.lock:
        return copy.deepcopy(server.space(namespace))


def memory_restore(url: str, namespace: str, snapshot, epoch: str) -> None:
    """The namespace back to ``snapshot`` (later writes lost), its memory noted under ``epoch``
    (another server's: the store notices the change at its next operation)."""
    server = memory_server(url)
    with server.lock:
        space = server.spaces[namespace] = copy.deepcopy(snapshot)
        if space.note is not None:
            space.note.epoch = epoch


def memory_entries_under(store, server_epoch: str) -> None:
    """The namespace's entries epoch looks written under ``server_epoch``."""
    with store.operation("age the epoch") as (_, space, _now):
        space.entries_server_epoch = server_epoch


def memory_age_cleared(store, name: str, by_ms: int) -> None:
    """The time of ``name``'s record ``by_ms`` into the past."""
    with store.operation("age a record") as (_, space, _now):
        space.stored[name] = dataclasses.replace(space.stored[name],
                                                 updated_ms=space.stored[name].updated_ms - by_ms)


# -- how to backdate a store's memory start ---------------------------------------------------------

def _backdate_memory(store, entries: list[str], by_ms: int) -> None:
    """born -= ``by_ms``, for the entries and the store-wide memory start."""
    from celery_anarchon.stores.memory.notes import fences
    with store.operation("backdate the memory start") as (server, space, now):
        store.note(server, space, now, claiming=False)
        space.note.born_ms -= by_ms
        for fence in fences(space, entries, now).values():
            fence.born_ms -= by_ms


def _backdate_redis(store, entries: list[str], by_ms: int) -> None:
    """The memory start of ``entries`` and of the store, ``by_ms`` back."""
    store.connection.call("memory_start", [k for e in entries for k in store._block(e)], int(by_ms))


def _backdate_redis_cluster(store, entries: list[str], by_ms: int) -> None:
    """The memory start of ``entries`` and of every hash slot (the store's), ``by_ms`` back: the
    slots of ``entries`` with their entries (one call a slot), every other slot's note after;
    and the namespace's own note (its slot: the memory of run-now requests)."""
    store.entries.request_clock()                                      # the namespace's note, noted
    store.connection.client()[0].hincrby(store.namespace_keys["store"], "born", -int(by_ms))
    groups = store._by_slot(entries)
    for names in groups.values():
        store.connection.call("memory_start", [k for e in names for k in store._block(e)], int(by_ms))
    cluster = store.connection.client()[0]
    by_node: dict = {}
    for slot, owners in cluster.nodes_manager.slots_cache.items():
        if slot not in groups:
            by_node.setdefault(owners[0].name, []).append(slot)
    for name, slots in by_node.items():
        pipe = cluster.get_redis_connection(cluster.get_node(node_name=name)).pipeline(
            transaction=False)
        for slot in slots:
            pipe.hincrby(store.slots.head(slot)[0], "born", -int(by_ms))
        pipe.execute()


def _backdate_sql(store, entries: list[str], by_ms: int) -> None:
    """born = (existing or now) - ``by_ms``, for the entries and the store-wide memory start."""
    import sqlalchemy as sa
    from celery_anarchon.stores.sql import schema

    def work(conn: sa.Connection) -> None:
        e, st = schema.entries, schema.stores
        store._memory.note_store(conn, claiming=False)
        conn.execute(sa.update(st).where(st.c.namespace == store.namespace)
                     .values(born_ms=st.c.born_ms - by_ms))
        for name in store._memory.lock_entries(conn, entries):
            conn.execute(sa.update(e).where(e.c.namespace == store.namespace, e.c.entry == name)
                         .values(born_ms=e.c.born_ms - by_ms))
    store.connection.run("backdate the memory start", work)


def _backdate_nats(store, entries: list[str], by_ms: int) -> None:
    """The memory of ``entries`` began ``by_ms`` earlier than the stream's creation (or than a
    previous backdating). Kept as a message in the claims stream, so it is lost with the stream."""
    import json
    from celery_anarchon.stores.nats.connection import reply_json, time_ms
    store._claims.born.clear()

    async def step(session, nc):
        info, _ = await store._claims_stream(session, nc)
        created = time_ms(info["created"])
        now = await session.get(nc, store.stream,
                                [{"last_by_subj": store._names.born_subject(e)} for e in entries])
        born = [int(s.body.get("born_ms", created)) if s else created for s in now]
        acks = await session.pipeline(nc, [
            (store._names.born_subject(e), json.dumps({"born_ms": b - int(by_ms)}).encode(), None)
            for e, b in zip(entries, born)])
        for ack in acks:
            reply_json(ack, store.stream)
    if entries:
        store._call("backdate memory start", step)


def _backdate_rabbitmq(store, entries: list[str], by_ms: int) -> None:
    from celery_anarchon.stores.rabbitmq.connection import ONE_MESSAGE
    from celery_anarchon.stores.rabbitmq.memory import local_ms
    with store._using("backdating the memory start") as s:
        for entry in entries:
            queue = store.names.born(entry)
            with store._memory.entry_lock(s, entry):
                ch = s.channel()
                ch.queue_declare(queue, durable=True, auto_delete=False, arguments=ONE_MESSAGE)
                old = store._memory.take_born(ch, queue, keep=False)
                ch.close()
                born = (old if old is not None else local_ms()) - int(by_ms)
                store._memory.put_born(s, entry, born)
            s.born[entry] = born


# -- the registry -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Backend:
    """One store the tests run against.

    :param kind: the test's name of the store ("redis-script": Redis, strategy script).
    :param url_variable: the environment variable that points the tests at a server (``None``:
        a file in the test's temporary folder).
    :param default_url: the URL when the variable is unset.
    :param server: what a skip message calls the server.
    :param options: store options that select the variant.
    :param wipe: ``wipe(url, open_one)``: make the server forget everything stores of this kind
        wrote (every namespace); ``open_one()`` opens a store of the row.
    :param backdate: ``backdate(store, entries, by_ms)``: move the memory start of ``entries``
        ``by_ms`` into the past.
    :param local_url: ``local_url(folder)``: the URL of a store of the test's own, for a row
        without a server (``url_variable`` None): a SQLite file in ``folder``, a memory server
        named after it.
    :param shared_by_processes: False for a store of one process (memory://): a test of
        several processes races threads on it instead, and the tests of real Celery processes
        leave it out.
    """

    kind: str
    url_variable: str | None
    default_url: str
    server: str
    options: dict
    wipe: Callable[[str, Callable[[], ClaimStore]], None]
    backdate: Callable[[ClaimStore, list[str], int], None]
    #: ``start()`` -> the URL of servers of the tests' own, started on first use when the
    #: variable is unset (it sets the variable), or None when they cannot run here
    start: Callable[[], str | None] | None = None
    local_url: Callable[[str], str] | None = None
    shared_by_processes: bool = True

    @property
    def url(self) -> str:
        """The server's URL (the variable's value, else servers started now, else the default)."""
        if self.url_variable is None:
            return self.default_url
        if self.start is not None and not os.environ.get(self.url_variable):
            return self.start() or self.default_url
        return os.environ.get(self.url_variable, self.default_url)

    def _probe(self) -> ClaimStore:
        """A store of this row, never used: building one does no I/O, its class tells what it
        can do. :raises ConfigError: its client library is not installed."""
        url = (os.environ.get(self.url_variable, self.default_url) if self.url_variable
               else self.local_url("probe"))
        return open_store(url, namespace="probe", instance_id="probe", options=dict(self.options))

    @property
    def missing_client(self) -> str | None:
        """Why no store of this row can be built here (its client library is not installed:
        the error names the extra to install), or None."""
        try:
            self._probe()
        except ConfigError as error:
            return str(error)
        return None

    @property
    def holds_leases(self) -> bool:
        return self._probe().leases is not None

    @property
    def checks_lateness(self) -> bool:
        return self._probe().checks_lateness


REDIS = "ANARCHON_TEST_REDIS_URL"

BACKENDS: tuple[Backend, ...] = (
    Backend("memory", None, "memory://", "memory", {}, _forget_memory, _backdate_memory,
            local_url=lambda folder: "memory://" + folder, shared_by_processes=False),
    Backend("sqlite", None, "", "SQLite", {}, _drop_sql_tables, _backdate_sql,
            local_url=lambda folder: "sqlite:///" + os.path.join(folder, "claims.sqlite3")),
    Backend("postgresql", "ANARCHON_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test",
            "PostgreSQL", {}, _drop_sql_tables, _backdate_sql),
    Backend("redis", REDIS, "redis://127.0.0.1:6379/9", "Redis", {}, _flush_redis, _backdate_redis),
    Backend("redis-stream-id", REDIS, "redis://127.0.0.1:6379/9", "Redis",
            {"strategy": "stream-id"}, _flush_redis, _backdate_redis),
    Backend("redis-script", REDIS, "redis://127.0.0.1:6379/9", "Redis",
            {"strategy": "script"}, _flush_redis, _backdate_redis),
    Backend("redis-idmp", "ANARCHON_TEST_REDIS8_URL", "redis://127.0.0.1:6390/0",
            "Redis >= 8.6 (built and started by .ci/run)", {"strategy": "idmp"}, _flush_redis,
            _backdate_redis),
    Backend("redis-cluster", "ANARCHON_TEST_REDIS_CLUSTER_URL", "redis+cluster://127.0.0.1:7000/",
            "Redis Cluster (three masters the tests start, or the variable's)", {},
            _flush_redis_cluster, _backdate_redis_cluster, start=_start_redis_cluster),
    Backend("rabbitmq", "ANARCHON_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//", "RabbitMQ",
            {}, _delete_rabbitmq_queues, _backdate_rabbitmq),
    Backend("nats", "ANARCHON_TEST_NATS_URL", "nats://127.0.0.1:4222", "NATS JetStream", {},
            _delete_nats_streams, _backdate_nats),
)

BY_KIND: dict[str, Backend] = {b.kind: b for b in BACKENDS}



def kinds_whose_store(test: Callable[[ClaimStore], bool]) -> tuple[str, ...]:
    """The kinds whose store passes ``test`` (read from a store built without I/O), in the
    registry's order. A kind whose client library is not installed is kept, whatever ``test``:
    its tests meet ``stores_support.require_client``, which skips them on a developer machine and
    fails them under CI, instead of the kind dropping out of the parametrization unseen."""
    return tuple(b.kind for b in BACKENDS if b.missing_client or test(b._probe()))


#: every store: the contract suite runs on each
ALL_STORES = tuple(BY_KIND)
#: the lease stores of docs/design.md (they check lateness on their own clock and hold leases)
LEASE_STORES = kinds_whose_store(lambda store: store.leases is not None)
#: stores that refuse late and early claims on their own clock
LATENESS_STORES = kinds_whose_store(lambda store: store.checks_lateness)
#: the stores that processes share (the tests of several real processes run on these)
PROCESS_STORES = tuple(b.kind for b in BACKENDS if b.shared_by_processes)
#: store options that select a variant of a backend (kind -> options)
VARIANT_OPTIONS: dict[str, dict] = {b.kind: dict(b.options) for b in BACKENDS if b.options}


def url_of(kind: str) -> str:
    """The server URL of ``kind`` (its variable, else its default)."""
    return BY_KIND[kind].url


def backdate_memory_start(store: ClaimStore, entries: Iterable[str], by_ms: int) -> None:
    """Move the memory start of ``entries`` ``by_ms`` into the past, as if the store had been
    running for a while (a fresh store refuses slots up to LATENESS_TOLERANCE_MS after its memory
    began). Works on any store of the registry's backends."""
    BY_KIND[store.kind].backdate(store, list(dict.fromkeys(entries)), int(by_ms))


def wipe(kind: str, url: str, namespace: str | None = None) -> None:
    """Make the server behind ``url`` forget everything stores of ``kind`` wrote."""
    backend = BY_KIND[kind]
    opened: list[ClaimStore] = []

    def open_one() -> ClaimStore:
        opened.append(open_store(url, namespace=namespace or "wiper-" + uuid.uuid4().hex[:6],
                                 instance_id="wiper", options=dict(backend.options)))
        return opened[-1]
    try:
        backend.wipe(url, open_one)
    finally:
        for store in opened:
            store.close()
