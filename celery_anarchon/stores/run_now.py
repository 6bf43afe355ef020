"""The rules of run-now requests that every entry store keeps
(:meth:`~celery_anarchon.stores.entry_store.Entries.request_run`), in one place: the SQL stores
run them in Python inside their transaction, the Redis scripts follow them in Lua.

* **The slot.** The store chooses it inside the atomic write that records the request: its
  clock's now, moved 1 ms later while it is one of the entry's scheduled slots (the caller sends
  them: :class:`SlotWindow`, a store cannot compute schedules) or the slot of another request of
  the entry; so two requests never share a claim, and none shares a scheduled run's.
* **Request ids.** A new id is a UUIDv7 (RFC 9562) whose time is the store's clock
  (:func:`new_request_id`); :func:`request_id_ms` reads the time back. The store keeps every
  request for the caller's retention (``anarchon_request_retention``) and vouches for the ids
  made since its memory of requests began (:class:`RequestClock`): an id that carries its time
  and was made before is refused (:func:`request_refusal`), never run again. An id that carries
  no time is one run while the store holds it.

Units: UTC integer milliseconds, the store's clock.
"""
from __future__ import annotations

import dataclasses
import os
import re
import uuid
from typing import ClassVar

from celery_anarchon._util import LATENESS_TOLERANCE_MS, iso
from celery_anarchon.errors import ConfigError, RequestRefused, StoreError
from celery_anarchon.schedule.slots import SlotSchedule, SlotsEnded


#: how far past the store's clock a run-now slot may move to avoid the entry's scheduled slots
#: and its other requests' slots, ms
EXTRA_SLOT_SEARCH_MS = 1000


@dataclasses.dataclass(frozen=True)
class SlotWindow:
    """The scheduled slots of one entry from ``start_ms`` to ``end_ms`` (both included), as the
    caller's plan gives them (a store cannot compute schedules): the store chooses a run-now
    slot in it, never one of ``scheduled``.

    :param start_ms: the first instant covered, UTC ms (at most the store's clock at the write).
    :param end_ms: the last instant covered, UTC ms.
    :param scheduled: the entry's scheduled slots in ``start_ms .. end_ms``.
    """

    start_ms: int
    end_ms: int
    scheduled: frozenset[int] = frozenset()

    #: a window starts this long before the store's clock, and ends this long after it, ms
    BEFORE_MS: ClassVar[int] = 5_000
    AFTER_MS: ClassVar[int] = 60_000
    #: the most scheduled slots a window lists (a denser entry's window ends at the last one)
    MAX_SLOTS: ClassVar[int] = 2 * EXTRA_SLOT_SEARCH_MS

    @classmethod
    def around(cls, slots: SlotSchedule, now_ms: int) -> SlotWindow:
        """The window of an entry's slots around ``now_ms`` (the store's clock): from
        :attr:`BEFORE_MS` before to :attr:`AFTER_MS` after, or to the :attr:`MAX_SLOTS`-th
        scheduled slot if it comes first (the call that writes the request must reach the store
        within it, or it is computed again).

        :param slots: the entry's slots (its plan's).
        :param now_ms: UTC ms.
        """
        start, end = now_ms - cls.BEFORE_MS, now_ms + cls.AFTER_MS
        scheduled: list[int] = []
        try:
            slot = slots.next_after(start - 1)
            while slot <= end:
                scheduled.append(slot)
                if len(scheduled) == cls.MAX_SLOTS:
                    end = slot
                    break
                slot = slots.next_after(slot)
        except SlotsEnded:             # past the entry's end_at: no scheduled slot is left
            pass
        return cls(start, end, frozenset(scheduled))

    def covers(self, now_ms: int) -> bool:
        """Whether a slot can be chosen from ``now_ms`` on within the window."""
        return self.start_ms <= now_ms <= self.end_ms

    def choose(self, now_ms: int, taken: set[int] | frozenset[int]) -> int | None:
        """The first instant from ``now_ms`` on, within the window and :data:`EXTRA_SLOT_SEARCH_MS`,
        that is neither scheduled nor in ``taken`` (other requests' slots); ``None`` if none.
        The reference the SQL stores run and the Redis scripts follow."""
        for slot in range(now_ms, min(self.end_ms, now_ms + EXTRA_SLOT_SEARCH_MS - 1) + 1):
            if slot not in taken and slot not in self.scheduled:
                return slot
        return None


class SlotWindowPassed(StoreError):
    """The store's clock at the write was outside the :class:`SlotWindow` the caller computed
    (the call took longer than the window, or the clock moved): nothing was written; compute
    the window again and repeat."""


def no_free_slot(entry: str) -> ConfigError:
    """The error of an entry with no free millisecond in :data:`EXTRA_SLOT_SEARCH_MS` past now."""
    return ConfigError(f"entry {entry!r}: no millisecond within {EXTRA_SLOT_SEARCH_MS} ms of now "
                       "is free of its scheduled slots and other run-now requests; fix: wait for "
                       "its next run instead")


# -- request ids ---------------------------------------------------------------------------------

#: a UUIDv7 (RFC 9562 section 5.7) in its canonical text form: the id of a request that carries
#: its creation time (UTC ms, the first 48 bits)
_UUID7 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
                    re.IGNORECASE)


def new_request_id(now_ms: int) -> str:
    """A new run-now request id: a UUIDv7 (RFC 9562 section 5.7) whose time is ``now_ms`` (the
    store's clock, so that the store can tell whether it still holds every request made since)
    and whose other 74 bits are random (:func:`os.urandom`).

    :param now_ms: UTC ms, 0 .. 2**48 - 1.
    :returns: the canonical lower-case text, 36 characters.
    """
    random = int.from_bytes(os.urandom(10), "big")
    value = ((int(now_ms) & (1 << 48) - 1) << 80 | 0x7 << 76 | (random >> 62 & 0xFFF) << 64
             | 0b10 << 62 | random & (1 << 62) - 1)
    return str(uuid.UUID(int=value))


def request_id_ms(request_id: str) -> int | None:
    """The creation time of a request id that carries one (a UUIDv7 in canonical text form,
    either case), UTC ms; ``None`` for any other id (``"ticket-4711"``, a UUIDv4): an opaque id,
    one run for as long as the store holds it."""
    if not isinstance(request_id, str) or not _UUID7.fullmatch(request_id):
        return None
    return int(request_id[:8] + request_id[9:13], 16)


@dataclasses.dataclass(frozen=True)
class RequestClock:
    """What a store tells before a request id is made (:meth:`Entries.request_clock`).

    An id may be made up to the lateness tolerance ahead of the store's clock, so the store
    vouches for the ids made from ``born_ms`` + that tolerance on (one made earlier may have been
    written, with its time ahead, just before the store lost it) and, after a prune of request
    ids, from ``pruned_ms`` on.

    :param now_ms: the store's clock, UTC ms.
    :param born_ms: when the store's memory began (the claims' memory start, docs/design.md
        "Amnesia": a new or wiped store, a new epoch), UTC ms.
    :param pruned_ms: the newest "now - retention" of a prune of request ids, UTC ms (0: none).
    """

    now_ms: int
    born_ms: int
    pruned_ms: int = 0

    def refusal(self, id_ms: int, retention_ms: int) -> str | None:
        """Why an id made at ``id_ms`` (UTC ms) is refused, or ``None``: :data:`OLDER_THAN_RETENTION`,
        :data:`BEFORE_MEMORY`, :data:`BEFORE_PRUNE` or :data:`AHEAD_OF_CLOCK`, in that order
        (the Redis script follows the same rule)."""
        if id_ms < self.now_ms - retention_ms:
            return OLDER_THAN_RETENTION
        if id_ms < self.born_ms + LATENESS_TOLERANCE_MS:
            return BEFORE_MEMORY
        if id_ms < self.pruned_ms:
            return BEFORE_PRUNE
        if id_ms > self.now_ms + LATENESS_TOLERANCE_MS:
            return AHEAD_OF_CLOCK
        return None

    def new_id(self) -> str:
        """A new request id (:func:`new_request_id`) the store vouches for: made at its clock's
        now, or at the first instant it vouches for when that is later (the first 10 s of a new
        memory: up to the tolerance ahead)."""
        return new_request_id(max(self.now_ms, self.born_ms + LATENESS_TOLERANCE_MS,
                                  self.pruned_ms))


#: why a store refuses a request id (:meth:`RequestClock.refusal`, :func:`request_refusal`)
OLDER_THAN_RETENTION, BEFORE_MEMORY, BEFORE_PRUNE, AHEAD_OF_CLOCK = (
    "retention", "memory", "pruned", "ahead")


def request_refusal(entry: str, request_id: str, why: str, *, id_ms: int, clock: RequestClock,
                    retention_ms: int) -> RequestRefused:
    """The error of a request id the store can no longer vouch for (nothing was written): the
    id, when it was made, why, and the fix.

    :param why: :meth:`RequestClock.refusal`'s answer.
    :param id_ms: when the id was made (:func:`request_id_ms`), UTC ms.
    :param clock: the store's clock and memory start at the refusal.
    """
    made = f"run-now request {request_id!r} of entry {entry!r} was made at {iso(id_ms)}"
    unknown = ("the store cannot tell whether it ran, so it is refused rather than run a second "
               "time; fix: look at the entry's history (celery anarchon history "
               f"{entry}) and, if it did not run, ask again without a request id (a new request)")
    tol_s = LATENESS_TOLERANCE_MS // 1000
    if why == OLDER_THAN_RETENTION:
        return RequestRefused(f"{made}, more than anarchon_request_retention "
                              f"({retention_ms / 1000:g} s) before the store's clock "
                              f"({iso(clock.now_ms)}), longer than the store keeps request ids: "
                              f"{unknown}")
    if why == BEFORE_MEMORY:
        return RequestRefused(f"{made}, before the store's memory of run-now requests began at "
                              f"{iso(clock.born_ms)} (+ {tol_s} s for an id made ahead of its "
                              "clock): the store is new, lost its data or changed server since "
                              f"(docs/design.md, \"Amnesia\"); {unknown}")
    if why == BEFORE_PRUNE:
        return RequestRefused(f"{made}, before {iso(clock.pruned_ms)}: the store pruned the request "
                              "ids made before then (a process with a shorter "
                              f"anarchon_request_retention wrote a request since); {unknown}")
    return RequestRefused(f"{made}, more than {tol_s} s after the store's clock "
                          f"({iso(clock.now_ms)}): the clock that made it is wrong; fix: make "
                          "request ids with Schedules.new_request_id() (the store's clock), or "
                          "give an id of your own that is not a UUIDv7")
