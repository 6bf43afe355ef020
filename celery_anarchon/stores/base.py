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
from collections.abc import Iterable, Sequence
from typing import ClassVar

from celery_anarchon._util import LATENESS_TOLERANCE_MS, Memory, mask_url  # noqa: F401  (re-exported)
from celery_anarchon.errors import ConfigError
from celery_anarchon.schedule.timing import LEASE_STORE_NAMES, LeaseTerms  # noqa: F401  (re-exported)
from celery_anarchon.stores.entry_store import ENTRY_STORE_NAMES, Entries, Instances
from celery_anarchon.stores.parts import History, Leases
from celery_anarchon.stores.records import (  # noqa: F401  (re-exported)
    AFTER_SEND, DEFAULT_CLAIM_TIMEOUT_S, DEFAULT_HISTORY_SIZE, DEFAULT_MEMORY_S, MAX_EARLIER,
    SEND_NOTES, SKIP_EVENTS, ClaimRequest, ClaimResult, HistoryRecord, LeasedRun, Outcome,
    RunEvent, RunState, TakeoverOutcome, keeps_earlier, memory_began_ms,
)

class ClaimStore(abc.ABC):
    """One backend that decides claims. Construct with :func:`celery_anarchon.stores.open_store`.

    Construction does no I/O; the first operation connects (in the process that ticks: under
    ``celery worker -B`` that is a forked child). Every operation raises
    :class:`~celery_anarchon.errors.StoreUnavailable` when the store cannot be reached or does not
    answer within ``claim_timeout`` seconds, and never anything that would let a caller send blind.

    What a store keeps besides claims are its parts, each an object of a contract of its own,
    built by the backend's constructor: :attr:`history` and :attr:`leases`
    (:mod:`celery_anarchon.stores.parts`), :attr:`instances` and :attr:`entries`
    (:mod:`celery_anarchon.stores.entry_store`). A part a store cannot hold is ``None``; every
    store has a history.
    """

    #: short backend name for logs and docs ("redis", "postgresql", "sqlite", ...)
    kind: ClassVar[str] = ""
    #: True when the store refuses late and early claims on its own clock
    checks_lateness: ClassVar[bool] = False
    #: True when a claim retried by its winner is recognised as won (docs/design.md "Who won"); a
    #: store that cannot read the winner back answers UNKNOWN instead (a possible miss)
    recognises_winner: ClassVar[bool] = True
    #: True when a slot older than one already claimed of the entry can still be claimed (within
    #: the memory): what a backfill needs. False for a store whose claims only move forward
    #: (Redis ``stream-id`` refuses an older slot as superseded)
    claims_past_slots: ClassVar[bool] = True

    #: the history of runs and the texts of definitions (:class:`~.parts.History`): every
    #: backend has it
    history: History
    #: the instance records (:class:`~.entry_store.Instances`): every backend of the registry
    #: has them; ``None`` for a store without them (it still runs: no heartbeat, no status)
    instances: Instances | None = None
    #: store entries, pauses and run-now requests (:class:`~.entry_store.Entries`), or ``None``
    #: when the store cannot hold them (:func:`entry_store` names the stores that can)
    entries: Entries | None = None
    #: the records of leased runs (:class:`~.parts.Leases`), or ``None`` when the store cannot
    #: hold leases (:func:`lease_store` names the stores that can)
    leases: Leases | None = None

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
    def holds_leases(self) -> bool:
        """True when the store has a :attr:`leases` part: what a plan, which cannot import the
        stores, asks of the store it is built for."""
        return self.leases is not None

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

    def exists(self) -> bool | None:
        """Whether the store already holds this namespace's data (its memory-start note), read
        without creating or writing anything (``check`` reads a store before beat's first
        start made it, and must not start its memory). ``None``: this store cannot tell
        without creating it.

        :raises StoreUnavailable: the store cannot be reached.
        """
        return None

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


def lease_store(store: ClaimStore) -> Leases:
    """``store``'s :class:`~.parts.Leases` part (``store.leases``), for the lease operations.

    :raises ConfigError: the store cannot hold leases (naming the stores that can).
    """
    if store.leases is None:
        raise ConfigError(f"the {store.kind} store cannot hold leases; use {LEASE_STORE_NAMES}"
                          " for leased entries")
    return store.leases


def entry_store(store: ClaimStore) -> Entries:
    """``store``'s :class:`~.entry_store.Entries` part (``store.entries``).

    :raises ConfigError: the store cannot hold entries (naming the stores that can).
    """
    if store.entries is None:
        raise ConfigError(f"the {store.kind} store cannot hold entries, pauses or run-now requests;"
                          f" use {ENTRY_STORE_NAMES} as anarchon_store_url for runtime schedules")
    return store.entries
