"""The Redis Cluster the tests share: three masters of our own (benchmarks/redis_cluster.py), started
once per test process on first use, unless ``ANARCHON_TEST_REDIS_CLUSTER_URL`` points at one, and
stopped when the process exits. Its URL is put into that variable, so the Celery processes a test
starts reach the same cluster.

The shared cluster has no replicas: its tests prove what the store does on a cluster (keys on
their slots, scripts, one winner), and a claim there must not wait on a replica's acknowledgement,
which a loaded machine delays past the store's bounds (a replica counts as live within 3 s) and
turns a won claim into an unconfirmed one. What replication does (failovers, unconfirmed writes,
WAITAOF) is proved in tests/stores/test_redis_cluster.py on rigs with replicas of their own."""
from __future__ import annotations

import atexit
import os
import shutil
import threading

REDIS_CLUSTER = "ANARCHON_TEST_REDIS_CLUSTER_URL"
_lock = threading.Lock()
_rig = None


def cluster_url() -> str | None:
    """The shared cluster's URL: the variable's, else a rig started now (None when
    ``redis-server`` is not installed)."""
    global _rig
    with _lock:
        if os.environ.get(REDIS_CLUSTER):
            return os.environ[REDIS_CLUSTER]
        if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
            return None
        from redis_cluster import RedisClusterRig
        _rig = RedisClusterRig(replicas=0).__enter__()
        atexit.register(_rig.close)
        os.environ[REDIS_CLUSTER] = _rig.url
        return _rig.url
