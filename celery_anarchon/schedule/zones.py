"""Time zone helpers for the slot math in :mod:`celery_anarchon.schedule.slots`.

All instants are integer seconds since the Unix epoch (UTC). A zone is any :class:`datetime.tzinfo`
that converts from UTC correctly (``zoneinfo``, ``datetime.timezone``, pytz, dateutil).

:mod:`zoneinfo` has no public API for a zone's transitions, so they are found by sampling the UTC
offset every :data:`SAMPLE_STEP_S` seconds and bisecting each change down to the second. The
transitions of each UTC day are computed once and cached. Two offset changes closer together than
the sampling step that cancel each other out would be missed: the IANA database has none (the
closest pair of offset changes in it is about four days apart, Africa/Freetown in 1939).
"""

from __future__ import annotations

import datetime
import difflib
import functools
import zoneinfo

from celery_anarchon.errors import ConfigError

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_ONE_S = datetime.timedelta(seconds=1)

#: Transitions are cached per chunk of UTC time of this many seconds.
CHUNK_S = 86_400
#: The UTC offset is sampled this often (seconds) to find transitions.
SAMPLE_STEP_S = 6 * 3600


def offset_s(tz: datetime.tzinfo, t_s: int) -> int:
    """The UTC offset of ``tz`` at the instant ``t_s`` (UTC seconds), in whole seconds."""
    return (_EPOCH + datetime.timedelta(seconds=t_s)).astimezone(tz).utcoffset() // _ONE_S


def _find_chunk(tz: datetime.tzinfo, k: int) -> tuple[int, ...]:
    """The transitions T with ``k * CHUNK_S < T <= (k + 1) * CHUNK_S``.

    A transition is the first second of a new offset: ``offset_s(T - 1) != offset_s(T)``.
    """
    if isinstance(tz, datetime.timezone):
        return ()
    found = []
    lo = k * CHUNK_S
    prev_t, prev_o = lo, offset_s(tz, lo)
    for t in range(lo + SAMPLE_STEP_S, lo + CHUNK_S + 1, SAMPLE_STEP_S):
        o = offset_s(tz, t)
        a, a_o = prev_t, prev_o
        while a_o != o:  # at least one change in (a, t]: bisect for the first one
            b = t
            while b - a > 1:
                mid = (a + b) // 2
                if offset_s(tz, mid) == a_o:
                    a = mid
                else:
                    b = mid
            found.append(b)
            a, a_o = b, offset_s(tz, b)
        prev_t, prev_o = t, o
    return tuple(found)


_cached_chunk = functools.lru_cache(maxsize=1 << 15)(_find_chunk)


def _chunk(tz: datetime.tzinfo, k: int) -> tuple[int, ...]:
    try:
        return _cached_chunk(tz, k)
    except TypeError:  # an unhashable tzinfo: compute without the cache
        return _find_chunk(tz, k)


def transitions_in(tz: datetime.tzinfo, lo_s: int, hi_s: int) -> list[int]:
    """The transitions T of ``tz`` with ``lo_s < T <= hi_s`` (UTC seconds), in increasing order."""
    found = []
    for k in range(lo_s // CHUNK_S, (hi_s - 1) // CHUNK_S + 1):
        found.extend(t for t in _chunk(tz, k) if lo_s < t <= hi_s)
    return found


def first_transition_in(tz: datetime.tzinfo, lo_s: int, hi_s: int) -> int | None:
    """The first transition T of ``tz`` with ``lo_s < T <= hi_s`` (UTC seconds), or None."""
    for k in range(lo_s // CHUNK_S, (hi_s - 1) // CHUNK_S + 1):
        for t in _chunk(tz, k):
            if lo_s < t <= hi_s:
                return t
    return None


def zone_name(tz: datetime.tzinfo) -> str:
    """A name for ``tz`` that is the same on every host (for fingerprints): ``Europe/Paris``."""
    for attr in ("key", "zone"):  # zoneinfo, pytz
        name = getattr(tz, attr, None)
        if isinstance(name, str):
            return name
    if isinstance(tz, datetime.timezone):
        return tz.tzname(None)  # "UTC", "UTC+02:00"
    filename = getattr(tz, "_filename", None)  # dateutil's tzfile: the path differs per host
    if isinstance(filename, str):
        return filename.rsplit("zoneinfo/", 1)[-1]
    return repr(tz)


def did_you_mean(name: object) -> str:
    """`` (did you mean 'Europe/Paris'?)`` for a zone name with a close known one, else ``""``
    (for the error of an unknown zone; reads the zone database, so only on that path)."""
    if not isinstance(name, str):
        return ""
    close = difflib.get_close_matches(name, sorted(zoneinfo.available_timezones()), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def iana_zone(name: object) -> zoneinfo.ZoneInfo | None:
    """The zone of the IANA name ``name`` (``"Europe/Paris"``), or ``None``: not text, or no
    zone of the database has that name."""
    if not isinstance(name, str):
        return None
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        return None     # OSError: the tzdata package's look-up of a name too long for a file


def resolve_zone(tz, where: str) -> datetime.tzinfo:
    """``tz`` as a tzinfo: a tzinfo as given, an IANA name looked up (:func:`iana_zone`).

    :param where: what the zone belongs to, for the error (``entry 'x': crontab``).
    :raises ConfigError: an unknown zone (naming the closest known one), or neither.
    """
    if isinstance(tz, datetime.tzinfo):
        return tz
    zone = iana_zone(tz)
    if zone is not None:
        return zone
    raise ConfigError(f"{where}: unknown time zone {tz!r}{did_you_mean(tz)}; fix: use an IANA "
                      "name such as 'Europe/Paris' (see zoneinfo.available_timezones()) or a "
                      "tzinfo")
