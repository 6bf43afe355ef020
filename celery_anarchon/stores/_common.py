"""What every backend shares below the contract: the scheme of a URL, the store options every
store accepts, and the one place where a driver's errors become StoreUnavailable.

As kombu's transports declare ``connection_errors``, each backend declares the driver exceptions
that mean "the server cannot be reached or did not answer" and lets :func:`translated` turn them
into :class:`~celery_anarchon.errors.StoreUnavailable`, naming the store, its masked URL, what it
was doing and the cause.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

from celery_anarchon.errors import ConfigError, StoreUnavailable

#: Options every store accepts (``anarchon_store_options``); the rest belong to one backend.
COMMON_OPTIONS = frozenset({"history_size", "claim_timeout"})


def scheme_of(url: str) -> str:
    """The lower-case scheme of ``url`` (``""`` when it has none)."""
    return urlsplit(url).scheme.lower() if "://" in url else ""


def reject_unknown_options(store_kind: str, given: dict, known: set[str] | frozenset[str]) -> None:
    """Raise ConfigError for keys of ``anarchon_store_options`` that ``store_kind`` does not use."""
    unknown = sorted(set(given) - set(known) - COMMON_OPTIONS)
    if unknown:
        allowed = ", ".join(sorted(set(known) | COMMON_OPTIONS))
        raise ConfigError(
            f"anarchon_store_options: {', '.join(map(repr, unknown))} not understood by the "
            f"{store_kind} store (a typo must not silently change a rule). Allowed: {allowed}.")


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
