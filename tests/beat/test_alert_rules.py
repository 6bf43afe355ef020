"""The Prometheus alerting rules shipped in docs/prometheus: ``promtool check rules`` and
``promtool test rules`` pass (series that fire each alert and series that do not), and every
metric they, docs/production.md's example alerts and the Grafana dashboard (docs/grafana) name is
a series the exporters really serve (beat engines ticked on a store, the worker's exporter,
scraped over HTTP); the committed dashboard is what its script makes. Without promtool (or
grafana-foundation-sdk) their test is skipped, and fails under ``CI=true`` (.ci/run installs
Debian's ``prometheus``; the ``test`` extra has the SDK)."""
from __future__ import annotations

import importlib.util
import json
import pathlib
import re
import shutil
import socket
import subprocess
import urllib.request

import pytest
from celery import Celery
from prometheus_client.parser import text_string_to_metric_families

from celery_anarchon import exporter
from celery_anarchon.beat.engine import Engine
from celery_anarchon.beat.metrics import PrometheusObserver
from celery_anarchon.worker import metrics as worker_metrics

from conftest import IN_CI
from engine_support import Clocks, another, make_plan, memory_store

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
RULES = DOCS / "prometheus" / "anarchon-alerts.yml"
RULES_TEST = DOCS / "prometheus" / "anarchon-alerts.test.yml"
PRODUCTION = DOCS / "production.md"
DASHBOARD = DOCS / "grafana" / "anarchon-dashboard.json"
MAKE_DASHBOARD = DOCS / "grafana" / "make_dashboard.py"
#: a metric name in an expression (Prometheus' own ``up`` aside, every metric here is ours)
METRIC = re.compile(r"\banarchon_[a-z_]+\b")
#: a label matcher on one of the few-valued labels: the value must be one the exporter serves
MATCHER = re.compile(r'\b(outcome|event|operation|kind)\s*=\s*"([a-z_]+)"')


def missing(message: str) -> None:
    """A tool the test needs is missing: a failure under CI, else a skip."""
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        missing("promtool is missing (Debian's prometheus package; .ci/run installs it)")
    return path


def test_the_rules_pass_promtool_check_and_test():
    tool = promtool()
    for args in (["check", "rules", RULES.name], ["test", "rules", RULES_TEST.name]):
        proc = subprocess.run([tool, *args], cwd=RULES.parent, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, f"promtool {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"


def rule_expressions() -> list[str]:
    """The ``expr`` of every rule of the rules file."""
    import yaml
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def docs_expressions() -> list[str]:
    """The PromQL blocks of docs/production.md (its example alerts)."""
    return re.findall(r"```promql\n(.*?)```", PRODUCTION.read_text(), re.S)


def test_the_docs_name_the_rules_file_and_show_alerts():
    assert docs_expressions(), "docs/production.md lost its example alerts"
    assert "docs/prometheus/anarchon-alerts.yml" in PRODUCTION.read_text()
    assert len(rule_expressions()) >= 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> list:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return [sample for family in text_string_to_metric_families(text)
            for sample in family.samples]


def served_by_beats() -> list:
    """The samples of beat instance B's /metrics after two instances ran two slots of a plain
    and a leased entry on one store (A won them, B lost them to A)."""
    from celery_anarchon.schedule.timing import LeaseSettings
    clocks = Clocks()
    store = memory_store(clocks)
    lease = LeaseSettings(duration_s=6, heartbeat_s=1, queue_timeout_s=4, max_attempts=3)
    plans = {"e": make_plan("e"), "leased": make_plan("leased", lease=lease)}
    engines, observers = [], []
    for instance, on in (("A", store), ("B", another(store, "B"))):
        observer = PrometheusObserver(instance_id=instance, namespace="ns")
        engines.append(Engine(on, plans, instance_id=instance, namespace="ns",
                              send=lambda *a: None, clock=clocks.wall, monotonic=clocks.mono,
                              sync_interval_s=1.0, observer=observer))
        observers.append(observer)
    for _ in range(2):
        for engine in engines:
            engine.tick()
        clocks.advance(10)
    port = free_port()
    server = exporter.serve(observers[1].registry, port=port, addr="127.0.0.1",
                            setting="anarchon_metrics_port")
    try:
        found = scrape(port)
    finally:
        server.shutdown()
    assert any(s.name == "anarchon_last_run_timestamp_seconds" and s.labels["entry"] == "e"
               for s in found), "B does not know of A's runs"
    return found


def served_by_a_worker() -> list:
    port = free_port()
    app = Celery("alert_rules", set_as_current=False)
    app.conf.anarchon_worker_metrics_port = port
    server = worker_metrics.start_exporter(app, pool="solo")
    try:
        return scrape(port)
    finally:
        server.shutdown()


def dashboard_expressions() -> list[str]:
    """The query of every panel of the committed dashboard, and of its variables."""
    board = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in board["panels"] for target in panel.get("targets", [])]
    queries += [v["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return queries


def test_the_committed_dashboard_is_what_its_script_makes():
    if importlib.util.find_spec("grafana_foundation_sdk") is None:
        missing("grafana-foundation-sdk is missing (the test and docs extras)")
    spec = importlib.util.spec_from_file_location("make_dashboard", MAKE_DASHBOARD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.render() == DASHBOARD.read_text(), \
        f"run python {MAKE_DASHBOARD.relative_to(DOCS.parent)} and commit its JSON"
    assert len(dashboard_expressions()) >= 10


def test_every_metric_the_rules_the_docs_and_the_dashboard_name_is_served():
    found = served_by_beats() + served_by_a_worker()
    served = {s.name for s in found}
    assert not [name for name in served if name.endswith("_created")]
    values = {(label, value) for s in found for label, value in s.labels.items()}
    for where, expressions in (("the rules file", rule_expressions()),
                               ("docs/production.md", docs_expressions()),
                               ("the dashboard", dashboard_expressions())):
        text = "\n".join(expressions)
        named = set(METRIC.findall(text))
        assert named, where
        assert named <= served, f"{where} names series nobody serves: {sorted(named - served)}"
        matched = set(MATCHER.findall(text))
        assert matched <= values, f"{where} matches label values never served: " \
                                  f"{sorted(matched - values)}"
