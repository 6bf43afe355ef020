"""Entry definitions in the store: each instance saves its definition (by fingerprint), and one
whose definition differs from the one that claimed a run says so once, naming both (a rolling
deploy, or instances running different schedules under the same name)."""
from __future__ import annotations

import logging
from collections.abc import Iterable

from celery_anarchon._util import log_time
from celery_anarchon.errors import StoreError
from celery_anarchon.schedule.plan import EntryPlan
from celery_anarchon.stores.base import ClaimResult, ClaimStore

logger = logging.getLogger(__name__)


class Definitions:
    def __init__(self, store: ClaimStore) -> None:
        self.store = store
        self._warned: set[tuple[str, str]] = set()

    def save(self, plan: EntryPlan, quiet: bool = True) -> None:
        """Save ``plan``'s definition; a store error is raised only when not ``quiet``."""
        try:
            self.store.history.save_definition(plan.name, plan.fingerprint, plan.definition)
        except StoreError:
            if not quiet:
                raise

    def save_all(self, plans: Iterable[EntryPlan]) -> None:
        """Save every plan's definition in a few round trips (start-up).

        :raises StoreError: the store cannot be reached."""
        self.store.history.save_definitions((p.name, p.fingerprint, p.definition) for p in plans)

    def check(self, plan: EntryPlan, result: ClaimResult) -> None:
        """Warn (once per other definition) when the winner of ``result`` claimed with another
        definition of the entry than ``plan``'s."""
        theirs = result.winner_fingerprint
        if not theirs or theirs == plan.fingerprint or (plan.name, theirs) in self._warned:
            return
        self._warned.add((plan.name, theirs))
        try:
            other = self.store.history.load_definition(plan.name, theirs)
        except StoreError:
            other = None
        logger.warning(
            "%s: slot %s was claimed by %s with a different definition of this entry. Theirs "
            "(%s): %s. Ours (%s): %s. A rolling deploy in progress? Otherwise the instances run "
            "different beat_schedule settings under the same name.", plan.name,
            log_time(result.slot_ms), result.winner, theirs, other or "unknown", plan.fingerprint,
            plan.definition)
