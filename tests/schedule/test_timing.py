"""Every timing rule of docs/design.md: the error is raised at start-up and names entry, rule,
values and fix."""
from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from celery import Celery
from celery.beat import ScheduleEntry
from celery.schedules import crontab, schedule

from celery_anarchon import ConfigError, install
from celery_anarchon.schedule.plan import build_plan, build_plans, task_id_for
from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import Memory
from celery_anarchon.schedule.timing import (
    check_request_retention, check_run_now, check_sync_interval, resolve,
)
from celery_anarchon.settings import Settings


def make_app(**conf):
    app = Celery("proj", set_as_current=False)
    app.conf.update(broker_url="memory://", **conf)
    return app


def plan_of(sched, options=None, *, app=None, store_options=None, name="report",
            url="sqlite:///unused.sqlite3", **conf):
    app = app or make_app(**conf)
    store = open_store(url, namespace="proj", instance_id="i", options=store_options or {})
    entry = ScheduleEntry(name=name, task="proj.report", schedule=sched, options=options or {}, app=app)
    return build_plan(name, entry, app=app, settings=Settings.from_app(app), store=store)


def error_of(*args, **kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        plan_of(*args, **kwargs)
    return str(info.value)


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_default_jitter_is_two_seconds_lowered_to_a_quarter_of_short_gaps():
    assert plan_of(60).timing.jitter_s == 2
    assert plan_of(1).timing.jitter_s == 0.25
    assert plan_of(timedelta(seconds=6)).timing.jitter_s == 1.5
    assert plan_of(crontab()).timing.jitter_s == 2


def test_jitter_must_be_below_half_the_shortest_gap():
    message = error_of(1, {"anarchon": {"jitter": 0.5}})
    assert "entry 'report'" in message
    assert "jitter 0.5 s" in message and "half the shortest gap" in message and "(1 s)" in message
    assert "'jitter': 0.25" in message


def test_explicit_global_jitter_is_never_lowered_silently():
    message = error_of(1, anarchon_jitter=2)
    assert "entry 'report'" in message and "anarchon_jitter" in message and "jitter 2 s" in message
    assert plan_of(60, anarchon_jitter=2).timing.jitter_s == 2


def test_max_late_must_exceed_jitter():
    message = error_of(60, {"anarchon": {"jitter": 5, "max_late": 5}})
    assert "entry 'report'" in message and "max_late 5 s must be greater than jitter 5 s" in message
    assert "raise max_late" in message


def test_jitter_plus_max_late_must_stay_under_the_store_memory():
    message = error_of(600, {"anarchon": {"max_late": 100}}, store_options={"memory": 90})
    assert "entry 'report'" in message
    assert "jitter 2 s + max_late 100 s = 102 s" in message and "memory" in message
    assert "anarchon_store_options['memory'] to at least 204" in message


def test_count_limited_memory_must_cover_jitter_plus_max_late():
    memory = Memory(duration_s=300, count=50, setting="duration", count_setting="max_size")
    with pytest.raises(ConfigError) as info:
        resolve("tick", {}, Settings.from_app(make_app()), shortest_gap_s=1, memory=memory)
    message = str(info.value)
    assert "entry 'tick'" in message and "at most 50 runs" in message
    assert "jitter + max_late = 60.25 s" in message and "'max_size'" in message and "at least 122" in message
    ok = resolve("tick", {}, Settings.from_app(make_app()), shortest_gap_s=2, memory=memory)
    assert ok.max_late_s == 60


def test_heartbeat_must_be_below_half_the_lease():
    message = error_of(600, {"anarchon": {"lease": {"duration": 10, "heartbeat": 5}}})
    assert "entry 'report'" in message and "heartbeat 5 s" in message and "duration 10 s" in message
    assert "below 5" in message
    with pytest.raises(ConfigError, match="anarchon_heartbeat 20 s must be less than half of anarchon_lease 30 s"):
        Settings.from_app(make_app(anarchon_heartbeat=20))


def test_a_gap_shorter_than_lease_plus_two_heartbeats_is_warned(caplog):
    app = make_app()
    install(app)
    with caplog.at_level(logging.WARNING, "celery_anarchon"):
        plan_of(20, {"anarchon": {"lease": {"duration": 30, "heartbeat": 5}}}, app=app)
    assert ("entry 'report': the shortest gap between slots (20 s) is shorter than lease duration "
            "+ 2 x heartbeat (40 s)") in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, "celery_anarchon"):
        plan_of(40, {"anarchon": {"lease": {"duration": 30, "heartbeat": 5}}}, app=app)
    assert "shortest gap" not in caplog.text


@pytest.mark.parametrize("options, expected", [
    ({"jiter": 1}, "unknown key 'jiter' (did you mean 'jitter'?)"),
    ({"lease": {"duraton": 5}}, "unknown key 'duraton' (did you mean 'duration'?)"),
    ({"lease": {"overlap": "queue"}}, "'queue' is not one of ('skip', 'allow')"),
    ({"lease": {"max_attempts": 0}}, "must be an integer >= 1"),
    ({"lease": "yes"}, "must be True or a dict"),
    ({"max_late": "60s"}, "'60s' is not a duration"),
    ({"max_late": -1}, "must be a finite number of seconds >= 0"),
    ("not a dict", "options['anarchon'] must be a dict"),
])
def test_bad_entry_options_are_refused_by_name(options, expected):
    message = error_of(600, {"anarchon": options})
    assert "entry 'report'" in message and expected in message


def test_anchor_applies_to_interval_schedules_only():
    assert plan_of(60, {"anarchon": {"anchor": 15}}).slots.next_after(0) == 15_000
    message = error_of(crontab(), {"anarchon": {"anchor": 15}})
    assert "entry 'report'" in message and "interval schedules only" in message


def test_relative_interval_is_refused_with_a_pointer_to_crontab_or_anchor():
    message = error_of(schedule(timedelta(hours=1), relative=True))
    assert "entry 'report'" in message and "crontab" in message and "anchor" in message


def test_every_misconfigured_entry_is_reported_at_once():
    app = make_app()
    store = open_store("sqlite:///unused.sqlite3", namespace="proj", instance_id="i")
    entries = {name: ScheduleEntry(name=name, task="t", schedule=1, options=opts, app=app)
               for name, opts in [("a", {"anarchon": {"jitter": 1}}), ("b", {}),
                                  ("c", {"anarchon": {"max_lat": 3}})]}
    with pytest.raises(ConfigError) as info:
        build_plans(entries, app=app, settings=Settings.from_app(app), store=store)
    assert "2 beat_schedule entries are misconfigured" in str(info.value)
    assert "entry 'a'" in str(info.value) and "entry 'c'" in str(info.value)


def test_fingerprint_follows_the_definition_not_the_instance():
    a, b = plan_of(60), plan_of(60)
    assert a.fingerprint == b.fingerprint
    assert plan_of(60, {"anarchon": {"max_late": 30}}).fingerprint != a.fingerprint
    assert plan_of(120).fingerprint != a.fingerprint
    assert plan_of(crontab(minute=0)).fingerprint != plan_of(crontab(minute=0), timezone="Europe/Paris").fingerprint
    assert '"max_late_s": 60.0' in a.definition and "proj.report" in a.definition


def test_options_reach_celery_without_our_key():
    plan = plan_of(60, {"queue": "q", "anarchon": {"jitter": 1}})
    assert plan.celery_options == {"queue": "q"}


def test_task_ids_are_deterministic_and_distinct_per_attempt():
    assert task_id_for("ns", "e", 1000, 1) == task_id_for("ns", "e", 1000, 1)
    assert len({task_id_for("ns", "e", 1000, 1), task_id_for("ns", "e", 1000, 2),
                task_id_for("ns", "e:1000", 1, 1), task_id_for("ns2", "e", 1000, 1)}) == 4


@pytest.mark.parametrize("url, expected", [
    ("redsi://localhost", "Did you mean 'redis'?"),
    ("postgress://x/y", "Did you mean 'postgres'?"),
    ("mongodb://x", "unknown store scheme 'mongodb'"),
])
def test_unknown_store_url_suggests_the_closest_scheme(url, expected):
    with pytest.raises(ConfigError) as info:
        open_store(url, namespace="n", instance_id="i")
    assert expected in str(info.value) and "Known schemes" in str(info.value)


@pytest.mark.parametrize("url, options, setting", [
    ("sqlite:///x.sqlite3", {"memory": 50}, "'memory'"),
    ("redis://127.0.0.1:1/0", {"memory": 50}, "'memory'"),
    ("redis://127.0.0.1:1/0", {"strategy": "script", "window": 50}, "'window'"),
    ("redis://127.0.0.1:1/0", {"strategy": "idmp", "duration": 50}, "'duration'"),
    ("amqp://guest:guest@127.0.0.1:1//", {"slot_ttl": 50}, "'slot_ttl'"),
    ("nats://127.0.0.1:1", {"duplicate_window": 50}, "'duplicate_window'"),
])
def test_every_store_memory_must_outlast_jitter_plus_max_late(url, options, setting):
    """The memory rule names the store option to raise and a safe value (no server needed)."""
    message = error_of(600, store_options=options, url=url)
    assert "entry 'report'" in message and setting in message and "at least 124" in message


@pytest.mark.parametrize("options, setting, need", [
    ({"strategy": "script", "history_size": 20}, "'history_size'", "at least 122"),
    ({"strategy": "idmp", "max_size": 20}, "'max_size'", "at least 122"),
])
def test_count_limited_redis_memories_must_cover_jitter_plus_max_late(options, setting, need):
    message = error_of(1, store_options=options, url="redis://127.0.0.1:1/0")
    assert "entry 'report'" in message and setting in message and need in message


@pytest.mark.parametrize("url, options", [
    ("redis://127.0.0.1:1/0", {"strategy": "stream-id"}),
    ("redis://127.0.0.1:1/0", {"strategy": "script"}),
    ("redis://127.0.0.1:1/0", {"strategy": "idmp"}),
    ("amqp://guest:guest@127.0.0.1:1//", {}),
    ("nats://127.0.0.1:1", {}),
])
def test_a_leased_entry_needs_a_store_that_holds_leases(url, options):
    message = error_of(600, {"anarchon": {"lease": True}}, store_options=options, url=url)
    assert "entry 'report' is leased" in message and "cannot hold leases" in message
    assert "Redis (strategy 'lease'), PostgreSQL or SQLite" in message


def test_a_run_now_claim_must_stay_within_the_store_memory():
    check_sync_interval(Settings.from_app(make_app()), Memory(3600))
    check_sync_interval(Settings.from_app(make_app()), Memory(None))
    with pytest.raises(ConfigError) as info:
        check_sync_interval(Settings.from_app(make_app(anarchon_sync_interval=60)), Memory(120))
    assert str(info.value) == (
        "anarchon_sync_interval 60 s: a run-now request is claimed up to 2 x the sync interval "
        "+ 5 s = 125 s after it was made, which must be less than the store's memory of a claimed "
        "run (120 s, store option 'memory'), or a late claim could win it a second time. Fix: "
        "lower anarchon_sync_interval (default 5) or set anarchon_store_options['memory'] to at "
        "least 250.")


def test_a_run_now_claim_must_stay_within_a_count_limited_memory_of_its_entry():
    """count x shortest gap must cover a run-now request's max_late (2 x sync + 5 s, or the
    entry's max_late if longer), as it covers jitter + max_late of the scheduled runs; the
    error names the entry, the values and the fix, lowering the sync interval only when that
    can help."""
    idmp = Memory(duration_s=300, count=5, setting="duration", count_setting="max_size")
    for memory, gap in ((Memory(3600), 0.001), (Memory(None), 0.001), (idmp, 3.001)):
        check_run_now("e", memory, shortest_gap_s=gap, max_late_s=3, sync_interval_s=5)
    with pytest.raises(ConfigError) as info:
        check_run_now("e", idmp, shortest_gap_s=1, max_late_s=3, sync_interval_s=5)
    assert str(info.value) == (
        "entry 'e': run-now refused: a run-now request is claimed up to 15 s after its slot "
        "(2 x anarchon_sync_interval 5 s + 5 s, or the entry's max_late if longer), but the store "
        "remembers at most 5 runs per entry (store option 'max_size'); with 1 s between slots "
        "that is 5 s: a claim that late could find the first claim forgotten, and win the run a "
        "second time or be refused (a miss). Its scheduled runs are not affected. Fix: set "
        "anarchon_store_options['max_size'] to at least 32, or wait for the entry's next run.")
    script = Memory(duration_s=300, count=10, setting="window", count_setting="history_size")
    with pytest.raises(ConfigError) as info:
        check_run_now("n" * 300, script, shortest_gap_s=2, max_late_s=4, sync_interval_s=10)
    message = str(info.value)
    assert message.startswith("entry 'nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn'...: run-now")
    assert ("up to 25 s after its slot" in message and "that is 20 s" in message
            and "anarchon_store_options['history_size'] to at least 26, lower "
                "anarchon_sync_interval below 7.5 s, or wait" in message), message
    check_run_now("e", script, shortest_gap_s=2, max_late_s=4, sync_interval_s=7.4)
    check_run_now("e", script, shortest_gap_s=60, max_late_s=500, sync_interval_s=5)
    # each other request of the entry within the span takes one of the runs remembered
    check_run_now("e", script, shortest_gap_s=2, max_late_s=4, sync_interval_s=5, others=2)
    with pytest.raises(ConfigError) as info:
        check_run_now("e", script, shortest_gap_s=2, max_late_s=4, sync_interval_s=5, others=3)
    assert str(info.value) == (
        "entry 'e': run-now refused: a run-now request is claimed up to 15 s after its slot "
        "(2 x anarchon_sync_interval 5 s + 5 s, or the entry's max_late if longer), but the store "
        "remembers at most 10 runs per entry (store option 'history_size'), and 3 other run-now "
        "request(s) of the entry made in the last 15 s take 3 of them; with 2 s between slots "
        "the rest is 14 s: a claim that late could find the first claim forgotten, and win the "
        "run a second time or be refused (a miss). Fix: wait 15 s and ask again, or set "
        "anarchon_store_options['history_size'] to at least 22.")


def test_request_ids_must_be_kept_longer_than_a_request_can_run():
    """A request is read for the store's memory and claimed up to 2 x sync + 5 s after its slot:
    its id must be kept longer (+ the 10-s tolerance), or a retry meanwhile would run again."""
    check_request_retention(Settings.from_app(make_app()), Memory(3600))
    check_request_retention(Settings.from_app(make_app(anarchon_request_retention=26)), Memory(None))
    with pytest.raises(ConfigError) as info:
        check_request_retention(Settings.from_app(make_app(anarchon_request_retention=24)),
                                Memory(None))
    assert "must be at least 25 s" in str(info.value)
    with pytest.raises(ConfigError) as info:
        check_request_retention(Settings.from_app(make_app(anarchon_request_retention=3000)),
                                Memory(3600))
    assert str(info.value) == (
        "anarchon_request_retention 3000 s must be at least 3610 s: a run-now request is read by "
        "every instance for the store's memory (3600 s, store option 'memory') and claimed up to "
        "15 s after its slot, and a retry of its id while it can still run must find it. Fix: "
        "raise anarchon_request_retention (default 604800 s, a week).")
