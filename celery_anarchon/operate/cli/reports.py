"""The bodies of the operators' commands: ``status``, ``history``, ``check`` and ``next``
(:mod:`celery_anarchon.operate.cli` declares them and imports this module only when one runs).

Exit codes (docs/production.md "Command line for operators"): ``status`` 0, or 1 when the store
cannot be reached; ``history`` 0, 1 store unreachable, 2 a bad ``--since``, 3 unknown entry;
``check`` 0 when every rule passes, 1 otherwise; ``next`` 0, 2 the entry breaks a rule, 3
unknown entry.
"""
from __future__ import annotations

import datetime
import json
import re
import time
import zoneinfo

import click

from celery_anarchon import limits
from celery_anarchon.schedule import as_data
from celery_anarchon.schedule import definition as entry_json
from celery_anarchon.operate import checks as testing
from celery_anarchon.schedule.zones import zone_name
from celery_anarchon._util import iso
from celery_anarchon.limits import LAST_SLOT_MS
from celery_anarchon.operate.cli.entries import (
    EXIT_FAILURE, _exit_codes, _open, _table, import_task_modules,
)
from celery_anarchon.errors import ConfigError, StoreError, UnknownEntry
from celery_anarchon.settings import make_instance_id, open_app_store, resolve_store_url
from celery_anarchon.messages import is_installed
from celery_anarchon.operate.overview import dumps, lost_lines, overview, run_json
from celery_anarchon.schedule.plan import EntryPlan
from celery_anarchon.operate.config import check_task
from celery_anarchon.operate.names import normal_name
from celery_anarchon.schedule.slots import CronSlots
from celery_anarchon.stores.entry_store import EntryStore, InstanceStore
from celery_anarchon.schedule.timing import Settings, check_sync_interval

#: ``--since`` durations: ``90s``, ``15m``, ``1h``, ``1h30m``, ``2d``, ``1w``
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([wdhms])")
_UNIT_S = {"w": 604_800, "d": 86_400, "h": 3_600, "m": 60, "s": 1}
#: 0001-01-01T00:00:00Z, UTC ms: the first instant a date holds
_FIRST_MS = -62_135_596_800_000


# -- status -------------------------------------------------------------------------------------

def status(app, runs: int, as_json: bool) -> None:
    """``status``: :func:`celery_anarchon.operate.overview.overview` as text, or as JSON (``--json``)."""
    with _exit_codes():
        settings, store = _open(app)
        try:
            data = overview(app, store, settings, runs=runs, next_count=1)
        finally:
            store.close()
    if as_json:
        click.echo(dumps(data))
    else:
        _print_status(data)
    if not data["store"]["reachable"]:
        raise click.exceptions.Exit(EXIT_FAILURE)


def _print_status(data: dict) -> None:
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
        click.echo(line)
    if data["instance_records"]:
        _print_instances(data)
    else:
        click.echo(f"\n(the {s['kind']} store keeps no instance records)")
    _print_entries(data)


#: the warning of a namespace no live, ticking beat instance runs (as the status page says it)
NO_LIVE_INSTANCE = "no live beat instance: nothing is being sent"


def _print_instances(data: dict) -> None:
    if data["instances"] is None:
        click.echo("\nlive instances: unknown (the store cannot be read)")
        return
    click.echo(f"\nlive instances: {len(data['instances'])}")
    if not any(r["ticking"] for r in data["instances"]):
        stale = " (every one listed is stale)" if data["instances"] else ""
        click.echo(f"warning: {NO_LIVE_INSTANCE}{stale}")
    for r in data["instances"]:
        skew = "?" if r["skew_ms"] is None else f"{r['skew_ms']:+d} ms"
        stale = (f"  STALE: last tick {r['last_tick_age_s']:g} s ago (ticks stopped?)"
                 if r["stale"] else "")
        click.echo(f"  {r['host']}:{r['pid']}  {r['instance_id']}  version {r['version']}  started "
                   f"{r['started']}  last tick {r['last_tick']}  skew {skew}  "
                   f"{r['entries']} entries{stale}")
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
                click.echo(f"    {v['fingerprint']}{source} on {', '.join(v['instances'])}: "
                           f"{v['definition'] or 'definition not saved'}")
            if d["fix"]:
                click.echo(f"    {d['fix']}")


#: how status names where an instance takes an entry from
_SOURCE_WORDS = {"config": "beat_schedule", "store": "store entry"}


def _state(e: dict) -> str:
    if e["state"] == "unknown":
        return "unknown (store unreachable)"
    if e["paused"]:
        p = e["paused"]
        return f"paused by {p['by']}" + (f": {p['reason']}" if p["reason"] else "")
    if e["state"] == "kept":
        return "paused (kept by " + ", ".join(k["instance"] for k in e["kept"]
                                              if k["what"] == "pause") + ")"
    return "problem" if e["problem"] else "running"


def _print_entries(data: dict) -> None:
    entries = data["entries"]
    click.echo(f"\nentries: {len(entries)}")
    rows = [("NAME", "SOURCE", "SCHEDULE", "TASK", "NEXT", "LAST", "STATE")]
    for e in entries:
        last = f"{e['last']['event']} {e['last']['slot']}" if e["last"] else "-"
        source = e["source"] + (" (store copy ignored)" if e["shadowed"] else "")
        rows.append((e["name"], source, e["schedule"] or "-", e["task"] or "-",
                     e["next"][0] if e["next"] else "-", last, _state(e)))
    _table(rows)
    pauses = [e for e in entries if e["paused"]]
    if not data["store"]["reachable"]:
        click.echo("\npauses: unknown (the store cannot be read)")
    else:
        click.echo(f"\npauses: {len(pauses)}")
    for e in pauses:
        click.echo(f"  {e['name']}: {_state(e)} (since {e['paused']['since']})")
    if data["run_now"]:
        click.echo(f"\nrun-now requests: {len(data['run_now'])}")
        for r in data["run_now"]:
            click.echo(f"  {r['entry']}: request {r['request_id']}, slot {r['slot']}, by {r['by']}")
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
            click.echo(f"  {r['slot']}  {r['event']:<17} {r['instance']}  attempt {r['attempt']}  "
                       f"{r['task_id']} {r['detail']}".rstrip())
            for x in reversed(r["earlier"]):    # the run's earlier attempts, newest first
                click.echo(f"    before: attempt {x['attempt']} {x['event']:<11} {x['instance']}  "
                           f"{x['task_id']} {x['detail']}".rstrip())
        if e["lease"]:
            lease = e["lease"]
            click.echo(f"  lease of {lease['slot']}: {lease['state']}, attempt {lease['attempt']}, "
                       f"held by {lease['holder'] or '-'}, token {lease['token']}, expires "
                       f"{lease['expires'] or '-'}{' (expired)' if lease['expired'] else ''}")


# -- history ------------------------------------------------------------------------------------

def parse_since(text: str, now_ms: int, *, option: str = "--since", sign: int = -1) -> int:
    """``--since``: an ISO 8601 instant (no zone: UTC) or a duration before ``now_ms`` (``90s``,
    ``15m``, ``1h30m``, ``2d``, ``1w``), as UTC ms.

    :param option: the option's name in the error message.
    :param sign: -1: a duration is before ``now_ms`` (``--since``); +1: after it (``--after``).
    :raises click.BadParameter: neither, with examples of both, or an instant outside the years
        1 to 9999.
    """
    value = text.strip()
    if value and _DURATION.sub("", value) == "":
        seconds = sum(float(n) * _UNIT_S[u] for n, u in _DURATION.findall(value))
        at_ms = now_ms + sign * seconds * 1000
        if not _FIRST_MS <= at_ms <= LAST_SLOT_MS:      # inf included
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


def history(app, entry: str, since: str | None, limit: int | None, as_json: bool) -> None:
    """``history ENTRY``: every run the store remembers of ``entry`` (its name in Unicode NFC,
    as beat records it), newest first."""
    given, entry = entry, normal_name(entry)
    with _exit_codes():
        settings, store = _open(app)
        try:
            since_ms = None if since is None else parse_since(since, int(time.time() * 1000))
            # a name no store can encode (a lone surrogate) has no runs: beat refuses it
            records = store.history(entry) if limits.undecodable(entry) is None else []
            if not records:   # given: a name stored unnormalized is known by its exact form
                _known_or_fail(app, store, given)
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
    rows = [("SLOT", "EVENT", "INSTANCE", "ATTEMPT", "TASK ID", "RECORDED", "REASON")]
    for r in runs:
        # a run taken over: its record, then what its earlier attempts recorded (newest first)
        for x in (r, *reversed(r["earlier"])):
            rows.append((x["slot"], x["event"], x["instance"] or "-", str(x["attempt"]),
                         x["task_id"] or "-", x["at"] or "-", x["detail"] or "-"))
    _table(rows)


def _known_or_fail(app, store, entry: str) -> None:
    """Nothing in the history: an unknown name is exit 3, a known one has no runs yet."""
    try:
        testing.plan_of(app, entry, store=store)
    except UnknownEntry:
        raise
    except ConfigError:  # a known entry that breaks a rule: still a known name
        pass


# -- check --------------------------------------------------------------------------------------

class _Report:
    """The lines of ``check``: ``ok``, ``warn`` and ``FAIL`` (with the rule)."""

    def __init__(self) -> None:
        self.failed = 0
        self.passed = 0
        self.warned = 0

    def ok(self, what: str) -> None:
        self.passed += 1
        click.echo(f"ok    {what}")

    def warn(self, what: str) -> None:
        self.warned += 1
        click.echo(f"warn  {what}")

    def fail(self, problem: testing.Problem) -> None:
        self.failed += 1
        label = problem.entry or getattr(problem, "setting", None) or "configuration"
        click.echo(f"FAIL  {label}: {problem.rule}\n      {problem.message}")


#: the settings that say which store to check: without them, check stops at their problem
_WHERE = ("anarchon_store_url", "anarchon_store_options", "anarchon_namespace")


class _WithoutSettings:
    """The app as :meth:`Settings.from_app` reads it, without the settings that failed (each
    then has its default), so that the other checks still run."""

    def __init__(self, app, dropped: set[str]) -> None:
        self.main = app.main
        self.conf = {k: v for k, v in app.conf.items() if k not in dropped}
        self._app = app

    @property
    def timezone(self):
        return self._app.timezone


def _settings(app, report: _Report) -> Settings | None:
    """The app's settings; each bad ``anarchon_*`` setting is a FAIL and is checked no further
    (its default stands in, so the other rules are still checked). ``None``: a problem that
    names no setting."""
    dropped: set[str] = set()
    while True:
        try:
            return Settings.from_app(_WithoutSettings(app, dropped) if dropped else app)
        except ConfigError as exc:
            problem = testing.problem_of(None, exc)
            report.fail(problem)
            if problem.setting is None or problem.setting in dropped or problem.setting in _WHERE:
                return None   # without the store's own settings no other check is meaningful
            if problem.setting == "timezone":
                return None   # no entry's slots can be computed without the app's zone
            dropped.add(problem.setting)


def check(app, use_store: bool, strict: bool = False) -> None:
    """``check``: every rule of every entry, the store and the worker side; exit 0 or 1 (with
    ``strict``, a warn line is 1 too)."""
    report = _Report()
    settings = _settings(app, report)
    if settings is None:
        _summary(report, strict)
    try:
        _, _, one_host = resolve_store_url(app, settings)
        store = open_app_store(app, settings, instance_id="cli:" + make_instance_id())
    except ConfigError as exc:
        report.fail(testing.problem_of(None, exc))
        _summary(report, strict)
    try:
        _check_all(app, settings, store, use_store, report)
        if one_host is None and store.kind == "sqlite":
            one_host = (f"anarchon store: the SQLite store {store.safe_url} coordinates the beat "
                        "processes of this one host only; set anarchon_store_url to a Redis or "
                        "PostgreSQL URL that every host reaches to run beat on several hosts.")
        if one_host:
            report.warn(one_host)
    finally:
        store.close()
    _summary(report, strict)


def _check_all(app, settings: Settings, store, use_store: bool, report: _Report) -> None:
    click.echo(f"check: app {app.main!r}, namespace {settings.namespace!r}, store "
               f"{store.safe_url} ({store.kind})")
    try:
        import_task_modules(app)
        modules_imported = True
    except ConfigError as exc:
        report.fail(testing.Problem(None, "the app's modules import", str(exc)))
        modules_imported = False
    try:
        check_sync_interval(settings, store.memory)
        report.ok(f"anarchon_sync_interval {settings.sync_interval_s:g} s against the store's memory")
    except ConfigError as exc:
        report.fail(testing.problem_of(None, exc))
    warnings: list[str] = []
    try:
        config = testing.config_entries(app)
    except ConfigError as exc:             # beat_schedule is not a dict
        report.fail(testing.problem_of(None, exc))
        config = {}
    plans, problems = testing.check_entries(app, config.items(), settings=settings, store=store,
                                            warn=warnings.append)
    _entries(report, "beat_schedule", plans, problems, warnings)
    if use_store:
        config_plans = dict(plans)
        plans.update(_check_store(app, settings, store, report, set(config)))
        _check_live_definitions(store, config_plans, report)
    if modules_imported:
        _check_tasks(app, plans, report)
    leased = sorted(n for n, p in plans.items() if p.timing.lease is not None)
    if leased and is_installed(app):
        report.ok(f"worker side installed (celery_anarchon.install(app)) for {len(leased)} "
                  f"leased entr{'y' if len(leased) == 1 else 'ies'}: {', '.join(leased)}")


def _entries(report: _Report, where: str, plans: dict[str, EntryPlan],
             problems: list[testing.Problem], warnings: list[str]) -> None:
    for problem in problems:
        report.fail(problem)
    for name, plan in sorted(plans.items()):
        report.ok(f"{where} entry {name!r} ({_words(plan)}): every timing rule")
    for warning in warnings:     # what beat would log at start-up about these entries
        report.warn(warning)


def _check_store(app, settings: Settings, store, report: _Report,
                 config: set[str]) -> dict[str, EntryPlan]:
    """The store reachable, what its setup can lose, and its own entries' rules (``config``:
    the names of the config entries, which win over store entries of the same name)."""
    try:
        warnings = store.prepare(())
        now = store.now_ms()
    except StoreError as exc:
        report.fail(testing.Problem(None, "the store reachable", str(exc)))
        return {}
    except ConfigError as exc:  # the store refuses this configuration (e.g. other settings)
        report.fail(testing.Problem(None, "the store accepts this configuration", str(exc)))
        return {}
    durability = getattr(store, "durability", None)
    clock = f", clock {iso(now)}" if now is not None else ""
    report.ok(f"store reachable{clock}"
              + (f", durability {durability}" if isinstance(durability, str) else ""))
    for warning in warnings:
        report.warn(warning)
    if not isinstance(store, EntryStore):
        return {}
    try:
        stored = store.load_entries().entries
    except StoreError as exc:
        report.fail(testing.Problem(None, "the store reachable", str(exc)))
        return {}
    items = []
    for name, e in sorted(stored.items()):
        if e.definition is None or name in config:
            continue
        try:
            items.append((name, entry_json.parse(name, e.definition, app=app)))
        except ConfigError as exc:
            items.append((name, exc))
    warnings: list[str] = []
    plans, problems = testing.check_entries(app, items, settings=settings, store=store,
                                            warn=warnings.append)
    _entries(report, "store", plans, problems, warnings)
    return plans


def _check_tasks(app, plans: dict[str, EntryPlan], report: _Report) -> None:
    """A ``warn`` line per entry whose task this app does not register (after importing its
    modules): a task only the workers know is not an error of the schedule."""
    for name, plan in sorted(plans.items()):
        if plan.entry.task.startswith("celery."):
            continue
        try:
            check_task(app, name, plan.entry.task)
        except ConfigError as exc:
            report.warn(str(exc))


def _check_live_definitions(store, plans: dict[str, EntryPlan], report: _Report) -> None:
    """A ``warn`` line per config entry whose definition here differs from a live instance's
    (its fingerprint): expected during a rolling deploy, not a failure."""
    if not isinstance(store, InstanceStore):
        return
    try:
        live = store.instances()
        mappings = {r.fingerprints_digest: store.load_fingerprints(r.fingerprints_digest)
                    for r in live}
    except (StoreError, ConfigError):   # reachability is reported by _check_store
        return
    for name, plan in sorted(plans.items()):
        others = sorted({f"{r.host}:{r.pid}" for r in live
                         if (m := mappings[r.fingerprints_digest]) is not None
                         and name in m and m[name] != plan.fingerprint})
        if others:
            report.warn(f"entry {name!r}: live beat instance{'s' if len(others) > 1 else ''} "
                        f"{', '.join(others)} run{'' if len(others) > 1 else 's'} another "
                        f"definition (fingerprint differs from {plan.fingerprint} here); expected "
                        "during a rolling deploy, else deploy one beat_schedule everywhere")


def _summary(report: _Report, strict: bool) -> None:
    if report.failed:
        click.echo(f"check: {report.failed} problem{'s' if report.failed > 1 else ''}, "
                   f"{report.passed} passed")
        raise click.exceptions.Exit(1)
    if strict and report.warned:
        click.echo(f"check: {report.warned} warning{'s' if report.warned > 1 else ''} "
                   f"(--strict), {report.passed} passed")
        raise click.exceptions.Exit(1)
    click.echo(f"check: all {report.passed} passed")


# -- next ---------------------------------------------------------------------------------------

def _words(plan: EntryPlan) -> str:
    try:
        return as_data.describe_schedule(as_data.from_entry(plan.entry)["schedule"])
    except Exception:  # a schedule class of the user's: its canonical text
        return plan.slots.describe()


def zone_of(plan: EntryPlan, app) -> datetime.tzinfo:
    """The zone an entry's slots are read in: its crontab's or cron's, else the app's."""
    if isinstance(plan.slots, CronSlots):
        return plan.slots.zone
    tz = app.timezone
    return zoneinfo.ZoneInfo(tz) if isinstance(tz, str) else tz


def _offset(local: datetime.datetime) -> str:
    seconds = int(local.utcoffset().total_seconds())
    sign = "+" if seconds >= 0 else "-"
    return f"{sign}{abs(seconds) // 3600:02d}:{abs(seconds) % 3600 // 60:02d}"


def next_(app, entry: str, n: int, after: str | None, as_json: bool) -> None:
    """``next ENTRY``: the next ``n`` slots in UTC and in the entry's zone, with its offset."""
    with _exit_codes():
        settings, store = _open(app)
        try:
            start_ms = int(time.time() * 1000) if after is None else parse_after(
                after, int(time.time() * 1000))
            try:
                start = datetime.datetime.fromtimestamp(start_ms / 1000, datetime.timezone.utc)
            except (OverflowError, ValueError, OSError):
                raise click.BadParameter(f"{after!r} is outside the years 1-9999",
                                         param_hint="'--after'") from None
            plan = testing.plan_of(app, entry, store=store)
            try:   # the entry is valid (plan_of): what fails here is a slot past the year 9999
                slots = testing.next_slots(app, entry, n, after=start, store=store)
            except (OverflowError, ValueError):
                raise ConfigError(f"entry {entry!r}: its next {n} slots after {start.isoformat()} "
                                  "go past the year 9999; fix: give an earlier --after, or a "
                                  "smaller -n") from None
        finally:
            store.close()
    zone = zone_of(plan, app)
    rows = []
    for slot in slots:
        local = slot.astimezone(zone)
        rows.append({"utc": slot.isoformat(), "local": local.isoformat(),
                     "offset": _offset(local), "abbreviation": local.tzname()})
    if as_json:
        click.echo(json.dumps({"entry": entry, "schedule": _words(plan),
                               "timezone": zone_name(zone), "slots": rows}, sort_keys=True))
        return
    name = zone_name(zone)
    click.echo(f"next {len(rows)} slots of {entry} ({_words(plan)}), in UTC and in {name}:")
    table = [("UTC", name, "OFFSET", "")]
    previous = _offset(start.astimezone(zone))   # a change before the first slot is noted too
    for row in rows:
        local = datetime.datetime.fromisoformat(row["local"])
        change = (f"UTC offset changes from {previous} to {row['offset']} (DST)"
                  if previous is not None and previous != row["offset"] else "")
        table.append((row["utc"], f"{local:%Y-%m-%d %H:%M:%S} {row['abbreviation']}",
                      f"UTC{row['offset']}", change))
        previous = row["offset"]
    _table(table)


__all__ = ["status", "history", "check", "next_", "parse_since", "parse_after", "zone_of"]
