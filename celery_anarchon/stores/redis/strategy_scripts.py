"""Lua claim scripts of the Redis strategies ``stream-id``, ``script`` and ``idmp``
(:mod:`celery_anarchon.stores.redis.strategies`), on the prelude of
:mod:`celery_anarchon.stores.redis.scripts` (keys, ARGV header, epoch, memory start, pause, clock).

The order of checks per run is in :mod:`.strategies`; each script's KEYS and ARGV are above it.
"""
from __future__ import annotations

from celery_anarchon.stores.redis.scripts import lua

#: Helpers of the three claim scripts. ARGV after the header: the strategy's parameters, then
#: RUN_ITEMS (6) items per request: entry block number (1-based), slot (UTC ms), task id,
#: fingerprint, entry name, "1" for the run of a run-now request (ClaimRequest.requested) else "0".
_HELPERS = r"""
local function fields(flat)  -- a stream entry's field list -> table
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end

local function xinfo(stream)  -- XINFO STREAM as a table
  return fields(redis.call('XINFO', 'STREAM', stream))
end

local function id_ms(id) return tonumber(string.match(id, '^(%d+)')) end

local function recorded(c)  -- the reply for a run whose claim record c = {w, f} was found
  return {o = (c.w == INSTANCE) and 'won' or 'other_won', w = c.w, f = c.f}
end

local function won(b, slot_s, task_id, fingerprint)
  history_put(b, slot_s, 'claimed', task_id, 1, '', false)
  return {o = 'won', w = INSTANCE, f = fingerprint}
end

local function skipped(b, slot_s, task_id, outcome, detail)  -- recorded once (fill only)
  history_put(b, slot_s, outcome, task_id, 1, detail, true)
  return {o = outcome, d = detail}
end

local function claim_all(first, claim_one)
  local refused = settings_refusal()  -- other memory settings in use: nothing is claimed
  local results = {}
  for i = first, #ARGV, 6 do
    local b, slot_s, task_id = tonumber(ARGV[i]), ARGV[i + 1], ARGV[i + 2]
    if refused then
      results[#results + 1] = skipped(b, slot_s, task_id, 'forgotten', refused)
    else
      results[#results + 1] = claim_one(b, slot_s, task_id, ARGV[i + 3], ARGV[i + 4],
                                        ARGV[i + 5] == '1')
    end
  end
  return claim_reply(results)
end
"""

#: stream-id: XADD <slot>-0 to the entry's stream; stream ids only grow (docs/design.md: memory forever).
#: A run-now request's run (its slot: the store's clock when it was made) is its own run, kept
#: apart: its claim record in CLAIMS (field = slot) and its slot in REQUESTED, trimmed to the
#: newest KEEP; REQUESTED_FLOOR is the newest slot ever trimmed from it. It moves no stream id, so
#: it supersedes no scheduled slot, and no scheduled slot supersedes it.
#: KEYS: the namespace keys, then per entry, ENTRY_KEYS then STREAM, REQUESTED, REQUESTED_FLOOR.
#: ARGV[7]: entries to keep (MAXLEN ~; also the run-now runs kept).  ARGV[8..]: runs.
#: Already claimed: <slot>-0 in the stream, or the slot in CLAIMS (one slot is one run, whichever
#: kind claimed it). Refusals: EARLY (slot more than 10 s ahead of the server's clock: an
#: instance with a fast clock must not push the id past everyone's slots), FORGOTTEN (the slot is
#: at or below REQUESTED_FLOOR: a trimmed run-now run of that slot cannot be told apart from
#: none), then for a scheduled slot SUPERSEDED (a newer slot is in the stream) and UNKNOWN (this
#: very id is the stream's last one but its entry is gone: nobody can tell the winner).
STREAM_ID_CLAIM = lua(_HELPERS + r"""
local KEEP = tonumber(ARGV[7])

local function claim_requested(b, slot_s, task_id, fingerprint)
  redis.call('HSET', key(b, CLAIMS), slot_s,
             cjson.encode({w = INSTANCE, f = fingerprint, t = int(NOW)}))
  redis.call('ZADD', key(b, REQUESTED), slot_s, slot_s)
  local excess = redis.call('ZCARD', key(b, REQUESTED)) - KEEP
  if excess > 0 then
    local gone = redis.call('ZRANGE', key(b, REQUESTED), 0, excess - 1)
    redis.call('ZREMRANGEBYRANK', key(b, REQUESTED), 0, excess - 1)
    for _, s in ipairs(gone) do redis.call('HDEL', key(b, CLAIMS), s) end
    local floor = num(redis.call('GET', key(b, REQUESTED_FLOOR)))
    if not floor or tonumber(gone[#gone]) > floor then
      redis.call('SET', key(b, REQUESTED_FLOOR), gone[#gone])
    end
  end
  return won(b, slot_s, task_id, fingerprint)
end

return claim_all(8, function(b, slot_s, task_id, fingerprint, name, requested)
  local stream, id, slot = key(b, STREAM), slot_s .. '-0', tonumber(slot_s)
  local found = redis.call('XRANGE', stream, id, id)[1]
  if found then return recorded(fields(found[2])) end
  local raw = redis.call('HGET', key(b, CLAIMS), slot_s)
  if raw then return recorded(cjson.decode(raw)) end
  local paused = pause_refusal(b, slot_s, task_id, name)
  if paused then return paused end
  local forgot = amnesia(b, slot)
  if forgot then return skipped(b, slot_s, task_id, 'forgotten', forgot) end
  if slot > NOW + TOL then
    return skipped(b, slot_s, task_id, 'early',
      'slot is more than 10 s ahead of the store clock ' .. iso(NOW) .. '; is this host ahead?')
  end
  local floor = num(redis.call('GET', key(b, REQUESTED_FLOOR)))
  if floor and slot <= floor then
    return skipped(b, slot_s, task_id, 'forgotten', 'the store keeps the newest ' .. int(KEEP) ..
      ' run-now runs of an entry and no longer remembers those up to ' .. iso(floor) ..
      ': this slot cannot be claimed safely')
  end
  if requested then return claim_requested(b, slot_s, task_id, fingerprint) end
  -- sequence is always 0: an XADD of <slot>-1 after <slot>-0 would be accepted (a second winner)
  local added = redis.pcall('XADD', stream, 'MAXLEN', '~', KEEP, id,
                            'w', INSTANCE, 'f', fingerprint, 't', int(NOW))
  if type(added) ~= 'table' or not added.err then return won(b, slot_s, task_id, fingerprint) end
  if not string.find(added.err, 'equal or smaller', 1, true) then error(added.err) end
  local last = xinfo(stream)['last-generated-id']
  if last == id then
    return skipped(b, slot_s, task_id, 'unknown',
      'the slot was claimed but its entry (and the name of its winner) is gone from the stream')
  end
  return skipped(b, slot_s, task_id, 'superseded',
    'a newer slot (' .. iso(id_ms(last)) .. ') was already claimed; stream ids only grow')
end)
""", extra_keys=("STREAM", "REQUESTED", "REQUESTED_FLOOR"))

#: script: the claimed slots of each entry in a sorted set (score = slot), the winners in the
#: ``claims`` hash; trimmed by window (server clock) and by count (history_size).
#: KEYS: the namespace keys, then per entry, ENTRY_KEYS then SLOTS, FLOOR.
#: ARGV[7]: window ms.  ARGV[8..]: runs.
#: FLOOR is the newest slot ever trimmed: a slot at or below it cannot be told apart from a claim
#: the store forgot, so it is refused (FORGOTTEN), never won again; so is a slot older than the
#: window on the server's clock. Window trimming runs first, count trimming after the batch (so a
#: run repeated inside one batch finds its own claim).
SCRIPT_CLAIM = lua(_HELPERS + r"""
local WINDOW = tonumber(ARGV[7])

local function forget(b, gone)  -- gone: slots in ascending order, already out of SLOTS
  if #gone == 0 then return end
  for _, s in ipairs(gone) do redis.call('HDEL', key(b, CLAIMS), s) end
  local floor = num(redis.call('GET', key(b, FLOOR)))
  local newest = gone[#gone]
  if not floor or tonumber(newest) > floor then redis.call('SET', key(b, FLOOR), newest) end
end

local function trim_window(b)
  local horizon = '(' .. int(NOW - WINDOW)
  local gone = redis.call('ZRANGEBYSCORE', key(b, SLOTS), '-inf', horizon)
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', key(b, SLOTS), '-inf', horizon) end
  forget(b, gone)
end

local function trim_count(b)
  local excess = redis.call('ZCARD', key(b, SLOTS)) - HISTORY_SIZE
  if excess <= 0 then return end
  local gone = redis.call('ZRANGE', key(b, SLOTS), 0, excess - 1)
  redis.call('ZREMRANGEBYRANK', key(b, SLOTS), 0, excess - 1)
  forget(b, gone)
end

for b = 1, NBLOCKS do trim_window(b) end
local reply = claim_all(8, function(b, slot_s, task_id, fingerprint, name)
  local slot = tonumber(slot_s)
  local raw = redis.call('HGET', key(b, CLAIMS), slot_s)
  if raw then return recorded(cjson.decode(raw)) end
  local paused = pause_refusal(b, slot_s, task_id, name)
  if paused then return paused end
  local forgot = amnesia(b, slot)
  if forgot then return skipped(b, slot_s, task_id, 'forgotten', forgot) end
  if slot < NOW - WINDOW then
    return skipped(b, slot_s, task_id, 'forgotten', 'the slot is older than the window (' ..
      int(WINDOW) .. ' ms) on the store clock ' .. iso(NOW))
  end
  local floor = num(redis.call('GET', key(b, FLOOR)))
  if floor and slot <= floor then
    return skipped(b, slot_s, task_id, 'forgotten', 'the store no longer remembers the runs up ' ..
      'to ' .. iso(floor) .. ' (trimmed by window or history_size): this one cannot be claimed safely')
  end
  redis.call('HSET', key(b, CLAIMS), slot_s,
             cjson.encode({w = INSTANCE, f = fingerprint, t = int(NOW)}))
  redis.call('ZADD', key(b, SLOTS), slot_s, slot_s)
  return won(b, slot_s, task_id, fingerprint)
end)
for b = 1, NBLOCKS do trim_count(b) end
return reply
""", extra_keys=("SLOTS", "FLOOR"))

_IDMP_STREAM = r"""
local DURATION, MAXSIZE = ARGV[7], ARGV[8]
local PRODUCER = 'anarchon'  -- one producer, shared by every instance, in each entry's stream

-- a missing stream is created with this store's IDMP settings before its first claim: setting
-- them later would wipe what it remembers (XCFGSET needs an existing stream; 0-1 is a placeholder)
local function ensure_stream(b)
  local stream = key(b, STREAM)
  if redis.call('EXISTS', stream) == 1 then return false end
  redis.call('XADD', stream, '0-1', 'created', int(NOW))
  redis.call('XDEL', stream, '0-1')
  redis.call('XCFGSET', stream, 'IDMP-DURATION', DURATION, 'IDMP-MAXSIZE', MAXSIZE)
  return true
end
"""

#: idmp (Redis >= 8.6): XADD ... IDMP <producer> <slot> * w <instance> f <fingerprint>. A repeated
#: XADD returns the first entry's id and adds nothing; reading that entry back tells, in the same
#: script, who won. An id newer than the stream's last entry before the XADD is a new claim.
#: A new claim of a paused entry is undone (XDEL) and answered paused; IDMP keeps the id, so a
#: marker {p = id} in CLAIMS (kept for the IDMP duration, pruned by age in EXPIRY) says the slot
#: was never won: a claim of it after the resume wins, its winner recorded in CLAIMS.
#: KEYS: the namespace keys, then per entry, ENTRY_KEYS then STREAM.
#: ARGV[7]: IDMP-DURATION s.  ARGV[8]: IDMP-MAXSIZE.  ARGV[9]: entries kept (MAXLEN ~).
#: ARGV[10..]: runs.
IDMP_CLAIM = lua(_HELPERS + _IDMP_STREAM + r"""
local KEEP = ARGV[9]

local function id_after(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, bm = tonumber(am), tonumber(bm)
  return am > bm or (am == bm and tonumber(as) > tonumber(bs))
end

local function note(b, slot_s, record)  -- a CLAIMS record, kept while IDMP may remember the slot
  local gone = redis.call('ZRANGEBYSCORE', key(b, EXPIRY), '-inf', NOW)
  for _, s in ipairs(gone) do redis.call('HDEL', key(b, CLAIMS), s) end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', key(b, EXPIRY), '-inf', NOW) end
  redis.call('HSET', key(b, CLAIMS), slot_s, cjson.encode(record))
  redis.call('ZADD', key(b, EXPIRY), int(NOW + tonumber(DURATION) * 1000), slot_s)
end

return claim_all(10, function(b, slot_s, task_id, fingerprint, name)
  local slot = tonumber(slot_s)
  local forgot = amnesia(b, slot)  -- first: only the XADD itself can tell "claimed"
  if forgot then return skipped(b, slot_s, task_id, 'forgotten', forgot) end
  -- on the server's clock, as the lease strategy: a slot IDMP may no longer remember, or one so
  -- far ahead that an instance with a fast clock claims what others have not reached
  if NOW - slot >= tonumber(DURATION) * 1000 then
    return skipped(b, slot_s, task_id, 'forgotten', 'the slot is older than the IDMP duration (' ..
      DURATION .. ' s) on the store clock ' .. iso(NOW) .. '; is this host behind?')
  end
  if slot > NOW + TOL then
    return skipped(b, slot_s, task_id, 'early',
      'slot is more than 10 s ahead of the store clock ' .. iso(NOW) .. '; is this host ahead?')
  end
  local stream = key(b, STREAM)
  ensure_stream(b)
  local top = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1]
  local id = redis.call('XADD', stream, 'IDMP', PRODUCER, slot_s, 'MAXLEN', '~', KEEP, '*',
                        'w', INSTANCE, 'f', fingerprint, 't', int(NOW))
  local entry = redis.call('XRANGE', stream, id, id)[1]
  local marked = false  -- the XADD met the id of a run refused as paused: never won
  if entry then
    if top and not id_after(id, top[1]) then return recorded(fields(entry[2])) end
  else
    local c = hget_json(key(b, CLAIMS), slot_s)
    if c and c.w then return recorded(c) end
    if not (c and c.p == id) then
      return skipped(b, slot_s, task_id, 'unknown',
        'the slot was claimed but its entry (and the name of its winner) is gone from the stream')
    end
    marked = true
  end
  local paused = pause_refusal(b, slot_s, task_id, name)
  if paused then
    if not marked then
      redis.call('XDEL', stream, id)
      note(b, slot_s, {p = id})
    end
    return paused
  end
  if marked then note(b, slot_s, {w = INSTANCE, f = fingerprint, t = int(NOW)}) end
  return won(b, slot_s, task_id, fingerprint)
end)
""", extra_keys=("STREAM",))

#: idmp, at start-up: create missing streams with this store's settings; report a live stream with
#: other settings, and change them only when it remembers no run (iids-tracked 0, which already
#: leaves out expired ones): then the wipe XCFGSET does cannot re-open a claim.
#: KEYS: the namespace keys, then per entry, ENTRY_KEYS then STREAM.
#: ARGV[7]: IDMP-DURATION s.  ARGV[8]: IDMP-MAXSIZE.
#: Reply: {now, streams: [{b block, a created|same|changed|kept, d duration, m maxsize,
#: n runs remembered}]}.
IDMP_SETTINGS = lua(_HELPERS + _IDMP_STREAM + r"""
local streams = {}
for b = 1, NBLOCKS do
  memory_start(b)
  local r = {b = int(b), a = 'created'}
  if not ensure_stream(b) then
    local info = xinfo(key(b, STREAM))
    r.d, r.m = int(info['idmp-duration']), int(info['idmp-maxsize'])
    r.n = int(info['iids-tracked'])
    if r.d == DURATION and r.m == MAXSIZE then
      r.a = 'same'
    elseif tonumber(r.n) == 0 then
      redis.call('XCFGSET', key(b, STREAM), 'IDMP-DURATION', DURATION, 'IDMP-MAXSIZE', MAXSIZE)
      r.a = 'changed'
    else
      r.a = 'kept'
    end
  end
  streams[#streams + 1] = r
end
return cjson.encode({now = int(NOW), streams = streams})
""", extra_keys=("STREAM",))
