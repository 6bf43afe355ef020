"""The overdue rule (celery_anarchon.operate.overdue) on the memory store and a clock the test
moves: an entry whose newest due slot (slot + jitter + max_late passed) has no record is
``overdue`` in the status data, ``status``, the page and ``check --overdue``; a paused entry, a
new one and one the store cannot vouch for are not."""
from __future__ import annotations

import datetime

import pytest
from celery import Celery

import celery_anarchon
from celery_anarchon.operate import overdue
from celery_anarchon.operate.overview import overview
from celery_anarchon.schedule.plan import EntryPlan
from celery_anarchon.schedule.timing import EntryTiming
from celery_anarchon.settings import Settings
from celery_anarchon.stores.base import RunEvent

from engine_support import T0_MS, Clocks, make_plan, memory_store
from operate_support import run_in_process

#: the entry of these tests: every 10 s, jitter 1 s, max_late 5 s: a slot's deadline is 6 s on
EVERY_S, JITTER_S, MAX_LATE_S = 10, 1, 5
SCHEDULE = {"e10": {"task": "t", "schedule": float(EVERY_S),
                    "options": {"anarchon": {"jitter": JITTER_S, "max_late": MAX_LATE_S}}}}


def _app(**conf) -> Celery:
    app = Celery("overdue_app", set_as_current=False)
    app.conf.update({"broker_url": "memory://", "anarchon_store_url": "memory://overdue",
                     "timezone": "UTC", "beat_schedule": dict(SCHEDULE), **conf})
    return app


def _row(app, store, name: str = "e10", **kwargs) -> dict:
    data = overview(app, store, Settings.from_app(app), runs=5, **kwargs)
    return {e["name"]: e for e in data["entries"]}[name]


# -- the newest due slot ----------------------------------------------------------------------

def test_the_newest_due_slot_is_the_newest_whose_deadline_passed():
    plan = make_plan("e", 10, jitter_s=1, max_late_s=5)
    # slots every 10 s from T0 (on a 10 s boundary); T0's deadline is T0 + 6 s
    assert overdue.due_slot(plan, T0_MS + 6_000) == T0_MS
    assert overdue.due_slot(plan, T0_MS + 5_999) == T0_MS - 10_000
    assert overdue.due_slot(plan, T0_MS + 15_999) == T0_MS
    assert overdue.due_slot(plan, T0_MS + 16_000) == T0_MS + 10_000
    # nothing due after the floor
    assert overdue.due_slot(plan, T0_MS + 6_000, floor_ms=T0_MS + 1) is None


def test_the_newest_due_slot_lies_within_start_at_and_end_at():
    import dataclasses

    from celery_anarchon.schedule.slots.window import Window, WindowedSlots
    plan = make_plan("e", 10, jitter_s=1, max_late_s=5)
    ended = dataclasses.replace(plan, slots=WindowedSlots("e", plan.slots, Window(
        T0_MS - 30_000, T0_MS + 5_000)))
    # the last slot before end_at is the newest due slot, however long after the end
    assert overdue.due_slot(ended, T0_MS + 6_000) == T0_MS
    assert overdue.due_slot(ended, T0_MS + 3_600_000) == T0_MS
    assert overdue.due_slot(ended, T0_MS - 25_000) is None      # T0-30 s: not due yet
    waiting = dataclasses.replace(plan, slots=WindowedSlots("e", plan.slots, Window(
        T0_MS + 60_000, None)))
    assert overdue.due_slot(waiting, T0_MS + 60_000) is None     # before start_at: none due


def test_the_newest_due_slot_of_a_sparse_cron_is_found_by_bisection():
    """Every minute 09:00-16:59 on weekdays: from Monday 08:00 the newest due slot is Friday
    16:59, more than two days back; the search agrees with a walk over every slot."""
    slots = celery_anarchon.cron("* 9-16 * * 1-5", tz="UTC").slots(datetime.timezone.utc)
    plan = EntryPlan("sparse", None, slots, EntryTiming(jitter_s=1, max_late_s=30), {}, "f", "{}")
    monday = int(datetime.datetime(2027, 3, 1, 8, tzinfo=datetime.timezone.utc).timestamp() * 1000)
    friday_last = int(datetime.datetime(2027, 2, 26, 16, 59,
                                        tzinfo=datetime.timezone.utc).timestamp() * 1000)
    assert overdue.due_slot(plan, monday) == friday_last
    now = monday + 3_600_000 + 10_000                       # 09:00:10: 09:00 + 31 s not passed
    assert overdue.due_slot(plan, now) == friday_last
    assert overdue.due_slot(plan, monday + 3_600_000 + 31_000) == monday + 3_600_000
    walked, slot = None, friday_last - 86_400_000
    while (slot := slots.next_after(slot)) <= monday - 31_000:
        walked = slot
    assert walked == friday_last


# -- the rule in the status data ------------------------------------------------------------------

def test_an_entry_with_no_record_of_its_newest_due_slot_is_overdue_until_one_is_recorded():
    clocks = Clocks()
    store = memory_store(clocks)
    app = _app()
    store.prepare(["e10"])
    for k in range(3):                                   # it ran: T0 - 20 s, T0 - 10 s, T0
        store.history.record("e10", T0_MS - 10_000 * k, RunEvent.SENT)
    clocks.advance(EVERY_S + JITTER_S + MAX_LATE_S - 0.001)   # T0 + 10 s is due in 1 ms
    row = _row(app, store)
    assert row["state"] == "running" and row["due"]["state"] == "recorded"
    assert row["due"]["event"] == "sent" and row["due"]["slot"].startswith("2023-11-14T22:13:20")
    clocks.advance(0.002)
    row = _row(app, store)
    assert row["state"] == "overdue"
    due = row["due"]
    assert due["state"] == "overdue" and due["event"] is None and due["why"] is None
    assert due["slot"] == "2023-11-14T22:13:30.000+00:00" and 0 < due["late_s"] < 0.01
    assert due["deadline"] == "2023-11-14T22:13:36.000+00:00"
    # a skip is a record too: the slot was handled
    store.history.record("e10", T0_MS + 10_000, RunEvent.LATE, detail="late")
    row = _row(app, store)
    assert row["state"] == "running" and row["due"]["event"] == "late"
    assert row["unsent"] is True       # the memory store keeps instance records: none is live


def test_a_paused_entry_is_not_overdue_and_a_new_one_cannot_be_vouched_for():
    clocks = Clocks()
    store = memory_store(clocks)
    app = _app()
    store.prepare(["e10"])
    clocks.advance(60)
    row = _row(app, store)       # no run of it at all: a new entry, or one nothing ran yet
    assert row["state"] == "running" and row["due"]["state"] == "unknown"
    assert "no run of it before this slot" in row["due"]["why"]
    store.history.record("e10", T0_MS, RunEvent.SENT)
    assert _row(app, store)["state"] == "overdue"
    celery_anarchon.schedules(app, store=store).pause("e10", reason="maintenance", by="ops")
    row = _row(app, store)
    assert row["state"] == "paused" and row["due"] is None


def test_a_store_entry_changed_before_its_due_slot_is_vouched_for():
    clocks = Clocks()
    store = memory_store(clocks)
    app = _app(beat_schedule={})
    store.prepare([])
    celery_anarchon.schedules(app, store=store).add("added", task="t", schedule=10.0,
                                                     options={"anarchon": {"jitter": 1,
                                                                           "max_late": 5}})
    clocks.advance(3)
    assert _row(app, store, "added")["due"]["state"] == "unknown"   # its due slot came before
    clocks.advance(30)
    row = _row(app, store, "added")
    assert row["state"] == "overdue" and row["source"] == "store"


def test_a_slot_the_store_cannot_vouch_for_is_unknown_never_overdue():
    # older than the store's memory: jitter + max_late of 6 s against a memory of 8 s, and a
    # slot every 30 s, so that the newest due slot is older than the memory for a while
    clocks = Clocks()
    store = memory_store(clocks, memory=8)
    app = _app(beat_schedule={"e30": {"task": "t", "schedule": 30.0, "options": {"anarchon": {
        "jitter": 1, "max_late": 5}}}}, anarchon_store_options={"memory": 8})
    store.prepare(["e30"])
    store.history.record("e30", T0_MS - 30_000, RunEvent.SENT)
    clocks.advance(10)
    row = _row(app, store, "e30")
    assert row["state"] == "running" and row["due"]["state"] == "unknown"
    assert row["due"]["slot"] is None and "within the store's memory (8 s)" in row["due"]["why"]
    # runs kept by count: every run kept is newer than the slot: unknown, not overdue
    clocks = Clocks()
    store = memory_store(clocks, history_size=3)
    app = _app(anarchon_store_options={"history_size": 3})
    store.prepare(["e10"])
    store.history.record("e10", T0_MS - 10_000, RunEvent.SENT)
    for k in (1, 2, 3):          # three run-now runs after T0, within T0's deadline
        store.history.record("e10", T0_MS + 1_000 * k, RunEvent.SENT)
    clocks.advance(JITTER_S + MAX_LATE_S + 1)
    row = _row(app, store)
    assert row["due"]["state"] == "unknown" and "keeps 3 runs of it" in row["due"]["why"]


def test_an_entry_not_due_yet_or_ended_before_the_stores_memory_is_no_warning():
    """No slot due within the store's memory is only "cannot tell" when a slot before the memory
    may be due: an entry whose start_at lies within the memory has no slot due yet, and one that
    ended before the memory has none left to vouch for; neither is a warning of ``check``."""
    import dataclasses

    from celery_anarchon._util import Memory
    from celery_anarchon.schedule.slots.window import Window, WindowedSlots
    plan = make_plan("e", 30, jitter_s=1, max_late_s=5)
    memory = Memory(duration_s=3600, count=None)
    now = T0_MS + 3_000

    def windowed(start_ms, end_ms):
        return dataclasses.replace(plan, slots=WindowedSlots("e", plan.slots,
                                                             Window(start_ms, end_ms)))
    starting = windowed(T0_MS - 2_000, None)          # its first slot's deadline is still ahead
    assert overdue.judge(starting, [], now, memory, complete=True) is None
    ended = windowed(None, T0_MS - 7_200_000)         # ended two hours ago, memory one hour
    assert overdue.judge(ended, [], now, memory, complete=True) is None
    # an entry of a slot every 2 h against a memory of 1 h: its due slot may be before it
    sparse = make_plan("s", 7_200, jitter_s=1, max_late_s=5)
    unknown = overdue.judge(sparse, [], T0_MS + 3_000, memory, complete=True)
    assert unknown is None or unknown["state"] == "unknown"


def test_the_full_history_is_read_when_the_runs_read_do_not_reach_the_due_slot():
    clocks = Clocks()
    store = memory_store(clocks)
    app = _app()
    store.prepare(["e10"])
    store.history.record("e10", T0_MS - 10_000, RunEvent.SENT)
    store.history.record("e10", T0_MS, RunEvent.SENT)
    for k in range(1, 30):       # 29 run-now runs newer than T0, more than one read holds
        store.history.record("e10", T0_MS + 100 * k, RunEvent.SENT)
    clocks.advance(JITTER_S + MAX_LATE_S + 1)
    row = _row(app, store)
    assert row["due"]["state"] == "recorded" and len(row["runs"]) == 5
    assert _row(app, store, due=False)["due"] is None


# -- what status, the page and check --overdue say ------------------------------------------

def test_status_the_page_and_check_overdue_name_the_overdue_entry(capsys, monkeypatch):
    from celery_anarchon.operate.cli import reports as cli_status
    from celery_anarchon.operate.cli import rules as cli_rules
    from celery_anarchon.operate.page import entries_page, render_page
    clocks = Clocks()
    store = memory_store(clocks)
    app = _app(beat_schedule={**SCHEDULE, "a-paused": {"task": "t", "schedule": 10.0}})
    store.prepare(["e10"])
    store.history.record("e10", T0_MS, RunEvent.SENT)
    celery_anarchon.schedules(app, store=store).pause("a-paused", reason="", by="ops")
    clocks.advance(1)
    opened = lambda _app: (Settings.from_app(app), store)   # noqa: E731
    monkeypatch.setattr(cli_status, "_open", opened)
    monkeypatch.setattr(cli_rules, "_open", opened)
    monkeypatch.setattr(store, "close", lambda: None)
    code, out, _ = run_in_process(cli_rules.overdue, app, capsys=capsys)
    assert code == 0 and out.splitlines()[-1] == "check --overdue: no entry overdue (3 entries, 3 warnings)", out

    clocks.advance(EVERY_S + JITTER_S + MAX_LATE_S)
    code, out, _ = run_in_process(cli_rules.overdue, app, capsys=capsys)
    assert code == 5, out
    assert ("OVERDUE  e10: its newest due slot 2023-11-14T22:13:30.000+00:00 has no record, 1 s "
            "past its deadline 2023-11-14T22:13:36.000+00:00 (slot + jitter + max_late)") in out
    assert out.splitlines()[-1] == "check --overdue: 1 entry overdue (3 entries, 2 warnings)", out

    code, text, _ = run_in_process(cli_status.status, app, 5, False, capsys=capsys)
    assert code == 0
    assert "overdue entries: 1\n  e10: its newest due slot" in text
    row = next(line for line in text.splitlines() if line.startswith("e10 "))
    assert "overdue; nothing sends it (no live beat)" in row
    data = overview(app, store, Settings.from_app(app))
    page = render_page(data)
    assert '<span class="state st-bad">overdue</span>' in page
    assert "has no record, 1.0 s past its deadline" in page
    assert "nothing sends it: no live beat instance" in page
    shown = entries_page(data["entries"])
    # overdue first among those needing attention, before a paused entry that sorts first by name
    assert [(e["name"], why) for e, why in shown["entries"][:2]] == [("e10", "overdue"),
                                                                    ("a-paused", "paused")]


def test_check_overdue_exits_1_when_the_store_cannot_be_read(capsys):
    from celery_anarchon.operate.cli import rules as cli_rules
    app = _app(anarchon_store_url="postgresql://postgres:secret@127.0.0.1:1/test")
    code, out, err = run_in_process(cli_rules.overdue, app, capsys=capsys)
    assert code == 1 and "store unreachable" in out and "secret" not in out + err


@pytest.mark.parametrize("runs", [0, 5])
def test_status_runs_0_still_tells_the_due_slot(runs):
    clocks = Clocks()
    store = memory_store(clocks)
    app = _app()
    store.prepare(["e10"])
    store.history.record("e10", T0_MS, RunEvent.SENT)
    clocks.advance(EVERY_S + JITTER_S + MAX_LATE_S)
    data = overview(app, store, Settings.from_app(app), runs=runs)
    row = {e["name"]: e for e in data["entries"]}["e10"]
    assert row["state"] == "overdue" and len(row["runs"]) == min(runs, 1)
