"""The bounds every input is held to, and the checks of them that every boundary shares (the
schedules API, the command line, ``beat_schedule`` at start-up, a definition read back from the
store). The bottom layer with :mod:`celery_anarchon.errors`: it imports nothing else of ours.

================================  ======================  ====================================
bound                             value                   why
================================  ======================  ====================================
an entry's name                   200 characters (NFC)    one limit on every store (PostgreSQL
                                                          indexes at most about 2,700 bytes a
                                                          row); django-celery-beat's limit
a run-now request id              200 characters (NFC)    one limit on every store, which
                                                          index it with the entry's name
characters of a name (an id)      no Cc, Cf, Zl, Zp, Cs   a control or format character (U+202E
                                                          right-to-left override, U+200B zero
                                                          width space) hides or disguises a
                                                          name in every table and log; a lone
                                                          surrogate is no character: no store
                                                          can encode it
other text (a task's name, a      text, no NUL, no lone   PostgreSQL's text holds no NUL; no
pause reason, who: ``by``)        surrogate               store encodes a lone surrogate
a stored definition               65,536 bytes of JSON    every beat reads every definition at
                                                          each change of the store's entries
nesting of a definition's JSON    100 levels              refused before any parser recurses:
                                                          Python's json, and Celery's
                                                          serializers, stop near 1,000 frames
a slot, an anchor                 up to the end of 9999   dates, ISO 8601 times and the stores'
                                                          clocks end there
a duration (jitter, max_late,     at most 100 years       now + any duration stays a date for
lease, expires, ...)                                      the next 7,900 years, and fits a
                                                          store's 64-bit milliseconds
================================  ======================  ====================================
"""
from __future__ import annotations

import datetime
import unicodedata
from typing import Any

from celery_anarchon.errors import ConfigError

#: the longest entry name, in characters (after NFC normalization): every store
MAX_NAME_CHARS = 200
#: the longest run-now request id, in characters (after NFC normalization): every store
MAX_REQUEST_ID_CHARS = 200
#: the Unicode categories a name (and a request id) may not hold: control, format, line and
#: paragraph separators, and lone surrogates (half of a UTF-16 pair: no store can encode one)
REFUSED_CATEGORIES = ("Cc", "Cf", "Zl", "Zp", "Cs")
#: the largest stored definition: bytes of its canonical JSON (ASCII: a character is a byte)
MAX_DEFINITION_BYTES = 65_536
#: the deepest nesting of lists and objects within a definition (the definition itself is 1)
MAX_DEPTH = 100
#: the first instant a date holds: 0001-01-01T00:00:00Z, UTC ms since the Unix epoch
FIRST_MS = -62_135_596_800_000
#: the last instant a slot can be: 9999-12-31T23:59:59.999Z, UTC ms since the Unix epoch
LAST_SLOT_MS = 253_402_300_799_999
#: :data:`LAST_SLOT_MS` in whole seconds
LAST_SLOT_S = LAST_SLOT_MS // 1000
#: the longest duration of any setting or option, seconds: 100 Julian years
MAX_DURATION_S = 3_155_760_000
_MS_PER_YEAR = 365.2425 * 86_400_000
_DAYS_TO_1970 = 719_162                 # 0001-01-01 to 1970-01-01 (proleptic Gregorian)
_DAYS_PER_400_YEARS = 146_097
_SHOWN_CHARS = 40
_SURROGATE = ("holds the lone surrogate U+{:04X} (half of a UTF-16 pair, not a character: no "
              "store can encode it to UTF-8)")


def shown(name: str) -> str:
    """``repr(name)``, cut to its first 40 characters (a name of 3,000 must not fill the
    screen)."""
    return repr(name) if len(name) <= _SHOWN_CHARS else repr(name[:_SHOWN_CHARS]) + "..."


def entry_name(name: Any) -> str:
    """An entry's name checked and normalized to Unicode NFC, the form every boundary uses (the
    schedules API, the command line, ``beat_schedule``): ``café`` typed on two keyboards is one
    entry, whose pause stops it.

    :returns: the NFC form of ``name``.
    :raises ConfigError: not a string, empty or whitespace only, longer than
        :data:`MAX_NAME_CHARS` characters, or holding a character of :data:`REFUSED_CATEGORIES`
        (naming it, escaped, and the fix).
    """
    if not isinstance(name, str) or not name:
        raise unnamed(name)
    return _visible_text(
        name, "entry name", noun="a name", example="'nightly-report'",
        empty_fix="give the entry a name of visible characters",
        limit_why="the limit of every store, as django-celery-beat's",
        long_fix="give a shorter name (details belong in args or kwargs)")


def unnamed(name: Any) -> ConfigError:
    """The error of an entry name that is not a non-empty string (naming it and the fix)."""
    return ConfigError(f"entry name {name!r}: not a non-empty string; fix: name the entry")


def request_id(value: Any, entry: str) -> str:
    """A run-now request id checked and normalized to Unicode NFC, with the rules of an entry's
    name (:func:`entry_name`): at most :data:`MAX_REQUEST_ID_CHARS` characters, none of
    :data:`REFUSED_CATEGORIES`, something visible. An id is shown in tables, logs, the status
    page and a printed command line, kept with the entry's name in every store (one limit on
    every store), and ``ticket-4711`` typed on two keyboards is one request.

    :param entry: the entry's name (checked), named in the message.
    :returns: the NFC form of ``value``.
    :raises ConfigError: naming the entry, the id (escaped, cut to 40 characters) and the fix.
    """
    label = f"entry {shown(entry)}: run-now request id"
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{label} {shown_value(value)}: not a non-empty string; fix: give text "
                          "such as 'ticket-4711', or no id (a new one is made and printed)")
    return _visible_text(
        value, label, noun="an id", example="'ticket-4711'", limit=MAX_REQUEST_ID_CHARS,
        empty_fix="give an id of visible characters such as 'ticket-4711', or no id (a new one "
                  "is made and printed)",
        limit_why="the limit of every store",
        long_fix="give a shorter id (a ticket number, a UUID), or no id (a new one is made and "
                 "printed)")


def _visible_text(text: str, label: str, *, noun: str, example: str, empty_fix: str,
                  limit_why: str, long_fix: str, limit: int = MAX_NAME_CHARS) -> str:
    """``text`` in NFC, checked as a name is (:func:`entry_name`); the messages start with
    ``label`` and the text (escaped, cut to 40 characters)."""
    if text.isascii() and text.isprintable() and len(text) <= limit and text.strip():
        return text                     # the common case, at once: NFC already, no Cc or Cf
    normal = unicodedata.normalize("NFC", text)
    if not normal.strip():
        raise ConfigError(f"{label} {shown(text)}: empty or whitespace only; fix: {empty_fix}")
    if len(normal) > limit:
        raise ConfigError(f"{label} {shown(normal)}: {len(normal):,} characters, more than "
                          f"{limit} ({limit_why}); fix: {long_fix}")
    for char in normal:
        category = unicodedata.category(char)
        if category not in REFUSED_CATEGORIES:
            continue
        if category == "Cs":
            raise ConfigError(f"{label} {shown(normal)}: {_SURROGATE.format(ord(char))}; fix: use "
                              f"visible characters and spaces only (e.g. {example})")
        if category == "Cf":
            what = unicodedata.name(char, "a format character")
            raise ConfigError(f"{label} {shown(normal)}: holds the invisible format character "
                              f"U+{ord(char):04X} ({what}), which hides or disguises {noun} in "
                              "tables and logs; fix: use visible characters and spaces only "
                              f"(e.g. {example})")
        raise ConfigError(f"{label} {shown(normal)}: holds the control character {char!r} "
                          f"(U+{ord(char):04X}); fix: use visible characters and spaces only "
                          f"(e.g. {example})")
    return normal


def plain_text(value: Any, label: str, fix: str) -> str:
    """Text every store can hold: a ``str`` without NUL (PostgreSQL's text refuses it) and
    without a lone surrogate (no store encodes one to UTF-8). For a task's name, a pause reason,
    who made a change (``by``).

    :param label: what the text is, first in the message (``"entry 'e': reason"``).
    :param fix: the message's fix.
    :returns: ``value``.
    :raises ConfigError: naming ``label``, the value (cut to 40 characters) and ``fix``.
    """
    if not isinstance(value, str):
        raise ConfigError(f"{label} {shown_value(value)}: not text; fix: {fix}")
    if value.isascii() and "\x00" not in value:
        return value                    # the common case, at once
    if "\x00" in value:
        raise ConfigError(f"{label} {shown(value)}: holds the NUL character (U+0000), which "
                          f"PostgreSQL's text cannot hold; fix: {fix}")
    for char in value:
        if "\ud800" <= char <= "\udfff":
            raise ConfigError(f"{label} {shown(value)}: {_SURROGATE.format(ord(char))}; fix: {fix}")
    return value


def undecodable(text: str) -> str | None:
    """Why ``text`` is not valid Unicode, or None: a store's reader decodes bytes that are not
    UTF-8 (a hand edit, another program) with ``surrogateescape``, each bad byte a lone surrogate
    U+DC80..U+DCFF, so that the read works and the value is refused where it is used."""
    if text.isascii():
        return None
    for index, char in enumerate(text):
        if "\udc80" <= char <= "\udcff":
            return (f"is not valid UTF-8 (the byte 0x{ord(char) - 0xDC00:02x} at character "
                    f"{index})")
        if "\ud800" <= char <= "\udfff":
            return f"holds the lone surrogate U+{ord(char):04X} at character {index}"
    return None


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether lists, tuples and dicts nest in ``value`` more than ``limit`` levels (``value``
    itself is level 1), found without recursion; a value that holds itself counts as too deep."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, (dict, list, tuple)))
    return False


def text_too_deep(text: str | bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether the JSON ``text`` nests arrays and objects more than ``limit`` levels, found
    without parsing it (so before any parser recurses). Text with no more brackets than
    ``limit`` is answered by counting them alone."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    if text.count("[") + text.count("{") <= limit:
        return False
    depth, in_string, escaped = 0, False, False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth -= 1
    return False


def year_of(ms: int | float) -> str:
    """The year of an instant in UTC ms since the Unix epoch, as text (``"33658"``), for a
    message about an instant past :data:`LAST_SLOT_MS`: exact in the proleptic Gregorian
    calendar (``datetime`` stops at 9999; the calendar repeats every 400 years), and in
    365.2425-day years, to three digits, beyond 10**20 ms."""
    if abs(ms) > 1e20:                  # (and a float that large has no exact day)
        return f"{1970 + ms / _MS_PER_YEAR:.3g}"
    days = int(ms // 86_400_000) + _DAYS_TO_1970      # days since 0001-01-01
    cycles, day = divmod(days, _DAYS_PER_400_YEARS)    # the calendar repeats every 400 years
    return str(400 * cycles + (datetime.date(1, 1, 1) + datetime.timedelta(days=day)).year)


def duration_bound(maximum: float) -> str:
    """How a message states a bound of seconds: ``3155760000 s (100 years)``."""
    text = f"{maximum:.0f}" if float(maximum).is_integer() else f"{maximum:g}"
    if maximum == MAX_DURATION_S:
        return f"{text} s (100 years)"
    if maximum == LAST_SLOT_S:
        return f"{text} s (the end of the year 9999, in seconds since the Unix epoch)"
    return f"{text} s"


def shown_value(value: Any) -> str:
    """``repr(value)``, cut to 40 characters (an int of 400 digits must not fill the screen)."""
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS - 3] + "..."


def object_repr(value: Any) -> str:
    """``repr(value)`` of an object the user gave (a schedule, an option), or, when the object's
    own ``__repr__`` raises, its class and that error: Celery's ``schedule`` keeps a Decimal
    period as given, and its repr then raises AttributeError (``total_seconds``). The object is
    shown, never a traceback, wherever a definition or an error names it.

    :returns: the repr, e.g. ``'<freq: 5.00 seconds>'``, or ``'<schedule object (its repr
        raised AttributeError: ...)>'``.
    """
    try:
        return repr(value)
    except Exception as exc:  # a foreign object's __repr__: any error is its own
        return f"<{type(value).__qualname__} object (its repr raised {type(exc).__name__}: {exc})>"


__all__ = ["MAX_NAME_CHARS", "MAX_REQUEST_ID_CHARS", "REFUSED_CATEGORIES", "MAX_DEFINITION_BYTES",
           "MAX_DEPTH", "LAST_SLOT_MS", "LAST_SLOT_S", "MAX_DURATION_S", "entry_name", "request_id",
           "plain_text", "undecodable",
           "shown", "too_deep", "text_too_deep", "year_of", "duration_bound", "shown_value",
           "object_repr"]
