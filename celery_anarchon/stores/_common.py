"""What every backend shares below the contract: the scheme of a URL, the store options every
store accepts, and the one place where a driver's errors become StoreUnavailable.

As kombu's transports declare ``connection_errors``, each backend declares the driver exceptions
that mean "the server cannot be reached or did not answer" and lets :func:`translated` turn them
into :class:`~celery_anarchon.errors.StoreUnavailable`, naming the store, its masked URL, what it
was doing and the cause.
"""
from __future__ import annotations

import contextlib
import difflib
import re
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import tenacity

from celery_anarchon.errors import ConfigError, StoreUnavailable

#: Options every store accepts (``anarchon_store_options``); the rest belong to one backend.
COMMON_OPTIONS = frozenset({"history_size", "claim_timeout"})


#: a URL's password (``scheme://user:password@``), for a URL too broken to parse
_PASSWORD = re.compile(r"(://[^:/@]*:)[^@]*@")


def scheme_of(url: str) -> str:
    """The lower-case scheme of ``url`` (``""`` when it has none).

    :raises ConfigError: a URL that cannot be parsed (e.g. an unclosed IPv6 bracket), naming
        it with its password masked.
    """
    if "://" not in url:
        return ""
    try:
        return urlsplit(url).scheme.lower()
    except ValueError as exc:
        shown = _PASSWORD.sub(r"\1***@", url)
        raise ConfigError(f"store URL {shown!r} cannot be parsed ({exc}); fix: check the URL "
                          "(anarchon_store_url, or the broker's), e.g. an IPv6 host in brackets: "
                          "redis://[::1]:6379/0") from exc


def reject_unknown_options(store_kind: str, given: dict, known: set[str] | frozenset[str]) -> None:
    """Raise ConfigError for keys of ``anarchon_store_options`` that ``store_kind`` does not use."""
    unknown = sorted(set(given) - set(known) - COMMON_OPTIONS)
    if unknown:
        options = sorted(set(known) | COMMON_OPTIONS)
        close = {k: difflib.get_close_matches(str(k), options, n=1) for k in unknown}
        hint = "; ".join(f"did you mean {c[0]!r} for {k!r}?" for k, c in close.items() if c)
        raise ConfigError(
            f"anarchon_store_options: {', '.join(map(repr, unknown))} not understood by the "
            f"{store_kind} store (a typo must not silently change a rule)"
            f"{' (' + hint + ')' if hint else ''}. Allowed: {', '.join(options)}.")


def failed(exc: BaseException) -> str:
    """The usual end of a StoreUnavailable message: `` failed: <Type>: <text>``."""
    return f" failed: {type(exc).__name__}: {exc}"


@contextlib.contextmanager
def translated(store: str, safe_url: str, doing: str,
               connection_errors: tuple[type[BaseException], ...], *,
               cause: Callable[[BaseException], str] = failed,
               on_error: Callable[[], object] | None = None) -> Iterator[None]:
    """Turn the driver errors ``connection_errors`` raised inside into StoreUnavailable
    ``"<store> store <safe_url>: <doing><cause(exc)>"``; ConfigError and StoreUnavailable pass.

    :param store: the store's name in messages ("Redis", "NATS", "RabbitMQ", "postgresql").
    :param cause: the message's end for one error (default :func:`failed`).
    :param on_error: called before raising (e.g. drop a connection that may be broken).
    """
    try:
        yield
    except (ConfigError, StoreUnavailable):
        raise
    except connection_errors as exc:
        if on_error is not None:
            on_error()
        raise StoreUnavailable(f"{store} store {safe_url}: {doing}{cause(exc)}") from exc


def retrying(retry_on: tuple[type[BaseException], ...] | Callable[[BaseException], bool], *,
             attempts: int | None = None, deadline_s: float | None = None,
             wait_s: float = 0.05, max_wait_s: float = 1.0,
             sleep: Callable[[float], None] = time.sleep,
             asynchronous: bool = False) -> tenacity.Retrying | tenacity.AsyncRetrying:
    """The one retry loop of the stores (tenacity): retry while the error matches ``retry_on``,
    with exponential backoff from ``wait_s`` up to ``max_wait_s`` seconds and random jitter,
    until ``attempts`` tries or ``deadline_s`` seconds on the monotonic clock; the last error is
    re-raised unchanged. Use as ``for attempt in retrying(...): with attempt: ...`` or
    ``retrying(...)(fn, *args)``.

    :param retry_on: exception classes, or a predicate of the exception (e.g. "a deadlock").
    :param asynchronous: for a coroutine (the NATS store's event loop): a tenacity
        ``AsyncRetrying`` that waits with ``asyncio.sleep`` (``sleep`` is not used), as
        ``async for attempt in retrying(..., asynchronous=True): with attempt: ...``.
    :raises ValueError: neither ``attempts`` nor ``deadline_s`` given (a loop must end).
    """
    if attempts is None and deadline_s is None:
        raise ValueError("retrying() needs attempts or deadline_s: a retry loop must end")
    stops = []
    if attempts is not None:
        stops.append(tenacity.stop_after_attempt(attempts))
    if deadline_s is not None:
        stops.append(tenacity.stop_after_delay(deadline_s))
    stop = stops[0] if len(stops) == 1 else tenacity.stop_any(*stops)
    retry = (tenacity.retry_if_exception_type(retry_on) if isinstance(retry_on, tuple)
             else tenacity.retry_if_exception(retry_on))
    wait = tenacity.wait_random_exponential(multiplier=wait_s, max=max_wait_s)
    if asynchronous:
        return tenacity.AsyncRetrying(stop=stop, retry=retry, reraise=True, wait=wait)
    return tenacity.Retrying(stop=stop, retry=retry, reraise=True, sleep=sleep, wait=wait)
