"""Instance records (heartbeats) and fingerprint mappings of the SQL stores (the
:class:`~celery_anarchon.stores.entry_store.Instances` contract): a part of
:class:`~celery_anarchon.stores.sql.store.SQLStore`, given what it needs of the store.

Tables ``anarchon_instances`` (one row per live instance, expiring on the store's clock) and
``anarchon_fingerprints`` (a mapping per digest, kept while heartbeats name it):
:mod:`celery_anarchon.stores.sql.schema`. Instants are UTC ms on the store's clock.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa

from celery_anarchon.stores.entry_store import Instances, InstanceRecord
from celery_anarchon.stores.sql import schema

#: fingerprints no heartbeat named for this long are pruned (ms): a day
FINGERPRINTS_KEEP_MS = 86_400_000
#: the fields of an instance record written by its heartbeat (the others are read back only)
_RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(InstanceRecord)
                       if f.name not in ("seen_ms", "expires_ms"))


class SQLInstances(Instances):
    """The instance record operations (the ``instances`` part) of one namespace.

    :param insert: ``insert(table)``: the dialect's INSERT (with ON CONFLICT).
    :param run: ``run(what, work, *, write=True, durable=True)``: ``work(conn)`` in one
        transaction of the store, driver errors turned into StoreUnavailable.
    :param now_us: ``now_us(conn)``: the store's clock, UTC microseconds.
    """

    def __init__(self, *, namespace: str, insert: Callable[[sa.Table], Any],
                 run: Callable[..., Any], now_us: Callable[[sa.Connection], int]) -> None:
        self.namespace = namespace
        self._insert = insert
        self._run = run
        self._now_us = now_us

    def prune(self, conn: sa.Connection, now: int) -> int:
        """Delete expired instance records and fingerprints unused for FINGERPRINTS_KEEP_MS.
        :returns: rows deleted."""
        inst, fp = schema.instances, schema.fingerprints
        return (conn.execute(sa.delete(inst).where(inst.c.expires_ms < now)).rowcount
                + conn.execute(sa.delete(fp).where(fp.c.used_ms < now - FINGERPRINTS_KEEP_MS)).rowcount)

    def record_instance(self, record: InstanceRecord, ttl_ms: int) -> None:
        """Write the heartbeat, expiring ``ttl_ms`` later on the store's clock, and refresh the
        fingerprints it names."""
        inst, fp = schema.instances, schema.fingerprints
        fields = json.dumps({k: getattr(record, k) for k in _RECORD_FIELDS}, sort_keys=True)

        def work(conn: sa.Connection) -> None:
            now = self._now_us(conn) // 1000
            ins = self._insert(inst).values(namespace=self.namespace, instance_id=record.instance_id,
                                            fields=fields, seen_ms=now, expires_ms=now + int(ttl_ms))
            conn.execute(ins.on_conflict_do_update(
                index_elements=("namespace", "instance_id"),
                set_={k: ins.excluded[k] for k in ("fields", "seen_ms", "expires_ms")}))
            conn.execute(sa.update(fp).where(fp.c.namespace == self.namespace,
                                             fp.c.digest == record.fingerprints_digest)
                         .values(used_ms=now))
        self._run("record the instance", work, durable=False)

    def instances(self) -> list[InstanceRecord]:
        """The records not expired on the store's clock, by instance id."""
        inst = schema.instances

        def work(conn: sa.Connection) -> list[InstanceRecord]:
            now = self._now_us(conn) // 1000
            rows = conn.execute(sa.select(inst).where(inst.c.namespace == self.namespace,
                                                      inst.c.expires_ms >= now)
                                .order_by(inst.c.instance_id))
            out = []
            for r in rows:
                fields = {k: v for k, v in json.loads(r.fields).items() if k in _RECORD_FIELDS}
                out.append(InstanceRecord(**{**fields, "instance_id": r.instance_id},
                                          seen_ms=r.seen_ms, expires_ms=r.expires_ms))
            return out
        return self._run("read the instances", work, write=False)

    def remove_instance(self, instance_id: str) -> None:
        """Drop the instance's heartbeat."""
        inst = schema.instances
        self._run("remove the instance", lambda conn: conn.execute(sa.delete(inst).where(
            inst.c.namespace == self.namespace, inst.c.instance_id == instance_id)), durable=False)

    def save_fingerprints(self, digest: str, fingerprints: Mapping[str, str]) -> None:
        """Keep ``fingerprints`` under ``digest`` (content-addressed: a second save only
        refreshes its last use)."""
        fp = schema.fingerprints
        text = json.dumps(dict(fingerprints), sort_keys=True)

        def work(conn: sa.Connection) -> None:
            ins = self._insert(fp).values(namespace=self.namespace, digest=digest, mapping=text,
                                          used_ms=self._now_us(conn) // 1000)
            conn.execute(ins.on_conflict_do_update(index_elements=("namespace", "digest"),
                                                   set_={"used_ms": ins.excluded.used_ms}))
        self._run("save fingerprints", work, durable=False)

    def load_fingerprints(self, digest: str) -> dict[str, str] | None:
        """The mapping saved under ``digest``, or ``None``."""
        fp = schema.fingerprints
        query = sa.select(fp.c.mapping).where(fp.c.namespace == self.namespace, fp.c.digest == digest)
        text = self._run("load fingerprints", lambda conn: conn.execute(query).scalar(), write=False)
        return None if text is None else json.loads(text)
