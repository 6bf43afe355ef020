"""The Celery app of the django-celery-beat test project (tests/contrib/): Django's settings
(djbeat_settings.py) and schedules_app's task and variables (its broker, store, namespace,
queue, executions file, sync interval and max_late), with our Scheduler on django-celery-beat's
rows. ``celery -A djbeat_app beat`` and ``worker`` run it; ``ANARCHON_DJ_DB`` names the
database the test process writes the rows to.
"""
from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djbeat_settings")

from schedules_app import make_app  # noqa: E402

SCHEDULER = "celery_anarchon.contrib.django_celery_beat:Scheduler"

app = make_app(os.environ)
app.conf.beat_scheduler = SCHEDULER
