"""Solar slots: the events of a ``celery.schedules.solar`` schedule, computed with ephem."""
from __future__ import annotations

import math
import threading

from celery.schedules import solar

from celery_anarchon.errors import ConfigError
from celery_anarchon.schedule.slots.base import SlotSchedule, whole_ms

#: ephem.Date("1970/1/1"): ephem dates are days since 1899-12-31 12:00
_EPHEM_UNIX_EPOCH = 25_567.5
#: a conservative lower bound of the gap between solar events: one event a day, polar edge cases
SOLAR_SHORTEST_GAP_MS = 3_600_000


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
        first_s = whole_ms(after_ms) // 1000 + 1
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

