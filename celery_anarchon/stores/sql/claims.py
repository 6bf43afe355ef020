"""The claim decisions of the SQL stores: one batch in one transaction, every run checked in the
order of the contract (:mod:`celery_anarchon.stores.base`, :mod:`.entry_store`): already claimed,
paused, forgotten, late, early, then for leased runs superseded (scheduled slots only: a run-now
request's run is its own run, never superseded by a newer scheduled slot and never superseding one)
and overlapping (another run of the entry alive); else won. A part of
:class:`~celery_anarchon.stores.sql.store.SQLStore`, given what it needs of the store. Instants are
UTC ms on the store's clock.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from celery_anarchon._util import iso
from celery_anarchon.errors import StoreUnavailable
from celery_anarchon.stores.base import (
    LATENESS_TOLERANCE_MS, ClaimRequest, ClaimResult, Outcome, RunEvent, RunState,
)
from celery_anarchon.stores.sql import schema
from celery_anarchon.stores.sql.history import SQLHistory
from celery_anarchon.stores.sql.memory import Fence, StoreNote

log = logging.getLogger(__name__)

#: Claimed runs looked up per statement (keeps bind parameters far below every server's limit).
_LOOKUP_CHUNK = 500
_TOL = LATENESS_TOLERANCE_MS
_RUN_KEY = ("namespace", "entry", "slot_ms")


@dataclasses.dataclass
class _Open:
    """A leased run in flight (queued or started), as the overlap check needs it."""

    state: str
    attempt: int
    lease_expires_ms: int | None
    queue_deadline_ms: int | None
    requested: bool = False       #: the run of a run-now request

    def alive(self, now_ms: int) -> bool:
        if self.state == "queued":
            return self.queue_deadline_ms is not None and self.queue_deadline_ms >= now_ms
        return self.lease_expires_ms is not None and self.lease_expires_ms >= now_ms


@dataclasses.dataclass
class _ClaimWrites:
    """What one claim batch writes, collected while deciding and written in a few statements."""

    claims: list[dict] = dataclasses.field(default_factory=list)
    new_runs: list[dict] = dataclasses.field(default_factory=list)
    superseded_runs: list[dict] = dataclasses.field(default_factory=list)
    skip_history: dict[tuple, dict] = dataclasses.field(default_factory=dict)      # fill only
    claimed_history: dict[tuple, dict] = dataclasses.field(default_factory=dict)   # replace
    superseded_history: dict[tuple, dict] = dataclasses.field(default_factory=dict)  # keep task id


class SQLClaims:
    """Decides a batch of claims inside the store's transaction and writes what it decided.

    :param insert: ``insert(table)``: the dialect's INSERT (with ON CONFLICT).
    :param note_store: ``note_store(conn, claiming=True)``: the store-wide note (epoch checked).
    :param lock_entries: ``lock_entries(conn, names, note)``: the entries' fences, rows locked.
    :param pauses: ``pauses(conn, names)``: the entries' pauses (read after the rows are locked:
        a pause written before the claim took them holds).
    :param save_fences: ``save_fences(conn, fences)``: write the fences that changed.
    :param now_us: ``now_us(conn)``: the store's clock, UTC microseconds.
    :param history: the store's history part (rows written in the same transaction).
    """

    def __init__(self, *, namespace: str, instance_id: str, memory_s: float, memory_ms: int,
                 insert: Callable[[sa.Table], Any], note_store: Callable[..., Any],
                 lock_entries: Callable[..., dict[str, Fence]],
                 pauses: Callable[[sa.Connection, Any], dict[str, Any]],
                 save_fences: Callable[..., None], now_us: Callable[[sa.Connection], int],
                 history: SQLHistory) -> None:
        self.namespace = namespace
        self.instance_id = instance_id
        self.memory_s = memory_s
        self.memory_ms = memory_ms
        self._insert = insert
        self._note_store = note_store
        self._lock_entries = lock_entries
        self._pauses = pauses
        self._save_fences = save_fences
        self._now_us = now_us
        self._history = history

    def decide(self, conn: sa.Connection, requests: list[ClaimRequest]) -> list[ClaimResult]:
        note = self._note_store(conn, claiming=True)
        fences = self._lock_entries(conn, (r.entry for r in requests), note)
        pauses = self._pauses(conn, {r.entry for r in requests})
        now_us = self._now_us(conn)
        now = now_us // 1000
        held = self._read_claims(conn, {r.run for r in requests}, now)
        opened = self._read_open_runs(conn, {r.entry for r in requests if r.lease is not None})
        writes = _ClaimWrites()
        results = [self._decide(r, fences[r.entry], held, opened, now_us, writes, note,
                                pauses.get(r.entry)) for r in requests]
        self._write_claims(conn, writes, fences)
        return results

    def unconfirmed(self, results: list[ClaimResult], *, run: Callable[..., Any], kind: str,
                    safe_url: str, confirm_timeout: float) -> list[ClaimResult]:
        """The claim committed, but not durably as the store's durability asks: every win is
        UNCONFIRMED (never sent; docs/design.md "Amnesia": durable claim) and its history says
        so (best effort, in a transaction of its own: ``run``, the store's). A retry of the same
        claim is confirmed again (its commit waits again) before it answers WON.

        :param confirm_timeout: seconds the commit waited (named in the detail).
        """
        detail = ("committed on the primary, but no synchronous standby confirmed it within "
                  f"confirm_timeout {confirm_timeout:g} s")
        answers = [dataclasses.replace(r, outcome=Outcome.UNCONFIRMED, token=None, detail=detail)
                   if r.outcome is Outcome.WON else r for r in results]
        rows = {r.request.run: r for r in answers if r.outcome is Outcome.UNCONFIRMED}
        log.warning("%s store %s: %d won claim(s) not confirmed durable in time: not sent",
                    kind, safe_url, len(rows))

        def work(conn: sa.Connection) -> None:
            self._lock_entries(conn, {entry for entry, _ in rows})
            now = self._now_us(conn) // 1000
            self._history.write(conn, [
                self._history.row(r.entry, r.slot_ms, RunEvent.UNCONFIRMED, now,
                                  task_id=r.request.task_id, attempt=r.attempt, detail=detail)
                for r in rows.values()], replace=True)
        if rows:
            try:
                run("record unconfirmed claims", work, durable=False)
            except StoreUnavailable as error:
                log.warning("%s", error)
        return answers

    def _read_claims(self, conn: sa.Connection, runs: set[tuple[str, int]], now: int) -> dict:
        """Claims still remembered: (entry, slot) -> (winner, fingerprint, token, attempt,
        owner of the run's current attempt)."""
        c, r = schema.claims, schema.runs
        joined = c.outerjoin(r, sa.and_(r.c.namespace == c.c.namespace, r.c.entry == c.c.entry,
                                        r.c.slot_ms == c.c.slot_ms))
        held: dict = {}
        ordered = sorted(runs)
        for i in range(0, len(ordered), _LOOKUP_CHUNK):
            rows = conn.execute(
                sa.select(c.c.entry, c.c.slot_ms, c.c.winner, c.c.fingerprint, r.c.token, r.c.attempt,
                          r.c.owner)
                .select_from(joined)
                .where(c.c.namespace == self.namespace, c.c.keep_until_ms >= now,
                       sa.tuple_(c.c.entry, c.c.slot_ms).in_(ordered[i:i + _LOOKUP_CHUNK])))
            for row in rows:
                held[(row.entry, row.slot_ms)] = (row.winner, row.fingerprint, row.token, row.attempt,
                                                  row.owner)
        return held

    def _read_open_runs(self, conn: sa.Connection, names: set[str]) -> dict[str, dict[int, _Open]]:
        r = schema.runs
        opened: dict[str, dict[int, _Open]] = {name: {} for name in names}
        if names:
            for row in conn.execute(
                    sa.select(r.c.entry, r.c.slot_ms, r.c.state, r.c.attempt, r.c.lease_expires_ms,
                              r.c.queue_deadline_ms, r.c.requested)
                    .where(r.c.namespace == self.namespace, r.c.entry.in_(sorted(names)),
                           schema.open_run)):
                opened[row.entry][row.slot_ms] = _Open(row.state, row.attempt, row.lease_expires_ms,
                                                       row.queue_deadline_ms, bool(row.requested))
        return opened

    def _refusal(self, r: ClaimRequest, fence: Fence, now: int) -> tuple[Outcome, str] | None:
        """Forgotten, late or early on the store's clock, or None."""
        slot = r.slot_ms
        begun = fence.memory_start_ms
        if slot < begun + _TOL:
            why = fence.memory_detail if begun == fence.store_born_ms else ""
            return Outcome.FORGOTTEN, (f"store memory began at {iso(begun)}{why}; slots before "
                                       f"{iso(begun + _TOL)} are refused")
        if now - slot >= self.memory_ms:
            return Outcome.FORGOTTEN, f"slot is older than the store's memory of {self.memory_s:g} s"
        if now > slot + r.max_late_ms + _TOL:
            return Outcome.LATE, (f"store clock is {now - slot} ms past the slot (max_late "
                                  f"{r.max_late_ms} ms + tolerance {_TOL} ms)")
        if slot > now + _TOL:
            return Outcome.EARLY, f"slot is {slot - now} ms ahead of the store clock (tolerance {_TOL} ms)"
        return None

    def _decide(self, r: ClaimRequest, fence: Fence, held: dict, opened: dict, now_us: int,
                writes: _ClaimWrites, note: StoreNote, pause: Any = None) -> ClaimResult:
        now = now_us // 1000
        entry, slot = r.run
        if r.run in held:
            winner, fingerprint, token, attempt, owner = held[r.run]
            attempt = attempt or 1
            if winner == self.instance_id and attempt > 1:
                # a claim is for attempt 1: the run was taken over since
                # (docs/design.md "Leases": Takeover)
                return ClaimResult(r, Outcome.OTHER_WON, owner, fingerprint, now, None, attempt,
                                   detail=f"taken over as attempt {attempt}")
            outcome = Outcome.WON if winner == self.instance_id else Outcome.OTHER_WON
            if outcome is Outcome.WON:
                fence.changed = True   # a re-answered win writes, so its commit is confirmed too
            return ClaimResult(r, outcome, winner, fingerprint, now,
                               token if outcome is Outcome.WON else None, attempt)
        if pause is not None:
            refusal = (Outcome.PAUSED, pause.describe())
        elif note.conflict:
            refusal = (Outcome.FORGOTTEN, note.conflict)
        else:
            refusal = self._refusal(r, fence, now)
        if refusal is None and r.lease is not None:
            refusal = self._lease_refusal(r, fence, opened[entry], now, writes)
        if refusal is not None:
            outcome, detail = refusal
            writes.skip_history.setdefault(r.run, self._history.row(
                entry, slot, RunEvent.for_skip(outcome), now, detail=detail))
            return ClaimResult(r, outcome, None, "", now, detail=detail)
        token = None
        if r.lease is not None:
            token = fence.issue_token(now_us)
            if not r.requested:   # the entry's newest slot stays the schedule's
                fence.newest_slot = slot if fence.newest_slot is None else max(fence.newest_slot, slot)
            deadline = now + r.lease.queue_timeout_ms
            writes.new_runs.append({
                "namespace": self.namespace, "entry": entry, "slot_ms": slot, "state": "queued",
                "attempt": 1, "token": token, "owner": self.instance_id, "lease_expires_ms": None,
                "queue_deadline_ms": deadline, "keep_until_ms": None, "prev_token": None,
                "requested": 1 if r.requested else None})
            opened[entry][slot] = _Open("queued", 1, None, deadline, r.requested)
        held[r.run] = (self.instance_id, r.fingerprint, token, 1, self.instance_id)
        writes.claims.append({
            "namespace": self.namespace, "entry": entry, "slot_ms": slot, "winner": self.instance_id,
            "fingerprint": r.fingerprint, "claimed_ms": now,
            "keep_until_ms": max(now, slot) + self.memory_ms})
        writes.claimed_history[r.run] = self._history.row(entry, slot, RunEvent.CLAIMED, now,
                                                          task_id=r.task_id)
        return ClaimResult(r, Outcome.WON, self.instance_id, r.fingerprint, now, token, 1)

    def _lease_refusal(self, r: ClaimRequest, fence: Fence, opened: dict[int, _Open], now: int,
                       writes: _ClaimWrites) -> tuple[Outcome, str] | None:
        """Superseded or overlapping (docs/design.md "Leases": Overlap, Takeover); when the claim may
        proceed, every dead earlier run of the entry becomes superseded. A run-now request's run
        (``r.requested``) is never superseded, and its claim supersedes nothing; a dead run-now
        run is not superseded by a scheduled claim either (it is taken over). Any other live run
        of the entry makes either kind overlapping under ``overlap="skip"``."""
        if (not r.requested and fence.newest_slot is not None
                and fence.newest_slot > r.slot_ms):
            return Outcome.SUPERSEDED, f"a newer slot {iso(fence.newest_slot)} was already claimed"
        others = {s: o for s, o in opened.items() if s != r.slot_ms}
        alive = sorted(s for s, o in others.items() if o.alive(now))
        if alive and not r.lease.overlap_allowed:
            o = others[alive[-1]]
            request = " (this run-now request is skipped: overlap=\"skip\")" if r.requested else ""
            return Outcome.OVERLAPPING, (f"the run of {iso(alive[-1])} is still {o.state} "
                                         f"(attempt {o.attempt}){request}")
        if r.requested:
            return None
        for s, o in others.items():
            if s < r.slot_ms and s not in alive and not o.requested:
                del opened[s]
                writes.superseded_runs.append({"b_ns": self.namespace, "b_entry": r.entry, "b_slot": s,
                                               "b_keep": now + self.memory_ms})
                writes.superseded_history[(r.entry, s)] = self._history.row(
                    r.entry, s, RunEvent.SUPERSEDED, now, attempt=o.attempt,
                    detail=f"its {o.state} lease ended; slot {iso(r.slot_ms)} runs instead")
        return None

    def _write_claims(self, conn: sa.Connection, w: _ClaimWrites, fences: dict[str, Fence]) -> None:
        c, r = schema.claims, schema.runs
        if w.claims:
            ins = self._insert(c)
            conn.execute(ins.on_conflict_do_update(  # an expired claim is replaced, never a live one
                index_elements=_RUN_KEY, where=c.c.keep_until_ms < ins.excluded.claimed_ms,
                set_={k: ins.excluded[k] for k in ("winner", "fingerprint", "claimed_ms", "keep_until_ms")}),
                w.claims)
        if w.new_runs:
            ins = self._insert(r)
            conn.execute(ins.on_conflict_do_update(index_elements=_RUN_KEY, set_={
                k: ins.excluded[k] for k in ("state", "attempt", "token", "owner", "lease_expires_ms",
                                             "queue_deadline_ms", "keep_until_ms", "prev_token")}),
                w.new_runs)
        if w.superseded_runs:
            conn.execute(sa.update(r).where(
                r.c.namespace == sa.bindparam("b_ns"), r.c.entry == sa.bindparam("b_entry"),
                r.c.slot_ms == sa.bindparam("b_slot"), schema.open_run,
            ).values(state=RunState.SUPERSEDED.value, keep_until_ms=sa.bindparam("b_keep")),
                w.superseded_runs)
        self._history.write(conn, list(w.skip_history.values()), replace=False, trim=False)
        self._history.write(conn, list(w.claimed_history.values()), replace=True, trim=False)
        self._history.write(conn, list(w.superseded_history.values()), replace=True, keep_task_id=True,
                            trim=False, chained=True)
        self._history.trim(conn, {run[0] for h in (w.skip_history, w.claimed_history,
                                                   w.superseded_history) for run in h})
        self._save_fences(conn, fences)
