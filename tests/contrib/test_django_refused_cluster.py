"""Two real ``celery beat -S celery_anarchon.contrib.django_celery_beat:Scheduler`` and a worker (a
SQLite store, the sandbox's Redis as the broker, the rows in the test process's migrated
database): a row our rules refuse (an unsafe jitter, a crontab step larger than its field) is
left out with an error naming the row, its id and the fix, while the other rows run, each run
once; ``celery anarchon status`` (another process) shows every refused row with its error and the
instances that left it out (``--json``: ``refused``), until the row is fixed in the database."""
from __future__ import annotations

import collections
import json
import subprocess
import sys

from django_project import django_db, rows  # noqa: F401  (fixtures; Django configured)
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

from broker_reads import queued_messages
from cluster import APPS, Cluster, read_executions
from conftest import REDIS_URL, require_server
from schedules_cluster import Run, cluster_env, store_in_service
from stores_support import store_url

sys.path.insert(0, APPS)
import schedules_app  # noqa: E402  (tests/support/apps: the task djbeat_app's processes run)

SCHEDULER = "celery_anarchon.contrib.django_celery_beat:Scheduler"
#: the beats' anarchon_sync_interval (their polls of the rows and their heartbeats), seconds
SYNC_S = 1.0
#: the slack of a wait (start-up, the worker, two busy cores); no verdict depends on it
SLACK_S = 30.0
BEATS = ("beat-a", "beat-b")
READ = "django-celery-beat PeriodicTask rows"


def status(cluster: Cluster, *args: str) -> str:
    """``celery -A djbeat_app anarchon status ARGS`` in the beats' environment: its output.

    :raises AssertionError: it exited non-zero."""
    done = subprocess.run([sys.executable, "-m", "celery", "-A", "djbeat_app", "anarchon",
                           "status", *args], env=cluster.environment(), cwd=cluster.workdir,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_refused_row_is_left_out_named_by_id_and_shown_in_status(rows, tmp_path, namespace):
    require_server(REDIS_URL, "Redis (the broker)")
    url = store_url("sqlite", str(tmp_path))
    out = str(tmp_path / "executions.jsonl")
    env = cluster_env("sqlite", url, namespace, out, ANARCHON_SC_SYNC_INTERVAL=str(SYNC_S),
                      ANARCHON_DJ_DB=rows)
    store = store_in_service("sqlite", url, namespace, ["good", "jumpy", "every-2h"])
    task = schedules_app.TASK
    every = IntervalSchedule.objects.create(every=1, period="seconds")
    PeriodicTask.objects.create(name="good", task=task, interval=every)
    jumpy = PeriodicTask.objects.create(name="jumpy", task=task, interval=every,
                                        headers='{"anarchon": {"jitter": 0.8}}')
    cron = PeriodicTask.objects.create(name="every-2h", task=task,
                                       crontab=CrontabSchedule.objects.create(minute="*/120"))
    cluster = Cluster(str(tmp_path), env, app="djbeat_app")
    run = Run(cluster, out, BEATS)
    try:
        cluster.worker("worker")
        for name in BEATS:
            cluster.beat(name, "-S", SCHEDULER)
        cluster.wait_log("worker", "ready.", timeout=60)
        run.wait(lambda: len(run.runs("good")) >= 3, SLACK_S, "three runs of good")
        run.phase("start")

        for name in BEATS:
            log = cluster.text(name)
            assert f"PeriodicTask 'jumpy' (id {jumpy.pk}) is left out: " in log, log[-3000:]
            line = next(x for x in log.splitlines() if f"(id {jumpy.pk}) is left out" in x)
            assert "jitter 0.8 s" in line and "Fix:" in line and '{"anarchon"' in line, line
            assert line.endswith("(the others run)"), line
            line = next(x for x in log.splitlines() if f"(id {cron.pk}) is left out" in x)
            assert "PeriodicTask 'every-2h'" in line and "*/120" in line and "fix:" in line, line
        text = status(cluster)
        assert "entries left out by beat, not run (our rules refuse them; the others run): 2" \
            in text, text
        for row in (jumpy, cron):
            listed = [x for x in text.splitlines() if f"(id {row.pk}) is left out" in x]
            assert len(listed) == 1 and listed[0].startswith(f"  {row.name}: "), text
            assert all(f":{cluster.procs[b].pid}" in listed[0] for b in BEATS), listed
        data = json.loads(status(cluster, "--json"))
        refused = {r["entry"]: r for r in data["refused"]}
        assert set(refused) == {"jumpy", "every-2h"}, data["refused"]
        assert f"(id {jumpy.pk})" in refused["jumpy"]["error"]
        assert len(refused["jumpy"]["instances"]) == len(BEATS)
        run.phase("status")

        jumpy.headers = '{"anarchon": {"jitter": 0.2}}'       # fixed in the admin
        jumpy.save()
        run.wait(lambda: len(run.runs("jumpy")) >= 2, 2 * SYNC_S + SLACK_S,
                 "two runs of the fixed row")
        run.wait(lambda: {r["entry"] for r in json.loads(status(cluster, "--json"))["refused"]}
                 == {"every-2h"}, 2 * SYNC_S + SLACK_S, "status to drop the fixed row")
        run.phase("fixed")

        for name in BEATS:
            cluster.stop(name)
        sent = sum(cluster.text(b).count("Sending due task") for b in BEATS)
        run.wait(lambda: len(read_executions(out)) >= sent and not queued_messages(
            f"sc-{namespace}"), SLACK_S, f"the worker to execute the {sent} runs sent")
        cluster.stop("worker")
        run.phase("drain")
        executed = read_executions(out)
        assert len(executed) == sent
        twice = {k: n for k, n in collections.Counter(
            (x["entry"], x["slot"]) for x in executed).items() if n > 1}
        assert not twice, f"sent more than once: {twice}"
        assert not run.runs("every-2h")
        print(f"runs: {collections.Counter(x['entry'] for x in executed)}; costs (s): "
              f"{ {k: round(v, 1) for k, v in run.costs.items()} }")
    finally:
        store.close()
        cluster.stop_all()
