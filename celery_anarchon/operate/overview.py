"""The status of one namespace as plain data: what ``celery anarchon status --json`` prints and
what the status page shows.

:func:`overview` reads the store once per part (clock, instances, entries and pauses, every
entry's history in a few round trips with ``store.history.read_many``, leases) and returns
JSON-able values only (str, int, float, bool, None, lists, dicts): no click, no Celery objects,
no password (the store's URL is :attr:`~ClaimStore.safe_url`). A store that cannot be reached gives
``store.reachable = False`` and the parts it could not read empty, never an exception: a status
view must show an outage, not fail on it; what only the store knows (pauses, leases, instances,
run-now requests) is then ``None`` and each entry's ``state`` is ``"unknown"``, never
"running".

The parts: :mod:`~celery_anarchon.operate.overview_entries` (an entry's row) and
:mod:`~celery_anarchon.operate.overview_instances` (the live instances, what they keep from a
loss, where they disagree).
"""
from __future__ import annotations

import json
import time
import weakref

from celery_anarchon import limits
from celery_anarchon._util import iso
from celery_anarchon.errors import ConfigError, StoreError
from celery_anarchon.operate.config import config_data, config_items
from celery_anarchon.operate.listing import CONFIG, ScheduledEntry
from celery_anarchon.operate.overview_entries import (
    UNKNOWN_STATE, entry_row, kept_of, plan_cache, run_json,
)
from celery_anarchon.operate.overview_instances import (
    LOST_FIX, STALE_INTERVALS, fingerprint_views, instance_json, lost_json, lost_lines,
    refused_json, refused_lines, store_definition,
)
from celery_anarchon.operate.schedules import Schedules
from celery_anarchon.settings import Settings
from celery_anarchon.stores.base import ClaimStore, HistoryRecord

#: per store object: the warnings of its prepare() (run once: a page reading the overview every
#: few seconds does not repeat the start-up checks) and its Schedules
_PREPARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_SCHEDULES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def store_warnings(store: ClaimStore) -> list[str]:
    """The warnings of ``store.prepare()``, which runs once per store object (a page reading the
    overview every few seconds does not repeat the start-up checks).

    :raises StoreError: the store cannot be reached (prepared again next time).
    """
    if store not in _PREPARED:
        _PREPARED[store] = list(store.prepare(()))
    return list(_PREPARED[store])


def _store_part(store: ClaimStore, now_ms: int | None) -> dict:
    """``store`` of :func:`overview` (reachable and clock filled in by the caller)."""
    durability = getattr(store, "durability", None)
    return {"url": store.safe_url, "kind": store.kind, "namespace": store.namespace,
            "durability": durability if isinstance(durability, str) else None,
            "memory_s": store.memory.duration_s, "memory_count": store.memory.count,
            "checks_lateness": store.checks_lateness, "leases": store.leases is not None,
            "entries": store.entries is not None,
            "reachable": False, "error": None, "warnings": [], "clock": None, "skew_ms": None}


def _listed(app, store: ClaimStore) -> tuple[list[ScheduledEntry], dict[str, str], list[dict]]:
    """Every entry (``Schedules.list``), the store entries' definition texts and the run-now
    requests; on a store without entries, the ``beat_schedule`` entries only."""
    if store.entries is None:
        return _config_listed(app), {}, []
    schedules = _SCHEDULES.get(store)
    if schedules is None or schedules.app is not app:
        schedules = _SCHEDULES[store] = Schedules(app, store=store)   # never closes the store
    listed = schedules.list()
    snapshot = store.entries.load_entries()
    texts = {n: e.definition for n, e in snapshot.entries.items() if e.definition is not None}
    requests = [{"entry": r.entry, "request_id": r.request_id, "slot": iso(r.slot_ms),
                 "by": r.by, "requested": iso(r.requested_ms)} for r in snapshot.requests]
    return listed, texts, requests


#: the runs of each entry read at least, for the overdue rule (an entry whose newest due slot is
#: older than these is read again in full)
DUE_RUNS = 20


def overview(app, store: ClaimStore, settings: Settings | None = None, *, runs: int = 20,
             next_count: int = 3, now_ms: int | None = None, due: bool = True) -> dict:
    """The status of ``app``'s namespace in ``store``, as JSON-able data.

    :param app: the Celery app (``beat_schedule``, ``timezone``, the ``anarchon_*`` settings).
    :param store: its store (:func:`celery_anarchon.settings.open_app_store`); not closed here.
    :param settings: the app's settings (default ``Settings.from_app(app)``).
    :param runs: how many of each entry's newest runs to show (``runs`` below), 0 for none;
        with ``due``, at least :data:`DUE_RUNS` are read.
    :param next_count: how many next slots per entry.
    :param now_ms: "now" for the next slots and the overdue rule, UTC ms (default: the store's
        clock, else this host's).
    :param due: tell each entry's newest due slot and whether it is overdue (``due``; reads at
        least :data:`DUE_RUNS` runs of each entry); ``False``: ``due`` is ``None``.
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
      ``lost``: ``{instance, what: "pause" | "entry" | "withheld", detail}``), ``due`` (its
      newest due slot, whose deadline slot + jitter + max_late has passed, and what the store
      says of it: ``{slot, deadline, state: "recorded" | "overdue" | "unknown", event (the
      slot's record's), late_s (seconds past the deadline), why (why "unknown": the store cannot
      vouch)}``, :mod:`~celery_anarchon.operate.overdue`; ``None`` for an entry paused, kept,
      broken or unknown, or with no slot due yet), ``unsent`` (``True``: no live, ticking beat
      instance, so nothing is sending it; ``None`` when the store keeps no instance records or
      cannot be read), ``state`` (``"running"``, ``"overdue"`` (running or ended, and its newest
      due slot has no record: ``due``), ``"waiting"`` (its ``start_at`` is to come),
      ``"ended"`` (no slot of it comes any more: its ``end_at``), ``"paused"``, ``"kept"`` (the
      store holds no pause, but a live instance keeps one from before the store's loss: it
      claims no run of it), ``"problem"``, or
      ``"unknown"`` when the store cannot be read: ``paused``, ``lease`` and ``run_now`` are then
      ``None``, not known), ``start_at`` and ``end_at`` (its window, ISO 8601 UTC, ``None``:
      unbounded).
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
    * ``refused``: entries live instances leave out because our rules refuse them, while they
      run the others (a django-celery-beat row with an unsafe jitter or a crontab step larger
      than its field): ``{entry, error, instances}``, ``error`` naming the entry, where it comes
      from (a row's id) and the fix; ``[]`` when none, ``None`` when the store cannot be read.
      Such an entry needs attention: nothing sends it.
    """
    settings = settings or Settings.from_app(app)
    out = {"namespace": store.namespace, "generated": None, "store": _store_part(store, None),
           "instance_records": store.instances is not None, "instances": [],
           "entries": [], "run_now": [], "partial": [], "disagreements": [], "unsaved": [],
           "lost": [], "refused": []}
    part = out["store"]
    store_now = None
    try:
        before = time.time()
        store_now = store.now_ms()
        after = time.time()
        part["warnings"] = store_warnings(store)
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
    if reachable and store.instances is not None:
        try:
            records = store.instances.instances()
            out["instances"] = [instance_json(r, store_now, settings.sync_interval_s)
                                for r in records]
            out["lost"] = lost_json(records)
            out["refused"] = refused_json(records)
            out["partial"], out["disagreements"], out["unsaved"] = fingerprint_views(
                store, records, texts,
                lambda name: store_definition(app, settings, store, name, texts[name]))
        except StoreError as exc:
            part["reachable"], part["error"], reachable = False, str(exc), False
    config = config_items(app)
    histories: dict[str, list[HistoryRecord]] = {}
    # at least DUE_RUNS runs of each: what the overdue rule needs of most entries in one read
    read_limit = max(runs, DUE_RUNS) if due else runs
    if reachable and read_limit:
        try:   # every entry's runs in a few round trips (History.read_many)
            # a name no store can encode (a lone surrogate) has no runs: beat refuses it
            histories = store.history.read_many([e.name for e in listed
                                                 if limits.undecodable(e.name) is None],
                                                limit=read_limit)
        except StoreError as exc:
            part["reachable"], part["error"], reachable = False, str(exc), False
    cache, used = plan_cache(app, settings, store), set()
    unsent = (not any(i["ticking"] for i in out["instances"])
              if reachable and store.instances is not None else None)
    for scheduled in listed:
        history = histories.get(scheduled.name, [])
        try:
            out["entries"].append(entry_row(
                app, settings, store, scheduled, config, texts.get(scheduled.name),
                history=history, next_count=next_count, now_ms=now_ms, reachable=reachable,
                requests=requests, cache=cache, used=used,
                kept=kept_of(out["lost"], scheduled.name), runs=runs,
                read_limit=read_limit if due and limits.undecodable(scheduled.name) is None else 0,
                unsent=unsent))
        except StoreError as exc:
            part["reachable"], part["error"], reachable = False, str(exc), False
            out["entries"].append(entry_row(
                app, settings, store, scheduled, config, texts.get(scheduled.name),
                history=history, next_count=next_count, now_ms=now_ms, reachable=False,
                requests=requests, cache=cache, used=used, kept=[], runs=runs))
    for key in set(cache) - used:   # definitions no longer listed
        del cache[key]
    if not reachable:   # what only the store knows is unknown, not empty
        out["instances"] = out["partial"] = out["disagreements"] = out["unsaved"] = None
        out["run_now"] = out["lost"] = out["refused"] = None
        for entry in out["entries"]:
            entry.update(state=UNKNOWN_STATE, paused=None, lease=None, run_now=None, runs=[],
                         last=None, kept=None, due=None, unsent=None)
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
    for name, item in sorted(config_items(app).items()):
        listed.append(ScheduledEntry(name, CONFIG, config_data(app, name, item)))
    return listed


def dumps(data: dict) -> str:
    """The overview as JSON text (sorted keys), as ``status --json`` prints it."""
    return json.dumps(data, sort_keys=True)


__all__ = ["overview", "dumps", "run_json", "lost_lines", "refused_lines", "LOST_FIX",
           "STALE_INTERVALS"]
