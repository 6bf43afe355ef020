"""django-celery-beat's rows as entries (docs/from-django-celery-beat.md): each model means what
it means there, a refused row is left out with an error naming it, its id and the fix while the
others run, a change through the ORM is read at the next poll, and only the winner's sends
update a row. Rows in a real migrated Django database (tests/support/django_project.py)."""
from __future__ import annotations

import datetime
import json
import logging
import time
import zoneinfo

import pytest
from celery import Celery
from django_project import django_db, rows  # noqa: F401  (fixtures; Django configured)
from django.utils import timezone
from django_celery_beat.models import (
    ClockedSchedule, CrontabSchedule, IntervalSchedule, PeriodicTask, PeriodicTasks,
    SolarSchedule,
)

from celery_anarchon.beat.entries import BeatEntry
from celery_anarchon.contrib.django_celery_beat import RowPlans, keep_phase
from celery_anarchon.contrib.django_celery_beat import scheduler as scheduler_mod
from celery_anarchon.django_rows.rows import SentRun, record_runs
from celery_anarchon.schedule.plan import config_entry, task_id_for
from celery_anarchon.schedule.message import task_message
from celery_anarchon.schedule.slots import SlotsEnded, datetime_to_ms
from celery_anarchon.settings import Settings
from celery_anarchon.stores import open_store

UTC = datetime.timezone.utc
TASK = "proj.tasks.report"


def row_plans(beat_schedule: dict | None = None, **conf) -> RowPlans:
    app = Celery("proj", set_as_current=False)
    app.conf.update(broker_url="memory://", **conf)
    store = open_store("memory://", namespace="proj", instance_id="i", options={})
    plans = RowPlans(app, Settings.from_app(app), store, BeatEntry)
    schedule = {name: config_entry(name, item, app=app, entry_cls=BeatEntry)
                for name, item in (beat_schedule or {}).items()}
    plans.built = plans.of_schedule(schedule)
    return plans


def next_read(plans: RowPlans, what: str, timeout: float = 5.0) -> dict:
    """The plans of the next read of the rows (polled as beat does, before each tick)."""
    deadline = time.monotonic() + timeout
    while (changed := plans.changed({}, lambda a, b: a == b)) is None:
        assert time.monotonic() < deadline, f"{what}: not read within {timeout} s"
        time.sleep(0.02)
    return changed


def every(n: int, period: str = "seconds") -> IntervalSchedule:
    return IntervalSchedule.objects.create(every=n, period=period)


def ms(dt: datetime.datetime) -> int:
    return datetime_to_ms(dt)


def test_an_interval_row_is_epoch_aligned_with_its_options_and_arguments(rows):
    PeriodicTask.objects.create(
        name="ten", task=TASK, interval=every(10), args='["a", 1]', kwargs='{"full": true}',
        queue="reports", exchange="ex", routing_key="rk", priority=3, expire_seconds=30,
        headers='{"trace": "x", "anarchon": {"jitter": 1, "max_late": 20, "catch_up": "none"}}')
    plan = row_plans().built["ten"]
    assert plan.slots.next_after(1_000_001) == 1_010_000          # multiples of 10 s since 1970
    assert (plan.timing.jitter_s, plan.timing.max_late_s, plan.timing.catch_up) == (
        1.0, 20.0, "none")
    assert plan.entry.args == ["a", 1] and plan.entry.kwargs == {"full": True}
    assert plan.celery_options == {
        "queue": "reports", "exchange": "ex", "routing_key": "rk", "priority": 3,
        "expires": 30, "headers": {"trace": "x", "periodic_task_name": "ten"}}
    message = task_message(plan, namespace="proj", instance_id="i", slot_ms=1_010_000,
                           attempt=1, token=None, task_id=task_id_for("proj", "ten", 1_010_000, 1))
    assert message.options["headers"]["periodic_task_name"] == "ten"
    assert "anarchon" not in message.options["headers"]


def test_an_anchor_keeps_an_interval_rows_phase(rows):
    PeriodicTask.objects.create(name="ten", task=TASK, interval=every(10),
                                headers='{"anarchon": {"anchor": 3}}')
    PeriodicTask.objects.create(name="iso", task=TASK, interval=every(1, "minutes"),
                                headers='{"anarchon": {"anchor": "1970-01-01T00:00:07+00:00"}}')
    built = row_plans().built
    assert built["ten"].slots.next_after(1_000_001) == 1_003_000
    assert built["iso"].slots.next_after(60_000) == 67_000


def test_keep_phase_anchors_each_interval_row_at_its_last_run(rows):
    last = datetime.datetime(2026, 3, 1, 12, 0, 7, 250_000, tzinfo=UTC)
    PeriodicTask.objects.create(name="ten", task=TASK, interval=every(10), last_run_at=last)
    PeriodicTask.objects.create(name="never", task=TASK, interval=every(10))
    assert keep_phase() == ["ten"]
    assert json.loads(PeriodicTask.objects.get(name="ten").headers) == {
        "anarchon": {"anchor": int(last.timestamp())}}
    assert keep_phase() == []                           # an anchor is kept as it is
    slot = row_plans().built["ten"].slots.next_after(ms(last))
    assert slot == ms(last.replace(microsecond=0) + datetime.timedelta(seconds=10))


def test_a_crontab_row_runs_in_its_own_time_zone(rows):
    cron = CrontabSchedule.objects.create(minute="0", hour="9", timezone="Europe/Paris")
    PeriodicTask.objects.create(name="nine", task=TASK, crontab=cron)
    plan = row_plans(timezone="UTC").built["nine"]
    after = datetime.datetime(2026, 1, 10, 12, tzinfo=UTC)
    paris = datetime.datetime(2026, 1, 11, 9, tzinfo=zoneinfo.ZoneInfo("Europe/Paris"))
    assert plan.slots.next_after(ms(after)) == ms(paris)            # 08:00 UTC in winter


def test_a_solar_row_runs_at_its_event(rows):
    solar = SolarSchedule.objects.create(event="sunrise", latitude=48.85, longitude=2.35)
    PeriodicTask.objects.create(name="dawn", task=TASK, solar=solar)
    plan = row_plans().built["dawn"]
    after = datetime.datetime(2026, 6, 21, tzinfo=UTC)
    slot = plan.slots.next_after(ms(after))
    assert ms(after) + 3 * 3600_000 < slot < ms(after) + 5 * 3600_000   # Paris, ~03:47 UTC


def test_a_clocked_row_has_one_slot_its_instant(rows):
    at = datetime.datetime(2026, 5, 1, 10, 30, tzinfo=UTC)
    clocked = ClockedSchedule.objects.create(clocked_time=at)
    PeriodicTask.objects.create(name="once", task=TASK, clocked=clocked, one_off=True)
    slots = row_plans().built["once"].slots
    assert slots.next_after(ms(at) - 60_000) == ms(at)
    with pytest.raises(SlotsEnded):
        slots.next_after(ms(at))


@pytest.mark.parametrize("microsecond", [123_456, 999_999, 1])
def test_a_clocked_time_with_microseconds_has_its_slot_in_whole_ms_rounded_down(rows,
                                                                                microsecond):
    at = datetime.datetime(2026, 12, 5, 12, 31, 15, microsecond, tzinfo=UTC)
    clocked = ClockedSchedule.objects.create(clocked_time=at)
    PeriodicTask.objects.create(name="clk-us", task=TASK, clocked=clocked, one_off=True)
    slots = row_plans().built["clk-us"].slots
    slot = ms(at)                                   # rounded down, as the import cuts it
    assert slots.next_after(slot - 60_000) == slot
    assert slots.next_after(slot - 1) == slot
    with pytest.raises(SlotsEnded):
        slots.next_after(slot)


def test_a_one_off_row_runs_at_its_schedules_first_slot_after_its_last_save(rows):
    row = PeriodicTask.objects.create(name="first", task=TASK, interval=every(10), one_off=True)
    slots = row_plans().built["first"].slots
    changed = ms(row.date_changed)
    first = slots.next_after(0)
    assert first == -(-changed // 10_000) * 10_000               # the first multiple of 10 s
    with pytest.raises(SlotsEnded):
        slots.next_after(first)


def test_a_one_off_row_with_a_start_time_runs_at_its_first_slot_after_it(rows):
    start = datetime.datetime(2030, 1, 1, 0, 0, 3, tzinfo=UTC)
    PeriodicTask.objects.create(name="later", task=TASK, interval=every(10), one_off=True,
                                start_time=start)
    assert row_plans().built["later"].slots.next_after(0) == ms(start) + 7_000


def test_disabled_rows_and_one_off_rows_that_ran_since_their_save_are_not_scheduled(rows):
    PeriodicTask.objects.create(name="off", task=TASK, interval=every(10), enabled=False)
    ran = PeriodicTask.objects.create(name="ran", task=TASK, interval=every(10), one_off=True)
    record_runs([SentRun(ran.pk, False, timezone.now())])       # its winner could not disable it
    again = PeriodicTask.objects.create(name="again", task=TASK, interval=every(10),
                                        one_off=True)
    record_runs([SentRun(again.pk, True, timezone.now())])
    again.refresh_from_db()
    again.enabled = True                                          # enabled again in the admin
    again.save()
    PeriodicTask.objects.create(name="on", task=TASK, interval=every(10))
    plans = row_plans()
    assert set(plans.built) == {"on", "again"} and plans.refused == {}


def test_start_time_and_expires_bound_the_slots_and_expires_reaches_apply_async(rows):
    start = datetime.datetime(2030, 1, 1, tzinfo=UTC)
    end = start + datetime.timedelta(minutes=1)
    PeriodicTask.objects.create(name="window", task=TASK, interval=every(10),
                                start_time=start, expires=end)
    plan = row_plans().built["window"]
    assert plan.slots.next_after(0) == ms(start)
    with pytest.raises(SlotsEnded):
        plan.slots.next_after(ms(end))
    assert plan.celery_options["expires"] == end


@pytest.mark.parametrize("field, value, words", [
    ("args", "[1,", "args '[1,' is not valid JSON"),
    ("args", '{"a": 1}', "is not a JSON list"),
    ("kwargs", "[]", "is not a JSON dict"),
    ("headers", '{"anarchon": {"jitterr": 1}}', "headers['anarchon'] has ['jitterr']"),
    ("headers", '{"anarchon": {"jitter": 9}}',                     # >= half of a 10-s gap
     'the "anarchon" object of its headers: edit the row in the admin'),
])
def test_a_row_our_rules_refuse_is_left_out_and_the_others_run(rows, caplog, field, value,
                                                                  words):
    bad = PeriodicTask.objects.create(name="bad", task=TASK, interval=every(10),
                                      **{field: value})
    PeriodicTask.objects.create(name="good", task=TASK, interval=every(10))
    with caplog.at_level(logging.ERROR, logger="celery_anarchon.contrib.django_celery_beat"):
        plans = row_plans()
    assert set(plans.built) == {"good"}
    error = plans.refused["bad"]
    assert f"PeriodicTask 'bad' (id {bad.pk}) is left out" in error
    assert words in error and "fix" in error.lower()
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [
        f"anarchon: {error} (the others run)"]


def test_two_rows_whose_names_are_equal_once_normalized_are_named_apart(rows, caplog):
    composed = PeriodicTask.objects.create(name="caf\u00e9", task=TASK, interval=every(10))
    decomposed = PeriodicTask.objects.create(name="cafe\u0301", task=TASK, interval=every(10))
    with caplog.at_level(logging.ERROR, logger="celery_anarchon.contrib.django_celery_beat"):
        plans = row_plans()
    assert set(plans.built) == {"caf\u00e9"}     # the name the admin's pause and run now reach
    error = plans.refused["cafe\u0301"]
    assert f"PeriodicTask 'cafe\\u0301' (id {decomposed.pk}) is left out" in error
    assert f"PeriodicTask 'caf\\xe9' (id {composed.pk})" in error
    assert "equal once normalized" in error and "rename one of them in the admin" in error
    assert "store entry" not in error and "celery anarchon remove" not in error
    assert error in caplog.text


def test_a_row_whose_name_is_not_normalized_is_left_out_with_a_rename_fix(rows):
    lone = PeriodicTask.objects.create(name="cafe\u0301", task=TASK, interval=every(10))
    error = row_plans().refused["cafe\u0301"]
    assert f"PeriodicTask 'cafe\\u0301' (id {lone.pk}) is left out" in error
    assert "rename it in the admin" in error and "store entry" not in error


def test_a_catch_up_window_below_zero_is_refused_with_the_fix_in_the_rows_headers(rows):
    bad = PeriodicTask.objects.create(
        name="bad", task=TASK, interval=every(10),
        headers='{"anarchon": {"catch_up": "all", "catch_up_window": -100}}')
    assert row_plans().refused["bad"] == (
        f"django-celery-beat PeriodicTask 'bad' (id {bad.pk}) is left out: entry 'bad': "
        "options['anarchon']['catch_up_window']: -100 must be a finite number of seconds >= 0; "
        "fix: give seconds from 0 to 3155760000 s (100 years), as an int, a float or a "
        'datetime.timedelta (on this row, options["anarchon"] is the "anarchon" object of its '
        'headers: edit the row in the admin, e.g. headers {"anarchon": {"jitter": 1}})')


def test_a_crontab_step_larger_than_its_field_is_refused_by_name(rows):
    cron = CrontabSchedule.objects.create(minute="*/120")
    bad = PeriodicTask.objects.create(name="bad", task=TASK, crontab=cron)
    PeriodicTask.objects.create(name="good", task=TASK, interval=every(10))
    plans = row_plans()
    assert set(plans.built) == {"good"}
    assert f"(id {bad.pk}) is left out" in plans.refused["bad"]
    assert "*/120" in plans.refused["bad"] and "fix" in plans.refused["bad"]


def test_a_beat_schedule_entry_wins_a_name_clash_with_a_row(rows, caplog):
    PeriodicTask.objects.create(name="celery.backend_cleanup", task=TASK, interval=every(10))
    config = {"celery.backend_cleanup": {"task": "celery.backend_cleanup", "schedule": 3600}}
    with caplog.at_level(logging.WARNING, logger="celery_anarchon.contrib.django_celery_beat"):
        plans = row_plans(config)
    assert plans.built["celery.backend_cleanup"].entry.task == "celery.backend_cleanup"
    assert "beat_schedule has an entry of that name" in caplog.text


def test_a_change_through_the_orm_is_read_at_the_next_poll(rows):
    PeriodicTask.objects.create(name="a", task=TASK, interval=every(10))
    plans = row_plans(anarchon_sync_interval=0.2)
    assert plans.changed({}, lambda a, b: a == b) is None        # within the sync interval
    row = PeriodicTask.objects.get(name="a")
    row.interval = every(20)
    row.save()
    PeriodicTask.objects.create(name="b", task=TASK, interval=every(10))
    changed = next_read(plans, "the change")
    if set(changed) != {"a", "b"}:        # read between the change note and the row's write
        changed = next_read(plans, "the change, read again")
    assert set(changed) == {"a", "b"}
    assert changed["a"].slots.shortest_gap_ms == 20_000
    PeriodicTask.objects.get(name="b").delete()
    changed = next_read(plans, "the deletion")
    if set(changed) != {"a"}:
        changed = next_read(plans, "the deletion, read again")
    assert set(changed) == {"a"}


def test_a_write_that_sent_no_signal_is_read_at_the_next_full_read(rows, monkeypatch):
    monkeypatch.setattr(scheduler_mod, "FULL_READ_S", 0.5)
    PeriodicTask.objects.create(name="a", task=TASK, interval=every(10))
    plans = row_plans(anarchon_sync_interval=0.1)
    next_read(plans, "the read after the first one")
    PeriodicTask.objects.filter(name="a").update(enabled=False)   # a bulk update: no signal
    began = time.monotonic()
    assert next_read(plans, "the bulk update") == {}
    assert time.monotonic() - began >= 0.4


def test_only_the_sent_runs_update_a_row_and_a_one_off_row_is_disabled(rows):
    ten = PeriodicTask.objects.create(name="ten", task=TASK, interval=every(10))
    once = PeriodicTask.objects.create(name="once", task=TASK, interval=every(10), one_off=True)
    before = PeriodicTasks.last_change()
    t1 = datetime.datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC)
    t2 = t1 + datetime.timedelta(seconds=10)
    record_runs([SentRun(ten.pk, False, t1), SentRun(ten.pk, False, t2)])
    ten.refresh_from_db()
    assert (ten.total_run_count, ten.last_run_at, ten.enabled) == (2, t2, True)
    assert PeriodicTasks.last_change() == before                # no change noted for a count
    record_runs([SentRun(once.pk, True, t1)])
    once.refresh_from_db()
    assert (once.total_run_count, once.last_run_at, once.enabled) == (1, t1, False)
    assert PeriodicTasks.last_change() > before                 # the others drop it


def test_the_admin_change_list_of_periodic_tasks_renders(rows):
    from django.contrib.auth.models import User
    from django.test import Client

    PeriodicTask.objects.create(name="ten", task=TASK, interval=every(10))
    user = User.objects.create_superuser("admin", "admin@example.com", "pw")
    try:
        client = Client()
        client.force_login(user)
        page = client.get("/admin/django_celery_beat/periodictask/")
        assert page.status_code == 200
        assert "ten" in page.content.decode()
    finally:
        user.delete()


#: the project's zone of the USE_TZ = False test: naive times in the rows are its wall clock
PARIS = zoneinfo.ZoneInfo("Europe/Paris")


def _slots_of_rows(local) -> tuple[dict, dict]:
    """The rows of the USE_TZ test, their times given by ``local(naive Paris wall time)``: each
    row's first slots from 2030-03-30 (across Paris's spring-forward night) and the rows."""
    wall = datetime.datetime(2030, 3, 30, 12, 0)
    made = {
        "window": PeriodicTask.objects.create(
            name="window", task=TASK, interval=every(3600), start_time=local(wall),
            expires=local(wall + datetime.timedelta(days=2))),
        "nightly": PeriodicTask.objects.create(
            name="nightly", task=TASK, crontab=CrontabSchedule.objects.create(
                minute="30", hour="2", timezone="Europe/Paris"), start_time=local(wall)),
        "clocked": PeriodicTask.objects.create(
            name="clocked", task=TASK, one_off=True, clocked=ClockedSchedule.objects.create(
                clocked_time=local(wall + datetime.timedelta(hours=5)))),
        "once": PeriodicTask.objects.create(name="once", task=TASK, interval=every(600),
                                            one_off=True, start_time=local(wall)),
    }
    plans = row_plans().built
    after = ms(wall.replace(tzinfo=PARIS)) - 1
    out = {}
    for name, plan in plans.items():
        slots, at = [], after
        for _ in range(3):
            try:
                at = plan.slots.next_after(at)
            except SlotsEnded:
                break
            slots.append(at)
        out[name] = slots
    return out, made


def test_naive_times_of_use_tz_false_give_the_same_slots_and_last_run_at(rows):
    """USE_TZ = False: the rows' times are naive, the wall clock of TIME_ZONE (as
    django-celery-beat's own make_aware reads them); the slots are those of the same rows with
    aware times, and the winner's last_run_at is written naive in TIME_ZONE."""
    from django.test import override_settings
    from django_celery_beat.utils import make_aware as dcb_make_aware

    expected, _ = _slots_of_rows(lambda wall: wall.replace(tzinfo=PARIS))
    assert expected["window"][0] == ms(datetime.datetime(2030, 3, 30, 11, 0, tzinfo=UTC))
    assert expected["nightly"] == [ms(datetime.datetime(2030, 3, 31, 3, 0, tzinfo=PARIS)),
                                   ms(datetime.datetime(2030, 4, 1, 2, 30, tzinfo=PARIS)),
                                   ms(datetime.datetime(2030, 4, 2, 2, 30, tzinfo=PARIS))]
    PeriodicTask.objects.all().delete()
    with override_settings(USE_TZ=False, TIME_ZONE="Europe/Paris"):
        naive, made = _slots_of_rows(lambda wall: wall)
        assert naive == expected
        sent = datetime.datetime(2030, 3, 30, 17, 0, 1, tzinfo=UTC)          # 18:00:01 in Paris (CET)
        record_runs([SentRun(made["window"].pk, False, sent),
                     SentRun(made["clocked"].pk, True, sent)])
        for name in ("window", "clocked"):
            row = PeriodicTask.objects.get(pk=made[name].pk)
            assert row.last_run_at == datetime.datetime(2030, 3, 30, 18, 0, 1)   # naive, Paris
            assert dcb_make_aware(row.last_run_at) == sent          # as django-celery-beat reads it
            assert row.total_run_count == 1
        assert set(row_plans().built) == {"window", "nightly", "once"}  # clocked ran: disabled
