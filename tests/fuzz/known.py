"""Findings already known and being fixed on their own branch (``findings``, pinned in
tests/test_fuzz_findings.py): the properties skip the inputs that reach them, so that they keep
finding others. Each filter names its finding; delete a filter once its fix is in (run with
``ANARCHON_FUZZ_KNOWN=0`` to see whether it still fails).

A filter looks at the input, never at the outcome: a new failure on other input is never hidden.
Fixed there and their filters deleted: a lone surrogate in add / update / pause / resume /
run-now / get, by= that is not text, a name that is not text, 10**400, crontab(minute=False),
a stored definition that is not UTF-8 (SQLite, Redis), beat_schedule of the wrong shape, a page
action on a name with a line break.
"""
from __future__ import annotations

import os

from celery_anarchon import limits


def _has_surrogate(value) -> bool:
    return isinstance(value, str) and any("\ud800" <= c <= "\udfff" for c in value)


def remove_surrogate(verb: str, name) -> str | None:
    """Finding "lone surrogates in names/task/by", still open for remove: remove('e\\ud800')
    raises UnicodeEncodeError from the store's driver (API and ``celery anarchon remove``)."""
    if verb == "remove" and _has_surrogate(name):
        return "lone surrogates in names/task/by (remove)"
    return None


def deep_redis_record(kind: str, role: str, raw: bytes) -> str | None:
    """Finding "malformed stored definitions on Redis", still open for a record nested past the
    recursion limit: ``_json_object`` (stores/redis/entries.py) json.loads it and RecursionError
    fails every read of the namespace (list, status, the page, beat's sync)."""
    if kind == "redis" and limits.text_too_deep(raw):
        return "malformed stored definitions on Redis (a record nested 5000 deep)"
    return None


def first(*found: str | None) -> str | None:
    """The first finding named, else ``None`` (always ``None`` with ``ANARCHON_FUZZ_KNOWN=0``:
    to see whether a filter's finding is fixed)."""
    if os.environ.get("ANARCHON_FUZZ_KNOWN") == "0":
        return None
    return next((f for f in found if f), None)
