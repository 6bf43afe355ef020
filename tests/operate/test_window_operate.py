"""start_at / end_at through the API and the command line: add with --start-at/--end-at, update
one bound keeping the other settings, the refusals with exit code 2, and what ``next`` and
``status`` say before the start, within the window and after the end (real subprocesses of
tests/support/apps/operate_app.py on a SQLite store)."""
from __future__ import annotations

import datetime
import json
import re

import pytest
from celery import Celery

import celery_anarchon
from celery_anarchon import ConfigError, testing

from operate_support import exits, operate

UTC = datetime.timezone.utc


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'store.sqlite3'}"


def _iso(dt: datetime.datetime) -> str:
    return dt.isoformat(timespec="seconds")


def test_add_update_next_and_status_of_an_entry_with_a_window(sqlite_url, namespace):
    def run(*args):
        return operate(sqlite_url, namespace, "good", *args)

    now = datetime.datetime.now(UTC).replace(microsecond=0)
    start = now + datetime.timedelta(days=2, seconds=-now.second % 10 + 5)   # between 2 slots
    end = start + datetime.timedelta(seconds=25)
    out = exits(run("add", "later", "--task", "operate_app.report", "--every", "10",
                    "--start-at", _iso(start.astimezone(datetime.timezone(
                        datetime.timedelta(hours=-5)))), "--end-at", _iso(end),
                    "--anarchon", '{"max_late": 30}', "--json"), 0)
    definition = json.loads(out)["definition"]
    assert definition["anarchon"] == {"max_late": 30, "start_at": _iso(start.astimezone(
        datetime.timezone(datetime.timedelta(hours=-5)))), "end_at": _iso(end)}

    # before the start: next lists the slots from start_at on, and says when it starts
    lines = exits(run("next", "later", "-n", "5", "--utc"), 0).splitlines()
    start_text = start.isoformat(timespec="milliseconds")
    assert lines[0] == f"later starts at {start_text} (its start_at)"
    # by default in the entry's zone (the app's: UTC), to the second
    assert exits(run("next", "later", "-n", "5"), 0).startswith(
        f"later starts at {_iso(start)} (its start_at)\n")
    slots = [line.split()[0] for line in lines[2:] if line.startswith("20")]
    first = start + datetime.timedelta(seconds=5)
    assert slots == [_iso(first + datetime.timedelta(seconds=10 * k)) for k in range(3)]
    assert lines[-1] == ("no slot after these: later ends at "
                         f"{end.isoformat(timespec='milliseconds')} (its end_at)")
    data = json.loads(exits(run("next", "later", "--json"), 0))
    assert data["start_at"] == start_text and len(data["slots"]) == 3
    status = json.loads(exits(run("status", "--json"), 0))
    row = {e["name"]: e for e in status["entries"]}["later"]
    assert (row["state"], row["start_at"], row["next"][0]) == (
        "waiting", start_text, first.isoformat(timespec="milliseconds"))
    assert f"starts at {start_text}" in exits(run("status", "--utc", "--wide"), 0)
    assert re.search(r"^later .* starts in 2 d(;|$)", exits(run("status"), 0), re.M)

    # after the end: no more slots, said with the instant it ended
    out = exits(run("next", "later", "--after", _iso(end + datetime.timedelta(seconds=1)),
                    "--utc"), 0)
    assert out == f"later has no more slots: it ended at {end.isoformat(timespec='milliseconds')} (its end_at)\n"

    # update one bound: the other and max_late are kept; the end in the past: ended
    past = now - datetime.timedelta(hours=1)
    updated = json.loads(exits(run("update", "later", "--start-at", "none", "--end-at",
                                   _iso(past), "--json"), 0))
    assert updated["definition"]["anarchon"] == {"max_late": 30, "end_at": _iso(past)}
    row = {e["name"]: e for e in json.loads(exits(run("status", "--json"), 0))["entries"]}["later"]
    ended = past.isoformat(timespec="milliseconds")
    assert (row["state"], row["next"], row["end_at"], row["start_at"]) == ("ended", [], ended, None)
    assert f"ended at {ended}" in exits(run("status", "--utc", "--wide"), 0)
    assert re.search(r"^later .* ended 6\d min ago$", exits(run("status"), 0), re.M)
    assert exits(run("next", "later", "--utc"), 0) == (f"later has no more slots: it ended at "
                                                       f"{ended} (its end_at)\n")

    # refusals: exit 2 with the message
    done = run("update", "later", "--end-at", "2026-01-01T00:00:00")
    assert done.returncode == 2 and "no UTC offset" in done.stderr and "fix: give the offset" in done.stderr
    done = run("add", "bad", "--task", "operate_app.report", "--every", "10",
               "--start-at", _iso(end), "--end-at", _iso(start))
    assert done.returncode == 2 and "is not after start_at" in done.stderr


def test_the_api_takes_start_at_and_end_at_and_keeps_the_other_settings(sqlite_url, namespace):
    app = Celery("window_api", set_as_current=False)
    app.conf.update(broker_url="memory://", anarchon_store_url=sqlite_url,
                    anarchon_namespace=namespace, timezone="UTC")
    start = datetime.datetime(2030, 1, 1, tzinfo=UTC)
    with celery_anarchon.schedules(app, by="ops") as s:
        added = s.add("w", task="proj.t", schedule=60, anarchon={"jitter": 1},
                      start_at=start, end_at="2030-02-01T00:00:00+01:00", check_task=False)
        assert added.definition["anarchon"] == {"jitter": 1, "start_at": "2030-01-01T00:00:00+00:00",
                                                "end_at": "2030-02-01T00:00:00+01:00"}
        moved = s.update("w", end_at=None, check_task=False)
        assert moved.definition["anarchon"] == {"jitter": 1, "start_at": "2030-01-01T00:00:00+00:00"}
        with pytest.raises(ConfigError) as caught:
            s.update("w", end_at=start, check_task=False)
        assert "is not after start_at" in str(caught.value)
        assert s.get("w").definition == moved.definition           # nothing written
        slots = testing.next_slots(app, "w", 2, store=s.store)
        assert slots == [start, start + datetime.timedelta(minutes=1)]


def test_add_keeps_a_window_given_in_anarchon(sqlite_url, namespace):
    """start_at / end_at given inside anarchon= (as a definition holds them) are kept by add,
    as the arguments start_at= / end_at= are."""
    app = Celery("window_in_anarchon", set_as_current=False)
    app.conf.update(broker_url="memory://", anarchon_store_url=sqlite_url,
                    anarchon_namespace=namespace, timezone="UTC")
    ours = {"anchor": 30, "start_at": "2030-01-01T00:00:00+00:00",
            "end_at": "2030-02-01T00:00:00+00:00"}
    with celery_anarchon.schedules(app, by="ops") as s:
        added = s.add("w", task="proj.t", schedule=60, anarchon=ours, check_task=False)
        assert added.definition["anarchon"] == ours
        assert s.get("w").definition["anarchon"] == ours


def test_an_update_that_cuts_slots_instances_may_still_claim_is_refused_unless_paused(
        sqlite_url, namespace):
    """An instance follows an update within 2 x the sync interval + 5 s: an end_at (or start_at)
    that leaves out a slot it may claim until then is refused; a paused entry (the pause holds at
    once on every instance) takes it."""
    app = Celery("window_cut", set_as_current=False)
    app.conf.update(broker_url="memory://", anarchon_store_url=sqlite_url,
                    anarchon_namespace=namespace, timezone="UTC", anarchon_sync_interval=1)
    soon = datetime.datetime.now(UTC) + datetime.timedelta(seconds=3)
    with celery_anarchon.schedules(app, by="ops") as s:
        s.add("fast", task="proj.t", schedule=1, check_task=False)
        with pytest.raises(ConfigError) as caught:
            s.update("fast", end_at=soon, check_task=False)
        message = str(caught.value)
        assert message.startswith("entry 'fast': the new start_at / end_at leaves out its slot ")
        assert message.endswith(
            "which instances that have not synced yet may still claim (each follows an update "
            "within 2 x anarchon_sync_interval + 5 s = 7 s, and claims a slot up to its jitter + "
            "max_late late); fix: give a bound that leaves out no slot before 7 s from now, or "
            "pause the entry first (a pause holds at once on every instance), update it, then "
            "resume it")
        with pytest.raises(ConfigError, match="leaves out its slot"):
            s.update("fast", start_at=soon + datetime.timedelta(minutes=1), check_task=False)
        assert "anarchon" not in s.get("fast").definition             # nothing written
        later = soon + datetime.timedelta(minutes=5)
        assert s.update("fast", end_at=later, check_task=False).definition["anarchon"] == {
            "end_at": later.isoformat()}
        s.pause("fast", reason="ending it now")
        assert s.update("fast", end_at=soon, check_task=False).definition["anarchon"] == {
            "end_at": soon.isoformat()}
