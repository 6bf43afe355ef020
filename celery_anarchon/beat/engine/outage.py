"""The store outage backoff: an unreachable store is logged once when it goes, again every
minute while it stays away, and once when it answers again; operations wait for the backoff
(0.5 s, doubling, at most 10 s), timed on the monotonic clock."""
from __future__ import annotations

import collections
import logging
import math
from typing import Callable

from celery_anarchon.beat.engine.observe import NOOP, Observer
from celery_anarchon.stores.base import ClaimStore

logger = logging.getLogger(__name__)

#: store outage backoff, seconds (first, factor 2, cap)
BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.5, 10.0
#: while the store stays unreachable, an error is logged again this often, seconds
DOWN_REPORT_EVERY_S = 60.0


class Outage:
    """Whether the store answers, and when to ask it again.

    :param store: the store (for its masked URL in the logs).
    :param monotonic: the clock of elapsed time, seconds from any origin.
    :param stats: the engine's counters (``store_errors``; ``store_unreachable`` is logged).
    :param observer: told whether the store answers.
    """

    def __init__(self, store: ClaimStore, monotonic: Callable[[], float],
                 stats: collections.Counter, *, observer: Observer = NOOP) -> None:
        self.store = store
        self.observer = observer
        self.monotonic = monotonic
        self.stats = stats
        self.ok = True
        self.down_since: float | None = None
        self.next_report = 0.0
        # monotonic times: -inf means "now is past it"
        self.retry_at = -math.inf             #: the store is not asked before this
        self.backoff = BACKOFF_FIRST_S
        #: the last time an operation on the store failed (including the lease checks and
        #: takeovers, which do not start a backoff)
        self.last_error_at = -math.inf
        #: how many outages ended (the missed-slot check runs again after each)
        self.recoveries = 0

    def may_try(self) -> bool:
        """Whether the backoff has run out (the store may be asked again)."""
        return self.monotonic() >= self.retry_at

    def failed(self, exc: Exception, doing: str) -> None:
        """The store did not answer while ``doing``: log (once per outage, then once a minute),
        count, and back off."""
        now = self.monotonic()
        self.stats["store_errors"] += 1
        self.last_error_at = now
        self.observer.store_reachable(False)
        reason = str(exc).rstrip(".")
        if self.ok:
            logger.error("anarchon store %s unreachable while %s: %s. No run is sent until it "
                         "answers; retrying with backoff. Fix: check anarchon_store_url (or the "
                         "broker URL the store follows), that the server runs, and that this host "
                         "reaches it.", self.store.safe_url, doing, reason)
            self.down_since = now
            self.next_report = now + DOWN_REPORT_EVERY_S
        elif now >= self.next_report:
            self.next_report = now + DOWN_REPORT_EVERY_S
            logger.error("anarchon store %s still unreachable after %.0f s (%s); no run is sent "
                         "until it answers (%d run(s) skipped so far).", self.store.safe_url,
                         now - (now if self.down_since is None else self.down_since), reason,
                         self.stats["store_unreachable"])
        else:
            logger.debug("anarchon store still unreachable while %s: %s", doing, reason)
        self.ok = False
        self.retry_at = now + self.backoff
        self.backoff = min(self.backoff * 2, BACKOFF_MAX_S)

    def refused(self, exc: Exception) -> None:
        """The store answers but cannot serve this configuration: nothing is sent, and it is
        asked again after the longest backoff."""
        logger.critical("anarchon store %s cannot serve this configuration: %s. Nothing is "
                        "sent until it is fixed.", self.store.safe_url, exc)
        self.ok = False
        self.retry_at = self.monotonic() + BACKOFF_MAX_S

    def recovered(self) -> None:
        """The store answered: log the end of an outage, reset the backoff."""
        self.observer.store_reachable(True)
        if not self.ok:
            self.recoveries += 1
            now = self.monotonic()
            logger.warning("anarchon store %s reachable again after %.0f s", self.store.safe_url,
                           now - (now if self.down_since is None else self.down_since))
        self.down_since = None
        self.ok = True
        self.backoff = BACKOFF_FIRST_S
        self.retry_at = -math.inf
