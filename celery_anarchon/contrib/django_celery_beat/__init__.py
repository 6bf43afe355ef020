"""celery_anarchon on django-celery-beat's models: keep django-celery-beat installed and in
``INSTALLED_APPS``, keep editing the periodic tasks in the Django admin, and run on every host::

    CELERY_BEAT_SCHEDULER = "celery_anarchon.contrib.django_celery_beat:Scheduler"
    # or: celery -A proj beat -S celery_anarchon.contrib.django_celery_beat:Scheduler

Each run of each ``PeriodicTask`` row is claimed once in the store (docs/from-django-celery-beat.md:
what each model means, what is not supported yet, a rolling switch). Needs
``pip install celery-anarchon[django]``.

In ``INSTALLED_APPS`` (``"celery_anarchon.contrib.django_celery_beat"``, beside
``"django_celery_beat"``) it is also a Django app whose admin's Disable / Enable pause and resume
a row in the store and whose "Run selected tasks" is one run-now per row and click
(:mod:`.admin`, :mod:`.control`).
"""
from celery_anarchon.contrib.django_celery_beat.scheduler import RowPlans, Scheduler

__all__ = ["Scheduler", "RowPlans"]


def keep_phase(rows=None) -> list[str]:
    """Anchor each interval row at its last run, so it keeps django-celery-beat's phase
    (:func:`celery_anarchon.django_rows.rows.keep_phase`; call it once Django is
    set up, e.g. in ``manage.py shell``).

    :returns: the names of the rows given an anchor.
    """
    from celery_anarchon.django_rows.rows import keep_phase as keep
    return keep(rows)


__all__.append("keep_phase")
