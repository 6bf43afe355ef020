"""A real Celery project for the runtime-schedule tests (tests/operate/test_schedules_cluster.py) and the
propagation benchmark (benchmarks/schedules_sync.py), configured by environment variables.

ANARCHON_SC_BROKER, ANARCHON_SC_STORE, ANARCHON_SC_NAMESPACE, ANARCHON_SC_QUEUE (required);
ANARCHON_SC_OUT (a JSON-lines file the worker appends one line to per executed task);
ANARCHON_SC_STORE_OPTIONS (JSON); ANARCHON_SC_SYNC_INTERVAL and ANARCHON_SC_MAX_LATE (seconds;
unset: the defaults of celery_anarchon); the config (``beat_schedule``) entries:
ANARCHON_SC_CLOCK (seconds: an entry ``clock`` of that period, the tests' pacemaker) and
ANARCHON_SC_DRIFT_EVERY (seconds: an entry ``drift`` of that period; two hosts given two values
run two definitions of one entry, as in a rolling deploy); ANARCHON_SC_ENTRIES (JSON: more
entries, name -> period in seconds).

The test process builds the same app with :func:`make_app` (its ``schedules(app)`` writes to the
beats' store); ``celery -A schedules_app`` finds :data:`app`, built from ``os.environ``.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping

from celery import Celery

import celery_anarchon

#: the task every entry of these tests runs (registered on each app built here, and only there:
#: a shared task would join every app of the test process)
TASK = "schedules_app.record"


def record(self, **kwargs):
    """Append what ran (entry, slot, sender, kwargs) and when to ``ANARCHON_SC_OUT``."""
    headers = self.request.headers or {}
    line = json.dumps({
        "entry": headers.get("anarchon_entry"),
        "slot": headers.get("anarchon_slot"),
        "instance": headers.get("anarchon_instance"),
        "task_id": self.request.id,
        "kwargs": kwargs,
        "scheduled_at": celery_anarchon.scheduled_at(self.request).isoformat(),
        "executed_at": time.time(),
    }) + "\n"
    fd = os.open(os.environ["ANARCHON_SC_OUT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def config_schedule(env: Mapping[str, str]) -> dict:
    """The ``beat_schedule`` the variables ask for (see the module docstring)."""
    schedule = {}
    if env.get("ANARCHON_SC_CLOCK"):
        schedule["clock"] = {"task": TASK, "schedule": float(env["ANARCHON_SC_CLOCK"])}
    if env.get("ANARCHON_SC_DRIFT_EVERY"):
        schedule["drift"] = {"task": TASK, "schedule": float(env["ANARCHON_SC_DRIFT_EVERY"])}
    for name, period in json.loads(env.get("ANARCHON_SC_ENTRIES") or "{}").items():
        schedule[name] = {"task": TASK, "schedule": float(period)}
    return schedule


def make_app(env: Mapping[str, str]) -> Celery:
    """The Celery app of these variables.

    :raises KeyError: a required variable is missing.
    """
    app = Celery("schedules_app")
    app.conf.update(
        broker_url=env["ANARCHON_SC_BROKER"],
        task_default_queue=env["ANARCHON_SC_QUEUE"],
        beat_scheduler="celery_anarchon:Scheduler",
        anarchon_store_url=env["ANARCHON_SC_STORE"],
        anarchon_namespace=env["ANARCHON_SC_NAMESPACE"],
        anarchon_store_options=json.loads(env.get("ANARCHON_SC_STORE_OPTIONS") or "{}"),
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        beat_schedule=config_schedule(env),
    )
    for variable, setting in (("ANARCHON_SC_SYNC_INTERVAL", "anarchon_sync_interval"),
                              ("ANARCHON_SC_MAX_LATE", "anarchon_max_late")):
        if env.get(variable):
            app.conf[setting] = float(env[variable])
    app.task(bind=True, name=TASK, shared=False)(record)
    return app


#: ``celery -A schedules_app`` (the test process imports this module without the variables)
app = make_app(os.environ) if "ANARCHON_SC_STORE" in os.environ else None
