"""Small helpers shared by the store tests (contract, per-store and HA): one copy of what four
test files each wrote for themselves."""
from __future__ import annotations

from celery_anarchon.stores.base import ClaimRequest
from backends import backdate_memory_start

#: how far back :func:`prepared` moves the memory start: a store in service for a while
BACKDATE_MS = 120_000


def req(entry: str, slot_ms: int, *, max_late_ms: int = 60_000, lease=None, fingerprint: str = "fp",
        task_id: str | None = None) -> ClaimRequest:
    """A claim request for ``entry``'s run at ``slot_ms`` (task id ``t-<slot>`` unless given)."""
    return ClaimRequest(entry=entry, slot_ms=slot_ms, max_late_ms=max_late_ms,
                        task_id=task_id or f"t-{slot_ms}", fingerprint=fingerprint, lease=lease)


def prepared(store, *entries: str):
    """Prepare ``entries`` (default ``"e"``) and move their memory start two minutes back, as on a
    store that has been running for a while (a new store refuses slots up to 10 s after its
    memory began). Returns the store."""
    entries = list(entries or ["e"])
    store.prepare(entries)
    backdate_memory_start(store, entries, BACKDATE_MS)
    return store


def request_run(store, entry: str, request_id: str, *, by: str = "test", scheduled=(), **options):
    """``store.entries.request_run`` with a window around the store's clock (:meth:`SlotWindow.around`
    holds ``scheduled``, the entry's scheduled slots, none by default); ``options``:
    ``retention_ms``."""
    from celery_anarchon.stores.run_now import SlotWindow
    now = store.now_ms()
    window = SlotWindow(now - SlotWindow.BEFORE_MS, now + SlotWindow.AFTER_MS, frozenset(scheduled))
    return store.entries.request_run(entry, request_id, window, by=by, **options)


#: store entries an older version accepted and that are invalid now, by name (each definition
#: as that version stored it): beat leaves each out, and every read surface shows it as a
#: problem row beside the others
BROKEN_STORE_ENTRIES = {
    "far": {"task": "t", "schedule": {"every": 1_000_000_000_000}},     # next slot: year 33658
    "expires-soon": {"task": "t", "schedule": {"every": 60}, "options": {"expires": "soon"}},
    "headers-x": {"task": "t", "schedule": {"every": 60}, "options": {"headers": "x"}},
    "huge-args": {"task": "t", "schedule": {"every": 60}, "args": ["x" * 100_000]},
    "n" * 300: {"task": "t", "schedule": {"every": 60}},
    "cafe\u0301": {"task": "t", "schedule": {"every": 60}},
}


def write_broken_entries(store) -> None:
    """Write :data:`BROKEN_STORE_ENTRIES` into ``store`` (an entry store) as an older version
    did: canonical JSON, no check."""
    import json
    store.prepare(())
    for name, definition in BROKEN_STORE_ENTRIES.items():
        text = json.dumps(definition, sort_keys=True, separators=(",", ":"))
        store.entries.put_entry(name, text, by="an older version", create=True)
