"""Cron strings: :class:`cron`, a ``beat_schedule`` schedule value of ours for what Celery's
crontab cannot say (docs/design.md "Slots", cron strings), with the slots and DST rules of
:class:`~celery_anarchon.schedule.slots.wall_clock.CronSlots`."""
from __future__ import annotations

import datetime
import re

from celery.schedules import BaseSchedule, schedstate

from celery_anarchon.errors import ConfigError
from celery_anarchon.schedule.slots.base import datetime_to_ms, ms_to_datetime
from celery_anarchon.schedule.slots.wall_clock import (
    CronSlots, check_steps, shortest_gap_of, wall_matcher,
)
from celery_anarchon.schedule.zones import resolve_zone, zone_name

_ALIASES = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
            "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
            "@hourly": "0 * * * *"}
_RANDOM_OR_HASHED = re.compile(r"^[hr](\(\d+-\d+\))?(/\d+)?$", re.IGNORECASE)


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
    check_steps(where, fields)
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
        self._zone = None if tz is None else resolve_zone(tz, where)
        self._matcher = wall_matcher(self.expr, True, where)
        self.shortest_gap_ms = shortest_gap_of(self._matcher.minutes, self._matcher.hours)
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
