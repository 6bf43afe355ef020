"""The status of one namespace as plain data: what ``celery anarchon status --json`` prints and
what the status page shows.

:func:`overview` reads the store once per part (clock, instances, entries and pauses, every
entry's history in a few round trips with ``history_many``, leases) and returns JSON-able values only (str, int, float, bool, None, lists, dicts): no click,
no Celery objects, no password (the store's URL is :attr:`~ClaimStore.safe_url`). A store that
cannot be reached gives ``store.reachable = False`` and the parts it could not read empty, never
an exception: a status view must show an outage, not fail on it; what only the store knows
(pauses, leases, instances, run-now requests) is then ``None`` and each entry's ``state`` is
``"unknown"``, never "running".
"""
from __future__ import annotations

import json
import time
import weakref
from collections.abc import Callable, Mapping

from celery_anarchon import limits
from celery_anarchon.schedule import as_data
from celery_anarchon.schedule import definition as entry_json
from celery_anarchon.schedule.zones import zone_name
from celery_anarchon._util import iso
from celery_anarchon.errors import ConfigError, StoreError
from celery_anarchon.schedule.plan import EntryPlan, build_plan, clash_fix, config_entry
from celery_anarchon.operate.config import config_data, config_items
from celery_anarchon.operate.listing import CONFIG, STORE, ScheduledEntry
from celery_anarchon.operate.schedules import Schedules
from celery_anarchon.schedule.slots import CronSlots
from celery_anarchon.stores.base import ClaimStore, HistoryRecord, LeaseStore, RunEvent
from celery_anarchon.stores.entry_store import EntryStore, InstanceRecord, InstanceStore
from celery_anarchon.schedule.timing import Settings

#: an instance whose last tick is older than this many sync intervals (store clock) is stale
STALE_INTERVALS = 2
#: per store object: the warnings of its prepare() (run once: a page reading the overview every
#: few seconds does not repeat the start-up checks) and its Schedules
_PREPARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_SCHEDULES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: per store object: (app, settings, {definition key: _Planned}); see :func:`_planned`
_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: an entry's ``state`` when the store cannot be read (its pause and lease are not known)
UNKNOWN_STATE = "unknown"
#: history events of a run that may hold a lease (its record is read with LeaseStore.inspect)
_LEASE_EVENTS = (RunEvent.CLAIMED, RunEvent.SENT, RunEvent.STARTED, RunEvent.TAKEN_OVER)


def _iso(ms: int | None) -> str | None:
    return None if ms is None else iso(ms)


def run_json(rec: HistoryRecord) -> dict:
    """One history record as data: ``{slot, event, at, instance, attempt, task_id, detail,
    earlier}``; ``earlier``: the records of the run's earlier attempts it keeps (a run taken
    over: the dead attempt's last record, then ``taken_over``), oldest first, each with the same
    keys but ``earlier``."""
    out = _record_json(rec)
    out["earlier"] = [_record_json(e) for e in rec.earlier]
    return out


def _record_json(rec: HistoryRecord) -> dict:
    return {"slot": iso(rec.slot_ms), "event": rec.event.value, "at": _iso(rec.store_ms or None),
            "instance": rec.instance, "attempt": rec.attempt, "task_id": rec.task_id,
            "detail": rec.detail}


def _store_part(store: ClaimStore, now_ms: int | None) -> dict:
    """``store`` of :func:`overview` (reachable and clock filled in by the caller)."""
    durability = getattr(store, "durability", None)
    return {"url": store.safe_url, "kind": store.kind, "namespace": store.namespace,
            "durability": durability if isinstance(durability, str) else None,
            "memory_s": store.memory.duration_s, "memory_count": store.memory.count,
            "checks_lateness": store.checks_lateness, "leases": isinstance(store, LeaseStore),
            "entries": isinstance(store, EntryStore),
            "reachable": False, "error": None, "warnings": [], "clock": None, "skew_ms": None}


def _instance(r: InstanceRecord, store_now_ms: int | None, sync_interval_s: float) -> dict:
    """One instance record with ``ticking`` / ``stale``: its last tick, moved onto the store's
    clock with its skew, older than :data:`STALE_INTERVALS` sync intervals."""
    last_on_store = r.last_tick_ms - (r.skew_ms or 0)
    age_ms = None if store_now_ms is None else max(0, store_now_ms - last_on_store)
    stale = age_ms is not None and age_ms > STALE_INTERVALS * sync_interval_s * 1000
    return {"instance_id": r.instance_id, "host": r.host, "pid": r.pid, "version": r.version,
            "started": iso(r.started_ms), "last_tick": iso(r.last_tick_ms),
            "last_tick_age_s": None if age_ms is None else round(age_ms / 1000, 3),
            "skew_ms": r.skew_ms, "entries": r.entries, "fingerprints_digest": r.fingerprints_digest,
            "seen": _iso(r.seen_ms or None), "expires": _iso(r.expires_ms or None),
            "ticking": not stale, "stale": stale, "kept": r.kept}


#: what an operator does about a loss the instances keep from (status, the page)
LOST_FIX = ("write each kept pause and store entry again (celery anarchon pause NAME --reason "
            "...; celery anarchon add NAME ..., the beat's log gives each store entry's "
            "definition), or accept the loss: celery anarchon accept-loss (every instance then "
            "follows the store as it is)")


def _lost(records: list[InstanceRecord]) -> list[dict]:
    """What live instances keep from before the store lost entries data (docs/design.md
    "Amnesia"), one item per instance that keeps something."""
    out = []
    for r in records:
        k = r.kept or {}
        if not k:
            continue
        out.append({"instance": _who(r), "instance_id": r.instance_id,
                    "since": _iso(k.get("since")), "why": k.get("why", ""),
                    "pauses": dict(k.get("pauses") or {}), "entries": list(k.get("entries") or []),
                    "withheld": list(k.get("withheld") or []), "counts": dict(k.get("counts") or {}),
                    "requests": k.get("requests", 0)})
    return out


def lost_lines(data: dict) -> list[str]:
    """The ``lost`` part of the status data as text lines (``status``), empty when nothing is
    kept."""
    lines = []
    for item in data.get("lost") or ():
        lines.append(f"  {item['instance']} since {item['since']}: {item['why']}")
        for name, pause in item["pauses"].items():
            lines.append(f"    pause kept (no run claimed there): {name} ({pause})")
        if item["entries"]:
            lines.append(f"    store entries kept running: {', '.join(item['entries'])}")
        if item["withheld"]:
            lines.append("    store entries removed before the loss, brought back by the store, "
                         f"not run there: {', '.join(item['withheld'])}")
        if item["requests"]:
            lines.append(f"    {item['requests']} run-now run(s) handled there, never claimed again")
    if lines:
        lines.insert(0, "ERROR: the store lost entries data; these instances keep what they knew:")
        lines.append(f"  fix: {LOST_FIX}")
    return lines


def _who(r: InstanceRecord) -> str:
    return f"{r.host}:{r.pid}"


#: where a live instance takes an entry's definition from (``disagreements[].definitions[].source``)
SOURCE_CONFIG, SOURCE_STORE = CONFIG, STORE


def _fingerprint_views(store, records: list[InstanceRecord], stored: Mapping[str, str],
                       store_definition: Callable[[str], tuple[str | None, str]]
                       ) -> tuple[list[dict], list[dict], list[str]]:
    """The config entries only some instances run, the entries whose fingerprints differ
    between instances, and the instances whose fingerprints are not saved yet.

    An instance whose beat_schedule lacks a name that is a store entry (``stored``: name ->
    definition text) runs the store's (:meth:`EntrySync.merge`): it is not "not running" the
    entry, and when others run a beat_schedule entry of that name, the entry is a disagreement
    whose definitions say where each comes from (``store_definition``: a store entry's
    fingerprint and definition as beat builds them)."""
    mappings: dict[str, dict[str, str] | None] = {}
    for r in records:
        if r.fingerprints_digest not in mappings:
            mappings[r.fingerprints_digest] = store.load_fingerprints(r.fingerprints_digest)
    known = [(r, m) for r in records if (m := mappings[r.fingerprints_digest]) is not None]
    unsaved = [_who(r) for r in records if mappings[r.fingerprints_digest] is None]
    names = sorted({n for _, m in known for n in m})
    partial = []
    disagreements = []
    for name in names:
        without = [_who(r) for r, m in known if name not in m]
        if without and name not in stored:
            partial.append({"entry": name, "run_by": [_who(r) for r, m in known if name in m],
                            "not_run_by": without})
        groups: dict[tuple[str, str | None], list[str]] = {}
        for r, m in known:
            if name in m:
                groups.setdefault((SOURCE_CONFIG, m[name]), []).append(_who(r))
        store_text: dict[tuple[str, str | None], str] = {}
        if without and name in stored:     # they run the store entry of that name
            fingerprint, store_text[(SOURCE_STORE, fingerprint)] = store_definition(name)
            groups[(SOURCE_STORE, fingerprint)] = without
        if len(groups) > 1:
            disagreements.append({"entry": name, "definitions": [
                {"fingerprint": fp, "source": source, "instances": hosts,
                 "definition": (store_text[(source, fp)] if source == SOURCE_STORE
                                else store.load_definition(name, fp))}
                for (source, fp), hosts in sorted(groups.items(), key=lambda g: (g[0][0],
                                                                                g[0][1] or ""))],
                "fix": clash_fix(name) if store_text else None})
    return partial, disagreements, unsaved


def _store_definition(app, settings: Settings, store: ClaimStore, name: str,
                      text: str) -> tuple[str | None, str]:
    """A store entry's fingerprint and definition as a beat builds them; ``None`` and its JSON
    text with the rule it breaks when beat refuses it."""
    try:
        plan = build_plan(name, entry_json.parse(name, text, app=app), app=app,
                          settings=settings, store=store)
    except ConfigError as exc:
        return None, f"{text} (beat refuses it: {exc})"
    return plan.fingerprint, plan.definition


def _config_items(app) -> dict:
    """The config entries, Celery's own included (for stores that hold no entries too)."""
    return config_items(app)


def _celery_entry(app, scheduled: ScheduledEntry, config: Mapping, stored_text: str | None):
    """The Celery ``ScheduleEntry`` of one listed entry, or ``None`` (a pause of a name neither
    ``beat_schedule`` nor the store defines).

    :raises ConfigError: Celery cannot build it, or its definition is invalid."""
    if scheduled.source == CONFIG and scheduled.name in config:
        return config_entry(scheduled.name, config[scheduled.name], app=app)
    if scheduled.source == STORE and stored_text is not None:
        return entry_json.parse(scheduled.name, stored_text, app=app)
    if scheduled.source == CONFIG and as_data.is_storable(scheduled.definition or {}):
        return entry_json.parse(scheduled.name, scheduled.definition, app=app)  # Celery's own
    return None


def _timezone(plan: EntryPlan, app) -> str:
    if isinstance(plan.slots, CronSlots):
        return zone_name(plan.slots.zone)
    return zone_name(app.timezone)


def _lease(store: ClaimStore, plan: EntryPlan | None, runs: list[HistoryRecord]) -> dict | None:
    """The lease record of the entry's newest run that may hold one (leased entries only)."""
    if plan is None or plan.timing.lease is None or not isinstance(store, LeaseStore):
        return None
    for rec in runs:
        if rec.event in _LEASE_EVENTS:
            leased = store.inspect(rec.entry, rec.slot_ms)
            if leased is None:
                return None
            return {"slot": iso(leased.slot_ms), "state": leased.state.value,
                    "attempt": leased.attempt, "holder": leased.owner, "token": leased.token,
                    "expires": _iso(leased.lease_expires_ms),
                    "queue_deadline": _iso(leased.queue_deadline_ms), "expired": leased.expired}
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
            celery_entry = _celery_entry(app, scheduled, config, stored_text)
            if celery_entry is not None:
                self.plan = build_plan(scheduled.name, celery_entry, app=app, settings=settings,
                                       store=store)
            if self.plan is not None:
                self.timezone = _timezone(self.plan, app)
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


def _plan_cache(app, settings: Settings, store: ClaimStore) -> dict:
    """The store object's ``{definition key: _Planned}`` for ``app`` and ``settings`` (a new one
    for another app or other settings)."""
    app_, settings_, cache = _PLANS.get(store, (None, None, None))
    if app_ is not app or settings_ != settings:
        cache = {}
        _PLANS[store] = (app, settings, cache)
    return cache


def _planned(cache: dict, used: set, app, settings: Settings, store: ClaimStore,
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


def _kept_of(lost: list[dict] | None, name: str) -> list[dict]:
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


def _entry(app, settings: Settings, store: ClaimStore, scheduled: ScheduledEntry, config: Mapping,
           stored_text: str | None, *, history: list[HistoryRecord], next_count: int, now_ms: int,
           reachable: bool, requests: list[dict], cache: dict, used: set,
           kept: list[dict]) -> dict:
    planned = _planned(cache, used, app, settings, store, scheduled, config, stored_text)
    definition = scheduled.definition or {}
    out = {"name": scheduled.name, "source": scheduled.source, "task": definition.get("task"),
           "schedule": planned.schedule, "timezone": planned.timezone,
           "next": planned.next_slots(now_ms, next_count), "problem": planned.problem,
           "leased": planned.plan is not None and planned.plan.timing.lease is not None,
           "shadowed": scheduled.shadowed, "paused": None, "last": None, "runs": [],
           "lease": None, "state": UNKNOWN_STATE,
           "run_now": (None if requests is None
                       else [r for r in requests if r["entry"] == scheduled.name]),
           "kept": kept}
    if reachable and scheduled.pause is not None:
        p = scheduled.pause
        out["paused"] = {"by": p.by, "reason": p.reason, "since": iso(p.at_ms)}
    if reachable:
        out["runs"] = [run_json(r) for r in history]
        out["last"] = out["runs"][0] if history else None
        out["lease"] = _lease(store, planned.plan, history)
        out["state"] = ("paused" if out["paused"] else
                        "kept" if any(k["what"] == "pause" for k in kept) else
                        "problem" if out["problem"] else "running")
    return out


def _listed(app, store: ClaimStore) -> tuple[list[ScheduledEntry], dict[str, str], list[dict]]:
    """Every entry (``Schedules.list``), the store entries' definition texts and the run-now
    requests; on a store without entries, the ``beat_schedule`` entries only."""
    if not isinstance(store, EntryStore):
        return _config_listed(app), {}, []
    schedules = _SCHEDULES.get(store)
    if schedules is None or schedules.app is not app:
        schedules = _SCHEDULES[store] = Schedules(app, store=store)   # never closes the store
    listed = schedules.list()
    snapshot = store.load_entries()
    texts = {n: e.definition for n, e in snapshot.entries.items() if e.definition is not None}
    requests = [{"entry": r.entry, "request_id": r.request_id, "slot": iso(r.slot_ms),
                 "by": r.by, "requested": iso(r.requested_ms)} for r in snapshot.requests]
    return listed, texts, requests


def overview(app, store: ClaimStore, settings: Settings | None = None, *, runs: int = 20,
             next_count: int = 3, now_ms: int | None = None) -> dict:
    """The status of ``app``'s namespace in ``store``, as JSON-able data.

    :param app: the Celery app (``beat_schedule``, ``timezone``, the ``anarchon_*`` settings).
    :param store: its store (:func:`celery_anarchon.settings.open_app_store`); not closed here.
    :param settings: the app's settings (default ``Settings.from_app(app)``).
    :param runs: how many of each entry's newest runs to read (``runs`` below), 0 for none.
    :param next_count: how many next slots per entry.
    :param now_ms: "now" for the next slots, UTC ms (default: the store's clock, else this
        host's).
    :raises ConfigError: a bad ``anarchon_*`` setting (every other problem is in the data).

    The keys (times are ISO 8601 UTC strings, ``...+00:00``, or ``None``):

    * ``namespace``: the namespace; ``generated``: the "now" used (store clock when known).
    * ``store``: ``url`` (password masked), ``kind``, ``namespace``, ``durability`` (the store's
      option, e.g. Redis/PostgreSQL ``"auto"``; ``None`` when the store has none),
      ``memory_s`` / ``memory_count`` (how long / how many runs it remembers; ``None``: no limit),
      ``checks_lateness``, ``leases``, ``entries`` (capabilities), ``reachable`` (bool),
      ``error`` (why not, or ``None``), ``warnings`` (what the setup can lose, from the store's
      start-up checks), ``clock`` (the store's clock, ``None`` without one), ``skew_ms`` (this
      host's clock minus the store's, ms).
    * ``instances``: the live beat instances, each with the instance record's fields
      (``instance_id``, ``host``, ``pid``, ``version``, ``started``, ``last_tick``, ``skew_ms``,
      ``entries``, ``fingerprints_digest``, ``seen``, ``expires``), ``last_tick_age_s`` (on the
      store's clock, corrected by the instance's skew) and ``ticking`` / ``stale``
      (``stale``: the last tick is older than 2 sync intervals). Empty on a store without
      instance records (``instance_records`` is then ``False``); ``None`` (unknown) when the
      store cannot be read, as ``run_now``, ``partial``, ``disagreements`` and ``unsaved``.
    * ``instance_records``: whether the store keeps instance records.
    * ``entries``: every entry by name, config (``beat_schedule``) and store, and pauses of
      names neither defines (``source == "unknown"``), each with ``name``, ``source``
      (``"config"``, ``"store"``, ``"unknown"``), ``task``, ``schedule`` (in words: ``every
      60 s``, ``crontab 0 3 * * * Europe/Paris``), ``timezone`` (a crontab's or cron's zone; the
      app's for the others), ``next`` (the next ``next_count`` slots), ``problem`` (the start-up
      rule it breaks, or ``None``), ``leased``, ``shadowed`` (a store entry under a
      beat_schedule name: ignored), ``paused`` (``None`` or ``{by, reason, since}``), ``runs``
      (newest first: ``{slot, event, at, instance, attempt, task_id, detail, earlier}``;
      ``event`` is a :class:`~celery_anarchon.stores.base.RunEvent` value such as ``sent``,
      ``late``, ``paused``; ``at`` when it was recorded; ``earlier``: a run taken over keeps the
      records of its earlier attempts, oldest first, see :func:`run_json`), ``last`` (``runs[0]`` or ``None``), ``lease``
      (leased entries: the newest run's lease ``{slot, state, attempt, holder, token, expires,
      queue_deadline, expired}`` or ``None``), ``run_now`` (its pending requests, as below),
      ``kept`` (what live instances keep of it from before the store lost entries data, as in
      ``lost``: ``{instance, what: "pause" | "entry" | "withheld", detail}``), ``state``
      (``"running"``, ``"paused"``, ``"kept"`` (the store holds no pause, but a live instance
      keeps one from before the store's loss: it claims no run of it), ``"problem"``, or
      ``"unknown"`` when the store cannot be read: ``paused``, ``lease`` and ``run_now`` are then
      ``None``, not known).
    * ``lost``: what live instances keep from before the store lost entries data (docs/design.md
      "Amnesia"), one item per such instance: ``{instance (host:pid), instance_id, since, why,
      pauses {name: detail}, entries [names kept running], withheld [names not run], counts,
      requests}``; ``[]`` when none keeps anything, ``None`` when the store cannot be read. What
      to do: :data:`LOST_FIX`.
    * ``run_now``: the run-now requests the store remembers: ``{entry, request_id, slot, by,
      requested}``.
    * ``partial``: config entries only some instances run: ``{entry, run_by, not_run_by}``
      (``host:pid`` lists); an instance whose beat_schedule lacks a store entry's name runs the
      store's, and is not listed here.
    * ``disagreements``: entries whose definition differs between live instances, or that some
      run from their beat_schedule and others from the store (a store entry's name in some
      instances' beat_schedule: there it wins, the others run the store's, so both schedules are
      sent): ``{entry, definitions: [{fingerprint, source, instances, definition}]}`` (``source``:
      ``"config"``, the instances' beat_schedule, or ``"store"``, the store entry; a store entry
      that breaks a rule has the fingerprint ``None``), ``fix`` (what to do when the sources
      differ, else ``None``).
    * ``unsaved``: instances (``host:pid``) whose entries are not saved yet.
    """
    settings = settings or Settings.from_app(app)
    out = {"namespace": store.namespace, "generated": None, "store": _store_part(store, None),
           "instance_records": isinstance(store, InstanceStore), "instances": [],
           "entries": [], "run_now": [], "partial": [], "disagreements": [], "unsaved": [],
           "lost": []}
    part = out["store"]
    store_now = None
    try:
        before = time.time()
        store_now = store.now_ms()
        after = time.time()
        if store not in _PREPARED:
            _PREPARED[store] = list(store.prepare(()))
        part["warnings"] = list(_PREPARED[store])
        part["reachable"] = True
        if store_now is not None:
            part["clock"] = iso(store_now)
            part["skew_ms"] = round((before + after) * 500 - store_now)
    except (StoreError, ConfigError) as exc:
        part["error"] = str(exc)
    reachable = part["reachable"]
    if now_ms is None:
        now_ms = store_now if store_now is not None else int(time.time() * 1000)
    out["generated"] = iso(now_ms)
    listed, texts, requests = _listed_safely(app, store, reachable, part)
    reachable = part["reachable"]
    out["run_now"] = requests
    if reachable and isinstance(store, InstanceStore):
        try:
            records = store.instances()
            out["instances"] = [_instance(r, store_now, settings.sync_interval_s) for r in records]
            out["lost"] = _lost(records)
            out["partial"], out["disagreements"], out["unsaved"] = _fingerprint_views(
                store, records, texts,
                lambda name: _store_definition(app, settings, store, name, texts[name]))
        except StoreError as exc:
            part["reachable"], part["error"], reachable = False, str(exc), False
    config = _config_items(app)
    histories: dict[str, list[HistoryRecord]] = {}
    if reachable and runs:
        try:   # every entry's runs in a few round trips (ClaimStore.history_many)
            # a name no store can encode (a lone surrogate) has no runs: beat refuses it
            histories = store.history_many([e.name for e in listed
                                            if limits.undecodable(e.name) is None], limit=runs)
        except StoreError as exc:
            part["reachable"], part["error"], reachable = False, str(exc), False
    cache, used = _plan_cache(app, settings, store), set()
    for scheduled in listed:
        history = histories.get(scheduled.name, [])
        try:
            out["entries"].append(_entry(
                app, settings, store, scheduled, config, texts.get(scheduled.name),
                history=history, next_count=next_count, now_ms=now_ms, reachable=reachable,
                requests=requests, cache=cache, used=used,
                kept=_kept_of(out["lost"], scheduled.name)))
        except StoreError as exc:
            part["reachable"], part["error"], reachable = False, str(exc), False
            out["entries"].append(_entry(
                app, settings, store, scheduled, config, texts.get(scheduled.name),
                history=history, next_count=next_count, now_ms=now_ms, reachable=False,
                requests=requests, cache=cache, used=used, kept=[]))
    for key in set(cache) - used:   # definitions no longer listed
        del cache[key]
    if not reachable:   # what only the store knows is unknown, not empty
        out["instances"] = out["partial"] = out["disagreements"] = out["unsaved"] = None
        out["run_now"] = out["lost"] = None
        for entry in out["entries"]:
            entry.update(state=UNKNOWN_STATE, paused=None, lease=None, run_now=None, runs=[],
                         last=None, kept=None)
    return out


def _listed_safely(app, store: ClaimStore, reachable: bool, part: dict):
    """:func:`_listed`, falling back to the config entries when the store cannot be read."""
    if reachable:
        try:
            return _listed(app, store)
        except StoreError as exc:
            part["reachable"], part["error"] = False, str(exc)

    return _config_listed(app), {}, None


def _config_listed(app) -> list[ScheduledEntry]:
    """The ``beat_schedule`` entries as listed entries (a store without entries, or one that
    cannot be read)."""
    listed = []
    for name, item in sorted(_config_items(app).items()):
        listed.append(ScheduledEntry(name, CONFIG, config_data(app, name, item)))
    return listed


def dumps(data: dict) -> str:
    """The overview as JSON text (sorted keys), as ``status --json`` prints it."""
    return json.dumps(data, sort_keys=True)


__all__ = ["overview", "dumps", "run_json", "lost_lines", "LOST_FIX", "STALE_INTERVALS"]
