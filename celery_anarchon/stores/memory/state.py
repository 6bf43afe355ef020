"""What a memory store holds: named *servers*, each a dict of namespaces under one lock.

A ``memory://<name>`` URL names a server (``memory://`` the one named ``""``). Every store opened
with that name in one process shares it, so several beat instances of a test race on one store.
A server lives as long as its process; another process has servers of its own (a forked child
starts with none: it never sees a copy of its parent's, whose lock another thread may hold).

The data mirrors the SQL stores' tables (:mod:`celery_anarchon.stores.sql.schema`), one field per
table: ``note`` is ``anarchon_stores``, ``fences`` ``anarchon_entries``, ``claims``
``anarchon_claims``, ``runs`` ``anarchon_runs``, and so on. Instants are UTC ms on the store's
clock.
"""
from __future__ import annotations

import dataclasses
import os
import secrets
import threading

from celery_anarchon.stores.base import HistoryRecord, RunState
from celery_anarchon.stores.entry_store import InstanceRecord, RunRequest, StoredEntry

#: the open states of a leased run: it is queued or started (the others are terminal)
OPEN_STATES = (RunState.QUEUED, RunState.STARTED)


@dataclasses.dataclass
class Note:
    """When a namespace's memory began, and what it was noted with (docs/design.md "Amnesia").

    :param born_ms: the store-wide memory start.
    :param epoch: the server's epoch it was noted under (:attr:`Server.epoch`).
    :param prev_epoch: the epoch before the newest change (``""``: none), named in refusals.
    :param memory_ms: the ``memory`` recorded by the first instance (every one must use it).
    :param memory_used_ms: the last claim made with the recorded ``memory``.
    """

    born_ms: int
    epoch: str
    prev_epoch: str
    memory_ms: int
    memory_used_ms: int


@dataclasses.dataclass
class Fence:
    """One entry's memory start and fencing: the row its claims and lease operations lock.

    :param born_ms: when the store's memory of the entry began.
    :param last_token: the last fencing token issued for the entry (0: none).
    :param newest_slot: the newest scheduled slot claimed with a lease (``None``: none).
    """

    born_ms: int
    last_token: int = 0
    newest_slot: int | None = None

    def issue_token(self, now_ms: int) -> int:
        """The next fencing token, ``max(last + 1, store clock in microseconds)``: tokens keep
        growing even after the store lost its data (docs/design.md "Words": fencing token)."""
        self.last_token = max(self.last_token + 1, now_ms * 1000)
        return self.last_token


@dataclasses.dataclass(frozen=True)
class Claim:
    """A won claim: who won, with which definition, kept until ``keep_until_ms``."""

    winner: str
    fingerprint: str
    claimed_ms: int
    keep_until_ms: int


@dataclasses.dataclass
class Run:
    """The record of one leased run (docs/design.md "Leases": State). It never expires on its own:
    a terminal run is kept until ``keep_until_ms`` (``None`` while it is open).

    :param prev_token: the token a takeover replaced, so that the taker's retry is recognised.
    :param requested: the run of a run-now request (never superseded, superseding nothing).
    """

    entry: str
    slot_ms: int
    state: RunState
    attempt: int
    token: int
    owner: str
    lease_expires_ms: int | None = None
    queue_deadline_ms: int | None = None
    keep_until_ms: int | None = None
    prev_token: int | None = None
    requested: bool = False

    def alive(self, now_ms: int) -> bool:
        """Open and not expired at ``now_ms``: an earlier run that makes a new slot overlap."""
        deadline = self.queue_deadline_ms if self.state is RunState.QUEUED else self.lease_expires_ms
        return self.state in OPEN_STATES and deadline is not None and deadline >= now_ms


@dataclasses.dataclass
class Space:
    """Everything a memory server holds for one namespace."""

    note: Note | None = None
    fences: dict[str, Fence] = dataclasses.field(default_factory=dict)
    claims: dict[tuple[str, int], Claim] = dataclasses.field(default_factory=dict)
    #: entry -> slot -> the leased run's record
    runs: dict[str, dict[int, Run]] = dataclasses.field(default_factory=dict)
    #: entry -> slot -> the run's record (one per run)
    history: dict[str, dict[int, HistoryRecord]] = dataclasses.field(default_factory=dict)
    definitions: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    # the entry store: entries, pauses, run-now requests, the entries epoch, instances
    stored: dict[str, StoredEntry] = dataclasses.field(default_factory=dict)
    version: int = 0
    entries_epoch: str = ""
    entries_server_epoch: str = ""     #: the server's epoch the entries epoch was written under
    accepted_ms: int = 0
    accepted_by: str = ""
    requests: dict[tuple[str, str], RunRequest] = dataclasses.field(default_factory=dict)
    pruned_ms: int = 0                 #: the newest "now - retention" of a prune of request ids
    instances: dict[str, InstanceRecord] = dataclasses.field(default_factory=dict)
    #: digest -> (mapping, last used ms)
    fingerprints: dict[str, tuple[dict[str, str], int]] = dataclasses.field(default_factory=dict)
    next_prune_ms: int = 0


class Server:
    """One named memory server: its namespaces, the lock every operation holds from its first
    read to its last write (what makes each operation atomic), and its epoch (its identity: a
    server whose data came back from an older copy has another, docs/design.md "Amnesia")."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.RLock()
        self.epoch = "memory " + secrets.token_hex(6)
        self.spaces: dict[str, Space] = {}

    def space(self, namespace: str) -> Space:
        """The namespace's data, created empty on first use."""
        return self.spaces.setdefault(namespace, Space())


_SERVERS: dict[tuple[int, str], Server] = {}
_SERVERS_LOCK = threading.Lock()


def _after_fork() -> None:
    global _SERVERS_LOCK
    _SERVERS_LOCK = threading.Lock()    # another thread of the parent may have held it


os.register_at_fork(after_in_child=_after_fork)


def server_named(name: str) -> Server:
    """The server of ``name`` in this process, created on first use."""
    key = (os.getpid(), name)
    with _SERVERS_LOCK:
        server = _SERVERS.get(key)
        if server is None:
            server = _SERVERS[key] = Server(name)
        return server
