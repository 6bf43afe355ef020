"""The memory rule (docs/design.md "Timing"): the latest claim of a run must come before the store
forgets the first one, by time (``memory.duration_s``) and, for stores that remember a number of
runs per entry, by count (count x shortest gap). One check for each span it bounds: jitter +
max_late (:func:`celery_anarchon.schedule.timing.resolve`) and the window of ``catch_up='all'``
(:func:`celery_anarchon.schedule.catch_up.resolve`)."""
from __future__ import annotations

import math

from celery_anarchon._util import Memory
from celery_anarchon.errors import ConfigError


def _fmt(s: float) -> str:
    return f"{s:g} s"


def check_span(where: str, span_s: float, memory: Memory, shortest_gap_s: float, *, terms: str,
               count_terms: str, risk: str, count_risk: str, lower: str,
               count_lower: str) -> None:
    """Refuse a claim span ``span_s`` (seconds after the slot) the store may not remember.

    :param where: who it is, for the message (``entry 'x'``).
    :param terms: what adds up to the span, with values (``jitter 2 s + max_late 60 s``);
        ``count_terms``: the same in the count message.
    :param risk: who would win twice (``a claim arriving``); ``count_risk``: in the count message.
    :param lower: the fix other than a longer memory, by time (``lower max_late``);
        ``count_lower``: by count.
    :raises ConfigError: naming the span, the memory, its store option and the fix.
    """
    if memory.duration_s is not None and span_s >= memory.duration_s:
        raise ConfigError(
            f"{where}: {terms} = {_fmt(span_s)} must be less than the store's memory of a claimed "
            f"run ({_fmt(memory.duration_s)}, store option {memory.setting!r}): {risk} after the "
            f"store forgot the first one would win a second time. Fix: set "
            f"anarchon_store_options[{memory.setting!r}] to at least {math.ceil(span_s * 2):g}, "
            f"or {lower}.")
    if memory.count is not None and memory.count * shortest_gap_s <= span_s:
        need = math.floor(span_s / shortest_gap_s) + 1
        raise ConfigError(
            f"{where}: the store remembers at most {memory.count} runs per entry (store option "
            f"{memory.count_setting!r}); with {_fmt(shortest_gap_s)} between slots that is "
            f"{_fmt(memory.count * shortest_gap_s)}, not more than {count_terms} = {_fmt(span_s)}: "
            f"{count_risk} could win a run the store already forgot. Fix: set "
            f"anarchon_store_options[{memory.count_setting!r}] to at least {need * 2}, or "
            f"{count_lower}.")
