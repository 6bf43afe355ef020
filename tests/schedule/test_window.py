"""start_at / end_at: no slot outside an entry's window, whatever its kind; the refusals word for
word; the window in the fingerprint."""
from __future__ import annotations

import datetime as dt
import random

import pytest
from celery import Celery
from celery.beat import ScheduleEntry
from celery.schedules import crontab, solar

from celery_anarchon import cron
from celery_anarchon.errors import ConfigError
from celery_anarchon.schedule import definition as entry_json
from celery_anarchon.schedule.plan import build_plan
from celery_anarchon.schedule.slots import SlotsEnded, WindowedSlots, slots_for
from celery_anarchon.schedule.slots.base import datetime_to_ms
from celery_anarchon.schedule.timing import TimingSettings
from celery_anarchon.stores import open_store

UTC = dt.timezone.utc
START = dt.datetime(2026, 3, 28, 22, 0, 0, 500_000, tzinfo=UTC)   # the eve of a DST change
END = dt.datetime(2026, 3, 30, 6, 0, tzinfo=UTC)
APP = Celery("window", set_as_current=False)
APP.conf.timezone = "Europe/Berlin"


@pytest.fixture(scope="module")
def store():
    store = open_store("memory://", namespace="window", instance_id="test")
    yield store
    store.close()


def plan_of(store, schedule, **ours):
    entry = ScheduleEntry(name="e", task="t", schedule=schedule, options={"anarchon": ours},
                          app=APP)
    return build_plan("e", entry, app=APP, settings=TimingSettings(), store=store)


def refusal(store, schedule=60, **ours) -> str:
    with pytest.raises(ConfigError) as caught:
        plan_of(store, schedule, **ours)
    return str(caught.value)


def walk(slots, from_ms: int) -> list[int]:
    """Every slot after ``from_ms`` up to the end of the window, strictly increasing."""
    found, at = [], from_ms
    while True:
        try:
            nxt = slots.next_after(at)
        except SlotsEnded:
            return found
        assert nxt > at
        found.append(nxt)
        at = nxt


KINDS = {
    "interval": 7.5,
    "crontab": crontab(minute="*/20"),
    "cron in Berlin, across DST": cron("30 2 * * *", tz="Europe/Berlin"),
    "solar": solar("sunset", 52.52, 13.405),
}


@pytest.mark.parametrize("kind", KINDS)
def test_no_slot_outside_the_window_for_every_kind(store, kind):
    """Asked from anywhere (before, inside, after the window), the windowed slots are exactly
    the schedule's own slots within it, and past the end there is none."""
    schedule = KINDS[kind]
    plan = plan_of(store, schedule, start_at=START, end_at=END.isoformat())
    own = slots_for(schedule, entry="e", app_timezone=APP.timezone)
    start_ms, end_ms = datetime_to_ms(START), datetime_to_ms(END)
    inside, at = [], start_ms - 1
    while (nxt := own.next_after(at)) <= end_ms:
        inside.append(nxt)
        at = nxt
    assert inside and inside[0] >= start_ms and inside[-1] <= end_ms
    assert walk(plan.slots, start_ms - 86_400_000) == inside
    rng = random.Random(20)
    for from_ms in [start_ms - 1, start_ms, end_ms - 1, *(rng.randrange(start_ms - 10**8,
                                                                          end_ms) for _ in range(20))]:
        got = walk(plan.slots, from_ms)
        assert got == [s for s in inside if s > from_ms]
    for from_ms in (end_ms, end_ms + 1, end_ms + 10**9):
        with pytest.raises(SlotsEnded) as ended:
            plan.slots.next_after(from_ms)
        assert ended.value.end_ms == end_ms
        assert str(ended.value) == ("entry 'e': no more slots: it ended at "
                                    "2026-03-30T06:00:00.000+00:00 (its end_at)")


def test_a_slot_on_a_bound_is_inside_and_one_bound_alone_works(store):
    on_start = dt.datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC)
    plan = plan_of(store, 10, start_at=on_start, end_at="2026-01-01T00:00:30Z")
    assert walk(plan.slots, 0) == [datetime_to_ms(on_start) + k * 10_000 for k in range(3)]
    only_start = plan_of(store, 10, start_at="2026-01-01T01:00:00+01:00")
    assert only_start.slots.next_after(0) == datetime_to_ms(dt.datetime(2026, 1, 1, tzinfo=UTC))
    only_end = plan_of(store, 10, end_at="1970-01-01T00:00:25Z")
    assert walk(only_end.slots, -1) == [0, 10_000, 20_000]
    assert isinstance(only_end.slots, WindowedSlots) and only_end.slots.ended(20_000)
    none = plan_of(store, 10, end_at=None, start_at=None)
    assert not isinstance(none.slots, WindowedSlots)


def test_the_refusals_word_for_word(store):
    example = ("e.g. '2026-03-01T09:00:00+01:00' or datetime(2026, 3, 1, 8, "
               "tzinfo=timezone.utc)")
    assert refusal(store, start_at="2026-03-01T09:00:00") == (
        "entry 'e': options['anarchon']['start_at'] = '2026-03-01T09:00:00': no UTC offset (a "
        "naive time would be read in each host's own zone); fix: give the offset, " + example)
    assert refusal(store, end_at=dt.datetime(2026, 3, 1)) == (
        "entry 'e': options['anarchon']['end_at'] = datetime.datetime(2026, 3, 1, 0, 0): no UTC "
        "offset (a naive time would be read in each host's own zone); fix: give the offset, "
        + example)
    assert refusal(store, end_at="next monday") == (
        "entry 'e': options['anarchon']['end_at'] = 'next monday': not an ISO 8601 date and "
        "time; fix: give an instant with its UTC offset, " + example)
    assert refusal(store, start_at=1767225600) == (
        "entry 'e': options['anarchon']['start_at'] = 1767225600: not a date and time; fix: give "
        "an aware datetime or ISO 8601 text with a UTC offset, " + example)
    assert refusal(store, start_at="1969-12-31T23:00:00Z") == (
        "entry 'e': options['anarchon']['start_at'] = '1969-12-31T23:00:00Z': outside the years "
        "1970 to 9999, where slots lie; fix: give an instant within them, " + example)
    assert refusal(store, start_at="2026-01-02T00:00:00Z", end_at="2026-01-02T01:00:00+01:00") == (
        "entry 'e': options['anarchon']['end_at'] 2026-01-02T00:00:00.000+00:00 is not after "
        "start_at 2026-01-02T00:00:00.000+00:00: the entry would have no slot; fix: give an "
        "end_at later than start_at (or leave one of them out)")
    assert refusal(store, end=END) == (
        "entry 'e': options['anarchon']: unknown key 'end' (did you mean 'end_at'?). Allowed "
        "keys: anchor, catch_up, catch_up_window, end_at, jitter, lease, max_late, start_at. A "
        "typo must not silently disable a rule.")


def test_a_store_definition_takes_the_window_as_text_only():
    with pytest.raises(ConfigError) as caught:
        entry_json.parse("e", {"task": "t", "schedule": {"every": 60},
                               "anarchon": {"end_at": 1767225600}}, app=APP)
    assert str(caught.value) == (
        "entry 'e': key 'anarchon.end_at' = 1767225600: not an instant; fix: give ISO 8601 text "
        'with a UTC offset, e.g. "2026-03-01T09:00:00+01:00"')
    entry = entry_json.parse("e", {"task": "t", "schedule": {"every": 60}, "anarchon": {
        "start_at": "2026-01-01T00:00:00+00:00", "end_at": "2026-02-01T00:00:00+00:00"}}, app=APP)
    assert entry.options["anarchon"]["end_at"] == "2026-02-01T00:00:00+00:00"


def test_the_window_is_part_of_the_fingerprint_and_one_instant_written_two_ways_is_one(store):
    plain = plan_of(store, 60)
    windowed = plan_of(store, 60, end_at="2026-02-01T00:00:00+00:00")
    same = plan_of(store, 60, end_at=dt.datetime(2026, 2, 1, 1, tzinfo=dt.timezone(
        dt.timedelta(hours=1))))
    later = plan_of(store, 60, end_at="2026-02-01T00:00:01+00:00")
    assert len({plain.fingerprint, windowed.fingerprint, later.fingerprint}) == 3
    assert same.fingerprint == windowed.fingerprint
    assert "end_ms=1769904000000" in windowed.definition
