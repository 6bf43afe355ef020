"""``celery anarchon ...``: look at the store from the command line.

Registered under Celery's ``celery.commands`` entry point, so ``celery -A proj anarchon status``
works wherever the package is installed. This module is imported on every ``celery`` run: keep
its imports light (everything heavy is imported inside the commands).
"""
from __future__ import annotations

import click
from celery.bin.base import CeleryCommand


def _open(app):
    from celery_anarchon.scheduler import make_instance_id, resolve_store_url
    from celery_anarchon.stores import open_store
    from celery_anarchon.timing import Settings
    settings = Settings.from_app(app)
    url, options, _ = resolve_store_url(app, settings)
    return settings, open_store(url, namespace=settings.namespace,
                                instance_id="cli:" + make_instance_id(), options=options)


@click.group(name="anarchon")
def anarchon():
    """celery_anarchon: the beat that runs on every host."""


@anarchon.command(cls=CeleryCommand)
@click.option("--runs", default=5, show_default=True, help="Runs to show per entry.")
@click.pass_context
def status(ctx, runs):
    """Show the store, the clock skew and the newest runs of every entry."""
    import time

    from celery_anarchon.engine import iso
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
