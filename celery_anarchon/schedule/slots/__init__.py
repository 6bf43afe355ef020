"""Slots: the nominal due instants of each ``beat_schedule`` entry, the same on every host.

A slot is an absolute instant in UTC integer milliseconds. Slots never depend on when an instance
started, on ``last_run_at`` or on any other local state (docs/design.md "Slots: the same on every
instance"), so every host computes the same slots and each run can be claimed once in the store.
Everything here is a pure function of the schedule and of the instant asked about: no I/O and no
clock reads.

:func:`slots_for` turns one entry's schedule into a :class:`SlotSchedule`:

- **interval** (a number, a ``timedelta``, ``celery.schedules.schedule``): ``anchor + k * period``
  for every integer k, i.e. the multiples of the period since the Unix epoch, shifted by the
  entry's ``anchor``. ``relative=True`` is refused.
- **crontab** (``celery.schedules.crontab``, days matched with AND as Celery does) and **cron
  strings** (:class:`cron`, cron(5) syntax and day OR): evaluated in the entry's time zone with the
  daylight-saving rules of cron(8), below.
- **solar** (``celery.schedules.solar``): the next event after an instant.
- **any other class** that has ``anarchon_next`` and ``anarchon_shortest_gap``.


One module per kind: :mod:`~celery_anarchon.schedule.slots.interval`,
:mod:`~celery_anarchon.schedule.slots.wall_clock` (crontab and cron strings, with the DST rules of
cron(8)), :mod:`~celery_anarchon.schedule.slots.cron_text` (:class:`cron`),
:mod:`~celery_anarchon.schedule.slots.solar_slots` and
:mod:`~celery_anarchon.schedule.slots.custom`, each on
:mod:`~celery_anarchon.schedule.slots.base` (:class:`SlotSchedule`, instants in UTC ms).
"""

from __future__ import annotations

import datetime

from celery.schedules import crontab, solar
from celery.schedules import schedule as interval_schedule

from celery_anarchon.errors import ConfigError
from celery_anarchon.limits import object_repr
from celery_anarchon.schedule.slots.base import (
    CHECK_FROM_S, SlotSchedule, datetime_to_ms, ms_to_datetime,
)
from celery_anarchon.schedule.slots.cron_text import cron
from celery_anarchon.schedule.slots.custom import CustomSlots
from celery_anarchon.schedule.slots.interval import IntervalSlots, interval_slots
from celery_anarchon.schedule.slots.solar_slots import SOLAR_SHORTEST_GAP_MS, SolarSlots
from celery_anarchon.schedule.slots.wall_clock import CronSlots, crontab_slots
from celery_anarchon.schedule.slots.window import (
    SlotsEnded, WindowedSlots, inner_of, outside, windowed,
)
from celery_anarchon.schedule.zones import resolve_zone

__all__ = ["SlotSchedule", "slots_for", "cron", "CronSlots", "IntervalSlots", "SolarSlots",
           "CustomSlots", "SOLAR_SHORTEST_GAP_MS", "ms_to_datetime", "datetime_to_ms",
           "text_schedule_error", "TEXT_SCHEDULE", "SlotsEnded", "WindowedSlots", "inner_of",
           "outside", "windowed"]


#: the words of the error of a schedule given as text (:func:`text_schedule_error`), which name
#: its rule in the problems of ``celery_anarchon.testing`` and ``check``
TEXT_SCHEDULE = "which Celery cannot read as a schedule"


def text_schedule_error(entry: str, text: str) -> ConfigError:
    """The error of a schedule given as text (``"every 5 minutes"``), which neither Celery nor
    we read: naming the entry, the text and the schedule objects to give instead."""
    shown = repr(text) if len(text) <= 40 else repr(text[:40]) + "..."
    return ConfigError(
        f"entry {entry!r}: schedule {shown} is text, {TEXT_SCHEDULE}; "
        "fix: give a number of seconds (300), a timedelta (timedelta(minutes=5)), a crontab "
        "(crontab(minute='*/5')) or celery_anarchon.cron('*/5 * * * *')")


def slots_for(schedule, *, entry: str, app_timezone: datetime.tzinfo,
              anchor_s: float | None = None) -> SlotSchedule:
    """Build the :class:`SlotSchedule` of one ``beat_schedule`` entry's schedule.

    ``schedule`` is what Celery's ScheduleEntry holds: ``celery.schedules.schedule`` (numbers and
    timedeltas are accepted too), ``crontab``, ``solar``, :class:`cron` or an object with
    ``anarchon_next``/``anarchon_shortest_gap``. ``app_timezone`` is ``app.timezone`` (a tzinfo or
    an IANA name), used by crontab and cron entries without a zone of their own. ``anchor_s``
    (seconds, interval schedules only) shifts the interval's slots. Rules: docs/design.md "Slots".

    Raises :class:`ConfigError` naming the entry, the value and the fix: ``relative=True``, a
    period or anchor that is not whole milliseconds, an anchor on another kind, a crontab step
    larger than its field (``*/120`` minutes), solar without ephem, an unsupported class.
    """
    if isinstance(schedule, (int, float, datetime.timedelta)) and not isinstance(schedule, bool):
        schedule = interval_schedule(schedule)
    hooks = ("anarchon_next", "anarchon_shortest_gap")
    has_hooks = any(hasattr(schedule, name) for name in hooks)
    if anchor_s is not None and (has_hooks or not isinstance(schedule, interval_schedule)):
        raise ConfigError(f"entry {entry!r}: anchor={anchor_s!r} applies to interval schedules "
                          f"only, not to {object_repr(schedule)}; fix: remove 'anchor' from "
                          "options['anarchon']")
    if has_hooks:
        missing = [name for name in hooks if not callable(getattr(schedule, name, None))]
        if missing:
            raise ConfigError(f"entry {entry!r}: {type(schedule).__qualname__} lacks "
                              f"{' and '.join(missing)}; fix: add both anarchon_next(after) and "
                              "anarchon_shortest_gap()")
        return CustomSlots(entry, schedule)
    if isinstance(schedule, cron):
        return schedule.slots(resolve_zone(app_timezone, f"entry {entry!r}: app timezone"))
    if isinstance(schedule, crontab):
        return crontab_slots(entry, schedule, app_timezone)
    if isinstance(schedule, solar):
        try:
            import ephem
        except ImportError:
            raise ConfigError(f"entry {entry!r}: solar schedule {object_repr(schedule)} needs "
                              "the ephem package; fix: pip install celery-anarchon[solar] "
                              "(or pip install ephem)") from None
        slots = SolarSlots(entry, schedule, ephem)
        slots.next_after(CHECK_FROM_S * 1000)  # an event that never happens fails at start-up
        return slots
    if isinstance(schedule, interval_schedule):
        return interval_slots(entry, schedule, anchor_s)
    if isinstance(schedule, str):
        raise text_schedule_error(entry, schedule)
    raise ConfigError(
        f"entry {entry!r}: schedule {object_repr(schedule)} of class "
        f"{type(schedule).__qualname__} is not supported: every host must compute the same "
        "slots from it. Fix: use a number, a timedelta, crontab, solar or celery_anarchon.cron, "
        "or add two methods to the class: anarchon_next(self, after: datetime) -> datetime "
        "(aware UTC in and out, strictly later) and anarchon_shortest_gap(self) -> timedelta")
