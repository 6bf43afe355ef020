"""From ``beat_schedule`` entries to plans: slots, timing, fingerprint and send options.

A plan is everything the scheduler needs to run one entry, checked once at start-up so that a bad
entry fails beat before anything is sent (docs/design.md "Timing", "Slots", point 8 of "One run").
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import numbers
import re
import shlex
import time
import uuid
from typing import Any, Callable

from celery import beat
from celery import schedules as celery_schedules

from celery_anarchon import limits
from celery_anarchon.schedule import catch_up
from celery_anarchon.schedule import task_options
from celery_anarchon.schedule import timing
from celery_anarchon.schedule import slots as slot_math
from celery_anarchon._util import duration
from celery_anarchon.errors import ConfigError
from celery_anarchon.messages import is_installed

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


def clash_fix(entry: str) -> str:
    """The fix of a name that some instances run from the store and others from their
    beat_schedule: one text for the beat log, ``status`` and the status page."""
    return (f"Fix: keep one definition under this name: remove the store entry (celery anarchon "
            f"remove {shlex.quote(entry)}) and define it in every host's beat_schedule, or remove "
            "it from every beat_schedule and keep the store's, or rename one of them.")


@dataclasses.dataclass(frozen=True)
class EntryPlan:
    """One entry, ready to run.

    :param entry: Celery's ``ScheduleEntry`` (task, args, kwargs as the user wrote them).
    :param slots: the entry's slot schedule (UTC ms), within its ``start_at`` / ``end_at``
        (:class:`~celery_anarchon.schedule.slots.WindowedSlots`) if it has them.
    :param timing: jitter, max_late, anchor and lease after defaults and rules (seconds).
    :param celery_options: the entry's ``options`` without our ``anarchon`` key.
    :param fingerprint: short hash of :attr:`definition`, recorded with every claim.
    :param definition: canonical JSON of task, schedule (with time zone), timing and store.
    :param since_ms: a store entry's: the store's clock when its definition was written (its
        ``add`` or last ``update``), UTC ms; ``None`` for a ``beat_schedule`` entry. A catch-up
        reaches back no further (:meth:`~celery_anarchon.beat.engine.due.DueRuns.seed`).
    :param held: its runs are never claimed (nor sent): an entry kept only so that the pause
        that holds it records each of its slots, as a paused entry's claim does (a
        django-celery-beat row disabled and paused in the store); the engine answers each due
        run paused while it sees the entry's pause, and drops it unrecorded otherwise.
    """

    name: str
    entry: Any
    slots: slot_math.SlotSchedule
    timing: timing.EntryTiming
    celery_options: dict
    fingerprint: str
    definition: str
    since_ms: int | None = None
    held: bool = False

    @property
    def jitter_ms(self) -> int:
        return timing.ms(self.timing.jitter_s)

    @property
    def max_late_ms(self) -> int:
        return timing.ms(self.timing.max_late_s)

    @property
    def claim_late_ms(self) -> int:
        """How late after its slot a run of this entry may still be claimed, ms: its max_late
        (docs/design.md "One run, in time", step 2), or its ``catch_up_window`` for
        ``catch_up='all'`` (step 7; :mod:`~celery_anarchon.schedule.catch_up`)."""
        window_s = self.timing.catch_up_window_s
        if self.timing.catch_up == "all" and window_s is not None:
            return timing.ms(window_s)
        return self.max_late_ms

    @property
    def catch_up_pace_ms(self) -> int:
        """The least time between two caught-up runs of this entry, ms
        (:func:`celery_anarchon.schedule.catch_up.pace_s` of its shortest gap)."""
        return timing.ms(catch_up.pace_s(self.slots.shortest_gap_ms / 1000))

    @property
    def lease_terms(self) -> timing.LeaseTerms | None:
        lease = self.timing.lease
        if lease is None:
            return None
        return timing.LeaseTerms(queue_timeout_ms=timing.ms(lease.queue_timeout_s),
                          overlap_allowed=lease.overlap == "allow")


#: keys of ``options['anarchon']`` that are part of the schedule, not of its timing
_NOT_TIMING = ("anchor", "start_at", "end_at")


def _is_interval(schedule) -> bool:
    return isinstance(schedule, celery_schedules.schedule)


def build_plan(name: str, entry, *, app, settings: timing.TimingSettings, store: Any,
               known: dict | None = None, warn: Callable[[str], None] | None = None) -> EntryPlan:
    """Check one ``ScheduleEntry`` and build its plan.

    :param store: the store the entry runs on, a :class:`~celery_anarchon.stores.base.ClaimStore`
        (typed ``Any``: the schedule wing stands below the stores): its ``memory``, ``kind`` and
        ``holds_leases`` are read, nothing is written.
    :param known: definitions already built, by (task, schedule, timing): entries that differ
        only by name, arguments or Celery options share one text and fingerprint (build_plans
        passes one dict for all its entries; the JSON of each of 100,000 entries is a second).
    :param warn: told each warning of an allowed but unwise setting (:func:`timing.resolve`);
        default: logged.
    :param name: the entry's name, as every boundary gives it: in Unicode NFC
        (:func:`~celery_anarchon.limits.entry_name`; :func:`build_plans` normalizes the names of
        ``beat_schedule``, the schedules API those it is given).
    :raises ConfigError: naming the entry, the value and the fix: its name (too long, a control
        or format character, not in NFC: a store entry an older version wrote), its schedule
        (a slot past the year 9999 too), its window (``start_at`` / ``end_at``: naive, not an
        instant, or end not after start), its timing, its ``apply_async`` options
        (:func:`celery_anarchon.schedule.task_options.check`).
    """
    if limits.entry_name(name) != name:
        raise ConfigError(
            f"entry name {limits.shown(name)} is not in Unicode NFC (normalization form C): names "
            "are normalized to it wherever they are given, so this one (a store entry an older "
            "version wrote) could not be paused or run by its name; fix: remove it (celery "
            "anarchon remove finds it by its exact name) and add it again")
    check_call(name, entry)
    ours, celery_options = timing.split_entry_options(name, entry.options)
    task_options.check(name, celery_options)
    schedule = entry.schedule
    if schedule is None:
        raise ConfigError(f"entry {name!r} has no 'schedule'; give a number of seconds, a "
                          "timedelta, a crontab, a solar or celery_anarchon.cron(...)")
    for key in ("producer", "publisher", "connection"):   # beat publishes on its own
        if key in celery_options:
            raise ConfigError(f"entry {name!r}: options[{key!r}] is set by beat; remove it")
    anchor_s = None
    if "anchor" in ours:
        if not _is_interval(schedule):
            raise ConfigError(f"entry {name!r}: options['anarchon']['anchor'] applies to interval "
                              "schedules only (it shifts their epoch-aligned slots); remove it")
        anchor = ours["anchor"]
        if hasattr(anchor, "timestamp") and getattr(anchor, "tzinfo", None) is not None:
            anchor_s = anchor.timestamp()
        else:
            anchor_s = duration(anchor, f"entry {name!r}: options['anarchon']['anchor']",
                                maximum=limits.LAST_SLOT_S,
                                fix="give an instant before the year 10000 (seconds since the "
                                    "Unix epoch, or an aware datetime), or a shift of less than "
                                    "one period")
    slots = slot_math.slots_for(schedule, entry=name, app_timezone=app.timezone, anchor_s=anchor_s)
    if isinstance(slots, slot_math.IntervalSlots):   # its next slot before the year 9999
        slots.next_after(int(time.time() * 1000))
    slots = slot_math.windowed(name, slots, ours)    # start_at / end_at
    entry_timing = timing.resolve(name, {k: v for k, v in ours.items() if k not in _NOT_TIMING},
                                  settings,
                                  shortest_gap_s=slots.shortest_gap_ms / 1000,
                                  memory=store.memory, is_interval=_is_interval(schedule),
                                  warn=warn)
    if entry_timing.anchor_s != anchor_s:
        entry_timing = dataclasses.replace(entry_timing, anchor_s=anchor_s)
    if entry_timing.lease is not None and not store.holds_leases:
        raise ConfigError(
            f"entry {name!r} is leased (options['anarchon']['lease']) but the {store.kind} store "
            f"cannot hold leases: use {timing.LEASE_STORE_NAMES} as anarchon_store_url, or remove the "
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


def build_plans(entries: dict, *, app, settings: timing.TimingSettings,
                store: Any) -> dict[str, EntryPlan]:
    """Plans of every entry; every problem of every entry is reported at once. The names are
    normalized to Unicode NFC (the plans are keyed and claimed by that form), and two names
    equal once normalized are refused: every host and the store would take them for one.

    :raises ConfigError: one message listing each misconfigured entry.
    """
    plans, problems, known, given = {}, [], {}, {}
    for name, entry in entries.items():
        try:
            normal = limits.entry_name(name)
            if normal in given:
                first = given[normal]
                raise ConfigError(
                    f"entries {first!r} and {name!r} of beat_schedule ({ascii(first)} and "
                    f"{ascii(name)}) are the same name once normalized (Unicode NFC: the same "
                    "characters written two ways), which every host and the store take for one "
                    "entry; fix: rename one of them")
            given[normal] = name
            plans[normal] = build_plan(normal, entry, app=app, settings=settings, store=store,
                                       known=known)
        except ConfigError as exc:
            problems.append(str(exc))
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(f"{len(problems)} beat_schedule entries are misconfigured:\n  - "
                          + "\n  - ".join(problems))
    return plans


#: the words of the error of a ``beat_schedule`` item Celery cannot build (:func:`cannot_build`),
#: which name its rule in the problems of ``celery_anarchon.testing`` and ``check``
CANNOT_BUILD = "Celery cannot build it"

_SCHEDULE_EXAMPLE = ("{'nightly-report': {'task': 'proj.tasks.report', 'schedule': "
                     "crontab(minute=0, hour=3)}}")


@dataclasses.dataclass(frozen=True)
class UnnamedItem:
    """A ``beat_schedule`` item whose name is not a string (``3``, ``b"x"``): the operator views
    key it by its repr (:func:`celery_anarchon.operate.config.config_items`), and
    :func:`config_entry` refuses it by that name, as beat does at start-up."""

    name: Any
    item: Any


def beat_schedule_of(value: Any) -> dict:
    """The ``beat_schedule`` setting checked as a whole: a dict of entries by name (None: none).

    :raises ConfigError: anything else (a list, a string), naming the setting, its value and
        the fix.
    """
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"beat_schedule = {limits.shown_value(value)}: not a dict of entries "
                          f"by name; fix: give a dict such as {_SCHEDULE_EXAMPLE}")
    return value


def item_problem(name: Any, item: Any) -> ConfigError | None:
    """What makes a ``beat_schedule`` item no entry before Celery sees it: its name is not a
    string, or the item is not a dict (the error naming it, the value and the fix), else None."""
    if isinstance(item, UnnamedItem):
        return ConfigError(f"entry name {limits.shown_value(item.name)} of beat_schedule: not a "
                           "string; fix: name the entry with text, e.g. 'nightly-report'")
    if not isinstance(item, dict):
        where = f"entry {limits.shown(name) if isinstance(name, str) else repr(name)}"
        return ConfigError(f"{where}: {limits.shown_value(item)} is not a dict; fix: give the "
                           "entry as {'task': 'proj.tasks.report', 'schedule': 60}")
    return None


def check_call(name: str, entry: beat.ScheduleEntry) -> None:
    """Refuse what beat could not send: a task name that is not text (or holds NUL or a lone
    surrogate), args that are not a list or tuple (a string would be sent as its characters),
    kwargs or options that are not a dict.

    :raises ConfigError: naming the entry, the field, the value and the fix.
    """
    where = f"entry {limits.shown(name)}"
    if not isinstance(entry.task, str) or not entry.task:
        raise ConfigError(f"{where}: task {limits.shown_value(entry.task)}: not a task name; fix: "
                          "give the registered name of the task as text, e.g. "
                          "'proj.tasks.report'")
    limits.plain_text(entry.task, f"{where}: task", "give the registered name of the task, e.g. "
                      "'proj.tasks.report'")
    if entry.args is not None and not isinstance(entry.args, (list, tuple)):
        raise ConfigError(f"{where}: args {limits.shown_value(entry.args)}: not a list or tuple; "
                          "fix: give the positional arguments as a list, e.g. ['x'] (a string "
                          "would be sent as its characters)")
    for field in ("kwargs", "options"):
        value = getattr(entry, field)
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: {field} {limits.shown_value(value)}: not a dict; fix: "
                              f"give {field} as a dict, e.g. "
                              + ("{'full': True}" if field == "kwargs" else "{'queue': 'reports'}"))


def config_entry(name: str, item: dict, *, app, entry_cls: type = beat.ScheduleEntry):
    """A ``beat_schedule`` item as Celery's entry, the way beat builds it; an item Celery cannot
    build is a ConfigError naming the entry, what is wrong and the fix.

    :raises ConfigError: a name that is not a string or an item that is not a dict
        (:func:`item_problem`), an unknown key, a schedule Celery cannot use (text, a number too
        large for a ``timedelta``), or whatever else Celery refuses (its message quoted).
    """
    problem = item_problem(name, item)
    if problem is not None:
        raise problem
    try:
        return entry_cls(**{"last_run_at": datetime.datetime.now(datetime.timezone.utc), **item,
                            "name": name, "app": app})
    except Exception as exc:           # what Celery raises is not ours to choose
        raise cannot_build(name, item, exc) from None


def _seconds_text(value: numbers.Real) -> str:
    """``value`` as ``1e+18``; an int past a float's range (``10**400``, which ``:g`` cannot
    format) by its first digits."""
    return f"{value:g}" if abs(value) < 1e308 else limits.shown_value(value)


def cannot_build(name: str, item: Any, exc: Exception) -> ConfigError:
    """The error of a ``beat_schedule`` item Celery could not build (``exc``), naming the entry,
    what is wrong and the fix: a schedule given as text, a number of seconds no ``timedelta``
    holds, else Celery's own words and the keys it takes."""
    problem = item_problem(name, item)
    if problem is not None:
        return problem
    schedule = item.get("schedule")
    where = f"entry {limits.shown(name) if isinstance(name, str) else repr(name)}"
    if isinstance(schedule, str):
        return slot_math.text_schedule_error(name, schedule)
    if isinstance(schedule, numbers.Real) and isinstance(exc, OverflowError):
        return ConfigError(
            f"{where}: every {_seconds_text(schedule)} s: its next slot would come after the "
            "year 9999, the last year a slot can have (dates, ISO 8601 times and the stores' "
            "clocks end there); fix: give a shorter period (a crontab runs yearly at most: crontab(0, 0, "
            "day_of_month=1, month_of_year=1))")
    keys = sorted(item, key=str)
    return ConfigError(
        f"{where}: {CANNOT_BUILD} from {keys}: {type(exc).__name__}: {exc}. Allowed "
        "keys: task, schedule, args, kwargs, options, relative; the schedule is a number of "
        "seconds, a timedelta, a crontab, a solar, celery_anarchon.cron(...) or an object with "
        "anarchon_next() and anarchon_shortest_gap()")
