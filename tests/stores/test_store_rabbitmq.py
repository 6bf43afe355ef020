"""What only the RabbitMQ store promises: its memory (slot_ttl), its refusals (another slot_ttl,
quorum queues, an unroutable publish), unknown outcomes, amnesia, names, options and errors.

The promises every store shares are proved by test_store_contract.py (``-k rabbitmq``).
"""
from __future__ import annotations

import multiprocessing
import os
import pathlib
import threading
import time
import uuid
from collections import Counter
from datetime import timedelta
from urllib.parse import unquote, urlsplit, urlunsplit

import amqp
import kombu
import pytest

from celery_anarchon.errors import ConfigError, StoreUnavailable
from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import LATENESS_TOLERANCE_MS, Memory, Outcome, RunEvent
from celery_anarchon.stores.rabbitmq import RabbitMQStore
from celery_anarchon.stores.rabbitmq.connection import QUEUE_NAME_MAX_BYTES, QueueNames, claim_arguments

import conftest
import rabbitmq_tools
from conftest import AMQP_URL
from rabbitmq_tools import need_rabbitmqctl, rabbitmqctl
from backends import forget_rabbitmq_queues
from stores_support import StoreMaker, store_url, wait_until
from tcp_proxy import TCPProxy
from helpers import prepared
from claim_helpers import req


@pytest.fixture
def stores(namespace):
    maker = StoreMaker("rabbitmq", store_url("rabbitmq", ""), namespace)
    yield maker
    maker.close_all()


@pytest.fixture
def broker():
    """A plain kombu connection to the test broker, for what the tests do behind the store."""
    store_url("rabbitmq", "")
    conn = kombu.Connection(AMQP_URL, connect_timeout=5, transport_options={"read_timeout": 10})
    conn.ensure_connection(max_retries=1)
    yield conn
    conn.release()


def now_ms() -> int:
    return int(time.time() * 1000)


def holds_a_claim(conn, queue: str) -> bool:
    """True while ``queue`` exists and holds its claim, asked without touching its expiry: a
    mandatory publish (a publish is no "use" for x-expires) is nacked by a full queue and
    returned when the queue is gone; False otherwise."""
    ch = conn.channel()
    returned = []
    ch.events["basic_return"].add(lambda *args: returned.append(args))
    ch.confirm_select()
    try:
        ch.basic_publish_confirm(amqp.Message(b"{}"), exchange="", routing_key=queue, mandatory=True,
                                 confirm_timeout=5)
        acked = True
    except amqp.exceptions.MessageNacked:
        acked = False
    finally:
        ch.close()
    # acked and not returned: a queue took the probe. Seen when the probe meets the queue while
    # the broker expires it (x-expires): the claim is gone either way, and the test's next claim
    # proves it (a live queue holding the probe would make that claim lose)
    return not returned and not acked


def url_with_password(password: str) -> str:
    parts = urlsplit(AMQP_URL)
    netloc = f"{parts.username or 'guest'}:{password}@{parts.hostname}:{parts.port or 5672}"
    return urlunsplit(parts._replace(netloc=netloc))


# -- memory: slot_ttl ------------------------------------------------------------------------------

def test_rabbitmq_claim_wins_again_only_after_slot_ttl(stores, broker):
    """The memory is slot_ttl after the run's first claim: until then every other claim loses;
    once the broker dropped the claim queue, a claim wins again. That is why jitter + max_late
    (plus the instances' clock skew) must stay under slot_ttl."""
    a, b = prepared(stores("A", slot_ttl=4)), stores("B", slot_ttl=4)
    assert a.memory == Memory(4.0, None, setting="slot_ttl")
    slot = now_ms()
    queue = a.names.claim("e", slot)
    claiming = time.monotonic()                  # before the claim queue exists
    assert a.claim([req("e", slot)])[0].outcome is Outcome.WON
    won_at = time.monotonic()
    losses = 0
    while time.monotonic() - won_at < 2.0:       # half the memory: 2 s for a slow claim to land
        result = b.claim([req("e", slot)])[0]
        assert result.outcome is Outcome.OTHER_WON and result.winner is None, result
        losses += 1
        time.sleep(0.2)
    assert losses >= 3
    wait_until(lambda: not holds_a_claim(broker, queue), 10, "the broker to drop the claim queue")
    assert time.monotonic() - claiming >= 4.0 - 0.05, "forgotten before slot_ttl had passed"
    again = b.claim([req("e", slot)])[0]
    assert again.outcome is Outcome.WON and again.winner == "B"


def test_rabbitmq_memory_and_flags():
    store = RabbitMQStore(AMQP_URL, namespace="n", instance_id="i")
    assert store.memory == Memory(300.0, None, setting="slot_ttl")
    assert store.now_ms() is None
    assert (store.checks_lateness, store.leases is not None, store.recognises_winner) == (False, False, False)
    assert "slot_ttl=300s" in store.describe()
    assert RabbitMQStore(AMQP_URL, namespace="n", instance_id="i",
                         slot_ttl=timedelta(minutes=10)).memory.duration_s == 600.0


# -- another slot_ttl, quorum queues: errors, never a win or a loss --------------------------------

def test_rabbitmq_other_slot_ttl_is_a_config_error_at_start_up(stores):
    prepared(stores("A", slot_ttl=300))
    b = stores("B", slot_ttl=2)
    with pytest.raises(ConfigError) as info:
        b.prepare(["e"])
    text = str(info.value)
    assert "slot_ttl" in text and "2 s here" in text and "slot_ttl 300 s" in text
    assert "delete_queue" in text and "guest:***@" in text


def test_rabbitmq_other_slot_ttl_under_a_running_instance_makes_claims_forgotten(stores):
    """Loss-spec point 5: a claim made with another memory setting than the recorded one is
    refused as forgotten, naming both values (a possible miss), and claims nothing."""
    a = prepared(stores("A", slot_ttl=300))
    slot = now_ms()
    assert a.claim([req("e", slot)])[0].outcome is Outcome.WON
    b = stores("B", slot_ttl=2)   # started without prepare (or the marker changed under it)
    result = b.claim([req("e", slot), req("e", slot + 1)])
    assert [r.outcome for r in result] == [Outcome.FORGOTTEN, Outcome.FORGOTTEN]
    assert "slot_ttl 300 s" in result[0].detail and "2 s here" in result[0].detail
    assert a.claim([req("e", slot + 1)])[0].outcome is Outcome.WON


def test_rabbitmq_claim_queue_declared_with_another_slot_ttl_is_unknown(stores, broker):
    """A claim queue declared elsewhere with other arguments: the broker refuses the declare
    (406); that run is UNKNOWN (not won, not lost) with both values named, the rest of the batch
    is decided as usual, and the history says unknown."""
    a = prepared(stores("A"))
    slot = now_ms()
    queue = a.names.claim("e", slot)
    ch = broker.channel()
    ch.queue_declare(queue, durable=True, auto_delete=False, arguments=claim_arguments(2000))
    results = a.claim([req("e", slot), req("e", slot + 1)])
    assert [r.outcome for r in results] == [Outcome.UNKNOWN, Outcome.WON]
    detail = results[0].detail
    assert "x-expires 2000 ms" in detail and "300000 ms" in detail and "slot_ttl" in detail
    assert {h.slot_ms: h.event for h in a.history.read("e")}[slot] is RunEvent.UNKNOWN
    ch.queue_delete(queue)


def test_rabbitmq_quorum_queues_are_refused(stores, broker):
    with pytest.raises(ConfigError, match="quorum"):
        stores("A", queue_type="quorum")
    a = prepared(stores("A", queue_type="classic"))
    slot = now_ms()
    queue = a.names.claim("e", slot)
    ch = broker.channel()
    ch.queue_declare(queue, durable=True, auto_delete=False,
                     arguments={"x-queue-type": "quorum", "x-max-length": 1,
                                "x-overflow": "reject-publish", "x-expires": 300_000})
    result = a.claim([req("e", slot)])[0]
    assert result.outcome is Outcome.UNKNOWN and "quorum" in result.detail
    broker.channel().queue_delete(queue)


def test_rabbitmq_start_up_refuses_a_broker_that_lets_two_claims_in_or_none(namespace):
    """The probe at start-up: a policy that changes how claim queues behave is a ConfigError.
    (An operator policy max-length 0 makes every claim nacked; the queues of this test only.)"""
    store_url("rabbitmq", "")
    need_rabbitmqctl()
    prefix = "t" + uuid.uuid4().hex[:10]
    policy = f"anarchon-test-{prefix}"
    vhost = unquote(urlsplit(AMQP_URL).path[1:]) or "/"     # the tests' vhost, not always "/"
    rabbitmqctl("set_operator_policy", "-p", vhost, policy, rf"^{prefix}\.claim\.",
                '{"max-length": 0}', "--apply-to", "queues")
    try:
        store = open_store(AMQP_URL, namespace=namespace, instance_id="A",
                           options={"queue_prefix": prefix})
        with pytest.raises(ConfigError, match="ack the first and nack the second"):
            store.prepare(["e"])
        store.close()
    finally:
        rabbitmqctl("clear_operator_policy", "-p", vhost, policy, check=False)


def test_rabbitmq_start_up_says_what_a_confirmed_claim_survives(stores):
    """Publisher confirms on a durable classic queue: on the node's disk, lost with it; on a
    cluster, a lost node's claims can be won again; no replicated queue type is allowed."""
    warnings = stores("A").prepare(["e"])
    [note] = [w for w in warnings if "publisher" in w or "confirms a claim" in w]
    assert "wrote it to disk" in note and "restart or a crash of the node keeps it" in note
    assert "lost with its disk" in note and "forgotten" in note and "won again" in note
    assert "quorum queues are refused" in note and "ha-mode" in note
    assert "guest:***@" in note, "the password is masked"


def test_rabbitmq_tests_without_rabbitmqctl_fail_under_ci(monkeypatch):
    """A missing rabbitmqctl skips on a developer machine but fails under CI=true, like a
    missing server: CI must never pass by skipping."""
    monkeypatch.setattr(rabbitmq_tools.shutil, "which", lambda name: None)
    monkeypatch.setattr(conftest, "IN_CI", True)
    with pytest.raises(pytest.fail.Exception, match="rabbitmqctl is not on this host"):
        need_rabbitmqctl()
    monkeypatch.setattr(conftest, "IN_CI", False)
    with pytest.raises(pytest.skip.Exception, match="rabbitmqctl is not on this host"):
        need_rabbitmqctl()


def test_rabbitmq_store_code_runs_no_program():
    """The broker is reached over AMQP only; rabbitmqctl belongs to the tests."""
    import celery_anarchon.stores.rabbitmq as package
    modules = sorted(pathlib.Path(package.__file__).parent.glob("*.py"))
    assert len(modules) >= 4, modules
    for module in modules:
        source = module.read_text(encoding="utf-8")
        assert "import subprocess" not in source and "os.system" not in source, module.name
    with pytest.raises(RuntimeError, match="queue_names"):
        forget_rabbitmq_queues(RabbitMQStore(AMQP_URL, namespace="n", instance_id="i"))


# -- a publish that could not be routed ------------------------------------------------------------

def test_rabbitmq_publish_to_a_missing_queue_never_wins(stores):
    """The queue vanished between declare and publish: the broker returns the publish (and then
    acks it). It is UNKNOWN, never WON; the channel is retired and the next claims are right."""
    a = prepared(stores("A"), "e")
    slot = now_ms()
    run, request = ("e", slot), req("e", slot)
    with a._using("test") as session:
        answers = a._claims.publish(session, [run], {run: request})
        assert session.confirms_channel is None, "the channel that saw NO_ROUTE is retired"
    assert answers[run][0] is Outcome.UNKNOWN and "NO_ROUTE" in answers[run][1]
    # the run was never claimed: a real claim wins it; the next ones get their own answers
    assert [r.outcome for r in a.claim([req("e", slot), req("e", slot + 1)])] == [Outcome.WON] * 2
    assert a.claim([req("e", slot)])[0].outcome is Outcome.OTHER_WON


# -- outcome unknown -----------------------------------------------------------------------------

def _through(proxy: TCPProxy) -> str:
    parts = urlsplit(AMQP_URL)
    return urlunsplit(parts._replace(netloc=f"{parts.username}:{parts.password}@127.0.0.1:{proxy.port}"))


@pytest.mark.parametrize("fault", ["answer_lost", "publish_lost"])
def test_rabbitmq_claim_retried_after_a_failure(stores, fault):
    """The broker took the claim but its answer never came: the retry is UNKNOWN (a possible
    miss, recorded), never WON. The publish never reached the broker: the retry can still win."""
    store_url("rabbitmq", "")
    proxy = TCPProxy((urlsplit(AMQP_URL).hostname, urlsplit(AMQP_URL).port or 5672)).start()
    try:
        maker = StoreMaker("rabbitmq", _through(proxy), stores.namespace)
        a = prepared(maker("A", claim_timeout=1))
        original = a._claims.publish

        def fail_then_publish(session, runs, first):
            if fault == "answer_lost":
                proxy.swallow_replies = True
            else:
                proxy.outage()
            return original(session, runs, first)
        a._claims.publish = fail_then_publish
        slot = now_ms()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            a.claim([req("e", slot)])
        assert time.monotonic() - started < 5
        proxy.restore()
        a._claims.publish = original
        retry = a.claim([req("e", slot)])[0]
        if fault == "answer_lost":
            assert retry.outcome is Outcome.UNKNOWN, retry
            assert {h.slot_ms: h.event for h in a.history.read("e")}[slot] is RunEvent.UNKNOWN
            assert stores("B").claim([req("e", slot)])[0].outcome is Outcome.OTHER_WON
        else:
            assert retry.outcome is Outcome.WON, retry
        maker.close_all()
    finally:
        proxy.close()


# -- amnesia -------------------------------------------------------------------------------------

def test_rabbitmq_store_that_forgot_refuses_old_runs_even_with_a_cached_start(stores):
    """The broker lost every queue under a running instance (its memory start is cached on its
    connection): the next batch notices the missing born queue and refuses old runs."""
    a = prepared(stores("A"))
    slot = now_ms()
    assert a.claim([req("e", slot)])[0].outcome is Outcome.WON
    stores.wipe()
    again = a.claim([req("e", slot), req("e", slot - 1)])
    assert [r.outcome for r in again] == [Outcome.FORGOTTEN] * 2
    assert "store memory began at" in again[0].detail
    assert {h.slot_ms: h.event for h in a.history.read("e")}[slot] is RunEvent.FORGOTTEN
    later = now_ms() + LATENESS_TOLERANCE_MS + 10
    assert a.claim([req("e", later)])[0].outcome is Outcome.WON


def test_rabbitmq_memory_start_is_the_first_writers(stores):
    a, b = stores("A"), stores("B")
    a.prepare(["e"])
    born = a._memory.born(a._current(), "e")
    time.sleep(0.01)
    b.prepare(["e"])
    assert b._memory.born(b._current(), "e") == born


# -- several processes -------------------------------------------------------------------------

def _batch_racer(url, namespace, instance_id, runs, barrier, queue):
    store = open_store(url, namespace=namespace, instance_id=instance_id)
    won, outcomes = [], Counter()
    try:
        for part in runs:
            barrier.wait(timeout=60)
            for result in store.claim([req(entry, slot) for entry, slot in part]):
                outcomes[result.outcome.value] += 1
                assert result.outcome in (Outcome.WON, Outcome.OTHER_WON), result
                assert (result.winner == instance_id) == (result.outcome is Outcome.WON), result
                if result.outcome is Outcome.WON:
                    won.append(result.request.run)
        queue.put((instance_id, won, dict(outcomes), None))
    except BaseException as exc:
        queue.put((instance_id, won, dict(outcomes), repr(exc)))
    finally:
        store.close()


def test_rabbitmq_batch_race_has_one_winner_per_run(stores):
    """Three processes claim the same 400 runs in batches of 100, all at once (a barrier before
    each batch, each process in its own order): exactly one winner per run."""
    setup = prepared(stores("setup"), "a", "b")
    base = now_ms() + 1000
    runs = [(entry, base + i) for entry in ("a", "b") for i in range(200)]
    ctx = multiprocessing.get_context("fork")
    barrier, queue = ctx.Barrier(3), ctx.Queue()
    procs = []
    for n in range(3):
        order = sorted(runs, key=lambda run, n=n: hash((n, run)))
        parts = [order[i:i + 100] for i in range(0, len(order), 100)]
        procs.append(ctx.Process(target=_batch_racer, args=(setup.url, stores.namespace, f"p{n}",
                                                             parts, barrier, queue)))
    started = time.monotonic()
    for p in procs:
        p.start()
    reports = [queue.get(timeout=120) for _ in procs]
    elapsed = time.monotonic() - started
    for p in procs:
        p.join(timeout=30)
    assert not [err for *_, err in reports if err], reports
    winners = Counter(run for _, won, _, _ in reports for run in won)
    assert set(winners) == set(runs) and max(winners.values()) == 1
    print(f"batch race: {3 * len(runs) / elapsed:.0f} claim attempts/s")


# -- names --------------------------------------------------------------------------------------

def test_rabbitmq_queue_names_escape_and_never_collide(stores):
    a = QueueNames("anarchon", "x.a")
    b = QueueNames("anarchon", "x")
    assert a.claim("b", 1) != b.claim("a.b", 1)
    assert a.claim("b", 1) == "anarchon.claim.x%2Ea.b.1"
    long = QueueNames("anarchon", "n").claim("é" * 200, -(2 ** 63))
    assert len(long.encode()) <= QUEUE_NAME_MAX_BYTES and ".!" in long
    assert len(QueueNames("p", "n" * 300).settings()) <= QUEUE_NAME_MAX_BYTES
    names = ["a.b", "a", "a%2Eb", "*", "#", "x" * 300, "x" * 301, "日本", ""]
    store = prepared(stores("A"), *names)
    slot = now_ms()
    assert [r.outcome for r in store.claim([req(n, slot) for n in names])] == [Outcome.WON] * len(names)
    other_ns = StoreMaker("rabbitmq", stores.url, stores.namespace + ".a")
    try:
        assert prepared(other_ns("B"), "b").claim([req("b", slot)])[0].outcome is Outcome.WON
        assert store.claim([req("a.b", slot)])[0].outcome is Outcome.OTHER_WON
    finally:
        other_ns.close_all()


# -- history -------------------------------------------------------------------------------------

def test_rabbitmq_concurrent_history_readers_see_everything(stores):
    a = prepared(stores("A"))
    base = now_ms()
    assert all(r.outcome is Outcome.WON for r in a.claim([req("e", base + i) for i in range(30)]))
    readers = [stores(f"R{i}") for i in range(4)]
    counts, errors = [], []

    def read(store):
        try:
            for _ in range(5):
                counts.append(len(store.history.read("e")))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=read, args=(r,)) for r in readers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and counts == [30] * 20


# -- options, connections, errors ------------------------------------------------------------------

def test_rabbitmq_unknown_option_is_refused():
    with pytest.raises(ConfigError, match="'memory'.*rabbitmq"):
        RabbitMQStore(AMQP_URL, namespace="n", instance_id="i", memory=600)


@pytest.mark.parametrize("option, value", [
    ("slot_ttl", 0), ("slot_ttl", -1), ("slot_ttl", "300"), ("slot_ttl", True),
    ("history_size", 0), ("claim_timeout", 0), ("queue_prefix", "a.b"), ("queue_prefix", ""),
    ("queue_type", "stream"), ("ssl", "yes"),
])
def test_rabbitmq_bad_option_values_name_the_option(option, value):
    with pytest.raises(ConfigError, match=option):
        RabbitMQStore(AMQP_URL, namespace="n", instance_id="i", **{option: value})


def test_rabbitmq_amqps_url_and_tls_options_reach_kombu_unchanged():
    tls = {"ca_certs": "/etc/ssl/ca.pem", "server_hostname": "broker.example"}
    store = RabbitMQStore("amqps://u:secret@broker.example:5671/vh", namespace="n",
                          instance_id="i", ssl=tls)
    conn = store._current().conn           # no I/O: the connection is made on first use
    assert conn.ssl == tls and conn.hostname == "broker.example" and conn.port == 5671
    assert conn.virtual_host == "vh" and conn.connected is False
    assert RabbitMQStore("amqps://u@h//", namespace="n", instance_id="i")._current().conn.ssl is True
    assert store.safe_url == "amqps://u:***@broker.example:5671/vh"


def test_rabbitmq_wrong_password_is_a_clear_error():
    store_url("rabbitmq", "")
    store = open_store(url_with_password("not-the-password"), namespace="n", instance_id="i")
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as info:
        store.prepare(["e"])
    assert time.monotonic() - started < 5
    text = str(info.value)
    assert "***@" in text and "not-the-password" not in text
    assert "refused access" in text and "password" in text
    store.close()


def test_rabbitmq_unreachable_broker_raises_store_unavailable_quickly():
    store = open_store("amqp://guest:secret@127.0.0.1:1//", namespace="n", instance_id="i",
                       options={"claim_timeout": 1})
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as info:
        store.claim([req("e", now_ms())])
    assert time.monotonic() - started < 5
    assert "guest:***@127.0.0.1:1" in str(info.value) and "secret" not in str(info.value)
    store.close()
    store.close()


def test_rabbitmq_close_twice_and_a_forked_child_opens_its_own_connection(stores):
    a = prepared(stores("A"))
    slot = now_ms()
    assert a.claim([req("e", slot)])[0].outcome is Outcome.WON
    parent_conn = a._current().conn.connection
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child claims through the same store object
        code = 1
        try:
            result = a.claim([req("e", slot + 1)])[0]
            if result.outcome is Outcome.WON and a._current().conn.connection is not parent_conn:
                code = 0
        finally:
            os.write(write, bytes([code]))
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"\x00"
    assert a.claim([req("e", slot + 2)])[0].outcome is Outcome.WON
    a.close()
    a.close()
    assert a.claim([req("e", slot + 3)])[0].outcome is Outcome.WON, "reconnects after close"

