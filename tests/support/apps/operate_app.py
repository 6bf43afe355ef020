"""A small Celery project for the operators' command-line tests (tests/operate/test_cli_operate.py),
configured by environment variables: ANARCHON_OP_STORE (store URL), ANARCHON_OP_NAMESPACE, and
ANARCHON_OP_SCHEDULE, which picks its beat_schedule (and ANARCHON_OP_ACKNOWLEDGE, a JSON list:
anarchon_acknowledge):

* ``good``: an interval entry, a crontab in Europe/Berlin and a leased entry (install done);
* ``broken``: an unsafe jitter for its interval, and a crontab step larger than its field;
* ``uninstalled``: a leased entry in an app that did not call celery_anarchon.install(app);
* ``overdue``: an entry every second, jitter 0.2 s, max_late 2 s: overdue soon after its beats
  stop.
"""
import json
import os

from celery import Celery
from celery.schedules import crontab

import celery_anarchon

app = Celery("operate_app")
app.conf.update(
    broker_url="memory://",
    beat_scheduler="celery_anarchon:Scheduler",
    anarchon_store_url=os.environ["ANARCHON_OP_STORE"],
    anarchon_namespace=os.environ["ANARCHON_OP_NAMESPACE"],
    anarchon_sync_interval=float(os.environ.get("ANARCHON_OP_SYNC", "5")),
    anarchon_acknowledge=json.loads(os.environ.get("ANARCHON_OP_ACKNOWLEDGE", "[]")),
    timezone="UTC",
)
GOOD = {
    "every-2s": {"task": "operate_app.report", "schedule": 2.0},
    "berlin-0230": {"task": "operate_app.report",
                    "schedule": celery_anarchon.cron("30 2 * * *", tz="Europe/Berlin")},
    "leased-hourly": {"task": "operate_app.report", "schedule": 3600.0,
                      "options": {"anarchon": {"lease": True}}},
}
SCHEDULES = {
    "good": GOOD,
    "broken": {
        "too-much-jitter": {"task": "operate_app.report", "schedule": 10.0,
                            "options": {"anarchon": {"jitter": 6}}},
        "bad-crontab": {"task": "operate_app.report", "schedule": crontab(minute="*/120")},
        "fine": {"task": "operate_app.report", "schedule": 60.0},
    },
    "overdue": {"every-1s": {"task": "operate_app.report", "schedule": 1.0,
                             "options": {"anarchon": {"jitter": 0.2, "max_late": 2}}}},
    "uninstalled": {"leased": {"task": "operate_app.report", "schedule": 60.0,
                               "options": {"anarchon": {"lease": True}}}},
}
app.conf.beat_schedule = SCHEDULES[os.environ.get("ANARCHON_OP_SCHEDULE", "good")]
if os.environ.get("ANARCHON_OP_SCHEDULE", "good") != "uninstalled":
    celery_anarchon.install(app)


@app.task(shared=False)   # registered in this app only, not in every app of the process
def report(*args, **kwargs):
    """Does nothing: the tests only schedule it."""
