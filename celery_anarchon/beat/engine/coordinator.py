"""The engine's coordinator: one tick of docs/design.md "One run, in time", told through its parts."""
from __future__ import annotations

import logging
import random
import time
from typing import Callable

from celery_anarchon.beat.engine.chunks import ClaimChunks
from celery_anarchon.beat.engine.claims import ClaimRetries
from celery_anarchon.beat.engine.counters import Counters
from celery_anarchon.beat.engine.definitions import Definitions
from celery_anarchon.beat.engine.due import DueRuns
from celery_anarchon.beat.engine.follow import StoreFollow
from celery_anarchon.beat.engine.gaps import GapCheck
from celery_anarchon.beat.engine.notes import NoteBuffer
from celery_anarchon.beat.engine.observe import NOOP, Observer
from celery_anarchon.beat.engine.outage import Outage
from celery_anarchon.beat.engine.pace import Pace
from celery_anarchon.beat.engine.sends import SendBatchFn, SendFn, SendQueue
from celery_anarchon.beat.engine.skew import SkewCheck
from celery_anarchon.beat.engine.skips import SkipLog
from celery_anarchon.beat.engine.sync import BuildStorePlans
from celery_anarchon.beat.engine.takeovers import Takeovers
from celery_anarchon.errors import ConfigError, StoreError
from celery_anarchon.schedule.plan import EntryPlan
from celery_anarchon.stores.base import ClaimRequest, ClaimStore

logger = logging.getLogger(__name__)

#: the longest single sleep: a long wait is a chain of these, each re-reading the clock
MAX_SLEEP_S = 60.0


class Engine:
    """Due runs, claims and sends for the plans of one beat instance.

    :param store: the claim store (opened lazily by its first operation).
    :param plans: entry name -> plan, of the config (``beat_schedule``) entries.
    :param instance_id: this instance's id, recorded with its claims.
    :param namespace: ``anarchon_namespace``, part of every task id.
    :param send: publishes one won run; raises when the send failed (it is retried).
    :param clock: the wall clock, seconds since the epoch (``time.time``): when a slot is due
        and whether it is late; tests pass their own.
    :param monotonic: a clock for elapsed time, seconds from any origin (``time.monotonic``):
        every backoff, retry, wait and lease-check deadline; tests pass their own.
    :param rng: the jitter source (default: the operating system's, never shared by forks).
    :param sync_interval_s: ``anarchon_sync_interval``, seconds: on an
        store with an ``instances`` part, how often this instance's heartbeat is written, and on
        one with an ``entries`` part how often the store's entries, pauses and run-now requests
        are followed too; ``None`` (or another store): the engine runs ``plans`` only.
    :param build_store_plans: store entries -> plans (the scheduler's; ``None``: store entries
        are not run).
    :param observer: told what happens (claims, sends, leases, the store's round trips and
        reachability, the live instances), for metrics; default: nobody.
    :param send_batch: the scheduler's send batch (:data:`~celery_anarchon.beat.engine.sends.SendBatchFn`):
        the won runs of one claim chunk are published in one; ``None``: one at a time.
    """

    def __init__(self, store: ClaimStore, plans: dict[str, EntryPlan], *, instance_id: str,
                 namespace: str, send: SendFn, clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None,
                 monotonic: Callable[[], float] = time.monotonic,
                 sync_interval_s: float | None = None,
                 build_store_plans: BuildStorePlans | None = None,
                 observer: Observer | None = None,
                 send_batch: SendBatchFn | None = None) -> None:
        self.store = store
        self.observer = observer = observer or NOOP
        observer.entries(plans)
        self.config_plans = dict(plans)
        self.plans = dict(plans)            #: what runs: the config plans and the store's
        self._any_leased = _any_leased(self.plans)
        self.instance_id = instance_id
        self.namespace = namespace
        self.clock = clock
        self.monotonic = monotonic
        rng = rng or random.SystemRandom()
        self.counters = Counters(monotonic)
        self.stats = stats = self.counters.counts
        self.outage = Outage(store, monotonic, stats, observer=observer)
        self.notes = NoteBuffer(store, self.outage)
        self.skips = SkipLog(store, instance_id, monotonic, stats, self.notes, observer=observer,
                             clock=clock)
        self.claims = ClaimRetries(store, instance_id, stats, self.notes, self.outage,
                                   observer=observer)
        self.due = DueRuns(namespace, rng, self.skips, self.claims, observer=observer)
        self.sends = SendQueue(send, clock, monotonic, stats, self.notes, observer=observer,
                               batch=send_batch)
        self.pace = Pace(monotonic)
        self.takeovers = Takeovers(store, namespace, monotonic, rng, stats, self.outage,
                                   self.sends, observer=observer)
        self.skew = SkewCheck(store, clock, monotonic)
        self.definitions = Definitions(store)
        self.follow = StoreFollow(store, build_store_plans, sync_interval_s, namespace,
                                  instance_id=instance_id, clock=clock, monotonic=monotonic,
                                  outage=self.outage, requested=self.due.requested,
                                  skew=self.skew, notes=self.notes, observer=observer)
        #: the entry sync and the heartbeat (``None``: not on this store), the follow's parts
        self.sync, self.heartbeat = self.follow.sync, self.follow.heartbeat
        self.gaps = GapCheck(store, instance_id, clock, monotonic, self.outage, follow=self.follow,
                             observer=observer)     #: missed slots recorded, once settled
        self.chunks = ClaimChunks(store, namespace, monotonic, stats, clock=clock, pace=self.pace,
                                  claims=self.claims, due=self.due, sends=self.sends,
                                  outage=self.outage, notes=self.notes, skips=self.skips,
                                  definitions=self.definitions, sync=self.sync, observer=observer)
        self._prepared = False
        self._seeded = False
        self._stopping = False

    @property
    def send(self) -> SendFn:
        """The send callback (replaceable: tests and fault injection wrap it)."""
        return self.sends.send_fn

    @send.setter
    def send(self, send: SendFn) -> None:
        self.sends.send_fn = send

    @property
    def rng(self) -> random.Random:
        """The jitter source, shared by the heap and the lease checks' offsets."""
        return self.due.rng

    @rng.setter
    def rng(self, rng: random.Random) -> None:
        self.due.rng = self.takeovers.rng = rng

    # -- public ------------------------------------------------------------------------------
    def tick(self) -> float:
        """Do what is due now; return the seconds to sleep before the next tick (0 < s <= 60)."""
        if self._stopping:
            return MAX_SLEEP_S
        now = self.clock()
        self.observer.ticked(now)
        if not self._seeded:                   # 7. at start-up, the newest slot within max_late
            self._seeded = True
            for plan in self.plans.values():
                self.due.seed(plan, now)
        if not self._prepared:
            self._prepare()
        requested = self._follow_store(now)    # the store's entries, pauses, run-now requests
        due = self.due.pop(now, self.plans)    # 1-2. slot + jitter came; late ones skipped
        if not self._prepared:                 # no store yet: the runs wait, never sent blind
            self.claims.hold(due)
            due = []
        due.extend(requested)
        due.extend(self.claims.due(now, self.plans, self._prepared))
        if due:                                # 3-4. in chunks; the won ones are sent
            self.chunks.claim(due, self.plans, self.config_plans)
        if self._stopping:                     # close() ran during the claim's sends
            return MAX_SLEEP_S
        self.sends.retry(now)                  # 5. failed sends retried until max_late
        self.notes.flush()                     # 9. outcomes in the store's history
        self.skips.flush()                     # skips hidden by the log's rate limit
        self._periodic()
        return self._delay(self.clock())       # 6. never more than 60 s

    def stop(self) -> None:
        """Send nothing more (beat is shutting down, possibly from a signal handler in the middle
        of a tick). A run won but not yet sent stays claimed without a send: the guarantee's
        "winner dying between its claim and its send"; a leased one is taken over."""
        self._stopping = True
        self.chunks.stop()
        self.sends.stop()

    def update_plans(self, plans: dict[str, EntryPlan]) -> None:
        """Replace the config plans (``beat_schedule`` changed); the store's entries are kept
        (a config entry wins a name clash). See :meth:`_set_plans`."""
        self.config_plans = dict(plans)
        self._set_plans(self.sync.merge(self.config_plans) if self.sync else self.config_plans)

    def close(self) -> None:
        """Write a stopped tick's notes (its sends: sent) and leave the instances. Never raises."""
        self.notes.flush()
        self.follow.leave()

    def next_fire(self) -> float | None:
        """When the next pending run fires (epoch seconds), for tests and the banner."""
        return self.due.next_fire()

    def start(self) -> bool:
        """Prepare the store at start-up. An unreachable store is logged and retried by the
        ticks (beat keeps running, sends nothing); a store that can never serve this
        configuration (a server too old, an option that contradicts the live store) raises.

        :raises ConfigError: the store refused the configuration.
        :returns: whether the store is ready.
        """
        return self._prepare(at_start_up=True)

    # -- the steps ------------------------------------------------------------------------------
    def _prepare(self, at_start_up: bool = False) -> bool:
        if not self.outage.may_try():
            return False
        try:
            warnings = self.store.prepare(list(self.plans))
            self.definitions.save_all(self.config_plans.values())
        except StoreError as exc:
            self.outage.failed(exc, "preparing the store")
            return False
        except ConfigError as exc:
            if at_start_up:
                raise
            self.outage.refused(exc)
            return False
        for warning in warnings:
            if self.store.safe_url in warning:   # most name the store already: not twice
                logger.warning("anarchon: %s", warning)
            else:
                logger.warning("anarchon store %s: %s", self.store.safe_url, warning)
        self.outage.recovered()
        self._prepared = True
        self.skew.check(self.plans.values())
        return True

    def _set_plans(self, plans: dict[str, EntryPlan]) -> None:
        """Run ``plans``: new or changed entries are seeded anew by their catch-up policy (by
        default the newest slot within max_late; never a slot this instance handled), removed ones are dropped; what
        this instance claimed is kept. A config entry's definition is saved (a store entry's is
        in the store already)."""
        old = self.plans
        self.plans = dict(plans)
        if set(old) != set(self.plans):
            self.observer.entries(self.plans)
        self._any_leased = _any_leased(self.plans)
        if not self._seeded:
            return
        now = self.clock()
        for name, plan in self.plans.items():
            if name not in old or old[name].fingerprint != plan.fingerprint:
                self.due.forget(name)
                self.due.seed(plan, now)
                if name in self.config_plans:
                    self.definitions.save(plan)
        for name in set(old) - set(self.plans):
            self.due.forget(name)
        self.takeovers.forget_removed(self.plans)

    def _follow_store(self, now: float) -> list[ClaimRequest]:
        """Every sync interval (:class:`~.follow.StoreFollow`): on an entry store, the store's
        entries (plans changed when their version moved), this instance's heartbeat, and the
        claims of the run-now requests; on an instance store that keeps no entries, the
        heartbeat alone."""
        if not self._prepared or not self.follow.due():
            return []
        plans = self.follow.moved(self.config_plans)
        if plans is not None:
            self._set_plans(plans)
        return self.follow.beat(now, self.config_plans, self.plans)

    def _periodic(self) -> None:
        now = self.monotonic()
        self.takeovers.retry(self.plans)
        if now >= self.takeovers.next_check:
            self.takeovers.check(self.plans)
        if now >= self.skew.next_check:
            self.skew.check(self.plans.values())
        self.counters.report_if_due(now)
        if self._prepared:                     # 7. slots no instance claimed: recorded missed
            self.gaps.check_if_due(self.plans, self.config_plans)

    def _delay(self, now: float) -> float:
        """Seconds until the next thing to do: the next slot (wall clock ``now``) or the next
        retry or check (monotonic), at most 60 s."""
        mono = self.monotonic()
        waits = [MAX_SLEEP_S]
        nxt = self.next_fire()
        if nxt is not None:
            waits.append(nxt - now)
        if self.claims or not self._prepared:
            waits.append(max(self.outage.retry_at - mono, 0.05))
        for retry_at in (self.sends.next_try(), self.takeovers.next_try()):
            if retry_at is not None:
                waits.append(retry_at - mono)
        if self.notes:
            waits.append(1.0)
        for at in ((self.follow.next_try(), self.gaps.next_try(self.plans)) if self._prepared
                   else ()):
            if at is not None:
                waits.append(max(at - mono, 0.05))
        if self._any_leased:
            waits.append(max(self.takeovers.next_check - mono, 0.01))
        return min(max(min(waits), 0.001), MAX_SLEEP_S)


def _any_leased(plans: dict[str, EntryPlan]) -> bool:
    """Whether some plan is leased (the lease checks then time the ticks); computed when the
    plans change, never per tick."""
    return any(p.timing.lease is not None for p in plans.values())
