"""Python objects as definition data (:mod:`celery_anarchon.schedule.definition`), and a
schedule's data in words.

A schedule object (a number, a ``timedelta``, Celery's ``schedule``, ``crontab`` and ``solar``,
:class:`celery_anarchon.cron`), a ``beat_schedule`` entry (Celery's ``ScheduleEntry``) and its
``options['anarchon']`` as the JSON values of a definition: what ``list``, ``status`` and the
page show, and what ``add`` and ``update`` store. What cannot be data is shown by its repr
(``{"repr": "..."}``) and is not storable (:func:`is_storable`).
"""
from __future__ import annotations

import datetime
import decimal
import json
import sys
from typing import Any

from celery import beat
from celery import schedules as celery_schedules

from celery_anarchon import limits
from celery_anarchon.schedule import slots
from celery_anarchon.schedule.definition import (
    CRON_ORDER, CRONTAB_FIELDS, SCHEDULE_KINDS, is_number,
)
from celery_anarchon.schedule.zones import iana_zone, zone_name


def seconds_json(value: Any) -> Any:
    """Seconds as JSON: a ``timedelta`` or a ``Decimal`` as a number, a whole float as an int
    (exactly: below 2**53); other values as given."""
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, decimal.Decimal):   # Celery's schedule keeps a Decimal period as given
        if not value.is_finite():
            return str(value)                # 'Infinity', 'NaN': refused by the checks, by name
        value = int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 53:
        return int(value)               # (exactly: a larger float stays one, e.g. 1e+308)
    return value


def _field_text(value: Any) -> str | int | bool:
    if isinstance(value, (str, int)):   # a bool as given: parse refuses it by its field
        return value
    return ",".join(str(v) for v in sorted(value))  # a set, list or range of values


def _storable_zone(tz: datetime.tzinfo) -> str | None:
    name = zone_name(tz)
    return None if iana_zone(name) is None else name


def _zoned(schedule: Any, out: dict, zone: datetime.tzinfo | None) -> dict:
    """``out`` with the schedule's own ``timezone``; its repr when the zone has no IANA name."""
    if zone is None:
        return out
    name = _storable_zone(zone)
    return {"repr": limits.object_repr(schedule)} if name is None else {**out, "timezone": name}


def schedule_json(schedule: Any) -> dict:
    """A schedule object as the ``"schedule"`` data of a definition.

    Accepts a number of seconds, a ``timedelta``, ``celery.schedules.schedule``, ``crontab`` (its
    fields as written, its own zone if it has one), :class:`celery_anarchon.cron`, ``solar``, or
    the data form itself (returned as given). What cannot be expressed (``relative=True``, a
    schedule class of your own, a zone without an IANA name) gives ``{"repr": "..."}``, which
    :func:`parse` refuses: see :func:`is_storable`.
    """
    if isinstance(schedule, dict):
        return schedule
    if is_number(schedule) or isinstance(schedule, datetime.timedelta):
        return {"every": seconds_json(schedule)}
    hooks = hasattr(schedule, "anarchon_next") or hasattr(schedule, "anarchon_shortest_gap")
    if isinstance(schedule, slots.cron) and not hooks:
        # the cron's own zone (None: the app's)
        return _zoned(schedule, {"cron": schedule.expr}, schedule._zone)
    if isinstance(schedule, celery_schedules.crontab) and not hooks:
        fields = {f: _field_text(getattr(schedule, f"_orig_{f}")) for f in CRONTAB_FIELDS}
        # a zone set on the instance, as django-celery-beat does (None: the app's)
        return _zoned(schedule, {"crontab": {f: v for f, v in fields.items() if v != "*"}},
                      vars(schedule).get("tz"))
    if isinstance(schedule, celery_schedules.solar) and not hooks:
        # float: django-celery-beat's SolarSchedule gives Decimals, which JSON has not
        return {"solar": schedule.event, "lat": float(schedule.lat), "lon": float(schedule.lon)}
    if (isinstance(schedule, celery_schedules.schedule) and not hooks
            and type(schedule) is celery_schedules.schedule and not schedule.relative):
        return {"every": seconds_json(schedule.run_every)}
    return {"repr": limits.object_repr(schedule)}


#: the schedule kinds that run in a time zone (their ``"timezone"`` key)
ZONED_KINDS = tuple(kind for kind, keys in SCHEDULE_KINDS.items() if "timezone" in keys)


def zoned_kind(schedule: Any) -> str | None:
    """``"crontab"`` or ``"cron"`` for a schedule's data form of that kind, else ``None``."""
    if isinstance(schedule, dict):
        return next((kind for kind in ZONED_KINDS if kind in schedule), None)
    return None


def keep_zone(new: Any, current: Any) -> Any:
    """The ``"schedule"`` data of an update: ``new`` (a crontab or cron without a zone of its
    own) with the ``timezone`` of ``current`` (the entry's schedule, a crontab or cron in a
    zone); any other ``new`` as given. The zone is a part of the schedule that changes only when
    given (docs/schedules.md, "update"): a 09:30 New York entry given new fields stays in New York,
    it does not move to the app's zone."""
    if (zoned_kind(new) is None or "timezone" in new or zoned_kind(current) is None
            or current.get("timezone") is None):
        return new
    return {**new, "timezone": current["timezone"]}


def anarchon_json(ours: dict | None) -> dict:
    """``options['anarchon']`` as data: timedeltas as seconds, an aware ``anchor`` datetime as
    seconds since the Unix epoch, ``start_at`` / ``end_at`` datetimes as ISO 8601 text; other
    values as given."""
    out = {}
    for key, value in (ours or {}).items():
        if key == "anchor" and isinstance(value, datetime.datetime) and value.tzinfo is not None:
            value = value.timestamp()
        elif key in ("start_at", "end_at") and isinstance(value, datetime.datetime):
            value = value.isoformat()   # naive: refused by the plan, shown as written
        elif key == "lease" and isinstance(value, dict):
            value = {k: seconds_json(v) for k, v in value.items()}
        out[key] = seconds_json(value)
    return out


def json_value(value: Any) -> Any:
    """``value`` as JSON values; one that is none (a Python object, NaN or infinity, nested past
    :data:`~celery_anarchon.limits.MAX_DEPTH`) as ``{"repr": ...}``, to show, not store."""
    if limits.too_deep(value):          # json.dumps would recurse past Python's limit
        return {"repr": f"(nested more than {limits.MAX_DEPTH} levels deep)"}
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError):
        return {"repr": limits.object_repr(value)}


def from_entry(entry: beat.ScheduleEntry) -> dict:
    """A ``ScheduleEntry`` (a ``beat_schedule`` entry) as a definition, for ``list`` and
    ``status``. A part that cannot be expressed as data (a schedule of your own, arguments that
    are not JSON) is given as ``{"repr": "..."}`` and the definition carries
    ``"storable": false``: it can be shown, not stored (:func:`is_storable`)."""
    options = dict(entry.options or {})
    ours = options.pop("anarchon", None)
    out = {"task": entry.task, "args": json_value(list(entry.args or ())),
           "kwargs": json_value(dict(entry.kwargs or {})), "options": json_value(options),
           "schedule": schedule_json(entry.schedule)}
    if ours:
        out["anarchon"] = json_value(anarchon_json(ours) if isinstance(ours, dict) else ours)
    if not is_storable(out):
        out["storable"] = False
    return out


def is_storable(definition: dict) -> bool:
    """False when :func:`from_entry` had to show a part of ``definition`` by its repr."""
    if definition.get("storable") is False:
        return False
    if "repr" in (definition.get("schedule") or {}):
        return False
    return not any(isinstance(definition.get(k), dict) and set(definition[k]) == {"repr"}
                   for k in ("args", "kwargs", "options", "anarchon"))


def describe_schedule(schedule: dict, default_zone: str | None = None) -> str:
    """A schedule's data in a few words, for tables: ``every 60 s``, ``crontab 0 */2 * * *
    Europe/Paris``, ``cron 0 3 * * *``, ``solar sunrise 48.85,2.35``.

    :param default_zone: the zone a crontab or cron without a zone of its own is read in (the
        app's ``timezone``), named after it; ``None``: none named.
    """
    if not isinstance(schedule, dict):
        return str(schedule)
    given = schedule.get("timezone") or default_zone
    zone = f" {given}" if given else ""
    if "every" in schedule:
        every = schedule["every"]
        if is_number(every) and abs(every) <= sys.float_info.max:   # {:g} of 10**400 overflows
            return f"every {every:g} s"
        return f"every {limits.shown_value(every)}" + (" s" if is_number(every) else "")
    if "crontab" in schedule and isinstance(schedule["crontab"], dict):
        fields = schedule["crontab"]
        return "crontab " + " ".join(str(fields.get(f, "*")) for f in CRON_ORDER) + zone
    if "cron" in schedule:
        return f"cron {schedule['cron']}{zone}"
    if "solar" in schedule:
        return f"solar {schedule['solar']} {schedule.get('lat')},{schedule.get('lon')}"
    return str(schedule.get("repr", schedule))
