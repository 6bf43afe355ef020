"""Change the schedule at run time: ``celery_anarchon.schedules(app)``.

::

    with celery_anarchon.schedules(app) as s:
        s.add("report", task="proj.tasks.report", schedule=crontab(minute=0, hour=3),
              kwargs={"full": True}, options={"queue": "reports"})
        s.pause("nightly-billing", reason="migration")      # a beat_schedule entry too
        s.run_now("report", request_id="ticket-4711")        # one extra run, once per id
        s.resume("nightly-billing")
        s.backfill("report", "2026-03-01T00:00:00Z", "2026-03-01T06:00:00Z")  # each slot once
        s.accept_loss()      # after the store lost data: every instance follows it as it is

Store entries live in the app's store (``anarchon_store_url``), per namespace, as JSON
(:mod:`celery_anarchon.schedule.definition`); every live beat instance follows within
``anarchon_sync_interval``. Pause, resume and run-now work on every entry, config
(``beat_schedule``) or store; add, update and remove only on store entries. Every definition is
checked before it is written, with the rules and messages of a beat start-up
(:func:`celery_anarchon.schedule.plan.build_plan`): an unsafe entry is refused now, not at 3 a.m. Every
name given is normalized to Unicode NFC (:func:`celery_anarchon.limits.entry_name`), as beat
normalizes the names of ``beat_schedule``. What each operation guarantees: docs/schedules.md.

The parts: :mod:`~celery_anarchon.operate.session` (the namespace's store and who makes the
changes), :mod:`~celery_anarchon.operate.names`, :mod:`~celery_anarchon.operate.config` (the
config entries), :mod:`~celery_anarchon.operate.listing` (entries as read) and
:mod:`~celery_anarchon.operate.run_now` (a run-now request's write) and
:mod:`~celery_anarchon.operate.backfill` (backfill: ``backfill``, ``plan_backfill``).
"""
from __future__ import annotations

import time
from typing import Any

from celery_anarchon import limits
from celery_anarchon.errors import ConfigError
from celery_anarchon.operate import run_now as run_now_request
from celery_anarchon.operate.backfill import Backfills
from celery_anarchon.operate.config import check_task as _check_task, refuse_config
from celery_anarchon.operate.listing import ScheduledEntry, listed, stored_data
from celery_anarchon.operate.names import check_name, default_by, given_name
from celery_anarchon.operate.session import NamespaceSession
from celery_anarchon.schedule import as_data
from celery_anarchon.schedule import definition as entry_json
from celery_anarchon._util import iso
from celery_anarchon.schedule.plan import EntryPlan, build_plan
from celery_anarchon.schedule.slots import SlotsEnded, text_schedule_error
from celery_anarchon.schedule.slots.window import first_cut
from celery_anarchon.schedule.timing import TimingSettings, check_request_retention
from celery_anarchon.stores.base import ClaimStore, RunEvent
from celery_anarchon.stores.entry_store import Pause, RunRequest, pause_span_detail

__all__ = ["Schedules", "ScheduledEntry", "schedules", "default_by"]

_UNSET: Any = object()


class Schedules(NamespaceSession, Backfills):
    """Store entries, pauses and run-now requests of one Celery app's namespace.

    Build it with :func:`celery_anarchon.schedules`; close it (or use ``with``). Methods raise
    :class:`~celery_anarchon.errors.StoreUnavailable` when the store cannot be reached; after that
    the outcome of a write is unknown (retrying it is safe: each write is idempotent, and a
    ``run_now`` retried with its ``request_id`` is one request and one run), but for
    :class:`~celery_anarchon.errors.StoreNotReached`: not reached before any write. A write
    the store applied but did not confirm durable within its ``confirm_timeout`` (a Redis store
    with ``durability`` on and its replicas down) raises
    :class:`~celery_anarchon.errors.StoreError`: the change may be lost if the master fails over
    now; repeat it once the replicas are back.

    :param app: the Celery app (its ``anarchon_*`` settings, ``beat_schedule``, ``timezone`` and
        ``tasks``).
    :param store: a store to use instead of the app's (then not closed by :meth:`close`).
    :param by: who makes the changes (default :func:`default_by`, ``user@host:pid``).
    :raises ConfigError: a bad ``anarchon_*`` setting, ``by`` that is not text every store can
        hold, or a store that cannot hold entries
        (naming the stores that can: ``entry_store.ENTRY_STORE_NAMES``).
    """

    # -- writing -------------------------------------------------------------------------------
    def add(self, name: str, *, task: str, schedule: Any, args: list | tuple = (),
            kwargs: dict | None = None, options: dict | None = None,
            anarchon: dict | None = None, start_at: Any = None, end_at: Any = None,
            catch_up: str | None = None, catch_up_window: Any = None,
            by: str | None = None, check_task: bool = True) -> ScheduledEntry:
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
            ``jitter``, ``max_late``, ``anchor`` (seconds), ``lease``, ``start_at``, ``end_at``,
            ``catch_up``, ``catch_up_window``.
        :param start_at: no slot before this instant (an aware ``datetime`` or ISO 8601 text
            with a UTC offset; a naive one is refused); ``anarchon['start_at']``.
        :param end_at: no slot after this instant, as ``start_at``; it must come after it.
        :param catch_up: the entry's catch-up policy, ``"newest"``, ``"all"`` or ``"none"``
            (:mod:`celery_anarchon.schedule.catch_up`); ``anarchon['catch_up']``.
        :param catch_up_window: with ``catch_up="all"``: how far back missed slots are claimed
            (seconds or a ``timedelta``); ``anarchon['catch_up_window']``.
        :param check_task: refuse a task name this app does not register (skipped when the app
            registers no task of its own: then it cannot be known here).
        :raises EntryOwnedByConfig: ``beat_schedule`` defines ``name``.
        :raises EntryExists: the store holds an entry of that name.
        :raises ConfigError: the definition is invalid or breaks a timing rule (the start-up
            message), or the task is not registered.
        """
        name = check_name(name)
        refuse_config(self.app, name, "add")
        definition = _definition(name, task=task, schedule=schedule, args=args,
                                 kwargs=kwargs, options=options, anarchon=anarchon,
                                 window=_given(start_at=start_at, end_at=end_at,
                                               catch_up=catch_up, catch_up_window=catch_up_window))
        return self._write(name, definition, check_task, by, create=True)

    def update(self, name: str, *, task: str = _UNSET, schedule: Any = _UNSET,
               args: list | tuple = _UNSET, kwargs: dict = _UNSET, options: dict = _UNSET,
               anarchon: dict = _UNSET, start_at: Any = _UNSET, end_at: Any = _UNSET,
               catch_up: str | None = _UNSET, catch_up_window: Any = _UNSET,
               by: str | None = None, check_task: bool = True) -> ScheduledEntry:
        """Change a store entry: each argument given replaces that part of the definition (the
        others are kept; ``anarchon`` and ``options`` are replaced whole). A ``schedule`` that is
        a crontab or cron without a zone of its own (an object built without ``tz``, or data
        without ``"timezone"``) keeps the entry's zone (:func:`as_data.keep_zone`): name the
        zone to change it, the app's included. The new slots follow the start-up rule on every
        instance within ``anarchon_sync_interval``. Two updates of one entry at once: the last
        one written wins. ``start_at`` and ``end_at`` replace those of ``anarchon`` (the entry's,
        or the one given) and keep its other settings; ``None`` removes the bound. So do
        ``catch_up`` and ``catch_up_window`` (``None``: back to the app's default).

        :raises EntryOwnedByConfig: ``beat_schedule`` defines ``name`` (change it there).
        :raises UnknownEntry: the store holds no entry ``name``.
        :raises ConfigError: nothing to change, a window that leaves out a slot instances not
            synced yet may still claim, unless the entry is paused (:func:`_check_cut`), or as
            :meth:`add`.
        """
        name = given_name(name)
        refuse_config(self.app, name, "update")
        changes = {k: v for k, v in dict(task=task, schedule=schedule, args=args, kwargs=kwargs,
                                          options=options, anarchon=anarchon).items()
                   if v is not _UNSET}
        window = _window(start_at=start_at, end_at=end_at, catch_up=catch_up,
                         catch_up_window=catch_up_window)
        if not changes and not window:
            raise ConfigError(f"entry {name!r}: nothing to change; fix: give task, schedule, args, "
                              "kwargs, options, anarchon, start_at, end_at, catch_up or "
                              "catch_up_window")
        stored = self._snapshot().entries.get(name)
        if stored is None or stored.definition is None:
            raise self._unknown(name)
        definition = _updated(name, stored.definition, changes, window)
        return self._write(name, definition, check_task, by, create=False,
                           before=None if stored.pause is not None else stored.definition)

    def remove(self, name: str, *, by: str | None = None) -> None:
        """Remove a store entry (and its pause): no instance claims its runs after its next sync;
        a run already claimed is still sent.

        A name an older version stored unnormalized (not in NFC) is found by its exact form.

        :raises EntryOwnedByConfig: ``beat_schedule`` defines ``name`` (remove it there).
        :raises UnknownEntry: the store holds no entry ``name``.
        """
        given, name = name, given_name(name)
        refuse_config(self.app, name, "remove")
        entries = self._ready()
        by = self._who(by, name)
        if limits.undecodable(name) is not None and name not in self._snapshot().entries:
            raise self._unknown(name)   # text no store encodes: only a name read from the store
        if not entries.remove_entry(name, by=by) and (
                given == name or not entries.remove_entry(given, by=by)):
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
        The newest slot it covered is recorded ``paused`` first, with its span (:func:`_mark_pause_span`).

        :raises UnknownEntry: nothing defines ``name`` and the store holds no pause of it.
        """
        name = given_name(name)
        snapshot = self._snapshot()
        stored = snapshot.entries.get(name)
        if stored is None or stored.pause is None:
            self._known(name, snapshot)
        else:
            _mark_pause_span(self, name, stored.pause, snapshot)
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
        found = (None if request_id is None
                 else run_now_request.earlier_request(self._ready(), name, request_id, given))
        if found is not None:
            return found                # the first request, whatever happened since
        snapshot = self._snapshot()
        entry = self._known(name, snapshot)
        self._ready()
        return run_now_request.request_run(self.store, self.settings, entry, snapshot,
                                           request_id, by, app=self.app)

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
            for found in listed(self.app, snapshot, only=candidate):
                return found
        raise self._unknown(name)

    def list(self) -> list[ScheduledEntry]:
        """Every entry: this app's ``beat_schedule``, the store's entries, and pauses of other
        names (``source == "unknown"``), by name."""
        return listed(self.app, self._snapshot())

    def _write(self, name: str, definition: dict, check: bool, by: Any, *,
               create: bool, before: str | None = None) -> ScheduledEntry:
        """Write a store entry's definition once it parses, builds a plan (every timing rule,
        with the start-up message) and names a registered task (``check``); an update of an
        entry that is not paused (``before``: its stored text) must not take out of its window
        a slot that instances which have not synced yet may still claim (:func:`_check_cut`)."""
        text, _ = checked_definition(self, name, definition, check_task=check, before=before)
        stored = self._ready().put_entry(name, text, by=self._who(by, name), create=create)
        return self._as_scheduled(stored)


def checked_definition(session: NamespaceSession, name: str, definition: dict, *,
                       check_task: bool = True, before: str | None = None) -> tuple[str, EntryPlan]:
    """The canonical text of ``definition`` as :meth:`Schedules.add` and :meth:`Schedules.update`
    write it, and its plan, once it parses, builds a plan (every timing rule, with the start-up
    message) and names a registered task (``check_task``). Nothing is written (an import's dry
    run, :mod:`celery_anarchon.operate.imports`, shows what the writes would refuse).

    :param session: the app's schedules (its app, settings and store).
    :param before: the stored text of the entry it updates while the entry is not paused: the
        update must not take out of its window a slot that instances not synced yet may still
        claim (:func:`_check_cut`). ``None``: an add, or an update of a paused entry.
    :raises ConfigError: the start-up message of the rule the definition breaks, naming the entry.
    """
    text = entry_json.canonical(definition, name=name)
    entry = entry_json.parse(name, text, app=session.app)
    plan = build_plan(name, entry, app=session.app, settings=session.settings,
                      store=session.store)
    if check_task:
        _check_task(session.app, name, entry.task)
    if before is not None:
        _check_cut(session.app, session.settings, session.store, plan, before)
    return text, plan


#: slots of an entry a resume walks at most, looking for the newest its pause covered
_MAX_WALK = 100_000


def _mark_pause_span(session: Schedules, name: str, pause: Pause, snapshot) -> None:
    """Before a resume, record ``paused`` at the newest slot the pause covered that has no record
    (a record that only fills a run with none), its detail naming the span the pause held
    (:func:`~celery_anarchon.stores.entry_store.pause_span_detail`): a gap check counts the slots
    of that span paused, not missed, though no beat ran to answer them (docs/missed-runs.md);
    and a catch-up (``catch_up='all'``) reaches back no further than the entry's newest decided
    run, so those slots are not caught up after the resume. At most :data:`_MAX_WALK` slots are
    walked; an entry whose plan no longer builds marks nothing."""
    try:
        plan = build_plan(name, session._known(name, snapshot), app=session.app,
                          settings=session.settings, store=session.store)
    except ConfigError:             # UnknownEntry too: a pause kept for a removed entry
        return
    now_ms = session.store.now_ms() or int(time.time() * 1000)
    recorded = {record.slot_ms for record in session.store.history.read(name)}
    newer = [slot for slot in recorded if slot >= pause.at_ms]
    # a history that holds only slots of the pause (a beat answered them): walk from its oldest,
    # as a gap check looks back no further than the newest record before it
    after = (min(newer) if len(newer) == len(recorded) and newer else pause.at_ms) - 1
    newest = None
    try:
        for _ in range(_MAX_WALK):
            slot = plan.slots.next_after(after)
            if slot > now_ms:
                break
            after = slot
            if slot not in recorded:
                newest = slot
    except (ConfigError, SlotsEnded):
        pass
    if newest is not None:
        session.store.history.record(name, newest, RunEvent.PAUSED,
                                     detail=pause_span_detail(pause, now_ms))


def _check_cut(app, settings: TimingSettings, store: ClaimStore, plan: EntryPlan,
               before: str) -> None:
    """Refuse an update whose ``start_at`` / ``end_at`` takes out a slot of the stored definition
    ``before`` that an instance still on it may claim: one due from now until every instance
    synced (2 x ``anarchon_sync_interval`` + 5 s, as a run-now request), or one it may still
    claim late (its jitter + max_late before now; for ``catch_up='all'``, its jitter +
    catch_up_window). A pause holds at once on every instance, so a paused entry's update is
    not checked: pause, update, resume.

    :raises ConfigError: naming the entry, the slot, the span and the fix.
    """
    try:
        old = build_plan(plan.name, entry_json.parse(plan.name, before, app=app), app=app,
                         settings=settings, store=store)
    except ConfigError:                 # a stored definition that no longer builds runs nowhere
        return
    now_ms = int(time.time() * 1000)
    span_s = settings.run_now_max_late_s
    cut = first_cut(old.slots, plan.slots, now_ms - old.jitter_ms - old.claim_late_ms,
                    now_ms + int(span_s * 1000))
    if cut is not None:
        raise ConfigError(
            f"entry {plan.name!r}: the new start_at / end_at leaves out its slot {iso(cut)}, which "
            f"instances that have not synced yet may still claim (each follows an update within "
            f"2 x anarchon_sync_interval + 5 s = {span_s:g} s, and claims a slot up to its "
            "jitter + max_late late); fix: give a bound that leaves out no slot before "
            f"{span_s:g} s from now, or pause the entry first (a pause holds at once on every "
            "instance), update it, then resume it")


def _window(**given: Any) -> dict:
    """The ``anarchon`` settings given as arguments of their own to :meth:`Schedules.add` or
    :meth:`Schedules.update` (``start_at``, ``end_at``, ``catch_up``, ``catch_up_window``;
    ``None`` kept in update: it removes the setting)."""
    return {k: v for k, v in given.items() if v is not _UNSET}


def _given(**bounds: Any) -> dict:
    """The ``start_at`` / ``end_at`` / ``catch_up`` / ``catch_up_window`` given to
    :meth:`Schedules.add` (``None``: not given, so the key inside ``anarchon`` stays)."""
    return {k: v for k, v in bounds.items() if v is not None}


def _definition(name: str, *, task, schedule, args, kwargs, options, anarchon,
                window: dict | None = None) -> dict:
    """The definition of the parts :meth:`Schedules.add` and :meth:`Schedules.update` take, as
    data (checked by the caller): the schedule and ``anarchon`` as data, ``options['anarchon']``
    taken as ``anarchon``, ``window`` (``start_at`` / ``end_at``: a value, or ``None`` to remove
    it) set in it.

    :raises ConfigError: a schedule given as text, or the per-entry settings given twice.
    """
    if isinstance(schedule, str):           # "every 5 minutes": no schedule we can read
        raise text_schedule_error(name, schedule)
    options = dict(options or {}) if isinstance(options, dict) or options is None else options
    if isinstance(options, dict) and "anarchon" in options:
        if anarchon:
            raise ConfigError(f"entry {name!r}: the per-entry settings are given twice "
                              "(options['anarchon'] and anarchon=); fix: give anarchon= only")
        anarchon = options.pop("anarchon")
    if window and (anarchon is None or isinstance(anarchon, dict)):
        anarchon = dict(anarchon or {})
        for key, value in window.items():
            if value is None:
                anarchon.pop(key, None)
            else:
                anarchon[key] = value
    out = {"task": task, "schedule": as_data.schedule_json(schedule),
           "args": list(args) if isinstance(args, tuple) else ([] if args is None else args),
           "kwargs": {} if kwargs is None else kwargs, "options": options}
    if anarchon:
        out["anarchon"] = as_data.anarchon_json(anarchon) if isinstance(anarchon, dict) \
            else anarchon
    return out


def _updated(name: str, stored_text: str, changes: dict, window: dict | None = None) -> dict:
    """The definition of a store entry (``stored_text``) with the parts ``changes`` gives, as
    :meth:`Schedules.update` writes it: a crontab or cron schedule without a zone of its own keeps
    the entry's (:func:`~celery_anarchon.schedule.as_data.keep_zone`).

    :raises ConfigError: the stored definition cannot be read back as an object, or as
        :func:`_definition`.
    """
    current = stored_data(name, stored_text, strict=True)
    merged = {k: current.get(k) for k in ("task", "schedule", "args", "kwargs", "options",
                                          "anarchon") if k in current}
    if "schedule" in changes:
        given = as_data.schedule_json(changes["schedule"])
        zoned = as_data.keep_zone(given, current.get("schedule"))
        if zoned is not given:          # anything else is checked as given, with its message
            changes = {**changes, "schedule": zoned}
    merged.update(changes)
    return _definition(name, window=window, **{k: merged.get(k) for k in (
        "task", "schedule", "args", "kwargs", "options", "anarchon")})


def schedules(app, *, store: ClaimStore | None = None, by: str | None = None) -> Schedules:
    """The runtime schedule of ``app``'s namespace (also ``celery_anarchon.schedules(app)``).

    :raises ConfigError: the store cannot hold entries (RabbitMQ, NATS): the message names the
        stores that can.
    """
    return Schedules(app, store=store, by=by)
