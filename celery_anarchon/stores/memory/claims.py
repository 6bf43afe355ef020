"""The claim decision order, in readable Python: the rules the Redis Lua scripts
(:mod:`celery_anarchon.stores.redis.scripts`, :mod:`~celery_anarchon.stores.redis.lease_scripts`)
and the SQL stores (:mod:`celery_anarchon.stores.sql.claims`) apply to each run of a batch, in
the order :mod:`celery_anarchon.stores.base` states, each where a reader meets it in
:meth:`ClaimBatch.decide`:

1. already claimed: the store recognises its own winner (docs/design.md "Who won");
2. paused (:class:`~celery_anarchon.stores.entry_store.Entries`);
3. forgotten: another ``memory`` than the recorded one, a slot before the memory start, or a
   slot older than the memory (docs/design.md "Amnesia", "Timing");
4. late, then early, on the store's clock (docs/design.md "One run, in time" 3);
5. leased runs: superseded by a newer scheduled slot, or overlapping a live run; a dead earlier
   run is superseded by the new one (docs/design.md "Leases": Overlap, Takeover);
6. won: the claim is kept for the memory, and a leased run's record is created queued with a
   new fencing token (docs/design.md "Leases": Queued).

A skip is recorded once in the run's history, never over a claimed run's record. Instants are
UTC ms on the store's clock.
"""
from __future__ import annotations

from celery_anarchon._util import iso
from celery_anarchon.stores.base import (
    LATENESS_TOLERANCE_MS, ClaimRequest, ClaimResult, HistoryRecord, Outcome, RunEvent, RunState,
)
from celery_anarchon.stores.memory import history
from celery_anarchon.stores.memory.notes import MemoryStart, fences, memory_start, since
from celery_anarchon.stores.memory.state import OPEN_STATES, Claim, Fence, Run, Space

_TOL = LATENESS_TOLERANCE_MS


class ClaimBatch:
    """One call of :meth:`~celery_anarchon.stores.base.ClaimStore.claim`, decided under the
    server's lock at one instant of the store's clock.

    :param start: the namespace's memory start, as this operation read it.
    :param now: the store's clock, UTC ms.
    :param instance_id: the claiming instance.
    :param memory_ms: the store's memory, ms (``memory_s`` in seconds, for messages).
    """

    def __init__(self, space: Space, start: MemoryStart, now: int, *, instance_id: str,
                 memory_ms: int, memory_s: float) -> None:
        self.space, self.start, self.now = space, start, now
        self.me = instance_id
        self.memory_ms, self.memory_s = memory_ms, memory_s

    def decide_all(self, requests: list[ClaimRequest], history_size: int) -> list[ClaimResult]:
        """Every request decided in order (a later one sees what an earlier one wrote); the
        entries whose history was written are trimmed once, at the end."""
        self.fences = fences(self.space, {r.entry for r in requests}, self.now)
        results = [self.decide(r) for r in requests]
        history.trim(self.space, {r.entry for r in requests}, history_size)
        return results

    def decide(self, r: ClaimRequest) -> ClaimResult:
        """The answer to one request, in the order of the module docstring."""
        claim = self.space.claims.get(r.run)
        if claim is not None and claim.keep_until_ms >= self.now:
            return self._claimed(r, claim)                                   # 1.
        stored = self.space.stored.get(r.entry)
        if stored is not None and stored.pause is not None:
            refusal = (Outcome.PAUSED, stored.pause.describe())             # 2.
        elif self.start.conflict is not None:
            refusal = (Outcome.FORGOTTEN, self.start.conflict)             # 3.
        else:
            refusal = self._forgotten_late_or_early(r, self.fences[r.entry])  # 3., 4.
        if refusal is None and r.lease is not None:
            refusal = self._superseded_or_overlapping(r, self.fences[r.entry])  # 5.
        if refusal is not None:
            outcome, detail = refusal
            self._note(r.entry, r.slot_ms, RunEvent.for_skip(outcome), how=history.FILL,
                       detail=detail)
            return ClaimResult(r, outcome, None, "", self.now, detail=detail)
        return self._won(r, self.fences[r.entry])                             # 6.

    def _claimed(self, r: ClaimRequest, claim: Claim) -> ClaimResult:
        """1. Already claimed: ``WON`` again for its winner (with the run's current token), else
        ``OTHER_WON`` naming the winner and its definition. A leased run taken over since is
        the taker's: its first winner's retry is ``OTHER_WON`` (docs/design.md "Leases")."""
        run = self.space.runs.get(r.entry, {}).get(r.slot_ms)
        attempt = run.attempt if run is not None else 1
        if claim.winner == self.me and attempt > 1:
            return ClaimResult(r, Outcome.OTHER_WON, run.owner, claim.fingerprint, self.now, None,
                               attempt, detail=f"taken over as attempt {attempt}")
        if claim.winner == self.me:
            token = run.token if run is not None else None
            return ClaimResult(r, Outcome.WON, claim.winner, claim.fingerprint, self.now, token,
                               attempt)
        return ClaimResult(r, Outcome.OTHER_WON, claim.winner, claim.fingerprint, self.now, None,
                           attempt)

    def _forgotten_late_or_early(self, r: ClaimRequest, fence: Fence) -> tuple[Outcome, str] | None:
        """3. Forgotten: the slot is before the entry's memory start + tolerance (a new, wiped or
        restored store may have won it before), or the store's memory cannot reach back to it.
        4. Late: the store's clock is past slot + max_late + tolerance. Early: the slot is more
        than the tolerance ahead of the store's clock."""
        slot, now = r.slot_ms, self.now
        begun = memory_start(fence, self.start)
        if slot < begun + _TOL:
            return Outcome.FORGOTTEN, (f"store memory began at {iso(begun)}"
                                       f"{since(fence, self.start)}; slots before "
                                       f"{iso(begun + _TOL)} are refused")
        if now - slot >= self.memory_ms:
            return Outcome.FORGOTTEN, f"slot is older than the store's memory of {self.memory_s:g} s"
        if now > slot + r.max_late_ms + _TOL:
            return Outcome.LATE, (f"store clock is {now - slot} ms past the slot (max_late "
                                  f"{r.max_late_ms} ms + tolerance {_TOL} ms)")
        if slot > now + _TOL:
            return Outcome.EARLY, f"slot is {slot - now} ms ahead of the store clock (tolerance {_TOL} ms)"
        return None

    def _superseded_or_overlapping(self, r: ClaimRequest, fence: Fence) -> tuple[Outcome, str] | None:
        """5. A leased run: superseded when a newer scheduled slot of the entry was claimed (never
        the run of a run-now request, which is its own run); overlapping when another run of the
        entry is alive and the entry's overlap is ``"skip"`` (a run-now request too, and it
        says so). When it may proceed, every dead earlier scheduled run of the entry is
        superseded by it; a run-now request's claim supersedes nothing."""
        if not r.requested and fence.newest_slot is not None and fence.newest_slot > r.slot_ms:
            return Outcome.SUPERSEDED, f"a newer slot {iso(fence.newest_slot)} was already claimed"
        others = {slot: run for slot, run in self.space.runs.get(r.entry, {}).items()
                  if slot != r.slot_ms and run.state in OPEN_STATES}
        alive = sorted(slot for slot, run in others.items() if run.alive(self.now))
        if alive and not r.lease.overlap_allowed:
            run = others[alive[-1]]
            request = " (this run-now request is skipped: overlap=\"skip\")" if r.requested else ""
            return Outcome.OVERLAPPING, (f"the run of {iso(alive[-1])} is still {run.state.value} "
                                         f"(attempt {run.attempt}){request}")
        if not r.requested:
            for slot, run in others.items():
                if slot < r.slot_ms and slot not in alive and not run.requested:
                    detail = f"its {run.state.value} lease ended; slot {iso(r.slot_ms)} runs instead"
                    run.state, run.keep_until_ms = RunState.SUPERSEDED, self.now + self.memory_ms
                    self._note(r.entry, slot, RunEvent.SUPERSEDED, attempt=run.attempt,
                               detail=detail, keep_task_id=True, chained=True)
        return None

    def _won(self, r: ClaimRequest, fence: Fence) -> ClaimResult:
        """6. Won: the claim is kept until max(now, slot) + memory; a leased run's record is
        created queued, with a new fencing token and a queue deadline of now + queue_timeout,
        and a scheduled slot becomes the entry's newest (what supersedes the older ones)."""
        token = None
        if r.lease is not None:
            token = fence.issue_token(self.now)
            if not r.requested:
                fence.newest_slot = max(r.slot_ms, fence.newest_slot or r.slot_ms)
            self.space.runs.setdefault(r.entry, {})[r.slot_ms] = Run(
                r.entry, r.slot_ms, RunState.QUEUED, 1, token, self.me,
                queue_deadline_ms=self.now + r.lease.queue_timeout_ms, requested=r.requested)
        self.space.claims[r.run] = Claim(self.me, r.fingerprint, self.now,
                                         max(self.now, r.slot_ms) + self.memory_ms)
        self._note(r.entry, r.slot_ms, RunEvent.CLAIMED, task_id=r.task_id)
        return ClaimResult(r, Outcome.WON, self.me, r.fingerprint, self.now, token, 1)

    def _note(self, entry: str, slot_ms: int, event: RunEvent, *, how: str = history.REPLACE,
              task_id: str = "", attempt: int = 1, detail: str = "", keep_task_id: bool = False,
              chained: bool = False) -> None:
        record = HistoryRecord(entry, slot_ms, event, self.me, self.now, task_id, attempt, detail)
        history.write(self.space, record, how=how, keep_task_id=keep_task_id, chained=chained)
