"""What only the Redis strategies stream-id, script and idmp promise: each one's memory, its own
refusals, the idmp server checks and settings, and their options; and, on every Redis strategy
(lease too), how the entry store and the pause inside the claim script are built.

The promises every store makes are proved by test_store_contract.py and, for entries and pauses,
test_store_entries.py (every Redis kind is an entry store). Memories are shown with small
settings and waits on the server's clock (``wait_until``), never sleeps.
"""
from __future__ import annotations

import dataclasses
import multiprocessing
import random
import time
from collections import Counter

import pytest
import redis
from redis.crc import key_slot

from celery_anarchon.errors import ConfigError, StoreUnavailable
from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import (
    LATENESS_TOLERANCE_MS, HistoryRecord, LeaseTerms, Outcome, RunEvent, lease_store,
)
from celery_anarchon.stores.entry_store import InstanceRecord, Pause
from celery_anarchon.stores.redis import RedisStore
from celery_anarchon.stores.redis.entries import DAY_MS
from celery_anarchon.stores.redis.strategies import (
    RedisIdmpStore, RedisScriptStore, RedisStreamIdStore,
)

from conftest import REDIS_URL, require_server
from stores_support import StoreMaker, wait_until
from redis_stores import redis_maker, round_trips
from helpers import prepared, req, request_run

KINDS = ("redis-stream-id", "redis-script", "redis-idmp")
#: every Redis strategy: each is an entry store
EVERY_KIND = ("redis", *KINDS)
DEFINITION = '{"schedule":{"every":60},"task":"proj.tasks.report"}'


@pytest.fixture(params=KINDS)
def stores(request, namespace):
    yield from redis_maker(request.param, namespace)


@pytest.fixture(params=EVERY_KIND)
def every(request, namespace):
    yield from redis_maker(request.param, namespace)


@pytest.fixture
def stream_id(namespace):
    yield from redis_maker("redis-stream-id", namespace)


@pytest.fixture
def script(namespace):
    yield from redis_maker("redis-script", namespace)


@pytest.fixture
def idmp(namespace):
    yield from redis_maker("redis-idmp", namespace)


def raw(maker: StoreMaker) -> redis.Redis:
    return redis.Redis.from_url(maker.url, decode_responses=True)


def outcome(store, slot, entry="e"):
    return store.claim([req(entry, slot)])[0].outcome


def history_event(store, slot, entry="e"):
    return {h.slot_ms: h.event for h in store.history.read(entry)}.get(slot)


# -- every strategy -------------------------------------------------------------------------------

def test_memory_flags_and_description(stores):
    s = stores("A")
    assert s.leases is None and not s.checks_lateness and s.recognises_winner
    expected = {"redis-stream-id": (None, None, "strategy", None),
                "redis-script": (300.0, 100, "window", "history_size"),
                "redis-idmp": (300.0, 1000, "duration", "max_size")}[stores.kind]
    m = s.memory
    assert (m.duration_s, m.count, m.setting, m.count_setting) == expected
    assert s.describe().startswith(f"redis strategy={s.strategy} ")


def test_no_lease_operations(stores):
    s = stores("A")
    with pytest.raises(ConfigError, match="cannot hold leases"):
        lease_store(s).adopt("e", 1, "w", 1000)
    with pytest.raises(ConfigError, match="cannot hold leases"):
        lease_store(s).expired_runs(["e"])


def test_every_key_of_an_entry_has_one_hash_tag_and_no_ttl(stores):
    s = prepared(stores("A"))
    now = s.now_ms()
    s.claim([req("e", now + i) for i in range(3)])
    keys = s.keys_of("e")
    assert len({key_slot(k.encode()) for k in keys.values()}) == 1
    server = raw(stores)
    present = [k for k in keys.values() if server.exists(k)]
    assert present and all(server.ttl(k) == -1 for k in present), "no key carries a TTL"


def test_batch_claim_is_one_round_trip(stores, monkeypatch):
    s = prepared(stores("A"), "a", "b")
    now = s.now_ms()
    sent = round_trips(s, monkeypatch)
    results = s.claim([req(e, now + i) for e in ("a", "b") for i in range(4)])
    assert sent == [["EVALSHA"]] and all(r.outcome is Outcome.WON for r in results)


def test_definitions_are_shared_with_the_lease_layout(stores):
    a, b = stores("A"), stores("B")
    a.history.save_definition("e", "fp1", "task=t")
    assert b.history.load_definition("e", "fp1") == "task=t" and b.history.load_definition("e", "x") is None


@pytest.mark.parametrize("strategy", ["stream-id", "script", "idmp"])
def test_unreachable_server_raises_store_unavailable_quickly(strategy):
    s = open_store("redis://:s3cret@127.0.0.1:1/0", namespace="ns", instance_id="A",
                   options={"strategy": strategy, "claim_timeout": 1})
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as caught:
        s.claim([req("e", 1)])
    assert time.monotonic() - started < 1 + 3     # claim_timeout, and margin for a loaded machine
    assert "redis://:***@127.0.0.1:1/0" in str(caught.value) and "s3cret" not in str(caught.value)
    with pytest.raises(StoreUnavailable):
        s.prepare(["e"])
    s.close()


# -- options --------------------------------------------------------------------------------------

def build(**options) -> RedisStore:
    return open_store(REDIS_URL, namespace="ns", instance_id="A", options=options)


@pytest.mark.parametrize("strategy, cls", [("stream-id", RedisStreamIdStore),
                                           ("script", RedisScriptStore), ("idmp", RedisIdmpStore)])
def test_strategy_builds_its_class(strategy, cls):
    assert type(build(strategy=strategy)) is cls


@pytest.mark.parametrize("strategy, option, owner", [
    ("idmp", "window", "script"), ("script", "duration", "idmp"), ("script", "max_size", "idmp"),
    ("stream-id", "memory", "lease"), ("stream-id", "window", "script"),
    ("lease", "window", "script"), ("lease", "duration", "idmp"), ("idmp", "memory", "lease"),
])
def test_an_option_of_another_strategy_is_refused(strategy, option, owner):
    """A ``window`` with strategy idmp is a typo or a half-done change: never ignored."""
    with pytest.raises(ConfigError) as caught:
        build(strategy=strategy, **{option: 10})
    text = str(caught.value)
    assert f"[{option!r}] belongs to the Redis strategy {owner!r}, not to {strategy!r}" in text


@pytest.mark.parametrize("strategy", ["stream-id", "script", "idmp"])
def test_unknown_option_is_refused(strategy):
    with pytest.raises(ConfigError, match="'windw' not understood"):
        build(strategy=strategy, windw=10)


@pytest.mark.parametrize("strategy, option, value", [
    ("script", "window", 0), ("script", "window", "5m"), ("script", "window", True),
    ("idmp", "duration", 0), ("idmp", "duration", 1.5), ("idmp", "duration", 86_401),
    ("idmp", "max_size", 0), ("idmp", "max_size", 10_001), ("idmp", "max_size", 2.0),
])
def test_bad_values_name_option_and_value(strategy, option, value):
    with pytest.raises(ConfigError) as caught:
        build(strategy=strategy, **{option: value})
    assert repr(option) in str(caught.value) and repr(value) in str(caught.value)


def test_idmp_takes_the_servers_duration_range_not_redis_pys():
    """redis-py 8.1's xcfgset() refuses a duration above 300 s before sending; the store sets
    IDMP-DURATION from Lua, so the server's 1..86400 s applies."""
    assert build(strategy="idmp", duration=3600).memory.duration_s == 3600
    assert build(strategy="idmp", duration=86_400, max_size=10_000).memory.count == 10_000


# -- stream-id ------------------------------------------------------------------------------------

def test_stream_id_refuses_an_older_slot_after_a_newer_one_as_superseded(stream_id):
    a, b = prepared(stream_id("A")), stream_id("B")
    now = a.now_ms()
    assert outcome(a, now) is Outcome.WON
    older = b.claim([req("e", now - 1000)])[0]
    assert older.outcome is Outcome.SUPERSEDED and "newer slot" in older.detail
    assert history_event(a, now - 1000) is RunEvent.SUPERSEDED
    assert outcome(b, now) is Outcome.OTHER_WON, "the same id is a loss, not superseded"
    assert outcome(a, now) is Outcome.WON, "the winner's retry reads its own record back"
    # a batch is claimed in slot order, so a late older run of the same tick is not refused
    results = b.claim([req("e", now + 2000), req("e", now + 1000)])
    assert [r.outcome for r in results] == [Outcome.WON, Outcome.WON]


def test_stream_id_uses_sequence_0_only(stream_id):
    """After <slot>-0, Redis would accept <slot>-1 (a second winner): every claim uses -0, so a
    second claim of the slot is refused and the stream holds one entry for it."""
    a, b = prepared(stream_id("A")), stream_id("B")
    slot = a.now_ms()
    assert outcome(a, slot) is Outcome.WON
    assert outcome(b, slot) is Outcome.OTHER_WON
    server, key = raw(stream_id), a.keys_of("e")["claims:stream"]
    assert [entry_id for entry_id, _ in server.xrange(key)] == [f"{slot}-0"]
    assert server.xadd(key, {"w": "rogue"}, id=f"{slot}-1") == f"{slot}-1", "the trap is real"
    assert outcome(b, slot) is Outcome.OTHER_WON, "the store still reads <slot>-0's winner"
    assert outcome(b, slot - 1) is Outcome.SUPERSEDED


def test_stream_id_trimming_keeps_the_refusal(stream_id):
    """The stream is bounded (MAXLEN ~), never expired or deleted; its last id survives any
    trim, so every older slot stays refused, even with the stream emptied by hand."""
    a = prepared(stream_id("A", history_size=5))
    server, key = raw(stream_id), a.keys_of("e")["claims:stream"]
    first = a.now_ms() - 5000
    for start in range(0, 1000, 100):
        a.claim([req("e", first + start + i) for i in range(100)])
    newest = first + 999
    assert server.xlen(key) <= 200, "trimmed to about max(history_size, 100) entries"
    assert outcome(a, first) is Outcome.SUPERSEDED, "an older slot whose entry was trimmed"
    assert server.ttl(key) == -1
    server.xtrim(key, maxlen=0)
    assert server.xlen(key) == 0 and server.exists(key)
    assert outcome(a, first + 500) is Outcome.SUPERSEDED
    gone = a.claim([req("e", newest)])[0]
    assert gone.outcome is Outcome.UNKNOWN, "the newest id with its record gone: never won twice"
    assert outcome(a, newest + 1) is Outcome.WON


def test_stream_id_keeps_run_now_runs_apart_and_never_wins_one_twice(stream_id):
    """Run-now runs (``requested``) older than the stream's newest slot are won, each once; they
    move no stream id. The newest max(history_size, 100) are kept; every slot at or below the
    newest one trimmed is refused (forgotten), so a trimmed run is never won again, and a slot of
    a run-now run is the same run for a scheduled claim."""
    a, b = prepared(stream_id("A", history_size=5)), stream_id("B", history_size=5)
    server, keys = raw(stream_id), a.keys_of("e")
    now = a.now_ms()
    assert outcome(a, now) is Outcome.WON
    base = now - 5000
    results = a.claim([dataclasses.replace(req("e", base + i), requested=True) for i in range(120)])
    assert {r.outcome for r in results} == {Outcome.WON}, Counter(r.outcome for r in results)
    assert server.xinfo_stream(keys["claims:stream"])["last-generated-id"] == f"{now}-0"
    assert server.zcard(keys["claims:requested"]) == 100 and server.hlen(keys["claims"]) == 100
    assert server.get(keys["claims:requested:floor"]) == str(base + 19)
    assert all(server.ttl(keys[k]) == -1 for k in ("claims", "claims:requested",
                                                    "claims:requested:floor"))

    def run_now(store, slot):
        return store.claim([dataclasses.replace(req("e", slot), requested=True)])[0]
    for slot in (base, base + 19, base - 1):      # trimmed, or older than the kept ones: refused
        refused = run_now(b, slot)
        assert refused.outcome is Outcome.FORGOTTEN and "run-now runs" in refused.detail, refused
    kept = run_now(b, base + 20)
    assert (kept.outcome, kept.winner) == (Outcome.OTHER_WON, "A"), kept
    assert run_now(a, base + 20).outcome is Outcome.WON, "the winner's retry"
    same = b.claim([req("e", base + 50)])[0]
    assert (same.outcome, same.winner) == (Outcome.OTHER_WON, "A"), "one slot is one run"
    assert outcome(b, now + 1000) is Outcome.WON, "the schedule goes on"
    assert run_now(b, now + 500).outcome is Outcome.WON
    assert outcome(b, now + 2000) is Outcome.WON, "a run-now run supersedes no scheduled slot"


def _shuffled_racer(url, namespace, instance_id, runs, barrier, queue):
    store = open_store(url, namespace=namespace, instance_id=instance_id,
                       options={"strategy": "stream-id"})
    try:
        barrier.wait(timeout=30)
        answers = [(r.request.slot_ms, r.outcome.value) for slot in runs
                   for r in store.claim([req("e", slot)])]
        queue.put((instance_id, answers, None))
    except BaseException as exc:  # report, never hang the parent
        queue.put((instance_id, [], repr(exc)))
    finally:
        store.close()


def test_stream_id_out_of_order_racers_never_win_a_run_twice(stream_id):
    """Processes claiming the same slots in different orders: older slots are superseded (a
    possible miss), and no run ever has two winners."""
    base = prepared(stream_id("setup")).now_ms()
    ctx = multiprocessing.get_context("fork")
    barrier, queue = ctx.Barrier(3), ctx.Queue()
    orders = [random.Random(n).sample(range(base, base + 60), 60) for n in range(3)]
    procs = [ctx.Process(target=_shuffled_racer, args=(stream_id.url, stream_id.namespace, f"p{n}",
                                                         order, barrier, queue))
             for n, order in enumerate(orders)]
    for p in procs:
        p.start()
    reports = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert not [err for _, _, err in reports if err]
    answers = [a for _, got, _ in reports for a in got]
    assert {outcome for _, outcome in answers} <= {"won", "other_won", "superseded"}
    winners = Counter(slot for slot, outcome in answers if outcome == "won")
    assert winners and max(winners.values()) == 1


def test_stream_id_refuses_early_slots_on_the_server_clock(stream_id):
    """An instance whose clock runs ahead must not push the stream's id past everyone's slots."""
    a = prepared(stream_id("A"))
    now = a.now_ms()
    early = a.claim([req("e", now + LATENESS_TOLERANCE_MS + 5000)])[0]
    assert early.outcome is Outcome.EARLY
    assert outcome(a, now) is Outcome.WON


# -- script ---------------------------------------------------------------------------------------

def test_script_remembers_for_its_window_then_refuses_on_the_server_clock(script):
    """Within the window a repeated claim is lost; after it the claim is pruned, and the slot,
    now older than the window on the server's clock, is refused (forgotten): never won again.
    The window is the memory; the refusal is the partial lateness check of docs/design.md's table."""
    # a window of 2 s: B's claim below lands within it even on a loaded machine
    a, b = prepared(script("A", window=2)), script("B", window=2)
    slot = a.now_ms()
    assert outcome(a, slot) is Outcome.WON
    assert outcome(b, slot) is Outcome.OTHER_WON
    wait_until(lambda: a.now_ms() > slot + 2100, 10, "the window to pass")
    again = b.claim([req("e", slot)])[0]
    assert again.outcome is Outcome.FORGOTTEN and "older than the window" in again.detail
    server = raw(script)
    assert not server.hexists(a.keys_of("e")["claims"], str(slot)), "the claim was pruned"
    assert outcome(a, a.now_ms()) is Outcome.WON


def test_script_count_trimming_never_reopens_a_trimmed_slot(script):
    a, b = prepared(script("A", history_size=3)), script("B", history_size=3)
    base = a.now_ms() - 10_000
    slots = [base + i * 1000 for i in range(1, 6)]
    for slot in slots:
        assert outcome(a, slot) is Outcome.WON
    server, keys = raw(script), a.keys_of("e")
    assert server.zcard(keys["claims:slots"]) == 3 and server.hlen(keys["claims"]) == 3
    assert server.get(keys["claims:floor"]) == str(slots[1])
    for slot in slots[:2]:  # trimmed: refused, never won a second time
        assert b.claim([req("e", slot)])[0].outcome is Outcome.FORGOTTEN
    assert outcome(b, base) is Outcome.FORGOTTEN, "an older unclaimed slot is refused too"
    assert outcome(b, slots[2]) is Outcome.OTHER_WON, "the newest 3 are remembered"
    assert outcome(b, slots[1] + 500) is Outcome.WON, "out of order inside the window is fine"


# -- idmp -----------------------------------------------------------------------------------------

def test_idmp_remembers_for_duration_then_refuses_on_the_server_clock(idmp):
    """Within ``duration`` a repeated claim is lost; once the slot is older than the duration on
    the server's clock it is refused (forgotten) before IDMP itself forgets it (its ids expire a
    duration after the claim, never before the slot + duration): never won a second time."""
    a, b = prepared(idmp("A", duration=1)), idmp("B", duration=1)
    slot = a.now_ms()
    won = a.claim([req("e", slot)])[0]
    assert won.outcome is Outcome.WON
    answers = []

    def repeat_refused():
        answers.append(b.claim([req("e", slot)])[0])
        return answers[-1].outcome is not Outcome.OTHER_WON

    wait_until(repeat_refused, 5, "the repeated claim to be refused after the duration")
    again = answers.pop()
    assert again.outcome is Outcome.FORGOTTEN and again.store_ms - slot >= 1000, again
    assert answers and all(r.outcome is Outcome.OTHER_WON and r.winner == "A" for r in answers)


def test_idmp_remembers_max_size_runs_then_a_repeat_wins_again(idmp):
    a, b = prepared(idmp("A", max_size=2)), idmp("B", max_size=2)
    base = a.now_ms() - 5000
    for i in range(3):
        assert outcome(a, base + i) is Outcome.WON
    assert outcome(b, base + 2) is Outcome.OTHER_WON and outcome(b, base + 1) is Outcome.OTHER_WON
    again = b.claim([req("e", base)])[0]
    assert again.outcome is Outcome.WON and again.winner == "B", "the oldest of 3 was forgotten"


def _run_now_then_scheduled_runs(store, count: int, entry="e"):
    """A run-now request of ``entry`` (an entry every second: its scheduled slots are the whole
    seconds), then ``count`` scheduled runs of it claimed by ``store``, the slots after the
    request's (claimed ahead of time, within the 10-s early tolerance, where a real beat would
    claim them one a second). Returns the request's claim."""
    now = store.now_ms()
    seconds = frozenset(range((now // 1000 - 10) * 1000, (now // 1000 + 70) * 1000, 1000))
    request = request_run(store, entry, "r1", scheduled=seconds)
    claim = dataclasses.replace(req(entry, request.slot_ms, max_late_ms=15_000), requested=True)
    first_second = request.slot_ms // 1000 * 1000 + 1000
    runs = [req(entry, first_second + i * 1000, max_late_ms=3_000) for i in range(count)]
    return claim, runs


def test_idmp_forgets_a_run_now_claim_after_max_size_newer_runs_and_a_late_claim_wins_it_again(
        idmp):
    """Why a count-limited memory must cover a run-now request's late window (``timing.
    check_run_now``): with ``max_size=5`` and an entry every second, IDMP remembers about 5 s
    of runs, but a second instance claims the request up to 2 x anarchon_sync_interval + 5 s
    (15 s) after its slot. Once 5 newer runs were claimed, its claim wins the run a second
    time: IDMP has no floor to refuse it by."""
    a, b = prepared(idmp("A", max_size=5)), idmp("B", max_size=5)
    claim, runs = _run_now_then_scheduled_runs(a, 5)
    assert a.claim([claim])[0].outcome is Outcome.WON
    assert {r.outcome for r in a.claim(runs)} == {Outcome.WON}
    again = b.claim([claim])[0]
    assert (again.outcome, again.winner) == (Outcome.WON, "B"), "a second win of one run"
    assert again.store_ms - claim.slot_ms < 10_000, "well within the request's 15-s window"


def test_script_refuses_a_run_now_claim_after_history_size_newer_runs_as_forgotten(script):
    """The same on ``script`` with ``history_size=5``: the count trimming moves its floor past the
    request's slot, so the request's claim is refused (forgotten): no second win, but a request
    that no instance claimed before those 5 runs is never sent (a miss)."""
    a, b = prepared(script("A", history_size=5)), script("B", history_size=5)
    claim, runs = _run_now_then_scheduled_runs(a, 5)
    assert a.claim([claim])[0].outcome is Outcome.WON
    assert {r.outcome for r in a.claim(runs)} == {Outcome.WON}
    again = b.claim([claim])[0]
    assert again.outcome is Outcome.FORGOTTEN and "history_size" in again.detail, again
    prepared(a, "f")
    missed, runs = _run_now_then_scheduled_runs(a, 6, entry="f")
    assert {r.outcome for r in a.claim(runs)} == {Outcome.WON}
    late = b.claim([missed])[0]
    assert late.outcome is Outcome.FORGOTTEN, "first claimed after 6 newer runs: never sent"


def test_idmp_winner_record_gone_is_unknown_never_a_win(idmp):
    a = prepared(idmp("A"))
    slot = a.now_ms()
    assert outcome(a, slot) is Outcome.WON
    raw(idmp).xtrim(a.keys_of("e")["claims:idmp"], maxlen=0)  # IDMP still remembers the slot
    assert outcome(a, slot) is Outcome.UNKNOWN


def stream_settings(maker, store, entry="e"):
    info = raw(maker).xinfo_stream(store.keys_of(entry)["claims:idmp"])
    return info["idmp-duration"], info["idmp-maxsize"]


def test_idmp_stream_is_created_with_the_settings_and_again_after_amnesia(idmp):
    a = prepared(idmp("A", duration=3600, max_size=7))
    assert stream_settings(idmp, a) == (3600, 7)
    slot = a.now_ms()
    assert outcome(a, slot) is Outcome.WON
    idmp.wipe()
    assert outcome(a, slot) is Outcome.FORGOTTEN
    begun = a.now_ms()
    wait_until(lambda: a.now_ms() > begun + 20, 5, "the store clock to move")
    assert outcome(a, begun + LATENESS_TOLERANCE_MS + 1) is Outcome.WON
    assert stream_settings(idmp, a) == (3600, 7), "never the server's defaults (100 s, 100)"


def release_settings(maker, store, by_ms=10_000_000):
    """Move the store-wide settings note's last use ``by_ms`` back: nobody used them for that long,
    so another instance may replace them (spec point 5)."""
    server, key = raw(maker), store.store_key
    server.hset(key, "settings_used", str(int(server.hget(key, "settings_used")) - by_ms))


def test_idmp_live_stream_with_other_settings_is_kept_and_reported(idmp):
    """The store-wide settings are replaceable (nobody used them lately), yet a stream still
    remembers runs under the old IDMP values: changing them would wipe it, so it is kept."""
    a = prepared(idmp("A", duration=60, max_size=50))
    slot = a.now_ms()
    assert outcome(a, slot) is Outcome.WON
    b = idmp("B", duration=120, max_size=80)
    with pytest.raises(ConfigError, match="duration=60s max_size=50"):
        b.prepare(["e"])
    release_settings(idmp, a)
    text = " ".join(b.prepare(["e"]))
    assert "IDMP-DURATION 60 s, IDMP-MAXSIZE 50" in text and "duration=120, max_size=80" in text
    assert "Kept" in text and "1 runs now" in text
    assert stream_settings(idmp, a) == (60, 50)
    assert outcome(b, slot) is Outcome.OTHER_WON, "changing them would have re-opened this run"


def test_idmp_stream_that_remembers_nothing_takes_the_new_settings(idmp):
    a = prepared(idmp("A", duration=1, max_size=50))
    assert outcome(a, a.now_ms()) is Outcome.WON
    key = a.keys_of("e")["claims:idmp"]
    wait_until(lambda: raw(idmp).xinfo_stream(key)["iids-tracked"] == 0, 5, "the duration to pass")
    release_settings(idmp, a)
    b = idmp("B", duration=120, max_size=80)
    text = " ".join(b.prepare(["e"]))
    assert "IDMP-DURATION 1 s, IDMP-MAXSIZE 50" in text and "changed to" in text
    assert stream_settings(idmp, a) == (120, 80)


def test_idmp_on_a_server_older_than_8_6_is_a_config_error():
    require_server(REDIS_URL, "Redis")
    version = redis.Redis.from_url(REDIS_URL).info("server")["redis_version"]
    if tuple(int(p) for p in version.split(".")[:2]) >= (8, 6):
        pytest.skip(f"the server at {REDIS_URL} is {version}, not older than 8.6")
    s = open_store(REDIS_URL, namespace="ns", instance_id="A", options={"strategy": "idmp"})
    with pytest.raises(ConfigError) as caught:
        s.prepare(["e"])
    text = str(caught.value)
    assert f"Redis {version}" in text and ">= 8.6" in text
    assert "'lease', 'stream-id', 'script'" in text and "'idmp'" not in text.split("work on")[1]
    s.close()


def test_idmp_refuses_early_and_forgotten_slots_on_the_server_clock(idmp):
    """An instance whose clock is off by more than the tolerance (ahead) or by more than the IDMP
    duration (behind) must not win a run the stream cannot remember: idmp checks the slot against
    the server's TIME, as the lease strategy does (early, forgotten)."""
    a = prepared(idmp("A", duration=2))
    now = a.now_ms()
    early = a.claim([req("e", now + LATENESS_TOLERANCE_MS + 5000)])[0]
    assert early.outcome is Outcome.EARLY, early
    old = a.claim([req("e", now - 3000)])[0]
    assert old.outcome is Outcome.FORGOTTEN and "duration" in old.detail, old
    assert history_event(a, now - 3000) is RunEvent.FORGOTTEN
    assert outcome(a, now) is Outcome.WON and outcome(a, now) is Outcome.WON


@pytest.mark.parametrize("kind, ours, theirs, words", [
    ("redis-script", {"window": 60}, {"window": 120}, ["window=60s", "window=120s"]),
    ("redis-idmp", {"duration": 60}, {"duration": 120}, ["duration=60s", "duration=120s"]),
    ("redis-stream-id", {}, {"strategy": "script"}, ["strategy=stream-id", "strategy=script"]),
])
def test_each_strategys_memory_settings_are_recorded_store_wide(kind, ours, theirs, words,
                                                                 namespace):
    """Spec point 5 for every strategy: the store records the settings that decide its memory;
    another instance with other values is refused at prepare and its claims are refused."""
    for maker in redis_maker(kind, namespace):
        a = prepared(maker("A", **ours))
        assert outcome(a, a.now_ms()) is Outcome.WON
        b = maker("B", **theirs)
        with pytest.raises(ConfigError) as caught:
            b.prepare(["e"])
        for word in words:
            assert word in str(caught.value)
        refused = b.claim([req("e", a.now_ms() + 1)])[0]
        assert refused.outcome is Outcome.FORGOTTEN and words[0] in refused.detail


# -- the entry store and the pause, every strategy -------------------------------------------------

def test_the_pause_is_decided_inside_the_claim_script_in_one_round_trip(every, monkeypatch):
    """A batch of a running and a paused entry is one EVALSHA: the pause is read by the claim
    script itself, so it holds on an instance that never read the entries; each paused run is
    answered with who paused and why and recorded once, and a leased one gets no lease record."""
    ops = every("ops")
    ops.entries.set_pause("held", Pause("maintenance", "ops", 0), by="ops")
    a = prepared(every("A"), "run", "held")
    now = a.now_ms()
    sent = round_trips(a, monkeypatch)
    lease = LeaseTerms(queue_timeout_ms=60_000) if a.leases is not None else None
    results = a.claim([req("run", now + i) for i in range(3)]
                      + [req("held", now + i, lease=lease) for i in range(3)])
    assert sent == [["EVALSHA"]]
    assert [r.outcome for r in results] == [Outcome.WON] * 3 + [Outcome.PAUSED] * 3
    assert {(r.detail, r.winner, r.token) for r in results[3:]} == {
        ("paused by ops: maintenance", None, None)}
    again = a.claim([req("held", now + i, lease=lease) for i in range(3)])
    assert [r.outcome for r in again] == [Outcome.PAUSED] * 3
    for i in range(3):
        assert [(h.event, h.instance) for h in a.history.read("held") if h.slot_ms == now + i] == [
            (RunEvent.PAUSED, "A")], "recorded once"
        if lease:
            assert a.leases.inspect("held", now + i) is None


def test_a_slot_refused_as_paused_is_won_once_after_the_resume(every):
    """A paused answer writes no claim: after the resume the same slot is won by the first
    instance that claims it, its retry is won again and the others lose it. On idmp the XADD of
    the paused run was undone in the claim script (the stream holds no entry for it) and the
    slot was marked as never won, since IDMP keeps the id."""
    a, b = prepared(every("A")), every("B")
    a.entries.set_pause("e", Pause("", "ops", 0), by="ops")
    slot = a.now_ms()
    assert outcome(b, slot) is Outcome.PAUSED and outcome(a, slot) is Outcome.PAUSED
    if every.kind == "redis-idmp":
        assert raw(every).xlen(a.keys_of("e")["claims:idmp"]) == 0, "the paused XADD was undone"
    a.entries.set_pause("e", None, by="ops")
    won = b.claim([req("e", slot)])[0]
    assert won.outcome is Outcome.WON and won.winner == "B"
    assert outcome(b, slot) is Outcome.WON, "the winner's retry"
    lost = a.claim([req("e", slot)])[0]
    assert lost.outcome is Outcome.OTHER_WON and lost.winner == "B"
    assert history_event(a, slot) is RunEvent.CLAIMED, "the claim replaces the paused record"
    assert outcome(a, slot + 1) is Outcome.WON


def test_every_write_is_one_script_raising_the_version_and_reads_are_one_round_trip(
        every, monkeypatch):
    """put, pause, resume, run-now and remove are one script each (the version is raised in the
    same script), and one round trip with their confirmation (the confirm_write script, then a
    WAIT when the master has replicas; durability "none": the script alone); entries_version()
    is one GET; load_entries(), instances() and a heartbeat are one round trip each."""
    a = prepared(every("A"))
    sent = round_trips(a, monkeypatch)
    a.entries.put_entry("e", DEFINITION, by="x", create=True)
    a.entries.set_pause("e", Pause("", "x", 0), by="x")
    a.entries.set_pause("e", None, by="x")
    request_run(a, "e", "r1", by="x")
    a.entries.remove_entry("e", by="x")
    assert [names for names in sent if names] == [["EVALSHA", "EVALSHA"]] * 5
    sent.clear()
    assert a.entries.entries_version() == 5
    assert sent == [[]], "one round trip, no script"
    sent.clear()
    a.entries.load_entries(), a.instances.instances()
    a.instances.record_instance(InstanceRecord("A", "h", 1, "1", 0, 0, None, 1, "d"), 60_000)
    assert len(sent) == 3 and sent[2] == ["EVALSHA"]
    lone = every("B", durability="none")
    sent.clear()
    lone.entries.set_pause("e", None, by="x")
    assert [names for names in sent if names] == [["EVALSHA"]]


def test_namespace_keys_share_one_hash_tag_and_carry_no_ttl(every):
    a = prepared(every("A"))
    a.entries.put_entry("e", DEFINITION, by="x", create=True)
    a.entries.set_pause("e", Pause("", "x", 0), by="x")
    a.entries.set_pause("gone", None, by="x")             # a cleared record (entries:cleared)
    request_run(a, "e", "r1", by="x")
    a.instances.record_instance(InstanceRecord("A", "h", 1, "1", 0, 0, None, 1, "d"), 60_000)
    a.instances.save_fingerprints("d", {"e": "fp"})
    keys = a.namespace_keys
    assert keys["store"] == a.store_key
    assert len({key_slot(k.encode()) for k in keys.values()}) == 1
    assert all(k.startswith(f"anarchon:{{{every.namespace}}}:") for k in keys.values())
    server = raw(every)
    assert all(server.exists(k) and server.ttl(k) == -1 for k in keys.values()), \
        {k: server.ttl(k) for k in keys.values()}
    assert not set(keys.values()) & set(a.keys_of("e").values())


def test_old_requests_and_expired_instances_are_pruned_by_the_next_write(script):
    """Run-now requests are read by beat as long as the store's memory (here the script window,
    1 s; a day when it is unbounded, stream-id), their ids are kept for the retention (a week by
    default); an expired instance record is dropped by the next heartbeat, all on the server's
    clock."""
    a = prepared(script("A", window=1))
    assert a.entries.horizon_ms == 1000
    assert build(strategy="stream-id").entries.horizon_ms == DAY_MS
    first = request_run(a, "e", "r1", by="x")
    a.instances.record_instance(InstanceRecord("old", "h", 1, "1", 0, 0, None, 1, ""), 1)
    wait_until(lambda: a.now_ms() > first.requested_ms + 1000, 5, "the window to pass")
    assert [r.request_id for r in a.entries.load_entries().requests] == [], "too old to be loaded"
    request_run(a, "e", "r2", by="x")
    a.instances.record_instance(InstanceRecord("A", "h", 1, "1", 0, 0, None, 1, ""), 60_000)
    server, keys = raw(script), a.namespace_keys
    assert server.hkeys(keys["requests"]) == ["e r2"] and server.zcard(keys["requests:age"]) == 1
    assert server.zrange(keys["requests:slots"], 0, -1) == ["e r2"]
    assert sorted(server.hkeys(keys["requests:ids"])) == ["e r1", "e r2"], "kept for the retention"
    assert server.hkeys(keys["instances"]) == ["A"] and server.zcard(keys["instances:expiry"]) == 1
    assert [r.request_id for r in a.entries.load_entries().requests] == ["r2"]
    assert request_run(a, "e", "r1", by="y") == dataclasses.replace(first, created=False)


def test_record_many_writes_what_record_writes_in_one_pipeline(every, monkeypatch):
    """The batch of history notes (sends, unconfirmed wins) lands in the entries' history as
    single records do: skip events fill an empty record only."""
    a = prepared(every("A"), "e", "f")
    now = a.now_ms()
    assert outcome(a, now) is Outcome.WON
    sent = round_trips(a, monkeypatch)
    a.history.record_many([HistoryRecord("e", now, RunEvent.SENT, task_id="t", detail="sent"),
                   HistoryRecord("f", now, RunEvent.LATE_LOCAL, detail="late here"),
                   HistoryRecord("e", now + 1, RunEvent.UNREACHABLE)])
    assert sent[-1] == ["EVALSHA"] * 3, "one pipeline (redis-py checks its scripts before)"
    a.history.record("e", now, RunEvent.LATE_LOCAL, detail="never over a sent run")
    assert [(h.event, h.detail) for h in a.history.read("e")] == [
        (RunEvent.UNREACHABLE, ""), (RunEvent.SENT, "sent")]
    assert [(h.event, h.detail) for h in a.history.read("f")] == [(RunEvent.LATE_LOCAL, "late here")]
