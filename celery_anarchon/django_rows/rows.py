"""django-celery-beat's ``PeriodicTask`` rows as entries: what each field means here
(docs/from-django-celery-beat.md).

A row becomes django-celery-beat's own ``ModelEntry`` (its model-to-schedule code: the
``IntervalSchedule``, ``CrontabSchedule`` with its zone, ``SolarSchedule``; the args, kwargs and
headers JSON; ``queue``, ``exchange``, ``routing_key``, ``priority``, ``expires`` /
``expire_seconds``), whose options gain ``options["anarchon"]``: ``start_time`` as ``start_at``,
``expires`` as ``end_at``, and the row's own settings from ``headers["anarchon"]`` (``jitter``,
``max_late``, ``anchor``, ``lease``, ``catch_up``, ``catch_up_window``). A ``ClockedSchedule`` row and a ``one_off`` row run once, at one
instant (:class:`Once`): the clocked time, or the first slot of the row's schedule at or after
its start (``start_time``, else the row's last save, ``date_changed``). A disabled row and a
``one_off`` row that ran since its last save are not scheduled.

This module imports django-celery-beat's models: import it once Django's apps are ready.
"""
from __future__ import annotations

import dataclasses
import datetime
import unicodedata
from typing import Any

from django.db.models import F
from django.utils import timezone
from django_celery_beat.models import PeriodicTask, PeriodicTasks
from django_celery_beat.schedulers import ModelEntry
from kombu.utils.json import loads

from celery_anarchon._util import iso
from celery_anarchon.errors import ConfigError
from celery_anarchon.schedule import slots as slot_math
from celery_anarchon.schedule.slots import SlotsEnded, datetime_to_ms, ms_to_datetime

#: the shortest gap of a run-once schedule (it has one slot: the jitter rule sees a long gap)
ONCE_GAP = datetime.timedelta(days=1)
#: the keys of ``headers["anarchon"]`` a row may set (its window comes from its own fields)
ROW_KEYS = ("jitter", "max_late", "anchor", "lease", "catch_up", "catch_up_window")
#: the schedule fields of a row, one of which is set
SCHEDULE_FIELDS = ("interval", "crontab", "solar", "clocked")


class Once:
    """A schedule of one run, at ``at``: a clocked row, or a ``one_off`` row's first slot. Its
    entry's window ends at ``at`` too, so no part ever asks it for a slot past it.

    :param entry: the entry's name (in :class:`SlotsEnded`).
    :param at: the instant, aware, in whole milliseconds (the slot; a finer one would be
        rounded up past the window's ``end_at``).
    """

    def __init__(self, entry: str, at: datetime.datetime) -> None:
        self.entry, self.at = entry, at

    def anarchon_next(self, after: datetime.datetime) -> datetime.datetime:
        """``at`` when it is later than ``after``.

        :raises SlotsEnded: ``at`` is not later: the run's slot has come.
        """
        if after < self.at:
            return self.at
        raise SlotsEnded(self.entry, datetime_to_ms(self.at))

    def anarchon_shortest_gap(self) -> datetime.timedelta:
        """:data:`ONCE_GAP`: one slot has no gap; the jitter rule sees a long one."""
        return ONCE_GAP

    def __repr__(self) -> str:
        return f"<once at {iso(datetime_to_ms(self.at))}>"


class RowEntry(ModelEntry):
    """django-celery-beat's ``ModelEntry`` of one row, which never writes the row: where
    django-celery-beat disables a row it cannot read (its schedule gone, its arguments not
    JSON), this refuses it. ``row_id`` and ``one_off`` tell the send of a won run which row to
    update (:func:`record_runs`)."""

    def __init__(self, model, app=None) -> None:
        self.row_id, self.one_off = model.pk, bool(model.one_off or model.clocked_id)
        super().__init__(model, app=app)

    def _disable(self, model) -> None:
        raise ConfigError(f"{where(model)}: django-celery-beat cannot read it (its schedule was "
                          "removed, or its arguments are not JSON); fix: edit the row in the "
                          "admin")

    def save(self) -> None:
        """Never called by our Scheduler: the winner of a run updates the row
        (:func:`record_runs`)."""


def where(row) -> str:
    """How a row is named in an error: its name and id."""
    return f"django-celery-beat PeriodicTask {row.name!r} (id {row.pk})"


def _escaped(row) -> str:
    """:func:`where` with the name's non-ASCII characters escaped (``'caf\\xe9'``,
    ``'cafe\\u0301'``): two names equal once normalized look different."""
    return f"django-celery-beat PeriodicTask {ascii(row.name)} (id {row.pk})"


def name_refusal(row, rows) -> str | None:
    """Why a row whose name is not in Unicode NFC is left out, or ``None`` (it is). Every
    boundary normalizes an entry's name to NFC (:func:`celery_anarchon.limits.entry_name`), so
    the admin's pause and run now of this row would reach the entry of the NFC name, not this
    one; a row never runs under a name other than its own.

    :param rows: the rows read with it: one whose name equals this one's once normalized is
        named too (both escaped, with their ids), and the fix is to rename one of them.
    :returns: the error, naming the row (escaped), its id and the fix: rename it in the admin.
    """
    nfc = unicodedata.normalize("NFC", row.name)
    if nfc == row.name:
        return None
    twins = [other for other in rows if other.pk != row.pk
             and unicodedata.normalize("NFC", other.name) == nfc]
    if twins:
        return (f"{_escaped(row)} is left out: its name and that of "
                f"{', '.join(_escaped(other) for other in twins)} are equal once normalized to "
                "Unicode NFC (as every entry name is: a pause or a run now of either would reach "
                "the same entry); fix: rename one of them in the admin")
    return (f"{_escaped(row)} is left out: its name is not in Unicode NFC (normalization form "
            "C), to which every entry name is normalized: the admin's pause and run now would "
            f"not reach it; fix: rename it in the admin, e.g. to {ascii(nfc)}")


#: where a row keeps what an entry of ``beat_schedule`` gives in ``options["anarchon"]``
ROW_OPTIONS = ('on this row, options["anarchon"] is the "anarchon" object of its headers: edit '
               'the row in the admin, e.g. headers {"anarchon": {"jitter": 1}}')


def row_fix(error: str) -> str:
    """An error of our rules about a row's entry, whose fix names ``options['anarchon']`` (a
    ``beat_schedule`` entry's place of our settings), with where a row keeps them
    (:data:`ROW_OPTIONS`); other errors as they are."""
    if "options={'anarchon'" in error or "options['anarchon']" in error:
        return f"{error.rstrip('.')} ({ROW_OPTIONS})"
    return error


def aware(value: datetime.datetime | None) -> datetime.datetime | None:
    """A row's date and time as an aware one: a naive one (``USE_TZ = False``) is read in
    Django's ``TIME_ZONE``, as the admin wrote it."""
    if value is None or timezone.is_aware(value):
        return value
    return timezone.make_aware(value, timezone.get_default_timezone())


def as_stored(value: datetime.datetime) -> datetime.datetime:
    """An aware instant as a row's field keeps it: as it is (``USE_TZ = True``), else naive, the
    wall clock of Django's ``TIME_ZONE`` (django-celery-beat's reading of a naive time,
    ``django_celery_beat.utils.make_aware``)."""
    from django.conf import settings
    if settings.USE_TZ or timezone.is_naive(value):
        return value
    return timezone.make_naive(value, timezone.get_default_timezone())


def ran_since_saved(row) -> bool:
    """Whether a one-off row ran since its last save: its winner's update (which neither saves
    nor disables it first, if it failed) set ``last_run_at`` at or after ``date_changed``. A row
    enabled again in the admin is saved: it runs once more, as in django-celery-beat."""
    ran, saved = aware(row.last_run_at), aware(row.date_changed)
    return ran is not None and (saved is None or ran >= saved)


def _json(row, field: str, kind: type, example: str) -> Any:
    text = getattr(row, field) or ("[]" if kind is list else "{}")
    try:
        value = loads(text)
    except ValueError as exc:
        raise ConfigError(f"{where(row)}: {field} {text[:80]!r} is not valid JSON ({exc}); fix: "
                          f"give a JSON {kind.__name__} in the admin, e.g. {example}") from None
    if not isinstance(value, kind):
        raise ConfigError(f"{where(row)}: {field} {text[:80]!r} is not a JSON "
                          f"{kind.__name__}; fix: give one in the admin, e.g. {example}")
    return value


def _row_options(row) -> dict:
    """``headers["anarchon"]`` of the row, checked: the row's own settings."""
    ours = _json(row, "headers", dict, '{"anarchon": {"jitter": 1}}').get("anarchon") or {}
    if not isinstance(ours, dict):
        raise ConfigError(f"{where(row)}: headers['anarchon'] = {ours!r} is not an object; fix: "
                          'give e.g. {"anarchon": {"jitter": 1, "anchor": 30}}')
    unknown = sorted(set(ours) - set(ROW_KEYS))
    if unknown:
        raise ConfigError(f"{where(row)}: headers['anarchon'] has {unknown}; a row may set "
                          f"{list(ROW_KEYS)} there (its start_time and expires are its window); "
                          "fix: remove the others")
    ours = dict(ours)
    if isinstance(ours.get("anchor"), str):       # JSON has no datetime: ISO 8601 text
        try:
            ours["anchor"] = datetime.datetime.fromisoformat(ours["anchor"])
        except ValueError:
            raise ConfigError(f"{where(row)}: headers['anarchon']['anchor'] = "
                              f"{ours['anchor']!r} is no ISO 8601 instant; fix: give one with its "
                              "UTC offset, e.g. '2026-01-01T00:00:30+00:00', or seconds") from None
    return ours


def row_entry(row, *, app, scheduled_only: bool = True) -> RowEntry | None:
    """The entry of one ``PeriodicTask`` row, or ``None`` when the row is not scheduled
    (disabled, a one-off that ran since its last save, one that expires before its run).

    :param scheduled_only: ``False``: the entry of a row that is not scheduled too (an import
        keeps a disabled row, paused), with its window as given (a one-off that expires before
        its run then has an ``end_at`` before its run).

    :raises ConfigError: naming the row, its id, the field and the fix: no schedule or more than
        one, JSON that is not valid (args a list, kwargs and headers objects), an unknown key of
        ``headers["anarchon"]``, ``expires`` not after ``start_time``, a one-off whose schedule
        has no slot (as :func:`celery_anarchon.schedule.slots.slots_for`).
    """
    if scheduled_only and not row.enabled:
        return None
    once = bool(row.one_off or row.clocked_id)
    if scheduled_only and once and ran_since_saved(row):
        return None
    chosen = [field for field in SCHEDULE_FIELDS if getattr(row, f"{field}_id") is not None]
    if len(chosen) != 1:
        raise ConfigError(f"{where(row)}: {'no schedule' if not chosen else chosen} set; fix: set "
                          "exactly one of interval, crontab, solar, clocked in the admin")
    _json(row, "args", list, '["x", 1]')
    _json(row, "kwargs", dict, '{"full": true}')
    ours = _row_options(row)
    entry = RowEntry(row, app=app)
    headers = dict(entry.options.get("headers") or {})
    headers.pop("anarchon", None)
    # django-celery-beat 2.7 gives the row's name as an option of its own, 2.8 on as a header
    headers.setdefault("periodic_task_name", entry.options.pop("periodic_task_name", row.name))
    entry.options["headers"] = headers
    start, end = aware(row.start_time), aware(row.expires)
    if start is not None and end is not None and end <= start:
        raise ConfigError(f"{where(row)}: expires {end.isoformat()} is not after start_time "
                          f"{start.isoformat()}: it would never run; fix: set a later expires or "
                          "clear it")
    if once:
        at = _once_at(row, entry.schedule, app, ours.pop("anchor", None), start)
        if end is not None and end < at and scheduled_only:     # it expires before its run
            return None
        entry.schedule = Once(row.name, at)
        ours["end_at"] = at if end is None or at <= end else end
    else:
        if start is not None:
            ours["start_at"] = start
        if end is not None:
            ours["end_at"] = end
    entry.options["anarchon"] = ours
    return entry


def _once_at(row, schedule, app, anchor, start: datetime.datetime | None) -> datetime.datetime:
    """The instant of a row's one run, in whole milliseconds (a slot's unit: docs/design.md
    "Words"): its clocked time (not before ``start_time``), rounded down as every instant is
    made a slot (:func:`~celery_anarchon.schedule.slots.datetime_to_ms`; the import of the row
    cuts it so too), or its schedule's first slot at or after its start (``start_time``, else
    its last save). Whole, the slot is the window's ``end_at``: one with sub-millisecond digits
    would come after it (the run never sent)."""
    if row.clocked_id is not None:
        at = aware(row.clocked.clocked_time)
        at = at if start is None or start <= at else start
        return ms_to_datetime(datetime_to_ms(at))
    since = aware(row.date_changed) or datetime.datetime.now(datetime.timezone.utc)
    if start is not None and start > since:
        since = start
    anchor_s = anchor.timestamp() if isinstance(anchor, datetime.datetime) else anchor
    slots = slot_math.slots_for(schedule, entry=row.name, app_timezone=app.timezone,
                                anchor_s=anchor_s)
    return ms_to_datetime(slots.next_after(datetime_to_ms(since) - 1))


@dataclasses.dataclass(frozen=True)
class SentRun:
    """One run this instance won and sent of a row's entry.

    :param row_id: the row's primary key.
    :param one_off: the row runs once (one_off or clocked): disabled once sent.
    :param sent_at: when it was sent, aware (written as the row keeps it: :func:`as_stored`).
    """

    row_id: int
    one_off: bool
    sent_at: datetime.datetime


def record_runs(sent: list[SentRun]) -> None:
    """Write what the winner sent: each row's ``last_run_at`` (the last send; naive in
    ``TIME_ZONE`` when ``USE_TZ = False``, as django-celery-beat keeps it) and
    ``total_run_count`` (plus one per run), and a one-off row disabled (then
    ``PeriodicTasks.update_changed()``, so every instance reads it at its next poll). Queryset
    updates: no signal, no ``date_changed``, no change noted for the others' poll.

    :raises django.db.DatabaseError: the database refused the writes.
    """
    by_row: dict[int, list[SentRun]] = {}
    for run in sent:
        by_row.setdefault(run.row_id, []).append(run)
    disabled = False
    for row_id, runs in by_row.items():
        fields: dict[str, Any] = {"last_run_at": as_stored(max(r.sent_at for r in runs)),
                                  "total_run_count": F("total_run_count") + len(runs)}
        if any(r.one_off for r in runs):
            fields["enabled"] = False
            disabled = True
        PeriodicTask.objects.filter(pk=row_id).update(**fields)
    if disabled:
        PeriodicTasks.update_changed()


def keep_phase(rows=None) -> list[str]:
    """Give each enabled interval row that has run the ``anchor`` of its last run
    (``headers["anarchon"]["anchor"]``, Unix seconds), so its runs keep the phase
    django-celery-beat gave them (it counts ``every`` from ``last_run_at``; our slots are the
    multiples of the period since 1970, shifted by the anchor). A row that has an anchor is left
    as it is. Each save notes a change: every instance reads the rows at its next poll.

    :param rows: a ``PeriodicTask`` queryset (default: every row).
    :returns: the names of the rows given an anchor.
    """
    import json

    rows = PeriodicTask.objects.all() if rows is None else rows
    anchored = []
    for row in rows.filter(enabled=True, interval__isnull=False, last_run_at__isnull=False):
        headers = loads(row.headers or "{}")
        ours = headers.get("anarchon") if isinstance(headers, dict) else None
        if not isinstance(headers, dict) or (isinstance(ours, dict) and "anchor" in ours):
            continue
        ours = dict(ours or {}, anchor=int(aware(row.last_run_at).timestamp()))
        row.headers = json.dumps(dict(headers, anarchon=ours))
        row.save(update_fields=["headers"])
        anchored.append(row.name)
    return anchored
