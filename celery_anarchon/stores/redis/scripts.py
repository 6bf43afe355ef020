"""Lua scripts of the Redis ``lease`` store (:mod:`celery_anarchon.stores.redis`), and the prelude
the other strategies' scripts share (:mod:`celery_anarchon.stores.redis.strategies`).

Each script is defined once here, with a comment per KEYS and ARGV item, and registered once per
client (redis-py ``Script`` objects: EVALSHA, re-loaded by redis-py after NOSCRIPT).

Conventions shared by every script (the semantics are in ``store-semantics.md``):

* **Keys.** A script receives, for each entry it touches, the entry's block of ``len(ENTRY_KEYS)``
  keys in :data:`ENTRY_KEYS` order (a strategy's claim script: followed by its own keys, see
  :func:`lua`); ``key(b, WHAT)`` is key WHAT of block ``b`` (1-based). No key name is ever built
  inside Lua, and every key of a block shares one hash tag.
* **Store key.** ``KEYS[1]`` is the namespace's store-wide hash (:data:`STORE_FIELDS`); the
  entries' blocks follow it.
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
  lost claims), now when the store is new, wiped or changed epoch (DESIGN.md "Amnesia").
* **Clock.** Every decision uses the server's ``TIME``, read once per script (DESIGN.md "Clocks":
  lateness and leases are judged on the store's clock).
* **Numbers.** Lua numbers are doubles and ``tostring`` keeps only 14 digits, which would round a
  microsecond fencing token: every number written or returned goes through ``int()``
  (``%d``), and stored records hold numbers as decimal strings.
* **Replies.** One JSON object (cjson) of strings; nothing read back is pickled or evaluated.

Records (JSON objects of strings):

* claim ``{w: winner, f: fingerprint, t: claimed at ms}`` in ``claims`` (field = slot);
* history ``{e: event, i: instance, t: ms, k: task id, a: attempt, d: detail}`` in ``history``;
* leased run ``{s: state, a: attempt, k: token, o: owner, w: the instance that sent the current
  attempt, p: the token a takeover replaced, x: lease expiry ms or "", q: queue deadline ms or
  ""}`` in ``runs``.
"""
from __future__ import annotations

#: The fields of the store-wide hash ``<prefix>:{<namespace>}:store`` (``KEYS[1]`` of every script).
STORE_FIELDS = (
    "epoch",          # the server's run_id when the store's memory last (re)started
    "born",           # store ms when the store's memory (re)started: new store, wipe, new epoch
    "previous",       # the epoch before the last change (named in refusals)
    "settings",       # the memory settings in use (text, e.g. "strategy=lease memory=3600s")
    "settings_used",  # store ms of the last claim made under them
    "taken_at",       # store ms of the last takeover answered TAKEN (a write its WAIT covers)
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
local NBLOCKS = (#KEYS - 1) / BLOCK
local clock = redis.call('TIME')
local NOW = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)  -- store ms
local NOW_US = tonumber(clock[1]) * 1000000 + tonumber(clock[2])              -- store us

local function key(b, what) return KEYS[1 + (b - 1) * BLOCK + what] end
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

-- The replicas a claim (or takeover) batch must be confirmed on, with durability 'auto': every
-- replica online now (acknowledged within the last 3 s, INFO replication lag in seconds; one that
-- is down or stalled stops counting) and, within REPLICA_GRACE_MS of the last batch that had a
-- larger group online, a majority of that group: floor((1 + seen) / 2), at least 1. The count
-- online is recorded store-wide with the time (replicas_seen; replicas_at: the last batch with
-- any). This may be an old master cut off by a failover that still takes writes (a split brain)
-- or one side of a split where each side keeps some replicas: without a majority of the group,
-- its wins could be lost or won again on the other side, so they stay unconfirmed until the grace
-- has passed; then it goes on with the replicas online.
-- Returns: replicas to wait for, online now, and when a majority is required beyond those
-- online, the recorded group's size and the time it was last seen (else nil, nil).
local function live_replicas()
  if not COUNT_REPLICAS then return 0, 0, nil, nil end
  local n = 0
  for lag in string.gmatch(redis.call('INFO', 'replication'), 'state=online,offset=%d+,lag=(%d+)') do
    if tonumber(lag) <= 3 then n = n + 1 end
  end
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
  if group > 0 and need > n then return need, n, group, group_at end
  return n, n, nil, nil
end

-- the confirmation fields of a claim or takeover reply: replicas (to wait for), online, and when
-- a majority of a recent group is required: seen (its size) and held (when it was last online)
local function with_replicas(reply)
  local need, online, group, group_at = live_replicas()
  reply.replicas, reply.online = int(need), int(online)
  if group then reply.seen, reply.held = int(group), int(group_at) end
  return cjson.encode(reply)
end

-- a claim script's reply
local function claim_reply(results)
  return with_replicas({now = int(NOW), results = results})
end

-- max(last + 1, store clock in us): tokens keep growing even after the store forgot
local function next_token(b)
  local last = num(redis.call('HGET', key(b, FENCE), 'token')) or 0
  local token = math.max(last + 1, NOW_US)
  redis.call('HSET', key(b, FENCE), 'token', int(token))
  return token
end

-- keep slot's claim and terminal run until at least until_ms (pruning is by age only)
local function keep_until(b, slot_s, until_ms)
  local cur = redis.call('ZSCORE', key(b, EXPIRY), slot_s)
  if not cur or tonumber(cur) < until_ms then
    redis.call('ZADD', key(b, EXPIRY), int(until_ms), slot_s)
  end
end

local function history_get(b, slot_s)
  local raw = redis.call('HGET', key(b, HISTORY), slot_s)
  if raw then return cjson.decode(raw) end
  return nil
end

-- write a run's history record (fill_only: only if it has none), keep the newest HISTORY_SIZE
local function history_put(b, slot_s, event, task_id, attempt, detail, fill_only)
  if fill_only and redis.call('HEXISTS', key(b, HISTORY), slot_s) == 1 then return end
  redis.call('HSET', key(b, HISTORY), slot_s, cjson.encode({e = event, i = INSTANCE,
    t = int(NOW), k = task_id, a = int(attempt), d = detail}))
  redis.call('ZADD', key(b, HISTORY_SLOTS), slot_s, slot_s)
  local excess = redis.call('ZCARD', key(b, HISTORY_SLOTS)) - HISTORY_SIZE
  if excess > 0 then
    for _, old in ipairs(redis.call('ZRANGE', key(b, HISTORY_SLOTS), 0, excess - 1)) do
      redis.call('HDEL', key(b, HISTORY), old)
    end
    redis.call('ZREMRANGEBYRANK', key(b, HISTORY_SLOTS), 0, excess - 1)
  end
end

-- a lease event replaces the record, keeping its task id; the attempt is the run's
local function history_event(b, slot_s, event, run, detail)
  local old = history_get(b, slot_s)
  history_put(b, slot_s, event, old and old.k or '', tonumber(run.a), detail or '', false)
end

local function run_get(b, slot_s)
  local raw = redis.call('HGET', key(b, RUNS), slot_s)
  if raw then return cjson.decode(raw) end
  return nil
end

local function run_put(b, slot_s, run)
  redis.call('HSET', key(b, RUNS), slot_s, cjson.encode(run))
  if run.s == 'queued' or run.s == 'started' then
    redis.call('ZADD', key(b, ACTIVE), slot_s, slot_s)
  else  -- terminal: may be pruned after the memory
    redis.call('ZREM', key(b, ACTIVE), slot_s)
    keep_until(b, slot_s, NOW + MEMORY_MS)
  end
end

local function alive(run)
  if run.s == 'queued' then return (num(run.q) or 0) >= NOW end
  if run.s == 'started' then return (num(run.x) or 0) >= NOW end
  return false
end

local function expired(run)
  return (run.s == 'queued' or run.s == 'started') and not alive(run)
end
"""


def lua(body: str, extra_keys: tuple[str, ...] = ()) -> str:
    """A script: the prelude, then ``body``. ``extra_keys`` names the Lua constants of the keys a
    strategy adds after :data:`ENTRY_KEYS` in every block (``("STREAM",)``: ``key(b, STREAM)``)."""
    header = f"local BLOCK = {len(ENTRY_KEYS) + len(extra_keys)}\n"
    header += "".join(f"local {name} = {len(ENTRY_KEYS) + i}\n"
                      for i, name in enumerate(extra_keys, 1))
    return header + _PRELUDE + body


#: Claim a batch of runs: all runs of a tick in one EVALSHA.
#: KEYS: the store key, then one ENTRY_KEYS block per distinct entry of the batch.
#: ARGV[1..6]: header (instance id, memory ms, history_size, settings, horizon ms, replica grace and
#:   allow_eviction).
#: ARGV[7..]: 8 items per request, in request order:
#:   +0 entry block number (1-based), +1 slot (UTC ms, decimal), +2 max_late ms,
#:   +3 task id (history), +4 claimant's fingerprint, +5 "1" leased / "0",
#:   +6 queue_timeout ms (leased), +7 "1" overlap allowed / "0" skip (leased).
#: Reply: {now, results: [{o outcome, w winner, f fingerprint, k token, a attempt, d detail}],
#: replicas: replicas to wait for (when counted), online: replicas online now, seen and held: when
#: more are required than are online, the size of the recent group whose majority is required
#: and when it was last online (within replica_grace)}.
CLAIM = lua(r"""
local function prune(b)  -- claims (and terminal runs) past their age; never by count
  local gone = redis.call('ZRANGEBYSCORE', key(b, EXPIRY), '-inf', NOW)
  for _, s in ipairs(gone) do
    redis.call('HDEL', key(b, CLAIMS), s)
    if not redis.call('ZSCORE', key(b, ACTIVE), s) then redis.call('HDEL', key(b, RUNS), s) end
  end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', key(b, EXPIRY), '-inf', NOW) end
end

local function refusal(b, slot_s, slot, max_late, leased, overlap)
  local forgot = amnesia(b, slot)
  if forgot then return 'forgotten', forgot end
  if NOW - slot >= MEMORY_MS then
    return 'forgotten', 'the slot is older than the store memory (' .. int(MEMORY_MS) .. ' ms)'
  end
  if NOW > slot + max_late + TOL then
    return 'late', 'store clock ' .. iso(NOW) .. ' is past slot + max_late + 10 s'
  end
  if slot > NOW + TOL then
    return 'early', 'slot is more than 10 s ahead of the store clock ' .. iso(NOW)
  end
  if not leased then return nil end
  local newest = num(redis.call('HGET', key(b, FENCE), 'newest'))
  if newest and newest > slot then
    return 'superseded', 'a newer slot (' .. iso(newest) .. ') was already claimed'
  end
  local live, dead = nil, {}
  for _, s in ipairs(redis.call('ZRANGEBYSCORE', key(b, ACTIVE), '-inf', '(' .. slot_s)) do
    local run = run_get(b, s)
    if run and alive(run) then live = live or s elseif run then dead[#dead + 1] = {s, run} end
  end
  if live and not overlap then
    return 'overlapping', 'the run of ' .. iso(tonumber(live)) .. ' is still alive'
  end
  for _, pair in ipairs(dead) do
    pair[2].s = 'superseded'
    run_put(b, pair[1], pair[2])
    history_event(b, pair[1], 'superseded', pair[2], 'the run of ' .. iso(slot) .. ' superseded it')
  end
  return nil
end

local function claim_one(b, slot_s, max_late, task_id, fingerprint, leased, queue_timeout, overlap)
  local slot = tonumber(slot_s)
  local raw = redis.call('HGET', key(b, CLAIMS), slot_s)
  if raw then  -- already claimed: checked before anything else ("Who won")
    local c = cjson.decode(raw)
    if c.w ~= INSTANCE then return {o = 'other_won', w = c.w, f = c.f} end
    local run = leased and run_get(b, slot_s)
    if run and tonumber(run.a) > 1 then  -- a claim is for attempt 1: never WON with another's
      return {o = 'other_won', w = run.w or run.o, f = c.f,
              d = 'taken over as attempt ' .. run.a .. ' by ' .. (run.w or run.o)}
    end
    if run then return {o = 'won', w = c.w, f = c.f, k = run.k, a = run.a} end
    return {o = 'won', w = c.w, f = c.f}
  end
  local skip, detail = refusal(b, slot_s, slot, max_late, leased, overlap)
  if skip then
    history_put(b, slot_s, skip, task_id, 1, detail, true)
    return {o = skip, d = detail}
  end
  redis.call('HSET', key(b, CLAIMS), slot_s, cjson.encode({w = INSTANCE, f = fingerprint, t = int(NOW)}))
  keep_until(b, slot_s, math.max(NOW, slot) + MEMORY_MS)
  history_put(b, slot_s, 'claimed', task_id, 1, '', false)
  if not leased then return {o = 'won', w = INSTANCE, f = fingerprint} end
  local newest = num(redis.call('HGET', key(b, FENCE), 'newest'))
  if not newest or slot > newest then redis.call('HSET', key(b, FENCE), 'newest', slot_s) end
  local run = {s = 'queued', a = '1', k = int(next_token(b)), o = INSTANCE, w = INSTANCE, x = '',
               q = int(NOW + queue_timeout)}
  run_put(b, slot_s, run)
  return {o = 'won', w = INSTANCE, f = fingerprint, k = run.k, a = run.a}
end

for b = 1, NBLOCKS do prune(b) end
local refused = settings_refusal()
local results = {}
for i = 7, #ARGV, 8 do
  local b, slot_s, task_id = tonumber(ARGV[i]), ARGV[i + 1], ARGV[i + 3]
  if refused then
    history_put(b, slot_s, 'forgotten', task_id, 1, refused, true)
    results[#results + 1] = {o = 'forgotten', d = refused}
  else
    results[#results + 1] = claim_one(b, slot_s, tonumber(ARGV[i + 2]), task_id, ARGV[i + 4],
      ARGV[i + 5] == '1', tonumber(ARGV[i + 6]), ARGV[i + 7] == '1')
  end
end
return claim_reply(results)
""")

#: Note (or move back, for tests) when the store's memory of each entry (and of the store) began.
#: KEYS: the store key, then one ENTRY_KEYS block per entry.
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
#: KEYS: the store key, then the entry's ENTRY_KEYS block.
#: ARGV[1..6]: header.  ARGV[7]: slot (ms).  ARGV[8]: event (RunEvent value).  ARGV[9]: task id.
#: ARGV[10]: attempt.  ARGV[11]: detail.  ARGV[12]: "1" fill only (skip events) / "0" replace.
#: Reply: {now}.
RECORD = lua(r"""
memory_start(1)
history_put(1, ARGV[7], ARGV[8], ARGV[9], tonumber(ARGV[10]), ARGV[11], ARGV[12] == '1')
return cjson.encode({now = int(NOW)})
""")

#: Read an entry's newest runs.
#: KEYS: the store key, then the entry's ENTRY_KEYS block.
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

#: Read one leased run.
#: KEYS: the store key, then the entry's ENTRY_KEYS block.  ARGV[1..6]: header.  ARGV[7]: slot (ms).
#: Reply: {now, run?}.
INSPECT = lua(r"""
memory_start(1)
return cjson.encode({now = int(NOW), run = run_get(1, ARGV[7])})
""")

#: Leased runs started with an expired lease or queued past their deadline.
#: KEYS: the store key, then one ENTRY_KEYS block per entry.  ARGV[1..6]: header.
#: Reply: {now, runs: [{b entry block, s slot, r run}]}.
EXPIRED_RUNS = lua(r"""
local found = {}
for b = 1, NBLOCKS do
  memory_start(b)
  for _, s in ipairs(redis.call('ZRANGE', key(b, ACTIVE), 0, -1)) do
    local run = run_get(b, s)
    if run and expired(run) then found[#found + 1] = {b = int(b), s = s, r = run} end
  end
end
return cjson.encode({now = int(NOW), runs = found})
""")

#: Take over an expired run: one compare-and-set on the expected token. The new record keeps the
#: token it replaced (p), so this instance's retry of a takeover whose reply was lost is TAKEN
#: again with the same record, not REFUSED. A run whose slot is older than the entry's memory
#: start + 10 s (an epoch change or amnesia since it was claimed: the store may have lost writes
#: to its record, such as its release) is never taken over: it becomes lost, and its history says
#: why (DESIGN.md "Leases": a possible miss, never a second run of the body).
#: KEYS: the store key, then the entry's ENTRY_KEYS block.
#: ARGV[1..6]: header.  ARGV[7]: slot (ms).  ARGV[8]: expected token.
#: ARGV[9]: queue_timeout ms for the new attempt.  ARGV[10]: max_attempts.
#: Reply: {now, outcome (TakeoverOutcome value), run?, replicas (to wait for, when counted), online,
#: seen?, held?} (as the claim reply).
TAKE_OVER = lua(r"""
memory_start(1)
local slot_s = ARGV[7]
local run = run_get(1, slot_s)
local function reply(outcome)
  if outcome == 'taken' then  -- a write of this call, so that its WAIT covers the takeover
    redis.call('HSET', STORE, 'taken_at', int(NOW))
  end
  return with_replicas({now = int(NOW), outcome = outcome, run = run})
end
if run and run.p and tonumber(run.p) == tonumber(ARGV[8]) and run.s == 'queued'
    and run.o == INSTANCE then
  return reply('taken')  -- this instance's own takeover, whose reply was lost: the same record
end
if not run or tonumber(run.k) ~= tonumber(ARGV[8]) or not expired(run) then return reply('refused') end
local forgot = amnesia(1, tonumber(slot_s))
if forgot then  -- the store may have lost writes to this record (its release, its adoption)
  local why = 'not taken over: its lease record may be stale after the store lost writes'
  if run.s == 'queued' then
    why = 'not taken over: it was queued before the store lost writes, so its adoption may be ' ..
      'lost and its first message may still be in the broker'
  end
  run.s = 'given_up'
  run_put(1, slot_s, run)
  history_event(1, slot_s, 'given_up', run, why .. ' (a possible miss; ' .. forgot .. ')')
  return reply('given_up')
end
local newest = num(redis.call('HGET', key(1, FENCE), 'newest'))
if newest and newest > tonumber(slot_s) then
  run.s = 'superseded'
  run_put(1, slot_s, run)
  history_event(1, slot_s, 'superseded', run, 'a newer slot (' .. iso(newest) .. ') was claimed')
  return reply('superseded')
end
if tonumber(run.a) >= tonumber(ARGV[10]) then
  run.s = 'given_up'
  run_put(1, slot_s, run)
  history_event(1, slot_s, 'given_up', run, 'given up after ' .. run.a .. ' attempts')
  return reply('given_up')
end
run = {s = 'queued', a = int(tonumber(run.a) + 1), k = int(next_token(1)), o = INSTANCE,
       w = INSTANCE, p = run.k, x = '', q = int(NOW + tonumber(ARGV[9]))}
run_put(1, slot_s, run)
history_event(1, slot_s, 'taken_over', run, '')
return reply('taken')
""")

#: Worker side: adopt a queued run (or one started with an expired lease) before the body runs.
#: KEYS: the store key, then the entry's ENTRY_KEYS block.
#: ARGV[1..6]: header.  ARGV[7]: slot (ms).  ARGV[8]: owner (this execution).
#: ARGV[9]: lease duration ms.
#: Reply: {now, adopted "1"/"0", run?}.
ADOPT = lua(r"""
memory_start(1)
local slot_s = ARGV[7]
local run = run_get(1, slot_s)
local adopted = '0'
if run and (run.s == 'queued' or (run.s == 'started' and expired(run))) then
  run = {s = 'started', a = run.a, k = int(next_token(1)), o = ARGV[8], w = run.w, p = run.p,
         x = int(NOW + tonumber(ARGV[9])), q = ''}
  run_put(1, slot_s, run)
  history_event(1, slot_s, 'started', run, '')
  adopted = '1'
end
return cjson.encode({now = int(NOW), adopted = adopted, run = run})
""")

#: Heartbeat: extend the lease held with a token. A missing record is re-created only when the
#: store forgot it (the slot is older than the entry's memory start + 10 s: amnesia, new epoch);
#: missing while the memory is intact, it was pruned after it finished: the lease is lost.
#: KEYS: the store key, then the entry's ENTRY_KEYS block.
#: ARGV[1..6]: header.  ARGV[7]: slot (ms).  ARGV[8]: token.  ARGV[9]: owner.
#: ARGV[10]: lease duration ms.
#: Reply: {now, run?} (no run: the token is stale, the runner lost the lease).
RENEW = lua(r"""
memory_start(1)
local slot_s, token = ARGV[7], tonumber(ARGV[8])
local run = run_get(1, slot_s)
if not run and tonumber(slot_s) >= memory_start(1) + TOL then
  run = nil  -- the store remembers this run's time: its record was pruned after it finished
elseif not run then  -- amnesia: the live runner keeps its run, and the fence covers its token
  run = {s = 'started', a = '1', k = ARGV[8], o = ARGV[9], x = int(NOW + tonumber(ARGV[10])), q = ''}
  run_put(1, slot_s, run)
  local last = num(redis.call('HGET', key(1, FENCE), 'token')) or 0
  if last < token then redis.call('HSET', key(1, FENCE), 'token', ARGV[8]) end
elseif tonumber(run.k) == token and run.s == 'started' then
  run.x = int(NOW + tonumber(ARGV[10]))
  run_put(1, slot_s, run)
else
  run = nil
end
return cjson.encode({now = int(NOW), run = run})
""")

#: The runner is done: state finished, if its token is current.
#: KEYS: the store key, then the entry's ENTRY_KEYS block.  ARGV[1..6]: header.  ARGV[7]: slot (ms).  ARGV[8]: token.
#: Reply: {now, done "1"/"0"}.
RELEASE = lua(r"""
memory_start(1)
local slot_s = ARGV[7]
local run = run_get(1, slot_s)
local done = '0'
if run and tonumber(run.k) == tonumber(ARGV[8]) and run.s == 'started' then
  run.s, run.x = 'finished', ''
  run_put(1, slot_s, run)
  history_event(1, slot_s, 'finished', run, '')
  done = '1'
end
return cjson.encode({now = int(NOW), done = done})
""")

#: A retry hands the run back to the queue, if its token is current (attempt and token kept).
#: KEYS: the store key, then the entry's ENTRY_KEYS block.
#: ARGV[1..6]: header.  ARGV[7]: slot (ms).  ARGV[8]: token.  ARGV[9]: retry delay ms.
#: ARGV[10]: queue_timeout ms.
#: Reply: {now, done "1"/"0"}.
REQUEUE = lua(r"""
memory_start(1)
local slot_s = ARGV[7]
local run = run_get(1, slot_s)
local done = '0'
if run and tonumber(run.k) == tonumber(ARGV[8]) and run.s == 'started' then
  run.s, run.x = 'queued', ''
  run.q = int(NOW + tonumber(ARGV[9]) + tonumber(ARGV[10]))
  run_put(1, slot_s, run)
  done = '1'
end
return cjson.encode({now = int(NOW), done = done})
""")

#: Read the memory settings recorded store-wide (prepare: refuse an instance with others).
#: KEYS: the store key.  ARGV[1..6]: header.
#: Reply: {now, settings ("" if none), used (ms of their last claim, "" if none)}.
SETTINGS_READ = lua(r"""
local rec = redis.call('HMGET', STORE, 'settings', 'settings_used')
return cjson.encode({now = int(NOW), settings = rec[1] or '', used = rec[2] or ''})
""")

#: Every script, by the attribute name the store registers it under.
SCRIPTS = {"settings": SETTINGS_READ,
    "claim": CLAIM, "memory_start": MEMORY_START, "record": RECORD, "history": HISTORY_READ,
    "inspect": INSPECT, "expired_runs": EXPIRED_RUNS, "take_over": TAKE_OVER, "adopt": ADOPT,
    "renew": RENEW, "release": RELEASE, "requeue": REQUEUE,
}
