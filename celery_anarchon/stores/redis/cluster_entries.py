"""The entry store of the Redis Cluster store: :class:`~.entries.RedisEntries` with the pause
also written into the entry's hash slot, where the claim script checks it.

The namespace's keys (entries, pauses, version, requests, instances) share the namespace's tag,
one slot, and its scripts run there unchanged. A claim runs in the entry's slot and cannot read
them, so each pause and resume is written twice: first the namespace's record (which raises the
entries version, as on one Redis), then the pause in the slot's pauses hash
(:class:`~.cluster_keys.SlotKeys`) with that version, applied only if it is newer than the
slot's last one (two writers racing end as the namespace records them). ``set_pause`` returns
once both are written: a pause returned before a claim always holds. Between the two writes the
claims still see the old state; if the second fails, ``set_pause`` raises StoreUnavailable and
the call is to be repeated (the namespace may already show the new state).
"""
from __future__ import annotations

import json
from collections.abc import Callable

import redis

from celery_anarchon.stores.entry_store import Pause, StoredEntry
from celery_anarchon.stores.redis.cluster_keys import SlotKeys
from celery_anarchon.stores.redis.entries import _PRELUDE, RedisEntries

#: Write the pause of one entry into its slot, if newer than the slot's last write for it.
#: KEYS: the slot's pauses, the slot's pause versions.  ARGV: name, entries version, pause record
#: JSON {r, b, t} ("" to resume).  Reply: "1" written, "0" an newer write was there.
SLOT_PAUSE = r"""
local last = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if tonumber(ARGV[2]) <= last then return '0' end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
if ARGV[3] == '' then redis.call('HDEL', KEYS[1], ARGV[1]) else redis.call('HSET', KEYS[1], ARGV[1], ARGV[3]) end
return '1'
"""

#: Remove a store entry's definition and its pause, as ``entry_remove``, returning the version.
#: KEYS: entries, pauses, entries:version.  ARGV: name.  Reply: {o: ok|none, v: version}.
ENTRY_REMOVE_VERSIONED = _PRELUDE + r"""
local rec = decoded(redis.call('HGET', KEYS[1], ARGV[1]))
if not (rec and rec.d) then return cjson.encode({o = 'none'}) end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return cjson.encode({o = 'ok', v = int(redis.call('INCR', KEYS[3]))})
"""

SCRIPTS = {"slot_pause": SLOT_PAUSE, "entry_remove_versioned": ENTRY_REMOVE_VERSIONED}


class ClusterEntries(RedisEntries):
    """The entry operations of one namespace on a Redis Cluster (see the module docstring).

    :param slots: the namespace's per-slot keys.
    :param node_client: ``node_client(key)`` -> the ``redis.Redis`` of the master serving
        ``key``'s slot (for the reads that must be one MULTI with ``TIME``).
    The other parameters are :class:`~.entries.RedisEntries`'.
    """

    def __init__(self, keys, connection, unavailable, horizon_ms: int, where: str, *,
                 slots: SlotKeys, node_client: Callable[[str], redis.Redis]) -> None:
        super().__init__(keys, connection, unavailable, horizon_ms, where)
        self.slots = slots
        self._node_client = node_client

    def _read(self, doing: str, fill: Callable[[redis.client.Pipeline], None]) -> list:
        """One MULTI/EXEC on the master of the namespace's slot (``TIME`` included)."""
        with self._unavailable(doing):
            pipe = self._node_client(self.keys["entries"]).pipeline(transaction=True)
            fill(pipe)
            return pipe.execute()

    def _slot_pause(self, name: str, version: int, pause: dict | None) -> None:
        slot = self.slots.slot_of_entry(name)
        self._run_keys("slot_pause", [self.slots.head(slot)[1], self.slots.pause_versions(slot)],
                       name, int(version), json.dumps(pause) if pause else "")

    def _run_keys(self, script: str, keys: list[str], *args) -> str:
        with self._unavailable(script.replace("_", " ")):
            return self._connection()[1][script](keys=keys, args=list(args))

    def set_pause(self, name: str, pause: Pause | None, *, by: str) -> StoredEntry:
        """Pause or resume ``name``: the namespace's record, then the entry's slot (the claims)."""
        stored = super().set_pause(name, pause, by=by)
        record = ({"r": stored.pause.reason, "b": stored.pause.by, "t": str(stored.pause.at_ms)}
                  if stored.pause else None)
        self._slot_pause(name, stored.version, record)
        return stored

    def remove_entry(self, name: str, *, by: str) -> bool:
        """Remove a definition and its pause (the namespace's, then the slot's)."""
        reply = json.loads(self._run("entry_remove_versioned",
                                     ("entries", "pauses", "entries:version"), name))
        if reply["o"] != "ok":
            return False
        self._slot_pause(name, int(reply["v"]), None)
        return True
