"""One entry's row of the status data (:func:`~celery_anarchon.operate.overview.overview`): its
schedule and zone in words, its next slots, the start-up rule it breaks, its runs, pause and
lease, and its state.

What an entry's definition gives whatever the time (its plan, or the rule it breaks) is built
once per definition and store object (:func:`planned`), so a page reading the status every few
seconds does not check the start-up rules again.
"""
from __future__ import annotations

import datetime
import json
import weakref
import zoneinfo
from collections.abc import Mapping

from celery_anarchon._util import iso
from celery_anarchon.errors import ConfigError, StoreError
from celery_anarchon.operate import overdue
from celery_anarchon.operate.listing import ScheduledEntry, celery_entry_in
from celery_anarchon.operate.overview_instances import maybe_iso
from celery_anarchon.schedule import as_data
from celery_anarchon.schedule.plan import EntryPlan, build_plan
from celery_anarchon.schedule.slots import CronSlots, SlotsEnded, WindowedSlots, inner_of
from celery_anarchon.schedule.slots.window import window_json
from celery_anarchon.schedule.zones import zone_name
from celery_anarchon.settings import Settings
from celery_anarchon.stores.base import ClaimStore, HistoryRecord, RunEvent, memory_began_ms

#: per store object: (app, settings, {definition key: _Planned}); see :func:`planned_of`
_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: an entry's ``state`` when the store cannot be read (its pause and lease are not known)
UNKNOWN_STATE = "unknown"
#: history events of a run that may hold a lease (its record is read with store.leases.inspect)
_LEASE_EVENTS = (RunEvent.CLAIMED, RunEvent.SENT, RunEvent.STARTED, RunEvent.TAKEN_OVER)


def run_json(rec: HistoryRecord) -> dict:
    """One history record as data: ``{slot, event, at, instance, attempt, task_id, detail,
    earlier}``; ``earlier``: the records of the run's earlier attempts it keeps (a run taken
    over: the dead attempt's last record, then ``taken_over``), oldest first, each with the same
    keys but ``earlier``."""
    out = _record_json(rec)
    out["earlier"] = [_record_json(e) for e in rec.earlier]
    return out


def mark_new_store(runs: list[dict], shown: list[HistoryRecord],
                   history: list[HistoryRecord]) -> None:
    """Set ``new_store: True`` on each run of ``runs`` (the data of ``shown``) that is a new
    store's first refusal (docs/design.md "Amnesia"), which needs no attention: a ``forgotten``
    record whose detail names only the store's memory start
    (:func:`~celery_anarchon.stores.records.memory_began_ms`: no epoch change), of an entry with
    no other record (of ``history``) older than that start: had a run been recorded before it,
    the store lost its data."""
    for run, rec in zip(runs, shown):
        began = memory_began_ms(rec.detail) if rec.event is RunEvent.FORGOTTEN else None
        if began is not None and not any(
                h.slot_ms < began and h.event is not RunEvent.FORGOTTEN for h in history):
            run["new_store"] = True


def _record_json(rec: HistoryRecord) -> dict:
    return {"slot": iso(rec.slot_ms), "event": rec.event.value,
            "at": maybe_iso(rec.store_ms or None),
            "instance": rec.instance, "attempt": rec.attempt, "task_id": rec.task_id,
            "detail": rec.detail}



def zone_of(plan: EntryPlan, app) -> datetime.tzinfo:
    """The zone an entry's slots are read in: its crontab's or cron's, else the app's."""
    own = inner_of(plan.slots)
    if isinstance(own, CronSlots):
        return own.zone
    tz = app.timezone
    return zoneinfo.ZoneInfo(tz) if isinstance(tz, str) else tz


def _lease(store: ClaimStore, plan: EntryPlan | None, runs: list[HistoryRecord]) -> dict | None:
    """The lease record of the entry's newest run that may hold one (leased entries only)."""
    if plan is None or plan.timing.lease is None or store.leases is None:
        return None
    for rec in runs:
        if rec.event in _LEASE_EVENTS:
            leased = store.leases.inspect(rec.entry, rec.slot_ms)
            if leased is None:
                return None
            return {"slot": iso(leased.slot_ms), "state": leased.state.value,
                    "attempt": leased.attempt, "holder": leased.owner, "token": leased.token,
                    "expires": maybe_iso(leased.lease_expires_ms),
                    "queue_deadline": maybe_iso(leased.queue_deadline_ms),
                    "expired": leased.expired}
    return None


class _Planned:
    """What an entry's definition gives, whatever the time: its plan (or the rule it breaks),
    zone and schedule in words, and its next slots while they stand. Nothing an entry's
    definition holds makes it raise: any failure is the entry's ``problem`` (one broken entry is
    a problem row; the others are shown)."""

    __slots__ = ("plan", "problem", "timezone", "schedule", "next_from", "next")

    def __init__(self, app, settings: Settings, store: ClaimStore, scheduled: ScheduledEntry,
                 config: Mapping, stored_text: str | None) -> None:
        definition = scheduled.definition or {}
        self.plan, self.problem, self.timezone = None, None, None
        self.schedule = (as_data.describe_schedule(definition["schedule"])
                         if "schedule" in definition else None)
        self.next_from, self.next = None, []
        try:
            celery_entry = celery_entry_in(app, scheduled.name, config, stored_text)
            if celery_entry is not None:
                self.plan = build_plan(scheduled.name, celery_entry, app=app, settings=settings,
                                       store=store)
            if self.plan is not None:
                self.timezone = zone_name(zone_of(self.plan, app))
                if "schedule" in definition:   # a crontab in the app's zone: name the zone
                    self.schedule = as_data.describe_schedule(definition["schedule"],
                                                                 default_zone=self.timezone)
        except StoreError:
            raise
        except Exception as exc:   # ConfigError, or what a schedule class of the user's raised
            self.plan, self.problem = None, _problem(scheduled.name, exc)

    def next_slots(self, now_ms: int, count: int) -> list[str]:
        """The ``count`` slots after ``now_ms`` (ISO), computed again only once the first of
        those computed before has come or ``now_ms`` went back."""
        if self.plan is None:
            return []
        standing = (self.next_from is not None and len(self.next) == count
                    and self.next_from <= now_ms and (not self.next or now_ms < self.next[0][0]))
        if not standing:
            slot, slots = now_ms, []
            try:
                for _ in range(count):
                    slot = self.plan.slots.next_after(slot)
                    slots.append((slot, iso(slot)))
            except SlotsEnded:         # the entry's end_at: the slots before it
                pass
            except Exception as exc:   # a slot past the year 9999, a schedule class's error
                self.problem = _problem(self.plan.name, exc)
                self.plan = None
                return []
            self.next_from, self.next = now_ms, slots
        return [text for _, text in self.next]


def _problem(name: str, exc: Exception) -> str:
    """An entry's problem from what building or reading its plan raised: a ConfigError's
    message, else the exception named with the entry."""
    if isinstance(exc, ConfigError):
        return str(exc)
    return f"entry {name!r}: {type(exc).__name__}: {exc}"


def _definition_key(scheduled: ScheduledEntry, stored_text: str | None) -> tuple:
    """What an entry's :class:`_Planned` depends on besides the app, settings and store."""
    return (scheduled.name, scheduled.source, stored_text,
            json.dumps(scheduled.definition, sort_keys=True, default=repr))


def plan_cache(app, settings: Settings, store: ClaimStore) -> dict:
    """The store object's ``{definition key: _Planned}`` for ``app`` and ``settings`` (a new one
    for another app or other settings)."""
    app_, settings_, cache = _PLANS.get(store, (None, None, None))
    if app_ is not app or settings_ != settings:
        cache = {}
        _PLANS[store] = (app, settings, cache)
    return cache


def planned_of(cache: dict, used: set, app, settings: Settings, store: ClaimStore,
             scheduled: ScheduledEntry, config: Mapping, stored_text: str | None) -> _Planned:
    """The entry's :class:`_Planned` from ``cache``, built (start-up rules checked) once per
    definition, so a page reading every few seconds does not check them again; its key is
    added to ``used``."""
    key = _definition_key(scheduled, stored_text)
    used.add(key)
    found = cache.get(key)
    if found is None:
        found = cache[key] = _Planned(app, settings, store, scheduled, config, stored_text)
    return found


def next_slot_of(app, settings: Settings, store: ClaimStore, scheduled: ScheduledEntry,
                 config: Mapping, stored_text: str | None, now_ms: int,
                 ) -> tuple[str | None, datetime.tzinfo | None]:
    """The entry's next slot after ``now_ms`` (UTC ms) as ISO 8601 UTC and the zone its slots
    are read in (:func:`zone_of`), as :func:`entry_row` gives ``next`` and ``timezone``
    (``list``); ``(None, None)`` for an entry that breaks a rule or has no definition here, and
    no slot once its ``end_at`` came.

    :param config: :func:`~celery_anarchon.operate.config.config_items` of ``app``.
    :param stored_text: the store's definition text of the entry (``None``: none).
    :raises StoreError: the store failed while the plan was built.
    """
    planned = planned_of(plan_cache(app, settings, store), set(), app, settings, store,
                         scheduled, config, stored_text)
    slots = planned.next_slots(now_ms, 1)
    zone = None if planned.plan is None else zone_of(planned.plan, app)
    return (slots[0] if slots else None), zone


def kept_of(lost: list[dict] | None, name: str) -> list[dict]:
    """What live instances keep of entry ``name`` from before the store's loss."""
    out = []
    for item in lost or ():
        if name in item["pauses"]:
            out.append({"instance": item["instance"], "what": "pause",
                        "detail": item["pauses"][name]})
        if name in item["entries"]:
            out.append({"instance": item["instance"], "what": "entry", "detail": ""})
        if name in item["withheld"]:
            out.append({"instance": item["instance"], "what": "withheld", "detail": ""})
    return out


def entry_row(app, settings: Settings, store: ClaimStore, scheduled: ScheduledEntry,
              config: Mapping,
           stored_text: str | None, *, history: list[HistoryRecord], next_count: int, now_ms: int,
           reachable: bool, requests: list[dict], cache: dict, used: set,
           kept: list[dict], runs: int | None = None, read_limit: int = 0,
           unsent: bool | None = None) -> dict:
    """One entry's row of :func:`~celery_anarchon.operate.overview.overview` (its docstring
    names the keys).

    :param history: the entry's runs as read, newest first (``read_limit`` at most); the row
        shows the first ``runs`` of them (default: all).
    :param read_limit: how many runs were read at most: when every one is newer than the
        entry's newest due slot, its history is read again in full (``History.read``) to
        find that slot's record (:mod:`~celery_anarchon.operate.overdue`). 0: no runs read, no
        ``due``.
    :param unsent: no live beat instance sends anything (``None``: not known).
    :raises StoreError: the store failed while a lease or the full history was read.
    """
    planned = planned_of(cache, used, app, settings, store, scheduled, config, stored_text)
    definition = scheduled.definition or {}
    out = {"name": scheduled.name, "source": scheduled.source, "task": definition.get("task"),
           "schedule": planned.schedule, "timezone": planned.timezone,
           "next": planned.next_slots(now_ms, next_count), "problem": planned.problem,
           "leased": planned.plan is not None and planned.plan.timing.lease is not None,
           "shadowed": scheduled.shadowed, "paused": None, "last": None, "runs": [],
           "lease": None, "state": UNKNOWN_STATE,
           "run_now": (None if requests is None
                       else [r for r in requests if r["entry"] == scheduled.name]),
           "kept": kept, "due": None, "unsent": unsent if reachable else None}
    if reachable and scheduled.pause is not None:
        p = scheduled.pause
        out["paused"] = {"by": p.by, "reason": p.reason, "since": iso(p.at_ms)}
    out.update(window_json(planned.plan.slots) if planned.plan is not None
               else {"start_at": None, "end_at": None})
    if reachable:
        shown = history if runs is None else history[:runs]
        out["runs"] = [run_json(r) for r in shown]
        mark_new_store(out["runs"], shown, history)
        out["last"] = out["runs"][0] if shown else None
        out["lease"] = _lease(store, planned.plan, shown)
        out["state"] = ("paused" if out["paused"] else
                        "kept" if any(k["what"] == "pause" for k in kept) else
                        "problem" if out["problem"] else _window_state(planned.plan, now_ms))
        if out["state"] in ("running", "ended") and planned.plan is not None and read_limit:
            out["due"] = _due(store, planned.plan, scheduled, history, now_ms, read_limit)
            if out["due"] is not None and out["due"]["state"] == overdue.OVERDUE:
                out["state"] = overdue.OVERDUE
    return out


def _due(store: ClaimStore, plan: EntryPlan, scheduled: ScheduledEntry,
         history: list[HistoryRecord], now_ms: int, read_limit: int) -> dict | None:
    """The entry's newest due slot as :func:`overdue.judge` tells it; the entry's history read
    again in full when the runs read do not reach that slot."""
    memory = store.memory
    slot = overdue.due_slot(plan, now_ms, floor_ms=None if memory.duration_s is None
                            else now_ms - int(memory.duration_s * 1000))
    complete = True
    kept = getattr(store, "history_size", None) or 10 ** 9   # runs the store keeps per entry
    if slot is not None and overdue.needs_more(history, min(read_limit, kept), slot):
        history = store.history.read(scheduled.name)
        complete = not overdue.needs_more(history, kept, slot)
    changed = scheduled.updated_ms if scheduled.source == "store" else None
    return overdue.judge(plan, history, now_ms, memory, complete=complete, changed_ms=changed)


def _window_state(plan: EntryPlan | None, now_ms: int) -> str:
    """``"ended"`` (no slot after ``now_ms``: its end_at came), ``"waiting"`` (its start_at is
    to come), else ``"running"``."""
    slots = None if plan is None else plan.slots
    if not isinstance(slots, WindowedSlots):
        return "running"
    if slots.ended(now_ms):
        return "ended"
    start = slots.window.start_ms
    return "waiting" if start is not None and now_ms < start else "running"

