"""The lease operations of a memory store (docs/design.md "Leases"), in readable Python: what
:class:`~celery_anarchon.stores.parts.Leases` states, as the SQL stores
(:mod:`celery_anarchon.stores.sql.leases`) and the Redis Lua
(:mod:`celery_anarchon.stores.redis.lease_scripts`) do it.

Each operation holds the server's lock from its first read to its last write: one
compare-and-set on the run's record, after the namespace's memory start was read (an epoch
change or amnesia restarts it: docs/design.md "Amnesia"). A run is expired as
:attr:`~celery_anarchon.stores.base.LeasedRun.expired` says. Instants are UTC ms on the store's
clock; durations ms.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import TypeVar

from celery_anarchon._util import iso, log_time
from celery_anarchon.stores.base import (
    LATENESS_TOLERANCE_MS, HistoryRecord, LeasedRun, RunEvent, RunState, TakeoverOutcome,
)
from celery_anarchon.stores.memory import history
from celery_anarchon.stores.memory.notes import MemoryStart, fences, memory_start, since
from celery_anarchon.stores.memory.state import OPEN_STATES, Fence, Run, Server, Space
from celery_anarchon.stores.parts import Leases

log = logging.getLogger(__name__)
T = TypeVar("T")


def leased(run: Run, now: int) -> LeasedRun:
    """The contract's view of a run's record, read at ``now``."""
    return LeasedRun(run.entry, run.slot_ms, run.state, run.attempt, run.token, run.owner,
                     run.lease_expires_ms, run.queue_deadline_ms, now)


def record_of(space: Space, entry: str, slot_ms: int, now: int) -> Run | None:
    """The run's record, or ``None``: a terminal record kept past its ``keep_until_ms`` is what
    the SQL stores prune, and is pruned here as it is found."""
    runs = space.runs.get(entry, {})
    run = runs.get(slot_ms)
    if run is not None and run.keep_until_ms is not None and run.keep_until_ms < now:
        del runs[slot_ms]
        return None
    return run


class MemoryLeases(Leases):
    """inspect, expired_runs, take_over, adopt, renew, release, requeue: the ``leases`` part of
    :class:`~celery_anarchon.stores.memory.store.MemoryStore`, given what it needs of it.

    :param operation: ``operation(what)``: the store's lock held for one operation, as a context
        of ``(server, space, now)``.
    :param note: ``note(server, space, now, claiming=False)``: the namespace's memory start.
    :param where: ``memory store <url>``, for messages.
    :param memory_ms: the store's memory, ms: an ended run is kept that long.
    """

    def __init__(self, *, instance_id: str, history_size: int, memory_ms: int, where: str,
                 operation: Callable[[str], AbstractContextManager[tuple[Server, Space, int]]],
                 note: Callable[..., MemoryStart]) -> None:
        self.instance_id = instance_id
        self.history_size = history_size
        self.memory_ms = memory_ms
        self.where = where
        self.operation = operation
        self.note = note

    def _op(self, what: str, entry: str, slot_ms: int,
            op: Callable[[Space, Fence, MemoryStart, Run | None, int], T]) -> T:
        """``op(space, fence, start, run_or_None, now)`` under the lock, after the memory start
        was read."""
        with self.operation(what) as (server, space, now):
            start = self.note(server, space, now, claiming=False)
            fence = fences(space, [entry], now)[entry]
            return op(space, fence, start, record_of(space, entry, slot_ms, now), now)

    def _event(self, space: Space, run: Run, event: RunEvent, now: int, *, detail: str = "",
               task_id: str | None = None) -> None:
        """A lease event in the run's history: it replaces the run's record (keeping its task id
        unless given, and the dead attempt's record when a takeover replaces it); the entry's
        history is trimmed after it."""
        record = HistoryRecord(run.entry, run.slot_ms, event, self.instance_id, now,
                               task_id or "", run.attempt, detail)
        history.write(space, record, keep_task_id=task_id is None, chained=True)
        history.trim(space, {run.entry}, self.history_size)

    def _end(self, space: Space, run: Run, state: RunState, event: RunEvent, now: int,
             detail: str) -> None:
        """The run ends in ``state`` (kept for the memory), recorded as ``event``."""
        run.state, run.keep_until_ms = state, now + self.memory_ms
        self._event(space, run, event, now, detail=detail)

    def _ended_by_pause(self, space: Space, run: Run, now: int) -> bool:
        """If the entry is paused, the run ends paused, recorded once with the pause's
        description (a pause stops takeovers and adoptions, checked atomically with the pause as
        a claim checks it); True."""
        stored = space.stored.get(run.entry)
        if stored is None or stored.pause is None:
            return False
        self._end(space, run, RunState.PAUSED, RunEvent.PAUSED, now, stored.pause.describe())
        return True

    def inspect(self, entry: str, slot_ms: int) -> LeasedRun | None:
        """The run's record (``store_ms``: now), or ``None``."""
        with self.operation("inspect a run") as (_, space, now):
            run = record_of(space, entry, slot_ms, now)
            return leased(run, now) if run is not None else None

    def expired_runs(self, entries: Iterable[str]) -> list[LeasedRun]:
        """The runs of ``entries`` started with an expired lease or queued past their deadline,
        by entry and slot."""
        names = sorted(set(entries))
        with self.operation("find expired runs") as (_, space, now):
            runs = [leased(run, now) for name in names
                    for _, run in sorted(space.runs.get(name, {}).items())]
            return [run for run in runs if run.expired]

    def take_over(self, entry: str, slot_ms: int, expected_token: int, *, queue_timeout_ms: int,
                  max_attempts: int, task_id: str = "") -> tuple[TakeoverOutcome, LeasedRun | None]:
        """One compare-and-set on ``expected_token``, then, in the contract's order
        (:meth:`~celery_anarchon.stores.parts.Leases.take_over`): paused, given up (the
        store may have lost writes to the record), superseded, given up (max_attempts), taken."""
        me = self.instance_id

        def op(space: Space, fence: Fence, start: MemoryStart, run: Run | None, now: int):
            # this instance's own takeover, asked again after its reply was lost: the same answer
            if (run is not None and run.state is RunState.QUEUED and run.owner == me
                    and run.prev_token == expected_token):
                return TakeoverOutcome.TAKEN, leased(run, now)
            if (run is None or run.token != expected_token or run.state not in OPEN_STATES
                    or not leased(run, now).expired):
                return TakeoverOutcome.REFUSED, (leased(run, now) if run is not None else None)
            if self._ended_by_pause(space, run, now):
                return TakeoverOutcome.PAUSED, leased(run, now)
            begun = memory_start(fence, start)
            if slot_ms < begun + LATENESS_TOLERANCE_MS:
                # claimed before the memory began again: its release or adoption may be lost, so
                # a second attempt could run the body twice (a possible miss, never a second run)
                why = ("it was queued before the store lost writes, so its adoption may be lost "
                       "and its first message may still be in the broker"
                       if run.state is RunState.QUEUED
                       else "its lease record may be stale after the store lost writes")
                self._end(space, run, RunState.GIVEN_UP, RunEvent.GIVEN_UP, now, (
                    f"not taken over: {why} (a possible miss; the store's memory began again at "
                    f"{iso(begun)}{since(fence, start, ' (amnesia)')})"))
                return TakeoverOutcome.GIVEN_UP, leased(run, now)
            if not run.requested and fence.newest_slot is not None and fence.newest_slot > slot_ms:
                self._end(space, run, RunState.SUPERSEDED, RunEvent.SUPERSEDED, now,
                          f"a newer slot {iso(fence.newest_slot)} was claimed")
                return TakeoverOutcome.SUPERSEDED, leased(run, now)
            if run.attempt >= max_attempts:
                self._end(space, run, RunState.GIVEN_UP, RunEvent.GIVEN_UP, now,
                          f"no attempt finished after {run.attempt} of {max_attempts}")
                return TakeoverOutcome.GIVEN_UP, leased(run, now)
            why = (f"the lease of attempt {run.attempt} (token {expected_token}, runner "
                   f"{run.owner}) expired" if run.state is RunState.STARTED else
                   f"attempt {run.attempt} (token {expected_token}) was queued past its deadline")
            run.state, run.attempt, run.prev_token = RunState.QUEUED, run.attempt + 1, expected_token
            run.token, run.owner = fence.issue_token(now), me
            run.lease_expires_ms, run.queue_deadline_ms = None, now + queue_timeout_ms
            self._event(space, run, RunEvent.TAKEN_OVER, now, task_id=task_id, detail=why)
            return TakeoverOutcome.TAKEN, leased(run, now)
        return self._op("take over a run", entry, slot_ms, op)

    def adopt(self, entry: str, slot_ms: int, owner: str,
              duration_ms: int) -> tuple[bool, LeasedRun | None]:
        """A queued run (any attempt's message), or one started with an expired lease, becomes
        started: a new token, ``owner``, lease until now + ``duration_ms``; when its entry is
        paused it ends paused instead. Any other message of the run is dropped."""
        def op(space: Space, fence: Fence, start: MemoryStart, run: Run | None, now: int):
            if run is None:
                return False, None
            if not (run.state is RunState.QUEUED or leased(run, now).expired):
                return False, leased(run, now)
            if self._ended_by_pause(space, run, now):
                return False, leased(run, now)
            run.state, run.token, run.owner = RunState.STARTED, fence.issue_token(now), owner
            run.lease_expires_ms, run.queue_deadline_ms = now + duration_ms, None
            self._event(space, run, RunEvent.STARTED, now, detail=f"adopted by {owner}")
            return True, leased(run, now)
        return self._op("adopt a run", entry, slot_ms, op)

    def _recreate(self, space: Space, fence: Fence, entry: str, slot_ms: int, token: int,
                  owner: str, lease_expires_ms: int | None) -> Run:
        """The record the store forgot, re-created started by its runner's ``token``."""
        run = space.runs.setdefault(entry, {})[slot_ms] = Run(
            entry, slot_ms, RunState.STARTED, 1, token, owner, lease_expires_ms=lease_expires_ms)
        fence.last_token = max(fence.last_token, token)
        return run

    def renew(self, entry: str, slot_ms: int, token: int, owner: str,
              duration_ms: int) -> LeasedRun | None:
        """The lease held with ``token`` until now + ``duration_ms``; ``None`` when the token is
        stale. A record the store forgot (its slot before the memory start + tolerance) is
        re-created by its live runner; one missing while the memory is intact was pruned after
        its run ended: ``None`` (docs/design.md "Leases": Heartbeat)."""
        def op(space: Space, fence: Fence, start: MemoryStart, run: Run | None, now: int):
            if run is None:
                if slot_ms >= memory_start(fence, start) + LATENESS_TOLERANCE_MS:
                    return None
                run = self._recreate(space, fence, entry, slot_ms, token, owner, now + duration_ms)
                log.warning("%s: the record of run %r %s was missing; re-created by its runner %s",
                            self.where, entry, log_time(slot_ms), owner)
                return leased(run, now)
            if run.token != token or run.state is not RunState.STARTED:
                return None
            run.lease_expires_ms = now + duration_ms
            return leased(run, now)
        return self._op("renew a lease", entry, slot_ms, op)

    def release(self, entry: str, slot_ms: int, token: int) -> bool:
        """Finished, if ``token`` is current. A record the store forgot is re-created finished
        with ``token``: the body ran, so the run is neither taken over nor given up later."""
        def op(space: Space, fence: Fence, start: MemoryStart, run: Run | None, now: int):
            detail = ""
            if run is None and slot_ms < memory_start(fence, start) + LATENESS_TOLERANCE_MS:
                run = self._recreate(space, fence, entry, slot_ms, token, "", None)
                detail = "released by its runner after the store forgot the run"
            if run is None or run.token != token or run.state is not RunState.STARTED:
                return False
            self._end(space, run, RunState.FINISHED, RunEvent.FINISHED, now, detail)
            return True
        return self._op("release a lease", entry, slot_ms, op)

    def requeue(self, entry: str, slot_ms: int, token: int, *, delay_ms: int,
                queue_timeout_ms: int) -> bool:
        """A retry hands the run back: queued, deadline = now + ``delay_ms`` +
        ``queue_timeout_ms``, attempt and token unchanged, if ``token`` is current."""
        def op(space: Space, fence: Fence, start: MemoryStart, run: Run | None, now: int):
            if run is None or run.token != token or run.state is not RunState.STARTED:
                return False
            run.state, run.lease_expires_ms = RunState.QUEUED, None
            run.queue_deadline_ms = now + delay_ms + queue_timeout_ms
            return True
        return self._op("requeue a run", entry, slot_ms, op)
