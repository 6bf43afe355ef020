"""Counters of what the engine did (``claim_won``, ``sent``, ``store_errors``, ...), logged at
INFO every few minutes."""
from __future__ import annotations

import collections
import logging
import math
from typing import Callable

logger = logging.getLogger(__name__)

#: how often counters are logged at INFO, seconds
STATS_EVERY_S = 300.0


class Counters:
    """``counts`` (a :class:`collections.Counter` the other parts add to) and its periodic log.

    :param monotonic: the clock of elapsed time, seconds from any origin.
    """

    def __init__(self, monotonic: Callable[[], float]) -> None:
        self.monotonic = monotonic
        self.counts: collections.Counter = collections.Counter()
        self.next_report = -math.inf          #: monotonic; -inf: due at the first tick

    def report_if_due(self, now: float) -> None:
        """Log the counters (when there are any) if ``now`` (monotonic) reached the next report."""
        if now < self.next_report:
            return
        self.next_report = now + STATS_EVERY_S
        if self.counts:
            logger.info("anarchon counters: %s", dict(sorted(self.counts.items())))
