"""``celery anarchon ...``: look at the store from the command line.

Registered under Celery's ``celery.commands`` entry point, so ``celery -A proj anarchon status``
works wherever the package is installed. This module is imported on every ``celery`` run: keep
its imports light (everything heavy is imported inside the commands).
"""
from __future__ import annotations

import logging

import click
from celery import signals
from celery.bin.base import CeleryCommand

logger = logging.getLogger("celery_anarchon.leases")


def _uses_anarchon(app) -> bool:
    conf = app.conf
    if "anarchon" in str(conf.get("beat_scheduler") or ""):
        return True
    if any(isinstance(k, str) and k.startswith("anarchon_") for k in conf.keys()):
        return True
    return any(isinstance(item, dict) and "anarchon" in (item.get("options") or {})
               for item in (conf.get("beat_schedule") or {}).values())


@signals.worker_init.connect(weak=False, dispatch_uid="celery_anarchon.cli.worker_init")
def _safety_net(sender=None, **kwargs) -> None:
    """A worker started by the ``celery`` command whose app uses celery_anarchon but whose app
    module forgot ``celery_anarchon.install(app)`` gets the worker side anyway: without it a
    leased run's body would run once per attempt. (A worker started another way has no such net:
    beat refuses to start without install(app), and the docs say where the line goes.)"""
    from celery_anarchon.leases import install, is_installed
    app = getattr(sender, "app", None)
    if app is None or is_installed(app) or not _uses_anarchon(app):
        return
    install(app)
    logger.warning("celery_anarchon: the app module of this worker does not call "
                   "celery_anarchon.install(app); installed the worker side of leases for this "
                   "worker. Add the call to the app module so every process that loads it has it.")


@signals.task_prerun.connect(weak=False, dispatch_uid="celery_anarchon.cli.task_prerun")
def _unprotected_leased_message(sender=None, task=None, **kwargs) -> None:
    """Say so when a leased run's message reaches a task without the worker side (it cannot be
    stopped from a signal: Celery swallows exceptions raised in handlers)."""
    headers = getattr(getattr(task, "request", None), "headers", None) or {}
    if "anarchon_token" in headers and not type(task).__dict__.get("_anarchon_patched"):
        logger.error("celery_anarchon: task %s runs a leased run (entry %s) on a worker without "
                     "the worker side of leases: nothing stops a second attempt from running its "
                     "body too. Call celery_anarchon.install(app) in the app module.",
                     getattr(task, "name", "?"), headers.get("anarchon_entry"))


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
