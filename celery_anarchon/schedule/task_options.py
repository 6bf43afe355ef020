"""The ``apply_async`` options of an entry, checked when it is defined (beat's start-up, the
schedules API's ``add`` and ``update``, a definition read back from the store) instead of at
every send.

Each known option is held to the types Celery's ``Task.apply_async`` / ``send_task`` /
``amqp.as_task_v2`` and kombu's ``Producer.publish`` accept: a value they would refuse while
building the message (``expires="soon"``: dateutil cannot read it; ``headers="x"``: no mapping)
fails every send of the entry, and one they pass on unread (``priority="high"`` on Redis,
``time_limit="x"``) fails on the broker or in the worker: each is refused once, naming the
entry, the option, the value and the fix. ``None`` is accepted for every option (Celery reads it as "not given"). Unknown
keys pass through to ``apply_async`` as they do in Celery, which has no list of them (kombu
takes any further keyword as a message property), except one that reads as ``anarchon``
misspelt: the entry's own settings in it would be ignored.
"""
from __future__ import annotations

import datetime
import difflib
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

from celery_anarchon.errors import ConfigError
from celery_anarchon.limits import MAX_DURATION_S, duration_bound, shown_value

#: the key of celery_anarchon's own settings of an entry among its options
ANARCHON = "anarchon"
#: the priority range: AMQP 0-9-1's priority is one octet (Redis maps it onto its 0-9 steps)
PRIORITY_RANGE = (0, 255)
#: kombu's delivery modes by name and number (``kombu.entity.DELIVERY_MODES``)
DELIVERY_MODES = ("transient", "persistent", 1, 2)


def _number(value: Any, *, negative: bool) -> str | None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return "not a number of seconds"
    # the bound first: an int past a float's range compares exactly (math.isfinite overflows)
    if abs(value) > MAX_DURATION_S or not math.isfinite(value):
        return f"not a finite number of seconds within {duration_bound(MAX_DURATION_S)}"
    if value < 0 and not negative:
        return "a negative number of seconds"
    return None


def _seconds(negative: bool = False) -> Callable[[Any], str | None]:
    return lambda value: _number(value, negative=negative)


def _iso(value: Any) -> str | None:
    """None when ``value`` is an ISO 8601 time as Celery reads one (dateutil's ``isoparse``)."""
    from dateutil.parser import isoparse
    try:
        isoparse(value)
    except (ValueError, OverflowError, TypeError) as exc:
        return f"not an ISO 8601 time Celery can read (dateutil: {exc})"
    return None


def _time(value: Any, *, seconds: bool) -> str | None:
    if isinstance(value, datetime.datetime):
        return None
    if isinstance(value, str):
        return _iso(value)
    if seconds and isinstance(value, numbers.Real) and not isinstance(value, bool):
        return _number(value, negative=True)
    return ("not seconds, a datetime or an ISO 8601 time" if seconds
            else "not a datetime or an ISO 8601 time")


def _text(value: Any) -> str | None:
    return None if isinstance(value, str) and value else "not a non-empty string"


def _text_or(kind_name: str) -> Callable[[Any], str | None]:
    """A non-empty string, or an object of kombu's class ``kind_name`` (Queue, Exchange)."""
    def check(value: Any) -> str | None:
        import kombu
        if isinstance(value, getattr(kombu, kind_name)):
            return None
        return None if isinstance(value, str) and value else f"not a name (or a kombu.{kind_name})"
    return check


def _bool(value: Any) -> str | None:
    return None if isinstance(value, bool) else "not true or false"


def _mapping(value: Any) -> str | None:
    if not isinstance(value, Mapping):
        return "not a mapping"
    bad = next((key for key in value if not isinstance(key, str)), None)
    return None if bad is None else f"a key that is not a string ({bad!r})"


def _priority(value: Any) -> str | None:
    low, high = PRIORITY_RANGE
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return f"not an integer from {low} to {high} (AMQP's priority; Redis uses its 0-9 steps)"
    return None


def _serializer(value: Any) -> str | None:
    from kombu.serialization import registry
    if isinstance(value, str) and value in registry.name_to_type:
        return None
    return f"not a serializer kombu knows ({', '.join(sorted(registry.name_to_type))})"


def _compression(value: Any) -> str | None:
    from kombu import compression
    try:
        compression.get_encoder(value)
    except (KeyError, TypeError):
        return "not a compression kombu knows (zlib, bzip2, lzma, or one registered)"
    return None


def _signatures(value: Any) -> str | None:
    items = value if isinstance(value, (list, tuple)) else [value]
    if all(isinstance(item, Mapping) for item in items):
        return None
    return "not a signature (a dict such as celery.signature(...) gives) or a list of them"


def _delivery_mode(value: Any) -> str | None:
    ok = value in DELIVERY_MODES and not isinstance(value, bool)
    return None if ok else "not 1, 2, 'transient' or 'persistent'"


#: option -> (check: value -> problem or None, the fix). Types as Celery 5.x and kombu 5.x take
#: them (``celery/app/task.py`` apply_async, ``celery/app/base.py`` send_task,
#: ``celery/app/amqp.py`` as_task_v2 and send_task_message, ``kombu/messaging.py`` publish)
CHECKS: dict[str, tuple[Callable[[Any], str | None], str]] = {
    "countdown": (_seconds(negative=True), "give seconds from the send, e.g. 10"),
    "eta": (lambda v: _time(v, seconds=False),
            "give an ISO 8601 time such as '2027-01-01T00:00:00+00:00' (or leave it out: the "
            "slot is the time)"),
    "expires": (lambda v: _time(v, seconds=True),
                "give seconds from the send (a number, e.g. 3600) or an ISO 8601 time such as "
                "'2027-01-01T00:00:00+00:00'"),
    "time_limit": (_seconds(), "give seconds, e.g. 300"),
    "soft_time_limit": (_seconds(), "give seconds, e.g. 240"),
    "expiration": (_seconds(), "give seconds, e.g. 3600"),
    "timeout": (_seconds(), "give seconds, e.g. 10"),
    "confirm_timeout": (_seconds(), "give seconds, e.g. 10"),
    "headers": (_mapping, "give a dict of header names to values, e.g. {'team': 'billing'}"),
    "retry_policy": (_mapping, "give a dict such as {'max_retries': 3} (beat publishes once: "
                               "it never retries a publish)"),
    "priority": (_priority, "give an integer such as 5"),
    "queue": (_text_or("Queue"), "give the queue's name, e.g. 'reports'"),
    "exchange": (_text_or("Exchange"), "give the exchange's name"),
    "routing_key": (_text, "give the routing key as text"),
    "exchange_type": (_text, "give 'direct', 'topic', 'fanout' or 'headers'"),
    "shadow": (_text, "give the name to show as text"),
    "reply_to": (_text, "give a queue name as text"),
    "serializer": (_serializer, "give one of the serializers named (or register yours with "
                                "kombu.serialization.register)"),
    "compression": (_compression, "give 'zlib', 'bzip2' or 'lzma' (or register yours with "
                                  "kombu.compression.register)"),
    "delivery_mode": (_delivery_mode, "give 2 ('persistent') or 1 ('transient')"),
    "retry": (_bool, "give true or false (beat publishes once: it never retries a publish)"),
    "mandatory": (_bool, "give true or false"),
    "immediate": (_bool, "give true or false"),
    "ignore_result": (_bool, "give true or false"),
    "add_to_parent": (_bool, "give true or false"),
    "link": (_signatures, "give a signature (celery.signature('proj.tasks.next')) or a list"),
    "link_error": (_signatures, "give a signature (celery.signature('proj.tasks.failed')) or "
                                "a list"),
}


def _not_a_misspelt_anarchon(entry: str, key: Any) -> None:
    """Refuse an unknown option key that reads as ``"anarchon"`` misspelt (``"anarcon"``,
    ``"Anarchon"``): Celery would pass it on unread, and the entry's own settings in it
    (``max_late``, ``lease``, ``end_at``, ...) would be ignored without a word (docs/reliability.md:
    a typo must not silently disable a rule)."""
    if not isinstance(key, str) or key == ANARCHON:
        return
    if key.lower() == ANARCHON or difflib.get_close_matches(key.lower(), [ANARCHON], n=1,
                                                            cutoff=0.8):
        raise ConfigError(f"entry {entry!r}: options[{key!r}] is no option Celery knows (did you "
                          f"mean {ANARCHON!r}?): the settings in it would be ignored; fix: rename "
                          f"it to {ANARCHON!r}")


def check(entry: str, options: Mapping) -> None:
    """Refuse an ``apply_async`` option of ``entry`` that Celery or kombu would refuse at every
    send (:data:`CHECKS`); other keys pass.

    :param entry: the entry's name (for the message).
    :param options: the options Celery's ``apply_async`` receives (without ``"anarchon"``).
    :raises ConfigError: naming the entry, the option, the value, what is wrong and the fix.
    """
    for key, value in options.items():
        known = CHECKS.get(key)
        if known is None:
            _not_a_misspelt_anarchon(entry, key)
            continue
        if value is None:
            continue
        test, fix = known
        problem = test(value)
        if problem is not None:
            raise ConfigError(f"entry {entry!r}: options[{key!r}] = {shown_value(value)}: "
                              f"{problem}, a value Celery, kombu or the worker cannot use; "
                              f"fix: {fix}")


__all__ = ["CHECKS", "PRIORITY_RANGE", "check"]
