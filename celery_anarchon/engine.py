"""The life of a run on one instance (DESIGN.md "One run, in time"), free of Celery.

The engine keeps a heap with one pending run per entry, fired at slot + jitter (jitter drawn per
run, per instance, from the operating system's random source, so forked processes never share a
sequence). Each tick claims every run that came due in one batch, sends the won ones through a
callback, and returns how long to sleep (never more than 60 s). It never sends a run without a won
claim: a store that cannot be reached means no sends (logged and retried until max_late).

Two injected clocks, so tests drive them: ``clock`` (the wall clock, seconds since the epoch)
decides what is due and what is late (slots are instants); ``monotonic`` (seconds, any origin)
times every "how long since / wait until": the store outage backoff, send retries, claim retry
waits, lease checks and their grace, takeover retries, log rate limits. A wall clock stepped back
or forward therefore never freezes a retry or a takeover, nor fires one early.
"""
from __future__ import annotations

import collections
import dataclasses
import heapq
import logging
import math
import os
import random
import time
from datetime import datetime, timezone
from typing import Callable

from celery_anarchon.errors import ConfigError, SendOutcomeUnknown, StoreError
from celery_anarchon.plan import EntryPlan, task_id_for
from celery_anarchon.stores.base import (
    ClaimRequest, ClaimResult, HistoryNote, LeasedRun, Outcome, RunState, Store, TakeoverOutcome,
    RunEvent,
)

logger = logging.getLogger("celery_anarchon.scheduler")

#: the longest single sleep: a long wait is a chain of these, each re-reading the clock
MAX_SLEEP_S = 60.0
#: how often the skew to the store's clock is measured and logged, seconds
SKEW_EVERY_S = 300.0
#: how often counters are logged at INFO, seconds
STATS_EVERY_S = 300.0
#: store outage backoff, seconds (first, factor 2, cap)
BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.5, 10.0
#: while the store stays unreachable, an error is logged again this often, seconds
DOWN_REPORT_EVERY_S = 60.0
#: a skip of the same kind on the same entry is logged at most this often (the rest at debug)
SKIP_LOG_EVERY_S = 60.0
#: a failed send is retried at most this often, seconds
SEND_RETRY_S = 1.0
#: a takeover whose answer did not come back (StoreError) is asked again this often, seconds
TAKEOVER_RETRY_S = 0.5
#: takeovers this instance sent, remembered per run so that one attempt is never sent twice
MAX_TAKEN_KEPT = 10_000
#: at most this many slots skipped in one go are walked one by one (the rest are counted)
MAX_SKIP_WALK = 10_000
#: history notes kept while the store is unreachable
MAX_PENDING_NOTES = 10_000

#: after a store error, a started run whose lease ran out is not taken over until this many of
#: its heartbeats (plus 1 s) have passed: its runner's renewals probably failed too
STORE_GRACE_HEARTBEATS = 2
#: fault injection for tests: the name of an entry after whose won claim the process exits at once,
#: before sending (a beat killed between its claim and its send)
EXIT_AFTER_CLAIM_ENV = "ANARCHON_TEST_EXIT_AFTER_CLAIM"

#: the send callback: (plan, slot_ms, attempt, token or None, task_id) -> None; raises on failure
SendFn = Callable[[EntryPlan, int, int, "int | None", str], None]


def iso(ms: int) -> str:
    """UTC ms as ISO 8601 with milliseconds, for logs."""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")


@dataclasses.dataclass
class _Send:
    plan: EntryPlan
    slot_ms: int
    attempt: int
    token: int | None
    task_id: str
    deadline_ms: int = 0         #: give up after this (UTC ms, wall clock): slot + max_late
    #: a takeover's send gives up at this monotonic time instead (max_late after the takeover)
    give_up_at: float | None = None
    next_try: float = 0.0        #: monotonic time of the next try
    error: str = ""

    def __post_init__(self) -> None:
        if not self.deadline_ms:
            self.deadline_ms = self.slot_ms + self.plan.max_late_ms


@dataclasses.dataclass
class _PendingTakeover:
    """A takeover asked of the store that raised StoreError: it may have committed with its reply
    lost. Asked again with the same expected token (a store recognises its own earlier takeover
    and answers TAKEN with the same record) until ``give_up_at``: the queue deadline that takeover
    would have set, after which any instance takes the run over anyway."""
    run: LeasedRun
    give_up_at: float            #: monotonic
    next_try: float              #: monotonic


class Engine:
    """Due runs, claims and sends for the plans of one beat instance.

    :param store: the claim store (opened lazily by its first operation).
    :param plans: entry name -> plan.
    :param instance_id: this instance's id, recorded with its claims.
    :param namespace: ``anarchon_namespace``, part of every task id.
    :param send: publishes one won run; raises when the send failed (it is retried).
    :param clock: the wall clock, seconds since the epoch (``time.time``): when a slot is due
        and whether it is late; tests pass their own.
    :param monotonic: a clock for elapsed time, seconds from any origin (``time.monotonic``):
        every backoff, retry, wait and lease-check deadline; tests pass their own.
    :param rng: the jitter source (default: the operating system's, never shared by forks).
    """

    def __init__(self, store: Store, plans: dict[str, EntryPlan], *, instance_id: str,
                 namespace: str, send: SendFn, clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.plans = dict(plans)
        self.instance_id = instance_id
        self.namespace = namespace
        self.send = send
        self.clock = clock
        self.monotonic = monotonic
        self.rng = rng or random.SystemRandom()
        self.stats: collections.Counter = collections.Counter()
        self._heap: list[tuple[float, int, str]] = []
        self._pending: dict[str, int] = {}            # entry -> the slot waiting in the heap
        self._last_claimed: dict[str, int] = {}       # entry -> newest slot this instance claimed
        self._claim_retry: dict[tuple[str, int], ClaimRequest] = {}
        self._send_retry: dict[tuple[str, int], _Send] = {}
        self._takeover_retry: dict[tuple[str, int], _PendingTakeover] = {}
        self._taken: collections.OrderedDict[tuple[str, int], int] = collections.OrderedDict()
        self._notes: list[HistoryNote] = []
        self._prepared = False
        self._seeded = False
        self._store_ok = True
        self._down_since: float | None = None
        self._next_down_report = 0.0
        self._skip_logged: dict[tuple[str, str], tuple[float, int]] = {}
        # monotonic times (self.monotonic): -inf means "now is past it"
        self._store_retry_at = -math.inf
        self._backoff = BACKOFF_FIRST_S
        self._next_skew = -math.inf
        self._next_stats = -math.inf
        self._next_lease_check = -math.inf
        self._exit_after_claim = os.environ.get(EXIT_AFTER_CLAIM_ENV)
        self._warned_fingerprints: set[tuple[str, str]] = set()
        self._stopping = False
        self._last_store_error_at = -math.inf

    # -- public ------------------------------------------------------------------------------
    def tick(self) -> float:
        """Do what is due now; return the seconds to sleep before the next tick (0 < s <= 60)."""
        if self._stopping:
            return MAX_SLEEP_S
        now = self.clock()
        if not self._seeded:
            self._seed_all(now)
        if not self._prepared:
            self._prepare(now)
        due = self._pop_due(now)
        if not self._prepared:                 # no store yet: the runs wait, never sent blind
            for request in due:
                self._claim_retry[request.run] = request
            due = []
        due.extend(self._due_retries(now))
        if due:
            self._claim(due)
        if self._stopping:                   # close() ran during the claim's sends
            return MAX_SLEEP_S
        self._retry_sends(now)
        self._flush_notes()
        self._periodic()
        return self._delay(self.clock())

    def stop(self) -> None:
        """Send nothing more (beat is shutting down, possibly from a signal handler in the middle
        of a tick). A run won but not yet sent stays claimed without a send: the guarantee's
        "winner dying between its claim and its send"; a leased one is taken over."""
        self._stopping = True

    def update_plans(self, plans: dict[str, EntryPlan]) -> None:
        """Replace the plans (the schedule changed): new or changed entries are scheduled anew,
        removed ones are dropped; what this instance claimed is kept."""
        old = self.plans
        self.plans = dict(plans)
        if not self._seeded:
            return
        now = self.clock()
        for name, plan in self.plans.items():
            if name not in old or old[name].fingerprint != plan.fingerprint:
                self._pending.pop(name, None)
                self._seed(plan, now)
                self._save_definition(plan)
        for name in set(old) - set(self.plans):
            self._pending.pop(name, None)
        for run in [r for r in self._takeover_retry if r[0] not in self.plans]:
            del self._takeover_retry[run]

    def next_fire(self) -> float | None:
        """When the next pending run fires (epoch seconds), for tests and the banner."""
        self._drop_stale_heads()
        return self._heap[0][0] if self._heap else None

    # -- start-up ------------------------------------------------------------------------------
    def start(self) -> bool:
        """Prepare the store at start-up. An unreachable store is logged and retried by the
        ticks (beat keeps running, sends nothing); a store that can never serve this
        configuration (a server too old, an option that contradicts the live store) raises.

        :raises ConfigError: the store refused the configuration.
        :returns: whether the store is ready.
        """
        return self._prepare(self.clock(), at_start_up=True)

    def _prepare(self, now: float, at_start_up: bool = False) -> bool:
        if self.monotonic() < self._store_retry_at:
            return False
        try:
            warnings = self.store.prepare(list(self.plans))
            for plan in self.plans.values():
                self._save_definition(plan, quiet=False)
        except StoreError as exc:
            self._store_failed(exc, "preparing the store")
            return False
        except ConfigError as exc:
            if at_start_up:
                raise
            logger.critical("anarchon store %s cannot serve this configuration: %s. Nothing is "
                            "sent until it is fixed.", self.store.safe_url, exc)
            self._store_ok = False
            self._store_retry_at = self.monotonic() + BACKOFF_MAX_S
            return False
        for warning in warnings:
            logger.warning("anarchon store %s: %s", self.store.safe_url, warning)
        self._store_recovered()
        self._prepared = True
        self._check_skew(now)
        return True

    def _seed_all(self, now: float) -> None:
        self._seeded = True
        for plan in self.plans.values():
            self._seed(plan, now)

    def _save_definition(self, plan: EntryPlan, quiet: bool = True) -> None:
        try:
            self.store.save_definition(plan.name, plan.fingerprint, plan.definition)
        except StoreError:
            if not quiet:
                raise

    def _seed(self, plan: EntryPlan, now: float) -> None:
        """Queue the entry's first run: the newest slot still within max_late (so a deploy that
        restarts every instance at once loses no run), else the next one. Nothing older.

        A re-seed (the entry changed at run time) whose slot already waits in the claim retries
        (the store was unreachable) does not queue it a second time: the waiting claim takes the
        new definition and the slot after it is queued (one run is claimed once per batch)."""
        now_ms = int(now * 1000)
        first = plan.slots.next_after(now_ms - plan.max_late_ms - 1)
        latest = None
        while first <= now_ms:
            latest, first = first, plan.slots.next_after(first)
        slot = latest if latest is not None else first
        if (plan.name, slot) in self._claim_retry:
            self._claim_retry[(plan.name, slot)] = self._request(plan, slot)
            slot = plan.slots.next_after(slot)
        self._push(plan, slot)

    def _push(self, plan: EntryPlan, slot_ms: int) -> None:
        jitter_s = self.rng.uniform(0, plan.jitter_ms / 1000) if plan.jitter_ms else 0.0
        self._pending[plan.name] = slot_ms
        heapq.heappush(self._heap, (slot_ms / 1000 + jitter_s, slot_ms, plan.name))

    def _drop_stale_heads(self) -> None:
        while self._heap and self._pending.get(self._heap[0][2]) != self._heap[0][1]:
            heapq.heappop(self._heap)

    # -- due runs ------------------------------------------------------------------------------
    def _pop_due(self, now: float) -> list[ClaimRequest]:
        now_ms = int(now * 1000)
        due = []
        while self._heap and self._heap[0][0] <= now:
            _, slot_ms, name = heapq.heappop(self._heap)
            plan = self.plans.get(name)
            if plan is None or self._pending.get(name) != slot_ms:
                continue                       # entry removed or re-seeded
            self._schedule_next(plan, slot_ms, now_ms)
            if slot_ms <= self._last_claimed.get(name, -1):
                logger.debug("%s: slot %s was already claimed here (the clock went back or the "
                             "entry was re-seeded)", name, iso(slot_ms))
                continue
            lateness = now_ms - slot_ms
            if lateness > plan.max_late_ms:
                self._skip_late_local(plan, [slot_ms], lateness)
                continue
            due.append(self._request(plan, slot_ms))
        return due

    def _schedule_next(self, plan: EntryPlan, slot_ms: int, now_ms: int) -> None:
        """Push the slot after ``slot_ms``; slots that are already late (the process was paused,
        the clock jumped forward) are skipped, logged and recorded, never sent in a burst."""
        nxt = plan.slots.next_after(slot_ms)
        if now_ms - nxt > plan.max_late_ms:
            late = []
            while now_ms - nxt > plan.max_late_ms and len(late) < MAX_SKIP_WALK:
                late.append(nxt)
                nxt = plan.slots.next_after(nxt)
            if now_ms - nxt > plan.max_late_ms:
                nxt = plan.slots.next_after(now_ms - plan.max_late_ms - 1)
            self._skip_late_local(plan, late, now_ms - late[0])
        self._push(plan, nxt)

    def _skip_late_local(self, plan: EntryPlan, slots: list[int], lateness_ms: int) -> None:
        self.stats["late_local"] += len(slots)
        if len(slots) == 1:
            logger.warning("%s: slot %s skipped as late: this instance reached it %.3f s after the "
                           "slot (max_late %g s). Was the process paused or did the clock jump?",
                           plan.name, iso(slots[0]), lateness_ms / 1000, plan.timing.max_late_s)
        else:
            logger.warning("%s: %d slots from %s to %s skipped as late (max_late %g s): the process "
                           "was paused or the clock jumped forward.", plan.name, len(slots),
                           iso(slots[0]), iso(slots[-1]), plan.timing.max_late_s)
        for slot in slots[-self.store.history_size:]:
            self._note(plan.name, slot, RunEvent.LATE_LOCAL,
                       detail=f"{self.instance_id} reached it {lateness_ms / 1000:.3f} s late")

    def _request(self, plan: EntryPlan, slot_ms: int) -> ClaimRequest:
        return ClaimRequest(entry=plan.name, slot_ms=slot_ms, max_late_ms=plan.max_late_ms,
                            task_id=task_id_for(self.namespace, plan.name, slot_ms, 1),
                            fingerprint=plan.fingerprint, lease=plan.lease_terms)

    def _due_retries(self, now: float) -> list[ClaimRequest]:
        """Claims that waited for the store: those still within max_late are retried (when the
        store may answer again); the others are given up, logged and noted in history."""
        if not self._claim_retry:
            return []
        now_ms = int(now * 1000)
        retry, given_up = [], []
        for run, request in list(self._claim_retry.items()):
            if request.entry not in self.plans:
                del self._claim_retry[run]
            elif now_ms - request.slot_ms > request.max_late_ms:
                del self._claim_retry[run]
                given_up.append(request)
                self._note(request.entry, request.slot_ms, RunEvent.UNREACHABLE,
                           detail=f"{self.instance_id} could not reach the store")
            else:
                retry.append(request)
        if given_up:
            self.stats["store_unreachable"] += len(given_up)
            first = min(given_up, key=lambda r: r.slot_ms)
            logger.error("%d run(s) of %d entries not claimed: the store %s could not be reached "
                         "until their max_late (the first: %s slot %s); skipped, never sent blind.",
                         len(given_up), len({r.entry for r in given_up}), self.store.safe_url,
                         first.entry, iso(first.slot_ms))
        if not self._prepared or self.monotonic() < self._store_retry_at:
            return []
        return retry

    # -- claims ---------------------------------------------------------------------------------
    def _claim(self, requests: list[ClaimRequest]) -> None:
        """Claim ``requests`` in one batch, each run once: the same run can come due in the heap
        and wait in the claim retries (a store blip, then a re-seed), and a store answers won to
        every copy of its own claim. The first copy wins (the heap's, built from the current
        plan)."""
        unique: dict[tuple[str, int], ClaimRequest] = {}
        for request in requests:
            unique.setdefault(request.run, request)
        requests = list(unique.values())
        try:
            results = self.store.claim(requests)
        except StoreError as exc:
            for request in requests:
                self._claim_retry[request.run] = request
            self._store_failed(exc, f"claiming {len(requests)} run(s)")
            return
        self._store_recovered()
        for result in results:
            self._claim_retry.pop(result.request.run, None)
            self._on_result(result)

    def _on_result(self, result: ClaimResult) -> None:
        plan = self.plans.get(result.entry)
        if plan is None:
            return
        self._check_fingerprint(plan, result)
        outcome = result.outcome
        self.stats[f"claim_{outcome.value}"] += 1
        if outcome is Outcome.UNCONFIRMED:
            # won in the store but not durable in time: never sent, and never asked again by this
            # instance (a re-seed, a clock set back), since a store that reads its own claim back
            # would answer won. The claim record stays: nobody else wins it either.
            self._last_claimed[plan.name] = max(self._last_claimed.get(plan.name, -1), result.slot_ms)
        if outcome is Outcome.WON:
            self._last_claimed[plan.name] = max(self._last_claimed.get(plan.name, -1), result.slot_ms)
            if self._exit_after_claim == plan.name:
                logger.warning("%s: exiting after the claim of slot %s (%s is set)", plan.name,
                               iso(result.slot_ms), EXIT_AFTER_CLAIM_ENV)
                logging.shutdown()
                os._exit(70)
            job = _Send(plan, result.slot_ms, result.attempt, result.token,
                        task_id_for(self.namespace, plan.name, result.slot_ms, result.attempt))
            self._try_send(job)
        elif outcome is Outcome.LOST:
            logger.debug("%s: slot %s claimed by %s", plan.name, iso(result.slot_ms),
                         result.winner or "another instance")
        else:
            self._log_skip(plan, result)

    def _log_skip(self, plan: EntryPlan, result: ClaimResult) -> None:
        """Log a skip; the same kind of skip of one entry at most once a minute (each run is in
        the store's history anyway), with the number of the ones not logged."""
        outcome = result.outcome
        now = self.monotonic()
        key = (plan.name, outcome.value)
        last, hidden = self._skip_logged.get(key, (-math.inf, 0))
        detail = f" ({result.detail})" if result.detail else ""
        if now - last < SKIP_LOG_EVERY_S:
            self._skip_logged[key] = (last, hidden + 1)
            logger.debug("%s: slot %s skipped: %s%s", plan.name, iso(result.slot_ms),
                         _SKIP_REASONS[outcome], detail)
            return
        self._skip_logged[key] = (now, 0)
        more = f"; {hidden} more slot(s) of this entry skipped so in the last minute" if hidden else ""
        level = logging.INFO if outcome in (Outcome.OVERLAPPING, Outcome.SUPERSEDED) else logging.WARNING
        logger.log(level, "%s: slot %s skipped: %s%s%s", plan.name, iso(result.slot_ms),
                   _SKIP_REASONS[outcome], detail, more)

    def _check_fingerprint(self, plan: EntryPlan, result: ClaimResult) -> None:
        theirs = result.winner_fingerprint
        if not theirs or theirs == plan.fingerprint or (plan.name, theirs) in self._warned_fingerprints:
            return
        self._warned_fingerprints.add((plan.name, theirs))
        try:
            other = self.store.load_definition(plan.name, theirs)
        except StoreError:
            other = None
        logger.warning(
            "%s: slot %s was claimed by %s with a different definition of this entry. Theirs "
            "(%s): %s. Ours (%s): %s. A rolling deploy in progress? Otherwise the instances run "
            "different beat_schedule settings under the same name.", plan.name,
            iso(result.slot_ms), result.winner, theirs, other or "unknown", plan.fingerprint,
            plan.definition)

    # -- sends ----------------------------------------------------------------------------------
    def _try_send(self, job: _Send) -> None:
        run = (job.plan.name, job.slot_ms)
        if self._stopping:
            self._send_retry.pop(run, None)
            logger.warning("%s: slot %s won but not sent: beat is shutting down", job.plan.name,
                           iso(job.slot_ms))
            return
        if job.attempt == 1 and job.plan.timing.lease is None \
                and int(self.clock() * 1000) > job.deadline_ms:
            # the claim itself took past max_late (a slow store): too late to send. Recorded as a
            # send that failed until max_late (a skip event would not replace the claim's record).
            # A leased run is sent anyway: its record is queued, and a takeover would send it later
            self._send_retry.pop(run, None)
            self.stats["send_failed"] += 1
            logger.warning("%s: slot %s won but not sent: the claim answered after max_late (%g s)",
                           job.plan.name, iso(job.slot_ms), job.plan.timing.max_late_s)
            self._note(job.plan.name, job.slot_ms, RunEvent.SEND_FAILED, task_id=job.task_id,
                       attempt=job.attempt, detail="won after max_late: the claim answered too late")
            return
        try:
            self.send(job.plan, job.slot_ms, job.attempt, job.token, job.task_id)
        except SendOutcomeUnknown as exc:
            # the broker may hold the message: publishing again could deliver it twice
            self._send_retry.pop(run, None)
            self.stats["send_unknown"] += 1
            leased = job.plan.timing.lease is not None
            logger.error("%s: slot %s attempt %d: the publish broke off (%s); the broker may or may "
                         "not have the message. Not published again (at most one send per attempt)%s",
                         job.plan.name, iso(job.slot_ms), job.attempt, exc,
                         "; if it never reaches a worker the run is taken over after its queue "
                         "deadline" if leased else "")
            self._note(job.plan.name, job.slot_ms, RunEvent.SEND_UNKNOWN, task_id=job.task_id,
                       attempt=job.attempt, detail=str(exc)[:200])
            return
        except Exception as exc:  # nothing reached the broker: retried by the winner until max_late
            first = run not in self._send_retry
            job.next_try = self.monotonic() + SEND_RETRY_S
            job.error = f"{type(exc).__name__}: {exc}"
            self._send_retry[run] = job
            if first:
                logger.error("%s: slot %s won but the send failed (%s); retrying until max_late",
                             job.plan.name, iso(job.slot_ms), job.error)
            return
        self._send_retry.pop(run, None)
        self.stats["sent"] += 1
        self._note(job.plan.name, job.slot_ms, RunEvent.SENT, task_id=job.task_id, attempt=job.attempt)

    def _retry_sends(self, now: float) -> None:
        now_ms, mono = int(now * 1000), self.monotonic()
        for run, job in list(self._send_retry.items()):
            if (mono > job.give_up_at) if job.give_up_at is not None else (now_ms > job.deadline_ms):
                del self._send_retry[run]
                self.stats["send_failed"] += 1
                logger.error("%s: slot %s not sent: the send kept failing until max_late (%g s); "
                             "last error: %s", job.plan.name, iso(job.slot_ms),
                             job.plan.timing.max_late_s, job.error)
                self._note(job.plan.name, job.slot_ms, RunEvent.SEND_FAILED, task_id=job.task_id,
                           attempt=job.attempt, detail=job.error[:200])
            elif mono >= job.next_try:
                self._try_send(job)

    # -- history notes ----------------------------------------------------------------------------
    def _note(self, entry: str, slot_ms: int, event: RunEvent, **fields) -> None:
        self._notes.append(HistoryNote(entry, slot_ms, event, **fields))
        if len(self._notes) > MAX_PENDING_NOTES:
            del self._notes[: len(self._notes) - MAX_PENDING_NOTES]

    def _flush_notes(self) -> None:
        if not self._notes or self.monotonic() < self._store_retry_at:
            return
        notes, self._notes = self._notes, []
        try:
            self.store.record_many(notes)
        except StoreError as exc:
            self._notes = notes + self._notes
            self._store_failed(exc, "writing history")

    # -- store health -------------------------------------------------------------------------------
    def _store_failed(self, exc: Exception, doing: str) -> None:
        now = self.monotonic()
        self.stats["store_errors"] += 1
        self._last_store_error_at = now
        reason = str(exc).rstrip(".")
        if self._store_ok:
            logger.error("anarchon store %s unreachable while %s: %s. No run is sent until it "
                         "answers; retrying with backoff. Fix: check anarchon_store_url (or the "
                         "broker URL the store follows), that the server runs, and that this host "
                         "reaches it.", self.store.safe_url, doing, reason)
            self._down_since = now
            self._next_down_report = now + DOWN_REPORT_EVERY_S
        elif now >= self._next_down_report:
            self._next_down_report = now + DOWN_REPORT_EVERY_S
            logger.error("anarchon store %s still unreachable after %.0f s (%s); no run is sent "
                         "until it answers (%d run(s) skipped so far).", self.store.safe_url,
                         now - (now if self._down_since is None else self._down_since), reason,
                         self.stats["store_unreachable"])
        else:
            logger.debug("anarchon store still unreachable while %s: %s", doing, reason)
        self._store_ok = False
        self._store_retry_at = now + self._backoff
        self._backoff = min(self._backoff * 2, BACKOFF_MAX_S)

    def _store_recovered(self) -> None:
        if not self._store_ok:
            now = self.monotonic()
            logger.warning("anarchon store %s reachable again after %.0f s", self.store.safe_url,
                           now - (now if self._down_since is None else self._down_since))
        self._down_since = None
        self._store_ok = True
        self._backoff = BACKOFF_FIRST_S
        self._store_retry_at = -math.inf

    # -- periodic work ------------------------------------------------------------------------------
    def _periodic(self) -> None:
        now = self.monotonic()
        if self._takeover_retry:
            self._retry_takeovers()
        if now >= self._next_lease_check:
            self._check_leases()
        if now >= self._next_skew:
            self._check_skew(self.clock())
        if now >= self._next_stats:
            self._next_stats = now + STATS_EVERY_S
            if self.stats:
                logger.info("anarchon counters: %s", dict(sorted(self.stats.items())))

    # -- leases ---------------------------------------------------------------------------------------
    def _check_leases(self) -> None:
        """Take over the leased runs of our entries whose runner is presumed dead (lease expired)
        or whose message never reached a worker (queued past its deadline). Every instance checks
        every heartbeat, at a random offset within one heartbeat; the store's compare-and-set on
        the expected token lets exactly one of them take a run over (DESIGN.md "Takeover").
        Timed on the monotonic clock, like the grace after a store error."""
        now = self.monotonic()
        leased = [p for p in self.plans.values() if p.timing.lease is not None]
        if not leased:
            self._next_lease_check = now + MAX_SLEEP_S
            return
        period = min(p.timing.lease.heartbeat_s for p in leased)
        self._next_lease_check = (math.floor(now / period) + 1) * period + self.rng.uniform(0, period)
        try:
            expired = self.store.expired_runs([p.name for p in leased])
        except StoreError as exc:
            self._last_store_error_at = now
            logger.debug("lease check failed: %s", exc)
            return
        for run in expired:
            plan = self.plans.get(run.entry)
            if plan is None or plan.timing.lease is None:
                continue
            pending = self._takeover_retry.get((run.entry, run.slot_ms))
            if pending is not None and pending.run.token == run.token:
                continue                       # asked again by _retry_takeovers
            if not self._deferred(plan, run, now):
                self._take_over(plan, run)

    @staticmethod
    def _grace(plan: EntryPlan) -> float:
        """Seconds a started run of ``plan`` is not taken over after a store error."""
        return STORE_GRACE_HEARTBEATS * plan.timing.lease.heartbeat_s + 1.0

    def _deferred(self, plan: EntryPlan, run: LeasedRun, now: float) -> bool:
        """True (and counted) when a started run must not be taken over yet: the store failed for
        us moments ago (monotonic ``now``), so it probably failed for the runner too, and its lease
        may have run out only because its renewals could not get through. A live runner gets
        2 heartbeats + 1 s to renew (or release) before it is presumed dead."""
        if run.state is not RunState.STARTED or now - self._last_store_error_at >= self._grace(plan):
            return False
        self.stats["takeover_deferred"] += 1
        logger.debug("%s: slot %s: takeover deferred, the store was unreachable %.1f s ago",
                     run.entry, iso(run.slot_ms), now - self._last_store_error_at)
        return True

    def _retry_takeovers(self) -> None:
        """Ask again the takeovers whose answer did not come back, with their expected token."""
        now = self.monotonic()
        for key, pending in list(self._takeover_retry.items()):
            plan = self.plans.get(key[0])
            if plan is None or plan.timing.lease is None:
                del self._takeover_retry[key]
            elif now > pending.give_up_at:
                del self._takeover_retry[key]
                self.stats["takeover_unanswered"] += 1
                logger.warning("%s: slot %s: the takeover of attempt %d got no answer from the store "
                               "until its queue deadline; the run is taken over again once it "
                               "shows expired", key[0], iso(key[1]), pending.run.attempt)
            elif now >= pending.next_try:
                if self._deferred(plan, pending.run, now):
                    pending.next_try = self._last_store_error_at + self._grace(plan)
                else:
                    self._take_over(plan, pending.run)

    def _take_over(self, plan: EntryPlan, run: LeasedRun) -> None:
        if self._stopping:
            return
        lease = plan.timing.lease
        key = (run.entry, run.slot_ms)
        try:
            outcome, new = self.store.take_over(
                run.entry, run.slot_ms, run.token, queue_timeout_ms=int(lease.queue_timeout_s * 1000),
                max_attempts=lease.max_attempts)
        except StoreError as exc:
            # it may have committed with its reply lost: ask again with the same expected token
            # (the store answers TAKEN again with the same record), never burn an attempt
            now = self.monotonic()
            self._last_store_error_at = now
            pending = self._takeover_retry.get(key)
            if pending is None or pending.run.token != run.token:
                pending = _PendingTakeover(run, give_up_at=now + lease.queue_timeout_s, next_try=now)
                logger.info("%s: slot %s: the takeover of attempt %d got no answer (%s); asking "
                            "again", run.entry, iso(run.slot_ms), run.attempt, exc)
            else:
                logger.debug("takeover of %s slot %s failed again: %s", run.entry,
                             iso(run.slot_ms), exc)
            pending.next_try = now + TAKEOVER_RETRY_S
            self._takeover_retry[key] = pending
            return
        retried = self._takeover_retry.pop(key, None) is not None
        self.stats[f"takeover_{outcome.value}"] += 1
        if retried and outcome is TakeoverOutcome.REFUSED:
            logger.info("%s: slot %s: the takeover of attempt %d, asked again after its answer was "
                        "lost, was refused: another instance took the run over, its runner renewed, "
                        "or the store cannot recognise its own earlier takeover", plan.name,
                        iso(run.slot_ms), run.attempt)
        if run.state is RunState.QUEUED:
            why = (f"it was queued past its deadline without a worker adopting it: is a worker "
                   f"consuming its queue, and does the workers' app call celery_anarchon.install(app)?")
        else:
            why = f"its runner {run.owner} stopped renewing its lease (presumed dead)"
        if outcome is TakeoverOutcome.TAKEN:
            log = logger.error if run.state is RunState.QUEUED else logger.warning
            if self._taken.get(key, 0) >= new.attempt:     # at most one send per attempt
                logger.debug("%s: slot %s attempt %d was already sent here", plan.name,
                             iso(run.slot_ms), new.attempt)
                return
            self._taken[key] = new.attempt
            self._taken.move_to_end(key)
            while len(self._taken) > MAX_TAKEN_KEPT:
                self._taken.popitem(last=False)
            log("%s: slot %s attempt %d taken over as attempt %d: %s", plan.name, iso(run.slot_ms),
                run.attempt, new.attempt, why)
            self._try_send(_Send(plan, run.slot_ms, new.attempt, new.token,
                                 task_id_for(self.namespace, plan.name, run.slot_ms, new.attempt),
                                 give_up_at=self.monotonic() + plan.timing.max_late_s))
        elif outcome is TakeoverOutcome.LOST and (new or run).attempt < lease.max_attempts:
            # attempts left: the store refused the takeover because it may have lost writes to
            # the run's record since it was claimed (an epoch change or amnesia: a release or an
            # adoption it no longer has); its history detail says which (DESIGN.md "Leases")
            logger.error("%s: slot %s attempt %d recorded lost, not taken over: the store may "
                         "have lost writes to its record since it was claimed, so the run may "
                         "still be running or may have finished (a possible miss, never a second "
                         "run)%s", plan.name, iso(run.slot_ms), run.attempt,
                         self._history_detail(run))
        elif outcome is TakeoverOutcome.LOST:
            logger.error("%s: slot %s recorded lost after %d attempts: %s", plan.name,
                         iso(run.slot_ms), run.attempt, why)
        elif outcome is TakeoverOutcome.SUPERSEDED:
            logger.info("%s: slot %s superseded by a newer slot instead of a takeover (%s)",
                        plan.name, iso(run.slot_ms), why)

    def _history_detail(self, run: LeasedRun) -> str:
        """``": <detail>"`` of the run's history record (one read, best effort), or ""."""
        try:
            records = self.store.history(run.entry, 50)
        except StoreError:
            return ""
        detail = next((r.detail for r in records if r.slot_ms == run.slot_ms), "")
        return f": {detail}" if detail else ""

    def _check_skew(self, now: float) -> None:
        """Measure this instance's clock against the store's and log it: a warning past 1 s, an
        error past half the smallest max_late (DESIGN.md "Timing")."""
        self._next_skew = self.monotonic() + SKEW_EVERY_S
        try:
            before, started = self.clock(), self.monotonic()
            store_ms = self.store.now_ms()
            after, took = self.clock(), self.monotonic() - started
        except StoreError as exc:
            logger.debug("skew check failed: %s", exc)
            return
        if store_ms is None:
            return
        skew_s = (store_ms - (before + after) * 500) / 1000
        limit_s = min((p.timing.max_late_s for p in self.plans.values()), default=60.0) / 2
        message = ("this instance's clock is %.3f s %s the store's clock (round trip %.1f ms)",
                   abs(skew_s), "behind" if skew_s > 0 else "ahead of", took * 1000)
        if abs(skew_s) > limit_s:
            logger.error(message[0] + ": more than half of max_late (%g s); its claims will be "
                         "refused as late or early. Run NTP on every host.", *message[1:], limit_s)
        elif abs(skew_s) > 1:
            logger.warning(message[0] + "; run NTP on every host.", *message[1:])
        else:
            logger.info(*message)

    def _delay(self, now: float) -> float:
        """Seconds until the next thing to do: the next slot (wall clock ``now``) or the next
        retry or check (monotonic), at most 60 s."""
        mono = self.monotonic()
        waits = [MAX_SLEEP_S]
        nxt = self.next_fire()
        if nxt is not None:
            waits.append(nxt - now)
        if self._claim_retry or not self._prepared:
            waits.append(max(self._store_retry_at - mono, 0.05))
        if self._send_retry:
            waits.append(min(job.next_try for job in self._send_retry.values()) - mono)
        if self._takeover_retry:
            waits.append(min(p.next_try for p in self._takeover_retry.values()) - mono)
        if self._notes:
            waits.append(1.0)
        if any(p.timing.lease is not None for p in self.plans.values()):
            waits.append(max(self._next_lease_check - mono, 0.01))
        return min(max(min(waits), 0.001), MAX_SLEEP_S)


_SKIP_REASONS = {
    Outcome.LATE: "late on the store's clock (slot + max_late + 10 s had passed when the claim arrived)",
    Outcome.EARLY: "early on the store's clock (more than 10 s before the slot): is this host's clock ahead?",
    Outcome.FORGOTTEN: "the store does not remember that far back (a new store, one that lost its data, or a slot older than its memory)",
    Outcome.OVERLAPPING: "an earlier run of this leased entry is still running (overlap='skip')",
    Outcome.SUPERSEDED: "a newer slot of this entry was already claimed",
    Outcome.UNKNOWN: "the store could not tell whether the claim was won; counted as lost",
    Outcome.UNCONFIRMED: "won, but the store did not confirm the claim durable (on its replicas or disk) in time; not sent, so a failover cannot make it run twice",
}
