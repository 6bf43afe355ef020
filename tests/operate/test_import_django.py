"""``celery -A proj anarchon import django-celery-beat``, against rows written through the ORM in
a real migrated SQLite Django project (tests/support/django_project.py), the command run as a
real subprocess of tests/support/apps/djimport_app.py (Django set up from its
DJANGO_SETTINGS_MODULE; our store SQLite): every schedule model, the dry run, the writes read back
through the schedules API, disabled -> paused, refusals that name the row, its id and the fix
while the others are written, and the second run that writes nothing."""
from __future__ import annotations

import datetime
import os
import subprocess
import sys

import pytest
from django_project import django_db, rows  # noqa: F401  (fixtures; Django configured)
from django_celery_beat.models import (
    ClockedSchedule, CrontabSchedule, IntervalSchedule, PeriodicTask, SolarSchedule,
)

import celery_anarchon
from celery_anarchon import testing

from operate_support import (
    COMPOSED, DECOMPOSED, exits, imports_refuse_both_spellings, reader_app, store_entries,
)
from paths import APPS

UTC = datetime.timezone.utc
TASK = "cli_app.report"
#: the clocked row's instant (whole milliseconds: a slot is one)
AT = datetime.datetime(2027, 1, 1, 12, 0, 0, 250_000, tzinfo=UTC)


@pytest.fixture
def store_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'store.sqlite3'}"


def run(db: str, store_url: str, namespace: str, *args: str,
        app: str = "djimport_app") -> subprocess.CompletedProcess:
    """``celery -A <app> anarchon import django-celery-beat <args>`` on the database ``db``."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(PYTHONPATH=os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")]),
               ANARCHON_DJ_DB=db, ANARCHON_CLI_STORE=store_url, ANARCHON_CLI_NAMESPACE=namespace)
    return subprocess.run([sys.executable, "-m", "celery", "-A", app, "anarchon", "import",
                           "django-celery-beat", *args],
                          env=env, capture_output=True, text=True, timeout=60, cwd=APPS)


def every(n: int) -> IntervalSchedule:
    return IntervalSchedule.objects.create(every=n, period="seconds")


def write_every_model() -> None:
    """One row of every schedule model, a disabled one, and the rows our rules refuse."""
    PeriodicTask.objects.create(
        name="every-5m", task=TASK, interval=every(300), args='[1]', kwargs='{"full": true}',
        queue="reports", priority=3, expire_seconds=30,
        headers='{"trace": "x", "anarchon": {"jitter": 1, "anchor": 30}}')
    PeriodicTask.objects.create(
        name="nightly", task=TASK, expires=datetime.datetime(2030, 1, 1, tzinfo=UTC),
        crontab=CrontabSchedule.objects.create(minute="30", hour="3", day_of_week="1-5",
                                               timezone="Europe/Paris"))
    PeriodicTask.objects.create(
        name="dawn", task=TASK, solar=SolarSchedule.objects.create(
            event="sunrise", latitude=48.85, longitude=2.35))
    PeriodicTask.objects.create(name="once", task=TASK, one_off=True,
                                clocked=ClockedSchedule.objects.create(clocked_time=AT))
    PeriodicTask.objects.create(name="off", task=TASK, interval=every(600), enabled=False)
    PeriodicTask.objects.create(name="config-entry", task=TASK, interval=every(60))
    PeriodicTask.objects.create(name="bad-kwargs", task=TASK, interval=every(60), kwargs="[1]")
    PeriodicTask.objects.create(name="too-wide-step", task=TASK,
                                crontab=CrontabSchedule.objects.create(minute="*/120"))


def test_every_model_is_imported_or_refused_naming_the_row(rows, store_url, namespace):
    write_every_model()
    bad = PeriodicTask.objects.get(name="bad-kwargs").pk

    dry = exits(run(rows, store_url, namespace, "--dry-run"), 6)
    assert dry.rstrip().endswith("dry run, nothing written: 5 to add, 1 skipped, 2 refused")
    assert store_entries(store_url, namespace) == {}           # the dry run wrote nothing

    done = run(rows, store_url, namespace)
    assert exits(done, 6).rstrip().endswith("imported: 5 added, 1 skipped, 2 refused")
    refused = dict(line.split(": ", 1) for line in done.stderr.splitlines())
    assert set(refused) == {"refused bad-kwargs", "refused too-wide-step"}
    assert refused["refused bad-kwargs"] == (
        f"django-celery-beat PeriodicTask 'bad-kwargs' (id {bad}): kwargs '[1]' is not a JSON "
        'dict; fix: give one in the admin, e.g. {"full": true}')
    assert refused["refused too-wide-step"].startswith(
        "entry 'too-wide-step': crontab: minute field '*/120': the step 120 is larger")

    stored = store_entries(store_url, namespace)
    assert set(stored) == {"every-5m", "nightly", "dawn", "once", "off"}
    assert stored["every-5m"] == ({
        "task": TASK, "schedule": {"every": 300}, "args": [1], "kwargs": {"full": True},
        "options": {"queue": "reports", "priority": 3, "expires": 30,
                    "headers": {"trace": "x", "periodic_task_name": "every-5m"}},
        "anarchon": {"jitter": 1, "anchor": 30}}, None)
    nightly = stored["nightly"][0]
    assert nightly["schedule"] == {"crontab": {"minute": "30", "hour": "3", "day_of_week": "1-5"},
                                   "timezone": "Europe/Paris"}
    assert nightly["anarchon"] == {"end_at": "2030-01-01T00:00:00+00:00"}
    assert nightly["options"]["expires"] == "2030-01-01T00:00:00+00:00"
    assert stored["dawn"][0]["schedule"] == {"solar": "sunrise", "lat": 48.85, "lon": 2.35}
    assert stored["off"] == ({"task": TASK, "schedule": {"every": 600}, "args": [], "kwargs": {},
                              "options": {"headers": {"periodic_task_name": "off"}}},
                             "came disabled from django-celery-beat (enabled=False)")
    # the clocked row: one slot, its instant
    app = reader_app(store_url, namespace)
    with celery_anarchon.schedules(app) as s:
        slots = testing.next_slots(app, "once", 3, store=s.store,
                                   after=AT - datetime.timedelta(days=3))
    assert slots == [AT]

    again = run(rows, store_url, namespace)
    assert exits(again, 6).rstrip().endswith("imported: 5 unchanged, 1 skipped, 2 refused")
    assert store_entries(store_url, namespace) == stored


def test_an_edited_row_is_an_update_and_a_second_run_writes_nothing(rows, store_url, namespace):
    PeriodicTask.objects.create(name="ten", task=TASK, interval=every(10))
    PeriodicTask.objects.create(name="off", task=TASK, interval=every(20), enabled=False)
    exits(run(rows, store_url, namespace, "--by", "ops"), 0)
    with celery_anarchon.schedules(reader_app(store_url, namespace)) as s:
        versions = {e.name: e.version for e in s.list() if e.source == "store"}
    again = exits(run(rows, store_url, namespace, "--by", "ops"), 0)
    assert again.rstrip().endswith("imported: every entry is unchanged, nothing to write")
    with celery_anarchon.schedules(reader_app(store_url, namespace)) as s:
        assert {e.name: e.version for e in s.list() if e.source == "store"} == versions

    # edited in the admin: an update; enabled there again: stays paused here (never resumed)
    row = PeriodicTask.objects.get(name="ten")
    row.interval = every(30)
    row.save()
    PeriodicTask.objects.filter(name="off").update(enabled=True)
    out = exits(run(rows, store_url, namespace, "--by", "ops"), 0)
    assert out.rstrip().endswith("imported: 1 updated, 1 unchanged")
    stored = store_entries(store_url, namespace)
    assert stored["ten"][0]["schedule"] == {"every": 30}
    assert stored["off"][1] == "came disabled from django-celery-beat (enabled=False)"


def test_without_django_settings_it_says_how_to_set_them(tmp_path, store_url, namespace):
    done = run(str(tmp_path / "none.sqlite3"), store_url, namespace, "--dry-run", app="cli_app")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "DJANGO_SETTINGS_MODULE" in done.stderr and "Traceback" not in done.stderr


def test_rows_whose_names_are_equal_once_normalized_are_refused_together(
        rows, store_url, namespace):
    """Two rows 'café' (one code point) and 'cafe' + U+0301: one store entry, so neither is
    imported (else each run would flip it between the two rows' definitions)."""
    PeriodicTask.objects.create(name=COMPOSED, task=TASK, interval=every(60))
    PeriodicTask.objects.create(name=DECOMPOSED, task=TASK, interval=every(120))
    PeriodicTask.objects.create(name="ten", task=TASK, interval=every(10))
    imports_refuse_both_spellings(lambda *args: run(rows, store_url, namespace, *args),
                                  store_url, namespace, "ten", "django-celery-beat")


def test_a_refused_catch_up_window_says_the_row_keeps_it_in_its_headers(rows, store_url,
                                                                        namespace):
    """The rules name options['anarchon'] (a beat_schedule entry's place of our settings); a
    row keeps them in headers["anarchon"], and the refusal says so."""
    PeriodicTask.objects.create(
        name="below", task=TASK, interval=every(10),
        headers='{"anarchon": {"catch_up": "all", "catch_up_window": -100}}')
    PeriodicTask.objects.create(      # Python's json reads NaN, as the rows' reader does
        name="nan", task=TASK, interval=every(10),
        headers='{"anarchon": {"catch_up": "all", "catch_up_window": NaN}}')
    done = run(rows, store_url, namespace)
    assert exits(done, 6).rstrip().endswith("imported: 2 refused")
    refused = dict(line.split(": ", 1) for line in done.stderr.splitlines())
    where = ('(on this row, options["anarchon"] is the "anarchon" object of its headers: edit '
             'the row in the admin, e.g. headers {"anarchon": {"jitter": 1}})')
    assert refused["refused below"] == (
        "entry 'below': options['anarchon']['catch_up_window']: -100 must be a finite number of "
        "seconds >= 0; fix: give seconds from 0 to 3155760000 s (100 years), as an int, a float "
        f"or a datetime.timedelta {where}")
    assert refused["refused nan"] == (
        "entry 'nan': key 'anarchon.catch_up_window' = NaN: not a finite number (JSON has no NaN "
        f"or infinity); fix: give a finite number of seconds, e.g. 60 {where}")
    assert store_entries(store_url, namespace) == {}


def test_help_says_a_dry_run_exits_6_when_a_row_would_be_refused():
    done = subprocess.run([sys.executable, "-m", "celery", "anarchon", "import",
                           "django-celery-beat", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "6 when some were refused (the others were written), with --dry-run too when some " \
           "would be" in text
    assert "(exit 6 when something would be refused)" in text
