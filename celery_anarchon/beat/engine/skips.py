"""Skips in the log: slots this instance reached too late (every one recorded in history), and
claims the store refused (late or early on its clock, forgotten, overlapping, superseded, ...),
the same kind of refusal of one entry logged at most once a minute (the ones hidden meanwhile
counted on the next line, or on their own line once the minute passed: :meth:`SkipLog.flush`); a
paused run (an operator's choice, not a fault) at INFO, once per run.

A new store's first refusals (the slots of its first 10 s, refused as ``forgotten``: the amnesia
protection of docs/design.md "Amnesia") are expected: they are one INFO line per beat once that
window has passed ("new store: N entries' slots before T refused"), each slot still recorded once
in its history. A refusal is a new store's when its detail names only the memory start
(:func:`~celery_anarchon.stores.records.memory_began_ms`: no epoch change), this instance
handled no earlier run of the entry, and the memory began no later than this instance started
(+ the 10 s tolerance, for skew): a store that lost its data under a running beat is still a
WARNING per entry."""
from __future__ import annotations

import collections
import logging
import math
import time
from typing import Callable

from celery_anarchon._util import LATENESS_TOLERANCE_MS, log_time
from celery_anarchon.beat.engine.notes import NoteBuffer
from celery_anarchon.beat.engine.observe import LATE_LOCAL, NOOP, Observer
from celery_anarchon.schedule.plan import EntryPlan
from celery_anarchon.stores.base import (
    ClaimResult, ClaimStore, Outcome, RunEvent, memory_began_ms,
)

logger = logging.getLogger(__name__)

#: a skip of the same kind on the same entry is logged at most this often (the rest at debug)
SKIP_LOG_EVERY_S = 60.0
#: the new store's line is logged this long after its refused window ended (the claims of its
#: last slots, each after its jitter, come in first), ms
NEW_STORE_SETTLE_MS = 5_000

SKIP_REASONS = {
    Outcome.LATE: "late on the store's clock (slot + max_late + 10 s had passed when the claim arrived)",
    Outcome.EARLY: "early on the store's clock (more than 10 s before the slot): is this host's clock ahead?",
    Outcome.FORGOTTEN: "the store does not remember that far back (a new store, one that lost its data, or a slot older than its memory)",
    Outcome.OVERLAPPING: "an earlier run of this leased entry is still running (overlap='skip')",
    Outcome.SUPERSEDED: "a newer slot of this entry was already claimed",
    Outcome.UNKNOWN: "the store could not tell whether the claim was won; counted as lost",
    Outcome.PAUSED: "the entry is paused",
    Outcome.UNCONFIRMED: "won, but the store did not confirm the claim durable (on its replicas or disk) in time; not sent, so a failover cannot make it run twice",
}


def _level(outcome: Outcome) -> int:
    """The log level of a refused claim: INFO for the expected ones (a leased run still running,
    a newer slot claimed), else WARNING."""
    return logging.INFO if outcome in (Outcome.OVERLAPPING, Outcome.SUPERSEDED) else logging.WARNING


class SkipLog:
    """Logs, counts and notes skipped slots.

    :param store: the store (its ``history_size`` bounds the late slots noted at once).
    :param instance_id: this instance's id, in the notes.
    :param monotonic: the clock of elapsed time (the rate limit).
    :param stats: the engine's counters (``late_local``).
    :param notes: the history-note buffer.
    :param observer: told of the slots reached too late.
    :param clock: the wall clock, epoch seconds (when this instance started; when a new store's
        refused window has passed).
    """

    def __init__(self, store: ClaimStore, instance_id: str, monotonic: Callable[[], float],
                 stats: collections.Counter, notes: NoteBuffer, *,
                 observer: Observer = NOOP, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        self.started_ms = int(clock() * 1000)
        #: a new store's refused entries not logged yet, and the end of its refused window (ms)
        self._new_store: set[str] = set()
        self._new_store_until = 0
        self.observer = observer
        self.instance_id = instance_id
        self.monotonic = monotonic
        self.stats = stats
        self.notes = notes
        self._logged: dict[tuple[str, str], tuple[float, int]] = {}
        #: (entry, outcome) -> (plan, the newest hidden result): skips not logged yet
        self._hidden: dict[tuple[str, str], tuple[EntryPlan, ClaimResult]] = {}
        self._flush_at = math.inf     # when the first of them is due (monotonic seconds)

    def late_local(self, plan: EntryPlan, slots: list[int], lateness_ms: int) -> None:
        """``slots`` (in order) were reached ``lateness_ms`` after the first past max_late (or
        past the window of ``catch_up='all'``: :attr:`EntryPlan.claim_late_ms`)."""
        self.stats["late_local"] += len(slots)
        self.observer.claimed(plan.name, LATE_LOCAL, len(slots))
        limit = (f"catch_up_window {plan.claim_late_ms / 1000:g} s"
                 if plan.claim_late_ms != plan.max_late_ms else f"max_late {plan.timing.max_late_s:g} s")
        if len(slots) == 1:
            logger.warning("%s: slot %s skipped as late: this instance reached it %.3f s after the "
                           "slot (%s). Was the process paused or did the clock jump?",
                           plan.name, log_time(slots[0]), lateness_ms / 1000, limit)
        else:
            logger.warning("%s: %d slots from %s to %s skipped as late (%s): the process "
                           "was paused or the clock jumped forward.", plan.name, len(slots),
                           log_time(slots[0]), log_time(slots[-1]), limit)
        for slot in slots[-self.store.history_size:]:
            self.notes.add(plan.name, slot, RunEvent.LATE_LOCAL,
                           detail=f"{self.instance_id} reached it {lateness_ms / 1000:.3f} s late")

    def refused(self, plan: EntryPlan, result: ClaimResult, *, ran_before: bool = False) -> None:
        """Log a skip; the same kind of skip of one entry at most once a minute (each run is in
        the store's history anyway), with the number of the ones not logged; a new store's first
        refusals in one line (:meth:`flush`).

        :param ran_before: this instance handled an earlier run of the entry (a forgotten slot
            after it means the store lost its data, never a new store's first refusal)."""
        outcome = result.outcome
        detail = f" ({result.detail})" if result.detail else ""
        if outcome is Outcome.PAUSED:          # asked once per run: never retried
            logger.info("%s: slot %s skipped: %s%s", plan.name, log_time(result.slot_ms),
                        SKIP_REASONS[outcome], detail)
            return
        if outcome is Outcome.FORGOTTEN and not ran_before and self._new_store_refusal(result):
            logger.debug("%s: slot %s skipped: a new store's first slots%s", plan.name,
                         log_time(result.slot_ms), detail)
            return
        now = self.monotonic()
        key = (plan.name, outcome.value)
        last, hidden = self._logged.get(key, (-math.inf, 0))
        if now - last < SKIP_LOG_EVERY_S:
            self._logged[key] = (last, hidden + 1)
            self._hidden[key] = (plan, result)
            self._flush_at = min(self._flush_at, last + SKIP_LOG_EVERY_S)
            logger.debug("%s: slot %s skipped: %s%s", plan.name, log_time(result.slot_ms),
                         SKIP_REASONS[outcome], detail)
            return
        self._logged[key] = (now, 0)
        self._hidden.pop(key, None)
        more = f"; {hidden} more slot(s) of this entry skipped so in the last minute" if hidden else ""
        logger.log(_level(outcome), "%s: slot %s skipped: %s%s%s", plan.name,
                   log_time(result.slot_ms), SKIP_REASONS[outcome], detail, more)

    def _new_store_refusal(self, result: ClaimResult) -> bool:
        """Whether a forgotten refusal is a new store's first (noted for :meth:`flush`): its
        detail names only the memory start, which began no later than this instance started
        (+ the tolerance)."""
        began = memory_began_ms(result.detail)
        if began is None or began > self.started_ms + LATENESS_TOLERANCE_MS:
            return False
        self._new_store.add(result.entry)
        self._new_store_until = max(self._new_store_until, began + LATENESS_TOLERANCE_MS)
        return True

    def flush(self) -> None:
        """Log the skips the rate limit hid once their minute has passed, when no skip of the
        same kind came to carry their count (each tick; nothing to do until the first is due).
        One line per entry and kind: the count and the newest slot. A new store's refusals in
        one INFO line, once its refused window has passed."""
        if self._new_store and self.clock() * 1000 >= self._new_store_until + NEW_STORE_SETTLE_MS:
            count = len(self._new_store)
            logger.info("new store: %d %s slots before %s refused (a new store refuses the "
                        "slots of its first %d s as forgotten, so that no run is ever sent twice: "
                        "docs/design.md \"Amnesia\"; each is in its entry's history)",
                        count, "entry's" if count == 1 else "entries'",
                        log_time(self._new_store_until), LATENESS_TOLERANCE_MS // 1000)
            self._new_store.clear()
        now = self.monotonic()
        if now < self._flush_at:
            return
        self._flush_at = math.inf
        for key, (plan, result) in list(self._hidden.items()):
            last, hidden = self._logged[key]
            if now - last < SKIP_LOG_EVERY_S:
                self._flush_at = min(self._flush_at, last + SKIP_LOG_EVERY_S)
                continue
            del self._hidden[key]
            self._logged[key] = (now, 0)
            detail = f" ({result.detail})" if result.detail else ""
            logger.log(_level(result.outcome), "%s: %d more slot(s) skipped in the last minute: %s, the newest %s%s",
                       plan.name, hidden, SKIP_REASONS[result.outcome],
                       log_time(result.slot_ms), detail)
