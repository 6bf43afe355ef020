"""A tiny Django project whose periodic tasks are django-celery-beat's ``PeriodicTask`` rows, run
by celery_anarchon's Scheduler on every host (``make demo-django``: example_project/demo_django.py).
As Django's Celery guide does, the Celery app is loaded with Django."""
from djproj.celery import app as celery_app

__all__ = ["celery_app"]
