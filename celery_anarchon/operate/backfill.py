"""Backfill: every slot of an entry in a past range runs once (``Schedules.backfill``,
``celery anarchon backfill``; docs/schedules.md "Backfill").

A backfill claims each slot in the store as a beat claims a run (docs/design.md "One run, in
time"), in chunks, oldest first, and sends only the slots it won, itself, through Celery, with
the message beat sends (:func:`~celery_anarchon.schedule.message.task_message`). So a slot
already claimed (sent by a beat, or by another backfill) answers ``other_won`` and is not sent
again: a backfill repeated, two at once, or one overlapping the live schedule sends each slot
once. Its claims carry an instance id of its own, never reused
(``backfill:<request id>:<host>:<pid>:<random>``): a backfill run again after an interruption
does not recognise the claims of the interrupted one as its own, so a slot that one claimed and
may or may not have sent (docs/design.md: "the winning instance dying between its claim and its
send") is never sent twice; the report names such slots.

What it refuses, before it claims anything (each a :class:`~celery_anarchon.errors.ConfigError`
naming the entry, the value and the fix): a range that ends before it starts or ends in the
future (past slots only), one older than the store's memory (the store cannot vouch that such a
slot was not sent), a store whose claims only move forward (Redis ``stream-id``), a leased
entry, a paused entry, more slots than ``max_slots``.
"""
from __future__ import annotations

import dataclasses
import math
import re
import secrets
import socket
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from celery_anarchon._util import iso
from celery_anarchon.limits import shown_value
from celery_anarchon.errors import ConfigError, StoreError, StoreUnavailable
from celery_anarchon.operate.names import check_name
from celery_anarchon.schedule.message import task_message
from celery_anarchon.schedule.plan import EntryPlan, build_plan, task_id_for
from celery_anarchon.schedule.slots import window
from celery_anarchon.schedule.slots.window import SlotsEnded
from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import (
    ClaimRequest, ClaimStore, HistoryRecord, Outcome, RunEvent,
)

#: sends per second, by default (``rate``; ``--rate``)
DEFAULT_RATE = 10.0
#: the most slots one backfill sends unless its caller raises it (``max_slots``; ``--max-slots``)
MAX_SLOTS = 10_000
#: the most slots claimed in one round trip (fewer at a low rate: one second's sends)
CLAIM_CHUNK = 100
#: how many times a chunk's claim is tried when the store does not answer
CLAIM_TRIES = 3
#: the margin, ms, of a backfill's claims: the claim's max_late is now - slot + this (a store
#: that checks lateness accepts the old slot), and a slot within this of the end of the store's
#: memory is not claimed (the memory must outlast the claim, as it must a beat's)
MARGIN_MS = 60_000
#: a request id: what an instance id and a history record can carry as it is
_REQUEST_ID = re.compile(r"[A-Za-z0-9._@+-]{1,100}")
#: the history events that say a run's message was published (or what came after it)
_SENT_EVENTS = frozenset({RunEvent.SENT, RunEvent.STARTED, RunEvent.FINISHED,
                          RunEvent.TAKEN_OVER, RunEvent.GIVEN_UP})
#: the prefix of every backfill's instance id
PREFIX = "backfill:"


class BackfillStopped(StoreError):
    """A backfill stopped before its end: a send failed (the broker), the store could not be
    reached. ``report`` says what was done; run the same backfill again to resume it."""

    def __init__(self, message: str, report: BackfillReport) -> None:
        super().__init__(message)
        self.report = report


@dataclasses.dataclass
class BackfillReport:
    """What a backfill did, slot by slot (UTC ms), as it goes (``progress`` is told it).

    :param instance: the instance id its claims carried.
    :param total: the slots of the range.
    :param sent: the slots it claimed and sent.
    :param already_run: the slots claimed before by a beat or another backfill (not sent again).
    :param not_resent: the slots another backfill claimed whose history showed no send when
        this one ended: that one was interrupted between its claim and its send (or its send
        failed), or it is still running (two at once) and sends them; not sent by this one.
    :param refused: the slots the store refused, by reason (``"late: ..."``, ``"paused: ..."``).
    :param failed: the slots this backfill won whose publish failed (recorded in the history;
        not sent again).
    :param past_history: the slots another backfill claimed older than every run the entry's
        history still holds (it keeps the newest ``history_size``, also a field): sent or not is
        not known here; not sent by this one.
    """

    entry: str
    request_id: str
    instance: str
    start_ms: int
    end_ms: int
    total: int
    sent: list[int] = dataclasses.field(default_factory=list)
    already_run: list[int] = dataclasses.field(default_factory=list)
    not_resent: list[int] = dataclasses.field(default_factory=list)
    refused: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    failed: list[int] = dataclasses.field(default_factory=list)
    past_history: list[int] = dataclasses.field(default_factory=list)
    history_size: int = 0
    #: how many slots another backfill had claimed (this one resumes it, or runs beside it)
    resumed: int = 0
    #: slots claimed by an earlier backfill, told apart by the history at the end
    pending: list[int] = dataclasses.field(default_factory=list, repr=False)

    @property
    def done(self) -> int:
        """The slots handled so far."""
        return (len(self.sent) + len(self.already_run) + len(self.not_resent) + len(self.pending)
                + len(self.failed) + len(self.past_history) + sum(len(v) for v in self.refused.values()))

    def summary(self) -> str:
        """One paragraph for people: the counts, each refusal's reason and the slots not re-sent."""
        lines = [f"backfill {self.request_id} of entry {self.entry!r}, {iso(self.start_ms)} to "
                 f"{iso(self.end_ms)}: {self.total} slots; sent {len(self.sent)}, already run "
                 f"{len(self.already_run)}, refused {sum(len(v) for v in self.refused.values())}"
                 f", not re-sent {len(self.not_resent)}"
                 + (f", send failed {len(self.failed)}" if self.failed else "")
                 + (f", past the history {len(self.past_history)}" if self.past_history else "")]
        for reason, slots in sorted(self.refused.items()):
            lines.append(f"  refused {len(slots)} ({_first(slots)}): {reason}")
        if self.not_resent:
            lines.append(f"  not re-sent {len(self.not_resent)} ({_first(self.not_resent)}): "
                         "claimed by an earlier backfill, history shows no send: not re-sent "
                         "(it was interrupted between its claim and its send, or it is still "
                         "running and sends it)")
        if self.past_history:
            lines.append(f"  past the history {len(self.past_history)} "
                         f"({_first(self.past_history)}): claimed by an earlier backfill, older "
                         "than every run the history still holds (it keeps the entry's newest "
                         f"{self.history_size} runs): whether that backfill sent them is not "
                         "known here (it sends each slot right after its claim, so most likely "
                         "it did); not re-sent")
        if self.failed:
            lines.append(f"  send failed {len(self.failed)} ({_first(self.failed)}): the "
                         "publish failed; recorded in the history, not sent again")
        return "\n".join(lines)

    def as_json(self) -> dict:
        """The report as JSON values (slots as ISO 8601 text)."""
        return {"entry": self.entry, "request_id": self.request_id, "instance": self.instance,
                "from": iso(self.start_ms), "to": iso(self.end_ms), "slots": self.total,
                "sent": [iso(s) for s in self.sent],
                "already_run": [iso(s) for s in self.already_run],
                "not_resent": [iso(s) for s in self.not_resent],
                "refused": {k: [iso(s) for s in v] for k, v in sorted(self.refused.items())},
                "send_failed": [iso(s) for s in self.failed],
                "past_history": [iso(s) for s in self.past_history]}


def _first(slots: list[int]) -> str:
    shown = ", ".join(iso(s) for s in slots[:3])
    return shown + (f", ... {len(slots) - 3} more" if len(slots) > 3 else "")


def instance_id_for(request_id: str) -> str:
    """A backfill's instance id, new on every call: ``backfill:<request id>:<host>:<pid>:<random>``
    (never the id of an earlier run, so the store never takes its claims for this one's)."""
    return f"{PREFIX}{request_id}:{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def instant_ms(name: str, which: str, value: Any) -> int:
    """``start`` or ``end`` of a backfill of entry ``name``, UTC ms.

    :param value: an aware ``datetime``, ISO 8601 text with a UTC offset, or UTC ms (int).
    :raises ConfigError: naming the entry, the bound, the value and the fix
        (:func:`~celery_anarchon.schedule.slots.window.instant_ms`).
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return window.instant_ms(name, which, value,
                             where=f"backfill of entry {name!r}: {which} {shown_value(value)}")


def check_request_id(name: str, request_id: Any) -> str:
    """A backfill's request id: 1 to 100 letters, digits or ``. _ @ + -``.

    :raises ConfigError: naming the entry, the id and the fix.
    """
    if not isinstance(request_id, str) or not _REQUEST_ID.fullmatch(request_id):
        raise ConfigError(f"backfill of entry {name!r}: request id {request_id!r}: not 1 to 100 "
                          "letters, digits or . _ @ + -; fix: give an id such as 'ticket-4711', "
                          "or none (a new one is made and printed)")
    return request_id


def check_store(name: str, store: ClaimStore, start_ms: int, now_ms: int,
                plan: EntryPlan) -> None:
    """Refuse a store that cannot vouch for the range: claims that only move forward, a memory
    that began after the range started (by duration) or that holds fewer runs of the entry than
    the range asks (by count).

    :raises ConfigError: naming the entry, the store, the value and the fix.
    """
    if not store.claims_past_slots:
        raise ConfigError(
            f"backfill of entry {name!r}: the store ({store.describe()}) claims slots in order "
            "only (an older slot is refused once a newer one was claimed), so it cannot backfill; "
            "fix: use the Redis strategy 'lease' (the default), PostgreSQL or SQLite as "
            "anarchon_store_url")
    memory = store.memory
    if memory.duration_s is not None and start_ms < now_ms - memory.duration_s * 1000 + MARGIN_MS:
        raise ConfigError(
            f"backfill of entry {name!r}: the store remembers claims for {memory.duration_s:g} s; "
            f"a backfill from {iso(start_ms)} could send a slot twice; shorten the range (from "
            f"{iso(now_ms - int(memory.duration_s * 1000) + MARGIN_MS)} at the earliest) or "
            f"raise anarchon_store_options[{memory.setting!r}]")
    if memory.count is not None:
        count = 0
        for _ in slots_between(plan, start_ms, now_ms):
            count += 1
            if count > memory.count:
                break
        if count > memory.count:
            raise ConfigError(
                f"backfill of entry {name!r}: the store remembers at most {memory.count} runs of "
                f"an entry, and more than that lie between {iso(start_ms)} and now: a backfill "
                "from there could send a slot twice; shorten the range or raise "
                f"anarchon_store_options[{memory.count_setting!r}]")


def slots_between(plan: EntryPlan, start_ms: int, end_ms: int) -> Iterator[int]:
    """The slots of ``plan``'s entry from ``start_ms`` to ``end_ms``, both included, oldest
    first (none past the entry's ``end_at``)."""
    try:
        slot = plan.slots.next_after(start_ms - 1)
        while slot <= end_ms:
            yield slot
            slot = plan.slots.next_after(slot)
    except SlotsEnded:
        return


class Backfill:
    """One backfill, checked and ready to :meth:`run` (built by :meth:`Backfills.plan_backfill`).

    :param store: the session's store (its URL, namespace and history); the claims go through a
        store of their own, opened by :meth:`run` with :attr:`instance` as its instance id.
    :param slots: the slots of the range, oldest first.
    """

    def __init__(self, *, app, settings, store: ClaimStore, plan: EntryPlan, slots: list[int],
                 start_ms: int, end_ms: int, request_id: str, by: str) -> None:
        self.app, self.settings, self.store, self.plan = app, settings, store, plan
        self.slots, self.start_ms, self.end_ms = slots, start_ms, end_ms
        self.request_id, self.by = request_id, by
        self.instance = instance_id_for(request_id)

    def run(self, *, rate: float = DEFAULT_RATE,
            progress: Callable[[BackfillReport], None] | None = None) -> BackfillReport:
        """Claim every slot (in chunks, oldest first) and send those won, at most ``rate`` a
        second; ``progress`` is told the report after each slot.

        :raises BackfillStopped: a publish failed or the store could not be reached: what was
            done is in ``exc.report``; run the same backfill again to resume.
        """
        if not rate > 0:
            raise ConfigError(f"backfill of entry {self.plan.name!r}: rate {rate!r}: not above 0; "
                              "fix: give sends per second, e.g. 10")
        report = BackfillReport(self.plan.name, self.request_id, self.instance, self.start_ms,
                                self.end_ms, len(self.slots))
        claims = open_store(self.store.url, namespace=self.store.namespace,
                            instance_id=self.instance, options=dict(self.settings.store_options))
        chunk = max(1, min(CLAIM_CHUNK, math.ceil(rate)))
        pace = _Pace(rate)
        try:
            claims.prepare(())
            with self.app.producer_or_acquire() as producer:
                for i in range(0, len(self.slots), chunk):
                    self._chunk(claims, self.slots[i:i + chunk], report, producer, pace, progress)
            self._earlier_sent(claims, report)
        except StoreError as exc:
            if isinstance(exc, BackfillStopped):
                raise
            raise BackfillStopped(f"backfill {self.request_id} of entry {self.plan.name!r} "
                                  f"stopped: the store: {exc}; run it again to resume (slots "
                                  "already claimed are not sent twice)", report) from exc
        finally:
            claims.close()
        return report

    def _chunk(self, claims: ClaimStore, slots: list[int], report: BackfillReport, producer,
               pace: _Pace, progress) -> None:
        """Claim ``slots`` in one round trip and send those won; the sends are recorded in the
        history even when a ``progress`` callback (or Ctrl-C) stops the backfill midway."""
        plan = self.plan
        now_ms = claims.now_ms() or int(time.time() * 1000)
        memory_s = claims.memory.duration_s
        requests = []
        for slot in slots:
            if memory_s is not None and now_ms - slot > memory_s * 1000 - MARGIN_MS:
                report.refused.setdefault(
                    f"forgotten: older than the store's memory of {memory_s:g} s less a margin "
                    f"of {MARGIN_MS // 1000} s by the time it came to be claimed", []).append(slot)
                continue
            requests.append(ClaimRequest(
                plan.name, slot, max_late_ms=now_ms - slot + MARGIN_MS,
                task_id=task_id_for(self.settings.namespace, plan.name, slot, 1),
                fingerprint=plan.fingerprint))
        results = _claim(claims, requests) if requests else []
        notes: list[HistoryRecord] = []
        detail = f"backfill {self.request_id} by {self.by}"
        try:
            for result in results:
                slot = result.slot_ms
                if result.outcome is Outcome.WON:
                    pace.wait()
                    try:
                        self._send(producer, slot, result.request.task_id)
                    except Exception as exc:
                        report.failed.append(slot)
                        notes.append(HistoryRecord(
                            plan.name, slot, RunEvent.SEND_UNKNOWN, task_id=result.request.task_id,
                            detail=f"{detail}: the publish failed ({type(exc).__name__}: "
                                   f"{exc})"[:200]))
                        unsent = [r for r in results if r.outcome is Outcome.WON
                                  and r.slot_ms > slot]
                        notes += [HistoryRecord(plan.name, r.slot_ms, RunEvent.SEND_FAILED,
                                                task_id=r.request.task_id,
                                                detail=f"{detail}: stopped before its send")
                                  for r in unsent]
                        raise BackfillStopped(
                            f"backfill {self.request_id} of entry {plan.name!r} stopped: the "
                            f"publish of slot {iso(slot)} failed ({type(exc).__name__}: {exc}); "
                            f"{len(unsent)} more slots it claimed are not sent; fix the broker "
                            "and run it again (what was claimed is not sent twice)",
                            report) from exc
                    report.sent.append(slot)
                    notes.append(HistoryRecord(plan.name, slot, RunEvent.SENT,
                                               task_id=result.request.task_id, detail=detail))
                elif result.outcome is Outcome.OTHER_WON:
                    winner = result.winner or ""
                    if winner.startswith(PREFIX):
                        report.resumed += 1
                        report.pending.append(slot)
                    else:
                        report.already_run.append(slot)
                else:
                    reason = result.outcome.value + (f": {result.detail}" if result.detail else "")
                    report.refused.setdefault(reason, []).append(slot)
                if progress is not None:
                    progress(report)
        finally:
            if notes:
                claims.history.record_many(notes)

    def _send(self, producer, slot_ms: int, task_id: str) -> None:
        """Publish the run of ``slot_ms`` as beat would (its message, its task id), once:
        Celery's retry is off (a publish that broke off may have reached the broker)."""
        message = task_message(self.plan, namespace=self.settings.namespace,
                               instance_id=self.instance, slot_ms=slot_ms, attempt=1,
                               token=None, task_id=task_id)
        task = self.app.tasks.get(message.task)
        if task is not None:
            task.apply_async(message.args, message.kwargs, producer=producer, **message.options)
        else:
            self.app.send_task(message.task, message.args, message.kwargs, producer=producer,
                               **message.options)

    def _earlier_sent(self, claims: ClaimStore, report: BackfillReport) -> None:
        """Tell the slots an earlier backfill claimed apart by the entry's history: sent (already
        run), not (not re-sent), or older than every run a full history still holds (past the
        history: it keeps the newest ``history_size`` runs, so a backfill of older slots finds
        its own sends gone from it at once; sent or not is not known)."""
        if not report.pending:
            return
        records = claims.history.read(self.plan.name)
        events = {r.slot_ms: r.event for r in records}
        report.history_size = claims.history_size
        oldest = min(events) if len(records) >= claims.history_size else None
        for slot in report.pending:
            if events.get(slot) in _SENT_EVENTS:
                report.already_run.append(slot)
            elif oldest is not None and slot < oldest:
                report.past_history.append(slot)
            else:
                report.not_resent.append(slot)
        report.already_run.sort()
        report.pending = []


def _claim(claims: ClaimStore, requests: list[ClaimRequest]) -> list:
    """``claims.claim(requests)``, retried :data:`CLAIM_TRIES` times a second apart when the
    store does not answer: the store recognises its own winner, so a claim won before a timeout
    answers won again (docs/design.md "Who won") and its slot is still sent.

    :raises StoreUnavailable: the last try's error.
    """
    for tries_left in range(CLAIM_TRIES - 1, -1, -1):
        try:
            return claims.claim(requests)
        except StoreUnavailable:
            if not tries_left:
                raise
            time.sleep(1.0)
    raise AssertionError("unreachable")


class _Pace:
    """At most ``rate`` sends a second (a send waits for its turn; no burst after a pause)."""

    def __init__(self, rate: float) -> None:
        self.step_s, self.next_at = 1.0 / rate, time.monotonic()

    def wait(self) -> None:
        now = time.monotonic()
        if now < self.next_at:
            time.sleep(self.next_at - now)
        self.next_at = max(now, self.next_at) + self.step_s


class Backfills:
    """The backfill operations of :class:`~celery_anarchon.operate.schedules.Schedules` (a part
    of it: ``self`` is the schedules session, its ``app``, ``settings``, ``store``)."""

    def plan_backfill(self, name: str, start: Any, end: Any, *, request_id: str | None = None,
                      by: str | None = None, max_slots: int = MAX_SLOTS) -> Backfill:
        """Check a backfill of entry ``name`` over [``start``, ``end``] and list its slots,
        without claiming anything (``Schedules.backfill`` gives the parameters and what is
        raised); :meth:`Backfill.run` runs it."""
        name = check_name(name)
        by = self._who(by, name)
        request_id = check_request_id(name, secrets.token_hex(6) if request_id is None
                                      else request_id)
        start_ms, end_ms = instant_ms(name, "start", start), instant_ms(name, "end", end)
        snapshot = self._snapshot()
        entry = self._known(name, snapshot)
        plan = build_plan(name, entry, app=self.app, settings=self.settings, store=self.store)
        if start_ms > end_ms:
            raise ConfigError(f"backfill of entry {name!r}: start {iso(start_ms)} is after end "
                              f"{iso(end_ms)}; fix: give a start before the end")
        now_ms = self.store.now_ms() or int(time.time() * 1000)
        if end_ms > now_ms:
            raise ConfigError(f"backfill of entry {name!r}: end {iso(end_ms)} is in the future "
                              f"(now {iso(now_ms)}): a backfill runs past slots only; fix: give "
                              "an end before now (the schedule runs the slots to come)")
        if plan.timing.lease is not None:
            raise ConfigError(f"backfill of entry {name!r}: the entry is leased; a backfill does "
                              "not hold leases (its runs would not be adopted, renewed or taken "
                              "over); fix: backfill an entry without a lease, or ask for single "
                              f"runs with run-now")
        stored = snapshot.entries.get(name)
        if stored is not None and stored.pause is not None:
            raise ConfigError(f"backfill of entry {name!r}: the entry is "
                              f"{stored.pause.describe()}: every claim would answer paused; fix: "
                              f"resume it first (celery anarchon resume {name})")
        check_store(name, self.store, start_ms, now_ms, plan)
        slots = []
        for slot in slots_between(plan, start_ms, end_ms):
            if len(slots) >= max_slots:
                raise ConfigError(
                    f"backfill of entry {name!r}: more than {max_slots} slots between "
                    f"{iso(start_ms)} and {iso(end_ms)}; fix: shorten the range, or raise the "
                    "bound (max_slots=, --max-slots) if that many runs are meant")
            slots.append(slot)
        return Backfill(app=self.app, settings=self.settings, store=self.store, plan=plan,
                        slots=slots, start_ms=start_ms, end_ms=end_ms, request_id=request_id,
                        by=by)

    def backfill(self, name: str, start: Any, end: Any, *, request_id: str | None = None,
                 by: str | None = None, rate: float = DEFAULT_RATE, max_slots: int = MAX_SLOTS,
                 progress: Callable[[BackfillReport], None] | None = None) -> BackfillReport:
        """Run every slot of entry ``name`` (config or store) from ``start`` to ``end`` (both
        included) once: each slot is claimed in the store like a run, oldest first, and sent
        by this process (as beat sends it) only when this claim won it. A slot already claimed
        (sent by a beat or another backfill) is not sent again, so a backfill repeated, two at
        once or one overlapping the live schedule sends each slot once; a backfill run again
        after an interruption resumes it (a slot the interrupted one claimed but may not have
        sent is reported in ``not_resent``, never sent twice). The claim records each run in the
        history (``claimed``), the send records ``sent`` with ``backfill <request_id> by <by>``.

        :param start: the first instant (an aware ``datetime``, ISO 8601 text with a UTC
            offset, or UTC ms).
        :param end: the last instant, as ``start``; not in the future.
        :param request_id: names the backfill in its claims' instance id and in the history
            (1 to 100 letters, digits or ``. _ @ + -``); default: a new one, in the report.
        :param by: who asks (default: the session's ``by``, ``user@host:pid``).
        :param rate: sends per second, at most (default :data:`DEFAULT_RATE`).
        :param max_slots: the most slots the range may hold (default :data:`MAX_SLOTS`).
        :param progress: told the report after each slot (a progress bar; raising in it stops
            the backfill, as Ctrl-C does: run it again to resume).
        :returns: what was sent, already run, refused (by reason) and not re-sent.
        :raises UnknownEntry: neither ``beat_schedule`` nor the store defines ``name``.
        :raises ConfigError: nothing claimed: an invalid entry or request id; a start after
            the end; an end in the future; a range older than the store's memory (by duration
            or by count); a store whose claims only move forward (Redis ``stream-id``); a leased
            or paused entry; more than ``max_slots`` slots.
        :raises BackfillStopped: a publish failed or the store could not be reached midway
            (``exc.report``); run it again to resume.
        """
        return self.plan_backfill(name, start, end, request_id=request_id, by=by,
                                  max_slots=max_slots).run(rate=rate, progress=progress)
