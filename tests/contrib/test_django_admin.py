"""django-celery-beat's admin on every host (docs/from-django-celery-beat.md, "The admin"): its
Disable / Enable / Toggle actions and a save that changes ``enabled`` pause and resume the row's
entry in the store, checked inside the atomic claim, recorded with the admin user; "Run selected
tasks" is one run-now request per row and click. Django's test client drives the real admin on a
real migrated database; the store is a SQLite file of the test."""
from __future__ import annotations

import pytest
from celery import Celery
from django_project import django_db, rows  # noqa: F401  (fixtures; Django configured)
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from celery_anarchon.beat.entries import BeatEntry
from celery_anarchon.contrib.django_celery_beat import RowPlans, control
from celery_anarchon.contrib.django_celery_beat.scheduler import SCHEDULER_PATH
from celery_anarchon.settings import Settings
from celery_anarchon.contrib.django_celery_beat.admin import CLICK_FIELD
from celery_anarchon.operate.schedules import schedules
from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import Outcome

from claim_helpers import after_memory_restart, req

TASK = "proj.tasks.report"
CHANGELIST = "admin:django_celery_beat_periodictask_changelist"
BY = "ada (Django admin)"


@pytest.fixture
def app(tmp_path):
    """The project's Celery app (``current_app`` while the test runs, as ``proj/__init__.py``
    makes it), its store a SQLite file of the test."""
    from celery import _state
    before = _state.get_current_app()
    app = Celery("proj", set_as_current=False)
    app.conf.update(broker_url="memory://", anarchon_store_url=f"sqlite:///{tmp_path}/s.db",
                    beat_scheduler=SCHEDULER_PATH)
    app.set_current()
    yield app
    before.set_current()


@pytest.fixture
def admin_client(rows, app) -> Client:
    user = User.objects.filter(username="ada").first() or User.objects.create_superuser(
        "ada", "ada@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


def make_rows(*names: str) -> list[PeriodicTask]:
    every = IntervalSchedule.objects.create(every=10, period="seconds")
    return [PeriodicTask.objects.create(name=n, task=TASK, interval=every) for n in names]


def act(client: Client, action: str, rows: list[PeriodicTask], click: str | None = None):
    data = {"action": action, "_selected_action": [r.pk for r in rows], "index": 0}
    if click is not None:
        data[CLICK_FIELD] = click
    response = client.post(reverse(CHANGELIST), data)
    assert response.status_code == 302, response.content[:2000]
    return response


def pauses(app) -> dict:
    with schedules(app) as s:
        snapshot = s._snapshot()
    return {n: e.pause for n, e in snapshot.entries.items() if e.pause is not None}


def claim_outcome(app, name: str) -> Outcome:
    """What the store answers a claim of a run of ``name`` (as every instance claims), at the
    first slot a store made by this test claims."""
    store = open_store(app.conf.anarchon_store_url, namespace="proj", instance_id="other",
                       options={})
    try:
        store.prepare(())
        return store.claim([req(name, after_memory_restart(store))])[0].outcome
    finally:
        store.close()


def test_disable_pauses_each_row_in_the_claim_with_the_admin_user(admin_client, app):
    a, b, c = make_rows("a", "b", "c")
    act(admin_client, "disable_tasks", [a, b])
    held = pauses(app)
    assert sorted(held) == ["a", "b"]
    assert {p.by for p in held.values()} == {BY}
    assert held["a"].reason == control.REASON
    assert list(PeriodicTask.objects.filter(enabled=False).values_list("name", flat=True)
                .order_by("name")) == ["a", "b"]
    assert claim_outcome(app, "a") is Outcome.PAUSED      # a row entry: paused inside the claim
    assert claim_outcome(app, "c") is Outcome.WON


def test_enable_resumes_and_toggle_does_both(admin_client, app):
    a, b = make_rows("a", "b")
    act(admin_client, "disable_tasks", [a])
    act(admin_client, "enable_tasks", [a])
    assert pauses(app) == {}
    assert PeriodicTask.objects.get(name="a").enabled
    assert claim_outcome(app, "a") is Outcome.WON
    act(admin_client, "disable_tasks", [b])
    act(admin_client, "toggle_tasks", [a, b])
    assert sorted(pauses(app)) == ["a"]
    assert dict(PeriodicTask.objects.values_list("name", "enabled")) == {"a": False, "b": True}


def test_run_selected_is_one_request_per_row_and_click(admin_client, app):
    a, b = make_rows("a", "b")
    act(admin_client, "run_tasks", [a, b], click="c1")
    act(admin_client, "run_tasks", [a, b], click="c1")     # the same form submitted twice
    with schedules(app) as s:
        requests = s._snapshot().requests
    assert sorted((r.entry, r.request_id, r.by) for r in requests) == [
        ("a", "admin:c1:a", BY), ("b", "admin:c1:b", BY)]
    act(admin_client, "run_tasks", [a], click="c2")        # another click
    act(admin_client, "run_tasks", [a])                     # a POST without the form's id
    with schedules(app) as s:
        assert sorted(r.entry for r in s._snapshot().requests) == ["a", "a", "a", "b"]


def test_the_changelist_gives_each_rendering_its_own_click_id(admin_client):
    make_rows("a")
    first = admin_client.get(reverse(CHANGELIST)).content.decode()
    second = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert f'name="{CLICK_FIELD}"' in first

    def click(page: str) -> str:
        return page.split(f'name="{CLICK_FIELD}" value="', 1)[1].split('"', 1)[0]
    assert click(first) != click(second)


def test_run_selected_refuses_a_disabled_row_and_sends_nothing(admin_client, app):
    (a,) = make_rows("a")
    act(admin_client, "disable_tasks", [a])
    response = admin_client.post(reverse(CHANGELIST), {
        "action": "run_tasks", "_selected_action": [a.pk], "index": 0}, follow=True)
    assert "is not scheduled" in response.content.decode()
    with schedules(app) as s:
        assert s._snapshot().requests == ()


def test_a_save_that_changes_enabled_pauses_and_resumes(rows, app):
    (a,) = make_rows("a")
    a.description = "no change of enabled"
    a.save()
    assert pauses(app) == {}
    a.enabled = False
    with control.acting(BY):
        a.save()
    assert pauses(app)["a"].by == BY
    a.enabled = True
    a.save()                                   # autocommit: resumed at once
    assert pauses(app) == {}


def scheduled_rows(app) -> set[str]:
    """The rows an instance of our Scheduler on ``app`` schedules when it reads them now."""
    store = open_store(app.conf.anarchon_store_url, namespace="proj", instance_id="i", options={})
    try:
        plans = RowPlans(app, Settings.from_app(app), store, BeatEntry)
        plans.of_schedule({})
        return set(plans.row_names)
    finally:
        store.close()


def test_a_row_runs_only_while_enabled_and_not_paused(admin_client, app):
    """Each of the two stops a row and neither restarts what the other stopped; the Scheduler
    writes neither."""
    a, b = make_rows("a", "b")
    act(admin_client, "disable_tasks", [a, b])
    PeriodicTask.objects.filter(name="a").update(enabled=True)   # a bulk update: no signal
    assert scheduled_rows(app) == {"a"}
    assert claim_outcome(app, "a") is Outcome.PAUSED            # still paused in the store
    with schedules(app) as s:
        s.resume("b")                                            # resumed, still disabled
    assert "b" not in scheduled_rows(app)
    assert sorted(pauses(app)) == ["a"]
    assert not PeriodicTask.objects.get(name="b").enabled


def test_a_row_disabled_in_the_admin_is_held_so_its_pause_records_each_slot(admin_client,
                                                                              app):
    """A row the admin disabled (paused, then disabled) stays among the plans as held: its
    runs are never claimed, and each slot its pause holds is recorded paused (the engine:
    EntryPlan.held). A row disabled without a pause (a bulk update) is left out, as before;
    resumed while disabled, a held row is left out at the next read."""
    a, b, c = make_rows("a", "b", "c")
    act(admin_client, "disable_tasks", [a])
    PeriodicTask.objects.filter(name="b").update(enabled=False)     # no signal: not paused
    store = open_store(app.conf.anarchon_store_url, namespace="proj", instance_id="i", options={})
    try:
        plans = RowPlans(app, Settings.from_app(app), store, BeatEntry)
        plans.of_schedule({})
        plans.of_store(store.entries.load_entries())    # the engine's sync, after the first read
        built = plans._poll(force=True) and plans._rows
        assert sorted(built) == ["a", "c"]
        assert built["a"].held and not built["c"].held
        assert "a" in plans.row_names and "a" not in plans.refused
        with schedules(app) as s:
            s.resume("a")                                           # resumed, still disabled
        plans.of_store(store.entries.load_entries())
        assert plans._poll(force=True) and sorted(plans._rows) == ["c"]
    finally:
        store.close()


def test_without_our_scheduler_the_admin_is_django_celery_beats(admin_client, app):
    """A project whose app still runs django-celery-beat's scheduler (the first step of a
    rolling switch): the actions and saves write nothing to a store."""
    app.conf.beat_scheduler = "django_celery_beat.schedulers:DatabaseScheduler"
    (a,) = make_rows("a")
    act(admin_client, "disable_tasks", [a])
    assert not PeriodicTask.objects.get(name="a").enabled
    app.conf.beat_scheduler = SCHEDULER_PATH
    assert pauses(app) == {}


def test_a_row_our_rules_refuse_is_still_paused_and_resumed(admin_client, app):
    (a,) = make_rows("a")
    PeriodicTask.objects.filter(pk=a.pk).update(args="[not json")
    act(admin_client, "disable_tasks", [a])
    assert sorted(pauses(app)) == ["a"]
    act(admin_client, "enable_tasks", [a])
    assert pauses(app) == {}
