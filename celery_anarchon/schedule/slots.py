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

import abc
import bisect
import datetime
import functools
import math
import operator
import re
import threading
import zoneinfo
from decimal import Decimal

from celery.schedules import BaseSchedule, crontab, schedstate, solar
from celery.schedules import schedule as interval_schedule
from croniter import CroniterBadDateError, croniter

from celery_anarchon.schedule.zones import did_you_mean, first_transition_in, offset_s, transitions_in, zone_name
from celery_anarchon.errors import ConfigError
from celery_anarchon.limits import LAST_SLOT_MS, LAST_SLOT_S, object_repr, year_of

__all__ = ["SlotSchedule", "slots_for", "cron"]

_ONE_S = datetime.timedelta(seconds=1)
_ONE_MS = datetime.timedelta(milliseconds=1)
_NAIVE_EPOCH = datetime.datetime(1970, 1, 1)
_UTC_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_LOOKBACK_S = 2 * 86_400  # longer than any backward jump of a wall clock (offsets are within 24 h)
_CHECK_FROM_S = 946_684_800  # 2000-01-01T00:00Z: "does this schedule ever fire?" is asked from here
_EPHEM_UNIX_EPOCH = 25_567.5  # ephem.Date("1970/1/1"): ephem dates are days since 1899-12-31 12:00
SOLAR_SHORTEST_GAP_MS = 3_600_000  # a conservative lower bound: one event a day, polar edge cases

# The five cron fields in cron order: (name as in crontab(), lowest, highest).
_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day_of_month", 1, 31),
           ("month_of_year", 1, 12), ("day_of_week", 0, 6))
_ALIASES = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
            "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
            "@hourly": "0 * * * *"}
_RANDOM_OR_HASHED = re.compile(r"^[hr](\(\d+-\d+\))?(/\d+)?$", re.IGNORECASE)


def ms_to_datetime(ms: int) -> datetime.datetime:
    """An instant in UTC milliseconds as an aware UTC datetime."""
    return _UTC_EPOCH + datetime.timedelta(milliseconds=ms)


def datetime_to_ms(dt: datetime.datetime) -> int:
    """An aware datetime (naive: taken as UTC) as UTC milliseconds, rounded down."""
    if dt.tzinfo is None or dt.utcoffset() is None:
        dt = dt.replace(tzinfo=datetime.timezone.utc)
    return (dt - _UTC_EPOCH) // _ONE_MS


def _whole_ms(after_ms: int | float) -> int:
    # Slots are whole milliseconds, so the first slot after x is the first slot after floor(x).
    return after_ms if isinstance(after_ms, int) else math.floor(after_ms)


class SlotSchedule(abc.ABC):
    """The slots of one entry: nominal due instants, UTC integer milliseconds, the same on every
    host.

    ``shortest_gap_ms`` is a lower bound of the gap between consecutive slots, in milliseconds (used
    by the jitter rule, docs/design.md "Timing"); each kind documents how it is derived.
    """

    shortest_gap_ms: int

    @abc.abstractmethod
    def next_after(self, after_ms: int) -> int:
        """The first slot strictly later than ``after_ms`` (both UTC milliseconds)."""

    @abc.abstractmethod
    def describe(self) -> str:
        """Canonical text of the schedule for the entry's fingerprint (kind, fields, time zone,
        anchor): the same input gives the same text on every host."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"


class IntervalSlots(SlotSchedule):
    """Slots ``anchor_ms + k * period_ms`` for every integer k (docs/design.md "Slots", interval),
    up to the end of the year 9999 (:data:`~celery_anarchon.limits.LAST_SLOT_MS`).

    Exact integer math; ``shortest_gap_ms`` is the period.

    :param entry: the entry's name, for the error of a slot past the year 9999.
    """

    def __init__(self, period_ms: int, anchor_ms: int = 0, *, entry: str = ""):
        self.period_ms = self.shortest_gap_ms = period_ms
        self.anchor_ms = anchor_ms % period_ms  # anchors one period apart give the same slots
        self.entry = entry

    def next_after(self, after_ms: int) -> int:
        """The first slot after ``after_ms``.

        :raises ConfigError: that slot comes after the year 9999 (no date, ISO time or store
            clock reaches it), naming the entry, the period, the year and the fix.
        """
        k = (_whole_ms(after_ms) - self.anchor_ms) // self.period_ms + 1
        slot = self.anchor_ms + k * self.period_ms
        if slot > LAST_SLOT_MS:
            raise ConfigError(
                f"entry {self.entry!r}: every {self.period_ms / 1000:g} s: its next slot would be in "
                f"the year {year_of(slot)}, after 9999, the last year a slot can have (dates, "
                "ISO 8601 times and the stores' clocks end there); fix: give a shorter period "
                "(a crontab runs yearly at most: crontab(0, 0, day_of_month=1, month_of_year=1))")
        return slot

    def describe(self) -> str:
        return f"kind=interval period_ms={self.period_ms} anchor_ms={self.anchor_ms}"


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
_ORIG_TEXTS = operator.attrgetter(*(f"_orig_{name}" for name, _, _ in _FIELDS))


def _matcher(expr: str, day_or: bool, where: str) -> _WallMatcher:
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
        matcher.first_at_or_after(_CHECK_FROM_S)
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


def _shortest_gap_ms(minutes, hours) -> int:
    """The shortest gap between consecutive wall times of one day, or from a day's last time to
    the next day's first: a lower bound (restricted days only make gaps longer). DST can shorten a
    real gap on transition days (a fixed-time time in a skipped interval runs at the jump; a
    wildcard entry runs in both copies of a repeated half hour in Lord Howe): not modelled."""
    times = sorted(h * 60 + m for h in hours for m in minutes)
    gaps = [b - a for a, b in zip(times, times[1:])] + [times[0] + 1440 - times[-1]]
    return min(gaps) * 60_000


def _check_steps(where: str, field_texts) -> None:
    """Refuse a step larger than its field's range (``*/120`` minutes): Celery and croniter
    silently keep only the first value (minute 0), i.e. once an hour, not every 120 minutes; and
    a field given as a bool (``minute=False``: Celery reads 0)."""
    for (name, lo, hi), text in zip(_FIELDS, field_texts):
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
    docstring; docs/design.md "Slots"). ``shortest_gap_ms``: see :func:`_shortest_gap_ms`; on DST
    transition days the real gap can be shorter."""

    def __init__(self, *, kind: str, expr: str, day_or: bool, zone: datetime.tzinfo,
                 fixed_time: bool, matcher: _WallMatcher):
        self.kind, self.expr, self.day_or, self.zone = kind, expr, day_or, zone
        self.fixed_time = fixed_time
        self._matcher = matcher
        self.shortest_gap_ms = _shortest_gap_ms(matcher.minutes, matcher.hours)
        #: the last (after_ms, slot) answered: the entries sharing this object are seeded with
        #: the same instant (one tuple, replaced whole: safe to read from any thread)
        self._last: tuple[int | float, int] | None = None

    def next_after(self, after_ms: int) -> int:
        last = self._last
        if last is not None and last[0] == after_ms:
            return last[1]
        start_s = _whole_ms(after_ms) // 1000 + 1  # slots are whole seconds
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


def _resolve_zone(tz, where: str) -> datetime.tzinfo:
    if isinstance(tz, datetime.tzinfo):
        return tz
    if isinstance(tz, str):
        try:
            return zoneinfo.ZoneInfo(tz)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            pass
    raise ConfigError(f"{where}: unknown time zone {tz!r}{did_you_mean(tz)}; fix: use an IANA "
                      "name such as 'Europe/Paris' (see zoneinfo.available_timezones()) or a "
                      "tzinfo")


def _parse_cron(expr, where: str) -> tuple[str, list[str]]:
    """Validate a cron(5) string (ConfigError) and return it normalised with its five fields."""
    if not isinstance(expr, str):
        raise ConfigError(f"{where}: a cron expression must be a string, got {type(expr).__name__}"
                          "; fix: pass text such as '0 22 L * *'")
    text = " ".join(expr.split())
    text = _ALIASES.get(text.lower(), text)
    fields = text.split(" ")
    if len(fields) != 5:
        raise ConfigError(f"{where}: {expr!r} has {len(fields)} fields; fix: give exactly five "
                          "(minute hour day-of-month month day-of-week), seconds and years are "
                          "not supported")
    for field in fields:
        if any(_RANDOM_OR_HASHED.match(part) for part in field.split(",")):
            raise ConfigError(f"{where}: {expr!r} uses croniter's random/hashed value {field!r}, "
                              "which differs between hosts; fix: write the value itself")
    _check_steps(where, fields)
    return text, fields


class cron(BaseSchedule):
    """A cron(5) expression in a time zone: a ``beat_schedule`` schedule value for what Celery's
    crontab cannot say (``L``, ``W``, ``#``, day-of-month OR day-of-week, a per-entry zone).

    ``cron("0 22 L * *", tz="Europe/Paris")`` runs at 22:00 Paris time on the last day of every
    month. ``tz`` is an IANA name or a tzinfo; None means the app's ``timezone``. DST follows
    cron(8) as crontab entries do (module docstring; docs/design.md "Slots"). The expression is
    validated here: a bad expression, a step larger than its field (``*/120`` minutes), a random
    or hashed value, an expression that never fires or an unknown zone raise :class:`ConfigError`.
    It also works under Celery's own beat: ``is_due`` and ``remaining_estimate`` follow the slots.
    """

    def __init__(self, expr: str, tz: str | datetime.tzinfo | None = None, *,
                 nowfun=None, app=None):
        where = f"cron({expr!r})"
        self.expr, fields = _parse_cron(expr, where)
        self.fixed_time = not (fields[0].startswith("*") or fields[1].startswith("*"))
        self._tz_arg = tz
        self._zone = None if tz is None else _resolve_zone(tz, where)
        self._matcher = _matcher(self.expr, True, where)
        self.shortest_gap_ms = _shortest_gap_ms(self._matcher.minutes, self._matcher.hours)
        super().__init__(nowfun=nowfun, app=app)

    @property
    def tz(self) -> datetime.tzinfo:
        """The entry's time zone: its own, else the app's."""
        return self._zone if self._zone is not None else self.app.timezone

    def slots(self, app_timezone: datetime.tzinfo) -> CronSlots:
        """The slots in this schedule's own zone, else in ``app_timezone``."""
        zone = self._zone if self._zone is not None else app_timezone
        return CronSlots(kind="cron", expr=self.expr, day_or=True, zone=zone,
                         fixed_time=self.fixed_time, matcher=self._matcher)

    def _next(self, after: datetime.datetime) -> datetime.datetime:
        after_ms = datetime_to_ms(self.maybe_make_aware(after))
        return ms_to_datetime(self.slots(self.tz).next_after(after_ms))

    def remaining_estimate(self, last_run_at: datetime.datetime) -> datetime.timedelta:
        """Time from now to the first slot after ``last_run_at`` (negative when overdue)."""
        return self._next(last_run_at) - self.maybe_make_aware(self.now())

    def is_due(self, last_run_at: datetime.datetime) -> schedstate:
        """Celery's ``(is_due, seconds until the next check)``: due when a slot after
        ``last_run_at`` has come; the next check is the next slot after now."""
        rem = self.remaining_estimate(last_run_at).total_seconds()
        if rem > 0:
            return schedstate(False, rem)
        now = self.maybe_make_aware(self.now())
        return schedstate(True, (self._next(now) - now).total_seconds())

    def _key(self):
        return self.expr, None if self._zone is None else zone_name(self._zone)

    def __repr__(self) -> str:
        tz = "" if self._zone is None else f", tz={zone_name(self._zone)!r}"
        return f"cron({self.expr!r}{tz})"

    def __eq__(self, other) -> bool:
        return self._key() == other._key() if isinstance(other, cron) else NotImplemented

    def __hash__(self) -> int:
        return hash(self._key())

    def __reduce__(self):
        return self.__class__, (self.expr, self._tz_arg)


@functools.lru_cache(maxsize=256)
def _overrides_tz(cls: type) -> bool:
    """True when a class between ``cls`` and BaseSchedule defines ``tz`` (a subclass's zone)."""
    return next(k for k in cls.__mro__ if "tz" in vars(k)) is not BaseSchedule


def _crontab_zone(sched: crontab, app_timezone: datetime.tzinfo):
    own = vars(sched).get("tz")  # set on the instance (django-celery-beat's TzAwareCrontab)
    if own is None and _overrides_tz(type(sched)):
        own = sched.tz
    return app_timezone if own is None else own


def _crontab_slots(entry: str, sched: crontab, app_timezone: datetime.tzinfo) -> CronSlots:
    try:
        texts = _ORIG_TEXTS(sched)
    except AttributeError:  # a crontab subclass without Celery's _orig_* fields
        texts = tuple(getattr(sched, f"_orig_{name}", None) for name, _, _ in _FIELDS)
    key = texts if all(type(t) in (str, int) for t in texts) else None
    tz = _crontab_zone(sched, app_timezone)
    try:
        shared = _CRON_SLOTS.get((key, tz)) if key is not None else None
    except TypeError:  # a zone that cannot be hashed: nothing shared
        key = shared = None
    if shared is not None:
        return shared
    where = f"entry {entry!r}: crontab"
    _check_steps(where, texts)
    known = _CRONTAB_EXPRS.get(key) if key is not None else None
    if known is None:
        values = [sched.minute, sched.hour, sched.day_of_month, sched.month_of_year,
                  sched.day_of_week]
        expr = " ".join("*" if set(v) == set(range(lo, hi + 1)) else ",".join(map(str, sorted(v)))
                        for v, (_, lo, hi) in zip(values, _FIELDS))
        wildcard = any(isinstance(t, str) and t.strip().startswith("*") for t in texts[:2])
        known = (expr, wildcard)
        if key is not None and len(_CRONTAB_EXPRS) < _MAX_MATCHERS:
            _CRONTAB_EXPRS[key] = known
    expr, wildcard = known
    zone = _resolve_zone(tz, where)
    slots = CronSlots(kind="crontab", expr=expr, day_or=False, zone=zone, fixed_time=not wildcard,
                      matcher=_matcher(expr, False, where))
    if key is not None and len(_CRON_SLOTS) < _MAX_MATCHERS:
        _CRON_SLOTS[(key, tz)] = slots
    return slots


def _ms_of(value, entry: str, what: str) -> int:
    """Seconds (int, float, Decimal or timedelta) as whole milliseconds, exactly."""
    if isinstance(value, datetime.timedelta):
        micros = value // datetime.timedelta(microseconds=1)
    elif isinstance(value, (int, float, Decimal)) and not isinstance(value, bool) \
            and math.isfinite(value) and abs(value) <= LAST_SLOT_S:  # no slot lies beyond
        micros = Decimal(repr(value) if isinstance(value, float) else value) * 1_000_000
    else:
        micros = None
    if micros is None or micros % 1000:
        raise ConfigError(f"entry {entry!r}: {what} {value!r} is not a whole number of "
                          "milliseconds; fix: give seconds (int, float or timedelta) with at "
                          "most three decimals")
    return int(micros // 1000)


def _interval_slots(entry: str, sched: interval_schedule, anchor_s) -> IntervalSlots:
    if sched.relative:
        raise ConfigError(
            f"entry {entry!r}: schedule({sched.run_every!r}, relative=True) rounds to wall-clock "
            "boundaries, which have no fixed period across DST, so hosts could not agree on its "
            "slots; fix: use a crontab (e.g. crontab(minute='*/15')) for runs on clock "
            "boundaries, or drop relative=True and shift the slots with "
            "options={'anarchon': {'anchor': <seconds>}}")
    period_ms = _ms_of(sched.run_every, entry, "period")
    if period_ms <= 0:
        raise ConfigError(f"entry {entry!r}: period {sched.run_every!r} is not positive; "
                          "fix: give a period of at least one millisecond")
    anchor_ms = 0 if anchor_s is None else _ms_of(anchor_s, entry, "anchor")
    return IntervalSlots(period_ms, anchor_ms, entry=entry)


class SolarSlots(SlotSchedule):
    """The events of a ``celery.schedules.solar`` schedule, computed with ephem from the instant
    asked about. Slots are whole seconds (the event rounded down). ``shortest_gap_ms`` is a
    conservative constant, :data:`SOLAR_SHORTEST_GAP_MS` (one hour)."""

    shortest_gap_ms = SOLAR_SHORTEST_GAP_MS

    def __init__(self, entry: str, sched: solar, ephem):
        self._entry, self._ephem = entry, ephem
        self.event, self.lat, self.lon = sched.event, sched.lat, sched.lon
        self._observer = sched.cal.copy()  # ephem observers are mutable: ours, behind a lock
        self._method, self._use_center = sched.method, sched.use_center
        self._max_days = getattr(sched, "max_search_days", 366)
        self._lock = threading.Lock()

    def next_after(self, after_ms: int) -> int:
        first_s = _whole_ms(after_ms) // 1000 + 1
        ephem, sun = self._ephem, self._ephem.Sun()
        kwargs = {"use_center": True} if self._use_center else {}
        start = ephem.Date(_EPHEM_UNIX_EPOCH + first_s / 86_400)
        with self._lock:
            for _ in range(self._max_days + 2):
                self._observer.date = start
                try:
                    event = getattr(self._observer, self._method)(sun, start=start, **kwargs)
                except ephem.CircumpolarError:  # no such event that day (polar day or night)
                    start = self._observer.next_antitransit(sun, start=start)
                    continue
                slot_s = math.floor((float(event) - _EPHEM_UNIX_EPOCH) * 86_400)
                if slot_s >= first_s:
                    return slot_s * 1000
                start = ephem.Date(float(event) + 1 / 86_400)
        raise ConfigError(f"entry {self._entry!r}: solar event {self.event!r} does not happen at "
                          f"latitude {self.lat}, longitude {self.lon} within {self._max_days} "
                          "days; fix: choose another event or location")

    def describe(self) -> str:
        return f"kind=solar event={self.event} lat={self.lat!r} lon={self.lon!r}"


class CustomSlots(SlotSchedule):
    """Slots of a schedule class of the user's, through its two methods
    ``anarchon_next(after: datetime) -> datetime`` (aware UTC in and out, strictly later) and
    ``anarchon_shortest_gap() -> timedelta``. What they return is checked: ConfigError if not."""

    def __init__(self, entry: str, sched):
        self._entry, self._sched = entry, sched
        self._name = f"{type(sched).__module__}.{type(sched).__qualname__}"
        gap = sched.anarchon_shortest_gap()
        if not isinstance(gap, datetime.timedelta) or gap < _ONE_MS:
            raise ConfigError(f"entry {entry!r}: {self._name}.anarchon_shortest_gap() returned "
                              f"{gap!r}; fix: return a timedelta of at least one millisecond")
        self.shortest_gap_ms = gap // _ONE_MS

    def next_after(self, after_ms: int) -> int:
        after = ms_to_datetime(_whole_ms(after_ms))
        found = self._sched.anarchon_next(after)
        if not isinstance(found, datetime.datetime) or found.utcoffset() is None:
            raise ConfigError(f"entry {self._entry!r}: {self._name}.anarchon_next({after}) "
                              f"returned {found!r}; fix: return an aware datetime "
                              "(tzinfo=datetime.timezone.utc)")
        if found <= after:
            raise ConfigError(f"entry {self._entry!r}: {self._name}.anarchon_next({after}) "
                              f"returned {found}, not later; fix: return the first run "
                              "strictly after its argument")
        return -((_UTC_EPOCH - found) // _ONE_MS)  # rounded up: still strictly later

    def describe(self) -> str:
        own_repr = type(self._sched).__repr__ is not object.__repr__
        return f"kind=custom class={self._name}" + (f" repr={self._sched!r}" if own_repr else "")


def text_schedule_error(entry: str, text: str) -> ConfigError:
    """The error of a schedule given as text (``"every 5 minutes"``), which neither Celery nor
    we read: naming the entry, the text and the schedule objects to give instead."""
    shown = repr(text) if len(text) <= 40 else repr(text[:40]) + "..."
    return ConfigError(
        f"entry {entry!r}: schedule {shown} is text, which Celery cannot read as a schedule; "
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
        return schedule.slots(_resolve_zone(app_timezone, f"entry {entry!r}: app timezone"))
    if isinstance(schedule, crontab):
        return _crontab_slots(entry, schedule, app_timezone)
    if isinstance(schedule, solar):
        try:
            import ephem
        except ImportError:
            raise ConfigError(f"entry {entry!r}: solar schedule {object_repr(schedule)} needs "
                              "the ephem package; fix: pip install celery-anarchon[solar] "
                              "(or pip install ephem)") from None
        slots = SolarSlots(entry, schedule, ephem)
        slots.next_after(_CHECK_FROM_S * 1000)  # an event that never happens fails at start-up
        return slots
    if isinstance(schedule, interval_schedule):
        return _interval_slots(entry, schedule, anchor_s)
    if isinstance(schedule, str):
        raise text_schedule_error(entry, schedule)
    raise ConfigError(
        f"entry {entry!r}: schedule {object_repr(schedule)} of class "
        f"{type(schedule).__qualname__} is not supported: every host must compute the same "
        "slots from it. Fix: use a number, a timedelta, crontab, solar or celery_anarchon.cron, "
        "or add two methods to the class: anarchon_next(self, after: datetime) -> datetime "
        "(aware UTC in and out, strictly later) and anarchon_shortest_gap(self) -> timedelta")
