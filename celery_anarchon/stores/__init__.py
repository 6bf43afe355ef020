"""Stores: the URL scheme picks the backend.

As kombu resolves its transports, a table maps each scheme to a ``"module:name"`` that is imported
only when used: an extra that is not installed costs nothing until asked for, its absence is an
error naming the extra, and an unknown scheme suggests the closest known one. The name is the
store's class, or the factory that picks it from the options (Redis: one class per ``strategy``).

A store another package provides is named by ``anarchon_store_url`` itself, as
``"package.module:Class"`` (as kombu takes a transport class by name, ``symbol_by_name``): the
class (or factory) is imported and built as the registry's are, with the value as its URL and
its settings in ``anarchon_store_options``.
"""
from __future__ import annotations

import difflib
import importlib
import os
import re
from collections.abc import Callable

from celery_anarchon._util import mask_url
from celery_anarchon.errors import ConfigError
from celery_anarchon.stores._common import (  # noqa: F401  (re-exported)
    COMMON_OPTIONS, reject_unknown_options, scheme_of,
)
from celery_anarchon.stores.base import (  # noqa: F401  (re-exported)
    ClaimRequest, ClaimResult, ClaimStore, HistoryRecord, LeasedRun, Leases, LeaseTerms, Memory,
    Outcome, RunEvent, RunState, TakeoverOutcome, lease_store,
)

#: scheme -> ("module:name" of the store's class or factory, extra that provides its client
#: library or None)
STORES: dict[str, tuple[str, str | None]] = {
    "memory": ("celery_anarchon.stores.memory:MemoryStore", None),
    "sqlite": ("celery_anarchon.stores.sql:SQLiteStore", None),
    "postgresql": ("celery_anarchon.stores.sql:PostgreSQLStore", "postgres"),
    "postgres": ("celery_anarchon.stores.sql:PostgreSQLStore", "postgres"),
    "postgresql+psycopg": ("celery_anarchon.stores.sql:PostgreSQLStore", "postgres"),
    "redis": ("celery_anarchon.stores.redis:open_redis_store", "redis"),
    "rediss": ("celery_anarchon.stores.redis:open_redis_store", "redis"),
    "unix": ("celery_anarchon.stores.redis:open_redis_store", "redis"),
    "amqp": ("celery_anarchon.stores.rabbitmq:RabbitMQStore", None),
    "amqps": ("celery_anarchon.stores.rabbitmq:RabbitMQStore", None),
    "nats": ("celery_anarchon.stores.nats:NATSStore", "nats"),
    "tls": ("celery_anarchon.stores.nats:NATSStore", "nats"),
    "sentinel": ("celery_anarchon.stores.redis:open_redis_store", "redis"),
    "redis+cluster": ("celery_anarchon.stores.redis.cluster:RedisClusterStore", "redis"),
    "rediss+cluster": ("celery_anarchon.stores.redis.cluster:RedisClusterStore", "redis"),
}

#: client library module -> extra that installs it
_EXTRA_OF_MODULE = {"redis": "redis", "psycopg": "postgres", "nats": "nats", "ephem": "solar"}

#: ``anarchon_store_url`` naming a store of another package: ``package.module:Class`` (no ``://``)
_NAMED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def named_store(url: str) -> Callable[..., ClaimStore]:
    """The class (or factory) ``url`` names as ``"package.module:Class"`` (a dotted name after the
    colon reaches an attribute of an attribute), imported now.

    :raises ConfigError: the module cannot be imported, or it has no such name, or what it names
        cannot be called.
    """
    module_name, _, name = url.partition(":")
    try:
        found = importlib.import_module(module_name)
        for part in name.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"anarchon_store_url {url!r} names a store that cannot be imported "
            f"({type(exc).__name__}: {exc}); fix: install the package that provides it, or check "
            "the module and class names (\"package.module:Class\")") from exc
    if not callable(found):
        raise ConfigError(f"anarchon_store_url {url!r} names {found!r}, which is not a store class "
                          "or a factory of one")
    return found


def store_factory(url: str) -> Callable[..., ClaimStore]:
    """What builds the store of ``url``'s scheme (its class, or a factory taking the same
    arguments), importing its module on first use; a ``url`` of the form
    ``"package.module:Class"`` names it itself (:func:`named_store`).

    :raises ConfigError: unknown scheme (with the closest known one), the client library of
        the store is not installed (with the extra to install), or a named store that cannot be
        imported.
    """
    if _NAMED.fullmatch(url):
        return named_store(url)
    scheme = scheme_of(url)
    if scheme not in STORES:
        close = difflib.get_close_matches(scheme, STORES, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"anarchon_store_url {mask_url(url)!r}: unknown store scheme {scheme!r}.{hint} Known "
            f"schemes: {', '.join(sorted(STORES))}.")
    target, extra = STORES[scheme]
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing.startswith("celery_anarchon"):
            raise
        extra = _EXTRA_OF_MODULE.get(missing, extra)
        raise ConfigError(
            f"anarchon_store_url {mask_url(url)!r} needs the Python package {missing!r}, which is "
            f"not installed: pip install 'celery-anarchon[{extra}]'") from exc
    return getattr(module, class_name)


def open_store(url: str, *, namespace: str, instance_id: str, options: dict | None = None) -> ClaimStore:
    """Build the store for ``url`` (no I/O: it connects on first use).

    :param url: ``anarchon_store_url``; its scheme picks the backend, or it names the store's
        class (``"package.module:Class"``).
    :param namespace: ``anarchon_namespace``; two apps sharing a store never collide.
    :param instance_id: this beat instance's id (host, pid, random suffix).
    :param options: ``anarchon_store_options``; validated by the store that owns them.
    :raises ConfigError: unknown scheme, missing extra, an option the store does not know, or a
        named store that cannot be imported or is not a :class:`ClaimStore`.
    """
    build = store_factory(url)
    store = build(url, namespace=namespace, instance_id=instance_id, **dict(options or {}))
    if not isinstance(store, ClaimStore):
        raise ConfigError(f"anarchon_store_url {mask_url(url)!r} built {type(store).__name__}, "
                          "which is not a store (a subclass of "
                          "celery_anarchon.stores.base.ClaimStore)")
    return store


def default_sqlite_url(broker_url: str | None) -> str:
    """Where the embedded SQLite store lives when the broker is local: next to a kombu SQLAlchemy
    broker's SQLite file, else ``celery-anarchon.sqlite3`` in the current directory."""
    if broker_url and broker_url.startswith("sqla+sqlite:///"):
        path = broker_url[len("sqla+sqlite:///"):]
        if path and path != ":memory:":
            folder = os.path.dirname(os.path.abspath(path))
            return "sqlite:///" + os.path.join(folder, "celery-anarchon.sqlite3")
    return "sqlite:///" + os.path.abspath("celery-anarchon.sqlite3")


#: the broker of an app that sets no ``broker_url``: Celery's default, kombu's defaults of the
#: ``amqp`` transport (``Celery().connection_for_write().as_uri(include_password=True)``)
CELERY_DEFAULT_BROKER = "amqp://guest:guest@localhost:5672//"


def url_following_broker(broker_url: str | None) -> tuple[str, str | None]:
    """The store URL to use when ``anarchon_store_url`` is unset (docs/design.md "Where the store is").

    :returns: ``(url, warning)``; ``warning`` is set for the embedded SQLite default.
    :raises ConfigError: a broker every host cannot share as a store (e.g. SQS).
    """
    url = (broker_url or "").split(";")[0].strip() or CELERY_DEFAULT_BROKER
    scheme = scheme_of(url)
    if scheme in ("redis", "rediss"):
        return url, None
    if scheme in ("sqla+postgresql", "sqla+postgres", "sqla+postgresql+psycopg"):
        return url[len("sqla+"):], None
    if scheme in ("sqla+sqlite", "filesystem", "memory"):
        path = default_sqlite_url(url)
        return path, (
            f"anarchon store: the broker ({mask_url(url)}) is local to this host, so claims use the "
            f"embedded SQLite file {path[len('sqlite:///'):]}. It coordinates the beat processes "
            "of this one host only; set anarchon_store_url to a Redis or PostgreSQL URL that every "
            "host reaches to run beat on several hosts.")
    if scheme in ("amqp", "amqps", "pyamqp", "librabbitmq"):
        return ("amqps" if scheme == "amqps" else "amqp") + url[len(scheme):], None
    raise ConfigError(
        f"anarchon_store_url is not set and the broker {mask_url(url)!r} cannot serve as the claim "
        "store: set anarchon_store_url to a store every beat host shares, e.g. "
        "'redis://host:6379/0' or 'postgresql://user@host/db' (a per-host default would send every "
        "run once per host).")
