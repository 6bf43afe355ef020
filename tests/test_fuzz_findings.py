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
from celery_anarchon.operate.schedules import default_by
from celery_anarchon.stores.base import ClaimRequest, Outcome

from stores_support import store_url

#: the stores a finding is checked on: the embedded default and the server stores that hold entries
STORES = ("sqlite", "postgresql", "redis")


def make_app(url: str, namespace: str, **conf) -> Celery:
    app = Celery("proj", set_as_current=False)
    app.conf.update(broker_url="memory://", anarchon_store_url=url, anarchon_namespace=namespace,
                    timezone="UTC", beat_schedule={"config-entry": {"task": "proj.t",
                                                                    "schedule": 60.0}}, **conf)
    return app


@pytest.fixture(params=STORES)
def api(request, tmp_path, namespace):
    """The schedules API of a new namespace on each store, holding the store entry 'stored'."""
    app = make_app(store_url(request.param, str(tmp_path)), namespace)
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
    refused(lambda: celery_anarchon.schedules(api.app, by=by), "by", repr(by))
    with celery_anarchon.schedules(api.app, by="") as default:
        assert default.by == default_by(), "by='': user@host:pid, as before"


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


def _write_raw_sqlite(url: str, name: str, definition: bytes) -> None:
    """Write ``definition`` (bytes, as text) into the SQLite row of ``name``, as a hand edit."""
    import sqlite3
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        conn.execute("UPDATE anarchon_schedule_entries SET definition = CAST(? AS TEXT) "
                     "WHERE name = ?", (definition, name))


def _write_raw_redis(url: str, namespace: str, name: str, record: bytes,
                     role: str = "entries") -> None:
    """Write ``record`` (bytes) as the field ``name`` of the namespace's ``role`` hash."""
    import redis
    client = redis.Redis.from_url(url)
    [key] = [k for k in client.scan_iter(f"*{{{namespace}}}:{role}") if k.endswith(
        f":{role}".encode())]
    client.hset(key, name, record)


def _every_read_surface_shows(app, broken: dict[str, str], capsys) -> None:
    """``list``, ``status`` (JSON and text), ``/api/status``, the page and a beat start-up with
    a sync: each works; each name of ``broken`` is a problem row whose message holds its text,
    and the store entry 'good' and the config entry are shown as usual and planned by beat."""
    import json

    from celery_anarchon.operate.cli import reports as cli_status
    from celery_anarchon.operate.web import StatusSource, create_app
    from operate_support import run_in_process
    from operate_support import asgi

    with celery_anarchon.schedules(app) as s:
        listed = {e.name: e for e in s.list()}
    for name, text in broken.items():      # (a JSON object is listed as it is stored)
        shown = listed[name].definition
        assert shown.get("storable", True) is False or "schedule" not in shown, shown
        assert "repr" not in shown or text in shown["repr"], shown
    assert listed["good"].definition["schedule"] == {"every": 60}
    code, out, err = run_in_process(cli_status.status, app, 5, True, capsys=capsys)
    assert code == 0 and not err, err
    entries = {e["name"]: e for e in json.loads(out)["entries"]}
    for name, text in broken.items():
        assert entries[name]["state"] == "problem" and text in entries[name]["problem"]
    assert entries["good"]["state"] == "running" and entries["config-entry"]["state"] == "running"
    code, out, err = run_in_process(cli_status.status, app, 5, False, capsys=capsys)
    assert code == 0 and not err and "Traceback" not in out
    source = StatusSource(app, runs=0)
    try:
        site = create_app(source, token=None, refresh_s=5.0)
        status, _, body = asgi(site, "GET", "/api/status")
        assert status == 200, body
        served = {e["name"]: e for e in json.loads(body)["entries"]}
        assert all(served[name]["state"] == "problem" for name in broken)
        status, _, page = asgi(site, "GET", "/")
        assert status == 200 and 'data-entry="good"' in page
    finally:
        source.close()
    scheduler = Scheduler(app)
    try:
        scheduler.tick()
        assert {"good", "config-entry"} <= set(scheduler.engine.plans)
        assert not set(broken) & set(scheduler.engine.plans)
    finally:
        scheduler.close()


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_stored_definition_that_is_not_utf8_is_an_error_row_and_the_others_run(
        kind, tmp_path, namespace, capsys):
    """Finding 7 (every read surface, SQLite and Redis): a definition whose bytes are not UTF-8
    (``{"t":"\xff"}`` written straight into the SQLite row or the Redis record) raised
    UnicodeDecodeError (Redis) or failed the whole read as a store outage (SQLite: "Could not
    decode to UTF-8 column"); now it is an error row in list, status, the page and /api/status,
    and beat runs the others, and ``remove`` (the fix the row gives) clears it (SQLite failed it
    as a store outage too). (PostgreSQL checks the encoding of what it stores.)"""
    url = store_url(kind, str(tmp_path))
    app = make_app(url, namespace)
    with celery_anarchon.schedules(app) as s:
        s.add("good", task="proj.t", schedule=60)
        s.add("bad", task="proj.t", schedule=60)
    if kind == "sqlite":
        _write_raw_sqlite(url, "bad", b'{"task":"\xff"}')
    else:
        _write_raw_redis(url, namespace, "bad", b'{"v":"2","t":"1","b":"x","d":"{\\"t\\":\xff}"}')
    _every_read_surface_shows(app, {"bad": "is not valid UTF-8 (the byte 0xff"}, capsys)
    with celery_anarchon.schedules(app) as s:   # the problem row's fix: remove it, add it again
        s.remove("bad")
        s.add("bad", task="proj.t", schedule=60)
        assert s.get("bad").definition["schedule"] == {"every": 60}


@pytest.mark.parametrize("record", [
    b"not json", b"[1, 2]", b'{"d": 5, "v": "x", "t": 1, "b": 2}', b'{"v": "1"}',
    b'{"d": "{\\"task\\": \\"proj.t\\"}"}'])
def test_a_malformed_redis_entry_record_is_an_error_row_and_the_others_run(
        record, tmp_path, namespace, capsys):
    """Finding 8 (every read surface, Redis): an entries record that is not JSON, JSON of the
    wrong type (a list), a definition that is not text, fields missing or of the wrong type
    (``{"v": "x"}``): json.loads, KeyError, AttributeError or ValueError broke every read, and
    the write scripts' cjson.decode failed ``remove``, the fix the problem row gives; now the
    record reads (its version 0 when it has none), its definition, where it has one, is an error
    row that ``remove`` clears; a record holding no definition reads as a cleared one."""
    url = store_url("redis", str(tmp_path))
    app = make_app(url, namespace)
    with celery_anarchon.schedules(app) as s:
        s.add("good", task="proj.t", schedule=60)
        s.add("bad", task="proj.t", schedule=60)
    _write_raw_redis(url, namespace, "bad", record)
    if record == b'{"v": "1"}':              # no definition, no pause: a cleared record
        _every_read_surface_shows(app, {}, capsys)
        with celery_anarchon.schedules(app) as s:
            assert "bad" not in {e.name for e in s.list()}
        return
    problem = {b"not json": "is not valid JSON", b"[1, 2]": "is not a JSON object",
               b'{"d": 5, "v": "x", "t": 1, "b": 2}': "is not a JSON object"}.get(record, "schedule")
    _every_read_surface_shows(app, {"bad": problem}, capsys)
    with celery_anarchon.schedules(app) as s:   # the problem row's fix: remove it, add it again
        s.remove("bad")
        s.add("bad", task="proj.t", schedule=60)
        assert s.get("bad").definition["schedule"] == {"every": 60}


def test_a_malformed_redis_pause_record_reads_as_a_pause_saying_so(tmp_path, namespace, capsys):
    """Finding 8, pause side (Redis): a pause record that is not JSON broke every read
    (json.loads) and every claim of the batch that read it (the claim script's cjson.decode);
    now the entry reads as paused and its claims answer paused, the reason saying the record is
    not readable, the other entries' claims are decided as usual, and a resume clears it."""
    url = store_url("redis", str(tmp_path))
    app = make_app(url, namespace)
    with celery_anarchon.schedules(app) as s:
        s.add("good", task="proj.t", schedule=60)
        s.pause("good", "first")
        _write_raw_redis(url, namespace, "good", b"\xff junk", role="pauses")
        entry = s.get("good")
        assert entry.paused and "pause record is not readable" in entry.pause.reason
        store, now_ms = s.store, s.store.entries.request_clock().now_ms
        results = store.claim([ClaimRequest(entry=name, slot_ms=now_ms, max_late_ms=60_000)
                               for name in ("good", "config-entry")])
        assert results[0].outcome is Outcome.PAUSED, results   # (the other: forgotten, as a
        assert results[1].outcome is not Outcome.PAUSED, results  # new store's first claims)
        assert not s.resume("good").paused and not s.get("good").paused


GOOD = {"task": "proj.t", "schedule": 60}
#: (id, a beat_schedule, the fragments the error names): one broken entry beside a good one
BAD_SHAPES = [
    ("a-list", [GOOD], ["beat_schedule = [{'task'", "not a dict of entries by name", "fix:"]),
    ("a-string", "abc", ["beat_schedule = 'abc'", "not a dict of entries by name", "fix:"]),
    ("item-not-a-dict", {"good": GOOD, "bad": 5}, ["entry 'bad': 5 is not a dict", "fix:"]),
    ("options-not-a-dict", {"good": GOOD, "bad": {**GOOD, "options": [1]}},
     ["entry 'bad': options [1]: not a dict", "fix:"]),
    ("int-name", {"good": GOOD, 3: GOOD}, ["entry name 3", "fix:"]),
    ("task-bytes", {"good": GOOD, "bad": {**GOOD, "task": b"x"}},
     ["entry 'bad': task b'x': not a task name", "fix:"]),
    ("args-a-string", {"good": GOOD, "bad": {**GOOD, "args": "xy"}},
     ["entry 'bad': args 'xy': not a list or tuple", "fix:"]),
    ("args-an-int", {"good": GOOD, "bad": {**GOOD, "args": 5}}, ["entry 'bad': args 5", "fix:"]),
    ("kwargs-a-list", {"good": GOOD, "bad": {**GOOD, "kwargs": [1]}},
     ["entry 'bad': kwargs [1]: not a dict", "fix:"]),
]


@pytest.mark.parametrize("case, beat_schedule, fragments", BAD_SHAPES,
                         ids=[c[0] for c in BAD_SHAPES])
def test_a_beat_schedule_of_the_wrong_shape_is_named_by_check_beat_and_every_view(
        case, beat_schedule, fragments, tmp_path, namespace, capsys):
    """Finding 9 (beat start-up, ``celery anarchon check``, list, status, /api/status):
    ``beat_schedule`` a list or a string (AttributeError), an item that is not a dict, options
    that are not a dict (TypeError in dict()), an int name (list and status: TypeError sorting
    names), ``task`` as bytes (status --json: bytes not JSON serializable; check: TypeError), args
    a string or an int and kwargs a list (accepted: beat would send them). Now beat refuses to
    start naming the problem; check reports it as a FAIL line and checks the others; list and
    status show the good entry, or exit 2 with one Error line when the setting itself is no
    dict."""
    import json

    from celery_anarchon.operate.cli import entries as cli_commands
    from celery_anarchon.operate.cli import reports as cli_status
    from celery_anarchon.operate.cli import rules as cli_rules
    from celery_anarchon.operate.web import StatusSource, create_app
    from operate_support import run_in_process
    from operate_support import asgi

    with pytest.raises(ConfigError) as caught:
        beat_start(tmp_path, namespace, beat_schedule)
    for fragment in fragments:
        assert fragment in str(caught.value), str(caught.value)
    app = make_app(f"sqlite:///{tmp_path / 'views.sqlite3'}", namespace)
    app.conf.beat_schedule = beat_schedule
    code, out, err = run_in_process(cli_rules.check, app, True, capsys=capsys)
    assert code == 1 and "Traceback" not in out + err
    assert all(fragment in out for fragment in fragments), out
    whole = not isinstance(beat_schedule, dict)
    if not whole:
        assert "ok    beat_schedule entry 'good'" in out, out
    for command, args in ((cli_commands.list_entries, (app, False)),
                          (cli_status.status, (app, 5, True)), (cli_status.status, (app, 5, False))):
        code, out, err = run_in_process(command, *args, capsys=capsys)
        assert "Traceback" not in out + err
        if whole:
            assert code == 2 and err.count("Error:") == 1 and fragments[0] in err, (code, err)
        else:
            assert code == 0 and not err and "good" in out, (code, err)
    source = StatusSource(app, runs=0)
    try:
        status, _, body = asgi(create_app(source, token=None, refresh_s=5.0), "GET", "/api/status")
    finally:
        source.close()
    if whole:
        assert fragments[0] in body, body[:500]
    else:
        assert status == 200, body[:500]
        entries = {e["name"]: e for e in json.loads(body)["entries"]}
        assert entries["good"]["state"] == "running"
        [bad] = [e for e in entries.values() if e["name"] in ("bad", "3")]
        assert bad["state"] == "problem" and fragments[0] in bad["problem"], bad


def test_the_page_actions_answer_for_a_name_with_a_line_break(tmp_path, namespace):
    """Finding 10 (the status page's POST /api/entries/<name>/pause, /resume, /run-now): a name
    holding a line break ('a\\nb', a store entry an older version wrote: add refuses it now)
    answered 404 "no such API route" (the route's pattern stopped at the line break). Now each
    action reaches the entry as the API does: pause and run-now answer 400 with the name rule
    (as add does), resume and the others act."""
    import json

    from celery_anarchon.schedule.definition import canonical
    from celery_anarchon.operate.web import TOKEN_HEADER, StatusSource, create_app
    from operate_support import asgi

    app = make_app(f"sqlite:///{tmp_path / 'store.sqlite3'}", namespace)
    with celery_anarchon.schedules(app) as s:
        refused(lambda: s.add("a\nb", task="proj.t", schedule=60), "control character '\\n'")
        s.store.entries.put_entry("a\nb", canonical({"task": "proj.t", "schedule": {"every": 60}}),
                          by="an older version", create=True)
    source = StatusSource(app, runs=0)
    token = "t" * 32
    site = create_app(source, token=token, refresh_s=5.0)

    def post(path: str) -> tuple[int, dict]:
        status, _, body = asgi(site, "POST", path, headers={TOKEN_HEADER: token})
        assert body.startswith("{"), (status, body[:300])
        return status, json.loads(body)
    try:
        for action in ("pause", "run-now"):
            status, answer = post(f"/api/entries/a\nb/{action}")
            assert status == 400 and "control character '\\n'" in answer["error"], answer
        status, answer = post("/api/entries/a\nb/resume")
        assert status == 200 and answer["entry"] == "a\nb", answer
        status, answer = post("/api/entries/config-entry/pause")
        assert status == 200 and answer["result"]["paused"], answer
    finally:
        source.close()
