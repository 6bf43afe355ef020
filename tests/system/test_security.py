"""Security: passwords never printed, nothing from a store unpickled or evaluated.

TLS URLs reaching the client libraries unchanged are tested per store (test_store_redis.py
rediss://, test_store_sql.py sslmode, test_store_rabbitmq.py amqps://, test_store_nats.py tls://);
entry names that could collide with or inject into another entry's keys, rows or subjects are in
the contract suite (test_entry_names_never_collide, on every store).
"""
from __future__ import annotations

import ast
import json
import pathlib

import pytest
import redis

from celery_anarchon.stores import mask_url

from cluster import Cluster
from conftest import POSTGRES_URL, REDIS_URL, require_server
from servers import RedisServer
from operate_support import free_port, http, wait_served

from paths import PACKAGE


@pytest.mark.parametrize("url, masked", [
    ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
    ("redis://user:pw@h/0", "redis://user:***@h/0"),
    ("postgresql://u:p%40ss@db:5432/app?sslmode=require", "postgresql://u:***@db:5432/app?sslmode=require"),
    ("amqps://guest:guest@rabbit:5671/vh", "amqps://guest:***@rabbit:5671/vh"),
    ("nats://u:secret@n1:4222", "nats://u:***@n1:4222"),
    ("redis://h:6379/0", "redis://h:6379/0"),
    # credentials in the query (redis-py and libpq take them there), any case, any of their names
    ("redis://h:6379/0?password=s3cret", "redis://h:6379/0?password=***"),
    ("rediss://h/0?ssl_cert_reqs=required&Password=s3cret&client_name=beat",
     "rediss://h/0?ssl_cert_reqs=required&Password=***&client_name=beat"),
    ("postgresql://u@db/app?sslmode=require&password=s3cret&sslpassword=k3y",
     "postgresql://u@db/app?sslmode=require&password=***&sslpassword=***"),
    ("postgresql://db/app?user=u&PWD=s3cret", "postgresql://db/app?user=u&PWD=***"),
    ("postgresql://db/app?passwd=s3cret", "postgresql://db/app?passwd=***"),
    ("redis://h/0?pass%77ord=s3cret", "redis://h/0?pass%77ord=***"),
    ("redis://h/0?auth_token=s3cret&x-api-key=s3cret&aws_secret_access_key=s3cret&key=s3cret",
     "redis://h/0?auth_token=***&x-api-key=***&aws_secret_access_key=***&key=***"),
    ("redis://h/0?client_secret=s3cret&AccessKey=s3cret&token=s3cret#frag",
     "redis://h/0?client_secret=***&AccessKey=***&token=***#frag"),
    ("redis://h/0?sslmode=x;password=s3cret&db=1", "redis://h/0?sslmode=x;password=***&db=1"),
    ("redis://h/0?password=", "redis://h/0?password="),
    ("redis://h/0?passfile=/etc/pgpass&ssl_keyfile=/k.pem", "redis://h/0?passfile=/etc/pgpass&ssl_keyfile=/k.pem"),
    # a password holding characters that end the host part when not %-encoded
    ("redis://:s3c#ret@h:6379/0", "redis://:***@h:6379/0"),
    ("redis://u:s3c?ret@h/0", "redis://u:***@h/0"),
    # NATS: a lone user part is a token
    ("nats://s3cret@n1:4222", "nats://***@n1:4222"),
    ("tls://alice:s3cret@n1:4222,tls://s3cret@n2", "tls://alice:***@n1:4222,tls://***@n2"),
    ("nats://n1:4222,nats://n2:4222", "nats://n1:4222,nats://n2:4222"),
    # several servers in one URL
    ("sentinel://:s3cret@s1:26379;sentinel://:s3cret@s2:26379/0?password=s3cret",
     "sentinel://:***@s1:26379;sentinel://:***@s2:26379/0?password=***"),
    ("redis+cluster://u:s3cret@h1:7000,h2:7001/?password=s3cret",
     "redis+cluster://u:***@h1:7000,h2:7001/?password=***"),
    ("redis+cluster://u:s3c,ret@h1:7000,h2:7001/", "redis+cluster://u:***@h1:7000,h2:7001/"),
    ("sqlite:////var/lib/anarchon.sqlite3", "sqlite:////var/lib/anarchon.sqlite3"),
    ("amqp://guest@rabbit//", "amqp://guest@rabbit//"),
])
def test_passwords_are_masked(url, masked):
    assert mask_url(url) == masked
    assert "s3c" not in mask_url(url)


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


SECRET = "s3cretq"


@pytest.mark.parametrize("kind", ["redis", "postgresql"])
def test_a_password_in_the_query_is_never_printed(kind, tmp_path, namespace):
    """A store password given in the URL's query (``?password=``, which redis-py and libpq
    read) is masked by everything that prints the URL: ``status``, ``status --json``,
    ``check``, the status page and ``/api/status``, and beat's start-up lines. The Redis case
    runs a server of its own that requires the password, so the commands really use it."""
    server = None
    if kind == "redis":
        server = RedisServer("pw", str(tmp_path), persistent=False)
        server.start()
        redis.Redis(port=server.port).config_set("requirepass", SECRET)
        url = f"redis://127.0.0.1:{server.port}/0?password={SECRET}"
    else:
        require_server(POSTGRES_URL, "PostgreSQL")
        url = f"{POSTGRES_URL}?sslmode=disable&password={SECRET}"
    procs = Cluster(str(tmp_path), {"ANARCHON_CLI_STORE": url, "ANARCHON_CLI_NAMESPACE": namespace},
                    app="cli_app")
    port = free_port()
    try:
        beat = procs.beat("beat")
        commands = {name: procs.start(name, "anarchon", *args) for name, args in (
            ("status", ("status",)), ("status-json", ("status", "--json")), ("check", ("check",)))}
        page = procs.start("web", "anarchon", "web", "--port", str(port))
        base = f"http://127.0.0.1:{port}"
        wait_served(base, page)
        html, data = http(base + "/")[1], http(base + "/api/status")[1]
        for proc in commands.values():
            proc.popen.wait(60)
        procs.wait_log("beat", "anarchon: instance", 60)
    finally:
        procs.stop_all()
        if server is not None:
            server.stop()
    outputs = {name: proc.text() for name, proc in commands.items()}
    outputs.update(page=html, api=data, web=page.text(), beat=beat.text())
    for name, text in outputs.items():
        assert SECRET not in text, f"{name} printed the password:\n{text}"
    for name in ("status", "check", "page", "beat"):
        assert "password=***" in outputs[name], f"{name}:\n{outputs[name]}"
    assert json.loads(data)["store"]["url"].endswith("password=***")
    assert json.loads(outputs["status-json"])["store"]["reachable"] is True, outputs["status-json"]
    assert "ok    store reachable" in outputs["check"], outputs["check"]
