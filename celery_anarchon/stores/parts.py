"""The parts of a store that not every store has, or that every store has but keeps apart from
its claims: each an abstract contract of its own, which a backend implements in a module of its
own and gives to its store (``store.leases``); callers use the part
(``store.leases.renew(...)``). The entries and instance records parts are in
:mod:`celery_anarchon.stores.entry_store`; the store's own contract in
:mod:`celery_anarchon.stores.base`.

Units as in :mod:`celery_anarchon.stores.base`: UTC integer milliseconds, the store's clock.
"""
from __future__ import annotations

import abc
from collections.abc import Iterable

from celery_anarchon.stores.records import LeasedRun, TakeoverOutcome


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
