"""The catch-up policy of a store entry through the API and the command line: ``catch_up`` and
``catch_up_window`` given to ``schedules(app).add/update`` and ``celery anarchon add/update
--catch-up/--catch-up-window`` land in the definition's ``anarchon`` and keep its other
settings, ``next`` shows a policy other than the default, and a value that is no policy is
refused with the start-up message (real subprocesses of tests/support/apps/operate_app.py on a
SQLite store)."""
from __future__ import annotations

import json
import time

import pytest
from celery import Celery

import celery_anarchon
from celery_anarchon import ConfigError
from celery_anarchon.stores.base import RunEvent
from celery_anarchon.stores.entry_store import pause_span_of

from operate_support import exits, operate, reader_app


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'store.sqlite3'}"


def test_the_api_takes_catch_up_and_its_window_and_keeps_the_other_settings(sqlite_url,
                                                                             namespace):
    app = Celery("catch_up_api", set_as_current=False)
    app.conf.update(broker_url="memory://", anarchon_store_url=sqlite_url,
                    anarchon_namespace=namespace, timezone="UTC")
    with celery_anarchon.schedules(app, by="ops") as s:
        added = s.add("c", task="proj.t", schedule=10, anarchon={"jitter": 1}, catch_up="all",
                      catch_up_window=300, check_task=False)
        assert added.definition["anarchon"] == {"jitter": 1, "catch_up": "all",
                                                "catch_up_window": 300}
        with pytest.raises(ConfigError) as caught:
            s.update("c", catch_up=None, check_task=False)      # the window stays: refused
        assert str(caught.value) == (
            "entry 'c': catch_up_window 300 s applies to catch_up='all' only, and this entry's "
            "catch_up is 'newest'; fix: remove catch_up_window, or set "
            "options['anarchon']['catch_up'] = 'all'")
        back = s.update("c", catch_up=None, catch_up_window=None, check_task=False)
        assert back.definition["anarchon"] == {"jitter": 1}
        none = s.update("c", catch_up="none", check_task=False)
        assert none.definition["anarchon"] == {"jitter": 1, "catch_up": "none"}
        # given in anarchon= alone, the keys that have arguments of their own are kept
        ours = {"catch_up": "all", "start_at": "2030-01-01T00:00:00+00:00"}
        assert s.add("d", task="proj.t", schedule=10, anarchon=ours,
                     check_task=False).definition["anarchon"] == ours


def test_add_update_and_next_with_catch_up_on_the_command_line(sqlite_url, namespace):
    def run(*args):
        return operate(sqlite_url, namespace, "good", *args)

    out = exits(run("add", "caught", "--task", "operate_app.report", "--every", "10",
                    "--catch-up", "all", "--catch-up-window", "120", "--anarchon",
                    '{"max_late": 30}', "--json"), 0)
    assert json.loads(out)["definition"]["anarchon"] == {"max_late": 30, "catch_up": "all",
                                                         "catch_up_window": 120}
    text = exits(run("next", "caught", "-n", "2"), 0)
    assert text.splitlines()[-1] == ("catch_up: all (after an outage, every slot within 120 s "
                                     "is claimed, oldest first, one every 1 s)")
    data = json.loads(exits(run("next", "caught", "--json"), 0))
    assert (data["catch_up"], data["catch_up_window"]) == ("all", 120)
    out = exits(run("update", "caught", "--catch-up", "none", "--catch-up-window", "default",
                    "--json"), 0)
    assert json.loads(out)["definition"]["anarchon"] == {"max_late": 30, "catch_up": "none"}
    refused = run("update", "caught", "--catch-up", "al")
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert ("entry 'caught': options['anarchon']['catch_up'] = 'al': not a catch-up policy; fix: "
            "set options['anarchon']['catch_up'] to 'newest'") in refused.stderr


@pytest.mark.parametrize("catch_up", [{"catch_up": "all", "catch_up_window": 30}, {}])
def test_a_resume_records_the_newest_slot_its_pause_covered_so_no_catch_up_sends_it(
        sqlite_url, namespace, catch_up):
    """No beat runs while the entry is paused (an outage), so nothing answered its slots
    paused; the resume records the newest of them ``paused``, which bounds a catch-up
    (``catch_up='all'`` reaches back no further than the entry's newest decided run), naming
    the span the pause held, which a gap check counts paused, not missed (every policy)."""
    app = Celery("catch_up_resume", set_as_current=False)
    app.conf.update(broker_url="memory://", anarchon_store_url=sqlite_url,
                    anarchon_namespace=namespace, timezone="UTC", beat_schedule={
                        "c": {"task": "proj.t", "schedule": 1.0, "options": {"anarchon": {
                            "jitter": 0, "max_late": 2, **catch_up}}}})
    with celery_anarchon.schedules(app, by="ops") as s:
        paused_at = s.pause("c", "outage").pause.at_ms
        deadline = time.monotonic() + 30
        while s.store.now_ms() < paused_at + 2_500:   # two slots come while it is paused
            assert time.monotonic() < deadline
            time.sleep(0.1)
        s.resume("c")
        resumed_ms = s.store.now_ms()
        marks = [r for r in s.store.history.read("c") if r.event is RunEvent.PAUSED]
    assert len(marks) == 1
    [mark] = marks
    assert paused_at <= mark.slot_ms <= resumed_ms and resumed_ms - mark.slot_ms <= 1_000
    assert mark.detail.startswith("paused by ops: outage (paused from "), mark.detail
    since, until = pause_span_of(mark)
    assert since == paused_at and mark.slot_ms <= until <= resumed_ms


#: what a refusal of a number that is not finite says after its key and value
NOT_FINITE = (": not a finite number (JSON has no NaN or infinity); fix: give a finite number "
              "of seconds")


def test_a_window_or_period_that_is_not_finite_is_refused_by_key_and_value(sqlite_url,
                                                                          namespace):
    with celery_anarchon.schedules(reader_app(sqlite_url, namespace), by="ops") as s:
        for key, value, given in (
                ("anarchon.catch_up_window", "NaN",
                 dict(schedule=10, catch_up_window=float("nan"))),
                ("anarchon.catch_up_window", "Infinity",
                 dict(schedule=10, catch_up_window=float("inf"))),
                ("schedule.every", "NaN", dict(schedule={"every": float("nan")}))):
            with pytest.raises(ConfigError) as caught:
                s.add("w", task="proj.t", catch_up="all", check_task=False, **given)
            assert str(caught.value).startswith(f"entry 'w': key {key!r} = {value}{NOT_FINITE}")
        s.add("w", task="proj.t", schedule=10, catch_up="all", check_task=False)
        with pytest.raises(ConfigError) as caught:
            s.update("w", catch_up_window=float("-inf"), check_task=False)
        assert str(caught.value).startswith(
            f"entry 'w': key 'anarchon.catch_up_window' = -Infinity{NOT_FINITE}")
        assert "catch_up_window" not in s.get("w").definition["anarchon"]     # nothing written


def test_every_or_a_window_of_nan_or_inf_on_the_command_line(sqlite_url, namespace):
    def run(*args):
        return operate(sqlite_url, namespace, "good", *args)

    for args, key, value in (
            (("add", "n", "--every", "nan"), "schedule.every", "NaN"),
            (("add", "n", "--every", "10", "--catch-up", "all", "--catch-up-window", "nan"),
             "anarchon.catch_up_window", "NaN"),
            (("add", "n", "--every", "10", "--catch-up", "all", "--catch-up-window", "inf"),
             "anarchon.catch_up_window", "Infinity")):
        done = run(*args, "--task", "operate_app.report")
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert f"Error: entry 'n': key {key!r} = {value}{NOT_FINITE}" in done.stderr
    exits(run("add", "n", "--task", "operate_app.report", "--every", "10", "--catch-up", "all"), 0)
    done = run("update", "n", "--catch-up-window", "inf")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert (f"Error: entry 'n': key 'anarchon.catch_up_window' = Infinity{NOT_FINITE}"
            in done.stderr)
