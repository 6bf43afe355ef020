"""Lua scripts of the Redis ``lease`` strategy (:mod:`celery_anarchon.stores.redis.lease`): its
claim (with the lease record of a leased run) and the lease operations.

They follow the conventions of :mod:`celery_anarchon.stores.redis.scripts` (keys, ARGV header,
epoch, memory start, clock, numbers, replies), whose prelude they share, plus the helpers below
for the ``runs`` records and fencing tokens.
"""
from __future__ import annotations

from celery_anarchon.stores.redis.scripts import SHARED, lua

#: ARGV items per request of the claim script (:data:`CLAIM`)
CLAIM_ITEMS = 10

#: Helpers of the lease scripts: fencing tokens, the age of claims, leased-run records.
_LEASE = r"""
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

-- a lease event replaces the record, keeping its task id unless one is given (a takeover's: the
-- new attempt's); the attempt is the run's
local function history_event(b, slot_s, event, run, detail, task_id)
  if not task_id then
    local old = history_get(b, slot_s)
    task_id = old and old.k or ''
  end
  history_put(b, slot_s, event, task_id, tonumber(run.a), detail or '', false)
end


local function run_get(b, slot_s) return hget_json(key(b, RUNS), slot_s) end

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
-- a run that ends because its entry is paused (why: the pause's description), recorded once
local function end_paused(b, slot_s, run, why)
  run.s = 'paused'
  run_put(b, slot_s, run)
  history_event(b, slot_s, 'paused', run, why)
end"""

#: Claim a batch of runs: all runs of a tick in one EVALSHA.
#: KEYS: the namespace keys, then one ENTRY_KEYS block per distinct entry of the batch.
#: ARGV[1..6]: header (instance id, memory ms, history_size, settings, horizon ms, replica grace and
#:   allow_eviction).
#: ARGV[7..]: CLAIM_ITEMS items per request, in request order:
#:   +0 entry block number (1-based), +1 slot (UTC ms, decimal), +2 max_late ms,
#:   +3 task id (history), +4 claimant's fingerprint, +5 "1" leased / "0",
#:   +6 queue_timeout ms (leased), +7 "1" overlap allowed / "0" skip (leased), +8 entry name,
#:   +9 "1" the run of a run-now request / "0" a scheduled slot.
#: Order per run: already claimed, paused, forgotten, late, early, superseded (scheduled slots:
#: a newer scheduled slot of the entry was claimed), overlapping (another run of the entry alive),
#: won. A leased run-now request is its own run: never superseded, and its claim neither makes
#: older slots superseded (the entry's newest slot stays the schedule's) nor supersedes a dead
#: run; a scheduled claim never supersedes a dead run-now run either (it is taken over).
#: Reply: {now, results: [{o outcome, w winner, f fingerprint, k token, a attempt, d detail}],
#: replicas: replicas to wait for (when counted), online: replicas online now, seen and held: when
#: more are required than are online, the size of the recent group whose majority is required
#: and when it was last online (within replica_grace)}.
CLAIM = lua(_LEASE + r"""
local function prune(b)  -- claims (and terminal runs) past their age; never by count
  local gone = redis.call('ZRANGEBYSCORE', key(b, EXPIRY), '-inf', NOW)
  for _, s in ipairs(gone) do
    redis.call('HDEL', key(b, CLAIMS), s)
    if not redis.call('ZSCORE', key(b, ACTIVE), s) then redis.call('HDEL', key(b, RUNS), s) end
  end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', key(b, EXPIRY), '-inf', NOW) end
end

local function refusal(b, slot_s, slot, max_late, leased, overlap, requested)
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
  if not requested and newest and newest > slot then
    return 'superseded', 'a newer slot (' .. iso(newest) .. ') was already claimed'
  end
  local live, dead = nil, {}
  for _, s in ipairs(redis.call('ZRANGE', key(b, ACTIVE), 0, -1)) do
    local run = s ~= slot_s and run_get(b, s)
    if run and alive(run) then
      live = live or s
    elseif run and not requested and run.r ~= '1' and tonumber(s) < slot then
      dead[#dead + 1] = {s, run}
    end
  end
  if live and not overlap then
    local why = 'the run of ' .. iso(tonumber(live)) .. ' is still alive'
    if requested then why = why .. ' (this run-now request is skipped: overlap="skip")' end
    return 'overlapping', why
  end
  for _, pair in ipairs(dead) do
    pair[2].s = 'superseded'
    run_put(b, pair[1], pair[2])
    history_event(b, pair[1], 'superseded', pair[2], 'the run of ' .. iso(slot) .. ' superseded it')
  end
  return nil
end

local function claim_one(b, slot_s, max_late, task_id, fingerprint, leased, queue_timeout, overlap,
                         name, requested)
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
  local paused = pause_refusal(b, slot_s, task_id, name)
  if paused then return paused end
  local skip, detail = refusal(b, slot_s, slot, max_late, leased, overlap, requested)
  if skip then
    history_put(b, slot_s, skip, task_id, 1, detail, true)
    return {o = skip, d = detail}
  end
  redis.call('HSET', key(b, CLAIMS), slot_s, cjson.encode({w = INSTANCE, f = fingerprint, t = int(NOW)}))
  keep_until(b, slot_s, math.max(NOW, slot) + MEMORY_MS)
  history_put(b, slot_s, 'claimed', task_id, 1, '', false)
  if not leased then return {o = 'won', w = INSTANCE, f = fingerprint} end
  local newest = num(redis.call('HGET', key(b, FENCE), 'newest'))
  if not requested and (not newest or slot > newest) then
    redis.call('HSET', key(b, FENCE), 'newest', slot_s)
  end
  local run = {s = 'queued', a = '1', k = int(next_token(b)), o = INSTANCE, w = INSTANCE, x = '',
               q = int(NOW + queue_timeout), r = requested and '1' or nil}
  run_put(b, slot_s, run)
  return {o = 'won', w = INSTANCE, f = fingerprint, k = run.k, a = run.a}
end

for b = 1, NBLOCKS do prune(b) end
local refused = settings_refusal()
local results = {}
for i = 7, #ARGV, CLAIM_ITEMS do
  local b, slot_s, task_id = tonumber(ARGV[i]), ARGV[i + 1], ARGV[i + 3]
  if refused then
    history_put(b, slot_s, 'forgotten', task_id, 1, refused, true)
    results[#results + 1] = {o = 'forgotten', d = refused}
  else
    results[#results + 1] = claim_one(b, slot_s, tonumber(ARGV[i + 2]), task_id, ARGV[i + 4],
      ARGV[i + 5] == '1', tonumber(ARGV[i + 6]), ARGV[i + 7] == '1', ARGV[i + 8],
      ARGV[i + 9] == '1')
  end
end
return claim_reply(results)
""".replace("CLAIM_ITEMS", str(CLAIM_ITEMS)))

#: Read one leased run.
#: KEYS: the namespace keys, then the entry's ENTRY_KEYS block.  ARGV[1..6]: header.  ARGV[7]: slot (ms).
#: Reply: {now, run?}.
INSPECT = lua(_LEASE + r"""
memory_start(1)
return cjson.encode({now = int(NOW), run = run_get(1, ARGV[7])})
""")

#: Leased runs started with an expired lease or queued past their deadline.
#: KEYS: the namespace keys, then one ENTRY_KEYS block per entry.  ARGV[1..6]: header.
#: Reply: {now, runs: [{b entry block, s slot, r run}]}.
EXPIRED_RUNS = lua(_LEASE + r"""
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

#: Take over an expired run: one compare-and-set on the expected token; then, in this order, the
#: entry paused (the run ends paused: recorded once with the pause's description, never taken
#: over after the resume, as a paused claim is not caught up), the store's memory (below), a newer
#: scheduled slot (superseded; never for a run-now request's run) and max_attempts. The new record keeps the
#: token it replaced (p), so this instance's retry of a takeover whose reply was lost is TAKEN
#: again with the same record, not REFUSED. A run whose slot is older than the entry's memory
#: start + 10 s (an epoch change or amnesia since it was claimed: the store may have lost writes
#: to its record, such as its release) is never taken over: it becomes lost, and its history says
#: why (docs/design.md "Leases": a possible miss, never a second run of the body).
#: KEYS: the namespace keys, then the entry's ENTRY_KEYS block.
#: ARGV[1..6]: header.  ARGV[7]: slot (ms).  ARGV[8]: expected token.
#: ARGV[9]: queue_timeout ms for the new attempt.  ARGV[10]: max_attempts.
#: ARGV[11]: the new attempt's task id (history).  ARGV[12]: the entry's name (its pause).
#: Reply: {now, outcome (TakeoverOutcome value), run?, replicas (to wait for, when counted), online,
#: seen?, held?} (as the claim reply).
TAKE_OVER = lua(_LEASE + r"""
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
local paused = pause_of(ARGV[12])
if paused then
  end_paused(1, slot_s, run, paused)
  return reply('paused')
end
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
if run.r ~= '1' and newest and newest > tonumber(slot_s) then
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
local why = 'attempt ' .. run.a .. ' (token ' .. run.k .. ') was queued past its deadline'
if run.s == 'started' then
  why = 'the lease of attempt ' .. run.a .. ' (token ' .. run.k .. ', runner ' .. run.o .. ') expired'
end
run = {s = 'queued', a = int(tonumber(run.a) + 1), k = int(next_token(1)), o = INSTANCE,
       w = INSTANCE, p = run.k, x = '', q = int(NOW + tonumber(ARGV[9])), r = run.r}
run_put(1, slot_s, run)
history_event(1, slot_s, 'taken_over', run, why, ARGV[11])
return reply('taken')
""")

#: Worker side: adopt a queued run (or one started with an expired lease) before the body runs;
#: when the entry is paused such a run ends paused instead (recorded once; its message is dropped).
#: KEYS: the namespace keys, then the entry's ENTRY_KEYS block.
#: ARGV[1..6]: header.  ARGV[7]: slot (ms).  ARGV[8]: owner (this execution).
#: ARGV[9]: lease duration ms.  ARGV[10]: the entry's name (its pause).
#: Reply: {now, adopted "1"/"0", run?}.
ADOPT = lua(_LEASE + r"""
memory_start(1)
local slot_s = ARGV[7]
local run = run_get(1, slot_s)
local adopted = '0'
local paused = run and (run.s == 'queued' or (run.s == 'started' and expired(run)))
  and pause_of(ARGV[10])
if paused then
  end_paused(1, slot_s, run, paused)
elseif run and (run.s == 'queued' or (run.s == 'started' and expired(run))) then
  run = {s = 'started', a = run.a, k = int(next_token(1)), o = ARGV[8], w = run.w, p = run.p,
         x = int(NOW + tonumber(ARGV[9])), q = '', r = run.r}
  run_put(1, slot_s, run)
  history_event(1, slot_s, 'started', run, '')
  adopted = '1'
end
return cjson.encode({now = int(NOW), adopted = adopted, run = run})
""")

#: Heartbeat: extend the lease held with a token. A missing record is re-created only when the
#: store forgot it (the slot is older than the entry's memory start + 10 s: amnesia, new epoch);
#: missing while the memory is intact, it was pruned after it finished: the lease is lost.
#: KEYS: the namespace keys, then the entry's ENTRY_KEYS block.
#: ARGV[1..6]: header.  ARGV[7]: slot (ms).  ARGV[8]: token.  ARGV[9]: owner.
#: ARGV[10]: lease duration ms.
#: Reply: {now, run?} (no run: the token is stale, the runner lost the lease).
RENEW = lua(_LEASE + r"""
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

#: The runner is done: state finished, if its token is current. A missing record the store
#: forgot (the slot is older than the entry's memory start + 10 s: amnesia, new epoch) is
#: re-created finished with the runner's token, as RENEW re-creates it started: the body ran, so
#: the run is neither answered taken over nor later given up as a possible miss.
#: KEYS: the namespace keys, then the entry's ENTRY_KEYS block.  ARGV[1..6]: header.
#: ARGV[7]: slot (ms).  ARGV[8]: token.
#: Reply: {now, done "1"/"0"}.
RELEASE = lua(_LEASE + r"""
memory_start(1)
local slot_s, token = ARGV[7], tonumber(ARGV[8])
local run = run_get(1, slot_s)
local done, detail = '0', ''
if not run and tonumber(slot_s) < memory_start(1) + TOL then
  run = {s = 'started', a = '1', k = ARGV[8], o = '', x = '', q = ''}
  local last = num(redis.call('HGET', key(1, FENCE), 'token')) or 0
  if last < token then redis.call('HSET', key(1, FENCE), 'token', ARGV[8]) end
  detail = 'released by its runner after the store forgot the run'
end
if run and tonumber(run.k) == token and run.s == 'started' then
  run.s, run.x = 'finished', ''
  run_put(1, slot_s, run)
  history_event(1, slot_s, 'finished', run, detail)
  done = '1'
end
return cjson.encode({now = int(NOW), done = done})
""")

#: A retry hands the run back to the queue, if its token is current (attempt and token kept).
#: KEYS: the namespace keys, then the entry's ENTRY_KEYS block.
#: ARGV[1..6]: header.  ARGV[7]: slot (ms).  ARGV[8]: token.  ARGV[9]: retry delay ms.
#: ARGV[10]: queue_timeout ms.
#: Reply: {now, done "1"/"0"}.
REQUEUE = lua(_LEASE + r"""
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

#: Every script of the lease strategy, by the name the store registers it under.
SCRIPTS = {**SHARED, "claim": CLAIM, "inspect": INSPECT, "expired_runs": EXPIRED_RUNS,
           "take_over": TAKE_OVER, "adopt": ADOPT, "renew": RENEW, "release": RELEASE,
           "requeue": REQUEUE}
