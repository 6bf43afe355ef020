"""Every zone, every offset transition of 2020-2030: slots follow docs/design.md "Slots" DST rules.

For each transition a brute-force oracle walks the UTC timeline minute by minute around it and
says where the slots must be: a wildcard entry at every minute whose wall time matches, a
fixed-time entry at the first minute whose wall time reaches each matching time (so once per
matching local time per day, several times of a skipped interval falling on one instant). The
slots computed by celery_anarchon.schedule.slots must be exactly those. Zones whose transitions and offsets
are identical over 2020-2030 (links, neighbours) behave identically and are checked once.
"""

import datetime as dt
import functools
import zoneinfo

import pytest

from celery_anarchon.schedule.slots import cron, slots_for

UTC = dt.timezone.utc
FROM_S = int(dt.datetime(2020, 1, 1, tzinfo=UTC).timestamp())
UNTIL_S = int(dt.datetime(2031, 1, 1, tzinfo=UTC).timestamp())
BEFORE_S, AFTER_S, WARM_UP_S = 18 * 3600, 18 * 3600, 6 * 3600

# expression -> (does the wall time (hour, minute) match, fixed-time?)
SCHEDULES = {
    "0 * * * *": (lambda h, m: m == 0, False),
    "30 * * * *": (lambda h, m: m == 30, False),
    "*/15 * * * *": (lambda h, m: m % 15 == 0, False),
    "30 2 * * *": (lambda h, m: (h, m) == (2, 30), True),
    "0 0 * * *": (lambda h, m: (h, m) == (0, 0), True),
}


def offset(zone, t):
    return int(dt.datetime.fromtimestamp(t, zone).utcoffset().total_seconds())


def transitions(zone):
    """(instant, offset before, offset after) of every offset change in 2020-2030: the offset is
    sampled daily and each change is bisected to the second."""
    found, prev = [], offset(zone, FROM_S)
    for t in range(FROM_S + 86400, UNTIL_S + 1, 86400):
        now = offset(zone, t)
        if now != prev:
            lo, hi = t - 86400, t
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if offset(zone, mid) == prev else (lo, mid)
            found.append((hi, prev, now))
        prev = now
    return tuple(found)


@functools.lru_cache(maxsize=None)
def windows():
    """One zone per distinct set of transitions, with those transitions."""
    by_signature = {}
    for name in sorted(zoneinfo.available_timezones()):
        zone = zoneinfo.ZoneInfo(name)
        by_signature.setdefault(transitions(zone), zone)
    return [(zone, sig) for sig, zone in by_signature.items() if sig]


def oracle(zone, matches, fixed_time, start, end):
    """The slots (UTC seconds) in [start, end), from a minute-by-minute walk."""
    slots, high = [], None
    for t in range(start, end, 60):
        wall = t + offset(zone, t)
        assert wall % 60 == 0
        if not fixed_time:
            if matches(wall // 3600 % 24, wall // 60 % 60):
                slots.append(t)
            continue
        if high is None:
            high = wall - 60
        if wall > high:  # the wall times in (high, wall] are reached now, first time
            if any(matches(w // 3600 % 24, w // 60 % 60) for w in range(high + 60, wall + 1, 60)):
                slots.append(t)
            high = wall
    return slots


def computed(slots, start, end):
    found, at = [], start * 1000 - 1
    while True:
        nxt = slots.next_after(at)
        assert nxt > at and nxt % 1000 == 0
        if nxt >= end * 1000:
            return found
        found.append(nxt // 1000)
        at = nxt


def test_transitions_are_found():
    sigs = dict((zone.key, sig) for zone, sig in windows())
    assert len(windows()) > 30
    assert any(t == (int(dt.datetime(2025, 3, 9, 7, tzinfo=UTC).timestamp()), -18000, -14400)
               for sig in sigs.values() for t in sig)


@pytest.mark.parametrize("expr", sorted(SCHEDULES))
def test_slots_around_every_transition_of_every_zone(expr):
    matches, fixed_time = SCHEDULES[expr]
    failures = []
    for zone, sig in windows():
        slots = slots_for(cron(expr, tz=zone), entry="dst", app_timezone=UTC)
        assert slots.describe().endswith("dst=fixed-time" if fixed_time else "dst=wildcard")
        for when, before, after in sig:
            start, end = when - BEFORE_S, when + AFTER_S
            got = computed(slots, start, end)
            assert got == sorted(set(got))  # strictly increasing, never repeated
            if not fixed_time:
                for t in got:
                    wall = t + offset(zone, t)
                    assert wall % 60 == 0 and matches(wall // 3600 % 24, wall // 60 % 60)
            else:  # one run per local day (a gap never moves a daily time to another date)
                days = [dt.datetime.fromtimestamp(t, zone).date() for t in got]
                assert len(days) == len(set(days))
            want = [t for t in oracle(zone, matches, fixed_time, start, end)
                    if t >= start + WARM_UP_S]
            # asked from just around the jump and from inside a repeated or skipped interval
            probes = [when + d for d in (-1, 0, 1, 600, 1799, 1800, 3599)]
            asked = [slots.next_after(p * 1000) // 1000 for p in probes]
            asked = [t if t < end else None for t in asked]  # the oracle knows up to end
            first_after = [next((t for t in want if t > p), None) for p in probes]
            if [t for t in got if t >= start + WARM_UP_S] != want or asked != first_after:
                failures.append((zone.key, dt.datetime.fromtimestamp(when, UTC), before, after))
    assert not failures, failures[:10]
