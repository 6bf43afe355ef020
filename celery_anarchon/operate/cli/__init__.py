"""``celery anarchon ...``: look at the store and change the schedule from the command line.

Registered under Celery's ``celery.commands`` entry point, so ``celery -A proj anarchon status``
works wherever the package is installed (through :mod:`celery_anarchon.command`). This module is
imported on every ``celery`` run: keep its imports light (the command bodies live in
:mod:`celery_anarchon.operate.cli.entries`, :mod:`celery_anarchon.operate.cli.reports` and
:mod:`celery_anarchon.operate.cli.rules`, :mod:`celery_anarchon.operate.cli.backfills` and
:mod:`celery_anarchon.operate.cli.imports`, imported when a command runs).

Exit codes (docs/schedules.md): 0 done; 1 the store is unreachable, or another failure; 2 bad
input (a usage error, an invalid definition, a timing rule, a store that cannot hold entries);
3 unknown entry; 4 the entry is owned by ``beat_schedule``, or exists already; 5 an entry is
overdue (``check --overdue``); 6 ``import redbeat`` / ``import django-celery-beat`` refused
some entries (the others were written), or would (``--dry-run``): docs/from-redbeat.md; 7 no
live beat instance (``status --fail-if-no-instance``); 130 a backfill interrupted. A backfill
that stopped midway exits 1. ``check`` exits 1 when any rule fails (docs/production.md "Command
line for operators").
"""
from __future__ import annotations

import json

import click
from celery.bin.base import CeleryCommand


class JSONValue(click.ParamType):
    """A command-line value given as JSON text (``--kwargs '{"full": true}'``)."""

    name = "JSON"

    def __init__(self, kind: type | None = None) -> None:
        self.kind = kind

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        from celery_anarchon import limits
        if limits.text_too_deep(value):      # json.loads would recurse past Python's limit
            self.fail(f"the JSON is nested more than {limits.MAX_DEPTH} levels deep (lists and "
                      "objects within each other); fix: flatten the data", param, ctx)
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            self.fail(f"{value!r} is not valid JSON ({exc})", param, ctx)
        if self.kind is not None and not isinstance(parsed, self.kind):
            what = {list: "a JSON list", dict: "a JSON object"}[self.kind]
            self.fail(f"{value!r} is not {what}", param, ctx)
        return parsed


def _definition_options(command):
    """The options of ``add`` and ``update`` (in ``update``, only those given change)."""
    options = [
        click.option("--task", help="The task's registered name."),
        click.option("--every", type=float, help="An interval, seconds."),
        click.option("--crontab", "crontab_", metavar='"m h dom mon dow"',
                     help="Celery crontab fields (days matched with AND), as written."),
        click.option("--cron", metavar="EXPR", help="A cron(5) expression (L, W, #; days OR)."),
        click.option("--timezone", help="IANA zone of --crontab or --cron (add: default the "
                     "app's; update: default the entry's own; alone in update: moves the entry's "
                     "crontab or cron to this zone)."),
        click.option("--args", "args_", type=JSONValue(list), help="Positional arguments, a JSON list."),
        click.option("--kwargs", "kwargs_", type=JSONValue(dict), help="Keyword arguments, a JSON object."),
        click.option("--options", "options_", type=JSONValue(dict),
                     help='apply_async options, a JSON object (e.g. {"queue": "reports"}).'),
        click.option("--anarchon", type=JSONValue(dict),
                     help='Per-entry settings, a JSON object (jitter, max_late, anchor, lease, '
                     'start_at, end_at, catch_up, catch_up_window).'),
        click.option("--catch-up", "catch_up", metavar="newest|all|none",
                     help="Which slots missed while no beat ran it are claimed at start-up: the "
                     "newest within max_late (default), all within --catch-up-window (oldest "
                     "first, paced), or none; update: 'default' goes back to the app's."),
        click.option("--catch-up-window", "catch_up_window", metavar="SECONDS",
                     help="With --catch-up all: how far back missed slots are claimed, seconds "
                     "(default anarchon_catch_up_window); update: 'default' goes back to it."),
        click.option("--start-at", "start_at", metavar="INSTANT",
                     help="No slot before this instant: ISO 8601 with a UTC offset (e.g. "
                     "2026-03-01T09:00+01:00); update: 'none' removes it."),
        click.option("--end-at", "end_at", metavar="INSTANT",
                     help="No slot after this instant, as --start-at; it must come after it."),
        click.option("--json-definition", "definition", type=JSONValue(dict),
                     help="The whole definition as JSON (docs/schedules.md), instead of the flags."),
        click.option("--no-check-task", is_flag=True,
                     help="Do not refuse a task name this app does not register."),
        click.option("--by", help="Who makes the change (default user@host:pid)."),
        click.option("--json", "as_json", is_flag=True, help="Print the entry as JSON."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@click.group(name="anarchon")
def anarchon():
    """celery_anarchon: the beat that runs on every host."""
    _escape_what_cannot_be_written()


def _escape_what_cannot_be_written() -> None:
    """Every command writes text its output cannot encode escaped (``e\\ud800``): a lone
    surrogate in a ``beat_schedule`` name or task, or in a stored definition decoded with
    ``surrogateescape``, is shown (and reported by ``check``) instead of ending the command with
    UnicodeEncodeError. A stream without ``reconfigure`` (not a text file) is left as it is."""
    import sys
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", None) == "strict":
            reconfigure(errors="backslashreplace")


@anarchon.command(cls=CeleryCommand)
@click.option("--runs", default=5, show_default=True, type=click.IntRange(0),
              help="Runs to show per entry.")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON (for scripts).")
@click.option("--fail-if-no-instance", is_flag=True,
              help="Exit 7 when no live beat instance runs (none, or every one stale): for a "
                   "health check or a probe.")
@click.option("--wide", is_flag=True, help="Whole cells and lines (default: within 120 columns).")
@click.option("--utc", is_flag=True, help="Times in ISO 8601 UTC, as --json gives them "
                                          "(default: relative to the store's clock).")
@click.pass_context
def status(ctx, runs, as_json, fail_if_no_instance, wide, utc):
    """Show the store, its clock, the live instances (and where they disagree), every entry with
    its schedule, next slot, last outcome, pause and lease, and the newest runs of every entry.
    Exit 1 when the store cannot be reached; 7 with --fail-if-no-instance when no live beat
    instance runs."""
    from celery_anarchon.operate.cli import reports as cli_status
    cli_status.status(ctx.obj.app, runs, as_json, fail_if_no_instance, wide=wide, utc=utc)


@anarchon.command(cls=CeleryCommand)
@click.argument("entry")
@click.option("--since", metavar="ISO|DURATION",
              help="Only runs whose slot is at or after this: 2026-03-29T00:00:00Z, or 1h, 30m, 2d ago.")
@click.option("--limit", type=click.IntRange(1), help="At most this many runs (newest first).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list (for scripts).")
@click.option("--utc", is_flag=True, help="Slots and when each was recorded in ISO 8601 UTC "
                                          "(default: slots in the entry's zone, recorded how long ago).")
@click.pass_context
def history(ctx, entry, since, limit, as_json, utc):
    """What happened to each run of ENTRY the store remembers, newest first: event, instance,
    attempt, task id and reason."""
    from celery_anarchon.operate.cli import reports as cli_status
    cli_status.history(ctx.obj.app, entry, since, limit, as_json, utc=utc)


@anarchon.command(cls=CeleryCommand)
@click.option("--no-store", is_flag=True,
              help="Check the rules only, without connecting to the store (as in CI).")
@click.option("--strict", is_flag=True,
              help="A warning fails the check too (an unregistered task, what the store can lose).")
@click.option("--overdue", is_flag=True,
              help="Check only that no entry is overdue (its newest slot past jitter + max_late "
                   "has no record): exit 5 when one is, 1 when the store cannot be read; for a "
                   "health check or a Kubernetes probe.")
@click.pass_context
def check(ctx, no_store, strict, overdue):
    """Check the whole configuration without starting beat: every timing rule of every entry
    (beat_schedule and store), the store reachable and what its setup can lose, the worker side
    installed for leased entries. Exit 0 when everything passes, 1 otherwise (with --strict,
    also when anything is warned of). With --overdue, only whether an entry is overdue: exit 0
    when none is, 5 when one is (each named), 1 when the store cannot be read."""
    from celery_anarchon.operate.cli import rules
    if overdue:
        if no_store:
            raise click.UsageError("--overdue reads the store: it cannot go with --no-store")
        rules.overdue(ctx.obj.app)
        return
    rules.check(ctx.obj.app, not no_store, strict)


@anarchon.command(name="next", cls=CeleryCommand)
@click.argument("entry")
@click.option("-n", "count", default=10, show_default=True, type=click.IntRange(1, 10_000),
              help="How many slots.")
@click.option("--after", metavar="ISO|DURATION",
              help="Start after this instant: 2027-03-26T12:00:00Z, or 1h, 30m, 2d from now "
                   "(default: now).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (for scripts).")
@click.option("--utc", is_flag=True, help="The slots in UTC only, and a pause's time, start_at "
                                          "and end_at in ISO 8601 UTC (default: also in the "
                                          "entry's zone; a pause since how long ago).")
@click.pass_context
def next_(ctx, entry, count, after, as_json, utc):
    """The next slots of ENTRY in UTC and in its time zone, with the UTC offset (a DST change
    shows as an offset change)."""
    from celery_anarchon.operate.cli import rules
    rules.next_(ctx.obj.app, entry, count, after, as_json, utc=utc)


def _write_command(verb: str, create: bool, help_text: str):
    """``add`` (``create``) or ``update``: the same flags, one body."""
    @anarchon.command(name=verb, cls=CeleryCommand, help=help_text)
    @click.argument("name")
    @_definition_options
    @click.pass_context
    def command(ctx, name, **flags):
        from celery_anarchon.operate.cli import entries as cli_commands
        cli_commands.write(ctx.obj.app, name, flags, create=create)
    return command


add = _write_command("add", True, "Add a store entry NAME (every live beat runs it within "
                     "anarchon_sync_interval).")
update = _write_command("update", False, "Change a store entry NAME: only the parts given "
                        "change (--crontab or --cron without --timezone keeps the entry's zone).")


@anarchon.command(cls=CeleryCommand)
@click.argument("name")
@click.option("--by", help="Who makes the change (default user@host:pid).")
@click.pass_context
def remove(ctx, name, by):
    """Remove a store entry NAME."""
    from celery_anarchon.operate.cli import entries as cli_commands
    cli_commands.remove(ctx.obj.app, name, by)


@anarchon.command(cls=CeleryCommand)
@click.argument("name")
@click.option("--reason", default="", help="Why (recorded with every paused run).")
@click.option("--by", help="Who pauses it (default user@host:pid).")
@click.option("--json", "as_json", is_flag=True, help="Print the entry as JSON.")
@click.pass_context
def pause(ctx, name, reason, by, as_json):
    """Pause entry NAME, config or store: no run is sent until it is resumed."""
    from celery_anarchon.operate.cli import entries as cli_commands
    cli_commands.pause(ctx.obj.app, name, reason, by, as_json)


@anarchon.command(cls=CeleryCommand)
@click.argument("name")
@click.option("--by", help="Who resumes it (default user@host:pid).")
@click.option("--json", "as_json", is_flag=True, help="Print the entry as JSON.")
@click.pass_context
def resume(ctx, name, by, as_json):
    """Resume entry NAME: its next slot runs."""
    from celery_anarchon.operate.cli import entries as cli_commands
    cli_commands.resume(ctx.obj.app, name, by, as_json)


@anarchon.command(name="accept-loss", cls=CeleryCommand)
@click.option("--by", help="Who accepts it (default user@host:pid).")
@click.option("--json", "as_json", is_flag=True, help="Print when and by whom as JSON.")
@click.pass_context
def accept_loss(ctx, by, as_json):
    """Accept what the store lost: every instance that keeps pauses or store entries from
    before a loss of the store's data (see status) follows the store as it is."""
    from celery_anarchon.operate.cli import entries as cli_commands
    cli_commands.accept_loss(ctx.obj.app, by, as_json)


@anarchon.command(name="run-now", cls=CeleryCommand)
@click.argument("name")
@click.option("--request-id", help="The id of this request (default: a new one, printed): the "
                                   "same id again is the same request, one run.")
@click.option("--by", help="Who asks (default user@host:pid).")
@click.option("--json", "as_json", is_flag=True, help="Print the request as JSON.")
@click.option("--utc", is_flag=True, help="Times in ISO 8601 UTC (default: relative, and the "
                                          "slot in the entry's zone).")
@click.pass_context
def run_now(ctx, name, request_id, by, as_json, utc):
    """Run entry NAME once more, now (claimed like any run; the schedule does not move)."""
    from celery_anarchon.operate.cli import entries as cli_commands
    cli_commands.run_now(ctx.obj.app, name, request_id, by, as_json, command=typed_command(ctx),
                         utc=utc)


@anarchon.command(cls=CeleryCommand)
@click.argument("name")
@click.option("--from", "start", required=True, metavar="ISO|DURATION",
              help="The first slot's earliest instant: 2026-03-29T00:00:00Z (no offset: UTC), "
                   "or 6h, 30m, 2d ago.")
@click.option("--to", "end", metavar="ISO|DURATION",
              help="The last slot's latest instant, as --from, not in the future "
                   "(default: now).")
@click.option("--request-id", help="Names this backfill in the history and its claims "
                                   "(default: a new one, printed).")
@click.option("--rate", default=10.0, show_default=True, type=click.FloatRange(min=0,
              min_open=True), help="Sends per second, at most.")
@click.option("--max-slots", default=10_000, show_default=True, type=click.IntRange(1),
              help="Refuse a range of more slots than this.")
@click.option("--by", help="Who asks (default user@host:pid).")
@click.option("--yes", is_flag=True, help="Run without asking for confirmation.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def backfill(ctx, name, start, end, request_id, rate, max_slots, by, yes, as_json):
    """Run every slot of entry NAME from --from to --to once. Each slot is claimed in the store
    like a run and sent only when this claim wins it: a slot already sent (by a beat, by an
    earlier or concurrent backfill) is not sent again, so the same command again resumes an
    interrupted backfill and sends nothing twice. A range older than the store's memory, a
    leased or paused entry, and a store whose claims only move forward are refused."""
    from celery_anarchon.operate.cli import backfills as cli_backfill
    cli_backfill.backfill(ctx.obj.app, name, start=start, end=end, request_id=request_id,
                          rate=rate, max_slots=max_slots, by=by, yes=yes, as_json=as_json,
                          command=typed_command(ctx))


def typed_command(ctx) -> str:
    """:func:`celery_anarchon.operate.cli.entries.typed_command`."""
    from celery_anarchon.operate.cli.entries import typed_command as typed
    return typed(ctx)


@anarchon.command(name="list", cls=CeleryCommand)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list (for scripts).")
@click.option("--utc", is_flag=True, help="Next slots and pauses' times in ISO 8601 UTC "
                                          "(default: relative, and next slots in the entry's zone).")
@click.option("--wide", is_flag=True, help="Whole cells (default: within 120 columns).")
@click.pass_context
def list_(ctx, as_json, utc, wide):
    """List every entry: beat_schedule and store, with its schedule, task, next slot and state
    (running, or paused by whom, why and since when)."""
    from celery_anarchon.operate.cli import entries as cli_commands
    cli_commands.list_entries(ctx.obj.app, as_json, utc=utc, wide=wide)


@anarchon.command(cls=CeleryCommand)
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind (0.0.0.0: every interface; put it behind your proxy).")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535),
              help="TCP port.")
@click.option("--allow-actions", is_flag=True,
              help="Show pause / resume / run-now buttons and the bulk pause / resume of "
                   "the selected rows, and accept them (with the token).")
@click.option("--token", envvar="ANARCHON_WEB_TOKEN", show_envvar=True,
              help="The actions' token (default: a new one, printed once at start-up).")
@click.option("--runs", default=20, show_default=True, type=click.IntRange(0, 500),
              help="Runs per entry in the page's strip.")
@click.option("--refresh", default=5.0, show_default=True, type=click.FloatRange(0),
              help="How often the page reloads its data, seconds (0: never).")
@click.pass_context
def web(ctx, host, port, allow_actions, token, runs, refresh):
    """Serve the status page (and its data as JSON at /api/status; each entry's page at
    /entries/NAME) until interrupted."""
    from celery_anarchon.operate import web as web_page
    from celery_anarchon.errors import ConfigError
    try:
        web_page.serve(ctx.obj.app, host=host, port=port, allow_actions=allow_actions,
                       token=token, runs=runs, refresh_s=refresh, echo=click.echo)
    except ConfigError as exc:
        click.echo(f"Error: {exc}", err=True)
        raise click.exceptions.Exit(2) from exc


def _import_options(stopped: str):
    """The options of every ``import`` command: ``--dry-run``, ``--paused`` (resumed once
    ``stopped`` holds), ``--no-check-task``, ``--by``, ``--json``."""
    options = [
        click.option("--dry-run", is_flag=True,
                     help="Show the table of what would be written and the refusals; write "
                          "nothing (exit 6 when something would be refused)."),
        click.option("--paused", is_flag=True,
                     help="Pause every entry it adds or updates (for a switch while our beats "
                          f"already run: resume them once {stopped})."),
        click.option("--no-check-task", is_flag=True,
                     help="Do not refuse a task name this app does not register."),
        click.option("--by", help="Who makes the change (default user@host:pid)."),
        click.option("--json", "as_json", is_flag=True,
                     help="Print the rows as JSON (for scripts)."),
    ]

    def decorate(command):
        for option in reversed(options):
            command = option(command)
        return command
    return decorate


@anarchon.group(name="import")
def import_():
    """Bring the entries of another scheduler into the store (docs/from-redbeat.md,
    docs/from-django-celery-beat.md)."""


@import_.command(name="redbeat", cls=CeleryCommand)
@click.option("--redis", metavar="URL",
              help="RedBeat's Redis (default: redbeat_redis_url, else broker_url, as RedBeat "
                   "reads it).")
@click.option("--key-prefix", "prefix", metavar="PREFIX",
              help="RedBeat's key prefix (default: redbeat_key_prefix, else 'redbeat:').")
@click.option("--keep-phase", is_flag=True,
              help="Give each interval the anchor of RedBeat's last run, so that its runs "
                   "keep their phase (default: epoch-aligned, the multiples of the period since "
                   "1970).")
@_import_options("RedBeat is stopped")
@click.pass_context
def import_redbeat(ctx, redis, prefix, dry_run, paused, keep_phase, no_check_task, by, as_json):
    """Read RedBeat's entries (the hashes its sorted set '<prefix>:schedule' lists) into store
    entries: print the table of what it writes (name, task, schedule, paused, action: add,
    update, unchanged, refused or skipped), then write it. An entry disabled in RedBeat becomes
    a paused store entry; one our rules refuse is named with the fix, and the others are still
    written; a name beat_schedule defines is skipped; running it twice writes nothing the
    second time. Exit 0 when every entry was imported, unchanged or skipped; 6 when some were
    refused (the others were written), with --dry-run too when some would be; 1 when RedBeat's
    Redis or the store cannot be reached; 2 on bad input."""
    from celery_anarchon.operate.cli import imports as cli_imports
    cli_imports.import_redbeat_command(ctx.obj.app, redis=redis, prefix=prefix, dry_run=dry_run,
                                       paused=paused, keep_phase=keep_phase,
                                       check_task=not no_check_task, by=by,
                                       as_json=as_json)


@import_.command(name="django-celery-beat", cls=CeleryCommand)
@_import_options("no beat reads the rows")
@click.pass_context
def import_django(ctx, dry_run, paused, no_check_task, by, as_json):
    """Read django-celery-beat's PeriodicTask rows (Django set up from DJANGO_SETTINGS_MODULE,
    as the app module sets it) into store entries, to leave the admin: print the table of what
    it writes, then write it, with the rules of import redbeat (a disabled row becomes a paused
    store entry; a row our rules refuse is named with its id and the fix, and the others are
    still written; a name beat_schedule defines is skipped; running it twice writes nothing the
    second time). Exit 0 when every row was imported, unchanged or skipped; 6 when some were
    refused (the others were written), with --dry-run too when some would be; 1 when Django's
    database or the store cannot be reached; 2 on bad input (Django not set up:
    docs/from-django-celery-beat.md)."""
    from celery_anarchon.operate.cli import imports as cli_imports
    cli_imports.import_django_command(ctx.obj.app, dry_run=dry_run, paused=paused,
                                      check_task=not no_check_task, by=by, as_json=as_json)
