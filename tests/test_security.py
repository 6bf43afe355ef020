"""Security: passwords never printed, nothing from a store unpickled or evaluated.

TLS URLs reaching the client libraries unchanged are tested per store (test_store_redis.py
rediss://, test_store_sql.py sslmode, test_store_rabbitmq.py amqps://, test_store_nats.py tls://);
entry names that could collide with or inject into another entry's keys, rows or subjects are in
the contract suite (test_entry_names_never_collide, on every store).
"""
from __future__ import annotations

import ast
import pathlib

import pytest

from celery_anarchon.stores import mask_url

from cluster import Cluster
from conftest import REDIS_URL, require_server

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "celery_anarchon"


@pytest.mark.parametrize("url, masked", [
    ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
    ("redis://user:pw@h/0", "redis://user:***@h/0"),
    ("postgresql://u:p%40ss@db:5432/app?sslmode=require", "postgresql://u:***@db:5432/app?sslmode=require"),
    ("amqps://guest:guest@rabbit:5671/vh", "amqps://guest:***@rabbit:5671/vh"),
    ("nats://u:secret@n1:4222", "nats://u:***@n1:4222"),
    ("redis://h:6379/0", "redis://h:6379/0"),
])
def test_passwords_are_masked(url, masked):
    assert mask_url(url) == masked


def test_nothing_read_from_a_store_is_unpickled_or_evaluated():
    """No module of the package imports pickle/marshal/shelve or calls eval/exec."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if {"pickle", "marshal", "shelve", "dill", "cloudpickle"} & {n.split(".")[0] for n in names}:
                    offenders.append(f"{path.name}:{node.lineno} imports {names}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("eval", "exec"):
                offenders.append(f"{path.name}:{node.lineno} calls {node.func.id}")
    assert not offenders, offenders


def test_the_status_command_never_prints_the_store_password(tmp_path):
    """`celery anarchon status` names the store with its password masked."""
    require_server(REDIS_URL, "Redis")
    url = REDIS_URL.replace("redis://", "redis://:s3cret@", 1)
    procs = Cluster(str(tmp_path), {
        "ANARCHON_IT_BROKER": "memory://", "ANARCHON_IT_STORE": url, "ANARCHON_IT_NAMESPACE": "sec",
        "ANARCHON_IT_QUEUE": "sec", "ANARCHON_IT_OUT": str(tmp_path / "out")})
    status = procs.start("status", "anarchon", "status")
    try:
        status.popen.wait(60)
    finally:
        procs.stop_all()
    output = status.text()
    assert "s3cret" not in output
    assert ":***@127.0.0.1" in output
