"""Leaf helpers: time formatting, clock skew, URL masking, option validation, and the store-side
values the timing rules need. The bottom layer: it imports nothing of ours but
:mod:`celery_anarchon.errors` and the bounds of :mod:`celery_anarchon.limits`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib.metadata
import logging
import math
import re
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator
from urllib.parse import unquote_plus

from celery_anarchon.errors import ConfigError
from celery_anarchon.limits import FIRST_MS, LAST_SLOT_MS, MAX_DURATION_S, duration_bound, shown_value

#: Lease stores refuse a run whose slot is older than max_late + this, or further than this in
#: the future, on the store's clock (docs/design.md "Timing": store-side lateness tolerance).
LATENESS_TOLERANCE_MS = 10_000

try:
    #: the version of celery_anarchon (``celery_anarchon.__version__``, an instance's record): the
    #: installed distribution's, from setup.cfg
    VERSION = importlib.metadata.version("celery-anarchon")
except importlib.metadata.PackageNotFoundError:  # a source tree on sys.path, not installed
    VERSION = "unknown"


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

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def iso(ms: int) -> str:
    """UTC ms as ISO 8601 with milliseconds (``2026-01-01T00:00:00.000+00:00``), for logs and
    views. Never raises: an instant outside the years 1 to 9999 (a value an older version
    stored) is shown as ``<ms> ms since the Unix epoch``."""
    if FIRST_MS <= ms <= LAST_SLOT_MS:
        try:
            return (_EPOCH + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds")
        except (OverflowError, ValueError, TypeError):
            pass
    return f"{ms} ms since the Unix epoch"


def iso_ms(text: str) -> int | None:
    """UTC ms of an ISO 8601 instant with its offset (what :func:`iso` writes; ``Z`` too), read
    back from a record's detail; ``None`` for text that is not one."""
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return None if when.tzinfo is None else round(when.timestamp() * 1000)


def log_time(ms: int) -> str:
    """UTC ms as ISO 8601 with milliseconds and its offset, in the zone of the log's own
    timestamps, for a log line: UTC (``+00:00``) when the log stamps its records in UTC
    (``logging.Formatter.converter`` is ``time.gmtime``), else the process's local zone, which
    Python's logging and Celery's log format use for ``%(asctime)s`` and which Django sets to its
    ``TIME_ZONE`` (``2026-07-01T14:00:00.000+02:00`` in Paris). One zone to read in the whole log
    (docs/with-django.md "The log's times"); the store's history and the views keep
    :func:`iso`'s UTC. Never raises: outside the years 1 to 9999, as :func:`iso`."""
    if logging.Formatter.converter is time.gmtime or not FIRST_MS <= ms <= LAST_SLOT_MS:
        return iso(ms)
    try:
        return (_EPOCH + timedelta(milliseconds=ms)).astimezone().isoformat(timespec="milliseconds")
    except (OverflowError, ValueError, TypeError, OSError):
        return iso(ms)


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
#: ``nats://a, nats://b``): a ``;`` or ``,`` (and any spaces) followed by a scheme
_NEXT_URL = re.compile(r"([;,]\s*)(?=[A-Za-z][A-Za-z0-9+.-]*://)")
#: a URL's scheme and the part before its path: ``scheme://authority``; the authority runs to
#: the first ``/``, so a password holding an unencoded ``?``, ``#`` or ``,`` stays inside it
_AUTHORITY = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://([^/]*)")
#: the schemes whose lone user part (``nats://TOKEN@host``) is a token, not a user name (NATS)
TOKEN_SCHEMES = frozenset({"nats", "tls"})
#: query parameter names that carry a credential (compared in lower case, without ``-``, ``_``
#: and ``.``): libpq's password / sslpassword, redis-py's password, and the usual token and key
#: names; a name ending in one of :data:`_SECRET_SUFFIXES` counts too
_SECRET_NAMES = frozenset({"pass", "pwd", "key", "auth", "sig", "signature", "credential",
                           "credentials"})
_SECRET_SUFFIXES = ("password", "passwd", "passphrase", "pwd", "secret", "token", "apikey",
                    "accesskey", "secretkey", "privatekey", "credential", "credentials")
MASK = "***"


def is_secret_parameter(name: str) -> bool:
    """Whether URL query parameter ``name`` (as written, possibly %-encoded) carries a
    credential: ``password``, ``PWD``, ``sslpassword``, ``auth_token``, ``x-api-key``,
    ``aws_secret_access_key``, ... (case-insensitive; see :data:`_SECRET_NAMES`)."""
    key = unquote_plus(name).lower().replace("-", "").replace("_", "").replace(".", "")
    return key in _SECRET_NAMES or key.endswith(_SECRET_SUFFIXES)


def _mask_query(query: str) -> str:
    """``query`` (without ``?`` and fragment) with the value of every credential parameter
    masked; parameters are split on ``&``, and on ``;`` inside one: everything after a
    credential's ``=`` up to the next ``&`` is masked (a ``;`` may be part of the password)."""
    out = []
    for param in query.split("&"):
        pieces = param.split(";")
        for i, piece in enumerate(pieces):
            name, eq, value = piece.partition("=")
            if eq and value and is_secret_parameter(name):
                param = ";".join(pieces[:i] + [f"{name}={MASK}"])
                break
        out.append(param)
    return "&".join(out)


def _mask_one(url: str) -> str:
    """One server's URL: its userinfo password (or NATS token) and its credential parameters
    masked. Text that is not ``scheme://...`` is returned as it is."""
    match = _AUTHORITY.match(url)
    if match is None:
        return url
    scheme, authority = match.group(1), match.group(2)
    userinfo, at, hosts = authority.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        if colon:
            authority = f"{user}:{MASK}@{hosts}"
        elif userinfo and scheme.lower() in TOKEN_SCHEMES:
            authority = f"{MASK}@{hosts}"
    rest = url[match.end():]
    path, question, query = rest.partition("?")
    if not question:
        # a query right after the host (``redis://h?password=x``) stayed in the authority
        hosts_part, question, query = authority.partition("?")
        if question:
            authority, path = hosts_part, ""
            query = query + rest
    query, hash_, fragment = query.partition("#")
    if question:
        query = _mask_query(query)
    return f"{url[:match.start(2)]}{authority}{path}{question}{query}{hash_}{fragment}"


def mask_url(url: str) -> str:
    """``url`` with every credential replaced by ``***``, for logs, banners, errors, ``status``,
    ``check`` and the status page (the one masking of the package: every printed URL goes
    through it, through :attr:`ClaimStore.safe_url` or directly).

    Masked: the password of the userinfo (``redis://user:***@host``), a NATS token (a lone
    user part of a ``nats://`` or ``tls://`` URL: ``nats://***@host``), and the value of every
    query parameter that carries a credential (:func:`is_secret_parameter`: ``?password=***``,
    ``sslpassword``, ``PWD``, ``token``, ...; redis-py and libpq read a password there), in each
    server of a multi-server URL (``sentinel://:***@a;sentinel://:***@b``, ``nats://a,nats://b``,
    ``redis+cluster://u:***@h1:7000,h2:7001``). A lone user part of any other scheme is a user
    name, shown as it is; an empty parameter (``?password=``) hides nothing and is shown.

    Built on the URL's text rather than ``urllib.parse.urlsplit``/``urlunsplit``, which end the
    host part at an unencoded ``#`` or ``?`` in a password (and so would print the rest) and
    rewrite some URLs when joining them again; kombu's ``sanitize_url`` drops the query, rewrites
    IPv6 hosts and refuses multi-server URLs.
    """
    if not isinstance(url, str):
        return url
    parts = _NEXT_URL.split(url)    # server URLs at even places, their separators between
    return "".join(part if i % 2 else _mask_one(part) for i, part in enumerate(parts))


# -- option validators -----------------------------------------------------------------------------

def store_option(name: str) -> str:
    """How an error names store option ``name``: ``anarchon_store_options['name']``."""
    return f"anarchon_store_options[{name!r}]"


def duration(value: Any, what: str, *, maximum: float = MAX_DURATION_S,
             fix: str = "give a shorter duration, in seconds") -> float:
    """``value`` (int, float or timedelta) as seconds from 0 to ``maximum``; ``what`` names it in
    the error (a Celery setting or an entry's option: the timing rules' validator).

    :param maximum: the most it may be, seconds (default
        :data:`~celery_anarchon.limits.MAX_DURATION_S`, 100 years; an anchor takes
        :data:`~celery_anarchon.limits.LAST_SLOT_S`).
    :param fix: the fix the error of a value above ``maximum`` gives.
    :raises ConfigError: not a number or a timedelta, not finite, negative, or more than
        ``maximum`` (naming ``what``, the value and the fix).
    """
    if isinstance(value, timedelta):
        result = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            result = float(value)
        except OverflowError:           # an int too large for a float
            result = math.inf
    else:
        raise ConfigError(f"{what}: {value!r} is not a duration; give seconds (int or float) or a "
                          "datetime.timedelta")
    if math.isnan(result) or result < 0:
        raise ConfigError(f"{what}: {value!r} must be a finite number of seconds >= 0; fix: give "
                          f"seconds from 0 to {duration_bound(maximum)}, as an int, a float or a "
                          "datetime.timedelta")
    if result > maximum:
        raise ConfigError(f"{what}: {shown_value(value)} s is more than {duration_bound(maximum)}, "
                          f"the most it may be; fix: {fix}")
    return result


def seconds(name: str, value: Any, *, minimum: float | None = None, why: str = "") -> float:
    """Store option ``name`` as seconds: an int, float or timedelta, finite, > 0 (or
    >= ``minimum``) and at most :data:`~celery_anarchon.limits.MAX_DURATION_S` (100 years).

    :param why: appended to the error after ``; `` (e.g. the server's own limit).
    :raises ConfigError: naming the option, the value and the rule.
    """
    number = value.total_seconds() if isinstance(value, timedelta) else value
    bad = (isinstance(number, bool) or not isinstance(number, (int, float))
           or number > MAX_DURATION_S or not math.isfinite(number)
           or (number <= 0 if minimum is None else number < minimum))
    if bad:
        rule = "> 0" if minimum is None else f">= {minimum:g}"
        raise ConfigError(f"{store_option(name)} = {value!r}: must be a number of seconds {rule} "
                          f"and at most {duration_bound(MAX_DURATION_S)} (int, float or "
                          f"timedelta){'; ' + why if why else ''}")
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


__all__ = ["LATENESS_TOLERANCE_MS", "Memory", "Skew", "iso", "iso_ms", "mask_url", "is_secret_parameter",
           "store_option", "duration", "seconds", "positive_int", "one_of"]
