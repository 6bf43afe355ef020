"""Takeovers (docs/design.md "Leases", "Takeover"): every heartbeat, at a random offset within one,
the leased runs of this instance's entries whose runner is presumed dead (lease expired) or whose
message never reached a worker (queued past its deadline) are taken over, one compare-and-set on
the expected token, and sent again as the next attempt. A started run is spared for a grace after
a store error (its runner's renewals probably failed too); a takeover whose answer did not come
back is asked again with the same expected token, and one attempt is never sent twice. Timed on
the monotonic clock. A takeover of a paused entry's run is refused by the store (the run ends
paused, recorded once), and a run-now request's run is never superseded by a scheduled slot."""
from __future__ import annotations

import collections
import dataclasses
import logging
import math
import random
import time
from typing import Callable

from celery_anarchon._util import log_time
from celery_anarchon.beat.engine.observe import NOOP, Observer
from celery_anarchon.beat.engine.outage import Outage
from celery_anarchon.beat.engine.sends import Send, SendQueue
from celery_anarchon.errors import StoreError
from celery_anarchon.schedule.plan import EntryPlan, task_id_for
from celery_anarchon.stores.base import ClaimStore, LeasedRun, RunState, TakeoverOutcome

logger = logging.getLogger(__name__)

#: the lease check's period when no entry is leased, seconds
IDLE_CHECK_S = 60.0
#: a takeover whose answer did not come back (StoreError) is asked again this often, seconds
TAKEOVER_RETRY_S = 0.5
#: takeovers this instance sent, remembered per run so that one attempt is never sent twice
MAX_TAKEN_KEPT = 10_000
#: after a store error, a started run whose lease ran out is not taken over until this many of
#: its heartbeats (plus 1 s) have passed: its runner's renewals probably failed too
STORE_GRACE_HEARTBEATS = 2
#: a takeover's outcome, as a lease event of the observer (REFUSED: nothing happened)
LEASE_EVENTS = {TakeoverOutcome.TAKEN: "taken_over", TakeoverOutcome.GIVEN_UP: "lost",
                TakeoverOutcome.SUPERSEDED: "superseded", TakeoverOutcome.PAUSED: "paused"}


@dataclasses.dataclass
class PendingTakeover:
    """A takeover asked of the store that raised StoreError: it may have committed with its reply
    lost. Asked again with the same expected token (a store recognises its own earlier takeover
    and answers TAKEN with the same record) until ``give_up_at``: the queue deadline that takeover
    would have set, after which any instance takes the run over anyway."""
    run: LeasedRun
    give_up_at: float            #: monotonic
    next_try: float              #: monotonic


def grace_s(plan: EntryPlan) -> float:
    """Seconds a started run of ``plan`` is not taken over after a store error."""
    return STORE_GRACE_HEARTBEATS * plan.timing.lease.heartbeat_s + 1.0


class Takeovers:
    """Lease checks, takeovers and the takeovers waiting for their answer.

    :param store: a store that holds leases (its ``leases`` part).
    :param namespace: ``anarchon_namespace``, part of every task id.
    :param monotonic: the clock of elapsed time.
    :param rng: the source of each check's random offset.
    :param stats: the engine's counters (``takeover_<outcome>``, ``takeover_deferred``, ...).
    :param outage: when the store last failed (the grace); a failure here is recorded there.
    :param sends: sends a taken-over attempt (and says whether beat is stopping).
    :param observer: told of the lease checks' round trips and of each takeover's outcome.
    """

    def __init__(self, store: ClaimStore, namespace: str, monotonic: Callable[[], float],
                 rng: random.Random, stats: collections.Counter, outage: Outage,
                 sends: SendQueue, *, observer: Observer = NOOP) -> None:
        self.store = store
        self.observer = observer
        self.namespace = namespace
        self.monotonic = monotonic
        self.rng = rng
        self.stats = stats
        self.outage = outage
        self.sends = sends
        self.pending: dict[tuple[str, int], PendingTakeover] = {}
        self._taken: collections.OrderedDict[tuple[str, int], int] = collections.OrderedDict()
        self.next_check = -math.inf           #: monotonic; -inf: due at the first tick

    def next_try(self) -> float | None:
        """The monotonic time of the next takeover asked again, if any."""
        return min(p.next_try for p in self.pending.values()) if self.pending else None

    def forget_removed(self, plans: dict[str, EntryPlan]) -> None:
        """Drop the pending takeovers of entries no longer in ``plans``."""
        for run in [r for r in self.pending if r[0] not in plans]:
            del self.pending[run]

    def check(self, plans: dict[str, EntryPlan]) -> None:
        """Take over the leased runs of ``plans`` whose runner is presumed dead (lease expired)
        or whose message never reached a worker (queued past its deadline). Every instance checks
        every heartbeat, at a random offset within one heartbeat; the store's compare-and-set on
        the expected token lets exactly one of them take a run over (docs/design.md "Takeover")."""
        now = self.monotonic()
        leased = [p for p in plans.values() if p.timing.lease is not None]
        if not leased:
            self.next_check = now + IDLE_CHECK_S
            return
        period = min(p.timing.lease.heartbeat_s for p in leased)
        self.next_check = (math.floor(now / period) + 1) * period + self.rng.uniform(0, period)
        try:
            started = time.perf_counter()
            expired = self.store.leases.expired_runs([p.name for p in leased])
            self.observer.store_round_trip("lease_check", time.perf_counter() - started)
        except StoreError as exc:
            self.outage.last_error_at = now
            logger.debug("lease check failed: %s", exc)
            return
        for run in expired:
            plan = plans.get(run.entry)
            if plan is None or plan.timing.lease is None:
                continue
            pending = self.pending.get((run.entry, run.slot_ms))
            if pending is not None and pending.run.token == run.token:
                continue                       # asked again by retry()
            if not self._deferred(plan, run, now):
                self._take_over(plan, run)

    def retry(self, plans: dict[str, EntryPlan]) -> None:
        """Ask again the takeovers whose answer did not come back, with their expected token."""
        if not self.pending:
            return
        now = self.monotonic()
        for key, pending in list(self.pending.items()):
            plan = plans.get(key[0])
            if plan is None or plan.timing.lease is None:
                del self.pending[key]
            elif now > pending.give_up_at:
                del self.pending[key]
                self.stats["takeover_unanswered"] += 1
                logger.warning("%s: slot %s: the takeover of attempt %d got no answer from the store "
                               "until its queue deadline; the run is taken over again once it "
                               "shows expired", key[0], log_time(key[1]), pending.run.attempt)
            elif now >= pending.next_try:
                if self._deferred(plan, pending.run, now):
                    pending.next_try = self.outage.last_error_at + grace_s(plan)
                else:
                    self._take_over(plan, pending.run)

    def _deferred(self, plan: EntryPlan, run: LeasedRun, now: float) -> bool:
        """True (and counted) when a started run must not be taken over yet: the store failed for
        us moments ago (monotonic ``now``), so it probably failed for the runner too, and its lease
        may have run out only because its renewals could not get through. A live runner gets
        2 heartbeats + 1 s to renew (or release) before it is presumed dead."""
        last_error_at = self.outage.last_error_at
        if run.state is not RunState.STARTED or now - last_error_at >= grace_s(plan):
            return False
        self.stats["takeover_deferred"] += 1
        logger.debug("%s: slot %s: takeover deferred, the store was unreachable %.1f s ago",
                     run.entry, log_time(run.slot_ms), now - last_error_at)
        return True

    def _take_over(self, plan: EntryPlan, run: LeasedRun) -> None:
        if self.sends.stopped:
            return
        lease = plan.timing.lease
        key = (run.entry, run.slot_ms)
        # a takeover always makes the attempt after the expired one (a retry of this instance's
        # own takeover answers the record it made): that attempt's task id goes in the history
        task_id = task_id_for(self.namespace, plan.name, run.slot_ms, run.attempt + 1)
        try:
            outcome, new = self.store.leases.take_over(
                run.entry, run.slot_ms, run.token, queue_timeout_ms=int(lease.queue_timeout_s * 1000),
                max_attempts=lease.max_attempts, task_id=task_id)
        except StoreError as exc:
            # it may have committed with its reply lost: ask again with the same expected token
            # (the store answers TAKEN again with the same record), never burn an attempt
            now = self.monotonic()
            self.outage.last_error_at = now
            pending = self.pending.get(key)
            if pending is None or pending.run.token != run.token:
                pending = PendingTakeover(run, give_up_at=now + lease.queue_timeout_s, next_try=now)
                logger.info("%s: slot %s: the takeover of attempt %d got no answer (%s); asking "
                            "again", run.entry, log_time(run.slot_ms), run.attempt, exc)
            else:
                logger.debug("takeover of %s slot %s failed again: %s", run.entry,
                             log_time(run.slot_ms), exc)
            pending.next_try = now + TAKEOVER_RETRY_S
            self.pending[key] = pending
            return
        retried = self.pending.pop(key, None) is not None
        self.stats[f"takeover_{outcome.value}"] += 1
        if outcome is not TakeoverOutcome.REFUSED:
            self.observer.lease(LEASE_EVENTS[outcome])
        if retried and outcome is TakeoverOutcome.REFUSED:
            logger.info("%s: slot %s: the takeover of attempt %d, asked again after its answer was "
                        "lost, was refused: another instance took the run over, its runner renewed, "
                        "or the store cannot recognise its own earlier takeover", plan.name,
                        log_time(run.slot_ms), run.attempt)
        if run.state is RunState.QUEUED:
            why = (f"it was queued past its deadline without a worker adopting it: is a worker "
                   f"consuming its queue, and does the workers' app call celery_anarchon.install(app)?")
        else:
            why = f"its runner {run.owner} stopped renewing its lease (presumed dead)"
        if outcome is TakeoverOutcome.TAKEN:
            log = logger.error if run.state is RunState.QUEUED else logger.warning
            if self._taken.get(key, 0) >= new.attempt:     # at most one send per attempt
                logger.debug("%s: slot %s attempt %d was already sent here", plan.name,
                             log_time(run.slot_ms), new.attempt)
                return
            self._taken[key] = new.attempt
            self._taken.move_to_end(key)
            while len(self._taken) > MAX_TAKEN_KEPT:
                self._taken.popitem(last=False)
            log("%s: slot %s attempt %d taken over as attempt %d: %s", plan.name,
                log_time(run.slot_ms), run.attempt, new.attempt, why)
            self.sends.send(Send(plan, run.slot_ms, new.attempt, new.token,
                                 task_id_for(self.namespace, plan.name, run.slot_ms, new.attempt),
                                 give_up_at=self.monotonic() + plan.timing.max_late_s))
        elif outcome is TakeoverOutcome.PAUSED:
            logger.warning("%s: slot %s attempt %d not taken over: the entry is paused, so the run "
                           "ends (recorded paused; not caught up after the resume). %s",
                           plan.name, log_time(run.slot_ms), run.attempt, why[0].upper() + why[1:])
        elif outcome is TakeoverOutcome.GIVEN_UP and (new or run).attempt < lease.max_attempts:
            # attempts left: the store refused the takeover because it may have lost writes to
            # the run's record since it was claimed (an epoch change or amnesia: a release or an
            # adoption it no longer has); its history detail says which (docs/design.md "Leases")
            logger.error("%s: slot %s attempt %d recorded lost, not taken over: the store may "
                         "have lost writes to its record since it was claimed, so the run may "
                         "still be running or may have finished (a possible miss, never a second "
                         "run)%s", plan.name, log_time(run.slot_ms), run.attempt,
                         self._history_detail(run))
        elif outcome is TakeoverOutcome.GIVEN_UP:
            logger.error("%s: slot %s recorded lost after %d attempts: %s", plan.name,
                         log_time(run.slot_ms), run.attempt, why)
        elif outcome is TakeoverOutcome.SUPERSEDED:
            logger.info("%s: slot %s superseded by a newer slot instead of a takeover (%s)",
                        plan.name, log_time(run.slot_ms), why)

    def _history_detail(self, run: LeasedRun) -> str:
        """``": <detail>"`` of the run's history record (one read, best effort), or ""."""
        try:
            records = self.store.history.read(run.entry, 50)
        except StoreError:
            return ""
        detail = next((r.detail for r in records if r.slot_ms == run.slot_ms), "")
        return f": {detail}" if detail else ""
