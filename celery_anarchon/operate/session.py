"""The store of one app's namespace as the schedules API holds it: opened once (or given),
prepared before the first read or write, closed when it is the app's own; who makes the changes;
an entry found by name, config first.
"""
from __future__ import annotations

from typing import Any, Self

from celery import beat

from celery_anarchon.errors import ConfigError, StoreNotReached, StoreUnavailable, UnknownEntry
from celery_anarchon.operate.config import config_items
from celery_anarchon.operate.listing import (
    ScheduledEntry, celery_entry_of, scheduled, unknown_entry_error,
)
from celery_anarchon.operate.names import by_text, default_by
from celery_anarchon.settings import Settings, make_instance_id, open_app_store
from celery_anarchon.stores.base import ClaimStore, entry_store
from celery_anarchon.stores.entry_store import Entries, EntrySnapshot, StoredEntry


def not_reached(exc: StoreUnavailable, url: str) -> StoreNotReached:
    """The error of an operation whose store could not be reached before it wrote anything:
    ``exc``'s words, then that nothing was changed, and the fix.

    :param url: the store's URL, masked (``store.safe_url``).
    """
    return StoreNotReached(f"{str(exc).rstrip('.')}; nothing was changed: the store {url} could "
                           "not be reached; fix: check anarchon_store_url (or the broker URL the "
                           "store follows), that the server runs and that this host reaches it, "
                           "then retry")


class NamespaceSession:
    """The app's namespace in its store, for :class:`~celery_anarchon.operate.schedules.Schedules`
    (whose docstring gives the parameters and what is raised).

    :param app: the Celery app.
    :param store: a store to use instead of the app's (then not closed by :meth:`close`).
    :param by: who makes the changes (default :func:`~celery_anarchon.operate.names.default_by`).
    :raises ConfigError: a bad ``anarchon_*`` setting, ``by`` that is not text every store can
        hold, or a store that cannot hold entries.
    """

    def __init__(self, app, *, store: ClaimStore | None = None, by: str | None = None) -> None:
        self.app = app
        self.by = default_by() if by is None or by == "" else by_text(by)   # before the store
        self.settings = Settings.from_app(app)
        own = store is None
        if store is None:
            store = open_app_store(self.settings, instance_id="api:" + make_instance_id())
        self.store = store
        try:
            #: the store's entries part
            self.entries: Entries = entry_store(store)
        except ConfigError:
            if own:
                store.close()
            raise
        self._own_store = own
        self._prepared = False

    # -- life cycle ----------------------------------------------------------------------------
    def close(self) -> None:
        """Release the store's connections (the app's own store only). Safe to call twice."""
        if self._own_store:
            self.store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _who(self, by: Any, name: str | None = None) -> str:
        """Who makes a change (to the entry ``name``): ``by`` checked
        (:func:`~celery_anarchon.operate.names.by_text`), else this object's ``by``."""
        return self.by if by is None or by == "" else by_text(by, name)

    def _ready(self) -> Entries:
        """The store's entries part, the store prepared once (its tables or keys created, as a
        beat start-up does) before the first read or write of every operation.

        :raises StoreNotReached: the store could not be reached to prepare it (nothing the
            operation asks was written yet: :func:`not_reached`).
        """
        if not self._prepared:
            try:
                self.store.prepare(())
            except StoreUnavailable as exc:
                raise not_reached(exc, self.store.safe_url) from exc
            self._prepared = True
        return self.entries

    # -- for the operations ------------------------------------------------------------------
    def _snapshot(self) -> EntrySnapshot:
        return self._ready().load_entries()

    def _known(self, name: str, snapshot: EntrySnapshot) -> beat.ScheduleEntry:
        """Celery's entry of ``name``, config first
        (:func:`~celery_anarchon.operate.listing.celery_entry_of`)."""
        return celery_entry_of(self.app, name, snapshot, namespace=self.settings.namespace,
                           entries=self.entries)

    def _unknown(self, name: str) -> UnknownEntry:
        return unknown_entry_error(self.app, name, namespace=self.settings.namespace,
                                   entries=self.entries)

    def _as_scheduled(self, stored: StoredEntry) -> ScheduledEntry:
        return scheduled(self.app, config_items(self.app), stored.name, stored)
