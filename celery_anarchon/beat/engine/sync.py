"""Following the store's entries (its :class:`~celery_anarchon.stores.entry_store.Entries` part):
every ``anarchon_sync_interval`` on the monotonic clock one cheap read of the entries version;
when it moved (and at the first sync) every store entry, pause and run-now request is loaded,
the store entries become plans (through the scheduler's callback), and the run-now requests this
instance has not handled yet are claimed at once. Store errors go through the outage backoff.

Each read compares the store's entries epoch and version with the last ones loaded: an epoch
that vanished or changed, or a version that went back, is a loss (docs/design.md "Amnesia"), and
the instance keeps what it knew (:mod:`.kept`): its pauses (the engine refuses their runs here),
its store entries (they keep running) and the run-now runs it handled (never claimed again)."""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Callable

from celery_anarchon.schedule import timing
from celery_anarchon._util import log_time
from celery_anarchon.beat.engine.kept import KeptEntries, loss_of
from celery_anarchon.beat.engine.observe import NOOP, Observer
from celery_anarchon.beat.engine.outage import Outage
from celery_anarchon.errors import ConfigError, StoreError
from celery_anarchon.schedule.plan import EntryPlan, task_id_for
from celery_anarchon.schedule.slots import SlotsEnded
from celery_anarchon.beat.engine.notes import NoteBuffer
from celery_anarchon.stores.base import ClaimRequest, ClaimStore, RunEvent
from celery_anarchon.stores.entry_store import EntrySnapshot, Pause, RunRequest

logger = logging.getLogger(__name__)

#: store entries -> plans (the scheduler's callback): an invalid definition is logged by the
#: callback and left out, the others are returned
BuildStorePlans = Callable[[EntrySnapshot], "dict[str, EntryPlan]"]
#: run-now runs handled here that the store lost are kept this long past the store's memory, ms
#: (a request older than the memory is never loaded again)
KEPT_REQUEST_MARGIN_MS = 60_000
#: ... and a day when the store's memory is unbounded
KEPT_REQUEST_UNBOUNDED_MS = 86_400_000


class EntrySync:
    """The store's entries, pauses and run-now requests, as this instance last read them.

    :param store: a store that holds entries (its ``entries`` part).
    :param build_store_plans: store entries -> plans, or ``None`` (store entries are not run;
        pauses and run-now requests are still followed).
    :param interval_s: ``anarchon_sync_interval``, seconds.
    :param namespace: ``anarchon_namespace``, part of every task id.
    :param monotonic: the clock of elapsed time, seconds from any origin.
    :param outage: the store outage backoff (a failed sync backs off like any store operation).
    :param requested: the run-now runs ``(entry, slot_ms)`` this instance handled, shared with
        the heap of due runs (which never claims one of them as a scheduled run); kept here to
        the requests the store still holds, and those it lost (kept until they are older than
        the store's memory).
    :param instance_id: this instance's id (in the details of the runs of a kept pause).
    :param clock: the wall clock, epoch seconds.
    :param observer: told of losses and of what is kept.
    :param notes: the history-note buffer (a run-now request refused here is recorded in it).
    """

    def __init__(self, store: ClaimStore, build_store_plans: BuildStorePlans | None,
                 interval_s: float, namespace: str, monotonic: Callable[[], float],
                 outage: Outage, requested: set[tuple[str, int]], *, instance_id: str = "",
                 clock: Callable[[], float] = time.time, observer: Observer = NOOP,
                 notes: NoteBuffer | None = None) -> None:
        self.store = store
        self.notes = notes
        self.build_store_plans = build_store_plans
        self.interval_s = interval_s
        self.namespace = namespace
        self.monotonic = monotonic
        self.outage = outage
        self.version: int | None = None                 #: the entries version last loaded
        self.store_plans: dict[str, EntryPlan] = {}
        self.requests: tuple[RunRequest, ...] = ()
        #: run-now runs (entry, slot_ms) this instance claimed or let pass: never claimed again
        self.requested = requested
        self.next_sync = -math.inf                      #: monotonic; -inf: at the first tick
        self._synced_at = -math.inf                     #: monotonic: the last sync that answered
        self.clock = clock
        #: (entries epoch, version) last loaded; None before the first sync
        self.loaded: tuple[str, int] | None = None
        #: what this instance keeps from before a loss of the store's entries data
        self.kept = KeptEntries(instance_id, f"{store.safe_url} (namespace {namespace!r})", clock,
                                observer=observer)
        #: run-now runs handled here that the store lost: still never claimed again
        self.kept_requests: set[tuple[str, int]] = set()
        self._pauses: dict[str, Pause] = {}
        self._clashes: set[str] = set()
        #: store entry -> (its definition text, its plan with since_ms): :func:`_dated`
        self._dated_plans: dict[str, tuple[str, EntryPlan]] = {}

    def request_max_late_ms(self, plan: EntryPlan) -> int:
        """The max_late of a run-now claim of ``plan``'s entry, ms:
        :func:`~celery_anarchon.schedule.timing.run_now_span_s` (the entry's max_late, at least
        2 x the sync interval + :data:`~celery_anarchon.schedule.timing.RUN_NOW_MARGIN_S`)."""
        return timing.ms(timing.run_now_span_s(plan.timing.max_late_s, self.interval_s))

    def due(self) -> bool:
        """Whether a sync is due: its interval passed, or a store operation failed since the last
        sync (the store may have restarted and lost its entries: the sync comes before the next
        claims), and the store is not in its backoff."""
        return ((self.monotonic() >= self.next_sync or self._failed_since())
                and self.outage.may_try())

    def next_try(self) -> float:
        """The monotonic time of the next sync."""
        return max(-math.inf if self._failed_since() else self.next_sync, self.outage.retry_at)

    def resync(self) -> None:
        """Sync at the next tick, before its claims: the store answered that it forgot runs (its
        memory began again: it may have lost its entries and pauses too)."""
        self.next_sync = -math.inf

    def _failed_since(self) -> bool:
        return self.outage.last_error_at >= self._synced_at

    def follow(self) -> bool:
        """One sync: read the entries epoch and version; load everything when either moved (and
        at the first call), keeping what the store lost (:mod:`.kept`). A store error is logged
        and backed off (retried at the next :meth:`due`).

        :returns: whether a new snapshot was loaded (the plans may have changed).
        """
        try:
            mark = self.store.entries.entries_epoch()
            loaded = (mark.epoch, mark.version)
            snapshot = self.store.entries.load_entries() if loaded != self.loaded else None
        except StoreError as exc:
            self.outage.failed(exc, "syncing the store's entries")
            return False
        self.outage.recovered()
        self._synced_at = self.monotonic()
        self.next_sync = self._synced_at + self.interval_s
        if snapshot is None:
            return False
        loss = loss_of(self.loaded, (snapshot.epoch, snapshot.version))
        held = {(r.entry, r.slot_ms) for r in snapshot.requests}
        if loss is not None:
            self.kept_requests |= self.requested - held
        self._forget_old_requests()
        snapshot = self.kept.follow(snapshot, loss)
        old = self.store_plans
        self._dated_plans = (_dated(self.build_store_plans(snapshot), snapshot, self._dated_plans)
                             if self.build_store_plans else {})
        self.store_plans = {name: plan for name, (_, plan) in self._dated_plans.items()}
        self.requests = snapshot.requests
        self.requested &= held | self.kept_requests
        self._log_pauses(snapshot, old)
        self._log_sync(snapshot.version, old)
        self.version = snapshot.version
        self.loaded = (snapshot.epoch, snapshot.version)
        return True

    def paused(self, name: str) -> bool:
        """Whether entry ``name`` is paused, as this instance last synced the store (or as it
        keeps the pause from before the store lost it)."""
        return name in self._pauses or self.pause_detail(name) is not None

    def pause_of(self, name: str) -> Pause | None:
        """Entry ``name``'s pause as this instance last synced the store, or ``None``."""
        return self._pauses.get(name)

    def pause_detail(self, name: str) -> str | None:
        """The history detail of a run of ``name`` this instance refuses because it keeps the
        entry's pause from before the store lost it, or ``None`` (:meth:`.KeptEntries.pause_detail`)."""
        return self.kept.pause_detail(name) if self.kept.pauses else None

    def _forget_old_requests(self) -> None:
        """Drop the kept run-now runs older than the store's memory (never loaded again)."""
        if not self.kept_requests:
            self.kept.requests = 0
            return
        memory_s = self.store.memory.duration_s
        horizon = (timing.ms(memory_s) + KEPT_REQUEST_MARGIN_MS if memory_s
                   else KEPT_REQUEST_UNBOUNDED_MS)
        oldest = int(self.clock() * 1000) - horizon
        self.kept_requests = {run for run in self.kept_requests if run[1] >= oldest}
        self.kept.requests = len(self.kept_requests)

    def merge(self, config: dict[str, EntryPlan]) -> dict[str, EntryPlan]:
        """The plans to run: ``config`` (``beat_schedule``) and the store's entries; a config
        entry wins a name clash here (logged once per clash, with both definitions). The
        instances whose beat_schedule lacks the name run the store's: the heartbeat names them
        (:class:`~celery_anarchon.beat.engine.instances.Heartbeat`)."""
        clashes = set(config) & set(self.store_plans)
        for name in sorted(clashes - self._clashes):
            ours, stored = config[name], self.store_plans[name]
            logger.warning("anarchon: store entry %r has the name of a beat_schedule entry: here "
                           "the beat_schedule one runs (%s: %s) and the store's is ignored (%s: "
                           "%s); an instance whose beat_schedule lacks it runs the store's. Fix: "
                           "keep one definition under this name: remove the store entry or the "
                           "beat_schedule entry, or rename one of them.", name, ours.fingerprint,
                           ours.definition, stored.fingerprint, stored.definition)
        self._clashes = clashes
        plans = dict(config)
        plans.update((n, p) for n, p in self.store_plans.items() if n not in config)
        return plans

    def requests_due(self, now: float, plans: dict[str, EntryPlan]) -> list[ClaimRequest]:
        """The claims of the run-now requests not handled here yet, of entries in ``plans``, each
        with max_late :meth:`request_max_late_ms`; a request already past it
        on the wall clock ``now`` (another instance ran it) and one whose slot is a scheduled
        slot of its entry (that run is the schedule's) are let pass. A request of an entry whose
        runs the store remembers by count for less than that max_late
        (:func:`~celery_anarchon.schedule.timing.check_run_now`) is refused: logged (ERROR) and recorded
        in the history as forgotten, never claimed (a late claim could win it a second time).
        Each is asked once."""
        now_ms = int(now * 1000)
        claims = []
        for request in self.requests:
            run = (request.entry, request.slot_ms)
            plan = plans.get(request.entry)
            if plan is None or run in self.requested:
                continue
            self.requested.add(run)
            max_late_ms = self.request_max_late_ms(plan)
            refusal = self._refusal(plan, request)
            if refusal is not None:
                logger.error("anarchon: entry %s: run-now request %s by %s is not claimed (slot "
                             "%s): %s", request.entry, request.request_id, request.by,
                             log_time(request.slot_ms), refusal)
                if self.notes is not None:
                    self.notes.add(plan.name, request.slot_ms, RunEvent.FORGOTTEN, detail=refusal,
                                   task_id=task_id_for(self.namespace, plan.name,
                                                       request.slot_ms, 1))
            elif now_ms - request.slot_ms > max_late_ms:
                logger.debug("%s: run-now request %s is past its max_late here", request.entry,
                             request.request_id)
            elif _scheduled(plan, request.slot_ms):
                logger.debug("%s: run-now request %s is a scheduled slot: the schedule runs it",
                             request.entry, request.request_id)
            else:
                logger.info("anarchon: entry %s: run-now request %s by %s, slot %s", request.entry,
                            request.request_id, request.by, log_time(request.slot_ms))
                claims.append(ClaimRequest(
                    entry=plan.name, slot_ms=request.slot_ms, max_late_ms=max_late_ms,
                    task_id=task_id_for(self.namespace, plan.name, request.slot_ms, 1),
                    fingerprint=plan.fingerprint, lease=plan.lease_terms, requested=True))
        return claims

    def _refusal(self, plan: EntryPlan, request: RunRequest) -> str | None:
        """Why ``request`` (of ``plan``'s entry) is not claimed here, or ``None``: a store that
        remembers fewer of the entry's runs than the request's max_late spans, counting the
        entry's requests whose slots come within that span before its slot
        (:func:`~celery_anarchon.schedule.timing.check_run_now`; every instance that loaded the request
        loaded those too, so each decides the same)."""
        memory = self.store.memory
        if memory.count is None:
            return None
        span_ms = self.request_max_late_ms(plan)
        others = sum(1 for r in self.requests if r.entry == request.entry
                     and request.slot_ms - span_ms < r.slot_ms < request.slot_ms)
        try:
            timing.check_run_now(plan.name, memory,
                                 shortest_gap_s=plan.slots.shortest_gap_ms / 1000,
                                 max_late_s=plan.timing.max_late_s,
                                 sync_interval_s=self.interval_s, others=others)
        except ConfigError as exc:
            return str(exc)
        return None

    def _log_pauses(self, snapshot: EntrySnapshot, old: dict[str, EntryPlan]) -> None:
        pauses = {name: stored.pause for name, stored in snapshot.entries.items()
                  if stored.pause is not None}
        for name in sorted(pauses):
            if self._pauses.get(name) != pauses[name]:
                logger.info("anarchon: entry %s is %s", name, pauses[name].describe())
        for name in sorted(set(self._pauses) - set(pauses)):
            stored = snapshot.entries.get(name)
            if ((stored is None or stored.definition is None) and name in old
                    and name not in self.store_plans):
                continue                               # the store entry was removed
            logger.info("anarchon: entry %s is resumed%s", name,
                        f" by {stored.updated_by}" if stored is not None else "")
        self._pauses = pauses

    def _log_sync(self, version: int, old: dict[str, EntryPlan]) -> None:
        new = self.store_plans
        added = sorted(set(new) - set(old))
        removed = sorted(set(old) - set(new))
        changed = sorted(n for n in set(new) & set(old) if _what_runs(new[n]) != _what_runs(old[n]))
        logger.info("anarchon: synced entries version %d: +%d -%d ~%d (%d store entries)",
                    version, len(added), len(removed), len(changed), len(new))
        if added or removed or changed:
            logger.debug("anarchon: store entries added %s, removed %s, changed %s", added,
                         removed, changed)


def _dated(plans: dict[str, EntryPlan], snapshot: EntrySnapshot,
           known: dict[str, tuple[str, EntryPlan]]) -> dict[str, tuple[str, EntryPlan]]:
    """The store's ``plans``, each with :attr:`EntryPlan.since_ms`, by name with the definition
    text it was dated for: the store's clock at the write of its definition as this instance
    first loaded that text (an add or an update: ``updated_ms``; a later pause or resume leaves
    it; an instance that starts after one takes its time, and a catch-up sends no paused run
    anyway). ``known``: the same, from the sync before."""
    dated = {}
    for name, plan in plans.items():
        stored = snapshot.entries[name]
        kept = known.get(name)
        if kept is None or kept[0] != stored.definition:
            kept = (stored.definition, dataclasses.replace(plan, since_ms=stored.updated_ms))
        dated[name] = kept
    return dated


def _what_runs(plan: EntryPlan) -> tuple:
    """What a change of the entry can change: its definition (schedule, timing) and the message
    (args, kwargs, options), which the fingerprint leaves out."""
    entry = plan.entry
    return (plan.fingerprint, repr(getattr(entry, "args", None)),
            repr(getattr(entry, "kwargs", None)), repr(sorted((plan.celery_options or {}).items())))


def _scheduled(plan: EntryPlan, slot_ms: int) -> bool:
    """Whether ``slot_ms`` is a scheduled slot of ``plan``'s entry (a run-now request there is
    the schedule's run); past the entry's ``end_at`` none is."""
    try:
        return plan.slots.next_after(slot_ms - 1) == slot_ms
    except SlotsEnded:
        return False
