"""The django-celery-beat tests of tests/contrib with the Django project's database on PostgreSQL
(the tests' server, ANARCHON_TEST_POSTGRES_URL): migrated with ``migrate``, its rows read by
three beats. Django is configured once a process, so they run in a pytest of their own."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import POSTGRES_URL, require_server

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TESTS = ["test_django_rows.py", "test_django_cluster.py"]


def test_the_rows_and_the_three_beats_on_postgresql():
    require_server(POSTGRES_URL, "PostgreSQL (the Django project's database)")
    # this process's servers (an xdist worker's own, in os.environ), not a worker of its own
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(ANARCHON_TEST_DJANGO_DB="postgresql", ANARCHON_TEST_POSTGRES_URL=POSTGRES_URL)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "0", "-q", "-p", "no:randomly", "-p",
         "no:cacheprovider", *(str(HERE / name) for name in TESTS)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    tail = done.stdout[-4000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    assert " passed" in done.stdout and "skipped" not in done.stdout, tail
