"""The Redis store (DESIGN.md store memory table: Redis ``lease``, ``stream-id``, ``script``,
``idmp``): one unit.

* :mod:`.options`: the options, validated (strategies, durability, key prefix, Sentinel URLs);
* :mod:`.store`: :class:`RedisStore`, what every strategy shares (connections, the scripts' header,
  start-up checks, durability, history, definitions); ``RedisStore(url, strategy=...)`` builds
  the class of the strategy asked for;
* :mod:`.lease`: strategy ``lease``, the lease store;
* :mod:`.strategies`: the claim-only strategies;
* :mod:`.scripts`: the Lua scripts of the lease strategy and the shared ones.
"""
from celery_anarchon.stores.redis.options import parse_sentinel_url  # noqa: F401
from celery_anarchon.stores.redis.store import RedisStore  # noqa: F401
from celery_anarchon.stores.redis.lease import RedisLeaseStore  # noqa: F401  (registers "lease")
from celery_anarchon.stores.redis.strategies import (  # noqa: F401  (register the others)
    RedisIdmpStore, RedisScriptStore, RedisStreamIdStore,
)
