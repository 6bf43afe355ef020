"""Two real ``celery beat -S celery_anarchon.contrib.django_celery_beat:Scheduler`` and a worker
(tests/support/django_cluster.py): a row disabled through the admin's "Disable" action is never
sent by any instance from the moment the action returned, although no instance reads the rows
again within the test (their sync interval is a minute): the pause is checked inside the claim.
The other row runs on. With a short sync interval, the beats read the disabled row again and keep
it held: each slot its pause holds is recorded paused in the history, none is sent.
The verdict is made once the beats stopped and the worker executed everything the broker held."""
from __future__ import annotations

import time

from django_project import django_db, rows  # noqa: F401  (fixtures; Django configured)
from django.urls import reverse
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from celery_anarchon.stores.base import RunEvent

from django_cluster import READ, TASK, RowCluster, admin_client, web_app

#: the beats' anarchon_sync_interval: longer than the test, so no beat reads the rows again
SYNC_S = 60.0
#: the slack of a wait (start-up, the worker, two busy cores); no verdict depends on it
SLACK_S = 30.0
BEATS = ("beat-a", "beat-b")


def _cluster(rows, tmp_path, namespace, sync_s: float) -> tuple[RowCluster, PeriodicTask]:
    """Two beats (not started yet), the rows "fast" and "steady" every second."""
    rig = RowCluster(rows, tmp_path, namespace, BEATS, ["fast", "steady"],
                     ANARCHON_SC_SYNC_INTERVAL=str(sync_s))
    every = IntervalSchedule.objects.create(every=1, period="seconds")
    fast = PeriodicTask.objects.create(name="fast", task=TASK, interval=every)
    PeriodicTask.objects.create(name="steady", task=TASK, interval=every)
    return rig, fast


def _disable(rig: RowCluster, row: PeriodicTask) -> int:
    """The admin's "Disable" of ``row`` in the web process; returns when it returned, UTC ms."""
    with web_app(rig.env):
        response = admin_client().post(
            reverse("admin:django_celery_beat_periodictask_changelist"),
            {"action": "disable_tasks", "_selected_action": [row.pk]})
    assert response.status_code == 302
    return int(time.time() * 1000)


def test_a_row_disabled_in_the_admin_is_sent_by_no_instance_from_then_on(rows, tmp_path,
                                                                         namespace):
    rig, fast = _cluster(rows, tmp_path, namespace, SYNC_S)
    run, cluster = rig.run, rig.cluster
    try:
        rig.start()
        run.wait(lambda: len(run.runs("fast")) >= 2, SLACK_S, "two runs of fast")
        reads = {b: cluster.text(b).count(READ) for b in BEATS}
        run.phase("start")

        returned_ms = _disable(rig, fast)
        run.wait(lambda: len([x for x in run.runs("steady") if x["slot"] > returned_ms + 3000]),
                 3 + SLACK_S, "three more runs of steady")
        run.phase("disabled")
        for name in BEATS:
            cluster.stop(name)
        assert {b: cluster.text(b).count(READ) for b in BEATS} == reads, "a beat read the rows"
        rig.drain(SLACK_S)

        fast_slots = [x["slot"] for x in run.runs("fast")]
        assert fast_slots and not [s for s in fast_slots if s > returned_ms], fast_slots
        steady = [x["slot"] for x in run.runs("steady")]
        assert len(steady) == len(set(steady))                      # each run once
        print(f"fast: {len(fast_slots)} runs, steady: {len(steady)}; costs (s): "
              f"{ {k: round(v, 1) for k, v in run.costs.items()} }")
    finally:
        rig.close()


def test_a_row_disabled_in_the_admin_records_each_slot_its_pause_holds(rows, tmp_path,
                                                                       namespace):
    rig, fast = _cluster(rows, tmp_path, namespace, 1.0)
    run, cluster = rig.run, rig.cluster
    try:
        rig.start()
        run.wait(lambda: len(run.runs("fast")) >= 2, SLACK_S, "two runs of fast")
        reads = {b: cluster.text(b).count(READ) for b in BEATS}
        returned_ms = _disable(rig, fast)
        run.wait(lambda: all(cluster.text(b).count(READ) > reads[b] for b in BEATS), SLACK_S,
                 "every beat to read the rows again")
        read_ms = int(time.time() * 1000)
        run.wait(lambda: len([x for x in run.runs("steady") if x["slot"] > read_ms + 3000]),
                 4 + SLACK_S, "three more runs of steady")
        run.phase("disabled, read again")
        rig.drain(SLACK_S)

        assert not [x["slot"] for x in run.runs("fast") if x["slot"] > returned_ms]
        history = {r.slot_ms: r for r in rig.store.history.read("fast")}
        after = {slot: r.event for slot, r in history.items() if slot > returned_ms}
        assert set(after.values()) == {RunEvent.PAUSED}, after
        held = sorted(slot for slot in after if slot > read_ms)
        assert held and held == list(range(held[0], held[-1] + 1, 1000)), held  # every slot
        assert len(held) >= 3, held
        print(f"fast: {len(after)} slots recorded paused after the disable, {len(held)} of them "
              f"after the beats read the rows again; costs (s): "
              f"{ {k: round(v, 1) for k, v in run.costs.items()} }")
    finally:
        rig.close()
