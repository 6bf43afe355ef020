"""What the tests of real Celery processes read on their broker (the Redis database 8 of the test
Redis): the messages still waiting in a queue once the beats stopped, sent but not yet executed."""
from __future__ import annotations

import json
import time

import redis

from conftest import REDIS_URL

#: the broker of the tests' Celery processes: database 8 of the test Redis
BROKER_URL = REDIS_URL.rsplit("/", 1)[0] + "/8"


def queued_messages(queue: str) -> list[dict]:
    """The headers of the messages still waiting in ``queue`` on the broker (kombu's Redis
    transport: one list per queue and priority)."""
    client = redis.Redis.from_url(BROKER_URL)
    try:
        found = []
        for key in client.scan_iter(match=f"{queue}*"):
            if client.type(key) != b"list":
                continue
            for raw in client.lrange(key, 0, -1):
                found.append(json.loads(raw)["headers"])
        return found
    finally:
        client.close()


def wait_drained(queue: str, timeout: float) -> list[dict]:
    """Wait until the worker emptied ``queue`` (nothing more is sent to it) or ``timeout``
    passed; returns the headers of the messages still waiting (sent, never executed)."""
    deadline = time.monotonic() + timeout
    while (left := queued_messages(queue)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left
