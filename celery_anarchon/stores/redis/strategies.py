"""The Redis strategies ``stream-id``, ``script`` and ``idmp`` (docs/design.md store memory table).

:func:`celery_anarchon.stores.redis.open_redis_store` builds these classes. They
share the ``lease`` strategy's connections, errors, key layout, memory start ("Amnesia"), history
and definitions (same keys, same scripts), and the entry store (:mod:`.entries`); each has its
own claim script (:mod:`.strategy_scripts`). They hold no leases
(``plan.py`` refuses a leased entry on them) and do not apply max_late on their own clock
(``checks_lateness`` is False: stream-id refuses only early slots, script only slots older than its
window), so the clock-skew limit of docs/design.md's memory table applies (``docs/stores.md``).

Every claim script, for each run of the batch, in this order (docs/design.md "Who won", "Amnesia"):

1. already claimed: the winner recorded inside the claim is read back: this instance -> WON (a
   retry after a timeout), another -> OTHER_WON with its fingerprint;
2. the entry is paused -> PAUSED, detail ``Pause.describe()``, recorded once in history;
3. the store's memory of the entry began after ``slot - 10 s`` (a new store, or it lost its data,
   e.g. a FLUSHDB) -> FORGOTTEN;
4. the strategy's own refusals (below), recorded once in history (fill only); none of them is
   "superseded" for the run of a run-now request (``ClaimRequest.requested``): stream-id claims
   it apart from its stream of scheduled slots, script and idmp never order their runs;
5. won: the claim, the winner (instance id, fingerprint, store ms) and the history record
   ``claimed`` are written by the same script.

(idmp checks 3 first: only its XADD can tell "claimed", and a slot refused by 3 was never won,
since the memory start moves only when the data is lost. It then refuses, on the server's clock, a
slot older than its ``duration`` (forgotten: IDMP may no longer remember it) or more than 10 s
ahead (early), as the lease strategy does, before its XADD; then 1 and 2 as above: the XADD of a
paused run is undone in the same script and the slot marked as never won.)

Before any run, every claim script checks the memory settings recorded store-wide (spec point 5):
another instance's, still in use, refuse the whole batch (forgotten, naming both).

Keys: the lease strategy's block (:data:`~celery_anarchon.stores.redis.scripts.ENTRY_KEYS`: only
``born``, ``claims`` (stream-id: the run-now runs' winners; idmp: ``claims`` and
``claims:expiry``, for runs refused as paused) and
the two history keys are used) followed by the strategy's own keys, all
under the entry's one hash tag. No key carries a TTL.
"""
from __future__ import annotations

from collections.abc import Sequence

from celery_anarchon.errors import ConfigError
from celery_anarchon.stores.base import ClaimRequest, ClaimResult, Memory
from celery_anarchon import _util
from celery_anarchon.stores.redis.options import STREAM_ID_HORIZON_MS
from celery_anarchon.stores.redis.scripts import SHARED
from celery_anarchon.stores.redis.history import _items
from celery_anarchon.stores.redis.store import RedisStore, claim_results
from celery_anarchon.stores.redis.strategy_scripts import (
    IDMP_CLAIM, IDMP_SETTINGS, SCRIPT_CLAIM, STREAM_ID_CLAIM,
)

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

# -- stores ---------------------------------------------------------------------------------------


class _ClaimOnlyRedisStore(RedisStore):
    """What the three strategies share: no leases, no lateness check of their own, one claim
    script per batch whose runs are 6 ARGV items each (after :meth:`_claim_params`; the last
    one marks the run of a run-now request, :attr:`ClaimRequest.requested`)."""

    checks_lateness = False
    #: the claim script
    CLAIM_SCRIPT = ""
    #: claim a batch in slot order (stream-id: an older slot after a newer one is refused)
    CLAIM_IN_SLOT_ORDER = False

    def _script_texts(self) -> dict[str, str]:
        return {**SHARED, "claim": self.CLAIM_SCRIPT}

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
                     r.fingerprint, r.entry, "1" if r.requested else "0"]
        reply, unconfirmed = self.connection.claim_call(
            [k for e in blocks for k in self._claim_block(e)], [*self._claim_params(), *args])
        results = self._unconfirmed(claim_results([requests[i] for i in order], reply), unconfirmed)
        in_order = [None] * len(requests)
        for i, result in zip(order, results):
            in_order[i] = result
        return in_order


class RedisStreamIdStore(_ClaimOnlyRedisStore):
    """Strategy ``stream-id``: the claim of a scheduled slot adds ``<slot>-0`` to the entry's
    stream; ids only grow, so a claimed run is remembered forever and an older slot after a newer
    one is refused (SUPERSEDED). The stream is trimmed to about max(history_size, 100) entries
    (MAXLEN ~), which keeps its last id, so trimming never weakens the refusal; it never gets a
    TTL nor a DEL.

    The run of a run-now request (:attr:`ClaimRequest.requested`) is its own run, kept apart (as
    the lease stores keep it, docs/design.md "Leases": Overlap): its winner in ``claims``, its slot
    in ``claims:requested``, never superseded by a scheduled slot and moving no stream id, so it
    supersedes none. The newest max(history_size, 100) of them are kept; ``claims:requested:floor``
    holds the newest slot trimmed, and every slot at or below it is refused (FORGOTTEN), so a
    claimed run, of either kind, is never won again."""

    strategy = "stream-id"
    #: an older slot after a newer one is refused (superseded): no backfill
    claims_past_slots = False
    EXTRA_KEYS = {"STREAM": "claims:stream", "REQUESTED": "claims:requested",
                  "REQUESTED_FLOOR": "claims:requested:floor"}
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
        self.window_s = _util.seconds("window", options.get("window", DEFAULT_WINDOW_S))
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
    number = _util.seconds(name, value) if unit else _util.positive_int(name, value)
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
        reply = self.connection.call("idmp_settings", [k for e in entries for k in self._claim_block(e)],
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
