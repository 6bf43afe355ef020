"""The instance and entry parts of a store: what the instances of one namespace share besides
claims.

A store's :class:`Instances` part (``store.instances``) keeps, per namespace, the **instance
records**: each live beat's heartbeat (id, host, pid, version, started, last tick, how many entries it runs,
its skew to the store's clock, the digest of the fingerprints of the config entries it runs),
expiring on the store's clock, and the fingerprint mappings those digests name. Every store of
the registry has one (Redis, PostgreSQL, SQLite, NATS JetStream, RabbitMQ, memory); the engine
and the status command check that it is there, so a store without one still runs.

A store's :class:`Entries` part (``store.entries``, ``None`` for a store that cannot hold them)
keeps, per namespace:

* **store entries**: definitions written at run time (``celery_anarchon.schedules(app).add``),
  as canonical JSON text (data, never code: nothing is pickled or evaluated);
* **pauses**, of any entry, config (``beat_schedule``) or store: a pause is checked inside the
  atomic claim, so it holds at once on every instance, synced or not;
* **run-now requests**: one extra run of an entry, with its own slot, one per request id. The
  store chooses the slot inside the atomic write that records the request (its clock's now,
  moved past the slots of the entry's other requests and its scheduled slots), and keeps every
  request id for a retention of its own (``anarchon_request_retention``), apart from the
  requests young enough to be claimed, which are all :meth:`Entries.load_entries` reads.
  Request ids that carry their creation time (UUIDv7) are refused when made before the store's
  memory of requests began: the rules are in :mod:`celery_anarchon.stores.run_now`.

Every change to entries, pauses or requests raises the namespace's **entries version**, so an
instance follows with one cheap read per ``anarchon_sync_interval`` (:meth:`entries_epoch`) and
loads everything only when it moved (:meth:`load_entries`).

**Amnesia** (docs/design.md "Amnesia"). A store can lose what it held: a Redis restarted without
persistence, dropped tables, a restored backup, a promoted replica that missed writes. So that an
instance can tell, the store keeps per namespace an **entries epoch**: an id written with the
first write of an entry, a pause or a run-now request (every write that raises the entries
version) into a namespace that holds none, and written anew when the server's own epoch changed
since (Redis ``run_id``, PostgreSQL system identifier and timeline,
SQLite file inode: a restart, a failover, a replaced file). An epoch that vanished or changed, or
a version lower than one seen before (an older copy), means the store may have lost writes. A
resume and a removal leave the name's record **cleared** (no definition, no pause; pruned after
:data:`CLEARED_KEEP_MS`) instead of deleting it, and :meth:`Entries.accept_loss` records when an
operator accepted a loss: with the records' store-clock times, an instance that keeps what it
knew from before a loss tells an operator's later word from the loss itself.

Units as in :mod:`celery_anarchon.stores.base`: UTC integer milliseconds; the store's clock for
``*_ms`` it writes. What a store can do are its parts: ``store.instances``, ``store.entries``
(``None`` when it has none); stores that cannot hold entries raise
:class:`~celery_anarchon.errors.ConfigError` through
:func:`~celery_anarchon.stores.base.entry_store`, naming :data:`ENTRY_STORE_NAMES`.
"""
from __future__ import annotations

import abc
import dataclasses
import re
import secrets
from collections.abc import Mapping

from celery_anarchon._util import iso, iso_ms
from celery_anarchon.stores.records import HistoryRecord, RunEvent

from celery_anarchon.stores.run_now import RequestClock, SlotWindow
from celery_anarchon.schedule.timing import DEFAULT_REQUEST_RETENTION_S

#: The stores that hold entries, pauses and run-now requests, in the words of error messages.
ENTRY_STORE_NAMES = "Redis (any strategy), PostgreSQL or SQLite"

#: How long a cleared record (a resume or a removal) is kept, ms: 7 days. An instance that keeps
#: what it knew from before a loss sees the resume or removal written since as long as the record
#: is kept; an older copy of the store restored later than that may bring back a store entry
#: removed in between (docs/design.md "Amnesia").
CLEARED_KEEP_MS = 7 * 86_400_000


@dataclasses.dataclass(frozen=True)
class Pause:
    """A pause of one entry: every claim of its runs answers ``paused`` until it is resumed.

    :param reason: why, as the operator wrote it (may be ``""``).
    :param by: who paused it (a user name, ``host:pid``, or what the caller passed).
    :param at_ms: when, on the store's clock, UTC ms.
    """

    reason: str
    by: str
    at_ms: int

    def describe(self) -> str:
        """``paused by <by>: <reason>``, the detail recorded with a paused run."""
        return f"paused by {self.by}" + (f": {self.reason}" if self.reason else "")


#: the end of the detail :func:`pause_span_detail` writes
_PAUSE_SPAN = re.compile(r" \(paused from (\S+) to (\S+)\)\Z")


def pause_span_detail(pause: Pause, until_ms: int) -> str:
    """The detail of the ``paused`` record a resume writes (docs/missed-runs.md): who paused
    and why, and the span the pause held, from its ``at_ms`` to ``until_ms`` (the resume,
    store clock, UTC ms). A gap check reads the span back (:func:`pause_span_of`): the slots
    in it were paused, not missed, though no beat ran to answer them."""
    return f"{pause.describe()} (paused from {iso(pause.at_ms)} to {iso(until_ms)})"


def pause_span_of(record: HistoryRecord) -> tuple[int, int] | None:
    """``(since_ms, until_ms)`` of a ``paused`` record :func:`pause_span_detail` wrote (UTC ms),
    else ``None``."""
    if record.event is not RunEvent.PAUSED:
        return None
    found = _PAUSE_SPAN.search(record.detail)
    if found is None:
        return None
    since, until = iso_ms(found.group(1)), iso_ms(found.group(2))
    return None if since is None or until is None else (since, until)


@dataclasses.dataclass(frozen=True)
class StoredEntry:
    """What the store keeps under one entry name.

    :param name: the entry's name.
    :param definition: canonical JSON of a store entry (:mod:`celery_anarchon.schedule.definition`), or
        ``None`` when the store only holds a pause for a config entry of that name.
    :param pause: the entry's pause, ``None`` when it runs.
    :param version: grows with every change of this name (definition or pause).
    :param updated_ms: the store's clock at the last change, UTC ms.
    :param updated_by: who made the last change.
    """

    name: str
    definition: str | None
    pause: Pause | None
    version: int
    updated_ms: int
    updated_by: str

    @property
    def cleared(self) -> bool:
        """The record holds neither a definition nor a pause: the name was resumed or removed
        (``updated_by`` at ``updated_ms``). Kept :data:`CLEARED_KEEP_MS`, so that an instance that
        keeps what it knew from before a loss sees the operator's word (module docstring)."""
        return self.definition is None and self.pause is None


@dataclasses.dataclass(frozen=True)
class EntriesEpoch:
    """The identity of a namespace's entries data and its version, as
    :meth:`Entries.entries_epoch` reads them (one cheap read).

    :param epoch: the entries epoch (module docstring); ``""`` when the store holds none (nothing
        written yet, or everything lost).
    :param version: the entries version (``0`` before any change).
    """

    epoch: str
    version: int


@dataclasses.dataclass(frozen=True)
class RunRequest:
    """One extra run of an entry (``run_now``), claimed like any run, with its own slot.

    :param entry: the entry's name.
    :param request_id: the caller's id: the same id twice is one request (one run).
    :param slot_ms: the run's slot, UTC ms (the store's clock at the request, moved past the
        entry's scheduled slots and its other requests' slots: no two requests share one).
    :param by: who asked.
    :param requested_ms: when, on the store's clock, UTC ms.
    :param created: ``True`` when the call that returned it recorded it; ``False`` when it found
        the request made before with that id (no new run), and in what ``load_entries`` reads.
    """

    entry: str
    request_id: str
    slot_ms: int
    by: str
    requested_ms: int
    created: bool = False


@dataclasses.dataclass(frozen=True)
class EntrySnapshot:
    """Everything :meth:`Entries.load_entries` read, at one entries version.

    :param version: the entries version.
    :param entries: every record by name: store entries, pauses, and cleared records
        (:attr:`StoredEntry.cleared`).
    :param requests: the run-now requests younger than the store's memory.
    :param epoch: the entries epoch (:class:`EntriesEpoch`), ``""`` when the store holds none.
    :param accepted_ms: when an operator last accepted a loss (:meth:`Entries.accept_loss`),
        the store's clock, UTC ms; ``0``: never.
    :param accepted_by: who accepted it (``""``: nobody).
    """

    version: int
    entries: Mapping[str, StoredEntry]
    requests: tuple[RunRequest, ...]
    epoch: str = ""
    accepted_ms: int = 0
    accepted_by: str = ""


@dataclasses.dataclass(frozen=True)
class InstanceRecord:
    """One live beat instance, as its heartbeat recorded it.

    :param instance_id: the instance's id (the one recorded with its claims).
    :param host: its host name.
    :param pid: its process id.
    :param version: the celery_anarchon version it runs.
    :param started_ms: when it started, UTC ms (its own clock).
    :param last_tick_ms: its last tick, UTC ms (its own clock).
    :param skew_ms: its clock minus the store's, ms (``None`` when unknown).
    :param entries: how many entries it runs (config and store).
    :param fingerprints_digest: digest of the fingerprints of the config entries it runs; the
        mapping itself is read with :meth:`Instances.load_fingerprints`.
    :param seen_ms: the store's clock when the heartbeat was written, UTC ms (read back only).
    :param expires_ms: when the record expires on the store's clock, UTC ms (read back only).
    :param kept: what the instance keeps from before its store lost entries data (JSON values:
        ``since`` (UTC ms, its clock), ``why``, ``pauses`` {name: pause's detail}, ``entries``
        [names], ``withheld`` [names], each list cut at a hundred names, and their counts
        ``counts`` {pauses, entries, withheld}); ``None`` when it keeps nothing
        (docs/design.md "Amnesia").
    :param refused: the entries it leaves out because our rules refuse them while the others
        run (a django-celery-beat row, read at run time): {name: the error, naming the entry,
        where it comes from and the fix}, at most :data:`MAX_REFUSED` of them; ``None`` when
        it leaves none out.
    """

    instance_id: str
    host: str
    pid: int
    version: str
    started_ms: int
    last_tick_ms: int
    skew_ms: int | None
    entries: int
    fingerprints_digest: str
    seen_ms: int = 0
    expires_ms: int = 0
    kept: dict | None = None
    refused: dict | None = None


#: the most refused entries an instance record names (``InstanceRecord.refused``), and the most
#: characters of each one's error
MAX_REFUSED, MAX_REFUSED_TEXT = 100, 1000


def refused_of(value) -> dict[str, str] | None:
    """``InstanceRecord.refused`` as read back from a record: a mapping of text to text cut to
    :data:`MAX_REFUSED` names and :data:`MAX_REFUSED_TEXT` characters, else ``None`` (a record
    of an older version has none; anything else is not trusted)."""
    if not isinstance(value, dict) or not value:
        return None
    out = {}
    for name, error in sorted(value.items())[:MAX_REFUSED]:
        if isinstance(name, str) and isinstance(error, str):
            out[name] = error[:MAX_REFUSED_TEXT]
    return out or None


class Instances(abc.ABC):
    """The instance record operations of one namespace: a store's ``instances`` part (module
    docstring), which a backend builds and its callers use (``store.instances.instances()``).

    Every operation raises :class:`~celery_anarchon.errors.StoreUnavailable` as the claim store's
    do.
    """

    @abc.abstractmethod
    def record_instance(self, record: InstanceRecord, ttl_ms: int) -> None:
        """Write this instance's heartbeat; it expires ``ttl_ms`` later on the store's clock."""

    @abc.abstractmethod
    def instances(self) -> list[InstanceRecord]:
        """The live instances of the namespace (heartbeat not expired on the store's clock),
        with ``seen_ms`` and ``expires_ms`` filled in."""

    @abc.abstractmethod
    def remove_instance(self, instance_id: str) -> None:
        """Drop an instance's heartbeat (it is shutting down)."""

    @abc.abstractmethod
    def save_fingerprints(self, digest: str, fingerprints: Mapping[str, str]) -> None:
        """Keep the mapping config entry name -> fingerprint under its ``digest`` (written once per
        distinct digest; kept at least as long as an instance record names it)."""

    @abc.abstractmethod
    def load_fingerprints(self, digest: str) -> dict[str, str] | None:
        """The mapping saved under ``digest``, or ``None`` if unknown."""


class Entries(abc.ABC):
    """The entry operations of one namespace: a store's ``entries`` part (module docstring),
    which a backend builds and its callers use (``store.entries.put_entry(...)``). One object
    may be both a store's :class:`Entries` and its :class:`Instances` part (the memory store's).

    With this part, the store's claim (:meth:`~celery_anarchon.stores.base.ClaimStore.claim`)
    of a run whose entry is paused answers ``Outcome.PAUSED`` (after the "already claimed"
    check, before every other), atomically with the pause: a pause written before the claim
    always holds. A paused run is recorded once in the history as ``RunEvent.PAUSED`` with
    :meth:`Pause.describe` as its detail.

    Every operation raises :class:`~celery_anarchon.errors.StoreUnavailable` as the claim store's
    do.
    """

    @abc.abstractmethod
    def entries_version(self) -> int:
        """The namespace's entries version: one cheap read (``0`` before any change). It grows
        with every change of an entry, a pause or a run-now request."""

    @abc.abstractmethod
    def entries_epoch(self) -> EntriesEpoch:
        """The namespace's entries epoch and version, in one cheap read (what an instance
        compares at every sync: module docstring)."""

    @abc.abstractmethod
    def load_entries(self) -> EntrySnapshot:
        """Every stored entry, pause and cleared record of the namespace, and the run-now
        requests younger than the store's memory (not every request id the store keeps: those are
        kept longer, for :meth:`request_run`), with the version, epoch and last accepted loss they
        were read at (one consistent read)."""

    @abc.abstractmethod
    def accept_loss(self, *, by: str) -> int:
        """Record that an operator accepts what the store lost: every instance that keeps a
        pause or a store entry from before a loss drops it (each record it kept is older than
        this) and follows the store as it is. Raises the entries version.

        :returns: when, the store's clock, UTC ms.
        """

    @abc.abstractmethod
    def put_entry(self, name: str, definition: str, *, by: str, create: bool) -> StoredEntry:
        """Write a store entry's definition (canonical JSON, checked by the caller).

        :param create: ``True``: add (the name must be new); ``False``: update (it must exist).
        :raises EntryExists: ``create`` and the name holds a definition already.
        :raises UnknownEntry: not ``create`` and the name holds no definition.
        """

    @abc.abstractmethod
    def remove_entry(self, name: str, *, by: str) -> bool:
        """Remove a store entry's definition and its pause, leaving the name's record cleared
        (:attr:`StoredEntry.cleared`). ``False`` (nothing written) when there was no definition."""

    @abc.abstractmethod
    def set_pause(self, name: str, pause: Pause | None, *, by: str) -> StoredEntry:
        """Pause (``pause`` set) or resume (``None``) the entry ``name``, config or store entry.
        The pause's ``at_ms`` is replaced by the store's clock. A resume always writes the
        name's record (cleared when it holds no definition), even when it held nothing."""

    @abc.abstractmethod
    def request_clock(self) -> RequestClock:
        """The store's clock and the start of its memory of run-now requests, once that start is
        noted (a new or wiped store, or a new epoch, begins it now): a new request id is made
        from it (:meth:`~.run_now.RequestClock.new_id`)."""

    @abc.abstractmethod
    def find_request(self, entry: str, request_id: str) -> RunRequest | None:
        """The run-now request of ``entry`` with ``request_id``, as step 1 of :meth:`request_run`
        finds it (``created`` False), or ``None``; one read, nothing written. A repeated request
        is answered with it before any other check of the entry (paused, removed since)."""

    @abc.abstractmethod
    def request_run(self, entry: str, request_id: str, window: SlotWindow, *, by: str,
                    retention_ms: int = int(DEFAULT_REQUEST_RETENTION_S * 1000)) -> RunRequest:
        """Record a run-now request of ``entry`` unless the store holds one with ``request_id``,
        in one atomic write that, in this order:

        1. finds the request of that id (kept for ``retention_ms`` after it was made; in the
           requests younger than the memory too): it is returned, ``created`` False;
        2. refuses an id that carries its time (:func:`~.run_now.request_id_ms`) by
           :meth:`~.run_now.RequestClock.refusal`: made more than ``retention_ms`` ago, before the store's
           memory start + the lateness tolerance (a new store, a wiped one, a new epoch), before
           the newest prune of request ids (which notes now - its retention), or more than the
           tolerance ahead, on the store's clock;
        3. prunes the requests made more than ``retention_ms`` + the tolerance ago (an id is made
           at most the tolerance ahead of its request: every id pruned is older than the prune's
           now - retention);
        4. chooses the slot: the store's clock now, 1 ms later while it is one of
           ``window.scheduled`` or the slot of another request of the entry
           (:meth:`~.run_now.SlotWindow.choose`);
        5. records the request (the store's clock as ``requested_ms``), raises the entries
           version and writes the entries epoch when the namespace has none or the server's
           epoch changed since (as every write of an entry or a pause: module docstring);
           returns it with ``created`` True.

        :param window: the entry's scheduled slots around the store's clock.
        :param retention_ms: how long request ids are kept, ms (``anarchon_request_retention``).
        :raises RequestRefused: step 2 (:func:`~.run_now.request_refusal`); nothing written.
        :raises SlotWindowPassed: the store's clock is outside ``window``; nothing written.
        :raises ConfigError: no free millisecond (:func:`~.run_now.no_free_slot`); nothing
            written.
        """


def new_epoch_id() -> str:
    """A new entries epoch id (module docstring): 12 random hex digits."""
    return secrets.token_hex(6)

