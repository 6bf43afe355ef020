"""The Redis stores of a test and the round trips they make, shared by the tests of the Redis
store (tests/stores/test_store_redis.py) and of its strategies (test_store_redis_strategies.py)."""
from __future__ import annotations

import redis

from stores_support import StoreMaker, store_url


def redis_maker(kind: str, namespace: str):
    """A StoreMaker of a Redis ``kind`` (stores_support); deletes the namespace's keys after."""
    maker = StoreMaker(kind, store_url(kind, ""), namespace)
    yield maker
    maker.close_all()
    server = redis.Redis.from_url(maker.url)
    for key in server.scan_iter(match=f"anarchon:{{{namespace}*"):
        server.delete(key)
    server.close()


def round_trips(s, monkeypatch) -> list[list[str]]:
    """Every round trip ``s`` makes from now on, as the list of the commands it sends (a
    pipeline is one round trip)."""
    s.now_ms()  # connected: the connection's handshake is not counted
    sent: list[list[str]] = []
    real = redis.connection.Connection.send_packed_command

    def send(conn, command, check_health=True):
        chunks = command if isinstance(command, list) else [command]
        data = b"".join(c if isinstance(c, bytes) else bytes(c) for c in chunks)
        names = [line.decode() for line in data.split(b"\r\n")
                 if line.upper() in (b"EVALSHA", b"WAIT", b"WAITAOF", b"EVAL", b"SCRIPT")]
        sent.append(names)
        return real(conn, command, check_health)

    monkeypatch.setattr(redis.connection.Connection, "send_packed_command", send)
    return sent
