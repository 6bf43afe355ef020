"""Cron-style slots on the wall clock of a time zone: :class:`CronSlots`, shared by Celery's
``crontab`` (days matched with AND, built here from its fields: :func:`crontab_slots`) and
:class:`~celery_anarchon.schedule.slots.cron_text.cron` (cron(5) syntax, day OR).

DST rules (docs/design.md "Slots"). An entry whose minute or hour field text starts with ``*`` (``*``,
``*/15``) is a *wildcard* entry: it follows real time and runs at every real instant whose local
wall time matches. Every other entry is a *fixed-time* entry: it runs once per matching local time
per day, at the first instant at which the wall clock shows that time or a later one. In
America/New_York:

- 2025-11-02, the clock falls back from 01:59:59 EDT to 01:00 EST. ``0 * * * *`` (wildcard) runs
  at 01:00 EDT (05:00Z) and again at 01:00 EST (06:00Z): 25 runs that day. ``30 1 * * *``
  (fixed-time) runs once, at 01:30 EDT (05:30Z), not again at 01:30 EST.
- 2025-03-09, the clock jumps from 01:59:59 EST to 03:00 EDT. ``0 * * * *`` never sees 02:00: 23
  runs. ``30 2 * * *`` runs right after the jump, at 03:00 EDT (07:00Z). Several local times that
  fall on the same instant (all of a skipped interval) are one slot.

Implementation: croniter only does wall-clock arithmetic, on naive datetimes (its own handling of
aware datetimes across DST follows other rules). Wall times are mapped to UTC here, walking the
timeline in segments of constant UTC offset (:mod:`celery_anarchon.schedule.zones`).
"""
from __future__ import annotations

import bisect
import datetime
import functools
import operator
import threading

from celery.schedules import BaseSchedule, crontab
from croniter import CroniterBadDateError, croniter

from celery_anarchon.errors import ConfigError
from celery_anarchon.schedule.slots.base import CHECK_FROM_S, SlotSchedule, whole_ms
from celery_anarchon.schedule.zones import (
    first_transition_in, offset_s, resolve_zone, transitions_in, zone_name,
)

_ONE_S = datetime.timedelta(seconds=1)
_NAIVE_EPOCH = datetime.datetime(1970, 1, 1)
_LOOKBACK_S = 2 * 86_400  # longer than any backward jump of a wall clock (offsets are within 24 h)

# The five cron fields in cron order: (name as in crontab(), lowest, highest).
FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day_of_month", 1, 31),
          ("month_of_year", 1, 12), ("day_of_week", 0, 6))


class _WallMatcher:
    """The wall-clock times matching a 5-field cron expression, as naive seconds since 1970-01-01
    00:00 wall time (croniter on naive datetimes: pure calendar arithmetic, no time zone).

    An expression that matches every day (day-of-month, month and day-of-week all ``*``: the
    daily, hourly and every-n-minutes schedules) is answered by arithmetic on its times of day,
    without croniter (the same answers, about a hundred times faster: 100,000 entries are seeded
    in a fraction of a second)."""

    def __init__(self, expr: str, day_or: bool):
        self._iter = croniter(expr, _NAIVE_EPOCH, day_or=day_or, ret_type=datetime.datetime)
        self._lock = threading.Lock()  # croniter keeps a cursor
        minutes, hours = self._iter.expanded[0], self._iter.expanded[1]
        self.minutes = range(60) if "*" in minutes else sorted(minutes)
        self.hours = range(24) if "*" in hours else sorted(hours)
        every_day = all(field == ["*"] for field in self._iter.expanded[2:5])
        #: seconds of the day that match, ascending, when every day matches (else None)
        self._day_s = (sorted(h * 3600 + m * 60 for h in self.hours for m in self.minutes)
                       if every_day and len(self._iter.expanded) == 5 else None)

    def first_at_or_after(self, wall_s: int) -> int:
        if self._day_s is not None:
            day, into = divmod(wall_s, 86_400)
            i = bisect.bisect_left(self._day_s, into)
            if i == len(self._day_s):
                return (day + 1) * 86_400 + self._day_s[0]
            return day * 86_400 + self._day_s[i]
        start = _NAIVE_EPOCH + datetime.timedelta(seconds=wall_s - 1)
        with self._lock:
            found = self._iter.get_next(datetime.datetime, start_time=start)
        return (found - _NAIVE_EPOCH) // _ONE_S


#: matchers by (expression, day_or): entries with the same expression share one (thread-safe)
_MATCHERS: dict[tuple[str, bool], _WallMatcher] = {}
#: at most this many distinct expressions are kept
_MAX_MATCHERS = 10_000
#: a crontab's field texts (its ``_orig_*``) -> (cron expression, wildcard)
_CRONTAB_EXPRS: dict[tuple, tuple[str, bool]] = {}
#: (field texts, zone as the crontab gives it) -> its CronSlots: checked and built once, shared
#: by the entries of that crontab (a CronSlots holds no state of an entry; 100,000 entries of 720
#: daily times build 720)
_CRON_SLOTS: dict[tuple, CronSlots] = {}
#: a crontab's field texts, as Celery keeps them (``_orig_minute``, ...)
_ORIG_TEXTS = operator.attrgetter(*(f"_orig_{name}" for name, _, _ in FIELDS))


def wall_matcher(expr: str, day_or: bool, where: str) -> _WallMatcher:
    """The (shared) matcher of a 5-field expression, checked.

    :param where: what the expression belongs to, for the error (``entry 'x': crontab``).
    :raises ConfigError: the expression is not valid (naming each field croniter refuses), or
        it never fires.
    """
    known = _MATCHERS.get((expr, day_or))
    if known is not None:
        return known
    try:
        matcher = _WallMatcher(expr, day_or)
    except (ValueError, TypeError, KeyError) as exc:  # croniter's errors are ValueErrors
        bad = _bad_fields(expr, day_or)
        which = (" in the " + ", ".join(f"{name} field {value!r}" for name, value in bad)
                 if bad else "")
        raise ConfigError(f"{where}: {expr!r} is not a valid cron expression ({exc}){which}; fix "
                          "the field out of range: the five fields are minute (0-59), hour "
                          "(0-23), day-of-month (1-31, L, W), month (1-12, JAN-DEC) and "
                          "day-of-week (0-6, SUN-SAT, #, L), for example '0 22 L * *'") from None
    try:
        matcher.first_at_or_after(CHECK_FROM_S)
    except CroniterBadDateError:
        raise ConfigError(f"{where}: {expr!r} never fires (no matching date within 50 years); "
                          "fix the day-of-month, month and day-of-week fields") from None
    if len(_MATCHERS) < _MAX_MATCHERS:
        _MATCHERS[(expr, day_or)] = matcher
    return matcher


_FIELD_NAMES = ("minute", "hour", "day-of-month", "month", "day-of-week")


def _bad_fields(expr: str, day_or: bool) -> list[tuple[str, str]]:
    """The (name, text) of each field of ``expr`` croniter refuses on its own (the others
    ``*``), for the error of an invalid expression."""
    fields = expr.split(" ")
    bad = []
    for i, (name, field) in enumerate(zip(_FIELD_NAMES, fields)):
        alone = " ".join(field if j == i else "*" for j in range(len(fields)))
        try:
            _WallMatcher(alone, day_or)
        except (ValueError, TypeError, KeyError):
            bad.append((name, field))
    return bad


def shortest_gap_of(minutes, hours) -> int:
    """The shortest gap between consecutive wall times of one day, or from a day's last time to
    the next day's first: a lower bound (restricted days only make gaps longer). DST can shorten a
    real gap on transition days (a fixed-time time in a skipped interval runs at the jump; a
    wildcard entry runs in both copies of a repeated half hour in Lord Howe): not modelled."""
    times = sorted(h * 60 + m for h in hours for m in minutes)
    gaps = [b - a for a, b in zip(times, times[1:])] + [times[0] + 1440 - times[-1]]
    return min(gaps) * 60_000


def check_steps(where: str, field_texts) -> None:
    """Refuse a step larger than its field's range (``*/120`` minutes): Celery and croniter
    silently keep only the first value (minute 0), i.e. once an hour, not every 120 minutes; and
    a field given as a bool (``minute=False``: Celery reads 0)."""
    for (name, lo, hi), text in zip(FIELDS, field_texts):
        if isinstance(text, bool):      # Celery takes False for 0 and True for 1
            raise ConfigError(
                f"{where}: {name} field {text!r}: not a crontab field (Celery would read it as "
                f"{int(text)}); fix: give the field as text or a number, e.g. '0', '*/15', '1-5'")
        for part in text.split(",") if isinstance(text, str) else ():
            step = part.rpartition("/")[2].strip() if "/" in part else ""
            if step.isdigit() and int(step) > hi - lo:
                unit = {"minute": "minutes", "hour": "hours", "day_of_month": "days"}.get(name)
                hint = f", or an interval schedule (timedelta({unit}={step}))" if unit else ""
                raise ConfigError(
                    f"{where}: {name} field {text!r}: the step {step} is larger than the field's "
                    f"range {lo}-{hi}, so only the first value would match, not every {step}; "
                    f"fix: use a step between 1 and {hi - lo}{hint}")


class CronSlots(SlotSchedule):
    """Slots of a crontab or cron expression in one time zone, with cron(8)'s DST rules (module
    docstring; docs/design.md "Slots"). ``shortest_gap_ms``: see :func:`shortest_gap_of`; on DST
    transition days the real gap can be shorter."""

    def __init__(self, *, kind: str, expr: str, day_or: bool, zone: datetime.tzinfo,
                 fixed_time: bool, matcher: _WallMatcher):
        self.kind, self.expr, self.day_or, self.zone = kind, expr, day_or, zone
        self.fixed_time = fixed_time
        self._matcher = matcher
        self.shortest_gap_ms = shortest_gap_of(matcher.minutes, matcher.hours)
        #: the last (after_ms, slot) answered: the entries sharing this object are seeded with
        #: the same instant (one tuple, replaced whole: safe to read from any thread)
        self._last: tuple[int | float, int] | None = None

    def next_after(self, after_ms: int) -> int:
        last = self._last
        if last is not None and last[0] == after_ms:
            return last[1]
        start_s = whole_ms(after_ms) // 1000 + 1  # slots are whole seconds
        first = self._first_fixed_time if self.fixed_time else self._first_wildcard
        slot = first(start_s) * 1000
        self._last = (after_ms, slot)
        return slot

    def _first_wildcard(self, t: int) -> int:
        # Walk segments of constant offset from t; in each, the first matching wall time shown.
        while True:
            o = offset_s(self.zone, t)
            candidate = self._matcher.first_at_or_after(t + o) - o
            jump = first_transition_in(self.zone, t, candidate)
            if jump is None:
                return candidate
            t = jump

    def _first_fixed_time(self, t: int) -> int:
        # The slot of wall time W is the first instant whose wall time is >= W. Times up to the
        # highest wall time shown before t have had theirs already (this covers a t inside the
        # second copy of a repeated interval): the highest one is at the end of a segment.
        high = t - 1 + offset_s(self.zone, t - 1)
        for jump in transitions_in(self.zone, t - _LOOKBACK_S, t - 1):
            high = max(high, jump - 1 + offset_s(self.zone, jump - 1))
        while True:
            o = offset_s(self.zone, t)
            wall = self._matcher.first_at_or_after(high + 1)
            if wall <= t + o:  # jumped over (a skipped interval) or reached at t itself
                return t
            jump = first_transition_in(self.zone, t, wall - o)
            if jump is None:
                return wall - o
            high = max(high, jump - 1 + o)
            t = jump

    def describe(self) -> str:
        return (f"kind={self.kind} expr={self.expr!r} days={'or' if self.day_or else 'and'} "
                f"tz={zone_name(self.zone)} dst={'fixed-time' if self.fixed_time else 'wildcard'}")


@functools.lru_cache(maxsize=256)
def _overrides_tz(cls: type) -> bool:
    """True when a class between ``cls`` and BaseSchedule defines ``tz`` (a subclass's zone)."""
    return next(k for k in cls.__mro__ if "tz" in vars(k)) is not BaseSchedule


def _crontab_zone(sched: crontab, app_timezone: datetime.tzinfo):
    own = vars(sched).get("tz")  # set on the instance (django-celery-beat's TzAwareCrontab)
    if own is None and _overrides_tz(type(sched)):
        own = sched.tz
    return app_timezone if own is None else own


def crontab_slots(entry: str, sched: crontab, app_timezone: datetime.tzinfo) -> CronSlots:
    """The :class:`CronSlots` of Celery's ``crontab`` ``sched`` in its own zone, else
    ``app_timezone``; shared by the entries of one crontab (its field texts and zone).

    :raises ConfigError: a step larger than its field, a field given as a bool, an expression
        that never fires, an unknown zone.
    """
    try:
        texts = _ORIG_TEXTS(sched)
    except AttributeError:  # a crontab subclass without Celery's _orig_* fields
        texts = tuple(getattr(sched, f"_orig_{name}", None) for name, _, _ in FIELDS)
    key = texts if all(type(t) in (str, int) for t in texts) else None
    tz = _crontab_zone(sched, app_timezone)
    try:
        shared = _CRON_SLOTS.get((key, tz)) if key is not None else None
    except TypeError:  # a zone that cannot be hashed: nothing shared
        key = shared = None
    if shared is not None:
        return shared
    where = f"entry {entry!r}: crontab"
    check_steps(where, texts)
    known = _CRONTAB_EXPRS.get(key) if key is not None else None
    if known is None:
        values = [sched.minute, sched.hour, sched.day_of_month, sched.month_of_year,
                  sched.day_of_week]
        expr = " ".join("*" if set(v) == set(range(lo, hi + 1)) else ",".join(map(str, sorted(v)))
                        for v, (_, lo, hi) in zip(values, FIELDS))
        wildcard = any(isinstance(t, str) and t.strip().startswith("*") for t in texts[:2])
        known = (expr, wildcard)
        if key is not None and len(_CRONTAB_EXPRS) < _MAX_MATCHERS:
            _CRONTAB_EXPRS[key] = known
    expr, wildcard = known
    zone = resolve_zone(tz, where)
    slots = CronSlots(kind="crontab", expr=expr, day_or=False, zone=zone, fixed_time=not wildcard,
                      matcher=wall_matcher(expr, False, where))
    if key is not None and len(_CRON_SLOTS) < _MAX_MATCHERS:
        _CRON_SLOTS[(key, tz)] = slots
    return slots
