"""Slots of a schedule class of the user's: any class with ``anarchon_next`` and
``anarchon_shortest_gap`` (docs/design.md "Slots", any other schedule class)."""
from __future__ import annotations

import datetime

from celery_anarchon.errors import ConfigError
from celery_anarchon.schedule.slots.base import (
    ONE_MS, UTC_EPOCH, SlotSchedule, ms_to_datetime, whole_ms,
)


class CustomSlots(SlotSchedule):
    """Slots of a schedule class of the user's, through its two methods
    ``anarchon_next(after: datetime) -> datetime`` (aware UTC in and out, strictly later) and
    ``anarchon_shortest_gap() -> timedelta``. What they return is checked: ConfigError if not."""

    def __init__(self, entry: str, sched):
        self._entry, self._sched = entry, sched
        self._name = f"{type(sched).__module__}.{type(sched).__qualname__}"
        gap = sched.anarchon_shortest_gap()
        if not isinstance(gap, datetime.timedelta) or gap < ONE_MS:
            raise ConfigError(f"entry {entry!r}: {self._name}.anarchon_shortest_gap() returned "
                              f"{gap!r}; fix: return a timedelta of at least one millisecond")
        self.shortest_gap_ms = gap // ONE_MS

    def next_after(self, after_ms: int) -> int:
        after = ms_to_datetime(whole_ms(after_ms))
        found = self._sched.anarchon_next(after)
        if not isinstance(found, datetime.datetime) or found.utcoffset() is None:
            raise ConfigError(f"entry {self._entry!r}: {self._name}.anarchon_next({after}) "
                              f"returned {found!r}; fix: return an aware datetime "
                              "(tzinfo=datetime.timezone.utc)")
        if found <= after:
            raise ConfigError(f"entry {self._entry!r}: {self._name}.anarchon_next({after}) "
                              f"returned {found}, not later; fix: return the first run "
                              "strictly after its argument")
        return -((UTC_EPOCH - found) // ONE_MS)  # rounded up: still strictly later

    def describe(self) -> str:
        own_repr = type(self._sched).__repr__ is not object.__repr__
        return f"kind=custom class={self._name}" + (f" repr={self._sched!r}" if own_repr else "")

