"""The task every ``PeriodicTask`` row of the demo runs."""
import json
import os
import time

from celery import shared_task

import celery_anarchon
from django.conf import settings


@shared_task(bind=True)
def record(self, what="run"):
    """Do the 'work': append one line per execution (the demo's live view and verdict read
    them), in one ``write`` so the lines of the worker's threads never interleave."""
    headers = self.request.headers or {}
    line = json.dumps({
        "entry": headers.get("anarchon_entry"), "slot": headers.get("anarchon_slot"),
        "instance": headers.get("anarchon_instance"), "task_id": self.request.id,
        "scheduled_at": celery_anarchon.scheduled_at(self.request).isoformat(),
        "executed_at": time.time(), "what": what,
    })
    fd = os.open(os.path.join(settings.FOLDER, "executions.jsonl"),
                 os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
    return what
