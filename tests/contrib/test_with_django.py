"""The "With Django" page (docs/with-django.md) on a real Django settings module
(tests/support/apps/djproj_settings.py, read by djproj_celery.py as the page's ``proj/celery.py``):
Celery's and our settings under the ``CELERY_`` namespace, a namespaced typo refused, Django's
``TIME_ZONE`` as the app's zone, and the log's times in the zone of the log's own timestamps.

Each test runs one Python process (Django is configured once a process, from
``DJANGO_SETTINGS_MODULE``, and sets the process's ``TZ``): about 1 s each."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import datetime
from zoneinfo import ZoneInfo

from paths import APPS
from stores_support import wait_until

#: what the process prints: our settings read from Django's, Celery's, and one instant (2026-07-01
#: 12:00 UTC, summer time in Paris) as our log lines give it and as the log's own timestamp does
_PROBE = """
import json, logging, sys, time
from djproj_celery import app
from celery_anarchon._util import log_time
from celery_anarchon.errors import ConfigError
from celery_anarchon.settings import Settings
if sys.argv[1] == "gmtime":
    logging.Formatter.converter = time.gmtime
ms = 1782907200000
out = {"app_timezone": str(app.timezone), "scheduler": app.conf.beat_scheduler,
       "schedule": sorted(app.conf.beat_schedule)}
# Django's settings are read now: the process's TZ is TIME_ZONE, as in a beat that started
stamp = logging.Formatter("%(asctime)s").format(logging.makeLogRecord({"created": ms / 1000}))
out.update(log_time=log_time(ms), stamp=stamp)
try:
    s = Settings.from_app(app)
except ConfigError as exc:
    out["error"] = str(exc)
else:
    out.update(store_url=s.store_url, jitter_s=s.jitter_s, max_late_s=s.max_late_s,
               store_options=s.store_options, namespace=s.namespace)
print(json.dumps(out))
"""


def _env(extra: dict | None = None, **more: str) -> dict:
    """The environment of a process on djproj_settings plus ``extra`` (no ``TZ`` of its own)."""
    path = os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "ANARCHON_DJ_EXTRA": json.dumps(extra or {}), **more}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.pop("TZ", None)
    return env


def _probe(extra: dict | None = None, converter: str = "localtime") -> dict:
    """What a process on djproj_settings (plus ``extra``) reads and prints (:data:`_PROBE`)."""
    done = subprocess.run([sys.executable, "-c", _PROBE, converter], env=_env(extra), cwd=APPS,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (done.stdout, done.stderr)
    return json.loads(done.stdout)


def test_namespaced_settings_are_read_from_django():
    """``CELERY_ANARCHON_*`` and ``CELERY_BEAT_*`` of Django's settings are our settings and
    Celery's; with no ``CELERY_TIMEZONE``, the app's zone is Django's ``TIME_ZONE``."""
    out = _probe()
    assert out["scheduler"] == "celery_anarchon:Scheduler"
    assert out["schedule"] == ["nightly"]
    assert out["app_timezone"] == "Europe/Paris"
    assert out["store_url"] == "sqlite:///:memory:"
    assert out["jitter_s"] == 1.5 and out["max_late_s"] == 45
    assert out["store_options"] == {"memory": 7200}
    assert out["namespace"] == "proj"


def test_celery_timezone_wins_over_django_time_zone():
    """``CELERY_TIMEZONE`` set: the app's zone (and every crontab's without a zone of its own)."""
    assert _probe({"CELERY_TIMEZONE": "America/New_York"})["app_timezone"] == "America/New_York"


def test_namespaced_typo_refused():
    """A misspelt ``CELERY_ANARCHON_*`` setting stops the beat, naming the key as written and the
    spelling Celery reads, as an unprefixed typo does."""
    out = _probe({"CELERY_ANARCHON_JITER": 3})
    assert "unknown setting 'CELERY_ANARCHON_JITER'" in out["error"], out
    assert "did you mean 'CELERY_ANARCHON_JITTER'?" in out["error"], out


def test_setting_without_the_namespace_refused():
    """``ANARCHON_JITTER`` without ``CELERY_`` is not read under the namespace: refused, with the
    namespaced name to use."""
    out = _probe({"ANARCHON_JITTER": 3})
    assert "unknown setting 'ANARCHON_JITTER'" in out["error"], out
    assert "did you mean 'CELERY_ANARCHON_JITTER'?" in out["error"], out


def test_log_times_in_the_zone_of_the_log_stamps():
    """With Django's ``TIME_ZONE``, the log's own timestamps are Paris time (Django sets ``TZ``);
    our lines give an instant in the same zone, with its offset."""
    out = _probe()
    assert out["stamp"].startswith("2026-07-01 14:00:00")
    assert out["log_time"] == "2026-07-01T14:00:00.000+02:00"


def test_log_times_follow_a_utc_log_stamp():
    """A log configured for UTC stamps (``logging.Formatter.converter = time.gmtime``): our
    lines give UTC, +00:00."""
    out = _probe(converter="gmtime")
    assert out["stamp"].startswith("2026-07-01 12:00:00")
    assert out["log_time"] == "2026-07-01T12:00:00.000+00:00"


#: a beat log line that gives a slot: its stamp (``%(asctime)s``) and the slot
_SLOT_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+: .* slot (\S+)", re.M)


def test_beat_log_in_one_zone(tmp_path):
    """A real ``celery -A proj beat`` on djproj_settings (``TIME_ZONE = "Europe/Paris"``): the
    stamp of the first line that gives a slot (at debug level: a new store refuses its first
    slots) and that slot are in one zone, Paris, with its offset (about 1.5 s: the beat's start and
    its first slot, every 2 s). Before the rule the slot read 10:15:04+00:00 beside a stamp of
    11:15:05."""
    extra = {"CELERY_ANARCHON_JITTER": None,
             "CELERY_BEAT_SCHEDULE": {"tick": {"task": "proj.tick", "schedule": 2.0}}}
    env = _env(extra, ANARCHON_DJ_STORE=f"sqlite:///{tmp_path / 'store.sqlite3'}")
    log = tmp_path / "beat.log"
    with open(log, "w") as out:
        beat = subprocess.Popen([sys.executable, "-m", "celery", "-A", "djproj_celery", "beat",
                                 "-l", "debug", "-s", str(tmp_path / "shelve")],
                                env=env, cwd=APPS, stdout=out, stderr=subprocess.STDOUT)
    try:
        # start-up, then one 2 s interval: 30 s covers a slow start on a busy host
        found = wait_until(lambda: _SLOT_LINE.search(log.read_text()), 30, "a line with a slot")
    finally:
        beat.terminate()
        beat.wait(timeout=30)
    stamp = datetime.fromisoformat(found.group(1)).replace(tzinfo=ZoneInfo("Europe/Paris"))
    slot = datetime.fromisoformat(found.group(2))
    assert slot.utcoffset() == stamp.utcoffset(), found.group(0)   # one zone: Paris
    assert abs((stamp - slot).total_seconds()) < 30, found.group(0)


def test_the_page_names_every_setting_under_the_namespace():
    """docs/with-django.md's table gives every row of the settings table, ``CELERY_`` + upper case,
    and no other ``CELERY_ANARCHON_*`` name."""
    from celery_anarchon.settings import SETTINGS
    from paths import DOCS

    text = (DOCS / "with-django.md").read_text()
    table = text[text.index("| Celery setting |"):text.index("A misspelt name")]
    assert sorted(set(re.findall(r"CELERY_ANARCHON_[A-Z_]+", table))) == sorted(
        f"CELERY_{name.upper()}" for name in SETTINGS)
