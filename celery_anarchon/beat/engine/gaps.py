"""Missed slots (docs/design.md "One run, in time", step 7): the slots of an entry that no
instance claimed in time (every beat down, the entry's hosts down, the store unreachable), found
in the store's history and recorded there once each, as ``missed``.

**What a check looks at.** The history the store keeps of an entry (its newest
``history_size`` runs). The range is ``(lookback start, horizon]``: the lookback starts at the
entry's newest run before this instance started (the newest record older than its start minus
the entry's claim window, which no claim of this instance can have written), or the store's
memory before now, or when the store's memory began again, when that is later (older slots the
store cannot vouch for: :func:`memory_start`). From there on
this instance handled every slot, so the gap an outage of every beat left is the slots between
that run and this instance's first; the slots among older runs are not looked at (had the
schedule changed, a denser one would call the slots between the old runs missed). The horizon is now minus the entry's claim window
(``claim_late_ms`` + ``jitter_ms`` + :data:`~celery_anarchon._util.LATENESS_TOLERANCE_MS` +
:data:`MARGIN_MS`), so no instance can still claim a slot the check calls missed. "Now" is the
store's clock where it has one. Every slot of the entry's schedule (within its ``start_at`` /
``end_at``) in that range without a record is missed, but for the slots of a pause a resume
recorded the span of (:func:`~celery_anarchon.stores.entry_store.pause_span_detail`: paused,
though no beat ran to answer them). An entry with no run before this
instance started has no gap (a new entry, or a store that forgot), and a paused entry is not
checked, nor a held one (:attr:`~celery_anarchon.schedule.plan.EntryPlan.held`: nobody runs it).

**Bounded.** At most :data:`MAX_RECORDED` missed slots of an entry are recorded one by one per
check, oldest first; past that, one more record at the next missed slot counts the rest
(":func:`summary_detail`"), and a later check treats the slots it counts as recorded.

**Once.** The records are skips (:data:`~celery_anarchon.stores.records.SKIP_EVENTS`): they fill
a run that has no record and never replace one, so several instances checking the same gap
leave one record per slot. Each instance then reads the history back and counts the ``missed``
records that are its own (a summary record counts the slots it stands for): the sum over the
instances is the number of missed slots (``anarchon_missed_runs_total``).

**When.** Once this instance has *settled*: at start-up and after the store came back from an
outage (:class:`~.outage.Outage`), once the longest claim window of its entries has passed, so
every slot it could claim since then has its own record. To stay cheap, an entry is left to
another live instance that runs the same definition of it and had settled before this one
started: that one's own check covered the gap before its start, and it claimed every slot
since. An entry nobody settled runs is checked here (on a store without instance records:
every entry). A store error is logged and the check is retried with the outage backoff; a
check never stops beat.
"""
from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

from celery_anarchon._util import LATENESS_TOLERANCE_MS, iso, iso_ms, log_time
from celery_anarchon.beat.engine.follow import StoreFollow
from celery_anarchon.beat.engine.observe import NOOP, Observer
from celery_anarchon.beat.engine.outage import Outage
from celery_anarchon.errors import StoreError
from celery_anarchon.schedule.plan import EntryPlan
from celery_anarchon.schedule.slots import SlotsEnded
from celery_anarchon.stores.base import ClaimStore, HistoryRecord, RunEvent, memory_began_ms
from celery_anarchon.stores.entry_store import pause_span_of
from celery_anarchon.stores.records import epoch_began_ms

logger = logging.getLogger(__name__)

#: missed slots of one entry recorded one by one per check; the rest are counted by one more
MAX_RECORDED = 20
#: added to an entry's claim window before a slot counts as missed (clock skew, a slow tick), ms
MARGIN_MS = 5_000
#: slots of one entry walked per check, at most (a gap longer than that is counted up to there)
MAX_WALK = 100_000
#: what a missed slot's record says happened
DETAIL = "no instance claimed it in time (no beat ran this entry, or none reached the store)"
_SUMMARY = re.compile(r"; and (\d+) more slot\(s\) missed up to (\S+)\Z")


def claim_window_ms(plan: EntryPlan) -> int:
    """How long after its slot a run of ``plan`` may still be claimed somewhere, with the store's
    lateness tolerance and :data:`MARGIN_MS`, ms: a slot older than that with no record was
    missed."""
    return plan.claim_late_ms + plan.jitter_ms + LATENESS_TOLERANCE_MS + MARGIN_MS


def summary_detail(rest: int, last_ms: int) -> str:
    """The detail of the record that counts the missed slots past :data:`MAX_RECORDED`: its own
    slot, and ``rest`` more up to ``last_ms`` (UTC ms)."""
    return f"{DETAIL}; and {rest} more slot(s) missed up to {iso(last_ms)}"


def summary_of(record: HistoryRecord) -> tuple[int, int] | None:
    """``(rest, last_ms)`` of a record :func:`summary_detail` wrote, else ``None``."""
    if record.event is not RunEvent.MISSED:
        return None
    found = _SUMMARY.search(record.detail)
    last = None if found is None else iso_ms(found.group(2))
    return None if last is None else (int(found.group(1)), last)


def memory_start(history: Iterable[HistoryRecord], *, epoch_only: bool = False) -> int | None:
    """When the store's memory began, the newest start the ``forgotten`` records of ``history``
    name (docs/design.md "Amnesia": a new store, one that lost its data or whose server epoch
    changed refuses the slots of its first 10 s, naming when its memory began), UTC ms, or
    ``None``. A store that came back from an older copy (a Redis snapshot, a failover) lost the
    runs sent since that copy, so the slots before its memory start cannot be called missed.

    :param epoch_only: only the starts at a change of the server's epoch, which hold for every
        entry of the store (another entry's records tell them); else an entry's own starts too.
    """
    read = epoch_began_ms if epoch_only else (
        lambda detail: epoch_began_ms(detail) or memory_began_ms(detail))
    starts = [began for record in history if record.event is RunEvent.FORGOTTEN
              and (began := read(record.detail)) is not None]
    return max(starts, default=None)


def missed_slots(plan: EntryPlan, history: Sequence[HistoryRecord], now_ms: int,
                 memory_s: float | None, started_ms: int,
                 began_ms: int | None = None) -> list[int]:
    """The slots of ``plan`` that ``history`` (its runs as the store keeps them) shows no
    instance claimed in time, oldest first (module docstring: the range; at most
    :data:`MAX_WALK`). Pure.

    :param now_ms: now, UTC ms (the store's clock where it has one).
    :param memory_s: the store's memory, seconds (``None``: forever).
    :param started_ms: when the checking instance started, UTC ms: the range starts at the
        entry's newest run before it.
    :param began_ms: when the store's memory began again for every entry (an epoch change
        another entry's records tell: :func:`memory_start`), UTC ms, or ``None``; the entry's own
        ``forgotten`` records are read here.
    """
    before = [record.slot_ms for record in history
              if record.slot_ms < started_ms - claim_window_ms(plan)]
    if not before:
        return []
    start = max(before)
    if memory_s is not None:
        start = max(start, now_ms - int(memory_s * 1000))
    for began in (began_ms, memory_start(history)):
        if began is not None:
            start = max(start, began)
    horizon = now_ms - claim_window_ms(plan)
    recorded = {record.slot_ms for record in history}
    counted = [(record.slot_ms, summary[1]) for record in history
               if (summary := summary_of(record)) is not None]
    counted += [(span[0] - 1, span[1]) for record in history       # paused, not missed
                if (span := pause_span_of(record)) is not None]
    missed: list[int] = []
    slot = start
    for _ in range(MAX_WALK):
        try:
            slot = plan.slots.next_after(slot)
        except SlotsEnded:
            break
        if slot > horizon:
            break
        if slot not in recorded and not any(lo < slot <= hi for lo, hi in counted):
            missed.append(slot)
    return missed


@dataclasses.dataclass(frozen=True)
class Found:
    """The missed slots of one entry a check found and recorded."""

    entry: str
    slots: list[int]

    def notes(self) -> list[HistoryRecord]:
        """The records to write: the first :data:`MAX_RECORDED` one by one, then one that
        counts the rest."""
        head = self.slots[:MAX_RECORDED]
        notes = [HistoryRecord(self.entry, slot, RunEvent.MISSED, detail=DETAIL) for slot in head]
        if len(self.slots) > MAX_RECORDED:
            notes.append(HistoryRecord(
                self.entry, self.slots[MAX_RECORDED], RunEvent.MISSED,
                detail=summary_detail(len(self.slots) - MAX_RECORDED - 1, self.slots[-1])))
        return notes

    def mine(self, history: Iterable[HistoryRecord], instance_id: str) -> int:
        """How many of the slots the records of ``instance_id`` among ``history`` (read back
        after the write) stand for: the records this instance's write filled."""
        written = set(self.slots[:MAX_RECORDED + 1])
        count = 0
        for record in history:
            if (record.event is RunEvent.MISSED and record.instance == instance_id
                    and record.slot_ms in written):
                summary = summary_of(record)
                count += 1 + (summary[0] if summary is not None else 0)
        return count


class GapCheck:
    """The missed-slot checks of one instance (module docstring).

    :param store: the store (its history, its clock, its memory, its instance records).
    :param instance_id: this instance's id: its records and the instance records of the others.
    :param clock: the wall clock, epoch seconds (this instance's start; "now" on a store without
        a clock).
    :param monotonic: seconds from any origin: when the check is due.
    :param outage: the store outage backoff (a failed check waits for it, and an outage's end
        calls for a check).
    :param follow: what this instance follows in the store: its entry sync says which entries
        are paused (not checked), and with a heartbeat the other instances' records are read
        (without one: every entry is checked).
    :param observer: told how many missed slots each entry's records of this instance stand for.
    """

    def __init__(self, store: ClaimStore, instance_id: str, clock: Callable[[], float],
                 monotonic: Callable[[], float], outage: Outage, *, follow: StoreFollow,
                 observer: Observer = NOOP) -> None:
        self.store = store
        self.instance_id = instance_id
        self.clock = clock
        self.monotonic = monotonic
        self.outage = outage
        self.follow = follow
        self.observer = observer
        self.started_ms = int(clock() * 1000)
        self._since = monotonic()              #: the start, or the end of the last outage
        self._pending = True
        self._recoveries = outage.recoveries

    def next_try(self, plans: Mapping[str, EntryPlan]) -> float | None:
        """When the pending check is due (monotonic), or ``None``: none is pending."""
        if self.outage.recoveries != self._recoveries:      # the store came back: check again
            self._recoveries = self.outage.recoveries
            self._since, self._pending = self.monotonic(), True
        if not self._pending or not plans:
            return None
        settle_s = max(claim_window_ms(plan) for plan in plans.values()) / 1000
        return max(self._since + settle_s, self.outage.retry_at)

    def check_if_due(self, plans: Mapping[str, EntryPlan],
                     config_plans: Mapping[str, EntryPlan]) -> None:
        """Check ``plans`` (``config_plans``: those of beat_schedule) when the check is due; a
        store error is logged and the check retried after the backoff."""
        due_at = self.next_try(plans)
        if due_at is None or self.monotonic() < due_at:
            return
        try:
            self.check(plans, config_plans)
        except StoreError as exc:
            self.outage.failed(exc, "looking for missed slots in the history")
            return
        self._pending = False

    def check(self, plans: Mapping[str, EntryPlan],
              config_plans: Mapping[str, EntryPlan]) -> list[Found]:
        """Record the missed slots of the entries of ``plans`` nobody settled runs; count and
        log those this instance recorded.

        :raises StoreError: the store could not be reached (some records may be written; a
            retry writes none twice).
        """
        now_ms = self.store.now_ms()
        now_ms = int(self.clock() * 1000) if now_ms is None else now_ms
        names = [name for name in self._unsettled(plans, config_plans, now_ms)
                 if not plans[name].held     # held: nobody runs it (EntryPlan.held)
                 and (self.follow.sync is None or not self.follow.sync.paused(name))]
        if not names:
            return []
        histories = self.store.history.read_many(names)
        memory_s = self.store.memory.duration_s
        began_ms = memory_start((record for history in histories.values() for record in history),
                                epoch_only=True)
        found = []
        for name in names:
            try:
                slots = missed_slots(plans[name], histories.get(name, []), now_ms, memory_s,
                                     self.started_ms, began_ms)
            except Exception as exc:   # a schedule class's own error: that entry is not checked
                logger.error("%s: its missed slots could not be computed: %s", name, exc)
                continue
            if slots:
                found.append(Found(name, slots))
        if not found:
            return []
        self.store.history.record_many([note for gap in found for note in gap.notes()])
        back = self.store.history.read_many([gap.entry for gap in found])
        for gap in found:
            self._tell(gap, gap.mine(back.get(gap.entry, []), self.instance_id))
        return found

    def _tell(self, gap: Found, mine: int) -> None:
        self.observer.missed(gap.entry, mine)
        if not mine:
            logger.info("%s: %d missed slot(s) from %s to %s were recorded by another instance",
                        gap.entry, len(gap.slots), log_time(gap.slots[0]), log_time(gap.slots[-1]))
            return
        by = "" if mine == len(gap.slots) else f" ({mine} of them by this instance)"
        logger.warning(
            "%s: %d slot(s) from %s to %s were missed (no instance claimed them in time); "
            "recorded in the history%s. Fix: keep a beat running this entry (every host runs "
            "one); missed slots are not sent unless the entry's catch_up policy sends them.",
            gap.entry, len(gap.slots), log_time(gap.slots[0]), log_time(gap.slots[-1]), by)

    def _unsettled(self, plans: Mapping[str, EntryPlan], config_plans: Mapping[str, EntryPlan],
                   now_ms: int) -> list[str]:
        """The entries of ``plans`` that no other live instance runs (the same definition) and
        had settled before this one started (module docstring)."""
        instances, heartbeat = self.store.instances, self.follow.heartbeat
        if instances is None or heartbeat is None:
            return list(plans)
        fresh_ms = now_ms - heartbeat.ttl_ms // 2             # a dead one's record lingers
        settled: list[tuple[Mapping[str, str], int]] = []   # (their entries, their start)
        for record in instances.instances():
            if record.instance_id == self.instance_id or record.seen_ms < fresh_ms:
                continue
            if record.started_ms >= self.started_ms:           # settled before this one began
                continue
            settled.append((instances.load_fingerprints(record.fingerprints_digest) or {},
                            record.started_ms))
        if not settled:
            return list(plans)
        out = []
        for name, plan in plans.items():
            covered = any(
                started + claim_window_ms(plan) <= self.started_ms
                and (theirs.get(name) == plan.fingerprint
                     or (name not in config_plans and self.store.entries is not None
                         and name not in theirs))
                for theirs, started in settled)
            if not covered:
                out.append(name)
        return out


__all__ = ["GapCheck", "Found", "missed_slots", "claim_window_ms", "summary_detail",
           "summary_of", "memory_start", "MAX_RECORDED", "MARGIN_MS", "DETAIL"]
