"""celery_anarchon: a Celery beat scheduler that runs on every host.

Every instance computes the same slots from the same ``beat_schedule``, waits a random jitter,
and claims each run in a shared store with one atomic operation: exactly one instance sends it.

Public names: :class:`Scheduler`, :class:`ConfigError`, :func:`scheduled_at`, :func:`cron`,
:func:`install`, :func:`current_lease`, :class:`LeaseLost`, :func:`schedules` (change the schedule
at run time: add, update, remove, pause, resume, run now).
"""
from celery_anarchon._util import VERSION as __version__  # the installed distribution's
from celery_anarchon.errors import ConfigError, LeaseLost, StoreError, StoreUnavailable
from celery_anarchon.messages import scheduled_at

__all__ = ["Scheduler", "ConfigError", "LeaseLost", "StoreError", "StoreUnavailable",
           "scheduled_at", "cron", "install", "current_lease", "schedules", "__version__"]


def __getattr__(name):
    # imported on first use: `import celery_anarchon` stays light for worker processes
    if name == "Scheduler":
        from celery_anarchon.beat.scheduler import Scheduler
        return Scheduler
    if name == "cron":
        from celery_anarchon.schedule.slots import cron
        return cron
    if name == "schedules":
        from celery_anarchon.operate.schedules import schedules
        return schedules
    if name in ("install", "current_lease"):
        from celery_anarchon.worker import leases
        return getattr(leases, name)
    raise AttributeError(f"module 'celery_anarchon' has no attribute {name!r}")
