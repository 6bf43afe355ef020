"""The memory store, ``memory://``: the claim decision order as readable Python, in one process.

Everything a lease store and an entry store keep (claims, history, leased runs, entries, pauses,
run-now requests, instance records) lives in dicts under one lock per named server
(:mod:`.state`), on an injectable clock. Each operation holds the lock from its first read to its
last write, so it is atomic as a Lua script or an SQL transaction is; the rules are the other
backends' (:mod:`.claims`, :mod:`.leases`, :mod:`.entries`, :mod:`.history`, :mod:`.notes`).

It is a store for tests: one process only. Stores opened with the same URL in one process share
one server, so several beat instances (or a beat and an in-process worker) race on it as on a
real store; another process, a forked child included, never sees it. Beat refuses it outside a
test app (docs/stores.md "memory://").

URLs::

    memory://            the server named ""
    memory://<name>      the server named <name> (what follows ``memory://``)
"""
from __future__ import annotations

import contextlib
import datetime as dt
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, ClassVar

from celery_anarchon._util import positive_int, seconds
from celery_anarchon.errors import ConfigError, StoreUnavailable
from celery_anarchon.stores._common import reject_unknown_options, scheme_of
from celery_anarchon.stores.base import (
    DEFAULT_CLAIM_TIMEOUT_S, DEFAULT_HISTORY_SIZE, DEFAULT_MEMORY_S, ClaimRequest, ClaimResult,
    ClaimStore, Memory,
)
from celery_anarchon.stores.memory.history import MemoryHistory
from celery_anarchon.stores.memory.claims import ClaimBatch
from celery_anarchon.stores.memory.entries import MemoryEntries, prune_entries
from celery_anarchon.stores.memory.leases import MemoryLeases
from celery_anarchon.stores.memory.notes import MemoryStart, fences, note_store
from celery_anarchon.stores.memory.state import Server, Space, server_named

#: store time between two prunes of what the store no longer promises to remember, ms (or half
#: the memory, if shorter), as the SQL stores prune
PRUNE_INTERVAL_MS = 5_000


def wall_clock_ms() -> int:
    """This host's clock, UTC ms: the default clock of a memory store."""
    return time.time_ns() // 1_000_000


class MemoryStore(ClaimStore):
    """A store held in this process (module docstring) with every part: its ``history`` is
    :class:`.history.MemoryHistory`, its ``leases`` :class:`.leases.MemoryLeases`; its
    ``entries`` and ``instances`` are one part, :class:`.entries.MemoryEntries`.

    Options (``anarchon_store_options``): ``memory`` (seconds a claimed run is remembered,
    default 3600; recorded in the store: every instance must use the same value, as on SQL),
    ``history_size`` (runs kept per entry, default 100), ``claim_timeout`` (seconds an operation
    waits for the server's lock, default 5) and ``clock``: a callable returning the store's time,
    UTC ms (default :func:`wall_clock_ms`; stores sharing a server should share it, as the
    instances of a real store share its server's clock).

    :raises ConfigError: not a ``memory://`` URL, an unknown option or a bad option value.
    """

    kind = "memory"
    checks_lateness = True
    #: what it holds lives in this process only: beat refuses it outside a test app
    one_process: ClassVar[bool] = True

    def __init__(self, url: str, *, namespace: str, instance_id: str,
                 memory: float | dt.timedelta = DEFAULT_MEMORY_S,
                 history_size: int = DEFAULT_HISTORY_SIZE,
                 claim_timeout: float | dt.timedelta = DEFAULT_CLAIM_TIMEOUT_S,
                 clock: Callable[[], int] | None = None, **options: Any) -> None:
        reject_unknown_options(self.kind, options, {"memory", "clock"})
        if scheme_of(url) != "memory":
            raise ConfigError(f"anarchon_store_url {url!r}: the memory store takes memory:// or "
                              "memory://<name> URLs")
        if clock is not None and not callable(clock):
            raise ConfigError(f"anarchon_store_options['clock'] = {clock!r}: must be a callable "
                              "returning the store's time in UTC ms")
        super().__init__(url, namespace=namespace, instance_id=instance_id,
                         history_size=positive_int("history_size", history_size),
                         claim_timeout=seconds("claim_timeout", claim_timeout))
        #: the server's name: what follows ``memory://``
        self.name = url.split("://", 1)[1]
        #: how long a claimed run is remembered, seconds and ms
        self.memory_s = seconds("memory", memory)
        self.memory_ms = math.ceil(self.memory_s * 1000)
        #: the store's clock, UTC ms
        self.clock = clock or wall_clock_ms
        #: the history of runs and the texts of definitions
        self.history = MemoryHistory(instance_id=instance_id, history_size=self.history_size,
                                     operation=self.operation)
        #: store entries, pauses, run-now requests and instance records: one part
        self.entries = self.instances = MemoryEntries(
            namespace=namespace, memory_ms=self.memory_ms, operation=self.operation,
            note=self.note)
        #: the records of leased runs
        self.leases = MemoryLeases(
            instance_id=instance_id, history_size=self.history_size, memory_ms=self.memory_ms,
            where=self.where, operation=self.operation, note=self.note)

    @property
    def where(self) -> str:
        """``memory store <url>``, for messages."""
        return f"{self.kind} store {self.safe_url}"

    @property
    def memory(self) -> Memory:
        """``memory`` seconds, pruned by age only (docs/design.md, store memory table)."""
        return Memory(duration_s=self.memory_s, count=None, setting="memory")

    @contextlib.contextmanager
    def operation(self, what: str) -> Iterator[tuple[Server, Space, int]]:
        """Hold the server's lock for one operation: ``(server, the namespace's data, the store's
        clock in UTC ms)``.

        :raises StoreUnavailable: the lock was not free within ``claim_timeout``.
        """
        server = server_named(self.name)
        if not server.lock.acquire(timeout=self.claim_timeout):
            raise StoreUnavailable(f"{self.where}: {what} failed: its lock was not free within "
                                   f"claim_timeout {self.claim_timeout:g} s")
        try:
            yield server, server.space(self.namespace), int(self.clock())
        finally:
            server.lock.release()

    def note(self, server: Server, space: Space, now: int, *, claiming: bool) -> MemoryStart:
        """The namespace's memory start, brought up to date (:func:`.notes.note_store`)."""
        return note_store(server, space, now, memory_ms=self.memory_ms, claiming=claiming,
                          where=self.where)

    # -- life cycle -------------------------------------------------------------------------------
    def prepare(self, entries: Iterable[str]) -> list[str]:
        """Note the memory start of the namespace (when it has none) and of ``entries``.

        :returns: the warning that what it holds lives in this process only.
        :raises ConfigError: the store recorded another ``memory`` that is still in use.
        """
        with self.operation("prepare") as (server, space, now):
            start = self.note(server, space, now, claiming=False)
            if start.conflict is not None:
                raise ConfigError(f"{self.where}: {start.conflict}")
            fences(space, sorted(set(entries)), now)
        return [f"{self.where}: what it holds lives in this process only (gone when it exits, "
                "never seen by another beat, worker or command): a store for tests"]

    def close(self) -> None:
        """Nothing to release: the server's data stays for the other stores of this process."""

    def now_ms(self) -> int:
        """The store's clock, UTC ms."""
        return int(self.clock())

    # -- claims -----------------------------------------------------------------------------------
    def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimResult]:
        """Every request decided in order, atomically (:class:`.claims.ClaimBatch`)."""
        if not requests:
            return []
        with self.operation("claim") as (server, space, now):
            start = self.note(server, space, now, claiming=True)
            batch = ClaimBatch(space, start, now, instance_id=self.instance_id,
                               memory_ms=self.memory_ms, memory_s=self.memory_s)
            results = batch.decide_all(list(requests), self.history_size)
            if now >= space.next_prune_ms:
                space.next_prune_ms = now + min(PRUNE_INTERVAL_MS, self.memory_ms // 2)
                self._prune(space, now)
            return results

    def _prune(self, space: Space, now: int) -> None:
        """Drop what the store no longer promises to remember: claims past ``max(claim time,
        slot) + memory``, terminal runs past their end + memory, and the entry store's expired
        records (:func:`.entries.prune_entries`)."""
        for run in [r for r, c in space.claims.items() if c.keep_until_ms < now]:
            del space.claims[run]
        for runs in space.runs.values():
            for slot in [s for s, r in runs.items()
                         if r.keep_until_ms is not None and r.keep_until_ms < now]:
                del runs[slot]
        prune_entries(space, now)
