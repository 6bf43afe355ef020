"""A run-now request in the store: the write behind ``Schedules.run_now``
(:mod:`celery_anarchon.operate.schedules`) once its entry is known.

The store chooses the request's slot in the write that records it (its clock's now, moved past
the entry's scheduled slots and its other requests' slots:
:class:`~celery_anarchon.stores.run_now.SlotWindow`);
a request id is one request, and one run, for ``anarchon_request_retention``
(docs/schedules.md, "What each operation guarantees").
"""
from __future__ import annotations

from celery import beat

from celery_anarchon.errors import ConfigError, StoreError
from celery_anarchon.schedule import timing
from celery_anarchon.schedule.plan import EntryPlan, build_plan
from celery_anarchon.settings import Settings
from celery_anarchon.stores.base import ClaimStore, entry_store
from celery_anarchon.stores.entry_store import Entries, EntrySnapshot, RunRequest
from celery_anarchon.stores.run_now import SlotWindow, SlotWindowPassed

#: how many times a request is computed again when the store's clock left its window
WINDOW_TRIES = 3


def earlier_request(entries: Entries, name: str, request_id: str,
                    given: str) -> RunRequest | None:
    """The request ``request_id`` (checked, in NFC) of entry ``name`` made before, or ``None``:
    the first request, whatever happened to the entry since (``given``: the id as the caller
    gave it, which an older version stored unnormalized).

    :param entries: the store's entries part, the store prepared.
    """
    found = entries.find_request(name, request_id)
    if found is None and given != request_id:   # stored unnormalized by an older version
        found = entries.find_request(name, given)
    return found


def request_run(store: ClaimStore, settings: Settings, entry: beat.ScheduleEntry,
                snapshot: EntrySnapshot, request_id: str | None, by: str, *, app) -> RunRequest:
    """Write a new run-now request of ``entry`` (Celery's entry of a config or store entry;
    ``request_id``; ``None``: a new id of the store's clock), its slot chosen by the store within
    the window of scheduled slots computed at the store's clock (computed again, up to
    :data:`WINDOW_TRIES` times, when the clock left it before the write).

    :param store: the store, prepared (one that holds entries: :func:`~.base.entry_store`).
    :param snapshot: the store's entries: the entry's pause and its other run-now requests.
    :raises ConfigError: the entry is paused, breaks a start-up rule
        (:func:`~celery_anarchon.schedule.plan.build_plan`), or its store remembers too few of its
        runs for a run-now claim (:func:`check_run_now`); nothing is written.
    :raises StoreError: the store could not be reached or did not confirm the write, or its
        clock left the window :data:`WINDOW_TRIES` times: the outcome is unknown; a request id
        known then is in ``exc.request_id`` (repeat the call with it: one run, never two).
    """
    name = entry.name
    entries = entry_store(store)
    stored = snapshot.entries.get(name)
    if stored is not None and stored.pause is not None:
        raise ConfigError(f"entry {name!r} is {stored.pause.describe()}: every claim of a run "
                          f"would answer paused; fix: resume it first (celery anarchon resume "
                          f"{name})")
    plan = build_plan(name, entry, app=app, settings=settings, store=store)
    check_run_now(store, settings, plan, snapshot, None)
    retention_ms = timing.ms(settings.request_retention_s)
    try:
        for _ in range(WINDOW_TRIES):
            clock = entries.request_clock()
            if request_id is None:
                request_id = clock.new_id()
            check_run_now(store, settings, plan, snapshot, clock.now_ms)
            window = SlotWindow.around(plan.slots, clock.now_ms)
            try:
                return entries.request_run(name, request_id, window, by=by,
                                           retention_ms=retention_ms)
            except SlotWindowPassed:
                continue                       # nothing written: a new window
        raise StoreError(f"entry {name!r}: run-now: the store's clock left the window of "
                         f"scheduled slots the request was computed for, {WINDOW_TRIES} times in "
                         "a row (a store clock that jumps, or calls that take a minute); fix: "
                         "check the store's clock and retry")
    except StoreError as exc:
        if request_id is not None:
            exc.request_id = request_id
            exc.add_note(f"run-now request id {request_id!r}: the outcome is unknown; "
                         "repeat the call with this request_id (one run, never two)")
        raise


def check_run_now(store: ClaimStore, settings: Settings, plan: EntryPlan,
                  snapshot: EntrySnapshot, now_ms: int | None) -> None:
    """:func:`~celery_anarchon.schedule.timing.check_run_now` for a new request of ``plan``'s entry
    made at ``now_ms`` (the store's clock), counting the entry's requests of ``snapshot``
    made within the span before it; ``None``: the entry alone (before the clock is read)."""
    memory = store.memory
    if memory.count is None:
        return
    max_late_s, sync_s = plan.timing.max_late_s, settings.sync_interval_s
    span_ms = timing.ms(timing.run_now_span_s(max_late_s, sync_s))
    others = 0 if now_ms is None else sum(
        1 for r in snapshot.requests if r.entry == plan.name and r.slot_ms > now_ms - span_ms)
    timing.check_run_now(plan.name, memory, shortest_gap_s=plan.slots.shortest_gap_ms / 1000,
                         max_late_s=max_late_s, sync_interval_s=sync_s, others=others)
