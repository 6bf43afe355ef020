"""``celery anarchon ...``: look at the store and change the schedule from the command line.

Registered under Celery's ``celery.commands`` entry point, so ``celery -A proj anarchon status``
works wherever the package is installed. This module is imported on every ``celery`` run: keep
its imports light (the command bodies live in :mod:`celery_anarchon.cli_commands`, imported when
a command runs). Loading it connects the worker side's safety net
(:func:`celery_anarchon.leases.connect_command_signals`).

Exit codes (docs/schedules.md): 0 done; 1 the store is unreachable, or another failure; 2 bad
input (a usage error, an invalid definition, a timing rule, a store that cannot hold entries);
3 unknown entry; 4 the entry is owned by ``beat_schedule``, or exists already.
"""
from __future__ import annotations

import json

import click
from celery.bin.base import CeleryCommand

from celery_anarchon import leases

# the safety net for workers this command starts (see leases.connect_command_signals)
leases.connect_command_signals()


class JSONValue(click.ParamType):
    """A command-line value given as JSON text (``--kwargs '{"full": true}'``)."""

    name = "JSON"

    def __init__(self, kind: type | None = None) -> None:
        self.kind = kind

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
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
        click.option("--timezone", help="IANA zone of --crontab or --cron (default: the app's)."),
        click.option("--args", "args_", type=JSONValue(list), help="Positional arguments, a JSON list."),
        click.option("--kwargs", "kwargs_", type=JSONValue(dict), help="Keyword arguments, a JSON object."),
        click.option("--options", "options_", type=JSONValue(dict),
                     help='apply_async options, a JSON object (e.g. {"queue": "reports"}).'),
        click.option("--anarchon", type=JSONValue(dict),
                     help='Per-entry settings, a JSON object (jitter, max_late, anchor, lease).'),
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


@anarchon.command(cls=CeleryCommand)
@click.option("--runs", default=5, show_default=True, help="Runs to show per entry.")
@click.pass_context
def status(ctx, runs):
    """Show the store, its clock, the live instances (and where they disagree), the store's
    entries and pauses, and the newest runs of every entry."""
    from celery_anarchon import cli_commands
    cli_commands.status(ctx.obj.app, runs)


def _write_command(verb: str, create: bool, help_text: str):
    """``add`` (``create``) or ``update``: the same flags, one body."""
    @anarchon.command(name=verb, cls=CeleryCommand, help=help_text)
    @click.argument("name")
    @_definition_options
    @click.pass_context
    def command(ctx, name, **flags):
        from celery_anarchon import cli_commands
        cli_commands.write(ctx.obj.app, name, flags, create=create)
    return command


add = _write_command("add", True, "Add a store entry NAME (every live beat runs it within "
                     "anarchon_sync_interval).")
update = _write_command("update", False, "Change a store entry NAME: only the parts given change.")


@anarchon.command(cls=CeleryCommand)
@click.argument("name")
@click.option("--by", help="Who makes the change (default user@host:pid).")
@click.pass_context
def remove(ctx, name, by):
    """Remove a store entry NAME."""
    from celery_anarchon import cli_commands
    cli_commands.remove(ctx.obj.app, name, by)


@anarchon.command(cls=CeleryCommand)
@click.argument("name")
@click.option("--reason", default="", help="Why (recorded with every paused run).")
@click.option("--by", help="Who pauses it (default user@host:pid).")
@click.option("--json", "as_json", is_flag=True, help="Print the entry as JSON.")
@click.pass_context
def pause(ctx, name, reason, by, as_json):
    """Pause entry NAME, config or store: no run is sent until it is resumed."""
    from celery_anarchon import cli_commands
    cli_commands.pause(ctx.obj.app, name, reason, by, as_json)


@anarchon.command(cls=CeleryCommand)
@click.argument("name")
@click.option("--by", help="Who resumes it (default user@host:pid).")
@click.option("--json", "as_json", is_flag=True, help="Print the entry as JSON.")
@click.pass_context
def resume(ctx, name, by, as_json):
    """Resume entry NAME: its next slot runs."""
    from celery_anarchon import cli_commands
    cli_commands.resume(ctx.obj.app, name, by, as_json)


@anarchon.command(name="run-now", cls=CeleryCommand)
@click.argument("name")
@click.option("--request-id", help="Your id of this request: the same id twice runs once.")
@click.option("--by", help="Who asks (default user@host:pid).")
@click.option("--json", "as_json", is_flag=True, help="Print the request as JSON.")
@click.pass_context
def run_now(ctx, name, request_id, by, as_json):
    """Run entry NAME once more, now (claimed like any run; the schedule does not move)."""
    from celery_anarchon import cli_commands
    cli_commands.run_now(ctx.obj.app, name, request_id, by, as_json)


@anarchon.command(name="list", cls=CeleryCommand)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list (for scripts).")
@click.pass_context
def list_(ctx, as_json):
    """List every entry: beat_schedule and store, with its state."""
    from celery_anarchon import cli_commands
    cli_commands.list_entries(ctx.obj.app, as_json)
