"""``celery -A proj anarchon import redbeat``, against entries the real celery-redbeat package
saved (its own ``RedBeatSchedulerEntry(...).save()``, an app with ``redbeat_redis_url`` set to
the test Redis and a key prefix of its own): every schedule type RedBeat stores, the dry run,
the writes read back through the schedules API, disabled -> paused, refusals that name the
entry and the fix while the others are written, the second run that writes nothing, and the
table word for word (real subprocesses of tests/support/apps/redbeat_app.py; our store SQLite)."""
from __future__ import annotations

import contextlib
import datetime
import os
import subprocess
import sys
import uuid

import pytest
import redis
from celery import Celery
from celery.schedules import crontab, schedule, solar

import celery_anarchon
from celery_anarchon import testing
from celery_anarchon.operate import import_redbeat

from conftest import REDIS_URL, require_server
from operate_support import (
    COMPOSED, DECOMPOSED, exits, imports_refuse_both_spellings, reader_app, store_entries,
)
from paths import APPS

# celery-redbeat: a test dependency (setup.cfg's test extra), never a runtime one
from redbeat import RedBeatSchedulerEntry
from redbeat.schedules import rrule

UTC = datetime.timezone.utc
#: an rrule's dtstart (RedBeat stores it as a timestamp with its UTC offset)
START = datetime.datetime(2026, 1, 5, 8, 30, tzinfo=UTC)


@pytest.fixture
def prefix() -> str:
    """A RedBeat key prefix of the test's own on the test Redis; its keys are deleted after."""
    require_server(REDIS_URL, "Redis")
    name = f"rb-{uuid.uuid4().hex[:10]}:"
    yield name
    client = redis.Redis.from_url(REDIS_URL)
    with client:
        keys = list(client.scan_iter(match=name + "*"))
        if keys:
            client.delete(*keys)


@pytest.fixture
def store_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'store.sqlite3'}"


@contextlib.contextmanager
def redbeat_app(prefix: str):
    """A Celery app configured for RedBeat as its users configure it (not the current app)."""
    app = Celery("redbeat_writer", set_as_current=False)
    app.conf.update(broker_url="memory://", redbeat_redis_url=REDIS_URL,
                    redbeat_key_prefix=prefix, timezone="Europe/Paris")
    try:
        yield app
    finally:
        client = getattr(app, "redbeat_redis", None)
        if client is not None:
            client.close()


def save(prefix: str, *entries: dict) -> None:
    """Save each entry with RedBeat's own ``RedBeatSchedulerEntry(...).save()``."""
    with redbeat_app(prefix) as app:
        for entry in entries:
            RedBeatSchedulerEntry(app=app, **entry).save()


def run(store_url: str, namespace: str, prefix: str, *args: str) -> subprocess.CompletedProcess:
    """``celery -A redbeat_app anarchon import redbeat <args>``: RedBeat's Redis from the app's
    ``redbeat_redis_url``."""
    path = os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "ANARCHON_RB_REDIS": REDIS_URL,
           "ANARCHON_RB_PREFIX": prefix, "ANARCHON_CLI_STORE": store_url,
           "ANARCHON_CLI_NAMESPACE": namespace}
    return subprocess.run([sys.executable, "-m", "celery", "-A", "redbeat_app", "anarchon",
                           "import", "redbeat", *args],
                          env=env, capture_output=True, text=True, timeout=60, cwd=APPS)


#: one entry of every kind RedBeat stores, and the refusals
EVERY_KIND = [
    dict(name="every-5m", task="cli_app.report", schedule=schedule(datetime.timedelta(minutes=5)),
         args=[1], kwargs={"full": True}, options={"queue": "reports"}),
    dict(name="nightly", task="cli_app.report",
         schedule=crontab(minute=30, hour=3, day_of_week="mon-fri")),
    dict(name="off", task="cli_app.report", schedule=schedule(600), enabled=False),
    dict(name="daily-rrule", task="cli_app.report",
         schedule=rrule("DAILY", dtstart=START, count=10)),
    dict(name="hourly-until", task="cli_app.report",
         schedule=rrule("HOURLY", dtstart=START, interval=6,
                        until=START + datetime.timedelta(days=1, hours=3))),
    dict(name="monthly-rrule", task="cli_app.report",
         schedule=rrule("MONTHLY", dtstart=START, bymonthday=[1])),
    dict(name="rounded", task="cli_app.report", schedule=schedule(3600, relative=True)),
    dict(name="too-wide-step", task="cli_app.report", schedule=crontab(minute="*/120")),
    dict(name="dated", task="cli_app.report", schedule=schedule(60),
         kwargs={"since": START}),
    dict(name="config-entry", task="cli_app.report", schedule=schedule(60)),
]


def test_every_schedule_type_redbeat_stores_is_imported_or_refused_by_name(
        store_url, namespace, prefix):
    save(prefix, *EVERY_KIND)

    dry = run(store_url, namespace, prefix, "--dry-run")
    out = exits(dry, 6)
    assert out.rstrip().endswith("dry run, nothing written: 5 to add, 1 skipped, 4 refused")
    assert store_entries(store_url, namespace) == {}           # the dry run wrote nothing

    done = run(store_url, namespace, prefix)
    assert exits(done, 6).rstrip().endswith("imported: 5 added, 1 skipped, 4 refused")
    refused = dict(line.split(": ", 1) for line in done.stderr.splitlines())
    assert set(refused) == {"refused monthly-rrule", "refused rounded", "refused too-wide-step",
                            "refused dated"}
    assert refused["refused monthly-rrule"].startswith(
        "entry 'monthly-rrule': its rrule (freq MONTHLY, interval 1, bymonthday [1]) has no exact "
        "form here")
    assert "fix: add it here with a crontab or cron that says the same" in refused[
        "refused monthly-rrule"]
    assert refused["refused rounded"].startswith(
        "entry 'rounded': its interval of 3600 s has relative=True")
    assert "fix: save it in RedBeat with relative=False" in refused["refused rounded"]
    # our start-up rule, with its message: Celery's crontab takes */120, we refuse it
    assert refused["refused too-wide-step"].startswith(
        "entry 'too-wide-step': crontab: minute field '*/120': the step 120 is larger than the "
        "field's range 0-59")
    assert refused["refused dated"].startswith(
        "entry 'dated': RedBeat stored kwargs.since as a datetime object")

    stored = store_entries(store_url, namespace)
    assert set(stored) == {"every-5m", "nightly", "off", "daily-rrule", "hourly-until"}
    assert stored["every-5m"] == ({"task": "cli_app.report", "schedule": {"every": 300},
                                   "args": [1], "kwargs": {"full": True},
                                   "options": {"queue": "reports"}}, None)
    # RedBeat ran a crontab in the app's timezone: the store entry names it
    assert stored["nightly"][0]["schedule"] == {
        "crontab": {"minute": 30, "hour": 3, "day_of_week": "mon-fri"},   # as RedBeat keeps them
        "timezone": "Europe/Paris"}
    assert stored["off"] == ({"task": "cli_app.report", "schedule": {"every": 600},
                              "args": [], "kwargs": {}, "options": {}},
                             "came disabled from RedBeat (enabled=False)")
    daily = stored["daily-rrule"][0]
    assert (daily["schedule"], daily["anarchon"]) == ({"every": 86400}, {
        "anchor": 30600, "start_at": "2026-01-05T08:30:00+00:00",
        "end_at": "2026-01-14T08:30:00+00:00"})           # the 10th run
    hourly = stored["hourly-until"][0]
    assert (hourly["schedule"], hourly["anarchon"]["end_at"]) == (
        {"every": 21600}, "2026-01-06T08:30:00+00:00")      # the last run before until
    # the same instants as RedBeat's rrule (dateutil) gives
    app = reader_app(store_url, namespace, "Europe/Paris")
    with celery_anarchon.schedules(app) as s:
        slots = testing.next_slots(app, "hourly-until", 10, store=s.store,
                                                   after=START - datetime.timedelta(seconds=1))
    assert slots == list(EVERY_KIND[4]["schedule"].rrule)

    again = run(store_url, namespace, prefix)
    assert exits(again, 6).rstrip().endswith("imported: 5 unchanged, 1 skipped, 4 refused")
    assert store_entries(store_url, namespace) == stored


def test_a_second_run_writes_nothing_and_says_every_entry_is_unchanged(
        store_url, namespace, prefix):
    save(prefix, EVERY_KIND[0], EVERY_KIND[1], EVERY_KIND[2])
    exits(run(store_url, namespace, prefix, "--by", "ops"), 0)
    with celery_anarchon.schedules(reader_app(store_url, namespace, "Europe/Paris")) as s:
        versions = {e.name: e.version for e in s.list() if e.source == "store"}
    again = exits(run(store_url, namespace, prefix, "--by", "ops"), 0)
    assert again.rstrip().endswith("imported: every entry is unchanged, nothing to write")
    assert ["  unchanged" in line for line in again.splitlines()[2:5]] == [True] * 3
    with celery_anarchon.schedules(reader_app(store_url, namespace, "Europe/Paris")) as s:
        assert {e.name: e.version for e in s.list() if e.source == "store"} == versions

    # a change in RedBeat is an update; one re-enabled there stays paused here (never resumed)
    save(prefix, {**EVERY_KIND[0], "schedule": schedule(120)}, {**EVERY_KIND[2], "enabled": True})
    out = exits(run(store_url, namespace, prefix, "--by", "ops"), 0)
    assert out.rstrip().endswith("imported: 1 updated, 2 unchanged")
    stored = store_entries(store_url, namespace)
    assert stored["every-5m"][0]["schedule"] == {"every": 120}
    assert stored["off"][1] == "came disabled from RedBeat (enabled=False)"


def test_the_table_word_for_word(store_url, namespace, prefix):
    save(prefix, EVERY_KIND[0], EVERY_KIND[1], EVERY_KIND[2], EVERY_KIND[3], EVERY_KIND[6],
         EVERY_KIND[9])
    done = run(store_url, namespace, prefix, "--dry-run")
    assert exits(done, 6) == (
        f"RedBeat {REDIS_URL} (prefix {prefix!r}): 6 entries -> store {store_url} (namespace "
        f"{namespace!r})\n"
        "NAME          TASK            SCHEDULE                               PAUSED  ACTION   NOTE\n"
        "config-entry  cli_app.report  every 60 s                             -       skipped  defined in beat_schedule: runs from there\n"
        "daily-rrule   cli_app.report  every 86400 s                          no      add      rrule DAILY from 2026-01-05T08:30:00+00:00 to 2026-01-14T08:30:00+00:00\n"
        "every-5m      cli_app.report  every 300 s                            no      add      epoch-aligned\n"
        "nightly       cli_app.report  crontab 30 3 * * mon-fri Europe/Paris  no      add\n"
        "off           cli_app.report  every 600 s                            yes     add      came disabled from RedBeat (enabled=False); epoch-aligned\n"
        "rounded       cli_app.report  every 3600 s (relative)                -       refused\n"
        "epoch-aligned: an interval's slots here are the multiples of its period since "
        "1970-01-01 UTC, the same on every host; RedBeat counted each period from the entry's "
        "last run, so the first run here may come up to one period sooner or later than "
        "RedBeat's next one (--keep-phase keeps RedBeat's phase with an anchor: "
        "docs/from-redbeat.md)\n"
        "dry run, nothing written: 4 to add, 1 skipped, 1 refused\n")
    assert done.stderr == (
        "refused rounded: entry 'rounded': its interval of 3600 s has relative=True (rounded "
        "to the wall clock), which has no fixed period across DST; fix: save it in RedBeat with "
        "relative=False (our slots are then the multiples of the period since 1970; "
        "--keep-phase keeps its phase), or add it here with a crontab\n")


def test_paused_imports_every_entry_paused(store_url, namespace, prefix):
    """--paused, for a switch while our beats already run: nothing runs before a resume."""
    save(prefix, EVERY_KIND[0], EVERY_KIND[2])
    exits(run(store_url, namespace, prefix, "--paused"), 0)
    reasons = {name: reason for name, (_, reason) in store_entries(store_url, namespace).items()}
    assert reasons == {"every-5m": ("imported from RedBeat paused: resume it once no RedBeat "
                                    "beat runs (docs/from-redbeat.md)"),
                       "off": "came disabled from RedBeat (enabled=False)"}
    assert "every entry is unchanged" in exits(run(store_url, namespace, prefix), 0)


def test_keep_phase_anchors_an_interval_at_redbeats_last_run(store_url, namespace, prefix):
    last = datetime.datetime.now(UTC).replace(microsecond=0) - datetime.timedelta(minutes=10)
    hourly = dict(name="hourly", task="cli_app.report", schedule=schedule(3600))
    save(prefix, {**hourly, "last_run_at": last})          # RedBeat runs it next at last + 1 h
    anchor = int(last.timestamp()) % 3600
    out = exits(run(store_url, namespace, prefix, "--keep-phase"), 0)
    assert out.splitlines()[2].split()[-6:] == ["add", "phase", "kept:", "anchor", f"{anchor}",
                                                "s"] and "epoch-aligned" not in out
    assert store_entries(store_url, namespace)["hourly"][0]["anarchon"] == {"anchor": anchor}
    app = reader_app(store_url, namespace, "Europe/Paris")
    with celery_anarchon.schedules(app) as s:
        assert testing.next_slots(app, "hourly", 1, store=s.store) == [
            last + datetime.timedelta(hours=1)]
    # RedBeat's next run came 3 s late: its phase moved by that; the phase kept stays
    with redbeat_app(prefix) as rb:
        RedBeatSchedulerEntry.from_key(prefix + "hourly", app=rb).reschedule(
            last + datetime.timedelta(hours=1, seconds=3))
    assert "every entry is unchanged" in exits(run(store_url, namespace, prefix, "--keep-phase"), 0)


def test_redbeat_stores_no_solar_schedule(prefix):
    """RedBeat's encoder has no form for solar: its own save() fails, so no import meets one."""
    with redbeat_app(prefix) as app, pytest.raises(TypeError, match="solar"):
        RedBeatSchedulerEntry(name="dawn", task="t", schedule=solar("sunrise", 48.85, 2.35),
                              app=app).save()


def test_the_redis_and_prefix_default_to_redbeats_own_settings(store_url, namespace, prefix):
    app = Celery("defaults", set_as_current=False)
    app.conf.update(broker_url="redis://broker.example:6379/3")
    assert (import_redbeat.redis_url(app), import_redbeat.key_prefix(app)) == (
        "redis://broker.example:6379/3", "redbeat:")
    app.conf.update(redbeat_redis_url="redis://beat.example:6379/1", redbeat_key_prefix="rb:")
    assert (import_redbeat.redis_url(app), import_redbeat.key_prefix(app)) == (
        "redis://beat.example:6379/1", "rb:")
    # --redis and --key-prefix win; a Redis that cannot be reached: exit 1, the URL masked
    save(prefix, EVERY_KIND[0])
    out = exits(run(store_url, namespace, "other:", "--redis", REDIS_URL, "--key-prefix",
                    prefix, "--dry-run"), 0)
    assert "1 to add" in out
    none = exits(run(store_url, namespace, "other:", "--dry-run"), 0)
    assert none.splitlines()[1:] == ["no entry in RedBeat's sorted set 'other::schedule'; check "
                                     "--redis and --key-prefix",
                                     "dry run, nothing written: no RedBeat entry found"]
    down = run(store_url, namespace, prefix, "--redis", "redis://:secret@127.0.0.1:1/0")
    assert down.returncode == 1 and "redis://:***@127.0.0.1:1/0 cannot be read" in down.stderr
    assert "secret" not in down.stderr + down.stdout


def test_help_names_the_exit_codes():
    done = subprocess.run([sys.executable, "-m", "celery", "anarchon", "import", "redbeat",
                           "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "Exit 0 when every entry was imported, unchanged or skipped; 6 when some were " \
           "refused (the others were written), with --dry-run too when some would be" in text
    assert "--dry-run Show the table of what would be written and the refusals; write " \
           "nothing (exit 6 when something would be refused)." in text


def test_names_equal_once_normalized_are_refused_together_and_a_second_run_changes_nothing(
        store_url, namespace, prefix):
    """'café' (one code point) and 'cafe' + U+0301 are one store entry: importing both would write
    one, refuse the other at the write, then flip between their definitions on every run."""
    save(prefix, dict(name=COMPOSED, task="cli_app.report", schedule=schedule(60)),
         dict(name=DECOMPOSED, task="cli_app.report", schedule=schedule(120)),
         EVERY_KIND[0])
    imports_refuse_both_spellings(lambda *args: run(store_url, namespace, prefix, *args),
                                  store_url, namespace, "every-5m", "RedBeat")


def test_a_dry_run_exits_6_with_the_refusal_the_writes_would_meet(store_url, namespace, prefix):
    """An update whose window leaves out a slot that instances not synced yet may still claim is
    refused by the write (Schedules.update); the dry run finds it too, with the same words."""
    save(prefix, dict(name="x", task="cli_app.report", schedule=schedule(60)))
    exits(run(store_url, namespace, prefix), 0)
    before = store_entries(store_url, namespace)
    tomorrow = datetime.datetime.now(UTC).replace(microsecond=0) + datetime.timedelta(days=1)
    save(prefix, dict(name="x", task="cli_app.report", schedule=rrule("DAILY", dtstart=tomorrow)))
    dry = run(store_url, namespace, prefix, "--dry-run")
    assert exits(dry, 6).rstrip().endswith("dry run, nothing written: 1 refused")
    done = run(store_url, namespace, prefix)
    assert exits(done, 6).rstrip().endswith("imported: 1 refused")
    assert dry.stderr == done.stderr and dry.stderr.startswith(
        "refused x: entry 'x': the new start_at / end_at leaves out its slot ")
    assert store_entries(store_url, namespace) == before
