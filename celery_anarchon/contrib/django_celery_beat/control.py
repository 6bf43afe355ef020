"""The admin's meaning on every host: a row disabled or enabled (an admin action, or any ORM
``save()`` that changes ``enabled``) becomes a pause or a resume of the row's entry in the store,
and "Run selected tasks" one run-now request per row and click (docs/from-django-celery-beat.md,
"The admin").

A pause is checked inside the atomic claim on every instance, so a disabled row is never sent by
an instance that has not read the rows again yet. A row runs only while it is enabled in the
database **and** not paused in the store: each one stops it, and neither one restarts what the
other stopped; the admin and every ``save()`` keep them in step. The Celery app is the
project's own, ``celery.current_app`` (as django-celery-beat's admin finds it: the app that
``proj/__init__.py`` imports, as Django's Celery guide makes it).
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Iterator

from celery_anarchon.errors import ConfigError, UnknownEntry
from celery_anarchon.operate.schedules import Schedules

#: who makes the changes of the saves made now (the admin user of a request: :func:`acting`)
_BY: contextvars.ContextVar[str | None] = contextvars.ContextVar("anarchon_admin_by",
                                                                 default=None)


def admin_by(user) -> str:
    """Who an admin user is in our history: ``"<username> (Django admin)"``."""
    return f"{user.get_username() or 'anonymous'} (Django admin)"


@contextlib.contextmanager
def acting(by: str) -> Iterator[None]:
    """The saves made within record ``by`` as who paused or resumed a row."""
    token = _BY.set(by)
    try:
        yield
    finally:
        _BY.reset(token)


def celery_app():
    """The project's Celery app when it runs our Scheduler on the rows, else ``None``.

    The app is ``celery.current_app``, the one ``proj/__init__.py`` imports (as
    django-celery-beat's admin takes it), with its ``anarchon_*`` settings; it runs our
    Scheduler when its ``beat_scheduler`` (``CELERY_BEAT_SCHEDULER`` in the settings) names
    :class:`~.scheduler.Scheduler` or a subclass. Otherwise (django-celery-beat's own scheduler
    still runs, as in the first step of a rolling switch) the admin and the saves act as
    django-celery-beat's do, and nothing is written to a store.
    """
    from celery import current_app
    from celery.utils.imports import symbol_by_name

    from celery_anarchon.contrib.django_celery_beat.scheduler import Scheduler
    app = current_app._get_current_object()
    try:
        chosen = symbol_by_name(app.conf.beat_scheduler)
    except (ImportError, AttributeError, ValueError):
        return None
    return app if isinstance(chosen, type) and issubclass(chosen, Scheduler) else None


class RowSchedules(Schedules):
    """:class:`~celery_anarchon.operate.schedules.Schedules` that knows the ``PeriodicTask``
    rows as entries too (after ``beat_schedule`` and the store's entries, as the Scheduler on
    the rows reads them): a row can be paused, resumed and run now by its name.

    :raises ConfigError: as :class:`Schedules`; ``run_now`` of a row that is not scheduled
        (disabled, or a one-off that ran): enable it first.
    """

    #: run_now: only a scheduled row is known (a run of another would never be claimed)
    _for_run = False
    #: pause: a row is known even when its entry cannot be built (it runs nowhere either)
    _lenient = False

    def _known(self, name: str, snapshot):
        try:
            return super()._known(name, snapshot)
        except UnknownEntry:
            from django_celery_beat.models import PeriodicTask

            from celery_anarchon.django_rows.rows import row_entry, where
            row = PeriodicTask.objects.filter(name=name).select_related(
                "interval", "crontab", "solar", "clocked").first()
            if row is None:
                raise
        try:
            entry = row_entry(row, app=self.app, scheduled_only=self._for_run)
        except ConfigError:
            if self._lenient:
                return None             # pause only asks whether it exists
            raise
        if entry is None:
            raise ConfigError(f"{where(row)} is not scheduled (disabled, or a one-off that ran "
                              "since its last save): no instance would claim a run of it; fix: "
                              "enable it first")
        return entry

    def pause(self, name: str, reason: str = "", *, by: str | None = None):
        """:meth:`Schedules.pause`, a row's entry too (one our rules refuse as well)."""
        self._lenient = True
        try:
            return super().pause(name, reason, by=by)
        finally:
            self._lenient = False

    def run_now(self, name: str, request_id: str | None = None, *, by: str | None = None):
        """:meth:`Schedules.run_now`, a row's entry too (a row that is not scheduled is
        refused: no instance runs it)."""
        self._for_run = True
        try:
            return super().run_now(name, request_id, by=by)
        finally:
            self._for_run = False


def pause_rows(app, names: Iterable[str], *, by: str | None, reason: str) -> list[str]:
    """Pause the entries of the rows ``names`` in ``app``'s store (before their ``enabled`` is
    written False).

    :returns: the names paused.
    :raises StoreError: the store cannot be reached: nothing after the first failing name is
        paused (the caller leaves the rows as they were).
    """
    names = list(names)
    with RowSchedules(app, by=by) as s:
        for name in names:
            s.pause(name, reason=reason)
    return names


def resume_rows(app, names: Iterable[str], *, by: str | None) -> list[str]:
    """Lift the pauses of the rows ``names`` in ``app``'s store (once their ``enabled`` is
    written True); a row with no pause is left as it is.

    :returns: the names resumed.
    """
    with RowSchedules(app, by=by) as s:
        held = {n for n, e in s._snapshot().entries.items() if e.pause is not None}
        resumed = [name for name in names if name in held]
        for name in resumed:
            s.resume(name)
    return resumed


def run_rows(app, names: Iterable[str], *, click: str, by: str | None) -> list:
    """One run-now request per row of ``names``, its id ``"admin:<click>:<name>"``: the same
    click submitted twice is one request (and one run) per row.

    :returns: the requests (``created`` False for a click seen before).
    :raises ConfigError: a row is not scheduled (the rows before it are requested).
    """
    with RowSchedules(app, by=by) as s:
        return [s.run_now(name, request_id=f"admin:{click}:{name}") for name in names]


# -- save() of a row: the signals (connected by the app's ready()) ------------------------------
REASON = "disabled in django-celery-beat"


def before_save(sender, instance, raw: bool = False, **_kwargs) -> None:
    """``pre_save`` of a ``PeriodicTask``: a row whose ``enabled`` goes from True to False is
    paused now, before the row is written (a store error stops the save: the row stays as it
    was); one going from False to True is resumed once the write is committed. Nothing is done
    while the project's app does not run our Scheduler (:func:`celery_app`)."""
    if raw or instance.pk is None:
        return
    app = celery_app()
    if app is None:
        return
    from django.db import transaction
    before = type(instance).objects.filter(pk=instance.pk).values_list("enabled", "name").first()
    if before is None or before[0] == instance.enabled:
        return
    by = _BY.get()
    was_enabled, old_name = before
    if not instance.enabled and was_enabled:
        pause_rows(app, [old_name], by=by, reason=REASON)
    elif instance.enabled and not was_enabled:
        name = instance.name
        transaction.on_commit(lambda: resume_rows(app, [name], by=by))


def connect() -> None:
    """Connect :func:`before_save` to ``PeriodicTask``'s ``pre_save`` (once)."""
    from django.db.models.signals import pre_save
    from django_celery_beat.models import PeriodicTask
    pre_save.connect(before_save, sender=PeriodicTask, dispatch_uid="anarchon_row_enabled")
