"""The Redis store, strategy ``lease`` (docs/design.md store memory table: Redis ``lease``).

The ``strategy`` store option picks how Redis claims: ``lease`` (this module), ``stream-id``,
``script`` or ``idmp`` (:mod:`celery_anarchon.stores.redis.strategies`). The factory of the URL
scheme table, :func:`celery_anarchon.stores.redis.open_redis_store`, builds the class of the
strategy asked for (:data:`celery_anarchon.stores.redis.STRATEGIES`).

Every claim decision is taken inside one Lua script per batch, on the server's ``TIME``
(docs/design.md "Clocks"); leases are compare-and-sets in one script per operation. The scripts live
in :mod:`celery_anarchon.stores.redis.lease_scripts` (on the prelude of :mod:`.scripts`); the
semantics are those of every leases part (:class:`~celery_anarchon.stores.parts.Leases`).

Key layout: every key of one entry shares one hash tag; the namespace has one store-wide hash::

    <key_prefix>:{<namespace>:<entry>}:<what>      (namespace and entry percent-escaped)
    <key_prefix>:{<namespace>}:store               (epoch, store-wide memory start, settings)
    <key_prefix>:{<namespace>}:<what>              (entries, pauses, requests, instances: .entries)

where ``<what>`` is one of :data:`~celery_anarchon.stores.redis.scripts.ENTRY_KEYS` or
``definitions``. Escaping with ``urllib.parse.quote(name, safe="")`` is injective and leaves no
``:``, ``{`` or ``}`` in a name, so two entries (or namespaces) can neither share nor reach into
each other's keys. No key carries a TTL: claims are pruned by age inside the claim script. A batch
claim touches the keys of several entries and the store-wide hash in one script, so the store
needs one Redis (or a Sentinel-managed master), not a Redis Cluster.

Losing writes (spec "exactly once when the store loses writes"): every script compares the
server's ``run_id`` with the epoch recorded store-wide and restarts the memory when it changed
(restart, failover), so the slots around the change are refused (forgotten); with ``durability``
on, a won claim is confirmed on the replicas (``WAIT``) and/or the disk (``WAITAOF``) in the same
round trip before it is answered WON, else it is answered UNCONFIRMED (never sent).

URLs: ``redis://``, ``rediss://`` and ``unix://`` go to ``redis.Redis.from_url`` unchanged (query
parameters included); ``sentinel://h1:26379;sentinel://h2:26379/0`` (as Celery's broker accepts
it) with the ``master_name`` option uses ``redis.sentinel.Sentinel(...).master_for``.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import ClassVar

from celery_anarchon.stores.base import (
    DEFAULT_MEMORY_S, ClaimRequest, ClaimResult, LeasedRun, Memory, RunState, TakeoverOutcome,
)
from celery_anarchon.stores.parts import Leases
from celery_anarchon import _util
from celery_anarchon.stores.redis.lease_scripts import SCRIPTS
from celery_anarchon.stores.redis.history import _items
from celery_anarchon.stores.redis.connection import RedisConnection
from celery_anarchon.stores.redis.store import RedisStore, claim_results


class RedisLeases(Leases):
    """The ``leases`` part of a Redis store of strategy ``lease``: every decision in a Lua script
    (:mod:`.lease_scripts`) on the server's clock (docs/design.md "Leases").

    :param connection: the store's connection (its scripts, round trips and confirmation).
    :param block: ``block(entry)``: the keys every shared script takes for ``entry``.
    """

    def __init__(self, connection: RedisConnection, block: Callable[[str], list[str]]) -> None:
        self.connection = connection
        self._block = block

    def inspect(self, entry: str, slot_ms: int) -> LeasedRun | None:
        """The run's record with store_ms = the server's clock now, or None."""
        reply = self.connection.call("inspect", self._block(entry), int(slot_ms))
        return _run(entry, slot_ms, reply)

    def expired_runs(self, entries: Iterable[str]) -> list[LeasedRun]:
        """Started runs whose lease ended and queued runs past their deadline, judged on the
        server's clock in one script for all ``entries`` ("Takeover")."""
        entries = list(dict.fromkeys(entries))
        if not entries:
            return []
        reply = self.connection.call("expired_runs", [k for e in entries for k in self._block(e)])
        return [_run(entries[int(f["b"]) - 1], int(f["s"]), {"now": reply["now"], "run": f["r"]})
                for f in _items(reply.get("runs"))]

    def take_over(self, entry: str, slot_ms: int, expected_token: int, *,
                  queue_timeout_ms: int, max_attempts: int,
                  task_id: str = "") -> tuple[TakeoverOutcome, LeasedRun | None]:
        """One compare-and-set on ``expected_token`` ("Takeover"): REFUSED unless still expired;
        PAUSED when the entry is paused (the run ends); SUPERSEDED when a newer scheduled slot was
        claimed (never a run-now request's run); GIVEN_UP at ``max_attempts``; else TAKEN as the
        next attempt, queued with a new token and deadline = now + ``queue_timeout_ms`` (ms),
        recorded ``taken_over`` with ``task_id``.

        A retry by the instance whose takeover committed (its reply was lost) answers TAKEN again
        with the same record (spec point 8). With ``durability`` on, TAKEN is confirmed like a
        claim, in the same round trip; a takeover not confirmed in time answers REFUSED: attempt
        2 is not sent, the run stays queued under the new token and is taken over again once its
        deadline passes (or TAKEN by this instance's retry once confirmed)."""
        reply, unconfirmed = self.connection.claim_call(
            self._block(entry), [int(slot_ms), int(expected_token), int(queue_timeout_ms),
                                 int(max_attempts), task_id, entry], script="take_over")
        outcome = TakeoverOutcome(reply["outcome"])
        if outcome is TakeoverOutcome.TAKEN and unconfirmed:
            outcome = TakeoverOutcome.REFUSED
        return outcome, _run(entry, slot_ms, reply)

    def adopt(self, entry: str, slot_ms: int, owner: str, duration_ms: int) -> tuple[bool, LeasedRun | None]:
        """Worker side ("Adopt"): a queued run, or one started with an expired lease, becomes
        started with a new token, ``owner`` and lease expiry = now + ``duration_ms`` (ms); when
        the entry is paused it ends paused instead (not adopted)."""
        reply = self.connection.call("adopt", self._block(entry), int(slot_ms), owner, int(duration_ms),
                           entry)
        return reply["adopted"] == "1", _run(entry, slot_ms, reply)

    def renew(self, entry: str, slot_ms: int, token: int, owner: str, duration_ms: int) -> LeasedRun | None:
        """Heartbeat ("Heartbeat"): lease expiry = now + ``duration_ms`` (ms) if ``token`` is
        current; None when stale. A record the store forgot is re-created with this token."""
        reply = self.connection.call("renew", self._block(entry), int(slot_ms), int(token), owner,
                           int(duration_ms))
        return _run(entry, slot_ms, reply)

    def release(self, entry: str, slot_ms: int, token: int) -> bool:
        """The runner is done ("Finished"): state finished if ``token`` is current."""
        return self.connection.call("release", self._block(entry), int(slot_ms), int(token))["done"] == "1"

    def requeue(self, entry: str, slot_ms: int, token: int, *, delay_ms: int,
                queue_timeout_ms: int) -> bool:
        """A retry hands the run back ("Finished"): queued, deadline = now + ``delay_ms`` +
        ``queue_timeout_ms`` (ms), attempt and token unchanged, if ``token`` is current."""
        reply = self.connection.call("requeue", self._block(entry), int(slot_ms), int(token), int(delay_ms),
                           int(queue_timeout_ms))
        return reply["done"] == "1"


class RedisLeaseStore(RedisStore):
    """Redis, strategy ``lease``: claims, history and leases (its ``leases`` part,
    :class:`RedisLeases`) in Lua scripts on the server clock (the options are
    :class:`~celery_anarchon.stores.redis.store.RedisStore`'s)."""

    strategy = "lease"
    checks_lateness = True

    def _configure(self, options: dict) -> None:
        """Read the strategy's own options (validated; ConfigError naming option and value)."""
        self.memory_s = _util.seconds("memory", options.get("memory", DEFAULT_MEMORY_S))
        #: ms sent in every script's header (the lease strategy's memory)
        self._memory_ms = max(1, round(self.memory_s * 1000))

    def memory_settings(self) -> tuple[str, int]:
        """(text, horizon ms): the settings that decide this store's memory, as recorded
        store-wide (spec point 5), and how long a claim made under them stays claimable (another
        instance may replace them once unused for longer than its own horizon + 20 s)."""
        return f"strategy=lease memory={self.memory_s:g}s", self._memory_ms

    @property
    def memory(self) -> Memory:
        return Memory(duration_s=self.memory_s)

    def describe(self) -> str:
        return f"redis strategy={self.strategy} memory={self.memory_s:g}s"

    def _script_texts(self) -> dict[str, str]:
        """The Lua scripts this strategy runs, by name."""
        return SCRIPTS

    # -- claims -------------------------------------------------------------------------------
    def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimResult]:
        """Claim the batch in one EVALSHA (docs/design.md "One run, in time" step 3): already claimed,
        paused, forgotten, late, early, superseded, overlapping, then won, all on the server's clock; the
        batch's confirmation (``durability``) rides in the same round trip. A won claim not
        confirmed in time answers UNCONFIRMED; a retried claim answers WON only for attempt 1
        (a run taken over since is LOST, winner the current attempt's sender)."""
        if not requests:
            return []
        blocks: dict[str, int] = {}
        args = claim_args(requests, blocks)
        reply, unconfirmed = self.connection.claim_call([k for e in blocks for k in self._block(e)], args)
        return self._unconfirmed(claim_results(requests, reply), unconfirmed)

    # -- the parts ----------------------------------------------------------------------------
    #: the leases part's class (the Cluster store's scans by hash slot)
    leases_class: ClassVar[type[RedisLeases]] = RedisLeases

    def _parts(self) -> None:
        """The parts of every strategy, and the leases."""
        super()._parts()
        #: the records of leased runs
        self.leases = self.leases_class(self.connection, self._block)


def claim_args(requests: Sequence[ClaimRequest], blocks: dict[str, int]) -> list:
    """The ARGV items of the claim script for ``requests`` (:data:`.lease_scripts.CLAIM_ITEMS`
    each, in the order the script reads them); ``blocks`` maps each entry to its block number
    (filled here, in the order entries first appear)."""
    args: list = []
    for r in requests:
        lease = r.lease
        args += [blocks.setdefault(r.entry, len(blocks) + 1), int(r.slot_ms), int(r.max_late_ms),
                 r.task_id, r.fingerprint, "1" if lease else "0",
                 int(lease.queue_timeout_ms) if lease else 0,
                 "1" if lease and lease.overlap_allowed else "0", r.entry,
                 "1" if r.requested else "0"]
    return args


def _run(entry: str, slot_ms: int, reply: dict) -> LeasedRun | None:
    """The LeasedRun in a script's reply (``run``: fields as decimal strings), or None."""
    r = reply.get("run")
    if not r:
        return None
    return LeasedRun(entry=entry, slot_ms=int(slot_ms), state=RunState(r["s"]), attempt=int(r["a"]),
                     token=int(r["k"]), owner=r["o"],
                     lease_expires_ms=int(r["x"]) if r.get("x") else None,
                     queue_deadline_ms=int(r["q"]) if r.get("q") else None,
                     store_ms=int(reply["now"]))

