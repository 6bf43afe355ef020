"""How many runs one claim asks for in a burst: as many as this instance claims and sends in
:data:`AHEAD_S` (30 ms), measured on the chunks it handled, so that a won claim is never far
ahead of its send. An instance killed in a burst then takes with it at most the won runs of one chunk (the
guarantee's "winner dying between its claim and its send"), and the runs due meanwhile wait one
chunk, not the whole burst."""
from __future__ import annotations

from typing import Callable

#: a chunk is what this instance claims and sends in this long, seconds
AHEAD_S = 0.03
#: bounds of a chunk, runs; the first chunk, before anything was measured
LEAST, MOST, FIRST = 10, 500, 50
#: weight of the newest measurement in the running mean of the time per run
WEIGHT = 0.3


class Pace:
    """The size of the next claim chunk, from the time per run of the chunks before it.

    :param monotonic: the clock of elapsed time, seconds from any origin (a clock that does not
        move, as in tests, leaves the size at ``first``).
    :param ahead_s: seconds of claiming and sending one chunk may take.
    :param least: the smallest chunk, runs.
    :param most: the largest chunk, runs.
    :param first: the chunk before any measurement, runs.
    """

    def __init__(self, monotonic: Callable[[], float], *, ahead_s: float = AHEAD_S,
                 least: int = LEAST, most: int = MOST, first: int = FIRST) -> None:
        self.monotonic = monotonic
        self.ahead_s = ahead_s
        self.least, self.most = least, most
        self._size = first
        self._per_run_s: float | None = None

    def size(self) -> int:
        """Runs to claim in the next chunk (``least`` <= size <= ``most``)."""
        return self._size

    def measured(self, runs: int, seconds: float) -> None:
        """A chunk of ``runs`` was claimed and its won runs sent in ``seconds``."""
        if runs <= 0 or seconds <= 0:
            return
        per_run = seconds / runs
        self._per_run_s = per_run if self._per_run_s is None else (
            WEIGHT * per_run + (1 - WEIGHT) * self._per_run_s)
        self._size = max(self.least, min(self.most, int(self.ahead_s / self._per_run_s)))
