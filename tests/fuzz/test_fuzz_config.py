"""A fuzzed ``beat_schedule`` (and app time zone): ``check`` (the command and
:func:`celery_anarchon.testing.check_schedule`) returns the problems, and beat's start-up either
starts or refuses with one of our errors naming the entry; neither raises anything else."""
from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from fuzz import strategies as S
from fuzz.conftest import budget, count
from fuzz.support import ErrorLog, cli, cli_ok, describe, is_ours, make_app, require

ZONE_SETTING = st.one_of(st.just("UTC"), st.just("UTC"), S.ZONES)


@settings(max_examples=budget(160))
@given(beat_schedule=S.BEAT_SCHEDULES, zone=ZONE_SETTING)
def test_check_returns_the_problems_and_beat_starts_or_names_them(beat_schedule, zone):
    require("sqlite")
    count()
    from celery_anarchon import Scheduler, testing
    app = make_app("sqlite", beat_schedule=beat_schedule, timezone=zone)
    try:
        problems = testing.check_schedule(app)
    except Exception as exc:
        if not is_ours(exc):
            raise AssertionError(f"check_schedule raised:\n{describe(exc)}") from exc
        problems = [exc]
    event(f"check_schedule: {'problems' if problems else 'ok'}")
    for args in (["check", "--no-store"], ["check"], ["list"], ["status"]):
        cli_ok(cli(app, args), args, codes=(0, 1) if args[0] == "check" else (0, 2))
    with ErrorLog() as errors:
        try:
            beat = Scheduler(app)
        except Exception as exc:
            if not is_ours(exc):
                raise AssertionError(f"Scheduler() raised:\n{describe(exc)}") from exc
            event("beat: refused")
            assert problems, f"beat refused what check passed: {exc}"
            return
        try:
            beat.tick()
        finally:
            beat.close()
    event("beat: started")
    failed = [r for r in errors.records if "tick failed" in r.getMessage()]
    assert not failed, errors.text()
