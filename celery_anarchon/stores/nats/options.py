"""The NATS store's options and URL: validated once, with ConfigError naming the option, the value
and the rule (the numbers by :mod:`celery_anarchon._util`'s validators), and the URL's servers
(an error names them masked by :func:`celery_anarchon._util.mask_url`, which knows NATS tokens).

URLs: ``nats://[user:password@|token@]host[:port]`` or ``tls://...``, several separated by commas;
credentials go to nats-py with the URL. TLS uses nats-py's own options, as store options ``tls``
(an ``ssl.SSLContext``), ``tls_hostname`` and ``tls_handshake_first``; ``user_credentials`` and
``nkeys_seed`` are nats-py's too. A ``tls://`` URL refuses an unencrypted connection.
"""
from __future__ import annotations

import dataclasses
import ssl
from urllib.parse import urlsplit

from celery_anarchon import _util
from celery_anarchon._util import mask_url
from celery_anarchon.errors import ConfigError
from celery_anarchon.stores._common import reject_unknown_options
from celery_anarchon.stores.base import DEFAULT_CLAIM_TIMEOUT_S, DEFAULT_HISTORY_SIZE

#: Options of ``anarchon_store_options`` this store understands (besides the common ones).
OPTIONS = frozenset({"duplicate_window", "replicas", "tls", "tls_hostname", "tls_handshake_first",
                     "user_credentials", "nkeys_seed"})
DEFAULT_DUPLICATE_WINDOW_S = 300.0
#: the server refuses a shorter window (measured: "duplicates window needs to be >= 100ms")
MIN_DUPLICATE_WINDOW_S = 0.1
#: JetStream's largest replica count
MAX_REPLICAS = 5
#: nats-py connect() options passed through as they are, with the type each must have
_CLIENT_OPTIONS = (("tls_hostname", str), ("tls_handshake_first", bool),
                   ("user_credentials", (str, tuple)), ("nkeys_seed", str))


@dataclasses.dataclass(frozen=True)
class NATSOptions:
    """The validated options of one NATS store.

    :param duplicate_window_s: seconds a claimed run is remembered (>= 0.1).
    :param replicas: copies of each stream (1 to 5), ``None`` for the default (3 on a cluster
        of at least 3 servers, else 1).
    :param history_size: runs of history kept per entry (>= 1).
    :param claim_timeout: seconds one operation may take, connecting included (> 0).
    :param servers: the server URLs, credentials included (for nats-py only, never logged).
    :param tls_required: a ``tls://`` URL: an unencrypted connection is refused.
    :param client: nats-py ``connect()`` keyword arguments (name, connect_timeout, TLS, creds).
    """

    duplicate_window_s: float
    replicas: int | None
    history_size: int
    claim_timeout: float
    servers: list[str]
    tls_required: bool
    client: dict


def parse(url: str, instance_id: str, options: dict) -> NATSOptions:
    """Validate ``url`` and ``options`` (``anarchon_store_options``) of a NATS store.

    :raises ConfigError: an unknown option, a value out of its range or of the wrong type, or a
        URL part that is not ``nats://`` or ``tls://`` with a host (its password masked).
    """
    reject_unknown_options("nats", options, OPTIONS)
    window_s = _util.seconds("duplicate_window",
                             options.get("duplicate_window", DEFAULT_DUPLICATE_WINDOW_S),
                             minimum=MIN_DUPLICATE_WINDOW_S, why="NATS refuses shorter windows")
    replicas = options.get("replicas")
    if replicas is not None:
        replicas = _util.positive_int(
            "replicas", replicas, maximum=MAX_REPLICAS,
            why="JetStream's replica count; 3 on a cluster keeps every acknowledged claim when one "
                "server is lost; or leave it out: 3 on a cluster of at least 3 servers, else 1")
    history_size = _util.positive_int("history_size",
                                      options.get("history_size", DEFAULT_HISTORY_SIZE))
    claim_timeout = _util.seconds("claim_timeout",
                                  options.get("claim_timeout", DEFAULT_CLAIM_TIMEOUT_S))
    servers = [part.strip() for part in url.split(",") if part.strip()]
    for part in servers or [url]:
        try:
            bits = urlsplit(part)
            bits.port  # noqa: B018  (raises ValueError for a bad port)
        except ValueError:
            bits = None
        if bits is None or bits.scheme.lower() not in ("nats", "tls") or not bits.hostname:
            raise ConfigError(f"anarchon_store_url {mask_url(part)!r}: expected "
                              "nats://[user:password@]host[:port] or tls://..., several "
                              "separated by commas")
    return NATSOptions(
        duplicate_window_s=window_s, replicas=replicas, history_size=history_size,
        claim_timeout=claim_timeout, servers=servers,
        tls_required=any(p.lower().startswith("tls://") for p in servers),
        client=_client_options(instance_id, claim_timeout, options))


def _client_options(instance_id: str, claim_timeout: float, options: dict) -> dict:
    """nats-py's ``connect()`` arguments: the client name, the connect timeout and the TLS and
    credential options given (each type-checked: ConfigError)."""
    kwargs = {"name": f"celery_anarchon {instance_id}", "connect_timeout": claim_timeout}
    if "tls" in options:
        if not isinstance(options["tls"], ssl.SSLContext):
            raise ConfigError(f"{_util.store_option('tls')} = {options['tls']!r}: must be an "
                              "ssl.SSLContext (e.g. ssl.create_default_context(cafile=...))")
        kwargs["tls"] = options["tls"]
    for name, kind in _CLIENT_OPTIONS:
        if name in options:
            if not isinstance(options[name], kind):
                raise ConfigError(f"{_util.store_option(name)} = {options[name]!r}: wrong type "
                                  "(see nats-py's connect())")
            kwargs[name] = options[name]
    return kwargs
