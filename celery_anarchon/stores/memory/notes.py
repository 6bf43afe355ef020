"""When the memory of a memory store began (docs/design.md "Amnesia"): the namespace's note
(the store-wide memory start, the server's epoch, the recorded ``memory``) and each entry's fence.

Every claim, lease operation and run-now request reads the note first, as the SQL stores read
``anarchon_stores`` (:mod:`celery_anarchon.stores.sql.memory`) and the Lua scripts the ``store``
hash: an entry's effective memory start is ``max(entry's, store-wide)``, and a slot before it
(plus the lateness tolerance) is refused as forgotten. Instants are UTC ms on the store's clock.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

from celery_anarchon.stores.base import LATENESS_TOLERANCE_MS
from celery_anarchon.stores.memory.state import Fence, Note, Server, Space

log = logging.getLogger(__name__)

_TOL = LATENESS_TOLERANCE_MS
#: the recorded memory's "last used" time is refreshed at most this often (ms); the replacement
#: rule adds it, so a coarse refresh never lets a value be replaced early (as in SQL)
MEMORY_USE_STEP_MS = 1000


@dataclasses.dataclass(frozen=True)
class MemoryStart:
    """The note as one operation read it.

    :param born_ms: the store-wide memory start.
    :param detail: why the memory began then (an epoch change names both epochs), for refusals.
    :param conflict: set when this instance's ``memory`` differs from the recorded one still in
        use: the detail its claims are refused with (forgotten) and prepare's error.
    """

    born_ms: int
    detail: str = ""
    conflict: str | None = None


def note_store(server: Server, space: Space, now: int, *, memory_ms: int, claiming: bool,
               where: str) -> MemoryStart:
    """Read the namespace's note and bring it up to date, in this order (docs/design.md "Amnesia";
    the same rules as :meth:`celery_anarchon.stores.sql.memory.SQLMemory.note_store`):

    1. no note (a new or wiped store): the memory begins now, with this server's epoch and this
       instance's ``memory``;
    2. another epoch (the data came back from an older copy, another server): the memory begins
       again now, so every entry refuses the slots before now + tolerance;
    3. another ``memory`` than the recorded one: replaced when the recorded one was last used
       more than the new memory + 2 x tolerance (+ the refresh step) ago, else a conflict;
    4. ``claiming``: the recorded memory's last use becomes now (at most every second).

    :param memory_ms: this instance's ``memory`` option, ms.
    :param where: ``"<kind> store <url>"``, for log lines and the conflict.
    """
    note = space.note
    if note is None:                                                   # 1.
        note = space.note = Note(now, server.epoch, "", memory_ms, now)
    if note.epoch != server.epoch:                                     # 2.
        log.warning("%s: the server's epoch changed from %r to %r (its data came back from an "
                    "older copy): it may have lost the newest claims; the store's memory begins "
                    "again now, and the runs of the next %d s are refused as forgotten", where,
                    note.epoch, server.epoch, _TOL // 1000)
        note.born_ms, note.prev_epoch, note.epoch = now, note.epoch, server.epoch
    detail = (f" (the server's epoch changed from {note.prev_epoch!r} to {note.epoch!r})"
              if note.prev_epoch else "")
    conflict = None
    if note.memory_ms != memory_ms:                                    # 3.
        idle = now - note.memory_used_ms
        wait_ms = memory_ms + 2 * _TOL + MEMORY_USE_STEP_MS
        if idle > wait_ms:
            log.warning("%s: the recorded 'memory' %g s (unused for %d s) is replaced by this "
                        "instance's %g s", where, note.memory_ms / 1000, idle // 1000,
                        memory_ms / 1000)
            note.memory_ms, note.memory_used_ms = memory_ms, now
        else:
            recorded, mine = note.memory_ms / 1000, memory_ms / 1000
            conflict = (
                f"anarchon_store_options['memory'] is {mine:g} s on this instance, but the store "
                f"recorded 'memory' = {recorded:g} s, last used by a claim {max(0, idle) / 1000:.1f}"
                f" s ago: use the same value on every instance; to change it, stop every instance "
                f"using {recorded:g} s and wait {mine:g} s + {2 * _TOL // 1000} s "
                f"({wait_ms / 1000:g} s after their last claim), or use another anarchon_namespace")
    elif claiming and now - note.memory_used_ms >= MEMORY_USE_STEP_MS:  # 4.
        note.memory_used_ms = now
    return MemoryStart(note.born_ms, detail, conflict)


def fences(space: Space, names: Iterable[str], now: int) -> dict[str, Fence]:
    """The entries' fences, a missing one created: its memory starts at the store-wide memory
    start when the namespace has one (its memory is intact: nothing of the entry can have been
    lost), else now."""
    born = space.note.born_ms if space.note is not None else now
    return {name: space.fences.setdefault(name, Fence(born)) for name in names}


def memory_start(fence: Fence, start: MemoryStart) -> int:
    """An entry's effective memory start: ``max(entry's, store-wide)`` (docs/design.md "Amnesia")."""
    return max(fence.born_ms, start.born_ms)


def since(fence: Fence, start: MemoryStart, otherwise: str = "") -> str:
    """Why the entry's memory began when it did, for a refusal: the note's detail when the
    store-wide start is the effective one, else ``otherwise``."""
    return start.detail if memory_start(fence, start) == start.born_ms else otherwise
