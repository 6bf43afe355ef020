"""The entry store of the Redis store, every strategy (:mod:`celery_anarchon.stores.entry_store`):
store entries, pauses, run-now requests, instance records and fingerprint mappings of one
namespace. :class:`RedisEntries` is composed into :class:`~.store.RedisStore`, which hands it its
connection and its error translation; the pause itself is read inside every claim script
(``pause_refusal`` in :mod:`.scripts`).

Keys, all under the namespace's one hash tag ``<prefix>:{<namespace>}`` (that of the store-wide
hash ``:store``)::

    :entries            hash   name -> {d: definition (absent: only a pause, or cleared),
                                        v: version, t: changed at ms, b: by}
    :pauses             hash   name -> {r: reason, b: by, t: paused at ms}
    :entries:version    string the namespace's entries version
    :entries:epoch      hash   the entries epoch {id, born: ms, server: the run_id it was
                               written under, accepted: ms, accepted_by}
    :entries:cleared    zset   the names whose record is cleared, scored by the ms it was
    :requests           hash   "<entry> <request id>" (percent-escaped) -> {e, i, s: slot, b, t}:
                               the requests younger than the memory (what load_entries reads)
    :requests:age       zset   request field scored by its request ms
    :requests:slots     zset   request field scored by its slot (a new request's slot avoids them)
    :requests:ids       hash   request field -> the same record, kept for the retention
    :requests:ids:age   zset   request field scored by its request ms
    :requests:pruned    string the newest "now - retention" of a prune of :requests:ids
    :instances          hash   instance id -> "<seen ms> <expires ms> <record JSON>"
    :instances:expiry   zset   instance id scored by its expiry ms
    :fingerprints       hash   digest -> JSON {config entry name: fingerprint}
    :fingerprints:kept  zset   digest scored by the ms until which it is kept

Every write of an entry, a pause or a request is one Lua script that raises ``:entries:version``
in the same script (atomic with the write) and writes the entries epoch when there is none or
the server's ``run_id`` changed since (a restart or a failover: docs/design.md "Amnesia"; a
version raised under the old epoch would hide the loss from an instance), and a resume or a
removal leaves the name's record cleared (pruned after
:data:`~celery_anarchon.stores.entry_store.CLEARED_KEEP_MS`). Each write is confirmed as a
durable claim is: the store's ``durability`` (WAIT / WAITAOF pipelined after it, with the ``confirm_write`` script of
:mod:`.scripts` counting the replicas by the claims' rule). One the master applied but did not
confirm within ``confirm_timeout`` raises :class:`~celery_anarchon.errors.StoreError`: the change
may be lost if the master fails over now (a pause lost so would let the promoted replica run the
entry), so the caller repeats it once the replicas are back. With durability ``"none"`` the script
runs alone. Instance records and fingerprint mappings are not confirmed (a heartbeat is written
again within seconds). :meth:`RedisEntries.version` is one GET, and the other
reads are one MULTI (one consistent read). Every time is the server's ``TIME``: an instance
record expires on the store's clock. No key carries a TTL: requests (older than the store's
memory, or a day when it is unbounded; their ids after the retention the request script is
given), expired instance records and fingerprint mappings no heartbeat named for a day are
pruned by the scripts that write their kind. The request script also reads and keeps the
store-wide note of the claims' scripts (``:store``: epoch and memory start, with the same rules):
its memory start begins the memory of run-now requests. Numbers are written as
decimal strings (``%d``), definitions as the caller's JSON text: nothing is pickled or evaluated.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any, ContextManager
from urllib.parse import quote

import redis

from celery_anarchon import limits
from celery_anarchon._util import LATENESS_TOLERANCE_MS
from celery_anarchon.errors import EntryExists, UnknownEntry
from celery_anarchon.stores.entry_store import (
    CLEARED_KEEP_MS, DEFAULT_REQUEST_RETENTION_S, EntriesEpoch, EntryOps, EntrySnapshot,
    InstanceRecord, Pause, RunRequest, StoredEntry, new_epoch_id,
)
from celery_anarchon.stores.run_now import (
    EXTRA_SLOT_SEARCH_MS, RequestClock, SlotWindow, SlotWindowPassed, no_free_slot,
    request_id_ms, request_refusal,
)
from celery_anarchon.stores.redis.options import namespace_key_prefix

#: The namespace's keys, by role (``<prefix>:{<namespace>}:<role>``); ``store`` is the store-wide
#: hash of :data:`~.scripts.STORE_FIELDS`.
ROLES = ("store", "pauses", "entries", "entries:version", "requests", "requests:age",
         "requests:slots", "requests:ids", "requests:ids:age", "requests:pruned", "instances",
         "instances:expiry", "fingerprints", "fingerprints:kept", "entries:epoch",
         "entries:cleared")
#: The keys of every write of an entry or a pause, in the order its script receives them.
WRITE_ROLES = ("entries", "pauses", "entries:version", "entries:epoch", "entries:cleared")
#: How long run-now requests are kept when the store's memory is unbounded (stream-id), ms.
DAY_MS = 86_400_000


def namespace_keys(key_prefix: str, namespace: str) -> dict[str, str]:
    """Every key of the namespace itself, by role (:data:`ROLES`), all with one hash tag."""
    start = namespace_key_prefix(key_prefix, namespace)
    return {role: f"{start}:{role}" for role in ROLES}


# -- Lua -------------------------------------------------------------------------------------------

_PRELUDE = r"""
local clock = redis.call('TIME')
local NOW = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)  -- store ms
local function int(n) return string.format('%d', n) end
-- a name's record as load_entries reads it (_read_record): one a hand edit or another program
-- wrote that is not a JSON object holds its text as the definition (so that it can be updated
-- or removed, as its problem row says); a pause record that cannot be read is a pause saying so
local function decoded(raw)
  if not raw then return nil end
  local ok, rec = pcall(cjson.decode, raw)
  if ok and type(rec) == 'table' and string.match(raw, '^%s*{') then return rec end
  return {d = raw}
end
local function pause_decoded(raw)
  if not raw then return nil end
  local ok, p = pcall(cjson.decode, raw)
  if ok and type(p) == 'table' and type(p.r) == 'string' and type(p.b) == 'string'
      and type(p.t) == 'string' then
    return p
  end
  return {r = "the store's pause record is not readable", b = '', t = '0'}
end

-- a change of one name: the namespace's version goes up in the same script and becomes the name's
local function changed(rec, by, version_key)
  rec.v, rec.t, rec.b = int(redis.call('INCR', version_key)), int(NOW), by
  return rec
end

-- drop the members of zset (and their fields of hash) scored up to upto
local function prune(hash, zset, upto)
  local gone = redis.call('ZRANGEBYSCORE', zset, '-inf', upto)
  for _, m in ipairs(gone) do redis.call('HDEL', hash, m) end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', zset, '-inf', upto) end
end

-- keep member of zset at least until until_ms
local function keep(zset, member, until_ms)
  local cur = redis.call('ZSCORE', zset, member)
  if not cur or tonumber(cur) < until_ms then redis.call('ZADD', zset, int(until_ms), member) end
end
"""

#: The entries epoch, kept by every script that raises the entries version (the writes of
#: entries and pauses, an accepted loss, a run-now request).
_EPOCH = r"""
-- the entries epoch (hash epoch_key): written when the namespace has none, or anew (new_id) when
-- the server's run_id changed since it was written (a restart or a failover: writes may have
-- been lost)
local function renew_entries_epoch(epoch_key, new_id)
  local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
  local rec = redis.call('HMGET', epoch_key, 'id', 'server')
  if not rec[1] or rec[2] ~= run_id then
    redis.call('HSET', epoch_key, 'id', new_id, 'born', int(NOW), 'server', run_id)
  end
end
"""

#: The writes of entries and pauses (KEYS: :data:`WRITE_ROLES`; ARGV[1] the name, the last two
#: ARGV a new epoch id and the ms a cleared record is kept): the entries epoch, and the record
#: of one name kept or cleared.
_WRITE_PRELUDE = _PRELUDE + _EPOCH + r"""
local EPOCH, CLEARED = KEYS[4], KEYS[5]
local NEW_EPOCH, CLEARED_KEEP_MS = ARGV[#ARGV - 1], tonumber(ARGV[#ARGV])

local function entries_epoch() renew_entries_epoch(EPOCH, NEW_EPOCH) end

-- write the record of name (cleared: it holds neither definition nor pause, kept CLEARED_KEEP_MS
-- so that instances that keep what they knew from before a loss see it), pruning old cleared ones
local function put_record(name, rec, paused)
  redis.call('HSET', KEYS[1], name, cjson.encode(rec))
  if rec.d or paused then
    redis.call('ZREM', CLEARED, name)
  else
    redis.call('ZADD', CLEARED, int(NOW), name)
  end
  prune(KEYS[1], CLEARED, '(' .. int(NOW - CLEARED_KEEP_MS))
  entries_epoch()
end
"""

#: Add (create "1") or update ("0") a store entry's definition.
#: KEYS: WRITE_ROLES.  ARGV: name, definition, by, create, new epoch id, cleared keep ms.
#: Reply: {o: ok|exists|unknown, r: the name's record, p: its pause?}.
ENTRY_PUT = _WRITE_PRELUDE + r"""
local rec = decoded(redis.call('HGET', KEYS[1], ARGV[1])) or {}
if ARGV[4] == '1' and rec.d then return cjson.encode({o = 'exists'}) end
if ARGV[4] ~= '1' and not rec.d then return cjson.encode({o = 'unknown'}) end
rec.d = ARGV[2]
changed(rec, ARGV[3], KEYS[3])
put_record(ARGV[1], rec, false)
return cjson.encode({o = 'ok', r = rec, p = pause_decoded(redis.call('HGET', KEYS[2], ARGV[1]))})
"""

#: Remove a store entry's definition and its pause, leaving the record cleared (nothing when it
#: has no definition).
#: KEYS: WRITE_ROLES.  ARGV: name, by, new epoch id, cleared keep ms.
#: Reply: {o: ok|none, v: the version}.
ENTRY_REMOVE = _WRITE_PRELUDE + r"""
local rec = decoded(redis.call('HGET', KEYS[1], ARGV[1]))
if not (rec and rec.d) then return cjson.encode({o = 'none'}) end
redis.call('HDEL', KEYS[2], ARGV[1])
rec = changed({}, ARGV[2], KEYS[3])
put_record(ARGV[1], rec, false)
return cjson.encode({o = 'ok', v = rec.v})
"""

#: Pause ("1") or resume ("0") the entry called name (config or store entry); a resume of a name
#: without a definition leaves its record cleared (written even when it held nothing).
#: KEYS: WRITE_ROLES.  ARGV: name, pause, reason, pause's by, by, new epoch id, cleared keep ms.
#: Reply: {o: ok, r: the name's record, p?}.
ENTRY_PAUSE = _WRITE_PRELUDE + r"""
local rec = changed(decoded(redis.call('HGET', KEYS[1], ARGV[1])) or {}, ARGV[5], KEYS[3])
local pause = nil
if ARGV[2] == '1' then
  pause = {r = ARGV[3], b = ARGV[4], t = int(NOW)}
  redis.call('HSET', KEYS[2], ARGV[1], cjson.encode(pause))
else
  redis.call('HDEL', KEYS[2], ARGV[1])
end
put_record(ARGV[1], rec, pause ~= nil)
return cjson.encode({o = 'ok', r = rec, p = pause})
"""

#: Record that an operator accepts what the store lost (docs/design.md "Amnesia").
#: KEYS: WRITE_ROLES.  ARGV: by, new epoch id, cleared keep ms.  Reply: {now}.
ENTRIES_ACCEPT = _WRITE_PRELUDE + r"""
entries_epoch()
redis.call('HSET', EPOCH, 'accepted', int(NOW), 'accepted_by', ARGV[1])
redis.call('INCR', KEYS[3])
return cjson.encode({now = int(NOW)})
"""

#: The store-wide note as the claims' scripts keep it (:mod:`.scripts`, "Epoch"): a new or wiped
#: store, or a new server epoch (run_id), begins its memory now. Sets BORN (store ms). KEYS[1]: the
#: namespace's store-wide hash.
_NOTE = r"""
local BORN
do
  local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
  local note = redis.call('HMGET', KEYS[1], 'epoch', 'born')
  if not note[1] then
    redis.call('HSET', KEYS[1], 'epoch', run_id, 'born', int(NOW))
    BORN = NOW
  elseif note[1] ~= run_id then
    redis.call('HSET', KEYS[1], 'epoch', run_id, 'born', int(NOW), 'previous', note[1])
    BORN = NOW
  else
    BORN = tonumber(note[2]) or NOW
  end
end
"""

#: The store's clock once the memory start is noted, with the prune mark (``request_clock``).
#: KEYS: store, requests:pruned.  Reply: {now, born, pruned}.
REQUEST_CLOCK = _PRELUDE + _NOTE + r"""
return cjson.encode({now = int(NOW), born = int(BORN),
                     pruned = int(tonumber(redis.call('GET', KEYS[2]) or '0'))})
"""

#: Record a run-now request (EntryOps.request_run, its steps in order): found (the retention's
#: ids, or the young requests) -> {o: found, r}; an id that carries its time refused
#: (RequestClock.refusal) -> {o: why, now, born, pruned}; the store's clock outside the caller's
#: window -> {o: window, now}; pruned; the slot chosen (SlotWindow.choose) or none -> {o: full};
#: recorded, the entries version raised and the entries epoch kept as every write of an entry
#: or a pause keeps it -> {o: new, r}.
#: KEYS: store, requests, requests:age, requests:slots, requests:ids, requests:ids:age,
#:   requests:pruned, entries:version, entries:epoch.
#: ARGV: field, entry, request id, by, memory horizon ms (young requests), retention ms, the id's
#:   time ms ("" : an opaque id), window start ms, window end ms, the window's scheduled slots
#:   (decimal ms, space-separated), the entry's field prefix ("<escaped entry> "), search ms,
#:   tolerance ms, a new entries epoch id.
REQUEST_RUN = _PRELUDE + _EPOCH + _NOTE + r"""
local raw = redis.call('HGET', KEYS[5], ARGV[1]) or redis.call('HGET', KEYS[2], ARGV[1])
if raw then return cjson.encode({o = 'found', r = raw}) end
local R, TOL = tonumber(ARGV[6]), tonumber(ARGV[13])
local pruned = tonumber(redis.call('GET', KEYS[7]) or '0')
local id_ms = tonumber(ARGV[7])
if id_ms then
  local why = nil
  if id_ms < NOW - R then why = 'retention'
  elseif id_ms < BORN + TOL then why = 'memory'
  elseif id_ms < pruned then why = 'pruned'
  elseif id_ms > NOW + TOL then why = 'ahead' end
  if why then
    return cjson.encode({o = why, now = int(NOW), born = int(BORN), pruned = int(pruned)})
  end
end
local start, stop = tonumber(ARGV[8]), tonumber(ARGV[9])
if NOW < start or NOW > stop then return cjson.encode({o = 'window', now = int(NOW)}) end
prune(KEYS[5], KEYS[6], '(' .. int(NOW - R - TOL))
if pruned < NOW - R then redis.call('SET', KEYS[7], int(NOW - R)) end
prune(KEYS[2], KEYS[3], '(' .. int(NOW - tonumber(ARGV[5])))
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. int(NOW - tonumber(ARGV[5])))
local blocked = {}
for slot in string.gmatch(ARGV[10], '%d+') do blocked[tonumber(slot)] = true end
local taken = redis.call('ZRANGEBYSCORE', KEYS[4], int(NOW), int(stop), 'WITHSCORES')
local prefix = ARGV[11]
for i = 1, #taken, 2 do
  if string.sub(taken[i], 1, #prefix) == prefix then blocked[tonumber(taken[i + 1])] = true end
end
local slot = nil
for candidate = NOW, math.min(stop, NOW + tonumber(ARGV[12]) - 1) do
  if not blocked[candidate] then slot = candidate break end
end
if not slot then return cjson.encode({o = 'full'}) end
raw = cjson.encode({e = ARGV[2], i = ARGV[3], s = int(slot), b = ARGV[4], t = int(NOW)})
redis.call('HSET', KEYS[2], ARGV[1], raw)
redis.call('ZADD', KEYS[3], int(NOW), ARGV[1])
redis.call('ZADD', KEYS[4], int(slot), ARGV[1])
redis.call('HSET', KEYS[5], ARGV[1], raw)
redis.call('ZADD', KEYS[6], int(NOW), ARGV[1])
redis.call('INCR', KEYS[8])
renew_entries_epoch(KEYS[9], ARGV[14])
return cjson.encode({o = 'new', r = raw})
"""

#: An instance's heartbeat: its record, expiring ttl ms later on the server's clock; drops expired
#: records; keeps the fingerprint mapping it names a day past its expiry, drops those past theirs.
#: KEYS: instances, instances:expiry, fingerprints, fingerprints:kept.
#: ARGV: instance id, record JSON, ttl ms, fingerprints digest ("" for none), keep ms.
#: Reply: {now}.
INSTANCE_RECORD = _PRELUDE + r"""
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
FINGERPRINTS_SAVE = _PRELUDE + r"""
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
keep(KEYS[2], ARGV[1], NOW + tonumber(ARGV[3]))
return cjson.encode({now = int(NOW)})
"""

#: The entry store's scripts, by the name the store registers them under.
SCRIPTS = {"entry_put": ENTRY_PUT, "entry_remove": ENTRY_REMOVE, "entry_pause": ENTRY_PAUSE,
           "entries_accept": ENTRIES_ACCEPT, "request_clock": REQUEST_CLOCK,
           "request_run": REQUEST_RUN, "instance_record": INSTANCE_RECORD,
           "fingerprints_save": FINGERPRINTS_SAVE}

_RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(InstanceRecord)
                       if f.name not in ("seen_ms", "expires_ms"))


# -- the operations --------------------------------------------------------------------------------

class RedisEntries(EntryOps):
    """The :class:`~celery_anarchon.stores.entry_store.EntryStore` operations of one Redis
    namespace (the store's methods of the same names call these).

    :param keys: the namespace's keys (:func:`namespace_keys`).
    :param connection: ``connection()`` -> (client, its registered scripts by name), the store's
        (the scripts of :data:`SCRIPTS` among them).
    :param unavailable: ``unavailable(doing)``: a context manager that turns driver errors into
        :class:`~celery_anarchon.errors.StoreUnavailable`.
    :param horizon_ms: how long run-now requests are kept, ms (the store's memory; ``0``: unbounded,
        then :data:`DAY_MS`).
    :param where: how errors name the store and namespace (``"Redis store <url>, namespace 'x'"``).
    :param write: ``write(doing, script, keys, args)`` -> the reply (JSON decoded) of an entry,
        pause or request script run on the master and confirmed as a durable claim is (the
        store's ``_entry_write``); it raises StoreError when the write is not confirmed within
        ``confirm_timeout``.
    """

    def __init__(self, keys: Mapping[str, str], connection: Callable[[], tuple[redis.Redis, dict]],
                 unavailable: Callable[[str], ContextManager], horizon_ms: int, where: str, *,
                 write: Callable[[str, str, list, list], Any]) -> None:
        self.keys = dict(keys)
        self._connection = connection
        self._unavailable = unavailable
        self.horizon_ms = int(horizon_ms) or DAY_MS
        self.where = where
        self._write_confirmed = write

    def _run(self, script: str, roles: tuple[str, ...], *args) -> str:
        """Run ``script`` on the namespace's keys of ``roles`` (no confirmation: heartbeats)."""
        with self._unavailable(script.replace("_", " ")):
            scripts = self._connection()[1]
            return scripts[script](keys=[self.keys[r] for r in roles], args=list(args))

    def _write(self, doing: str, script: str, roles: tuple[str, ...], *args) -> Any:
        """Run the write ``script`` on the namespace's keys of ``roles``, confirmed (``write``).

        :returns: its reply, JSON decoded.
        :raises StoreError: not confirmed within ``confirm_timeout``.
        :raises StoreUnavailable: the store did not answer.
        """
        return self._write_confirmed(doing, script, [self.keys[r] for r in roles], list(args))

    def _write_entries(self, doing: str, script: str, *args) -> Any:
        """Run a write of entries or pauses (KEYS :data:`WRITE_ROLES`; ``args`` then a new epoch
        id and :data:`CLEARED_KEEP_MS`), confirmed, as :meth:`_write`."""
        return self._write(doing, script, WRITE_ROLES, *args, new_epoch_id(), CLEARED_KEEP_MS)

    def _read(self, doing: str, fill: Callable[[redis.client.Pipeline], None]) -> list:
        """One MULTI/EXEC (a consistent read): ``fill(pipe)`` queues the commands."""
        with self._unavailable(doing):
            pipe = self._connection()[0].pipeline(transaction=True)
            fill(pipe)
            return pipe.execute()

    # -- entries, pauses, requests ------------------------------------------------------------
    def entries_version(self) -> int:
        """The namespace's entries version: one GET (0 before any change)."""
        with self._unavailable("read the entries version"):
            value = self._connection()[0].get(self.keys["entries:version"])
        return int(value or 0)

    def entries_epoch(self) -> EntriesEpoch:
        """The namespace's entries epoch and version: one MULTI of a GET and an HGET."""
        k = self.keys
        version, epoch = self._read("read the entries epoch", lambda p: (
            p.get(k["entries:version"]), p.hget(k["entries:epoch"], "id")))
        return EntriesEpoch(epoch=epoch or "", version=int(version or 0))

    def load_entries(self) -> EntrySnapshot:
        """Every entry, pause and cleared record, the requests younger than the horizon, the
        entries epoch and the last accepted loss, in one MULTI."""
        k = self.keys
        version, entries, pauses, requests, (secs, micros), epoch = self._read(
            "load entries", lambda p: (
                p.get(k["entries:version"]), p.hgetall(k["entries"]), p.hgetall(k["pauses"]),
                p.hgetall(k["requests"]), p.time(),
                p.hmget(k["entries:epoch"], "id", "accepted", "accepted_by")))
        now = int(secs) * 1000 + int(micros) // 1000
        stored = {name: _read_record(name, raw, pauses.get(name))
                  for name, raw in entries.items()}
        young = [r for r in map(_request, map(json.loads, requests.values()))
                 if r.requested_ms > now - self.horizon_ms]
        young.sort(key=lambda r: (r.requested_ms, r.entry, r.request_id))
        epoch_id, accepted, accepted_by = epoch
        return EntrySnapshot(version=int(version or 0), entries=stored, requests=tuple(young),
                             epoch=epoch_id or "", accepted_ms=int(accepted or 0),
                             accepted_by=accepted_by or "")

    def accept_loss(self, *, by: str) -> int:
        """Record the accepted loss (the server's clock, ``by``); raises the version."""
        return int(self._write_entries("accept the loss", "entries_accept", by)["now"])

    def put_entry(self, name: str, definition: str, *, by: str, create: bool) -> StoredEntry:
        """Add or update a definition (see :meth:`EntryStore.put_entry`)."""
        reply = self._write_entries(f"{'add' if create else 'update'} {name!r}", "entry_put",
                                    name, definition, by, "1" if create else "0")
        if reply["o"] == "exists":
            raise EntryExists(f"{self.where}: the store holds an entry {name!r} already; update "
                              "it, or remove it first")
        if reply["o"] == "unknown":
            raise UnknownEntry(f"{self.where}: the store holds no entry {name!r}; add it first")
        return _stored(name, reply["r"], reply.get("p"))

    def remove_entry(self, name: str, *, by: str) -> bool:
        """Remove a definition and its pause, leaving the record cleared; False when there was
        no definition."""
        return self._write_entries(f"remove {name!r}", "entry_remove", name, by)["o"] == "ok"

    def set_pause(self, name: str, pause: Pause | None, *, by: str) -> StoredEntry:
        """Pause or resume ``name`` (the pause's time is the server's)."""
        reply = self._write_entries(
            f"{'pause' if pause else 'resume'} {name!r}", "entry_pause", name,
            "1" if pause else "0", pause.reason if pause else "", pause.by if pause else "", by)
        return _stored(name, reply["r"], reply.get("p"))

    def request_clock(self) -> RequestClock:
        """The server's ``TIME`` once the store-wide memory start is noted, with the prune mark
        (one script)."""
        return _clock(self._write("read the clock for a request id", "request_clock",
                                  ("store", "requests:pruned")))

    def find_request(self, entry: str, request_id: str) -> RunRequest | None:
        """:meth:`EntryStore.find_request`: the two HGETs of :data:`REQUEST_RUN`'s first step,
        in one MULTI."""
        field = _request_field(entry, request_id)
        kept, young = self._read("find a run-now request", lambda p: (
            p.hget(self.keys["requests:ids"], field), p.hget(self.keys["requests"], field)))
        raw = kept or young
        return None if raw is None else _request(json.loads(raw))

    def request_run(self, entry: str, request_id: str, window: SlotWindow, *, by: str,
                    retention_ms: int = int(DEFAULT_REQUEST_RETENTION_S * 1000)) -> RunRequest:
        """:meth:`EntryStore.request_run` in one script (:data:`REQUEST_RUN`), confirmed as a
        durable claim is."""
        prefix = _request_field(entry, "")
        id_ms = request_id_ms(request_id)
        reply = self._write(
            f"run-now {entry!r}", "request_run",
            ("store", "requests", "requests:age", "requests:slots", "requests:ids",
             "requests:ids:age", "requests:pruned", "entries:version", "entries:epoch"),
            _request_field(entry, request_id), entry, request_id, by, self.horizon_ms,
            int(retention_ms), "" if id_ms is None else id_ms, window.start_ms, window.end_ms,
            " ".join(str(s) for s in sorted(window.scheduled)), prefix, EXTRA_SLOT_SEARCH_MS,
            LATENESS_TOLERANCE_MS, new_epoch_id())
        outcome = reply["o"]
        if outcome in ("found", "new"):
            return _request(json.loads(reply["r"]), created=outcome == "new")
        if outcome == "window":
            raise SlotWindowPassed(f"{self.where}: run-now of {entry!r}: the store's clock "
                                   f"{reply['now']} is outside the window {window.start_ms}.."
                                   f"{window.end_ms}")
        if outcome == "full":
            raise no_free_slot(entry)
        raise request_refusal(entry, request_id, outcome, id_ms=int(id_ms), clock=_clock(reply),
                              retention_ms=int(retention_ms))

    # -- instances, fingerprints --------------------------------------------------------------
    def record_instance(self, record: InstanceRecord, ttl_ms: int) -> None:
        """Write the heartbeat, expiring ``ttl_ms`` later on the server's clock."""
        text = json.dumps({f: getattr(record, f) for f in _RECORD_FIELDS}, sort_keys=True)
        self._run("instance_record", ("instances", "instances:expiry", "fingerprints",
                                      "fingerprints:kept"),
                  record.instance_id, text, max(0, int(ttl_ms)), record.fingerprints_digest, DAY_MS)

    def instances(self) -> list[InstanceRecord]:
        """The records not expired on the server's clock (one MULTI), by instance id."""
        (secs, micros), records = self._read("read instances", lambda p: (
            p.time(), p.hgetall(self.keys["instances"])))
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
        self._read("remove instance", lambda p: (
            p.hdel(self.keys["instances"], instance_id),
            p.zrem(self.keys["instances:expiry"], instance_id)))

    def save_fingerprints(self, digest: str, fingerprints: Mapping[str, str]) -> None:
        """Keep the mapping under ``digest`` (a day, and while heartbeats name it)."""
        self._run("fingerprints_save", ("fingerprints", "fingerprints:kept"), digest,
                  json.dumps(dict(fingerprints), sort_keys=True), DAY_MS)

    def load_fingerprints(self, digest: str) -> dict[str, str] | None:
        """The mapping saved under ``digest``, or None."""
        with self._unavailable("load fingerprints"):
            raw = self._connection()[0].hget(self.keys["fingerprints"], digest)
        return json.loads(raw) if raw else None


def _stored(name: str, rec: dict, pause: dict | None) -> StoredEntry:
    """A StoredEntry from the scripts' record ``{d?, v, t, b}`` and pause ``{r, b, t}``."""
    return StoredEntry(name=name, definition=rec.get("d"),
                       pause=Pause(reason=pause["r"], by=pause["b"], at_ms=int(pause["t"]))
                       if pause else None,
                       version=int(rec["v"]), updated_ms=int(rec["t"]), updated_by=rec["b"])


def _read_record(name: str, raw: str, pause_raw: str | None) -> StoredEntry:
    """The StoredEntry of a record as :meth:`RedisEntries.load_entries` reads it, whatever a hand
    edit or another version wrote there: a record that is not a JSON object keeps its text as
    the definition (refused by name where it is used: a problem row, an entry beat leaves out),
    a definition that is not text its JSON, a version, time or author missing or of the wrong
    type reads as 0 or ``""``; a pause record that cannot be read is a pause (its claims are
    refused too) whose reason says so."""
    rec = _json_object(raw)
    definition = raw if rec is None else rec.get("d")
    if definition is not None and not isinstance(definition, str):
        definition = json.dumps(definition)
    rec = rec or {}
    pause = None
    if pause_raw is not None:
        fields = _json_object(pause_raw)
        if fields is None or not all(isinstance(fields.get(k), str) for k in "rbt"):
            pause = Pause(reason=f"the store's pause record is not readable: {pause_raw[:80]!r}",
                          by="", at_ms=0)
        else:
            pause = Pause(reason=fields["r"], by=fields["b"], at_ms=_whole(fields["t"]))
    return StoredEntry(name=name, definition=definition, pause=pause,
                       version=_whole(rec.get("v")), updated_ms=_whole(rec.get("t")),
                       updated_by=rec.get("b") if isinstance(rec.get("b"), str) else "")


def _json_object(text: str) -> dict | None:
    """The JSON object ``text`` holds, or None (not JSON, not an object, or nested deeper than
    :data:`~celery_anarchon.limits.MAX_DEPTH`: json.loads would recurse past Python's limit)."""
    if limits.text_too_deep(text):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _whole(value: Any) -> int:
    """A record's number (a decimal string, as the scripts write it), or 0 when it is not one."""
    digits = value[1:] if isinstance(value, str) and value.startswith("-") else value
    if isinstance(digits, str) and digits.isascii() and digits.isdecimal() and len(digits) < 20:
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _clock(reply: dict) -> RequestClock:
    """A RequestClock from a script's reply ``{now, born, pruned}``."""
    return RequestClock(int(reply["now"]), int(reply["born"]), int(reply["pruned"]))


def _request_field(entry: str, request_id: str) -> str:
    """The field of a request in the request hashes: ``"<entry> <request id>"``, both
    percent-escaped (``""`` as the id: the prefix of the entry's fields)."""
    return quote(entry, safe="") + " " + quote(request_id, safe="")


def _request(rec: dict, created: bool = False) -> RunRequest:
    """A RunRequest from the script's record ``{e, i, s, b, t}``."""
    return RunRequest(entry=rec["e"], request_id=rec["i"], slot_ms=int(rec["s"]), by=rec["b"],
                      requested_ms=int(rec["t"]), created=created)
