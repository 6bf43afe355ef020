"""The Redis store (docs/design.md store memory table: Redis ``lease``, ``stream-id``, ``script``,
``idmp``): one unit.

* :mod:`.store`: :class:`RedisStore`, what every strategy shares (options, keys, start-up checks),
  joining the parts below;
* :mod:`.connection`: the client, the scripts registered on it, and every round trip that runs
  them, with the confirmation of a durable claim;
* :mod:`.options`: the options, validated (strategies, durability, key prefix, Sentinel URLs);
* :mod:`.server`: what the store reads and judges about its server (facts, durability, warnings);
* :mod:`.history`: history and definitions;
* :mod:`.entries`: the entry store (entries, pauses, run-now requests), every strategy, with its
  scripts in :mod:`.entry_scripts`;
* :mod:`.instances`: instance records (heartbeats) and fingerprint mappings;
* :mod:`.lease`: strategy ``lease``, the lease store, with its scripts in :mod:`.lease_scripts`;
* :mod:`.strategies`: the claim-only strategies, with their scripts in :mod:`.strategy_scripts`;
* :mod:`.scripts`: the prelude every claim-side script shares and the scripts every strategy runs;
* :mod:`.cluster`: the Redis Cluster store (``redis+cluster://``), on :mod:`.cluster_connection`,
  :mod:`.cluster_entries` and :mod:`.cluster_keys`.

Each strategy is a class of its own; the URL scheme table names :func:`open_redis_store`, which
builds the class of the strategy asked for (:data:`STRATEGIES`).
"""
from __future__ import annotations

from celery_anarchon.stores.redis.lease import RedisLeaseStore
from celery_anarchon.stores.redis.options import _strategy, parse_sentinel_url  # noqa: F401
from celery_anarchon.stores.redis.store import RedisStore
from celery_anarchon.stores.redis.strategies import (
    RedisIdmpStore, RedisScriptStore, RedisStreamIdStore,
)

#: The value of the ``strategy`` store option -> the class that claims that way.
STRATEGIES: dict[str, type[RedisStore]] = {
    "lease": RedisLeaseStore,
    "stream-id": RedisStreamIdStore,
    "script": RedisScriptStore,
    "idmp": RedisIdmpStore,
}


def open_redis_store(url: str, *, namespace: str, instance_id: str, **options) -> RedisStore:
    """The Redis store of ``url`` (``redis://``, ``rediss://``, ``unix://``, ``sentinel://``) with
    the strategy the ``strategy`` option names (``"lease"`` by default): the factory of the URL
    scheme table (:func:`celery_anarchon.stores.open_store`). No I/O.

    :param options: ``anarchon_store_options`` (:class:`RedisStore` documents them).
    :raises ConfigError: an unknown strategy, an option of another strategy, or a bad value.
    """
    cls = STRATEGIES[_strategy(options.get("strategy", "lease"))]
    return cls(url, namespace=namespace, instance_id=instance_id, **options)
