"""Whether an entry is overdue: the rule behind the ``overdue`` state of ``status``, the status
page, ``/api/status`` and ``check --overdue``.

An entry's **newest due slot** is its newest slot whose deadline has passed: slot + jitter +
max_late (the entry's plan) at or before "now" (the store's clock, where the overview reads it).
By then the slot has a record in the store's history if any instance handled it: a claim (sent,
claimed, ...), a skip (late, paused, forgotten, ...) or a failure (send_failed, ...). The entry
is **overdue** when that slot has no record and the store can vouch for it:

* the slot is within the store's memory (``Memory.duration_s`` before now), and the history the
  store keeps of the entry (``history_size`` runs) reaches back to it;
* the entry existed at that slot: the history holds a record of an older slot of it, or it is a
  store entry last changed at or before the slot. A new entry whose first due slot came before
  any instance ran it is not overdue.

Where the store cannot vouch, the slot's ``state`` is ``"unknown"`` with the reason: never an
alarm. Paused entries are never overdue (their slots are recorded ``paused``), nor entries that
break a rule (they have no plan), nor any entry of a store that cannot be read.

Pure: no I/O; the caller reads the history (:func:`needs_more` says when the runs it read do not
reach the slot).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from celery_anarchon._util import Memory, iso
from celery_anarchon.schedule.plan import EntryPlan
from celery_anarchon.schedule.slots import SlotsEnded
from celery_anarchon.stores.base import HistoryRecord

#: ``due.state``: the slot has a record; it has none and the store vouches for it; cannot tell
RECORDED, OVERDUE, UNKNOWN = "recorded", "overdue", "unknown"
#: how far back the newest due slot is looked for when the store's memory has no time limit
MAX_LOOKBACK_MS = 400 * 86_400_000


def due_slot(plan: EntryPlan, now_ms: int, *, floor_ms: int | None = None) -> int | None:
    """The newest slot of ``plan`` whose deadline (slot + jitter + max_late) is at or before
    ``now_ms`` (UTC ms), looked for back to ``floor_ms`` (default :data:`MAX_LOOKBACK_MS` before
    now); ``None`` when there is none there, or the schedule cannot say (a slot past the year
    9999, a schedule class's error). An entry's start_at / end_at bound it: an entry that ended
    has its last slot before end_at as its newest due slot.

    A window that doubles from the shortest gap finds a slot, then a bisection the newest one: a
    few ``next_after`` calls for an interval, at most about 40 for a sparse cron."""
    cutoff = now_ms - plan.jitter_ms - plan.max_late_ms
    floor = now_ms - MAX_LOOKBACK_MS if floor_ms is None else floor_ms

    def next_after(after_ms: int) -> float:
        try:
            return plan.slots.next_after(after_ms)
        except SlotsEnded:              # past end_at: no slot, as one beyond the cutoff
            return math.inf
    try:
        step = max(int(plan.slots.shortest_gap_ms), 1_000)
        while True:
            start = max(cutoff - step, floor - 1)
            found = next_after(start)
            if found <= cutoff:
                break
            if start <= floor - 1:
                return None
            step *= 2
        if next_after(found) > cutoff:
            return found
        low, high = found, cutoff       # next_after(low) <= cutoff < next_after(high)
        while high - low > 1:
            middle = (low + high) // 2
            if next_after(middle) <= cutoff:
                low = middle
            else:
                high = middle
        return next_after(low)
    except Exception:   # ConfigError past the year 9999, a user schedule class's own error
        return None


def needs_more(history: Sequence[HistoryRecord], limit: int, slot_ms: int) -> bool:
    """Whether a read of at most ``limit`` runs (newest first) may have left out the record of
    ``slot_ms``: it was full and every run in it is newer."""
    return len(history) >= limit and all(r.slot_ms > slot_ms for r in history)


def judge(plan: EntryPlan, history: Sequence[HistoryRecord], now_ms: int, memory: Memory, *,
          complete: bool, changed_ms: int | None = None) -> dict | None:
    """The entry's newest due slot and what the store says of it (module docstring).

    :param plan: the entry's plan.
    :param history: its runs, newest first, reaching back to the slot unless ``complete`` is
        false.
    :param now_ms: "now", UTC ms (the store's clock where known).
    :param memory: the store's memory.
    :param complete: the runs are every run the store keeps of the entry back to the slot (a
        read of the ``history_size`` runs the store keeps, all newer, is not).
    :param changed_ms: a store entry's last change, store clock ms (``None``: a config entry).
    :returns: ``None`` when no slot is due in the lookback, or none can be within the
        store's memory (the entry's start_at lies within it, or its end_at before it), else ``{slot, deadline (ISO, or None
        when no slot is known), state (RECORDED, OVERDUE, UNKNOWN), event (the slot's record's, or
        None), late_s (seconds past the deadline), why (the reason of UNKNOWN, else None)}``.
    """
    floor = None if memory.duration_s is None else now_ms - int(memory.duration_s * 1000)
    slot = due_slot(plan, now_ms, floor_ms=floor)
    if slot is None:
        window = getattr(plan.slots, "window", None)       # start_at / end_at
        if floor is None or (window is not None and (
                (window.start_ms is not None and window.start_ms >= floor)  # none due yet
                or (window.end_ms is not None and window.end_ms < floor))):  # ended before it
            return None
        return {"slot": None, "deadline": None, "state": UNKNOWN, "event": None, "late_s": None,
                "why": f"no slot of it within the store's memory ({memory.duration_s:g} s)"}
    deadline = slot + plan.jitter_ms + plan.max_late_ms
    out = {"slot": iso(slot), "deadline": iso(deadline), "state": UNKNOWN, "event": None,
           "late_s": round((now_ms - deadline) / 1000, 3), "why": None}
    record = next((r for r in history if r.slot_ms == slot), None)
    if record is not None:
        out.update(state=RECORDED, event=record.event.value)
    elif not complete:
        out["why"] = (f"the store keeps {len(history)} runs of it (history_size), all newer "
                      "than this slot")
    elif not (any(r.slot_ms < slot for r in history)
              or (changed_ms is not None and changed_ms <= slot)):
        out["why"] = ("no run of it before this slot in the store's history: a new entry, or one "
                      "no instance ran yet")
    else:
        out["state"] = OVERDUE
    return out


def overdue_line(name: str, due: dict) -> str:
    """One overdue entry in words (``status``, ``check --overdue``)."""
    return (f"{name}: its newest due slot {due['slot']} has no record, {due['late_s']:g} s past "
            f"its deadline {due['deadline']} (slot + jitter + max_late)")


__all__ = ["due_slot", "needs_more", "judge", "overdue_line", "RECORDED", "OVERDUE", "UNKNOWN"]
