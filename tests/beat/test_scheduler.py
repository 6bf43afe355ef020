"""The Celery glue: construction, banner, close, tick never raising, sending (where the store is:
tests/test_settings.py)."""
from __future__ import annotations

import logging
import time
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
import redis
from celery import Celery
from celery.schedules import crontab
from kombu.exceptions import OperationalError

from celery_anarchon import ConfigError, Scheduler, scheduled_at
from celery_anarchon.beat.publisher import Publisher
from celery_anarchon.errors import SendOutcomeUnknown
from celery_anarchon.beat.scheduler import _exit_requested
from celery_anarchon.schedule import definition as entry_json
from celery_anarchon.stores.base import RunEvent

from conftest import REDIS_URL, require_server
from stores_support import wait_until
from tcp_proxy import TCPProxy, redis_address
from backends import backdate_memory_start


def make_app(tmp_path, **conf):
    app = Celery("proj", set_as_current=False)
    settings = {"broker_url": "memory://", "anarchon_store_url": f"sqlite:///{tmp_path}/s.sqlite3",
                "beat_schedule": {"tick": {"task": "proj.tick", "schedule": 10.0}}}
    app.conf.update({**settings, **conf})
    return app


def test_the_banner_instance_opens_nothing_and_masks_the_password(tmp_path):
    require_server(REDIS_URL, "Redis")
    proxy = TCPProxy(redis_address()).start()
    try:
        app = make_app(tmp_path, anarchon_store_url=f"redis://:s3cret@127.0.0.1:{proxy.port}/9")
        scheduler = Scheduler(app, lazy=True)
        info = scheduler.info
        time.sleep(0.2)
        assert proxy.accepted == 0, "the lazy banner instance connected to the store"
        assert "s3cret" not in info and f"redis://:***@127.0.0.1:{proxy.port}/9" in info
        assert "namespace -> proj" in info and "max_late 60 s" in info and "jitter 2 s" in info
        assert scheduler.engine is None
    finally:
        proxy.close()


def test_close_is_safe_twice_and_the_store_reopens_lazily(tmp_path):
    app = make_app(tmp_path, beat_schedule={
        "tick": {"task": "proj.tick", "schedule": 10.0, "options": {"anarchon": {"jitter": 0}}}})
    sent = []
    scheduler = Scheduler(app)
    backdate_memory_start(scheduler.store, ["tick"], 120_000)   # not a new store: it claims
    scheduler.engine.send = lambda plan, slot, attempt, token, task_id: sent.append(slot)
    scheduler.close()
    scheduler.close()
    scheduler.tick()                      # the start-up run: claimed and recorded in the store
    assert len(sent) == 1, "no run was claimed and sent after close()"
    history = scheduler.store.history.read("tick")
    assert [(h.slot_ms, h.event) for h in history] == [(sent[0], RunEvent.SENT)], \
        "the reopened store did not record the send"
    scheduler.close()


def test_a_subclass_swaps_the_publisher_whose_connection_and_producer_are_celerys(tmp_path):
    """``Scheduler.Publisher`` is the class of the broker side, swapped by a subclass as Celery's
    ``Entry`` is; Celery's ``connection`` and ``producer`` are the publisher's; a forked process
    gets a publisher of its own, with its own instance id."""
    published = []

    class Recording(Publisher):
        def send(self, plan, slot_ms, attempt, token, task_id):
            published.append((plan.name, self.instance_id))
            super().send(plan, slot_ms, attempt, token, task_id)

    class Mine(Scheduler):
        Publisher = Recording

    app = make_app(tmp_path, beat_schedule={
        "tick": {"task": "proj.tick", "schedule": 10.0, "options": {"anarchon": {"jitter": 0}}}})
    scheduler = Mine(app)
    try:
        assert type(scheduler.publisher) is Recording and Scheduler.Publisher is Publisher
        assert scheduler.producer is scheduler.publisher.producer
        assert scheduler.connection is scheduler.publisher.connection
        backdate_memory_start(scheduler.store, ["tick"], 120_000)   # not a new store: it claims
        scheduler.tick()                      # the start-up run, sent through the subclass
        assert published == [("tick", scheduler._instance_id)]
        with app.connection_for_read() as conn:
            assert conn.SimpleQueue("celery").get(timeout=2).headers["task"] == "proj.tick"
        parent = scheduler.publisher
        scheduler._pid = -1                   # as if this process were forked from another
        scheduler.tick()
        assert type(scheduler.publisher) is Recording and scheduler.publisher is not parent
        assert scheduler.publisher.instance_id == scheduler._instance_id != parent.instance_id
    finally:
        scheduler.close()


def test_the_memory_store_runs_only_in_a_test_app(tmp_path, namespace):
    """memory:// lives in one process: beat refuses it with a broker other processes share,
    naming the setting, its value and the fix, and takes it with the in-memory broker of a test
    app, where two beats of the process share memory://<name> and send the run once."""
    url = f"memory://{namespace}"
    with pytest.raises(ConfigError) as refused:
        Scheduler(make_app(tmp_path, broker_url="redis://127.0.0.1:6379/0", anarchon_store_url=url))
    for words in (f"anarchon_store_url = '{url}'", "this process only", "broker_url is 'memory://'",
                  "'redis://127.0.0.1:6379/0'", "fix: set anarchon_store_url to a store every beat"):
        assert words in str(refused.value), (words, str(refused.value))
    sent = []
    beats = [Scheduler(make_app(tmp_path, anarchon_store_url=url, beat_schedule={
        "tick": {"task": "proj.tick", "schedule": 10.0, "options": {"anarchon": {"jitter": 0}}}}))
        for _ in range(2)]
    backdate_memory_start(beats[0].store, ["tick"], 120_000)   # not a new store: it claims
    for beat in beats:
        beat.engine.send = lambda plan, slot, attempt, token, task_id: sent.append(slot)
    for beat in beats:
        beat.tick()
        beat.close()
    assert len(sent) == 1, sent


def test_no_exception_ever_leaves_tick(tmp_path, caplog):
    scheduler = Scheduler(make_app(tmp_path))

    def broken():
        raise RuntimeError("a bug")
    scheduler.engine.tick = broken
    with caplog.at_level(logging.ERROR, "celery_anarchon"):
        assert scheduler.tick() == 5.0
    assert "tick failed" in caplog.text and "a bug" in caplog.text


def test_a_close_during_a_tick_ends_beat_and_nothing_more_is_sent(tmp_path):
    """Beat's SIGTERM handler calls close() and raises SystemExit inside whatever runs; redis-py
    turned that into ``ValueError: I/O operation on closed file`` during a publish."""
    app = make_app(tmp_path, beat_schedule={
        "a": {"task": "proj.a", "schedule": 2.0, "options": {"anarchon": {"jitter": 0}}},
        "b": {"task": "proj.b", "schedule": 2.0, "options": {"anarchon": {"jitter": 0}}}})
    scheduler = Scheduler(app)
    backdate_memory_start(scheduler.store, ["a", "b"], 120_000)   # not a new store: it claims
    calls = []

    def interrupted(plan, slot, attempt, token, task_id):
        calls.append(plan.name)
        scheduler.close()                     # what beat's signal handler does first
        try:
            raise SystemExit()
        except SystemExit:
            raise ValueError("I/O operation on closed file")

    scheduler.engine.send = interrupted
    with pytest.raises(SystemExit):
        scheduler.tick()
    assert len(calls) == 1, "the engine went on sending after close()"
    scheduler.engine.send = lambda *a: calls.append("again")
    assert scheduler.engine.tick() == 60 and len(calls) == 1
    scheduler.store.close()


def test_an_exit_hidden_in_an_exception_chain_is_found():
    try:
        try:
            raise KeyboardInterrupt()
        except KeyboardInterrupt as exc:
            raise OSError("broken pipe") from exc
    except OSError as exc:
        assert _exit_requested(exc)
    assert not _exit_requested(ValueError("just a bug"))


def test_a_publish_that_broke_off_is_reported_unknown_never_retried(tmp_path):
    """Real Redis broker behind a proxy: a publish on a connection the broker lost raises
    SendOutcomeUnknown (the engine does not publish it again); once the connection sat idle, it
    is checked first and a dead broker is a plain, retryable failure."""
    require_server(REDIS_URL, "Redis")
    proxy = TCPProxy(redis_address()).start()
    try:
        app = make_app(tmp_path, broker_url=proxy.url("redis", "/11"))
        with app.connection_for_read() as conn:
            conn.SimpleQueue("celery").clear()
        scheduler = Scheduler(app)
        plan = scheduler.engine.plans["tick"]
        publisher = scheduler.publisher

        def received():
            with app.connection_for_read() as conn:
                message = conn.SimpleQueue("celery").get(timeout=2)
                message.ack()
                return message.headers["id"]

        publisher.send(plan, 1_700_000_000_000, 1, None, "first")
        assert received() == "first"
        proxy.outage()                      # the broker goes away while the connection is idle
        publisher._broker_used_at = 0.0     # idle: checked (PING) first, nothing is written
        with pytest.raises(redis.exceptions.ConnectionError):   # the PING, before any publish
            publisher.send(plan, 1_700_000_010_000, 1, None, "second")
        proxy.restore()
        publisher.send(plan, 1_700_000_020_000, 1, None, "third")
        assert received() == "third"
        proxy.outage()                      # the broker goes away right after a publish ...
        publisher._broker_used_at = time.monotonic()   # ... so the next one is not checked first
        with pytest.raises(SendOutcomeUnknown):
            publisher.send(plan, 1_700_000_030_000, 1, None, "fourth")
        proxy.restore()
        publisher.send(plan, 1_700_000_040_000, 1, None, "fifth")
        assert received() == "fifth"
    finally:
        proxy.close()
        scheduler.close()



def test_a_send_batch_on_a_redis_broker_writes_once_and_a_broken_write_is_unknown(tmp_path):
    """Real Redis broker behind a proxy: the runs of one send batch reach the broker in one
    pipelined write when the batch ends; a write that broke off raises SendOutcomeUnknown (the
    engine never publishes those runs again); a broker down when a batch starts is a plain,
    retryable failure (nothing was written)."""
    require_server(REDIS_URL, "Redis")
    proxy = TCPProxy(redis_address()).start()
    try:
        app = make_app(tmp_path, broker_url=proxy.url("redis", "/11"))
        with app.connection_for_read() as conn:
            conn.SimpleQueue("celery").clear()
        scheduler = Scheduler(app)
        plan = scheduler.engine.plans["tick"]
        publisher = scheduler.publisher

        def received():
            ids = []
            with app.connection_for_read() as conn:
                queue = conn.SimpleQueue("celery")
                while True:
                    try:
                        message = queue.get(timeout=0.5)
                    except queue.Empty:
                        return ids
                    message.ack()
                    ids.append(message.headers["id"])

        with publisher.send_batch(3):
            for n in range(3):
                publisher.send(plan, 1_700_000_000_000 + n * 10_000, 1, None, f"first-{n}")
            assert received() == [], "nothing written before the batch ends"
        assert received() == ["first-0", "first-1", "first-2"]
        proxy.outage()                      # the broker goes away right after a write ...
        publisher._broker_used_at = time.monotonic()   # ... so the batch does not check it first
        with pytest.raises(SendOutcomeUnknown):
            with publisher.send_batch(2):
                publisher.send(plan, 1_700_000_100_000, 1, None, "lost-0")
                publisher.send(plan, 1_700_000_110_000, 1, None, "lost-1")
        publisher._broker_used_at = 0.0     # idle: checked first (connect, PING), nothing written
        with pytest.raises((redis.exceptions.ConnectionError, OperationalError)):
            with publisher.send_batch(1):
                pass
        proxy.restore()
        with publisher.send_batch(2):
            publisher.send(plan, 1_700_000_200_000, 1, None, "again-0")
            publisher.send(plan, 1_700_000_210_000, 1, None, "again-1")
        assert received() == ["again-0", "again-1"]
    finally:
        proxy.close()
        scheduler.close()


def test_an_entry_added_at_run_time_is_scheduled(tmp_path):
    scheduler = Scheduler(make_app(tmp_path))
    scheduler.tick()
    scheduler.add(name="added", task="proj.added", schedule=30.0)
    scheduler.entry_plans.checked_at -= 2       # the second between two comparisons has passed
    scheduler.tick()
    assert "added" in scheduler.engine.plans and "tick" in scheduler.engine.plans
    scheduler.close()

def test_sleeps_are_capped_at_sixty_seconds(tmp_path):
    app = make_app(tmp_path, beat_schedule={"daily": {"task": "t", "schedule": crontab(0, 4)}})
    scheduler = Scheduler(app, max_interval=300)
    assert 0 < scheduler.tick() <= 60


def test_celery_backend_cleanup_is_kept(tmp_path):
    app = make_app(tmp_path, result_backend=f"db+sqlite:///{tmp_path}/results.sqlite3")
    scheduler = Scheduler(app)
    assert "celery.backend_cleanup" in scheduler.schedule
    assert "celery.backend_cleanup" in scheduler.engine.plans
    assert "tick" in scheduler.engine.plans


@pytest.mark.parametrize("entry, expected", [
    ({"task": "t", "schedule": 1, "relative": True}, "crontab"),
    ({"task": "t", "schedule": 1, "options": {"anarchon": {"jiter": 0.1}}}, "did you mean 'jitter'"),
    ({"task": "t", "schedule": crontab(minute="*/120")}, "*/120"),
])
def test_bad_entries_stop_beat_at_start_up(tmp_path, entry, expected):
    with pytest.raises(ConfigError) as info:
        Scheduler(make_app(tmp_path, beat_schedule={"bad": entry}))
    assert "'bad'" in str(info.value) and expected in str(info.value)


def test_a_run_is_sent_with_its_headers_task_id_and_untouched_options(tmp_path):
    user_headers = {"team": "billing"}
    app = make_app(tmp_path, beat_schedule={"bill": {
        "task": "proj.bill", "schedule": 10.0, "args": (1,),
        "options": {"headers": user_headers, "queue": "q1", "anarchon": {"max_late": 20}}}})
    scheduler = Scheduler(app)
    plan = scheduler.engine.plans["bill"]
    scheduler.publisher.send(plan, 1_700_000_000_000, 1, None, "the-task-id")
    with app.connection_for_read() as conn:
        message = conn.SimpleQueue("q1").get(timeout=2)
    headers = message.headers
    assert headers["id"] == "the-task-id" and headers["task"] == "proj.bill"
    assert headers["anarchon_slot"] == 1_700_000_000_000 and headers["anarchon_entry"] == "bill"
    assert headers["anarchon_namespace"] == "proj" and headers["anarchon_attempt"] == 1
    assert headers["anarchon_instance"] == scheduler._instance_id
    assert headers["celery_beat_task"] is True and headers["team"] == "billing"
    assert "anarchon" not in message.properties
    assert user_headers == {"team": "billing"}, "the user's options are never mutated"
    assert app.conf.beat_schedule["bill"]["options"]["anarchon"] == {"max_late": 20}


def test_scheduled_at_gives_the_slot_as_aware_utc():
    request = SimpleNamespace(headers={"anarchon_slot": 1_700_000_000_250})
    assert scheduled_at(request) == datetime(2023, 11, 14, 22, 13, 20, 250000, tzinfo=timezone.utc)
    assert scheduled_at(SimpleNamespace(request=request)) == scheduled_at(request)
    assert scheduled_at(SimpleNamespace(headers={})) is None


def test_a_leased_entry_needs_the_worker_side_installed(tmp_path):
    import celery_anarchon
    entry = {"task": "t", "schedule": 600, "options": {"anarchon": {"lease": True}}}
    app = make_app(tmp_path, beat_schedule={"long": entry})
    with pytest.raises(ConfigError) as info:
        Scheduler(app)
    assert "'long'" in str(info.value) and "celery_anarchon.install(app)" in str(info.value)
    celery_anarchon.install(app)
    plan = Scheduler(app).engine.plans["long"]
    assert plan.timing.lease.duration_s == 30 and plan.timing.lease.heartbeat_s == 5
    assert plan.lease_terms.queue_timeout_ms == 300_000 and not plan.lease_terms.overlap_allowed


def test_install_wraps_tasks_without_changing_plain_calls(tmp_path):
    import celery_anarchon
    app = make_app(tmp_path)

    @app.task(bind=True, shared=False)   # registered on this app only: no leak into others
    def add(self, x, y):
        return (x + y, self.request.id)

    celery_anarchon.install(app)
    app.finalize()
    assert type(app.tasks[add.name]).__dict__.get("_anarchon_patched")
    assert add(1, 2) == (3, None)                        # a plain call
    assert add.apply((2, 3), task_id="abc").get() == (5, "abc"), "the request survives the wrapper"


def test_store_entries_run_and_an_invalid_one_is_left_out_by_name(tmp_path, caplog):
    """The store's entries become plans (entry_json, then the start-up rules); one that breaks a
    rule on this instance is logged by name, once, and the others run; a beat_schedule entry
    wins a name clash."""
    app = make_app(tmp_path, anarchon_sync_interval=0.2)
    scheduler = Scheduler(app)
    store = scheduler.store

    def put(name, **schedule_and_anarchon):
        definition = {"task": "proj.t", "schedule": {"every": 10}, **schedule_and_anarchon}
        store.entries.put_entry(name, entry_json.canonical(definition), by="test", create=True)
    put("good")
    put("bad", schedule={"every": 1}, anarchon={"jitter": 0.9})   # jitter >= half the gap
    put("tick", schedule={"every": 20})                            # the config's name
    try:
        with caplog.at_level(logging.INFO, "celery_anarchon"):
            scheduler.tick()
            assert "good" in scheduler.engine.plans and "bad" not in scheduler.engine.plans
            assert scheduler.engine.plans["tick"].slots.shortest_gap_ms == 10_000, "config wins"
            put("good2")
            wait_until(lambda: (scheduler.tick(), "good2" in scheduler.engine.plans)[1], 5,
                       "the next sync")
        bad = [r for r in caplog.records if "store entry 'bad'" in r.getMessage()]
        assert len(bad) == 1 and bad[0].levelno == logging.ERROR
        assert bad[0].getMessage().startswith(
            "anarchon: store entry 'bad' is not valid on this instance and is left out (the others "
            "run): entry 'bad': jitter 0.9 s")
        assert "store entry 'tick' has the name of a beat_schedule entry" in caplog.text
        assert any(i.instance_id == scheduler._instance_id for i in store.instances.instances())
    finally:
        scheduler.close()
    assert not [i for i in store.instances.instances() if i.instance_id == scheduler._instance_id], \
        "close() removes this instance's record"
    store.close()


def test_store_entries_an_older_version_accepted_are_left_out_by_name_and_the_others_run(
        tmp_path, caplog):
    """Definitions stored before the rules of names, sizes, slots and options (a slot in the
    year 33658, options Celery cannot send, 100 KB of args, a name too long, a decomposed
    name): each is logged by name once as left out, without a traceback, and a good store entry
    and the config entry run."""
    from helpers import BROKEN_STORE_ENTRIES, write_broken_entries
    app = make_app(tmp_path, anarchon_sync_interval=0.2)
    scheduler = Scheduler(app)
    write_broken_entries(scheduler.store)
    scheduler.store.entries.put_entry("good", entry_json.canonical(
        {"task": "proj.t", "schedule": {"every": 10}}), by="test", create=True)
    try:
        with caplog.at_level(logging.INFO, "celery_anarchon"):
            scheduler.tick()
        assert set(scheduler.engine.plans) - {"celery.backend_cleanup"} == {"tick", "good"}
        for name in BROKEN_STORE_ENTRIES:
            said = [r for r in caplog.records if f"store entry {name!r} is not valid" in r.getMessage()]
            assert len(said) == 1 and not said[0].exc_info, (name, said)
    finally:
        scheduler.close()


def test_a_sync_interval_the_store_cannot_cover_stops_beat_at_start_up(tmp_path):
    app = make_app(tmp_path, anarchon_sync_interval=2000)           # memory: 3600 s
    with pytest.raises(ConfigError) as info:
        Scheduler(app)
    assert "anarchon_sync_interval 2000 s" in str(info.value)


def test_the_store_warnings_at_start_up_name_the_store_once(tmp_path, caplog):
    """The shared Redis keeps no data on disk: its warning names the (masked) URL once."""
    require_server(REDIS_URL, "Redis")
    server = redis.Redis.from_url(REDIS_URL)
    if server.config_get("save")["save"] or server.config_get("appendonly")["appendonly"] != "no":
        pytest.skip("this Redis keeps its data: no warning to look at")
    app = make_app(tmp_path, anarchon_store_url=REDIS_URL, anarchon_namespace="warn-once")
    with caplog.at_level(logging.WARNING, "celery_anarchon"):
        scheduler = Scheduler(app)
        try:
            scheduler.tick()
        finally:
            scheduler.close()
    [line] = [r.getMessage() for r in caplog.records if "keeps no data" in r.getMessage()]
    assert line.count(scheduler.store.safe_url) == 1, line
