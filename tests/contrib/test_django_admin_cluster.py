"""Two real ``celery beat -S celery_anarchon.contrib.django_celery_beat:Scheduler`` and a worker
(a SQLite store, the sandbox's Redis as the broker, the rows in the test process's migrated
database): a row disabled through the admin's "Disable" action is never sent by any instance
from the moment the action returned, although no instance reads the rows again within the test
(their sync interval is a minute): the pause is checked inside the claim. The other row runs on.
The verdict is made once the beats stopped and the worker executed everything the broker held."""
from __future__ import annotations

import sys
import time

from django_project import django_db, rows  # noqa: F401  (fixtures; Django configured)
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from broker_reads import queued_messages
from cluster import APPS, Cluster, read_executions
from conftest import REDIS_URL, require_server
from schedules_cluster import Run, cluster_env, store_in_service
from stores_support import store_url

sys.path.insert(0, APPS)
import schedules_app  # noqa: E402  (tests/support/apps: the task djbeat_app's processes run)

SCHEDULER = "celery_anarchon.contrib.django_celery_beat:Scheduler"
#: the beats' anarchon_sync_interval: longer than the test, so no beat reads the rows again
SYNC_S = 60.0
#: the slack of a wait (start-up, the worker, two busy cores); no verdict depends on it
SLACK_S = 30.0
BEATS = ("beat-a", "beat-b")
READ = "django-celery-beat PeriodicTask rows"


def test_a_row_disabled_in_the_admin_is_sent_by_no_instance_from_then_on(rows, tmp_path,
                                                                         namespace):
    require_server(REDIS_URL, "Redis (the broker)")
    url = store_url("sqlite", str(tmp_path))
    out = str(tmp_path / "executions.jsonl")
    env = cluster_env("sqlite", url, namespace, out, ANARCHON_SC_SYNC_INTERVAL=str(SYNC_S),
                      ANARCHON_DJ_DB=rows)
    store = store_in_service("sqlite", url, namespace, ["fast", "steady"])
    every = IntervalSchedule.objects.create(every=1, period="seconds")
    fast = PeriodicTask.objects.create(name="fast", task=schedules_app.TASK, interval=every)
    PeriodicTask.objects.create(name="steady", task=schedules_app.TASK, interval=every)
    from celery import _state
    before = _state.get_current_app()
    app = schedules_app.make_app(env)          # the web process's app: its store, our Scheduler
    app.conf.beat_scheduler = SCHEDULER
    app.set_current()
    client = Client()
    client.force_login(User.objects.filter(username="ada").first()
                       or User.objects.create_superuser("ada", "ada@example.com", "pw"))
    cluster = Cluster(str(tmp_path), env, app="djbeat_app")
    run = Run(cluster, out, BEATS)
    try:
        cluster.worker("worker")
        for name in BEATS:
            cluster.beat(name, "-S", SCHEDULER)
        cluster.wait_log("worker", "ready.", timeout=60)
        run.wait(lambda: len(run.runs("fast")) >= 2, SLACK_S, "two runs of fast")
        reads = {b: cluster.text(b).count(READ) for b in BEATS}
        run.phase("start")

        response = client.post(reverse("admin:django_celery_beat_periodictask_changelist"),
                               {"action": "disable_tasks", "_selected_action": [fast.pk]})
        assert response.status_code == 302
        returned_ms = int(time.time() * 1000)
        run.wait(lambda: len([x for x in run.runs("steady") if x["slot"] > returned_ms + 3000]),
                 3 + SLACK_S, "three more runs of steady")
        run.phase("disabled")
        for name in BEATS:
            cluster.stop(name)
        assert {b: cluster.text(b).count(READ) for b in BEATS} == reads, "a beat read the rows"
        sent = sum(cluster.text(b).count("Sending due task") for b in BEATS)
        run.wait(lambda: len(read_executions(out)) >= sent and not queued_messages(
            f"sc-{namespace}"), SLACK_S, f"the worker to execute the {sent} runs sent")
        cluster.stop("worker")
        run.phase("drain")

        fast_slots = [x["slot"] for x in run.runs("fast")]
        assert fast_slots and not [s for s in fast_slots if s > returned_ms], fast_slots
        steady = [x["slot"] for x in run.runs("steady")]
        assert len(steady) == len(set(steady))                      # each run once
        print(f"fast: {len(fast_slots)} runs, steady: {len(steady)}; costs (s): "
              f"{ {k: round(v, 1) for k, v in run.costs.items()} }")
    finally:
        before.set_current()
        store.close()
        cluster.stop_all()
