"""``proj/celery.py`` of the "With Django" page (docs/with-django.md), as the page gives it, on
the settings module djproj_settings.py."""
from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djproj_settings")

app = Celery("proj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
