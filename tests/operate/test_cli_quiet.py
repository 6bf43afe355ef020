"""The operators' commands as probes and deploy scripts read them: ``check`` on a store beat has
not made yet (it creates nothing), the summaries' counts, and what a new store's first refusals
look like (tests/support/apps/operate_app.py, real subprocesses on real stores)."""
from __future__ import annotations

import json
import os
import re
import sqlite3

import redis
from celery import Celery

from celery_anarchon._util import iso
from celery_anarchon.operate.cli.narrow import fit_table, relative, to_ms
from celery_anarchon.operate.overview import overview
from celery_anarchon.operate.page import attention
from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import ClaimRequest, Outcome, RunEvent
from celery_anarchon.stores.entry_store import InstanceRecord

from backends import backdate_memory_start, url_of
from operate_support import exits, operate
from paths import APPS


def test_check_on_a_sqlite_store_not_made_yet_says_so_and_creates_nothing(tmp_path, namespace):
    path = tmp_path / "new" / "store.sqlite3"
    out = exits(operate(f"sqlite:///{path}", namespace, "good", "check"), 0)
    assert (f"ok    store reachable, not created yet: namespace {namespace!r} has no data in "
            f"sqlite:///{path}; beat's first start creates it (check creates nothing)") in out, out
    assert not path.exists() and not path.parent.exists(), os.listdir(tmp_path)


def test_check_on_a_redis_namespace_not_made_yet_writes_nothing(namespace):
    url = url_of("redis")
    out = exits(operate(url, namespace, "good", "check"), 0)
    assert f"ok    store reachable, not created yet: namespace {namespace!r}" in out, out
    client = redis.Redis.from_url(url)
    try:
        assert list(client.scan_iter(match=f"*{namespace}*")) == []
    finally:
        client.close()


# -- a new store's first refusals on the page -------------------------------------------------

def _attention_of(url: str, namespace: str, name: str) -> str | None:
    app = Celery("quiet_app", set_as_current=False)
    app.conf.update(broker_url="memory://", anarchon_store_url=url, anarchon_namespace=namespace,
                    beat_schedule={name: {"task": "t", "schedule": 2.0}})
    store = open_store(url, namespace=namespace, instance_id="cli")
    try:
        data = overview(app, store)
    finally:
        store.close()
    [entry] = [e for e in data["entries"] if e["name"] == name]
    return attention(entry)


def _claim(store, slot_ms: int):
    [result] = store.claim([ClaimRequest("a", slot_ms, 10_000)])
    return result


def test_a_new_stores_first_refusal_needs_no_attention_and_a_changed_epoch_does(
        tmp_path, namespace):
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    store = open_store(url, namespace=namespace, instance_id="A")
    try:
        store.prepare(["a"])
        now = store.now_ms()
        assert _claim(store, now // 2000 * 2000).outcome is Outcome.FORGOTTEN   # its first 10 s
    finally:
        store.close()
    assert _attention_of(url, namespace, "a") is None

    # the same file replaced by a copy of itself (another inode: another epoch): the store may
    # have lost claims, and says so
    path = str(tmp_path / "store.sqlite3")
    with sqlite3.connect(path) as source, sqlite3.connect(path + ".copy") as target:
        source.backup(target)
    os.replace(path + ".copy", path)
    store = open_store(url, namespace=namespace, instance_id="A")
    try:
        result = _claim(store, store.now_ms() // 2000 * 2000 + 2000)
        assert result.outcome is Outcome.FORGOTTEN and "epoch" in result.detail, result
    finally:
        store.close()
    assert _attention_of(url, namespace, "a") == "forgotten"


def test_a_forgotten_slot_after_runs_were_recorded_needs_attention(tmp_path, namespace):
    """The store's memory began after a run it recorded: it lost its claims (its history kept)."""
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    store = open_store(url, namespace=namespace, instance_id="A")
    try:
        store.prepare(["a"])
        backdate_memory_start(store, ["a"], 120_000)
        slot = store.now_ms() // 2000 * 2000
        assert _claim(store, slot).outcome is Outcome.WON
        backdate_memory_start(store, ["a"], -125_000)   # its memory began again after that run
        assert _claim(store, slot + 2000).outcome is Outcome.FORGOTTEN
    finally:
        store.close()
    assert _attention_of(url, namespace, "a") == "forgotten"


# -- probes, hints, the pause in next --------------------------------------------------------

def test_status_fail_if_no_instance_exits_7_until_a_live_beat_runs(tmp_path, namespace):
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    exits(operate(url, namespace, "good", "status"), 0)
    done = operate(url, namespace, "good", "status", "--fail-if-no-instance")
    assert done.returncode == 7, (done.returncode, done.stdout, done.stderr)
    assert ("status: no live beat instance: nothing is being sent; exit 7 (--fail-if-no-instance). "
            "Fix: start beat on at least one host (") in done.stderr, done.stderr
    assert done.stderr.rstrip().endswith("-A operate_app beat, or worker -B)"), done.stderr
    assert operate(url, namespace, "good", "status", "--json",
                   "--fail-if-no-instance").returncode == 7
    store = open_store(url, namespace=namespace, instance_id="beat-a:7:aa")
    try:
        now = store.now_ms()
        store.instances.record_instance(InstanceRecord("beat-a:7:aa", "beat-a", 7, "0.1.0",
                                                       now - 60_000, now, 0, 3, "d"),
                                        ttl_ms=600_000)
    finally:
        store.close()
    out = exits(operate(url, namespace, "good", "status", "--fail-if-no-instance"), 0)
    assert "live instances: 1" in out, out


def test_a_hint_in_an_error_repeats_the_app_the_operator_typed(tmp_path, namespace):
    done = operate(f"sqlite:///{tmp_path / 'store.sqlite3'}", namespace, "good", "next", "every-3s")
    assert done.returncode == 3, (done.returncode, done.stderr)
    assert "did you mean 'every-2s'" in done.stderr, done.stderr
    assert "fix: check the name (" in done.stderr and " -A operate_app anarchon list)" in done.stderr, \
        done.stderr
    assert "(celery anarchon list)" not in done.stderr


def test_next_names_the_pause_of_a_paused_entry(tmp_path, namespace):
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    out = exits(operate(url, namespace, "good", "next", "every-2s", "-n", "2"), 0)
    assert "paused" not in out and not (tmp_path / "store.sqlite3").exists(), out
    exits(operate(url, namespace, "good", "pause", "every-2s", "--reason", "migration",
                  "--by", "ops"), 0)
    out = exits(operate(url, namespace, "good", "next", "every-2s", "-n", "2"), 0)
    [line] = [line for line in out.splitlines() if "paused" in line]
    assert line.startswith("every-2s is paused by ops since "), line
    assert ": migration; these slots are recorded paused, not sent, until it is resumed (" in line
    assert line.endswith(" -A operate_app anarchon resume every-2s)"), line
    data = json.loads(exits(operate(url, namespace, "good", "next", "every-2s", "-n", "2",
                                    "--json"), 0))
    assert data["paused"]["by"] == "ops" and data["paused"]["reason"] == "migration", data
    exits(operate(url, namespace, "good", "resume", "every-2s"), 0)
    data = json.loads(exits(operate(url, namespace, "good", "next", "every-2s", "--json"), 0))
    assert data["paused"] is None, data


# -- warnings: counted, named, acknowledged ---------------------------------------------------

def test_check_strict_fails_on_a_warning_until_the_app_acknowledges_it(
        tmp_path, namespace, monkeypatch):
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    out = exits(operate(url, namespace, "good", "check"), 0)
    assert out.rstrip().endswith("check: 7 passed, 1 warning"), out
    out = exits(operate(url, namespace, "good", "check", "--strict"), 1)
    assert ("warn  anarchon store: the SQLite store " in out
            and "on one host, acknowledge it: anarchon_acknowledge = [\"sqlite-one-host\"] "
                "[sqlite-one-host]\n" in out), out
    assert ("(--strict fails on a warning; to accept one for good, name it in the app's "
            "settings: anarchon_acknowledge = [\"sqlite-one-host\"])\n"
            "check: 1 warning (--strict), 7 passed\n") in out, out

    monkeypatch.setenv("ANARCHON_OP_ACKNOWLEDGE", '["sqlite-one-host"]')
    out = exits(operate(url, namespace, "good", "check", "--strict"), 0)
    assert "ack   anarchon store: the SQLite store " in out and "[sqlite-one-host: acknowledged]" in out
    assert "warn  " not in out and out.rstrip().endswith("check: 7 passed, 1 acknowledged"), out

    monkeypatch.setenv("ANARCHON_OP_ACKNOWLEDGE", '["sqlite-onehost"]')
    out = exits(operate(url, namespace, "good", "check"), 1)
    assert ("anarchon_acknowledge: 'sqlite-onehost' is no check warning (did you mean "
            "'sqlite-one-host'?); the names: sqlite-one-host, store-setup, entry-timing, "
            "task-not-registered, definitions-differ") in out, out


# -- status within 120 columns, times relative ------------------------------------------------

def test_relative_times_and_a_table_fitted_to_the_width():
    now = 1_700_000_000_000
    at = lambda ms: iso(now + ms)   # noqa: E731
    assert [relative(at(ms), now) for ms in (-12_000, 3 * 60_000, -2 * 3_600_000,
                                             4 * 86_400_000, 0)] == [
        "12 s ago", "in 3 min", "2 h ago", "in 4 d", "0 s ago"]
    assert relative(None, now) == "-" and relative("soon", now) == "soon"
    rows = fit_table([("NAME", "STATE"), ("n" * 30, "s" * 200)], width=60)
    assert rows == [("NAME", "STATE"), ("n" * 28 + "…", "s" * 28 + "…")]   # the widest cut first
    assert fit_table([("NAME", "STATE"), ("n" * 20, "s" * 40)], width=70, keep=(1,)) == [
        ("NAME", "STATE"), ("n" * 20, "s" * 40)]                          # it fits
    assert fit_table([("NAME", "SOURCE", "STATE"), ("n" * 20, "o" * 30, "s" * 40)], width=80,
                     keep=(2,)) == [("NAME", "SOURCE", "STATE"),
                                    ("n" * 20, "o" * 15 + "…", "s" * 40)]       # STATE cut last
    # the first column, the row's name: cut below 24 only when nothing else can be
    assert fit_table([("NAME", "STATE"), ("n" * 30, "s" * 40)], width=60, keep=(1,)) == [
        ("NAME", "STATE"), ("n" * 23 + "…", "s" * 33 + "…")]
    assert fit_table([("NAME", "STATE"), ("n" * 30, "s" * 40)], width=30, keep=(1,)) == [
        ("NAME", "STATE"), ("n" * 19 + "…", "s" * 7 + "…")]


def test_status_fits_120_columns_utc_prints_iso_utc_and_wide_whole_lines(tmp_path, namespace):
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    store = open_store(url, namespace=namespace, instance_id="beat-a:7:aa")
    try:
        store.prepare(["every-2s"])
        now = store.now_ms()
        store.history.record("every-2s", now // 2000 * 2000 - 2000, RunEvent.LATE,
                             detail="x" * 150)
        store.instances.record_instance(InstanceRecord("beat-a:7:aa", "beat-a", 7, "0.1.0",
                                                       now - 60_000, now, 0, 3, "d"),
                                        ttl_ms=600_000)
    finally:
        store.close()
    out = exits(operate(url, namespace, "good", "status"), 0)
    # every line but the store's (its URL, whole) within 120 columns
    assert max(len(line) for line in out.splitlines() if not line.startswith("store:")) <= 120
    assert re.search(r"  beat-a:7  beat-a:7:aa  last tick \d s ago  version 0\.1\.0  started "
                     r"\d+ s ago  skew ", out), out
    [late] = [line for line in out.splitlines() if line.startswith("  ") and "  late  " in line]
    assert re.match(r"  \d s ago  late +beat-a:7:aa  attempt 1 +x+…$", late), late
    assert late.endswith("x…") and len(late) == 120, late
    wide = exits(operate(url, namespace, "good", "status", "--wide", "--utc"), 0)
    assert "x" * 150 in wide and max(len(line) for line in wide.splitlines()) > 120
    assert " ago" not in wide and "+00:00" in wide, wide
    # --utc alone: ISO UTC times, still within 120 columns; --wide alone: relative times
    iso_utc = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00"
    utc = exits(operate(url, namespace, "good", "status", "--utc"), 0)
    assert max(len(line) for line in utc.splitlines() if not line.startswith("store:")) <= 120
    assert re.search(rf"  beat-a:7  beat-a:7:aa  last tick {iso_utc}  version 0\.1\.0  started "
                     rf"{iso_utc}", utc), utc
    [late] = [line for line in utc.splitlines() if line.startswith("  ") and "  late  " in line]
    assert re.match(rf"  {iso_utc}  late +beat-a:7:aa  attempt 1 +x+…$", late), late
    assert " ago" not in utc and re.search(r"\bin \d", utc) is None, utc
    wide = exits(operate(url, namespace, "good", "status", "--wide"), 0)
    assert "x" * 150 in wide and re.search(r"last tick \d+ s ago", wide), wide


def test_check_on_a_postgresql_namespace_not_made_yet_writes_nothing(namespace):
    import sqlalchemy as sa
    url = url_of("postgresql")
    out = exits(operate(url, namespace, "good", "check"), 0)
    assert f"ok    store reachable, not created yet: namespace {namespace!r}" in out, out
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            if sa.inspect(conn).has_table("anarchon_stores"):
                written = conn.execute(sa.text("select count(*) from anarchon_stores where "
                                               "namespace = :ns"), {"ns": namespace}).scalar()
                assert written == 0
    finally:
        engine.dispose()


def test_history_shows_slots_in_the_entrys_zone_and_utc_with_utc(tmp_path, namespace):
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    slot_ms = to_ms("2027-03-27T01:30:00Z")         # 02:30 in Berlin, CET (UTC+01:00)
    store = open_store(url, namespace=namespace, instance_id="host-a:1:aa")
    try:
        store.prepare(["berlin-0230"])
        store.history.record("berlin-0230", slot_ms, RunEvent.SENT, task_id="task-1")
    finally:
        store.close()
    table = exits(operate(url, namespace, "good", "history", "berlin-0230"), 0).splitlines()
    assert table[0].split()[:2] == ["SLOT", "EVENT"], table
    assert re.match(r"2027-03-27T02:30:00\+01:00 +sent +host-a:1:aa +1 +task-1 +\d+ s ago +-$",
                    table[1]), table
    utc = exits(operate(url, namespace, "good", "history", "berlin-0230", "--utc"),
                0).splitlines()
    assert re.match(r"2027-03-27T01:30:00\.000\+00:00 +sent +host-a:1:aa +1 +task-1 +"
                    r"\d{4}-\d\d-\d\dT[\d:.]+\+00:00 +-$", utc[1]), utc


def test_check_on_a_relative_sqlite_path_not_made_yet_still_warns_of_it(tmp_path, namespace):
    done = operate("sqlite:///rel-store.sqlite3", namespace, "good", "check")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "warn  sqlite store sqlite:///" in done.stdout and "names a relative path" in done.stdout
    assert "[store-setup]" in done.stdout and "not created yet" in done.stdout, done.stdout
    assert not (APPS / "rel-store.sqlite3").exists(), "check created the file"
