"""The names an operator gives, and who makes a change (:mod:`celery_anarchon.operate.schedules`,
the command line, the status page).

Every name given is normalized to Unicode NFC (:func:`celery_anarchon.limits.entry_name`), as beat
normalizes the names of ``beat_schedule``.
"""
from __future__ import annotations

import difflib
import getpass
import os
import socket
import unicodedata
from collections.abc import Iterable
from typing import Any

from celery_anarchon import limits
from celery_anarchon.errors import ConfigError


def check_name(name: str) -> str:
    """The name of an entry written to the store (added, paused, run now), in Unicode NFC.
    Refused: empty or whitespace only, longer than 200 characters (one limit on every store), or
    holding a control character, a line break or an invisible format character (``\n``,
    ``\x1b``, U+2028, U+202E, U+200B, ...): it would break or disguise tables, logs and the
    status page's buttons (:func:`celery_anarchon.limits.entry_name`).

    :returns: the NFC form of ``name``.
    :raises ConfigError: naming the rule, the character (escaped) and the fix.
    """
    return limits.entry_name(name)


def normal_name(name: Any) -> Any:
    """The NFC form of a name given to find an entry (a name that is no string: as given)."""
    return unicodedata.normalize("NFC", name) if isinstance(name, str) else name


def given_name(name: Any) -> str:
    """The NFC form of a name given to find an entry (get, update, resume, remove): any non-empty
    text (a name an older version stored under other rules is still found).

    :raises ConfigError: ``name`` is not a non-empty string.
    """
    if not isinstance(name, str) or not name:
        raise ConfigError(f"entry name {limits.shown_value(name)}: not a non-empty string; fix: "
                          "name the entry (celery anarchon list shows the names)")
    return unicodedata.normalize("NFC", name)


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` naming the known name closest to ``name``, else ``""`` (for the
    error of an unknown entry or task)."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def by_text(by: Any, name: str | None = None) -> str:
    """``by`` (who makes a change, to the entry ``name``) checked: text every store can hold
    (:func:`celery_anarchon.limits.plain_text`)."""
    label = "by" if name is None else f"entry {limits.shown(name)}: by"
    return limits.plain_text(by, label, "give who makes the change as text, e.g. "
                             "'ops@example.com', or leave it out (user@host:pid)")


def default_by() -> str:
    """``user@host:pid``: who made a change, when the caller does not say."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (containers)
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}:{os.getpid()}"

