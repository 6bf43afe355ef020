"""Prometheus metrics of a beat instance: the engine's observer hook
(:class:`celery_anarchon.beat.engine.observe.Observer`) implemented with prometheus_client, in a
``CollectorRegistry`` of its own, served over HTTP by the beat process (also the beat inside
``celery worker -B``) when ``anarchon_metrics_port`` is set.

Settings (Celery configuration; rows of :data:`celery_anarchon.settings.OPTIONS`, read into
:class:`celery_anarchon.settings.Settings`):

* ``anarchon_metrics_port``: the port of ``/metrics`` (int; default ``None``: no exporter);
* ``anarchon_metrics_addr``: the address it binds (default ``"127.0.0.1"``; ``"0.0.0.0"`` for a
  Prometheus server on another host);
* ``anarchon_metrics_max_entries``: how many entries get a label of their own (default 500).

Bounded labels: the ``entry`` label names only the first ``anarchon_metrics_max_entries`` entries
in the order of their names (the same on every instance that runs the same entries); every other
entry is counted under ``entry="(other)"``. The histograms carry no entry label. So 10,000 entries
make at most 501 entry values per counter, whatever the schedule. See docs/production.md "Metrics".

Every labelled counter is served from 0 for each entry label and each outcome or event this
instance knows, so that ``increase(...)`` sees the first event; the series of an entry that no
longer has a label of its own are dropped (memory stays bounded when entries come and go). No
``*_created`` series are served (:func:`celery_anarchon.exporter.registry`).

The timestamps of an entry (gauges, epoch seconds; entries with a label of their own only: one
value cannot stand for every entry under ``(other)``):

* ``anarchon_next_slot_timestamp_seconds``: its next slot as the plan computes it (absent once
  the entry's ``end_at`` left it none);
* ``anarchon_last_slot_timestamp_seconds``: its newest slot that came (should have run);
* ``anarchon_last_run_timestamp_seconds``: the slot of its newest run this instance knows was
  sent: sent here, or won by another instance (every instance claims every slot of the entries
  it runs, so every instance knows of every run the cluster sent). Absent until this instance
  saw one since it started. So "entry X has not run for 2 intervals" is
  ``time() - max by (entry) (anarchon_last_run_timestamp_seconds{entry="X"}) > 2 * interval`` on
  any instance, and an entry is overdue when its last slot is newer than its last run.
"""
from __future__ import annotations

import heapq
import os
import threading
from collections.abc import Iterable
from typing import Any

from celery_anarchon import exporter
from celery_anarchon.beat.engine.observe import CLAIM_OUTCOMES, LEASE_EVENTS, ROUND_TRIPS, Observer
from celery_anarchon.settings import DEFAULT_METRICS_MAX_ENTRIES, OTHER_ENTRY_LABEL, Settings

#: the entry label of every entry past the cap
OTHER = OTHER_ENTRY_LABEL
DEFAULT_MAX_ENTRIES = DEFAULT_METRICS_MAX_ENTRIES
#: lateness at send, seconds: jitter (0-2 s by default) and a slow store or broker on top
LATENESS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)
#: one store call, seconds
ROUND_TRIP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                      2.5, 5.0, 10.0)


def require_client(settings: Settings) -> None:
    """prometheus_client, when ``anarchon_metrics_port`` is set (checked when beat starts).

    :raises ConfigError: a port set without prometheus_client installed.
    """
    if settings.metrics_port is not None:
        exporter.require_prometheus_client("anarchon_metrics_port")


class EntryLabels:
    """The ``entry`` label of each entry name, bounded: the first ``max_entries`` names in sorted
    order keep their name, every other entry is :data:`OTHER`.

    :param max_entries: how many entries keep their name (0: every entry is ``(other)``).
    """

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._named: frozenset[str] = frozenset()

    def update(self, names: Iterable[str]) -> None:
        """The entries run now: the first ``max_entries`` of them by name get a label."""
        self._named = frozenset(heapq.nsmallest(self.max_entries, set(names)))

    def __call__(self, name: str) -> str:
        """The label value of entry ``name``."""
        return name if name in self._named else OTHER

    @property
    def named(self) -> frozenset[str]:
        """The entries that keep their name."""
        return self._named


class PrometheusObserver(Observer):
    """The engine's facts as Prometheus metrics in :attr:`registry` (a registry of its own).

    :param max_entries: ``anarchon_metrics_max_entries`` (see :class:`EntryLabels`).
    :param instance_id: this instance's id, in ``anarchon_instance_info``.
    :param namespace: ``anarchon_namespace``, in ``anarchon_instance_info``.
    """

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, *, instance_id: str = "",
                 namespace: str = "") -> None:
        from prometheus_client import Counter, Gauge, Histogram, Info

        from celery_anarchon.beat.engine.instances import VERSION
        self.registry = registry = exporter.registry()
        self.labels = EntryLabels(max_entries)
        self._lock = threading.Lock()
        self.claims = Counter(
            "anarchon_claims", "Claim answers by entry and outcome (won, other_won: lost to "
            "another instance, or a skip reason)", ["entry", "outcome"], registry=registry)
        self.sends = Counter("anarchon_sends", "Runs published (every attempt)", ["entry"],
                             registry=registry)
        self.send_failures = Counter(
            "anarchon_send_failures", "Won runs not sent: the send failed until max_late, the "
            "claim answered too late, or the publish broke off", ["entry"], registry=registry)
        self.missed_runs = Counter(
            "anarchon_missed_runs", "Slots no instance claimed in time (every beat down, the "
            "store unreachable), recorded missed in the history by this instance: summed over "
            "the instances, each missed slot counts once", ["entry"], registry=registry)
        self.lateness = Histogram(
            "anarchon_lateness_seconds", "Seconds from the slot to the send of a first attempt",
            buckets=LATENESS_BUCKETS, registry=registry)
        self.round_trip = Histogram(
            "anarchon_store_round_trip_seconds", "Seconds of one store call (claim: a batch of "
            "claims; lease_check: the scan of expired leases)", ["operation"],
            buckets=ROUND_TRIP_BUCKETS, registry=registry)
        self.leases = Counter("anarchon_leases", "Lease events of this instance (started, "
                              "taken_over, lost, superseded, paused)", ["event"], registry=registry)
        self.store_up = Gauge("anarchon_store_up", "1 when the store answered last, 0 when it "
                              "could not be reached", registry=registry)
        self.last_tick = Gauge("anarchon_last_tick_timestamp_seconds", "When this instance last "
                               "ticked (epoch seconds)", registry=registry)
        self.entry_count = Gauge("anarchon_entries", "Entries this instance runs",
                                 registry=registry)
        self.entries_losses = Counter(
            "anarchon_entries_lost", "Losses of the store's entries data this instance saw (its "
            "entries epoch gone or changed, or its entries version gone back)", registry=registry)
        self.kept = Gauge(
            "anarchon_entries_kept", "Pauses (kind=pause) and store entries (kind=entry) this "
            "instance keeps from before its store lost them; 0: it follows the store",
            ["kind"], registry=registry)
        for kind in ("pause", "entry"):
            self.kept.labels(kind).set(0)
        self.next_slots = Gauge(
            "anarchon_next_slot_timestamp_seconds", "The entry's next slot as its plan computes "
            "it (epoch seconds)", ["entry"], registry=registry)
        self.last_slots = Gauge(
            "anarchon_last_slot_timestamp_seconds", "The entry's newest slot that came on this "
            "instance: the newest that should have run (epoch seconds)", ["entry"],
            registry=registry)
        self.last_runs = Gauge(
            "anarchon_last_run_timestamp_seconds", "The slot of the entry's newest run this "
            "instance knows was sent: here, or won by another instance (epoch seconds)",
            ["entry"], registry=registry)
        self._last_run_ms: dict[str, int] = {}
        for event in LEASE_EVENTS:
            self.leases.labels(event)
        for operation in ROUND_TRIPS:
            self.round_trip.labels(operation)
        Info("anarchon_instance", "This beat instance", registry=registry).info(
            {"instance_id": instance_id, "namespace": namespace, "version": VERSION})
        self._gauge_cls = Gauge
        self._live = None               # created at the first count: absent on other stores
        #: label values -> the metric's child: a burst of 10,000 runs looks each up once
        self._children: dict[tuple, Any] = {}
        self._labelled: set[str] = set()
        self._zero({OTHER})

    def _child(self, metric: Any, *values: str) -> Any:
        key = (id(metric), *values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def _zero(self, labels: set[str]) -> None:
        """Serve the counters of entry labels ``labels`` from 0."""
        for label in labels:
            for outcome in CLAIM_OUTCOMES:
                self._child(self.claims, label, outcome)
            self._child(self.sends, label)
            self._child(self.send_failures, label)
            self._child(self.missed_runs, label)
        self._labelled |= labels

    def _drop(self, labels: set[str]) -> None:
        """Drop every series of entry labels ``labels`` (entries no longer labelled)."""
        by_metric = {id(metric): metric for metric in
                     (self.claims, self.sends, self.send_failures, self.missed_runs,
                      self.next_slots, self.last_slots, self.last_runs)}
        for key in [k for k in self._children if k[0] in by_metric and k[1] in labels]:
            metric = by_metric[key[0]]
            del self._children[key]
            try:
                metric.remove(*key[1:])
            except KeyError:
                pass
        for label in labels:
            self._last_run_ms.pop(label, None)
        self._labelled -= labels

    def entries(self, names: Iterable[str]) -> None:
        names = list(names)
        self.labels.update(names)
        self.entry_count.set(len(names))
        labelled = set(self.labels.named) | {OTHER}
        self._drop(self._labelled - labelled)
        self._zero(labelled - self._labelled)

    def ticked(self, now: float) -> None:
        self.last_tick.set(now)

    def claimed(self, entry: str, outcome: str, count: int = 1) -> None:
        self._child(self.claims, self.labels(entry), outcome).inc(count)

    def sent(self, entry: str, attempt: int, lateness_s: float) -> None:
        self._child(self.sends, self.labels(entry)).inc()
        if attempt == 1:               # a takeover's lateness is the lease's, not the schedule's
            self.lateness.observe(lateness_s)

    def send_failed(self, entry: str, unknown: bool = False) -> None:
        self._child(self.send_failures, self.labels(entry)).inc()

    def missed(self, entry: str, count: int) -> None:
        if count:
            self._child(self.missed_runs, self.labels(entry)).inc(count)

    def store_round_trip(self, operation: str, seconds: float) -> None:
        self._child(self.round_trip, operation).observe(seconds)

    def lease(self, event: str) -> None:
        self._child(self.leases, event).inc()

    def live_instances(self, count: int) -> None:
        with self._lock:
            if self._live is None:
                self._live = self._gauge_cls(
                    "anarchon_live_instances", "Live instances (this one included) holding a "
                    "record in the store, at this instance's last heartbeat", registry=self.registry)
        self._live.set(count)

    def store_reachable(self, up: bool) -> None:
        self.store_up.set(1 if up else 0)

    def entries_lost(self) -> None:
        self.entries_losses.inc()

    def entries_kept(self, pauses: int, entries: int) -> None:
        self._child(self.kept, "pause").set(pauses)
        self._child(self.kept, "entry").set(entries)

    def next_slot(self, entry: str, slot_ms: int) -> None:
        if entry in self.labels.named:
            self._child(self.next_slots, entry).set(slot_ms / 1000)

    def no_next_slot(self, entry: str) -> None:
        child = self._children.pop((id(self.next_slots), entry), None)
        if child is not None:
            try:
                self.next_slots.remove(entry)
            except KeyError:
                pass

    def slot_came(self, entry: str, slot_ms: int) -> None:
        if entry in self.labels.named:
            self._child(self.last_slots, entry).set(slot_ms / 1000)

    def ran(self, entry: str, slot_ms: int) -> None:
        if entry in self.labels.named and slot_ms > self._last_run_ms.get(entry, -1):
            self._last_run_ms[entry] = slot_ms
            self._child(self.last_runs, entry).set(slot_ms / 1000)


_process_lock = threading.Lock()
#: pid -> the observer of this process (one registry and one exporter per process)
_process_observers: dict[int, PrometheusObserver] = {}


def process_observer(settings: Settings, *, instance_id: str,
                     namespace: str) -> PrometheusObserver | None:
    """The observer of this beat process, its exporter started on first use (once per process:
    a forked process gets its own); ``None`` when ``anarchon_metrics_port`` is unset.

    :raises ConfigError: the port is in use (naming the setting, the value and the fix), or
        prometheus_client is not installed.
    """
    if settings.metrics_port is None:
        return None
    with _process_lock:
        observer = _process_observers.get(os.getpid())
        if observer is None:
            observer = PrometheusObserver(settings.metrics_max_entries, instance_id=instance_id,
                                          namespace=namespace)
            exporter.serve(observer.registry, port=settings.metrics_port,
                           addr=settings.metrics_addr, setting="anarchon_metrics_port")
            _process_observers[os.getpid()] = observer
        return observer
