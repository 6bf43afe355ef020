"""The store followed every ``anarchon_sync_interval``: on an entry store, its entries, pauses and
run-now requests (:mod:`.sync`) and this instance's heartbeat (:mod:`.instances`); on an instance
store that keeps no entries, the heartbeat alone."""
from __future__ import annotations

from typing import Callable

from celery_anarchon.beat.engine.instances import TTL_INTERVALS, Heartbeat
from celery_anarchon.beat.engine.notes import NoteBuffer
from celery_anarchon.beat.engine.observe import Observer
from celery_anarchon.beat.engine.outage import Outage
from celery_anarchon.beat.engine.skew import SkewCheck
from celery_anarchon.beat.engine.sync import BuildStorePlans, EntrySync
from celery_anarchon.schedule.plan import EntryPlan
from celery_anarchon.stores.base import ClaimRequest, ClaimStore


class StoreFollow:
    """What this instance follows in the store, and when: the entry sync (``sync``, on a store
    with an ``entries`` part) and the heartbeat (``heartbeat``, on one with an ``instances``
    part), each ``None`` on a store without it or without ``sync_interval_s``. The engine asks
    only once the store is prepared.

    :param sync_interval_s: ``anarchon_sync_interval``, seconds: how often the store is followed
        (``None``: never).
    :param requested: the run-now runs ``(entry, slot_ms)`` this instance handled, shared with
        the heap of due runs (:class:`~.sync.EntrySync`).
    :param clock: the wall clock, seconds since the epoch.
    :param monotonic: seconds from any origin: when the store is followed next.
    """

    def __init__(self, store: ClaimStore, build_store_plans: BuildStorePlans | None,
                 sync_interval_s: float | None, namespace: str, *, instance_id: str,
                 clock: Callable[[], float], monotonic: Callable[[], float], outage: Outage,
                 requested: set[tuple[str, int]], skew: SkewCheck, notes: NoteBuffer,
                 observer: Observer) -> None:
        self.monotonic = monotonic
        self.sync: EntrySync | None = None
        self.heartbeat: Heartbeat | None = None
        self._beat_interval_s = sync_interval_s or 0.0
        self._beat_at = 0.0                 #: monotonic: the next heartbeat without a sync
        if store.entries is not None and sync_interval_s:
            self.sync = EntrySync(store, build_store_plans, sync_interval_s, namespace, monotonic,
                                  outage, requested, instance_id=instance_id, clock=clock,
                                  observer=observer, notes=notes)
        if store.instances is not None and sync_interval_s:
            self.heartbeat = Heartbeat(store, instance_id, clock,
                                       int(TTL_INTERVALS * sync_interval_s * 1000), outage, skew,
                                       observer=observer)

    def due(self) -> bool:
        """Whether the store is to be followed now (:meth:`moved`, then :meth:`beat`); a
        heartbeat without a sync is then timed from now."""
        if self.sync is not None:
            return self.sync.due()
        if self.heartbeat is None:
            return False
        mono = self.monotonic()
        if mono < self._beat_at:
            return False
        self._beat_at = mono + self._beat_interval_s
        return True

    def moved(self, config_plans: dict[str, EntryPlan]) -> dict[str, EntryPlan] | None:
        """The plans to run (the store's merged with ``config_plans``) when the store's entries
        version moved, else ``None``."""
        if self.sync is not None and self.sync.follow():
            return self.sync.merge(config_plans)
        return None

    def beat(self, now: float, config_plans: dict[str, EntryPlan],
             plans: dict[str, EntryPlan]) -> list[ClaimRequest]:
        """Write this instance's heartbeat; the claims of the run-now requests due at ``now``
        (wall clock) among ``plans``."""
        sync = self.sync
        if sync is None:
            self.heartbeat.beat(config_plans, len(plans))
            return []
        self.heartbeat.beat(config_plans, len(plans), sync.store_plans, kept=sync.kept.record())
        return sync.requests_due(now, plans)

    def next_try(self) -> float | None:
        """When the store is to be followed next (monotonic), or ``None``: never."""
        if self.sync is not None:
            return self.sync.next_try()
        return self._beat_at if self.heartbeat is not None else None

    def leave(self) -> None:
        """Drop this instance's heartbeat (beat is shutting down); a later beat writes it again.
        Never raises for a store error."""
        if self.heartbeat is not None:
            self.heartbeat.leave()
