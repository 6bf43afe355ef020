"""What only the NATS JetStream store promises: its memory is the stream's duplicate_window, the
server's clock refuses a skewed instance, a deleted stream forgets nothing it should remember,
the event loop thread, forks, TLS and options.

The shared promises of every store are proved by test_store_contract.py.
"""
from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import socket
import ssl
import subprocess
import time

import nats
import nats.js.errors
import pytest

from celery_anarchon.errors import ConfigError, StoreUnavailable
from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import LATENESS_TOLERANCE_MS, Memory, Outcome, RunEvent
from celery_anarchon._util import iso as _iso
from celery_anarchon.stores.nats import NATSStore
from celery_anarchon.stores.nats.connection import token

import ha_nats  # benchmarks/ha_nats.py: the rigs' nats-server launcher
from conftest import IN_CI, NATS_URL
from stores_support import StoreMaker, store_url, wait_until
from helpers import prepared, req

NAMES = ["a.b", "a_2Eb", "a", "*", ">", "a.>", "with space", "with_space", "café", "cafe", "",
         "_", "日本", "x" * 300, "x" * 301, "tab\there", "%3A", ":"]


@pytest.fixture
def stores(namespace):
    maker = StoreMaker("nats", store_url("nats", ""), namespace)
    yield maker
    cleaner = maker("cleaner")
    maker.close_all()
    _server(lambda js: _delete(js, cleaner.stream, cleaner.history.kv_stream, cleaner.epoch_stream))


def _delete(js, *names):
    async def go():
        for name in names:
            try:
                await js.delete_stream(name)
            except nats.js.errors.NotFoundError:
                pass
    return go()


def _server(work):
    """Run ``work(js)`` (a coroutine factory) against the test server with a client of our own."""
    async def main():
        nc = await nats.connect(NATS_URL)
        try:
            return await work(nc.jetstream())
        finally:
            await nc.close()
    return asyncio.run(main())


# -- options and URLs ------------------------------------------------------------------------------

def test_options_are_validated():
    def make(url=NATS_URL, **options):
        return open_store(url, namespace="ns", instance_id="A", options=options)
    with pytest.raises(ConfigError, match="'window'.*not understood.*duplicate_window"):
        make(window=300)
    with pytest.raises(ConfigError, match="duplicate_window.*0.1"):
        make(duplicate_window=0.05)
    with pytest.raises(ConfigError, match="duplicate_window"):
        make(duplicate_window="300")
    with pytest.raises(ConfigError, match="history_size"):
        make(history_size=0)
    with pytest.raises(ConfigError, match="claim_timeout"):
        make(claim_timeout=-1)
    with pytest.raises(ConfigError, match="ssl.SSLContext"):
        make(tls="yes")
    with pytest.raises(ConfigError, match="nats://"):
        make("nats://127.0.0.1:4222,redis://127.0.0.1:6379")
    store = make(duplicate_window=600, history_size=7, claim_timeout=2)
    assert isinstance(store, NATSStore) and store.kind == "nats"
    assert store.memory == Memory(600.0, None, setting="duplicate_window")
    assert not store.checks_lateness and store.leases is None and store.recognises_winner
    assert store.describe() == "nats duplicate_window=600s"
    assert store._session is None, "construction does no I/O"


def test_tls_urls_and_credentials_pass_through_to_nats_py():
    context = ssl.create_default_context()
    url = "tls://alice:s3cret@nats1.example:4222, tls://tok3n@nats2.example"
    store = open_store(url, namespace="ns", instance_id="A",
                       options={"tls": context, "tls_hostname": "nats.example",
                                "user_credentials": "/etc/nats/beat.creds"})
    assert store._servers == ["tls://alice:s3cret@nats1.example:4222", "tls://tok3n@nats2.example"]
    options = store._connect_options
    assert options["tls"] is context and options["tls_hostname"] == "nats.example"
    assert options["user_credentials"] == "/etc/nats/beat.creds"
    assert store._tls_required
    assert "s3cret" not in store.safe_url and "tok3n" not in store.safe_url
    assert store.safe_url == "tls://alice:***@nats1.example:4222, tls://***@nats2.example"


def test_unreachable_server_fails_fast_with_password_masked():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = open_store(f"nats://beat:s3cret@127.0.0.1:{port}", namespace="ns", instance_id="A",
                       options={"claim_timeout": 10})
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as caught:
        store.claim([req("e", 1)])
    # at once, not after claim_timeout (10 s): half of it is margin for a loaded machine
    assert time.monotonic() - started < 5, "a refused connection is reported at once"
    text = str(caught.value)
    assert "s3cret" not in text and "beat:***@127.0.0.1" in text and "Refused" in text
    store.close()


def test_tls_url_refuses_a_server_without_tls(stores):
    store = stores("A")
    plain = open_store(store.url.replace("nats://", "tls://", 1), namespace=stores.namespace,
                       instance_id="A")
    with pytest.raises(ConfigError, match="offers no TLS"):
        plain.prepare(["e"])
    plain.close()


# -- names ---------------------------------------------------------------------------------------

def test_tokens_are_injective_and_safe():
    tokens = [token(name) for name in NAMES]
    assert len(set(tokens)) == len(NAMES), tokens
    allowed = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    for t in tokens:
        assert t and len(t) <= 96 and not set(t) - allowed, t
    assert token("a.b") == "a_2Eb" and token("a_2Eb") == "a_5F2Eb"


def test_entry_names_with_subject_syntax_never_collide(stores):
    store = prepared(stores("A"), *NAMES)
    slot = store.now_ms() + 1
    results = store.claim([req(name, slot) for name in NAMES])
    assert [r.outcome for r in results] == [Outcome.WON] * len(NAMES)
    for name in NAMES:
        assert [h.entry for h in store.history.read(name)] == [name]
    other = stores("B")
    assert all(r.outcome is Outcome.OTHER_WON and r.winner == "A"
               for r in other.claim([req(name, slot) for name in NAMES]))


# -- the memory: duplicate_window ------------------------------------------------------------------

def test_repeated_claim_wins_again_after_the_window_and_never_before(stores):
    """With duplicate_window = 2 s a claimed run is LOST for 2 s after the first claim, then won
    again: the start-up rule jitter + max_late < duplicate_window exists for this."""
    a = prepared(stores("A", duplicate_window=2))
    b = stores("B", duplicate_window=2)
    slot = a.now_ms() + 5000  # ahead, so the run is not older than the window meanwhile
    before = time.monotonic()
    assert a.claim([req("e", slot, max_late_ms=0)])[0].outcome is Outcome.WON
    answers = []

    def b_wins():
        result = b.claim([req("e", slot, max_late_ms=0)])[0]
        answers.append((time.monotonic(), result))
        return result.outcome is Outcome.WON
    wait_until(b_wins, 6, "the window to pass", interval=0.05)
    # every claim answered before the window could have ended was lost to A
    early = [r for t, r in answers if t < before + 2.0]
    assert early and all(r.outcome is Outcome.OTHER_WON and r.winner == "A" for r in early)
    assert answers[-1][0] >= before + 2.0
    assert a.claim([req("e", slot, max_late_ms=0)])[0].winner == "B", "the new claim replaced A's"


def test_claim_older_than_the_window_is_refused_as_forgotten(stores):
    a = prepared(stores("A", duplicate_window=300))
    old = a.now_ms() - 301_000
    result = a.claim([req("e", old, max_late_ms=0)])[0]
    assert result.outcome is Outcome.FORGOTTEN and "duplicate_window" in result.detail


def _stream_config(store):
    async def read(js):
        return (await js.stream_info(store.stream)).config
    return _server(read)


def _set_window(store, seconds):
    async def change(js):
        info = await js.stream_info(store.stream)
        info.config.duplicate_window = seconds
        await js.update_stream(info.config)
    _server(change)


def test_another_duplicate_window_is_refused_at_start_up_while_in_use(stores):
    """Loss-spec point 5: the stream records the window; an instance with another one is a
    ConfigError naming both values and the fix while the stream was used within the new window +
    20 s (a longer or a shorter one alike), and the stream keeps its window."""
    a = prepared(stores("A", duplicate_window=300))
    assert a.claim([req("e", a.now_ms())])[0].outcome is Outcome.WON
    for other in (600, 60):
        with pytest.raises(ConfigError) as caught:
            stores("B", duplicate_window=other).prepare(["e"])
        text = str(caught.value)
        assert f"is {other} s here" in text and "remembers claims for 300 s" in text, text
        assert "same duplicate_window on every instance" in text
        assert f"wait {other + 20} s" in text, text
    assert _stream_config(stores("C")).duplicate_window == 300


def test_an_unused_stream_takes_the_new_duplicate_window(stores):
    """A stream that stored nothing (or nothing within the new window + 20 s) gets the new
    instance's window, with a warning naming both."""
    async def create(js):
        await js.add_stream(name=stores("x").stream, subjects=[f"{stores('x')._names.root}.>"],
                            duplicate_window=300, max_age=600, max_msgs_per_subject=1)
    _server(create)
    warnings = stores("B", duplicate_window=600).prepare(["e"])
    assert any("had duplicate_window 300 s" in w and "replaced by this instance's 600 s" in w
               for w in warnings), warnings
    config = _stream_config(stores("C"))
    assert config.duplicate_window == 600 and config.max_age == 1200


def test_a_window_changed_under_a_running_instance_makes_its_claims_forgotten(stores):
    """Changed behind a running instance's back: its claims are refused as forgotten, naming
    both values, and publish nothing, until the values agree again."""
    a = prepared(stores("A", duplicate_window=300))
    slot = a.now_ms()
    assert a.claim([req("e", slot)])[0].outcome is Outcome.WON
    _set_window(a, 60)
    first = a.claim([req("e", slot + 1)])[0]
    assert first.outcome is Outcome.FORGOTTEN, first
    assert "300 s here" in first.detail and "remembers claims for 60 s" in first.detail
    second = a.claim([req("e", slot + 2)])[0]
    assert second.outcome is Outcome.FORGOTTEN, second
    unclaimed = stores("B", duplicate_window=60).claim([req("e", slot + 2, max_late_ms=0)])[0]
    assert unclaimed.outcome is Outcome.WON, "the refused claim published nothing"
    _set_window(a, 300)
    a.claim([req("e", slot + 3)])  # reads the stream again
    assert a.claim([req("e", slot + 4)])[0].outcome is Outcome.WON


# -- the server's clock and skew -------------------------------------------------------------------

def test_now_is_the_servers_clock(stores):
    store = stores("A")
    before = time.time() * 1000
    now = store.now_ms()
    assert before - 1000 < now < time.time() * 1000 + 1000
    assert abs(store._server_clock.skew.offset_ms) < 1000


@pytest.mark.parametrize("offset_s, outcome, word", [(200, Outcome.EARLY, "ahead of"),
                                                     (-200, Outcome.LATE, "behind")])
def test_an_instance_too_far_off_is_refused_and_blocks_nobody(stores, offset_s, outcome, word):
    """A clock 200 s off is more than (300 - 60) / 2 = 120 s: its claims are refused before they
    are published, so the others still win the run; one 50 s off claims normally."""
    ok = prepared(stores("OK"))
    skewed = stores("SKEWED")
    skewed._clock = lambda: time.time() + offset_s
    slot = ok.now_ms() + 1
    refused = skewed.claim([req("e", slot)])[0]
    assert refused.outcome is outcome and refused.winner is None
    assert f"{word} the NATS server's" in refused.detail and "120 s allowed" in refused.detail
    assert abs(skewed._server_clock.skew.offset_ms - offset_s * 1000) < 1000
    assert ok.claim([req("e", slot)])[0].outcome is Outcome.WON, "a refused claim blocks nobody"
    # already claimed comes first: the skewed instance learns who won
    lost = skewed.claim([req("e", slot)])[0]
    assert lost.outcome is Outcome.OTHER_WON and lost.winner == "OK"
    assert ok.history.read("e")[0].event is RunEvent.CLAIMED
    near = stores("NEAR")
    near._clock = lambda: time.time() + 50
    assert near.claim([req("e", slot + 1)])[0].outcome is Outcome.WON


def test_a_clock_jump_is_measured_before_the_next_claim(stores):
    store = prepared(stores("A"))
    slot = store.now_ms() + 1
    assert store.claim([req("e", slot)])[0].outcome is Outcome.WON
    store._clock = lambda: time.time() - 500   # the host's clock jumps back
    refused = store.claim([req("e", slot + 1)])[0]
    assert refused.outcome is Outcome.LATE and "behind" in refused.detail


def test_skew_bound_shrinks_with_max_late(stores):
    """(duplicate_window 2 s - max_late 1.5 s) / 2 = 0.25 s: a clock 0.5 s ahead is refused."""
    store = prepared(stores("A", duplicate_window=2))
    store._clock = lambda: time.time() + 0.5
    slot = store.now_ms() + 1000
    assert store.claim([req("e", slot, max_late_ms=1500)])[0].outcome is Outcome.EARLY
    assert store.claim([req("e", slot, max_late_ms=0)])[0].outcome is Outcome.WON


# -- amnesia ---------------------------------------------------------------------------------------

def test_a_deleted_stream_refuses_the_runs_it_forgot(stores):
    a, b = prepared(stores("A")), stores("B")
    slot = a.now_ms() + 1
    assert a.claim([req("e", slot)])[0].outcome is Outcome.WON
    first = a._streams.created_ms
    _server(lambda js: _delete(js, a.stream))
    again = b.claim([req("e", slot)])[0]
    assert again.outcome is Outcome.FORGOTTEN and "store memory began" in again.detail
    assert b._streams.created_ms > first
    # the winner's own retry (its cache still knew the old stream) is refused too, not won again
    assert a.claim([req("e", slot)])[0].outcome is Outcome.FORGOTTEN
    # the history bucket kept the claim: a skip never overwrites it
    assert b.history.read("e")[0].event is RunEvent.CLAIMED
    later = b._streams.created_ms + 10_001
    wait_until(lambda: b.now_ms() > b._streams.created_ms + 20, 5, "the server clock to move")
    assert b.claim([req("e", later)])[0].outcome is Outcome.WON
    assert a.claim([req("e", later)])[0].outcome is Outcome.OTHER_WON


def test_a_lost_epoch_marker_restarts_the_memory_for_every_instance(stores):
    """The epoch marker lives in memory: a server restart loses it (tests/system/test_ha_nats.py
    restarts a server of its own; here the marker's stream is deleted, as a restart of a single
    server does). The next claim of any instance sees it and refuses the slots before the new
    marker + 10 s as forgotten, naming both epochs; later slots are claimed as usual."""
    a, b = prepared(stores("A")), stores("B")
    slot = a.now_ms() - 1000
    assert a.claim([req("e", slot)])[0].outcome is Outcome.WON
    old = a._epoch.marker
    _server(lambda js: _delete(js, a.epoch_stream))
    fresh = slot + 500
    refused = b.claim([req("e", fresh)])[0]
    assert refused.outcome is Outcome.FORGOTTEN, refused
    assert "epoch changed" in refused.detail and "may have lost their newest claims" in refused.detail
    assert b._epoch.marker.time_ms > old.time_ms
    mine = a.claim([req("e", fresh + 1)])[0]
    assert mine.outcome is Outcome.FORGOTTEN, "the other instance reads the same new epoch"
    assert f"epoch {_iso(old.time_ms)} -> epoch {_iso(b._epoch.marker.time_ms)}" in mine.detail
    assert a.claim([req("e", slot)])[0].outcome is Outcome.FORGOTTEN, "never won again"
    later = b._epoch.marker.time_ms + LATENESS_TOLERANCE_MS + 1
    wait_until(lambda: b.now_ms() > b._epoch.marker.time_ms + 20, 5, "the server clock to move")
    assert b.claim([req("e", later)])[0].outcome is Outcome.WON
    assert a.claim([req("e", later)])[0].outcome is Outcome.OTHER_WON


def test_a_slot_more_than_10_s_ahead_of_the_server_is_refused_as_early(stores):
    """So that no claim taken before a server restart is for a slot the epoch change does not
    refuse (stores/nats/memory.py, "Amnesia and partial loss")."""
    a = prepared(stores("A"))
    now = a.now_ms()
    early = a.claim([req("e", now + LATENESS_TOLERANCE_MS + 2000)])[0]
    assert early.outcome is Outcome.EARLY and "ahead of the NATS server's clock" in early.detail
    assert a.claim([req("e", now + LATENESS_TOLERANCE_MS - 2000)])[0].outcome is Outcome.WON


def test_start_up_on_a_single_server_warns_what_a_crash_can_lose(stores):
    warnings = stores("A").prepare(["e"])
    [warning] = [w for w in warnings if "single NATS server" in w]
    assert "every 2 minutes" in warning and "sync_interval" in warning
    assert "no such setting before 2.10" in warning  # the test server is 2.9
    assert "refuses the slots up to 10 s after it" in warning and "cluster of 3" in warning


# -- the event loop thread and forks ---------------------------------------------------------------

def test_the_loop_thread_stops_on_close_and_restarts_on_use(stores):
    store = prepared(stores("A"))
    thread = store._session.thread
    assert thread.is_alive() and thread.daemon
    store.close()
    assert not thread.is_alive()
    store.close()
    assert store.claim([req("e", store.now_ms() + 1)])[0].outcome is Outcome.WON
    assert store._session.thread is not thread and store._session.thread.is_alive()


def _in_child(store, slot, queue):
    try:
        outcome = store.claim([req("e", slot)])[0].outcome.value
        session = store._session
        queue.put((outcome, session.pid == os.getpid(), session.thread.is_alive()))
        store.close()
    except BaseException as exc:
        queue.put((repr(exc), False, False))


def test_a_forked_child_gets_its_own_loop_and_leaves_the_parents_alone(stores):
    store = prepared(stores("A"))
    slot = store.now_ms() + 1
    assert store.claim([req("e", slot)])[0].outcome is Outcome.WON
    parent_session = store._session
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_in_child, args=(store, slot + 1, queue))
    child.start()
    assert queue.get(timeout=30) == ("won", True, True)
    child.join(timeout=30)
    assert child.exitcode == 0
    assert store._session is parent_session
    assert store.claim([req("e", slot + 2)])[0].outcome is Outcome.WON, "the parent's loop still works"
    other = stores("B").claim([req("e", slot + 1)])[0]
    assert other.outcome is Outcome.OTHER_WON and other.winner == "A", "the child's claim stands"


# -- servers of our own: TLS, no JetStream ---------------------------------------------------------

def _need(path: str, what: str) -> None:
    if os.path.exists(path) or shutil.which(path):
        return
    if IN_CI:
        pytest.fail(f"{what} is missing")
    pytest.skip(f"{what} is missing")


@pytest.fixture
def own_server(tmp_path):
    """``own_server(*args, jetstream=True) -> port``: a nats-server of our own (the rigs'
    ``ha_nats.NatsServer``, free ports, its files in ``tmp_path``), stopped after the test."""
    _need(ha_nats.NATS_SERVER, "nats-server")
    servers = []

    def start(*args, jetstream: bool = True) -> int:
        server = ha_nats.NatsServer(f"own{len(servers)}", str(tmp_path), jetstream=jetstream,
                                    args=args)
        servers.append(server)
        server.start()
        return server.port
    start.folder = str(tmp_path)
    yield start
    for server in servers:
        server.stop()


def test_tls_connection_through_nats_py_options(own_server):
    _need("openssl", "openssl")
    folder = own_server.folder
    key, cert = os.path.join(folder, "key.pem"), os.path.join(folder, "cert.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=nats.test", "-addext", "subjectAltName=DNS:nats.test",
                    "-keyout", key, "-out", cert], check=True, capture_output=True)
    port = own_server("--tls", "--tlscert", cert, "--tlskey", key)
    context = ssl.create_default_context(cafile=cert)
    store = open_store(f"tls://user:pw@127.0.0.1:{port}", namespace="tls", instance_id="A",
                       options={"tls": context, "tls_hostname": "nats.test"})
    try:
        prepared(store)
        assert store.claim([req("e", store.now_ms() + 1)])[0].outcome is Outcome.WON
    finally:
        store.close()
    untrusted = open_store(f"tls://127.0.0.1:{port}", namespace="tls", instance_id="B",
                           options={"claim_timeout": 2})
    with pytest.raises(StoreUnavailable, match="CERTIFICATE_VERIFY_FAILED|certificate verify"):
        untrusted.prepare(["e"])
    untrusted.close()


def test_a_server_without_jetstream_is_a_config_error(own_server):
    port = own_server(jetstream=False)
    store = open_store(f"nats://127.0.0.1:{port}", namespace="ns", instance_id="A",
                       options={"claim_timeout": 2})
    with pytest.raises(ConfigError, match="JetStream"):
        store.prepare(["e"])
    store.close()


# -- round trips ------------------------------------------------------------------------------------

def test_a_batch_takes_two_rounds(stores, monkeypatch):
    """Won runs: the publishes (with the stream's info and the epoch marker), then the history
    writes; lost runs: the publishes, then reading the winners back. Each round is one pipelined
    burst."""
    a, b = prepared(stores("A"), "x", "y", "z"), stores("B")
    slot = a.now_ms() - 1000
    # each store reads an entry's memory start once per stream: done here, not counted
    a.claim([req(e, slot) for e in ("x", "y", "z")])
    b.claim([req(e, slot - 1) for e in ("x", "y", "z")])
    rounds = []
    real = type(a._session).pipeline

    async def counting(self, nc, requests):
        rounds.append(len(requests))
        return await real(self, nc, requests)
    monkeypatch.setattr(type(a._session), "pipeline", counting)
    batch = [req(e, slot + i) for e in ("x", "y", "z") for i in range(1, 11)]
    a.now_ms(), b.now_ms()  # a fresh skew: no clock probe rides along
    rounds.clear()
    assert all(r.outcome is Outcome.WON for r in a.claim(batch))
    assert rounds == [32, 30], rounds
    rounds.clear()
    assert all(r.outcome is Outcome.OTHER_WON and r.winner == "A" for r in b.claim(batch))
    assert len(rounds) == 2 and rounds == [32, 30], rounds
