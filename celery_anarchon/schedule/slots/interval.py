"""Interval slots: ``anchor + k * period`` for every integer k (docs/design.md "Slots", interval).

A number, a ``timedelta`` or ``celery.schedules.schedule``: the multiples of the period since the
Unix epoch, shifted by the entry's ``anchor``; ``relative=True`` is refused. Exact integer math.
"""
from __future__ import annotations

import datetime
import math
from decimal import Decimal

from celery.schedules import schedule as interval_schedule

from celery_anarchon.errors import ConfigError
from celery_anarchon.limits import LAST_SLOT_MS, LAST_SLOT_S, year_of
from celery_anarchon.schedule.slots.base import SlotSchedule, whole_ms


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
        k = (whole_ms(after_ms) - self.anchor_ms) // self.period_ms + 1
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


def interval_slots(entry: str, sched: interval_schedule, anchor_s) -> IntervalSlots:
    """The :class:`IntervalSlots` of Celery's interval schedule ``sched``, shifted by
    ``anchor_s`` (seconds, or ``None``).

    :raises ConfigError: ``relative=True``, a period that is not positive, or a period or anchor
        that is not whole milliseconds.
    """
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

