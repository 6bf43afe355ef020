"""The Redis strategies ``stream-id``, ``script`` and ``idmp`` (DESIGN.md store memory table).

``RedisStore(url, strategy=...)`` (:mod:`celery_anarchon.stores.redis`) builds these classes. They
share the ``lease`` strategy's connections, errors, key layout, memory start ("Amnesia"), history
and definitions (same keys, same scripts); each has its own claim script. They hold no leases
(``plan.py`` refuses a leased entry on them) and do not apply max_late on their own clock
(``checks_lateness`` is False: stream-id refuses only early slots, script only slots older than its
window), so the clock-skew limit of DESIGN.md's memory table applies (``docs/stores.md``).

Every claim script, for each run of the batch, in this order (DESIGN.md "Who won", "Amnesia"):

1. already claimed: the winner recorded inside the claim is read back: this instance -> WON (a
   retry after a timeout), another -> LOST with its fingerprint;
2. the store's memory of the entry began after ``slot - 10 s`` (a new store, or it lost its data,
   e.g. a FLUSHDB) -> FORGOTTEN;
3. the strategy's own refusals (below), recorded once in history (fill only);
4. won: the claim, the winner (instance id, fingerprint, store ms) and the history record
   ``claimed`` are written by the same script.

(idmp checks 2 before 1: only its XADD can tell "claimed", and a slot refused by 2 was never won,
since the memory start moves only when the data is lost. It then refuses, on the server's clock, a
slot older than its ``duration`` (forgotten: IDMP may no longer remember it) or more than 10 s
ahead (early), as the lease strategy does, before its XADD.)

Before any run, every claim script checks the memory settings recorded store-wide (spec point 5):
another instance's, still in use, refuse the whole batch (forgotten, naming both).

Keys: the lease strategy's block (:data:`~celery_anarchon.stores.redis.scripts.ENTRY_KEYS`: only
``born``, ``claims`` and the two history keys are used) followed by the strategy's own keys, all
under the entry's one hash tag. No key carries a TTL.
"""
from __future__ import annotations

from collections.abc import Sequence

from celery_anarchon.errors import ConfigError
from celery_anarchon.stores.base import ClaimRequest, ClaimResult, Memory
from celery_anarchon.stores.redis.options import STREAM_ID_HORIZON_MS, _positive_int, _seconds
from celery_anarchon.stores.redis.store import RedisStore, _items, claim_results
from celery_anarchon.stores.redis.scripts import HISTORY_READ, MEMORY_START, RECORD, SETTINGS_READ, lua

#: Default memory of ``script`` (``window``) and ``idmp`` (``duration``), seconds.
DEFAULT_WINDOW_S = 300.0
DEFAULT_DURATION_S = 300
#: Default ``max_size`` of ``idmp``: runs remembered per entry.
DEFAULT_MAX_SIZE = 1000
#: The server's ranges for IDMP-DURATION (s) and IDMP-MAXSIZE. redis-py 8.1's ``xcfgset()`` caps the
#: duration at 300 s on the client; the store sends XCFGSET from Lua, so the server's range applies.
IDMP_DURATION_RANGE = (1, 86_400)
IDMP_MAXSIZE_RANGE = (1, 10_000)
#: ``stream-id`` keeps at least this many claims (and at least history_size) in each stream, so a
#: winner's retry and a loser read the recorded winner back; older entries are trimmed.
STREAM_KEEP_MIN = 100

# -- Lua ------------------------------------------------------------------------------------------

#: Helpers of the three claim scripts. ARGV after the header: the strategy's parameters, then 4
#: items per request: entry block number (1-based), slot (UTC ms), task id, fingerprint.
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
  for i = first, #ARGV, 4 do
    local b, slot_s, task_id = tonumber(ARGV[i]), ARGV[i + 1], ARGV[i + 2]
    if refused then
      results[#results + 1] = skipped(b, slot_s, task_id, 'forgotten', refused)
    else
      results[#results + 1] = claim_one(b, slot_s, task_id, ARGV[i + 3])
    end
  end
  return claim_reply(results)
end
"""

#: stream-id: XADD <slot>-0 to the entry's stream; stream ids only grow (DESIGN.md: memory forever).
#: KEYS: the store key, then per entry, ENTRY_KEYS then STREAM.
#: ARGV[7]: entries to keep (MAXLEN ~).  ARGV[8..]: runs.
#: Refusals: EARLY (slot more than 10 s ahead of the server's clock: an instance with a fast clock
#: must not push the id past everyone's slots), SUPERSEDED (a newer slot is in the stream), UNKNOWN
#: (this very id is the stream's last one but its entry is gone: nobody can tell the winner).
STREAM_ID_CLAIM = lua(_HELPERS + r"""
local KEEP = ARGV[7]
return claim_all(8, function(b, slot_s, task_id, fingerprint)
  local stream, id, slot = key(b, STREAM), slot_s .. '-0', tonumber(slot_s)
  local found = redis.call('XRANGE', stream, id, id)[1]
  if found then return recorded(fields(found[2])) end
  local forgot = amnesia(b, slot)
  if forgot then return skipped(b, slot_s, task_id, 'forgotten', forgot) end
  if slot > NOW + TOL then
    return skipped(b, slot_s, task_id, 'early',
      'slot is more than 10 s ahead of the store clock ' .. iso(NOW) .. '; is this host ahead?')
  end
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
""", extra_keys=("STREAM",))

#: script: the claimed slots of each entry in a sorted set (score = slot), the winners in the
#: ``claims`` hash; trimmed by window (server clock) and by count (history_size).
#: KEYS: the store key, then per entry, ENTRY_KEYS then SLOTS, FLOOR.
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
local reply = claim_all(8, function(b, slot_s, task_id, fingerprint)
  local slot = tonumber(slot_s)
  local raw = redis.call('HGET', key(b, CLAIMS), slot_s)
  if raw then return recorded(cjson.decode(raw)) end
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
#: KEYS: the store key, then per entry, ENTRY_KEYS then STREAM.
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

return claim_all(10, function(b, slot_s, task_id, fingerprint)
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
  if not entry then
    return skipped(b, slot_s, task_id, 'unknown',
      'the slot was claimed but its entry (and the name of its winner) is gone from the stream')
  end
  if not top or id_after(id, top[1]) then return won(b, slot_s, task_id, fingerprint) end
  return recorded(fields(entry[2]))
end)
""", extra_keys=("STREAM",))

#: idmp, at start-up: create missing streams with this store's settings; report a live stream with
#: other settings, and change them only when it remembers no run (iids-tracked 0, which already
#: leaves out expired ones): then the wipe XCFGSET does cannot re-open a claim.
#: KEYS: the store key, then per entry, ENTRY_KEYS then STREAM.  ARGV[7]: IDMP-DURATION s.  ARGV[8]: IDMP-MAXSIZE.
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

# -- stores ---------------------------------------------------------------------------------------


class _ClaimOnlyRedisStore(RedisStore):
    """What the three strategies share: no leases, no lateness check of their own, one claim
    script per batch whose runs are 4 ARGV items each (after :meth:`_claim_params`)."""

    checks_lateness = False
    #: the claim script
    CLAIM_SCRIPT = ""
    #: claim a batch in slot order (stream-id: an older slot after a newer one is refused)
    CLAIM_IN_SLOT_ORDER = False

    def _script_texts(self) -> dict[str, str]:
        return {"claim": self.CLAIM_SCRIPT, "memory_start": MEMORY_START, "record": RECORD,
                "history": HISTORY_READ, "settings": SETTINGS_READ}

    def _claim_params(self) -> list:
        """The script's parameters between the header and the runs."""
        return []

    def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimResult]:
        """Claim the batch in one EVALSHA (see the module's docstring for the order of checks).

        :raises StoreUnavailable: the outcome is unknown; a retry recognises this instance's win.
        """
        if not requests:
            return []
        order = list(range(len(requests)))
        if self.CLAIM_IN_SLOT_ORDER:
            order.sort(key=lambda i: requests[i].slot_ms)
        blocks: dict[str, int] = {}
        args: list = []
        for i in order:
            r = requests[i]
            args += [blocks.setdefault(r.entry, len(blocks) + 1), int(r.slot_ms), r.task_id,
                     r.fingerprint]
        reply, unconfirmed = self._claim_call(
            [k for e in blocks for k in self._claim_block(e)], [*self._claim_params(), *args])
        results = self._unconfirmed(claim_results([requests[i] for i in order], reply), unconfirmed)
        in_order = [None] * len(requests)
        for i, result in zip(order, results):
            in_order[i] = result
        return in_order


class RedisStreamIdStore(_ClaimOnlyRedisStore):
    """Strategy ``stream-id``: the claim adds ``<slot>-0`` to the entry's stream; ids only grow,
    so a claimed run is remembered forever and an older slot after a newer one is refused
    (SUPERSEDED). The stream is trimmed to about max(history_size, 100) entries (MAXLEN ~), which
    keeps its last id, so trimming never weakens the refusal; it never gets a TTL nor a DEL."""

    strategy = "stream-id"
    EXTRA_KEYS = {"STREAM": "claims:stream"}
    CLAIM_SCRIPT = STREAM_ID_CLAIM
    CLAIM_IN_SLOT_ORDER = True

    def _configure(self, options: dict) -> None:
        self._memory_ms = 0

    @property
    def memory(self) -> Memory:
        return Memory(duration_s=None, setting="strategy")

    def describe(self) -> str:
        return "redis strategy=stream-id memory=forever"

    def memory_settings(self) -> tuple[str, int]:
        return "strategy=stream-id", STREAM_ID_HORIZON_MS

    def _claim_params(self) -> list:
        return [max(self.history_size, STREAM_KEEP_MIN)]


class RedisScriptStore(_ClaimOnlyRedisStore):
    """Strategy ``script``: a Lua script keeps each entry's claimed slots, trimmed by ``window``
    (seconds, server clock) and to ``history_size`` runs. It refuses (FORGOTTEN) a slot older than
    the window on the server's clock, or not newer than the newest slot it ever trimmed."""

    strategy = "script"
    EXTRA_KEYS = {"SLOTS": "claims:slots", "FLOOR": "claims:floor"}
    CLAIM_SCRIPT = SCRIPT_CLAIM

    def _configure(self, options: dict) -> None:
        self.window_s = _seconds("window", options.get("window", DEFAULT_WINDOW_S))
        self._memory_ms = max(1, round(self.window_s * 1000))

    @property
    def memory(self) -> Memory:
        return Memory(duration_s=self.window_s, count=self.history_size, setting="window",
                      count_setting="history_size")

    def describe(self) -> str:
        return f"redis strategy=script window={self.window_s:g}s history_size={self.history_size}"

    def memory_settings(self) -> tuple[str, int]:
        return (f"strategy=script window={self.window_s:g}s history_size={self.history_size}",
                self._memory_ms)

    def _claim_params(self) -> list:
        return [self._memory_ms]


def _whole(name: str, value, low: int, high: int, unit: str = "") -> int:
    """An integer option within the server's range, else ConfigError naming option and range."""
    number = _seconds(name, value) if unit else _positive_int(name, value)
    if number != int(number) or not low <= number <= high:
        raise ConfigError(f"anarchon_store_options[{name!r}] = {value!r}: must be a whole number"
                          f"{' of seconds' if unit else ''} from {low} to {high} (Redis IDMP-"
                          f"{'DURATION' if unit else 'MAXSIZE'} range)")
    return int(number)


class RedisIdmpStore(_ClaimOnlyRedisStore):
    """Strategy ``idmp`` (Redis >= 8.6): an idempotent XADD per claim, one producer per entry's
    stream, the slot as idempotent id; the stream remembers ``duration`` seconds and at most
    ``max_size`` runs (IDMP-DURATION, IDMP-MAXSIZE), set when the stream is created."""

    strategy = "idmp"
    EXTRA_KEYS = {"STREAM": "claims:idmp"}
    CLAIM_SCRIPT = IDMP_CLAIM

    def _configure(self, options: dict) -> None:
        self.duration_s = _whole("duration", options.get("duration", DEFAULT_DURATION_S),
                                 *IDMP_DURATION_RANGE, unit="s")
        self.max_size = _whole("max_size", options.get("max_size", DEFAULT_MAX_SIZE),
                               *IDMP_MAXSIZE_RANGE)
        self._memory_ms = self.duration_s * 1000
        #: entries kept per stream: at least every run IDMP may still remember, so the entry a
        #: repeated XADD points to (the winner's record) is still there
        self._keep = self.max_size

    def _script_texts(self) -> dict[str, str]:
        return {**super()._script_texts(), "idmp_settings": IDMP_SETTINGS}

    @property
    def memory(self) -> Memory:
        return Memory(duration_s=float(self.duration_s), count=self.max_size, setting="duration",
                      count_setting="max_size")

    def describe(self) -> str:
        return f"redis strategy=idmp duration={self.duration_s}s max_size={self.max_size}"

    def memory_settings(self) -> tuple[str, int]:
        return f"strategy=idmp duration={self.duration_s}s max_size={self.max_size}", self._memory_ms

    def _claim_params(self) -> list:
        return [self.duration_s, self.max_size, self._keep]

    def _prepare_strategy(self, entries: list[str]) -> list[str]:
        """Create the entries' streams with this store's IDMP settings; report (warning naming both
        values) a live stream that has others. Such a stream is changed only if it remembers no
        run, since XCFGSET wipes its memory; otherwise it keeps its values."""
        if not entries:
            return []
        reply = self._call("idmp_settings", [k for e in entries for k in self._claim_block(e)],
                           self.duration_s, self.max_size)
        warnings = []
        for s in _items(reply.get("streams")):
            entry, action = entries[int(s["b"]) - 1], s["a"]
            if action in ("created", "same"):
                continue
            live = f"IDMP-DURATION {s['d']} s, IDMP-MAXSIZE {s['m']}"
            ours = f"duration={self.duration_s}, max_size={self.max_size}"
            if action == "changed":
                warnings.append(
                    f"Redis store {self.safe_url}: entry {entry!r}: its claim stream had {live}; "
                    f"changed to this store's {ours} (it remembered no run, so nothing re-opened).")
                continue
            self._keep = max(self._keep, int(s["m"]))
            shorter = int(s["d"]) < self.duration_s or int(s["m"]) < self.max_size
            warnings.append(
                f"Redis store {self.safe_url}: entry {entry!r}: its claim stream remembers runs "
                f"with {live}, not this store's {ours}. Kept: changing them wipes what the stream "
                f"remembers ({s['n']} runs now) and could let a run be claimed twice. "
                + ("Until it changes, the store remembers less than this beat's start-up rules "
                   "assumed: a claim arriving later than that after the first one would win again. "
                   if shorter else "")
                + f"It changes when a beat starts while the stream remembers no run (every beat "
                  f"of this entry stopped for {s['d']} s); or set the options back.")
        return warnings
