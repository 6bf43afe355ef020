"""Store entries, pauses, run-now requests and instance records of a memory store: the
:class:`~celery_anarchon.stores.entry_store.Entries` and
:class:`~celery_anarchon.stores.entry_store.Instances` parts (one object), as
:mod:`celery_anarchon.stores.entry_store` and :mod:`celery_anarchon.stores.run_now` state them
(the SQL stores: :mod:`celery_anarchon.stores.sql.entries`).

Every write raises the namespace's entries version and writes the entries epoch when the
namespace has none or the server's epoch changed since (docs/design.md "Amnesia"); a resume and a
removal leave the name's record cleared, pruned after
:data:`~celery_anarchon.stores.entry_store.CLEARED_KEEP_MS` by the next write. A pause is read by
the claim under the same lock, so a pause written before a claim always holds. Definitions are
kept as the text given: nothing is evaluated. Instants are UTC ms on the store's clock.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager

from celery_anarchon._util import LATENESS_TOLERANCE_MS
from celery_anarchon.errors import EntryExists, UnknownEntry
from celery_anarchon.stores.entry_store import (
    CLEARED_KEEP_MS, DEFAULT_REQUEST_RETENTION_S, Entries, EntriesEpoch, EntrySnapshot,
    InstanceRecord, Instances, Pause, RunRequest, StoredEntry, new_epoch_id,
)
from celery_anarchon.stores.memory.notes import MemoryStart, fences
from celery_anarchon.stores.memory.state import Server, Space
from celery_anarchon.stores.run_now import (
    RequestClock, SlotWindow, SlotWindowPassed, no_free_slot, request_id_ms, request_refusal,
)

#: the fields of an instance record written by its heartbeat (the others are read back only)
_RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(InstanceRecord)
                       if f.name not in ("seen_ms", "expires_ms"))
#: fingerprints no heartbeat named for this long are pruned (ms): a day, as in SQL
FINGERPRINTS_KEEP_MS = 86_400_000


def prune_entries(space: Space, now: int) -> None:
    """Drop expired instance records, fingerprints unused for :data:`FINGERPRINTS_KEEP_MS` and
    cleared records older than :data:`CLEARED_KEEP_MS`."""
    for iid in [i for i, r in space.instances.items() if r.expires_ms < now]:
        del space.instances[iid]
    for digest in [d for d, (_, used) in space.fingerprints.items()
                   if used < now - FINGERPRINTS_KEEP_MS]:
        del space.fingerprints[digest]
    for name in [n for n, e in space.stored.items()
                 if e.cleared and e.updated_ms < now - CLEARED_KEEP_MS]:
        del space.stored[name]


class MemoryEntries(Entries, Instances):
    """The entry and instance record operations of one store's namespace, each under the
    server's lock: a part of :class:`~celery_anarchon.stores.memory.store.MemoryStore`, given
    what it needs of it.

    :param memory_ms: the store's memory, ms: run-now requests older than it are not loaded.
    :param operation: ``operation(what)``: the store's lock held for one operation, as a context
        of ``(server, space, now)``.
    :param note: ``note(server, space, now, claiming=False)``: the namespace's memory start.
    """

    def __init__(self, *, namespace: str, memory_ms: int,
                 operation: Callable[[str], AbstractContextManager[tuple[Server, Space, int]]],
                 note: Callable[..., MemoryStart]) -> None:
        self.namespace = namespace
        self.memory_ms = memory_ms
        self.operation = operation
        self.note = note

    def _bump(self, server: Server, space: Space, now: int) -> int:
        """Raise the entries version (every write), write a new entries epoch when the namespace
        has none or the server's epoch changed since, and prune cleared records. :returns: the
        new version."""
        space.version += 1
        if not space.entries_epoch or space.entries_server_epoch != server.epoch:
            space.entries_epoch, space.entries_server_epoch = new_epoch_id(), server.epoch
        prune_entries(space, now)
        return space.version

    def _record(self, space: Space, name: str, now: int, by: str, version: int, *,
                definition: str | None, pause: Pause | None) -> StoredEntry:
        fences(space, [name], now)     # the name's fence, as the row every claim locks
        stored = space.stored[name] = StoredEntry(name, definition, pause, version, now, by)
        return stored

    # -- reads -------------------------------------------------------------------------------------
    def entries_version(self) -> int:
        """The namespace's entries version (``0`` before any change)."""
        with self.operation("read the entries version") as (_, space, _now):
            return space.version

    def entries_epoch(self) -> EntriesEpoch:
        """The namespace's entries epoch (``""``: none) and version."""
        with self.operation("read the entries epoch") as (_, space, _now):
            return EntriesEpoch(space.entries_epoch, space.version)

    def load_entries(self) -> EntrySnapshot:
        """Every entry, pause and cleared record by name, the run-now requests younger than the
        store's memory (by time, entry and id), the version, epoch and accepted loss."""
        with self.operation("load the entries") as (_, space, now):
            young = [r for r in space.requests.values()
                     if r.requested_ms >= now - self.memory_ms]
            young.sort(key=lambda r: (r.requested_ms, r.entry, r.request_id))
            return EntrySnapshot(space.version, dict(sorted(space.stored.items())), tuple(young),
                                 epoch=space.entries_epoch, accepted_ms=space.accepted_ms,
                                 accepted_by=space.accepted_by)

    # -- writes ------------------------------------------------------------------------------------
    def accept_loss(self, *, by: str) -> int:
        """Record the accepted loss (now, ``by``) and raise the entries version."""
        with self.operation("accept the loss") as (server, space, now):
            self._bump(server, space, now)
            space.accepted_ms, space.accepted_by = now, by
            return now

    def put_entry(self, name: str, definition: str, *, by: str, create: bool) -> StoredEntry:
        """Add (``create``) or update a store entry's definition, keeping its pause.

        :raises EntryExists: ``create`` and the name holds a definition.
        :raises UnknownEntry: not ``create`` and the name holds none.
        """
        with self.operation("write an entry") as (server, space, now):
            old = space.stored.get(name)
            if create and old is not None and old.definition is not None:
                raise EntryExists(f"entry {name!r} exists already in the store (namespace "
                                  f"{self.namespace!r}): update it, or remove it first")
            if not create and (old is None or old.definition is None):
                raise UnknownEntry(f"entry {name!r} is not in the store (namespace "
                                   f"{self.namespace!r}): add it first")
            return self._record(space, name, now, by, self._bump(server, space, now),
                                definition=definition, pause=old.pause if old else None)

    def remove_entry(self, name: str, *, by: str) -> bool:
        """Remove a store entry's definition and its pause, leaving the name's record cleared;
        ``False`` (nothing written) when the name holds no definition."""
        with self.operation("remove an entry") as (server, space, now):
            old = space.stored.get(name)
            if old is None or old.definition is None:
                return False
            self._record(space, name, now, by, self._bump(server, space, now), definition=None,
                         pause=None)
            return True

    def set_pause(self, name: str, pause: Pause | None, *, by: str) -> StoredEntry:
        """Pause or resume (``None``) ``name``, the pause's time the store's clock; a resume is
        written even where nothing was (a cleared record)."""
        what = "pause an entry" if pause else "resume an entry"
        with self.operation(what) as (server, space, now):
            old = space.stored.get(name)
            version = self._bump(server, space, now)
            return self._record(space, name, now, by, version,
                                definition=old.definition if old else None,
                                pause=Pause(pause.reason, pause.by, now) if pause else None)

    # -- run-now requests --------------------------------------------------------------------------
    def request_clock(self) -> RequestClock:
        """The store's clock, its memory start (noted now on a new or wiped store) and the
        newest prune of request ids."""
        with self.operation("read the clock for a request id") as (server, space, now):
            born = self.note(server, space, now, claiming=False).born_ms
            return RequestClock(now, born, space.pruned_ms)

    def find_request(self, entry: str, request_id: str) -> RunRequest | None:
        """The request of ``entry`` with ``request_id`` (``created`` False), or ``None``."""
        with self.operation("find a run-now request") as (_, space, _now):
            found = space.requests.get((entry, request_id))
            return None if found is None else dataclasses.replace(found, created=False)

    def request_run(self, entry: str, request_id: str, window: SlotWindow, *, by: str,
                    retention_ms: int = int(DEFAULT_REQUEST_RETENTION_S * 1000)) -> RunRequest:
        """:meth:`~celery_anarchon.stores.entry_store.Entries.request_run`, its five steps in
        their order under the lock.

        :raises RequestRefused: step 2; nothing written.
        :raises SlotWindowPassed: the store's clock is outside ``window``; nothing written.
        :raises ConfigError: no free millisecond; nothing written.
        """
        retention_ms = int(retention_ms)
        with self.operation("request a run") as (server, space, now):
            clock = RequestClock(now, self.note(server, space, now, claiming=False).born_ms,
                                 space.pruned_ms)
            fences(space, [entry], now)
            found = space.requests.get((entry, request_id))                    # 1.
            if found is not None:
                return dataclasses.replace(found, created=False)
            id_ms = request_id_ms(request_id)                                  # 2.
            why = None if id_ms is None else clock.refusal(id_ms, retention_ms)
            if why is not None:
                raise request_refusal(entry, request_id, why, id_ms=id_ms, clock=clock,
                                      retention_ms=retention_ms)
            if not window.covers(now):
                raise SlotWindowPassed(f"run-now of {entry!r}: the store's clock {now} is outside "
                                       f"the window {window.start_ms}..{window.end_ms}")
            oldest = now - retention_ms - LATENESS_TOLERANCE_MS                # 3.
            for key in [k for k, r in space.requests.items() if r.requested_ms < oldest]:
                del space.requests[key]
            space.pruned_ms = max(space.pruned_ms, now - retention_ms)
            taken = {r.slot_ms for (e, _), r in space.requests.items()         # 4.
                     if e == entry and now <= r.slot_ms <= window.end_ms}
            slot = window.choose(now, taken)
            if slot is None:
                raise no_free_slot(entry)
            made = RunRequest(entry, request_id, slot, by, now, created=True)  # 5.
            space.requests[(entry, request_id)] = dataclasses.replace(made, created=False)
            self._bump(server, space, now)
            return made

    # -- instance records ------------------------------------------------------------------------
    def record_instance(self, record: InstanceRecord, ttl_ms: int) -> None:
        """The heartbeat, expiring ``ttl_ms`` later on the store's clock; the fingerprints it
        names are used now."""
        # as JSON, as every other store keeps it: what is read back is data, never the caller's
        fields = json.loads(json.dumps({k: getattr(record, k) for k in _RECORD_FIELDS}))
        with self.operation("record the instance") as (_, space, now):
            space.instances[record.instance_id] = InstanceRecord(
                **fields, seen_ms=now, expires_ms=now + int(ttl_ms))
            if record.fingerprints_digest in space.fingerprints:
                mapping, _ = space.fingerprints[record.fingerprints_digest]
                space.fingerprints[record.fingerprints_digest] = (mapping, now)

    def instances(self) -> list[InstanceRecord]:
        """The records not expired on the store's clock, by instance id."""
        with self.operation("read the instances") as (_, space, now):
            return [r for _, r in sorted(space.instances.items()) if r.expires_ms >= now]

    def remove_instance(self, instance_id: str) -> None:
        """Drop the instance's heartbeat."""
        with self.operation("remove the instance") as (_, space, _now):
            space.instances.pop(instance_id, None)

    def save_fingerprints(self, digest: str, fingerprints: Mapping[str, str]) -> None:
        """Keep ``fingerprints`` under ``digest`` (content-addressed: a second save only
        refreshes its last use)."""
        with self.operation("save fingerprints") as (_, space, now):
            mapping, _ = space.fingerprints.get(digest, (dict(fingerprints), now))
            space.fingerprints[digest] = (mapping, now)

    def load_fingerprints(self, digest: str) -> dict[str, str] | None:
        """The mapping saved under ``digest``, or ``None``."""
        with self.operation("load fingerprints") as (_, space, _now):
            found = space.fingerprints.get(digest)
            return None if found is None else dict(found[0])
