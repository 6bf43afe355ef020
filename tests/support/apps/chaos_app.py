"""The Celery project of the chaos run (benchmarks/chaos.py, tests/system/test_chaos.py).

Fifty entries: 15 every second, 12 every 2 s, 12 every 5 s, 6 every-minute crontabs and 5 leased
entries (lease 6 s / heartbeat 1 s) whose task works 2 to 4 s. Configured by environment:

CHAOS_BROKER, CHAOS_STORE, CHAOS_STORE_OPTIONS (JSON), CHAOS_NAMESPACE, CHAOS_QUEUE (plain
entries; leased ones go to CHAOS_QUEUE + "-leases"), CHAOS_MAX_LATE (seconds), CHAOS_OUT (a
JSON-lines file the tasks append one line to per event: ``run`` for a plain task, ``start``,
``end`` and ``lost`` for a leased one).
"""
import json
import os
import time

from celery import Celery
from celery.schedules import crontab

import celery_anarchon

QUEUE = os.environ.get("CHAOS_QUEUE", "chaos")
LEASE_QUEUE = QUEUE + "-leases"
#: a lease short enough for a takeover to happen within a short run (docs/leases.md "fast failover")
LEASE = {"duration": 6, "heartbeat": 1, "queue_timeout": 10, "max_attempts": 3}


def build_schedule() -> dict:
    """The 50 entries; ``ENTRY_PERIODS_MS`` below gives the period of each (for expected slots)."""
    schedule = {}
    for n in range(15):
        schedule[f"s1-{n:02d}"] = {"task": "chaos_app.record", "schedule": 1.0}
    for n in range(12):
        schedule[f"s2-{n:02d}"] = {"task": "chaos_app.record", "schedule": 2.0}
    for n in range(12):
        schedule[f"s5-{n:02d}"] = {"task": "chaos_app.record", "schedule": 5.0}
    for n in range(6):
        schedule[f"cron-{n:02d}"] = {"task": "chaos_app.record", "schedule": crontab()}
    for n, (every, work) in enumerate([(15, 2), (15, 3), (20, 4), (20, 2), (30, 3)]):
        schedule[f"lease-{n:02d}"] = {
            "task": "chaos_app.leased", "schedule": float(every), "args": [work],
            "options": {"queue": LEASE_QUEUE, "anarchon": {"lease": dict(LEASE)}}}
    return schedule


SCHEDULE = build_schedule()
#: entry -> period in ms (slots are the multiples of it since the epoch; crontab(): every minute)
ENTRY_PERIODS_MS = {name: 60_000 if isinstance(spec["schedule"], crontab)
                    else int(spec["schedule"] * 1000) for name, spec in SCHEDULE.items()}
LEASED_ENTRIES = sorted(name for name in SCHEDULE if name.startswith("lease-"))

app = Celery("chaos_app")
if "CHAOS_BROKER" in os.environ:
    app.conf.update(
        broker_url=os.environ["CHAOS_BROKER"],
        task_default_queue=QUEUE,
        beat_scheduler="celery_anarchon:Scheduler",
        anarchon_store_url=os.environ["CHAOS_STORE"],
        anarchon_namespace=os.environ["CHAOS_NAMESPACE"],
        anarchon_store_options=json.loads(os.environ.get("CHAOS_STORE_OPTIONS", "{}")),
        anarchon_max_late=float(os.environ.get("CHAOS_MAX_LATE", "15")),
        beat_schedule=SCHEDULE,
        worker_prefetch_multiplier=1,
        worker_lost_wait=2,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        worker_hijack_root_logger=False,
        timezone="UTC",
    )
celery_anarchon.install(app)

if os.environ.get("CHAOS_LOG_EVERY_SKIP"):
    # every skipped slot in the beat log, not one per entry and minute (the others are at DEBUG):
    # on the Sentinel rig a failover can take the history records of refused slots with it, and
    # the log is then the only record of why a run was not sent
    import logging

    class _SkipsOnly(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return record.levelno > logging.DEBUG or "skipped:" in str(record.msg)

    _skip_log = logging.getLogger("celery_anarchon.beat.engine.skips")   # the claim refusals' logger
    _skip_log.setLevel(logging.DEBUG)
    _skip_log.addFilter(_SkipsOnly())


def note(task, kind: str, **extra) -> None:
    """Append one event of this execution to CHAOS_OUT (one write: lines never interleave)."""
    headers = task.request.headers or {}
    lease = celery_anarchon.current_lease()
    line = json.dumps({
        "kind": kind, "entry": headers.get("anarchon_entry"), "slot": headers.get("anarchon_slot"),
        "instance": headers.get("anarchon_instance"),
        "attempt": lease.attempt if lease else headers.get("anarchon_attempt"),
        "token": lease.token if lease else None, "task_id": task.request.id, "pid": os.getpid(),
        "time": time.time(), **extra,
    }) + "\n"
    fd = os.open(os.environ["CHAOS_OUT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@app.task(bind=True)
def record(self):
    """A plain entry's body: note that it ran."""
    note(self, "run")


@app.task(bind=True)
def leased(self, seconds):
    """A leased entry's body: work ``seconds``, checking the lease like a cooperative task."""
    note(self, "start")
    lease = celery_anarchon.current_lease()
    deadline = time.time() + seconds
    while time.time() < deadline:
        time.sleep(0.05)
        if lease is not None and lease.lost:
            note(self, "lost")
            return "lost"
    note(self, "end")
    return "done"
