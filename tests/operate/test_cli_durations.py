"""The instants the commands take (``history --since``, ``next --after``, ``backfill --from /
--to``): an ISO 8601 time or a duration, written as their own messages write it ("2d ago",
"in 1h") or bare ("2d")."""
from __future__ import annotations

import click
import pytest

from celery_anarchon.operate.cli.reports import parse_after, parse_since

NOW_MS = 1_800_000_000_000


@pytest.mark.parametrize("text", ["2d", "2d ago", " 2d  ago "])
def test_a_duration_ago_is_taken_with_or_without_the_word(text):
    assert parse_since(text, NOW_MS) == NOW_MS - 2 * 86_400_000


@pytest.mark.parametrize("text", ["1h30m", "in 1h30m", "1h30m from now"])
def test_a_duration_from_now_is_taken_as_the_message_writes_it(text):
    assert parse_after(text, NOW_MS) == NOW_MS + 5_400_000


def test_a_word_of_the_other_direction_is_refused_with_the_examples():
    with pytest.raises(click.BadParameter) as caught:
        parse_since("in 2d", NOW_MS)
    assert "fix: give e.g. 2026-03-29T00:00:00Z, or a duration: 1h, 30m, 1h30m, 2d ago" in str(
        caught.value.message)
