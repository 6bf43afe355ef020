"""The django-celery-beat test project in the test process (tests/contrib/): Django configured
once per process with djbeat_settings (apps/) on a SQLite file of a temporary folder when this
module is imported (the test modules import django-celery-beat's models), migrated before the
first test that uses it; the rows the tests write there are read by the beats of the same
database. The test modules import the fixtures :func:`django_db` and :func:`rows` from here."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import POSTGRES_URL, require_server
from paths import APPS

sys.path.insert(0, str(APPS))

import djbeat_settings  # noqa: E402  (tests/support/apps)


def configure_django(db: str) -> str:
    """Configure Django on the database ``db`` (a SQLite path or a PostgreSQL URL); a second
    call returns the database of the first (Django is configured once a process).

    :returns: the database the process's Django uses.
    """
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(**djbeat_settings.settings_for({"ANARCHON_DJ_DB": db}))
        django.setup()
    default = settings.DATABASES["default"]
    return db if default["ENGINE"].endswith("postgresql") else str(default["NAME"])


def migrate() -> None:
    """Run django-celery-beat's (and the admin's) migrations on the configured database."""
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def clear_rows() -> None:
    """Delete every periodic task and schedule row (a test starts from none)."""
    from django_celery_beat import models

    for model in (models.PeriodicTask, models.IntervalSchedule, models.CrontabSchedule,
                  models.SolarSchedule, models.ClockedSchedule):
        model.objects.all().delete()



#: ``ANARCHON_TEST_DJANGO_DB=postgresql``: the project's database is the PostgreSQL of the
#: tests (ANARCHON_TEST_POSTGRES_URL) instead of a SQLite file (tests/contrib/test_django_postgres.py
#: runs the other tests of tests/contrib so)
ON_POSTGRES = os.environ.get("ANARCHON_TEST_DJANGO_DB") == "postgresql"
_FOLDER = tempfile.mkdtemp(prefix="anarchon-djbeat-")
#: the database of this process's Django (the beats of tests/contrib read it too)
DB = configure_django(POSTGRES_URL if ON_POSTGRES else str(Path(_FOLDER) / "djbeat.sqlite3"))


@pytest.fixture(scope="session")
def django_db() -> str:
    """The database of this process's Django, migrated; a SQLite file is removed at the end of
    the session."""
    if ON_POSTGRES:
        require_server(POSTGRES_URL, "PostgreSQL (the Django project's database)")
    migrate()
    yield DB
    shutil.rmtree(_FOLDER, ignore_errors=True)


@pytest.fixture
def rows(django_db) -> str:
    """No periodic task or schedule row at the start of the test; the database's path."""
    clear_rows()
    yield django_db
    clear_rows()
