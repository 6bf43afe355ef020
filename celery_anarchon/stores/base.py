"""The store contract: what every backend (Redis, PostgreSQL, SQLite, ...) implements.

A store decides claims. Every instance of beat computes the same runs (entry, slot) and asks
the store to claim them; the store answers each with exactly one winner, atomically, and
remembers the claim for at least its *memory*. Lease stores also keep one record per leased run
(state, attempt, fencing token, lease expiry) on their own clock.

Units: every instant is UTC integer milliseconds (``*_ms``); durations given to a store are
milliseconds too. User-facing settings are seconds and are converted by :mod:`celery_anarchon.schedule.timing`.

The rules below come from docs/design.md ("Who won", "Amnesia", "One run, in time", "Leases"):

* A claim checks, in this order: already claimed (by this instance: ``WON`` again, the store
  recognises its own winner; by another: ``OTHER_WON``), forgotten (the slot is older than the store's
  memory, or the store's memory began after ``slot - LATENESS_TOLERANCE_MS``), late (store clock:
  ``now > slot + max_late + LATENESS_TOLERANCE_MS``), early (``slot > now + LATENESS_TOLERANCE_MS``),
  then for leased entries overlapping / superseding, then it records the claim.
* Skips (late, early, forgotten, overlapping, superseded) are recorded once in the history of the
  run, never over a claimed run's record.
* Fencing tokens are per entry and only grow, even after the store lost its data: a token is
  ``max(previous + 1, store clock in microseconds)``.
"""
from __future__ import annotations

import abc
import dataclasses
import enum
from collections.abc import Iterable, Sequence
from typing import ClassVar

from celery_anarchon._util import LATENESS_TOLERANCE_MS, Memory, mask_url  # noqa: F401  (re-exported)
from celery_anarchon.errors import ConfigError
from celery_anarchon.schedule.timing import LEASE_STORE_NAMES, LeaseTerms  # noqa: F401  (re-exported)

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
                         RunEvent.PAUSED})
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
    :meth:`ClaimStore.history` reads it, or an event to write with :meth:`ClaimStore.record_many`
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
    """The answer to :meth:`LeaseStore.take_over`."""

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


class ClaimStore(abc.ABC):
    """One backend that decides claims. Construct with :func:`celery_anarchon.stores.open_store`.

    Construction does no I/O; the first operation connects (in the process that ticks: under
    ``celery worker -B`` that is a forked child). Every operation raises
    :class:`~celery_anarchon.errors.StoreUnavailable` when the store cannot be reached or does not
    answer within ``claim_timeout`` seconds, and never anything that would let a caller send blind.
    A store that also holds leases is a :class:`LeaseStore`.
    """

    #: short backend name for logs and docs ("redis", "postgresql", "sqlite", ...)
    kind: ClassVar[str] = ""
    #: True when the store refuses late and early claims on its own clock
    checks_lateness: ClassVar[bool] = False
    #: True when a claim retried by its winner is recognised as won (docs/design.md "Who won"); a
    #: store that cannot read the winner back answers UNKNOWN instead (a possible miss)
    recognises_winner: ClassVar[bool] = True
    #: True when the store holds leases (a :class:`LeaseStore`): what a plan, which cannot import
    #: the stores, asks of the store it is built for
    holds_leases: ClassVar[bool] = False

    def __init__(self, url: str, *, namespace: str, instance_id: str,
                 history_size: int = DEFAULT_HISTORY_SIZE,
                 claim_timeout: float = DEFAULT_CLAIM_TIMEOUT_S) -> None:
        self.url = url
        self.namespace = namespace
        self.instance_id = instance_id
        self.history_size = int(history_size)
        self.claim_timeout = float(claim_timeout)

    # -- identity -----------------------------------------------------------------------------
    @property
    def safe_url(self) -> str:
        """The URL with its password masked, for logs and the banner."""
        return mask_url(self.url)

    @property
    @abc.abstractmethod
    def memory(self) -> Memory:
        """How long this store remembers a claimed run (used by the start-up rules)."""

    def describe(self) -> str:
        """Store settings that belong in an entry's fingerprint (kind, strategy, memory)."""
        m = self.memory
        return f"{self.kind} memory={m.duration_s}s count={m.count}"

    # -- life cycle ---------------------------------------------------------------------------
    @abc.abstractmethod
    def prepare(self, entries: Iterable[str]) -> list[str]:
        """Connect, create what is missing (schema, keys) and note when the store's memory began
        for each entry that has no such note yet. Idempotent; called at start-up.

        :returns: warnings for the operator (e.g. "this Redis keeps no data on disk").
        :raises StoreUnavailable: the store cannot be reached.
        :raises ConfigError: the store exists but cannot serve (e.g. wrong server version).
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections. Safe to call twice, and from a signal handler."""

    @abc.abstractmethod
    def now_ms(self) -> int | None:
        """The store's clock, UTC ms, or ``None`` for a store without a clock."""

    # -- claims -------------------------------------------------------------------------------
    @abc.abstractmethod
    def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimResult]:
        """Claim every run of ``requests`` in one round trip where the backend allows it.

        Results come in the order of ``requests``. Each run has at most one winner, ever, while the
        store remembers it; a retry by the winner answers ``WON`` again (with the same token).
        A skip is recorded once in the run's history.

        :raises StoreUnavailable: the outcome is unknown; retry with the same requests.
        """

    # -- history ------------------------------------------------------------------------------
    @abc.abstractmethod
    def record(self, entry: str, slot_ms: int, event: RunEvent, *, task_id: str = "",
               attempt: int = 1, detail: str = "") -> None:
        """Write an event of a run into its history, as this instance.

        Events in :data:`SKIP_EVENTS` only fill a run with no record yet; other events replace
        the record, but a note of :data:`SEND_NOTES` never replaces a later attempt's record nor
        one of :data:`AFTER_SEND` of its own attempt. Keeps the newest ``history_size`` runs of
        the entry.
        """

    def record_many(self, notes: Sequence[HistoryRecord]) -> None:
        """Write several :meth:`record` events, in one round trip where the backend allows it."""
        for note in notes:
            self.record(note.entry, note.slot_ms, note.event, task_id=note.task_id,
                        attempt=note.attempt, detail=note.detail)

    @abc.abstractmethod
    def history(self, entry: str, limit: int | None = None) -> list[HistoryRecord]:
        """The entry's newest runs, newest first (at most ``limit`` or ``history_size``)."""

    def history_many(self, entries: Iterable[str],
                     limit: int | None = None) -> dict[str, list[HistoryRecord]]:
        """The newest runs of each of ``entries``, as :meth:`history` gives them, read in as few
        round trips as the backend allows (this default: one :meth:`history` per entry).

        :param entries: entry names (a name given twice is read once).
        :param limit: runs per entry, at most (default and cap ``history_size``); below 1: none.
        :returns: ``{entry: runs newest first}``, with a key for every name (``[]``: no runs).
        :raises StoreUnavailable: the store cannot be reached (nothing is returned).
        """
        names = list(dict.fromkeys(entries))
        if limit is not None and int(limit) < 1:
            return {name: [] for name in names}
        return {name: self.history(name, limit) for name in names}

    # -- definitions (fingerprints) -------------------------------------------------------------
    def save_definition(self, entry: str, fingerprint: str, text: str) -> None:
        """Remember what a fingerprint stands for, so another instance can name it. Optional."""

    def save_definitions(self, definitions: Iterable[tuple[str, str, str]]) -> None:
        """:meth:`save_definition` for each ``(entry, fingerprint, text)``; a store that can
        writes them in a few round trips (the start-up of 100,000 entries saves every one).

        :raises StoreError: the store cannot be reached (some may be saved).
        """
        for entry, fingerprint, text in definitions:
            self.save_definition(entry, fingerprint, text)

    def load_definition(self, entry: str, fingerprint: str) -> str | None:
        """The text saved for ``fingerprint``, or ``None`` if unknown. Optional."""
        return None


class LeaseStore(ClaimStore):
    """A claim store that also keeps one record per leased run (state, attempt, fencing token,
    lease expiry) on its own clock (docs/design.md "Leases"). Lease stores check lateness."""

    checks_lateness: ClassVar[bool] = True
    holds_leases: ClassVar[bool] = True

    @abc.abstractmethod
    def inspect(self, entry: str, slot_ms: int) -> LeasedRun | None:
        """The record of one leased run, or ``None`` if the store has none."""

    @abc.abstractmethod
    def expired_runs(self, entries: Iterable[str]) -> list[LeasedRun]:
        """Leased runs of ``entries`` that are started with an expired lease or queued past their
        deadline, on the store's clock."""

    @abc.abstractmethod
    def take_over(self, entry: str, slot_ms: int, expected_token: int, *,
                  queue_timeout_ms: int, max_attempts: int,
                  task_id: str = "") -> tuple[TakeoverOutcome, LeasedRun | None]:
        """One compare-and-set on ``expected_token``: if the run is still expired and no newer slot
        of the entry was claimed, queue it again as the next attempt with a new token and a queue
        deadline of now + ``queue_timeout_ms``, recorded ``taken_over`` with ``task_id`` (the new
        attempt's) in the run's history, which keeps the dead attempt's record in ``earlier``.

        Checked in this order after the compare-and-set: the entry paused (``PAUSED``: the run
        ends, recorded ``paused`` with the pause's description, checked atomically with the
        pause as a claim checks it); the slot older than the entry's effective memory start +
        tolerance (``GIVEN_UP``: the store may have lost writes to its record, e.g. its release:
        a possible miss, never a second run); a newer scheduled slot claimed (``SUPERSEDED``;
        never for the run of a run-now request, which is its own run); ``max_attempts`` reached
        (``GIVEN_UP``). Exactly one of several instances finding the same expired run gets
        ``TAKEN``."""

    @abc.abstractmethod
    def adopt(self, entry: str, slot_ms: int, owner: str, duration_ms: int) -> tuple[bool, LeasedRun | None]:
        """Worker side, before the task body runs: succeeds when the run is queued (any attempt's
        message) or started with an expired lease; sets it started with a new token, ``owner`` and
        lease expiry = now + ``duration_ms``. Returns ``(adopted, record)``.

        When the entry is paused (checked atomically with the pause) such a run is not adopted:
        it ends in state ``paused``, recorded ``paused`` with the pause's description, and the
        message is dropped. A run that is started under a live lease is not touched by a pause
        (:meth:`renew` and :meth:`release` work as before)."""

    @abc.abstractmethod
    def renew(self, entry: str, slot_ms: int, token: int, owner: str, duration_ms: int) -> LeasedRun | None:
        """Extend the lease held with ``token`` to now + ``duration_ms``. ``None`` when the token is
        stale (the lease was taken over: the runner lost it). If the store forgot the record
        (amnesia) it is re-created with this token, so a live runner keeps its run."""

    @abc.abstractmethod
    def release(self, entry: str, slot_ms: int, token: int) -> bool:
        """The runner is done: state finished, if ``token`` is still current. If the store forgot
        the record (amnesia, an epoch change; as for :meth:`renew`) it is re-created finished with
        this token: the body ran, so the run is neither answered taken over nor given up later."""

    @abc.abstractmethod
    def requeue(self, entry: str, slot_ms: int, token: int, *, delay_ms: int,
                queue_timeout_ms: int) -> bool:
        """A retry hands the run back: state queued, deadline = now + ``delay_ms`` +
        ``queue_timeout_ms`` (the retry's countdown), attempt unchanged, if ``token`` is current."""


def lease_store(store: ClaimStore) -> LeaseStore:
    """``store`` as a :class:`LeaseStore` for the lease operations.

    :raises ConfigError: the store cannot hold leases (naming the stores that can).
    """
    if not isinstance(store, LeaseStore):
        raise ConfigError(f"the {store.kind} store cannot hold leases; use {LEASE_STORE_NAMES}"
                          " for leased entries")
    return store
