"""django-celery-beat's ``PeriodicTask`` rows as store entries: ``celery -A proj anarchon import
django-celery-beat`` (docs/from-django-celery-beat.md, "Leaving the admin").

Django is set up from the project's settings (``DJANGO_SETTINGS_MODULE``, which the app module
sets, as Django's Celery guide does). Every row, enabled or not, is mapped as our Scheduler on
the rows reads it (:func:`celery_anarchon.django_rows.rows.row_entry`: the same models, fields
and refusals), then written as data (:func:`celery_anarchon.schedule.as_data.from_entry`):

=====================================  ========================================================
the row                                store entry
=====================================  ========================================================
``IntervalSchedule``                   ``{"every": s}``, epoch-aligned (``headers["anarchon"]``'s
                                       ``anchor`` kept: ``keep_phase()`` writes it)
``CrontabSchedule``, ``SolarSchedule``  ``{"crontab": ..., "timezone": its zone}``, ``{"solar": ...}``
``ClockedSchedule``, ``one_off``       its one run (the clocked instant; a one-off's first slot
                                       after its last save or ``start_time``): ``{"every": 1 day}``
                                       anchored at it, ``start_at`` = it, ``end_at`` = it + 1 s
``start_time``, ``expires``            ``start_at``, ``end_at``; ``expire_seconds`` and a
                                       datetime ``expires`` as the message's ``expires``
``enabled=False``                      paused, with the reason
=====================================  ========================================================

Reading and mapping only: what is written, and how, is :mod:`celery_anarchon.operate.imports`.
"""
from __future__ import annotations

import datetime

from celery_anarchon import django_rows, limits
from celery_anarchon.errors import ConfigError, StoreUnavailable
from celery_anarchon.operate.import_redbeat import FoundEntry
from celery_anarchon.schedule import as_data
from celery_anarchon.schedule import definition as entry_json
from celery_anarchon.schedule.as_data import seconds_json
from celery_anarchon.schedule.slots import datetime_to_ms, ms_to_datetime

#: how the command names itself in an error
COMMAND = "celery anarchon import django-celery-beat"
#: the pause reason of a row that was disabled
DISABLED_REASON = "came disabled from django-celery-beat (enabled=False)"
#: the period of a run-once row's entry, seconds (its window holds one slot of it)
ONCE_PERIOD_S = 86_400
#: the end of a run-once row's window past its run (``end_at`` must come after ``start_at``)
ONCE_END = datetime.timedelta(seconds=1)
_SCHEDULE_FIELDS = ("interval", "crontab", "solar", "clocked")


def read(app) -> list[FoundEntry]:
    """Every ``PeriodicTask`` row, enabled or not, mapped, by name.

    :param app: the Celery app (its ``timezone``, as the Scheduler on the rows uses it).
    :raises ConfigError: Django is not set up, or django-celery-beat is not installed.
    :raises StoreUnavailable: the database cannot be read (not migrated, not reachable).
    """
    django_rows.ready(COMMAND)
    from django.db import DatabaseError
    from django_celery_beat.models import PeriodicTask
    try:
        rows = list(PeriodicTask.objects.select_related(*_SCHEDULE_FIELDS).order_by("name"))
    except DatabaseError as exc:
        raise StoreUnavailable(
            f"django-celery-beat's PeriodicTask rows cannot be read ({type(exc).__name__}: "
            f"{exc}); fix: check DATABASES in DJANGO_SETTINGS_MODULE's settings and run python "
            "manage.py migrate") from exc
    return [found(row, app) for row in rows]


def found(row, app) -> FoundEntry:
    """One row mapped onto a store entry's definition, or refused (naming the row, its id and
    the fix)."""
    from celery_anarchon.django_rows.rows import Once, row_entry, where
    key, shown = f"PeriodicTask id {row.pk}", _describe(row)
    try:
        entry = row_entry(row, app=app, scheduled_only=False)
        ours = dict(entry.options.get("anarchon") or {})
        note = ""
        if isinstance(entry.schedule, Once):
            at_ms = datetime_to_ms(entry.schedule.at)      # its slot: whole milliseconds
            at = ms_to_datetime(at_ms)
            entry.schedule = datetime.timedelta(seconds=ONCE_PERIOD_S)
            ours.update(start_at=at, anchor=seconds_json(at_ms % (ONCE_PERIOD_S * 1000) / 1000))
            if ours["end_at"] >= at:          # not before it: expires, if earlier, stays
                ours["end_at"] = at + ONCE_END
            note = f"runs once, at {at.isoformat()}"
        expires = entry.options.get("expires")
        if isinstance(expires, datetime.datetime):      # the message's: ISO 8601 text
            entry.options["expires"] = expires.isoformat()
        entry.options["anarchon"] = ours
        definition = as_data.from_entry(entry)
        if not as_data.is_storable(definition):
            _check_finite(row.name, entry)
            raise ConfigError(f"{where(row)}: a part of it is no JSON value "
                              f"({definition}); fix: edit the row in the admin")
    except Exception as exc:        # a row never stops the others
        reason = str(exc) if isinstance(exc, ConfigError) else (
            f"{where(row)}: {type(exc).__name__}: {exc}; fix: edit the row in the admin")
        return FoundEntry(key, row.name, row.task, row.enabled, None, reason, shown)
    return FoundEntry(key, row.name, row.task, row.enabled, definition, None, shown, note)


def _check_finite(name: str, entry) -> None:
    """Refuse a NaN or an infinity in the row's arguments, options or settings (Python's JSON
    reads ``NaN`` and ``Infinity`` in the row's text fields), naming its key, its value and the
    fix (:func:`celery_anarchon.schedule.definition.check_finite`)."""
    options = {k: v for k, v in (entry.options or {}).items() if k != "anarchon"}
    ours = entry.options.get("anarchon")
    parts = {"args": list(entry.args or ()), "kwargs": dict(entry.kwargs or {}),
             "options": options,
             "anarchon": as_data.anarchon_json(ours) if isinstance(ours, dict) else ours}
    if limits.too_deep(parts):          # the message of the part shown by its repr says so
        return
    try:
        entry_json.check_finite(name, parts)
    except ConfigError as exc:
        raise ConfigError(refusal(str(exc))) from None


def refusal(error: str) -> str:
    """A refusal of our rules for a row's store entry, as a row's owner reads it: a setting the
    rules name in ``options['anarchon']`` (a ``beat_schedule`` entry's place of them, as
    :func:`celery_anarchon.django_rows.rows.row_fix` says on the Scheduler's side) or in the
    definition's ``anarchon`` key is in the row's ``headers["anarchon"]``."""
    from celery_anarchon.django_rows.rows import ROW_OPTIONS, row_fix
    if "key 'anarchon" in error:
        return f"{error.rstrip('.')} ({ROW_OPTIONS})"
    return row_fix(error)


def _describe(row) -> str:
    """The row's schedule in its own words, for a refused row's line."""
    for field in _SCHEDULE_FIELDS:
        value = getattr(row, field, None)
        if value is not None:
            return f"{field}: {value}"
    return "-"
