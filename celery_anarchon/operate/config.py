"""The config entries of an app: its ``beat_schedule`` and the entries Celery's beat adds itself,
as every operator view (list, status, history, next, check, the testing helpers, the schedules
API) takes them.

Which entries Celery's beat adds is Celery's to say: :func:`config_items` asks
``celery.beat.Scheduler.install_default_entries`` itself, on a scheduler built lazily as Celery
builds one for beat's banner (no broker connection, no schedule set up).
"""
from __future__ import annotations

from typing import Any

from celery import beat

from celery_anarchon import limits
from celery_anarchon.errors import ConfigError, EntryOwnedByConfig
from celery_anarchon.operate.names import did_you_mean, normal_name
from celery_anarchon.schedule import as_data
from celery_anarchon.schedule.plan import UnnamedItem, beat_schedule_of, check_call, config_entry

#: the names of the entries Celery's beat may add itself (``install_default_entries``: when
#: results expire): owned by the configuration too, whether this app's beat adds them or not
CELERY_DEFAULT_ENTRIES = ("celery.backend_cleanup",)


def config_items(app) -> dict[str, dict]:
    """The config entries of ``app``, by name: its ``beat_schedule`` items, with the entries
    Celery's beat adds itself (:func:`celery_default_items`), which beat runs like the others.

    :param app: the Celery app (``beat_schedule``, ``result_expires``, its result backend).
    :returns: a new dict of ``beat_schedule`` items (dicts as Celery takes them) by name in
        Unicode NFC, as beat runs them (the second of two names equal in NFC keeps its own form:
        beat refuses the pair; a name that is not a string is keyed by its repr, its item an
        :class:`~celery_anarchon.schedule.plan.UnnamedItem` that
        :func:`~celery_anarchon.schedule.plan.config_entry` refuses).
    :raises ConfigError: ``beat_schedule`` is not a dict
        (:func:`~celery_anarchon.schedule.plan.beat_schedule_of`).
    """
    config: dict = {}
    for name, item in beat_schedule_of(app.conf.beat_schedule).items():
        if not isinstance(name, str):   # shown by its repr, refused by config_entry
            config[repr(name)] = UnnamedItem(name, item)
            continue
        normal = normal_name(name)
        config[name if normal in config else normal] = item
    config.update(celery_default_items(app, config))
    return config


def celery_default_items(app, config: dict) -> dict[str, dict]:
    """The entries Celery's beat adds to ``config`` itself, as ``beat_schedule`` items:
    ``celery.backend_cleanup`` when results expire on a backend that does not expire them itself.

    Celery decides (``Scheduler.install_default_entries``, called here on a ``Scheduler`` built
    with ``lazy=True``: no connection, nothing sent; our beat's ``setup_schedule`` calls the same
    method after its merge); an entry ``config`` defines already is left to it.

    :returns: the items by name; none when the app's result backend cannot be built (beat would
        fail on it at start-up).
    """
    try:
        scheduler = beat.Scheduler(app, lazy=True)
        scheduler.install_default_entries(config)
    except Exception:                      # a backend that cannot be built: beat would fail
        return {}
    return {name: {"task": entry.task, "schedule": entry.schedule, "args": entry.args,
                   "kwargs": entry.kwargs, "options": entry.options}
            for name, entry in scheduler.schedule.items()}


def refuse_config(app, name: str, what: str) -> None:
    """Refuse to ``what`` (add, update, remove) a store entry under a config entry's name.

    :raises ConfigError: ``name`` is not a non-empty string.
    :raises EntryOwnedByConfig: ``beat_schedule`` defines ``name``, or Celery's beat may add it.
    """
    if not isinstance(name, str) or not name:
        raise limits.unnamed(name)
    if name in config_items(app) or name in CELERY_DEFAULT_ENTRIES:
        fix = ("pick another name for the store entry" if what == "add" else
               f"{what} it in beat_schedule and restart beat")
        raise EntryOwnedByConfig(
            f"entry {name!r} is defined in beat_schedule: {fix} (pause, resume and run-now "
            "work on it here)")


def config_data(app, name: str, item: Any) -> dict:
    """A ``beat_schedule`` item as the views show its definition (data of
    :mod:`~celery_anarchon.schedule.definition`); an
    item that is no entry as its task and the repr of its schedule, ``"storable": false`` (its
    problem comes from :func:`~celery_anarchon.schedule.plan.build_plan`)."""
    try:
        entry = config_entry(name, item, app=app)
        check_call(name, entry)            # a task that is no text is no JSON either
        return as_data.from_entry(entry)
    except Exception:  # a broken beat_schedule entry: shown, never stored
        return _broken_item_data(item)


def _broken_item_data(item: Any) -> dict:
    """What the views show of a ``beat_schedule`` item that is no entry."""
    if not isinstance(item, dict):
        return {"task": None, "schedule": {"repr": limits.object_repr(item)}, "storable": False}
    task = item.get("task")
    return {"task": task if isinstance(task, str) else limits.object_repr(task),
            "schedule": {"repr": limits.object_repr(item.get("schedule"))}, "storable": False}


def check_task(app, name: str, task: str) -> None:
    """Refuse a task name ``app`` does not register, when it registers tasks of its own (an app
    that registers none cannot know which names the workers register). The modules of the app's
    ``imports`` / ``include`` are registered only once imported (a worker imports them; the
    command line does too before it checks).

    :param name: the entry's name (for the message).
    :param task: the task's name.
    :raises ConfigError: the task is not registered (naming the closest registered name).
    """
    tasks = app.tasks  # finalizes the app: autodiscovered and imported tasks are in
    own = sorted(t for t in tasks if not t.startswith("celery."))
    if not own or task in tasks:
        return  # no task of its own: the app cannot know which names the workers register
    hint = did_you_mean(task, own)
    raise ConfigError(f"entry {name!r}: task {task!r} is not registered in app "
                      f"{app.main!r}{hint}; fix: use a registered task name, import the "
                      "module that defines it (imports, include, autodiscover_tasks), or pass "
                      "check_task=False (command line: --no-check-task) if only the workers "
                      "know it")

