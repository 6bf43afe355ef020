"""The log's times in one zone (docs/with-django.md "The log's times"): every instant a log line of
ours gives goes through ``log_time`` (the zone of the log's own timestamps, with its offset),
never ``iso`` (UTC, kept for the store's history and the views)."""
from __future__ import annotations

import ast

from celery_anarchon._util import log_time
from paths import PACKAGE

_LOG_CALLS = {"debug", "info", "warning", "error", "exception", "critical", "log"}


def _log_calls_with_iso(tree: ast.AST):
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name not in _LOG_CALLS:
            continue
        for arg in node.args:
            for inner in ast.walk(arg):
                if isinstance(inner, ast.Call) and getattr(inner.func, "id", None) == "iso":
                    yield node.lineno


def test_log_lines_give_instants_in_the_log_zone():
    """No log call of the package (beat, stores, worker, ...) formats an instant with ``iso``."""
    found = [f"{path.relative_to(PACKAGE)}:{line}"
             for path in sorted(PACKAGE.rglob("*.py"))
             for line in _log_calls_with_iso(ast.parse(path.read_text()))]
    assert found == []


def test_log_time_never_raises():
    """An instant outside the years 1 to 9999 (a value an older version stored) is shown as its
    count of ms, as ``iso`` shows it."""
    assert log_time(10**18) == "1000000000000000000 ms since the Unix epoch"
