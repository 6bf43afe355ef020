"""The operators' commands as probes and deploy scripts read them: ``check`` on a store beat has
not made yet (it creates nothing), the summaries' counts, and what a new store's first refusals
look like (tests/support/apps/operate_app.py, real subprocesses on real stores)."""
from __future__ import annotations

import os

import redis

from backends import url_of
from operate_support import exits, operate


def test_check_on_a_sqlite_store_not_made_yet_says_so_and_creates_nothing(tmp_path, namespace):
    path = tmp_path / "new" / "store.sqlite3"
    out = exits(operate(f"sqlite:///{path}", namespace, "good", "check"), 0)
    assert (f"ok    store reachable, not created yet: namespace {namespace!r} has no data in "
            f"sqlite:///{path}; beat's first start creates it (check creates nothing)") in out, out
    assert not path.exists() and not path.parent.exists(), os.listdir(tmp_path)


def test_check_on_a_redis_namespace_not_made_yet_writes_nothing(namespace):
    url = url_of("redis")
    out = exits(operate(url, namespace, "good", "check"), 0)
    assert f"ok    store reachable, not created yet: namespace {namespace!r}" in out, out
    client = redis.Redis.from_url(url)
    try:
        assert list(client.scan_iter(match=f"*{namespace}*")) == []
    finally:
        client.close()
