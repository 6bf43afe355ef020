"""The prelude every claim-side Lua script of the Redis store shares, and the scripts every
strategy runs (memory start, history, settings). The lease strategy's own scripts are in
:mod:`.lease_scripts`, the other strategies' claims in :mod:`.strategy_scripts`, the entry store's
in :mod:`.entry_scripts` (and :mod:`.instances`).

Each script is defined once, with a comment per KEYS and ARGV item, and registered once per
client (redis-py ``Script`` objects: EVALSHA, re-loaded by redis-py after NOSCRIPT).

Conventions shared by every script (the semantics are the store contract's,
:mod:`celery_anarchon.stores.base`):

* **Keys.** A script receives, for each entry it touches, the entry's block of ``len(ENTRY_KEYS)``
  keys in :data:`ENTRY_KEYS` order (a strategy's claim script: followed by its own keys, see
  :func:`lua`); ``key(b, WHAT)`` is key WHAT of block ``b`` (1-based). No key name is ever built
  inside Lua, and every key of a block shares one hash tag.
* **Namespace keys.** ``KEYS[1]`` is the namespace's store-wide hash (:data:`STORE_FIELDS`),
  ``KEYS[2]`` its pauses (hash: entry name -> pause record, written by :mod:`.entries`); the
  entries' blocks follow them.
* **ARGV header.** ``ARGV[1]`` this instance's id, ``ARGV[2]`` the store memory in ms,
  ``ARGV[3]`` history_size, ``ARGV[4]`` the text of this instance's memory settings,
  ``ARGV[5]`` how long a claim made under them stays claimable (ms), ``ARGV[6]`` two words:
  "0", or the ``replica_grace`` in ms when a claim reply must count the replicas (durability
  "auto"), then "1" when ``allow_eviction`` is set, else "0" (e.g. ``"60000 0"``); a script's own
  arguments start at ``ARGV[7]``.
* **Eviction.** Every claim script reads ``maxmemory_policy`` (``INFO memory``): under an
  ``allkeys-*`` policy, unless ``allow_eviction``, the whole batch is refused (forgotten), since an
  evicted claim could be won again (spec point 9: eviction is partial loss; the policy may change
  after ``prepare()``).
* **Epoch.** Every script reads the server's ``run_id`` (``INFO server``) and compares it with
  the one recorded store-wide; a change (restart, failover) restarts the store's memory at that
  moment (spec "Epoch"), so the slots around it are refused, whichever instance asks first.
* **Memory start.** Every script notes the memory start of an entry that has none: the
  store-wide start when the store's memory is intact (an entry the store never saw cannot have
  lost claims), now when the store is new, wiped or changed epoch (docs/design.md "Amnesia").
* **Pause.** Every claim script, for each run not already claimed, reads the entry's pause
  (``pause_refusal``) before any other refusal: a paused run answers ``paused`` with the pause's
  ``paused by <by>: <reason>``, recorded once in its history (fill only).
* **Clock.** Every decision uses the server's ``TIME``, read once per script (docs/design.md "Clocks":
  lateness and leases are judged on the store's clock).
* **Numbers.** Lua numbers are doubles and ``tostring`` keeps only 14 digits, which would round a
  microsecond fencing token: every number written or returned goes through ``int()``
  (``%d``), and stored records hold numbers as decimal strings.
* **Replies.** One JSON object (cjson) of strings; nothing read back is pickled or evaluated.

Records (JSON objects of strings):

* claim ``{w: winner, f: fingerprint, t: claimed at ms}`` in ``claims`` (field = slot);
* pause ``{r: reason, b: by, t: paused at ms}`` in the namespace's pauses (field = entry name);
* history ``{e: event, i: instance, t: ms, k: task id, a: attempt, d: detail, c: the earlier
  attempts' records (the same fields, oldest first; absent when none)}`` in ``history``;
* leased run ``{s: state, a: attempt, k: token, o: owner, w: the instance that sent the current
  attempt, p: the token a takeover replaced, x: lease expiry ms or "", q: queue deadline ms or
  "", r: "1" for the run of a run-now request}`` in ``runs`` (:mod:`.lease_scripts`).
"""
from __future__ import annotations

from celery_anarchon.stores.base import MAX_EARLIER
from celery_anarchon.stores.redis.options import LIVE_REPLICA_LAG_S

#: The fields of the store-wide hash ``<prefix>:{<namespace>}:store`` (``KEYS[1]`` of every script).
STORE_FIELDS = (
    "epoch",          # the server's run_id when the store's memory last (re)started
    "born",           # store ms when the store's memory (re)started: new store, wipe, new epoch
    "previous",       # the epoch before the last change (named in refusals)
    "settings",       # the memory settings in use (text, e.g. "strategy=lease memory=3600s")
    "settings_used",  # store ms of the last claim made under them
    "taken_at",       # store ms of the last takeover answered TAKEN (a write its WAIT covers)
    "written_at",     # store ms of the last entry-store write confirmed (a write its WAIT covers)
    "replicas_at",    # store ms of the last claim batch the master had live replicas to wait for
    "replicas_seen",  # JSON {count: store ms}: when claim batches last had that many replicas online
)

#: What each key of an entry's block holds, in the order scripts receive them.
ENTRY_KEYS = (
    "born",           # string: store ms when the store's memory of this entry began ("Amnesia")
    "fence",          # hash: token = last fencing token, newest = newest slot claimed for a lease
    "claims",         # hash: slot -> claim record
    "claims:expiry",  # zset: slot scored by the ms after which its claim/terminal run is pruned
    "history",        # hash: slot -> history record
    "history:slots",  # zset: slot scored by slot (trimmed to history_size, oldest first)
    "runs",           # hash: slot -> leased run record
    "runs:active",    # zset: slots of queued or started runs, scored by slot
)

_PRELUDE = r"""
local BORN, FENCE, CLAIMS, EXPIRY, HISTORY, HISTORY_SLOTS, RUNS, ACTIVE = 1, 2, 3, 4, 5, 6, 7, 8
local TOL = 10000                                   -- LATENESS_TOLERANCE_MS
local INSTANCE = ARGV[1]                            -- this instance's id
local MEMORY_MS = tonumber(ARGV[2])                 -- store memory, ms
local HISTORY_SIZE = tonumber(ARGV[3])              -- runs of history kept per entry
local SETTINGS = ARGV[4]                            -- this instance's memory settings (text)
local HORIZON_MS = tonumber(ARGV[5])                -- how long a claim made under them counts, ms
local REPLICA_GRACE_MS = tonumber(string.match(ARGV[6], '^(%d+)')) or 0  -- "auto": replica_grace ms
local ALLOW_EVICTION = string.match(ARGV[6], ' (%d)$') == '1'  -- allow_eviction set
local COUNT_REPLICAS = REPLICA_GRACE_MS > 0         -- claim replies say how many replicas to wait for
local STORE = KEYS[1]                               -- the namespace's store-wide hash
local PAUSES = KEYS[2]                              -- the namespace's pauses: name -> pause record
local HEAD = 2                                      -- namespace keys before the entries' blocks
local NBLOCKS = (#KEYS - HEAD) / BLOCK
local clock = redis.call('TIME')
local NOW = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)  -- store ms
local NOW_US = tonumber(clock[1]) * 1000000 + tonumber(clock[2])              -- store us

local function key(b, what) return KEYS[HEAD + (b - 1) * BLOCK + what] end
local function int(n) return string.format('%d', n) end
local function num(s) if not s or s == '' then return nil end return tonumber(s) end

local function iso(ms)  -- UTC ISO 8601 (days-from-civil inverse; Lua here has no os.date)
  local secs = math.floor(ms / 1000)
  local days = math.floor(secs / 86400)
  local rem = secs - days * 86400
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
                          - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400 + (m <= 2 and 1 or 0)
  return string.format('%04d-%02d-%02dT%02d:%02d:%02d.%03dZ', y, m, d, math.floor(rem / 3600),
                       math.floor(rem % 3600 / 60), rem % 60, ms % 1000)
end

-- The epoch: the server's identity (INFO server run_id: new on every restart, different on a
-- promoted replica), kept in the store-wide hash with the store-wide memory start. Read in every
-- script, so every instance's first operation after a restart or a failover sees the change and
-- restarts the memory at that moment: what the lost writes may have held is refused (forgotten).
local RUN_ID = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
local STORE_BORN, PREVIOUS_EPOCH
do
  local note = redis.call('HMGET', STORE, 'epoch', 'born', 'previous')
  if not note[1] then  -- a new store, or one that lost everything (no store-wide note)
    redis.call('HSET', STORE, 'epoch', RUN_ID, 'born', int(NOW))
    STORE_BORN = NOW
  elseif note[1] ~= RUN_ID then  -- restarted (maybe from an old snapshot) or failed over
    redis.call('HSET', STORE, 'epoch', RUN_ID, 'born', int(NOW), 'previous', note[1])
    STORE_BORN, PREVIOUS_EPOCH = NOW, note[1]
  else
    STORE_BORN, PREVIOUS_EPOCH = num(note[2]) or NOW, note[3] or nil
  end
end

-- when the store's memory of entry b began: the later of its own note and the store-wide one.
-- An entry without a note gets the store-wide start (the store cannot have lost claims of it);
-- a new, wiped or changed store's start is now.
local function memory_start(b)
  local born = num(redis.call('GET', key(b, BORN)))
  if not born then
    born = STORE_BORN
    redis.call('SET', key(b, BORN), int(born))
  end
  return math.max(born, STORE_BORN)
end

-- why slot cannot be claimed because the store's memory of entry b began after it ("Amnesia"),
-- or nil; notes the memory start if it is missing
local function amnesia(b, slot)
  local born = memory_start(b)
  if slot < born + TOL then
    if born == STORE_BORN and PREVIOUS_EPOCH then
      return "the store's memory began again at " .. iso(born) .. ': the server epoch changed ' ..
        'from ' .. PREVIOUS_EPOCH .. ' to ' .. RUN_ID .. ' (a restart or a failover: the newest ' ..
        'writes may be lost); runs before ' .. iso(born + TOL) .. ' are refused'
    end
    return "the store's memory of this entry began at " .. iso(born) ..
      ' (new store, or it lost its data); runs before ' .. iso(born + TOL) .. ' are refused'
  end
  return nil
end

-- why every claim is refused because the server may evict the store's keys (an allkeys-*
-- maxmemory-policy: an evicted claim could be won again), or nil. Read in every claim, not only
-- at prepare(): CONFIG SET can change the policy of a running server (spec point 9).
local function eviction_refusal()
  if ALLOW_EVICTION then return nil end
  local policy = string.match(redis.call('INFO', 'memory'), 'maxmemory_policy:([%w%-]+)')
  if policy and string.sub(policy, 1, 8) == 'allkeys-' then
    return "the server's maxmemory-policy is " .. policy .. ', which may evict the store\'s ' ..
      'keys (an evicted claim could be won again): every claim is refused, a possible miss. ' ..
      'Set maxmemory-policy to noeviction or a volatile-* policy (the store\'s keys carry no ' ..
      "TTL), or set anarchon_store_options['allow_eviction'] = True to accept that risk"
  end
  return nil
end

-- Claim scripts only: why every claim of the batch is refused, or nil: the server may evict the
-- store's keys (eviction_refusal), or the store records other memory settings than this
-- instance's, still in use; else nil, after recording ours with their last use. That write also
-- makes a WAIT after the script cover every earlier write of the master, including a claim this
-- instance reads back as its own (a won-again answer on a new connection).
local function settings_refusal()
  local evicting = eviction_refusal()
  if evicting then return evicting end
  local rec = redis.call('HMGET', STORE, 'settings', 'settings_used')
  if rec[1] and rec[1] ~= SETTINGS and NOW - (num(rec[2]) or 0) <= HORIZON_MS + 2 * TOL then
    return 'the store records the memory settings "' .. rec[1] .. '" (last used at ' ..
      iso(num(rec[2]) or 0) .. '), not this instance\'s "' .. SETTINGS .. '": a possible miss; ' ..
      'use the same value on every instance'
  end
  redis.call('HSET', STORE, 'settings', SETTINGS, 'settings_used', int(NOW))
  return nil
end

-- The replicas online now: connected and acknowledged within LIVE_LAG_S (INFO replication lag,
-- in seconds; one that is down or stalled stops counting). The one count of live replicas: the
-- claims' confirmation below and the store's start-up plan (SETTINGS_READ) use it. Second: the
-- replicas connected and synced whatever their lag (a WAIT can only be acknowledged by those).
local function online_replicas()
  local n, connected = 0, 0
  for lag in string.gmatch(redis.call('INFO', 'replication'), 'state=online,offset=%d+,lag=(%d+)') do
    connected = connected + 1
    if tonumber(lag) <= LIVE_LAG_S then n = n + 1 end
  end
  return n, connected
end

-- The replicas a claim (or takeover) batch must be confirmed on, with durability 'auto': every
-- replica online now and, within REPLICA_GRACE_MS of the last batch that had a
-- larger group online, a majority of that group: floor((1 + seen) / 2), at least 1. The count
-- online is recorded store-wide with the time (replicas_seen; replicas_at: the last batch with
-- any). This may be an old master cut off by a failover that still takes writes (a split brain)
-- or one side of a split where each side keeps some replicas: without a majority of the group,
-- its wins could be lost or won again on the other side, so they stay unconfirmed until the grace
-- has passed; then it goes on with the replicas online.
-- Returns: replicas to wait for, online now, and when a majority is required beyond those
-- online, the recorded group's size and the time it was last seen (else nil, nil); then the
-- replicas connected (:func:`online_replicas`).
local function live_replicas()
  if not COUNT_REPLICAS then return 0, 0, nil, nil, 0 end
  local n, connected = online_replicas()
  local seen = cjson.decode(redis.call('HGET', STORE, 'replicas_seen') or '{}')
  if n > 0 then
    seen[int(n)] = int(NOW)
    redis.call('HSET', STORE, 'replicas_at', int(NOW), 'replicas_seen', cjson.encode(seen))
  end
  local group, group_at = 0, nil
  for count, at in pairs(seen) do
    local c, t = tonumber(count), tonumber(at)
    if c and t and NOW - t <= REPLICA_GRACE_MS and c > group then group, group_at = c, t end
  end
  local need = math.max(1, math.floor((1 + group) / 2))
  if group > 0 and need > n then return need, n, group, group_at, connected end
  return n, n, nil, nil, connected
end

-- the confirmation fields of a claim or takeover reply: replicas (to wait for), online,
-- connected (fewer than to wait for: a WAIT could only time out), and when a majority of a
-- recent group is required: seen (its size) and held (when it was last online)
local function with_replicas(reply)
  local need, online, group, group_at, connected = live_replicas()
  reply.replicas, reply.online, reply.connected = int(need), int(online), int(connected)
  if group then reply.seen, reply.held = int(group), int(group_at) end
  return cjson.encode(reply)
end

-- a claim script's reply
local function claim_reply(results)
  return with_replicas({now = int(NOW), results = results})
end

-- the JSON record in field of hash k, decoded, or nil
local function hget_json(k, field)
  local raw = redis.call('HGET', k, field)
  if raw then return cjson.decode(raw) end
  return nil
end

local function history_get(b, slot_s) return hget_json(key(b, HISTORY), slot_s) end

-- write a run's history record (fill_only: only if it has none), keep the newest HISTORY_SIZE
-- a beat's notes of its publish (SEND_NOTES), written at the end of its tick, never replace a
-- later attempt's record nor what came after the send of their own attempt (AFTER_SEND).
-- A record replaced keeps the earlier attempts' records (c, oldest first, at most MAX_EARLIER):
-- a takeover keeps the dead attempt's last record, and whatever replaces a taken_over record
-- keeps it (base.keeps_earlier)
local SEND_NOTES = {sent = true, send_failed = true, send_unknown = true}
local AFTER_SEND = {started = true, finished = true, given_up = true, superseded = true}
local function history_put(b, slot_s, event, task_id, attempt, detail, fill_only)
  if fill_only and redis.call('HEXISTS', key(b, HISTORY), slot_s) == 1 then return end
  local old = history_get(b, slot_s)
  if SEND_NOTES[event] then
    if old and (tonumber(old.a) > tonumber(attempt)
                or (tonumber(old.a) == tonumber(attempt) and AFTER_SEND[old.e])) then return end
  end
  local rec = {e = event, i = INSTANCE, t = int(NOW), k = task_id, a = int(attempt), d = detail}
  if old then
    local chain = (type(old.c) == 'table' and #old.c > 0) and old.c or nil
    if old.e == 'taken_over' or event == 'taken_over' then
      chain = chain or {}
      chain[#chain + 1] = {e = old.e, i = old.i, t = old.t, k = old.k, a = old.a, d = old.d}
      while #chain > MAX_EARLIER do table.remove(chain, 1) end
    end
    rec.c = chain
  end
  redis.call('HSET', key(b, HISTORY), slot_s, cjson.encode(rec))
  redis.call('ZADD', key(b, HISTORY_SLOTS), slot_s, slot_s)
  local excess = redis.call('ZCARD', key(b, HISTORY_SLOTS)) - HISTORY_SIZE
  if excess > 0 then
    for _, old in ipairs(redis.call('ZRANGE', key(b, HISTORY_SLOTS), 0, excess - 1)) do
      redis.call('HDEL', key(b, HISTORY), old)
    end
    redis.call('ZREMRANGEBYRANK', key(b, HISTORY_SLOTS), 0, excess - 1)
  end
end

-- the pause of the entry called name as Pause.describe() words it ('paused by <by>: <reason>'),
-- or nil when it runs; read once per entry and script (nothing when no entry is paused); a record
-- that cannot be read is a pause too (decoding it failed the whole batch of claims)
local pauses_read, any_paused = {}, nil
local function pause_of(name)
  if any_paused == nil then any_paused = redis.call('EXISTS', PAUSES) == 1 end
  if not any_paused then return nil end
  local why = pauses_read[name]
  if why == nil then
    local raw = redis.call('HGET', PAUSES, name)
    local ok, p = pcall(cjson.decode, raw or 'null')
    if not raw then
      why = false
    elseif ok and type(p) == 'table' and type(p.b) == 'string' and type(p.r) == 'string' then
      why = 'paused by ' .. p.b .. ((p.r ~= '' and (': ' .. p.r)) or '')
    else  -- a record a hand edit or another program wrote: still a pause, for every claim
      why = "paused: the store's pause record is not readable"
    end
    pauses_read[name] = why
  end
  return why or nil
end

-- the reply for a run of entry name (block b) when the entry is paused, recorded once in its
-- history (fill only, as every skip); nil when it runs. Checked after "already claimed", before
-- every other refusal (the entries part: a pause written before the claim always holds).
local function pause_refusal(b, slot_s, task_id, name)
  local why = pause_of(name)
  if not why then return nil end
  history_put(b, slot_s, 'paused', task_id, 1, why, true)
  return {o = 'paused', d = why}
end

"""


def lua(body: str, extra_keys: tuple[str, ...] = ()) -> str:
    """A script: the prelude, then ``body``. ``extra_keys`` names the Lua constants of the keys a
    strategy adds after :data:`ENTRY_KEYS` in every block (``("STREAM",)``: ``key(b, STREAM)``)."""
    header = f"local BLOCK = {len(ENTRY_KEYS) + len(extra_keys)}\n"
    header += "".join(f"local {name} = {len(ENTRY_KEYS) + i}\n"
                      for i, name in enumerate(extra_keys, 1))
    header += f"local LIVE_LAG_S = {LIVE_REPLICA_LAG_S}\n"  # a replica's lag that still counts, s
    header += f"local MAX_EARLIER = {MAX_EARLIER}\n"  # earlier records a history record keeps
    return header + _PRELUDE + body


#: Note (or move back, for tests) when the store's memory of each entry (and of the store) began.
#: KEYS: the namespace keys, then one ENTRY_KEYS block per entry.
#: ARGV[1..6]: header.  ARGV[7]: ms to move the memory start back ("0": only note missing ones).
#: Reply: {now}.
MEMORY_START = lua(r"""
local by = tonumber(ARGV[7])
for b = 1, NBLOCKS do
  local born = memory_start(b)
  if by > 0 then redis.call('SET', key(b, BORN), int(born - by)) end
end
if by > 0 then redis.call('HSET', STORE, 'born', int(STORE_BORN - by)) end
return cjson.encode({now = int(NOW)})
""")

#: Write one event into a run's history.
#: KEYS: the namespace keys, then the entry's ENTRY_KEYS block.
#: ARGV[1..6]: header.  ARGV[7]: slot (ms).  ARGV[8]: event (RunEvent value).  ARGV[9]: task id.
#: ARGV[10]: attempt.  ARGV[11]: detail.  ARGV[12]: "1" fill only (skip events) / "0" replace.
#: Reply: {now}.
RECORD = lua(r"""
memory_start(1)
history_put(1, ARGV[7], ARGV[8], ARGV[9], tonumber(ARGV[10]), ARGV[11], ARGV[12] == '1')
return cjson.encode({now = int(NOW)})
""")

#: Read an entry's newest runs.
#: KEYS: the namespace keys, then the entry's ENTRY_KEYS block.
#: ARGV[1..6]: header.  ARGV[7]: how many runs at most.
#: Reply: {now, records: [{s slot, r history record}]}, newest first.
HISTORY_READ = lua(r"""
memory_start(1)
local records = {}
for _, s in ipairs(redis.call('ZREVRANGE', key(1, HISTORY_SLOTS), 0, tonumber(ARGV[7]) - 1)) do
  local rec = history_get(1, s)
  if rec then records[#records + 1] = {s = s, r = rec} end
end
return cjson.encode({now = int(NOW), records = records})
""")

#: Read the memory settings recorded store-wide (prepare: refuse an instance with others) and the
#: replicas online now (the store's plan of the claims' confirmation).
#: KEYS: the namespace keys.  ARGV[1..6]: header.
#: Reply: {now, settings ("" if none), used (ms of their last claim, "" if none), online}.
SETTINGS_READ = lua(r"""
local rec = redis.call('HMGET', STORE, 'settings', 'settings_used')
return cjson.encode({now = int(NOW), settings = rec[1] or '', used = rec[2] or '',
                     online = int(online_replicas())})
""")

#: After an entry-store write (:mod:`.entries`), in the same round trip: the replicas its
#: confirmation waits for, by the claims' rule (``with_replicas``), and a write of its own, so that
#: a WAIT sent after it on any connection covers every earlier write of the master (the entry
#: write among them).
#: KEYS: the namespace keys (on a Cluster: the head of the written slot).  ARGV[1..6]: header.
#: Reply: {now, replicas, online, seen?, held?}.
CONFIRM_WRITE = lua(r"""
redis.call('HSET', STORE, 'written_at', int(NOW))
return with_replicas({now = int(NOW)})
""")

#: The scripts every strategy registers, by name.
SHARED = {"settings": SETTINGS_READ, "memory_start": MEMORY_START, "record": RECORD,
          "history": HISTORY_READ, "confirm_write": CONFIRM_WRITE}
