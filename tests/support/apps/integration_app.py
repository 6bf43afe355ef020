"""A real Celery project for the multi-process tests, configured by environment variables.

ANARCHON_IT_BROKER, ANARCHON_IT_STORE, ANARCHON_IT_NAMESPACE, ANARCHON_IT_QUEUE, ANARCHON_IT_OUT
(a JSON-lines file the worker appends one line to per executed task); optional:
ANARCHON_IT_ENTRIES (JSON: name -> interval, seconds), ANARCHON_IT_ENTRY_OPTIONS (JSON: the
``options['anarchon']`` of each of those entries), ANARCHON_IT_MAX_LATE, ANARCHON_IT_JITTER,
ANARCHON_IT_SYNC (anarchon_sync_interval), and per beat ANARCHON_METRICS_PORT.
"""
import json
import os
import time

from celery import Celery
from celery.schedules import crontab

import celery_anarchon

app = Celery("integration_app")
app.conf.update(
    broker_url=os.environ["ANARCHON_IT_BROKER"],
    task_default_queue=os.environ["ANARCHON_IT_QUEUE"],
    beat_scheduler="celery_anarchon:Scheduler",
    anarchon_store_url=os.environ["ANARCHON_IT_STORE"],
    anarchon_namespace=os.environ["ANARCHON_IT_NAMESPACE"],
    anarchon_store_options=json.loads(os.environ.get("ANARCHON_IT_STORE_OPTIONS", "{}")),
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    beat_schedule={
        "every-1s": {"task": "integration_app.record", "schedule": 1.0},
        "every-2s": {"task": "integration_app.record", "schedule": 2.0},
        "every-5s": {"task": "integration_app.record", "schedule": 5.0},
        "every-minute": {"task": "integration_app.record", "schedule": crontab()},
    },
)
if os.environ.get("ANARCHON_IT_ENTRIES"):      # name -> interval in seconds
    _ours = json.loads(os.environ.get("ANARCHON_IT_ENTRY_OPTIONS", "{}"))
    app.conf.beat_schedule = {name: {"task": "integration_app.record", "schedule": float(every),
                                     "options": {"anarchon": _ours}}
                              for name, every in json.loads(os.environ["ANARCHON_IT_ENTRIES"]).items()}
if os.environ.get("ANARCHON_IT_MAX_LATE"):
    app.conf.anarchon_max_late = float(os.environ["ANARCHON_IT_MAX_LATE"])
if os.environ.get("ANARCHON_IT_JITTER"):
    app.conf.anarchon_jitter = float(os.environ["ANARCHON_IT_JITTER"])
if os.environ.get("ANARCHON_IT_SYNC"):
    app.conf.anarchon_sync_interval = float(os.environ["ANARCHON_IT_SYNC"])
if os.environ.get("ANARCHON_METRICS_PORT"):
    app.conf.anarchon_metrics_port = int(os.environ["ANARCHON_METRICS_PORT"])


@app.task(bind=True)
def record(self):
    """Append what ran, when, and who sent it."""
    headers = self.request.headers or {}
    line = json.dumps({
        "namespace": headers.get("anarchon_namespace"),
        "entry": headers.get("anarchon_entry"),
        "slot": headers.get("anarchon_slot"),
        "instance": headers.get("anarchon_instance"),
        "attempt": headers.get("anarchon_attempt"),
        "task_id": self.request.id,
        "scheduled_at": celery_anarchon.scheduled_at(self.request).isoformat(),
        "executed_at": time.time(),
    }) + "\n"
    fd = os.open(os.environ["ANARCHON_IT_OUT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
