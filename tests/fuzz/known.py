"""Findings already known and being fixed on their own branch (pinned in
tests/test_fuzz_findings.py): the properties skip the inputs that reach them, so that they keep
finding others. Each filter names its finding; delete a filter once its fix is in.

A filter looks at the input, never at the outcome: a new failure on other input is never hidden.
"""
from __future__ import annotations

import os
import sys

#: finding -> the filter's description (for the report of what is still filtered)
FINDINGS: dict[str, str] = {}


def _walk(value, depth=0):
    """Every value inside ``value`` (dict keys too), bounded in depth."""
    yield value
    if depth > 50:
        return
    if isinstance(value, dict):
        for k, v in list(value.items()):
            yield from _walk(k, depth + 1)
            yield from _walk(v, depth + 1)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for v in list(value):
            yield from _walk(v, depth + 1)
    else:
        for attr in ("run_every", "_orig_minute", "_orig_hour", "_orig_day_of_week",
                     "_orig_day_of_month", "_orig_month_of_year", "lat", "lon", "event"):
            if hasattr(value, attr) and not isinstance(value, (str, bytes, int, float)):
                yield from _walk(getattr(value, attr), depth + 1)


def _has_surrogate(value) -> bool:
    return isinstance(value, str) and any("\ud800" <= c <= "\udfff" for c in value)


def surrogates(*values) -> str | None:
    """Finding: lone surrogates in names / task / by."""
    if any(_has_surrogate(v) for value in values for v in _walk(value)):
        return "lone surrogates in names/task/by"
    return None


def non_text_by(by) -> str | None:
    if by is not None and not isinstance(by, str):
        return "non-text by="
    return None


def none_name(name) -> str | None:
    """Finding: pause(None)/run_now(None); while it is open, every name that is no string (the
    same check at the same boundary: resume(5349) raised TypeError in difflib)."""
    if not isinstance(name, str):
        return "pause(None)/run_now(None)"
    return None


def huge_ints(*values) -> str | None:
    """Finding: 10**400 ints (past a float's range) anywhere."""
    for value in values:
        for v in _walk(value):
            if isinstance(v, int) and not isinstance(v, bool) and abs(v) > sys.float_info.max:
                return "10**400 ints"
    return None


def crontab_bools(*values) -> str | None:
    """Finding: crontab(minute=False) (a bool in a crontab field)."""
    from celery.schedules import crontab
    for value in values:
        for v in _walk(value):
            if isinstance(v, crontab) and any(isinstance(getattr(v, f"_orig_{k}", None), bool)
                                              for k in ("minute", "hour", "day_of_week",
                                                        "day_of_month", "month_of_year")):
                return "crontab(minute=False)"
            if isinstance(v, dict) and isinstance(v.get("crontab"), dict) and any(
                    isinstance(x, bool) for x in v["crontab"].values()):
                return "crontab(minute=False)"
    return None


def nul_on_postgres(kind: str, *values) -> str | None:
    if kind == "postgresql" and any(isinstance(v, str) and "\x00" in v
                                    for value in values for v in _walk(value)):
        return "NUL in text on PostgreSQL"
    return None


def malformed_raw() -> str:
    """Finding: invalid UTF-8 / malformed stored records on SQLite/Redis (a raw write)."""
    return "invalid UTF-8 / malformed stored definitions on SQLite/Redis"


def beat_schedule_shape(beat_schedule) -> str | None:
    """Findings: beat_schedule not a dict / item not dict / options not dict / int names /
    bytes task / args not list."""
    if not isinstance(beat_schedule, dict):
        return "beat_schedule not a dict"
    for name, item in beat_schedule.items():
        if not isinstance(name, str):
            return "int names"
        if not isinstance(item, dict):
            return "item not dict"
        if "options" in item and not isinstance(item["options"], dict):
            return "options not dict"
        if "task" in item and not isinstance(item["task"], str):
            return "bytes task (while open: any task that is no string; int: status's table)"
        if "args" in item and not isinstance(item["args"], (list, tuple)):
            return "args not list"
    return None


def line_break_action(name) -> str | None:
    if isinstance(name, str) and any(c in name for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"):
        return "page action on a name with a line break"
    return None


def first(*found: str | None) -> str | None:
    """The first finding named, else ``None`` (always ``None`` with ``ANARCHON_FUZZ_KNOWN=0``:
    to see whether a filter's finding is fixed)."""
    if os.environ.get("ANARCHON_FUZZ_KNOWN") == "0":
        return None
    return next((f for f in found if f), None)
