"""django-celery-beat's ``PeriodicTask`` rows as entries, for both who read them: the beat's
Scheduler on the rows (:mod:`celery_anarchon.contrib.django_celery_beat`) and ``celery anarchon
import django-celery-beat`` (:mod:`celery_anarchon.operate.import_django`). This module only sets
Django up (:func:`ready`); :mod:`celery_anarchon.django_rows.rows`, which imports
django-celery-beat's models, maps a row onto an entry once it is.
"""
from __future__ import annotations

from celery_anarchon.errors import ConfigError


def ready(reader: str) -> None:
    """Django's apps, set up once (``celery beat`` with Celery's Django fix-up has done it; a
    process that reads the rows first has not), with django-celery-beat installed.

    :param reader: what reads the rows, for the error (the Scheduler's path, a command).
    :raises ConfigError: Django is not configured (no ``DJANGO_SETTINGS_MODULE``), or
        ``django_celery_beat`` is not in ``INSTALLED_APPS``: naming what is missing and the fix.
    """
    from django.apps import apps
    from django.core.exceptions import ImproperlyConfigured
    if not apps.ready:
        import django
        try:
            django.setup()
        except (ImproperlyConfigured, ImportError) as exc:
            raise ConfigError(
                f"{reader} reads django-celery-beat's rows through Django, which is not "
                f"set up in this process ({type(exc).__name__}: {exc}); fix: set "
                "DJANGO_SETTINGS_MODULE before the Celery app is created (os.environ.setdefault("
                "'DJANGO_SETTINGS_MODULE', 'proj.settings') in proj/celery.py, as Django's "
                "Celery guide does)") from None
    if not apps.is_installed("django_celery_beat"):
        raise ConfigError(f"{reader} reads django-celery-beat's rows, but "
                          "'django_celery_beat' is not in INSTALLED_APPS; fix: add it (and run "
                          "python manage.py migrate)")
