"""``celery anarchon ...``: look at the store from the command line.

Registered under Celery's ``celery.commands`` entry point, so ``celery -A proj anarchon status``
works wherever the package is installed. This module is imported on every ``celery`` run: keep
its imports light (everything heavy is imported inside the commands). Loading it connects the
worker side's safety net (:func:`celery_anarchon.leases.connect_command_signals`).
"""
from __future__ import annotations

import click
from celery.bin.base import CeleryCommand

from celery_anarchon import leases

# the safety net for workers this command starts (see leases.connect_command_signals)
leases.connect_command_signals()


def _open(app):
    from celery_anarchon.app_store import make_instance_id, open_app_store
    from celery_anarchon.timing import Settings
    settings = Settings.from_app(app)
    return settings, open_app_store(app, settings, instance_id="cli:" + make_instance_id())


@click.group(name="anarchon")
def anarchon():
    """celery_anarchon: the beat that runs on every host."""


@anarchon.command(cls=CeleryCommand)
@click.option("--runs", default=5, show_default=True, help="Runs to show per entry.")
@click.pass_context
def status(ctx, runs):
    """Show the store, the clock skew and the newest runs of every entry."""
    import time

    from celery_anarchon._util import iso
    from celery_anarchon.errors import StoreError
    app = ctx.obj.app
    settings, store = _open(app)
    try:
        click.echo(f"store: {store.safe_url} ({store.kind})  namespace: {settings.namespace}")
        try:
            before = time.time()
            now = store.now_ms()
            if now is not None:
                skew = now / 1000 - (before + time.time()) / 2
                click.echo(f"store clock: {iso(now)}  (this host is {skew:+.3f} s off)")
            for name in sorted(app.conf.beat_schedule or {}):
                click.echo(f"\n{name}")
                for rec in store.history(name, limit=runs):
                    click.echo(f"  {iso(rec.slot_ms)}  {rec.event.value:<17} {rec.instance}  "
                               f"attempt {rec.attempt}  {rec.task_id} {rec.detail}")
        except StoreError as exc:
            raise click.ClickException(str(exc)) from exc
    finally:
        store.close()
