"""The Redis store (docs/design.md store memory table: Redis ``lease``, ``stream-id``, ``script``,
``idmp``): one unit.

* :mod:`.options`: the options, validated (strategies, durability, key prefix, Sentinel URLs);
* :mod:`.store`: :class:`RedisStore`, what every strategy shares (connections, the scripts' header,
  start-up checks, durability, history, definitions); ``RedisStore(url, strategy=...)`` builds
  the class of the strategy asked for;
* :mod:`.server`: what the store reads and judges about its server (facts, durability, warnings);
* :mod:`.entries`: the entry store (entries, pauses, run-now requests, instance records), every
  strategy, composed into the store;
* :mod:`.lease`: strategy ``lease``, the lease store, with its scripts in :mod:`.lease_scripts`;
* :mod:`.strategies`: the claim-only strategies, with their scripts in :mod:`.strategy_scripts`;
* :mod:`.scripts`: the prelude every claim-side script shares and the scripts every strategy runs.
"""
from celery_anarchon.stores.redis.options import parse_sentinel_url  # noqa: F401
from celery_anarchon.stores.redis.store import RedisStore  # noqa: F401
from celery_anarchon.stores.redis.lease import RedisLeaseStore  # noqa: F401  (registers "lease")
from celery_anarchon.stores.redis.strategies import (  # noqa: F401  (register the others)
    RedisIdmpStore, RedisScriptStore, RedisStreamIdStore,
)
