"""The rig of the multi-process tests of tests/contrib: real ``celery beat -S
celery_anarchon.contrib.django_celery_beat:Scheduler`` processes and a worker of djbeat_app
(tests/support/apps) on a SQLite store in the test's folder, the sandbox's Redis as the broker,
the rows in the test process's migrated database (django_project.py); the web process's app, for
the admin driven through Django's test client; and the drain that ends each such test."""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from broker_reads import queued_messages
from cluster import APPS, Cluster, read_executions
from conftest import REDIS_URL, require_server
from schedules_cluster import Run, cluster_env, store_in_service
from stores_support import store_url

sys.path.insert(0, APPS)
import schedules_app  # noqa: E402  (tests/support/apps: the task djbeat_app's processes run)

#: the scheduler every beat is started with (``-S``)
SCHEDULER = "celery_anarchon.contrib.django_celery_beat:Scheduler"
#: the task of every row
TASK = schedules_app.TASK
#: a beat's log line each time it read the rows
READ = "django-celery-beat PeriodicTask rows"


class RowCluster:
    """The processes of one test (not started yet), its store (for the test process: its
    memory began two minutes ago) and its executions file.

    :param db: the Django database (the ``rows`` fixture's).
    :param tmp_path: the test's folder (the store, the logs, the executions).
    :param namespace: the test's namespace.
    :param beats: the names of the beats.
    :param entries: the names whose store memory is backdated (a new store refuses the slots of
        its first 10 s).
    :param settings: more ``ANARCHON_SC_*`` variables (sync interval, max_late).
    """

    def __init__(self, db: str, tmp_path, namespace: str, beats: tuple[str, ...],
                 entries: list[str], **settings: str) -> None:
        require_server(REDIS_URL, "Redis (the broker)")
        self.namespace, self.beats = namespace, beats
        url = store_url("sqlite", str(tmp_path))
        self.out = str(tmp_path / "executions.jsonl")
        self.env = cluster_env("sqlite", url, namespace, self.out, ANARCHON_DJ_DB=db,
                               **settings)
        self.store = store_in_service("sqlite", url, namespace, entries)
        self.cluster = Cluster(str(tmp_path), self.env, app="djbeat_app")
        self.run = Run(self.cluster, self.out, beats)

    def start(self) -> None:
        """Start the worker and the beats; return once the worker is ready."""
        self.cluster.worker("worker")
        for name in self.beats:
            self.cluster.beat(name, "-S", SCHEDULER)
        self.cluster.wait_log("worker", "ready.", timeout=60)

    def drain(self, timeout: float) -> list[dict]:
        """Stop the beats, wait (up to ``timeout`` s) until the worker executed every run they
        sent and the broker holds none, stop the worker.

        :returns: what the worker executed, oldest first; as many as the beats sent."""
        for name in self.beats:
            self.cluster.stop(name)
        sent = sum(self.cluster.text(b).count("Sending due task") for b in self.beats)
        self.run.wait(lambda: len(read_executions(self.out)) >= sent and not queued_messages(
            f"sc-{self.namespace}"), timeout, f"the worker to execute the {sent} runs sent")
        self.cluster.stop("worker")
        self.run.phase("drain")
        executed = read_executions(self.out)
        assert len(executed) == sent
        return executed

    def close(self) -> None:
        """Stop every process, close the store."""
        self.store.close()
        self.cluster.stop_all()


@contextlib.contextmanager
def web_app(env: dict) -> Iterator:
    """The web process's Celery app (the beats' store, our Scheduler) made current within,
    as ``proj/__init__.py`` makes the project's app: what the admin module acts on."""
    from celery import _state
    before = _state.get_current_app()
    app = schedules_app.make_app(env)
    app.conf.beat_scheduler = SCHEDULER
    app.set_current()
    try:
        yield app
    finally:
        before.set_current()


def admin_client(username: str = "ada"):
    """Django's test client logged in as a superuser ``username`` (made when missing)."""
    from django.contrib.auth.models import User
    from django.test import Client

    client = Client()
    client.force_login(User.objects.filter(username=username).first()
                       or User.objects.create_superuser(username, f"{username}@example.com",
                                                        "pw"))
    return client
