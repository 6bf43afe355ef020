"""Lease operations of the SQL stores (docs/design.md "Leases"): a part of
:class:`~celery_anarchon.stores.sql.store.SQLStore`, given what it needs of the store.

Every operation is one transaction that first locks the entry's row of ``anarchon_entries``
(which serializes it with claims and other lease changes of the entry), reads the store's clock,
then compares and sets the run's record. Instants are UTC ms on the store's clock; durations ms.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa

from celery_anarchon._util import iso, log_time
from celery_anarchon.errors import StoreUnavailable
from celery_anarchon.stores.base import (
    LATENESS_TOLERANCE_MS, LeasedRun, RunEvent, RunState, TakeoverOutcome,
)
from celery_anarchon.stores.parts import Leases
from celery_anarchon.stores.sql import schema
from celery_anarchon.stores.sql.memory import Fence

if TYPE_CHECKING:
    from collections.abc import Iterable

log = logging.getLogger(__name__)
T = TypeVar("T")


class SQLLeases(Leases):
    """inspect, expired_runs, take_over, adopt, renew, release, requeue: the ``leases`` part of
    the SQL stores (:class:`~celery_anarchon.stores.parts.Leases`).

    :param run: ``run(what, work, *, write=True, unconfirmed=None)``: ``work(conn)`` in one
        transaction of the store, driver errors turned into StoreUnavailable.
    :param lock_entries: ``lock_entries(conn, names, note)``: the entries' fences, rows locked.
    :param note_store: ``note_store(conn, claiming=False)``: the store-wide note (epoch checked).
    :param save_fences: ``save_fences(conn, fences)``: write the fences that changed.
    :param now_us: ``now_us(conn)``: the store's clock, UTC microseconds.
    :param history_row: ``history_row(entry, slot_ms, event, now, **fields)``: a history row.
    :param write_history: ``write_history(conn, rows, *, replace, keep_task_id, chained)``.
    :param pauses: ``pauses(conn, names)``: the entries' pauses (read after the entry's row is
        locked, as a claim reads them: a pause committed before the operation holds).
    """

    def __init__(self, *, namespace: str, instance_id: str, memory_ms: int, kind: str,
                 safe_url: str, run: Callable[..., Any],
                 lock_entries: Callable[..., dict[str, Fence]], note_store: Callable[..., Any],
                 save_fences: Callable[..., None], now_us: Callable[..., int],
                 history_row: Callable[..., dict], write_history: Callable[..., None],
                 pauses: Callable[..., dict[str, Any]]) -> None:
        self.namespace = namespace
        self.instance_id = instance_id
        self.memory_ms = memory_ms
        self.kind = kind
        self.safe_url = safe_url
        self._run = run
        self._lock_entries = lock_entries
        self._note_store = note_store
        self._save_fences = save_fences
        self._now_us = now_us
        self._history_row = history_row
        self._write_history = write_history
        self._pauses = pauses

    def _lease_op(self, what: str, entry: str, slot_ms: int,
                  op: Callable[[sa.Connection, Fence, dict | None, int], T],
                  unconfirmed: Callable[[T], T] | None = None) -> T:
        """Run ``op(conn, fence, run_or_None, now_us)`` with the entry locked (after the store's
        epoch was checked: docs/design.md "Amnesia"), then save the fence."""
        def work(conn: sa.Connection) -> T:
            note = self._note_store(conn, claiming=False)
            fences = self._lock_entries(conn, [entry], note)
            now_us = self._now_us(conn)
            run = _read_run(conn, self.namespace, entry, slot_ms)
            result = op(conn, fences[entry], run, now_us)
            self._save_fences(conn, fences)
            return result
        return self._run(what, work, unconfirmed=unconfirmed)

    def _lease_event(self, conn: sa.Connection, run: dict, event: RunEvent, now: int, *,
                     detail: str = "", task_id: str | None = None) -> None:
        row = self._history_row(run["entry"], run["slot_ms"], event, now, task_id=task_id or "",
                                attempt=run["attempt"], detail=detail)
        self._write_history(conn, [row], replace=True, keep_task_id=task_id is None, chained=True)

    def _ended_by_pause(self, conn: sa.Connection, run: dict, now: int) -> bool:
        """If the run's entry is paused: the run ends paused, recorded once with the pause's
        description (docs/design.md "Leases": a pause stops takeovers and adoptions); True."""
        pause = self._pauses(conn, [run["entry"]]).get(run["entry"])
        if pause is None:
            return False
        _update_run(conn, run, state=RunState.PAUSED.value, keep_until_ms=now + self.memory_ms)
        self._lease_event(conn, run, RunEvent.PAUSED, now, detail=pause.describe())
        return True

    def inspect(self, entry: str, slot_ms: int) -> LeasedRun | None:
        """The record of one leased run (``store_ms`` = now), or None. :raises StoreUnavailable:"""
        def work(conn: sa.Connection) -> LeasedRun | None:
            now = self._now_us(conn) // 1000
            run = _read_run(conn, self.namespace, entry, slot_ms)
            return _leased(run, now) if run else None
        return self._run("inspect a run", work, write=False)

    def expired_runs(self, entries: Iterable[str]) -> list[LeasedRun]:
        """Runs of ``entries`` started with an expired lease or queued past their deadline, on the
        store's clock (docs/design.md "Leases": Takeover). :raises StoreUnavailable:"""
        names = sorted(set(entries))
        if not names:
            return []
        r = schema.runs

        def work(conn: sa.Connection) -> list[LeasedRun]:
            now = self._now_us(conn) // 1000
            rows = conn.execute(sa.select(r).where(
                r.c.namespace == self.namespace, r.c.entry.in_(names), schema.open_run,
                sa.or_(sa.and_(r.c.state == "started", r.c.lease_expires_ms < now),
                       sa.and_(r.c.state == "queued", r.c.queue_deadline_ms < now)),
            ).order_by(r.c.entry, r.c.slot_ms)).mappings()
            return [_leased(dict(row), now) for row in rows]
        return self._run("find expired runs", work, write=False)

    def take_over(self, entry: str, slot_ms: int, expected_token: int, *,
                  queue_timeout_ms: int, max_attempts: int,
                  task_id: str = "") -> tuple[TakeoverOutcome, LeasedRun | None]:
        """Compare-and-set on ``expected_token`` (docs/design.md "Leases": Takeover): REFUSED unless
        the run is still expired with that token; PAUSED when its entry is paused (the run ends);
        SUPERSEDED when a newer scheduled slot was claimed (never a run-now request's run);
        GIVEN_UP after ``max_attempts``; else TAKEN: queued again as the next attempt with a new
        token and deadline = now + ``queue_timeout_ms``, recorded ``taken_over`` with
        ``task_id`` (the dead attempt's record kept in ``earlier``). The record keeps the token it replaced, so this
        instance's retry with the same ``expected_token`` (its first reply was lost) answers TAKEN
        again with the same record while the run is still queued (docs/design.md "Leases":
        Takeover). A run whose
        slot is older than the entry's effective memory start + tolerance (an epoch change or
        amnesia since it was claimed: the store may have lost writes to its record, such as its
        release) is never taken over: LOST, with a history detail saying why (docs/design.md
        "Leases": a possible miss, never a second run of the body).

        :raises StoreUnavailable: the outcome is unknown (also: committed on the primary but not
            confirmed by a synchronous standby in time); retry with the same expected token.
        """
        def op(conn, fence: Fence, run: dict | None, now_us: int):
            now = now_us // 1000
            if (run is not None and run["state"] == "queued" and run["owner"] == self.instance_id
                    and run.get("prev_token") == expected_token):
                return TakeoverOutcome.TAKEN, _leased(run, now)
            if (run is None or run["token"] != expected_token or run["state"] not in schema.OPEN_STATES
                    or not _expired(run, now)):
                return TakeoverOutcome.REFUSED, (_leased(run, now) if run else None)
            if self._ended_by_pause(conn, run, now):
                return TakeoverOutcome.PAUSED, _leased(run, now)
            begun = fence.memory_start_ms
            if slot_ms < begun + LATENESS_TOLERANCE_MS:
                # the store may have lost writes to this record (its release, its adoption)
                why = "its lease record may be stale after the store lost writes"
                if run["state"] == "queued":
                    why = ("it was queued before the store lost writes, so its adoption may be "
                           "lost and its first message may still be in the broker")
                since = fence.memory_detail if begun == fence.store_born_ms else " (amnesia)"
                _update_run(conn, run, state="given_up", keep_until_ms=now + self.memory_ms)
                self._lease_event(conn, run, RunEvent.GIVEN_UP, now, detail=(
                    f"not taken over: {why} (a possible miss; the store's memory began again at "
                    f"{iso(begun)}{since})"))
                return TakeoverOutcome.GIVEN_UP, _leased(run, now)
            if (not run.get("requested") and fence.newest_slot is not None
                    and fence.newest_slot > slot_ms):
                _update_run(conn, run, state="superseded", keep_until_ms=now + self.memory_ms)
                self._lease_event(conn, run, RunEvent.SUPERSEDED, now,
                                  detail=f"a newer slot {iso(fence.newest_slot)} was claimed")
                return TakeoverOutcome.SUPERSEDED, _leased(run, now)
            if run["attempt"] >= max_attempts:
                _update_run(conn, run, state="given_up", keep_until_ms=now + self.memory_ms)
                self._lease_event(conn, run, RunEvent.GIVEN_UP, now,
                                  detail=f"no attempt finished after {run['attempt']} of {max_attempts}")
                return TakeoverOutcome.GIVEN_UP, _leased(run, now)
            why = (f"the lease of attempt {run['attempt']} (token {expected_token}, runner "
                   f"{run['owner']}) expired" if run["state"] == "started" else
                   f"attempt {run['attempt']} (token {expected_token}) was queued past its deadline")
            _update_run(conn, run, state="queued", attempt=run["attempt"] + 1,
                             prev_token=expected_token,
                             token=fence.issue_token(now_us), owner=self.instance_id,
                             lease_expires_ms=None, queue_deadline_ms=now + queue_timeout_ms)
            self._lease_event(conn, run, RunEvent.TAKEN_OVER, now, task_id=task_id, detail=why)
            return TakeoverOutcome.TAKEN, _leased(run, now)

        def unconfirmed(answer):
            if answer[0] is TakeoverOutcome.REFUSED:
                return answer
            raise StoreUnavailable(f"{self.kind} store {self.safe_url}: the takeover of {entry!r} "
                                   f"{iso(slot_ms)} committed on the primary, but no synchronous "
                                   "standby confirmed it in time; retry it with the same token")
        return self._lease_op("take over a run", entry, slot_ms, op, unconfirmed)

    def adopt(self, entry: str, slot_ms: int, owner: str, duration_ms: int) -> tuple[bool, LeasedRun | None]:
        """Worker side: adopt a queued run (or one started with an expired lease): started, new
        token, ``owner``, lease until now + ``duration_ms``; when its entry is paused it ends
        paused instead (not adopted). :returns: ``(adopted, record)``.
        :raises StoreUnavailable:"""
        def op(conn, fence: Fence, run: dict | None, now_us: int):
            now = now_us // 1000
            if run is None:
                return False, None
            if not (run["state"] == "queued" or (run["state"] == "started" and _expired(run, now))):
                return False, _leased(run, now)
            if self._ended_by_pause(conn, run, now):
                return False, _leased(run, now)
            _update_run(conn, run, state="started", token=fence.issue_token(now_us), owner=owner,
                             lease_expires_ms=now + duration_ms, queue_deadline_ms=None)
            self._lease_event(conn, run, RunEvent.STARTED, now, detail=f"adopted by {owner}")
            return True, _leased(run, now)
        return self._lease_op("adopt a run", entry, slot_ms, op)

    def renew(self, entry: str, slot_ms: int, token: int, owner: str, duration_ms: int) -> LeasedRun | None:
        """Extend the lease held with ``token`` to now + ``duration_ms``; None when the token is
        stale. A missing record is re-created with this token only when the store forgot it (the
        slot is older than the entry's effective memory start + tolerance: amnesia, an epoch
        change; docs/design.md "Leases": Heartbeat); missing while the memory is intact, it was pruned
        after its run ended: None (docs/design.md "Leases": Heartbeat). :raises StoreUnavailable:"""
        def op(conn, fence: Fence, run: dict | None, now_us: int):
            now = now_us // 1000
            if run is None and slot_ms >= fence.memory_start_ms + LATENESS_TOLERANCE_MS:
                return None
            if run is None:
                run = {"namespace": self.namespace, "entry": entry, "slot_ms": slot_ms,
                       "state": "started", "attempt": 1, "token": token, "owner": owner,
                       "lease_expires_ms": now + duration_ms, "queue_deadline_ms": None,
                       "keep_until_ms": None, "prev_token": None}
                conn.execute(sa.insert(schema.runs).values(**run))
                if token > fence.last_token:
                    fence.last_token, fence.changed = token, True
                log.warning("%s store %s: the record of run %r %s was missing; re-created by its "
                            "runner %s", self.kind, self.safe_url, entry, log_time(slot_ms), owner)
                return _leased(run, now)
            if run["token"] != token or run["state"] != "started":
                return None
            _update_run(conn, run, lease_expires_ms=now + duration_ms)
            return _leased(run, now)
        return self._lease_op("renew a lease", entry, slot_ms, op)

    def release(self, entry: str, slot_ms: int, token: int) -> bool:
        """The runner is done: finished, if ``token`` is current. A missing record the store
        forgot (the slot is older than the entry's effective memory start + tolerance: amnesia,
        an epoch change) is re-created finished with ``token``, as :meth:`renew` re-creates it
        started: the body ran, so the run is neither answered taken over nor later given up as
        a possible miss. :raises StoreUnavailable:"""
        def op(conn, fence: Fence, run: dict | None, now_us: int):
            now, detail = now_us // 1000, ""
            if run is None and slot_ms < fence.memory_start_ms + LATENESS_TOLERANCE_MS:
                run = {"namespace": self.namespace, "entry": entry, "slot_ms": slot_ms,
                       "state": "started", "attempt": 1, "token": token, "owner": "",
                       "lease_expires_ms": None, "queue_deadline_ms": None,
                       "keep_until_ms": None, "prev_token": None}
                conn.execute(sa.insert(schema.runs).values(**run))
                if token > fence.last_token:
                    fence.last_token, fence.changed = token, True
                detail = "released by its runner after the store forgot the run"
            if run is None or run["token"] != token or run["state"] != "started":
                return False
            _update_run(conn, run, state="finished", keep_until_ms=now + self.memory_ms)
            self._lease_event(conn, run, RunEvent.FINISHED, now, detail=detail)
            return True
        return self._lease_op("release a lease", entry, slot_ms, op)

    def requeue(self, entry: str, slot_ms: int, token: int, *, delay_ms: int,
                queue_timeout_ms: int) -> bool:
        """A retry hands the run back: queued, deadline = now + ``delay_ms`` +
        ``queue_timeout_ms``, same attempt and token, if ``token`` is current. :raises StoreUnavailable:"""
        def op(conn, fence: Fence, run: dict | None, now_us: int):
            if run is None or run["token"] != token or run["state"] != "started":
                return False
            now = now_us // 1000
            _update_run(conn, run, state="queued", lease_expires_ms=None,
                             queue_deadline_ms=now + delay_ms + queue_timeout_ms)
            return True
        return self._lease_op("requeue a run", entry, slot_ms, op)


def _read_run(conn: sa.Connection, namespace: str, entry: str, slot_ms: int) -> dict | None:
    """The run's row of ``anarchon_runs`` as a dict, or None."""
    r = schema.runs
    row = conn.execute(sa.select(r).where(r.c.namespace == namespace, r.c.entry == entry,
                                          r.c.slot_ms == slot_ms)).mappings().first()
    return dict(row) if row is not None else None


def _update_run(conn: sa.Connection, run: dict, **values: Any) -> None:
    """Write ``values`` into the run's row and into ``run``."""
    r = schema.runs
    run.update(values)
    conn.execute(sa.update(r).where(r.c.namespace == run["namespace"], r.c.entry == run["entry"],
                                    r.c.slot_ms == run["slot_ms"]).values(**values))


def _leased(run: dict, now: int) -> LeasedRun:
    """The run's row as a :class:`LeasedRun` read at ``now`` (store ms)."""
    return LeasedRun(entry=run["entry"], slot_ms=run["slot_ms"], state=RunState(run["state"]),
                     attempt=run["attempt"], token=run["token"], owner=run["owner"],
                     lease_expires_ms=run["lease_expires_ms"],
                     queue_deadline_ms=run["queue_deadline_ms"], store_ms=now)


def _expired(run: dict, now: int) -> bool:
    """A started run whose lease ended, or a queued run past its deadline, at ``now``."""
    if run["state"] == "started":
        return run["lease_expires_ms"] is not None and run["lease_expires_ms"] < now
    if run["state"] == "queued":
        return run["queue_deadline_ms"] is not None and run["queue_deadline_ms"] < now
    return False
