"""Timing settings, their defaults, and the start-up rules (docs/design.md "Timing").

Settings come from the Celery configuration (``anarchon_*``, read by
:mod:`celery_anarchon.settings` into a :class:`TimingSettings`) and from each entry's
``options={"anarchon": {...}}``. Durations are seconds (int, float or ``timedelta``), as everywhere
in Celery. Every unsafe combination raises :class:`~celery_anarchon.errors.ConfigError` when beat
starts, naming the entry, the rule, the values and the fix: failing at start-up beats running a
job twice at 3 a.m.

The rules:

========================================  ===================================================
rule                                      why
========================================  ===================================================
jitter < half the shortest gap            the jitter windows of two consecutive runs must not meet
max_late > jitter                         an instance waiting its full jitter must not be late
jitter + max_late < store memory          a late claim must still find the first claim
count x shortest gap > jitter + max_late  the same, for stores that remember a number of runs
heartbeat < half of the lease duration    a lease is renewed at least twice before it ends
========================================  ===================================================

The rules of ``catch_up='all'`` (its window against max_late and the store's memory) are in
:mod:`celery_anarchon.schedule.catch_up`.
"""
from __future__ import annotations

import dataclasses
import datetime
import difflib
import logging
import math
import zoneinfo
from typing import Any, Callable

from celery_anarchon import limits
from celery_anarchon.schedule import catch_up as catch_up_rules
from celery_anarchon.schedule.catch_up import DEFAULT_CATCH_UP, DEFAULT_CATCH_UP_WINDOW_S
from celery_anarchon.schedule.memory_rule import check_span
from celery_anarchon.schedule.zones import did_you_mean
from celery_anarchon._util import LATENESS_TOLERANCE_MS, Memory
from celery_anarchon._util import duration as seconds  # seconds(value, what): a duration >= 0
from celery_anarchon.errors import ConfigError

logger = logging.getLogger(__name__)

DEFAULT_JITTER_S = 2.0
DEFAULT_MAX_LATE_S = 60.0
DEFAULT_LEASE_S = 30.0
DEFAULT_HEARTBEAT_S = 5.0
DEFAULT_QUEUE_TIMEOUT_S = 300.0
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_SYNC_INTERVAL_S = 5.0
#: a run-now request is claimed with a max_late of at least 2 x the sync interval + this, seconds
#: (the instances see it up to one interval late, and one more interval covers a missed sync)
RUN_NOW_MARGIN_S = 5.0
#: how long the store keeps the id of a run-now request (``anarchon_request_retention``), seconds:
#: a week, so that a retry days later is still one request
DEFAULT_REQUEST_RETENTION_S = 7 * 86400.0
#: the longest ``anarchon_request_retention``, seconds (ten years: more is a typo)
MAX_REQUEST_RETENTION_S = 3650 * 86400.0

#: keys allowed in ``options={"anarchon": {...}}``
ENTRY_KEYS = ("anchor", "catch_up", "catch_up_window", "end_at", "jitter", "lease", "max_late",
              "start_at")
#: keys allowed in ``options={"anarchon": {"lease": {...}}}``
LEASE_KEYS = ("duration", "heartbeat", "max_attempts", "overlap", "queue_timeout")
OVERLAP_VALUES = ("skip", "allow")
def _fmt(s: float) -> str:
    """Seconds for messages: ``2 s``, ``0.25 s``, ``1.5 s``."""
    return f"{s:g} s"


def _unknown_keys(given: dict, allowed: tuple[str, ...], where: str) -> None:
    unknown = [k for k in given if k not in allowed]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(str(key), allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{where}: unknown key {key!r}{hint}. Allowed keys: {', '.join(allowed)}. "
                          "A typo must not silently disable a rule.")


@dataclasses.dataclass(frozen=True)
class LeaseSettings:
    """A leased entry's settings (docs/design.md "Leases"), seconds.

    :param duration_s: how long one lease lasts without renewal.
    :param heartbeat_s: how often the executing process renews it (< duration_s / 2).
    :param overlap: ``"skip"`` (default) or ``"allow"`` a new slot while an earlier run is alive.
    :param queue_timeout_s: how long a queued run may wait for a worker before takeover.
    :param max_attempts: attempts (the first send included) before the run is recorded lost.
    """

    duration_s: float = DEFAULT_LEASE_S
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    overlap: str = "skip"
    queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S
    max_attempts: int = DEFAULT_MAX_ATTEMPTS


@dataclasses.dataclass(frozen=True)
class TimingSettings:
    """The app-wide values the timing rules read, seconds (defaults applied, types checked):
    :class:`celery_anarchon.settings.Settings` reads them from the Celery configuration (its
    table ``OPTIONS``) and extends this class with the rest of the ``anarchon_*`` settings.

    :param jitter_s: ``anarchon_jitter`` or ``None`` (default: 2 s lowered per entry).
    :param max_late_s: ``anarchon_max_late``: the default max_late of an entry (default 60).
    :param lease_s: ``anarchon_lease``: the default lease duration of a leased entry (default 30).
    :param heartbeat_s: ``anarchon_heartbeat``: the default lease heartbeat (default 5).
    :param sync_interval_s: ``anarchon_sync_interval``: how often an instance reads the store's
        entries version (and heartbeats), seconds (default 5).
    :param request_retention_s: ``anarchon_request_retention``: how long the store keeps the id of
        a run-now request made by this app (the API, the command line, the status page), seconds
        (default 7 days); a request id is one run for that long (docs/schedules.md).
    :param catch_up: ``anarchon_catch_up``: the default catch-up policy of an entry
        (:mod:`~celery_anarchon.schedule.catch_up`; default ``"newest"``).
    :param catch_up_window_s: ``anarchon_catch_up_window``: the default window of
        ``catch_up='all'``, seconds (default 600).
    :ivar run_now_max_late_s: derived once, at construction: the least max_late of a run-now
        request's claim, 2 x ``sync_interval_s`` + :data:`RUN_NOW_MARGIN_S`, seconds.
    """

    jitter_s: float | None = None
    max_late_s: float = DEFAULT_MAX_LATE_S
    lease_s: float = DEFAULT_LEASE_S
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    sync_interval_s: float = DEFAULT_SYNC_INTERVAL_S
    request_retention_s: float = DEFAULT_REQUEST_RETENTION_S
    catch_up: str = DEFAULT_CATCH_UP
    catch_up_window_s: float = DEFAULT_CATCH_UP_WINDOW_S
    run_now_max_late_s: float = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "run_now_max_late_s",
                           2 * self.sync_interval_s + RUN_NOW_MARGIN_S)


def timezone_error(app) -> ConfigError | None:
    """The error of an app whose ``timezone`` setting names no known zone, else ``None``.

    :returns: a ConfigError naming the setting, the value and the fix, or ``None``.
    """
    try:
        zone = app.timezone
    # OSError: the tzdata package's look-up of a name too long for a file name
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError) as exc:
        value = app.conf.get("timezone")
        return ConfigError(f"timezone {value!r} (app.conf.timezone) is not a known IANA time "
                           f"zone ({exc}){did_you_mean(value)}; fix: use a zone name such as "
                           "'UTC' or 'Europe/Berlin' (the zones of the system, or pip install "
                           "tzdata)")
    if not isinstance(zone, datetime.tzinfo):   # Celery passes a value that is no text as is
        value = app.conf.get("timezone")
        return ConfigError(f"timezone {value!r} (app.conf.timezone) is not a time zone: it is "
                           f"{type(value).__name__}, not an IANA zone name; fix: use a zone name "
                           "such as 'UTC' or 'Europe/Berlin'")
    return None


@dataclasses.dataclass(frozen=True)
class EntryTiming:
    """The timing of one entry after defaults and rules, seconds.

    :param jitter_s: the upper bound of the random delay drawn per run before claiming.
    :param max_late_s: a run whose claim would come later than this after its slot is skipped.
    :param anchor_s: shift of an interval entry's slots from the Unix epoch, or ``None``.
    :param lease: the lease settings of a leased entry, or ``None``.
    :param catch_up: the catch-up policy, ``"newest"``, ``"all"`` or ``"none"``.
    :param catch_up_window_s: how late a slot of a ``catch_up='all'`` entry may still be claimed,
        seconds; ``None`` for the other policies.
    """

    jitter_s: float
    max_late_s: float
    anchor_s: float | None = None
    lease: LeaseSettings | None = None
    catch_up: str = DEFAULT_CATCH_UP
    catch_up_window_s: float | None = None

    def as_dict(self) -> dict:
        """Plain values for a fingerprint. The default policy is left out (and the window of
        another than ``"all"``), so an entry that keeps it keeps the fingerprint it had before
        the policy existed."""
        out = dataclasses.asdict(self)
        if self.catch_up == DEFAULT_CATCH_UP:
            del out["catch_up"]
        if self.catch_up_window_s is None:
            del out["catch_up_window_s"]
        return out


def split_entry_options(name: str, options: dict | None) -> tuple[dict, dict]:
    """Separate ``options["anarchon"]`` from the options Celery's ``apply_async`` receives.

    :returns: ``(anarchon_options, celery_options)``; neither dict is the caller's.
    :raises ConfigError: ``options["anarchon"]`` is not a dict or has an unknown key, or a key
        of it (:data:`ENTRY_KEYS`) is in ``options`` itself: Celery would pass it to
        ``apply_async`` and the rule it sets would silently not apply.
    """
    options = dict(options or {})
    ours = options.pop("anarchon", None) or {}
    if not isinstance(ours, dict):
        raise ConfigError(f"entry {name!r}: options['anarchon'] must be a dict, got {ours!r}")
    _unknown_keys(ours, ENTRY_KEYS, f"entry {name!r}: options['anarchon']")
    misplaced = {k: options[k] for k in ENTRY_KEYS if k in options}
    if misplaced:
        given = ", ".join(f"options[{k!r}] = {v!r}" for k, v in misplaced.items())
        what = "is a celery_anarchon option" if len(misplaced) == 1 else "are celery_anarchon options"
        raise ConfigError(f"entry {name!r}: {given} {what} outside options['anarchon']: Celery "
                          "would pass it to apply_async and it would not apply; fix: "
                          f"options={{'anarchon': {misplaced!r}}}")
    return dict(ours), options


def _lease_settings(name: str, value: Any, settings: TimingSettings) -> LeaseSettings | None:
    if value is None or value is False:
        return None
    if value is True:
        value = {}
    if not isinstance(value, dict):
        raise ConfigError(f"entry {name!r}: options['anarchon']['lease'] must be True or a dict of "
                          f"{', '.join(LEASE_KEYS)}; got {value!r}")
    where = f"entry {name!r}: options['anarchon']['lease']"
    _unknown_keys(value, LEASE_KEYS, where)
    duration = seconds(value.get("duration", settings.lease_s), f"{where}['duration']")
    heartbeat = seconds(value.get("heartbeat", settings.heartbeat_s), f"{where}['heartbeat']")
    queue_timeout = seconds(value.get("queue_timeout", DEFAULT_QUEUE_TIMEOUT_S), f"{where}['queue_timeout']")
    overlap = value.get("overlap", "skip")
    attempts = value.get("max_attempts", DEFAULT_MAX_ATTEMPTS)
    if overlap not in OVERLAP_VALUES:
        raise ConfigError(f"{where}['overlap']: {overlap!r} is not one of {OVERLAP_VALUES}")
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
        raise ConfigError(f"{where}['max_attempts']: {attempts!r} must be an integer >= 1 (default 3)")
    if duration <= 0 or heartbeat <= 0 or queue_timeout <= 0:
        raise ConfigError(f"{where}: duration, heartbeat and queue_timeout must be more than 0 s "
                          f"(got {duration:g}, {heartbeat:g}, {queue_timeout:g})")
    if heartbeat >= duration / 2:
        raise ConfigError(
            f"entry {name!r}: lease heartbeat {_fmt(heartbeat)} must be less than half of the lease "
            f"duration {_fmt(duration)}: a lease must be renewed at least twice before it can run "
            f"out. Fix: set options['anarchon']['lease']['heartbeat'] below {duration / 2:g} "
            f"(e.g. {duration / 6:.3g}) or raise 'duration'.")
    return LeaseSettings(duration, heartbeat, overlap, queue_timeout, attempts)


def resolve(name: str, ours: dict, settings: TimingSettings, *, shortest_gap_s: float,
            memory: Memory, is_interval: bool = True,
            warn: Callable[[str], None] | None = None) -> EntryTiming:
    """Apply defaults and every start-up rule to one entry.

    :param ours: the entry's ``options["anarchon"]`` (see :func:`split_entry_options`).
    :param shortest_gap_s: the shortest gap between the entry's consecutive slots, seconds.
    :param memory: the store's memory (docs/design.md store memory table).
    :param is_interval: whether the entry's schedule is an interval (the caller handles
        ``anchor``, which only such schedules take).
    :param warn: told each warning of a setting that is allowed but unwise (docs/design.md "Leases":
        Overlap), as one line naming the entry; default: logged at WARNING.
    :raises ConfigError: naming the entry, the rule, the values and the fix.
    """
    where = f"entry {name!r}"
    explicit = ours.get("jitter", settings.jitter_s)
    source = ("options['anarchon']['jitter']" if "jitter" in ours else "anarchon_jitter")
    if explicit is None:
        jitter_s = min(DEFAULT_JITTER_S, shortest_gap_s / 4)
    else:
        jitter_s = seconds(explicit, f"{where}: {source}")
        if jitter_s >= shortest_gap_s / 2:
            raise ConfigError(
                f"{where}: jitter {_fmt(jitter_s)} ({source}) must be less than half the shortest "
                f"gap between its slots ({_fmt(shortest_gap_s)}), or the jitter windows of two "
                f"consecutive runs meet. Fix: set options={{'anarchon': {{'jitter': "
                f"{shortest_gap_s / 4:g}}}}} on this entry (a quarter of the gap), or leave jitter "
                "unset to get that default.")
    max_late_s = seconds(ours.get("max_late", settings.max_late_s), f"{where}: max_late")
    if max_late_s <= jitter_s:
        raise ConfigError(
            f"{where}: max_late {_fmt(max_late_s)} must be greater than jitter {_fmt(jitter_s)}: an "
            f"instance waiting its full jitter would already be late. Fix: raise max_late "
            f"(options['anarchon']['max_late'] or anarchon_max_late, default 60) above "
            f"{jitter_s:g}, or lower the jitter.")
    check_span(where, jitter_s + max_late_s, memory, shortest_gap_s,
               terms=f"jitter {_fmt(jitter_s)} + max_late {_fmt(max_late_s)}",
               count_terms="jitter + max_late", risk="a claim arriving",
               count_risk="a late claim", lower="lower max_late", count_lower="lower max_late")
    lease = _lease_settings(name, ours.get("lease"), settings)
    if lease is not None and shortest_gap_s < lease.duration_s + 2 * lease.heartbeat_s:
        (warn or logger.warning)(
            f"{where}: the shortest gap between slots ({_fmt(shortest_gap_s)}) is shorter than "
            f"lease duration + 2 x heartbeat ({_fmt(lease.duration_s + 2 * lease.heartbeat_s)}): "
            "a dead runner's replacement would always be superseded by the next slot. Lower the "
            "lease duration or run the entry less often.")
    policy, window_s = catch_up_rules.resolve(
        name, ours, default=settings.catch_up, default_window_s=settings.catch_up_window_s,
        jitter_s=jitter_s, max_late_s=max_late_s, shortest_gap_s=shortest_gap_s, memory=memory,
        leased=lease is not None)
    return EntryTiming(jitter_s, max_late_s, None, lease, policy, window_s)


def check_sync_interval(settings: TimingSettings, memory: Memory) -> None:
    """The sync interval against the store's memory: a run-now request is claimed up to
    :attr:`TimingSettings.run_now_max_late_s` after its slot, which the store must still remember
    (the rule "jitter + max_late < store memory" of docs/design.md "Timing", for run-now requests).

    :raises ConfigError: naming both values and the fix.
    """
    span = settings.run_now_max_late_s
    if memory.duration_s is not None and span >= memory.duration_s:
        raise ConfigError(
            f"anarchon_sync_interval {_fmt(settings.sync_interval_s)}: a run-now request is claimed "
            f"up to 2 x the sync interval + {_fmt(RUN_NOW_MARGIN_S)} = {_fmt(span)} after it was "
            f"made, which must be less than the store's memory of a claimed run "
            f"({_fmt(memory.duration_s)}, store option {memory.setting!r}), or a late claim could "
            f"win it a second time. Fix: lower anarchon_sync_interval (default 5) or set "
            f"anarchon_store_options[{memory.setting!r}] to at least {math.ceil(span * 2):g}.")


def run_now_span_s(max_late_s: float, sync_interval_s: float) -> float:
    """How long after its slot a run-now request is claimed: max(the entry's ``max_late_s``, 2 x
    ``sync_interval_s`` + :data:`RUN_NOW_MARGIN_S`), seconds (an instance claims it at its next
    sync; :attr:`~celery_anarchon.beat.engine.sync.EntrySync.request_max_late_ms`)."""
    return max(max_late_s, 2 * sync_interval_s + RUN_NOW_MARGIN_S)


def check_run_now(name: str, memory: Memory, *, shortest_gap_s: float, max_late_s: float,
                  sync_interval_s: float, others: int = 0) -> None:
    """A run-now request of entry ``name`` against a store that remembers a number of runs per
    entry (``memory.count``: Redis ``idmp`` ``max_size``, ``script`` ``history_size``): it is
    claimed up to :func:`run_now_span_s` after its slot, which ``count`` x the entry's shortest
    gap must cover (the rule "count x shortest gap must cover jitter + max_late" of
    docs/design.md "Timing", for run-now requests), or a late claim finds the first one
    forgotten: a second win on ``idmp``, a refusal (a miss) on ``script``. Each of the entry's
    ``others`` run-now requests made within that span before this one takes one of those runs.
    Checked where a request is made (:meth:`Schedules.run_now`) and where beat claims one
    (:meth:`~celery_anarchon.beat.engine.sync.EntrySync.requests_due`), not at start-up: an entry
    that is never run now keeps running (its scheduled runs are covered by :func:`resolve`).

    :param shortest_gap_s: the entry's shortest gap between slots, seconds.
    :param max_late_s: the entry's max_late, seconds.
    :param sync_interval_s: ``anarchon_sync_interval``, seconds.
    :param others: the entry's other run-now requests whose slots are within the span before
        this one's.
    :raises ConfigError: naming the entry, the values and the fix.
    """
    if memory.count is None:
        return
    span = run_now_span_s(max_late_s, sync_interval_s)
    covered = (memory.count - others) * shortest_gap_s
    if covered > span:
        return
    need = math.floor(span / shortest_gap_s) + 1 + others
    where = (f"entry {limits.shown(name)}: run-now refused: a run-now request is claimed up to "
             f"{_fmt(span)} after its slot (2 x anarchon_sync_interval {_fmt(sync_interval_s)} + "
             f"{_fmt(RUN_NOW_MARGIN_S)}, or the entry's max_late if longer), but the store "
             f"remembers at most {memory.count} runs per entry (store option "
             f"{memory.count_setting!r})")
    risk = ("a claim that late could find the first claim forgotten, and win the run a second "
            "time or be refused (a miss)")
    fix = f"set anarchon_store_options[{memory.count_setting!r}] to at least {need * 2}"
    if others and memory.count * shortest_gap_s > span:
        raise ConfigError(
            f"{where}, and {others} other run-now request(s) of the entry made in the last "
            f"{_fmt(span)} take {others} of them; with {_fmt(shortest_gap_s)} between slots the "
            f"rest is {_fmt(covered)}: {risk}. Fix: wait {_fmt(span)} and ask again, or {fix}.")
    sync_below = (memory.count * shortest_gap_s - RUN_NOW_MARGIN_S) / 2
    lower = (f", lower anarchon_sync_interval below {sync_below:g} s"
             if sync_below > 0 and max_late_s < memory.count * shortest_gap_s else "")
    raise ConfigError(
        f"{where}; with {_fmt(shortest_gap_s)} between slots that is "
        f"{_fmt(memory.count * shortest_gap_s)}: {risk}. Its scheduled runs are not affected. "
        f"Fix: {fix}{lower}, or wait for the entry's next run.")


def check_request_retention(settings: TimingSettings, memory: Memory) -> None:
    """The retention of run-now request ids against the store: a request stays claimable for
    :attr:`TimingSettings.run_now_max_late_s` after its slot and is read by every instance for the
    store's memory, so its id must be kept longer than both (+ the store-side lateness
    tolerance), or a retry while the first request can still run would be a second request
    (docs/schedules.md, "What each operation guarantees").

    :raises ConfigError: naming both values and the fix.
    """
    need = max(settings.run_now_max_late_s, memory.duration_s or 0) + LATENESS_TOLERANCE_MS / 1000
    if settings.request_retention_s < need:
        read = (f"read by every instance for the store's memory ({_fmt(memory.duration_s)}, "
                f"store option {memory.setting!r}) and " if memory.duration_s else "")
        raise ConfigError(
            f"anarchon_request_retention {_fmt(settings.request_retention_s)} must be at least "
            f"{_fmt(need)}: a run-now request is {read}claimed up to "
            f"{_fmt(settings.run_now_max_late_s)} after its slot, and a retry of its id while it "
            f"can still run must find it. Fix: raise anarchon_request_retention (default "
            f"{DEFAULT_REQUEST_RETENTION_S:g} s, a week).")


def ms(s: float) -> int:
    """Seconds to integer milliseconds (rounded)."""
    return int(round(s * 1000))


__all__ = ["ConfigError", "EntryTiming", "LeaseSettings", "TimingSettings",
           "check_request_retention", "check_run_now", "check_sync_interval", "run_now_span_s",
           "resolve", "seconds", "split_entry_options", "ms", "LATENESS_TOLERANCE_MS"]


@dataclasses.dataclass(frozen=True)
class LeaseTerms:
    """What a leased entry's claim needs from the store.

    :param queue_timeout_ms: how long a queued run may wait for a worker to adopt it, ms.
    :param overlap_allowed: ``overlap="allow"``: a new slot runs even if an earlier run is alive.
    """

    queue_timeout_ms: int
    overlap_allowed: bool = False


#: The stores that hold leases, in the words of error messages (docs/design.md "Leases").
LEASE_STORE_NAMES = "Redis (strategy 'lease'), PostgreSQL or SQLite"
