"""Skew measurement: this instance's clock against the store's, every five minutes, logged at
INFO, a warning past 1 s, an error past half the smallest max_late (docs/design.md "Clocks"). The skew
itself is :class:`celery_anarchon._util.Skew`, the computation the NATS store's claims use too."""
from __future__ import annotations

import logging
import math
from typing import Callable, Iterable

from celery_anarchon._util import Skew
from celery_anarchon.errors import StoreError
from celery_anarchon.schedule.plan import EntryPlan
from celery_anarchon.stores.base import ClaimStore

logger = logging.getLogger(__name__)

#: how often the skew to the store's clock is measured and logged, seconds
SKEW_EVERY_S = 300.0


class SkewCheck:
    """Measures and logs the skew to ``store``'s clock.

    :param clock: the wall clock, epoch seconds (the clock measured).
    :param monotonic: the clock of elapsed time (the round trip, the next measurement).
    """

    def __init__(self, store: ClaimStore, clock: Callable[[], float],
                 monotonic: Callable[[], float]) -> None:
        self.store = store
        self.clock = clock
        self.monotonic = monotonic
        self.next_check = -math.inf           #: monotonic; -inf: due at the first tick
        #: the last measurement: this instance's clock minus the store's, ms (None: not yet)
        self.skew_ms: int | None = None

    def check(self, plans: Iterable[EntryPlan]) -> None:
        """Measure once and log the skew; the limit is half the smallest max_late of ``plans``."""
        self.next_check = self.monotonic() + SKEW_EVERY_S
        try:
            before, started = self.clock(), self.monotonic()
            store_ms = self.store.now_ms()
            after, took = self.clock(), self.monotonic() - started
        except StoreError as exc:
            logger.debug("skew check failed: %s", exc)
            return
        if store_ms is None:
            return
        ahead_s = Skew.measured(before, after, store_ms).offset_ms / 1000
        self.skew_ms = round(ahead_s * 1000)
        limit_s = min((p.timing.max_late_s for p in plans), default=60.0) / 2
        message = ("this instance's clock is %.3f s %s the store's clock (round trip %.1f ms)",
                   abs(ahead_s), "behind" if ahead_s < 0 else "ahead of", took * 1000)
        if abs(ahead_s) > limit_s:
            logger.error(message[0] + ": more than half of max_late (%g s); its claims will be "
                         "refused as late or early. Run NTP on every host.", *message[1:], limit_s)
        elif abs(ahead_s) > 1:
            logger.warning(message[0] + "; run NTP on every host.", *message[1:])
        else:
            logger.info(*message)
