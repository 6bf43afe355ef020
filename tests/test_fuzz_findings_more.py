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
