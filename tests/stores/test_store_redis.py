"""What only the Redis store promises: key layout, server checks, connections and errors.

The shared promises of every lease store are proved by test_store_contract.py.
"""
from __future__ import annotations

import inspect
import multiprocessing
import socket
import time

import pytest
import redis
from redis.crc import key_slot

from celery_anarchon.errors import ConfigError, StoreUnavailable
from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import (
    LATENESS_TOLERANCE_MS, LeaseTerms, Outcome, TakeoverOutcome,
)
from celery_anarchon.stores.redis import STRATEGIES, RedisStore, parse_sentinel_url
from celery_anarchon.stores.redis import options as redis_options

from conftest import REDIS_URL
from stores_support import wait_until
from redis_stores import redis_maker, round_trips
from helpers import prepared, req

NAMES = ["a:b", "a", "x}", "{x", "{x}", "it's", 'say "hi"', "with space", "with_space", "café",
         "cafe", "%3A", ":", "", "日本", "a}:{b"]


@pytest.fixture
def stores(namespace):
    yield from redis_maker("redis", namespace)


@pytest.fixture
def server():
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    yield client
    client.close()


def store(namespace="ns", **options) -> RedisStore:
    return open_store(REDIS_URL, namespace=namespace, instance_id="A", options=options)


# -- key layout ---------------------------------------------------------------------------------

def hash_tag(key: str) -> str:
    start = key.index("{")
    return key[start + 1:key.index("}", start + 1)]


def test_every_key_of_an_entry_has_the_same_hash_tag():
    """All keys of one entry land in one cluster slot, whatever the entry's name."""
    s = store(namespace="app:{1}")
    for name in NAMES:
        keys = list(s.keys_of(name).values())
        assert len({hash_tag(k) for k in keys}) == 1, keys
        assert len({key_slot(k.encode()) for k in keys}) == 1, keys


def test_entry_names_map_to_distinct_hash_tags_and_keys():
    """Names with ':', braces, quotes, spaces or non-ASCII never share or reach into another
    entry's keys; neither do namespace/entry splits of the same text."""
    s = store(namespace="ns")
    tags = {name: hash_tag(s.keys_of(name)["claims"]) for name in NAMES}
    assert len(set(tags.values())) == len(NAMES), tags
    for tag in tags.values():
        assert "{" not in tag and "}" not in tag and tag.count(":") == 1
    all_keys = [k for name in NAMES for k in s.keys_of(name).values()]
    assert len(all_keys) == len(set(all_keys))
    split_a = store(namespace="a").keys_of("b:c")["claims"]
    split_b = store(namespace="a:b").keys_of("c")["claims"]
    assert split_a != split_b


def test_key_prefix_option(stores):
    s = stores(key_prefix="beat")
    assert all(k.startswith("beat:{") for k in s.keys_of("e").values())
    with pytest.raises(ConfigError, match="key_prefix"):
        stores(key_prefix="a{b}")


# -- the server ---------------------------------------------------------------------------------

def test_warns_when_the_server_keeps_no_data(stores, server):
    """This server runs with --save "" --appendonly no: a restart would forget every claim."""
    keeps_nothing = (server.config_get("save")["save"] == ""
                     and server.config_get("appendonly")["appendonly"] == "no")
    warnings = stores("A").prepare(["e"])
    text = " ".join(warnings)
    if keeps_nothing:
        assert "restart forgets every claim" in text and "appendonly yes" in text
        assert "never duplicates" in text
    else:
        assert "keeps no data" not in text


def test_batch_claim_is_one_round_trip(stores, monkeypatch):
    """All runs of a tick, over several entries, in one EVALSHA."""
    s = prepared(stores("A"), "a", "b", "c")
    now = s.now_ms()
    sent = round_trips(s, monkeypatch)
    results = s.claim([req(e, now + i) for e in ("a", "b", "c") for i in range(5)])
    assert sent == [["EVALSHA"]], "the claim script, and no WAIT on a server without replicas"
    assert all(r.outcome is Outcome.WON for r in results)


def test_claims_are_pruned_by_age_only(stores, server):
    """More claims than history_size are all kept while within memory; past the memory a later
    claim prunes them (no TTL on any key)."""
    s = prepared(stores("A", memory=1, history_size=5))
    keys = s.keys_of("e")
    first = s.now_ms() + 1
    slots = [first + i for i in range(20)]
    assert all(r.outcome is Outcome.WON for r in s.claim([req("e", slot) for slot in slots]))
    assert server.hlen(keys["claims"]) == 20, "never pruned by count"
    assert server.zcard(keys["history:slots"]) == 5
    assert all(server.ttl(k) == -1 for k in keys.values() if server.exists(k))
    wait_until(lambda: s.now_ms() > slots[-1] + 1000, 10, "the memory to pass")
    assert server.hlen(keys["claims"]) == 20, "nothing expires on its own"
    fresh = s.now_ms() + 1
    assert s.claim([req("e", fresh)])[0].outcome is Outcome.WON
    assert server.hkeys(keys["claims"]) == [str(fresh)]
    assert server.zrange(keys["claims:expiry"], 0, -1) == [str(fresh)]


def test_fencing_tokens_are_exact_microsecond_integers(stores, server):
    """Tokens (store clock in us, ~1.8e15) survive Lua's 14-digit number formatting."""
    s = prepared(stores("A"))
    slot = s.now_ms() + 1
    token = s.claim([req("e", slot, lease=LeaseTerms(60_000))])[0].token
    assert token > 10 ** 15
    assert server.hget(s.keys_of("e")["fence"], "token") == str(token)
    assert s.leases.inspect("e", slot).token == token
    again = s.claim([req("e", slot + 1, lease=LeaseTerms(60_000, overlap_allowed=True))])[0].token
    assert again > token


def test_flushed_scripts_are_reloaded(stores, server):
    s = prepared(stores("A"))
    slot = s.now_ms() + 1
    assert s.claim([req("e", slot)])[0].outcome is Outcome.WON
    server.script_flush()
    assert s.claim([req("e", slot)])[0].outcome is Outcome.WON
    assert s.claim([req("e", slot + 1)])[0].outcome is Outcome.WON


# -- connections and errors ------------------------------------------------------------------------

def test_unreachable_redis_raises_store_unavailable_quickly():
    s = open_store("redis://:s3cret@127.0.0.1:1/0", namespace="ns", instance_id="A",
                   options={"claim_timeout": 1})  # construction does no I/O
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as caught:
        s.claim([req("e", 1)])
    assert time.monotonic() - started < 1 + 3     # claim_timeout, and margin for a loaded machine
    message = str(caught.value)
    assert "redis://:***@127.0.0.1:1/0" in message and "s3cret" not in message
    with pytest.raises(StoreUnavailable):
        s.prepare(["e"])
    s.close()


def test_a_silent_server_times_out_after_claim_timeout():
    """A server that accepts but never answers: StoreUnavailable after about claim_timeout."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # the kernel completes the handshake; nobody ever answers
        port = listener.getsockname()[1]
        s = open_store(f"redis://127.0.0.1:{port}/0", namespace="ns", instance_id="A",
                       options={"claim_timeout": 0.3})
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{port}.*Timeout"):
            s.claim([req("e", 1)])
        assert time.monotonic() - started < 0.3 + 3   # claim_timeout, and margin for a loaded machine
        s.close()


def test_a_dropped_connection_is_retried_once(stores, server):
    """A pooled connection the server closed (restart, idle kill) is replaced transparently."""
    s = prepared(stores("A"))
    slot = s.now_ms() + 1
    server.client_kill_filter(_id=s.connection.client()[0].client_id())
    assert s.claim([req("e", slot)])[0].outcome is Outcome.WON


def test_unreachable_sentinel_raises_store_unavailable():
    s = open_store("sentinel://:pw@127.0.0.1:1", namespace="ns", instance_id="A",
                   options={"master_name": "mymaster", "claim_timeout": 1})
    with pytest.raises(StoreUnavailable, match="sentinel://:\\*\\*\\*@127.0.0.1:1"):
        s.now_ms()
    s.close()


def test_rediss_url_and_its_parameters_reach_redis_py_unchanged():
    s = open_store("rediss://:pw@127.0.0.1:6380/3?ssl_cert_reqs=none&health_check_interval=7",
                   namespace="ns", instance_id="A", options={"claim_timeout": 2})
    pool = s.connection.client()[0].connection_pool  # builds the client: no I/O
    assert pool.connection_class is redis.SSLConnection
    kwargs = pool.connection_kwargs
    assert (kwargs["ssl_cert_reqs"], kwargs["health_check_interval"], kwargs["db"]) == ("none", 7, 3)
    assert kwargs["socket_timeout"] == 2 and kwargs["password"] == "pw"
    s.close()


def test_close_is_idempotent_and_reconnects(stores):
    s = stores("A")
    assert s.now_ms()
    s.close()
    s.close()
    assert abs(s.now_ms() - time.time() * 1000) < 2000


def _client_id_in_child(s, queue):
    try:
        queue.put(s.connection.client()[0].client_id())
        s.close()
    except BaseException as exc:
        queue.put(repr(exc))


def test_a_forked_child_never_shares_the_parents_connection(stores):
    """A pool created before a fork is not used by the child (redis-py resets it by pid)."""
    s = stores("A")
    parent_id = s.connection.client()[0].client_id()
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_client_id_in_child, args=(s, queue))
    child.start()
    child_id = queue.get(timeout=30)
    child.join(timeout=30)
    assert isinstance(child_id, int) and child_id != parent_id
    assert s.connection.client()[0].client_id() == parent_id, "the parent keeps its own connection"


# -- options --------------------------------------------------------------------------------------

def test_unknown_option_is_refused():
    with pytest.raises(ConfigError, match="'memroy'"):
        store(memroy=10)


@pytest.mark.parametrize("strategy", ["lease", "stream-id", "idmp", "script"])
def test_the_strategy_option_picks_the_strategy(strategy):
    """Every strategy of docs/design.md is built by the factory of the URL table
    (``open_redis_store``, a class per strategy); only 'lease' holds leases and checks lateness on
    the server's clock (the others: test_store_redis_strategies.py)."""
    s = store(strategy=strategy)
    assert isinstance(s, RedisStore) and s.strategy == strategy
    assert type(s) is STRATEGIES[strategy] and set(STRATEGIES) == set(redis_options.STRATEGIES)
    assert (s.leases is not None) is s.checks_lateness is (strategy == "lease")


@pytest.mark.parametrize("option, value", [("memory", 0), ("memory", "1h"), ("memory", True),
                                           ("history_size", 0), ("history_size", 2.5),
                                           ("claim_timeout", -1), ("strategy", "leases")])
def test_bad_values_name_option_value_and_range(option, value):
    with pytest.raises(ConfigError) as caught:
        store(**{option: value})
    assert repr(option) in str(caught.value) and repr(value) in str(caught.value)


def test_sentinel_urls():
    url = "sentinel://:pw1@h1:26379;sentinel://:pw1@h2/0"
    with pytest.raises(ConfigError, match="master_name"):
        open_store(url, namespace="ns", instance_id="A")
    s = open_store(url, namespace="ns", instance_id="A", options={"master_name": "mymaster"})
    assert "pw1" not in s.safe_url and s.safe_url.count("***") == 2
    assert parse_sentinel_url(url) == ([("h1", 26379), ("h2", 26379)], {"password": "pw1", "db": 0})
    with pytest.raises(ConfigError, match="different db"):
        parse_sentinel_url("sentinel://h1/1;sentinel://h2/2")
    with pytest.raises(ConfigError, match="sentinel:// URLs only"):
        store(master_name="mymaster")


def test_forgotten_detail_names_the_memory_start(stores):
    s = stores("A")
    s.prepare(["e"])
    result = s.claim([req("e", s.now_ms() - LATENESS_TOLERANCE_MS)])[0]
    assert result.outcome is Outcome.FORGOTTEN and "memory of this entry began at 20" in result.detail


# -- replies lost on the way back (tcp_proxy swallow_replies) ---------------------------------------

def _through_proxy(maker, instance):
    from tcp_proxy import TCPProxy, redis_address
    proxy = TCPProxy(redis_address()).start()
    db = maker.url.rsplit("/", 1)[1]
    s = open_store(proxy.url("redis", f"/{db}"), namespace=maker.namespace, instance_id=instance,
                   options={"claim_timeout": 0.5})
    maker.opened.append(s)
    return proxy, s


def test_retried_claim_after_a_takeover_of_its_lost_reply_is_lost(stores):
    """queue_timeout below max_late: A's claim commits, its reply never comes back; B takes the
    unadopted run over as attempt 2; A's retry must not answer WON with attempt 2 (A would send
    attempt 2 as well)."""
    proxy, a = _through_proxy(stores, "A")
    b = stores("B")
    try:
        prepared(b)
        slot = b.now_ms()
        terms = LeaseTerms(queue_timeout_ms=200)
        a.prepare(["e"])  # connected, its setup read, before the replies stop
        proxy.swallow_replies = True
        with pytest.raises(StoreUnavailable):
            a.claim([req("e", slot, lease=terms)])
        proxy.restore()
        run = wait_until(lambda: b.leases.expired_runs(["e"]), 10, "the queue deadline")[0]
        assert run.owner == "A", "A's claim committed"
        outcome, taken = b.leases.take_over("e", slot, run.token, queue_timeout_ms=60_000, max_attempts=3)
        assert outcome is TakeoverOutcome.TAKEN
        again = a.claim([req("e", slot, lease=terms)])[0]
        assert again.outcome is Outcome.OTHER_WON and again.winner == "B", again
        assert again.token is None and "taken over as attempt 2" in again.detail
    finally:
        proxy.close()


def test_takeover_whose_reply_was_lost_answers_taken_on_retry(stores):
    proxy, b = _through_proxy(stores, "B")
    a = stores("A")
    try:
        prepared(a)
        slot = a.now_ms()
        a.claim([req("e", slot, lease=LeaseTerms(queue_timeout_ms=200))])
        run = wait_until(lambda: a.leases.expired_runs(["e"]), 10, "the queue deadline")[0]
        b.prepare(["e"])  # connected, its setup read, before the replies stop
        proxy.swallow_replies = True
        with pytest.raises(StoreUnavailable):
            b.leases.take_over("e", slot, run.token, queue_timeout_ms=60_000, max_attempts=3)
        proxy.restore()
        assert a.leases.inspect("e", slot).attempt == 2, "B's takeover committed"
        outcome, again = b.leases.take_over("e", slot, run.token, queue_timeout_ms=60_000, max_attempts=3)
        assert outcome is TakeoverOutcome.TAKEN and again.attempt == 2 and again.owner == "B"
    finally:
        proxy.close()


# -- durability options ------------------------------------------------------------------------------

@pytest.mark.parametrize("options, words", [
    ({"durability": "replicas"}, ["'durability'", "'replicas'", "'auto'", "'replica+aof'"]),
    ({"durability": "replica", "min_replicas": 0}, ["'min_replicas'", "0"]),
    ({"durability": "auto", "min_replicas": 1}, ["'min_replicas'", "'replica'"]),
    ({"confirm_timeout": 0}, ["'confirm_timeout'"]),
    ({"confirm_timeout": 5, "claim_timeout": 5}, ["'confirm_timeout'", "'claim_timeout'", "below"]),
    ({"allow_eviction": "yes"}, ["'allow_eviction'"]),
    ({"replica_grace": 0}, ["'replica_grace'", "0"]),
    ({"replica_grace": "60"}, ["'replica_grace'", "'60'"]),
    ({"durability": "replica", "replica_grace": 30}, ["'replica_grace'", "'auto'", "'replica'"]),
])
def test_bad_durability_options_name_option_value_and_fix(options, words):
    with pytest.raises(ConfigError) as caught:
        store(**options)
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))


@pytest.mark.parametrize("strategy", ["lease", "stream-id", "script", "idmp"])
def test_every_strategy_takes_the_durability_options(strategy):
    s = store(strategy=strategy, durability="replica", min_replicas=2, confirm_timeout=1)
    assert (s.durability, s.min_replicas, s.confirm_timeout) == ("replica", 2, 1.0)
    assert store(strategy=strategy).durability == "auto"
    assert store(strategy=strategy).replica_grace == 60.0, "Redis's repl-timeout default"
    assert store(strategy=strategy, replica_grace=5.5).replica_grace == 5.5


def test_memory_settings_are_recorded_store_wide(stores):
    """Spec point 5: an instance whose memory differs from the one in use is refused at prepare
    (naming both values and the fix); the recorded value is replaced only once it has been
    unused for longer than the new memory + 20 s."""
    a = prepared(stores("A", memory=60))
    assert a.claim([req("e", a.now_ms())])[0].outcome is Outcome.WON
    with pytest.raises(ConfigError) as caught:
        stores("B", memory=120).prepare(["e"])
    text = str(caught.value)
    assert "memory=60s" in text and "memory=120s" in text and "stop every instance" in text
    # last used 141 s ago: past 120 s + 2 x 10 s, so B's first claim replaces it
    server = redis.Redis.from_url(stores.url, decode_responses=True)
    key = a.store_key
    server.hset(key, "settings_used", str(int(server.hget(key, "settings_used")) - 141_000))
    b = stores("B", memory=120)
    b.prepare(["e"])
    assert b.claim([req("e", b.now_ms() + 1)])[0].outcome is Outcome.WON
    assert server.hget(key, "settings") == "strategy=lease memory=120s"
    assert a.claim([req("e", a.now_ms() + 2)])[0].outcome is Outcome.FORGOTTEN


def test_the_scripts_name_the_same_send_notes_and_after_send_events_as_the_contract():
    """history_put's tables (Lua) are base.SEND_NOTES and base.AFTER_SEND, event for event."""
    import re

    from celery_anarchon.stores.base import AFTER_SEND, SEND_NOTES
    from celery_anarchon.stores.redis import scripts
    source = inspect.getsource(scripts)
    for name, events in (("SEND_NOTES", SEND_NOTES), ("AFTER_SEND", AFTER_SEND)):
        table = re.search(rf"local {name} = \{{([^}}]*)\}}", source).group(1)
        assert set(re.findall(r"(\w+) = true", table)) == {e.value for e in events}, name
