"""The Lua scripts of the Redis entry store (:mod:`.entries`: the keys they take, and why each
write raises the entries version and keeps the entries epoch): the writes of entries and pauses,
an accepted loss, and run-now requests, with the prelude they share (also the instance records'
scripts of :mod:`.instances`).

Each script is defined once, with a comment per KEYS and ARGV item, and registered once per
client (:data:`SCRIPTS`). Numbers are written as decimal strings (``%d``); every time is the
server's ``TIME``.
"""
from __future__ import annotations

#: What every script of the namespace's keys shares: the server's clock (``NOW``, ms), ``int``,
#: the reading of a name's record and pause as :mod:`.entries` reads them, ``changed``,
#: ``prune`` and ``keep``.
PRELUDE = r"""
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

#: The writes of entries and pauses (KEYS: :data:`.entries.WRITE_ROLES`; ARGV[1] the name, the
#: last two ARGV a new epoch id and the ms a cleared record is kept): the entries epoch, and the
#: record of one name kept or cleared.
_WRITE_PRELUDE = PRELUDE + _EPOCH + r"""
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
REQUEST_CLOCK = PRELUDE + _NOTE + r"""
return cjson.encode({now = int(NOW), born = int(BORN),
                     pruned = int(tonumber(redis.call('GET', KEYS[2]) or '0'))})
"""

#: Record a run-now request (Entries.request_run, its steps in order): found (the retention's
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
REQUEST_RUN = PRELUDE + _EPOCH + _NOTE + r"""
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

#: The entry store's scripts, by the name the store registers them under.
SCRIPTS = {"entry_put": ENTRY_PUT, "entry_remove": ENTRY_REMOVE, "entry_pause": ENTRY_PAUSE,
           "entries_accept": ENTRIES_ACCEPT, "request_clock": REQUEST_CLOCK,
           "request_run": REQUEST_RUN}
