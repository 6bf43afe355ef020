"""History notes (sent, send failed, late on this instance, the store unreachable, ...) buffered
and written to the store a batch per tick; kept while the store is unreachable, at most as many
per entry as the store keeps of the entry's history."""
from __future__ import annotations

import array
import collections

from celery_anarchon.beat.engine.outage import Outage
from celery_anarchon.errors import StoreError
from celery_anarchon.stores.base import ClaimStore, HistoryRecord, RunEvent

#: history notes written in one store call; the rest go in the next ticks' calls (a long outage
#: leaves up to history_size notes per entry)
WRITE_AT_ONCE = 5_000
#: notes kept before the oldest beyond each entry's ``per_entry`` are dropped (then again at
#: twice what was left: amortized, so a burst's notes are appended to one list, nothing more)
COMPACT_AT = 50_000


class NoteBuffer:
    """Notes waiting to be written to ``store``'s history; a failed write is kept and counted as
    a store error by ``outage``, which also says when to write again.

    Each entry keeps at most its ``per_entry`` newest notes: the store keeps the newest
    ``history_size`` runs of an entry, so an outage long enough to fill that drops the entry's
    oldest notes as the store itself would, and the notes of one entry never push out another's.
    The runs given up because the store could not be reached, one per due run in an outage, are
    kept as their slots alone (8 bytes each): memory stays within about 16 bytes x ``per_entry``
    per entry however long the outage (10,000 entries: 16 MB at most), besides the other notes.

    :param store: where the notes go (its history part:
        :meth:`~celery_anarchon.stores.parts.History.record_many`).
    :param outage: the store's outage backoff.
    :param per_entry: notes kept per entry (default: the store's ``history_size``).
    :param write_at_once: notes written in one call, at most.
    :param compact_at: notes kept before the first drop of each entry's oldest past ``per_entry``.
    """

    def __init__(self, store: ClaimStore, outage: Outage, *, per_entry: int | None = None,
                 write_at_once: int = WRITE_AT_ONCE, compact_at: int = COMPACT_AT) -> None:
        self.store = store
        self.outage = outage
        self.per_entry = max(1, per_entry or getattr(store, "history_size", 0) or 100)
        self.write_at_once = write_at_once
        self._notes: list[HistoryRecord] = []
        self._least_compact_at = self._compact_at = compact_at
        self._unreachable: dict[str, array.array] = {}   # entry -> slots (ms), oldest first
        self._unreachable_detail = ""

    def __bool__(self) -> bool:
        return bool(self._notes) or bool(self._unreachable)

    @property
    def pending(self) -> list[HistoryRecord]:
        """The notes not written yet, in the order they were added (the runs given up as
        unreachable after the others)."""
        return [*self._notes, *self._unreachable_notes(self._unreachable)]

    def add(self, entry: str, slot_ms: int, event: RunEvent, **fields) -> None:
        """Keep one note (past ``per_entry`` notes of ``entry``, its oldest go, now and then)."""
        self._notes.append(HistoryRecord(entry, slot_ms, event, **fields))
        if len(self._notes) >= self._compact_at:
            self._compact()

    def _compact(self) -> None:
        """Keep each entry's newest ``per_entry`` notes, in their order."""
        counts: collections.Counter = collections.Counter()
        kept = []
        for note in reversed(self._notes):
            if counts[note.entry] < self.per_entry:
                counts[note.entry] += 1
                kept.append(note)
        kept.reverse()
        self._notes = kept
        self._compact_at = max(self._least_compact_at, 2 * len(kept))

    def add_unreachable(self, entry: str, slot_ms: int, detail: str) -> None:
        """Keep the note of a run given up because the store could not be reached (event
        ``store_unreachable``; ``detail`` is the same for every such note of this instance)."""
        self._unreachable_detail = detail
        slots = self._unreachable.get(entry)
        if slots is None:
            slots = self._unreachable[entry] = array.array("q")
        slots.append(slot_ms)
        if len(slots) >= 2 * self.per_entry:       # trimmed now and then, not at every note
            del slots[:len(slots) - self.per_entry]

    def _unreachable_notes(self, slots_of: dict[str, array.array]):
        for entry, slots in slots_of.items():
            for slot_ms in slots[-self.per_entry:]:
                yield HistoryRecord(entry, slot_ms, RunEvent.UNREACHABLE,
                                    detail=self._unreachable_detail)

    def flush(self) -> None:
        """Write up to ``write_at_once`` notes in one call, unless the store is in its outage
        backoff; those that fail are kept, in their order."""
        if not self or not self.outage.may_try():
            return
        notes = self._notes[:self.write_at_once]
        del self._notes[:len(notes)]
        room = self.write_at_once - len(notes)
        unreachable: dict[str, array.array] = {}
        for entry, slots in self._unreachable.items():
            if room <= 0:
                break
            if len(slots) > self.per_entry:
                del slots[:len(slots) - self.per_entry]
            unreachable[entry] = slots[:room]
            del slots[:room]
            room -= len(unreachable[entry])
        for entry in unreachable:
            if not self._unreachable[entry]:
                del self._unreachable[entry]
        try:
            self.store.history.record_many([*notes, *self._unreachable_notes(unreachable)])
        except StoreError as exc:
            self._notes[:0] = notes
            for entry, slots in unreachable.items():
                self._unreachable[entry] = slots + self._unreachable.get(entry, array.array("q"))
            self.outage.failed(exc, "writing history")
