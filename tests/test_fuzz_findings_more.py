"""Findings of the property-based fuzzing (tests/fuzz/) beyond those of test_fuzz_findings.py,
each reduced to its minimal example: the input gets one of our errors naming it, never a
traceback."""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from celery import Celery

from celery_anarchon import ConfigError, Scheduler, testing


@pytest.fixture
def sqlite_url():
    folder = tempfile.mkdtemp(prefix="anarchon-fuzz-findings-")
    yield "sqlite:///" + os.path.join(folder, "store.sqlite3")
    shutil.rmtree(folder, True)


def _app(url: str, **conf) -> Celery:
    app = Celery("findings_more", set_as_current=False)
    app.conf.update({"broker_url": "memory://", "anarchon_store_url": url, "beat_schedule": {},
                     **conf})
    return app


@pytest.mark.parametrize("zone", [-1944, 3.5, b"UTC", ["UTC"]])
def test_an_app_timezone_that_is_no_zone_name_is_a_config_error_naming_the_setting(sqlite_url, zone):
    """``timezone = -1944`` (no text): beat's start-up raised TypeError from Celery's clock and
    check blamed celery.backend_cleanup's crontab; now both name app.conf.timezone."""
    app = _app(sqlite_url, timezone=zone)
    with pytest.raises(ConfigError, match=r"app\.conf\.timezone"):
        Scheduler(app).close()
    problems = testing.check_schedule(app)
    assert any("app.conf.timezone" in str(p) for p in problems), problems


def _cli(app, *args):
    from celery.bin.base import CLIContext
    from click.testing import CliRunner
    from celery_anarchon.operate.cli import anarchon
    return CliRunner().invoke(anarchon, list(args), obj=CLIContext(app=app, no_color=True,
                                                                     workdir=None))


@pytest.mark.parametrize("item", [{"e\ud800": {"task": "t", "schedule": 60}},
                                  {"e": {"task": "t\udcff", "schedule": 60}}],
                         ids=["name", "task"])
def test_a_lone_surrogate_in_beat_schedule_is_shown_escaped_by_every_command(sqlite_url, item):
    """beat refuses a lone surrogate in a beat_schedule name or task by name, but check, list and
    status raised UnicodeEncodeError writing that name to stdout: the commands now show text they
    cannot encode escaped (e\\ud800), and check reports the rule."""
    app = _app(sqlite_url, beat_schedule=item)
    for args, code in ((["check", "--no-store"], 1), (["list"], 0), (["status"], 0),
                       (["status", "--json"], 0)):
        result = _cli(app, *args)
        assert result.exception is None or isinstance(result.exception, SystemExit), \
            (args, repr(result.exception))
        assert result.exit_code == code, (args, result.stdout, result.stderr)
        assert "\\ud800" in result.stdout or "\\udcff" in result.stdout, (args, result.stdout)


@pytest.mark.parametrize("item", [{"e\ud800": {"task": "t", "schedule": 60}},
                                  {"e": {"task": "t\udcff", "schedule": 60}}],
                         ids=["name", "task"])
def test_a_lone_surrogate_in_beat_schedule_is_shown_escaped_by_history_and_the_page(
        sqlite_url, item):
    """history asked the store for the runs of a name no store can encode (UnicodeEncodeError
    from the driver) and the page's / and /api/status answered with UnicodeEncodeError (a 500
    behind a server): history now finds no runs and the page shows the text escaped."""
    import json
    from fuzz.support import asgi
    from celery_anarchon.operate.web import StatusSource, create_app
    app = _app(sqlite_url, beat_schedule=item)
    result = _cli(app, "history", next(iter(item)))
    assert result.exit_code == 0 and "no runs" in result.stdout, (result.stdout, result.exception)
    source = StatusSource(app, runs=2)
    try:
        site = create_app(source, token=None)
        status, _, body = asgi(site, "GET", "/api/status")
        assert status == 200 and json.loads(body)["entries"], body[:500]
        assert "\\ud800" in body or "\\udcff" in body
        status, _, page = asgi(site, "GET", "/")
        assert status == 200 and ("\\ud800" in page or "\\udcff" in page), page[:500]
    finally:
        source.close()


def test_a_stored_interval_past_float_range_is_listed_not_an_overflow(sqlite_url):
    """A definition written into the store with {"every": 10**400} (another version, a hand
    edit): `celery anarchon list` raised OverflowError formatting it with {:g}; now it lists
    the entry, its interval cut short, and status shows it as a problem row."""
    import json
    from celery_anarchon.stores import open_store
    app = _app(sqlite_url, anarchon_namespace="ns")
    store = open_store(sqlite_url, namespace="ns", instance_id="hand", options={})
    store.prepare(())
    for name, every in (("huge", 10**400), ("negative", -10**400)):
        store.entries.put_entry(name, json.dumps({"task": "t", "schedule": {"every": every}}),
                        by="a hand edit", create=True)
    store.close()
    result = _cli(app, "list")
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        repr(result.exception)
    assert result.exit_code == 0 and "every 1000000000" in result.stdout, result.stdout
    assert "every -1000000000" in result.stdout, result.stdout
    result = _cli(app, "status", "--json")
    assert result.exit_code == 0, (result.stdout, result.exception)
    entries = {e["name"]: e for e in json.loads(result.stdout)["entries"]}
    assert entries["huge"]["problem"] and entries["negative"]["problem"], entries


@pytest.mark.parametrize("name", ["e\ud800", "e\udcff"])
def test_remove_of_a_name_with_a_lone_surrogate_is_an_unknown_entry(sqlite_url, name):
    """remove('e\\ud800') went to the store with the name and SQLite's driver raised
    UnicodeEncodeError (get, update and resume answered UnknownEntry): now remove answers
    UnknownEntry too, and `celery anarchon remove` exits 3 with one Error: line."""
    import celery_anarchon
    from celery_anarchon.errors import UnknownEntry
    app = _app(sqlite_url)
    with celery_anarchon.schedules(app) as s:
        with pytest.raises(UnknownEntry, match="no entry"):
            s.remove(name)
    result = _cli(app, "remove", name)
    assert result.exit_code == 3 and result.stderr.startswith("Error: no entry"), \
        (result.stderr, result.exception)


def test_a_redis_entry_record_nested_past_the_recursion_limit_is_an_error_row(namespace):
    """A Redis entry record of 5000 nested lists (a hand edit, another program): load_entries'
    json.loads raised RecursionError and every read of the namespace failed (list, status, the
    page, beat's sync); now the record is the entry's definition, refused by name (a problem
    row), and the entries beside it are listed."""
    import json
    import celery_anarchon
    from conftest import REDIS_URL, require_server
    from fuzz.support import write_raw_redis
    require_server(REDIS_URL, "Redis")
    app = _app(REDIS_URL, anarchon_namespace=namespace)
    with celery_anarchon.schedules(app) as s:
        s.add("deep", task="t", schedule=60, check_task=False)
        s.add("fine", task="t", schedule=60, check_task=False)
    write_raw_redis(REDIS_URL, namespace, "deep", b"[" * 5000 + b"]" * 5000)
    with celery_anarchon.schedules(app) as s:
        assert {"deep", "fine"} <= {e.name for e in s.list()}
    result = _cli(app, "status", "--json")
    assert result.exit_code == 0, (result.stdout, result.exception)
    entries = {e["name"]: e for e in json.loads(result.stdout)["entries"]}
    assert "nested more than" in entries["deep"]["problem"], entries["deep"]
    assert not entries["fine"]["problem"]


def test_an_entry_stored_under_a_name_not_in_nfc_is_found_by_get_next_and_history(sqlite_url):
    """A store entry an older version wrote under a decomposed name ('cafe\\u0301'): list()
    shows it, but get(), `next` and `history` of that very name normalized it to 'café' and
    answered UnknownEntry / exit 3 (remove finds such a name by its exact form); now they find
    it too (next names its rule)."""
    import celery_anarchon
    from celery_anarchon.stores import open_store
    app = _app(sqlite_url, anarchon_namespace="ns")
    store = open_store(sqlite_url, namespace="ns", instance_id="older", options={})
    store.prepare(())
    store.entries.put_entry("cafe\u0301", '{"schedule":{"every":60},"task":"t"}', by="an older version",
                    create=True)
    store.close()
    with celery_anarchon.schedules(app) as s:
        assert "cafe\u0301" in [e.name for e in s.list()]
        assert s.get("cafe\u0301").name == "cafe\u0301"
    # next and history found no entry either (exit 3); now: its rule (2), and no runs (0)
    result = _cli(app, "next", "cafe\u0301")
    assert result.exit_code == 2 and "not in Unicode NFC" in result.stderr, result.stderr
    result = _cli(app, "history", "cafe\u0301")
    assert result.exit_code == 0 and "no runs" in result.stdout, (result.stdout, result.stderr)


def _every_view_answers(app) -> None:
    """check finds the problem (exit 1); list, list --json, status and status --json answer
    (exit 0); none ends in a traceback."""
    for args, code in ((["check", "--no-store"], 1), (["list"], 0), (["list", "--json"], 0),
                       (["status"], 0), (["status", "--json"], 0)):
        result = _cli(app, *args)
        assert result.exception is None or isinstance(result.exception, SystemExit), \
            (args, result.exception)
        assert result.exit_code == code, (args, result.exit_code, result.output)


@pytest.mark.parametrize("relative", [False, True], ids=["plain", "relative"])
@pytest.mark.parametrize("value", ["Infinity", "NaN", "1e400"])
def test_a_celery_schedule_whose_own_repr_raises_is_named_by_every_command(sqlite_url, value,
                                                                           relative):
    """``schedule(Decimal('Infinity'))`` in beat_schedule (make fuzz, seed 1796430675): Celery
    keeps a Decimal as the period, and the schedule's own repr then raises AttributeError
    (``total_seconds``); list and status ended in that traceback where they show the definition.
    Every command now names the entry and shows what the object is."""
    from decimal import Decimal

    from celery.schedules import schedule
    given = schedule(Decimal(value), relative=relative)
    app = _app(sqlite_url, beat_schedule={"e": {"task": "t", "schedule": given}})
    _every_view_answers(app)
    problems = testing.check_schedule(app)
    assert problems and all("'e'" in str(p) for p in problems), problems
    with pytest.raises(ConfigError, match="entry 'e'"):
        Scheduler(app).close()


def test_a_broken_beat_schedule_item_whose_schedule_repr_raises_is_listed(sqlite_url):
    """The same schedule in an item that is no entry for another reason (kwargs not a dict; make
    fuzz, seed 1796431968): the views show such an item by its task and its schedule's repr,
    which raised AttributeError there too (list and status exited with the traceback)."""
    from decimal import Decimal

    from celery.schedules import schedule
    item = {"task": "t", "schedule": schedule(Decimal("Infinity")), "kwargs": object()}
    app = _app(sqlite_url, beat_schedule={"e": item})
    _every_view_answers(app)
    assert "its repr raised AttributeError" in _cli(app, "list", "--json").output


def test_a_stored_definition_whose_task_is_no_text_is_shown_by_status_and_list(sqlite_url):
    """A definition written into the store with a task that is no text (``{"task": 1}``; make
    fuzz, seed 1796431968): status printed its table with the int as a cell and raised
    TypeError (``len``); list and status now show it, with its problem row."""
    import json
    from celery_anarchon.stores import open_store
    app = _app(sqlite_url, anarchon_namespace="ns")
    store = open_store(sqlite_url, namespace="ns", instance_id="hand", options={})
    store.prepare(())
    store.entries.put_entry("odd", json.dumps({"task": 1, "schedule": {"every": 60}}), by="a hand edit",
                    create=True)
    store.close()
    for args in (["status"], ["list"], ["status", "--json"], ["list", "--json"]):
        result = _cli(app, *args)
        assert result.exception is None or isinstance(result.exception, SystemExit), \
            (args, result.exception)
        assert result.exit_code == 0 and "odd" in result.stdout, (args, result.stdout)
