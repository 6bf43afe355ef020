"""Instance records (heartbeats) and fingerprint mappings of the Redis store, every strategy: the
:class:`~celery_anarchon.stores.entry_store.Instances` part of :class:`~.store.RedisStore`,
with its two scripts.

Keys, under the namespace's hash tag (:mod:`.entries`, the table of the namespace's keys)::

    :instances          hash   instance id -> "<seen ms> <expires ms> <record JSON>"
    :instances:expiry   zset   instance id scored by its expiry ms
    :fingerprints       hash   digest -> JSON {config entry name: fingerprint}
    :fingerprints:kept  zset   digest scored by the ms until which it is kept

A heartbeat is one script on the server's clock: the record expires on the store's clock, and
expired records and the mappings no heartbeat named for a day are pruned by the scripts that
write their kind (no key carries a TTL). They are not confirmed on the replicas (a heartbeat is
written again within seconds). The reads are one MULTI (one consistent read, with ``TIME``).
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

from celery_anarchon.stores.entry_store import Instances, InstanceRecord
from celery_anarchon.stores.redis.connection import RedisConnection
from celery_anarchon.stores.redis.entry_scripts import PRELUDE

#: Fingerprint mappings are kept this long past the expiry of the last heartbeat naming them
#: (and at least this long after they were saved), ms: a day.
FINGERPRINTS_KEEP_MS = 86_400_000

#: An instance's heartbeat: its record, expiring ttl ms later on the server's clock; drops expired
#: records; keeps the fingerprint mapping it names a day past its expiry, drops those past theirs.
#: KEYS: instances, instances:expiry, fingerprints, fingerprints:kept.
#: ARGV: instance id, record JSON, ttl ms, fingerprints digest ("" for none), keep ms.
#: Reply: {now}.
INSTANCE_RECORD = PRELUDE + r"""
local expires = NOW + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], int(NOW) .. ' ' .. int(expires) .. ' ' .. ARGV[2])
redis.call('ZADD', KEYS[2], int(expires), ARGV[1])
prune(KEYS[1], KEYS[2], int(NOW))
if ARGV[4] ~= '' then keep(KEYS[4], ARGV[4], expires + tonumber(ARGV[5])) end
prune(KEYS[3], KEYS[4], int(NOW))
return cjson.encode({now = int(NOW)})
"""

#: Keep a fingerprint mapping under its digest (a day at least; heartbeats naming it extend it).
#: KEYS: fingerprints, fingerprints:kept.  ARGV: digest, mapping JSON, keep ms.  Reply: {now}.
FINGERPRINTS_SAVE = PRELUDE + r"""
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
keep(KEYS[2], ARGV[1], NOW + tonumber(ARGV[3]))
return cjson.encode({now = int(NOW)})
"""

#: The instance records' scripts, by the name the store registers them under.
SCRIPTS = {"instance_record": INSTANCE_RECORD, "fingerprints_save": FINGERPRINTS_SAVE}

#: the fields of an instance record written by its heartbeat (the others are read back only)
_RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(InstanceRecord)
                       if f.name not in ("seen_ms", "expires_ms"))


class RedisInstances(Instances):
    """The instance records of one Redis namespace (module docstring).

    :param keys: the namespace's keys (:func:`.entries.namespace_keys`).
    :param connection: the store's connection (the scripts of :data:`SCRIPTS` registered on it).
    """

    def __init__(self, keys: Mapping[str, str], connection: RedisConnection) -> None:
        self.keys = dict(keys)
        self.connection = connection

    def _run(self, script: str, roles: tuple[str, ...], *args) -> str:
        """Run ``script`` on the namespace's keys of ``roles`` (no confirmation: heartbeats)."""
        with self.connection.unavailable(script.replace("_", " ")):
            scripts = self.connection.client()[1]
            return scripts[script](keys=[self.keys[r] for r in roles], args=list(args))

    def record_instance(self, record: InstanceRecord, ttl_ms: int) -> None:
        """Write the heartbeat, expiring ``ttl_ms`` later on the server's clock."""
        text = json.dumps({f: getattr(record, f) for f in _RECORD_FIELDS}, sort_keys=True)
        self._run("instance_record", ("instances", "instances:expiry", "fingerprints",
                                      "fingerprints:kept"),
                  record.instance_id, text, max(0, int(ttl_ms)), record.fingerprints_digest,
                  FINGERPRINTS_KEEP_MS)

    def instances(self) -> list[InstanceRecord]:
        """The records not expired on the server's clock (one MULTI), by instance id."""
        key = self.keys["instances"]
        (secs, micros), records = self.connection.multi(
            "read instances", key, lambda p: (p.time(), p.hgetall(key)))
        now = int(secs) * 1000 + int(micros) // 1000
        out = []
        for raw in records.values():
            seen, expires, text = raw.split(" ", 2)
            if int(expires) > now:
                data = json.loads(text)
                out.append(InstanceRecord(**{f: data[f] for f in _RECORD_FIELDS if f in data},
                                          seen_ms=int(seen), expires_ms=int(expires)))
        return sorted(out, key=lambda r: r.instance_id)

    def remove_instance(self, instance_id: str) -> None:
        """Drop an instance's heartbeat (one MULTI)."""
        self.connection.multi("remove instance", self.keys["instances"], lambda p: (
            p.hdel(self.keys["instances"], instance_id),
            p.zrem(self.keys["instances:expiry"], instance_id)))

    def save_fingerprints(self, digest: str, fingerprints: Mapping[str, str]) -> None:
        """Keep the mapping under ``digest`` (a day, and while heartbeats name it)."""
        self._run("fingerprints_save", ("fingerprints", "fingerprints:kept"), digest,
                  json.dumps(dict(fingerprints), sort_keys=True), FINGERPRINTS_KEEP_MS)

    def load_fingerprints(self, digest: str) -> dict[str, str] | None:
        """The mapping saved under ``digest``, or None."""
        with self.connection.unavailable("load fingerprints"):
            raw = self.connection.client()[0].hget(self.keys["fingerprints"], digest)
        return json.loads(raw) if raw else None
