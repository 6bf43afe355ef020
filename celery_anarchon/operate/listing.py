"""Every entry as an operator reads it (``Schedules.get`` and ``Schedules.list`` of
:mod:`celery_anarchon.operate.schedules`, the views): the config entries, the
store's entries, and pauses of names neither defines, each a :class:`ScheduledEntry`.

A name ``beat_schedule`` defines is a config entry, whatever the store holds under it (config
first, as the engine does; the store's copy is *shadowed*).
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

from celery import beat

from celery_anarchon import limits
from celery_anarchon.errors import ConfigError, UnknownEntry
from celery_anarchon.operate.config import config_data, config_items
from celery_anarchon.operate.names import did_you_mean
from celery_anarchon.schedule import definition as entry_json
from celery_anarchon.schedule.plan import config_entry
from celery_anarchon.stores.entry_store import Entries, EntrySnapshot, Pause, StoredEntry

#: where an entry is defined (:attr:`ScheduledEntry.source`)
CONFIG, STORE, UNKNOWN = "config", "store", "unknown"


@dataclasses.dataclass(frozen=True)
class ScheduledEntry:
    """One entry as :meth:`Schedules.get` and :meth:`Schedules.list` read it.

    :param name: the entry's name.
    :param source: ``"config"`` (this app's ``beat_schedule``), ``"store"`` (added at run time)
        or ``"unknown"`` (the store holds only a pause for a name neither defines here: a config
        entry of other hosts' ``beat_schedule``, or of none any more).
    :param definition: the definition as data (:mod:`celery_anarchon.schedule.definition`); a config
        entry's parts that cannot be data are ``{"repr": ...}`` with ``"storable": false``;
        ``None`` for ``"unknown"``.
    :param pause: the entry's pause, ``None`` when it runs.
    :param version: the store's version of this name (0: the store holds nothing for it).
    :param updated_ms: the store's clock at the last change of this name, UTC ms (None: never).
    :param updated_by: who made that change (None: never).
    :param shadowed: a config entry whose name the store also defines: beat_schedule wins.
    """

    name: str
    source: str
    definition: dict | None
    pause: Pause | None = None
    version: int = 0
    updated_ms: int | None = None
    updated_by: str | None = None
    shadowed: bool = False

    @property
    def paused(self) -> bool:
        """True while the entry is paused (every claim of its runs answers ``paused``)."""
        return self.pause is not None

    def as_json(self) -> dict:
        """Plain JSON values (the CLI's ``list --json``)."""
        out = dataclasses.asdict(self)
        out["paused"] = self.paused
        return out


def scheduled(app, config: Mapping, name: str, stored: StoredEntry | None) -> ScheduledEntry | None:
    """The entry ``name`` as read: config (``config``:
    :func:`~celery_anarchon.operate.config.config_items`) first, else the store's entry, else
    the store's record of a name neither defines (a pause, or what is left of one resumed or
    removed: ``stored.cleared``).

    :returns: ``None`` when neither ``config`` nor the store (``stored``) holds anything of it.
    """
    if name in config:
        return _scheduled(name, CONFIG, config_data(app, name, config[name]), stored,
                          shadowed=stored is not None and stored.definition is not None)
    if stored is not None and stored.definition is not None:
        return _scheduled(name, STORE, stored_data(name, stored.definition), stored)
    if stored is not None:
        return _scheduled(name, UNKNOWN, None, stored)
    return None


def listed(app, snapshot: EntrySnapshot, only: str | None = None) -> list[ScheduledEntry]:
    """Every entry of ``app`` and of the store's ``snapshot`` by name (``only``: that name
    alone); a name the store holds only a cleared record of (resumed or removed) is left out."""
    config = config_items(app)
    names = sorted(set(config) | set(snapshot.entries)) if only is None else [only]
    out = []
    for name in names:
        found = scheduled(app, config, name, snapshot.entries.get(name))
        if found is not None and not (found.source == UNKNOWN
                                      and snapshot.entries[name].cleared):
            out.append(found)
    return out


def _scheduled(name: str, source: str, definition: dict | None, stored: StoredEntry | None,
               shadowed: bool = False) -> ScheduledEntry:
    if stored is None:
        return ScheduledEntry(name, source, definition)
    return ScheduledEntry(name, source, definition, stored.pause, stored.version,
                          stored.updated_ms, stored.updated_by, shadowed)


def celery_entry_of(app, name: str, snapshot: EntrySnapshot, *, namespace: str,
                    entries: Entries) -> beat.ScheduleEntry:
    """Celery's entry of ``name`` (config first, as the engine does), or UnknownEntry.

    :raises UnknownEntry: neither ``beat_schedule`` nor the store defines ``name``
        (:func:`unknown_entry_error`).
    :raises ConfigError: Celery cannot build the config item, or the stored definition is
        invalid.
    """
    stored = snapshot.entries.get(name)
    found = celery_entry_in(app, name, config_items(app),
                            None if stored is None else stored.definition)
    if found is None:
        raise unknown_entry_error(app, name, namespace=namespace, entries=entries)
    return found


def celery_entry_in(app, name: str, config: Mapping,
                    stored_text: str | None) -> beat.ScheduleEntry | None:
    """Celery's entry of ``name``: its config item (``config``:
    :func:`~celery_anarchon.operate.config.config_items`) first, as the engine does, else the
    store's definition ``stored_text``; ``None`` when neither defines it (a pause of a name, or
    nothing).

    :raises ConfigError: Celery cannot build the config item, or the definition is invalid.
    """
    if name in config:
        return config_entry(name, config[name], app=app)
    if stored_text is not None:
        return entry_json.parse(name, stored_text, app=app)
    return None


def unknown_entry_error(app, name: str, *, namespace: str,
                        entries: Entries) -> UnknownEntry:
    """The error of a name neither ``beat_schedule`` nor the store (of ``namespace``, its
    ``entries`` part) defines, naming the closest known name."""
    names = sorted(config_items(app)) + sorted(_store_names(entries))
    hint = did_you_mean(name, names)
    return UnknownEntry(f"no entry {name!r}{hint}: neither beat_schedule nor the store "
                        f"(namespace {namespace!r}) defines it; fix: check the "
                        "name (celery anarchon list), or add it")


def _store_names(entries: Entries) -> list[str]:
    try:
        return [n for n, s in entries.load_entries().entries.items() if s.definition]
    except Exception:  # only for a hint in an error message
        return []


def stored_data(name: str, text: str, *, strict: bool = False) -> dict:
    """A stored definition as data, for views and ``update``; its nesting is checked before it is
    parsed (a definition an older version stored may nest past Python's recursion limit).

    :param strict: raise instead of returning a note (``update`` merges into the data).
    :returns: the definition; one that cannot be read back as an object (``strict`` off) is
        ``{"repr": <why>, "storable": false}``.
    :raises ConfigError: (``strict``) not valid UTF-8, nested too deep, not JSON, or not an
        object.
    """
    problem = limits.undecodable(text)  # bytes the store read that are not UTF-8
    if problem is None and limits.text_too_deep(text):
        problem = f"is nested more than {limits.MAX_DEPTH} levels deep"
    elif problem is None:
        try:
            data = json.loads(text)
        except ValueError as exc:
            problem = f"is not valid JSON ({exc})"
        else:
            if isinstance(data, dict):
                return data
            problem = "is not a JSON object"
    message = (f"entry {name!r}: the stored definition {problem}; fix: remove the entry and add "
               "it again")
    if strict:
        raise ConfigError(message)
    return {"repr": message, "storable": False}
