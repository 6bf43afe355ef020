"""Instants of the status data as an operator reads them: relative to a "now" (``12 s ago``,
``in 3 min``; ``status`` and the status page) and whole in a zone (the page's tooltips, the
entry's zone).

The status page's script moves its relative times on with the same rule (``relative`` in
``templates/status.html``): a change here is a change there.
"""
from __future__ import annotations

import datetime

from celery_anarchon.schedule.zones import iana_zone


def to_ms(text: str | None) -> int | None:
    """UTC ms of an ISO 8601 instant of the status data, ``None`` for none or a value that is
    no instant (an older version's)."""
    if not text or not isinstance(text, str):
        return None
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return round(when.timestamp() * 1000)


def span(seconds: float) -> str:
    """A duration in the unit an operator reads at a glance, rounded half to even: under 90 s
    in seconds (``12 s``), under 90 min in minutes, under 36 h in hours, else days (``4 d``)."""
    seconds = round(abs(seconds))
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    if seconds < 36 * 3600:
        return f"{round(seconds / 3600)} h"
    return f"{round(seconds / 86400)} d"


def relative(text: str | None, now_ms: int) -> str:
    """An ISO 8601 instant of the status data as the time from ``now_ms`` (UTC ms): ``12 s
    ago``, ``in 3 min``, ``2 h ago``, ``in 4 d`` (:func:`span`); ``-`` for none; the text as it
    is when it is no instant."""
    at_ms = to_ms(text)
    if at_ms is None:
        return text or "-"
    words = span(abs(at_ms - now_ms) / 1000)
    return f"in {words}" if at_ms > now_ms else f"{words} ago"


def absolute(text: str | None, zone: str | None = None) -> str:
    """An ISO 8601 instant whole, to the second: ``2026-03-29 01:00:00 UTC``, and in ``zone``
    (an IANA name) as well when it is another: ``2026-03-29 03:00:00 CEST (Europe/Paris) ·
    2026-03-29 01:00:00 UTC``. The text as it is when it is no instant; a zone this host does
    not know is left out."""
    at_ms = to_ms(text)
    if at_ms is None:
        return "" if text is None else str(text)
    try:
        utc = datetime.datetime.fromtimestamp(at_ms / 1000, datetime.timezone.utc)
    except (OverflowError, ValueError, OSError):   # no instant this host can hold
        return str(text)
    whole = f"{utc:%Y-%m-%d %H:%M:%S} UTC"
    local = _zone(zone)
    if local is None:
        return whole
    try:
        there = utc.astimezone(local)
    except (OverflowError, ValueError):   # past the year 9999 there
        return whole
    return f"{there:%Y-%m-%d %H:%M:%S} {there.tzname()} ({zone}) · {whole}"


def zone_time(text: str | None, zone: str | None) -> str:
    """An ISO 8601 instant to the second in ``zone`` (an IANA name), as the entry page lists an
    entry's next slots: ``2026-03-29 03:00:00 CEST``; in UTC (``... UTC``) when the zone is UTC,
    one this host does not know, or cannot hold the instant (past the year 9999 there). The text
    as it is when it is no instant."""
    whole = absolute(text)
    local = _zone(zone)
    at_ms = to_ms(text)
    if local is None or at_ms is None:
        return whole
    try:
        utc = datetime.datetime.fromtimestamp(at_ms / 1000, datetime.timezone.utc)
        there = utc.astimezone(local)
    except (OverflowError, ValueError, OSError):
        return whole
    return f"{there:%Y-%m-%d %H:%M:%S} {there.tzname()}"


def _zone(name: str | None) -> datetime.tzinfo | None:
    """The zone of an IANA ``name``; ``None`` for UTC, none, or one this host does not know."""
    if name in ("UTC", "Etc/UTC", ""):
        return None
    return iana_zone(name)
