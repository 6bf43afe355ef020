"""The heap of due runs: one pending slot per entry, fired at slot + jitter (jitter drawn per
run from the engine's random source), seeded at start-up by the entry's catch-up policy
(docs/design.md "One run, in time", step 7): the newest slot still within max_late
(``"newest"``), the next slot after now (``"none"``), or the oldest slot within the catch-up
window (``"all"``: its slots then come one by one, oldest first, one every
:attr:`~celery_anarchon.schedule.plan.EntryPlan.catch_up_pace_ms`, each claimed as its own run).
Slots reached too late (past max_late, or past the window of ``"all"``) are skipped (never sent
in a burst), and a slot this instance already claimed is never due again (a clock set back, a
re-seed). An entry whose next slot cannot be computed (past the year 9999, a schedule class's
error) is logged and has no further run here; the others go on. An entry's slots lie within its ``start_at`` / ``end_at``
(:class:`~celery_anarchon.schedule.slots.WindowedSlots`): before the start its first run waits
for it, past the end it has none (logged once, at INFO)."""
from __future__ import annotations

import heapq
import logging
import random

from celery_anarchon._util import log_time
from celery_anarchon.beat.engine.claims import ClaimRetries, claim_request
from celery_anarchon.beat.engine.observe import NOOP, Observer
from celery_anarchon.beat.engine.skips import SkipLog
from celery_anarchon.errors import ConfigError
from celery_anarchon.schedule.plan import EntryPlan
from celery_anarchon.schedule.slots import SlotsEnded
from celery_anarchon.stores.base import ClaimRequest

logger = logging.getLogger(__name__)


def _next(plan: EntryPlan, after_ms: int) -> int | None:
    """The entry's first slot after ``after_ms``, or ``None`` past its ``end_at``."""
    try:
        return plan.slots.next_after(after_ms)
    except SlotsEnded:
        return None

def _newest(plan: EntryPlan, now_ms: int) -> int | None:
    """The newest slot of the entry still within max_late at ``now_ms``, else the next one;
    ``None`` past its ``end_at``."""
    first = _next(plan, now_ms - plan.max_late_ms - 1)
    latest = None
    while first is not None and first <= now_ms:
        latest, first = first, _next(plan, first)
    return latest if latest is not None else first


def _since(plan: EntryPlan, now_ms: int) -> int | None:
    """The first slot a catch-up of a store entry claims: the first at or after the write of its
    definition (:attr:`EntryPlan.since_ms`: the slots before it were none of this definition's,
    or the entry did not exist), or the newest slot still within max_late if that is older (what
    ``add`` and an ``update`` promise, as at start-up: docs/schedules.md)."""
    found = [s for s in (_next(plan, plan.since_ms - 1), _newest(plan, now_ms)) if s is not None]
    return min(found) if found else None


#: at most this many slots skipped in one go are walked one by one (the rest are counted)
MAX_SKIP_WALK = 10_000


class DueRuns:
    """Pending runs by fire time (wall clock, epoch seconds).

    :param namespace: ``anarchon_namespace``, part of every task id.
    :param rng: the jitter source.
    :param skips: logs and notes the slots reached too late.
    :param claims: the claims waiting for the store (a re-seed does not queue one twice).
    :param observer: told of each entry's next slot and of each slot that came.
    """

    def __init__(self, namespace: str, rng: random.Random, skips: SkipLog,
                 claims: ClaimRetries, *, observer: Observer = NOOP) -> None:
        self.observer = observer
        self.namespace = namespace
        self.rng = rng
        self.skips = skips
        self.claims = claims
        self._heap: list[tuple[float, int, str]] = []
        self._pending: dict[str, int] = {}            # entry -> the slot waiting in the heap
        self._last_claimed: dict[str, int] = {}       # entry -> newest slot this instance handled
        #: run-now runs (entry, slot_ms) this instance handled: never claimed as scheduled runs
        self.requested: set[tuple[str, int]] = set()
        self._ended_logged: dict[str, EntryPlan] = {}  # entry -> the plan whose end was logged
        self._catching_up: set[str] = set()            # entries whose catch-up was logged

    def seed(self, plan: EntryPlan, now: float) -> None:
        """Queue the entry's first run by its catch-up policy: ``"newest"``, the newest slot still
        within max_late (so a deploy that restarts every instance at once loses no run), else the
        next one; ``"none"``, the next slot after ``now``; ``"all"``, the oldest slot within the
        catch-up window (its later slots follow, paced: :meth:`_schedule_next`). Never a slot
        this instance already handled (a re-seed after the entry changed: a store that reads its
        own claim back would answer won again, a second send).

        A re-seed (the entry changed at run time) whose slot already waits in the claim retries
        (the store was unreachable) does not queue it a second time: the waiting claim takes the
        new definition and the slot after it is queued (one run is claimed once per batch)."""
        try:
            now_ms = int(now * 1000)
            policy = plan.timing.catch_up
            if policy == "none":
                slot = _next(plan, now_ms)
            elif policy == "all":
                slot = _next(plan, now_ms - plan.claim_late_ms - 1)
                if slot is not None and plan.since_ms is not None and slot < plan.since_ms:
                    slot = _since(plan, now_ms)
            else:
                slot = _newest(plan, now_ms)
            handled = self._last_claimed.get(plan.name, -1)
            if slot is not None and slot <= handled:
                slot = _next(plan, handled)
            if slot is not None and (plan.name, slot) in self.claims:
                self.claims.hold([claim_request(self.namespace, plan, slot)])
                slot = _next(plan, slot)
        except ConfigError as exc:
            self._no_next(plan, exc)
            return
        if slot is None:
            self._ended(plan)
            return
        self._catching_up.discard(plan.name)
        self._push(plan, slot, now_ms)

    def forget(self, name: str) -> None:
        """Drop the pending run of entry ``name`` (removed, or about to be re-seeded)."""
        self._pending.pop(name, None)

    def claimed(self, name: str, slot_ms: int) -> None:
        """This instance saw ``slot_ms`` of ``name`` decided (won, unconfirmed, paused, won by
        another instance): it never asks for it, nor for an older slot, again."""
        self._last_claimed[name] = max(self._last_claimed.get(name, -1), slot_ms)

    def handled(self, name: str) -> bool:
        """Whether this instance saw a run of ``name`` decided (:meth:`claimed`)."""
        return name in self._last_claimed

    def next_fire(self) -> float | None:
        """When the next pending run fires (epoch seconds)."""
        self._drop_stale_heads()
        return self._heap[0][0] if self._heap else None

    def pop(self, now: float, plans: dict[str, EntryPlan]) -> list[ClaimRequest]:
        """The claims of the runs due at ``now`` (wall clock); each entry's next run is queued.
        A run of a ``catch_up='all'`` entry with older runs waiting in the claim retries waits
        behind them (:meth:`ClaimRetries.behind`): its runs are claimed oldest first."""
        now_ms = int(now * 1000)
        due = []
        while self._heap and self._heap[0][0] <= now:
            _, slot_ms, name = heapq.heappop(self._heap)
            plan = plans.get(name)
            if plan is None or self._pending.get(name) != slot_ms:
                continue                       # entry removed or re-seeded
            self._schedule_next(plan, slot_ms, now_ms)
            if slot_ms <= self._last_claimed.get(name, -1) or (name, slot_ms) in self.requested:
                logger.debug("%s: slot %s was already claimed here (the clock went back or the "
                             "entry was re-seeded)", name, log_time(slot_ms))
                continue
            lateness = now_ms - slot_ms
            if lateness > plan.claim_late_ms:
                self.skips.late_local(plan, [slot_ms], lateness)
                continue
            due.append(claim_request(self.namespace, plan, slot_ms))
        return self.claims.behind(due, plans)

    def _push(self, plan: EntryPlan, slot_ms: int, now_ms: int, paced: bool = False) -> None:
        """Queue ``slot_ms`` at slot + jitter. A ``catch_up='all'`` slot already due at
        ``now_ms`` with another due after it starts a catch-up (logged once); ``paced``: the
        slot follows a run of the entry that fired at ``now_ms``, so it fires no sooner than one
        pace later."""
        jitter_s = self.rng.uniform(0, plan.jitter_ms / 1000) if plan.jitter_ms else 0.0
        fire = slot_ms / 1000 + jitter_s
        if plan.timing.catch_up == "all":
            if slot_ms > now_ms:
                self._catching_up.discard(plan.name)
            else:
                if paced:
                    fire = max(fire, (now_ms + plan.catch_up_pace_ms) / 1000)
                if plan.name not in self._catching_up:
                    self._log_catch_up(plan, slot_ms, now_ms)
        self._pending[plan.name] = slot_ms
        self.observer.next_slot(plan.name, slot_ms)
        heapq.heappush(self._heap, (fire, slot_ms, plan.name))

    def _log_catch_up(self, plan: EntryPlan, first_ms: int, now_ms: int) -> None:
        """Log, once per catch-up, the slots from ``first_ms`` to ``now_ms`` that this instance
        will claim one by one (none when only ``first_ms`` is due: that is no catch-up)."""
        due, last = 1, first_ms
        try:
            nxt = _next(plan, first_ms)
            while nxt is not None and nxt <= now_ms and due <= MAX_SKIP_WALK:
                due, last, nxt = due + 1, nxt, _next(plan, nxt)
        except ConfigError:
            pass                                # the walk that reaches it says so
        if due < 2:
            return
        self._catching_up.add(plan.name)
        count = f"more than {MAX_SKIP_WALK}" if due > MAX_SKIP_WALK else str(due)
        logger.info("%s: catching up %s slot(s) from %s to %s (catch_up='all', window %g s), one "
                    "every %g s; each is claimed as its own run, so one already sent is not "
                    "sent again", plan.name, count, log_time(first_ms), log_time(last),
                    plan.claim_late_ms / 1000, plan.catch_up_pace_ms / 1000)

    def _drop_stale_heads(self) -> None:
        while self._heap and self._pending.get(self._heap[0][2]) != self._heap[0][1]:
            heapq.heappop(self._heap)

    def _schedule_next(self, plan: EntryPlan, slot_ms: int, now_ms: int) -> None:
        """Push the slot after ``slot_ms``; slots that are already late (the process was paused,
        the clock jumped forward) are skipped, logged and recorded, never sent in a burst: past
        max_late, or for ``catch_up='all'`` past its window (the slots within it are claimed one
        by one, paced: :meth:`_push`)."""
        late: list[int] = []
        late_ms = plan.claim_late_ms
        try:
            nxt = _next(plan, slot_ms)
            while nxt is not None and now_ms - nxt > late_ms and len(late) < MAX_SKIP_WALK:
                late.append(nxt)
                nxt = _next(plan, nxt)
            if nxt is not None and now_ms - nxt > late_ms:
                nxt = _next(plan, now_ms - late_ms - 1)
        except ConfigError as exc:
            self._no_next(plan, exc)
            return
        finally:
            self.observer.slot_came(plan.name, late[-1] if late else slot_ms)
            if late:
                self.skips.late_local(plan, late, now_ms - late[0])
        if nxt is None:
            self._ended(plan)
            return
        self._push(plan, nxt, now_ms, paced=True)

    def _ended(self, plan: EntryPlan) -> None:
        """The entry has no slot left before its ``end_at``: no further run (logged once per
        plan at INFO; an update that moves ``end_at`` later re-seeds it)."""
        self._pending.pop(plan.name, None)
        self.observer.no_next_slot(plan.name)
        if self._ended_logged.get(plan.name) is not plan:
            self._ended_logged[plan.name] = plan
            logger.info("anarchon: entry %s has no more slots: it ended at %s (its end_at)",
                        plan.name, log_time(plan.slots.window.end_ms))

    def _no_next(self, plan: EntryPlan, exc: ConfigError) -> None:
        """The entry's next slot cannot be computed: logged, and no further run here (a slot
        past the year 9999 never comes; a schedule class that failed is fixed by a restart)."""
        self._pending.pop(plan.name, None)
        logger.error("%s: no further run on this instance: its next slot cannot be computed "
                     "(%s); the other entries run", plan.name, exc)
