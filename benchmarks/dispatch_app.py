"""The Celery project of the dispatch benchmark (benchmarks/dispatch.py); every beat loads it.

One ``beat_schedule`` for every scheduler: ``DISPATCH_ENTRIES`` entries named ``e00000``,
``e00001``, ... each running the task ``dispatch_app.noop`` every ``DISPATCH_INTERVAL`` seconds
(a plain interval schedule, the entry's name as its only argument, no per-entry options). Set by
the benchmark in the environment of each beat:

DISPATCH_BROKER     the broker (Redis) URL
DISPATCH_SCHEDULER  ``default`` (Celery's PersistentScheduler), ``redbeat`` or ``anarchon``
DISPATCH_STORE      the claim store URL of ``anarchon`` (its default Redis ``lease`` strategy)
DISPATCH_REDBEAT    RedBeat's Redis URL (``redbeat_redis_url``); everything else is RedBeat's default
DISPATCH_KIND       ``interval`` (default) or ``daily``: each entry a daily crontab six to
                    eighteen hours after ``DISPATCH_HOUR`` (UTC), minute = entry number % 60,
                    so that nothing comes due (the idle workloads)
DISPATCH_HOUR       the UTC hour the idle workload starts in (default: now's)
DISPATCH_NAMESPACE  ``anarchon_namespace`` (default: the app's name, ``dispatch_app``)
DISPATCH_READY      a file: the end of beat's first tick is written there (epoch seconds, CPU
                    seconds of the process), for every scheduler alike
"""
import os
import resource
import time

from celery import Celery, signals
from celery.schedules import crontab

ENTRIES = int(os.environ.get("DISPATCH_ENTRIES", "10"))
INTERVAL = float(os.environ.get("DISPATCH_INTERVAL", "1"))
SCHEDULERS = {
    "default": "celery.beat:PersistentScheduler",
    "redbeat": "redbeat:RedBeatScheduler",
    "anarchon": "celery_anarchon:Scheduler",
}


def entry_name(n: int) -> str:
    return f"e{n:05d}"


def schedule_of(n: int):
    """Entry ``n``'s schedule: the interval, or a daily crontab far from now (``daily``)."""
    if os.environ.get("DISPATCH_KIND", "interval") == "daily":
        hour = int(os.environ.get("DISPATCH_HOUR", time.gmtime().tm_hour))
        return crontab(minute=n % 60, hour=(hour + 6 + (n // 60) % 12) % 24)
    return INTERVAL


app = Celery("dispatch_app")
app.conf.update(
    broker_url=os.environ.get("DISPATCH_BROKER", "redis://127.0.0.1:6431/0"),
    beat_scheduler=SCHEDULERS[os.environ.get("DISPATCH_SCHEDULER", "default")],
    beat_schedule={entry_name(n): {"task": "dispatch_app.noop", "schedule": schedule_of(n),
                                   "args": (entry_name(n),)}
                   for n in range(ENTRIES)},
    timezone="UTC",
    broker_connection_retry_on_startup=True,
)
if "DISPATCH_STORE" in os.environ:
    app.conf.anarchon_store_url = os.environ["DISPATCH_STORE"]
if "DISPATCH_NAMESPACE" in os.environ:
    app.conf.anarchon_namespace = os.environ["DISPATCH_NAMESPACE"]
if "DISPATCH_REDBEAT" in os.environ:
    app.conf.redbeat_redis_url = os.environ["DISPATCH_REDBEAT"]


@signals.beat_init.connect
def _mark_first_tick(sender, **kwargs):
    """Write the end of the first tick to DISPATCH_READY (the scheduler is built by then)."""
    path = os.environ.get("DISPATCH_READY")
    if not path:
        return
    scheduler = sender.scheduler
    tick = scheduler.tick

    def first_tick(*args, **kw):
        try:
            return tick(*args, **kw)
        finally:
            scheduler.tick = tick
            usage = resource.getrusage(resource.RUSAGE_SELF)
            with open(path, "w") as f:
                f.write(f"{time.time()} {usage.ru_utime + usage.ru_stime}\n")
    scheduler.tick = first_tick


@app.task(name="dispatch_app.noop")
def noop(entry):
    """Never executed: the benchmark's consumer only counts the messages."""
    return entry
