"""One entry as the status page's entry page shows it (``GET /entries/<name>`` and
``GET /api/entries/<name>`` of :mod:`celery_anarchon.operate.web`): its definition and where it
comes from, who changed it last, its pause, lease and state, its next slots in its own zone, and
its history a page at a time, each run's task id linked to Flower when ``anarchon_flower_url``
is set.

The row's parts it shares with the status page (schedule in words, zone, next slots, the
start-up rule it breaks, lease, state, overdue) come from
:func:`~celery_anarchon.operate.overview_entries.entry_row`, so both pages say the same.
"""
from __future__ import annotations

import json
import time
from urllib.parse import quote

from celery_anarchon import limits
from celery_anarchon._util import iso
from celery_anarchon.errors import UnknownEntry
from celery_anarchon.operate import times
from celery_anarchon.operate.config import config_items
from celery_anarchon.operate.listing import (
    ScheduledEntry, listed, scheduled as scheduled_in, unknown_entry_error,
)
from celery_anarchon.operate.names import normal_name
from celery_anarchon.operate.overview import store_warnings
from celery_anarchon.operate.overview_entries import entry_row, kept_of, plan_cache, run_json
from celery_anarchon.operate.overview_instances import lost_json
from celery_anarchon.schedule import as_data
from celery_anarchon.settings import Settings
from celery_anarchon.stores.base import ClaimStore, HistoryRecord

#: runs per page of an entry's history: the default and the most (``?limit=N``)
HISTORY_PAGE, MAX_HISTORY_PAGE = 50, 1000
#: how many next slots the entry page shows
NEXT_COUNT = 10
#: where an entry is defined (``source``) when only live beat instances run it: neither this
#: app's beat_schedule nor a store entry (a django-celery-beat row, another host's beat_schedule)
INSTANCES = "instances"
#: ``source`` in words
SOURCES = {"config": "beat_schedule (this app's configuration)",
           "store": "a store entry (added at run time)",
           "unknown": "neither: the store holds a pause of this name only",
           INSTANCES: "live beat instances only (e.g. a django-celery-beat row, or another "
                      "host's beat_schedule): they record its task, schedule and timing, not "
                      "its args, kwargs or options"}


def flower_link(flower_url: str | None, task_id: str | None) -> str | None:
    """``<flower_url>/task/<task_id>`` (the id quoted), or ``None`` without a URL or an id."""
    if not flower_url or not task_id:
        return None
    return f"{flower_url}/task/{quote(task_id, safe='')}"


def page_limit(value: str | int | None) -> int:
    """The runs per history page from ``?limit=N``: held within 1 .. :data:`MAX_HISTORY_PAGE`;
    :data:`HISTORY_PAGE` when missing or not a number."""
    try:
        return min(max(int(value), 1), MAX_HISTORY_PAGE)
    except (TypeError, ValueError):
        return HISTORY_PAGE


def page_before(value: str | int | None) -> int | None:
    """The ``?before=<slot ms>`` of a history page (runs of older slots), ``None`` when missing
    or not an integer."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def history_page(history: list[HistoryRecord], *, before_ms: int | None,
                 limit: int) -> tuple[list[HistoryRecord], int | None]:
    """One page of an entry's runs (newest first): the first ``limit`` of those whose slot is
    older than ``before_ms`` (``None``: the newest).

    :returns: ``(runs, next_before)``: ``next_before`` is the slot (UTC ms) the next, older,
        page starts before, ``None`` when no older run is kept.
    """
    older = [r for r in history if before_ms is None or r.slot_ms < before_ms]
    shown = older[:limit]
    return shown, (shown[-1].slot_ms if len(older) > len(shown) else None)


def _run(rec: HistoryRecord, flower_url: str | None) -> dict:
    """A run as :func:`run_json` gives it, each attempt's ``flower`` link added."""
    out = run_json(rec)
    for one in (out, *out["earlier"]):
        one["flower"] = flower_link(flower_url, one["task_id"])
    return out


def _find(app, store: ClaimStore,
          name: str) -> tuple[ScheduledEntry | None, list[dict], str | None]:
    """The entry ``name`` (its exact form first, then its NFC form, as ``Schedules.get``), the
    store's run-now requests of it and its stored definition text; the entry is ``None`` when
    neither beat_schedule nor the store holds anything of it."""
    config = config_items(app)
    snapshot = store.entries.load_entries() if store.entries is not None else None
    for candidate in dict.fromkeys((name, normal_name(name))):
        if snapshot is None:
            found = scheduled_in(app, config, candidate, None)
        else:
            found = next(iter(listed(app, snapshot, only=candidate)), None)
        if found is None:
            continue
        if snapshot is None:
            return found, [], None
        stored = snapshot.entries.get(found.name)
        requests = [{"entry": r.entry, "request_id": r.request_id, "slot": iso(r.slot_ms),
                     "by": r.by, "requested": iso(r.requested_ms)}
                    for r in snapshot.requests if r.entry == found.name]
        return found, requests, None if stored is None else stored.definition
    return None, [], None


def _instances(store: ClaimStore, name: str) -> tuple[list, list[str], dict | None]:
    """The live instances' records, those (``host:pid``) that run ``name``, and the definition
    the first of them runs (``{task, schedule, timing, store}`` as beat describes it), else
    ``None``."""
    if store.instances is None:
        return [], [], None
    records = store.instances.instances()
    run_by, definition, mappings = [], None, {}
    for r in records:
        if r.fingerprints_digest not in mappings:
            mappings[r.fingerprints_digest] = store.instances.load_fingerprints(
                r.fingerprints_digest) or {}
        mapping = mappings[r.fingerprints_digest]
        if name in mapping:
            run_by.append(f"{r.host}:{r.pid}")
            if definition is None:
                text = store.history.load_definition(name, mapping[name])
                try:
                    definition = json.loads(text) if text else None
                except ValueError:
                    definition = {"repr": text}
    return records, run_by, definition


def _kept_per_entry(store: ClaimStore) -> int:
    """The runs the store keeps per entry (``history_size``; a very large number when the store
    does not say): a full :meth:`History.read` holds all of them."""
    return getattr(store, "history_size", None) or 10 ** 9


def entry_detail(app, store: ClaimStore, settings: Settings | None = None, name: str = "", *,
                 before: str | int | None = None, limit: str | int | None = None,
                 next_count: int = NEXT_COUNT, now_ms: int | None = None) -> dict:
    """The entry page's data of entry ``name`` (the JSON of ``GET /api/entries/<name>``).

    :param app: the Celery app (``beat_schedule``, ``timezone``, the ``anarchon_*`` settings).
    :param store: its store (not closed here).
    :param settings: the app's settings (default ``Settings.from_app(app)``): its
        ``flower_url`` links the task ids.
    :param before: the history page's ``?before=``: runs of slots older than this, UTC ms
        (``None``: the newest).
    :param limit: runs per history page (:func:`page_limit`).
    :param next_count: how many next slots.
    :param now_ms: "now", UTC ms (default: the store's clock, else this host's).
    :raises UnknownEntry: neither beat_schedule, the store nor a live beat instance knows
        ``name`` (the message names it and the closest known name).
    :raises StoreError: the store cannot be read.
    :raises ConfigError: a bad ``anarchon_*`` setting.

    The keys (times ISO 8601 UTC, or ``None``): ``namespace``, ``generated`` (the "now" used),
    ``name``, ``source`` (``"config"``, ``"store"``, ``"unknown"``, ``"instances"``) and
    ``source_text`` (in words), ``shadowed``, ``definition`` (the definition as data:
    ``task``, ``schedule``, ``args``, ``kwargs``, ``options``, ``anarchon`` (its per-entry
    settings); for ``"instances"``, what they record: ``task``, ``schedule``, ``timing``),
    ``queue`` (``options["queue"]``, or ``None``), ``changed`` (the store's last change of the
    name: ``{version, at, by}``, ``None`` when the store holds nothing of it), ``run_by``
    (``host:pid`` of the live instances that run it), the row of the status page
    (:func:`~celery_anarchon.operate.overview.overview`'s ``entries`` item: ``schedule``,
    ``timezone``, ``problem``, ``leased``, ``paused``, ``lease``, ``state``, ``due``, ``run_now``,
    ``kept``, ``start_at``, ``end_at``), ``next`` (``[{slot, local}]``: ``local`` in the
    entry's zone), ``flower_url``, and ``history``: ``{runs (newest first, each as in
    ``overview``'s runs with ``flower``: the task id's Flower link or ``None``, on each of its
    ``earlier`` attempts too), before, limit, next_before (the ``before`` of the next, older,
    page; ``None``: no older run kept), kept (runs the store holds of the entry), history_size
    (the most it keeps per entry)}``.
    """
    settings = settings or Settings.from_app(app)
    store_warnings(store)                     # prepared once, as the status page does
    if now_ms is None:
        store_now = store.now_ms()
        now_ms = store_now if store_now is not None else int(time.time() * 1000)
    found, requests, stored_text = _find(app, store, name)
    records, run_by, ran = _instances(store, name if found is None else found.name)
    if found is None and not run_by:
        if store.entries is not None:
            raise unknown_entry_error(app, name, namespace=settings.namespace,
                                      entries=store.entries)
        raise UnknownEntry(f"no entry {name!r}: neither beat_schedule nor a live beat instance "
                           f"(namespace {settings.namespace!r}) knows it")
    found = found or ScheduledEntry(name, INSTANCES, ran)
    readable = limits.undecodable(found.name) is None
    history = store.history.read(found.name) if readable else []
    row = entry_row(app, settings, store, found, config_items(app), stored_text,
                    history=history, next_count=next_count, now_ms=now_ms, reachable=True,
                    requests=requests, cache=plan_cache(app, settings, store), used=set(),
                    kept=kept_of(lost_json(records), found.name), runs=None,
                    read_limit=_kept_per_entry(store) if readable else 0)
    row.pop("runs"), row.pop("last")
    limit_n = page_limit(limit)
    before_ms = page_before(before)
    shown, next_before = history_page(history, before_ms=before_ms, limit=limit_n)
    # a definition written straight into the store may hold what is no JSON (NaN): its repr
    definition = {k: as_data.json_value(v) for k, v in (found.definition or {}).items()}
    options = definition.get("options")
    return {**row, "namespace": store.namespace, "generated": iso(now_ms),
            "source_text": SOURCES.get(found.source, found.source), "definition": definition,
            "queue": options.get("queue") if isinstance(options, dict) else None,
            "changed": (None if not found.version else
                        {"version": found.version, "at": iso(found.updated_ms),
                         "by": found.updated_by}),
            "run_by": run_by,
            "next": [{"slot": s, "local": times.zone_time(s, row["timezone"])}
                     for s in row["next"]],
            "flower_url": settings.flower_url,
            "history": {"runs": [_run(r, settings.flower_url) for r in shown],
                        "before": before_ms, "limit": limit_n, "next_before": next_before,
                        "kept": len(history),
                        "history_size": getattr(store, "history_size", None)}}


