"""The history and leases parts of a store: each an abstract contract of its own, which a
backend implements in a module of its own and gives to its store (``store.history``,
``store.leases``); callers use the part (``store.history.read(...)``,
``store.leases.renew(...)``). The entries and instance records parts are in
:mod:`celery_anarchon.stores.entry_store`; the store's own contract in
:mod:`celery_anarchon.stores.base`.

Units as in :mod:`celery_anarchon.stores.base`: UTC integer milliseconds, the store's clock.
"""
from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence

from celery_anarchon.stores.records import HistoryRecord, LeasedRun, RunEvent, TakeoverOutcome


class History(abc.ABC):
    """A store's ``history`` part, which every store has: one record per run, the newest
    ``history_size`` runs of each entry, and the texts of the definitions that instances'
    fingerprints stand for.

    Every operation raises :class:`~celery_anarchon.errors.StoreUnavailable` as the claim
    store's do.
    """

    @abc.abstractmethod
    def record(self, entry: str, slot_ms: int, event: RunEvent, *, task_id: str = "",
               attempt: int = 1, detail: str = "") -> None:
        """Write an event of a run into its history, as this instance.

        Events in :data:`~.records.SKIP_EVENTS` only fill a run with no record yet; other
        events replace the record, but a note of :data:`~.records.SEND_NOTES` never replaces a
        later attempt's record nor one of :data:`~.records.AFTER_SEND` of its own attempt.
        Keeps the newest ``history_size`` runs of the entry.
        """

    def record_many(self, notes: Sequence[HistoryRecord]) -> None:
        """Write several :meth:`record` events, in one round trip where the backend allows it."""
        for note in notes:
            self.record(note.entry, note.slot_ms, note.event, task_id=note.task_id,
                        attempt=note.attempt, detail=note.detail)

    @abc.abstractmethod
    def read(self, entry: str, limit: int | None = None) -> list[HistoryRecord]:
        """The entry's newest runs, newest first (at most ``limit`` or ``history_size``)."""

    def read_many(self, entries: Iterable[str],
                  limit: int | None = None) -> dict[str, list[HistoryRecord]]:
        """The newest runs of each of ``entries``, as :meth:`read` gives them, read in as few
        round trips as the backend allows (this default: one :meth:`read` per entry).

        :param entries: entry names (a name given twice is read once).
        :param limit: runs per entry, at most (default and cap ``history_size``); below 1: none.
        :returns: ``{entry: runs newest first}``, with a key for every name (``[]``: no runs).
        :raises StoreUnavailable: the store cannot be reached (nothing is returned).
        """
        names = list(dict.fromkeys(entries))
        if limit is not None and int(limit) < 1:
            return {name: [] for name in names}
        return {name: self.read(name, limit) for name in names}

    # -- definitions (fingerprints) -------------------------------------------------------------
    @abc.abstractmethod
    def save_definition(self, entry: str, fingerprint: str, text: str) -> None:
        """Remember what a fingerprint stands for, so another instance can name it."""

    def save_definitions(self, definitions: Iterable[tuple[str, str, str]]) -> None:
        """:meth:`save_definition` for each ``(entry, fingerprint, text)``; a store that can
        writes them in a few round trips (the start-up of 100,000 entries saves every one).

        :raises StoreError: the store cannot be reached (some may be saved).
        """
        for entry, fingerprint, text in definitions:
            self.save_definition(entry, fingerprint, text)

    @abc.abstractmethod
    def load_definition(self, entry: str, fingerprint: str) -> str | None:
        """The text saved for ``fingerprint``, or ``None`` if unknown."""


class Leases(abc.ABC):
    """A store's ``leases`` part: one record per leased run (state, attempt, fencing token,
    lease expiry) on the store's clock (docs/design.md "Leases"). A store with this part checks
    lateness (:attr:`~celery_anarchon.stores.base.ClaimStore.checks_lateness`), and its claim
    creates the record of a leased run.

    Every operation raises :class:`~celery_anarchon.errors.StoreUnavailable` as the claim
    store's do.
    """

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
