"""The operators' commands as people, CI pipelines and deploy scripts run them: `celery -A
operate_app anarchon status | history | check | next` as real subprocesses (tests/support/apps/
operate_app.py) against real stores, and celery_anarchon.testing in a user's own tests."""
from __future__ import annotations

import datetime
import json
import pathlib
import time

import celery._state
import pytest
from celery import Celery
from celery.schedules import crontab

import celery_anarchon
from celery_anarchon import testing
from celery_anarchon.operate.overview import overview
from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import ClaimRequest, LeaseTerms, RunEvent
from celery_anarchon.stores.entry_store import InstanceRecord
from celery_anarchon.settings import Settings

from backends import BACKENDS
from cluster import Cluster
from helpers import request_run
from operate_support import exits, operate, run_in_process

from paths import APPS
BERLIN_DST_2027 = "2027-03-26T12:00:00Z"   # two days before the last Sunday of March 2027


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'store.sqlite3'}"


def test_check_fails_with_the_exact_rule_on_a_broken_schedule_and_passes_on_a_good_one(
        sqlite_url, namespace):
    out = exits(operate(sqlite_url, namespace, "broken", "check"), 1)
    assert ("FAIL  too-much-jitter: jitter < half the shortest gap between slots\n      entry "
            "'too-much-jitter': jitter 6 s (options['anarchon']['jitter']) must be less than half "
            "the shortest gap between its slots (10 s)") in out
    assert ("FAIL  bad-crontab: a crontab step within its field\n      entry 'bad-crontab': "
            "crontab: minute field '*/120': the step 120 is larger than the field's range 0-59"
            ) in out
    assert "ok    beat_schedule entry 'fine' (every 60 s): every timing rule" in out
    assert "ok    store reachable" in out and out.rstrip().endswith("check: 2 problems, 4 passed, 1 warning")

    out = exits(operate(sqlite_url, namespace, "good", "check"), 0)
    assert "ok    beat_schedule entry 'berlin-0230' (cron 30 2 * * * Europe/Berlin)" in out
    assert ("ok    worker side installed (celery_anarchon.install(app)) for 1 leased entry: "
            "leased-hourly") in out
    assert "warn  anarchon store: the SQLite store" in out   # one host only: counted
    assert out.rstrip().endswith("check: 7 passed, 1 warning")

    out = exits(operate(sqlite_url, namespace, "uninstalled", "check"), 1)
    assert "FAIL  leased: a leased entry needs celery_anarchon.install(app)" in out
    # nothing listens on port 1: the rules still pass, the store is a problem; --no-store skips it
    out = exits(operate("postgresql://postgres:secret@127.0.0.1:1/test", namespace, "good", "check"), 1)
    assert "FAIL  configuration: the store reachable" in out and "secret" not in out
    assert "check: all 6 passed" in exits(operate("postgresql://postgres@127.0.0.1:1/test",
                                                   namespace, "good", "check", "--no-store"), 0)


def test_history_since_and_limit(sqlite_url, namespace):
    store = open_store(sqlite_url, namespace=namespace, instance_id="host-a:1:aa", options={})
    now = int(time.time() * 1000)
    hours_ago = {3: RunEvent.SENT, 2: RunEvent.LATE, 0.5: RunEvent.SENT, 0.1: RunEvent.PAUSED}
    try:
        store.prepare(["every-2s"])
        for h, event in hours_ago.items():
            store.history.record("every-2s", now - int(h * 3_600_000), event, task_id=f"task-{h}",
                         detail=f"reason {h}")
    finally:
        store.close()
    run = lambda *args: operate(sqlite_url, namespace, "good", "history", "every-2s", *args)  # noqa: E731
    table = exits(run(), 0).splitlines()
    assert table[0].split() == ["SLOT", "EVENT", "INSTANCE", "ATTEMPT", "TASK", "ID", "RECORDED",
                                "REASON"]
    assert [line.split()[1] for line in table[1:]] == ["paused", "sent", "late", "sent"]
    assert "host-a:1:aa" in table[1] and "reason 0.1" in table[1] and "task-0.1" in table[1]
    recent = json.loads(exits(run("--since", "1h", "--json"), 0))
    assert [r["task_id"] for r in recent] == ["task-0.1", "task-0.5"]
    assert set(recent[0]) == {"slot", "event", "at", "instance", "attempt", "task_id", "detail",
                              "earlier"}
    since = datetime.datetime.fromtimestamp((now - 2.5 * 3_600_000) / 1000, datetime.timezone.utc)
    newest = json.loads(exits(run("--since", since.isoformat(), "--limit", "2", "--json"), 0))
    assert [(r["event"], r["detail"]) for r in newest] == [("paused", "reason 0.1"),
                                                          ("sent", "reason 0.5")]
    assert len(json.loads(exits(run("--limit", "3", "--json"), 0))) == 3
    assert "no runs since" in exits(run("--since", "1m"), 0)
    assert exits(operate(sqlite_url, namespace, "good", "history", "every-2"), 3) == ""
    assert "neither an ISO 8601 time nor a duration" in operate(
        sqlite_url, namespace, "good", "history", "every-2s", "--since", "yesterday").stderr


def test_next_shows_the_utc_offset_change_across_dst(sqlite_url, namespace):
    out = exits(operate(sqlite_url, namespace, "good", "next", "berlin-0230", "-n", "3",
                        "--after", BERLIN_DST_2027), 0).splitlines()
    assert out[0] == ("next 3 slots of berlin-0230 (cron 30 2 * * * Europe/Berlin), in UTC and in "
                      "Europe/Berlin:")
    assert out[2].split() == ["2027-03-27T01:30:00+00:00", "2027-03-27", "02:30:00", "CET",
                              "UTC+01:00"]
    # 02:30 does not exist on the last Sunday of March: the run comes right after the jump
    assert out[3].split()[:5] == ["2027-03-28T01:00:00+00:00", "2027-03-28", "03:00:00", "CEST",
                                  "UTC+02:00"]
    assert out[3].endswith("UTC offset changes from +01:00 to +02:00 (DST)")
    assert out[4].split() == ["2027-03-29T00:30:00+00:00", "2027-03-29", "02:30:00", "CEST",
                              "UTC+02:00"]
    data = json.loads(exits(operate(sqlite_url, namespace, "good", "next", "every-2s", "-n", "2",
                                    "--after", "2027-03-28T00:00:01Z", "--json"), 0))
    assert data["timezone"] == "UTC" and [s["utc"] for s in data["slots"]] == [
        "2027-03-28T00:00:02+00:00", "2027-03-28T00:00:04+00:00"]
    assert "no entry 'berlin'" in operate(sqlite_url, namespace, "good", "next", "berlin").stderr


#: the keys of status --json (overview's docstring documents each)
TOP_KEYS = {"namespace", "generated", "store", "instance_records", "instances", "entries",
            "run_now", "partial", "disagreements", "unsaved", "lost", "refused"}
STORE_KEYS = {"url", "kind", "namespace", "durability", "memory_s", "memory_count",
              "checks_lateness", "leases", "entries", "reachable", "error", "warnings", "clock",
              "skew_ms"}
INSTANCE_KEYS = {"instance_id", "host", "pid", "version", "started", "last_tick",
                 "last_tick_age_s", "skew_ms", "entries", "fingerprints_digest", "seen", "expires",
                 "ticking", "stale", "kept"}
ENTRY_KEYS = {"name", "source", "task", "schedule", "timezone", "next", "problem", "leased",
              "shadowed", "paused", "last", "runs", "lease", "run_now", "state", "kept", "due",
              "unsent", "start_at", "end_at"}


def test_status_json_keys_instances_pauses_leases_and_requests(sqlite_url, namespace, monkeypatch):
    """A live instance and one whose ticks stopped, a paused entry, a leased run held by a
    worker, a store entry with a run-now request: status --json says each; the text says it too."""
    # a sync interval of 60 s: the live instance stays live (2 intervals) however long the
    # commands below take to start; the stopped one last ticked 10 minutes ago
    monkeypatch.setenv("ANARCHON_OP_SYNC", "60")
    store = open_store(sqlite_url, namespace=namespace, instance_id="beat-a:1:aa", options={})
    now = int(time.time() * 1000)
    slot = now - 1_000
    try:
        store.prepare(["leased-hourly"])
        [sqlite] = [b for b in BACKENDS if b.kind == "sqlite"]
        sqlite.backdate(store, ["leased-hourly"], 3_600_000)   # a brand-new store refuses older slots
        store.instances.save_fingerprints("d", {"every-2s": "f1"})
        store.instances.record_instance(InstanceRecord("beat-a:1:aa", "beat-a", 1, "0.1.0", now - 60_000,
                                             now, 3, 4, "d"), ttl_ms=600_000)
        store.instances.record_instance(InstanceRecord("beat-b:2:bb", "beat-b", 2, "0.1.0", now - 900_000,
                                             now - 600_000, 0, 4, "d"), ttl_ms=600_000)
        [won] = store.claim([ClaimRequest("leased-hourly", slot, 60_000, task_id="t-1",
                                          lease=LeaseTerms(queue_timeout_ms=300_000))])
        store.history.record("leased-hourly", slot, RunEvent.SENT, task_id="t-1")
        store.leases.adopt("leased-hourly", slot, "worker-1@host:77", 30_000)
        store.entries.put_entry("added", json.dumps({"task": "operate_app.report",
                                             "schedule": {"every": 90}}), by="ops", create=True)
        request_run(store, "added", "req-9", by="ops")
    finally:
        store.close()
    assert won.outcome.value == "won"
    exits(operate(sqlite_url, namespace, "good", "pause", "every-2s", "--reason", "release",
                  "--by", "ops"), 0)

    data = json.loads(exits(operate(sqlite_url, namespace, "good", "status", "--json"), 0))
    assert set(data) == TOP_KEYS and set(data["store"]) == STORE_KEYS
    assert data["store"]["reachable"] and data["store"]["kind"] == "sqlite"
    instances = {i["host"]: i for i in data["instances"]}
    assert all(set(i) == INSTANCE_KEYS for i in instances.values())
    assert instances["beat-a"]["ticking"] and not instances["beat-a"]["stale"]
    assert instances["beat-b"]["stale"] and instances["beat-b"]["last_tick_age_s"] >= 599
    entries = {e["name"]: e for e in data["entries"]}
    assert all(set(e) == ENTRY_KEYS for e in entries.values())
    assert set(entries) == {"every-2s", "berlin-0230", "leased-hourly", "added",
                            "celery.backend_cleanup"}     # Celery's own entry, run by beat too
    assert entries["every-2s"]["paused"]["by"] == "ops" and entries["every-2s"]["paused"]["reason"] == "release"
    assert entries["berlin-0230"]["schedule"] == "cron 30 2 * * * Europe/Berlin"
    assert entries["berlin-0230"]["timezone"] == "Europe/Berlin"
    assert entries["berlin-0230"]["next"][0].endswith(":30:00.000+00:00")
    lease = entries["leased-hourly"]["lease"]
    assert lease["holder"] == "worker-1@host:77" and lease["state"] == "started" and lease["token"]
    assert entries["leased-hourly"]["last"]["event"] == "started"   # adopted by the worker
    assert entries["added"]["source"] == "store" and entries["added"]["run_now"][0]["request_id"] == "req-9"
    assert data["run_now"][0]["by"] == "ops"

    text = exits(operate(sqlite_url, namespace, "good", "status"), 0)
    assert "live instances: 2" in text and "STALE: last tick" in text
    assert "every-2s: paused by ops: release" in text and "added: request req-9" in text
    assert "held by worker-1@host:77" in text

    down = operate("postgresql://postgres:secret@127.0.0.1:1/test", namespace, "good", "status",
                   "--json")
    assert down.returncode == 1 and "secret" not in down.stdout
    dead = json.loads(down.stdout)
    assert not dead["store"]["reachable"] and dead["store"]["error"]
    assert {e["name"] for e in dead["entries"]} == {"every-2s", "berlin-0230", "leased-hourly",
                                                    "celery.backend_cleanup"}


def test_status_of_a_running_beat_and_of_one_whose_ticks_stopped(tmp_path, sqlite_url, namespace,
                                                                monkeypatch):
    """A real beat: the overview shows it ticking with its runs sent; stopped (SIGSTOP), it is
    stale before its record expires."""
    env = {"ANARCHON_OP_STORE": sqlite_url, "ANARCHON_OP_NAMESPACE": namespace,
           "ANARCHON_OP_SCHEDULE": "good", "ANARCHON_OP_SYNC": "3"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(APPS))
    import operate_app
    app = operate_app.app
    # the module may be imported already, its app changed by another test: all it needs is set
    app.conf.update(anarchon_store_url=sqlite_url, anarchon_namespace=namespace,
                    anarchon_sync_interval=3.0, beat_schedule=operate_app.SCHEDULES["good"])
    cluster = Cluster(str(tmp_path), env, app="operate_app")
    store = open_store(sqlite_url, namespace=namespace, instance_id="test", options={})
    settings = Settings.from_app(app)
    try:
        store.prepare(["every-2s"])
        [sqlite] = [b for b in BACKENDS if b.kind == "sqlite"]
        sqlite.backdate(store, ["every-2s"], 3_600_000)   # a brand-new store refuses older slots
        cluster.beat("beat")

        def sent_and_ticking():
            data = overview(app, store, settings, runs=5)
            entry = {e["name"]: e for e in data["entries"]}["every-2s"]
            return (len(data["instances"]) == 1 and data["instances"][0]["ticking"]
                    and any(r["event"] == "sent" for r in entry["runs"])) and data
        started = time.monotonic()
        data = wait_for(sent_and_ticking, 30)
        print(f"ticking with a run sent {time.monotonic() - started:.1f} s after the start")
        assert data["instances"][0]["pid"] == cluster.procs["beat"].pid
        cluster.pause("beat")
        started = time.monotonic()
        # stale after 2 sync intervals, gone after 3: a window of one interval (3 s), wide
        # enough for an overview read on a loaded machine to fall in it
        data = wait_for(lambda: (d := overview(app, store, settings, runs=0))["instances"]
                        and d["instances"][0]["stale"] and d, 30)
        assert data["instances"][0]["last_tick_age_s"] > 2
        print(f"stale {time.monotonic() - started:.1f} s after SIGSTOP")
        cluster.resume("beat")
    finally:
        store.close()
        cluster.stop_all()


def wait_for(condition, timeout: float):
    """The first truthy value of ``condition()`` within ``timeout`` seconds, polled every 0.1 s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s: {condition}")


# -- celery_anarchon.testing in a user's own test suite ----------------------------------------

def _app(schedule: dict, **conf) -> Celery:
    app = Celery("users_app", set_as_current=False)   # not the current app of later tests
    app.conf.update(broker_url="memory://", timezone="Europe/Berlin", beat_schedule=schedule,
                    anarchon_store_url="redis://127.0.0.1:1/0", **conf)   # never connected
    return app


def test_testing_helpers_check_every_rule_without_a_store_server():
    good = _app({"report": {"task": "t", "schedule": crontab(minute=30, hour=2)}})
    testing.assert_schedule_ok(good)
    assert testing.check_schedule(good) == []
    slots = testing.next_slots(good, "report", 3,
                               after=datetime.datetime(2027, 3, 27, tzinfo=datetime.timezone.utc))
    assert [s.isoformat() for s in slots] == ["2027-03-27T01:30:00+00:00",
                                              "2027-03-28T01:00:00+00:00",
                                              "2027-03-29T00:30:00+00:00"]

    bad = _app({"fast": {"task": "t", "schedule": 1.0, "options": {"anarchon": {"jitter": 0.2,
                                                                              "max_late": 0.1}}},
                "leased": {"task": "t", "schedule": 60.0, "options": {"anarchon": {"lease": True}}},
                "typo": {"task": "t", "schedule": 60.0, "options": {"anarchon": {"jiter": 1}}}})
    problems = {p.entry: p for p in testing.check_schedule(bad)}
    assert problems["fast"].rule == "max_late > jitter"
    assert problems["leased"].rule == "a leased entry needs celery_anarchon.install(app)"
    assert problems["typo"].rule == "no unknown keys in options['anarchon']"
    assert "did you mean 'jitter'?" in problems["typo"].message
    with pytest.raises(AssertionError) as failed:
        testing.assert_schedule_ok(bad)
    assert str(failed.value).startswith("3 problems in the beat schedule:\n  - [")
    assert "[max_late > jitter] entry 'fast': max_late 0.1 s must be greater than jitter" in str(failed.value)

    short_memory = _app({"slow": {"task": "t", "schedule": 600.0}},
                        anarchon_store_options={"memory": 50})
    [problem] = [p for p in testing.check_schedule(short_memory) if p.entry != "celery.backend_cleanup"]
    assert problem.rule == "jitter + max_late < store memory" and problem.entry == "slow"
    celery_anarchon.install(bad)
    assert "leased" not in {p.entry for p in testing.check_schedule(bad)}
    with pytest.raises(celery_anarchon.ConfigError, match="no entry 'reprot'"):
        testing.next_slots(good, "reprot")


# -- the commands in this process (fast: no subprocess), for what a new user ran into ----------

DOWN_URL = "postgresql://postgres:secret@127.0.0.1:1/test"   # nothing listens on port 1


def _leased_app(url: str, namespace: str, **conf) -> Celery:
    app = Celery("operate_inline", set_as_current=False)
    app.conf.update(broker_url="memory://", anarchon_store_url=url, anarchon_namespace=namespace,
                    timezone="UTC", beat_schedule={
                        "every-2s": {"task": "t", "schedule": 2.0},
                        "leased": {"task": "t", "schedule": 60.0,
                                   "options": {"anarchon": {"lease": True}}}}, **conf)
    celery_anarchon.install(app)
    return app


def test_an_unreachable_store_leaves_states_pauses_leases_and_instances_unknown(namespace, capsys):
    from celery_anarchon.operate.cli import reports as cli_status
    from celery_anarchon.operate.web import render_page
    app = _leased_app(DOWN_URL, namespace)
    code, out, _ = run_in_process(cli_status.status, app, 5, True, capsys=capsys)
    data = json.loads(out)
    assert code == 1 and not data["store"]["reachable"]
    assert data["instances"] is None and data["run_now"] is None
    for entry in data["entries"]:
        assert entry["state"] == "unknown" and entry["paused"] is None and entry["lease"] is None
    code, text, _ = run_in_process(cli_status.status, app, 5, False, capsys=capsys)
    assert code == 1 and "running" not in text and "pauses: 0" not in text
    assert "live instances: unknown" in text and "pauses: unknown" in text
    assert "unknown (store unreachable)" in text
    page = render_page(data)
    assert "st-ok\">running" not in page and "leased, no live run" not in page
    assert 'class="state st-unknown">unknown' in page and ">unknown</span></h2>" in page


def test_status_warns_when_no_live_instance_sends_the_schedule(sqlite_url, namespace, capsys):
    from celery_anarchon.operate.cli import reports as cli_status
    app = _leased_app(sqlite_url, namespace)
    code, text, _ = run_in_process(cli_status.status, app, 0, False, capsys=capsys)
    assert code == 0 and "live instances: 0" in text
    assert "warning: no live beat instance: nothing is being sent" in text
    store = open_store(sqlite_url, namespace=namespace, instance_id="beat-a:1:aa", options={})
    now = int(time.time() * 1000)
    try:
        store.prepare([])
        store.instances.record_instance(InstanceRecord("beat-a:1:aa", "beat-a", 1, "0.1.0", now - 60_000,
                                             now - 30_000, 0, 2, "d"), ttl_ms=600_000)
    finally:
        store.close()
    code, text, _ = run_in_process(cli_status.status, app, 0, False, capsys=capsys)
    assert "live instances: 1" in text and "STALE" in text
    assert "warning: no live beat instance: nothing is being sent (every one listed is stale)" in text


def test_celerys_own_cleanup_entry_is_a_config_entry_for_every_command(sqlite_url, namespace, capsys):
    """celery.backend_cleanup (results expire, the backend does not expire them itself): next,
    history, check and the testing helpers know it as list, status and pause do."""
    from celery_anarchon.operate.cli import reports as cli_status
    from celery_anarchon.operate.cli import rules as cli_rules
    from celery_anarchon.operate import checks
    app = _leased_app(sqlite_url, namespace)
    assert "celery.backend_cleanup" in checks.config_entries(app)
    [slot] = testing.next_slots(app, "celery.backend_cleanup", 1,
                                after=datetime.datetime(2027, 1, 1, tzinfo=datetime.timezone.utc))
    assert slot.isoformat() == "2027-01-01T04:00:00+00:00"
    code, out, err = run_in_process(cli_rules.next_, app, "celery.backend_cleanup", 2, None, False,
                                    capsys=capsys)
    assert code == 0 and "crontab 0 4 * * *" in out, err
    code, out, err = run_in_process(cli_status.history, app, "celery.backend_cleanup", None, None,
                                    False, capsys=capsys)
    assert code == 0 and "no runs" in out, err
    code, out, _ = run_in_process(cli_rules.check, app, False, capsys=capsys)
    assert "ok    beat_schedule entry 'celery.backend_cleanup' (crontab 0 4 * * *" in out
    dead = overview(_leased_app(DOWN_URL, namespace), open_store(
        DOWN_URL, namespace=namespace, instance_id="x", options={}), runs=0)
    assert "celery.backend_cleanup" in {e["name"] for e in dead["entries"]}


def test_check_warns_of_live_beats_running_another_definition(sqlite_url, namespace, capsys):
    from celery_anarchon.operate.cli import rules as cli_rules
    app = _leased_app(sqlite_url, namespace)
    mine = testing.plan_of(app, "every-2s").fingerprint
    store = open_store(sqlite_url, namespace=namespace, instance_id="old:9:aa", options={})
    now = int(time.time() * 1000)
    try:
        store.prepare([])
        store.instances.save_fingerprints("old", {"every-2s": "0ld0ld0ld0ld", "leased": "x"})
        store.instances.save_fingerprints("same", {"every-2s": mine})
        store.instances.record_instance(InstanceRecord("old:9:aa", "old-host", 9, "0.1.0", now, now, 0, 2,
                                             "old"), ttl_ms=600_000)
        store.instances.record_instance(InstanceRecord("new:8:bb", "new-host", 8, "0.1.0", now, now, 0, 2,
                                             "same"), ttl_ms=600_000)
    finally:
        store.close()
    code, out, _ = run_in_process(cli_rules.check, app, True, capsys=capsys)
    assert code == 0, out
    assert (f"warn  entry 'every-2s': live beat instance old-host:9 runs another definition "
            f"(fingerprint differs from {mine} here); expected during a rolling deploy") in out
    assert "warn  entry 'leased': live beat instance old-host:9" in out and "new-host" not in out


def test_check_reports_a_start_up_warning_of_an_entry_as_a_warn_line(sqlite_url, namespace,
                                                                     capsys, caplog):
    """A leased entry whose gap is shorter than lease duration + 2 x heartbeat passes its rules,
    but beat warns at start-up that a dead runner's replacement would always be superseded:
    check says so in a warn line of its report, not as a stray log line beside it."""
    from celery_anarchon.operate.cli import rules as cli_rules
    app = _leased_app(sqlite_url, namespace)
    app.conf.beat_schedule["leased"]["schedule"] = 30.0
    code, out, err = run_in_process(cli_rules.check, app, True, capsys=capsys)
    assert code == 0, out
    assert ("warn  entry 'leased': the shortest gap between slots (30 s) is shorter than lease "
            "duration + 2 x heartbeat (40 s)") in out
    assert "shorter than lease duration" not in err + caplog.text, "reported once, in the report"


def test_check_strict_fails_on_a_warn_line(namespace, capsys, tmp_path):
    """A task name no module registers (a typo) is a warn line: beat may not import the worker's
    modules. --strict makes every warn line fail the check (exit 1), for a deploy pipeline that
    wants none; without a warning, --strict passes. (A Redis store, not checked here: the SQLite
    store's warning that it coordinates one host only would be one.)"""
    from celery_anarchon.operate.cli import rules as cli_rules
    from stores_support import store_url
    app = _leased_app(store_url("redis", str(tmp_path)), namespace)

    @app.task(name="t", shared=False)   # not in the apps later tests make
    def t():
        pass

    code, out, _ = run_in_process(cli_rules.check, app, False, capsys=capsys, strict=True)
    assert code == 0 and out.rstrip().endswith("passed"), out
    app.conf.beat_schedule["typo"] = {"task": "billing.chrage", "schedule": 60.0}
    code, out, _ = run_in_process(cli_rules.check, app, False, capsys=capsys)
    assert code == 0 and "warn  entry 'typo'" in out, out
    code, out, _ = run_in_process(cli_rules.check, app, False, capsys=capsys, strict=True)
    assert code == 1, out
    assert "warn  entry 'typo'" in out and out.rstrip().endswith("check: 1 warning (--strict), 6 passed"), out


def test_tasks_of_the_apps_include_modules_are_known_to_add_update_and_check(
        sqlite_url, namespace, tmp_path, monkeypatch, capsys):
    from celery_anarchon.operate.cli import entries as cli_commands
    from celery_anarchon.operate.cli import rules as cli_rules
    module = f"included_tasks_{namespace.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(   # registered on this app only (not shared_task)
        "from celery import current_app\n\n@current_app.task(name='inc.report', shared=False)\n"
        "def report():\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    app = _leased_app(sqlite_url, namespace, include=[module])
    monkeypatch.setattr(celery._state._tls, "current_app", None, raising=False)   # undone after
    app.set_current()
    app.conf.beat_schedule["every-2s"]["task"] = "inc.reprot"
    flags = {"task": "inc.reprt", "every": 60.0}
    code, _, err = run_in_process(cli_commands.write, app, "new", flags, capsys=capsys, create=True)
    assert code == 2 and "task 'inc.reprt' is not registered" in err
    assert "did you mean 'inc.report'?" in err
    code, out, _ = run_in_process(cli_rules.check, app, False, capsys=capsys)
    assert "warn  entry 'every-2s': task 'inc.reprot' is not registered" in out

    broken = _leased_app(sqlite_url, namespace, include=["no_such_module_of_tasks"])
    code, _, err = run_in_process(cli_commands.write, broken, "new", flags, capsys=capsys,
                                  create=True)
    assert code == 2 and "cannot import module 'no_such_module_of_tasks'" in err
    assert "Traceback" not in err
    code, out, _ = run_in_process(cli_rules.check, broken, False, capsys=capsys)
    assert code == 1 and "FAIL  configuration: the app's modules import" in out
    assert "cannot import module 'no_such_module_of_tasks'" in out


def test_next_after_takes_a_duration_from_now_names_its_option_and_notes_a_first_dst_row(
        sqlite_url, namespace, capsys):
    from celery_anarchon.operate.cli import rules as cli_rules
    app = _leased_app(sqlite_url, namespace)
    app.conf.beat_schedule["berlin"] = {"task": "t",
                                        "schedule": celery_anarchon.cron("30 2 * * *", tz="Europe/Berlin")}
    code, out, _ = run_in_process(cli_rules.next_, app, "every-2s", 1, "1h", True, capsys=capsys)
    [slot] = json.loads(out)["slots"]
    ahead = datetime.datetime.fromisoformat(slot["utc"]).timestamp() - time.time()
    assert code == 0 and 3590 < ahead < 3610
    code, _, err = run_in_process(cli_rules.next_, app, "every-2s", 1, "tomorrow", False,
                                  capsys=capsys)
    assert code == 2 and "'--after'" in err and "--since" not in err
    code, _, err = run_in_process(cli_rules.next_, app, "every-2s", 3, "9999-12-31T23:59:59Z",
                                  False, capsys=capsys)
    assert code == 2 and "past the year 9999" in err and "Traceback" not in err
    # after 01:30 CET on the last Sunday of March 2027: the first slot is already in CEST
    code, out, _ = run_in_process(cli_rules.next_, app, "berlin", 1, "2027-03-28T00:30:00Z",
                                  False, capsys=capsys)
    first = out.splitlines()[2]
    assert first.split()[:5] == ["2027-03-28T01:00:00+00:00", "2027-03-28", "03:00:00", "CEST",
                                 "UTC+02:00"]
    assert first.endswith("UTC offset changes from +01:00 to +02:00 (DST)")


def test_check_names_a_bad_setting_states_its_rule_and_still_checks_the_rest(
        sqlite_url, namespace, capsys):
    from celery_anarchon.operate.cli import rules as cli_rules
    app = _leased_app(sqlite_url, namespace, anarchon_sync_interval=-5)
    code, out, _ = run_in_process(cli_rules.check, app, True, capsys=capsys)
    assert code == 1
    assert ("FAIL  anarchon_sync_interval: a duration more than 0\n      anarchon_sync_interval: "
            "-5 s must be more than 0 (default 5)") in out
    assert ">= 0" not in out and "a valid entry" not in out
    assert "ok    beat_schedule entry 'every-2s' (every 2 s): every timing rule" in out
    assert "ok    store reachable" in out
    assert "warn  anarchon store: the SQLite store" in out and "this one host only" in out
    code, out, _ = run_in_process(cli_rules.check, _leased_app(sqlite_url, namespace,
                                                                anarchon_sync_interval=0),
                                  True, capsys=capsys)
    assert "anarchon_sync_interval: 0 s must be more than 0" in out


def test_status_and_list_name_the_zone_of_a_crontab_in_the_apps_zone(sqlite_url, namespace, capsys):
    from celery_anarchon.operate.cli import entries as cli_commands
    from celery_anarchon.operate.cli import reports as cli_status
    app = _leased_app(sqlite_url, namespace)
    app.conf.timezone = "Europe/Berlin"
    app.conf.beat_schedule["nightly"] = {"task": "t", "schedule": crontab(minute=0, hour=3)}
    _, text, _ = run_in_process(cli_status.status, app, 0, False, capsys=capsys)
    [row] = [line for line in text.splitlines() if line.startswith("nightly ")]
    assert "crontab 0 3 * * * Europe/Berlin" in row
    _, text, _ = run_in_process(cli_commands.list_entries, app, False, capsys=capsys)
    [row] = [line for line in text.splitlines() if line.startswith("nightly ")]
    assert "crontab 0 3 * * * Europe/Berlin" in row and "every 2 s" in text


def test_update_crontab_or_cron_keeps_the_entrys_time_zone(sqlite_url, namespace):
    """`update --crontab` / `--cron` change the fields and keep the entry's zone (only the flags
    given change): a 09:30 New York entry moved to 10:30 stays in New York, its next slot 10:30
    New York time, not 10:30 in the app's zone (UTC). `--timezone` alone moves the zone and keeps
    the fields; with the fields it wins; on an interval entry it is refused (exit 2)."""
    def run(*args, code=0):
        return exits(operate(sqlite_url, namespace, "good", *args), code)

    run("add", "ny", "--task", "operate_app.report", "--crontab", "30 9 * * *",
        "--timezone", "America/New_York")
    out = run("update", "ny", "--crontab", "30 10 * * *")
    assert "updated ny (store: crontab 30 10 * * * America/New_York -> operate_app.report" in out
    after = "2027-01-04T12:00:00Z"              # a Monday, 07:00 in New York (EST, UTC-05:00)
    slots = json.loads(run("next", "ny", "-n", "1", "--after", after, "--json"))
    assert slots["timezone"] == "America/New_York"
    assert slots["slots"][0]["utc"] == "2027-01-04T15:30:00+00:00", slots   # 10:30 EST

    run("add", "tokyo", "--task", "operate_app.report", "--cron", "0 3 L * *",
        "--timezone", "Asia/Tokyo")
    updated = json.loads(run("update", "tokyo", "--cron", "0 4 L * *", "--json"))
    assert updated["definition"]["schedule"] == {"cron": "0 4 L * *", "timezone": "Asia/Tokyo"}
    updated = json.loads(run("update", "tokyo", "--crontab", "0 5 * * *", "--json"))
    assert updated["definition"]["schedule"] == {"crontab": {"minute": "0", "hour": "5"},
                                                 "timezone": "Asia/Tokyo"}

    updated = json.loads(run("update", "ny", "--timezone", "Europe/Paris", "--json"))
    assert updated["definition"]["schedule"] == {
        "crontab": {"minute": "30", "hour": "10"}, "timezone": "Europe/Paris"}
    updated = json.loads(run("update", "ny", "--crontab", "0 6 * * *", "--timezone", "UTC",
                             "--json"))
    assert updated["definition"]["schedule"] == {"crontab": {"minute": "0", "hour": "6"},
                                                 "timezone": "UTC"}

    run("add", "every", "--task", "operate_app.report", "--every", "60")
    done = operate(sqlite_url, namespace, "good", "update", "every", "--timezone", "Asia/Tokyo")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert ("Error: entry 'every': --timezone changes the time zone of a crontab or cron "
            "schedule, and this entry's schedule is every 60 s; fix: give --crontab or --cron "
            "with --timezone") in done.stderr, done.stderr
    listed = {e["name"]: e for e in json.loads(run("list", "--json"))}
    assert listed["every"]["definition"]["schedule"] == {"every": 60}


def test_one_broken_entry_never_takes_down_status_list_history_or_check(sqlite_url, namespace,
                                                                         capsys):
    """A beat_schedule schedule given as text, and store entries an older version accepted and
    that break a rule now (a slot in the year 33658, options Celery cannot send, 100 KB of
    args, a name too long, a decomposed name): status (text and JSON), list, history and check
    each show every entry, each broken one as a problem row naming it, and the others as they
    are."""
    from celery_anarchon.operate.cli import entries as cli_commands
    from celery_anarchon.operate.cli import reports as cli_status
    from celery_anarchon.operate.cli import rules as cli_rules
    from helpers import BROKEN_STORE_ENTRIES, write_broken_entries
    app = _leased_app(sqlite_url, namespace)
    app.conf.beat_schedule["text"] = {"task": "t", "schedule": "every 5 minutes"}
    store = open_store(sqlite_url, namespace=namespace, instance_id="older", options={})
    write_broken_entries(store)
    store.close()
    broken = {"text", *BROKEN_STORE_ENTRIES}

    code, out, err = run_in_process(cli_status.status, app, 5, True, capsys=capsys)
    assert code == 0 and not err, err
    entries = {e["name"]: e for e in json.loads(out)["entries"]}
    assert broken | {"every-2s", "leased"} <= set(entries)
    for name in broken:
        assert entries[name]["state"] == "problem" and entries[name]["next"] == [], entries[name]
    assert "in the year 33658" in entries["far"]["problem"]
    assert "options['expires'] = 'soon'" in entries["expires-soon"]["problem"]
    assert "'every 5 minutes'" in entries["text"]["problem"]
    assert "more than 65,536" in entries["huge-args"]["problem"]
    assert "300 characters, more than 200" in entries["n" * 300]["problem"]
    assert "not in Unicode NFC" in entries["cafe\u0301"]["problem"]
    assert entries["every-2s"]["state"] == "running" and len(entries["every-2s"]["next"]) == 1

    code, text, err = run_in_process(cli_status.status, app, 5, False, capsys=capsys)
    assert code == 0 and not err and "Traceback" not in text
    assert f"entries that break a rule (beat refuses them): {len(broken)}" in text
    code, text, err = run_in_process(cli_commands.list_entries, app, False, capsys=capsys)
    assert code == 0 and not err and all(f"\n{name} " in text for name in ("far", "text"))
    code, text, err = run_in_process(cli_status.history, app, "far", None, None, False,
                                     capsys=capsys)
    assert code == 0 and "far: no runs" in text
    code, text, err = run_in_process(cli_rules.check, app, True, capsys=capsys)
    assert code == 1 and "Traceback" not in text + err
    assert "FAIL  far:" in text and "FAIL  text:" in text and "ok    beat_schedule entry 'every-2s'" in text
