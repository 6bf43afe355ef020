"""The settings of a Celery app: the store's URL and options (``anarchon_store_url``, else the
broker's), and opening it.

Shared by the beat, worker and operator wings: it sits below all three, above the stores it opens.
"""
from __future__ import annotations

import os
import secrets
import socket

from celery_anarchon.stores import ClaimStore, open_store, scheme_of, url_following_broker
from celery_anarchon.schedule.timing import Settings


def make_instance_id() -> str:
    """``host:pid:random`` (the random suffix tells apart two processes that reuse a pid)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def resolve_store_url(app, settings: Settings) -> tuple[str, dict, str | None]:
    """The store URL and options of ``app``: ``anarchon_store_url``, else the broker's.

    :returns: ``(url, options, warning)``; ``warning`` is set for the embedded one-host default.
    :raises ConfigError: the broker cannot serve as a store and no store URL is set.
    """
    options = dict(settings.store_options)
    if settings.store_url:
        return settings.store_url, options, None
    broker = app.conf.broker_url or app.conf.broker_read_url or ""
    if scheme_of(broker) == "sentinel":
        transport = app.conf.broker_transport_options or {}
        if "master_name" in transport:
            options.setdefault("master_name", transport["master_name"])
        return broker, options, None
    url, warning = url_following_broker(broker)
    return url, options, warning


def open_app_store(app, settings: Settings, *, instance_id: str, namespace: str | None = None) -> ClaimStore:
    """Open ``app``'s store (no I/O: it connects on first use) under ``namespace`` (default: the
    settings' ``anarchon_namespace``)."""
    url, options, _ = resolve_store_url(app, settings)
    return open_store(url, namespace=settings.namespace if namespace is None else namespace,
                      instance_id=instance_id, options=options)
