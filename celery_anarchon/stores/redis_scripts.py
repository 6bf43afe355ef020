"""Lua scripts of the Redis ``lease`` store (:mod:`celery_anarchon.stores.redis`), and the prelude
the other strategies' scripts share (:mod:`celery_anarchon.stores.redis_strategies`).

Each script is defined once here, with a comment per KEYS and ARGV item, and registered once per
client (redis-py ``Script`` objects: EVALSHA, re-loaded by redis-py after NOSCRIPT).

Conventions shared by every script (the semantics are in ``store-semantics.md``):

* **Keys.** A script receives, for each entry it touches, the entry's block of ``len(ENTRY_KEYS)``
  keys in :data:`ENTRY_KEYS` order (a strategy's claim script: followed by its own keys, see
  :func:`lua`); ``key(b, WHAT)`` is key WHAT of block ``b`` (1-based). No key name is ever built
  inside Lua, and every key of a block shares one hash tag.
* **ARGV header.** ``ARGV[1]`` this instance's id, ``ARGV[2]`` the store memory in ms,
  ``ARGV[3]`` history_size; a script's own arguments start at ``ARGV[4]``.
* **Memory start.** Every script notes the memory start of an entry that has none (the store
  lost its data: DESIGN.md "Amnesia"), so the next claim refuses what it cannot remember.
* **Clock.** Every decision uses the server's ``TIME``, read once per script (DESIGN.md "Clocks":
  lateness and leases are judged on the store's clock).
* **Numbers.** Lua numbers are doubles and ``tostring`` keeps only 14 digits, which would round a
  microsecond fencing token: every number written or returned goes through ``int()``
  (``%d``), and stored records hold numbers as decimal strings.
* **Replies.** One JSON object (cjson) of strings; nothing read back is pickled or evaluated.

Records (JSON objects of strings):

* claim ``{w: winner, f: fingerprint, t: claimed at ms}`` in ``claims`` (field = slot);
* history ``{e: event, i: instance, t: ms, k: task id, a: attempt, d: detail}`` in ``history``;
* leased run ``{s: state, a: attempt, k: token, o: owner, x: lease expiry ms or "",
  q: queue deadline ms or ""}`` in ``runs``.
"""
from __future__ import annotations

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
local clock = redis.call('TIME')
local NOW = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)  -- store ms
local NOW_US = tonumber(clock[1]) * 1000000 + tonumber(clock[2])              -- store us

local function key(b, what) return KEYS[(b - 1) * BLOCK + what] end
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

-- when the store's memory of entry b began; a missing note means the store lost its data
local function memory_start(b)
  local born = redis.call('GET', key(b, BORN))
  if born then return tonumber(born) end
  redis.call('SET', key(b, BORN), int(NOW))
  return NOW
end

-- why slot cannot be claimed because the store's memory of entry b began after it ("Amnesia"),
-- or nil; notes the memory start if it is missing
local function amnesia(b, slot)
  local born = memory_start(b)
  if slot < born + TOL then
    return "the store's memory of this entry began at " .. iso(born) ..
      ' (new store, or it lost its data); runs before ' .. iso(born + TOL) .. ' are refused'
  end
  return nil
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
#: KEYS: one ENTRY_KEYS block per distinct entry of the batch.
#: ARGV[1..3]: header (instance id, memory ms, history_size).
#: ARGV[4..]: 8 items per request, in request order:
#:   +0 entry block number (1-based), +1 slot (UTC ms, decimal), +2 max_late ms,
#:   +3 task id (history), +4 claimant's fingerprint, +5 "1" leased / "0",
#:   +6 queue_timeout ms (leased), +7 "1" overlap allowed / "0" skip (leased).
#: Reply: {now, results: [{o outcome, w winner, f fingerprint, k token, a attempt, d detail}]}.
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
    if c.w ~= INSTANCE then return {o = 'lost', w = c.w, f = c.f} end
    local run = leased and run_get(b, slot_s)
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
  local run = {s = 'queued', a = '1', k = int(next_token(b)), o = INSTANCE, x = '',
               q = int(NOW + queue_timeout)}
  run_put(b, slot_s, run)
  return {o = 'won', w = INSTANCE, f = fingerprint, k = run.k, a = run.a}
end

for b = 1, #KEYS / BLOCK do prune(b) end
local results = {}
for i = 4, #ARGV, 8 do
  results[#results + 1] = claim_one(tonumber(ARGV[i]), ARGV[i + 1], tonumber(ARGV[i + 2]),
    ARGV[i + 3], ARGV[i + 4], ARGV[i + 5] == '1', tonumber(ARGV[i + 6]), ARGV[i + 7] == '1')
end
return cjson.encode({now = int(NOW), results = results})
""")

#: Note (or move back, for tests) when the store's memory of each entry began.
#: KEYS: one ENTRY_KEYS block per entry.
#: ARGV[1..3]: header.  ARGV[4]: ms to move the memory start back ("0": only note missing ones).
#: Reply: {now}.
MEMORY_START = lua(r"""
local by = tonumber(ARGV[4])
for b = 1, #KEYS / BLOCK do
  local born = memory_start(b)
  if by > 0 then redis.call('SET', key(b, BORN), int(born - by)) end
end
return cjson.encode({now = int(NOW)})
""")

#: Write one event into a run's history.
#: KEYS: the entry's ENTRY_KEYS block.
#: ARGV[1..3]: header.  ARGV[4]: slot (ms).  ARGV[5]: event (RunEvent value).  ARGV[6]: task id.
#: ARGV[7]: attempt.  ARGV[8]: detail.  ARGV[9]: "1" fill only (skip events) / "0" replace.
#: Reply: {now}.
RECORD = lua(r"""
memory_start(1)
history_put(1, ARGV[4], ARGV[5], ARGV[6], tonumber(ARGV[7]), ARGV[8], ARGV[9] == '1')
return cjson.encode({now = int(NOW)})
""")

#: Read an entry's newest runs.
#: KEYS: the entry's ENTRY_KEYS block.
#: ARGV[1..3]: header.  ARGV[4]: how many runs at most.
#: Reply: {now, records: [{s slot, r history record}]}, newest first.
HISTORY_READ = lua(r"""
memory_start(1)
local records = {}
for _, s in ipairs(redis.call('ZREVRANGE', key(1, HISTORY_SLOTS), 0, tonumber(ARGV[4]) - 1)) do
  local rec = history_get(1, s)
  if rec then records[#records + 1] = {s = s, r = rec} end
end
return cjson.encode({now = int(NOW), records = records})
""")

#: Read one leased run.
#: KEYS: the entry's ENTRY_KEYS block.  ARGV[1..3]: header.  ARGV[4]: slot (ms).
#: Reply: {now, run?}.
INSPECT = lua(r"""
memory_start(1)
return cjson.encode({now = int(NOW), run = run_get(1, ARGV[4])})
""")

#: Leased runs started with an expired lease or queued past their deadline.
#: KEYS: one ENTRY_KEYS block per entry.  ARGV[1..3]: header.
#: Reply: {now, runs: [{b entry block, s slot, r run}]}.
EXPIRED_RUNS = lua(r"""
local found = {}
for b = 1, #KEYS / BLOCK do
  memory_start(b)
  for _, s in ipairs(redis.call('ZRANGE', key(b, ACTIVE), 0, -1)) do
    local run = run_get(b, s)
    if run and expired(run) then found[#found + 1] = {b = int(b), s = s, r = run} end
  end
end
return cjson.encode({now = int(NOW), runs = found})
""")

#: Take over an expired run: one compare-and-set on the expected token.
#: KEYS: the entry's ENTRY_KEYS block.
#: ARGV[1..3]: header.  ARGV[4]: slot (ms).  ARGV[5]: expected token.
#: ARGV[6]: queue_timeout ms for the new attempt.  ARGV[7]: max_attempts.
#: Reply: {now, outcome (TakeoverOutcome value), run?}.
TAKE_OVER = lua(r"""
memory_start(1)
local slot_s = ARGV[4]
local run = run_get(1, slot_s)
local function reply(outcome) return cjson.encode({now = int(NOW), outcome = outcome, run = run}) end
if not run or tonumber(run.k) ~= tonumber(ARGV[5]) or not expired(run) then return reply('refused') end
local newest = num(redis.call('HGET', key(1, FENCE), 'newest'))
if newest and newest > tonumber(slot_s) then
  run.s = 'superseded'
  run_put(1, slot_s, run)
  history_event(1, slot_s, 'superseded', run, 'a newer slot (' .. iso(newest) .. ') was claimed')
  return reply('superseded')
end
if tonumber(run.a) >= tonumber(ARGV[7]) then
  run.s = 'lost'
  run_put(1, slot_s, run)
  history_event(1, slot_s, 'lost', run, 'given up after ' .. run.a .. ' attempts')
  return reply('lost')
end
run = {s = 'queued', a = int(tonumber(run.a) + 1), k = int(next_token(1)), o = INSTANCE, x = '',
       q = int(NOW + tonumber(ARGV[6]))}
run_put(1, slot_s, run)
history_event(1, slot_s, 'taken_over', run, '')
return reply('taken')
""")

#: Worker side: adopt a queued run (or one started with an expired lease) before the body runs.
#: KEYS: the entry's ENTRY_KEYS block.
#: ARGV[1..3]: header.  ARGV[4]: slot (ms).  ARGV[5]: owner (this execution).
#: ARGV[6]: lease duration ms.
#: Reply: {now, adopted "1"/"0", run?}.
ADOPT = lua(r"""
memory_start(1)
local slot_s = ARGV[4]
local run = run_get(1, slot_s)
local adopted = '0'
if run and (run.s == 'queued' or (run.s == 'started' and expired(run))) then
  run = {s = 'started', a = run.a, k = int(next_token(1)), o = ARGV[5],
         x = int(NOW + tonumber(ARGV[6])), q = ''}
  run_put(1, slot_s, run)
  history_event(1, slot_s, 'started', run, '')
  adopted = '1'
end
return cjson.encode({now = int(NOW), adopted = adopted, run = run})
""")

#: Heartbeat: extend the lease held with a token (re-create the record if the store forgot it).
#: KEYS: the entry's ENTRY_KEYS block.
#: ARGV[1..3]: header.  ARGV[4]: slot (ms).  ARGV[5]: token.  ARGV[6]: owner.
#: ARGV[7]: lease duration ms.
#: Reply: {now, run?} (no run: the token is stale, the runner lost the lease).
RENEW = lua(r"""
memory_start(1)
local slot_s, token = ARGV[4], tonumber(ARGV[5])
local run = run_get(1, slot_s)
if not run then  -- amnesia: the live runner keeps its run, and the fence covers its token
  run = {s = 'started', a = '1', k = ARGV[5], o = ARGV[6], x = int(NOW + tonumber(ARGV[7])), q = ''}
  run_put(1, slot_s, run)
  local last = num(redis.call('HGET', key(1, FENCE), 'token')) or 0
  if last < token then redis.call('HSET', key(1, FENCE), 'token', ARGV[5]) end
elseif tonumber(run.k) == token and run.s == 'started' then
  run.x = int(NOW + tonumber(ARGV[7]))
  run_put(1, slot_s, run)
else
  run = nil
end
return cjson.encode({now = int(NOW), run = run})
""")

#: The runner is done: state finished, if its token is current.
#: KEYS: the entry's ENTRY_KEYS block.  ARGV[1..3]: header.  ARGV[4]: slot (ms).  ARGV[5]: token.
#: Reply: {now, done "1"/"0"}.
RELEASE = lua(r"""
memory_start(1)
local slot_s = ARGV[4]
local run = run_get(1, slot_s)
local done = '0'
if run and tonumber(run.k) == tonumber(ARGV[5]) and run.s == 'started' then
  run.s, run.x = 'finished', ''
  run_put(1, slot_s, run)
  history_event(1, slot_s, 'finished', run, '')
  done = '1'
end
return cjson.encode({now = int(NOW), done = done})
""")

#: A retry hands the run back to the queue, if its token is current (attempt and token kept).
#: KEYS: the entry's ENTRY_KEYS block.
#: ARGV[1..3]: header.  ARGV[4]: slot (ms).  ARGV[5]: token.  ARGV[6]: retry delay ms.
#: ARGV[7]: queue_timeout ms.
#: Reply: {now, done "1"/"0"}.
REQUEUE = lua(r"""
memory_start(1)
local slot_s = ARGV[4]
local run = run_get(1, slot_s)
local done = '0'
if run and tonumber(run.k) == tonumber(ARGV[5]) and run.s == 'started' then
  run.s, run.x = 'queued', ''
  run.q = int(NOW + tonumber(ARGV[6]) + tonumber(ARGV[7]))
  run_put(1, slot_s, run)
  done = '1'
end
return cjson.encode({now = int(NOW), done = done})
""")

#: Every script, by the attribute name the store registers it under.
SCRIPTS = {
    "claim": CLAIM, "memory_start": MEMORY_START, "record": RECORD, "history": HISTORY_READ,
    "inspect": INSPECT, "expired_runs": EXPIRED_RUNS, "take_over": TAKE_OVER, "adopt": ADOPT,
    "renew": RENEW, "release": RELEASE, "requeue": REQUEUE,
}
