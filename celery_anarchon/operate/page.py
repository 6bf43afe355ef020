"""The status page's HTML (``GET /`` of :mod:`celery_anarchon.operate.web`): the status data of
:func:`~celery_anarchon.operate.overview.overview` rendered with Jinja2 (``templates/status.html``,
every value escaped), its entries searched, sorted by what needs attention and paged, and the
colours of the runs' strip.

Jinja2 comes with the ``web`` extra; it is imported when a page is rendered.
"""
from __future__ import annotations

import functools
import math
import time
from collections.abc import Collection
from pathlib import Path
from urllib.parse import quote, urlencode

from celery_anarchon.errors import ConfigError
from celery_anarchon.operate import times

#: the header, form field and environment variable of the actions' token
TOKEN_HEADER, TOKEN_FIELD, TOKEN_ENV = "X-Anarchon-Token", "token", "ANARCHON_WEB_TOKEN"
#: the page's reload interval, seconds: 0 (never) or within these bounds (``?refresh=N``)
MIN_REFRESH_S, MAX_REFRESH_S = 1.0, 3600.0
#: entries per page of the status page: the default and the most (``?per_page=N``)
PER_PAGE, MAX_PER_PAGE = 100, 1000
_TEMPLATES = Path(__file__).with_name("templates")


def refresh_interval(value: str | float | None, default: float) -> float:
    """The page's reload interval from ``?refresh=N``: 0 (never), else clamped to
    :data:`MIN_REFRESH_S` .. :data:`MAX_REFRESH_S` seconds; ``default`` (clamped too) when
    ``value`` is missing, not a number, infinite or NaN.

    :param value: the query parameter's text (or a number), or ``None``.
    :param default: the page's ``--refresh``, seconds.
    :returns: seconds, 0 or within the bounds; never raises.
    """
    try:
        seconds = float(default if value is None else value)
    except (TypeError, ValueError):
        seconds = float(default)
    if not math.isfinite(seconds):
        seconds = float(default) if math.isfinite(float(default)) else MAX_REFRESH_S
    if seconds <= 0:
        return 0.0
    return min(max(seconds, MIN_REFRESH_S), MAX_REFRESH_S)


def missing_extra() -> ConfigError:
    """The error of a page started without the ``web`` extra (naming the fix)."""
    return ConfigError("the status page needs the web extra: pip install 'celery-anarchon[web]' "
                       "(starlette, uvicorn, jinja2)")


def render_page(data: dict | None, *, error: str | None = None, actions: bool = False,
                nonce: str = "", refresh_s: float = 0.0, query: str | None = None,
                page: str | int | None = 1, per_page: str | int | None = PER_PAGE,
                params: dict[str, str] | None = None) -> str:
    """The page's HTML for the status data ``data`` (:func:`overview.overview`), every value
    escaped.

    :param error: why there is no data (shown instead).
    :param actions: render the token field, the pause / resume / run-now buttons and the
        selection of rows with its bulk pause / resume.
    :param nonce: the Content-Security-Policy nonce of the page's script.
    :param refresh_s: how often the page reloads its data, seconds (0: never).
    :param query: page, per_page: the entries shown (:func:`entries_page`; ``?q=``, ``?page=``,
        ``?per_page=``).
    :param params: the request's query parameters the page's links keep (``q``, ``per_page``,
        ``refresh``).
    :raises ConfigError: Jinja2 (the ``web`` extra) is not installed.
    """
    data = data or {}
    params = dict(params or {})
    disagreeing = {d.get("entry") for d in data.get("disagreements") or ()}
    shown = entries_page(data.get("entries") or [], query=query, page=page, per_page=per_page,
                         disagreeing=disagreeing)
    now_ms = times.to_ms(data.get("generated"))
    if now_ms is None:
        now_ms = int(time.time() * 1000)
    links = {"prev": page_link(params, page=shown["page"] - 1) if shown["page"] > 1 else None,
             "next": (page_link(params, page=shown["page"] + 1)
                      if shown["page"] < shown["pages"] else None),
             "all": page_link(params, q=None, page=None) if shown["query"] else None}
    return _template().render(
        data=data, error=error, actions=actions, nonce=nonce, store_ms=_store_ms(data),
        refresh_ms=int(refresh_interval(refresh_s, 0.0) * 1000), token_header=TOKEN_HEADER, legend=LEGEND,
        classes=COLOURS, skips=recent_skips(data), shown=shown, links=links,
        kept={k: v for k, v in params.items() if k != "q"}, lost_fix=_lost_fix(),
        ago=functools.partial(time_tag, now_ms=now_ms), run_classes=run_classes,
        schedule_parts=schedule_parts, now_ms=now_ms)


def time_tag(value, zone: str | None = None, *, now_ms: int):
    """An instant of the status data as the page shows it: ``<time>`` whose text is relative to
    ``now_ms`` (``12 s ago``, ``in 3 min``: :func:`~celery_anarchon.operate.times.relative`),
    whose ``title`` (the tooltip) is the whole instant in ``zone`` and UTC
    (:func:`~celery_anarchon.operate.times.absolute`) and whose ``data-ms`` the page's script
    reads to keep the text right between reloads. Every value escaped.

    :param value: an ISO 8601 instant (another value is shown as it is, escaped; ``None``: empty).
    :param zone: the entry's zone (IANA name), or ``None``: UTC only.
    :param now_ms: "now", UTC ms: the store's clock when the data was read (``generated``).
    :returns: :class:`markupsafe.Markup`.
    """
    from markupsafe import Markup, escape
    at_ms = times.to_ms(value)
    if at_ms is None:
        return escape("" if value is None else value)
    return Markup('<time class="ago" datetime="{}" data-ms="{}" title="{}">{}</time>').format(
        value, at_ms, times.absolute(value, zone), times.relative(value, now_ms))


def schedule_parts(entry: dict) -> tuple[str, str | None]:
    """An entry's schedule cell: its schedule in words without the zone at its end (the
    expression: ``crontab */2 * * * *``, never wrapped on the page) and the zone, named once
    (``None`` when the entry has none)."""
    text, zone = str(entry.get("schedule") or ""), entry.get("timezone") or None
    if zone and text.endswith(" " + zone):
        text = text[:-len(zone) - 1]
    return text, zone


def _lost_fix() -> str:
    """What to do about a store's loss (:data:`overview.LOST_FIX`; imported when rendered, as
    the overview is)."""
    from celery_anarchon.operate.overview import LOST_FIX
    return LOST_FIX


def _template(name: str = "status.html"):
    return _environment().get_template(name)


@functools.lru_cache(maxsize=1)
def _environment():
    try:
        import jinja2
    except ImportError as exc:
        raise missing_extra() from exc
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(_TEMPLATES), autoescape=True,
                             undefined=jinja2.ChainableUndefined)
    env.filters.update(when=_when, entry_path=entry_path, as_json=_as_json)
    return env


def entry_path(name) -> str:
    """The path of entry ``name``'s page: ``/entries/`` and the name with every character but
    letters, digits and ``_.-~`` percent-encoded (a ``/`` too, so that a name is one segment;
    text UTF-8 cannot encode, a lone surrogate, backslash-escaped)."""
    return "/entries/" + quote(str(name), safe="", errors="backslashreplace")


def _as_json(value) -> str:
    """A definition's part as JSON text (sorted keys, non-ASCII kept), for the entry page; the
    page escapes it."""
    import json
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=repr)


def render_entry(data: dict | None, *, name: str, error: str | None = None,
                 params: dict[str, str] | None = None) -> str:
    """The entry page's HTML for the data ``data`` of
    :func:`~celery_anarchon.operate.entry_detail.entry_detail`, every value escaped.

    :param name: the entry's name as asked for (the heading; the 404 page names it).
    :param error: why there is no data (an unknown entry, the store unreachable), shown instead.
    :param params: the request's query parameters the paging links keep (``limit``).
    :raises ConfigError: Jinja2 (the ``web`` extra) is not installed.
    """
    params = {k: v for k, v in (params or {}).items() if k == "limit"}
    history = (data or {}).get("history") or {}
    now_ms = times.to_ms((data or {}).get("generated")) or int(time.time() * 1000)
    links = {"newest": page_link(params) if history.get("before") is not None else None,
             "older": (page_link(params, before=history["next_before"])
                       if history.get("next_before") is not None else None)}
    return _template("entry.html").render(d=data, name=name, error=error, links=links,
                                          classes=COLOURS,
                                          ago=functools.partial(time_tag, now_ms=now_ms))


def _store_ms(data: dict) -> int | None:
    """The store's clock when the status data was read, UTC ms (``None``: not known): the
    page's script makes run-now request ids of it."""
    import datetime
    try:
        return round(datetime.datetime.fromisoformat(data["store"]["clock"]).timestamp() * 1000)
    except (KeyError, TypeError, ValueError):
        return None


def _when(value) -> str:
    """An ISO time as the page shows it: ``2026-03-29 01:00:00Z`` (milliseconds dropped)."""
    if not isinstance(value, str) or "T" not in value:
        return "" if value is None else str(value)
    day, time_ = value.split("T", 1)
    return f"{day} {time_[:8]}Z" if time_.endswith(("Z", "+00:00")) else f"{day} {time_}"


#: the strip's colours: (colour class, what it means, the history events it shows)
LEGEND = (
    ("ok", "sent (leased: finished)", ("sent", "finished")),
    ("busy", "claimed, running (leased: started)", ("claimed", "started")),
    ("takeover", "taken over: its runner presumed dead, sent again as a new attempt (an "
     "orange top: the later attempt of a run taken over)", ("taken_over",)),
    ("send-failed", "send failed: the winner could not publish it until max_late",
     ("send_failed",)),
    ("bad", "failed: send unknown, unconfirmed, store unreachable, given up",
     ("send_unknown", "unconfirmed", "store_unreachable", "unknown", "given_up")),
    ("skip", "skipped: late, early, forgotten, overlapping, superseded",
     ("late", "late_local", "early", "forgotten", "overlapping", "superseded")),
    ("paused", "paused", ("paused",)),
    ("missed", "missed: no instance claimed it in time (no beat ran, or none reached the store)",
     ("missed",)),
)
#: history event -> the strip's colour class (an event not listed: "other")
COLOURS = {event: colour for colour, _, events in LEGEND for event in events}
#: the colour classes of runs that went wrong: listed under "Recent skips", and an entry with
#: one among the runs shown needs attention (a new store's first refusals aside)
WRONG = ("skip", "bad", "send-failed", "missed")
#: the mark of a run with an earlier attempt taken over, beside its own colour (CSS class)
TAKEN_MARK = "taken"
#: the skips the page lists under "Recent skips", at most
SKIPS_SHOWN = 20
#: why an entry needs attention, in words, for the events whose value is not the word
_WORDS = {"send_failed": "send failed", "taken_over": "taken over"}


def taken_over(run: dict) -> bool:
    """Whether a run of the status data was taken over: its record is the takeover, or it keeps
    a takeover among its earlier attempts' records (docs/design.md "Leases")."""
    return run.get("event") == "taken_over" or any(
        x.get("event") == "taken_over" for x in run.get("earlier") or ())


def run_classes(run: dict) -> str:
    """The CSS classes of a run's cell in the strip: its colour (:data:`COLOURS`) and
    :data:`TAKEN_MARK` when an earlier attempt of it was taken over."""
    colour = COLOURS.get(run.get("event"), "other")
    return f"{colour} {TAKEN_MARK}" if colour != "takeover" and taken_over(run) else colour


def recent_skips(data: dict, limit: int = SKIPS_SHOWN) -> list[tuple[str, dict]]:
    """The newest skipped or failed runs of every entry of the status data ``data``, newest slot
    first: ``(entry name, run)`` pairs, at most ``limit``."""
    found = [(e["name"], r) for e in data.get("entries", ()) for r in e.get("runs", ())
             if COLOURS.get(r.get("event")) in WRONG]
    return sorted(found, key=lambda pair: pair[1]["slot"], reverse=True)[:limit]


def attention(entry: dict, disagreeing: Collection[str] = ()) -> str | None:
    """Why an entry of the status data needs attention (something to do), or ``None``:

    ``"unknown"`` (the store cannot be read), ``"paused"``, ``"pause kept"`` (a live instance
    keeps its pause from before the store lost it), ``"problem"`` (it breaks a start-up rule),
    ``"overdue"`` (its newest due slot has no record), ``"definitions disagree"`` (its name is
    in ``disagreeing``: live instances send the slots of different definitions), ``"store lost
    data"`` (a live instance keeps it from before the store's loss), ``"lease expired"``, then
    the newest of its runs shown that was ``"taken over"``, whose send failed (``"send
    failed"``) or that went otherwise wrong (its event: ``"late"``, ``"missed"``,
    ``"given_up"``, ...). A new store's first refusals (``new_store``: the amnesia protection,
    expected once) are no such run.

    :param disagreeing: the names of the status data's ``disagreements``.
    """
    if entry.get("state") == "unknown":
        return "unknown"
    if entry.get("paused"):
        return "paused"
    if entry.get("state") == "kept":
        return "pause kept"
    if entry.get("problem"):
        return "problem"
    if entry.get("state") == "overdue":
        return "overdue"
    if entry.get("name") in disagreeing:
        return "definitions disagree"
    if entry.get("kept"):
        return "store lost data"
    if (entry.get("lease") or {}).get("expired"):
        return "lease expired"
    for run in entry.get("runs") or ():
        if taken_over(run):
            return "taken over"
        event = run.get("event")
        if COLOURS.get(event) in WRONG and not run.get("new_store"):
            return _WORDS.get(event, event)
    return None


def _number(value, default: int, low: int, high: int) -> int:
    try:
        return min(max(int(value), low), high)
    except (TypeError, ValueError):
        return default


def entries_page(entries: list[dict], *, query: str | None = None, page: str | int | None = 1,
                 per_page: str | int | None = PER_PAGE, disagreeing: Collection[str] = ()) -> dict:
    """One page of the status page's entries: those whose name contains ``query`` (ignoring
    case), the ones needing :func:`attention` first (the overdue ones, then the others, each by
    name), then the others (by name).

    :param query: ``?q=``; empty or ``None``: every entry.
    :param page: ``?page=``, from 1; held within the pages (not a number: 1).
    :param per_page: ``?per_page=``, held within 1 .. :data:`MAX_PER_PAGE` (not a number:
        :data:`PER_PAGE`).
    :returns: ``{entries: [(entry, attention or None)], query, page, pages, per_page, first,
        last (1-based positions shown, 0 when none), matching, total, attention (matching entries
        needing it), needing ([(name, why)] of every matching entry needing it, in that order)}``;
        never raises.
    :param disagreeing: the names of entries whose definitions disagree (:func:`attention`).
    """
    query = (query or "").strip()
    needle = query.casefold()
    found = [(e, attention(e, disagreeing)) for e in entries
             if not needle or needle in str(e.get("name", "")).casefold()]
    found.sort(key=lambda pair: (pair[1] is None, pair[1] != "overdue",
                                 str(pair[0].get("name", ""))))
    size = _number(per_page, PER_PAGE, 1, MAX_PER_PAGE)
    pages = max(1, -(-len(found) // size))
    number = _number(page, 1, 1, pages)
    start = (number - 1) * size
    shown = found[start:start + size]
    return {"entries": shown, "query": query, "page": number, "pages": pages, "per_page": size,
            "first": start + 1 if shown else 0, "last": start + len(shown),
            "matching": len(found), "total": len(entries),
            "attention": sum(1 for _, why in found if why is not None),
            "needing": [(e.get("name"), why) for e, why in found if why is not None]}


def page_link(params: dict[str, str], **changes) -> str:
    """The page's own URL (``?...``) with ``params`` and ``changes`` (a ``None`` value drops
    its parameter)."""
    merged = {**params, **{k: v for k, v in changes.items()}}
    return "?" + urlencode({k: v for k, v in merged.items() if v not in (None, "")})

