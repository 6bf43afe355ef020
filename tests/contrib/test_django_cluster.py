"""Three real ``celery beat -S celery_anarchon.contrib.django_celery_beat:Scheduler`` and a worker
on a SQLite store (a temp dir), the sandbox's Redis as the broker, and django-celery-beat's rows
in the test process's migrated SQLite database (tests/support/django_project.py), written through
the ORM while the beats run: a row created, edited, disabled and deleted, a one-off row and a
clocked row. Every run is sent exactly once; the one-off and the clocked row run once (the
clocked one at its instant, microseconds cut to its whole millisecond); each row's total_run_count is the number of its runs sent, not
three times it, and last_run_at is set by those sends; the instances reading an edit a poll
apart log no disagreement.

The verdict is made once the beats stopped and the worker executed everything the broker held."""
from __future__ import annotations

import collections
import datetime
import math
import os
import subprocess
import sys
import time

from django_project import django_db, rows  # noqa: F401  (fixtures; Django configured)
from django_celery_beat.models import ClockedSchedule, IntervalSchedule, PeriodicTask

from cluster import APPS
from django_cluster import READ, SCHEDULER, TASK, RowCluster
from schedules_cluster import cluster_env

#: anarchon_sync_interval of the beats (how often they poll PeriodicTasks.last_change()), s
SYNC_S = 1.0
#: anarchon_max_late of the beats, seconds
MAX_LATE_S = 5.0
#: the slack of a wait past what the design allows (ticks, the worker, two busy cores); a wait
#: ends as soon as its condition holds, no verdict depends on it
SLACK_S = 20.0
BEATS = ("beat-a", "beat-b", "beat-c")
ENTRIES = ["steady", "added", "once", "clocked"]


def every(n: int) -> IntervalSchedule:
    return IntervalSchedule.objects.create(every=n, period="seconds")


def test_rows_changed_through_the_orm_run_exactly_once_on_three_beats(rows, tmp_path, namespace):
    rig = RowCluster(rows, tmp_path, namespace, BEATS, ENTRIES,
                     ANARCHON_SC_SYNC_INTERVAL=str(SYNC_S), ANARCHON_SC_MAX_LATE=str(MAX_LATE_S))
    run, cluster, task = rig.run, rig.cluster, TASK
    PeriodicTask.objects.create(name="steady", task=task, interval=every(2))

    def all_read_again() -> float:
        """Wait until every beat read the rows twice since now (the first read may come
        between django-celery-beat's change note and the row's write); when, epoch seconds."""
        before = {b: cluster.text(b).count(READ) for b in BEATS}
        run.wait(lambda: all(cluster.text(b).count(READ) >= before[b] + 2 for b in BEATS),
                 2 * SYNC_S + SLACK_S, "every beat to read the changed rows")
        return time.time()

    try:
        rig.start()
        for name in BEATS:
            cluster.wait_log(name, READ, timeout=60)
        run.wait(lambda: len(run.runs("steady")) >= 2, 4 + SLACK_S, "two runs of steady")
        run.phase("start")

        # created: a 1-s row, a one-off row and a clocked row a few seconds ahead
        PeriodicTask.objects.create(name="added", task=task, interval=every(1),
                                    kwargs='{"n": 1}')
        PeriodicTask.objects.create(name="once", task=task, interval=every(3), one_off=True)
        # with microseconds, as timezone.now() + timedelta(...) gives: its slot is the whole ms
        clocked_ms = (math.ceil(time.time()) + 5) * 1000 + 123
        at = datetime.datetime.fromtimestamp(clocked_ms // 1000, datetime.timezone.utc).replace(
            microsecond=123_456)
        PeriodicTask.objects.create(name="clocked", task=task, one_off=True,
                                    clocked=ClockedSchedule.objects.create(clocked_time=at))
        all_read_again()
        run.wait(lambda: len(run.runs("added")) >= 3, 3 + SLACK_S, "three runs of added")
        run.wait(lambda: run.runs("clocked") and run.runs("once"),
                 (clocked_ms / 1000 - time.time()) + MAX_LATE_S + SLACK_S,
                 "the runs of the clocked and the one-off rows")
        run.phase("created")

        # edited: steady every 3 s from now on
        steady = PeriodicTask.objects.get(name="steady")
        steady.interval = every(3)
        steady.save(update_fields=["interval"])    # the counts are the beats' to write
        edited_s = all_read_again()
        run.wait(lambda: [x for x in run.runs("steady") if x["slot"] > edited_s * 1000 + 3000],
                 6 + SLACK_S, "a run of steady on its new period")
        run.phase("edited")

        # disabled, then deleted
        added = PeriodicTask.objects.get(name="added")
        added.enabled = False
        added.save(update_fields=["enabled"])
        disabled_s = all_read_again()
        PeriodicTask.objects.get(name="steady").delete()
        deleted_s = all_read_again()
        run.phase("disabled, deleted")

        executed = rig.drain(SLACK_S)
        twice = {k: n for k, n in collections.Counter(
            (x["entry"], x["slot"]) for x in executed).items() if n > 1}
        assert not twice, f"sent more than once: {twice}"
        by_entry = collections.defaultdict(list)
        for x in executed:
            by_entry[x["entry"]].append(x["slot"])
        assert by_entry["clocked"] == [clocked_ms]
        assert len(by_entry["once"]) == 1 and by_entry["once"][0] % 3000 == 0
        assert all(s % 3000 == 0 for s in by_entry["steady"] if s > edited_s * 1000)
        assert not [s for s in by_entry["steady"] if s > deleted_s * 1000], "ran after deletion"
        assert not [s for s in by_entry["added"] if s > disabled_s * 1000], "ran once disabled"
        assert all(x["kwargs"] == {"n": 1} for x in executed if x["entry"] == "added")
        for name in ("once", "clocked", "added"):
            row = PeriodicTask.objects.get(name=name)
            assert row.total_run_count == len(by_entry[name]), (name, row.total_run_count)
            if name != "added":       # disabling a row in the admin clears its last_run_at
                assert not row.enabled and row.last_run_at is not None
        for name in BEATS:       # a poll or two apart is no disagreement worth an error
            assert "instances disagree" not in cluster.text(name), cluster.text(name)[-3000:]
        print(f"runs: { {k: len(v) for k, v in by_entry.items()} }; costs (s): "
              f"{ {k: round(v, 1) for k, v in run.costs.items()} }")
    finally:
        rig.close()


def test_beat_without_django_set_up_says_so_and_exits(tmp_path):
    """A beat whose app never set DJANGO_SETTINGS_MODULE stops at start-up with one error that
    names the setting and the fix (not a traceback at every tick)."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(cluster_env("sqlite", f"sqlite:///{tmp_path / 'claims.sqlite3'}", "nodjango",
                           str(tmp_path / "out.jsonl")), ANARCHON_SC_BROKER="memory://",
               PYTHONPATH=os.pathsep.join(filter(None, [APPS, env.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-m", "celery", "-A", "schedules_app", "beat", "-S",
                           SCHEDULER, "--schedule", str(tmp_path / "unused")], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "anarchon: beat cannot start" in output and "DJANGO_SETTINGS_MODULE" in output, output
    assert "Traceback" not in output, output
