"""The django-celery-beat test project in this process: Django configured when this folder is
collected (its models are imported by the test modules), on a SQLite file of a temporary folder
migrated before the first test that uses it (tests/support/django_project.py)."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from django_project import clear_rows, configure_django, migrate

_FOLDER = tempfile.mkdtemp(prefix="anarchon-djbeat-")
#: the SQLite file of this process's Django (the beats of tests/contrib read it too)
DB = configure_django(str(Path(_FOLDER) / "djbeat.sqlite3"))


@pytest.fixture(scope="session")
def django_db() -> str:
    """The database of this process's Django, migrated; removed at the end of the session."""
    migrate()
    yield DB
    shutil.rmtree(_FOLDER, ignore_errors=True)


@pytest.fixture
def rows(django_db) -> str:
    """No periodic task or schedule row at the start of the test; the database's path."""
    clear_rows()
    yield django_db
    clear_rows()
