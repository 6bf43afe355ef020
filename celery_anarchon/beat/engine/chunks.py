"""Claims in chunks and their answers (docs/design.md "One run, in time", steps 3-4): each chunk
one store call, its won runs sent before the next chunk is claimed."""
from __future__ import annotations

import collections
import logging
import time
from typing import Callable

from celery_anarchon._util import log_time
from celery_anarchon.beat.engine.claims import ClaimRetries
from celery_anarchon.beat.engine.definitions import Definitions
from celery_anarchon.beat.engine.due import DueRuns
from celery_anarchon.beat.engine.notes import NoteBuffer
from celery_anarchon.beat.engine.observe import Observer
from celery_anarchon.beat.engine.outage import Outage
from celery_anarchon.beat.engine.pace import Pace
from celery_anarchon.beat.engine.sends import Send, SendQueue
from celery_anarchon.beat.engine.skips import SkipLog
from celery_anarchon.beat.engine.sync import EntrySync
from celery_anarchon.errors import StoreError
from celery_anarchon.schedule.plan import EntryPlan, task_id_for
from celery_anarchon.stores.base import (
    ClaimRequest, ClaimResult, ClaimStore, HistoryRecord, Outcome, RunEvent,
)

logger = logging.getLogger(__name__)

#: claim answers after which this instance never asks for that scheduled slot, nor an older one,
#: again: a store that reads its own claim back answers won again (a second send), a paused run
#: is skipped, and a slot another instance won ran there (a re-seed after an update starts after
#: it, so the entry's runs never go back in time)
HANDLED = (Outcome.WON, Outcome.UNCONFIRMED, Outcome.PAUSED, Outcome.OTHER_WON)


#: history events that record a slot nobody ran: a catch-up's gap, which it may still send
GAP_EVENTS = frozenset({RunEvent.MISSED, RunEvent.UNREACHABLE})


class ClaimChunks:
    """The claims of the due runs, in chunks sized by :class:`~.pace.Pace`, and what each answer
    means: counted, logged, the slot marked handled, a won run sent (in one send batch per
    chunk), a refusal logged as a skip.

    :param store: the claim store.
    :param namespace: ``anarchon_namespace``, part of every task id.
    :param monotonic: seconds from any origin: how long a chunk took.
    :param stats: the engine's counters (``claim_<outcome>``).
    :param sync: the entry sync, whose kept pauses are answered here (``None``: no entry store).
    :param clock: the wall clock, epoch seconds: which claims are a catch-up's (past their
        entry's max_late).
    """

    def __init__(self, store: ClaimStore, namespace: str, monotonic: Callable[[], float],
                 stats: collections.Counter, *, clock: Callable[[], float] = time.time,
                 pace: Pace, claims: ClaimRetries, due: DueRuns,
                 sends: SendQueue, outage: Outage, notes: NoteBuffer, skips: SkipLog,
                 definitions: Definitions, sync: EntrySync | None, observer: Observer) -> None:
        self.store = store
        self.namespace = namespace
        self.monotonic = monotonic
        self.clock = clock
        self.stats = stats
        self.pace = pace
        self.claims = claims
        self.due = due
        self.sends = sends
        self.outage = outage
        self.notes = notes
        self.skips = skips
        self.definitions = definitions
        self.sync = sync
        self.observer = observer
        self._stopping = False
        #: entry -> the newest decided slot that bounded its catch-up, as last logged
        self._bounds: dict[str, int] = {}

    def stop(self) -> None:
        """Claim no further chunk (beat is shutting down)."""
        self._stopping = True

    def claim(self, requests: list[ClaimRequest], plans: dict[str, EntryPlan],
              config_plans: dict[str, EntryPlan]) -> None:
        """Claim ``requests``, oldest fire time first, in chunks (:class:`~.pace.Pace`): each
        chunk is one store call, and its won runs are sent (in one send batch) before the next
        chunk is claimed, so a claim is never far ahead of its send. Each run is claimed once:
        the same run can come due in the heap and wait in the claim retries (a store blip, then
        a re-seed), and a store answers won to every copy of its own claim. The first copy wins
        (the heap's, built from the current plan). A store error holds this chunk and the rest
        for the claim retries.

        :param plans: what runs, by entry name; ``config_plans``: those of ``beat_schedule``.
        """
        unique: dict[tuple[str, int], ClaimRequest] = {}
        for request in requests:
            unique.setdefault(request.run, request)
        requests = self._refuse_kept_pauses(list(unique.values()), plans, config_plans)
        requests = self._answer_held(requests, plans, config_plans)
        try:
            requests = self._drop_decided_slots(requests, plans)
        except StoreError as exc:
            self.claims.hold(requests)
            self.outage.failed(exc, "reading the history of the runs to catch up")
            return
        start = 0
        while start < len(requests) and not self._stopping:
            chunk = requests[start:start + self.pace.size()]
            began = self.monotonic()
            try:
                started = time.perf_counter()
                results = self.store.claim(chunk)
                self.observer.store_round_trip("claim", time.perf_counter() - started)
            except StoreError as exc:
                self.claims.hold(requests[start:])
                self.outage.failed(exc, f"claiming {len(requests) - start} run(s)")
                return
            start += len(chunk)
            self.outage.recovered()
            won = []
            for result in results:
                self.claims.answered(result.request.run)
                send = self._on_result(result, plans, config_plans)
                if send is not None:
                    won.append(send)
            self.sends.send_many(won)
            self.pace.measured(len(chunk), self.monotonic() - began)

    def _refuse_kept_pauses(self, requests: list[ClaimRequest], plans: dict[str, EntryPlan],
                            config_plans: dict[str, EntryPlan]) -> list[ClaimRequest]:
        """The requests to claim: a run of an entry whose pause this instance keeps from before
        the store lost it (docs/design.md "Amnesia") is not claimed; it is answered paused here,
        logged, counted and recorded in the history (the store's claim would let it win)."""
        if self.sync is None or not self.sync.kept.pauses:
            return requests
        rest = []
        for request in requests:
            detail = self.sync.pause_detail(request.entry)
            if detail is None:
                rest.append(request)
                continue
            self.claims.answered(request.run)
            self.notes.add(request.entry, request.slot_ms, RunEvent.PAUSED, detail=detail,
                           task_id=request.task_id)
            self._on_result(ClaimResult(request, Outcome.PAUSED, detail=detail), plans,
                            config_plans)
        return rest

    def _answer_held(self, requests: list[ClaimRequest], plans: dict[str, EntryPlan],
                     config_plans: dict[str, EntryPlan]) -> list[ClaimRequest]:
        """The requests to claim: a run of a held plan (:attr:`EntryPlan.held`) is never
        claimed. While this instance's sync sees the entry's pause, it is answered paused here,
        logged, counted and recorded in the history with the pause's detail, as the store's claim
        answers a paused entry's run (several instances write the same run's record); else it
        is dropped unrecorded (resumed, the entry is still held elsewhere: a disabled row)."""
        if not any(plans[r.entry].held for r in requests if r.entry in plans):
            return requests
        rest = []
        for request in requests:
            plan = plans.get(request.entry)
            if plan is None or not plan.held:
                rest.append(request)
                continue
            self.claims.answered(request.run)
            pause = self.sync.pause_of(request.entry) if self.sync is not None else None
            if pause is None:
                self.due.claimed(request.entry, request.slot_ms)
                continue
            detail = pause.describe()
            self.notes.add(request.entry, request.slot_ms, RunEvent.PAUSED, detail=detail,
                           task_id=request.task_id)
            self._on_result(ClaimResult(request, Outcome.PAUSED, detail=detail), plans,
                            config_plans)
        return rest

    def _drop_decided_slots(self, requests: list[ClaimRequest],
                            plans: dict[str, EntryPlan]) -> list[ClaimRequest]:
        """The requests to claim, without the catch-up's slots that are no gap: a catch-up
        (``catch_up='all'``: docs/design.md "One run, in time", step 7) reaches back no further
        than the entry's newest decided run in the history (any record but ``missed`` and
        ``store_unreachable``, which are the gap itself). Slots older than it came while an
        instance ran the entry: run, skipped with a reason, or answered paused (a pause holds
        for the slots it covered, and no claim holds a paused slot, so the store would let a
        catch-up win one after the resume); or under another schedule, before a change. A
        catch-up's claim is one past its entry's max_late; the history of those entries is read
        once per call (the newest record is all it needs, so a history cut at
        ``history_size`` still bounds it), and the slots it drops are marked handled, never
        claimed.

        :raises StoreError: the history could not be read.
        """
        now_ms = int(self.clock() * 1000)
        late = [r for r in requests if not r.requested and r.entry in plans
                and now_ms - r.slot_ms > plans[r.entry].max_late_ms]
        if not late:
            return requests
        histories = self.store.history.read_many({r.entry for r in late})
        decided: dict[str, HistoryRecord] = {}
        for name, records in histories.items():
            runs = [r for r in records if r.event not in GAP_EVENTS]
            if runs:
                decided[name] = max(runs, key=lambda r: r.slot_ms)
        dropped = {r.run for r in late
                   if r.entry in decided and r.slot_ms <= decided[r.entry].slot_ms}
        if not dropped:
            return requests
        for entry, slot_ms in sorted(dropped):
            self.claims.answered((entry, slot_ms))
            self.due.claimed(entry, slot_ms)
        for entry in sorted({entry for entry, _ in dropped}):
            self._log_bound(entry, decided[entry])
        return [r for r in requests if r.run not in dropped]

    def _log_bound(self, entry: str, newest: HistoryRecord) -> None:
        """Log the bound of a catch-up once per entry and bound (its slots come due one a pace,
        each dropped in its own call): at INFO when the newest decided record is a pause (else
        DEBUG), naming every slot up to it, since all of them are dropped; the same bound again
        at DEBUG."""
        first = self._bounds.get(entry) != newest.slot_ms
        self._bounds[entry] = newest.slot_ms
        level = logging.INFO if first and newest.event is RunEvent.PAUSED else logging.DEBUG
        logger.log(level, "%s: slots up to %s not caught up (catch_up='all'): the entry's "
                   "history records %s for slot %s, so they were decided while an instance ran "
                   "it (sent, skipped or paused) and none is sent again; the catch-up goes on "
                   "after it", entry, log_time(newest.slot_ms), newest.event.value,
                   log_time(newest.slot_ms))

    def _on_result(self, result: ClaimResult, plans: dict[str, EntryPlan],
                   config_plans: dict[str, EntryPlan]) -> Send | None:
        """Count and log one claim's answer; the send of a won run (sent by the caller)."""
        plan = plans.get(result.entry)
        if plan is None:
            return None
        if plan.name in config_plans:     # a store entry differs while an update syncs
            self.definitions.check(plan, result)
        outcome = result.outcome
        self.stats[f"claim_{outcome.value}"] += 1
        self.observer.claimed(plan.name, outcome.value)
        if outcome is Outcome.WON and plan.timing.lease is not None:
            self.observer.lease("started")       # the claim queued the run's lease record
        if outcome in HANDLED and result.request.run not in self.due.requested:
            # UNCONFIRMED: won in the store but not durable in time: never sent, and never asked
            # again (the claim record stays: nobody else wins it either)
            self.due.claimed(plan.name, result.slot_ms)
        if outcome is Outcome.WON:
            task_id = (result.request.task_id if result.attempt == 1 and result.request.task_id
                       else task_id_for(self.namespace, plan.name, result.slot_ms, result.attempt))
            return Send(plan, result.slot_ms, result.attempt, result.token, task_id,
                        deadline_ms=result.slot_ms + result.request.max_late_ms)
        if outcome is Outcome.OTHER_WON:       # the normal case, not an error
            self.observer.ran(plan.name, result.slot_ms)
            if logger.isEnabledFor(logging.DEBUG):   # every lost claim: format only if logged
                logger.debug("%s: slot %s claimed by %s", plan.name, log_time(result.slot_ms),
                             result.winner or "another instance")
        else:
            self.skips.refused(plan, result, ran_before=self.due.handled(plan.name))
        if outcome is Outcome.FORGOTTEN and self.sync is not None:
            self.sync.resync()    # the store may have lost its pauses too: look before claiming
        return None
