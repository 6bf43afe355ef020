"""A Celery project for the metrics test: entries whose slots come only within a window, so the
counts of a run stop moving once it is over, read back over HTTP.

ANARCHON_IT_BROKER, ANARCHON_IT_STORE, ANARCHON_IT_NAMESPACE, ANARCHON_IT_QUEUE, ANARCHON_IT_OUT
(a JSON-lines file: one line per executed task), ANARCHON_IT_WINDOW (``start,end`` epoch
seconds), and per process ANARCHON_METRICS_PORT / ANARCHON_WORKER_METRICS_PORT.
"""
import json
import math
import os
import time
from datetime import datetime, timedelta, timezone

from celery import Celery

import celery_anarchon

#: the slot after the window: far enough never to come in a test
NEVER = datetime(2100, 1, 1, tzinfo=timezone.utc)


class Window:
    """Slots every ``every_s`` seconds from ``start_s`` to ``end_s`` (epoch seconds), then none."""

    def __init__(self, every_s: int, start_s: int, end_s: int) -> None:
        self.every_s, self.start_s, self.end_s = every_s, start_s, end_s

    def anarchon_next(self, after: datetime) -> datetime:
        t = after.timestamp()
        k = max(0, math.floor((t - self.start_s) / self.every_s) + 1)
        slot = self.start_s + k * self.every_s
        if slot > self.end_s:
            return NEVER if after < NEVER else after + timedelta(days=1)
        return datetime.fromtimestamp(slot, timezone.utc)

    def anarchon_shortest_gap(self) -> timedelta:
        return timedelta(seconds=self.every_s)

    def __repr__(self) -> str:
        return f"Window({self.every_s}, {self.start_s}, {self.end_s})"


def _port(name):
    value = os.environ.get(name)
    return int(value) if value else None


start_s, end_s = (int(x) for x in os.environ["ANARCHON_IT_WINDOW"].split(","))
app = Celery("metrics_app")
app.conf.update(
    broker_url=os.environ["ANARCHON_IT_BROKER"],
    task_default_queue=os.environ["ANARCHON_IT_QUEUE"],
    beat_scheduler="celery_anarchon:Scheduler",
    anarchon_store_url=os.environ["ANARCHON_IT_STORE"],
    anarchon_namespace=os.environ["ANARCHON_IT_NAMESPACE"],
    anarchon_max_late=3.0,
    anarchon_sync_interval=1.0,
    anarchon_metrics_port=_port("ANARCHON_METRICS_PORT"),
    anarchon_worker_metrics_port=_port("ANARCHON_WORKER_METRICS_PORT"),
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    beat_schedule={
        "every-1s": {"task": "metrics_app.record", "schedule": Window(1, start_s, end_s)},
        "leased-3s": {"task": "metrics_app.record", "schedule": Window(3, start_s, end_s),
                      "kwargs": {"sleep_s": 1.2},
                      # a lease seconds longer than the run: a heartbeat late on a loaded
                      # machine never lets beat take a live run over
                      "options": {"anarchon": {"lease": {"duration": 6, "heartbeat": 0.5}}}},
    },
)
celery_anarchon.install(app)


@app.task(bind=True)
def record(self, sleep_s: float = 0.0):
    """Append what ran (a leased run holds its lease for ``sleep_s``)."""
    time.sleep(sleep_s)
    headers = self.request.headers or {}
    line = json.dumps({"entry": headers.get("anarchon_entry"), "slot": headers.get("anarchon_slot"),
                       "instance": headers.get("anarchon_instance"),
                       "attempt": headers.get("anarchon_attempt"),
                       "worker": self.request.hostname.split("@")[0]}) + "\n"
    fd = os.open(os.environ["ANARCHON_IT_OUT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
