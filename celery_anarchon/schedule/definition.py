"""Entry definitions as data: a JSON object <-> a Celery ``ScheduleEntry`` with real schedule objects.

A store entry (``celery_anarchon.schedules(app).add(...)``) is kept as JSON text, never as code:
nothing is pickled or evaluated. The form::

    {"task": "proj.tasks.report",                       # required, a registered task's name
     "args": [], "kwargs": {},                          # JSON values
     "options": {"queue": "reports"},                   # apply_async options, without "anarchon"
     "anarchon": {"jitter": 2, "max_late": 60},         # options['anarchon'] of beat_schedule
     # (also "catch_up": "newest" | "all" | "none", "catch_up_window": seconds, "anchor", "lease")
     # "anarchon" may bound the slots: "start_at" / "end_at", ISO 8601 text with a UTC offset
     "schedule": {"every": 60}}                         # one of the four kinds below

``schedule`` is one of:

* ``{"every": 60}``: an interval, seconds (a number > 0, whole milliseconds); its slots are the
  multiples of the period since the Unix epoch, shifted by ``anarchon.anchor`` (seconds);
* ``{"crontab": {"minute": "0", "hour": "*/2"}, "timezone": "Europe/Paris"}``: Celery's crontab,
  its fields as written (``minute``, ``hour``, ``day_of_week``, ``day_of_month``,
  ``month_of_year``; a missing one is ``"*"``), days matched with AND; ``timezone`` optional
  (default: the app's ``timezone`` on each instance);
* ``{"cron": "0 3 * * *", "timezone": "Europe/Paris"}``: :class:`celery_anarchon.cron`
  (cron(5) syntax, day OR, ``L``, ``W``, ``#``); ``timezone`` optional as above;
* ``{"solar": "sunrise", "lat": 48.85, "lon": 2.35}``: Celery's solar (needs ``ephem``).

The canonical text (:func:`canonical`) is ``json.dumps(obj, sort_keys=True, separators=(",", ":"))``:
the same definition gives the same text on every host. It is at most
:data:`~celery_anarchon.limits.MAX_DEFINITION_BYTES` (64 KiB: every beat reads every definition at
each change of the store's entries) and nests at most :data:`~celery_anarchon.limits.MAX_DEPTH`
(100) levels, checked before any parser recurses. :func:`parse` checks a definition and builds
the entry; the timing rules (docs/design.md "Timing") are then applied by
:func:`celery_anarchon.schedule.plan.build_plan`, with the same messages as at start-up. The other
way, Python objects as this data: :mod:`celery_anarchon.schedule.as_data`.
"""
from __future__ import annotations

import datetime
import difflib
import json
import math
import weakref
import zoneinfo
from typing import Any

from celery import beat
from celery import schedules as celery_schedules
from celery.exceptions import ImproperlyConfigured

from celery_anarchon import limits
from celery_anarchon.schedule import slots
from celery_anarchon.schedule.slots.wall_clock import FIELDS
from celery_anarchon.schedule.timing import ENTRY_KEYS
from celery_anarchon.schedule.zones import did_you_mean, iana_zone
from celery_anarchon.errors import ConfigError

#: the keys of a definition
KEYS = ("anarchon", "args", "kwargs", "options", "schedule", "task")
#: the keys of ``"anarchon"``: those of ``options['anarchon']`` of a beat_schedule entry
ANARCHON_KEYS = ENTRY_KEYS
#: schedule kind -> the keys its ``"schedule"`` object may hold (the kind's key first)
SCHEDULE_KINDS = {"every": ("every",), "crontab": ("crontab", "timezone"),
                  "cron": ("cron", "timezone"), "solar": ("solar", "lat", "lon")}
#: the fields of ``{"crontab": {...}}``, as ``celery.schedules.crontab`` names them
CRONTAB_FIELDS = ("minute", "hour", "day_of_week", "day_of_month", "month_of_year")
#: the same fields in cron(5) order (minute hour day-of-month month day-of-week)
CRON_ORDER = tuple(name for name, _, _ in FIELDS)
_KINDS_TEXT = ('{"every": 60}, {"crontab": {"minute": "0", "hour": "3"}}, '
               '{"cron": "0 3 * * *"} or {"solar": "sunrise", "lat": 48.85, "lon": 2.35}')


def _show(value: Any) -> str:
    try:
        text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        text = limits.object_repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _error(name: str, key: str, value: Any, problem: str, fix: str) -> ConfigError:
    """``entry 'n': key 'k' = value: problem; fix: ...`` (entry, key, value and fix)."""
    return ConfigError(f"entry {name!r}: key {key!r} = {_show(value)}: {problem}; fix: {fix}")


def _unknown(name: str, where: str, given: dict, allowed: tuple[str, ...]) -> None:
    for key in given:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            path = f"{where}.{key}" if where else str(key)
            raise _error(name, path, given[key], "unknown key",
                         f"{hint}the allowed keys are {', '.join(allowed)} (a typo must not "
                         "silently change the entry)")


def check_keys(name: str, obj: dict) -> None:
    """Refuse a key of a definition (or of a part of one, as ``update`` takes) that is not in
    :data:`KEYS`.

    :raises ConfigError: naming the entry, the key, its value and the allowed keys.
    """
    _unknown(name, "", obj, KEYS)


def is_number(value: Any) -> bool:
    """A finite int or float (an int is finite at any size: ``math.isfinite(10**400)`` raises
    OverflowError; its range is the caller's bound to check)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)


def canonical(obj: dict | str, *, name: str = "") -> str:
    """The canonical JSON text of a definition: ``json.dumps(obj, sort_keys=True,
    separators=(",", ":"))`` (text in: parsed first).

    :param name: the entry's name, for the error message.
    :raises ConfigError: the value is not JSON (a Python object, NaN or infinity (naming its key
        and value), a key that is not a string), nests more than
        :data:`~celery_anarchon.limits.MAX_DEPTH` levels (found before serializing it), or its
        text is longer than :data:`~celery_anarchon.limits.MAX_DEFINITION_BYTES`.
    """
    if isinstance(obj, (str, bytes)):
        obj = _load(name, obj)
    _check_depth(name, obj)
    try:
        text = json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        check_finite(name, obj)
        raise ConfigError(f"entry {name!r}: the definition is not JSON ({exc}); fix: give only "
                          "strings, numbers, booleans, null, lists and objects with string keys "
                          "(dates as ISO text or seconds)") from None
    _check_size(name, len(text))        # ASCII (ensure_ascii): one byte a character
    return text


#: the keys of a definition whose value is seconds (a refusal's fix says so)
_SECONDS_KEYS = frozenset({"every", "anchor", "catch_up_window", "jitter", "max_late", "duration",
                           "heartbeat", "queue_timeout"})


def check_finite(name: str, obj: Any, path: str = "") -> None:
    """Refuse the first float of ``obj`` (a definition, or parts of one) that is NaN or infinite
    (JSON has neither), naming entry ``name``, its key (``anarchon.catch_up_window``,
    ``args[0]``), its value and the fix: a finite number (of seconds, under a key that holds
    seconds). ``obj`` must nest no deeper than :data:`~celery_anarchon.limits.MAX_DEPTH`.

    :param path: the key of ``obj`` itself (``""``: a whole definition).
    :raises ConfigError: such a float found.
    """
    if isinstance(obj, float) and not math.isfinite(obj):
        seconds = path.rsplit(".", 1)[-1] in _SECONDS_KEYS
        raise _error(name, path, obj, "not a finite number (JSON has no NaN or infinity)",
                     "give a finite number of seconds, e.g. 60" if seconds
                     else "give a finite number")
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) \
        if isinstance(obj, (list, tuple)) else ()
    for key, value in items:
        check_finite(name, value, f"{path}[{key}]" if isinstance(obj, (list, tuple))
                      else f"{path}.{key}" if path else str(key))


def _check_depth(name: str, obj: Any) -> None:
    """Refuse a definition that nests more than :data:`~celery_anarchon.limits.MAX_DEPTH`
    levels, naming the key that does (found without recursion)."""
    if not limits.too_deep(obj):
        return
    deep = [key for key, value in obj.items() if limits.too_deep(value, limits.MAX_DEPTH - 1)] \
        if isinstance(obj, dict) else []
    where = deep[0] if deep else None
    raise ConfigError(_too_deep(name, "the definition" if where is None else f"key {where!r}"))


def _too_deep(name: str, what: str) -> str:
    return (f"entry {name!r}: {what} is nested more than {limits.MAX_DEPTH} levels deep (lists "
            "and objects within each other; the definition itself is one); fix: flatten the data "
            "(the limit keeps every JSON parser and serializer, Celery's too, within its "
            "recursion limit)")


def _check_size(name: str, size: int) -> None:
    if size > limits.MAX_DEFINITION_BYTES:
        raise ConfigError(
            f"entry {name!r}: the definition is {size:,} bytes of JSON, more than "
            f"{limits.MAX_DEFINITION_BYTES:,} (64 KiB, the limit of a stored definition: every "
            "beat reads every definition at each change of the store's entries); fix: pass a "
            "reference (an id, a path, a URL) in args or kwargs instead of the data itself")


def _no_constant(text: str):
    raise ValueError(f"{text} is not a JSON number")


def _load(name: str, text: str | bytes) -> Any:
    """The JSON values of ``text`` (NaN and Infinity refused, as :func:`canonical` refuses them;
    its size and nesting checked before it is parsed)."""
    _check_size(name, len(text) if isinstance(text, bytes) or text.isascii()
                else len(text.encode("utf-8", "surrogatepass")))
    bad = None if isinstance(text, bytes) else limits.undecodable(text)
    if bad is not None:                 # bytes a store read that are not UTF-8
        raise ConfigError(f"entry {name!r}: the definition {bad}; fix: remove the entry and add "
                          "it again")
    if limits.text_too_deep(text):
        raise ConfigError(_too_deep(name, "the definition"))
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:
        raise ConfigError(f"entry {name!r}: the definition is not valid JSON ({exc}); fix: give a "
                          'JSON object such as {"task": "proj.tasks.report", '
                          '"schedule": {"every": 60}}') from None


def _zone(name: str, key: str, value: Any) -> zoneinfo.ZoneInfo:
    zone = iana_zone(value)
    if zone is not None:
        return zone
    raise _error(name, key, value, "unknown time zone" + did_you_mean(value),
                 "give an IANA name such as \"Europe/Paris\" or \"UTC\" "
                 "(zoneinfo.available_timezones()), or leave it out for the app's timezone")


#: the longest period a ``timedelta`` (and so Celery's interval schedule) holds, seconds
_LONGEST_TIMEDELTA_S = datetime.timedelta.max.total_seconds()


def _every(name: str, sched: dict, app) -> celery_schedules.schedule:
    every = sched["every"]
    if not is_number(every) or every <= 0:
        raise _error(name, "schedule.every", every, "not a number of seconds > 0",
                     'give the period in seconds, e.g. {"every": 60}')
    if every > _LONGEST_TIMEDELTA_S:    # (a shorter period's slots: plan.build_plan)
        raise _error(name, "schedule.every", every,
                     "its next slot would come after the year 9999, the last year a slot can "
                     "have (dates, ISO 8601 times and the stores' clocks end there)",
                     'give a shorter period, e.g. {"every": 86400} for daily runs (a crontab '
                     'runs yearly at most: {"crontab": {"minute": "0", "hour": "0", '
                     '"day_of_month": "1", "month_of_year": "1"}})')
    return celery_schedules.schedule(datetime.timedelta(seconds=every), app=app)


#: the crontabs parsed for an app's store entries, by (fields, zone): entries with one definition
#: share one object (a Celery crontab keeps nothing of an entry: its last run lives on the
#: ScheduleEntry). Parsing the same fields again for each of 100,000 entries was half of a beat's
#: start-up and about half its memory (docs/performance.md, "100,000 store entries").
_SHARED_CRONTABS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: at most this many distinct crontabs are shared per app
MAX_SHARED_CRONTABS = 10_000
#: what Celery's crontab raises for a field it cannot parse (its ParseException is no ValueError:
#: an empty field, for one)
_CRONTAB_ERRORS = (ValueError, TypeError, KeyError, celery_schedules.ParseException)

def _crontab(name: str, sched: dict, app) -> celery_schedules.crontab:
    fields = sched["crontab"]
    if not isinstance(fields, dict):
        raise _error(name, "schedule.crontab", fields, "not an object of crontab fields",
                     'give the fields as written, e.g. {"crontab": {"minute": "0", "hour": "*/2"}}'
                     ' (or a cron string: {"cron": "0 */2 * * *"})')
    _unknown(name, "schedule.crontab", fields, CRONTAB_FIELDS)
    for field, value in fields.items():
        if not (isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))):
            raise _error(name, f"schedule.crontab.{field}", value, "not a crontab field",
                         'give the field as text, e.g. "0", "*/15", "1-5" or "mon,wed"')
    key = (tuple(sorted(fields.items())), str(sched.get("timezone")))
    shared = _SHARED_CRONTABS.setdefault(app, {}) if app is not None else {}
    if key in shared:
        return shared[key]
    try:
        result = celery_schedules.crontab(**fields, app=app)
    except _CRONTAB_ERRORS as exc:
        for field, value in fields.items():  # name the field Celery refuses alone, if one
            try:
                celery_schedules.crontab(**{field: value})
            except _CRONTAB_ERRORS as field_exc:
                raise _error(name, f"schedule.crontab.{field}", value,
                             f"Celery's crontab refuses it ({field_exc})",
                             "write the field in crontab syntax within its range: minute 0-59, "
                             "hour 0-23, day_of_week 0-6 or sun-sat, day_of_month 1-31, "
                             "month_of_year 1-12") from None
        raise _error(name, "schedule.crontab", fields, f"Celery's crontab refuses it ({exc})",
                     "choose a day_of_month that exists in the month_of_year") from None
    if "timezone" in sched:
        result.tz = _zone(name, "schedule.timezone", sched["timezone"])  # the crontab's own zone
    if len(shared) < MAX_SHARED_CRONTABS:
        shared[key] = result
    return result


def _cron(name: str, sched: dict, app) -> slots.cron:
    expr = sched["cron"]
    zone = sched.get("timezone")
    if zone is not None:
        _zone(name, "schedule.timezone", zone)
    if not isinstance(expr, str):
        raise _error(name, "schedule.cron", expr, "not a cron expression",
                     'give the five fields as text, e.g. {"cron": "0 22 L * *"}')
    try:
        return slots.cron(expr, tz=zone, app=app)
    except ConfigError as exc:
        raise ConfigError(f"entry {name!r}: key 'schedule.cron': {exc}") from None


def _solar(name: str, sched: dict, app) -> celery_schedules.solar:
    event = sched["solar"]
    for key in ("lat", "lon"):
        if not is_number(sched.get(key)):
            raise _error(name, f"schedule.{key}", sched.get(key), "missing or not a number",
                         'give "lat" (-90..90) and "lon" (-180..180) in degrees, e.g. '
                         '{"solar": "sunrise", "lat": 48.85, "lon": 2.35}')
    if not isinstance(event, str):
        raise _error(name, "schedule.solar", event, "not the name of a solar event",
                     f"give one of {', '.join(sorted(celery_schedules.solar._all_events))}")
    try:
        return celery_schedules.solar(event, sched["lat"], sched["lon"], app=app)
    except ImproperlyConfigured:
        raise ConfigError(f"entry {name!r}: key 'schedule.solar': a solar schedule needs the "
                          "ephem package; fix: pip install celery-anarchon[solar] (or pip install "
                          "ephem) on every beat host") from None
    except ValueError as exc:
        raise _error(name, "schedule", sched, f"Celery's solar refuses it ({exc})",
                     f"give one of the events {', '.join(sorted(celery_schedules.solar._all_events))}"
                     ", a latitude within -90..90 and a longitude within -180..180") from None


_BUILDERS = {"every": _every, "crontab": _crontab, "cron": _cron, "solar": _solar}


def _schedule(name: str, sched: Any, app):
    if not isinstance(sched, dict):
        raise _error(name, "schedule", sched, "not a schedule object", f"give one of {_KINDS_TEXT}")
    if "repr" in sched:
        raise _error(name, "schedule", sched, "this schedule cannot be stored as data (it is shown "
                     "by its repr only)", f"give one of {_KINDS_TEXT}")
    kinds = [k for k in SCHEDULE_KINDS if k in sched]
    if len(kinds) != 1:
        problem = "no schedule kind" if not kinds else f"several schedule kinds ({', '.join(kinds)})"
        raise _error(name, "schedule", sched, problem, f"give exactly one of {_KINDS_TEXT}")
    _unknown(name, "schedule", sched, SCHEDULE_KINDS[kinds[0]])
    return _BUILDERS[kinds[0]](name, sched, app)


def _anarchon(name: str, ours: Any) -> dict:
    if not isinstance(ours, dict):
        raise _error(name, "anarchon", ours, "not an object",
                     'give the per-entry settings as an object, e.g. {"jitter": 2, "max_late": 60}')
    _unknown(name, "anarchon", ours, ANARCHON_KEYS)
    for key in ("anchor", "catch_up_window", "jitter", "max_late"):
        if key in ours and not is_number(ours[key]):
            raise _error(name, f"anarchon.{key}", ours[key], "not a number of seconds",
                         "give seconds as a number (JSON has no timedelta)")
    if "catch_up" in ours and not isinstance(ours["catch_up"], str):  # its value: timing
        raise _error(name, "anarchon.catch_up", ours["catch_up"], "not a catch-up policy",
                     'give "newest" (the default), "all" or "none"')
    for key in ("start_at", "end_at"):  # the instant itself: plan.build_plan (slots.window)
        if key in ours and ours[key] is not None and not isinstance(ours[key], str):
            raise _error(name, f"anarchon.{key}", ours[key], "not an instant",
                         'give ISO 8601 text with a UTC offset, e.g. "2026-03-01T09:00:00+01:00"')
    lease = ours.get("lease")
    if lease is not None and not isinstance(lease, (bool, dict)):
        raise _error(name, "anarchon.lease", lease, "not true, false or an object",
                     'give true for the defaults or an object such as {"duration": 30}')
    return dict(ours)


def parse(name: str, obj_or_text: dict | str | bytes, *, app,
          entry_cls: type[beat.ScheduleEntry] = beat.ScheduleEntry) -> beat.ScheduleEntry:
    """Check a definition (a dict or its JSON text) and build the ``ScheduleEntry`` it stands for.

    The entry holds real schedule objects (``celery.schedules.schedule``, ``crontab`` with its own
    zone, :class:`celery_anarchon.cron`, ``solar``) and ``options['anarchon']`` as a beat_schedule
    entry would. What needs the slots (a crontab step larger than its field, an expression that
    never fires, a period that is not whole milliseconds, an anchor) and the timing rules are
    checked by :func:`celery_anarchon.schedule.plan.build_plan`, which every caller applies next, with the
    start-up messages (building the slots once per entry: they cost most of a sync of 10,000
    crontab entries).

    :param name: the entry's name (named in every error).
    :param app: the Celery app (its ``timezone`` for a crontab or cron without ``timezone``).
    :param entry_cls: the entry class (the scheduler's ``Entry`` or Celery's ``ScheduleEntry``).
    :raises ConfigError: naming the entry, the key, the value and the fix: not JSON, an unknown
        key, a value of the wrong type, a bad crontab or cron expression, an unknown time zone.
    """
    if not isinstance(name, str) or not name:
        raise limits.unnamed(name)
    text_in = isinstance(obj_or_text, (str, bytes))
    obj = _load(name, obj_or_text) if text_in else obj_or_text
    if not isinstance(obj, dict):
        raise ConfigError(f"entry {name!r}: the definition {_show(obj)} is not a JSON object; fix: "
                          'give {"task": ..., "schedule": ...}')
    if not text_in:
        obj = json.loads(canonical(obj, name=name))  # a copy, JSON values only
    check_keys(name, obj)
    task = obj.get("task")
    if not isinstance(task, str) or not task:
        raise _error(name, "task", task, "missing or not a task name",
                     'give the registered name of the task, e.g. "proj.tasks.report"')
    limits.plain_text(task, f"entry {limits.shown(name)}: task",
                      'give the registered name of the task, e.g. "proj.tasks.report"')
    args, kwargs, options = obj.get("args", []), obj.get("kwargs", {}), obj.get("options", {})
    if not isinstance(args, list):
        raise _error(name, "args", args, "not a list", "give the positional arguments as a list")
    if not isinstance(kwargs, dict):
        raise _error(name, "kwargs", kwargs, "not an object", "give the keyword arguments as an object")
    if not isinstance(options, dict):
        raise _error(name, "options", options, "not an object",
                     'give apply_async options as an object, e.g. {"queue": "reports"}')
    if "anarchon" in options:
        raise _error(name, "options.anarchon", options["anarchon"], "misplaced",
                     'put the per-entry settings at the top level: "anarchon": {...}')
    ours = _anarchon(name, obj.get("anarchon", {}))
    if "schedule" not in obj:
        raise _error(name, "schedule", None, "missing", f"give one of {_KINDS_TEXT}")
    schedule = _schedule(name, obj["schedule"], app)
    if ours:
        options["anarchon"] = ours
    return entry_cls(name=name, task=task, schedule=schedule, args=tuple(args), kwargs=kwargs,
                     options=options, app=app)
