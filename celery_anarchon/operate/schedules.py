"""Change the schedule at run time: ``celery_anarchon.schedules(app)``.

::

    with celery_anarchon.schedules(app) as s:
        s.add("report", task="proj.tasks.report", schedule=crontab(minute=0, hour=3),
              kwargs={"full": True}, options={"queue": "reports"})
        s.pause("nightly-billing", reason="migration")      # a beat_schedule entry too
        s.run_now("report", request_id="ticket-4711")        # one extra run, once per id
        s.resume("nightly-billing")
        s.accept_loss()      # after the store lost data: every instance follows it as it is

Store entries live in the app's store (``anarchon_store_url``), per namespace, as JSON
(:mod:`celery_anarchon.schedule.definition`); every live beat instance follows within
``anarchon_sync_interval``. Pause, resume and run-now work on every entry, config
(``beat_schedule``) or store; add, update and remove only on store entries. Every definition is
checked before it is written, with the rules and messages of a beat start-up
(:func:`celery_anarchon.schedule.plan.build_plan`): an unsafe entry is refused now, not at 3 a.m. Every
name given is normalized to Unicode NFC (:func:`celery_anarchon.limits.entry_name`), as beat
normalizes the names of ``beat_schedule``. What each operation guarantees: docs/schedules.md.
"""
from __future__ import annotations

import dataclasses
import difflib
import getpass
import json
import os
import socket
import unicodedata
from typing import Any

from celery import beat
from celery.schedules import crontab

from celery_anarchon import limits
from celery_anarchon.schedule import as_data
from celery_anarchon.schedule import definition as entry_json
from celery_anarchon.schedule import timing
from celery_anarchon.settings import make_instance_id, open_app_store
from celery_anarchon.errors import ConfigError, EntryOwnedByConfig, StoreError, UnknownEntry
from celery_anarchon.schedule.plan import (
    EntryPlan, UnnamedItem, beat_schedule_of, build_plan, check_call, config_entry,
)
from celery_anarchon.schedule.slots import text_schedule_error
from celery_anarchon.stores.base import ClaimStore
from celery_anarchon.stores.entry_store import (
    EntrySnapshot, EntryStore, Pause, RunRequest, StoredEntry, entry_store,
)
from celery_anarchon.stores.run_now import SlotWindow, SlotWindowPassed
from celery_anarchon.schedule.timing import Settings, check_request_retention

#: where an entry is defined (:attr:`ScheduledEntry.source`)
CONFIG, STORE, UNKNOWN = "config", "store", "unknown"
#: the entry Celery's beat adds itself when results expire (owned by the configuration too)
CELERY_DEFAULT_ENTRIES = ("celery.backend_cleanup",)
_UNSET: Any = object()


def config_items(app) -> dict[str, dict]:
    """The config entries of ``app``, by name: its ``beat_schedule`` items, with the entry Celery's
    beat adds itself (``celery.backend_cleanup``, when results expire on a backend that does not
    expire them itself: Celery's ``Scheduler.install_default_entries``), which beat runs like the
    others. Every operator view (list, status, history, next, check, the testing helpers) takes
    the config entries from here.

    :param app: the Celery app (``beat_schedule``, ``result_expires``, its result backend).
    :returns: a new dict of ``beat_schedule`` items (dicts as Celery takes them) by name in
        Unicode NFC, as beat runs them (the second of two names equal in NFC keeps its own form:
        beat refuses the pair; a name that is not a string is keyed by its repr, its item an
        :class:`~celery_anarchon.schedule.plan.UnnamedItem` that :func:`~celery_anarchon.schedule.plan.config_entry`
        refuses); a result backend that cannot be built adds no entry (beat would fail on it at
        start-up).
    :raises ConfigError: ``beat_schedule`` is not a dict (:func:`~celery_anarchon.schedule.plan.beat_schedule_of`).
    """
    config: dict = {}
    for name, item in beat_schedule_of(app.conf.beat_schedule).items():
        if not isinstance(name, str):   # shown by its repr, refused by config_entry
            config[repr(name)] = UnnamedItem(name, item)
            continue
        normal = normal_name(name)
        config[name if normal in config else normal] = item
    try:
        cleanup = app.conf.result_expires and not app.backend.supports_autoexpire
    except Exception:                      # a backend that cannot be built: beat would fail
        cleanup = False
    if cleanup:
        config.setdefault("celery.backend_cleanup", {
            "task": "celery.backend_cleanup", "schedule": crontab("0", "4", "*"),
            "options": {"expires": 12 * 3600}})
    return config


def check_name(name: str) -> str:
    """The name of an entry written to the store (added, paused, run now), in Unicode NFC.
    Refused: empty or whitespace only, longer than 200 characters (one limit on every store), or
    holding a control character, a line break or an invisible format character (``\n``,
    ``\x1b``, U+2028, U+202E, U+200B, ...): it would break or disguise tables, logs and the
    status page's buttons (:func:`celery_anarchon.limits.entry_name`).

    :returns: the NFC form of ``name``.
    :raises ConfigError: naming the rule, the character (escaped) and the fix.
    """
    return limits.entry_name(name)


def normal_name(name: Any) -> Any:
    """The NFC form of a name given to find an entry (a name that is no string: as given)."""
    return unicodedata.normalize("NFC", name) if isinstance(name, str) else name


def given_name(name: Any) -> str:
    """The NFC form of a name given to find an entry (get, update, resume, remove): any non-empty
    text (a name an older version stored under other rules is still found).

    :raises ConfigError: ``name`` is not a non-empty string.
    """
    if not isinstance(name, str) or not name:
        raise ConfigError(f"entry name {limits.shown_value(name)}: not a non-empty string; fix: "
                          "name the entry (celery anarchon list shows the names)")
    return unicodedata.normalize("NFC", name)


def _by_text(by: Any, name: str | None = None) -> str:
    """``by`` (who makes a change, to the entry ``name``) checked: text every store can hold
    (:func:`celery_anarchon.limits.plain_text`)."""
    label = "by" if name is None else f"entry {limits.shown(name)}: by"
    return limits.plain_text(by, label, "give who makes the change as text, e.g. "
                             "'ops@example.com', or leave it out (user@host:pid)")


def default_by() -> str:
    """``user@host:pid``: who made a change, when the caller does not say."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (containers)
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}:{os.getpid()}"


@dataclasses.dataclass(frozen=True)
class ScheduledEntry:
    """One entry as :meth:`Schedules.get` and :meth:`Schedules.list` read it.

    :param name: the entry's name.
    :param source: ``"config"`` (this app's ``beat_schedule``), ``"store"`` (added at run time)
        or ``"unknown"`` (the store holds only a pause for a name neither defines here: a config
        entry of other hosts' ``beat_schedule``, or of none any more).
    :param definition: the definition as data (:mod:`celery_anarchon.schedule.definition`); a config
        entry's parts that cannot be data are ``{"repr": ...}`` with ``"storable": false``;
        ``None`` for ``"unknown"``.
    :param pause: the entry's pause, ``None`` when it runs.
    :param version: the store's version of this name (0: the store holds nothing for it).
    :param updated_ms: the store's clock at the last change of this name, UTC ms (None: never).
    :param updated_by: who made that change (None: never).
    :param shadowed: a config entry whose name the store also defines: beat_schedule wins.
    """

    name: str
    source: str
    definition: dict | None
    pause: Pause | None = None
    version: int = 0
    updated_ms: int | None = None
    updated_by: str | None = None
    shadowed: bool = False

    @property
    def paused(self) -> bool:
        """True while the entry is paused (every claim of its runs answers ``paused``)."""
        return self.pause is not None

    def as_json(self) -> dict:
        """Plain JSON values (the CLI's ``list --json``)."""
        out = dataclasses.asdict(self)
        out["paused"] = self.paused
        return out


class Schedules:
    """Store entries, pauses and run-now requests of one Celery app's namespace.

    Build it with :func:`celery_anarchon.schedules`; close it (or use ``with``). Methods raise
    :class:`~celery_anarchon.errors.StoreUnavailable` when the store cannot be reached; after that
    the outcome of a write is unknown (retrying it is safe: each write is idempotent, and a
    ``run_now`` retried with its ``request_id`` is one request and one run). A write the store
    applied but did not confirm durable within its ``confirm_timeout`` (a Redis store with
    ``durability`` on and its replicas down) raises :class:`~celery_anarchon.errors.StoreError`:
    the change may be lost if the master fails over now; repeat it once the replicas are back.

    :param app: the Celery app (its ``anarchon_*`` settings, ``beat_schedule``, ``timezone`` and
        ``tasks``).
    :param store: a store to use instead of the app's (then not closed by :meth:`close`).
    :param by: who makes the changes (default :func:`default_by`, ``user@host:pid``).
    :raises ConfigError: a bad ``anarchon_*`` setting, ``by`` that is not text every store can
        hold, or a store that cannot hold entries
        (naming the stores that can: ``entry_store.ENTRY_STORE_NAMES``).
    """

    def __init__(self, app, *, store: ClaimStore | None = None, by: str | None = None) -> None:
        self.app = app
        self.by = default_by() if by is None or by == "" else _by_text(by)   # before the store
        self.settings = Settings.from_app(app)
        own = store is None
        if store is None:
            store = open_app_store(app, self.settings, instance_id="api:" + make_instance_id())
        try:
            self.store: EntryStore = entry_store(store)
        except ConfigError:
            if own:
                store.close()
            raise
        self._own_store = own
        self._prepared = False

    # -- life cycle ----------------------------------------------------------------------------
    def close(self) -> None:
        """Release the store's connections (the app's own store only). Safe to call twice."""
        if self._own_store:
            self.store.close()

    def __enter__(self) -> Schedules:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _who(self, by: Any, name: str | None = None) -> str:
        """Who makes a change (to the entry ``name``): ``by`` checked (:func:`_by_text`), else
        this object's ``by``."""
        return self.by if by is None or by == "" else _by_text(by, name)

    def _ready(self) -> EntryStore:
        if not self._prepared:  # creates the tables/keys a store needs, as a beat start-up does
            self.store.prepare(())
            self._prepared = True
        return self.store

    # -- writing -------------------------------------------------------------------------------
    def add(self, name: str, *, task: str, schedule: Any, args: list | tuple = (),
            kwargs: dict | None = None, options: dict | None = None,
            anarchon: dict | None = None, by: str | None = None,
            check_task: bool = True) -> ScheduledEntry:
        """Add a store entry; every live instance runs it within ``anarchon_sync_interval``.

        :param task: the task's registered name.
        :param schedule: seconds (a number or a ``timedelta``), a ``crontab``,
            :class:`celery_anarchon.cron`, a ``solar``, or the data form
            (``{"every": 60}``, ``{"crontab": {...}, "timezone": ...}``, ``{"cron": "...",
            "timezone": ...}``, ``{"solar": ..., "lat": ..., "lon": ...}``).
        :param args: positional arguments (JSON values).
        :param kwargs: keyword arguments (JSON values).
        :param options: ``apply_async`` options (JSON values): queue, priority, expires, ...
            An ``"anarchon"`` key in them is taken as ``anarchon``.
        :param anarchon: the per-entry settings of ``beat_schedule``'s ``options['anarchon']``:
            ``jitter``, ``max_late``, ``anchor`` (seconds), ``lease``.
        :param check_task: refuse a task name this app does not register (skipped when the app
            registers no task of its own: then it cannot be known here).
        :raises EntryOwnedByConfig: ``beat_schedule`` defines ``name``.
        :raises EntryExists: the store holds an entry of that name.
        :raises ConfigError: the definition is invalid or breaks a timing rule (the start-up
            message), or the task is not registered.
        """
        name = check_name(name)
        self._not_config(name, "add")
        definition = self._definition(name, task=task, schedule=schedule, args=args,
                                      kwargs=kwargs, options=options, anarchon=anarchon)
        text = self._check(name, definition, check_task)
        stored = self._ready().put_entry(name, text, by=self._who(by, name), create=True)
        return self._as_scheduled(stored)

    def update(self, name: str, *, task: str = _UNSET, schedule: Any = _UNSET,
               args: list | tuple = _UNSET, kwargs: dict = _UNSET, options: dict = _UNSET,
               anarchon: dict = _UNSET, by: str | None = None,
               check_task: bool = True) -> ScheduledEntry:
        """Change a store entry: each argument given replaces that part of the definition (the
        others are kept; ``anarchon`` and ``options`` are replaced whole). A ``schedule`` that is
        a crontab or cron without a zone of its own (an object built without ``tz``, or data
        without ``"timezone"``) keeps the entry's zone (:func:`as_data.keep_zone`): name the
        zone to change it, the app's included. The new slots follow the start-up rule on every
        instance within ``anarchon_sync_interval``. Two updates of one entry at once: the last
        one written wins.

        :raises EntryOwnedByConfig: ``beat_schedule`` defines ``name`` (change it there).
        :raises UnknownEntry: the store holds no entry ``name``.
        :raises ConfigError: nothing to change, or as :meth:`add`.
        """
        name = given_name(name)
        self._not_config(name, "update")
        changes = {k: v for k, v in dict(task=task, schedule=schedule, args=args, kwargs=kwargs,
                                          options=options, anarchon=anarchon).items()
                   if v is not _UNSET}
        if not changes:
            raise ConfigError(f"entry {name!r}: nothing to change; fix: give task, schedule, args, "
                              "kwargs, options or anarchon")
        stored = self._snapshot().entries.get(name)
        if stored is None or stored.definition is None:
            raise self._unknown(name)
        current = _stored_data(name, stored.definition, strict=True)
        merged = {k: current.get(k) for k in ("task", "schedule", "args", "kwargs", "options",
                                              "anarchon") if k in current}
        if "schedule" in changes:
            given = as_data.schedule_json(changes["schedule"])
            zoned = as_data.keep_zone(given, current.get("schedule"))
            if zoned is not given:          # anything else is checked as given, with its message
                changes["schedule"] = zoned
        merged.update(changes)
        definition = self._definition(name, **{k: merged.get(k) for k in (
            "task", "schedule", "args", "kwargs", "options", "anarchon")})
        text = self._check(name, definition, check_task)
        stored = self._ready().put_entry(name, text, by=self._who(by, name), create=False)
        return self._as_scheduled(stored)

    def remove(self, name: str, *, by: str | None = None) -> None:
        """Remove a store entry (and its pause): no instance claims its runs after its next sync;
        a run already claimed is still sent.

        A name an older version stored unnormalized (not in NFC) is found by its exact form.

        :raises EntryOwnedByConfig: ``beat_schedule`` defines ``name`` (remove it there).
        :raises UnknownEntry: the store holds no entry ``name``.
        """
        given, name = name, given_name(name)
        self._not_config(name, "remove")
        store = self._ready()
        by = self._who(by, name)
        if limits.undecodable(name) is not None and name not in self._snapshot().entries:
            raise self._unknown(name)   # text no store encodes: only a name read from the store
        if not store.remove_entry(name, by=by) and (
                given == name or not store.remove_entry(given, by=by)):
            raise self._unknown(name)

    def pause(self, name: str, reason: str = "", *, by: str | None = None) -> ScheduledEntry:
        """Pause an entry, config or store: from now on every claim of its runs, on every
        instance (synced or not), answers ``paused`` and nothing is sent; each paused run is
        recorded once in the history with ``reason`` and who paused it.

        :raises UnknownEntry: neither ``beat_schedule`` nor the store defines ``name``.
        """
        name = check_name(name)
        limits.plain_text(reason, f"entry {limits.shown(name)}: reason", "give the reason as "
                          "text of visible characters (e.g. 'migration'), or none")
        by = self._who(by, name)
        self._known(name, self._snapshot())
        stored = self._ready().set_pause(name, Pause(reason=reason, by=by, at_ms=0), by=by)
        return self._as_scheduled(stored)

    def resume(self, name: str, *, by: str | None = None) -> ScheduledEntry:
        """Lift an entry's pause: its next slot runs; what was paused is not caught up, except a
        slot still within max_late that another instance claims after the resume (its claim
        comes later by its jitter): that slot runs once, as the newest slot may at a start-up.

        :raises UnknownEntry: nothing defines ``name`` and the store holds no pause of it.
        """
        name = given_name(name)
        snapshot = self._snapshot()
        stored = snapshot.entries.get(name)
        if stored is None or stored.pause is None:
            self._known(name, snapshot)
        return self._as_scheduled(self._ready().set_pause(name, None, by=self._who(by, name)))

    def new_request_id(self) -> str:
        """A new run-now request id: a UUIDv7 made from the store's clock
        (:meth:`~celery_anarchon.stores.run_now.RequestClock.new_id`). Make it before calling
        :meth:`run_now` when the call may have to be retried: the same id again is the same
        request (one run), for ``anarchon_request_retention``.

        :raises StoreUnavailable: the store cannot be reached (nothing was requested).
        """
        return self._ready().request_clock().new_id()

    def run_now(self, name: str, request_id: str | None = None, *,
                by: str | None = None) -> RunRequest:
        """One extra run of an entry, config or store, claimed like any run with a slot of its
        own, which the store chooses in the write that records the request (its clock's now,
        moved past the entry's scheduled slots and its other requests' slots); the schedule does
        not move. An instance that runs the entry claims it at its next sync; it is sent once.

        :param request_id: the caller's id: the same id again is the same request and no new
            run (the answer is the first request, ``created`` False, whatever happened to the
            entry since: paused, or removed), for as long as the store keeps it
            (``anarchon_request_retention``, default 7 days). It has the rules of a name
            (:func:`celery_anarchon.limits.request_id`: at most 200 characters, no control or
            format character, normalized to NFC). Default: a new id (:meth:`new_request_id`), in
            the answer; a :class:`StoreError` raised then carries it (``exc.request_id``) so the
            call can be retried with it.
        :returns: the request; ``created`` tells a new request from one made before.
        :raises UnknownEntry: neither ``beat_schedule`` nor the store defines ``name`` (and the
            store holds no request of it with ``request_id``).
        :raises RequestRefused: ``request_id`` is a UUIDv7 made before the store's memory of
            requests began, longer ago than the retention, or ahead of the store's clock: the
            store cannot tell whether it ran (nothing is written).
        :raises ConfigError: ``request_id`` breaks its rules; the entry is paused (resume it
            first: every claim would refuse the run); its definition is invalid; its store
            remembers too few of its runs to cover a run-now claim
            (:func:`~celery_anarchon.schedule.timing.check_run_now`); or ``anarchon_request_retention`` is
            shorter than the store's memory
            (:func:`~celery_anarchon.schedule.timing.check_request_retention`). Nothing is written.
        :raises StoreError: the store could not be reached or did not confirm the write: the
            outcome is unknown; repeat the call with the same ``request_id`` (``exc.request_id``).
        """
        name = check_name(name)
        by = self._who(by, name)
        given = request_id
        if request_id is not None:
            request_id = limits.request_id(request_id, name)
        check_request_retention(self.settings, self.store.memory)
        if request_id is not None:
            found = self._ready().find_request(name, request_id)
            if found is None and given != request_id:   # stored unnormalized by an older version
                found = self.store.find_request(name, given)
            if found is not None:
                return found                # the first request, whatever happened since
        snapshot = self._snapshot()
        entry = self._known(name, snapshot)
        stored = snapshot.entries.get(name)
        if stored is not None and stored.pause is not None:
            raise ConfigError(f"entry {name!r} is {stored.pause.describe()}: every claim of a run "
                              f"would answer paused; fix: resume it first (celery anarchon resume "
                              f"{name})")
        plan = build_plan(name, entry, app=self.app, settings=self.settings, store=self.store)
        self._check_run_now(plan, snapshot, None)
        retention_ms = timing.ms(self.settings.request_retention_s)
        try:
            for _ in range(3):
                clock = self._ready().request_clock()
                if request_id is None:
                    request_id = clock.new_id()
                self._check_run_now(plan, snapshot, clock.now_ms)
                window = SlotWindow.around(plan.slots, clock.now_ms)
                try:
                    return self.store.request_run(name, request_id, window,
                                                  by=by, retention_ms=retention_ms)
                except SlotWindowPassed:
                    continue                       # nothing written: a new window
            raise StoreError(f"entry {name!r}: run-now: the store's clock left the window of "
                             "scheduled slots the request was computed for, 3 times in a row (a "
                             "store clock that jumps, or calls that take a minute); fix: check "
                             "the store's clock and retry")
        except StoreError as exc:
            if request_id is not None:
                exc.request_id = request_id
                exc.add_note(f"run-now request id {request_id!r}: the outcome is unknown; "
                             "repeat the call with this request_id (one run, never two)")
            raise

    def _check_run_now(self, plan: EntryPlan, snapshot: EntrySnapshot, now_ms: int | None) -> None:
        """:func:`~celery_anarchon.schedule.timing.check_run_now` for a new request of ``plan``'s entry
        made at ``now_ms`` (the store's clock), counting the entry's requests of ``snapshot``
        made within the span before it; ``None``: the entry alone (before the clock is read)."""
        memory = self.store.memory
        if memory.count is None:
            return
        max_late_s, sync_s = plan.timing.max_late_s, self.settings.sync_interval_s
        span_ms = timing.ms(timing.run_now_span_s(max_late_s, sync_s))
        others = 0 if now_ms is None else sum(
            1 for r in snapshot.requests if r.entry == plan.name and r.slot_ms > now_ms - span_ms)
        timing.check_run_now(plan.name, memory, shortest_gap_s=plan.slots.shortest_gap_ms / 1000,
                             max_late_s=max_late_s, sync_interval_s=sync_s, others=others)

    def accept_loss(self, *, by: str | None = None) -> int:
        """Accept what the store lost (docs/design.md "Amnesia"): an instance that saw the store
        lose entries data keeps the pauses and store entries it knew (``celery anarchon status``
        lists them by instance) until the store holds each name again or an operator accepts the
        loss. After this call every such instance drops what it keeps at its next sync and
        follows the store as it is: pause or add again first what should stay.

        :returns: when the loss was accepted, the store's clock, UTC ms.
        """
        return self._ready().accept_loss(by=self._who(by))

    # -- reading -------------------------------------------------------------------------------
    def get(self, name: str) -> ScheduledEntry:
        """The entry ``name`` with its pause (a name an older version stored unnormalized, not in
        NFC, is found by its exact form, as :meth:`list` shows it).

        :raises UnknownEntry: neither ``beat_schedule`` nor the store knows ``name``.
        """
        given, name = name, given_name(name)
        snapshot = self._snapshot()
        # a name an older version stored unnormalized (not in NFC) is found by its exact form
        for candidate in dict.fromkeys((name, given)):
            for found in self._entries(snapshot, only=candidate):
                return found
        raise self._unknown(name)

    def list(self) -> list[ScheduledEntry]:
        """Every entry: this app's ``beat_schedule``, the store's entries, and pauses of other
        names (``source == "unknown"``), by name."""
        return self._entries(self._snapshot())

    # -- internals -----------------------------------------------------------------------------
    def _snapshot(self) -> EntrySnapshot:
        return self._ready().load_entries()

    def _config(self) -> dict:
        """:func:`config_items` of the app."""
        return config_items(self.app)

    def _config_entry(self, name: str, item: dict) -> beat.ScheduleEntry:
        """The entry Celery builds of a beat_schedule item (ConfigError when it cannot: the
        message beat stops with)."""
        return config_entry(name, item, app=self.app)

    def _not_config(self, name: str, what: str) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"entry name {name!r}: not a non-empty string; fix: name the entry")
        if name in self._config() or name in CELERY_DEFAULT_ENTRIES:
            fix = ("pick another name for the store entry" if what == "add" else
                   f"{what} it in beat_schedule and restart beat")
            raise EntryOwnedByConfig(
                f"entry {name!r} is defined in beat_schedule: {fix} (pause, resume and run-now "
                "work on it here)")

    def _unknown(self, name: str) -> UnknownEntry:
        names = sorted(self._config()) + sorted(self._store_names())
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return UnknownEntry(f"no entry {name!r}{hint}: neither beat_schedule nor the store "
                            f"(namespace {self.settings.namespace!r}) defines it; fix: check the "
                            "name (celery anarchon list), or add it")

    def _store_names(self) -> list[str]:
        try:
            return [n for n, s in self.store.load_entries().entries.items() if s.definition]
        except Exception:  # only for a hint in an error message
            return []

    def _known(self, name: str, snapshot: EntrySnapshot) -> beat.ScheduleEntry:
        """The entry ``name`` (config first, as the engine does), or UnknownEntry."""
        config = self._config()
        if name in config:
            return self._config_entry(name, config[name])
        stored = snapshot.entries.get(name)
        if stored is not None and stored.definition is not None:
            return entry_json.parse(name, stored.definition, app=self.app)
        raise self._unknown(name)

    def _definition(self, name: str, *, task, schedule, args, kwargs, options, anarchon) -> dict:
        if isinstance(schedule, str):           # "every 5 minutes": no schedule we can read
            raise text_schedule_error(name, schedule)
        options = dict(options or {}) if isinstance(options, dict) or options is None else options
        if isinstance(options, dict) and "anarchon" in options:
            if anarchon:
                raise ConfigError(f"entry {name!r}: the per-entry settings are given twice "
                                  "(options['anarchon'] and anarchon=); fix: give anarchon= only")
            anarchon = options.pop("anarchon")
        out = {"task": task, "schedule": as_data.schedule_json(schedule),
               "args": list(args) if isinstance(args, tuple) else ([] if args is None else args),
               "kwargs": {} if kwargs is None else kwargs, "options": options}
        if anarchon:
            out["anarchon"] = as_data.anarchon_json(anarchon) if isinstance(anarchon, dict) \
                else anarchon
        return out

    def _check(self, name: str, definition: dict, check_task: bool) -> str:
        """The canonical text of a definition that parses, builds a plan (every timing rule,
        with the start-up message) and names a registered task."""
        text = entry_json.canonical(definition, name=name)
        entry = entry_json.parse(name, text, app=self.app)
        build_plan(name, entry, app=self.app, settings=self.settings, store=self.store)
        if check_task:
            self._check_task(name, entry.task)
        return text

    def _check_task(self, name: str, task: str) -> None:
        check_task(self.app, name, task)

    def _entries(self, snapshot: EntrySnapshot, only: str | None = None) -> list[ScheduledEntry]:
        config = self._config()
        names = sorted(set(config) | set(snapshot.entries)) if only is None else [only]
        out = []
        for name in names:
            stored = snapshot.entries.get(name)
            if name in config:
                out.append(self._scheduled(name, CONFIG, self._config_data(name, config[name]),
                                           stored, shadowed=bool(stored and stored.definition)))
            elif stored is not None and stored.definition is not None:
                out.append(self._scheduled(name, STORE, _stored_data(name, stored.definition),
                                           stored))
            elif stored is not None and not stored.cleared:   # cleared: resumed or removed
                out.append(self._scheduled(name, UNKNOWN, None, stored))
        return out

    def _config_data(self, name: str, item: dict) -> dict:
        return config_data(self.app, name, item)

    @staticmethod
    def _scheduled(name: str, source: str, definition: dict | None, stored: StoredEntry | None,
                   shadowed: bool = False) -> ScheduledEntry:
        if stored is None:
            return ScheduledEntry(name, source, definition)
        return ScheduledEntry(name, source, definition, stored.pause, stored.version,
                              stored.updated_ms, stored.updated_by, shadowed)

    def _as_scheduled(self, stored: StoredEntry) -> ScheduledEntry:
        config = self._config()
        if stored.name in config:
            return self._scheduled(stored.name, CONFIG,
                                   self._config_data(stored.name, config[stored.name]), stored,
                                   shadowed=stored.definition is not None)
        if stored.definition is not None:
            return self._scheduled(stored.name, STORE,
                                   _stored_data(stored.name, stored.definition), stored)
        return self._scheduled(stored.name, UNKNOWN, None, stored)


def config_data(app, name: str, item: Any) -> dict:
    """A ``beat_schedule`` item as the views show its definition (:mod:`entry_json` data); an
    item that is no entry as its task and the repr of its schedule, ``"storable": false`` (its
    problem comes from :func:`~celery_anarchon.schedule.plan.build_plan`)."""
    try:
        entry = config_entry(name, item, app=app)
        check_call(name, entry)            # a task that is no text is no JSON either
        return as_data.from_entry(entry)
    except Exception:  # a broken beat_schedule entry: shown, never stored
        return _broken_item_data(item)


def _broken_item_data(item: Any) -> dict:
    """What the views show of a ``beat_schedule`` item that is no entry."""
    if not isinstance(item, dict):
        return {"task": None, "schedule": {"repr": limits.object_repr(item)}, "storable": False}
    task = item.get("task")
    return {"task": task if isinstance(task, str) else limits.object_repr(task),
            "schedule": {"repr": limits.object_repr(item.get("schedule"))}, "storable": False}


def _stored_data(name: str, text: str, *, strict: bool = False) -> dict:
    """A stored definition as data, for views and ``update``; its nesting is checked before it is
    parsed (a definition an older version stored may nest past Python's recursion limit).

    :param strict: raise instead of returning a note (``update`` merges into the data).
    :returns: the definition; one that cannot be read back as an object (``strict`` off) is
        ``{"repr": <why>, "storable": false}``.
    :raises ConfigError: (``strict``) not valid UTF-8, nested too deep, not JSON, or not an
        object.
    """
    problem = limits.undecodable(text)  # bytes the store read that are not UTF-8
    if problem is None and limits.text_too_deep(text):
        problem = f"is nested more than {limits.MAX_DEPTH} levels deep"
    elif problem is None:
        try:
            data = json.loads(text)
        except ValueError as exc:
            problem = f"is not valid JSON ({exc})"
        else:
            if isinstance(data, dict):
                return data
            problem = "is not a JSON object"
    message = (f"entry {name!r}: the stored definition {problem}; fix: remove the entry and add "
               "it again")
    if strict:
        raise ConfigError(message)
    return {"repr": message, "storable": False}


def check_task(app, name: str, task: str) -> None:
    """Refuse a task name ``app`` does not register, when it registers tasks of its own (an app
    that registers none cannot know which names the workers register). The modules of the app's
    ``imports`` / ``include`` are registered only once imported (a worker imports them; the
    command line does too before it checks).

    :param name: the entry's name (for the message).
    :param task: the task's name.
    :raises ConfigError: the task is not registered (naming the closest registered name).
    """
    tasks = app.tasks  # finalizes the app: autodiscovered and imported tasks are in
    own = sorted(t for t in tasks if not t.startswith("celery."))
    if not own or task in tasks:
        return  # no task of its own: the app cannot know which names the workers register
    close = difflib.get_close_matches(task, own, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(f"entry {name!r}: task {task!r} is not registered in app "
                      f"{app.main!r}{hint}; fix: use a registered task name, import the "
                      "module that defines it (imports, include, autodiscover_tasks), or pass "
                      "check_task=False (command line: --no-check-task) if only the workers "
                      "know it")


def schedules(app, *, store: ClaimStore | None = None, by: str | None = None) -> Schedules:
    """The runtime schedule of ``app``'s namespace (also ``celery_anarchon.schedules(app)``).

    :raises ConfigError: the store cannot hold entries (RabbitMQ, NATS): the message names the
        stores that can.
    """
    return Schedules(app, store=store, by=by)
