"""``status`` within a terminal's width (docs/production.md "Command line for operators"): times
relative to the store's clock ("12 s ago", "in 3 min"), a table whose widest columns are cut to
fit and the lines of lists cut, at :data:`WIDTH` columns; a warning or a fix stays one whole
line, to be searched for and pasted (a terminal wraps it). ``status --wide`` prints whole cells
and lines and ISO 8601 UTC times instead (:mod:`celery_anarchon.operate.cli.reports`)."""
from __future__ import annotations

from celery_anarchon.operate.times import relative, to_ms

__all__ = ["WIDTH", "CUT", "View", "cut", "fit_table", "relative", "to_ms"]

#: the columns ``status`` fits its lines in by default
WIDTH = 120
#: what ends a cell or a line that was cut
CUT = "…"
#: a column is never cut narrower than this
MIN_COLUMN = 8


def cut(line: str, width: int = WIDTH) -> str:
    """``line`` within ``width`` columns, ending with :data:`CUT` when it was longer."""
    return line if len(line) <= width else line[:width - len(CUT)] + CUT


def fit_table(rows: list[tuple[str, ...]], width: int = WIDTH, gap: int = 2,
              keep: tuple[int, ...] = ()) -> list[tuple[str, ...]]:
    """``rows`` (the first is the heading) with the widest columns cut, one character at a
    time, until a row fits ``width`` columns with ``gap`` between columns (none narrower than
    :data:`MIN_COLUMN` or its heading); the columns ``keep`` (indexes) only once no other can be
    cut. A cut cell ends with :data:`CUT`."""
    rows = [tuple(str(cell) for cell in row) for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    floor = [max(MIN_COLUMN, len(heading)) for heading in rows[0]]
    while sum(widths) + gap * (len(widths) - 1) > width:
        shrinkable = [i for i, w in enumerate(widths) if w > floor[i]]
        shrinkable = [i for i in shrinkable if i not in keep] or shrinkable
        if not shrinkable:
            break
        widest = max(shrinkable, key=lambda i: widths[i])
        widths[widest] -= 1
    return [tuple(cut(cell, w) for cell, w in zip(row, widths)) for row in rows]


class View:
    """How ``status`` prints: ``wide`` as the data says (whole cells and lines, ISO 8601 UTC
    times), else within :data:`WIDTH` columns with times relative to ``now_ms`` (UTC ms: the
    store's clock when known)."""

    def __init__(self, wide: bool, now_ms: int) -> None:
        self.wide = wide
        self.now_ms = now_ms

    def when(self, text: str | None) -> str:
        """An instant of the status data: as it is (wide), else relative (:func:`relative`)."""
        if self.wide:
            return text or "-"
        return relative(text, self.now_ms)

    def row(self, line: str) -> str:
        """A line of a list (a run, an instance): cut unless wide."""
        return line if self.wide else cut(line)

    def table(self, rows: list[tuple[str, ...]], keep: tuple[int, ...] = ()) -> list[tuple[str, ...]]:
        """A table's rows: fitted (:func:`fit_table`, cutting the columns ``keep`` last) unless
        wide."""
        return rows if self.wide else fit_table(rows, keep=keep)
