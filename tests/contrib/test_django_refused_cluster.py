"""Two real ``celery beat -S celery_anarchon.contrib.django_celery_beat:Scheduler`` and a worker
(tests/support/django_cluster.py): a row our rules refuse (an unsafe jitter, a crontab step
larger than its field) is left out with an error naming the row, its id and the fix, while the
other rows run, each run once; ``celery anarchon status`` (another process) shows every refused
row with its error and the instances that left it out (``--json``: ``refused``), until the row
is fixed in the database."""
from __future__ import annotations

import collections
import json
import subprocess
import sys

from django_project import django_db, rows  # noqa: F401  (fixtures; Django configured)
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

from django_cluster import TASK, RowCluster

#: the beats' anarchon_sync_interval (their polls of the rows and their heartbeats), seconds
SYNC_S = 1.0
#: the slack of a wait (start-up, the worker, two busy cores); no verdict depends on it
SLACK_S = 30.0
BEATS = ("beat-a", "beat-b")


def status(rig: RowCluster, *args: str) -> str:
    """``celery -A djbeat_app anarchon status ARGS`` in the beats' environment: its output.

    :raises AssertionError: it exited non-zero."""
    done = subprocess.run([sys.executable, "-m", "celery", "-A", "djbeat_app", "anarchon",
                           "status", *args], env=rig.cluster.environment(),
                          cwd=rig.cluster.workdir, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def refused_names(rig: RowCluster) -> set[str]:
    return {r["entry"] for r in json.loads(status(rig, "--json"))["refused"]}


def test_a_refused_row_is_left_out_named_by_id_and_shown_in_status(rows, tmp_path, namespace):
    rig = RowCluster(rows, tmp_path, namespace, BEATS, ["good", "jumpy", "every-2h"],
                     ANARCHON_SC_SYNC_INTERVAL=str(SYNC_S))
    run, cluster = rig.run, rig.cluster
    every = IntervalSchedule.objects.create(every=1, period="seconds")
    PeriodicTask.objects.create(name="good", task=TASK, interval=every)
    jumpy = PeriodicTask.objects.create(name="jumpy", task=TASK, interval=every,
                                        headers='{"anarchon": {"jitter": 0.8}}')
    cron = PeriodicTask.objects.create(name="every-2h", task=TASK,
                                       crontab=CrontabSchedule.objects.create(minute="*/120"))
    try:
        rig.start()
        run.wait(lambda: len(run.runs("good")) >= 3, SLACK_S, "three runs of good")
        run.phase("start")

        for name in BEATS:
            log = cluster.text(name)
            line = next(x for x in log.splitlines() if f"(id {jumpy.pk}) is left out" in x)
            assert "ERROR" in line and "PeriodicTask 'jumpy'" in line, line
            assert "jitter 0.8 s" in line and "Fix:" in line and '{"anarchon"' in line, line
            assert line.endswith("(the others run)"), line
            line = next(x for x in log.splitlines() if f"(id {cron.pk}) is left out" in x)
            assert "PeriodicTask 'every-2h'" in line and "*/120" in line and "fix:" in line, line
        text = status(rig)
        assert "entries left out by beat, not run (our rules refuse them; the others run): 2" \
            in text, text
        for row in (jumpy, cron):
            listed = [x for x in text.splitlines() if f"(id {row.pk}) is left out" in x]
            assert len(listed) == 1 and listed[0].startswith(f"  {row.name}: "), text
            assert all(f":{cluster.procs[b].pid}" in listed[0] for b in BEATS), listed
        refused = {r["entry"]: r for r in json.loads(status(rig, "--json"))["refused"]}
        assert set(refused) == {"jumpy", "every-2h"}, refused
        assert f"(id {jumpy.pk})" in refused["jumpy"]["error"]
        assert len(refused["jumpy"]["instances"]) == len(BEATS)
        run.phase("status")

        jumpy.headers = '{"anarchon": {"jitter": 0.2}}'       # fixed in the admin
        jumpy.save()
        run.wait(lambda: len(run.runs("jumpy")) >= 2, 2 * SYNC_S + SLACK_S,
                 "two runs of the fixed row")
        run.wait(lambda: refused_names(rig) == {"every-2h"}, 2 * SYNC_S + SLACK_S,
                 "status to drop the fixed row")
        run.phase("fixed")

        executed = rig.drain(SLACK_S)
        twice = {k: n for k, n in collections.Counter(
            (x["entry"], x["slot"]) for x in executed).items() if n > 1}
        assert not twice, f"sent more than once: {twice}"
        assert not run.runs("every-2h")
        print(f"runs: {collections.Counter(x['entry'] for x in executed)}; costs (s): "
              f"{ {k: round(v, 1) for k, v in run.costs.items()} }")
    finally:
        rig.close()
