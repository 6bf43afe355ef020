"""An entry's window: ``start_at`` / ``end_at``, the instants its slots lie between.

``options={"anarchon": {"start_at": ..., "end_at": ...}}`` (``"anarchon"`` of a store entry's
definition) bounds an entry's slots: none before ``start_at``, none after ``end_at`` (both
included). Each is an absolute instant: an aware ``datetime``, or ISO 8601 text with a UTC offset
(``"2026-01-01T00:00:00+01:00"``, ``"2026-01-01T00:00Z"``). A naive one is refused: the window is
part of the entry's fingerprint, and every host must read the same instant from it whatever its
time zone. :class:`WindowedSlots` wraps the entry's slots, so every part that asks for a slot
(the beat engine, ``next``, ``status``) sees none outside; past the end it raises
:class:`SlotsEnded`. Pure: no I/O and no clock reads.
"""
from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from celery_anarchon._util import iso
from celery_anarchon.errors import ConfigError
from celery_anarchon.limits import LAST_SLOT_MS, shown_value
from celery_anarchon.schedule.slots.base import SlotSchedule, datetime_to_ms, whole_ms

#: the keys of ``options['anarchon']`` that make the window
WINDOW_KEYS = ("start_at", "end_at")
#: the first instant a window may name, UTC ms (1970-01-01T00:00Z)
_FIRST_MS = 0


class SlotsEnded(ConfigError):
    """No slot of the entry comes after the instant asked about: its ``end_at`` is reached.

    A :class:`~celery_anarchon.errors.ConfigError`, so a part that stops on an entry whose next
    slot cannot be computed stops here too; the beat engine, ``next`` and ``status`` tell it
    apart: the entry has ended, nothing is wrong.

    :ivar end_ms: the entry's ``end_at``, UTC ms.
    """

    def __init__(self, entry: str, end_ms: int) -> None:
        self.entry, self.end_ms = entry, end_ms
        super().__init__(f"entry {entry!r}: no more slots: it ended at {iso(end_ms)} (its "
                         "end_at)")


def instant_ms(entry: str, key: str, value: Any, *, where: str | None = None) -> int:
    """``start_at`` or ``end_at`` of entry ``entry`` as UTC ms.

    :param value: an aware ``datetime`` or ISO 8601 text with a UTC offset.
    :param where: what the value is, first in a message (default: the entry's
        ``options['anarchon'][key]`` and the value).
    :raises ConfigError: naming the entry, the key, the value and the fix: not a datetime or
        text, text that is no ISO 8601 instant, no UTC offset (naive), outside 1970..9999.
    """
    if where is None:
        where = f"entry {entry!r}: options['anarchon'][{key!r}] = {shown_value(value)}"
    example = "e.g. '2026-03-01T09:00:00+01:00' or datetime(2026, 3, 1, 8, tzinfo=timezone.utc)"
    if isinstance(value, str):
        try:
            value = datetime.datetime.fromisoformat(value)
        except ValueError:
            raise ConfigError(f"{where}: not an ISO 8601 date and time; fix: give an instant with "
                              f"its UTC offset, {example}") from None
    if not isinstance(value, datetime.datetime):
        raise ConfigError(f"{where}: not a date and time; fix: give an aware datetime or ISO "
                          f"8601 text with a UTC offset, {example}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ConfigError(f"{where}: no UTC offset (a naive time would be read in each host's "
                          f"own zone); fix: give the offset, {example}")
    try:
        ms = datetime_to_ms(value)
    except OverflowError:
        ms = -1
    if not _FIRST_MS <= ms <= LAST_SLOT_MS:
        raise ConfigError(f"{where}: outside the years 1970 to 9999, where slots lie; fix: give "
                          f"an instant within them, {example}")
    return ms


@dataclasses.dataclass(frozen=True)
class Window:
    """The instants an entry's slots lie between, UTC ms, both included; ``None``: unbounded."""

    start_ms: int | None = None
    end_ms: int | None = None

    def describe(self) -> str:
        """The window's part of the entry's canonical schedule text (its fingerprint)."""
        parts = []
        if self.start_ms is not None:
            parts.append(f"start_ms={self.start_ms}")
        if self.end_ms is not None:
            parts.append(f"end_ms={self.end_ms}")
        return " ".join(parts)


def window_of(entry: str, ours: dict) -> Window | None:
    """The window ``options['anarchon']`` (``ours``) gives entry ``entry``, or ``None``.

    :raises ConfigError: as :func:`instant_ms`, or ``end_at`` not after ``start_at``.
    """
    given = {key: ours[key] for key in WINDOW_KEYS if ours.get(key) is not None}
    if not given:
        return None
    ms = {key: instant_ms(entry, key, value) for key, value in given.items()}
    start, end = ms.get("start_at"), ms.get("end_at")
    if start is not None and end is not None and end <= start:
        raise ConfigError(f"entry {entry!r}: options['anarchon']['end_at'] {iso(end)} is not "
                          f"after start_at {iso(start)}: the entry would have no slot; fix: give "
                          "an end_at later than start_at (or leave one of them out)")
    return Window(start, end)


class WindowedSlots(SlotSchedule):
    """The slots of ``inner`` within ``window``: the first slot of a window with a start is the
    first of ``inner`` at or after it; past the end, :meth:`next_after` raises
    :class:`SlotsEnded`. ``shortest_gap_ms`` is ``inner``'s (the window removes slots only)."""

    def __init__(self, entry: str, inner: SlotSchedule, window: Window) -> None:
        self.entry, self.inner, self.window = entry, inner, window
        self.shortest_gap_ms = inner.shortest_gap_ms

    def next_after(self, after_ms: int) -> int:
        """The first slot of ``inner`` later than ``after_ms`` and within the window.

        :raises SlotsEnded: that slot would come after ``end_at``.
        :raises ConfigError: as ``inner``'s.
        """
        after_ms = whole_ms(after_ms)
        start, end = self.window.start_ms, self.window.end_ms
        if end is not None and after_ms >= end:
            raise SlotsEnded(self.entry, end)
        if start is not None and after_ms < start - 1:
            after_ms = start - 1
        slot = self.inner.next_after(after_ms)
        if end is not None and slot > end:
            raise SlotsEnded(self.entry, end)
        return slot

    def ended(self, now_ms: int) -> bool:
        """Whether no slot comes after ``now_ms``."""
        try:
            self.next_after(now_ms)
        except SlotsEnded:
            return True
        return False

    def describe(self) -> str:
        return f"{self.inner.describe()} {self.window.describe()}"


def windowed(entry: str, slots: SlotSchedule, ours: dict) -> SlotSchedule:
    """``slots`` within the window of ``options['anarchon']`` (``ours``), or ``slots`` itself
    when it sets none.

    :raises ConfigError: as :func:`window_of`.
    """
    window = window_of(entry, ours)
    return slots if window is None else WindowedSlots(entry, slots, window)


def outside(slots: SlotSchedule, slot_ms: int) -> bool:
    """Whether ``slot_ms`` lies before the ``start_at`` or after the ``end_at`` of an entry's
    ``slots`` (a schedule without a window: never)."""
    if not isinstance(slots, WindowedSlots):
        return False
    start, end = slots.window.start_ms, slots.window.end_ms
    return (start is not None and slot_ms < start) or (end is not None and slot_ms > end)


#: the most slots :func:`first_cut` walks (a denser schedule is checked over its first ones)
MAX_CUT_WALK = 100_000


def first_cut(old: SlotSchedule, new: SlotSchedule, lo_ms: int, hi_ms: int) -> int | None:
    """The first slot of ``old`` in ``lo_ms .. hi_ms`` that lies outside the window of ``new``
    (a window an update narrowed), or ``None``: the slots an instance still on ``old`` could
    claim there and one on ``new`` would not."""
    try:
        slot = old.next_after(lo_ms - 1)
        for _ in range(MAX_CUT_WALK):
            if slot > hi_ms:
                return None
            if outside(new, slot):
                return slot
            slot = old.next_after(slot)
    except ConfigError:                # SlotsEnded included: no slot of old is left
        return None
    return None


def inner_of(slots: SlotSchedule) -> SlotSchedule:
    """The schedule's own slots, without a window."""
    return slots.inner if isinstance(slots, WindowedSlots) else slots


def window_json(slots: SlotSchedule) -> dict:
    """``{"start_at": ISO or None, "end_at": ISO or None}`` of an entry's slots (``None``: no
    bound)."""
    window = slots.window if isinstance(slots, WindowedSlots) else Window()
    return {"start_at": None if window.start_ms is None else iso(window.start_ms),
            "end_at": None if window.end_ms is None else iso(window.end_ms)}
