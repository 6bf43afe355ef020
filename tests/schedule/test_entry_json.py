"""Entry definitions as data (celery_anarchon.schedule.definition): JSON in, a Celery ScheduleEntry with real
schedule objects out; the same slots, timing and fingerprint as the beat_schedule entry it
describes; every bad definition refused by entry, key, value and fix; nothing evaluated."""
from __future__ import annotations

import datetime
import json
import zoneinfo

import pytest
from celery import Celery
from celery.beat import ScheduleEntry
from celery.schedules import crontab, schedule, solar

from celery_anarchon import ConfigError, cron
from celery_anarchon.schedule import as_data
from celery_anarchon.schedule import definition as entry_json
from celery_anarchon.schedule.plan import build_plan
from celery_anarchon.stores import open_store
from celery_anarchon.settings import Settings

#: 2025-01-01T00:00:00Z
T0_MS = 1_735_689_600_000


def make_app(**conf):
    app = Celery("proj", set_as_current=False)
    app.conf.update(broker_url="memory://", timezone="Europe/Paris", **conf)
    return app


def plan_of(name, entry, app):
    store = open_store("sqlite:///unused.sqlite3", namespace="proj", instance_id="i", options={})
    return build_plan(name, entry, app=app, settings=Settings.from_app(app), store=store)


def slots_from(plan, n=5, after_ms=T0_MS):
    out = []
    for _ in range(n):
        after_ms = plan.slots.next_after(after_ms)
        out.append(after_ms)
    return out


# The same entry as data and as a beat_schedule entry: (definition, schedule, options)
SAME = {
    "interval": ({"every": 90}, 90, {}),
    "interval-anchored": ({"every": 3600}, datetime.timedelta(hours=1), {"anchor": 900}),
    "interval-fraction": ({"every": 0.25}, 0.25, {}),
    "crontab-app-zone": ({"crontab": {"minute": "0", "hour": "*/2"}}, crontab(minute="0", hour="*/2"), {}),
    "crontab-days": ({"crontab": {"minute": "30", "hour": "2", "day_of_week": "mon-fri",
                                  "day_of_month": "1-7"}},
                     crontab(minute="30", hour="2", day_of_week="mon-fri", day_of_month="1-7"), {}),
    "cron-zone": ({"cron": "0 22 L * *", "timezone": "America/New_York"},
                  cron("0 22 L * *", tz="America/New_York"), {}),
    "cron-app-zone": ({"cron": "*/15 * * * 1#2"}, cron("*/15 * * * 1#2"), {}),
    "solar": ({"solar": "sunrise", "lat": 48.85, "lon": 2.35}, solar("sunrise", 48.85, 2.35), {}),
}


@pytest.mark.parametrize("case", sorted(SAME))
def test_a_definition_builds_the_same_plan_as_its_beat_schedule_entry(case):
    """Real schedule objects, and the same slots, timing and fingerprint as the beat_schedule
    entry: an instance cannot tell a store entry from a config entry by its runs."""
    data, sched, ours = SAME[case]
    app = make_app()
    definition = {"task": "proj.report", "args": [1, "a"], "kwargs": {"k": [True, None]},
                  "options": {"queue": "reports", "priority": 3}, "schedule": data}
    if ours:
        definition["anarchon"] = ours
    from_data = entry_json.parse("report", definition, app=app)
    options = {"queue": "reports", "priority": 3, **({"anarchon": ours} if ours else {})}
    from_config = ScheduleEntry(name="report", task="proj.report", schedule=sched, args=(1, "a"),
                                kwargs={"k": [True, None]}, options=options, app=app)
    assert type(from_data.schedule) is type(from_config.schedule)
    assert from_data.args == (1, "a") and from_data.kwargs == {"k": [True, None]}
    assert from_data.options == options
    a, b = plan_of("report", from_data, app), plan_of("report", from_config, app)
    assert a.definition == b.definition and a.fingerprint == b.fingerprint
    assert slots_from(a) == slots_from(b)
    # and back: the config entry as data is the definition we started from
    assert entry_json.canonical(as_data.from_entry(from_config)) == entry_json.canonical(definition)


def test_a_crontab_keeps_its_fields_as_written_and_its_own_zone():
    app = make_app()
    entry = entry_json.parse("r", {"task": "t", "schedule": {
        "crontab": {"minute": "30", "hour": "2"}, "timezone": "America/New_York"}}, app=app)
    assert isinstance(entry.schedule, crontab)
    assert entry.schedule._orig_minute == "30" and entry.schedule._orig_hour == "2"
    assert entry.schedule.tz == zoneinfo.ZoneInfo("America/New_York")
    plan = plan_of("r", entry, app)
    assert "tz=America/New_York" in plan.slots.describe()
    assert "dst=fixed-time" in plan.slots.describe()       # 2 and 30 are fixed times: cron(8)'s rule
    # 02:30 New York on 2025-03-09 (the skipped hour) runs once, right after the jump: 07:00Z
    march_9 = int(datetime.datetime(2025, 3, 9, 6, tzinfo=datetime.timezone.utc).timestamp() * 1000)
    assert plan.slots.next_after(march_9) == march_9 + 3_600_000
    same = as_data.from_entry(entry)
    assert same["schedule"] == {"crontab": {"minute": "30", "hour": "2"}, "timezone": "America/New_York"}


def test_entries_with_one_crontab_definition_share_one_crontab():
    app = make_app()

    def schedule_of(fields, zone="Europe/Berlin", name="r"):
        return entry_json.parse(name, {"task": "t", "schedule": {
            "crontab": fields, "timezone": zone}}, app=app).schedule

    first = schedule_of({"minute": "30", "hour": "2"})
    assert schedule_of({"hour": "2", "minute": "30"}, name="other") is first, "one object per definition"
    assert schedule_of({"minute": "30", "hour": "3"}) is not first
    berlin, tokyo = first, schedule_of({"minute": "30", "hour": "2"}, zone="Asia/Tokyo")
    assert tokyo is not berlin and tokyo.tz == zoneinfo.ZoneInfo("Asia/Tokyo")
    assert berlin.tz == zoneinfo.ZoneInfo("Europe/Berlin")
    other_app = make_app()
    assert entry_json.parse("r", {"task": "t", "schedule": {"crontab": {"minute": "30", "hour": "2"},
                            "timezone": "Europe/Berlin"}}, app=other_app).schedule is not first


def test_canonical_text_is_sorted_and_compact_and_refuses_what_is_not_json():
    obj = {"task": "t", "schedule": {"every": 5}, "args": [1]}
    text = entry_json.canonical(obj)
    assert text == '{"args":[1],"schedule":{"every":5},"task":"t"}'
    assert entry_json.canonical(json.dumps(obj, indent=4)) == text      # text in, same text out
    assert text == json.dumps(obj, sort_keys=True, separators=(",", ":"))
    for bad in ({"task": "t", "args": [object()]}, {"task": {1, 2}}):
        with pytest.raises(ConfigError, match="entry 'r': the definition is not JSON"):
            entry_json.canonical(bad, name="r")
    # NaN and infinity: named by their key and value
    with pytest.raises(ConfigError) as caught:
        entry_json.canonical({"task": "t", "kwargs": {"a": [1, float("nan")]}}, name="r")
    assert str(caught.value) == ("entry 'r': key 'kwargs.a[1]' = NaN: not a finite number (JSON "
                                 "has no NaN or infinity); fix: give a finite number")
    with pytest.raises(ConfigError) as caught:
        entry_json.canonical({"anarchon": {"lease": {"duration": float("-inf")}}}, name="r")
    assert str(caught.value) == (
        "entry 'r': key 'anarchon.lease.duration' = -Infinity: not a finite number (JSON has no "
        "NaN or infinity); fix: give a finite number of seconds, e.g. 60")


@pytest.mark.parametrize("definition, words", [
    ({"task": "t", "schedule": {"every": 60}, "kwarg": {}},
     ["key 'kwarg'", "unknown key", "did you mean 'kwargs'?", "fix:"]),
    ({"task": "t", "schedule": {"evry": 60}}, ["key 'schedule'", '{"evry": 60}', "no schedule kind",
                                               'fix: give exactly one of {"every": 60}']),
    ({"task": "t", "schedule": {"every": 60, "cron": "* * * * *"}}, ["several schedule kinds"]),
    ({"task": "t", "schedule": {"every": 60, "timezone": "UTC"}},
     ["key 'schedule.timezone'", "unknown key", "allowed keys are every"]),
    ({"task": "t", "schedule": {"every": "60"}}, ["key 'schedule.every'", '"60"', "seconds > 0"]),
    ({"task": "t", "schedule": {"every": 0}}, ["key 'schedule.every'", "= 0"]),
    ({"task": "t", "schedule": {"every": True}}, ["key 'schedule.every'", "= true"]),
    ({"task": "t", "schedule": 60}, ["key 'schedule'", "= 60", "not a schedule object"]),
    ({"schedule": {"every": 60}}, ["key 'task'", "= null", "registered name"]),
    ({"task": ["t"], "schedule": {"every": 60}}, ["key 'task'", '["t"]']),
    ({"task": "t", "args": {"a": 1}, "schedule": {"every": 60}}, ["key 'args'", "not a list"]),
    ({"task": "t", "kwargs": [1], "schedule": {"every": 60}}, ["key 'kwargs'", "not an object"]),
    ({"task": "t", "options": "q", "schedule": {"every": 60}}, ["key 'options'", "not an object"]),
    ({"task": "t", "options": {"anarchon": {"jitter": 1}}, "schedule": {"every": 60}},
     ["key 'options.anarchon'", "put the per-entry settings at the top level"]),
    ({"task": "t", "anarchon": {"max_lat": 5}, "schedule": {"every": 60}},
     ["key 'anarchon.max_lat'", "did you mean 'max_late'?"]),
    ({"task": "t", "anarchon": {"jitter": "2s"}, "schedule": {"every": 60}},
     ["key 'anarchon.jitter'", '"2s"', "not a number of seconds"]),
    ({"task": "t", "anarchon": {"lease": "yes"}, "schedule": {"every": 60}}, ["key 'anarchon.lease'"]),
    ({"task": "t"}, ["key 'schedule'", "missing"]),
    ({"task": "t", "schedule": {"crontab": "0 3 * * *"}},
     ["key 'schedule.crontab'", "not an object of crontab fields", '{"cron": "0 */2 * * *"}']),
    ({"task": "t", "schedule": {"crontab": {"minutes": "0"}}},
     ["key 'schedule.crontab.minutes'", "did you mean 'minute'?"]),
    ({"task": "t", "schedule": {"crontab": {"hour": "25"}}},
     ["key 'schedule.crontab.hour'", '"25"', "Celery's crontab refuses it", "hour 0-23"]),
    ({"task": "t", "schedule": {"crontab": {"minute": 1.5}}},
     ["key 'schedule.crontab.minute'", "1.5", "not a crontab field"]),
    ({"task": "t", "schedule": {"crontab": {"day_of_month": "30", "month_of_year": "2"}}},
     ["key 'schedule.crontab'", "never occurs", "day_of_month that exists"]),
    ({"task": "t", "schedule": {"crontab": {"minute": "0"}, "timezone": "Europe/Pariss"}},
     ["key 'schedule.timezone'", '"Europe/Pariss"', "unknown time zone", "IANA name"]),
    ({"task": "t", "schedule": {"cron": "0 3 * * *", "timezone": 2}},
     ["key 'schedule.timezone'", "= 2", "unknown time zone"]),
    ({"task": "t", "schedule": {"cron": "0 25 * * *"}},
     ["entry 'r': key 'schedule.cron'", "'0 25 * * *' is not a valid cron expression", "fix"]),
    ({"task": "t", "schedule": {"cron": "0 3 * *"}}, ["key 'schedule.cron'", "has 4 fields"]),
    ({"task": "t", "schedule": {"cron": "0 0 30 2 *"}}, ["key 'schedule.cron'", "never fires"]),
    ({"task": "t", "schedule": {"cron": ["0", "3"]}}, ["key 'schedule.cron'", "not a cron expression"]),
    ({"task": "t", "schedule": {"solar": "sunrse", "lat": 1, "lon": 2}},
     ["key 'schedule'", "Celery's solar refuses it", "sunrise"]),
    ({"task": "t", "schedule": {"solar": "sunrise", "lat": 1}}, ["key 'schedule.lon'", "missing"]),
    ({"task": "t", "schedule": {"solar": "sunrise", "lat": 91, "lon": 0}}, ["latitude"]),
    ({"task": "t", "schedule": {"repr": "<mine>"}}, ["cannot be stored as data"]),
    ('{"task": "t", ', ["entry 'r': the definition is not valid JSON", "fix"]),
    ('["t"]', ["entry 'r': the definition [\"t\"] is not a JSON object"]),
])
def test_a_bad_definition_names_the_entry_the_key_the_value_and_the_fix(definition, words):
    with pytest.raises(ConfigError) as info:
        entry_json.parse("r", definition, app=make_app())
    message = str(info.value)
    assert message.startswith("entry 'r'"), message
    for word in words:
        assert word in message, (word, message)


@pytest.mark.parametrize("schedule, words", [
    ({"crontab": {"minute": "*/120"}}, ["minute field '*/120'", "step 120 is larger", "fix:"]),
    ({"every": 0.0005}, ["period", "is not a whole number of milliseconds", "fix:"]),
])
def test_what_needs_the_slots_is_refused_by_the_plan_with_the_start_up_message(schedule, words):
    app = make_app()
    entry = entry_json.parse("r", {"task": "t", "schedule": schedule}, app=app)
    with pytest.raises(ConfigError) as info:
        plan_of("r", entry, app)
    for word in ["entry 'r'", *words]:
        assert word in str(info.value), (word, str(info.value))


def test_timing_rules_apply_to_a_definition_with_the_start_up_message():
    """A definition whose timing breaks a rule parses, and its plan is refused with the very
    message a beat_schedule entry gets at start-up."""
    app = make_app()
    data = entry_json.parse("r", {"task": "t", "schedule": {"every": 1},
                                  "anarchon": {"jitter": 0.5}}, app=app)
    config = ScheduleEntry(name="r", task="t", schedule=1, options={"anarchon": {"jitter": 0.5}}, app=app)
    messages = []
    for entry in (data, config):
        with pytest.raises(ConfigError) as info:
            plan_of("r", entry, app)
        messages.append(str(info.value))
    assert messages[0] == messages[1] and "half the shortest gap" in messages[0]


def test_text_is_data_never_code():
    """Strings that look like code stay strings: a task name, arguments, options."""
    app = make_app()
    sneaky = "__import__('os').system('touch /tmp/pwned')"
    entry = entry_json.parse("r", json.dumps({"task": sneaky, "args": [sneaky],
                                              "kwargs": {"x": sneaky}, "schedule": {"every": 5}}),
                             app=app)
    assert entry.task == sneaky and entry.args == (sneaky,) and entry.kwargs == {"x": sneaky}


def test_python_schedules_as_data():
    assert as_data.schedule_json(10.0) == {"every": 10}
    assert as_data.schedule_json(0.5) == {"every": 0.5}
    assert as_data.schedule_json(datetime.timedelta(minutes=2)) == {"every": 120}
    assert as_data.schedule_json(schedule(datetime.timedelta(seconds=30))) == {"every": 30}
    assert as_data.schedule_json(crontab(minute=0, hour=[1, 2])) == \
        {"crontab": {"minute": 0, "hour": "1,2"}}
    assert as_data.schedule_json(cron("@daily", tz="Asia/Tokyo")) == \
        {"cron": "0 0 * * *", "timezone": "Asia/Tokyo"}
    assert as_data.schedule_json(solar("sunset", 10, 20)) == {"solar": "sunset", "lat": 10, "lon": 20}
    data = {"every": 7}
    assert as_data.schedule_json(data) is data
    assert as_data.anarchon_json({"jitter": datetime.timedelta(seconds=1.5), "anchor":
                                     datetime.datetime(1970, 1, 1, 0, 15, tzinfo=datetime.timezone.utc),
                                     "lease": {"duration": datetime.timedelta(minutes=1)}}) == \
        {"jitter": 1.5, "anchor": 900, "lease": {"duration": 60}}


class Mine:
    """A schedule class of the user's (anarchon_next and anarchon_shortest_gap)."""

    def anarchon_next(self, after):
        return after + datetime.timedelta(seconds=10)

    def anarchon_shortest_gap(self):
        return datetime.timedelta(seconds=10)


def test_what_cannot_be_data_is_shown_by_its_repr_and_not_storable():
    app = make_app()
    for sched in (Mine(), schedule(60, relative=True)):
        entry = ScheduleEntry(name="m", task="t", schedule=sched, app=app,
                              last_run_at=datetime.datetime.now(datetime.timezone.utc))
        data = as_data.from_entry(entry)
        assert set(data["schedule"]) == {"repr"} and data["storable"] is False
        assert not as_data.is_storable(data)
        with pytest.raises(ConfigError, match="unknown key|cannot be stored"):
            entry_json.parse("m", data, app=app)
    entry = ScheduleEntry(name="m", task="t", schedule=5, args=(object(),), app=app)
    data = as_data.from_entry(entry)
    assert set(data["args"]) == {"repr"} and not as_data.is_storable(data)
    assert as_data.is_storable(as_data.from_entry(ScheduleEntry(name="m", task="t",
                                                                      schedule=5, app=app)))


def test_the_entry_class_is_the_callers():
    class Entry(ScheduleEntry):
        pass
    entry = entry_json.parse("r", {"task": "t", "schedule": {"every": 5}}, app=make_app(),
                             entry_cls=Entry)
    assert type(entry) is Entry and entry.name == "r"


def test_describe_schedule_in_a_few_words():
    d = as_data.describe_schedule
    assert d({"every": 60}) == "every 60 s"
    assert d({"crontab": {"minute": "0", "hour": "*/2"}, "timezone": "UTC"}) == "crontab 0 */2 * * * UTC"
    assert d({"cron": "0 3 * * *"}) == "cron 0 3 * * *"
    assert d({"solar": "sunrise", "lat": 1, "lon": 2}) == "solar sunrise 1,2"
    assert d({"repr": "<x>"}) == "<x>"


def test_a_text_definition_with_nan_or_infinity_is_refused():
    """Python's json reads NaN and Infinity; a definition never holds them (JSON has none)."""
    app = make_app()
    for bad in ('{"task": "t", "schedule": {"every": NaN}}',
                '{"task": "t", "schedule": {"every": 60}, "args": [Infinity]}'):
        with pytest.raises(ConfigError, match="entry 'r': the definition is not valid JSON.*"
                                              "is not a JSON number"):
            entry_json.parse("r", bad, app=app)
