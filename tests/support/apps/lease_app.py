"""A real Celery project with leased entries, for the lease tests; configured by environment.

ANARCHON_LT_BROKER, ANARCHON_LT_BACKEND, ANARCHON_LT_STORE, ANARCHON_LT_NAMESPACE, ANARCHON_LT_OUT
(JSON lines, one per task event), ANARCHON_LT_ACKS_LATE ("1": acks_late + reject_on_worker_lost),
ANARCHON_LT_SCHEDULE (JSON: name -> {task, every, anchor, args, queue, lease}),
ANARCHON_LT_EXIT_BEFORE_SEND (an entry name: beat exits at once when its won claim is about to be
sent, before publishing: a beat killed between its claim and its send).
"""
import json
import logging
import os
import signal
import time

from celery import Celery

import celery_anarchon

app = Celery("lease_app")
acks_late = os.environ.get("ANARCHON_LT_ACKS_LATE") == "1"
schedule = {}
for name, spec in json.loads(os.environ.get("ANARCHON_LT_SCHEDULE", "{}")).items():
    schedule[name] = {
        "task": spec["task"], "schedule": float(spec["every"]), "args": spec.get("args", []),
        "options": {"queue": spec.get("queue", "leases"),
                    "anarchon": {"anchor": spec["anchor"], "lease": spec["lease"]}},
    }
app.conf.update(
    broker_url=os.environ["ANARCHON_LT_BROKER"],
    result_backend=os.environ["ANARCHON_LT_BACKEND"],
    beat_scheduler="celery_anarchon:Scheduler",
    anarchon_store_url=os.environ["ANARCHON_LT_STORE"],
    anarchon_namespace=os.environ["ANARCHON_LT_NAMESPACE"],
    beat_schedule=schedule,
    task_acks_late=acks_late,
    task_reject_on_worker_lost=acks_late,
    worker_prefetch_multiplier=1,
    worker_lost_wait=2,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
EXIT_BEFORE_SEND = os.environ.get("ANARCHON_LT_EXIT_BEFORE_SEND")
if EXIT_BEFORE_SEND:
    from celery_anarchon.beat.publisher import Publisher
    from celery_anarchon.beat.scheduler import Scheduler

    class ExitBeforePublish(Publisher):
        """The fault through the engine's send callback: the won claim (attempt 1) of the entry
        ``EXIT_BEFORE_SEND`` makes the process exit before anything is published."""

        def send(self, plan, slot_ms, attempt, token, task_id):
            if plan.name == EXIT_BEFORE_SEND and attempt == 1:
                logging.getLogger(__name__).warning(
                    "%s: exiting after the claim of slot %s (ANARCHON_LT_EXIT_BEFORE_SEND is set)",
                    plan.name, slot_ms)
                logging.shutdown()
                os._exit(70)
            super().send(plan, slot_ms, attempt, token, task_id)

    class ExitBeforeSend(Scheduler):
        """Beat with the publisher above (the Scheduler's ``Publisher``, swapped)."""

        Publisher = ExitBeforePublish

    app.conf.beat_scheduler = "lease_app:ExitBeforeSend"
if os.environ.get("ANARCHON_LT_NO_INSTALL") != "1":    # "1": a worker whose module forgot it
    celery_anarchon.install(app)


def note(task, event, **extra):
    """Append one event of this execution to the test's file."""
    lease = celery_anarchon.current_lease()
    headers = task.request.headers or {}
    line = json.dumps({
        "event": event, "entry": headers.get("anarchon_entry"), "slot": headers.get("anarchon_slot"),
        "attempt": lease.attempt if lease else headers.get("anarchon_attempt"),
        "token": lease.token if lease else None, "pid": os.getpid(), "task_id": task.request.id,
        "retries": task.request.retries, "time": time.time(), **extra,
    }) + "\n"
    fd = os.open(os.environ["ANARCHON_LT_OUT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@app.task(bind=True)
def sleepy(self, seconds):
    """Work for ``seconds``, checking the lease like a cooperative long task."""
    note(self, "start")
    lease = celery_anarchon.current_lease()
    deadline = time.time() + seconds
    while time.time() < deadline:
        time.sleep(0.05)
        if lease.lost:
            note(self, "lost")
            return "lost"
    note(self, "end")
    return "done"


@app.task(bind=True)
def suicidal(self):
    """Kill the worker process running it, every time."""
    note(self, "start")
    os.kill(os.getpid(), signal.SIGKILL)


@app.task(bind=True)
def retrying(self, countdown):
    """Retry once with ``countdown``, then finish."""
    note(self, "start")
    if self.request.retries == 0:
        raise self.retry(countdown=countdown)
    note(self, "end")
    return "done"


@app.task(bind=True)
def failing(self):
    """Fail for good (no retry): the run is finished, its lease released."""
    note(self, "start")
    raise ValueError("this task fails for good")
