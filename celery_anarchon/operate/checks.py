"""Check a Celery app's schedule in its own test suite, before it is deployed.

In a project's tests (three lines; no store server needed)::

    def test_beat_schedule_is_safe():
        from proj.celery import app
        celery_anarchon.testing.assert_schedule_ok(app)

:func:`check_schedule` applies every start-up rule beat applies to every ``beat_schedule`` entry
(:func:`celery_anarchon.schedule.plan.build_plan`: the schedule, the timing rules, a lease only on a lease
store and with :func:`celery_anarchon.install`) and the sync interval rule, and returns every
problem instead of stopping at the first. It never connects to the store: the rules that need
the store's memory read it from the configured store (``anarchon_store_url``, else the broker's,
and ``anarchon_store_options``): the store's documented default unless an option sets it, which
is what beat itself checks at start-up. What only the store knows (its reachability, what its
setup can lose, settings another instance recorded in it) is checked by ``celery -A proj
anarchon check``, which also checks the store's own entries.

:func:`next_slots` lists an entry's next slots, as beat computes them.
"""
from __future__ import annotations

import dataclasses
import datetime
import re
from collections.abc import Callable, Iterable

from celery_anarchon.schedule import definition as entry_json
from celery_anarchon.settings import Settings, make_instance_id, open_app_store
from celery_anarchon.errors import ConfigError, UnknownEntry
from celery_anarchon.schedule.plan import CANNOT_BUILD, EntryPlan, build_plan, config_entry
from celery_anarchon.operate.config import config_items
from celery_anarchon.operate.names import did_you_mean, normal_name
from celery_anarchon.schedule.slots import (
    TEXT_SCHEDULE, SlotsEnded, datetime_to_ms, ms_to_datetime,
)
from celery_anarchon.stores.base import ClaimStore
from celery_anarchon.schedule.timing import check_sync_interval, timezone_error

__all__ = ["Problem", "RULES", "check_schedule", "assert_schedule_ok", "next_slots", "plan_of",
           "timezone_error", "problem_of", "setting_of"]

#: The rules, as docs/design.md and :mod:`celery_anarchon.schedule.timing` state them, with the words of the
#: error message that breaks each (the first match names a problem's rule).
RULES: tuple[tuple[str, str], ...] = (
    ("must be less than half the shortest gap", "jitter < half the shortest gap between slots"),
    ("must be greater than jitter", "max_late > jitter"),
    ("a run-now request is claimed", "2 x anarchon_sync_interval + 5 s < store memory"),
    ("not a catch-up policy", "catch_up is newest, all or none"),
    ("applies to catch_up='all' only", "catch_up_window with catch_up='all' only"),
    ("must be greater than max_late", "catch_up_window > max_late"),
    ("catch_up='all' cannot go with a lease", "catch_up='all' without a lease"),
    ("a slot caught up after", "catch_up_window + jitter + 10 s < store memory"),
    ("a caught-up slot could win", "runs remembered x shortest gap > catch_up_window + jitter + 10 s"),
    ("less than the store's memory", "jitter + max_late < store memory"),
    ("the store remembers at most", "runs remembered x shortest gap > jitter + max_late"),
    ("less than half of the lease duration", "lease heartbeat < half of the lease duration"),
    ("cannot hold leases", "a leased entry needs a lease store"),
    ("install(app) was not called", "a leased entry needs celery_anarchon.install(app)"),
    ("unknown key", "no unknown keys in options['anarchon']"),
    ("outside options['anarchon']", "celery_anarchon's options inside options['anarchon']"),
    ("cron expression", "a valid crontab or cron expression"),
    ("never fires", "a schedule that fires"),
    ("step", "a crontab step within its field"),
    ("relative", "slots the same on every host (no relative=True)"),
    ("not supported", "a schedule class every host computes the same slots from"),
    (CANNOT_BUILD, "a beat_schedule item Celery can build"),
    (TEXT_SCHEDULE, "a beat_schedule item Celery can build"),
    ("after the year 9999", "slots before the end of the year 9999"),
    ("characters, more than", "a name of at most 200 characters"),
    ("format character", "a name of visible characters"),
    ("control character", "a name of visible characters"),
    ("not in Unicode NFC", "a name in Unicode NFC"),
    ("the same name once normalized", "names that differ in Unicode NFC"),
    ("bytes of JSON, more than", "a definition of at most 64 KiB"),
    ("levels deep", "a definition nested at most 100 levels"),
    ("kombu or the worker cannot use", "apply_async options of the types Celery takes"),
    ("is not a known IANA time zone", "a known time zone"),
    ("must be more than 0", "a duration more than 0"),
)
#: the rule of a problem no entry of :data:`RULES` matches
OTHER_RULE = "a valid entry"


def rule_of(message: str) -> str:
    """The rule (:data:`RULES`) that the message of a ConfigError states as broken."""
    for words, rule in RULES:
        if words in message:
            return rule
    return OTHER_RULE


@dataclasses.dataclass(frozen=True)
class Problem:
    """One broken rule.

    :param entry: the entry's name, or ``None`` for a problem of the settings or the store.
    :param rule: the rule in a few words (:data:`RULES`), e.g. ``"max_late > jitter"``.
    :param message: the full message beat would stop with: the entry, the values and the fix.
    :param setting: for a problem of the settings, the setting it is in (``"timezone"``,
        ``"anarchon_sync_interval"``, ...), when the message names one; else ``None``.
    """

    entry: str | None
    rule: str
    message: str
    setting: str | None = None

    def __str__(self) -> str:
        return f"[{self.rule}] {self.message}"


#: the rule of a problem of the settings no entry of :data:`RULES` matches
OTHER_SETTING_RULE = "a valid setting"
#: the setting a message of the settings starts with, or names as ``app.conf.<name>``
_SETTING = re.compile(r"^(?:unknown setting ')?(anarchon_[a-z_]+)|\(app\.conf\.([a-z_]+)\)")


def setting_of(message: str) -> str | None:
    """The setting an error message of the settings is about (``anarchon_sync_interval``,
    ``timezone``), or ``None`` when it names none."""
    found = _SETTING.search(message)
    return None if found is None else found.group(1) or found.group(2)


def problem_of(entry: str | None, exc: Exception) -> Problem:
    """The :class:`Problem` of a ConfigError: its rule (:func:`rule_of`), and for a problem of
    no entry the setting it names (:func:`setting_of`; the rule is then "a valid setting" when
    no rule matches)."""
    message = str(exc)
    rule = rule_of(message)
    if entry is None:
        return Problem(None, OTHER_SETTING_RULE if rule == OTHER_RULE else rule, message,
                       setting_of(message))
    return Problem(entry, rule, message)


_problem = problem_of


def config_entries(app) -> dict:
    """The config entries (:func:`celery_anarchon.operate.config.config_items`: ``beat_schedule``
    and Celery's own ``celery.backend_cleanup``) as Celery ``ScheduleEntry`` objects, by name; an
    item Celery cannot build is a :class:`ConfigError` in its place (with the message beat stops
    with); the names in Unicode NFC, as beat runs them."""
    out: dict = {}
    for name, item in config_items(app).items():
        try:
            out[name] = config_entry(name, item, app=app)
        except ConfigError as exc:  # what Scheduler.merge_inplace reports
            out[name] = exc
    return out


def _open(app, settings: Settings, store: ClaimStore | None) -> tuple[ClaimStore, bool]:
    if store is not None:
        return store, False
    return open_app_store(settings, instance_id="check:" + make_instance_id()), True


def check_entries(app, entries: Iterable[tuple[str, object]], *, settings: Settings,
                  store: ClaimStore, warn: Callable[[str], None] | None = None,
                  ) -> tuple[dict[str, EntryPlan], list[Problem]]:
    """Build the plan of every ``(name, entry)`` (an entry may be a ConfigError already).

    :param warn: told each warning beat would log at start-up about an entry that passes (one
        line naming it); default: logged.
    :returns: the plans of the entries that pass, and the problems of the others.
    """
    plans, problems = {}, []
    zone_error = timezone_error(app)
    if zone_error is not None:   # no entry's slots can be computed: one problem, not one each
        return plans, [_problem(None, zone_error)]
    for name, entry in entries:
        if isinstance(entry, Exception):
            problems.append(_problem(name, entry))
            continue
        try:
            plans[name] = build_plan(name, entry, app=app, settings=settings, store=store,
                                     warn=warn)
        except ConfigError as exc:
            problems.append(_problem(name, exc))
    return plans, problems


def check_schedule(app, *, store: ClaimStore | None = None) -> list[Problem]:
    """Every problem of ``app``'s settings and ``beat_schedule`` entries, by the start-up rules;
    ``[]`` when beat would start. No I/O: ``store`` (default: the app's, opened without
    connecting, and closed) gives the memory and capabilities the rules need.
    """
    try:
        settings = Settings.from_app(app)
    except ConfigError as exc:
        return [_problem(None, exc)]
    try:
        store, own = _open(app, settings, store)
    except ConfigError as exc:  # an unknown scheme, a missing extra, a bad store option
        return [_problem(None, exc)]
    try:
        problems = []
        try:
            check_sync_interval(settings, store.memory)
        except ConfigError as exc:
            problems.append(_problem(None, exc))
        _, found = check_entries(app, config_entries(app).items(), settings=settings, store=store)
        return problems + found
    finally:
        if own:
            store.close()


def assert_schedule_ok(app, *, store: ClaimStore | None = None) -> None:
    """Fail a test when :func:`check_schedule` finds a problem.

    :raises AssertionError: listing every problem with its rule, the values and the fix.
    """
    problems = check_schedule(app, store=store)
    if problems:
        raise AssertionError(f"{len(problems)} problem{'s' if len(problems) > 1 else ''} in the "
                             "beat schedule:\n" + "\n".join(f"  - {p}" for p in problems))


def plan_of(app, entry: str, *, store: ClaimStore | None = None) -> EntryPlan:
    """The checked plan of ``entry``: a ``beat_schedule`` entry, else (when ``store`` holds
    entries) a store entry.

    :raises UnknownEntry: no such entry (a ConfigError naming the closest name).
    :raises ConfigError: the entry breaks a rule.
    """
    settings = Settings.from_app(app)   # an unknown app timezone is refused here
    given, entry = entry, normal_name(entry)
    store_, own = _open(app, settings, store)
    try:
        config = config_entries(app)
        if entry in config:
            found = config[entry]
            if isinstance(found, Exception):
                raise found
            return build_plan(entry, found, app=app, settings=settings, store=store_)
        names = sorted(config)
        if store is not None and store_.entries is not None:
            stored = store_.entries.load_entries().entries
            names += sorted(n for n, e in stored.items() if e.definition is not None)
            # a name an older version stored unnormalized (not in NFC): found by its exact form
            for name in dict.fromkeys((entry, given)):
                if name in stored and stored[name].definition is not None:
                    parsed = entry_json.parse(name, stored[name].definition, app=app)
                    return build_plan(name, parsed, app=app, settings=settings, store=store_)
        hint = did_you_mean(entry, names)
        raise UnknownEntry(f"no entry {entry!r}{hint}: beat_schedule"
                          f"{' and the store do not define' if store is not None else ' does not define'}"
                          f" it; fix: check the name (celery anarchon list)")
    finally:
        if own:
            store_.close()


def next_slots(app, entry: str, n: int = 10, *, after: datetime.datetime | None = None,
               store: ClaimStore | None = None) -> list[datetime.datetime]:
    """The next ``n`` slots of ``entry`` strictly after ``after`` (default now), as aware UTC
    datetimes, exactly as every beat instance computes them (time zone and DST included, none
    before its ``start_at``; fewer, or none, when its ``end_at`` comes first).

    :param store: also look the entry up among the store's entries (the store is read).
    :raises ConfigError: as :func:`plan_of`.
    """
    plan = plan_of(app, entry, store=store)
    slot = datetime_to_ms(after or datetime.datetime.now(datetime.timezone.utc))
    out = []
    for _ in range(n):
        try:
            slot = plan.slots.next_after(slot)
        except SlotsEnded:
            break
        out.append(ms_to_datetime(slot))
    return out
