"""``celery anarchon backfill``: the command's body (declared in :mod:`celery_anarchon.operate.cli`).

It checks the backfill and counts its slots first (nothing claimed), asks for confirmation
(``--yes`` skips it; without a terminal it is required), prints the command that resumes it,
then runs it with a progress bar on a terminal (a line every :data:`LINE_EVERY` slots
otherwise) and ends with the report: sent, already run, refused (by reason), not re-sent.
Exit codes as :mod:`celery_anarchon.operate.cli.entries`; 1 when the backfill stopped midway
(a publish failed, the store could not be reached), 130 when interrupted.
"""
from __future__ import annotations

import json
import shlex
import sys
import time

import click

from celery_anarchon._util import iso
from celery_anarchon.operate.backfill import BackfillReport, BackfillStopped
from celery_anarchon.operate.cli.entries import EXIT_BAD_INPUT, EXIT_FAILURE, _schedules
from celery_anarchon.operate.cli.reports import parse_since

#: without a terminal, a progress line every this many slots
LINE_EVERY = 100
#: the exit code of an interrupted backfill (128 + SIGINT, as a shell reports it)
EXIT_INTERRUPTED = 130


def backfill(app, name: str, *, start: str, end: str | None, request_id: str | None,
             rate: float, max_slots: int, by: str | None, yes: bool, as_json: bool,
             command: str = "celery anarchon") -> None:
    """``backfill``: see the module docstring.

    :param command: how the operator ran ``anarchon``, for the printed resume command.
    """
    now_ms = int(time.time() * 1000)
    start_ms = parse_since(start, now_ms, option="--from")
    end_ms = now_ms if end is None else parse_since(end, now_ms, option="--to")
    with _schedules(app) as s:
        job = s.plan_backfill(name, start_ms, end_ms, request_id=request_id, by=by,
                              max_slots=max_slots)
        say = (lambda text: click.echo(text, err=True)) if as_json else click.echo
        say(f"backfill {job.request_id} of entry {name!r}: {len(job.slots)} slots from "
            f"{iso(start_ms)} to {iso(end_ms)}, at most {rate:g} a second; each is claimed like "
            "a run and sent only if no beat or other backfill sent it")
        if not job.slots:
            say("nothing to do: no slot of the entry lies in the range")
            return
        if not yes:
            if not sys.stdin.isatty():
                click.echo("Error: no terminal to confirm on; fix: give --yes to run the "
                           "backfill", err=True)
                raise click.exceptions.Exit(EXIT_BAD_INPUT)
            click.confirm("run it?", abort=True)
        say("to resume it if it is interrupted (what it claimed is never sent twice): "
            f"{command} backfill {shlex.quote(name)} --from {iso(start_ms)} --to "
            f"{iso(end_ms)} --request-id {shlex.quote(job.request_id)} --yes")
        report = _run(job, rate, say, bar=sys.stdout.isatty() and not as_json)
    if as_json:
        click.echo(json.dumps(report.as_json(), sort_keys=True))
    else:
        _end(report, click.echo)


def _run(job, rate: float, say, *, bar: bool) -> BackfillReport:
    """Run ``job`` with a progress bar (``bar``) or a line every :data:`LINE_EVERY` slots; a
    backfill that stops or is interrupted prints its report so far and how to resume."""
    total = len(job.slots)
    seen = [0]
    progressbar = click.progressbar(length=total, label="backfill", show_pos=True) if bar else None

    def progress(report: BackfillReport) -> None:
        done = report.done
        if progressbar is not None:
            progressbar.update(done - seen[0])
        elif done // LINE_EVERY > seen[0] // LINE_EVERY or done == total:
            say(f"backfill {job.request_id}: {done}/{total} slots, sent {len(report.sent)}")
        seen[0] = done
    try:
        if progressbar is not None:
            with progressbar:
                return job.run(rate=rate, progress=progress)
        return job.run(rate=rate, progress=progress)
    except BackfillStopped as exc:
        click.echo(f"Error: {exc}", err=True)
        _end(exc.report, lambda text: click.echo(text, err=True))
        raise click.exceptions.Exit(EXIT_FAILURE) from exc
    except KeyboardInterrupt:
        click.echo("interrupted: run the same command again to resume it (a slot this run "
                   "claimed and may not have sent is not sent again)", err=True)
        raise click.exceptions.Exit(EXIT_INTERRUPTED) from None


def _end(report: BackfillReport, echo) -> None:
    echo(report.summary())
    if report.resumed:
        echo(f"resumed: {report.resumed} slots were claimed by an earlier backfill, or by one "
             "running now (not sent again by this one)")
