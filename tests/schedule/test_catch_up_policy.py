"""The catch-up policy of an entry (celery_anarchon/schedule/catch_up.py): its values per entry,
app-wide and in a store entry's definition, the start-up rules of ``catch_up='all'`` (its window
against max_late and the store's memory, by time and by count; no lease), and the plan's
``claim_late_ms`` and fingerprint. Every refusal is checked word for word."""
from __future__ import annotations

from datetime import timedelta

import pytest
from celery import Celery
from celery.beat import ScheduleEntry

from celery_anarchon import ConfigError, install
from celery_anarchon.operate.checks import rule_of
from celery_anarchon.schedule import definition as entry_json
from celery_anarchon.schedule.catch_up import CATCH_UP_PACE_S, pace_s
from celery_anarchon.schedule.plan import build_plan
from celery_anarchon.settings import Settings
from celery_anarchon.stores import open_store


def make_app(**conf):
    app = Celery("proj", set_as_current=False)
    app.conf.update(broker_url="memory://", **conf)
    return app


def plan_of(sched, ours=None, *, app=None, store_options=None, url="sqlite:///unused.sqlite3",
            **conf):
    app = app or make_app(**conf)
    store = open_store(url, namespace="proj", instance_id="i", options=store_options or {})
    entry = ScheduleEntry(name="report", task="proj.report", schedule=sched,
                          options={"anarchon": ours} if ours is not None else {}, app=app)
    return build_plan("report", entry, app=app, settings=Settings.from_app(app), store=store)


def error_of(*args, **kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        plan_of(*args, **kwargs)
    return str(info.value)


def test_the_default_is_newest_and_claims_no_later_than_max_late():
    plan = plan_of(10)
    assert (plan.timing.catch_up, plan.timing.catch_up_window_s) == ("newest", None)
    assert plan.claim_late_ms == plan.max_late_ms == 60_000
    assert plan_of(10, {"catch_up": "none"}).claim_late_ms == 60_000


def test_all_claims_as_late_as_its_window_per_entry_or_app_wide():
    plan = plan_of(10, {"catch_up": "all", "catch_up_window": timedelta(minutes=5)})
    assert (plan.timing.catch_up, plan.timing.catch_up_window_s) == ("all", 300)
    assert plan.claim_late_ms == 300_000 and plan.max_late_ms == 60_000
    app_wide = plan_of(10, anarchon_catch_up="all")
    assert app_wide.timing.catch_up_window_s == 600 and app_wide.claim_late_ms == 600_000
    assert plan_of(10, anarchon_catch_up="all", anarchon_catch_up_window=120).claim_late_ms == 120_000
    assert plan_of(10, {"catch_up": "newest"}, anarchon_catch_up="all").claim_late_ms == 60_000


def test_the_pace_is_a_second_or_half_the_shortest_gap():
    assert CATCH_UP_PACE_S == 1.0
    assert pace_s(10) == 1.0 and pace_s(1) == 0.5 and pace_s(0.5) == 0.25
    assert plan_of(10, {"catch_up": "all"}).catch_up_pace_ms == 1000
    assert plan_of(1, {"catch_up": "all"}).catch_up_pace_ms == 500


def test_the_policy_is_in_the_fingerprint_and_the_default_keeps_the_old_one():
    newest, explicit = plan_of(10), plan_of(10, {"catch_up": "newest"})
    assert newest.fingerprint == explicit.fingerprint
    assert '"catch_up' not in newest.definition          # as before the policy existed
    caught = plan_of(10, {"catch_up": "all"})
    wider = plan_of(10, {"catch_up": "all", "catch_up_window": 900})
    none = plan_of(10, {"catch_up": "none"})
    assert len({newest.fingerprint, caught.fingerprint, wider.fingerprint, none.fingerprint}) == 4
    assert '"catch_up": "all"' in caught.definition and '"catch_up_window_s": 600' in caught.definition


def test_a_value_that_is_no_policy_is_refused_per_entry_and_app_wide():
    assert error_of(10, {"catch_up": "al"}) == (
        "entry 'report': options['anarchon']['catch_up'] = 'al': not a catch-up policy; fix: set "
        "options['anarchon']['catch_up'] to 'newest' (the default: the newest slot within "
        "max_late), 'all' (every slot within catch_up_window, oldest first, paced) or 'none' "
        "(nothing older than now)")
    with pytest.raises(ConfigError) as info:
        Settings.from_app(make_app(anarchon_catch_up=True))
    assert str(info.value) == (
        "anarchon_catch_up = True: not a catch-up policy; fix: set anarchon_catch_up to 'newest' "
        "(the default: the newest slot within max_late), 'all' (every slot within "
        "catch_up_window, oldest first, paced) or 'none' (nothing older than now)")
    with pytest.raises(ConfigError) as info:
        Settings.from_app(make_app(anarchon_catch_up_window=0))
    assert str(info.value) == "anarchon_catch_up_window: 0 s must be more than 0 (default 600)"


def test_a_window_without_all_is_refused():
    assert error_of(10, {"catch_up_window": 300}) == (
        "entry 'report': catch_up_window 300 s applies to catch_up='all' only, and this entry's "
        "catch_up is 'newest'; fix: remove catch_up_window, or set "
        "options['anarchon']['catch_up'] = 'all'")


@pytest.mark.parametrize("window, shown", [(-100, "-100"), (float("nan"), "nan"),
                                           (timedelta(days=-1), "datetime.timedelta(days=-1)")])
def test_a_window_below_zero_or_not_a_number_is_refused_with_the_fix(window, shown):
    assert error_of(10, {"catch_up": "all", "catch_up_window": window}) == (
        f"entry 'report': options['anarchon']['catch_up_window']: {shown} must be a finite number "
        "of seconds >= 0; fix: give seconds from 0 to 3155760000 s (100 years), as an int, a "
        "float or a datetime.timedelta")


def test_the_window_must_exceed_max_late():
    assert error_of(10, {"catch_up": "all", "catch_up_window": 60}) == (
        "entry 'report': catch_up_window 60 s (options['anarchon']['catch_up_window']) must be "
        "greater than max_late 60 s: max_late already claims a slot that late. Fix: set "
        "catch_up_window above 60 (e.g. 600), or use catch_up='newest'.")
    assert error_of(10, {"catch_up": "all", "max_late": 900}) == (
        "entry 'report': catch_up_window 600 s (anarchon_catch_up_window) must be greater than "
        "max_late 900 s: max_late already claims a slot that late. Fix: set catch_up_window "
        "above 900 (e.g. 1800), or use catch_up='newest'.")


def test_the_window_must_stay_within_the_store_memory():
    assert error_of(10, {"catch_up": "all"}, store_options={"memory": 600}) == (
        "entry 'report': catch_up_window 600 s + jitter 2 s + the store's lateness tolerance 10 s "
        "= 612 s must be less than the store's memory of a claimed run (600 s, store option "
        "'memory'): a slot caught up after the store forgot the first one would win a second "
        "time. Fix: set anarchon_store_options['memory'] to at least 1224, or shorten "
        "catch_up_window below 588.")
    assert plan_of(10, {"catch_up": "all", "catch_up_window": 580},
                   store_options={"memory": 600}).claim_late_ms == 580_000
    nats = error_of(10, {"catch_up": "all"}, url="nats://127.0.0.1:1")   # 5 min, no server needed
    assert "(300 s, store option 'duplicate_window')" in nats and "below 288." in nats


def test_a_count_limited_memory_must_cover_the_window():
    assert error_of(1, {"catch_up": "all", "catch_up_window": 120},
                    store_options={"strategy": "idmp", "max_size": 100},
                    url="redis://127.0.0.1:1/0") == (
        "entry 'report': the store remembers at most 100 runs per entry (store option "
        "'max_size'); with 1 s between slots that is 100 s, not more than catch_up_window 120 s "
        "+ jitter 0.25 s + the store's lateness tolerance 10 s = 130.25 s: a caught-up slot "
        "could win a run the store already forgot. Fix: set anarchon_store_options['max_size'] "
        "to at least 262, or shorten catch_up_window below 89.75.")


def test_stream_ids_remember_forever_so_any_window_passes():
    plan = plan_of(1, {"catch_up": "all", "catch_up_window": 86_400},
                   store_options={"strategy": "stream-id"}, url="redis://127.0.0.1:1/0")
    assert plan.claim_late_ms == 86_400_000


def test_a_leased_entry_cannot_catch_up_all():
    app = make_app()
    install(app)
    message = error_of(60, {"catch_up": "all", "lease": True}, app=app)
    assert rule_of(message) == "catch_up='all' without a lease"
    assert message == (
        "entry 'report': catch_up='all' cannot go with a lease: a leased run is refused while an "
        "earlier run of the entry still holds its lease (overlapping), so the caught-up runs, one "
        "every 1 s, would be refused one after another. Fix: use catch_up='newest' (the default) "
        "or 'none' for this entry, or remove its lease.")
    assert plan_of(60, {"catch_up": "none", "lease": True}, app=app).timing.catch_up == "none"


def test_a_store_definition_takes_the_policy_and_its_window():
    app = make_app()
    entry = entry_json.parse("dyn", {"task": "proj.report", "schedule": {"every": 10},
                                     "anarchon": {"catch_up": "all", "catch_up_window": 300}},
                             app=app)
    assert entry.options["anarchon"] == {"catch_up": "all", "catch_up_window": 300}
    with pytest.raises(ConfigError) as info:
        entry_json.parse("dyn", {"task": "proj.report", "schedule": {"every": 10},
                                 "anarchon": {"catch_up_window": "10m"}}, app=app)
    assert str(info.value) == (
        "entry 'dyn': key 'anarchon.catch_up_window' = \"10m\": not a number of seconds; fix: give "
        "seconds as a number (JSON has no timedelta)")
    with pytest.raises(ConfigError) as info:
        entry_json.parse("dyn", {"task": "proj.report", "schedule": {"every": 10},
                                 "anarchon": {"catch_up": ["all"]}}, app=app)
    assert str(info.value) == (
        "entry 'dyn': key 'anarchon.catch_up' = [\"all\"]: not a catch-up policy; fix: give "
        "\"newest\" (the default), \"all\" or \"none\"")


@pytest.mark.parametrize("ours, store_options, url, rule", [
    ({"catch_up": "al"}, {}, "sqlite:///unused.sqlite3", "catch_up is newest, all or none"),
    ({"catch_up_window": 300}, {}, "sqlite:///unused.sqlite3",
     "catch_up_window with catch_up='all' only"),
    ({"catch_up": "all", "catch_up_window": 60}, {}, "sqlite:///unused.sqlite3",
     "catch_up_window > max_late"),
    ({"catch_up": "all"}, {"memory": 600}, "sqlite:///unused.sqlite3",
     "catch_up_window + jitter + 10 s < store memory"),
    ({"catch_up": "all", "catch_up_window": 120}, {"strategy": "idmp", "max_size": 100},
     "redis://127.0.0.1:1/0", "runs remembered x shortest gap > catch_up_window + jitter + 10 s"),
])
def test_check_names_the_catch_up_rule_each_refusal_breaks(ours, store_options, url, rule):
    """``celery anarchon check`` and ``celery_anarchon.testing`` name a problem by its rule."""
    assert rule_of(error_of(1 if "strategy" in store_options else 10, ours,
                            store_options=store_options, url=url)) == rule
