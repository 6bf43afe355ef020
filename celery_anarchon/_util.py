"""Leaf helpers: time formatting, clock skew, URL masking, option validation, and the store-side
values the timing rules need. The bottom layer: it imports nothing of ours but
:mod:`celery_anarchon.errors`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import re
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator
from urllib.parse import urlsplit, urlunsplit

from celery_anarchon.errors import ConfigError

#: Lease stores refuse a run whose slot is older than max_late + this, or further than this in
#: the future, on the store's clock (docs/design.md "Timing": store-side lateness tolerance).
LATENESS_TOLERANCE_MS = 10_000


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Python's cyclic garbage collector off inside the block (and back on after it, if it was
    on): for a build that allocates much and frees nothing cyclic, such as a beat's start-up with
    100,000 entries, where each of the collector's full passes walks every object of the app's
    schedule again (about 1 s each there, a fifth of the start-up). Reference counting still
    frees what the block drops; the collector's next pass takes any cycle it left."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclasses.dataclass(frozen=True)
class Memory:
    """How long a store remembers a claimed run (docs/design.md, store memory table).

    :param duration_s: seconds, or ``None`` for forever.
    :param count: runs per entry, or ``None`` when not limited by count.
    :param setting: the store option that sets ``duration_s`` (named in error messages).
    :param count_setting: the store option that sets ``count``.
    """

    duration_s: float | None
    count: int | None = None
    setting: str = "memory"
    count_setting: str | None = None


# -- time ------------------------------------------------------------------------------------------

def iso(ms: int) -> str:
    """UTC ms as ISO 8601 with milliseconds (``2026-01-01T00:00:00.000+00:00``), for logs."""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")


# -- clocks ----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Skew:
    """This instance's clock minus a store's, from one reading of the store's clock taken between
    two readings of this one (docs/design.md "Clocks"); positive when this clock is ahead. The one
    computation of the skew: the engine's check (``engine/skew``) and the NATS store's claim
    bound use it.

    :param offset_ms: this clock minus the store's, ms: the middle of the round trip against the
        store's reading.
    :param uncertainty_ms: how far the true offset may be from ``offset_ms``, ms: half the round
        trip, plus 1 ms for a store clock read in whole milliseconds.
    """

    offset_ms: float
    uncertainty_ms: float

    @classmethod
    def measured(cls, before_s: float, after_s: float, store_ms: float) -> Skew:
        """The skew from ``store_ms`` (the store's clock, UTC ms) read between this clock's
        readings ``before_s`` and ``after_s`` (epoch seconds)."""
        return cls((before_s + after_s) * 500 - store_ms, (after_s - before_s) * 500 + 1)


# -- URLs ------------------------------------------------------------------------------------------

#: a separator between the server URLs of one store URL (``sentinel://a;sentinel://b``,
#: ``nats://a,nats://b``): a ``;`` or ``,`` followed by a scheme
_NEXT_URL = re.compile(r"[;,](?=[A-Za-z][A-Za-z0-9+.-]*://)")


def _mask_one(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = parts.username or ""
    host = netloc[1] if len(netloc) == 2 else ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def mask_url(url: str) -> str:
    """``url`` with every password replaced by ``***`` (for logs, banners and errors); each part
    of a multi-server URL (``sentinel://:pw@a;sentinel://:pw@b``, ``nats://a,nats://b``) too.

    (kombu's ``sanitize_url`` does not fit: it drops the query, rewrites IPv6 hosts and refuses
    multi-server URLs.) A lone user part is left as it is: it is a user name for every scheme but
    NATS, whose store masks a token itself.
    """
    starts = [0] + [m.start() + 1 for m in _NEXT_URL.finditer(url)]
    if len(starts) == 1:
        return _mask_one(url)
    pieces = [url[a:b - 1] for a, b in zip(starts, starts[1:])] + [url[starts[-1]:]]
    seps = [url[b - 1] for b in starts[1:]]
    out = _mask_one(pieces[0])
    for sep, piece in zip(seps, pieces[1:]):
        out += sep + _mask_one(piece)
    return out


# -- option validators -----------------------------------------------------------------------------

def store_option(name: str) -> str:
    """How an error names store option ``name``: ``anarchon_store_options['name']``."""
    return f"anarchon_store_options[{name!r}]"


def duration(value: Any, what: str) -> float:
    """``value`` (int, float or timedelta) as seconds >= 0; ``what`` names it in the error
    (a Celery setting or an entry's option: the timing rules' validator).

    :raises ConfigError: not a number or a timedelta, not finite, or negative.
    """
    if isinstance(value, timedelta):
        result = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        result = float(value)
    else:
        raise ConfigError(f"{what}: {value!r} is not a duration; give seconds (int or float) or a "
                          "datetime.timedelta")
    if not math.isfinite(result) or result < 0:
        raise ConfigError(f"{what}: {value!r} must be a finite number of seconds >= 0")
    return result


def seconds(name: str, value: Any, *, minimum: float | None = None, why: str = "") -> float:
    """Store option ``name`` as seconds: an int, float or timedelta, finite, > 0 (or
    >= ``minimum``).

    :param why: appended to the error after ``; `` (e.g. the server's own limit).
    :raises ConfigError: naming the option, the value and the rule.
    """
    number = value.total_seconds() if isinstance(value, timedelta) else value
    bad = (isinstance(number, bool) or not isinstance(number, (int, float))
           or not math.isfinite(number)
           or (number <= 0 if minimum is None else number < minimum))
    if bad:
        rule = "> 0" if minimum is None else f">= {minimum:g}"
        raise ConfigError(f"{store_option(name)} = {value!r}: must be a number of seconds {rule} "
                          f"(int, float or timedelta){'; ' + why if why else ''}")
    return float(number)


def positive_int(name: str, value: Any, *, maximum: int | None = None, why: str = "") -> int:
    """Store option ``name`` as an integer >= 1 (and <= ``maximum``); a bool is not an integer.

    :raises ConfigError: naming the option, the value and the rule.
    """
    if (isinstance(value, bool) or not isinstance(value, int) or value < 1
            or (maximum is not None and value > maximum)):
        rule = "an integer >= 1" if maximum is None else f"an integer from 1 to {maximum}"
        raise ConfigError(f"{store_option(name)} = {value!r}: must be {rule}"
                          f"{' (' + why + ')' if why else ''}")
    return value


def one_of(name: str, value: Any, allowed: tuple) -> Any:
    """Store option ``name`` as one of ``allowed``.

    :raises ConfigError: naming the option, the value and the allowed values.
    """
    if value not in allowed:
        raise ConfigError(f"{store_option(name)} = {value!r}: must be one of "
                          f"{', '.join(map(repr, allowed))}")
    return value


__all__ = ["LATENESS_TOLERANCE_MS", "Memory", "Skew", "iso", "mask_url", "store_option",
           "duration", "seconds", "positive_int", "one_of"]
