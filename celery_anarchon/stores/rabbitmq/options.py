"""The RabbitMQ store's options and URL: validated once, with ConfigError naming the option, the
value and the rule (the numbers by :mod:`celery_anarchon._util`'s validators).

URLs ``amqp://user:password@host:5672/vhost`` and ``amqps://...`` go to kombu (py-amqp)
unchanged; the ``ssl`` option (``True`` or a dict of TLS settings) is kombu's ``ssl`` argument,
passed as it is (default: ``True`` for ``amqps://``).
"""
from __future__ import annotations

import dataclasses
import math

from celery_anarchon import _util
from celery_anarchon._util import mask_url
from celery_anarchon.errors import ConfigError
from celery_anarchon.stores._common import reject_unknown_options, scheme_of
from celery_anarchon.stores.base import DEFAULT_CLAIM_TIMEOUT_S, DEFAULT_HISTORY_SIZE
from celery_anarchon.stores.rabbitmq.connection import valid_prefix

#: Options of ``anarchon_store_options`` this store understands (besides the common ones).
OPTIONS = frozenset({"slot_ttl", "queue_type", "queue_prefix", "ssl"})
#: Default memory of a claimed run, seconds (docs/design.md memory table).
DEFAULT_SLOT_TTL_S = 300.0
DEFAULT_QUEUE_PREFIX = "anarchon"


@dataclasses.dataclass(frozen=True)
class RabbitMQOptions:
    """The validated options of one RabbitMQ store.

    :param history_size: runs of history kept per entry (>= 1).
    :param claim_timeout: seconds one round trip may take (> 0).
    :param slot_ttl_s: seconds a claimed run is remembered after its first claim (> 0), and in
        ms, rounded up (``slot_ttl_ms``): the claim queues' ``x-expires``.
    :param queue_prefix: the first part of every queue name.
    :param ssl: kombu's ``ssl`` argument.
    """

    history_size: int
    claim_timeout: float
    slot_ttl_s: float
    slot_ttl_ms: int
    queue_prefix: str
    ssl: bool | dict


def parse(url: str, options: dict) -> RabbitMQOptions:
    """Validate ``url`` and ``options`` (``anarchon_store_options``) of a RabbitMQ store.

    :raises ConfigError: an unknown option (with the closest known one), a bad value, a queue
        type other than ``"classic"``, or a URL that is not ``amqp://`` / ``amqps://``.
    """
    reject_unknown_options("rabbitmq", options, OPTIONS)
    history_size = _util.positive_int("history_size",
                                      options.get("history_size", DEFAULT_HISTORY_SIZE))
    claim_timeout = _util.seconds("claim_timeout",
                                  options.get("claim_timeout", DEFAULT_CLAIM_TIMEOUT_S))
    slot_ttl_s = _util.seconds("slot_ttl", options.get("slot_ttl", DEFAULT_SLOT_TTL_S))
    queue_type = options.get("queue_type", "classic")
    if queue_type != "classic":
        raise ConfigError(
            f"anarchon_store_options['queue_type'] = {queue_type!r}: the RabbitMQ store works "
            "on classic queues only. A quorum queue checks x-max-length after it took the "
            "message, so two claims of one run both win (measured: 163 of 200 runs raced by 3 "
            "processes had two winners), and streams never refuse a message. Remove the "
            "option or set it to 'classic'.")
    prefix = options.get("queue_prefix", DEFAULT_QUEUE_PREFIX)
    if not valid_prefix(prefix):
        raise ConfigError(f"anarchon_store_options['queue_prefix'] = {prefix!r}: 1 to 64 "
                          "letters, digits, '_' or '-' (no dots: they separate a name's parts)")
    ssl = options.get("ssl")
    if ssl is not None and not isinstance(ssl, (bool, dict)):
        raise ConfigError(f"anarchon_store_options['ssl'] = {ssl!r}: True, False or a dict of "
                          "TLS settings (kombu's ssl argument)")
    scheme = scheme_of(url)
    if scheme not in ("amqp", "amqps"):
        raise ConfigError(f"anarchon_store_url {mask_url(url)!r}: the RabbitMQ store takes "
                          "amqp:// or amqps:// URLs")
    return RabbitMQOptions(
        history_size=history_size, claim_timeout=claim_timeout, slot_ttl_s=slot_ttl_s,
        slot_ttl_ms=max(1, math.ceil(slot_ttl_s * 1000)), queue_prefix=prefix,
        ssl=ssl if ssl is not None else (scheme == "amqps"))
