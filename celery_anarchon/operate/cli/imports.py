"""The bodies of ``celery anarchon import redbeat`` and ``import django-celery-beat`` (declared in
:mod:`celery_anarchon.operate.cli`):
the table of what the import will write, then the writes (none with ``--dry-run``), then a line
of counts. Exit 0 when every entry was imported, unchanged or skipped, 6 when some were refused
(the others were written; a dry run: when some would be, the refusals of the writes included:
:func:`celery_anarchon.operate.imports.plan`), 1 when RedBeat's Redis, Django's database or the
store cannot be reached, 2 on bad input.
"""
from __future__ import annotations

import json
from collections import Counter

import click

from celery_anarchon._util import mask_url
from celery_anarchon.operate import import_django, import_redbeat, imports
from celery_anarchon.operate.cli.entries import _exit_codes, _table, import_task_modules
from celery_anarchon.operate.schedules import Schedules

#: some entries were refused (the others were written): docs/from-redbeat.md,
#: docs/from-django-celery-beat.md
EXIT_REFUSED = 6
#: what the table's "epoch-aligned" means, printed under it once
PHASE_NOTE = ("epoch-aligned: an interval's slots here are the multiples of its period since "
              "1970-01-01 UTC, the same on every host; RedBeat counted each period from the "
              "entry's last run, so the first run here may come up to one period sooner or "
              "later than RedBeat's next one (--keep-phase keeps RedBeat's phase with an anchor: "
              "docs/from-redbeat.md)")
#: the same for django-celery-beat's rows
DJANGO_PHASE_NOTE = ("epoch-aligned: an interval's slots here are the multiples of its period "
                     "since 1970-01-01 UTC, the same on every host; django-celery-beat counted "
                     "each period from the row's last run, so the first run here may come up to "
                     "one period sooner or later (keep_phase() before the import keeps its "
                     "phase with an anchor: docs/from-django-celery-beat.md)")
_PAST = {imports.ADD: "added", imports.UPDATE: "updated"}


def import_redbeat_command(app, *, redis: str | None, prefix: str | None, dry_run: bool,
                           paused: bool, keep_phase: bool, check_task: bool, by: str | None,
                           as_json: bool) -> None:
    """``import redbeat``: read RedBeat's entries, show the table, write (unless ``dry_run``)."""
    with _exit_codes():
        url = redis or import_redbeat.redis_url(app)
        prefix = prefix or import_redbeat.key_prefix(app)
        found = import_redbeat.read(app, url, prefix, keep_phase=keep_phase)
        if check_task:
            import_task_modules(app)
    _import(app, found, f"RedBeat {mask_url(url)} (prefix {prefix!r})",
            f"no entry in RedBeat's sorted set {prefix + ':schedule'!r}; check --redis and "
            "--key-prefix", dry_run=dry_run, paused=paused, check_task=check_task, by=by,
            as_json=as_json, what="RedBeat entry", phase_note=PHASE_NOTE)


def import_django_command(app, *, dry_run: bool, paused: bool, check_task: bool,
                          by: str | None, as_json: bool) -> None:
    """``import django-celery-beat``: read the ``PeriodicTask`` rows (Django set up from
    ``DJANGO_SETTINGS_MODULE``), show the table, write (unless ``dry_run``)."""
    with _exit_codes():
        found = import_django.read(app)
        if check_task:
            import_task_modules(app)
    from django.db import connection
    _import(app, found, f"django-celery-beat's PeriodicTask rows (database "
                        f"{connection.settings_dict.get('NAME')!s})",
            "no PeriodicTask row; check DJANGO_SETTINGS_MODULE", dry_run=dry_run, paused=paused,
            check_task=check_task, by=by, as_json=as_json, what="PeriodicTask row",
            phase_note=DJANGO_PHASE_NOTE, disabled_reason=import_django.DISABLED_REASON,
            source_name="django-celery-beat", explain=import_django.refusal)


def _import(app, found: list, source: str, empty: str, *, dry_run: bool, paused: bool,
            check_task: bool, by: str | None, as_json: bool, what: str, phase_note: str,
            disabled_reason: str = imports.DISABLED_REASON, source_name: str = "RedBeat",
            explain=str) -> None:
    """The table of what ``found`` (the entries of ``source``, each a ``what``) becomes, the
    writes (unless ``dry_run``), the counts; ``empty`` says what to check when there is none,
    ``source_name`` names the other scheduler in a refusal, ``explain`` words our rules' refusals
    for its users (:func:`imports.plan`)."""
    with _exit_codes(), Schedules(app, by=by) as s:
        rows = imports.plan(s, found, paused=paused, check_task=check_task,
                            disabled_reason=disabled_reason, source=source_name,
                            explain=explain)
        if not as_json:
            _show(rows, f"{source}: {len(rows)} entries -> store {s.store.safe_url} (namespace "
                        f"{s.settings.namespace!r})", phase_note)
            if not rows:
                click.echo(empty)
        if not dry_run:
            rows = imports.apply(s, rows, check_task=check_task, explain=explain)
    if as_json:
        click.echo(json.dumps([_as_json(r) for r in rows], sort_keys=True))
    else:
        _summary(rows, dry_run, what)
    if any(r.action == imports.REFUSED for r in rows):
        raise click.exceptions.Exit(EXIT_REFUSED)


def _show(rows: list[imports.ImportRow], title: str, phase_note: str) -> None:
    click.echo(title)
    if not rows:
        return
    table = [("NAME", "TASK", "SCHEDULE", "PAUSED", "ACTION", "NOTE")]
    for r in rows:
        paused = "-" if r.paused is None else "yes" if r.paused else "no"
        table.append((r.name, r.task, r.schedule, paused, r.action, r.note))
    _table(table)
    if any("epoch-aligned" in r.note for r in rows):
        click.echo(phase_note)


def _summary(rows: list[imports.ImportRow], dry_run: bool, what: str) -> None:
    for r in rows:
        if r.action == imports.REFUSED:
            click.echo(f"refused {r.name}: {r.error}", err=True)
    counts = Counter(r.action for r in rows)
    if dry_run:
        parts = [f"{counts[a]} to {a}" for a in (imports.ADD, imports.UPDATE) if counts[a]]
    else:
        parts = [f"{counts[a]} {_PAST[a]}" for a in (imports.ADD, imports.UPDATE) if counts[a]]
    parts += [f"{counts[a]} {a}" for a in (imports.UNCHANGED, imports.SKIPPED, imports.REFUSED)
              if counts[a]]
    head = "dry run, nothing written" if dry_run else "imported"
    if rows and counts[imports.UNCHANGED] == len(rows):
        click.echo(f"{head}: every entry is unchanged, nothing to write")
    else:
        click.echo(f"{head}: " + (", ".join(parts) if parts else f"no {what} found"))


def _as_json(row: imports.ImportRow) -> dict:
    return {"name": row.name, "task": row.task, "schedule": row.schedule, "paused": row.paused,
            "action": row.action, "note": row.note, "definition": row.definition,
            "error": row.error}
