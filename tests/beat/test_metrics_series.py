"""The series beat's metrics serve: every labelled counter from 0 for each entry label and
outcome or event the instance knows (an ``increase()`` sees the first event), no ``*_created``
series, the series of an entry that lost its label dropped, and each entry's next slot, last slot
and last run as timestamps told by the engine (docs/production.md "Metrics")."""
from __future__ import annotations

import socket
import urllib.request

from celery import Celery
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from celery_anarchon.beat.engine import Engine
from celery_anarchon.beat.engine.observe import CLAIM_OUTCOMES, LEASE_EVENTS
from celery_anarchon.beat.metrics import OTHER, PrometheusObserver
from celery_anarchon.worker import metrics as worker_metrics

from engine_support import T0, Clocks, another, make_plan, memory_store


def served(observer: PrometheusObserver) -> dict[tuple, float]:
    """``{(name, sorted labels): value}`` of every sample the observer's registry serves."""
    text = generate_latest(observer.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(found: dict, name: str, **labels) -> float | None:
    return found.get((name, tuple(sorted(labels.items()))))


def test_every_labelled_counter_starts_at_zero_for_each_entry_and_outcome():
    observer = PrometheusObserver(max_entries=2)
    observer.entries(["a", "b", "c"])
    found = served(observer)
    for entry in ("a", "b", OTHER):
        for outcome in CLAIM_OUTCOMES:
            assert value(found, "anarchon_claims_total", entry=entry, outcome=outcome) == 0
        assert value(found, "anarchon_sends_total", entry=entry) == 0
        assert value(found, "anarchon_send_failures_total", entry=entry) == 0
        assert value(found, "anarchon_missed_runs_total", entry=entry) == 0
    assert not [key for key in found if key[0] == "anarchon_claims_total"
                and dict(key[1])["entry"] == "c"]
    for event in LEASE_EVENTS:
        assert value(found, "anarchon_leases_total", event=event) == 0
    assert value(found, "anarchon_store_round_trip_seconds_count", operation="claim") == 0
    assert not [key for key in found if key[0].endswith("_created")]
    observer.claimed("c", "late_local")
    assert value(served(observer), "anarchon_claims_total", entry=OTHER, outcome="late_local") == 1
    observer.missed("a", 21)
    observer.missed("c", 3)
    observer.missed("a", 0)
    found = served(observer)
    assert value(found, "anarchon_missed_runs_total", entry="a") == 21
    assert value(found, "anarchon_missed_runs_total", entry=OTHER) == 3


def test_an_entry_that_loses_its_label_loses_its_series_and_the_new_one_starts_at_zero():
    observer = PrometheusObserver(max_entries=2)
    observer.entries(["a", "b", "c"])
    observer.claimed("a", "won")
    observer.next_slot("a", 5_000)
    observer.entries(["b", "c", "d"])
    found = served(observer)
    assert not [key for key in found if ("entry", "a") in key[1]]
    assert value(found, "anarchon_claims_total", entry="c", outcome="won") == 0
    assert value(found, "anarchon_sends_total", entry="c") == 0


def test_the_timestamps_are_served_for_the_labelled_entries_only_and_the_last_run_only_grows():
    observer = PrometheusObserver(max_entries=1)
    observer.entries(["a", "b"])
    for name in ("a", "b"):
        observer.next_slot(name, 20_000)
        observer.slot_came(name, 10_000)
        observer.ran(name, 10_000)
    observer.ran("a", 5_000)              # an older run told later: the newest stays
    found = served(observer)
    assert value(found, "anarchon_next_slot_timestamp_seconds", entry="a") == 20.0
    assert value(found, "anarchon_last_slot_timestamp_seconds", entry="a") == 10.0
    assert value(found, "anarchon_last_run_timestamp_seconds", entry="a") == 10.0
    assert not [key for key in found if key[0].endswith("_timestamp_seconds")
                and dict(key[1]).get("entry") in ("b", OTHER)]


def test_an_entry_past_its_end_at_has_no_next_slot_series():
    import collections
    import dataclasses
    import random

    from celery_anarchon.beat.engine.claims import ClaimRetries
    from celery_anarchon.beat.engine.due import DueRuns
    from celery_anarchon.beat.engine.notes import NoteBuffer
    from celery_anarchon.beat.engine.outage import Outage
    from celery_anarchon.schedule.slots.window import Window, WindowedSlots
    clocks = Clocks()
    store, stats = memory_store(clocks), collections.Counter()
    outage = Outage(store, clocks.mono, stats)
    observer = PrometheusObserver(max_entries=2)
    observer.entries(["e"])
    due = DueRuns("ns", random.Random(1), None,
                  ClaimRetries(store, "A", stats, NoteBuffer(store, outage), outage),
                  observer=observer)
    plan = make_plan(every_s=10, max_late_s=5)
    end_ms = int(T0 * 1000) + 10_000
    plan = dataclasses.replace(plan, slots=WindowedSlots("e", plan.slots, Window(None, end_ms)))
    due.seed(plan, T0 + 6)                        # the slot at T0 is past max_late
    assert value(served(observer), "anarchon_next_slot_timestamp_seconds", entry="e") == T0 + 10
    assert [r.slot_ms for r in due.pop(T0 + 10, {"e": plan})] == [end_ms]
    assert value(served(observer), "anarchon_next_slot_timestamp_seconds", entry="e") is None
    assert value(served(observer), "anarchon_last_slot_timestamp_seconds", entry="e") == T0 + 10


def test_the_engines_tell_each_instance_the_slots_and_the_runs_the_cluster_sent():
    """A wins every run, B loses each to A: both know the last run. A's sends then fail until
    max_late: its last slot moves past its last run (overdue), while B, which only saw the claim
    won, still counts it as sent (the winner's failures are in its send failures)."""
    clocks = Clocks()
    store = memory_store(clocks)
    plans = {"e": make_plan("e", every_s=10, max_late_s=5)}
    failing = []

    def send(*args):
        if failing:
            raise ConnectionError("broker down")

    observers = {name: PrometheusObserver() for name in "AB"}
    engines = [Engine(on, plans, instance_id=name, namespace="ns", send=send, clock=clocks.wall,
                      monotonic=clocks.mono, observer=observers[name])
               for name, on in (("A", store), ("B", another(store, "B")))]

    def tick_for(seconds: float) -> None:
        for _ in range(int(seconds)):
            for engine in engines:
                engine.tick()
            clocks.advance(1)

    tick_for(11)          # the slots T0 (before the new store's memory: forgotten) and T0 + 10 s
    for name in "AB":
        found = served(observers[name])
        assert value(found, "anarchon_last_slot_timestamp_seconds", entry="e") == T0 + 10
        assert value(found, "anarchon_last_run_timestamp_seconds", entry="e") == T0 + 10
        assert value(found, "anarchon_next_slot_timestamp_seconds", entry="e") == T0 + 20
    assert value(served(observers["B"]), "anarchon_claims_total", entry="e",
                 outcome="other_won") == 1
    failing.append(True)
    tick_for(20)                         # T0 + 20 s and 30 s came; A's sends fail until max_late
    found = served(observers["A"])
    assert value(found, "anarchon_last_slot_timestamp_seconds", entry="e") == T0 + 30
    assert value(found, "anarchon_last_run_timestamp_seconds", entry="e") == T0 + 10
    assert value(found, "anarchon_send_failures_total", entry="e") >= 1
    assert value(served(observers["B"]), "anarchon_last_run_timestamp_seconds",
                 entry="e") == T0 + 30


def test_the_worker_serves_every_lease_event_from_zero_without_created_series():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = Celery("metrics_series", set_as_current=False)
    app.conf.anarchon_worker_metrics_port = port
    server = worker_metrics.start_exporter(app, pool="threads")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
    samples = {(s.name, s.labels.get("event")): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    for event in worker_metrics.EVENTS:
        assert ("anarchon_worker_leases_total", event) in samples, event
    assert not [name for name, _ in samples if name.endswith("_created")]
