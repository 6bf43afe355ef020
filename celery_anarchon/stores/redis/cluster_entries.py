"""The entry store of the Redis Cluster store: :class:`~.entries.RedisEntries` with the pause
also written into the entry's hash slot, where the claim script checks it.

The namespace's keys (entries, pauses, version, requests, instances) share the namespace's tag,
one slot, and its scripts run there unchanged. A claim runs in the entry's slot and cannot read
them, so each pause and resume is written twice: the namespace's record (which raises the entries
version, as on one Redis, and is what ``list`` and ``status`` show) and the pause in the slot's
pauses hash (:class:`~.cluster_keys.SlotKeys`, what claims check), applied with that version only
if it is newer than the slot's last one (two writers racing end as the namespace orders them).

Every write is confirmed on the replicas of the master it went to, as a durable claim is (the
store's ``durability``; the two slots may be on two masters), and ``set_pause`` returns once all
are written and confirmed: a pause returned before a claim always holds, on the master and on a
replica promoted after it. The order makes a failure between the writes (StoreUnavailable, or
StoreError for a write not confirmed within ``confirm_timeout``; the call stops at the first one)
err on the side of "paused":

* **pause**: first the entry's slot (the pause, unversioned: the claims refuse from now on), then
  the namespace's record, then the slot again with the record's version (so that a resume
  racing it ends as the namespace orders the two). Failing after the first write, the claims
  answer ``paused`` while the namespace may not show the pause yet;
* **resume**: first the namespace's record, then the slot. Failing between them, the namespace
  shows the entry resumed while the claims still answer ``paused``;
* **remove** (definition and pause): as a resume, the namespace first.

Either way the call raises, and repeating it (once the replicas are back) makes both agree. A
write not confirmed stays on the master: the error says the change may be lost if it fails over.
"""
from __future__ import annotations

import json

from celery_anarchon.stores.entry_store import Pause, StoredEntry
from celery_anarchon.stores.redis.cluster_connection import ClusterConnection
from celery_anarchon.stores.redis.cluster_keys import SlotKeys
from celery_anarchon.stores.redis.entries import RedisEntries

#: Write the pause of one entry into its slot, if newer than the slot's last write for it; with no
#: version (a pause's first write, before the namespace orders it) the pause unconditionally, its
#: time the server's, the versions untouched.
#: KEYS: the slot's pauses, the slot's pause versions.  ARGV: name, entries version ("": first
#: write), pause record JSON {r, b, t} ({r, b} for a first write; "" to resume).
#: Reply: "1" written, "0" a newer write was there.
SLOT_PAUSE = r"""
if ARGV[2] == '' then
  local clock = redis.call('TIME')
  local rec = cjson.decode(ARGV[3])
  rec.t = string.format('%d', tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000))
  redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(rec))
  return '1'
end
local last = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if tonumber(ARGV[2]) <= last then return '0' end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
if ARGV[3] == '' then redis.call('HDEL', KEYS[1], ARGV[1]) else redis.call('HSET', KEYS[1], ARGV[1], ARGV[3]) end
return '1'
"""

SCRIPTS = {"slot_pause": SLOT_PAUSE}


class ClusterEntries(RedisEntries):
    """The entry operations of one namespace on a Redis Cluster (see the module docstring).

    The parameters are :class:`~.entries.RedisEntries`', the connection a
    :class:`~.cluster_connection.ClusterConnection` (its ``write`` runs a script on the slot of
    its first key and confirms it on that slot's master; a MULTI runs on the master of its key's
    slot; its ``slots`` are the namespace's per-slot keys).
    """

    def __init__(self, keys, connection: ClusterConnection, horizon_ms: int) -> None:
        super().__init__(keys, connection, horizon_ms)
        self.slots: SlotKeys = connection.slots

    def _slot_pause(self, name: str, version: int | None, pause: dict | None, *,
                    doing: str = "pause") -> None:
        """Write ``name``'s pause record (``None``: resume) into its slot with the namespace's
        ``version`` (``None``: a pause's first write, unversioned), confirmed on that slot's master.

        :raises StoreError: not confirmed within ``confirm_timeout`` (``doing`` names the call).
        :raises StoreUnavailable: the master did not answer.
        """
        slot = self.slots.slot_of_entry(name)
        self.connection.write(
            doing, "slot_pause", [self.slots.head(slot)[1], self.slots.pause_versions(slot)],
            [name, "" if version is None else int(version), json.dumps(pause) if pause else ""])

    def set_pause(self, name: str, pause: Pause | None, *, by: str) -> StoredEntry:
        """Pause ``name`` (the entry's slot, the namespace's record, the slot with its version) or
        resume it (the namespace's record, then the slot): see the module docstring.

        :raises StoreError: a write not confirmed within ``confirm_timeout`` (the call stops
            there; repeat it once the replicas are back).
        :raises StoreUnavailable: a master did not answer.
        """
        doing = f"{'pause' if pause else 'resume'} {name!r}"
        if pause is not None:
            self._slot_pause(name, None, {"r": pause.reason, "b": pause.by}, doing=doing)
        stored = super().set_pause(name, pause, by=by)
        record = ({"r": stored.pause.reason, "b": stored.pause.by, "t": str(stored.pause.at_ms)}
                  if stored.pause else None)
        self._slot_pause(name, stored.version, record, doing=doing)
        return stored

    def remove_entry(self, name: str, *, by: str) -> bool:
        """Remove a definition and its pause (the namespace's, then the slot's, as a resume).

        :raises StoreError: a write not confirmed within ``confirm_timeout``.
        :raises StoreUnavailable: a master did not answer.
        """
        doing = f"remove {name!r}"
        reply = self._write_entries(doing, "entry_remove", name, by)
        if reply["o"] != "ok":
            return False
        self._slot_pause(name, int(reply["v"]), None, doing=doing)
        return True
