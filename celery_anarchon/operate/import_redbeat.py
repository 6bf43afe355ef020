"""RedBeat's entries as store entries: ``celery -A proj anarchon import redbeat``
(docs/from-redbeat.md).

RedBeat (celery-redbeat) keeps each entry in a Redis hash ``<prefix><name>`` whose field
``definition`` is JSON written by its ``RedBeatJSONEncoder``: ``name``, ``task``, ``schedule``,
``args``, ``kwargs``, ``options``, ``enabled``; the keys of every entry are the members of the
sorted set ``<prefix>:schedule`` (scored by the next due time). The prefix is
``redbeat_key_prefix`` (default ``"redbeat:"``). This module reads those keys with redis-py alone
(RedBeat itself is not needed) and maps each definition onto ours
(:mod:`celery_anarchon.schedule.definition`):

==================================================  =============================================
RedBeat's schedule (its encoder's ``__type__``)     store entry
==================================================  =============================================
``interval`` (``every``, ``relative=False``)        ``{"every": s}``: epoch-aligned (RedBeat counts
                                                    from the last run); ``keep_phase``: with the
                                                    ``anchor`` of RedBeat's last run
``interval`` with ``relative=True``                 refused: no fixed period (our rule)
``crontab`` (its five fields as written)            ``{"crontab": ..., "timezone": zone}``: the
                                                    zone RedBeat ran it in (the app's ``timezone``;
                                                    a zone stored with the fields wins)
``rrule`` of WEEKLY, DAILY, HOURLY, MINUTELY or     ``{"every": interval x unit}`` with ``anchor``
SECONDLY frequency, no ``by*`` part                 and ``start_at`` = ``dtstart``, ``end_at`` =
                                                    ``until`` or the ``count``-th run: the same
                                                    instants (RedBeat stores ``dtstart`` with a
                                                    fixed UTC offset, so no DST moves them)
any other ``rrule`` (MONTHLY, YEARLY, ``by*``)      refused, naming a crontab or cron to write
==================================================  =============================================

RedBeat's encoder writes no solar schedule (saving one raises ``TypeError`` there); a datetime
in ``args``, ``kwargs`` or ``options`` (its ``{"__type__": "datetime"}``) is refused: a
definition holds JSON values only. Reading and mapping only: what is written, and how, is
:mod:`celery_anarchon.operate.imports`.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import zoneinfo
from typing import Any

from celery_anarchon._util import mask_url
from celery_anarchon.errors import ConfigError, StoreUnavailable
from celery_anarchon.schedule.as_data import seconds_json
from celery_anarchon.schedule.zones import zone_name

#: RedBeat's settings, as it reads them (redbeat/schedulers.py, ``RedBeatConfig``)
PREFIX_SETTING, URL_SETTING, DEFAULT_PREFIX = "redbeat_key_prefix", "redbeat_redis_url", "redbeat:"
#: dateutil's rrule frequencies that are a fixed period, and the period of one, seconds
_FIXED_FREQS = {2: ("WEEKLY", 604_800), 3: ("DAILY", 86_400), 4: ("HOURLY", 3_600),
                5: ("MINUTELY", 60), 6: ("SECONDLY", 1)}
_FREQ_NAMES = {0: "YEARLY", 1: "MONTHLY", **{k: v[0] for k, v in _FIXED_FREQS.items()}}
_RRULE_PARTS = ("bysetpos", "bymonth", "bymonthday", "byyearday", "byeaster", "byweekno",
                "byweekday", "byhour", "byminute", "bysecond")
_CRONTAB_FIELDS = ("minute", "hour", "day_of_week", "day_of_month", "month_of_year")
#: the parts of RedBeat's ``{"__type__": "datetime"}``
_DATETIME_PARTS = ("year", "month", "day", "hour", "minute", "second", "microsecond")


class Refused(ConfigError):
    """A RedBeat entry that cannot become a store entry; the message names the entry, the
    reason and the fix."""


@dataclasses.dataclass(frozen=True)
class FoundEntry:
    """One entry of another scheduler as read and mapped (a RedBeat entry; a django-celery-beat
    row: :mod:`celery_anarchon.operate.import_django`).

    :param key: where it was read (RedBeat: its Redis key ``<prefix><name>``; a row: its id).
    :param name: its name (the definition's ``name``, else the key without the prefix).
    :param task: its task, as stored (shown in the table even when refused).
    :param enabled: its ``enabled`` (``False``: the store entry is paused).
    :param definition: our definition (:mod:`celery_anarchon.schedule.definition`), ``None``
        when refused.
    :param refused: why it cannot be imported, with the fix (``None``: it can).
    :param schedule: RedBeat's schedule in words, for the table.
    :param note: how the schedule was mapped, when the table should say (an rrule's window).
    :param anchored: an interval given the anchor of RedBeat's last run (``keep_phase``).
    """

    key: str
    name: str
    task: str
    enabled: bool
    definition: dict | None
    refused: str | None
    schedule: str
    note: str = ""
    anchored: bool = False


def redis_url(app) -> str:
    """The Redis RedBeat reads, as it reads it: ``redbeat_redis_url``, else the broker URL.

    :raises ConfigError: neither is set.
    """
    url = app.conf.get(URL_SETTING) or app.conf.broker_url
    if not url:
        raise ConfigError("RedBeat's Redis: neither redbeat_redis_url nor broker_url is set; "
                          "fix: give --redis redis://host:6379/0")
    return url


def key_prefix(app) -> str:
    """RedBeat's key prefix: ``redbeat_key_prefix``, else ``"redbeat:"``."""
    return app.conf.get(PREFIX_SETTING) or DEFAULT_PREFIX


def read(app, url: str, prefix: str, *, keep_phase: bool = False) -> list[FoundEntry]:
    """Every entry of RedBeat's sorted set ``<prefix>:schedule``, mapped, by name.

    :param app: the Celery app (its ``timezone``: the zone RedBeat ran a crontab in).
    :param keep_phase: give each interval the ``anchor`` of RedBeat's last run (its ``meta``'s
        ``last_run_at``, whole seconds; RedBeat's next run comes one period after it), or of its
        score in the sorted set for an entry that never ran (RedBeat runs it at once), so that
        its runs keep their phase.
    :raises ConfigError: redis-py is not installed, or the URL is not a Redis URL.
    :raises StoreUnavailable: the Redis at ``url`` cannot be reached (the URL shown masked).
    """
    try:
        import redis
    except ImportError:
        raise ConfigError("reading RedBeat's entries needs redis-py; fix: pip install "
                          "'celery-anarchon[redis]'") from None
    try:
        client = redis.Redis.from_url(url, decode_responses=True)
    except ValueError as exc:
        raise ConfigError(f"RedBeat's Redis {mask_url(url)}: not a Redis URL ({exc}); fix: give "
                          "--redis redis://host:6379/0 (a Sentinel or cluster: the master's "
                          "URL)") from None
    try:
        with client:
            scored = client.zrange(prefix + ":schedule", 0, -1, withscores=True)
            keys = [key for key, _ in scored]
            with client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.hmget(key, "definition", "meta")
                texts = pipe.execute()
    except redis.RedisError as exc:
        raise StoreUnavailable(f"RedBeat's Redis {mask_url(url)} cannot be read "
                               f"({type(exc).__name__}: {exc}); fix: check the URL (--redis) "
                               "and that the server runs") from exc
    zone = _app_zone(app)
    found = [entry(key, text, prefix, zone,
                   phase_s=_phase_s(meta, due) if keep_phase else None)
             for (key, due), (text, meta) in zip(scored, texts) if text]
    return sorted(found, key=lambda e: e.name)


def _app_zone(app) -> str:
    try:
        return zone_name(app.timezone)
    except Exception:                   # an unknown zone: the crontab refused by its check
        return str(app.conf.timezone or "UTC")


def entry(key: str, text: str, prefix: str, zone: str, *,
          phase_s: int | None = None) -> FoundEntry:
    """One RedBeat definition (its JSON ``text`` under ``key``) mapped onto ours.

    :param zone: the zone RedBeat ran a crontab without one of its own in (the app's).
    :param phase_s: an instant of the entry's phase (its last run), Unix seconds: an interval
        gets the ``anchor`` that keeps it (``None``: epoch-aligned).
    """
    fallback = key[len(prefix):] if key.startswith(prefix) else key
    try:
        raw = json.loads(text)
    except ValueError as exc:
        return FoundEntry(key, fallback, "-", True, None, _refusal(
            fallback, f"its definition under {key!r} is not JSON ({exc})",
            "save the entry again with RedBeat, or delete it there"), "-")
    raw = raw if isinstance(raw, dict) else {}
    name = raw.get("name") if isinstance(raw.get("name"), str) and raw.get("name") else fallback
    task = raw.get("task") if isinstance(raw.get("task"), str) else "-"
    enabled = raw.get("enabled", True) is not False
    shown = _describe(raw.get("schedule"))
    try:
        definition = _definition(name, raw, zone, phase_s)
    except Refused as exc:
        return FoundEntry(key, name, task, enabled, None, str(exc), shown)
    ours = definition.get("anarchon", {})
    note = (f"{shown} from {ours['start_at']}" + (f" to {ours['end_at']}" if "end_at" in ours
                                                  else "")) if "start_at" in ours else ""
    anchored = "anchor" in ours and "start_at" not in ours
    return FoundEntry(key, name, task, enabled, definition, None, shown, note, anchored)


def _refusal(name: str, reason: str, fix: str) -> str:
    return f"entry {name!r}: {reason}; fix: {fix}"


def _phase_s(meta: str | None, due: float) -> int | None:
    """The instant of an entry's phase, Unix seconds: its ``last_run_at`` (RedBeat runs it a
    period after that; its score is not always that instant: RedBeat computes it as
    ``last_run_at`` + the time left from now), else its score (an entry that never ran: RedBeat
    runs it at once, then counts from then), else ``None``."""
    try:
        last = json.loads(meta).get("last_run_at") if meta else None
    except (ValueError, AttributeError):
        last = None
    if isinstance(last, dict) and last.get("__type__") == "datetime":
        zone = last.get("timezone", "UTC")
        try:
            tz = (datetime.timezone(datetime.timedelta(seconds=zone))
                  if isinstance(zone, (int, float)) else zoneinfo.ZoneInfo(zone))
            return int(datetime.datetime(**{k: last[k] for k in _DATETIME_PARTS},
                                         tzinfo=tz).timestamp())
        except (KeyError, TypeError, ValueError, zoneinfo.ZoneInfoNotFoundError):
            pass
    return int(due) if due > 0 else None


def _definition(name: str, raw: dict, zone: str, phase_s: int | None) -> dict:
    out: dict[str, Any] = {"task": raw.get("task")}
    for key, empty in (("args", []), ("kwargs", {}), ("options", {})):
        value = raw.get(key)
        out[key] = empty if value is None else _plain(name, key, value)
    schedule, anarchon = _schedule(name, raw.get("schedule"), zone)
    every = schedule.get("every")
    if phase_s is not None and not anarchon and isinstance(every, (int, float)) and every > 0:
        anarchon = {"anchor": seconds_json(phase_s % every)}
    out["schedule"] = schedule
    if anarchon:
        out["anarchon"] = anarchon
    return out


def _plain(name: str, where: str, value: Any) -> Any:
    """``value`` when it holds JSON values only (no RedBeat ``__type__`` object)."""
    if isinstance(value, dict):
        if "__type__" in value:
            raise Refused(_refusal(
                name, f"RedBeat stored {where} as a {value['__type__']} object, and a definition "
                "here holds JSON values only", f"save it in RedBeat as plain JSON (a datetime as "
                "ISO 8601 text, an expiry in seconds), or add the entry here yourself "
                "(celery anarchon add)"))
        return {k: _plain(name, f"{where}.{k}", v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(name, f"{where}[{i}]", v) for i, v in enumerate(value)]
    return value


def _schedule(name: str, sched: Any, zone: str) -> tuple[dict, dict]:
    """Our ``"schedule"`` and the ``"anarchon"`` settings it needs (an rrule's window)."""
    kind = sched.get("__type__") if isinstance(sched, dict) else None
    if kind == "interval":
        if sched.get("relative"):
            raise Refused(_refusal(
                name, f"its interval of {_seconds(sched.get('every'))} s has relative=True "
                "(rounded to the wall clock), which has no fixed period across DST",
                "save it in RedBeat with relative=False (our slots are then the multiples of the "
                "period since 1970; --keep-phase keeps its phase), or add it here with a crontab"))
        return {"every": seconds_json(sched.get("every"))}, {}
    if kind == "crontab":
        fields = {f: sched[f] for f in _CRONTAB_FIELDS if f in sched and sched[f] != "*"}
        own = sched.get("timezone") or sched.get("tz")
        return {"crontab": fields, "timezone": own if isinstance(own, str) else zone}, {}
    if kind == "rrule":
        return _rrule(name, sched)
    what = f"of type {kind!r}" if kind else f"{json.dumps(sched)[:80]}"
    raise Refused(_refusal(name, f"its schedule {what} is none that RedBeat's encoder writes "
                           "(interval, crontab, rrule) and has no form here",
                           "add the entry here with an interval, crontab, cron or solar schedule "
                           "(celery anarchon add)"))


def _rrule(name: str, sched: dict) -> tuple[dict, dict]:
    """An rrule of a fixed period (no ``by*`` part) as an interval with its anchor and window."""
    freq, step = sched.get("freq"), sched.get("interval") or 1
    parts = [p for p in _RRULE_PARTS if sched.get(p) not in (None, [], ())]
    if freq not in _FIXED_FREQS or parts or not isinstance(step, int) or step < 1 \
            or not isinstance(sched.get("dtstart"), (int, float)):
        given = ", ".join([f"freq {_FREQ_NAMES.get(freq, freq)}", f"interval {step}",
                           *(f"{p} {sched[p]}" for p in parts)])
        raise Refused(_refusal(
            name, f"its rrule ({given}) has no exact form here: only an rrule of WEEKLY, DAILY, "
            "HOURLY, MINUTELY or SECONDLY frequency without by* parts maps (onto an interval)",
            "add it here with a crontab or cron that says the same (celery anarchon add NAME "
            "--cron '...' --timezone ZONE), then delete it from RedBeat"))
    period = step * _FIXED_FREQS[freq][1]
    start = int(sched["dtstart"])
    anarchon: dict[str, Any] = {"anchor": start % period, "start_at": _iso(start)}
    count, until = sched.get("count"), sched.get("until")
    ends = []
    if isinstance(count, int) and count > 0:
        ends.append(start + (count - 1) * period)
    if isinstance(until, (int, float)):
        ends.append(start + (int(until) - start) // period * period)
    if ends:
        anarchon["end_at"] = _iso(min(ends))
    return {"every": period}, anarchon


def _iso(seconds: int) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat()


def _seconds(value: Any) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)


def _describe(sched: Any) -> str:
    """RedBeat's schedule in words, for a refused entry's row."""
    if not isinstance(sched, dict):
        return "-"
    kind = sched.get("__type__")
    if kind == "interval":
        relative = " (relative)" if sched.get("relative") else ""
        return f"every {_seconds(sched.get('every'))} s{relative}"
    if kind == "crontab":
        return "crontab " + " ".join(str(sched.get(f, "*")) for f in (
            "minute", "hour", "day_of_month", "month_of_year", "day_of_week"))
    if kind == "rrule":
        return f"rrule {_FREQ_NAMES.get(sched.get('freq'), sched.get('freq'))}"
    return str(kind or "-")
