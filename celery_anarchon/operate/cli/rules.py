"""The bodies of ``check`` and ``next``: what beat's start-up rules and its slot math say of
the app's entries, without running beat (:mod:`celery_anarchon.operate.cli` declares them and
imports this module only when one runs).

Exit codes (docs/production.md "Command line for operators"): ``check`` 0 when every rule
passes, 1 otherwise; ``check --overdue`` 0 when no entry is overdue, 5 when one is, 1 when the
store cannot be read; ``next`` 0, 2 the entry breaks a rule, 3 unknown entry.
"""
from __future__ import annotations

import datetime
import json
import shlex
import time

import click

from celery_anarchon._util import iso
from celery_anarchon.errors import ConfigError, StoreError
from celery_anarchon.messages import is_installed
from celery_anarchon.operate import checks as testing
from celery_anarchon.operate.cli.entries import (
    EXIT_FAILURE, EXIT_OVERDUE, _exit_codes, _open, _table, as_typed, import_task_modules,
)
from celery_anarchon.operate.cli.narrow import in_zone, relative
from celery_anarchon.operate.cli.reports import parse_after
from celery_anarchon.operate.config import check_task
from celery_anarchon.operate.overdue import OVERDUE, UNKNOWN, overdue_line
from celery_anarchon.operate.overview_entries import zone_of
from celery_anarchon.schedule import as_data
from celery_anarchon.schedule import definition as entry_json
from celery_anarchon.schedule.plan import EntryPlan
from celery_anarchon.schedule.slots.window import window_json
from celery_anarchon.schedule.timing import check_sync_interval
from celery_anarchon.schedule.zones import zone_name
from celery_anarchon.settings import Settings, make_instance_id, open_app_store


# -- check --------------------------------------------------------------------------------------

class _Report:
    """The lines of ``check``: ``ok``, ``warn`` (ending with the warning's name), ``ack`` (a
    warning ``anarchon_acknowledge`` names) and ``FAIL`` (with the rule)."""

    def __init__(self) -> None:
        self.failed = 0
        self.passed = 0
        self.warned = 0
        self.acked = 0
        #: ``anarchon_acknowledge``, once the settings are read
        self.acknowledged: tuple[str, ...] = ()
        #: the names of the warn lines printed (for the fix of a --strict failure)
        self.names: list[str] = []

    def ok(self, what: str) -> None:
        self.passed += 1
        click.echo(f"ok    {what}")

    def warn(self, what: str, name: str) -> None:
        """A warning named ``name`` (a key of
        :data:`~celery_anarchon.settings.CHECK_WARNINGS`): acknowledged, or counted."""
        if name in self.acknowledged:
            self.acked += 1
            click.echo(f"ack   {as_typed(what)} [{name}: acknowledged]")
            return
        self.warned += 1
        self.names.append(name)
        click.echo(f"warn  {as_typed(what)} [{name}]")

    def fail(self, problem: testing.Problem) -> None:
        self.failed += 1
        label = problem.entry or getattr(problem, "setting", None) or "configuration"
        click.echo(f"FAIL  {label}: {problem.rule}\n      {as_typed(problem.message)}")


#: the settings that say which store to check: without them, check stops at their problem
_WHERE = ("anarchon_store_url", "anarchon_store_options", "anarchon_namespace")


class _ConfWithout(dict):
    """``app.conf`` without the settings that failed; Celery's own (``broker_url``, ...) are
    read through as attributes, as :meth:`Settings.from_app` reads them."""

    def __init__(self, conf, dropped: set[str]) -> None:
        super().__init__((k, v) for k, v in conf.items() if k not in dropped)
        self._conf = conf

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._conf, name)


class _WithoutSettings:
    """The app as :meth:`Settings.from_app` reads it, without the settings that failed (each
    then has its default), so that the other checks still run."""

    def __init__(self, app, dropped: set[str]) -> None:
        self.main = app.main
        self.conf = _ConfWithout(app.conf, dropped)
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
    report.acknowledged = settings.acknowledged
    try:
        one_host = settings.store_warning
        store = open_app_store(settings, instance_id="cli:" + make_instance_id())
    except ConfigError as exc:
        report.fail(testing.problem_of(None, exc))
        _summary(report, strict)
    try:
        _check_all(app, settings, store, use_store, report)
        if one_host is None and store.kind == "sqlite":
            one_host = (f"anarchon store: the SQLite store {store.safe_url} coordinates the beat "
                        "processes of this one host only; set anarchon_store_url to a Redis or "
                        "PostgreSQL URL that every host reaches to run beat on several hosts, or, "
                        "on one host, acknowledge it: anarchon_acknowledge = [\"sqlite-one-host\"]")
        if one_host:
            report.warn(one_host, "sqlite-one-host")
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
    if use_store and _store_made(settings, store, report):
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
        report.warn(warning, "entry-timing")


def _store_made(settings: Settings, store, report: _Report) -> bool:
    """Whether the store holds the namespace's data, read without creating anything: a store
    beat has not made yet is an ``ok`` line and is checked no further (preparing it would start
    its memory at ``check``, not at beat's first start). A store that cannot tell without
    creating itself (:meth:`~celery_anarchon.stores.base.ClaimStore.exists`) is checked."""
    try:
        made = store.exists()
    except StoreError as exc:
        report.fail(testing.Problem(None, "the store reachable", str(exc)))
        return False
    if made is False:
        report.ok(f"store reachable, not created yet: namespace {settings.namespace!r} has no "
                  f"data in {store.safe_url}; beat's first start creates it (check creates "
                  "nothing)")
        relative = getattr(store, "relative_warning", lambda: None)()   # SQLite: a relative path
        if relative:
            report.warn(relative, "store-setup")
    return made is not False


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
        report.warn(warning, "store-setup")
    if store.entries is None:
        return {}
    try:
        stored = store.entries.load_entries().entries
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
            report.warn(str(exc), "task-not-registered")


def _check_live_definitions(store, plans: dict[str, EntryPlan], report: _Report) -> None:
    """A ``warn`` line per config entry whose definition here differs from a live instance's
    (its fingerprint): expected during a rolling deploy, not a failure."""
    instances = store.instances
    if instances is None:
        return
    try:
        live = instances.instances()
        mappings = {r.fingerprints_digest: instances.load_fingerprints(r.fingerprints_digest)
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
                        "during a rolling deploy, else deploy one beat_schedule everywhere",
                        "definitions-differ")


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _summary(report: _Report, strict: bool) -> None:
    """The last line, every count in it: ``check: all 7 passed``; ``check: 7 passed, 1
    warning``; ``check: 2 problems, 4 passed, 1 warning``; ``check: 1 warning (--strict), 6
    passed``."""
    warned = f", {_count(report.warned, 'warning')}" if report.warned else ""
    acked = f", {report.acked} acknowledged" if report.acked else ""
    if report.failed:
        click.echo(f"check: {_count(report.failed, 'problem')}, {report.passed} passed{warned}"
                   f"{acked}")
        raise click.exceptions.Exit(1)
    if strict and report.warned:
        names = ", ".join(f'"{n}"' for n in dict.fromkeys(report.names))
        click.echo(f"(--strict fails on a warning; to accept one for good, name it in the app's "
                   f"settings: anarchon_acknowledge = [{names}])")
        click.echo(f"check: {_count(report.warned, 'warning')} (--strict), {report.passed} passed"
                   f"{acked}")
        raise click.exceptions.Exit(1)
    if report.warned or report.acked:
        click.echo(f"check: {report.passed} passed{warned}{acked}")
    else:
        click.echo(f"check: all {report.passed} passed")


# -- check --overdue ------------------------------------------------------------------------------

def overdue(app) -> None:
    """``check --overdue``: one line per overdue entry (its newest due slot, how long past its
    deadline), a ``warn`` line per entry the store cannot vouch for, and exit
    :data:`~celery_anarchon.operate.cli.entries.EXIT_OVERDUE` when any entry is overdue, 1 when
    the store cannot be read, else 0 (a health check or a Kubernetes probe)."""
    from celery_anarchon.operate.overview import overview
    with _exit_codes():
        settings, store = _open(app)
        try:
            data = overview(app, store, settings, runs=0, next_count=0)
        finally:
            store.close()
    if not data["store"]["reachable"]:
        click.echo(f"FAIL  store unreachable: {data['store']['error']}")
        raise click.exceptions.Exit(EXIT_FAILURE)
    entries = data["entries"]
    late = [e for e in entries if e["state"] == OVERDUE]
    for e in late:
        click.echo(f"OVERDUE  {overdue_line(e['name'], e['due'])}")
    warned = 0
    for e in entries:
        if e["due"] is not None and e["due"]["state"] == UNKNOWN:
            slot = f"newest due slot {e['due']['slot']}: " if e["due"]["slot"] else ""
            click.echo(f"warn  {e['name']}: cannot tell whether it is overdue: {slot}"
                       f"{e['due']['why']}")
            warned += 1
    if entries and all(e["unsent"] for e in entries):
        click.echo("warn  no live beat instance: nothing is sending any entry")
        warned += 1
    total = (f"({len(entries)} entr{'y' if len(entries) == 1 else 'ies'}"
             + (f", {_count(warned, 'warning')})" if warned else ")"))
    if late:
        click.echo(f"check --overdue: {len(late)} entr{'y' if len(late) == 1 else 'ies'} overdue "
                   f"{total}")
        raise click.exceptions.Exit(EXIT_OVERDUE)
    click.echo(f"check --overdue: no entry overdue {total}")


# -- next ---------------------------------------------------------------------------------------

def _words(plan: EntryPlan) -> str:
    try:
        return as_data.describe_schedule(as_data.from_entry(plan.entry)["schedule"])
    except Exception:  # a schedule class of the user's: its canonical text
        return plan.slots.describe()


def _offset(local: datetime.datetime) -> str:
    seconds = int(local.utcoffset().total_seconds())
    sign = "+" if seconds >= 0 else "-"
    return f"{sign}{abs(seconds) // 3600:02d}:{abs(seconds) % 3600 // 60:02d}"


#: ``next``'s pause when the store cannot be read
UNKNOWN_PAUSE = "unknown"


def _pause_of(store, name: str) -> dict | str | None:
    """The entry's pause as data (``by``, ``reason``, ``since``), ``None`` when it runs (or the
    store holds no entries, or beat has not made it yet), :data:`UNKNOWN_PAUSE` when the store
    cannot be read."""
    if store.entries is None:
        return None
    try:
        if store.exists() is False:      # nothing paused there, and nothing created by reading
            return None
        stored = store.entries.load_entries().entries.get(name)
    except StoreError:
        return UNKNOWN_PAUSE
    if stored is None or stored.pause is None:
        return None
    p = stored.pause
    return {"by": p.by, "reason": p.reason, "since": iso(p.at_ms)}


def next_(app, entry: str, n: int, after: str | None, as_json: bool, *,
          utc: bool = False) -> None:
    """``next ENTRY``: the next ``n`` slots in UTC and in the entry's zone, with its offset;
    a pause since how long ago, and a ``start_at`` / ``end_at`` in the entry's zone. ``utc``:
    the slots in UTC only, and every time in ISO 8601 UTC."""
    now_ms = int(time.time() * 1000)
    with _exit_codes():
        settings, store = _open(app)
        try:
            start_ms = now_ms if after is None else parse_after(after, now_ms)
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
            paused = _pause_of(store, plan.name)
        finally:
            store.close()
    zone = zone_of(plan, app)
    rows = []
    for slot in slots:
        local = slot.astimezone(zone)
        rows.append({"utc": slot.isoformat(), "local": local.isoformat(),
                     "offset": _offset(local), "abbreviation": local.tzname()})
    window = window_json(plan.slots)
    catch_up = {"catch_up": plan.timing.catch_up, "catch_up_window": plan.timing.catch_up_window_s}
    if as_json:
        click.echo(json.dumps({"entry": entry, "schedule": _words(plan),
                               "timezone": zone_name(zone), "slots": rows, "paused": paused,
                               **window, **catch_up}, sort_keys=True))
        return
    name = zone_name(zone)
    at = (lambda text: text) if utc else (lambda text: in_zone(text, zone))   # noqa: E731
    if paused == UNKNOWN_PAUSE:
        click.echo(f"{entry}: whether it is paused is unknown (the store cannot be read)")
    elif paused is not None:
        since = paused["since"] if utc else relative(paused["since"], now_ms)
        click.echo(as_typed(
            f"{entry} is paused by {paused['by']} since {since}"
            + (f": {paused['reason']}" if paused["reason"] else "")
            + f"; these slots are recorded paused, not sent, until it is resumed "
            f"(celery anarchon resume {shlex.quote(plan.name)})"))
    if window["start_at"] and start < datetime.datetime.fromisoformat(window["start_at"]):
        click.echo(f"{entry} starts at {at(window['start_at'])} (its start_at)")
    if not rows:
        click.echo(f"{entry} has no more slots: it ended at {at(window['end_at'])} (its end_at)")
        return
    click.echo(f"next {len(rows)} slots of {entry} ({_words(plan)}), in UTC"
               + ("" if utc else f" and in {name}") + ":")
    if utc:
        _table([("UTC",), *((row["utc"],) for row in rows)])
    else:   # a change of offset before the first slot is noted too
        _zone_table(rows, name, _offset(start.astimezone(zone)))
    if plan.timing.catch_up != "newest":
        click.echo(f"catch_up: {_catch_up_words(plan)}")
    if len(rows) < n and window["end_at"]:
        click.echo(f"no slot after these: {entry} ends at {at(window['end_at'])} (its end_at)")


def _zone_table(rows: list[dict], name: str, previous: str | None) -> None:
    """``next``'s slots in UTC and in the entry's zone ``name``, each change of the UTC offset
    named on its line (``previous``: the offset at ``--after``)."""
    table = [("UTC", name, "OFFSET", "")]
    for row in rows:
        local = datetime.datetime.fromisoformat(row["local"])
        change = (f"UTC offset changes from {previous} to {row['offset']} (DST)"
                  if previous is not None and previous != row["offset"] else "")
        table.append((row["utc"], f"{local:%Y-%m-%d %H:%M:%S} {row['abbreviation']}",
                      f"UTC{row['offset']}", change))
        previous = row["offset"]
    _table(table)


def _catch_up_words(plan) -> str:
    """An entry's catch-up policy other than the default, in a few words (``next``)."""
    if plan.timing.catch_up == "none":
        return "none (after an outage, the first slot claimed is the next one)"
    return (f"all (after an outage, every slot within {plan.claim_late_ms / 1000:g} s is "
            f"claimed, oldest first, one every {plan.catch_up_pace_ms / 1000:g} s)")


__all__ = ["check", "overdue", "next_"]
