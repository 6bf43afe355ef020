"""The Celery project of the takeover benchmark (benchmarks/takeover_bound.py); beats and the worker
load it.

One leased entry, ``TB_ENTRY``, running ``takeover_app.hold`` every ``TB_EVERY`` seconds from
``TB_ANCHOR`` (epoch seconds) on queue ``TB_QUEUE``, under the lease terms ``TB_LEASE`` (JSON:
duration, heartbeat, ...). Its first attempt holds the run for ``TB_HOLD`` seconds (the benchmark
kills it long before); a later attempt (a takeover's) ends after ``TB_HOLD_LATER`` seconds, so the
next slot finds the run finished. Each execution appends one JSON line per event (``start``,
``end``, ``lost``) to ``TB_OUT``: entry, slot, attempt, token, pid, task id, epoch time.

TB_BROKER       the broker URL (no result backend: results are ignored)
TB_STORE        ``anarchon_store_url``; TB_STORE_OPTIONS (JSON) ``anarchon_store_options``
TB_NAMESPACE    ``anarchon_namespace``
"""
import json
import os
import time

from celery import Celery

import celery_anarchon
from procs import append_record   # benchmarks/ is on the processes' PYTHONPATH

ENTRY = os.environ.get("TB_ENTRY", "held")
app = Celery("takeover_app")
app.conf.update(
    broker_url=os.environ["TB_BROKER"],
    beat_scheduler="celery_anarchon:Scheduler",
    anarchon_store_url=os.environ["TB_STORE"],
    anarchon_store_options=json.loads(os.environ.get("TB_STORE_OPTIONS", "{}")),
    anarchon_namespace=os.environ["TB_NAMESPACE"],
    beat_schedule={ENTRY: {
        "task": "takeover_app.hold", "schedule": float(os.environ.get("TB_EVERY", "3600")),
        "options": {"queue": os.environ["TB_QUEUE"],
                    "anarchon": {"anchor": int(os.environ["TB_ANCHOR"]),
                                 "lease": json.loads(os.environ["TB_LEASE"])}},
    }},
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
celery_anarchon.install(app)


def note(task, event: str) -> None:
    """Append one event of this execution to ``TB_OUT``."""
    lease = celery_anarchon.current_lease()
    headers = task.request.headers or {}
    append_record(os.environ["TB_OUT"], {
        "event": event, "entry": headers.get("anarchon_entry"), "slot": headers.get("anarchon_slot"),
        "attempt": lease.attempt if lease else headers.get("anarchon_attempt"),
        "token": lease.token if lease else None, "pid": os.getpid(), "task_id": task.request.id,
        "time": time.time()})


@app.task(bind=True)
def hold(self):
    """Hold the run (``TB_HOLD`` s for attempt 1, ``TB_HOLD_LATER`` s for a later one), checking
    the lease as docs/leases.md "Inside the task" shows."""
    note(self, "start")
    lease = celery_anarchon.current_lease()
    first = lease is None or lease.attempt == 1
    deadline = time.time() + float(os.environ.get("TB_HOLD" if first else "TB_HOLD_LATER", "1"))
    try:
        while time.time() < deadline:
            time.sleep(0.05)
            if lease is not None:
                lease.check()
    except celery_anarchon.LeaseLost:
        note(self, "lost")
        return "lost"
    note(self, "end")
    return "done"
