"""The Redis store's options: validated once, with ConfigError naming the option, the value and
the rule (strategies, durability, key prefix, Sentinel URLs)."""
from __future__ import annotations

from urllib.parse import quote, unquote, urlsplit

import redis

from celery_anarchon import _util
from celery_anarchon._util import mask_url
from celery_anarchon.errors import ConfigError
from celery_anarchon.stores._common import reject_unknown_options, scheme_of
from celery_anarchon.stores.base import DEFAULT_MEMORY_S

#: Options of ``anarchon_store_options`` every strategy understands (besides the common ones).
OPTIONS = frozenset({"strategy", "key_prefix", "master_name", "sentinel_kwargs", "durability",
                     "min_replicas", "confirm_timeout", "replica_grace", "allow_eviction"})
#: Values of the ``durability`` option: what a won claim is confirmed on before it is answered WON.
DURABILITIES = ("auto", "none", "replica", "aof", "replica+aof")
#: Default ``confirm_timeout``, seconds (lowered to half of ``claim_timeout`` when that is shorter).
DEFAULT_CONFIRM_TIMEOUT_S = 2.0
#: ``durability="auto"`` counts a replica only if it acknowledged within this many seconds
#: (``INFO replication`` lag): a replica that is down or stalled does not stop the schedule.
LIVE_REPLICA_LAG_S = 3
#: Default ``replica_grace``, seconds: Redis's own ``repl-timeout`` default. With durability
#: "auto", a master with no live replica whose replicas confirmed claims within this long still
#: needs one (an old master cut off by a failover must not confirm alone), then goes on alone.
DEFAULT_REPLICA_GRACE_S = 60.0
#: The first Redis with WAITAOF.
WAITAOF_VERSION = (7, 2)
#: How long a claim made under the ``stream-id`` settings counts, ms, when another strategy wants
#: to replace them (it has no memory setting: it remembers forever, so assume the lease default).
STREAM_ID_HORIZON_MS = int(DEFAULT_MEMORY_S * 1000)
#: Each strategy's own options (docs/design.md store memory table: the setting of its memory).
STRATEGY_OPTIONS = {"lease": ("memory",), "stream-id": (), "script": ("window",),
                    "idmp": ("duration", "max_size")}
STRATEGIES = tuple(STRATEGY_OPTIONS)
#: The Redis version each strategy needs: streams (XADD with explicit ids) and scripts replicated by
#: effects (TIME before writes) exist from 5.0; XADD ... IDMP from 8.6.
MIN_VERSIONS = {"lease": (5, 0), "stream-id": (5, 0), "script": (5, 0), "idmp": (8, 6)}
DEFAULT_KEY_PREFIX = "anarchon"
SENTINEL_PORT = 26379
#: maxmemory policies that may evict keys without a TTL (ours): claims would vanish. The claim
#: scripts refuse every claim under one of them (any ``allkeys-*``), read per batch.
_EVICTING = ("allkeys-lru", "allkeys-lfu", "allkeys-random")


# -- options -----------------------------------------------------------------------------------

def _strategy(value) -> str:
    """The ``strategy`` option: one of :data:`STRATEGIES` ('lease' by default)."""
    return _util.one_of("strategy", value, STRATEGIES)


def check_options(strategy: str, options: dict) -> None:
    """ConfigError for an option of another strategy (a ``window`` with strategy ``idmp`` is a
    typo or a half-done change, not something to ignore) or one no Redis strategy knows."""
    for name in options:
        owners = [s for s, names in STRATEGY_OPTIONS.items() if name in names and s != strategy]
        if owners and name not in STRATEGY_OPTIONS[strategy]:
            raise ConfigError(
                f"anarchon_store_options[{name!r}] belongs to the Redis strategy {owners[0]!r}, not "
                f"to {strategy!r} (the strategy in use); remove it, or set 'strategy' to "
                f"{owners[0]!r}. Options of {strategy!r}: "
                f"{', '.join(STRATEGY_OPTIONS[strategy]) or 'none besides the common ones'}.")
    reject_unknown_options(f"redis (strategy {strategy!r})", options,
                           OPTIONS | set(STRATEGY_OPTIONS[strategy]))


def _durability(options: dict, claim_timeout: float) -> tuple[str, int, float, float]:
    """(durability, min_replicas, confirm_timeout s, replica_grace s) from the options, validated
    (ConfigError naming the option, the value and what is allowed)."""
    mode = _util.one_of("durability", options.get("durability", "auto"), DURABILITIES)
    if "min_replicas" in options and "replica" not in mode:
        raise ConfigError(f"anarchon_store_options['min_replicas'] = {options['min_replicas']!r} "
                          f"applies to durability 'replica' or 'replica+aof', not {mode!r} ('auto' "
                          "waits for every replica the master has connected)")
    min_replicas = _util.positive_int("min_replicas", options.get("min_replicas", 1))
    if "confirm_timeout" in options:
        confirm = _util.seconds("confirm_timeout", options["confirm_timeout"])
    else:
        confirm = min(DEFAULT_CONFIRM_TIMEOUT_S, claim_timeout / 2)
    if confirm >= claim_timeout:
        raise ConfigError(f"anarchon_store_options['confirm_timeout'] = {confirm:g} s must be below "
                          f"anarchon_store_options['claim_timeout'] = {claim_timeout:g} s (a claim's "
                          "reply waits for its confirmation); lower confirm_timeout or raise "
                          "claim_timeout")
    if "replica_grace" in options and mode != "auto":
        raise ConfigError(f"anarchon_store_options['replica_grace'] = {options['replica_grace']!r} "
                          f"applies to durability 'auto', not {mode!r} ('replica' always waits "
                          "for min_replicas)")
    grace = _util.seconds("replica_grace", options.get("replica_grace", DEFAULT_REPLICA_GRACE_S))
    return mode, min_replicas, confirm, grace


def _allow_eviction(value) -> bool:
    """The ``allow_eviction`` option: True or False (no other truthy value: it gives up the
    guarantee, so it must be meant)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{_util.store_option('allow_eviction')} = {value!r}: must be True or False")
    return value


def _key_prefix(value) -> str:
    if not isinstance(value, str) or not value or "{" in value or "}" in value:
        raise ConfigError(f"anarchon_store_options['key_prefix'] = {value!r}: must be a non-empty "
                          "string without '{' or '}' (braces would change the keys' hash tag)")
    return value


def parse_sentinel_url(url: str) -> tuple[list[tuple[str, int]], dict]:
    """``sentinel://[user:password@]host[:port][/db];sentinel://...`` -> (sentinels, master kwargs).

    As Celery's broker: each part names one Sentinel (port 26379 by default); credentials and db
    (given on any part, consistently) are those of the Redis master.
    """
    sentinels, master = [], {}
    for part in filter(None, (p.strip() for p in url.split(";"))):
        try:
            bits = urlsplit(part)
            host, port = bits.hostname, bits.port or SENTINEL_PORT
        except ValueError as exc:
            raise ConfigError(f"anarchon_store_url {mask_url(part)!r}: {exc}") from exc
        if bits.scheme.lower() != "sentinel" or not host:
            raise ConfigError(f"anarchon_store_url {mask_url(part)!r}: every part of a Sentinel "
                              "URL must look like sentinel://[:password@]host[:port][/db]")
        if bits.query:
            raise ConfigError(f"anarchon_store_url {mask_url(part)!r}: Sentinel URLs take no query "
                              "parameters; use anarchon_store_options['sentinel_kwargs']")
        db = bits.path.strip("/")
        given = {"username": unquote(bits.username) if bits.username else None,
                 "password": unquote(bits.password) if bits.password is not None else None,
                 "db": int(db) if db.isdigit() else None}
        if db and not db.isdigit():
            raise ConfigError(f"anarchon_store_url {mask_url(part)!r}: the db must be a number")
        for name, value in given.items():
            if value is not None and master.setdefault(name, value) != value:
                raise ConfigError(f"anarchon_store_url {mask_url(url)!r}: the Sentinel parts give "
                                  f"different {name} values")
        sentinels.append((host, port))
    if not sentinels:
        raise ConfigError(f"anarchon_store_url {mask_url(url)!r}: no Sentinel given")
    return sentinels, master


def namespace_key_prefix(key_prefix: str, namespace: str) -> str:
    """``<prefix>:{<namespace>}``: the start of every key of the namespace itself (the store-wide
    hash, entries, pauses, requests, instances: one hash tag)."""
    return f"{key_prefix}:{{{quote(namespace, safe='')}}}"


def sentinel_setup(url: str, options: dict, safe_url: str) -> tuple | None:
    """For a ``sentinel://`` URL: (sentinels, master kwargs, ``master_name``, ``sentinel_kwargs``)
    from the URL and the options; ``None`` for any other URL (checked with redis-py's parser).

    :raises ConfigError: no ``master_name`` for a Sentinel URL, ``sentinel_kwargs`` not a dict,
        either option with another URL, or a URL redis-py cannot parse.
    """
    if scheme_of(url) == "sentinel":
        master_name = options.get("master_name")
        if not isinstance(master_name, str) or not master_name:
            raise ConfigError(f"anarchon_store_url {safe_url!r} is a Sentinel URL: set "
                              "anarchon_store_options['master_name'] to the master's name")
        sentinel_kwargs = options.get("sentinel_kwargs") or {}
        if not isinstance(sentinel_kwargs, dict):
            raise ConfigError(f"anarchon_store_options['sentinel_kwargs'] = {sentinel_kwargs!r}:"
                              " must be a dict of connection arguments")
        return (*parse_sentinel_url(url), master_name, sentinel_kwargs)
    for name in ("master_name", "sentinel_kwargs"):
        if name in options:
            raise ConfigError(f"anarchon_store_options[{name!r}] applies to sentinel:// URLs"
                              f" only, not to {safe_url!r}")
    try:
        redis.connection.parse_url(url)
    except ValueError as exc:
        raise ConfigError(f"anarchon_store_url {safe_url!r}: {exc}") from exc
    if scheme_of(url) in ("redis", "rediss"):     # redis-py takes any other path as db 0
        db = unquote(urlsplit(url).path).strip("/")
        if db and not db.isdigit():
            raise ConfigError(f"anarchon_store_url {safe_url!r}: the database {db!r} is not a "
                              "number; fix: end the URL with the database's number, e.g. "
                              "redis://host:6379/0")
    return None


def entry_key_prefix(key_prefix: str, namespace: str, entry: str) -> str:
    """``<prefix>:{<namespace>:<entry>}``: the start of every key of one entry (one hash tag)."""
    return f"{key_prefix}:{{{quote(namespace, safe='')}:{quote(entry, safe='')}}}"
