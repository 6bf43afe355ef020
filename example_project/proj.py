"""An ordinary Celery project that uses celery_anarchon.

Run ``celery -A proj beat`` next to every ``celery -A proj worker`` (as many as you like):
each run below is sent exactly once. With no server at all, the broker is kombu's SQLAlchemy
transport on a SQLite file and the claims go to the embedded SQLite store beside it (one host).
Point it at shared servers with environment variables::

    ANARCHON_DEMO_BROKER=redis://127.0.0.1:6379/0 ANARCHON_DEMO_STORE=redis://127.0.0.1:6379/1
    ANARCHON_DEMO_STORE=postgresql://postgres@127.0.0.1/test
"""
import json
import os
import time

from celery import Celery
from celery.schedules import crontab

import celery_anarchon

HERE = os.environ.get("ANARCHON_DEMO_DIR", os.path.dirname(os.path.abspath(__file__)))

app = Celery("proj")
app.conf.update(
    broker_url=os.environ.get("ANARCHON_DEMO_BROKER", f"sqla+sqlite:///{HERE}/broker.sqlite3"),
    broker_connection_retry_on_startup=True,
    # the only line a Celery project needs to change:
    beat_scheduler="celery_anarchon:Scheduler",
    beat_schedule={
        "heartbeat-every-second": {"task": "proj.record", "schedule": 1.0},
        "report-every-5s": {"task": "proj.record", "schedule": 5.0, "args": ("report",)},
        "cleanup-every-minute": {"task": "proj.record", "schedule": crontab(), "args": ("cleanup",)},
        "billing-every-10s": {"task": "proj.record", "schedule": 10.0, "args": ("billing",),
                              "options": {"anarchon": {"max_late": 30}}},
    },
)
if os.environ.get("ANARCHON_DEMO_STORE"):
    app.conf.anarchon_store_url = os.environ["ANARCHON_DEMO_STORE"]


@app.task(bind=True)
def record(self, what="heartbeat"):
    """Do the 'work' and append one line per execution for the demo's live view and summary."""
    headers = self.request.headers or {}
    line = json.dumps({
        "entry": headers.get("anarchon_entry"), "slot": headers.get("anarchon_slot"),
        "instance": headers.get("anarchon_instance"), "task_id": self.request.id,
        "scheduled_at": celery_anarchon.scheduled_at(self.request).isoformat(),
        "executed_at": time.time(), "what": what,
    })
    fd = os.open(os.path.join(HERE, "executions.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
    return what
