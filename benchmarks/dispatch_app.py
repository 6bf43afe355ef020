"""The Celery project of the dispatch benchmark (benchmarks/dispatch.py); every beat loads it.

One ``beat_schedule`` for every scheduler: ``DISPATCH_ENTRIES`` entries named ``e00000``,
``e00001``, ... each running the task ``dispatch_app.noop`` every ``DISPATCH_INTERVAL`` seconds
(a plain interval schedule, the entry's name as its only argument, no per-entry options). Set by
the benchmark in the environment of each beat:

DISPATCH_BROKER     the broker (Redis) URL
DISPATCH_SCHEDULER  ``default`` (Celery's PersistentScheduler), ``redbeat`` or ``anarchon``
DISPATCH_STORE      the claim store URL of ``anarchon`` (its default Redis ``lease`` strategy)
DISPATCH_REDBEAT    RedBeat's Redis URL (``redbeat_redis_url``); everything else is RedBeat's default
"""
import os

from celery import Celery

ENTRIES = int(os.environ.get("DISPATCH_ENTRIES", "10"))
INTERVAL = float(os.environ.get("DISPATCH_INTERVAL", "1"))
SCHEDULERS = {
    "default": "celery.beat:PersistentScheduler",
    "redbeat": "redbeat:RedBeatScheduler",
    "anarchon": "celery_anarchon:Scheduler",
}


def entry_name(n: int) -> str:
    return f"e{n:05d}"


app = Celery("dispatch_app")
app.conf.update(
    broker_url=os.environ.get("DISPATCH_BROKER", "redis://127.0.0.1:6431/0"),
    beat_scheduler=SCHEDULERS[os.environ.get("DISPATCH_SCHEDULER", "default")],
    beat_schedule={entry_name(n): {"task": "dispatch_app.noop", "schedule": INTERVAL,
                                   "args": (entry_name(n),)}
                   for n in range(ENTRIES)},
    timezone="UTC",
    broker_connection_retry_on_startup=True,
)
if "DISPATCH_STORE" in os.environ:
    app.conf.anarchon_store_url = os.environ["DISPATCH_STORE"]
if "DISPATCH_REDBEAT" in os.environ:
    app.conf.redbeat_redis_url = os.environ["DISPATCH_REDBEAT"]


@app.task(name="dispatch_app.noop")
def noop(entry):
    """Never executed: the benchmark's consumer only counts the messages."""
    return entry
