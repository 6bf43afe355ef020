"""History notes (sent, send failed, late on this instance, the store unreachable, ...) buffered
and written to the store a batch per tick; kept while the store is unreachable, at most as many
per entry as the store keeps of the entry's history."""
from __future__ import annotations

import array
import collections
import itertools

from celery_anarchon.engine.outage import Outage
from celery_anarchon.errors import StoreError
from celery_anarchon.stores.base import ClaimStore, HistoryRecord, RunEvent

#: history notes written in one store call; the rest go in the next ticks' calls (a long outage
#: leaves up to history_size notes per entry)
WRITE_AT_ONCE = 5_000


class NoteBuffer:
    """Notes waiting to be written to ``store``'s history; a failed write is kept and counted as
    a store error by ``outage``, which also says when to write again.

    The notes of each entry are kept in order, at most ``per_entry`` of them: the store keeps the
    newest ``history_size`` runs of an entry, so an outage long enough to fill that drops the
    entry's oldest notes as the store itself would, and the notes of one entry never push out
    another's. The runs given up because the store could not be reached, one per due run in an
    outage, are kept as their slots alone (8 bytes each): memory stays within about 16 bytes x
    ``per_entry`` per entry however long the outage (10,000 entries: 16 MB at most).

    :param store: where the notes go (:meth:`~celery_anarchon.stores.base.ClaimStore.record_many`).
    :param outage: the store's outage backoff.
    :param per_entry: notes kept per entry (default: the store's ``history_size``).
    :param write_at_once: notes written in one call, at most.
    """

    def __init__(self, store: ClaimStore, outage: Outage, *, per_entry: int | None = None,
                 write_at_once: int = WRITE_AT_ONCE) -> None:
        self.store = store
        self.outage = outage
        self.per_entry = max(1, per_entry or getattr(store, "history_size", 0) or 100)
        self.write_at_once = write_at_once
        self._notes: dict[str, collections.deque[HistoryRecord]] = {}
        self._unreachable: dict[str, array.array] = {}   # entry -> slots (ms), oldest first
        self._unreachable_detail = ""

    def __bool__(self) -> bool:
        return bool(self._notes) or bool(self._unreachable)

    @property
    def pending(self) -> list[HistoryRecord]:
        """The notes not written yet: each entry's in the order they were added (the runs given
        up as unreachable after the others)."""
        return list(itertools.chain(itertools.chain.from_iterable(self._notes.values()),
                                    self._unreachable_notes(self._unreachable)))

    def add(self, entry: str, slot_ms: int, event: RunEvent, **fields) -> None:
        """Keep one note; past ``per_entry`` notes of ``entry``, its oldest is dropped."""
        notes = self._notes.get(entry)
        if notes is None:
            notes = self._notes[entry] = collections.deque(maxlen=self.per_entry)
        notes.append(HistoryRecord(entry, slot_ms, event, **fields))

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
        room = self.write_at_once
        notes: dict[str, list[HistoryRecord]] = {}
        for entry, kept in self._notes.items():
            if room <= 0:
                break
            notes[entry] = [kept.popleft() for _ in range(min(room, len(kept)))]
            room -= len(notes[entry])
        unreachable: dict[str, array.array] = {}
        for entry, slots in self._unreachable.items():
            if room <= 0:
                break
            if len(slots) > self.per_entry:
                del slots[:len(slots) - self.per_entry]
            unreachable[entry] = slots[:room]
            del slots[:room]
            room -= len(unreachable[entry])
        for entry in notes:
            if not self._notes[entry]:
                del self._notes[entry]
        for entry in unreachable:
            if not self._unreachable[entry]:
                del self._unreachable[entry]
        try:
            self.store.record_many(list(itertools.chain(
                itertools.chain.from_iterable(notes.values()),
                self._unreachable_notes(unreachable))))
        except StoreError as exc:
            for entry, batch in notes.items():
                kept = self._notes.setdefault(entry, collections.deque(maxlen=self.per_entry))
                kept.extendleft(reversed(batch))
            for entry, slots in unreachable.items():
                self._unreachable[entry] = slots + self._unreachable.get(entry, array.array("q"))
            self.outage.failed(exc, "writing history")
