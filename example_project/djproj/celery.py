"""The Celery app of djproj, as Django's Celery guide writes it, plus the one line that runs
django-celery-beat's rows on every host: ``celery -A djproj beat`` next to every
``celery -A djproj worker``."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djproj.settings")

app = Celery("djproj")
app.config_from_object("django.conf:settings", namespace="CELERY")
# the only line a django-celery-beat project changes (or CELERY_BEAT_SCHEDULER in settings.py)
app.conf.beat_scheduler = "celery_anarchon.contrib.django_celery_beat:Scheduler"
app.autodiscover_tasks()
