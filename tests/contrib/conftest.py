"""The django-celery-beat test project's database, one per test process (Django is configured
once a process): a SQLite file, migrated (tests/support/django_project.py)."""
from __future__ import annotations

import pytest

from django_project import clear_rows, setup_django


@pytest.fixture(scope="session")
def django_db(tmp_path_factory) -> str:
    """The database of this process's Django (a migrated SQLite file)."""
    return setup_django(str(tmp_path_factory.getbasetemp() / "djbeat.sqlite3"))


@pytest.fixture
def rows(django_db) -> str:
    """No periodic task or schedule row at the start of the test; the database's path."""
    clear_rows()
    yield django_db
    clear_rows()
