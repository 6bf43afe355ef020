"""Beat's entries: :class:`BeatEntry`, Celery's ``ScheduleEntry`` as beat builds it, and
:class:`EntryPlans`, the plans of the entries one beat runs (its ``beat_schedule``'s, followed
for changes made at run time, and the store's), each checked by the start-up rules
(:func:`celery_anarchon.schedule.plan.build_plan`).
"""
from __future__ import annotations

import copy
import logging
import time
from typing import Any, Callable

from celery import beat

from celery_anarchon.errors import ConfigError
from celery_anarchon.schedule import definition as entry_json
from celery_anarchon.schedule import plan as plans_mod
from celery_anarchon.schedule.plan import EntryPlan
from celery_anarchon.schedule.timing import TimingSettings
from celery_anarchon.stores.entry_store import EntrySnapshot

logger = logging.getLogger("celery_anarchon.beat.scheduler")

#: beat_schedule is compared with its last copy at most this often after a change through
#: ``add`` or ``update_from_dict`` (or of its size), and this often anyway, seconds (a comparison
#: walks every entry: with 100,000 entries it is not done at every tick)
SCHEDULE_CHECK_S, SCHEDULE_WALK_S = 1.0, 60.0


class BeatEntry(beat.ScheduleEntry):
    """Celery's ``ScheduleEntry``, accepting any schedule object: a schedule class of your own
    needs only ``anarchon_next`` and ``anarchon_shortest_gap`` (beat never asks it ``is_due``).
    The Scheduler's ``Entry`` (Celery's name for the class of its entries)."""

    def default_now(self):
        return self.schedule.now() if hasattr(self.schedule, "now") else self.app.now()


class EntryPlans:
    """The plans of one beat's entries: those of Celery's schedule (``beat_schedule`` with
    Celery's default entries), and those of the store's entries, built once per definition text.

    :param app: the Celery app.
    :param settings: the app's timing settings.
    :param store: the store the entries run on (:class:`~celery_anarchon.stores.base.ClaimStore`:
        its memory, kind and leases decide what an entry may ask); replaced after a fork.
    :param entry_cls: the class a store entry's definition is built into (the Scheduler's
        ``Entry``).
    """

    def __init__(self, app, settings: TimingSettings, store: Any, entry_cls: type) -> None:
        self.app = app
        self.settings = settings
        self.store = store
        self.entry_cls = entry_cls
        #: beat_schedule as last planned (a shallow copy: an entry changed in place is the same
        #: object in both)
        self._planned: dict | None = None
        self._of_store: dict[str, tuple[str, EntryPlan | None]] = {}  # name -> (definition, plan)
        #: monotonic: when beat_schedule was last compared with its copy
        self.checked_at = 0.0
        #: beat_schedule was changed through ``add`` or ``update_from_dict`` since
        self.dirty = False

    def of_schedule(self, schedule: dict) -> dict[str, EntryPlan]:
        """The plans of Celery's schedule (entry name -> ``ScheduleEntry``), remembered as the
        copy that :meth:`changed` compares with.

        :raises ConfigError: naming each misconfigured entry.
        """
        self._planned = copy.copy(schedule)
        return self._build(schedule)

    def changed(self, schedule: dict,
                equal: Callable[[dict, dict], bool]) -> dict[str, EntryPlan] | None:
        """The new plans of Celery's schedule when entries were added or changed at run time
        (``add``, ``update_from_dict``, the dict changed directly), else ``None``. ``schedule``
        is compared with its last copy (by identity first, then by ``equal``, Celery's
        ``schedules_equal``) at most every :data:`SCHEDULE_CHECK_S` after ``add``,
        ``update_from_dict`` or a change of its size, and every :data:`SCHEDULE_WALK_S` anyway
        (a change made to the dict directly): the comparison walks every entry, which an idle
        beat with 100,000 entries cannot do at every tick.

        :raises ConfigError: the changed schedule is not valid (it is not built again until it
            changes again).
        """
        now = time.monotonic()
        old, new = self._planned, schedule
        dirty = self.dirty or len(old) != len(new)
        since = now - self.checked_at
        if since < SCHEDULE_WALK_S and not (dirty and since >= SCHEDULE_CHECK_S):
            return None
        self.checked_at = now
        self.dirty = False
        if len(old) == len(new) and all(old.get(name) is entry for name, entry in new.items()):
            return None
        self._planned = copy.copy(schedule)
        if equal(old, new):  # entries replaced by equal ones
            return None
        return self._build(schedule)

    def _build(self, schedule: dict) -> dict[str, EntryPlan]:
        return plans_mod.build_plans(dict(schedule), app=self.app, settings=self.settings,
                                     store=self.store)

    def of_store(self, snapshot: EntrySnapshot) -> dict[str, EntryPlan]:
        """The plans of the store's entries (the engine's callback at each sync that loaded):
        each definition parsed (:func:`celery_anarchon.schedule.definition.parse`) and checked by
        the start-up rules (:func:`celery_anarchon.schedule.plan.build_plan`), once per
        definition text. An invalid one is logged by name and left out; the others run."""
        built, plans, texts = {}, {}, {}
        for name, stored in snapshot.entries.items():
            if stored.definition is None:          # a pause of a config entry, no definition
                continue
            known = self._of_store.get(name)
            if known is None or known[0] != stored.definition:
                try:
                    entry = entry_json.parse(name, stored.definition, app=self.app,
                                             entry_cls=self.entry_cls)
                    plan = plans_mod.build_plan(name, entry, app=self.app,
                                                settings=self.settings, store=self.store,
                                                known=texts)
                except Exception as exc:           # a bad definition never stops the others
                    logger.error("anarchon: store entry %r is not valid on this instance and is "
                                 "left out (the others run): %s", name, exc,
                                 exc_info=not isinstance(exc, ConfigError))
                    plan = None
                known = (stored.definition, plan)
            built[name] = known
            if known[1] is not None:
                plans[name] = known[1]
        self._of_store = built
        return plans
