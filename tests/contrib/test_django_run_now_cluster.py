"""Three real ``celery beat -S celery_anarchon.contrib.django_celery_beat:Scheduler`` and a worker
(tests/support/django_cluster.py) and the admin's "Run selected tasks" through Django's test
client: a click (the id of the change list's form) submitted twice, then a second click, on two
rows. Each row runs exactly once per click id, claimed by one instance: never once per beat,
never once per submission.

The verdict is made once every beat synced the requests, every request's slot is past its last
moment to be claimed (slot + jitter + max_late), the beats stopped and the worker executed
everything the broker held."""
from __future__ import annotations

import collections
import re
import time

from django_project import django_db, rows  # noqa: F401  (fixtures; Django configured)
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse
from django_celery_beat.models import CrontabSchedule, PeriodicTask

from django_cluster import TASK, RowCluster, admin_client, web_app

from celery_anarchon.contrib.django_celery_beat.admin import CLICK_FIELD

CHANGELIST = "admin:django_celery_beat_periodictask_changelist"
#: the beats' anarchon_sync_interval (when they read the store's run-now requests), seconds
SYNC_S = 1.0
#: the beats' anarchon_max_late, and the longest jitter of a yearly row (its default), seconds
MAX_LATE_S, JITTER_S = 3.0, 2.0
#: the slack of a wait (start-up, the worker, two busy cores); no verdict depends on it
SLACK_S = 30.0
BEATS = ("beat-a", "beat-b", "beat-c")


def click_of(client: Client) -> str:
    """The click id of the change list's action form, as the browser would submit it."""
    page = client.get(reverse(CHANGELIST)).content.decode()
    found = re.search(rf'name="{CLICK_FIELD}" value="([0-9a-f]+)"', page)
    assert found, page[:3000]
    return found.group(1)


def run_selected(client: Client, rows: list[PeriodicTask], click: str) -> str:
    """"Run selected tasks" on ``rows`` with the click ``click``: the message shown."""
    response = client.post(reverse(CHANGELIST), {
        "action": "run_tasks", "_selected_action": [r.pk for r in rows], "index": 0,
        CLICK_FIELD: click})
    assert response.status_code == 302, response.content[:2000]
    return " ".join(str(m) for m in get_messages(response.wsgi_request))


def test_run_selected_tasks_runs_each_row_once_per_click_on_three_beats(rows, tmp_path,
                                                                       namespace):
    rig = RowCluster(rows, tmp_path, namespace, BEATS, ["report", "export"],
                     ANARCHON_SC_SYNC_INTERVAL=str(SYNC_S), ANARCHON_SC_MAX_LATE=str(MAX_LATE_S))
    run = rig.run
    yearly = CrontabSchedule.objects.create(minute="0", hour="0", day_of_month="1",
                                            month_of_year="1")        # no slot within the test
    chosen = [PeriodicTask.objects.create(name=n, task=TASK, crontab=yearly)
              for n in ("report", "export")]
    client = admin_client()
    try:
        with web_app(rig.env):
            rig.start()
            run.synced(0, timeout=SLACK_S)
            run.phase("start")

            first = click_of(client)
            assert "2 run-now requests made (0 made before" in run_selected(client, chosen, first)
            assert "0 run-now requests made (2 made before" in run_selected(client, chosen, first)
            second = click_of(client)
            assert second != first
            assert "2 run-now requests made" in run_selected(client, chosen, second)
        snapshot = rig.store.entries.load_entries()
        slots = {(r.entry, r.request_id): r.slot_ms for r in snapshot.requests}
        assert set(slots) == {(n, f"admin:{c}:{n}") for n in ("report", "export")
                              for c in (first, second)}
        assert {r.by for r in snapshot.requests} == {"ada (Django admin)"}
        run.synced(snapshot.version, timeout=2 * SYNC_S + SLACK_S)
        run.wait(lambda: len(run.runs("report") + run.runs("export")) >= 4, SLACK_S,
                 "the four runs")
        last_ms = max(slots.values()) + (JITTER_S + MAX_LATE_S) * 1000
        run.wait(lambda: time.time() * 1000 > last_ms, (last_ms / 1000 - time.time()) + SLACK_S,
                 "every request past its last moment to be claimed")
        run.phase("clicks")

        executed = rig.drain(SLACK_S)
        runs = collections.Counter((x["entry"], x["slot"]) for x in executed)
        assert runs == collections.Counter({(n, s): 1 for (n, _), s in slots.items()}), \
            (runs, slots)
        senders = collections.Counter(x["instance"] for x in executed)
        print(f"runs by instance: {dict(senders)}; costs (s): "
              f"{ {k: round(v, 1) for k, v in run.costs.items()} }")
    finally:
        rig.close()
