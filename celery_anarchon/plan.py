"""From ``beat_schedule`` entries to plans: slots, timing, fingerprint and send options.

A plan is everything the scheduler needs to run one entry, checked once at start-up so that a bad
entry fails beat before anything is sent (docs/design.md "Timing", "Slots", point 8 of "One run").
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import uuid
from typing import Any, Callable

from celery import schedules as celery_schedules

from celery_anarchon import slots as slot_math
from celery_anarchon import timing
from celery_anarchon._util import duration
from celery_anarchon.errors import ConfigError
from celery_anarchon.leases import is_installed
from celery_anarchon.stores.base import LEASE_STORE_NAMES, LeaseStore, LeaseTerms, Store

#: uuid5 namespace of task ids (any fixed UUID works; this one is ours)
_TASK_ID_NS = uuid.UUID("2f0c8e53-8b7a-4d0e-9c5e-6b1f6d2a9a11")
#: text json.dumps writes as it is (no escape): printable ASCII without the quote and backslash
_PLAIN = re.compile(r'[ !#-\[\]-~]*')


def task_id_for(namespace: str, entry: str, slot_ms: int, attempt: int) -> str:
    """The deterministic task id of one attempt of a run: the same on every instance, distinct
    per attempt, so a duplicate is visible downstream and a re-sent run does not share the dead
    attempt's result (docs/design.md "One run", point 4)."""
    if _PLAIN.fullmatch(namespace) and _PLAIN.fullmatch(entry):   # what json.dumps would write
        key = f'["{namespace}", "{entry}", {int(slot_ms)}, {int(attempt)}]'
    else:
        key = json.dumps([namespace, entry, int(slot_ms), int(attempt)], ensure_ascii=False)
    # uuid.uuid5(_TASK_ID_NS, key), without its objects (a burst computes thousands)
    digest = bytearray(hashlib.sha1(_TASK_ID_NS.bytes + key.encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50
    digest[8] = (digest[8] & 0x3F) | 0x80
    h = digest.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


@dataclasses.dataclass(frozen=True)
class EntryPlan:
    """One entry, ready to run.

    :param entry: Celery's ``ScheduleEntry`` (task, args, kwargs as the user wrote them).
    :param slots: the entry's slot schedule (UTC ms).
    :param timing: jitter, max_late, anchor and lease after defaults and rules (seconds).
    :param celery_options: the entry's ``options`` without our ``anarchon`` key.
    :param fingerprint: short hash of :attr:`definition`, recorded with every claim.
    :param definition: canonical JSON of task, schedule (with time zone), timing and store.
    """

    name: str
    entry: Any
    slots: slot_math.SlotSchedule
    timing: timing.EntryTiming
    celery_options: dict
    fingerprint: str
    definition: str

    @property
    def jitter_ms(self) -> int:
        return timing.ms(self.timing.jitter_s)

    @property
    def max_late_ms(self) -> int:
        return timing.ms(self.timing.max_late_s)

    @property
    def lease_terms(self) -> LeaseTerms | None:
        lease = self.timing.lease
        if lease is None:
            return None
        return LeaseTerms(queue_timeout_ms=timing.ms(lease.queue_timeout_s),
                          overlap_allowed=lease.overlap == "allow")


def _is_interval(schedule) -> bool:
    return isinstance(schedule, celery_schedules.schedule)


def build_plan(name: str, entry, *, app, settings: timing.Settings, store: Store,
               known: dict | None = None, warn: Callable[[str], None] | None = None) -> EntryPlan:
    """Check one ``ScheduleEntry`` and build its plan.

    :param known: definitions already built, by (task, schedule, timing): entries that differ
        only by name, arguments or Celery options share one text and fingerprint (build_plans
        passes one dict for all its entries; the JSON of each of 100,000 entries is a second).
    :param warn: told each warning of an allowed but unwise setting (:func:`timing.resolve`);
        default: logged.
    :raises ConfigError: naming the entry, the value and the fix.
    """
    ours, celery_options = timing.split_entry_options(name, entry.options)
    schedule = entry.schedule
    if schedule is None:
        raise ConfigError(f"entry {name!r} has no 'schedule'; give a number of seconds, a "
                          "timedelta, a crontab, a solar or celery_anarchon.cron(...)")
    if "producer" in celery_options:
        raise ConfigError(f"entry {name!r}: options['producer'] is set by beat; remove it")
    anchor_s = None
    if "anchor" in ours:
        if not _is_interval(schedule):
            raise ConfigError(f"entry {name!r}: options['anarchon']['anchor'] applies to interval "
                              "schedules only (it shifts their epoch-aligned slots); remove it")
        anchor = ours["anchor"]
        if hasattr(anchor, "timestamp") and getattr(anchor, "tzinfo", None) is not None:
            anchor_s = anchor.timestamp()
        else:
            anchor_s = duration(anchor, f"entry {name!r}: options['anarchon']['anchor']")
    slots = slot_math.slots_for(schedule, entry=name, app_timezone=app.timezone, anchor_s=anchor_s)
    entry_timing = timing.resolve(name, {k: v for k, v in ours.items() if k != "anchor"}, settings,
                                  shortest_gap_s=slots.shortest_gap_ms / 1000,
                                  memory=store.memory, is_interval=_is_interval(schedule),
                                  warn=warn)
    if entry_timing.anchor_s != anchor_s:
        entry_timing = dataclasses.replace(entry_timing, anchor_s=anchor_s)
    if entry_timing.lease is not None and not isinstance(store, LeaseStore):
        raise ConfigError(
            f"entry {name!r} is leased (options['anarchon']['lease']) but the {store.kind} store "
            f"cannot hold leases: use {LEASE_STORE_NAMES} as anarchon_store_url, or remove the "
            "lease.")
    if entry_timing.lease is not None and not is_installed(app):
        raise ConfigError(
            f"entry {name!r} is leased but celery_anarchon.install(app) was not called: without the "
            "worker side a leased run's body would run once per attempt. Add "
            "celery_anarchon.install(app) to the app module after configuring the app (beat and "
            "every worker load that module).")
    described = slots.describe()
    try:
        key = (entry.task, described, entry_timing)
        shared = known.get(key) if known is not None else None
    except TypeError:  # a timing value that cannot be hashed: nothing shared
        key = shared = None
    if shared is None:
        definition = json.dumps({
            "task": entry.task,
            "schedule": described,
            "timing": entry_timing.as_dict(),
            "store": store.describe(),
        }, sort_keys=True, default=str, ensure_ascii=False)
        shared = hashlib.sha256(definition.encode()).hexdigest()[:12], definition
        if key is not None and known is not None:
            known[key] = shared
    fingerprint, definition = shared
    return EntryPlan(name, entry, slots, entry_timing, celery_options, fingerprint, definition)


def build_plans(entries: dict, *, app, settings: timing.Settings, store: Store) -> dict[str, EntryPlan]:
    """Plans of every entry; every problem of every entry is reported at once.

    :raises ConfigError: one message listing each misconfigured entry.
    """
    plans, problems, known = {}, [], {}
    for name, entry in entries.items():
        try:
            plans[name] = build_plan(name, entry, app=app, settings=settings, store=store,
                                     known=known)
        except ConfigError as exc:
            problems.append(str(exc))
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(f"{len(problems)} beat_schedule entries are misconfigured:\n  - "
                          + "\n  - ".join(problems))
    return plans


