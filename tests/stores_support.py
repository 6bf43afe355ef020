"""Helpers to open every store against its real server, and to wipe one (amnesia tests)."""
from __future__ import annotations

import os
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import ClaimStore

import backends
from backends import (  # noqa: F401  (re-exported: the lists the tests parametrize over)
    ALL_STORES, LATENESS_STORES, LEASE_STORES, VARIANT_OPTIONS, backdate_memory_start,
)
from conftest import require_server


@dataclass
class StoreMaker:
    """Opens stores of one backend that share one namespace, as several instances would."""

    kind: str
    url: str
    namespace: str
    opened: list[ClaimStore] = field(default_factory=list)

    def __call__(self, instance_id: str | None = None, **options) -> ClaimStore:
        options = {**VARIANT_OPTIONS.get(self.kind, {}), **options}
        store = open_store(self.url, namespace=self.namespace,
                           instance_id=instance_id or "inst-" + uuid.uuid4().hex[:6], options=options)
        self.opened.append(store)
        return store

    def wipe(self) -> None:
        """Make the server forget everything of this store (a Redis restarted without
        persistence, a dropped database): the amnesia case (the registry's wipe of the kind)."""
        backends.wipe(self.kind, self.url, self.namespace)

    def close_all(self) -> None:
        for store in self.opened:
            store.close()


def store_url(kind: str, tmpdir: str) -> str:
    """The URL of a real server (or file) for ``kind``; skips/fails when the server is down."""
    backend = backends.BY_KIND[kind]
    if backend.url_variable is None:
        return "sqlite:///" + os.path.join(tmpdir, "claims.sqlite3")
    require_server(backend.url, backend.server)
    return backend.url


def wait_until(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.02):
    """Poll ``predicate`` until it returns a true value; fail with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def new_tmpdir() -> str:
    return tempfile.mkdtemp(prefix="anarchon-test-")
