"""History notes (sent, send failed, late on this instance, ...) buffered and written to the
store in one call per tick; kept while the store is unreachable, up to a bound."""
from __future__ import annotations

from celery_anarchon.engine.outage import Outage
from celery_anarchon.errors import StoreError
from celery_anarchon.stores.base import ClaimStore, HistoryRecord, RunEvent

#: history notes kept while the store is unreachable
MAX_PENDING_NOTES = 10_000


class NoteBuffer:
    """Notes waiting to be written to ``store``'s history; a failed write is kept and counted as
    a store error by ``outage``, which also says when to write again."""

    def __init__(self, store: ClaimStore, outage: Outage,
                 max_kept: int = MAX_PENDING_NOTES) -> None:
        self.store = store
        self.outage = outage
        self.max_kept = max_kept
        self.pending: list[HistoryRecord] = []

    def __bool__(self) -> bool:
        return bool(self.pending)

    def add(self, entry: str, slot_ms: int, event: RunEvent, **fields) -> None:
        """Keep one note; the oldest are dropped past ``max_kept``."""
        self.pending.append(HistoryRecord(entry, slot_ms, event, **fields))
        if len(self.pending) > self.max_kept:
            del self.pending[: len(self.pending) - self.max_kept]

    def flush(self) -> None:
        """Write the notes in one call, unless the store is in its outage backoff."""
        if not self.pending or not self.outage.may_try():
            return
        notes, self.pending = self.pending, []
        try:
            self.store.record_many(notes)
        except StoreError as exc:
            self.pending = notes + self.pending
            self.outage.failed(exc, "writing history")
