"""What every slot schedule is: :class:`SlotSchedule`, and instants as UTC milliseconds.

A slot is an absolute instant in UTC integer milliseconds, the same on every host
(:mod:`celery_anarchon.schedule.slots`). Pure: no I/O and no clock reads.
"""
from __future__ import annotations

import abc
import datetime
import math

ONE_MS = datetime.timedelta(milliseconds=1)
UTC_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
#: 2000-01-01T00:00Z, UTC seconds: "does this schedule ever fire?" is asked from here
CHECK_FROM_S = 946_684_800


def ms_to_datetime(ms: int) -> datetime.datetime:
    """An instant in UTC milliseconds as an aware UTC datetime."""
    return UTC_EPOCH + datetime.timedelta(milliseconds=ms)


def datetime_to_ms(dt: datetime.datetime) -> int:
    """An aware datetime (naive: taken as UTC) as UTC milliseconds, rounded down."""
    if dt.tzinfo is None or dt.utcoffset() is None:
        dt = dt.replace(tzinfo=datetime.timezone.utc)
    return (dt - UTC_EPOCH) // ONE_MS


def whole_ms(after_ms: int | float) -> int:
    """The first slot after x is the first slot after floor(x): slots are whole milliseconds."""
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

