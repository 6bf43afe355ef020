"""Claim requests, and the claims that wait for the store: a claim that could not reach the
store is asked again (the store recognises its own winner) until its slot's max_late, then
given up, logged and noted in history (never sent blind)."""
from __future__ import annotations

import collections
import logging

from celery_anarchon._util import log_time
from celery_anarchon.beat.engine.notes import NoteBuffer
from celery_anarchon.beat.engine.observe import NOOP, UNREACHABLE, Observer
from celery_anarchon.beat.engine.outage import Outage
from celery_anarchon.schedule.plan import EntryPlan, task_id_for
from celery_anarchon.schedule.slots import outside
from celery_anarchon.stores.base import ClaimRequest, ClaimStore, RunEvent

logger = logging.getLogger(__name__)


def claim_request(namespace: str, plan: EntryPlan, slot_ms: int) -> ClaimRequest:
    """The claim of ``plan``'s run at ``slot_ms`` (first attempt), claimable up to the plan's
    :attr:`~celery_anarchon.schedule.plan.EntryPlan.claim_late_ms` after its slot (max_late, or
    the window of ``catch_up='all'``: lateness-checking stores check it on their clock)."""
    return ClaimRequest(entry=plan.name, slot_ms=slot_ms, max_late_ms=plan.claim_late_ms,
                        task_id=task_id_for(namespace, plan.name, slot_ms, 1),
                        fingerprint=plan.fingerprint, lease=plan.lease_terms)


class ClaimRetries:
    """Claims waiting for the store, one per run (``(entry, slot_ms)``).

    :param store: the store (its masked URL in the logs).
    :param instance_id: this instance's id, in the notes.
    :param stats: the engine's counters (``store_unreachable``).
    :param notes: the history-note buffer.
    :param outage: says when the store may be asked again.
    :param observer: told of the claims given up.
    """

    def __init__(self, store: ClaimStore, instance_id: str, stats: collections.Counter,
                 notes: NoteBuffer, outage: Outage, *, observer: Observer = NOOP) -> None:
        self.store = store
        self.observer = observer
        self.instance_id = instance_id
        self.stats = stats
        self.notes = notes
        self.outage = outage
        self.waiting: dict[tuple[str, int], ClaimRequest] = {}
        #: entry -> when (wall clock, epoch seconds) a held claim of a ``catch_up='all'`` entry
        #: was last handed back to be retried (:meth:`_paced`)
        self._released: dict[str, float] = {}
        #: the history detail of every run given up
        self._unreachable = f"{instance_id} could not reach the store"

    def __bool__(self) -> bool:
        return bool(self.waiting)

    def __contains__(self, run: tuple[str, int]) -> bool:
        return run in self.waiting

    def hold(self, requests: list[ClaimRequest]) -> None:
        """Keep ``requests`` until the store answers (a later copy of a run replaces the earlier)."""
        for request in requests:
            self.waiting[request.run] = request

    def behind(self, requests: list[ClaimRequest],
               plans: dict[str, EntryPlan]) -> list[ClaimRequest]:
        """The runs to claim now, of ``requests`` (come due in the heap): a run of a
        ``catch_up='all'`` entry that has runs held here waits behind them (it is held too), so
        that entry's runs are claimed oldest first (:meth:`_paced`), as a catch-up at start-up
        claims them."""
        if not self.waiting:
            return requests
        held = {entry for entry, _ in self.waiting}
        out = []
        for request in requests:
            plan = plans.get(request.entry)
            if request.entry in held and plan is not None and plan.timing.catch_up == "all":
                self.waiting[request.run] = request
            else:
                out.append(request)
        return out

    def answered(self, run: tuple[str, int]) -> None:
        """The store answered the claim of ``run``."""
        self.waiting.pop(run, None)

    def due(self, now: float, plans: dict[str, EntryPlan], prepared: bool) -> list[ClaimRequest]:
        """Claims that waited for the store: those still within max_late (wall clock ``now``)
        are returned to be retried when the store may answer again (prepared, backoff over);
        the others are given up, logged and noted in history. Entries gone from ``plans`` are
        dropped, and so are slots outside the entry's window (an update moved its ``start_at`` /
        ``end_at`` while the claim waited)."""
        if not self.waiting:
            return []
        now_ms = int(now * 1000)
        retry, given_up = [], []
        for run, request in list(self.waiting.items()):
            if request.entry not in plans:
                del self.waiting[run]
            elif not request.requested and outside(plans[request.entry].slots, request.slot_ms):
                del self.waiting[run]          # the entry's start_at / end_at changed since
                logger.info("%s: slot %s is outside the entry's start_at / end_at now: not "
                            "claimed", request.entry, log_time(request.slot_ms))
            elif now_ms - request.slot_ms > request.max_late_ms:
                del self.waiting[run]
                given_up.append(request)
                self.observer.claimed(request.entry, UNREACHABLE)
                self.notes.add_unreachable(request.entry, request.slot_ms, self._unreachable)
            else:
                retry.append(request)
        if given_up:
            self.stats["store_unreachable"] += len(given_up)
            first = min(given_up, key=lambda r: r.slot_ms)
            logger.error("%d run(s) of %d entries not claimed: the store %s could not be reached "
                         "until their max_late (the first: %s slot %s); skipped, never sent blind.",
                         len(given_up), len({r.entry for r in given_up}), self.store.safe_url,
                         first.entry, log_time(first.slot_ms))
        if not prepared or not self.outage.may_try():
            return []
        return self._paced(retry, plans, now)

    def _paced(self, retry: list[ClaimRequest], plans: dict[str, EntryPlan],
               now: float) -> list[ClaimRequest]:
        """The claims to retry now: of a ``catch_up='all'`` entry, whose held runs can reach back
        its whole window (a long store outage), the oldest only, a pace
        (:attr:`EntryPlan.catch_up_pace_ms`) after the one before, as a catch-up at start-up
        sends them; the others (and run-now requests) all at once."""
        out, seen = [], set()
        for request in sorted(retry, key=lambda r: r.slot_ms):
            plan = plans[request.entry]
            if plan.timing.catch_up != "all" or request.requested:
                out.append(request)
                continue
            if request.entry in seen:
                continue
            seen.add(request.entry)
            last = self._released.get(request.entry)
            if last is not None and last <= now < last + plan.catch_up_pace_ms / 1000:
                continue
            self._released[request.entry] = now
            out.append(request)
        return out
