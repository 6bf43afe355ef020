"""The bodies of the operators' reports of the store: ``status`` and ``history``
(:mod:`celery_anarchon.operate.cli` declares them and imports this module only when one runs).
``check`` and ``next`` are in :mod:`celery_anarchon.operate.cli.rules`.

Exit codes (docs/production.md "Command line for operators"): ``status`` 0, 1 when the store
cannot be reached, 7 with ``--fail-if-no-instance`` when no live beat instance runs; ``history``
0, 1 store unreachable, 2 a bad ``--since``, 3 unknown entry.
"""
from __future__ import annotations

import datetime
import json
import re
import time

import click

from celery_anarchon import limits
from celery_anarchon._util import iso
from celery_anarchon.errors import ConfigError, UnknownEntry
from celery_anarchon.limits import FIRST_MS, LAST_SLOT_MS
from celery_anarchon.operate import checks as testing
from celery_anarchon.operate.cli.entries import (
    EXIT_FAILURE, EXIT_NO_INSTANCE, _exit_codes, _open, _table, as_typed, zone_of_entry,
)
from celery_anarchon.operate.cli.narrow import View, in_zone, relative, to_ms
from celery_anarchon.operate.names import normal_name
from celery_anarchon.operate.overdue import OVERDUE, overdue_line
from celery_anarchon.operate.overview import (
    dumps, lost_lines, overview, refused_lines, run_json,
)

#: ``--since`` durations: ``90s``, ``15m``, ``1h``, ``1h30m``, ``2d``, ``1w``
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([wdhms])")
_UNIT_S = {"w": 604_800, "d": 86_400, "h": 3_600, "m": 60, "s": 1}


# -- status -------------------------------------------------------------------------------------

def status(app, runs: int, as_json: bool, fail_if_no_instance: bool = False,
           wide: bool = True, utc: bool = True) -> None:
    """``status``: :func:`celery_anarchon.operate.overview.overview` as text, or as JSON
    (``--json``). Exit 1 when the store cannot be reached; with ``fail_if_no_instance``,
    :data:`EXIT_NO_INSTANCE` when no live, ticking beat instance runs the namespace (a probe's
    answer). ``wide``: whole cells and lines, else within 120 columns; ``utc``: ISO 8601 UTC
    times, else relative to the store's clock (:mod:`~celery_anarchon.operate.cli.narrow`)."""
    with _exit_codes():
        settings, store = _open(app)
        try:
            data = overview(app, store, settings, runs=runs, next_count=1)
        finally:
            store.close()
    if as_json:
        click.echo(dumps(data))
    else:
        now_ms = to_ms(data["store"].get("clock")) or int(time.time() * 1000)
        _print_status(data, View(wide, now_ms, utc))
    if not data["store"]["reachable"]:
        raise click.exceptions.Exit(EXIT_FAILURE)
    if fail_if_no_instance and not any(r["ticking"] for r in data["instances"] or ()):
        listed = len(data["instances"] or ())
        stale = f" ({listed} listed, every one stale)" if listed else ""
        beat = as_typed("celery anarchon").rsplit(" ", 1)[0] + " beat"
        click.echo(f"status: {NO_LIVE_INSTANCE}{stale}; exit {EXIT_NO_INSTANCE} "
                   f"(--fail-if-no-instance). Fix: start beat on at least one host ({beat}, or "
                   "worker -B)" + (", or look at why the stale ones stopped ticking" if listed
                                   else ""), err=True)
        raise click.exceptions.Exit(EXIT_NO_INSTANCE)


def _print_status(data: dict, view: View) -> None:
    s = data["store"]
    click.echo(f"store: {s['url']} ({s['kind']})  namespace: {data['namespace']}")
    if not s["reachable"]:
        click.echo(f"store unreachable: {s['error']}")
    elif s["clock"] is not None:
        click.echo(f"store clock: {s['clock']}  (this host is {s['skew_ms'] / 1000:+.3f} s off)")
    if s["durability"]:
        click.echo(f"durability: {s['durability']}")
    for warning in s["warnings"]:
        click.echo(f"warning: {warning}")
    for line in lost_lines(data):
        click.echo(as_typed(line))
    for line in refused_lines(data):        # whole: the error ends with its fix
        click.echo(line)
    if data["instance_records"]:
        _print_instances(data, view)
    else:
        click.echo(f"\n(the {s['kind']} store keeps no instance records)")
    _print_entries(data, view)


#: the warning of a namespace no live, ticking beat instance runs (as the status page says it)
NO_LIVE_INSTANCE = "no live beat instance: nothing is being sent"


def _print_instances(data: dict, view: View) -> None:
    if data["instances"] is None:
        click.echo("\nlive instances: unknown (the store cannot be read)")
        return
    click.echo(f"\nlive instances: {len(data['instances'])}")
    if not any(r["ticking"] for r in data["instances"]):
        stale = " (every one listed is stale)" if data["instances"] else ""
        click.echo(f"warning: {NO_LIVE_INSTANCE}{stale}")
    for r in data["instances"]:
        skew = "?" if r["skew_ms"] is None else f"{r['skew_ms']:+d} ms"
        who = f"{r['host']}:{r['pid']}  {r['instance_id']}"
        ticked = (f"STALE: last tick {view.when(r['last_tick'])} (ticks stopped?)" if r["stale"]
                  else f"last tick {view.when(r['last_tick'])}")   # first, where a cut keeps it
        click.echo(view.row(f"  {who}  {ticked}  version {r['version']}  started "
                            f"{view.when(r['started'])}  skew {skew}  {r['entries']} entries"))
    for who in data["unsaved"]:
        click.echo(f"  ({who}: its entries are not saved yet)")
    if data["partial"]:
        click.echo("\nbeat_schedule entries only some instances run (removed from, or not yet "
                   "added to, the others):")
        for p in data["partial"]:
            click.echo(f"  {p['entry']}: run by {', '.join(p['run_by'])}; "
                       f"not by {', '.join(p['not_run_by'])}")
    if data["disagreements"]:
        click.echo("\ninstances that disagree (each sends the slots of its own definition):")
        for d in data["disagreements"]:
            click.echo(f"  {d['entry']}:")
            for v in d["definitions"]:
                source = f" ({_SOURCE_WORDS[v['source']]})" if d["fix"] else ""
                click.echo(view.row(f"    {v['fingerprint']}{source} on "
                                    f"{', '.join(v['instances'])}: "
                                    f"{v['definition'] or 'definition not saved'}"))
            if d["fix"]:
                click.echo(f"    {as_typed(d['fix'])}")


#: how status names where an instance takes an entry from
_SOURCE_WORDS = {"config": "beat_schedule", "store": "store entry"}


def _state(e: dict, view: View) -> str:
    if e["state"] == "unknown":
        return "unknown (store unreachable)"
    if e["paused"]:
        p = e["paused"]
        return f"paused by {p['by']}" + (f": {p['reason']}" if p["reason"] else "")
    if e["state"] == "kept":
        return "paused (kept by " + ", ".join(k["instance"] for k in e["kept"]
                                              if k["what"] == "pause") + ")"
    if e["problem"]:
        return "problem"
    if e["state"] == "ended":
        return f"ended {_at(e['end_at'], view)}"
    if e["state"] == "waiting":
        state = f"starts {_at(e['start_at'], view)}"
    elif e["state"] == OVERDUE:
        state = OVERDUE
    else:
        state = "running" + (f" (ends {_at(e['end_at'], view)})" if e.get("end_at") else "")
    return f"{state}; {NOTHING_SENDS}" if e.get("unsent") else state


def _at(text: str, view: View) -> str:
    """An instant after a verb: ``at 2026-03-05T09:00:00.000+00:00`` (``--utc``), else ``in 3
    h`` or ``2 d ago``."""
    return f"at {text}" if view.utc else view.when(text)


#: an entry's state when no live beat instance sends anything (``unsent``)
NOTHING_SENDS = "nothing sends it (no live beat)"


def _print_entries(data: dict, view: View) -> None:
    entries = data["entries"]
    click.echo(f"\nentries: {len(entries)}")
    rows = [("NAME", "SOURCE", "SCHEDULE", "TASK", "NEXT", "LAST", "STATE")]
    for e in entries:
        last = f"{e['last']['event']} {view.when(e['last']['slot'])}" if e["last"] else "-"
        source = e["source"] + (" (store copy ignored)" if e["shadowed"] else "")
        rows.append((e["name"], source, e["schedule"] or "-", e["task"] or "-",
                     view.when(e["next"][0]) if e["next"] else "-", last, _state(e, view)))
    _table(view.table(rows, keep=(4, 5, 6)))     # NEXT, LAST, STATE: cut last
    pauses = [e for e in entries if e["paused"]]
    if not data["store"]["reachable"]:
        click.echo("\npauses: unknown (the store cannot be read)")
    else:
        click.echo(f"\npauses: {len(pauses)}")
    for e in pauses:
        click.echo(view.row(f"  {e['name']}: {_state(e, view)} (since "
                            f"{view.when(e['paused']['since'])})"))
    if data["run_now"]:
        click.echo(f"\nrun-now requests: {len(data['run_now'])}")
        for r in data["run_now"]:
            click.echo(view.row(f"  {r['entry']}: request {r['request_id']}, slot "
                                f"{view.when(r['slot'])}, by {r['by']}"))
    late = [e for e in entries if e["state"] == OVERDUE]
    if late:
        click.echo(f"\noverdue entries: {len(late)}")
        for e in late:
            click.echo(f"  {overdue_line(e['name'], e['due'])}")
    problems = [e for e in entries if e["problem"]]
    if problems:
        click.echo(f"\nentries that break a rule (beat refuses them): {len(problems)}")
        for e in problems:
            click.echo(f"  {e['problem']}")
    for e in entries:
        if not e["runs"] and not e["lease"]:
            continue
        click.echo(f"\n{e['name']}")
        for r in e["runs"]:
            click.echo(view.row(f"  {view.when(r['slot'])}  {r['event']:<17} {r['instance']}  "
                                f"attempt {r['attempt']}  {r['task_id']} {r['detail']}".rstrip()))
            for x in reversed(r["earlier"]):    # the run's earlier attempts, newest first
                click.echo(view.row(f"    before: attempt {x['attempt']} {x['event']:<11} "
                                    f"{x['instance']}  {x['task_id']} {x['detail']}".rstrip()))
        if e["lease"]:
            lease = e["lease"]
            click.echo(view.row(
                f"  lease of {view.when(lease['slot'])}: {lease['state']}, attempt "
                f"{lease['attempt']}, held by {lease['holder'] or '-'}, token {lease['token']}, "
                f"expires {view.when(lease['expires'])}{' (expired)' if lease['expired'] else ''}"))


# -- history ------------------------------------------------------------------------------------

def parse_since(text: str, now_ms: int, *, option: str = "--since", sign: int = -1) -> int:
    """``--since``: an ISO 8601 instant (no zone: UTC) or a duration before ``now_ms`` (``90s``,
    ``15m``, ``1h30m``, ``2d``, ``1w``), as UTC ms.

    :param option: the option's name in the error message.
    :param sign: -1: a duration is before ``now_ms`` (``--since``); +1: after it (``--after``).
    :raises click.BadParameter: neither, with examples of both, or an instant outside the years
        1 to 9999.
    """
    value = " ".join(text.split())
    # a duration as the examples below write it: "2d ago", "in 1h", "1h from now"
    for word in ((" ago",) if sign < 0 else ("in ", " from now")):
        if word.startswith(" ") and value.endswith(word):
            value = value[:-len(word)]
        elif value.startswith(word):
            value = value[len(word):]
    if value and _DURATION.sub("", value) == "":
        seconds = sum(float(n) * _UNIT_S[u] for n, u in _DURATION.findall(value))
        at_ms = now_ms + sign * seconds * 1000
        if not FIRST_MS <= at_ms <= LAST_SLOT_MS:      # inf included
            when = "before the year 1" if sign < 0 else "after the year 9999"
            raise click.BadParameter(
                f"{text!r} {'ago' if sign < 0 else 'from now'} is {when}; fix: give a shorter "
                "duration, or an ISO 8601 time such as 2026-03-29T00:00:00Z",
                param_hint=f"'{option}'")
        return int(at_ms)
    try:
        at = datetime.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
        if at.tzinfo is None:
            at = at.replace(tzinfo=datetime.timezone.utc)
        return int(at.timestamp() * 1000)
    except (ValueError, OverflowError):
        example = "in 1h, 30m, 1h30m, 2d from now" if sign > 0 else "1h, 30m, 1h30m, 2d ago"
        raise click.BadParameter(f"{text!r} is neither an ISO 8601 time nor a duration; fix: give "
                                 f"e.g. 2026-03-29T00:00:00Z, or a duration: {example}",
                                 param_hint=f"'{option}'") from None


def parse_after(text: str, now_ms: int) -> int:
    """``next --after``: an ISO 8601 instant (no zone: UTC) or a duration from ``now_ms`` on
    (``1h``: one hour from now), as UTC ms.

    :raises click.BadParameter: neither (naming ``--after``).
    """
    return parse_since(text, now_ms, option="--after", sign=1)


def history(app, entry: str, since: str | None, limit: int | None, as_json: bool, *,
            utc: bool = True) -> None:
    """``history ENTRY``: every run the store remembers of ``entry`` (its name in Unicode NFC,
    as beat records it), newest first. ``utc``: slots and when each was recorded in ISO 8601
    UTC, as ``--json`` gives them; else each slot in the entry's zone (to the second, with its
    offset) and when it was recorded relative to now."""
    given, entry = entry, normal_name(entry)
    with _exit_codes():
        settings, store = _open(app)
        try:
            since_ms = None if since is None else parse_since(since, int(time.time() * 1000))
            # a name no store can encode (a lone surrogate) has no runs: beat refuses it
            records = store.history.read(entry) if limits.undecodable(entry) is None else []
            if not records:   # given: a name stored unnormalized is known by its exact form
                _known_or_fail(app, store, given)
            zone = None if utc or as_json else zone_of_entry(app, store, entry)
        finally:
            store.close()
    runs = [run_json(r) for r in records if since_ms is None or r.slot_ms >= since_ms]
    runs = runs if limit is None else runs[:limit]
    if as_json:
        click.echo(json.dumps(runs, sort_keys=True))
        return
    if not runs:
        click.echo(f"{entry}: no runs" + (f" since {iso(since_ms)}" if since_ms is not None else "")
                   + " in the store's history")
        return
    now_ms = int(time.time() * 1000)
    slot = (lambda text: text) if zone is None else (lambda text: in_zone(text, zone))  # noqa: E731
    rows = [("SLOT", "EVENT", "INSTANCE", "ATTEMPT", "TASK ID", "RECORDED", "REASON")]
    for r in runs:
        # a run taken over: its record, then what its earlier attempts recorded (newest first)
        for x in (r, *reversed(r["earlier"])):
            at = (x["at"] or "-") if zone is None else relative(x["at"], now_ms)
            rows.append((slot(x["slot"]), x["event"], x["instance"] or "-", str(x["attempt"]),
                         x["task_id"] or "-", at, x["detail"] or "-"))
    _table(rows)


def _known_or_fail(app, store, entry: str) -> None:
    """Nothing in the history: an unknown name is exit 3, a known one has no runs yet."""
    try:
        testing.plan_of(app, entry, store=store)
    except UnknownEntry:
        raise
    except ConfigError:  # a known entry that breaks a rule: still a known name
        pass



__all__ = ["status", "history", "parse_since", "parse_after"]
