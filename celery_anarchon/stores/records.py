"""The records of the store contract (:mod:`celery_anarchon.stores.base`): a claim's request
and answer, a run's history record, a leased run's record and the enums they hold, with the
defaults every store shares. Re-exported by :mod:`celery_anarchon.stores.base`, whose docstring
gives the rules.

Units: every instant is UTC integer milliseconds (``*_ms``); durations given to a store are
milliseconds too.
"""
from __future__ import annotations

import dataclasses
import datetime
import enum
import re

from celery_anarchon.schedule.timing import LeaseTerms

#: Default history kept per entry, in runs (``anarchon_store_options["history_size"]``).
DEFAULT_HISTORY_SIZE = 100

#: Default store memory of the lease stores, seconds (``anarchon_store_options["memory"]``).
DEFAULT_MEMORY_S = 3600.0

#: Default seconds to wait for one store round trip (``anarchon_store_options["claim_timeout"]``).
DEFAULT_CLAIM_TIMEOUT_S = 5.0


def _reads_lost_as(member: str) -> classmethod:
    """An enum's ``_missing_`` that reads the value ``"lost"``, written by an older version, as
    ``member`` (``"lost"`` named both another's win and a run given up)."""
    def _missing_(cls, value):
        return cls[member] if value == "lost" else None
    return classmethod(_missing_)


class Outcome(str, enum.Enum):
    """The answer of the store to the claim of one run."""

    WON = "won"                  #: this instance holds the claim: it sends the run
    OTHER_WON = "other_won"      #: another instance holds the claim (the normal case)
    LATE = "late"                #: refused: store clock says slot + max_late + tolerance has passed
    EARLY = "early"              #: refused: store clock says the slot is more than tolerance ahead
    FORGOTTEN = "forgotten"      #: refused: the store cannot remember that far back (amnesia, memory)
    OVERLAPPING = "overlapping"  #: refused: an earlier run of the leased entry is still alive
    SUPERSEDED = "superseded"    #: refused: a newer slot of the entry was already claimed
    UNKNOWN = "unknown"          #: the store could not tell; counted as not won, a possible miss
    #: won, but the claim was not confirmed durable (replicas, disk) in time: never sent, a
    #: possible miss (docs/design.md "Amnesia and partial loss": durable claim)
    UNCONFIRMED = "unconfirmed"
    #: refused: the entry is paused (checked inside the claim; :mod:`.entry_store`)
    PAUSED = "paused"
    _missing_ = _reads_lost_as("OTHER_WON")

    @property
    def is_skip(self) -> bool:
        """True for outcomes that mean nobody sends this run (recorded in history)."""
        return self not in (Outcome.WON, Outcome.OTHER_WON)


class RunEvent(str, enum.Enum):
    """What a history record says about a run. One record per run; later events replace earlier."""

    CLAIMED = "claimed"            #: a claim was won; the send follows
    SENT = "sent"                  #: the winner published the task message
    SEND_FAILED = "send_failed"    #: the winner could not publish it until max_late
    SEND_UNKNOWN = "send_unknown"  #: the publish broke off; the broker may or may not have it
    LATE = "late"                  #: skipped: late on the store's clock
    LATE_LOCAL = "late_local"      #: skipped: late on the instance's clock (paused, clock jump)
    EARLY = "early"                #: skipped: early on the store's clock
    FORGOTTEN = "forgotten"        #: skipped: the store forgot (amnesia) or the memory was too short
    OVERLAPPING = "overlapping"    #: skipped: an earlier leased run was still alive
    SUPERSEDED = "superseded"      #: skipped or abandoned: a newer slot of the entry runs instead
    UNKNOWN = "unknown"            #: the claim's outcome could not be read back
    UNCONFIRMED = "unconfirmed"    #: won, not confirmed durable in time: not sent (replaces claimed)
    UNREACHABLE = "store_unreachable"  #: skipped: the store could not be reached until max_late
    PAUSED = "paused"              #: skipped: the entry was paused (detail: by whom, why)
    #: no instance claimed the slot in time (all beats down, the store unreachable): recorded
    #: once, by the first instance that can tell, never sent unless a catch-up or a backfill does
    MISSED = "missed"
    STARTED = "started"            #: leased: a worker adopted the run
    FINISHED = "finished"          #: leased: released by its runner
    TAKEN_OVER = "taken_over"      #: leased: re-sent as a new attempt (runner presumed dead)
    GIVEN_UP = "given_up"          #: leased: given up after max_attempts
    _missing_ = _reads_lost_as("GIVEN_UP")

    @classmethod
    def for_skip(cls, outcome: Outcome) -> RunEvent:
        """The history event that records a skipped claim outcome."""
        return cls(outcome.value)


#: Events that only fill an empty history slot: they never overwrite what a winner recorded.
SKIP_EVENTS = frozenset({RunEvent.LATE, RunEvent.LATE_LOCAL, RunEvent.EARLY, RunEvent.FORGOTTEN,
                         RunEvent.OVERLAPPING, RunEvent.UNKNOWN, RunEvent.UNREACHABLE,
                         RunEvent.PAUSED, RunEvent.MISSED})
#: the words of a forgotten refusal's detail that name the start of the store's memory (every
#: store writes "memory began at <ISO time>" or "memory of this entry began at <ISO time>"; after
#: an epoch change, Redis writes "memory began again at <ISO time>")
_MEMORY_BEGAN = re.compile(r"memory (?:of this entry )?began (?:again )?at "
                           r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d))")


def memory_began_ms(detail: str) -> int | None:
    """When the store's memory began, UTC ms, read from the detail of a ``forgotten`` refusal
    or history record that says only that (a new store's first slots, the amnesia protection of
    docs/design.md "Amnesia"); ``None`` for any other forgetting: an epoch change (the detail
    names the epoch: the store may have lost its newest claims), a slot older than the store's
    memory, or a detail without that note. Who reads it must still tell a new store from one
    that lost its data by what ran before (:mod:`celery_anarchon.beat.engine.skips`,
    :mod:`celery_anarchon.operate.overview_entries`)."""
    if not detail or "epoch" in detail:
        return None
    return _began(detail)


def epoch_began_ms(detail: str) -> int | None:
    """When the store's memory began again at a change of the server's epoch (a restart from an
    older snapshot, a failover: the newest writes may be lost), UTC ms, read from the detail of a
    ``forgotten`` refusal or history record that names the change (docs/design.md "Amnesia");
    ``None`` for any other detail. The epoch is the server's, so the start holds for every entry
    of the store."""
    if not detail or "epoch" not in detail:
        return None
    return _began(detail)


def _began(detail: str) -> int | None:
    found = _MEMORY_BEGAN.search(detail)
    if found is None:
        return None
    when = datetime.datetime.fromisoformat(found.group(1).replace("Z", "+00:00"))
    return round(when.timestamp() * 1000)


#: A beat's notes of its publish, written at the end of its tick: a worker (or a takeover) may
#: have recorded the run's next step before them. Such a note never replaces a record of a later
#: attempt, nor one of :data:`AFTER_SEND` of its own attempt.
SEND_NOTES = frozenset({RunEvent.SENT, RunEvent.SEND_FAILED, RunEvent.SEND_UNKNOWN})
#: What happens to an attempt after its message was published (the lease protocol's events).
AFTER_SEND = frozenset({RunEvent.STARTED, RunEvent.FINISHED, RunEvent.GIVEN_UP,
                        RunEvent.SUPERSEDED})


#: the earlier records a run's history record keeps at most (:attr:`HistoryRecord.earlier`): two
#: per takeover (the dead attempt's last record, the takeover), so max_attempts = 6 fits whole
MAX_EARLIER = 10


def keeps_earlier(replaced: RunEvent | str, event: RunEvent | str) -> bool:
    """Whether a record of ``replaced`` goes into :attr:`HistoryRecord.earlier` when ``event``
    replaces it: a takeover keeps the dead attempt's last record, and a ``taken_over`` record is
    kept by whatever replaces it (the same rule in every lease store: Lua and SQL)."""
    return RunEvent.TAKEN_OVER.value in (getattr(replaced, "value", replaced),
                                         getattr(event, "value", event))


class RunState(str, enum.Enum):
    """State of a leased run's record (docs/design.md "Leases")."""

    QUEUED = "queued"
    STARTED = "started"
    FINISHED = "finished"
    GIVEN_UP = "given_up"
    SUPERSEDED = "superseded"
    #: ended by a pause of its entry before a worker started it (or took it over)
    PAUSED = "paused"
    _missing_ = _reads_lost_as("GIVEN_UP")

    @property
    def is_terminal(self) -> bool:
        return self in (RunState.FINISHED, RunState.GIVEN_UP, RunState.SUPERSEDED, RunState.PAUSED)


@dataclasses.dataclass(frozen=True)
class ClaimRequest:
    """One run to claim.

    :param entry: the entry's name in ``beat_schedule``.
    :param slot_ms: the run's slot, UTC ms.
    :param max_late_ms: the entry's max_late, ms (lateness is re-checked on the store's clock).
    :param task_id: the task id the winner will send (recorded in history).
    :param fingerprint: the claiming instance's fingerprint of the entry's definition.
    :param lease: set for leased entries: the claim also creates the run's lease record.
    :param requested: the run of a run-now request (``run_now``), not a slot of the entry's
        schedule: for a leased entry it is its own run, never superseded by a newer scheduled
        slot and never superseding one (docs/design.md "Leases": Overlap); the overlap rule
        still applies to it.
    """

    entry: str
    slot_ms: int
    max_late_ms: int
    task_id: str = ""
    fingerprint: str = ""
    lease: LeaseTerms | None = None
    requested: bool = False

    @property
    def run(self) -> tuple[str, int]:
        return (self.entry, self.slot_ms)


@dataclasses.dataclass(frozen=True)
class ClaimResult:
    """The store's answer for one :class:`ClaimRequest`.

    :param winner: instance id that holds the claim (``WON``: this instance; ``OTHER_WON``: the
        other),
        ``None`` when nobody does.
    :param winner_fingerprint: the fingerprint recorded by the winner, ``""`` when unknown.
    :param store_ms: the store's clock when it decided, UTC ms (``None`` for stores without one).
    :param token: fencing token of a leased run (``WON`` only), else ``None``.
    :param attempt: attempt number of a leased run (1 for the first send).
    :param detail: a short explanation for skips (e.g. the store's memory start).
    """

    request: ClaimRequest
    outcome: Outcome
    winner: str | None = None
    winner_fingerprint: str = ""
    store_ms: int | None = None
    token: int | None = None
    attempt: int = 1
    detail: str = ""

    @property
    def entry(self) -> str:
        return self.request.entry

    @property
    def slot_ms(self) -> int:
        return self.request.slot_ms


@dataclasses.dataclass(frozen=True)
class HistoryRecord:
    """One run in an entry's history (the newest ``history_size`` runs are kept), as
    :meth:`~.parts.History.read` reads it, or an event to write with
    :meth:`~.parts.History.record_many`
    (which writes it as this instance, on the store's clock: ``instance`` and ``store_ms`` are
    not read there).

    :param store_ms: the store's clock (or the recording instance's, for stores without one)
        when the record was last written, UTC ms.
    :param earlier: the records of the run's earlier attempts that this one replaced, oldest
        first (lease stores; read only): a takeover keeps the dead attempt's last record, and the
        next record of the new attempt keeps the ``taken_over`` record, so a run taken over shows
        what each attempt did and each attempt's task id. At most :data:`MAX_EARLIER` (the
        newest); their own ``earlier`` is empty. Not counted in ``history_size``, which bounds
        the runs of an entry.
    """

    entry: str
    slot_ms: int
    event: RunEvent
    instance: str = ""
    store_ms: int = 0
    task_id: str = ""
    attempt: int = 1
    detail: str = ""
    earlier: tuple[HistoryRecord, ...] = ()


@dataclasses.dataclass(frozen=True)
class LeasedRun:
    """The record of one leased run, as the store holds it (it never expires on its own).

    :param lease_expires_ms: when the current lease ends on the store's clock (started runs), UTC ms.
    :param queue_deadline_ms: when a queued run counts as not adopted (queued runs), UTC ms.
    :param store_ms: the store's clock when this was read, UTC ms.
    """

    entry: str
    slot_ms: int
    state: RunState
    attempt: int
    token: int
    owner: str
    lease_expires_ms: int | None
    queue_deadline_ms: int | None
    store_ms: int

    @property
    def expired(self) -> bool:
        """A started run whose lease ended, or a queued run past its deadline (store clock)."""
        if self.state is RunState.STARTED:
            return self.lease_expires_ms is not None and self.lease_expires_ms < self.store_ms
        if self.state is RunState.QUEUED:
            return self.queue_deadline_ms is not None and self.queue_deadline_ms < self.store_ms
        return False


class TakeoverOutcome(str, enum.Enum):
    """The answer to :meth:`~celery_anarchon.stores.parts.Leases.take_over`."""

    TAKEN = "taken"            #: this instance re-sends the run as ``run.attempt``
    #: max_attempts reached, or the store may have lost writes to the run's record (an epoch
    #: change or amnesia since it was claimed): the run is recorded given up, not taken over
    GIVEN_UP = "given_up"
    SUPERSEDED = "superseded"  #: a newer slot of the entry was claimed: the run is abandoned
    REFUSED = "refused"        #: the token changed or the run is alive/finished: nothing to do
    #: the entry is paused: the run is not taken over and ends (recorded ``paused`` once, with
    #: the pause's description; not caught up after the resume, as a paused claim is not)
    PAUSED = "paused"
    _missing_ = _reads_lost_as("GIVEN_UP")
