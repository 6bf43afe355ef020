"""Prometheus metrics: the bounded entry label, the exporter, the engine's observer hook, and the
metrics of a three-beat run read back over HTTP (real processes). Their settings and errors:
tests/test_settings.py."""
from __future__ import annotations

import collections
import json
import math
import socket
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from celery_anarchon import exporter
from celery_anarchon.beat.engine.observe import Observer
from celery_anarchon.beat.engine.outage import Outage
from celery_anarchon.beat.engine.sends import Send, SendQueue
from celery_anarchon.beat.engine.notes import NoteBuffer
from celery_anarchon.errors import ConfigError, StoreError
from celery_anarchon.beat.metrics import OTHER, EntryLabels, PrometheusObserver
from celery_anarchon.stores import open_store

from backends import backdate_memory_start
from cluster import Cluster, read_executions
from conftest import REDIS_URL, require_server
from engine_support import T0, Clocks, make_plan, memory_store
from stores_support import store_url, wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def samples(text: str) -> list[tuple[str, dict, float]]:
    """``(name, labels, value)`` of every sample of a /metrics page."""
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text)
            for s in family.samples]


def total(found: list, name: str, **labels) -> float:
    """The sum of the samples named ``name`` whose labels include ``labels``."""
    return sum(v for n, l, v in found if n == name and labels.items() <= l.items())


# -- the bounded entry label ---------------------------------------------------------------------

def test_the_first_entries_by_name_keep_their_label_the_rest_are_other():
    labels = EntryLabels(500)
    names = [f"entry-{i:05d}" for i in range(10_000)]
    labels.update(reversed(names))
    values = {labels(name) for name in names}
    assert len(values) == 501 and OTHER in values
    assert all(labels(name) == name for name in names[:500])
    assert all(labels(name) == OTHER for name in names[500:])
    assert labels("not-run-here") == OTHER


def test_the_cut_moves_with_the_entries_run():
    labels = EntryLabels(2)
    labels.update(["b", "c", "d"])
    assert [labels(n) for n in "abcd"] == [OTHER, "b", "c", OTHER]
    labels.update(["a", "b", "c", "d"])
    assert [labels(n) for n in "abcd"] == ["a", "b", OTHER, OTHER]
    zero = EntryLabels(0)
    zero.update(["a"])
    assert zero("a") == OTHER


def test_ten_thousand_entries_make_a_bounded_number_of_series():
    observer = PrometheusObserver(max_entries=50)
    names = [f"e{i}" for i in range(10_000)]
    observer.entries(names)
    for name in names:
        observer.claimed(name, "won")
        observer.claimed(name, "other_won")
        observer.sent(name, 1, 0.1)
    from prometheus_client import generate_latest
    found = samples(generate_latest(observer.registry).decode())
    entries = {l["entry"] for n, l, _ in found if "entry" in l}
    assert len(entries) == 51
    assert total(found, "anarchon_claims_total", entry=OTHER, outcome="won") == 10_000 - 50
    assert total(found, "anarchon_claims_total") == 20_000
    assert total(found, "anarchon_lateness_seconds_count") == 10_000
    assert not [l for n, l, _ in found if n.startswith("anarchon_lateness") and "entry" in l]


# -- the exporter ---------------------------------------------------------------------------------

def test_a_port_in_use_is_a_config_error_naming_the_setting_value_and_fix():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError) as err:
            exporter.serve(PrometheusObserver().registry, port=port, addr="127.0.0.1",
                           setting="anarchon_metrics_port")
    message = str(err.value)
    assert f"anarchon_metrics_port = {port}: cannot serve metrics on 127.0.0.1:{port}" in message
    assert "Fix: pick a free port for anarchon_metrics_port" in message


def test_an_exporter_serves_its_registry_once_per_process():
    observer = PrometheusObserver(instance_id="i-1", namespace="ns")
    port = free_port()
    server = exporter.serve(observer.registry, port=port, addr="127.0.0.1",
                            setting="anarchon_metrics_port")
    try:
        assert exporter.serve(observer.registry, port=port, addr="127.0.0.1",
                              setting="anarchon_metrics_port") is server
        with pytest.raises(ConfigError, match="already serves other metrics"):
            exporter.serve(PrometheusObserver().registry, port=port, addr="127.0.0.1",
                           setting="anarchon_metrics_port")
        observer.store_reachable(True)
        found = samples(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
                        .read().decode())
        assert total(found, "anarchon_store_up") == 1
        assert total(found, "anarchon_instance_info", instance_id="i-1", namespace="ns") == 1
        assert not [n for n, _, _ in found if n == "anarchon_live_instances"]  # no records seen
    finally:
        server.shutdown()


# -- the engine's hook ---------------------------------------------------------------------------

class Recorder(Observer):
    def __init__(self):
        self.calls = []

    def __getattribute__(self, name):
        if name in ("sent", "send_failed", "store_reachable", "claimed", "lease", "store_round_trip"):
            return lambda *args, **kwargs: self.calls.append((name, *args, *kwargs.values()))
        return object.__getattribute__(self, name)


def test_the_send_queue_tells_the_observer_each_send_its_lateness_and_each_failure():
    clocks, recorder = Clocks(), Recorder()
    store = memory_store(clocks)
    stats = collections.Counter()
    outage = Outage(store, clocks.mono, stats, observer=recorder)
    failing = []

    def send(*args):
        if failing:
            raise failing[0]

    sends = SendQueue(send, clocks.wall, clocks.mono, stats, NoteBuffer(store, outage),
                      observer=recorder)
    plan = make_plan(every_s=10)
    clocks.advance(0.25)
    sends.send(Send(plan, int(T0 * 1000), 1, None, "t1"))
    assert recorder.calls == [("sent", "e", 1, pytest.approx(0.25))]
    failing.append(ConnectionError("broker down"))
    sends.send(Send(plan, int(T0 * 1000) + 10_000, 1, None, "t2"))
    clocks.advance(plan.timing.max_late_s + 11)
    sends.retry(clocks.wall())
    assert recorder.calls[-1] == ("send_failed", "e")
    outage.failed(StoreError("down"), "claiming")
    outage.recovered()
    assert recorder.calls[-2:] == [("store_reachable", False), ("store_reachable", True)]


def test_takeovers_and_heartbeats_tell_the_observer():
    import random

    from celery_anarchon.beat.engine.instances import Heartbeat
    from celery_anarchon.beat.engine.skew import SkewCheck
    from celery_anarchon.beat.engine.takeovers import Takeovers
    from celery_anarchon.schedule.timing import LeaseSettings
    from engine_support import expired_run

    clocks, recorder = Clocks(), Recorder()
    store = memory_store(clocks)
    stats = collections.Counter()
    outage = Outage(store, clocks.mono, stats)
    sends = SendQueue(lambda *a: None, clocks.wall, clocks.mono, stats, NoteBuffer(store, outage))
    takeovers = Takeovers(store, "ns", clocks.mono, random.Random(7), stats, outage, sends,
                          observer=recorder)
    lease = LeaseSettings(duration_s=6, heartbeat_s=1, queue_timeout_s=4, max_attempts=3)
    plan = make_plan(lease=lease)
    expired_run(store, clocks, lease=lease)
    takeovers.check({"e": plan})
    assert ("lease", "taken_over") in recorder.calls
    assert [c[1] for c in recorder.calls if c[0] == "store_round_trip"] == ["lease_check"]
    heartbeat = Heartbeat(store, "A", clocks.wall, 15_000, outage,
                          SkewCheck(store, clocks.wall, clocks.mono), observer=recorder)
    lives = []
    recorder.live_instances = lives.append
    heartbeat.beat({"e": plan}, 1)
    Heartbeat(store, "B", clocks.wall, 15_000, outage, SkewCheck(store, clocks.wall, clocks.mono),
              observer=recorder).beat({"e": plan}, 1)
    assert lives == [1, 2]


# -- a three-beat run, read back over HTTP --------------------------------------------------------

ENTRIES = ("every-1s", "leased-3s")


def scrape(port: int) -> list:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return samples(response.read().decode())


def test_three_beats_metrics_add_up_to_the_runs_executed(tmp_path, namespace, capsys):
    require_server(REDIS_URL, "Redis (the broker)")
    started = time.monotonic()
    url = store_url("sqlite", str(tmp_path))
    store = open_store(url, namespace=namespace, instance_id="test", options={})
    store.prepare(list(ENTRIES))
    backdate_memory_start(store, list(ENTRIES), 120_000)    # a store in service for a while
    store.close()
    out = str(tmp_path / "executions.jsonl")
    window_start = math.ceil(time.time()) + 5
    window_end = window_start + 9
    cluster = Cluster(str(tmp_path), {
        "ANARCHON_IT_BROKER": REDIS_URL.rsplit("/", 1)[0] + "/8", "ANARCHON_IT_STORE": url,
        "ANARCHON_IT_NAMESPACE": namespace, "ANARCHON_IT_QUEUE": f"metrics-{namespace}",
        "ANARCHON_IT_OUT": out, "ANARCHON_IT_WINDOW": f"{window_start},{window_end}"},
        app="metrics_app")
    beat_ports = {name: free_port() for name in ("beat-a", "beat-b", "beat-c")}
    worker_ports = {"worker": free_port(), "beat-c": free_port()}
    try:
        # a prefork worker reports its children's lease events in multiprocess mode; the
        # worker of beat-c runs threads, in its main process
        (tmp_path / "prom").mkdir()
        cluster.worker("worker", pool="prefork", concurrency=2, env={
            "ANARCHON_WORKER_METRICS_PORT": str(worker_ports["worker"]),
            "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prom")})
        for name in ("beat-a", "beat-b"):
            cluster.beat(name, env={"ANARCHON_METRICS_PORT": str(beat_ports[name])})
        cluster.worker("beat-c", "-B", env={               # beat inside a worker, and its worker
            "ANARCHON_METRICS_PORT": str(beat_ports["beat-c"]),
            "ANARCHON_WORKER_METRICS_PORT": str(worker_ports["beat-c"])})
        for name in beat_ports:
            cluster.wait_log(name, "anarchon: metrics on http://127.0.0.1:")
        # every slot is claimed by jitter + max_late after the window; the last leased run
        # takes 1.2 s more; then the counts stop moving
        time.sleep(max(0.0, window_end + 0.75 + 3.0 + 0.5 - time.time()))

        def settled():
            beats = {name: scrape(port) for name, port in beat_ports.items()}
            executed = read_executions(out)
            sends = sum(total(found, "anarchon_sends_total") for found in beats.values())
            live = [total(found, "anarchon_live_instances") for found in beats.values()]
            return (beats, executed) if len(executed) == sends and live == [3, 3, 3] else None
        beats, executed = wait_until(settled, 15, "every send executed, 3 live instances seen",
                                     interval=0.2)
        workers = {name: scrape(port) for name, port in worker_ports.items()}
    finally:
        cluster.stop_all()
    runs = collections.Counter((x["entry"], x["slot"]) for x in executed)
    assert all(n == 1 for n in runs.values()), runs
    expected = {"every-1s": window_end - window_start + 1,
                "leased-3s": (window_end - window_start) // 3 + 1}
    by_entry = collections.Counter(entry for entry, _ in runs)
    assert all(0 < by_entry[e] <= expected[e] for e in ENTRIES), (by_entry, cluster.logs())
    for entry in ENTRIES:        # the won claims, summed over the instances: the runs executed
        assert sum(total(found, "anarchon_claims_total", entry=entry, outcome="won")
                   for found in beats.values()) == by_entry[entry]
    for name, found in beats.items():
        wins = total(found, "anarchon_claims_total", outcome="won")
        assert total(found, "anarchon_claims_total", outcome="other_won") > 0, name
        assert total(found, "anarchon_sends_total") == wins, name
        assert total(found, "anarchon_send_failures_total") == 0, name
        assert total(found, "anarchon_lateness_seconds_count") == wins, name
        assert total(found, "anarchon_leases_total", event="started") == total(
            found, "anarchon_claims_total", entry="leased-3s", outcome="won"), name
        assert total(found, "anarchon_store_round_trip_seconds_count", operation="claim") > 0
        assert total(found, "anarchon_store_up") == 1, name
        assert total(found, "anarchon_live_instances") == 3, name
        assert total(found, "anarchon_entries") == 2 + 1, name   # and celery.backend_cleanup
        assert time.time() - total(found, "anarchon_last_tick_timestamp_seconds") < 60
    adopted = sum(total(w, "anarchon_worker_leases_total", event="adopted") for w in workers.values())
    released = sum(total(w, "anarchon_worker_leases_total", event="released")
                   for w in workers.values())
    renewed = sum(total(w, "anarchon_worker_leases_total", event="renewed") for w in workers.values())
    assert adopted == released == by_entry["leased-3s"], workers
    by_worker = collections.Counter(x["worker"] for x in executed if x["entry"] == "leased-3s")
    assert {name: total(w, "anarchon_worker_leases_total", event="adopted")
            for name, w in workers.items()} == {name: by_worker[name] for name in workers}
    assert renewed >= by_entry["leased-3s"]          # 1.2 s at a 0.5 s heartbeat: 2 each
    with capsys.disabled():
        wins = {name: total(f, "anarchon_claims_total", outcome="won") for name, f in beats.items()}
        print(f"\n[metrics] {sum(by_entry.values())} runs executed, wins per instance {wins}, "
              f"leases adopted {adopted:g} renewed {renewed:g}, leased runs per worker "
              f"{dict(by_worker)}, "
              f"test {time.monotonic() - started:.1f} s")
