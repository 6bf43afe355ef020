"""How fast slot math walks a schedule: microseconds per ``next_after`` call.

    python benchmarks/slots_speed.py [--calls 2000]

Prints one line per schedule (interval, wildcard and fixed-time crontab and cron strings in New
York, across the 2025 fall-back night). The engine calls ``next_after`` once per run plus once per
slot it skips, so this bounds the cost of a tick, not the claim (a store round trip).
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
import zoneinfo

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from celery.schedules import crontab, schedule  # noqa: E402

from celery_anarchon.schedule.slots import cron, slots_for  # noqa: E402

NY = zoneinfo.ZoneInfo("America/New_York")
START_MS = int(dt.datetime(2025, 11, 1, tzinfo=dt.timezone.utc).timestamp() * 1000)
CASES = {
    "interval 60 s": lambda: slots_for(schedule(60), entry="e", app_timezone=NY),
    "crontab * * * * * (New York)": lambda: slots_for(crontab.from_string("* * * * *"), entry="e",
                                                      app_timezone=NY),
    "crontab 59 23 * * * (New York)": lambda: slots_for(crontab.from_string("59 23 * * *"),
                                                        entry="e", app_timezone=NY),
    "cron * * * * * tz=New York": lambda: slots_for(cron("* * * * *", tz=NY), entry="e",
                                                    app_timezone=NY),
    "cron 59 23 * * * tz=New York": lambda: slots_for(cron("59 23 * * *", tz=NY), entry="e",
                                                      app_timezone=NY),
    "cron 0 22 L * * tz=New York": lambda: slots_for(cron("0 22 L * *", tz=NY), entry="e",
                                                     app_timezone=NY),
}


def measure(slots, calls: int) -> float:
    """Mean seconds per ``next_after`` over ``calls`` successive slots from 2025-11-01 UTC."""
    at = START_MS
    began = time.perf_counter()
    for _ in range(calls):
        at = slots.next_after(at)
    return (time.perf_counter() - began) / calls


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args(argv)
    print(f"{'schedule':34s} {'us/call':>9s}  ({args.calls} successive calls, best of 3)")
    for name, make in CASES.items():
        slots = make()
        best = min(measure(slots, args.calls) for _ in range(3))
        print(f"{name:34s} {best * 1e6:9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
