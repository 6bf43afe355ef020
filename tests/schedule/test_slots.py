"""Slots are the same on every host (docs/design.md "Slots: the same on every instance")."""

import datetime as dt
import pickle
import random
import sys
import time
import zoneinfo

import pytest
from celery import Celery
from celery.beat import ScheduleEntry
from celery.schedules import crontab, schedule, solar

from celery_anarchon.errors import ConfigError
from celery_anarchon.schedule.slots import SlotSchedule, cron, ms_to_datetime, slots_for

UTC = dt.timezone.utc
NY = zoneinfo.ZoneInfo("America/New_York")
LONDON = zoneinfo.ZoneInfo("Europe/London")
LORD_HOWE = zoneinfo.ZoneInfo("Australia/Lord_Howe")
ZUTC = zoneinfo.ZoneInfo("UTC")


def ms(*args, tz=UTC):
    return int(dt.datetime(*args, tzinfo=tz).timestamp() * 1000)


def build(sched, tz=ZUTC, **kw):
    return slots_for(sched, entry="nightly", app_timezone=tz, **kw)


def slots_between(slots, start_ms, end_ms):
    """Every slot in [start_ms, end_ms), checking that they strictly increase."""
    found, at = [], start_ms - 1
    while True:
        nxt = slots.next_after(at)
        assert nxt > at
        if nxt >= end_ms:
            return found
        found.append(nxt)
        at = nxt


def runs_on_local_day(slots, tz, day):
    """The slots whose local date (in tz) is ``day``."""
    start = dt.datetime.combine(day, dt.time(), tzinfo=tz)
    end = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), tzinfo=tz)
    return slots_between(slots, int(start.timestamp() * 1000), int(end.timestamp() * 1000))


def both_kinds(expr, tz):
    """The same expression as a Celery crontab (zone from the app) and as our cron."""
    return [build(crontab.from_string(expr), tz), build(cron(expr, tz=tz), ZUTC)]


# --- interval ---------------------------------------------------------------------------------

def test_interval_slots_are_epoch_multiples():
    slots = build(schedule(dt.timedelta(minutes=5)))
    for after in (0, 1, 299_999, 300_000, 1_750_000_123_456, -1, -300_000):
        nxt = slots.next_after(after)
        assert nxt > after and nxt % 300_000 == 0 and nxt - after <= 300_000
    assert slots.next_after(300_000) == 600_000  # exactly at a slot: the next one
    assert slots.shortest_gap_ms == 300_000
    assert build(30).next_after(1) == 30_000
    assert build(dt.timedelta(seconds=0.25)).next_after(0) == 250


def test_interval_anchor_shifts_slots():
    slots = build(schedule(dt.timedelta(hours=1)), anchor_s=7.5)
    assert slots.next_after(0) == 7_500
    assert slots.next_after(7_500) == 3_607_500
    assert build(schedule(60), anchor_s=0.1).next_after(0) == 100
    assert build(schedule(60), anchor_s=dt.timedelta(seconds=-1)).next_after(0) == 59_000
    # anchors one period apart are the same slots and the same description
    assert build(schedule(60), anchor_s=61).describe() == build(schedule(60), anchor_s=1).describe()


def test_interval_relative_refused_pointing_to_crontab_and_anchor():
    with pytest.raises(ConfigError) as err:
        build(schedule(dt.timedelta(minutes=15), relative=True))
    msg = str(err.value)
    assert "nightly" in msg and "relative=True" in msg and "crontab" in msg and "anchor" in msg


@pytest.mark.parametrize("period", [dt.timedelta(microseconds=1500), dt.timedelta(0), -5])
def test_interval_period_must_be_positive_whole_ms(period):
    with pytest.raises(ConfigError) as err:
        build(schedule(period))
    msg = str(err.value)
    assert "nightly" in msg and repr(schedule(period).run_every) in msg and "fix" in msg


def test_anchor_must_be_whole_ms_and_interval_only():
    with pytest.raises(ConfigError, match=r"nightly.*anchor 0\.0001.*fix"):
        build(schedule(60), anchor_s=0.0001)
    with pytest.raises(ConfigError, match=r"nightly.*anchor=5.*interval schedules only.*fix"):
        build(crontab(), anchor_s=5)


# --- crontab and cron across DST ---------------------------------------------------------------

DST_DAYS = [
    # zone, fall-back day, spring-forward day (2025)
    (NY, dt.date(2025, 11, 2), dt.date(2025, 3, 9)),
    (LONDON, dt.date(2025, 10, 26), dt.date(2025, 3, 30)),
    (LORD_HOWE, dt.date(2025, 4, 6), dt.date(2025, 10, 5)),
    (ZUTC, dt.date(2025, 11, 2), dt.date(2025, 3, 9)),
]
# expr -> runs on (fall-back day, spring-forward day) per zone; 1440/24/1 on ordinary days
EXPECTED_RUNS = {
    "* * * * *": {NY: (1500, 1380), LONDON: (1500, 1380), LORD_HOWE: (1470, 1410),
                  ZUTC: (1440, 1440)},
    "0 * * * *": {NY: (25, 23), LONDON: (25, 23), LORD_HOWE: (24, 23), ZUTC: (24, 24)},
    "30 * * * *": {NY: (25, 23), LONDON: (25, 23), LORD_HOWE: (25, 24), ZUTC: (24, 24)},
    "30 1 * * *": {NY: (1, 1), LONDON: (1, 1), LORD_HOWE: (1, 1), ZUTC: (1, 1)},
    "30 2 * * *": {NY: (1, 1), LONDON: (1, 1), LORD_HOWE: (1, 1), ZUTC: (1, 1)},
    "0 2 * * *": {NY: (1, 1), LONDON: (1, 1), LORD_HOWE: (1, 1), ZUTC: (1, 1)},
}
ORDINARY = {"* * * * *": 1440, "0 * * * *": 24, "30 * * * *": 24}


@pytest.mark.parametrize("expr", sorted(EXPECTED_RUNS))
@pytest.mark.parametrize("tz,fall_back,spring_forward", DST_DAYS, ids=lambda v: str(v))
def test_runs_per_local_day_across_dst(expr, tz, fall_back, spring_forward):
    want_fall, want_spring = EXPECTED_RUNS[expr][tz]
    for slots in both_kinds(expr, tz):
        assert len(runs_on_local_day(slots, tz, fall_back)) == want_fall
        assert len(runs_on_local_day(slots, tz, spring_forward)) == want_spring
        for day in (fall_back - dt.timedelta(days=1), spring_forward + dt.timedelta(days=1)):
            assert len(runs_on_local_day(slots, tz, day)) == ORDINARY.get(expr, 1)


def test_new_york_instants():
    for slots in both_kinds("30 2 * * *", NY):  # skipped: right after the jump, 03:00 EDT
        assert runs_on_local_day(slots, NY, dt.date(2025, 3, 9)) == [ms(2025, 3, 9, 7, 0)]
    for slots in both_kinds("30 1 * * *", NY):  # repeated: the first occurrence only
        assert runs_on_local_day(slots, NY, dt.date(2025, 11, 2)) == [ms(2025, 11, 2, 5, 30)]
    for slots in both_kinds("30 * * * *", NY):  # wildcard: both copies of 01:30
        day = runs_on_local_day(slots, NY, dt.date(2025, 11, 2))
        assert ms(2025, 11, 2, 5, 30) in day and ms(2025, 11, 2, 6, 30) in day
    for slots in both_kinds("*/15 * * * *", NY):  # 01:45 EST, then 03:00 EDT
        assert slots.next_after(ms(2025, 3, 9, 6, 45)) == ms(2025, 3, 9, 7, 0)
    for slots in both_kinds("0,30 2 * * *", NY):  # two skipped times: one slot
        assert runs_on_local_day(slots, NY, dt.date(2025, 3, 9)) == [ms(2025, 3, 9, 7, 0)]
        assert len(runs_on_local_day(slots, NY, dt.date(2025, 3, 10))) == 2


def test_fixed_time_from_inside_second_copy_of_repeated_hour():
    second_copy = ms(2025, 11, 2, 6, 10)  # 01:10 EST, after 01:30 EDT already came
    for slots in both_kinds("30 1 * * *", NY):
        assert slots.next_after(second_copy) == ms(2025, 11, 3, 6, 30)
        assert slots.next_after(ms(2025, 11, 2, 5, 10)) == ms(2025, 11, 2, 5, 30)  # first copy
    for slots in both_kinds("*/15 * * * *", NY):  # wildcard: the second copy runs too
        assert slots.next_after(second_copy) == ms(2025, 11, 2, 6, 15)
    for slots in both_kinds("15 2 * * *", NY):  # not repeated: 02:15 EST
        assert slots.next_after(second_copy) == ms(2025, 11, 2, 7, 15)


def test_fixed_time_from_inside_skipped_interval():
    jump = ms(2025, 3, 9, 7, 0)  # 02:00 EST -> 03:00 EDT
    for slots in both_kinds("30 2 * * *", NY):
        assert slots.next_after(jump - 1) == jump
        assert slots.next_after(jump) == ms(2025, 3, 10, 6, 30)
    # "02:30 local" read by zoneinfo (fold=0: the EST offset) is 03:30 EDT: 02:45 already ran
    after = int(dt.datetime(2025, 3, 9, 2, 30, tzinfo=NY).timestamp() * 1000)
    for slots in both_kinds("45 2 * * *", NY):
        assert slots.next_after(after) == ms(2025, 3, 10, 6, 45)
    for slots in both_kinds("0 3 * * *", NY):
        assert slots.next_after(jump - 1) == jump


def test_lord_howe_half_hour_instants():
    # fall back 2025-04-06 02:00 +11 -> 01:30 +10:30 (15:00Z); spring 02:00 +10:30 -> 02:30 +11
    for slots in both_kinds("30 * * * *", LORD_HOWE):
        day = runs_on_local_day(slots, LORD_HOWE, dt.date(2025, 4, 6))
        assert ms(2025, 4, 5, 14, 30) in day and ms(2025, 4, 5, 15, 0) in day
    for slots in both_kinds("0 2 * * *", LORD_HOWE):
        day = runs_on_local_day(slots, LORD_HOWE, dt.date(2025, 10, 5))
        assert day == [ms(2025, 10, 4, 15, 30)]


def test_last_day_of_month_in_paris():
    slots = build(cron("0 22 L * *", tz="Europe/Paris"))
    got = slots_between(slots, ms(2024, 1, 1), ms(2024, 5, 1))
    assert got == [ms(2024, 1, 31, 21), ms(2024, 2, 29, 21),  # 22:00 CET
                   ms(2024, 3, 31, 20), ms(2024, 4, 30, 20)]  # 22:00 CEST
    assert "tz=Europe/Paris" in slots.describe() and slots.shortest_gap_ms == 86_400_000


def test_every_seven_minutes_restarts_each_hour():
    for slots in both_kinds("*/7 * * * *", ZUTC):
        got = slots_between(slots, ms(2025, 1, 1, 10, 50), ms(2025, 1, 1, 11, 15))
        assert [ms_to_datetime(s).minute for s in got] == [56, 0, 7, 14]
        assert slots.shortest_gap_ms == 4 * 60_000  # 56 -> 0


def test_day_or_for_cron_and_for_crontab():
    start = ms(2025, 1, 1)
    # cron(5): the 13th OR a Friday; Celery's crontab: a Friday the 13th
    assert build(cron("0 0 13 * 5")).next_after(start) == ms(2025, 1, 3)
    friday_13th = crontab(minute=0, hour=0, day_of_month=13, day_of_week=5)
    assert build(friday_13th).next_after(start) == ms(2025, 6, 13)


def test_special_cron_syntax():
    assert build(cron("0 9 * * 1#2")).next_after(ms(2025, 1, 1)) == ms(2025, 1, 13, 9)
    assert build(cron("0 9 15W * *")).next_after(ms(2025, 3, 1)) == ms(2025, 3, 14, 9)
    assert build(cron("@daily")).next_after(ms(2025, 3, 1)) == ms(2025, 3, 2)


def test_yearly_entry():
    for slots in both_kinds("0 0 1 1 *", NY):
        assert slots.next_after(ms(2025, 3, 1)) == ms(2026, 1, 1, 5)
        assert slots.shortest_gap_ms == 86_400_000  # a lower bound
    leap = build(cron("0 12 29 2 *", tz="Asia/Tokyo"))
    assert leap.next_after(ms(2024, 3, 1)) == ms(2028, 2, 29, 3)


def test_historical_offset_with_seconds():
    # New York, 1883-11-18 12:03:58 LMT (-4:56:02) becomes 12:00:00 EST: a 3 min 58 s repeat
    day = dt.date(1883, 11, 18)
    for slots in both_kinds("* * * * *", NY):
        assert len(runs_on_local_day(slots, NY, day)) == 1444  # 12:00 to 12:03 twice
    for slots in both_kinds("0 12 * * *", NY):
        assert runs_on_local_day(slots, NY, day) == [ms(1883, 11, 18, 16, 56, 2)]
    for slots in both_kinds("2 12 * * *", NY):
        assert runs_on_local_day(slots, NY, day) == [ms(1883, 11, 18, 16, 58, 2)]


def test_a_long_walk_of_a_wildcard_entry_keeps_real_time_across_fall_back():
    """2000 successive slots of an every-minute entry in New York, across the fall-back night:
    each exactly one real minute after the last (the speed of this walk is measured by
    benchmarks/slots_speed.py, not asserted here)."""
    slots = build(cron("* * * * *", tz=NY))
    at, gaps = ms(2025, 11, 1), set()
    for _ in range(2000):                        # 33 h: through 2025-11-02 06:00 UTC
        nxt = slots.next_after(at)
        gaps.add(nxt - at)
        at = nxt
    assert gaps == {60_000} and at == ms(2025, 11, 1) + 2000 * 60_000


def test_host_time_zone_does_not_matter(monkeypatch):
    def two_days():
        return slots_between(build(cron("30 * * * *", tz=NY)), ms(2025, 11, 1), ms(2025, 11, 3))

    before = two_days()
    for host_tz in ("Asia/Kolkata", "America/Los_Angeles"):
        monkeypatch.setenv("TZ", host_tz)
        time.tzset()
        assert two_days() == before
    monkeypatch.undo()
    time.tzset()


def test_crontab_in_utc_agrees_with_celery():
    """Random crontabs (a fixed seed): the same next run as Celery's own crontab, in UTC."""
    rng = random.Random(20250309)
    app = Celery(set_as_current=False)

    def some(lo, hi, most):
        return set(rng.sample(range(lo, hi + 1), rng.randint(1, most)))

    for _ in range(300):
        sched = crontab(minute=some(0, 59, 4), hour=some(0, 23, 3),
                        day_of_month=rng.choice(["*", some(1, 28, 5)]),
                        day_of_week=rng.choice(["*", some(0, 6, 3)]))
        sched.app = app
        after = rng.randrange(ms(2000, 1, 1), ms(2040, 1, 1))
        last = ms_to_datetime(after)
        _, delta, _ = sched.remaining_delta(last)
        celery_next = (last + delta).replace(second=0, microsecond=0)
        assert ms_to_datetime(build(sched).next_after(after)) == celery_next, (sched, last)


# --- refused configurations ----------------------------------------------------------------

@pytest.mark.parametrize("kw,field,value,allowed", [
    ({"minute": "*/120"}, "minute", "*/120", "0-59"),
    ({"minute": "0", "hour": "*/25"}, "hour", "*/25", "0-23"),
    ({"minute": "5-10/100"}, "minute", "5-10/100", "0-59"),
])
def test_crontab_step_larger_than_field_refused(kw, field, value, allowed):
    assert len(getattr(crontab(**kw), field)) == 1  # Celery itself accepts it, silently
    with pytest.raises(ConfigError) as err:
        build(crontab(**kw))
    msg = str(err.value)
    assert "nightly" in msg and field in msg and value in msg and allowed in msg and "fix" in msg


def test_cron_step_larger_than_field_refused():
    with pytest.raises(ConfigError) as err:
        cron("*/120 * * * *")
    msg = str(err.value)
    assert "*/120" in msg and "minute" in msg and "0-59" in msg and "between 1 and 59" in msg


@pytest.mark.parametrize("expr,reason", [
    ("61 * * * *", "not a valid cron expression"),
    ("bad", "fields"),
    ("0 0 * * * 2030", "fields"),
    ("0 0 30 2 *", "never fires"),
    ("R * * * *", "random/hashed"),
    ("0 0 * * 1#6", "not a valid cron expression"),
])
def test_bad_cron_string_refused(expr, reason):
    with pytest.raises(ConfigError) as err:
        cron(expr)
    assert expr in str(err.value) and reason in str(err.value) and "fix" in str(err.value)


def test_unknown_time_zone_refused():
    with pytest.raises(ConfigError, match=r"cron\('0 0 \* \* \*'\).*'Mars/Olympus'.*fix"):
        cron("0 0 * * *", tz="Mars/Olympus")


class NotSlotted:
    def is_due(self, last_run_at):
        return False, 60


def test_unsupported_class_refused_with_the_fix():
    with pytest.raises(ConfigError) as err:
        build(NotSlotted())
    msg = str(err.value)
    assert "nightly" in msg and "NotSlotted" in msg
    assert "anarchon_next" in msg and "anarchon_shortest_gap" in msg


# --- custom classes ------------------------------------------------------------------------

class EveryTenMinutesPastFive:
    def anarchon_next(self, after):
        nxt = after.replace(minute=5, second=0, microsecond=0)
        while nxt <= after:
            nxt += dt.timedelta(minutes=10)
        return nxt

    def anarchon_shortest_gap(self):
        return dt.timedelta(minutes=10)


def test_custom_class_with_both_methods():
    slots = build(EveryTenMinutesPastFive())
    assert slots.next_after(ms(2025, 1, 1, 10, 5)) == ms(2025, 1, 1, 10, 15)
    assert slots.shortest_gap_ms == 600_000
    assert slots.describe() == f"kind=custom class={__name__}.EveryTenMinutesPastFive"


class HalfDone:
    def anarchon_next(self, after):
        return after + dt.timedelta(minutes=1)


class Naive(EveryTenMinutesPastFive):
    def anarchon_next(self, after):
        return after.replace(tzinfo=None) + dt.timedelta(minutes=1)


class NotLater(EveryTenMinutesPastFive):
    def anarchon_next(self, after):
        return after


def test_custom_class_misbehaving_refused():
    with pytest.raises(ConfigError, match=r"nightly.*HalfDone.*anarchon_shortest_gap.*fix"):
        build(HalfDone())
    with pytest.raises(ConfigError, match=r"nightly.*Naive.anarchon_next.*returned datetime"
                       r"\.datetime\(1970, 1, 1, 0, 1\).*fix: return an aware"):
        build(Naive()).next_after(0)
    with pytest.raises(ConfigError, match=r"nightly.*NotLater.anarchon_next.*not later.*fix"):
        build(NotLater()).next_after(0)


# --- solar ---------------------------------------------------------------------------------

def test_solar_sunset_in_berlin():
    slots = build(solar("sunset", 52.52, 13.405))
    first = slots.next_after(ms(2025, 6, 1, 12))
    assert abs(first - ms(2025, 6, 1, 19, 19, 42)) < 60_000
    second = slots.next_after(first)
    assert ms(2025, 6, 2, 19) < second < ms(2025, 6, 2, 19, 40)
    assert slots.next_after(first - 1) == first
    assert slots.describe() == "kind=solar event=sunset lat=52.52 lon=13.405"
    assert slots.shortest_gap_ms == 3_600_000


def test_solar_polar_night_skips_to_the_next_sunrise():
    slots = build(solar("sunrise", 78.0, 15.0))
    assert ms(2026, 2, 10) < slots.next_after(ms(2025, 12, 1)) < ms(2026, 2, 20)


def test_solar_without_ephem_says_what_to_install(monkeypatch):
    sched = solar("sunset", 52.52, 13.405)
    monkeypatch.setitem(sys.modules, "ephem", None)
    with pytest.raises(ConfigError) as err:
        build(sched)
    msg = str(err.value)
    assert "nightly" in msg and "sunset" in msg and "pip install celery-anarchon[solar]" in msg


# --- cron as a Celery schedule, descriptions ----------------------------------------------

def test_cron_is_a_celery_schedule():
    app = Celery(set_as_current=False)
    app.conf.timezone = "Europe/Paris"
    now = dt.datetime(2025, 3, 31, 19, 30, tzinfo=UTC)
    sched = cron("0 22 L * *", nowfun=lambda: now)
    sched.app = app
    assert sched.tz.key == "Europe/Paris"
    assert sched.remaining_estimate(dt.datetime(2025, 3, 1, tzinfo=UTC)) == dt.timedelta(minutes=30)
    assert sched.is_due(dt.datetime(2025, 3, 1, tzinfo=UTC)) == (False, 1800.0)
    # February's slot was missed: due now (once), next check at March's slot
    assert sched.is_due(dt.datetime(2025, 2, 1, tzinfo=UTC)) == (True, 1800.0)
    later = dt.datetime(2025, 3, 31, 20, 0, 5, tzinfo=UTC)
    sched.nowfun = lambda: later
    due, next_s = sched.is_due(dt.datetime(2025, 3, 1, tzinfo=UTC))
    assert due and next_s == (dt.datetime(2025, 4, 30, 20, tzinfo=UTC) - later).total_seconds()
    assert repr(cron("0 22 L * *", tz="Europe/Paris")) == "cron('0 22 L * *', tz='Europe/Paris')"


def test_cron_in_a_celery_schedule_entry():
    app = Celery(set_as_current=False)
    app.conf.beat_schedule = {"report": {"task": "t", "schedule": cron("*/5 * * * *", tz=NY)}}
    entry = ScheduleEntry(name="report", app=app, **app.conf.beat_schedule["report"])
    assert entry.schedule.app is app
    due, next_s = entry.is_due()
    assert not due and 0 < next_s <= 300
    slots = slots_for(entry.schedule, entry=entry.name, app_timezone=app.timezone)
    assert slots.describe() == \
        "kind=cron expr='*/5 * * * *' days=or tz=America/New_York dst=wildcard"


def test_cron_equality_hash_and_pickle():
    a = cron("0  22 L * *", tz="Europe/Paris")
    assert a == cron("0 22 L * *", tz=zoneinfo.ZoneInfo("Europe/Paris"))
    assert a != cron("0 22 L * *") and a != cron("0 21 L * *", tz="Europe/Paris")
    assert len({a, cron("0 22 L * *", tz="Europe/Paris")}) == 1
    assert pickle.loads(pickle.dumps(a)) == a


def test_describe_is_canonical():
    a = build(crontab(minute="*/15", hour="9-17"), NY).describe()
    assert a == "kind=crontab expr='0,15,30,45 9,10,11,12,13,14,15,16,17 * * *' days=and " \
        "tz=America/New_York dst=wildcard"
    b = build(crontab(minute="0,15,30,45", hour="9-17"), NY).describe()  # same times, fixed-time
    assert b == a.replace("dst=wildcard", "dst=fixed-time")
    assert build(cron("30 2 * * *")).describe() == \
        "kind=cron expr='30 2 * * *' days=or tz=UTC dst=fixed-time"
    assert build(cron("30 2 * * *"), UTC).describe() == build(cron("30 2 * * *")).describe()
    assert build(schedule(60)).describe() == "kind=interval period_ms=60000 anchor_ms=0"
    assert "0x" not in build(NotLater()).describe()


def test_crontab_own_time_zone_wins_over_the_app():
    sched = crontab(minute=0, hour=9)
    sched.tz = zoneinfo.ZoneInfo("Asia/Tokyo")
    assert build(sched, NY).next_after(ms(2024, 12, 31, 12)) == ms(2025, 1, 1, 0)

    class TokyoCrontab(crontab):
        @property
        def tz(self):
            return zoneinfo.ZoneInfo("Asia/Tokyo")

    after = ms(2024, 12, 31, 12)
    assert build(TokyoCrontab(minute=0, hour=9), NY).next_after(after) == ms(2025, 1, 1, 0)
    assert build(crontab(minute=0, hour=9), NY).next_after(after) == ms(2024, 12, 31, 14)


def test_shortest_gaps():
    assert build(crontab(minute="*/15")).shortest_gap_ms == 900_000
    assert build(crontab(minute=0, hour="9,17")).shortest_gap_ms == 8 * 3_600_000
    assert build(cron("30 2 * * 1")).shortest_gap_ms == 86_400_000
    assert isinstance(build(cron("* * * * *")), SlotSchedule)


def test_no_clock_is_read(monkeypatch):
    slots = build(cron("*/5 * * * *", tz=NY))
    monkeypatch.setattr(time, "time", lambda: pytest.fail("clock read"))
    assert slots.next_after(ms(2025, 1, 1)) == ms(2025, 1, 1, 0, 5)


def test_every_day_expressions_answer_as_croniter_does():
    """The arithmetic of an expression matching every day (slots.wall_clock._WallMatcher) gives
    croniter's answer for random minute and hour sets and random instants, seconds included."""
    from celery_anarchon.schedule.slots import wall_clock as slots_module
    rng = random.Random(20261201)
    for _ in range(300):
        minutes = "*" if rng.random() < 0.2 else ",".join(
            map(str, sorted(rng.sample(range(60), rng.randint(1, 4)))))
        hours = "*" if rng.random() < 0.4 else ",".join(
            map(str, sorted(rng.sample(range(24), rng.randint(1, 3)))))
        expr = f"{minutes} {hours} * * *"
        fast = slots_module._WallMatcher(expr, False)
        assert fast._day_s is not None, expr
        slow = slots_module._WallMatcher(expr, False)
        slow._day_s = None                       # croniter's own answer
        for _ in range(20):
            wall_s = rng.randrange(0, 4_000_000_000)
            assert fast.first_at_or_after(wall_s) == slow.first_at_or_after(wall_s), (expr, wall_s)
