"""The entry store of the Redis store, every strategy (:mod:`celery_anarchon.stores.entry_store`):
store entries, pauses and run-now requests of one namespace, and the keys of the namespace
(the instance records and fingerprint mappings among them: :mod:`.instances`).
:class:`RedisEntries` is a part of :class:`~.store.RedisStore`, which hands it its connection;
its scripts are in :mod:`.entry_scripts`, and the pause itself is read inside every claim script
(``pause_refusal`` in :mod:`.scripts`).

Keys, all under the namespace's one hash tag ``<prefix>:{<namespace>}`` (that of the store-wide
hash ``:store``)::

    :entries            hash   name -> {d: definition (absent: only a pause, or cleared),
                                        v: version, t: changed at ms, b: by}
    :pauses             hash   name -> {r: reason, b: by, t: paused at ms}
    :entries:version    string the namespace's entries version
    :entries:epoch      hash   the entries epoch {id, born: ms, server: the run_id it was
                               written under, accepted: ms, accepted_by}
    :entries:cleared    zset   the names whose record is cleared, scored by the ms it was
    :requests           hash   "<entry> <request id>" (percent-escaped) -> {e, i, s: slot, b, t}:
                               the requests younger than the memory (what load_entries reads)
    :requests:age       zset   request field scored by its request ms
    :requests:slots     zset   request field scored by its slot (a new request's slot avoids them)
    :requests:ids       hash   request field -> the same record, kept for the retention
    :requests:ids:age   zset   request field scored by its request ms
    :requests:pruned    string the newest "now - retention" of a prune of :requests:ids
    :instances          hash   instance id -> "<seen ms> <expires ms> <record JSON>"
    :instances:expiry   zset   instance id scored by its expiry ms
    :fingerprints       hash   digest -> JSON {config entry name: fingerprint}
    :fingerprints:kept  zset   digest scored by the ms until which it is kept

Every write of an entry, a pause or a request is one Lua script that raises ``:entries:version``
in the same script (atomic with the write) and writes the entries epoch when there is none or
the server's ``run_id`` changed since (a restart or a failover: docs/design.md "Amnesia"; a
version raised under the old epoch would hide the loss from an instance), and a resume or a
removal leaves the name's record cleared (pruned after
:data:`~celery_anarchon.stores.entry_store.CLEARED_KEEP_MS`). Each write is confirmed as a
durable claim is: the store's ``durability`` (WAIT / WAITAOF pipelined after it, with the ``confirm_write`` script of
:mod:`.scripts` counting the replicas by the claims' rule). One the master applied but did not
confirm within ``confirm_timeout`` raises :class:`~celery_anarchon.errors.StoreError`: the change
may be lost if the master fails over now (a pause lost so would let the promoted replica run the
entry), so the caller repeats it once the replicas are back. With durability ``"none"`` the script
runs alone. Instance records and fingerprint mappings are not confirmed (a heartbeat is written
again within seconds). :meth:`RedisEntries.version` is one GET, and the other
reads are one MULTI (one consistent read). Every time is the server's ``TIME``: an instance
record expires on the store's clock. No key carries a TTL: requests (older than the store's
memory, or a day when it is unbounded; their ids after the retention the request script is
given), expired instance records and fingerprint mappings no heartbeat named for a day are
pruned by the scripts that write their kind. The request script also reads and keeps the
store-wide note of the claims' scripts (``:store``: epoch and memory start, with the same rules):
its memory start begins the memory of run-now requests. Numbers are written as
decimal strings (``%d``), definitions as the caller's JSON text: nothing is pickled or evaluated.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

import redis

from celery_anarchon import limits
from celery_anarchon._util import LATENESS_TOLERANCE_MS
from celery_anarchon.errors import EntryExists, UnknownEntry
from celery_anarchon.stores.entry_store import (
    CLEARED_KEEP_MS, DEFAULT_REQUEST_RETENTION_S, EntriesEpoch, Entries, EntrySnapshot, Pause,
    RunRequest, StoredEntry, new_epoch_id,
)
from celery_anarchon.stores.run_now import (
    EXTRA_SLOT_SEARCH_MS, RequestClock, SlotWindow, SlotWindowPassed, no_free_slot,
    request_id_ms, request_refusal,
)
from celery_anarchon.stores.redis.connection import RedisConnection
from celery_anarchon.stores.redis.options import namespace_key_prefix

#: The namespace's keys, by role (``<prefix>:{<namespace>}:<role>``); ``store`` is the store-wide
#: hash of :data:`~.scripts.STORE_FIELDS`.
ROLES = ("store", "pauses", "entries", "entries:version", "requests", "requests:age",
         "requests:slots", "requests:ids", "requests:ids:age", "requests:pruned", "instances",
         "instances:expiry", "fingerprints", "fingerprints:kept", "entries:epoch",
         "entries:cleared")
#: The keys of every write of an entry or a pause, in the order its script receives them.
WRITE_ROLES = ("entries", "pauses", "entries:version", "entries:epoch", "entries:cleared")
#: How long run-now requests are kept when the store's memory is unbounded (stream-id), ms.
DAY_MS = 86_400_000


def namespace_keys(key_prefix: str, namespace: str) -> dict[str, str]:
    """Every key of the namespace itself, by role (:data:`ROLES`), all with one hash tag."""
    start = namespace_key_prefix(key_prefix, namespace)
    return {role: f"{start}:{role}" for role in ROLES}


# -- the operations --------------------------------------------------------------------------------

class RedisEntries(Entries):
    """The :class:`~celery_anarchon.stores.entry_store.Entries` operations of one Redis
    namespace (the store's ``entries`` part).

    :param keys: the namespace's keys (:func:`namespace_keys`).
    :param connection: the store's connection (the scripts of
        :data:`.entry_scripts.SCRIPTS` registered on it): its writes are confirmed as a durable
        claim is (:meth:`~.connection.RedisConnection.write`: StoreError when a write is not
        confirmed within ``confirm_timeout``).
    :param horizon_ms: how long run-now requests are kept, ms (the store's memory; ``0``: unbounded,
        then :data:`DAY_MS`).
    """

    def __init__(self, keys: Mapping[str, str], connection: RedisConnection,
                 horizon_ms: int) -> None:
        self.keys = dict(keys)
        self.connection = connection
        self.horizon_ms = int(horizon_ms) or DAY_MS
        #: how errors name the store and namespace (``"Redis store <url>, namespace 'x'"``)
        self.where = connection.where

    def _write(self, doing: str, script: str, roles: tuple[str, ...], *args) -> Any:
        """Run the write ``script`` on the namespace's keys of ``roles``, confirmed.

        :returns: its reply, JSON decoded.
        :raises StoreError: not confirmed within ``confirm_timeout``.
        :raises StoreUnavailable: the store did not answer.
        """
        return self.connection.write(doing, script, [self.keys[r] for r in roles], list(args))

    def _write_entries(self, doing: str, script: str, *args) -> Any:
        """Run a write of entries or pauses (KEYS :data:`WRITE_ROLES`; ``args`` then a new epoch
        id and :data:`CLEARED_KEEP_MS`), confirmed, as :meth:`_write`."""
        return self._write(doing, script, WRITE_ROLES, *args, new_epoch_id(), CLEARED_KEEP_MS)

    def _read(self, doing: str, fill: Callable[[redis.client.Pipeline], None]) -> list:
        """One MULTI/EXEC (a consistent read) on the namespace's keys: ``fill(pipe)`` queues the
        commands."""
        return self.connection.multi(doing, self.keys["entries"], fill)

    # -- entries, pauses, requests ------------------------------------------------------------
    def entries_version(self) -> int:
        """The namespace's entries version: one GET (0 before any change)."""
        with self.connection.unavailable("read the entries version"):
            value = self.connection.client()[0].get(self.keys["entries:version"])
        return int(value or 0)

    def entries_epoch(self) -> EntriesEpoch:
        """The namespace's entries epoch and version: one MULTI of a GET and an HGET."""
        k = self.keys
        version, epoch = self._read("read the entries epoch", lambda p: (
            p.get(k["entries:version"]), p.hget(k["entries:epoch"], "id")))
        return EntriesEpoch(epoch=epoch or "", version=int(version or 0))

    def load_entries(self) -> EntrySnapshot:
        """Every entry, pause and cleared record, the requests younger than the horizon, the
        entries epoch and the last accepted loss, in one MULTI."""
        k = self.keys
        version, entries, pauses, requests, (secs, micros), epoch = self._read(
            "load entries", lambda p: (
                p.get(k["entries:version"]), p.hgetall(k["entries"]), p.hgetall(k["pauses"]),
                p.hgetall(k["requests"]), p.time(),
                p.hmget(k["entries:epoch"], "id", "accepted", "accepted_by")))
        now = int(secs) * 1000 + int(micros) // 1000
        stored = {name: _read_record(name, raw, pauses.get(name))
                  for name, raw in entries.items()}
        young = [r for r in map(_request, map(json.loads, requests.values()))
                 if r.requested_ms > now - self.horizon_ms]
        young.sort(key=lambda r: (r.requested_ms, r.entry, r.request_id))
        epoch_id, accepted, accepted_by = epoch
        return EntrySnapshot(version=int(version or 0), entries=stored, requests=tuple(young),
                             epoch=epoch_id or "", accepted_ms=int(accepted or 0),
                             accepted_by=accepted_by or "")

    def accept_loss(self, *, by: str) -> int:
        """Record the accepted loss (the server's clock, ``by``); raises the version."""
        return int(self._write_entries("accept the loss", "entries_accept", by)["now"])

    def put_entry(self, name: str, definition: str, *, by: str, create: bool) -> StoredEntry:
        """Add or update a definition (see :meth:`Entries.put_entry`)."""
        reply = self._write_entries(f"{'add' if create else 'update'} {name!r}", "entry_put",
                                    name, definition, by, "1" if create else "0")
        if reply["o"] == "exists":
            raise EntryExists(f"{self.where}: the store holds an entry {name!r} already; update "
                              "it, or remove it first")
        if reply["o"] == "unknown":
            raise UnknownEntry(f"{self.where}: the store holds no entry {name!r}; add it first")
        return _stored(name, reply["r"], reply.get("p"))

    def remove_entry(self, name: str, *, by: str) -> bool:
        """Remove a definition and its pause, leaving the record cleared; False when there was
        no definition."""
        return self._write_entries(f"remove {name!r}", "entry_remove", name, by)["o"] == "ok"

    def set_pause(self, name: str, pause: Pause | None, *, by: str) -> StoredEntry:
        """Pause or resume ``name`` (the pause's time is the server's)."""
        reply = self._write_entries(
            f"{'pause' if pause else 'resume'} {name!r}", "entry_pause", name,
            "1" if pause else "0", pause.reason if pause else "", pause.by if pause else "", by)
        return _stored(name, reply["r"], reply.get("p"))

    def request_clock(self) -> RequestClock:
        """The server's ``TIME`` once the store-wide memory start is noted, with the prune mark
        (one script)."""
        return _clock(self._write("read the clock for a request id", "request_clock",
                                  ("store", "requests:pruned")))

    def find_request(self, entry: str, request_id: str) -> RunRequest | None:
        """:meth:`Entries.find_request`: the two HGETs of :data:`REQUEST_RUN`'s first step,
        in one MULTI."""
        field = _request_field(entry, request_id)
        kept, young = self._read("find a run-now request", lambda p: (
            p.hget(self.keys["requests:ids"], field), p.hget(self.keys["requests"], field)))
        raw = kept or young
        return None if raw is None else _request(json.loads(raw))

    def request_run(self, entry: str, request_id: str, window: SlotWindow, *, by: str,
                    retention_ms: int = int(DEFAULT_REQUEST_RETENTION_S * 1000)) -> RunRequest:
        """:meth:`Entries.request_run` in one script (:data:`REQUEST_RUN`), confirmed as a
        durable claim is."""
        prefix = _request_field(entry, "")
        id_ms = request_id_ms(request_id)
        reply = self._write(
            f"run-now {entry!r}", "request_run",
            ("store", "requests", "requests:age", "requests:slots", "requests:ids",
             "requests:ids:age", "requests:pruned", "entries:version", "entries:epoch"),
            _request_field(entry, request_id), entry, request_id, by, self.horizon_ms,
            int(retention_ms), "" if id_ms is None else id_ms, window.start_ms, window.end_ms,
            " ".join(str(s) for s in sorted(window.scheduled)), prefix, EXTRA_SLOT_SEARCH_MS,
            LATENESS_TOLERANCE_MS, new_epoch_id())
        outcome = reply["o"]
        if outcome in ("found", "new"):
            return _request(json.loads(reply["r"]), created=outcome == "new")
        if outcome == "window":
            raise SlotWindowPassed(f"{self.where}: run-now of {entry!r}: the store's clock "
                                   f"{reply['now']} is outside the window {window.start_ms}.."
                                   f"{window.end_ms}")
        if outcome == "full":
            raise no_free_slot(entry)
        raise request_refusal(entry, request_id, outcome, id_ms=int(id_ms), clock=_clock(reply),
                              retention_ms=int(retention_ms))


def _stored(name: str, rec: dict, pause: dict | None) -> StoredEntry:
    """A StoredEntry from the scripts' record ``{d?, v, t, b}`` and pause ``{r, b, t}``."""
    return StoredEntry(name=name, definition=rec.get("d"),
                       pause=Pause(reason=pause["r"], by=pause["b"], at_ms=int(pause["t"]))
                       if pause else None,
                       version=int(rec["v"]), updated_ms=int(rec["t"]), updated_by=rec["b"])


def _read_record(name: str, raw: str, pause_raw: str | None) -> StoredEntry:
    """The StoredEntry of a record as :meth:`RedisEntries.load_entries` reads it, whatever a hand
    edit or another version wrote there: a record that is not a JSON object keeps its text as
    the definition (refused by name where it is used: a problem row, an entry beat leaves out),
    a definition that is not text its JSON, a version, time or author missing or of the wrong
    type reads as 0 or ``""``; a pause record that cannot be read is a pause (its claims are
    refused too) whose reason says so."""
    rec = _json_object(raw)
    definition = raw if rec is None else rec.get("d")
    if definition is not None and not isinstance(definition, str):
        definition = json.dumps(definition)
    rec = rec or {}
    pause = None
    if pause_raw is not None:
        fields = _json_object(pause_raw)
        if fields is None or not all(isinstance(fields.get(k), str) for k in "rbt"):
            pause = Pause(reason=f"the store's pause record is not readable: {pause_raw[:80]!r}",
                          by="", at_ms=0)
        else:
            pause = Pause(reason=fields["r"], by=fields["b"], at_ms=_whole(fields["t"]))
    return StoredEntry(name=name, definition=definition, pause=pause,
                       version=_whole(rec.get("v")), updated_ms=_whole(rec.get("t")),
                       updated_by=rec.get("b") if isinstance(rec.get("b"), str) else "")


def _json_object(text: str) -> dict | None:
    """The JSON object ``text`` holds, or None (not JSON, not an object, or nested deeper than
    :data:`~celery_anarchon.limits.MAX_DEPTH`: json.loads would recurse past Python's limit)."""
    if limits.text_too_deep(text):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _whole(value: Any) -> int:
    """A record's number (a decimal string, as the scripts write it), or 0 when it is not one."""
    digits = value[1:] if isinstance(value, str) and value.startswith("-") else value
    if isinstance(digits, str) and digits.isascii() and digits.isdecimal() and len(digits) < 20:
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _clock(reply: dict) -> RequestClock:
    """A RequestClock from a script's reply ``{now, born, pruned}``."""
    return RequestClock(int(reply["now"]), int(reply["born"]), int(reply["pruned"]))


def _request_field(entry: str, request_id: str) -> str:
    """The field of a request in the request hashes: ``"<entry> <request id>"``, both
    percent-escaped (``""`` as the id: the prefix of the entry's fields)."""
    return quote(entry, safe="") + " " + quote(request_id, safe="")


def _request(rec: dict, created: bool = False) -> RunRequest:
    """A RunRequest from the script's record ``{e, i, s, b, t}``."""
    return RunRequest(entry=rec["e"], request_id=rec["i"], slot_ms=int(rec["s"]), by=rec["b"],
                      requested_ms=int(rec["t"]), created=created)
