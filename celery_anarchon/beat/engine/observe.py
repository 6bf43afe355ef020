"""The engine's observer hook: the facts an exporter of metrics needs, told as they happen.

The engine knows nothing of Prometheus: it calls an :class:`Observer`, whose methods do nothing.
:class:`celery_anarchon.beat.metrics.PrometheusObserver` implements them with prometheus_client; a
test or another exporter subclasses :class:`Observer` and overrides what it needs. Every method
is called from the beat process's ticking thread, must return quickly and must never raise (an
exporter's fault must not stop a run being sent).

The words of the ``outcome`` and ``event`` arguments:

* claim outcomes: the store's answers (:class:`~celery_anarchon.stores.base.Outcome` values:
  ``won``, ``other_won`` (lost to another instance: the normal case), ``late``, ``early``,
  ``forgotten``, ``overlapping``, ``superseded``, ``unknown``, ``unconfirmed``, ``paused``), and
  two decided on this instance: ``late_local`` (the slot was reached after max_late) and
  ``unreachable`` (the store did not answer until max_late);
* lease events on the beat side: ``started`` (a won claim of a leased entry: its lease record is
  queued), ``taken_over``, ``lost`` (given up after max_attempts, or because the store may have
  lost writes to it), ``superseded`` (abandoned for a newer slot instead of a takeover),
  ``paused`` (ended instead of a takeover: its entry is paused).

The slots, for the timestamps an alert compares (docs/production.md "Metrics"):
:meth:`Observer.next_slot` (the slot this instance waits for), :meth:`Observer.slot_came` (the
newest slot that should have run) and :meth:`Observer.ran` (the newest run this instance knows
was sent, by it or another).
"""
from __future__ import annotations

from collections.abc import Iterable

from celery_anarchon.stores.base import Outcome

#: the claim outcomes decided on this instance, beside the store's answers
LATE_LOCAL, UNREACHABLE = "late_local", "unreachable"
#: every claim outcome an instance tells (the store's answers and the two of its own)
CLAIM_OUTCOMES = (*(outcome.value for outcome in Outcome), LATE_LOCAL, UNREACHABLE)
#: every lease event of the beat side
LEASE_EVENTS = ("started", "taken_over", "lost", "superseded", "paused")
#: the store calls whose round trips are told
ROUND_TRIPS = ("claim", "lease_check")


class Observer:
    """What the engine did, one call per fact; every method is a no-op here."""

    def entries(self, names: Iterable[str]) -> None:
        """The entries this instance runs now (at start-up and whenever they change)."""

    def ticked(self, now: float) -> None:
        """A tick began at ``now`` (wall clock, epoch seconds)."""

    def claimed(self, entry: str, outcome: str, count: int = 1) -> None:
        """``count`` runs of ``entry`` were answered ``outcome`` (see the module's words)."""

    def sent(self, entry: str, attempt: int, lateness_s: float) -> None:
        """A run of ``entry`` (``attempt``, 1 for a claim, more for a takeover) was published,
        ``lateness_s`` seconds after its slot (wall clock)."""

    def send_failed(self, entry: str, unknown: bool = False) -> None:
        """A won run of ``entry`` was not sent: the send kept failing until max_late, or the
        claim answered too late; ``unknown``: the publish broke off (the broker may hold it)."""

    def store_round_trip(self, operation: str, seconds: float) -> None:
        """One call to the store took ``seconds`` (``operation``: ``claim`` for a batch of claims,
        ``lease_check`` for the scan of expired leases)."""

    def lease(self, event: str) -> None:
        """A lease event of this instance (see the module's words)."""

    def live_instances(self, count: int) -> None:
        """``count`` live instances (this one included) hold a record in the store."""

    def store_reachable(self, up: bool) -> None:
        """The store answered (``True``) or could not be reached (``False``)."""

    def entries_lost(self) -> None:
        """This instance saw the store lose entries data: its entries epoch vanished or changed,
        or its entries version went back (docs/design.md "Amnesia")."""

    def entries_kept(self, pauses: int, entries: int) -> None:
        """This instance keeps ``pauses`` pauses and ``entries`` store entries from before a loss
        of the store's entries data (0 and 0: it follows the store)."""


    def next_slot(self, entry: str, slot_ms: int) -> None:
        """The next slot of ``entry`` (epoch ms) as its plan computes it: the run this instance
        waits for, told when it is queued (at start-up, after each slot came, when the entry
        changed)."""

    def no_next_slot(self, entry: str) -> None:
        """``entry`` has no next slot: its ``end_at`` came (it had one before)."""

    def slot_came(self, entry: str, slot_ms: int) -> None:
        """The slot ``slot_ms`` (epoch ms) of ``entry`` came on this instance (its jitter passed,
        or it was reached after max_late): the newest slot that should have run."""

    def ran(self, entry: str, slot_ms: int) -> None:
        """The run of ``entry``'s slot ``slot_ms`` (epoch ms) was sent, as this instance knows:
        sent here (any attempt), or its claim was won by another instance (which sends it)."""

    def missed(self, entry: str, count: int) -> None:
        """``count`` slots of ``entry`` that no instance claimed in time were recorded
        ``missed`` by this instance (:mod:`.gaps`; once across instances: each counts the
        records it wrote)."""


#: the observer of an engine given none
NOOP = Observer()
