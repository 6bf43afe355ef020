"""The catch-up policy of an entry: which of the slots missed while no instance ran it are claimed
at start-up (docs/design.md "One run, in time", step 7; docs/timing.md "Catch-up").

* ``"newest"`` (the default): the newest slot still within max_late is claimed; older ones are
  skipped (late). One missed run at most is caught up, and a long outage never causes a burst.
* ``"all"``: every slot within ``catch_up_window`` seconds is claimed, oldest first, each as its
  own run (its own claim: no instance and no restart sends it twice), one every
  :func:`pace_s`. The window bounds how late a run of the entry may be claimed
  (:attr:`~celery_anarchon.schedule.plan.EntryPlan.claim_late_ms`), so the store must remember a
  claimed run for longer (the rules of :func:`resolve`).
* ``"none"``: at start-up the first slot claimed is the next one after now.

The rules, checked when beat starts (and where a store entry is written), for ``"all"``:

=================================================  ============================================
rule                                               why
=================================================  ============================================
catch_up_window > max_late                         max_late already claims that late
window + jitter + tolerance < store memory         a caught-up claim must still find the first
count x shortest gap > window + jitter + tolerance the same, for stores that remember a count
not leased                                         a leased run refuses to overlap the previous
=================================================  ============================================
"""
from __future__ import annotations

from typing import Any

from celery_anarchon._util import LATENESS_TOLERANCE_MS, Memory
from celery_anarchon._util import duration as seconds
from celery_anarchon.errors import ConfigError
from celery_anarchon.schedule.memory_rule import check_span

#: the policies, the default first
CATCH_UP_VALUES = ("newest", "all", "none")
DEFAULT_CATCH_UP = "newest"
#: ``anarchon_catch_up_window``, seconds: ten minutes covers a deploy that restarts every host or
#: a host's reboot, stays well inside the default memory (1 hour) of the lease stores, and its
#: catch-up takes at most ten minutes at one run a second
DEFAULT_CATCH_UP_WINDOW_S = 600.0
#: the longest pace between two caught-up runs of one entry, seconds (half the entry's shortest
#: gap if that is shorter: the catch-up then gains on the schedule at every step)
CATCH_UP_PACE_S = 1.0

_FIX_VALUE = ("'newest' (the default: the newest slot within max_late), 'all' (every slot "
              "within catch_up_window, oldest first, paced) or 'none' (nothing older than now)")


def pace_s(shortest_gap_s: float) -> float:
    """Seconds between two caught-up runs of an entry: ``min(CATCH_UP_PACE_S, shortest_gap_s /
    2)``. Shorter than the gap, so the lateness of the slots never grows along a catch-up: a slot
    inside the window when the catch-up starts stays inside it."""
    return min(CATCH_UP_PACE_S, shortest_gap_s / 2)


def check_policy(value: Any, where: str, fix_key: str) -> str:
    """``value`` as a catch-up policy.

    :param where: who gave it, for the message (``entry 'x': options['anarchon']['catch_up']``).
    :param fix_key: what the fix sets (``options['anarchon']['catch_up']``, ``anarchon_catch_up``).
    :raises ConfigError: not one of :data:`CATCH_UP_VALUES`, naming the value and the fix.
    """
    if isinstance(value, str) and value in CATCH_UP_VALUES:
        return value
    raise ConfigError(f"{where} = {value!r}: not a catch-up policy; fix: set {fix_key} to "
                      f"{_FIX_VALUE}")


def _fmt(s: float) -> str:
    return f"{s:g} s"


def resolve(name: str, ours: dict, *, default: str, default_window_s: float, jitter_s: float,
            max_late_s: float, shortest_gap_s: float, memory: Memory,
            leased: bool) -> tuple[str, float | None]:
    """The catch-up policy of entry ``name`` and its window, with the rules of this module.

    :param ours: the entry's ``options["anarchon"]`` (keys ``catch_up``, ``catch_up_window``).
    :param default: ``anarchon_catch_up``; ``default_window_s``: ``anarchon_catch_up_window``.
    :param jitter_s: the entry's jitter, ``max_late_s`` its max_late, ``shortest_gap_s`` the
        shortest gap between its slots (seconds).
    :param memory: the store's memory (docs/design.md store memory table).
    :param leased: whether the entry holds a lease on each of its runs.
    :returns: ``(policy, window_s)``; ``window_s`` is ``None`` unless the policy is ``"all"``.
    :raises ConfigError: a value that is no policy, a window given without ``"all"``, or a
        broken rule, naming the entry, the rule, the values and the fix.
    """
    where = f"entry {name!r}"
    if "catch_up" in ours:
        policy = check_policy(ours["catch_up"], f"{where}: options['anarchon']['catch_up']",
                              "options['anarchon']['catch_up']")
    else:
        policy = default
    if "catch_up_window" in ours:
        window_s = seconds(ours["catch_up_window"], f"{where}: options['anarchon']['catch_up_window']")
        source = "options['anarchon']['catch_up_window']"
        if policy != "all":
            raise ConfigError(
                f"{where}: catch_up_window {_fmt(window_s)} applies to catch_up='all' only, and "
                f"this entry's catch_up is {policy!r}; fix: remove catch_up_window, or set "
                "options['anarchon']['catch_up'] = 'all'")
    else:
        window_s, source = default_window_s, "anarchon_catch_up_window"
    if policy != "all":
        return policy, None
    if leased:
        raise ConfigError(
            f"{where}: catch_up='all' cannot go with a lease: a leased run is refused while an "
            "earlier run of the entry still holds its lease (overlapping), so the caught-up runs, "
            f"one every {_fmt(pace_s(shortest_gap_s))}, would be refused one after another. Fix: "
            "use catch_up='newest' (the default) or 'none' for this entry, or remove its lease.")
    if window_s <= max_late_s:
        raise ConfigError(
            f"{where}: catch_up_window {_fmt(window_s)} ({source}) must be greater than max_late "
            f"{_fmt(max_late_s)}: max_late already claims a slot that late. Fix: set "
            f"catch_up_window above {max_late_s:g} (e.g. {max(DEFAULT_CATCH_UP_WINDOW_S, 2 * max_late_s):g}), "
            "or use catch_up='newest'.")
    tolerance_s = LATENESS_TOLERANCE_MS / 1000
    terms = (f"catch_up_window {_fmt(window_s)} + jitter {_fmt(jitter_s)} + the store's lateness "
             f"tolerance {_fmt(tolerance_s)}")
    room_s = (memory.duration_s or 0) - jitter_s - tolerance_s
    count_room_s = (memory.count or 0) * shortest_gap_s - jitter_s - tolerance_s
    check_span(where, window_s + jitter_s + tolerance_s, memory, shortest_gap_s, terms=terms,
               count_terms=terms, risk="a slot caught up", count_risk="a caught-up slot",
               lower=f"shorten catch_up_window below {room_s:g}",
               count_lower=f"shorten catch_up_window below {count_room_s:g}")
    return policy, window_s


__all__ = ["CATCH_UP_PACE_S", "CATCH_UP_VALUES", "DEFAULT_CATCH_UP", "DEFAULT_CATCH_UP_WINDOW_S",
           "check_policy", "pace_s", "resolve"]
