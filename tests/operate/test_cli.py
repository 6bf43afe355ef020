"""The command line, as people and scripts run it: `celery -A cli_app anarchon ...` as a real
subprocess (tests/support/apps/cli_app.py) against real stores: its output, its JSON and its exit codes
(0 done, 1 store unreachable, 2 bad input, 3 unknown entry, 4 owned by beat_schedule or exists)."""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from celery_anarchon.stores import open_store
from celery_anarchon.stores.entry_store import ENTRY_STORE_NAMES, InstanceRecord

from conftest import POSTGRES_URL, require_server
from helpers import request_run

from paths import APPS


def cli(store_url: str, namespace: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``celery -A cli_app anarchon <args>``; the result has stdout, stderr, returncode."""
    path = os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "ANARCHON_CLI_STORE": store_url,
           "ANARCHON_CLI_NAMESPACE": namespace}
    return subprocess.run([sys.executable, "-m", "celery", "-A", "cli_app", "anarchon", *args],
                          env=env, capture_output=True, text=True, timeout=60, cwd=APPS)


def ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    return done.stdout


def fails(done: subprocess.CompletedProcess, code: int, *words: str) -> None:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    for word in words:
        assert word in done.stderr, (word, done.stderr)


def test_add_update_pause_run_now_list_remove_and_their_exit_codes(tmp_path, namespace):
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"

    def run(*args):
        return cli(url, namespace, *args)

    out = ok(run("add", "report", "--task", "cli_app.report", "--crontab", "*/5 * * * 1-5",
                 "--timezone", "Europe/Paris", "--kwargs", '{"full": true}', "--by", "ops"))
    assert "added report (store: crontab */5 * * * 1-5 Europe/Paris -> cli_app.report; running" in out
    fails(run("add", "report", "--task", "cli_app.report", "--every", "10"), 4, "exists already")
    fails(run("add", "config-entry", "--task", "cli_app.report", "--every", "10"), 4,
          "'config-entry' is defined in beat_schedule")
    fails(run("update", "config-entry", "--every", "10"), 4, "beat_schedule")
    fails(run("update", "nope", "--every", "10"), 3, "no entry 'nope'")
    fails(run("remove", "nope"), 3, "no entry 'nope'")
    # bad input: the start-up message of a timing rule, an unregistered task, usage errors
    fails(run("add", "fast", "--task", "cli_app.report", "--every", "1", "--anarchon",
              '{"jitter": 0.5}'), 2, "must be less than half the shortest gap")
    fails(run("add", "typo", "--task", "cli_app.reprot", "--every", "10"), 2,
          "did you mean 'cli_app.report'?", "--no-check-task")
    fails(run("add", "x", "--task", "cli_app.report", "--every", "10", "--cron", "* * * * *"), 2,
          "give one schedule")
    fails(run("add", "x", "--task", "cli_app.report", "--every", "10", "--kwargs", "[1]"), 2,
          "is not a JSON object")
    fails(run("add", "x", "--json-definition", '{"task": "cli_app.report", "schedul": {}}'), 2,
          "key 'schedul'", "did you mean 'schedule'?")
    fails(run("add", "x", "--task", "cli_app.report", "--crontab", "0 3 * *"), 2, "five fields")

    updated = json.loads(ok(run("update", "report", "--every", "30", "--json")))
    assert updated["definition"]["schedule"] == {"every": 30}
    assert updated["definition"]["kwargs"] == {"full": True} and updated["updated_by"].count("@") == 1
    ok(run("add", "nightly", "--json-definition", json.dumps({
        "task": "cli_app.report", "schedule": {"cron": "0 3 * * *", "timezone": "Asia/Tokyo"},
        "anarchon": {"max_late": 120}})))

    assert "paused config-entry (config: every 60 s" in ok(run("pause", "config-entry", "--reason",
                                                                "db migration", "--by", "ops"))
    fails(run("run-now", "config-entry"), 2, "paused by ops: db migration", "resume it first")
    first = json.loads(ok(run("run-now", "report", "--request-id", "t-1", "--json")))
    again = json.loads(ok(run("run-now", "report", "--request-id", "t-1", "--json")))
    assert first == {**again, "created": True} and first["request_id"] == "t-1"   # one run

    table = ok(run("list", "--wide")).splitlines()   # whole cells
    assert table[0].split() == ["NAME", "SOURCE", "SCHEDULE", "TASK", "NEXT", "STATE"]
    rows = {line.split()[0]: line for line in table[1:]}
    assert "paused by ops: db migration (since " in rows["config-entry"]
    assert "every 30 s" in rows["report"] and "running" in rows["report"]
    assert "cron 0 3 * * * Asia/Tokyo" in rows["nightly"]
    listed = {e["name"]: e for e in json.loads(ok(run("list", "--json")))}
    assert listed["config-entry"]["paused"] and listed["config-entry"]["source"] == "config"
    assert listed["nightly"]["definition"]["anarchon"] == {"max_late": 120}

    assert "resumed config-entry" in ok(run("resume", "config-entry"))
    assert ok(run("remove", "report")) == "removed report\n"
    assert [e["name"] for e in json.loads(ok(run("list", "--json")))] == [
        "celery.backend_cleanup", "config-entry", "nightly"]


def test_status_shows_live_instances_what_they_disagree_on_store_entries_and_pauses(tmp_path, namespace):
    """Two live instances: one still runs an entry the other dropped from its beat_schedule, and
    they run different definitions of another; status names both, with the hosts and the
    definitions, besides the store's entries, pauses and run-now requests."""
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    store = open_store(url, namespace=namespace, instance_id="test", options={})
    try:
        store.prepare(())
        store.history.save_definition("config-entry", "aaaa11112222", '{"schedule":"every 60 s (old)"}')
        store.history.save_definition("config-entry", "bbbb33334444", '{"schedule":"every 30 s (new)"}')
        store.instances.save_fingerprints("d-old", {"config-entry": "aaaa11112222", "dropped": "cccc55556666"})
        store.instances.save_fingerprints("d-new", {"config-entry": "bbbb33334444"})
        for iid, host, digest in (("i-old", "old-host", "d-old"), ("i-new", "new-host", "d-new")):
            store.instances.record_instance(InstanceRecord(iid, host, 4242, "0.1.0", 1_000, 2_000, 12, 2,
                                                 digest), ttl_ms=600_000)
        store.entries.put_entry("added", json.dumps({"task": "cli_app.report", "schedule": {"every": 90}}),
                        by="ops", create=True)
        request_run(store, "added", "req-9", by="ops")
    finally:
        store.close()
    ok(cli(url, namespace, "pause", "config-entry", "--reason", "release", "--by", "ops"))
    out = ok(cli(url, namespace, "status"))
    assert "live instances: 2" in out
    assert "old-host:4242  i-old" in out and "new-host:4242  i-new" in out and "skew +12 ms" in out
    assert "dropped: run by old-host:4242; not by new-host:4242" in out
    assert "instances that disagree" in out
    assert 'aaaa11112222 on old-host:4242: {"schedule":"every 60 s (old)"}' in out
    assert 'bbbb33334444 on new-host:4242: {"schedule":"every 30 s (new)"}' in out
    assert re.search(r"^added +store +every 90 s +cli_app\.report ", out, re.M), out
    assert "config-entry: paused by ops: release" in out
    assert "added: request req-9" in out


def test_status_reports_a_store_entry_that_other_instances_run_from_their_beat_schedule(
        tmp_path, namespace):
    """``nightly`` is a store entry and a beat_schedule entry of host-a only; host-b, whose
    beat_schedule lacks it, runs the store's. status lists it as a disagreement with both
    definitions, where each comes from and the hosts, and the fix; it never says host-b does not
    run it. The same on the status app's own beat_schedule entry with a store copy."""
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    store = open_store(url, namespace=namespace, instance_id="test", options={})
    try:
        store.prepare(())
        store.history.save_definition("nightly", "aaaa11112222", '{"schedule":"every 7200 s (config)"}')
        store.history.save_definition("config-entry", "cccc33334444", '{"schedule":"every 60 s"}')
        store.instances.save_fingerprints("d-a", {"nightly": "aaaa11112222", "config-entry": "cccc33334444"})
        store.instances.save_fingerprints("d-b", {})
        for iid, host, digest in (("i-a", "host-a", "d-a"), ("i-b", "host-b", "d-b")):
            store.instances.record_instance(InstanceRecord(iid, host, 4242, "0.1.0", 1_000, 2_000, 0, 2,
                                                 digest), ttl_ms=600_000)
        for name in ("nightly", "config-entry"):
            store.entries.put_entry(name, json.dumps({"task": "cli_app.report",
                                              "schedule": {"every": 3600}}), by="ops", create=True)
    finally:
        store.close()
    data = json.loads(ok(cli(url, namespace, "status", "--json")))
    assert data["partial"] == [], data["partial"]
    clashes = {d["entry"]: d for d in data["disagreements"]}
    assert sorted(clashes) == ["config-entry", "nightly"], data["disagreements"]
    nightly = clashes["nightly"]
    [config, stored] = nightly["definitions"]
    assert (config["source"], config["fingerprint"], config["instances"], config["definition"]) == (
        "config", "aaaa11112222", ["host-a:4242"], '{"schedule":"every 7200 s (config)"}')
    assert (stored["source"], stored["instances"]) == ("store", ["host-b:4242"])
    assert "period_ms=3600000" in stored["definition"] and len(stored["fingerprint"]) == 12
    assert nightly["fix"].startswith("Fix: keep one definition under this name: remove the "
                                     "store entry (celery anarchon remove nightly)")
    out = ok(cli(url, namespace, "status"))
    assert "  nightly:\n    aaaa11112222 (beat_schedule) on host-a:4242: " in out, out
    assert f"    {stored['fingerprint']} (store entry) on host-b:4242: " in out, out
    assert "    Fix: keep one definition under this name" in out
    assert "not by host-b" not in out


def test_a_store_that_cannot_hold_entries_or_cannot_be_reached(namespace):
    fails(cli("amqp://guest:guest@127.0.0.1:5672//", namespace, "list"), 2, ENTRY_STORE_NAMES)
    fails(cli("nats://127.0.0.1:4222", namespace, "pause", "config-entry"), 2, ENTRY_STORE_NAMES)
    # nothing listens on port 1: the store is unreachable
    fails(cli("postgresql://postgres@127.0.0.1:1/test", namespace, "list"), 1, "Error: ", "postgresql")


@pytest.mark.parametrize("args", [
    ("run-now", "config-entry", "--request-id", "t-9"), ("pause", "config-entry"),
    ("resume", "config-entry"), ("add", "z", "--task", "cli_app.report", "--every", "10"),
    ("remove", "z"), ("backfill", "config-entry", "--from", "1h", "--to", "10m", "--yes")])
def test_a_store_unreachable_before_any_write_says_nothing_was_changed_and_the_fix(
        namespace, args):
    """Nothing listens on port 1: the command fails at its first contact with the store (its
    preparation), before it writes anything, and says so, with the store (masked) and the
    fix; never that the outcome is unknown."""
    done = cli("redis://:secret@127.0.0.1:1/0", namespace, *args)
    fails(done, 1, "Error: Redis store redis://:***@127.0.0.1:1/0: prepare failed: ",
          "; nothing was changed: the store redis://:***@127.0.0.1:1/0 could not be reached; "
          "fix: check anarchon_store_url (or the broker URL the store follows), that the server "
          "runs and that this host reaches it, then retry")
    assert "outcome is unknown" not in done.stderr and "secret" not in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr


def test_the_commands_on_postgresql(namespace):
    require_server(POSTGRES_URL, "PostgreSQL")
    ok(cli(POSTGRES_URL, namespace, "add", "pg", "--task", "cli_app.report", "--every", "45"))
    assert [e["definition"]["schedule"] for e in json.loads(ok(cli(POSTGRES_URL, namespace, "list",
                                                                   "--json")))
            if e["name"] == "pg"] == [{"every": 45}]
    ok(cli(POSTGRES_URL, namespace, "remove", "pg"))


def test_loading_the_command_module_stays_light():
    """Every `celery` run imports cli.py: no store driver, no API, no engine until a command runs."""
    code = ("import sys, celery_anarchon.operate.cli; "
            "heavy = [m for m in sys.modules if m.startswith(('sqlalchemy', 'redis', 'nats', "
            "'celery_anarchon.operate.schedules', 'celery_anarchon.operate.cli.entries', 'celery_anarchon.beat.engine', "
            "'celery_anarchon.schedule.plan'))]; print(heavy)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_status_shows_the_live_instances_of_a_store_that_keeps_no_entries(namespace):
    """NATS keeps instance records but no entries: status lists its live instances."""
    from backends import url_of
    url = url_of("nats")
    require_server(url, "NATS")
    store = open_store(url, namespace=namespace, instance_id="test", options={})
    try:
        store.instances.save_fingerprints("d-1", {"config-entry": "aaaa11112222"})
        store.instances.record_instance(InstanceRecord("i-nats", "nats-host", 4242, "0.1.0", 1_000, 2_000,
                                             -7, 2, "d-1"), ttl_ms=600_000)
    finally:
        store.close()
    out = ok(cli(url, namespace, "status"))
    assert "live instances: 1" in out and "nats-host:4242  i-nats" in out and "skew -7 ms" in out
    data = json.loads(ok(cli(url, namespace, "status", "--json")))
    assert data["instance_records"] and [i["instance_id"] for i in data["instances"]] == ["i-nats"]


UUID7 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


def test_run_now_prints_its_request_id_the_retry_command_and_says_a_repeat_runs_nothing(
        tmp_path, namespace):
    """``run-now`` without ``--request-id`` makes an id, prints it and the command that repeats
    the same request (with ``-A`` as typed); that command, or any repeat of a ``--request-id``,
    says the request was made before, when and by whom, and that no new run comes of it."""
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    out = ok(cli(url, namespace, "run-now", "config-entry", "--by", "ops"))
    (made,) = set(UUID7.findall(out))
    assert f"run-now config-entry: new request {made}" in out, out
    retry = f"-m celery -A cli_app anarchon run-now config-entry --request-id {made}"
    assert retry in out, out
    again = ok(cli(url, namespace, "run-now", "config-entry", "--request-id", made, "--by", "dev",
                   "--utc"))
    assert re.search(rf"run-now config-entry: request {made} was already requested at "
                     r"\d{4}-\d\d-\d\dT[\d:.]+\+00:00 by ops: no new run", again), again
    first = ok(cli(url, namespace, "run-now", "config-entry", "--request-id", "ticket-4711"))
    assert "run-now config-entry: new request ticket-4711" in first, first
    repeat = ok(cli(url, namespace, "run-now", "config-entry", "--request-id", "ticket-4711"))
    assert re.search(r"request ticket-4711 was already requested \d+ s ago by ", repeat), repeat
    assert "no new run" in repeat, repeat
    as_json = json.loads(ok(cli(url, namespace, "run-now", "config-entry", "--request-id",
                                "ticket-4711", "--json")))
    assert as_json["request_id"] == "ticket-4711" and as_json["created"] is False
    # a store that cannot be reached at all: nothing was requested, the retry is printed (a
    # store lost after it answered: the outcome is unknown, the same retry printed)
    down = "redis://127.0.0.1:1/0"
    failed = cli(down, namespace, "run-now", "config-entry", "--request-id", "ticket-4712")
    fails(failed, 1, "nothing was changed",
          "-A cli_app anarchon run-now config-entry --request-id ticket-4712")
    assert ".;" not in failed.stderr and "outcome is unknown" not in failed.stderr, failed.stderr
    # without an id, the store that cannot be reached makes none: nothing was changed
    unmade = cli(down, namespace, "run-now", "config-entry")
    fails(unmade, 1, "nothing was changed", "then retry")
    assert "outcome is unknown" not in unmade.stderr, unmade.stderr


def test_run_now_refuses_a_bad_request_id_and_answers_a_repeat_of_a_paused_entry(
        tmp_path, namespace):
    """``--request-id`` has the rules of a name: too long, or holding a control or format
    character: exit 2, one ``Error:`` line naming the entry, the id (escaped, shortened) and
    the fix, nothing written. A repeat of an id after its entry was paused answers the first
    request ("already requested ... no new run"), not "resume it first"."""
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    for request_id, words in (("t" * 201, "'tttttttttttttttttttttttttttttttttttttttt'...: 201 "
                                          "characters, more than 200"),
                              ("t-1\x1b[31m", "control character '\\x1b' (U+001B)"),
                              ("pay\u202eroll", "format character U+202E"), ("", "not a non-empty")):
        done = cli(url, namespace, "run-now", "config-entry", "--request-id", request_id)
        fails(done, 2, "entry 'config-entry': run-now request id", words, "fix:")
        errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    store = open_store(url, namespace=namespace, instance_id="t")
    try:
        assert store.entries.entries_version() == 0, "a refused request id was written"
    finally:
        store.close()
    first = ok(cli(url, namespace, "run-now", "config-entry", "--request-id", "ticket-4711",
                   "--by", "alice"))
    assert "new request ticket-4711" in first, first
    ok(cli(url, namespace, "pause", "config-entry", "--reason", "migration"))
    again = ok(cli(url, namespace, "run-now", "config-entry", "--request-id", "ticket-4711",
                   "--utc"))
    assert re.search(r"run-now config-entry: request ticket-4711 was already requested at "
                     r"\S+ by alice: no new run", again), again
    fails(cli(url, namespace, "run-now", "config-entry", "--request-id", "ticket-4712"), 2,
          "resume it first")
