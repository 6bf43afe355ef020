"""The bodies of the ``celery anarchon ...`` commands (:mod:`celery_anarchon.operate.cli` declares them
and imports this module only when a command runs, so that every ``celery`` run stays light).

Each body prints for people (a table, a line) or, with ``--json``, JSON for scripts, and ends
with the exit code of :mod:`celery_anarchon.operate.cli`: 0 done, 1 store unreachable or another
failure, 2 bad input, 3 unknown entry, 4 owned by ``beat_schedule`` or exists already.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import re
import shlex
import time
from collections.abc import Iterator

import click

from celery_anarchon.schedule import as_data
from celery_anarchon.schedule import definition as entry_json
from celery_anarchon.schedule.zones import zone_name
from celery_anarchon._util import iso
from celery_anarchon.settings import Settings, make_instance_id, open_app_store
from celery_anarchon.errors import (
    ConfigError, EntryExists, EntryOwnedByConfig, StoreError, StoreNotReached, UnknownEntry,
)
from celery_anarchon.operate.schedules import Schedules, ScheduledEntry

#: exit codes (documented in docs/schedules.md)
EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_UNKNOWN_ENTRY, EXIT_OWNED_OR_EXISTS = 1, 2, 3, 4
#: ``check --overdue``: an entry is overdue (docs/production.md "Command line for operators")
EXIT_OVERDUE = 5
#: ``status --fail-if-no-instance``: no live, ticking beat instance runs the namespace
EXIT_NO_INSTANCE = 7
#: the flags of add/update that are parts of a definition: flag -> definition key
_PART_FLAGS = {"task": "task", "args_": "args", "kwargs_": "kwargs", "options_": "options",
               "anarchon": "anarchon", "start_at": "start_at", "end_at": "end_at",
               "catch_up": "catch_up", "catch_up_window": "catch_up_window"}
#: what ``update --start-at`` / ``--end-at`` take to remove the bound
_NO_BOUND = ("none", "")
#: what ``update --catch-up`` / ``--catch-up-window`` take to go back to the app's default
_DEFAULT = "default"


@contextlib.contextmanager
def _exit_codes() -> Iterator[None]:
    """Print an error as ``Error: ...`` on stderr and exit with its code."""
    try:
        yield
    except UnknownEntry as exc:
        _fail(exc, EXIT_UNKNOWN_ENTRY)
    except (EntryOwnedByConfig, EntryExists) as exc:
        _fail(exc, EXIT_OWNED_OR_EXISTS)
    except ConfigError as exc:
        _fail(exc, EXIT_BAD_INPUT)
    except StoreError as exc:
        _fail(exc, EXIT_FAILURE)


def _fail(exc: Exception, code: int):
    click.echo(f"Error: {as_typed(str(exc))}", err=True)
    raise click.exceptions.Exit(code)


#: a hint's command in a message (``celery anarchon list``), before :func:`as_typed`
_HINT = re.compile(r"\bcelery anarchon\b")


def as_typed(text: str) -> str:
    """``text`` with each command it hints at (``celery anarchon list``, as the library's
    messages name them) as the operator typed this one (``celery -A proj anarchon list``), so
    that a hint pasted back reaches the same app. Outside a command: ``text`` as it is."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return text
    return _HINT.sub(lambda _: typed_command(ctx), text)


def typed_command(ctx: click.Context) -> str:
    """How the operator ran ``anarchon``, for a command to print: the program as Click names it
    (``celery``) and ``-A`` as given (on the command line or in ``CELERY_APP``)."""
    root = ctx.find_root()
    app = root.params.get("app")
    words = [root.info_name or "celery"]
    if isinstance(app, str) and app:
        words += ["-A", shlex.quote(app)]
    return " ".join([*words, "anarchon"])


@contextlib.contextmanager
def _schedules(app) -> Iterator[Schedules]:
    with _exit_codes(), Schedules(app) as s:
        yield s


def _schedule_of(flags: dict) -> dict | None:
    kinds = [k for k in ("every", "crontab_", "cron") if flags.get(k) is not None]
    if len(kinds) > 1:
        raise click.UsageError("give one schedule: --every, --crontab or --cron")
    if flags.get("timezone") is not None and kinds not in (["crontab_"], ["cron"]):
        raise click.UsageError("--timezone goes with --crontab or --cron (or alone in update, to "
                               "move a crontab or cron entry to another zone)")
    zone = {"timezone": flags["timezone"]} if flags.get("timezone") is not None else {}
    if not kinds:
        return None
    if kinds == ["every"]:
        return {"every": as_data.seconds_json(flags["every"])}
    if kinds == ["cron"]:
        return {"cron": flags["cron"], **zone}
    fields = flags["crontab_"].split()
    if len(fields) != 5:
        raise click.UsageError(f"--crontab {flags['crontab_']!r}: give five fields, "
                               '"minute hour day-of-month month day-of-week" (e.g. "0 3 * * 1-5")')
    return {"crontab": {k: v for k, v in zip(entry_json.CRON_ORDER, fields) if v != "*"}, **zone}


def _parts(name: str, flags: dict) -> dict:
    """The definition parts the flags give (``update`` changes only these)."""
    given = [f for f in (*_PART_FLAGS, "every", "crontab_", "cron", "timezone")
             if flags.get(f) is not None]
    if flags.get("definition") is not None:
        if given:
            raise click.UsageError("--json-definition replaces the other flags: give one or the other")
        entry_json.check_keys(name, flags["definition"])
        return dict(flags["definition"])
    parts = {key: flags[flag] for flag, key in _PART_FLAGS.items() if flags.get(flag) is not None}
    for key in ("start_at", "end_at"):
        if isinstance(parts.get(key), str) and parts[key].strip().lower() in _NO_BOUND:
            parts[key] = None
    for key in ("catch_up", "catch_up_window"):
        if isinstance(parts.get(key), str) and parts[key].strip().lower() == _DEFAULT:
            parts[key] = None
    if isinstance(parts.get("catch_up_window"), str):
        try:
            parts["catch_up_window"] = as_data.seconds_json(float(parts["catch_up_window"]))
        except ValueError:
            raise click.BadParameter(f"{parts['catch_up_window']!r} is not a number of seconds "
                                     "(or 'default')", param_hint="--catch-up-window") from None
    schedule = _schedule_of(flags)
    if schedule is not None:
        parts["schedule"] = schedule
    return parts


def _print_entry(verb: str, entry: ScheduledEntry, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(entry.as_json(), sort_keys=True))
        return
    definition = entry.definition or {}
    what = (f": {as_data.describe_schedule(definition.get('schedule'))} -> "
            f"{definition.get('task')}" if definition else "")
    state = entry.pause.describe() if entry.pause else "running"
    click.echo(f"{verb} {entry.name} ({entry.source}{what}; {state}; version {entry.version})")


def import_task_modules(app) -> None:
    """Import the app's default modules (``imports``, ``include``) as a worker does
    (``app.loader.import_default_modules()``), so that the tasks they define are registered
    before a task name is checked.

    :raises ConfigError: a module cannot be imported (naming it, the setting and the cause).
    """
    try:
        app.loader.import_default_modules()
    except ImportError as exc:
        module = exc.name or "?"
        raise ConfigError(f"app {app.main!r}: cannot import module {module!r} of its imports / "
                          f"include settings ({type(exc).__name__}: {exc}); fix: correct the "
                          "module name in app.conf.include / app.conf.imports, or make it "
                          "importable here (PYTHONPATH, the working directory)") from exc


def _zone_only(flags: dict) -> str | None:
    """``update --timezone`` without ``--crontab`` / ``--cron``: the new zone (the fields are
    kept), else ``None``."""
    if flags.get("timezone") is None or flags.get("definition") is not None:
        return None
    if any(flags.get(k) is not None for k in ("every", "crontab_", "cron")):
        return None
    return flags["timezone"]


def _in_zone(s: Schedules, name: str, zone: str) -> dict:
    """The schedule of entry ``name`` with its time zone set to ``zone`` (``update --timezone``).

    :raises ConfigError: the entry's schedule is not a crontab or cron (it has no zone).
    :raises UnknownEntry: no entry ``name``.
    """
    schedule = (s.get(name).definition or {}).get("schedule")
    if as_data.zoned_kind(schedule) is None:
        what = as_data.describe_schedule(schedule) if isinstance(schedule, dict) else "-"
        raise ConfigError(f"entry {name!r}: --timezone changes the time zone of a crontab or cron "
                          f"schedule, and this entry's schedule is {what}; fix: give --crontab or "
                          "--cron with --timezone")
    return {**schedule, "timezone": zone}


def write(app, name: str, flags: dict, *, create: bool) -> None:
    """``add`` (``create``) or ``update``. ``update --crontab`` / ``--cron`` without
    ``--timezone`` keeps the entry's zone (:meth:`Schedules.update`); ``update --timezone``
    alone changes the zone and keeps the fields."""
    zone_only = None if create else _zone_only(flags)
    if zone_only is not None:
        flags = {**flags, "timezone": None}
    with _exit_codes():
        parts = _parts(name, flags)
        if not flags.get("no_check_task"):
            import_task_modules(app)
    if create and ("task" not in parts or "schedule" not in parts):
        raise click.UsageError("add needs --task and one of --every, --crontab or --cron "
                               "(or --json-definition)")
    if not create and not parts and zone_only is None:
        raise click.UsageError("update needs at least one flag to change (see --help)")
    with _schedules(app) as s:
        if zone_only is not None:
            parts["schedule"] = _in_zone(s, name, zone_only)
        call = s.add if create else s.update
        entry = call(name, **parts, by=flags.get("by"), check_task=not flags.get("no_check_task"))
    _print_entry("added" if create else "updated", entry, flags.get("as_json"))


def remove(app, name: str, by: str | None) -> None:
    with _schedules(app) as s:
        s.remove(name, by=by)
    click.echo(f"removed {name}")


def pause(app, name: str, reason: str, by: str | None, as_json: bool) -> None:
    with _schedules(app) as s:
        entry = s.pause(name, reason, by=by)
    _print_entry("paused", entry, as_json)


def resume(app, name: str, by: str | None, as_json: bool) -> None:
    with _schedules(app) as s:
        entry = s.resume(name, by=by)
    _print_entry("resumed", entry, as_json)


def accept_loss(app, by: str | None, as_json: bool) -> None:
    with _schedules(app) as s:
        at = s.accept_loss(by=by)
        who = by or s.by
    if as_json:
        click.echo(json.dumps({"accepted": iso(at), "by": who}, sort_keys=True))
    else:
        click.echo(f"accepted the loss at {iso(at)} by {who}: every instance that keeps pauses or "
                   "store entries from before a loss of the store's data follows the store as it "
                   "is at its next sync")


def run_now(app, name: str, request_id: str | None, by: str | None, as_json: bool,
            command: str = "celery anarchon", *, utc: bool = True) -> None:
    """``run-now``: the request's id (given, or a new one of the store's clock) is printed with
    the command that repeats the same request; a repeat says so (no new run); a store error
    says the outcome is unknown and prints that command (or, before an id was made from the
    store's clock, that nothing was requested; a store not reached before any write: that
    nothing was changed, with that command).

    :param command: how the operator ran ``anarchon`` (``celery -A proj anarchon``), for the
        printed command.
    :param utc: times in ISO 8601 UTC; else relative to the store's clock, and the slot also in
        the entry's zone (:func:`zone_of_entry`).
    """
    from celery_anarchon.operate.cli.narrow import View, in_zone
    with _schedules(app) as s:
        if request_id is None:
            try:
                request_id = s.new_request_id()        # made from the store's clock
            except StoreNotReached:
                raise                                   # says that nothing was changed
            except StoreError as exc:
                raise StoreError(f"{str(exc).rstrip('.')}; nothing was requested: run the same "
                                 "command again once the store answers") from exc
        again = (f"{command} run-now {shlex.quote(name)} --request-id "
                 f"{shlex.quote(request_id)}")
        try:
            request = s.run_now(name, request_id, by=by)
        except StoreNotReached as exc:
            raise StoreNotReached(f"{exc}: {again}") from exc
        except StoreError as exc:
            raise StoreError(f"{str(exc).rstrip('.')}; the outcome is unknown: repeat the same "
                             f"request (one run, never two): {again}") from exc
        if not (as_json or utc):
            zone, now_ms = zone_of_entry(app, s.store, name), s.store.now_ms()
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(request), sort_keys=True))
        return
    slot, requested = iso(request.slot_ms), iso(request.requested_ms)
    if utc:
        slot_words, when_words = slot, f"at {requested}"
    else:
        view = View(True, now_ms or int(time.time() * 1000))
        slot_words, when_words = view.slot(slot, zone), view.when(requested)
    if request.created:
        click.echo(f"run-now {name}: new request {request.request_id}, slot {slot_words}, by "
                   f"{request.by}" + (f" {when_words}" if utc else ""))
        click.echo(f"to repeat this request if its outcome is ever in doubt (one run, never two): "
                   f"{again}")
    else:
        click.echo(f"run-now {name}: request {request.request_id} was already requested "
                   f"{when_words} by {request.by}: no new run (its slot "
                   f"{slot if utc else in_zone(slot, zone)})")


def _table(rows: list[tuple]) -> None:
    """Print ``rows`` as columns. A cell is shown as text: a stored definition another version
    or a hand edit wrote may hold a value that is no text where text belongs (``{"task": 1}``)."""
    rows = [tuple(cell if isinstance(cell, str) else str(cell) for cell in row) for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


def _app_zone(app) -> str | None:
    """The name of the app's ``timezone`` (a crontab without a zone of its own runs in it), or
    ``None`` when it names no known zone."""
    try:
        return zone_name(app.timezone)
    except Exception:  # an unknown zone: check reports it
        return None


def list_entries(app, as_json: bool, *, utc: bool = True, wide: bool = True) -> None:
    """``list``: a table, or a JSON list of :meth:`ScheduledEntry.as_json`. The table's NEXT is
    each entry's next slot, relative to the store's clock and in the entry's zone, and a
    pause's STATE says since when (how long ago); ``utc``: both in ISO 8601 UTC; ``wide``:
    whole cells, else within 120 columns (:mod:`~celery_anarchon.operate.cli.narrow`)."""
    from celery_anarchon.operate.cli.narrow import View
    from celery_anarchon.operate.config import config_items
    from celery_anarchon.operate.overview_entries import next_slot_of
    with _schedules(app) as s:
        entries = s.list()
        if as_json:
            click.echo(json.dumps([e.as_json() for e in entries], sort_keys=True))
            return
        now_ms = s.store.now_ms() or int(time.time() * 1000)
        texts = {n: e.definition for n, e in s.entries.load_entries().entries.items()}
        config = config_items(app)
        upcoming = {e.name: next_slot_of(app, s.settings, s.store, e, config, texts.get(e.name),
                                         now_ms) for e in entries}
    view = View(wide, now_ms, utc)
    rows = [("NAME", "SOURCE", "SCHEDULE", "TASK", "NEXT", "STATE")]
    zone = _app_zone(app)
    for e in entries:
        d = e.definition or {}
        source = e.source + (" (store copy ignored)" if e.shadowed else "")
        state = (f"{e.pause.describe()} (since {view.when(iso(e.pause.at_ms))})" if e.pause
                 else "running")
        rows.append((e.name, source, as_data.describe_schedule(d.get("schedule", "-"), zone),
                     str(d.get("task", "-")), view.slot(*upcoming[e.name]), state))
    _table(view.table(rows, keep=(4,)))     # NEXT: cut last


# -- the store of a command (reports, rules) ------------------------------------------------------

def zone_of_entry(app, store, entry: str) -> datetime.tzinfo:
    """The zone a command shows an entry's slots in: its own (a crontab's or cron's, else the
    app's ``timezone``); the app's, or UTC, for an entry no longer defined or that breaks a rule
    (``history``, ``run-now``)."""
    from celery_anarchon.operate import checks
    from celery_anarchon.operate.overview_entries import zone_of
    try:
        return zone_of(checks.plan_of(app, entry, store=store), app)
    except (ConfigError, StoreError):
        return app.timezone or datetime.timezone.utc


def _open(app):
    """The app's settings and its store, opened (no I/O yet) as a command line instance."""
    settings = Settings.from_app(app)
    return settings, open_app_store(settings, instance_id="cli:" + make_instance_id())
