"""The Django settings module of the "With Django" page (docs/with-django.md): Celery's and our
settings under the ``CELERY_`` namespace, ``TIME_ZONE`` away from UTC. Read through
``DJANGO_SETTINGS_MODULE`` by djproj_celery.py; ``ANARCHON_DJ_EXTRA`` (a JSON object) adds or
replaces settings, ``ANARCHON_DJ_STORE`` is the store's URL.
"""
from __future__ import annotations

import json
import os

SECRET_KEY = "tests-only"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
USE_TZ = True
TIME_ZONE = "Europe/Paris"

CELERY_BROKER_URL = "memory://"
CELERY_BEAT_SCHEDULER = "celery_anarchon:Scheduler"
CELERY_ANARCHON_STORE_URL = os.environ.get("ANARCHON_DJ_STORE", "sqlite:///:memory:")
CELERY_ANARCHON_JITTER = 1.5
CELERY_ANARCHON_MAX_LATE = 45
CELERY_ANARCHON_STORE_OPTIONS = {"memory": 7200}
CELERY_BEAT_SCHEDULE = {"nightly": {"task": "proj.nightly", "schedule": 3600.0}}

globals().update(json.loads(os.environ.get("ANARCHON_DJ_EXTRA", "{}")))
