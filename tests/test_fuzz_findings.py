"""Inputs a property-based fuzz run of the public surfaces found reaching a raw traceback or a
wrong error (issue "No input reaches a traceback"), each pinned by a plain test: the input is now
refused with our clear error (a ConfigError naming the entry or field, the value and the fix; on
the command line exit 2 with one ``Error:`` line), or, for a store read, shown as an error row
while the other entries keep working. One test per finding; the docstring gives the minimal
example and the surface.
"""
from __future__ import annotations

import pytest
from celery import Celery
from celery.schedules import crontab

import celery_anarchon
from celery_anarchon import ConfigError, Scheduler

from backends import BY_KIND
from conftest import require_server
from stores_support import require_client

#: the stores a finding is checked on: the embedded default and the server stores that hold entries
STORES = ("sqlite", "postgresql", "redis")


def store_url(kind: str, tmp_path) -> str:
    require_client(kind)
    backend = BY_KIND[kind]
    if backend.url_variable is None:
        return f"sqlite:///{tmp_path / 'store.sqlite3'}"
    require_server(backend.url, backend.server)
    return backend.url


def make_app(url: str, namespace: str, **conf) -> Celery:
    app = Celery("proj", set_as_current=False)
    app.conf.update(broker_url="memory://", anarchon_store_url=url, anarchon_namespace=namespace,
                    timezone="UTC", beat_schedule={"config-entry": {"task": "proj.t",
                                                                    "schedule": 60.0}}, **conf)
    return app


@pytest.fixture(params=STORES)
def api(request, tmp_path, namespace):
    """The schedules API of a new namespace on each store, holding the store entry 'stored'."""
    app = make_app(store_url(request.param, tmp_path), namespace)
    with celery_anarchon.schedules(app, by="ops@test") as s:
        s.add("stored", task="proj.t", schedule=60)
        yield s


def refused(call, *fragments: str) -> str:
    """The message of the ConfigError ``call`` raises; each fragment must be in it."""
    with pytest.raises(ConfigError) as caught:
        call()
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


def unchanged(api, before) -> None:
    """Nothing was written by a refused call: the namespace reads as before."""
    assert api.list() == before


def test_lone_surrogates_in_names_tasks_reasons_and_by_are_config_errors(api):
    """Finding 1 (schedules API, every store): a lone surrogate ('\\ud800') in an entry name, a
    task name, a pause reason or ``by=`` of add / update / pause / run_now raised the store
    driver's UnicodeEncodeError (SQLite, PostgreSQL, Redis) or plan's hashing of the definition;
    now a ConfigError naming the field, before anything is written."""
    before = api.list()
    lone = "x\ud800"
    refused(lambda: api.add(lone, task="proj.t", schedule=60), "entry name", "U+D800", "fix:")
    refused(lambda: api.add("new", task=lone, schedule=60), "entry 'new'", "task", "U+D800",
            "fix:")
    refused(lambda: api.update("stored", task=lone), "entry 'stored'", "task", "U+D800")
    refused(lambda: api.pause("stored", lone), "entry 'stored'", "reason", "U+D800")
    refused(lambda: api.pause("stored", by=lone), "by", "U+D800")
    refused(lambda: api.run_now("stored", by=lone), "by", "U+D800")
    refused(lambda: api.add("new", task="proj.t", schedule=60, by=lone), "by", "U+D800")
    refused(lambda: api.run_now("stored", request_id=lone), "request id", "U+D800")
    unchanged(api, before)


@pytest.mark.parametrize("by", [123, b"x", ["ops"]])
def test_by_that_is_not_text_is_a_config_error(api, by):
    """Finding 2 (schedules API, every store): ``pause("e", by=123)`` / ``by=b"x"`` was stored as
    ``str(by)`` (earlier: reported as a store outage); now a ConfigError naming ``by``."""
    before = api.list()
    refused(lambda: api.pause("stored", by=by), "entry 'stored': by", repr(by), "fix:")
    refused(lambda: api.run_now("stored", by=by), "by", repr(by))
    refused(lambda: api.add("new", task="proj.t", schedule=60, by=by), "by", repr(by))
    refused(lambda: api.remove("stored", by=by), "by", repr(by))
    unchanged(api, before)


def test_nul_in_task_reason_and_by_is_a_config_error(api):
    """Finding 3 (schedules API; PostgreSQL text refuses NUL): ``pause("e", "r\\x00")`` raised
    StoreUnavailable (psycopg: "PostgreSQL text fields cannot contain NUL") and ``add(...,
    task="t\\x00")`` was stored; names already refused it (a control character). NUL in args,
    kwargs and options stays accepted: the definition is stored as ASCII JSON (``\\u0000``) in a
    text column on every store, and reads back as given."""
    before = api.list()
    refused(lambda: api.add("new", task="proj.t\x00", schedule=60), "entry 'new'", "task",
            "NUL", "fix:")
    refused(lambda: api.pause("stored", "r\x00"), "entry 'stored'", "reason", "NUL")
    refused(lambda: api.pause("stored", by="ops\x00"), "by", "NUL")
    unchanged(api, before)
    added = api.add("nul-args", task="proj.t", schedule=60, args=["a\x00"],
                    kwargs={"k\x00": "v\x00"}, options={"queue": "q\x00"})
    assert api.get("nul-args").definition == added.definition
    assert added.definition["args"] == ["a\x00"]
    assert added.definition["kwargs"] == {"k\x00": "v\x00"}


@pytest.mark.parametrize("name", [None, 123, [1], b"stored", ""])
def test_a_name_that_is_not_text_is_a_config_error_on_every_operation(api, name):
    """Finding 4 (schedules API): ``pause(None)`` / ``run_now(None)`` / ``remove(123)`` raised a
    TypeError (fixed since); ``resume(None)`` and ``get([1])`` still did, and ``get(None)``
    answered the first entry. Now every operation refuses it naming the name."""
    before = api.list()
    for call in (lambda: api.get(name), lambda: api.resume(name), lambda: api.pause(name),
                 lambda: api.run_now(name), lambda: api.remove(name),
                 lambda: api.update(name, task="proj.t"),
                 lambda: api.add(name, task="proj.t", schedule=60)):
        refused(call, f"entry name {name!r}", "fix:")
    unchanged(api, before)


HUGE = 10 ** 400        # an int past a float's range (math.isfinite raised OverflowError)


@pytest.mark.parametrize("label, given, fragments", [
    ("interval", dict(schedule=HUGE), ["entry 'huge'", "every"]),
    ("interval-data", dict(schedule={"every": HUGE}), ["entry 'huge'", "every"]),
    ("max_late", dict(anarchon={"max_late": HUGE}), ["entry 'huge'", "max_late"]),
    ("jitter", dict(anarchon={"jitter": HUGE}), ["entry 'huge'", "jitter"]),
    ("anchor", dict(anarchon={"anchor": HUGE}), ["entry 'huge'", "anchor"]),
    ("lease", dict(anarchon={"lease": {"duration": HUGE}}), ["entry 'huge'", "lease"]),
    ("expires", dict(options={"expires": HUGE}), ["entry 'huge'", "expires"]),
    ("countdown", dict(options={"countdown": HUGE}), ["entry 'huge'", "countdown"]),
    ("time_limit", dict(options={"time_limit": HUGE}), ["entry 'huge'", "time_limit"]),
])
def test_integers_past_float_range_are_config_errors(api, label, given, fragments):
    """Finding 5 (schedules API): ``add("e", task=..., schedule=10**400)``, and 10**400 as
    ``max_late``, ``jitter``, ``anchor``, ``expires``, ``countdown``: OverflowError ("int too
    large to convert to float") from ``math.isfinite``; now a ConfigError naming the field."""
    before = api.list()
    definition = dict(task="proj.t", schedule=60)
    definition.update(given)
    refused(lambda: api.add("huge", **definition), *fragments, "fix:")
    unchanged(api, before)


def test_huge_integers_in_args_and_kwargs_are_stored_as_given(api):
    """Finding 5, args side (schedules API, every store): an int past a float's range in args or
    kwargs is JSON and is stored and read back exactly (no OverflowError on any store)."""
    added = api.add("huge-args", task="proj.t", schedule=60, args=[HUGE], kwargs={"n": -HUGE})
    assert api.get("huge-args").definition["args"] == [HUGE]
    assert api.get("huge-args").definition["kwargs"] == {"n": -HUGE} == added.definition["kwargs"]


def beat_start(tmp_path, namespace, beat_schedule):
    """What ``celery beat`` does at start-up: build the Scheduler of an app so configured."""
    app = make_app(f"sqlite:///{tmp_path / 'beat.sqlite3'}", namespace)
    app.conf.beat_schedule = beat_schedule
    return Scheduler(app)


def test_an_interval_past_float_range_in_beat_schedule_stops_beat_by_name(tmp_path, namespace):
    """Finding 5 (beat start-up): ``beat_schedule = {"e": {"task": "proj.t", "schedule":
    10**400}}`` raised OverflowError while the message about it was formatted (``{:g}``)."""
    with pytest.raises(ConfigError) as caught:
        beat_start(tmp_path, namespace, {"e": {"task": "proj.t", "schedule": HUGE}})
    assert "entry 'e': every 1000000000" in str(caught.value)
    assert "after the year 9999" in str(caught.value) and "fix:" in str(caught.value)


@pytest.mark.parametrize("field, value", [  # (day_of_month=False: Celery's crontab refuses it)
    ("minute", False), ("minute", True), ("hour", False), ("hour", True), ("day_of_week", False),
    ("day_of_week", True), ("day_of_month", True), ("month_of_year", True)])
def test_a_crontab_field_that_is_a_bool_is_refused_by_name(tmp_path, namespace, field, value):
    """Finding 6 (schedules API and beat start-up): ``crontab(minute=False)`` raised TypeError
    ("'bool' object is not iterable") in ``add``, and in ``beat_schedule`` Celery took False for
    0 and True for 1 (a run at minute 0 nobody asked for); now both name the entry and field."""
    app = make_app(f"sqlite:///{tmp_path / 'store.sqlite3'}", namespace)
    with celery_anarchon.schedules(app) as s:
        refused(lambda: s.add("cron", task="proj.t", schedule=crontab(**{field: value})),
                "entry 'cron'", field, "fix:")
        assert [e.name for e in s.list() if e.source == "store"] == []
    with pytest.raises(ConfigError) as caught:
        beat_start(tmp_path, namespace, {
            "good": {"task": "proj.t", "schedule": 60},
            "cron": {"task": "proj.t", "schedule": crontab(**{field: value})}})
    message = str(caught.value)
    assert "entry 'cron'" in message and field in message and repr(value) in message, message
    assert "fix:" in message and "'good'" not in message
