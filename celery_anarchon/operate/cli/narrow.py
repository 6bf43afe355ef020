"""The commands' times and widths (docs/production.md "Command line for operators"): times
relative to now ("12 s ago", "in 3 min") and an instant in the entry's zone by default, ISO 8601
UTC with ``--utc`` (``status``, ``history``, ``list``, ``next``); a table whose widest columns
are cut to fit and the lines of lists cut, at :data:`WIDTH` columns (``status``, ``list``); a
warning or a fix stays one whole line, to be searched for and pasted (a terminal wraps it).
``--wide`` prints whole cells and lines instead (:mod:`celery_anarchon.operate.cli.reports`,
:mod:`celery_anarchon.operate.cli.entries`)."""
from __future__ import annotations

import datetime

from celery_anarchon.operate.times import relative, to_ms

__all__ = ["WIDTH", "CUT", "View", "cut", "fit_table", "in_zone", "relative", "to_ms"]

#: the columns ``status`` fits its lines in by default
WIDTH = 120
#: what ends a cell or a line that was cut
CUT = "…"
#: a column is never cut narrower than this
MIN_COLUMN = 8
#: the first column (an entry's name) is cut narrower than this only when nothing else can be
NAME_COLUMN = 24


def in_zone(text: str | None, zone: datetime.tzinfo) -> str:
    """An ISO 8601 instant of the status data in ``zone``, to the second with its UTC offset
    (``2027-03-27T02:30:00+01:00``); ``-`` for none; the text as it is when it is no instant or
    one past the year 9999 in ``zone`` (shown in UTC only, never an error)."""
    at_ms = to_ms(text)
    if at_ms is None:
        return text or "-"
    try:
        return datetime.datetime.fromtimestamp(at_ms / 1000, zone).isoformat(timespec="seconds")
    except (OverflowError, ValueError, OSError):
        return str(text)


def cut(line: str, width: int = WIDTH) -> str:
    """``line`` within ``width`` columns, ending with :data:`CUT` when it was longer."""
    return line if len(line) <= width else line[:width - len(CUT)] + CUT


def fit_table(rows: list[tuple[str, ...]], width: int = WIDTH, gap: int = 2,
              keep: tuple[int, ...] = ()) -> list[tuple[str, ...]]:
    """``rows`` (the first is the heading) with the widest columns cut, one character at a
    time, until a row fits ``width`` columns with ``gap`` between columns (none narrower than
    :data:`MIN_COLUMN` or its heading); the columns ``keep`` (indexes) only once no other can be
    cut. The first column names the row: it is cut below :data:`NAME_COLUMN` characters only
    once no other column can be cut, the columns ``keep`` included. A cut cell ends with
    :data:`CUT`."""
    rows = [tuple(str(cell) for cell in row) for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    floor = [max(MIN_COLUMN, len(heading)) for heading in rows[0]]
    named = [max(floor[0], min(widths[0], NAME_COLUMN)), *floor[1:]]
    for floors in (named, floor):
        while sum(widths) + gap * (len(widths) - 1) > width:
            shrinkable = [i for i, w in enumerate(widths) if w > floors[i]]
            shrinkable = [i for i in shrinkable if i not in keep] or shrinkable
            if not shrinkable:
                break
            widest = max(shrinkable, key=lambda i: widths[i])
            widths[widest] -= 1
    return [tuple(cut(cell, w) for cell, w in zip(row, widths)) for row in rows]


class View:
    """How ``status`` and ``list`` print: ``wide``, whole cells and lines, else within
    :data:`WIDTH` columns; ``utc``, instants as the data says (ISO 8601 UTC, as ``--json``
    gives them), else relative to ``now_ms`` (UTC ms: the store's clock when known)."""

    def __init__(self, wide: bool, now_ms: int, utc: bool = False) -> None:
        self.wide = wide
        self.now_ms = now_ms
        self.utc = utc

    def when(self, text: str | None) -> str:
        """An instant of the data: as it is (``utc``), else relative (:func:`relative`)."""
        if self.utc:
            return text or "-"
        return relative(text, self.now_ms)

    def slot(self, text: str | None, zone: datetime.tzinfo | None) -> str:
        """An entry's slot: as it is (``utc``), else relative and then in the entry's
        ``zone`` (:func:`in_zone`), ``in 5 h (2027-03-27T02:30:00+01:00)``: a cut keeps the
        relative time."""
        if self.utc or zone is None or to_ms(text) is None:
            return self.when(text)
        return f"{relative(text, self.now_ms)} ({in_zone(text, zone)})"

    def row(self, line: str) -> str:
        """A line of a list (a run, an instance): cut unless wide."""
        return line if self.wide else cut(line)

    def table(self, rows: list[tuple[str, ...]], keep: tuple[int, ...] = ()) -> list[tuple[str, ...]]:
        """A table's rows: fitted (:func:`fit_table`, cutting the columns ``keep`` last) unless
        wide."""
        return rows if self.wide else fit_table(rows, keep=keep)
