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

import celery_anarchon
from celery_anarchon import ConfigError

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
