"""Bad input: each case gives a clear message that names what is wrong and how to fix it; where
beat keeps running, nothing is lost and nothing is sent twice.

The table in docs/reliability.md lists these cases with their messages; print it again with
``python tests/system/test_bad_input.py`` (run from the repository root, servers up).
"""
from __future__ import annotations

import atexit
import collections
import json
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from datetime import timedelta

import pytest
from celery import Celery
from celery.schedules import crontab, schedule

from celery_anarchon import ConfigError, Scheduler, cron  # noqa: E402
from celery_anarchon.errors import StoreUnavailable  # noqa: E402
from celery_anarchon.stores import open_store  # noqa: E402

from conftest import AMQP_URL, REDIS_URL, require_server  # noqa: E402
from backends import backdate_memory_start

#: a file of this test process's own (a fixed /tmp path was shared by every run on the host, and
#: kept what earlier runs, of any version, wrote there)
_FOLDER = tempfile.mkdtemp(prefix="anarchon-bad-input-")
atexit.register(shutil.rmtree, _FOLDER, True)
SQLITE = "sqlite:///" + os.path.join(_FOLDER, "claims.sqlite3")


def beat_with(entries=None, **conf):
    """Start a Scheduler (what `celery beat` does at start-up) for a project configured so."""
    app = Celery("proj", set_as_current=False)
    settings = {"broker_url": "memory://", "anarchon_store_url": SQLITE,
                "beat_schedule": {name: {"task": "proj.t", **item}
                                  for name, item in (entries or {"e": {"schedule": 10}}).items()}}
    settings.update(conf)
    app.conf.update(settings)
    return Scheduler(app)


class Custom:
    """A schedule class without the two methods every host needs to agree on its slots."""


def _regular_file() -> str:
    path = os.path.join(_FOLDER, "regular-file")
    open(path, "w").close()
    return path


def store(url, **options):
    return open_store(url, namespace="bad-input", instance_id="t", options=options)


#: (id, what is wrong, how it is given, the fragments the message must contain)
REFUSED = [
    ("jitter-gap", "jitter not below half the shortest gap",
     lambda: beat_with({"e": {"schedule": 1, "options": {"anarchon": {"jitter": 0.5}}}}),
     ["entry 'e'", "jitter 0.5 s", "half the shortest gap", "(1 s)", "'jitter': 0.25"]),
    ("global-jitter", "anarchon_jitter too large for a 1-s entry",
     lambda: beat_with({"e": {"schedule": 1}}, anarchon_jitter=2),
     ["entry 'e'", "anarchon_jitter", "jitter 2 s"]),
    ("max-late", "max_late not above jitter",
     lambda: beat_with({"e": {"schedule": 60, "options": {"anarchon": {"jitter": 5, "max_late": 5}}}}),
     ["entry 'e'", "max_late 5 s must be greater than jitter 5 s", "raise max_late"]),
    ("memory", "jitter + max_late not below the store's memory",
     lambda: beat_with({"e": {"schedule": 600, "options": {"anarchon": {"max_late": 100}}}},
                       anarchon_store_options={"memory": 90}),
     ["entry 'e'", "102 s", "anarchon_store_options['memory'] to at least 204"]),
    ("count-memory", "a count-limited memory (idmp max_size) too small",
     lambda: beat_with({"e": {"schedule": 1}}, anarchon_store_url="redis://127.0.0.1:1/0",
                       anarchon_store_options={"strategy": "idmp", "max_size": 20}),
     ["entry 'e'", "at most 20 runs", "'max_size'", "at least 122"]),
    ("lease-heartbeat", "a lease heartbeat not below half its duration",
     lambda: beat_with({"e": {"schedule": 600, "options": {"anarchon": {
         "lease": {"duration": 10, "heartbeat": 5}}}}}),
     ["entry 'e'", "heartbeat 5 s", "duration 10 s", "below 5"]),
    ("global-heartbeat", "anarchon_heartbeat not below half of anarchon_lease",
     lambda: beat_with(anarchon_heartbeat=20),
     ["anarchon_heartbeat 20 s", "anarchon_lease 30 s", "below 15"]),
    ("relative", "an interval with relative=True (no fixed period across DST)",
     lambda: beat_with({"e": {"schedule": schedule(timedelta(hours=1), relative=True)}}),
     ["entry 'e'", "relative=True", "crontab", "anchor"]),
    ("crontab-step", "a crontab step larger than its field (*/120 minutes)",
     lambda: beat_with({"e": {"schedule": crontab(minute="*/120")}}),
     ["entry 'e'", "'*/120'", "0-59", "step between 1 and 59"]),
    ("crontab-range", "a crontab hour out of range (Celery refuses it when the module loads)",
     lambda: crontab(hour=25), ["Valid range is 0-23", "'25'"]),
    ("cron-field", "a cron string with a value out of range",
     lambda: cron("61 * * * *"), ["'61 * * * *'", "out of range", "in the minute field '61'",
                                  "minute (0-59)"]),
    ("cron-hour", "a cron string with an hour out of range",
     lambda: cron("0 25 * * *"), ["'0 25 * * *'", "in the hour field '25'", "hour (0-23)"]),
    ("cron-fields", "a cron string with three fields",
     lambda: cron("* * *"), ["'* * *' has 3 fields", "exactly five"]),
    ("cron-tz", "a cron string in an unknown time zone",
     lambda: cron("0 * * * *", tz="Mars/Olympus"), ["unknown time zone 'Mars/Olympus'", "IANA name"]),
    ("cron-tz-typo", "a typo in a cron string's time zone",
     lambda: cron("0 * * * *", tz="America/New_Yrok"),
     ["unknown time zone 'America/New_Yrok' (did you mean 'America/New_York'?)"]),
    ("option-typo", "a typo in an entry's anarchon options",
     lambda: beat_with({"e": {"schedule": 10, "options": {"anarchon": {"jiter": 1}}}}),
     ["entry 'e'", "unknown key 'jiter'", "did you mean 'jitter'"]),
    ("setting-typo", "a typo in a Celery setting of celery_anarchon",
     lambda: beat_with(anarchon_jiter=1),
     ["unknown setting 'anarchon_jiter'", "did you mean 'anarchon_jitter'"]),
    ("misplaced-option", "a celery_anarchon option in options, outside options['anarchon']",
     lambda: beat_with({"e": {"schedule": 60, "options": {"queue": "q", "max_late": 30}}}),
     ["entry 'e'", "options['max_late'] = 30", "apply_async", "options={'anarchon': {'max_late': 30}}"]),
    ("lease-typo", "a typo in an entry's lease options",
     lambda: beat_with({"e": {"schedule": 600, "options": {"anarchon": {"lease": {"duraton": 5}}}}}),
     ["entry 'e'", "unknown key 'duraton'", "did you mean 'duration'"]),
    ("overlap", "an unknown overlap policy",
     lambda: beat_with({"e": {"schedule": 600, "options": {"anarchon": {"lease": {"overlap": "queue"}}}}}),
     ["entry 'e'", "'queue' is not one of ('skip', 'allow')"]),
    ("max-attempts", "max_attempts of 0",
     lambda: beat_with({"e": {"schedule": 600, "options": {"anarchon": {"lease": {"max_attempts": 0}}}}}),
     ["entry 'e'", "max_attempts", "integer >= 1"]),
    ("duration-type", "a duration given as text",
     lambda: beat_with({"e": {"schedule": 10, "options": {"anarchon": {"max_late": "60s"}}}}),
     ["entry 'e'", "'60s' is not a duration", "timedelta"]),
    ("anchor-crontab", "an anchor on a crontab entry",
     lambda: beat_with({"e": {"schedule": crontab(), "options": {"anarchon": {"anchor": 5}}}}),
     ["entry 'e'", "interval schedules only"]),
    ("no-schedule", "an entry without a schedule",
     lambda: beat_with({"e": {}}), ["entry 'e' has no 'schedule'"]),
    ("unknown-key", "an entry key Celery does not know",
     lambda: beat_with({"e": {"schedule": 10, "bogus": 1}}),
     ["entry 'e'", "unexpected keyword argument 'bogus'", "Allowed keys"]),
    ("custom-class", "a schedule class without anarchon_next / anarchon_shortest_gap",
     lambda: beat_with({"e": {"schedule": Custom()}}),
     ["entry 'e'", "class Custom", "anarchon_next(self, after: datetime)", "anarchon_shortest_gap"]),
    ("scheme", "an unknown store URL scheme",
     lambda: beat_with(anarchon_store_url="redsi://localhost:6379/0"),
     ["unknown store scheme 'redsi'", "Did you mean 'redis'?"]),
    ("store-option", "a typo in a store option",
     lambda: beat_with(anarchon_store_url=REDIS_URL, anarchon_store_options={"memroy": 10}),
     ["'memroy' not understood", "did you mean 'memory' for 'memroy'?", "Allowed:", "memory"]),
    ("strategy-option", "an option of another Redis strategy",
     lambda: beat_with(anarchon_store_url=REDIS_URL,
                       anarchon_store_options={"strategy": "idmp", "window": 10}),
     ["['window'] belongs to the Redis strategy 'script'", "not to 'idmp'"]),
    ("idmp-old-redis", "the idmp strategy on a Redis older than 8.6",
     lambda: beat_with(anarchon_store_url=REDIS_URL, anarchon_store_options={"strategy": "idmp"}),
     ["Redis 7.", "needs Redis >= 8.6", "'lease', 'stream-id', 'script'"]),
    ("sqlite-path", "a SQLite path that cannot be created (a folder under a regular file)",
     lambda: beat_with(anarchon_store_url=f"sqlite:///{_regular_file()}/x/claims.sqlite3"),
     ["cannot create the folder", "Not a directory", "point anarchon_store_url at a file"]),
    ("lease-store", "a leased entry on a store that cannot hold leases",
     lambda: beat_with({"e": {"schedule": 600, "options": {"anarchon": {"lease": True}}}},
                       anarchon_store_url="nats://127.0.0.1:1"),
     ["entry 'e' is leased", "cannot hold leases", "Redis (strategy 'lease'), PostgreSQL or SQLite"]),
    ("lease-install", "a leased entry whose app did not call celery_anarchon.install(app)",
     lambda: beat_with({"e": {"schedule": 600, "options": {"anarchon": {"lease": True}}}}),
     ["entry 'e' is leased", "celery_anarchon.install(app) was not called"]),
    ("broker-sqs", "no store URL with a broker that cannot be a store (SQS)",
     lambda: beat_with(broker_url="sqs://AKIA:s3cret@", anarchon_store_url=None),
     ["anarchon_store_url is not set", "sqs://AKIA:***@", "once per host"]),
    ("sentinel", "a Sentinel store URL without master_name",
     lambda: beat_with(anarchon_store_url="sentinel://127.0.0.1:26379"),
     ["Sentinel URL", "master_name"]),
    ("quorum", "a RabbitMQ store asked for quorum queues",
     lambda: beat_with(anarchon_store_url=AMQP_URL, anarchon_store_options={"queue_type": "quorum"}),
     ["classic queues only", "two claims", "'classic'"]),
]

#: store errors that are retried (beat keeps running and sends nothing): (id, what, call, fragments)
RETRIED = [
    ("unreachable", "a store that cannot be reached",
     lambda: store("redis://:s3cret@127.0.0.1:1/0").prepare(["e"]),
     ["redis://:***@127.0.0.1:1/0", "Connection refused"]),
    ("credentials", "wrong RabbitMQ credentials",
     lambda: store(AMQP_URL.replace("guest:guest", "guest:wrong")).prepare(["e"]),
     ["amqp://guest:***@", "refused access", "check the user name, password"]),
]

# -- bad values of a definition, a name, an option: one error, nothing written (rows 39-...) -------

SQLITE_API = "sqlite:///" + os.path.join(_FOLDER, "api.sqlite3")   # this process's own, as SQLITE


def nested(depth: int) -> list:
    """A list nested ``depth`` levels deep: [[[...]]]."""
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def api_add(name="e", **definition):
    """``celery_anarchon.schedules(app).add(name, ...)`` on a SQLite store, in a namespace of its
    own (task "proj.t", every 60 s unless given); whatever happens, it wrote nothing."""
    import uuid

    import celery_anarchon
    app = Celery("proj", set_as_current=False)
    app.conf.update(broker_url="memory://", anarchon_store_url=SQLITE_API, timezone="UTC",
                    anarchon_namespace=f"bad-input-{uuid.uuid4().hex[:8]}",
                    beat_schedule={"ok": {"task": "proj.t", "schedule": 60.0}})
    with celery_anarchon.schedules(app) as s:
        before = s.store.entries.entries_version()
        try:
            s.add(name, **{"task": "proj.t", "schedule": 60, **definition}, check_task=False)
        finally:
            assert s.store.entries.entries_version() == before and not s.store.entries.load_entries().entries, \
                "a refused add wrote to the store"


#: (id, what is wrong, where it is given, how, the fragments the message must contain)
BAD_VALUES = [
    ("every-1e308", "an interval of 1e308 seconds", "API, CLI",
     lambda: api_add(schedule={"every": 1e308}),
     ["entry 'e'", "'schedule.every' = 1e+308", "after the year 9999", "fix: give a shorter period"]),
    ("every-1e18", "an interval of 1e18 seconds", "API, CLI",
     lambda: api_add(schedule={"every": 1e18}),
     ["entry 'e'", "'schedule.every' = 1e+18", "after the year 9999"]),
    ("every-1e12", "an interval of 1e12 seconds (next slot in the year 33658)", "API, CLI",
     lambda: api_add(schedule=1e12),
     ["entry 'e'", "every 1e+12 s", "in the year 33658", "after 9999", "fix: give a shorter period"]),
    ("beat-every-1e12", "an interval of 1e12 seconds in beat_schedule", "beat",
     lambda: beat_with({"e": {"schedule": 1e12}}),
     ["entry 'e'", "every 1e+12 s", "in the year 33658", "fix: give a shorter period"]),
    ("beat-every-1e18", "an interval of 1e18 seconds in beat_schedule (Celery cannot hold it)",
     "beat", lambda: beat_with({"e": {"schedule": 1e18}}),
     ["entry 'e'", "1e+18", "after the year 9999", "fix: give a shorter period"]),
    ("max-late-1e308", "max_late of 1e308 seconds", "API, CLI",
     lambda: api_add(anarchon={"max_late": 1e308}),
     ["entry 'e'", "max_late", "1e+308", "more than 3155760000 s (100 years)", "fix:"]),
    ("anchor-1e308", "an anchor of 1e308 seconds", "API, CLI",
     lambda: api_add(anarchon={"anchor": 1e308}),
     ["entry 'e'", "['anchor']", "1e+308", "the end of the year 9999", "fix:"]),
    ("crontab-empty", "an empty crontab field", "API, CLI",
     lambda: api_add(schedule={"crontab": {"minute": ""}}),
     ["entry 'e'", "'schedule.crontab.minute' = \"\"", "empty part", "fix: write the field"]),
    ("args-deep", "args nested 5,000 levels deep", "API, CLI",
     lambda: api_add(args=nested(5000)),
     ["entry 'e'", "key 'args'", "nested more than 100 levels deep", "fix: flatten"]),
    ("beat-text-schedule", "a schedule given as text in beat_schedule", "beat",
     lambda: beat_with({"e": {"schedule": "every 5 minutes"}}),
     ["entry 'e'", "'every 5 minutes'", "is text", "timedelta(minutes=5)", "crontab(minute='*/5')"]),
    ("text-schedule", "a schedule given as text to the API", "API, CLI",
     lambda: api_add(schedule="every 5 minutes"),
     ["entry 'e'", "'every 5 minutes'", "is text", "timedelta(minutes=5)"]),
    ("options-expires", "apply_async option expires that is no time", "API, CLI",
     lambda: api_add(options={"expires": "soon"}),
     ["entry 'e'", "options['expires'] = 'soon'", "ISO 8601", "fix: give seconds"]),
    ("options-headers", "apply_async option headers that is no mapping", "API, CLI",
     lambda: api_add(options={"headers": "x"}),
     ["entry 'e'", "options['headers'] = 'x'", "not a mapping", "fix: give a dict"]),
    ("beat-options-priority", "apply_async option priority as text in beat_schedule", "beat",
     lambda: beat_with({"e": {"schedule": 60, "options": {"priority": "high"}}}),
     ["entry 'e'", "options['priority'] = 'high'", "integer from 0 to 255", "fix:"]),
    ("name-long", "a name of 201 characters", "API, CLI",
     lambda: api_add("n" * 201),
     ["201 characters, more than 200", "fix: give a shorter name"]),
    ("beat-name-long", "a beat_schedule name of 3,000 characters", "beat",
     lambda: beat_with({"n" * 3000: {"schedule": 60}}),
     ["3,000 characters, more than 200", "fix: give a shorter name"]),
    ("name-rlo", "a name holding U+202E (right-to-left override)", "API, CLI",
     lambda: api_add("pay\u202eroll"),
     ["format character U+202E (RIGHT-TO-LEFT OVERRIDE)", "fix: use visible characters"]),
    ("name-zwsp", "a name holding U+200B (zero width space)", "API, CLI",
     lambda: api_add("re\u200bport"),
     ["format character U+200B (ZERO WIDTH SPACE)", "fix: use visible characters"]),
    ("beat-names-nfc", "two beat_schedule names equal after NFC (café composed and decomposed)",
     "beat", lambda: beat_with({"caf\u00e9": {"schedule": 60}, "cafe\u0301": {"schedule": 60}}),
     ["'café'", "the same name once normalized (Unicode NFC", "fix: rename one"]),
    ("definition-size", "a definition of more than 64 KiB (args of 70,000 characters)", "API, CLI",
     lambda: api_add(args=["x" * 70_000]),
     ["entry 'e'", "70,", "bytes of JSON, more than 65,536", "fix: pass a reference"]),
]


@pytest.mark.parametrize("case", BAD_VALUES, ids=[c[0] for c in BAD_VALUES])
def test_a_bad_value_is_one_config_error_naming_it_and_nothing_is_written(case):
    """Each is a ConfigError (a refused add wrote nothing: api_add checks), never an
    OverflowError, a RecursionError, Celery's ParseException or a traceback of a later send."""
    _, _, _, call, fragments = case
    with pytest.raises(ConfigError) as info:
        call()
    for fragment in fragments:
        assert fragment in str(info.value), f"{fragment!r} missing from: {info.value}"
    assert len(str(info.value)) < 1000, "a message must stay readable"


def api_run_now(request_id: str, *, url: str = SQLITE_API, options: dict | None = None,
                schedule: float = 60.0):
    """``celery_anarchon.schedules(app).run_now("ok", request_id=...)`` in a namespace of its
    own (the config entry "ok", every ``schedule`` seconds, max_late 3 s); whatever happens, it
    wrote nothing."""
    import uuid

    import celery_anarchon
    app = Celery("proj", set_as_current=False)
    app.conf.update(broker_url="memory://", anarchon_store_url=url, timezone="UTC",
                    anarchon_namespace=f"bad-input-{uuid.uuid4().hex[:8]}",
                    anarchon_store_options=options or {},
                    beat_schedule={"ok": {"task": "proj.t", "schedule": schedule,
                                          "options": {"anarchon": {"max_late": 3}}}})
    with celery_anarchon.schedules(app) as s:
        before = s.store.entries.entries_version()
        try:
            s.run_now("ok", request_id=request_id)
        finally:
            assert s.store.entries.entries_version() == before, "a refused run-now wrote to the store"


#: run-now requests refused (rows 68-...): (id, what is wrong, where it is given, how, the
#: fragments the message must contain)
BAD_REQUESTS = [
    ("request-id-long", "a run-now request id of 201 characters", "API, CLI",
     lambda: api_run_now("t" * 201),
     ["entry 'ok': run-now request id", "201 characters, more than 200", "fix: give a shorter id"]),
    ("request-id-newline", "a run-now request id holding a line break", "API, CLI",
     lambda: api_run_now("t-1\nX-Injected: 1"),
     ["entry 'ok': run-now request id 't-1\\nX-Injected: 1'", "control character '\\n'",
      "fix: use visible characters"]),
    ("request-id-rlo", "a run-now request id holding U+202E (right-to-left override)", "API, CLI",
     lambda: api_run_now("pay\u202eroll"),
     ["entry 'ok': run-now request id", "format character U+202E", "fix: use visible characters"]),
    ("request-id-blank", "a run-now request id of spaces only", "API, CLI",
     lambda: api_run_now("   "),
     ["entry 'ok': run-now request id '   '", "empty or whitespace only", "fix: give an id"]),
    ("run-now-count-memory", "run-now of an entry every second on Redis `script` with "
     "`history_size` 5 (5 s of runs, against a run-now window of 15 s)", "API, CLI",
     lambda: api_run_now("t-1", url=REDIS_URL, options={"strategy": "script", "history_size": 5},
                         schedule=1.0),
     ["entry 'ok': run-now refused", "up to 15 s after its slot", "at most 5 runs per entry",
      "anarchon_store_options['history_size'] to at least 32"]),
]


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=[c[0] for c in BAD_REQUESTS])
def test_a_bad_run_now_request_is_one_config_error_naming_it_and_nothing_is_written(case):
    case_id, _, _, call, fragments = case
    if case_id == "run-now-count-memory":
        require_server(REDIS_URL, "Redis")
    with pytest.raises(ConfigError) as info:
        call()
    for fragment in fragments:
        assert fragment in str(info.value), f"{fragment!r} missing from: {info.value}"
    assert len(str(info.value)) < 1000, "a message must stay readable"


_DEEP_ARGS = "[" * 5000 + "]" * 5000
#: (id, the command's arguments after ``celery -A app anarchon``, fragments of its one Error line)
BAD_COMMANDS = [
    ("every-1e308", ["add", "e", "--every", "1e308"], ["'schedule.every'", "after the year 9999"]),
    ("every-1e18", ["add", "e", "--every", "1e18"], ["'schedule.every'", "after the year 9999"]),
    ("every-1e12", ["add", "e", "--every", "1e12"], ["in the year 33658"]),
    ("max-late-1e308", ["add", "e", "--every", "60", "--anarchon", '{"max_late": 1e308}'],
     ["max_late", "more than 3155760000 s (100 years)"]),
    ("anchor-1e308", ["add", "e", "--every", "60", "--anarchon", '{"anchor": 1e308}'],
     ["['anchor']", "the end of the year 9999"]),
    ("crontab-empty", ["add", "e", "--json-definition",
                       '{"task": "T", "schedule": {"crontab": {"minute": ""}}}'],
     ["'schedule.crontab.minute'", "empty part"]),
    ("args-deep", ["add", "e", "--every", "60", "--args", _DEEP_ARGS],
     ["'--args'", "nested more than 100 levels deep", "fix: flatten"]),
    ("since", ["history", "ok", "--since", "99999999d"],
     ["'--since'", "'99999999d'", "before the year 1", "fix:"]),
    ("since-inf", ["history", "ok", "--since", "9" * 400 + "d"], ["'--since'", "before the year 1"]),
    ("options-expires", ["add", "e", "--every", "60", "--options", '{"expires": "soon"}'],
     ["options['expires'] = 'soon'"]),
    ("name-rlo", ["add", "pay\u202eroll", "--every", "60"], ["U+202E"]),
    ("name-long", ["add", "n" * 201, "--every", "60"], ["201 characters, more than 200"]),
    ("definition-size", ["add", "e", "--every", "60", "--args", '["' + "x" * 70_000 + '"]'],
     ["more than 65,536"]),
    ("request-id-long", ["run-now", "ok", "--request-id", "t" * 201],
     ["entry 'ok': run-now request id", "201 characters, more than 200"]),
    ("request-id-esc", ["run-now", "ok", "--request-id", "t-1\x1b[31m"],
     ["entry 'ok': run-now request id 't-1\\x1b[31m'", "control character"]),
]


@pytest.mark.parametrize("case", BAD_COMMANDS, ids=[c[0] for c in BAD_COMMANDS])
def test_a_bad_value_on_the_command_line_exits_2_with_one_error_line(case, tmp_path, namespace):
    """The command line as a user types it (click parses the flags, our code runs in this
    process): exit 2, one ``Error:`` line, no traceback, and nothing written."""
    from click.testing import CliRunner
    from celery.bin.celery import celery as celery_command
    case_id, args, fragments = case
    module = f"bad_cli_{namespace.replace('-', '_')}"
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    (tmp_path / f"{module}.py").write_text(
        "from celery import Celery\n"
        f"app = Celery({module!r}, set_as_current=False)\n"
        f"app.conf.update(broker_url='memory://', anarchon_store_url={url!r}, timezone='UTC',\n"
        f"                anarchon_namespace={namespace!r},\n"
        "                beat_schedule={'ok': {'task': 'T', 'schedule': 60.0}})\n")
    sys.path.insert(0, str(tmp_path))
    try:
        args = [a.replace('"T"', f'"{module}.T"') for a in args]
        if args[0] == "add" and "--json-definition" not in args:
            args += ["--task", "T", "--no-check-task"]
        result = CliRunner().invoke(celery_command, ["-A", module, "anarchon", *args])
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(module, None)
    output = result.stdout + result.stderr
    assert result.exit_code == 2, (result.exit_code, output[-2000:], result.exception)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in output, output[-2000:]
    for fragment in fragments:
        assert fragment in errors[0], f"{fragment!r} missing from: {errors[0][:1000]}"
    written = open_store(url, namespace=namespace, instance_id="t")
    try:
        snapshot = written.entries.load_entries()
        assert not snapshot.entries and not snapshot.requests, "a refused command wrote to the store"
    finally:
        written.close()


#: servers a case needs (case id -> (url, name))
NEEDS = {"strategy-option": (REDIS_URL, "Redis"), "idmp-old-redis": (REDIS_URL, "Redis"),
         "store-option": (REDIS_URL, "Redis"), "credentials": (AMQP_URL, "RabbitMQ"),
         "quorum": (AMQP_URL, "RabbitMQ")}


def message_of(call) -> str:
    try:
        call()
    except (ConfigError, ValueError, StoreUnavailable) as exc:
        return str(exc)
    raise AssertionError("no error")


#: rows 92 and 93 of docs/reliability.md: the key of the entry's own settings misspelt among its
#: options (Celery passes an unknown option on unread: the settings in it would be ignored)
MISSPELT_ANARCHON = [
    ("api", lambda: api_add(options={"anarcon": {"end_at": "2026-01-01T00:00:00+00:00"}}),
     "entry 'e': options['anarcon'] is no option Celery knows (did you mean 'anarchon'?): the "
     "settings in it would be ignored; fix: rename it to 'anarchon'"),
    ("beat", lambda: beat_with({"e": {"schedule": 60, "options": {"Anarchon": {"max_late": 5}}}}),
     "entry 'e': options['Anarchon'] is no option Celery knows (did you mean 'anarchon'?): the "
     "settings in it would be ignored; fix: rename it to 'anarchon'"),
]


@pytest.mark.parametrize("where, call, message", MISSPELT_ANARCHON,
                         ids=[c[0] for c in MISSPELT_ANARCHON])
def test_a_misspelt_anarchon_key_is_refused_not_ignored(where, call, message):
    assert message in message_of(call)


@pytest.mark.parametrize("case", REFUSED, ids=[c[0] for c in REFUSED])
def test_bad_configuration_is_refused_by_name(case):
    case_id, _, call, fragments = case
    if case_id in NEEDS:
        require_server(*NEEDS[case_id])
    with pytest.raises((ConfigError, ValueError)) as info:
        call()
    for fragment in fragments:
        assert fragment in str(info.value), f"{fragment!r} missing from: {info.value}"
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize("case", RETRIED, ids=[c[0] for c in RETRIED])
def test_an_unusable_store_says_why_and_hides_the_password(case):
    case_id, _, call, fragments = case
    if case_id in NEEDS:
        require_server(*NEEDS[case_id])
    with pytest.raises(StoreUnavailable) as info:
        call()
    for fragment in fragments:
        assert fragment in str(info.value), f"{fragment!r} missing from: {info.value}"
    assert "s3cret" not in str(info.value) and "wrong" not in str(info.value)


def test_beat_keeps_running_without_a_store_and_never_sends_blind(caplog):
    sent = []
    with caplog.at_level(logging.INFO, "celery_anarchon"):
        scheduler = beat_with({"e": {"schedule": 1}}, anarchon_store_url="redis://:s3cret@127.0.0.1:1/0")
        scheduler.engine.send = lambda *args: sent.append(args)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert 0 < scheduler.tick() <= 60
            time.sleep(0.05)
    assert sent == []
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "unreachable" in errors[0] and "No run is sent" in errors[0]
    assert "Fix: check anarchon_store_url" in errors[0]
    assert "s3cret" not in caplog.text and "redis://:***@127.0.0.1:1/0" in caplog.text


# -- what beat does run: odd names, two apps on one store, a rolling restart ------------------------

def test_odd_names_two_apps_and_a_rolling_restart_run_every_slot_once(tmp_path, namespace, capsys):
    """Entries named with ':', quotes, spaces and non-ASCII; a second app with the same entry
    names on the same store; one beat restarted with a changed definition (max_late) while the
    others run. Each run of each app executes once; the restarted beat names both definitions."""
    from cluster import Cluster, read_executions
    from stores_support import wait_until
    require_server(REDIS_URL, "Redis")
    names = {"a:b": 1, "it's \"quoted\"": 2, "with space": 1, "café ☕": 2}
    out = str(tmp_path / "executions.jsonl")
    base = {"ANARCHON_IT_BROKER": REDIS_URL.rsplit("/", 1)[0] + "/8", "ANARCHON_IT_STORE": REDIS_URL,
            "ANARCHON_IT_QUEUE": f"it-{namespace}", "ANARCHON_IT_OUT": out,
            "ANARCHON_IT_ENTRIES": json.dumps(names)}
    apps = {"A": f"{namespace}-A", "B": f"{namespace}-B"}
    for ns in apps.values():
        s = open_store(REDIS_URL, namespace=ns, instance_id="test")
        s.prepare(list(names))
        backdate_memory_start(s, list(names), 120_000)
        s.close()
    cluster = Cluster(str(tmp_path), {**base, "ANARCHON_IT_NAMESPACE": apps["A"]})
    try:
        cluster.worker("worker")
        cluster.wait_log("worker", "ready.")
        for name, app in (("a1", "A"), ("a2", "A"), ("b1", "B")):
            cluster.beat(name, env={"ANARCHON_IT_NAMESPACE": apps[app]})
        start = max(cluster.wait_log(n, "anarchon: instance") for n in ("a1", "a2", "b1")) + 1
        time.sleep(6)
        cluster.signal("a2", signal.SIGTERM)
        cluster.procs["a2"].popen.wait(15)
        cluster.beat("a2-new", env={"ANARCHON_IT_NAMESPACE": apps["A"], "ANARCHON_IT_MAX_LATE": "30"})
        cluster.wait_log("a2-new", "different definition", timeout=30)
        time.sleep(4)
        end = time.time() - 2
        want = {(ns, e, s) for ns in apps.values() for e, every in names.items()
                for s in range(int(start * 1000) // (every * 1000) * every * 1000 + every * 1000,
                               int(end * 1000), every * 1000)}
        def missing():
            return want - {(x["namespace"], x["entry"], x["slot"]) for x in read_executions(out)}
        wait_until(lambda: not missing(), 60, f"every run to execute", interval=0.2)
        time.sleep(1)
    finally:
        cluster.stop_all()
    runs = collections.Counter((x["namespace"], x["entry"], x["slot"]) for x in read_executions(out))
    warning = [line for line in cluster.procs["a2-new"].text().splitlines() if "different definition" in line][0]
    with capsys.disabled():
        print(f"\n[names, two apps, rolling restart] {len(want)} runs expected, "
              f"{sum(1 for r in want if runs[r] == 1)} executed once, "
              f"{sum(1 for n in runs.values() if n > 1)} twice")
    assert not [r for r, n in runs.items() if n > 1], "no run executed twice"
    assert want <= set(runs), sorted(want - set(runs))
    assert {e for _, e, _ in runs} == set(names)
    assert re.search(r"Theirs \([0-9a-f]{12}\): .*max_late_s\": 60", warning)
    assert re.search(r"Ours \([0-9a-f]{12}\): .*max_late_s\": 30", warning)


if __name__ == "__main__":     # print the table of docs/reliability.md
    print("| # | bad input | what happens |\n| --- | --- | --- |")
    for n, (case_id, what, call, _) in enumerate(REFUSED + RETRIED, 1):
        try:
            text = message_of(call)
        except Exception as exc:  # a server that is down
            text = f"(not measured: {exc})"
        kind = "beat refuses to start" if (case_id, what, call, _) in REFUSED else "logged; beat keeps running, sends nothing, retries"
        print(f"| {n} | {what} | {kind}: `{text}` |")
    print("\n(rows 36-38: the multi-process test; then the bad values)\n")
    kinds = {"beat": "beat refuses to start",
             "API, CLI": "the API raises it, the CLI exits 2 with it; nothing is written"}
    for n, (case_id, what, where, call, _) in enumerate(BAD_VALUES, 39):
        try:
            text = message_of(call)
        except Exception as exc:
            text = f"(not measured: {exc})"
        print(f"| {n} | {what} | {kinds[where]}: `{text}` |")
    print("\n(rows 59-67: cases of their own; then the run-now requests)\n")
    for n, (case_id, what, where, call, _) in enumerate(BAD_REQUESTS, 68):
        try:
            text = message_of(call)
        except Exception as exc:
            text = f"(not measured: {exc})"
        print(f"| {n} | {what} | {kinds[where]}: `{text}` |")


def test_a_broken_url_a_redis_db_that_is_no_number_and_an_unknown_zone_are_config_errors(capsys):
    """Each is a ConfigError naming the value and the fix, never a bare ValueError or a
    traceback; the password stays masked."""
    from celery_anarchon import testing
    from celery_anarchon.operate.cli import rules as cli_rules
    with pytest.raises(ConfigError) as info:
        store("redis://user:s3cret@[::1/3")
    assert type(info.value) is ConfigError and "cannot be parsed" in str(info.value)
    assert "s3cret" not in str(info.value) and "user:***@" in str(info.value)
    with pytest.raises(ConfigError, match="the database 'notadb' is not a number"):
        store("redis://127.0.0.1:6379/notadb")
    store("redis://127.0.0.1:6379/3").close()      # a number is still fine (no I/O)

    app = Celery("proj", set_as_current=False)
    app.conf.update(broker_url="memory://", anarchon_store_url=SQLITE, timezone="Mars/Olympus",
                    beat_schedule={"e": {"task": "proj.t", "schedule": 60.0}})
    [problem] = testing.check_schedule(app)
    assert problem.rule == "a known time zone" and "'Mars/Olympus' (app.conf.timezone)" in problem.message
    import click
    with pytest.raises(click.exceptions.Exit):
        cli_rules.check(app, False)
    out = capsys.readouterr().out
    assert "FAIL  timezone: a known time zone" in out and "fix: use a zone name" in out


def test_an_unknown_app_timezone_is_one_error_naming_the_setting_wherever_the_app_is_read():
    """beat, the status views and the schedules API all refuse it with the same message (the
    setting, the value, the fix), not one misleading "Celery cannot build it" per entry."""
    import celery_anarchon
    from celery_anarchon.operate import overview
    from celery_anarchon.settings import Settings
    app = Celery("proj", set_as_current=False)
    app.conf.update(broker_url="memory://", anarchon_store_url=SQLITE, timezone="Mars/Olympus",
                    beat_schedule={"a": {"task": "proj.t", "schedule": crontab(minute="0")},
                                   "b": {"task": "proj.t", "schedule": 60.0}})
    fragments = ["timezone 'Mars/Olympus' (app.conf.timezone)", "not a known IANA time zone",
                 "fix: use a zone name such as 'UTC'"]
    for call in (lambda: Scheduler(app), lambda: Settings.from_app(app),
                 lambda: overview.overview(app, store(SQLITE)),
                 lambda: celery_anarchon.schedules(app)):
        with pytest.raises(ConfigError) as info:
            call()
        for fragment in fragments:
            assert fragment in str(info.value), f"{fragment!r} missing from: {info.value}"
        assert "Celery cannot build it" not in str(info.value)
    app.conf.timezone = "Europe/Pariss"
    with pytest.raises(ConfigError, match=r"\(did you mean 'Europe/Paris'\?\); fix"):
        Settings.from_app(app)
    # the worker side computes no slot: its lease store opens whatever the zone
    assert Settings.from_app(app, check_timezone=False).namespace == "proj"


@pytest.mark.parametrize("settings, message, quiet", [
    ("beat_schedule={'e': {'task': 'badproj.t', 'schedule': 60, "
     "'options': {'anarchon': {'max_lat': 30}}}}",
     "unknown key 'max_lat' (did you mean 'max_late'?)", False),
    ("anarchon_jiter=1", "'anarchon_jiter'", False),
    ("anarchon_jiter=1", "'anarchon_jiter'", True),
    ("anarchon_store_options={'memroy': 100}", "did you mean 'memory' for 'memroy'?", False),
], ids=["entry", "setting", "setting-quiet", "store-option"])
def test_celery_beat_with_a_bad_setting_exits_with_one_short_message(tmp_path, settings, message,
                                                                     quiet):
    """A bad entry is found after Celery beat redirected stderr into its log, where a traceback
    becomes hundreds of WARNING lines (one per fragment); a bad setting or store option when
    beat builds the scheduler for its banner, before that (or, with --quiet, after it). Either
    way beat says the error once, without a traceback, and exits 1."""
    import subprocess
    (tmp_path / "badproj.py").write_text(
        "from celery import Celery\n"
        "app = Celery('badproj', broker='memory://')\n"
        f"app.conf.update(beat_scheduler='celery_anarchon:Scheduler', "
        f"anarchon_store_url='sqlite:///{tmp_path}/s.sqlite3', {settings})\n")
    done = subprocess.run([sys.executable, "-m", "celery", "-A", "badproj", *(["--quiet"] * quiet),
                           "beat", "-l", "info",
                           "--schedule", str(tmp_path / "celerybeat-schedule")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert output.count(message) == 1, output
    assert "beat cannot start" in output and "Traceback" not in output, output
    assert len(output.splitlines()) < 40, output
