"""The Redis store: what every strategy shares (options, keys, start-up checks, the parts). The
strategies are its subclasses: ``lease`` (:mod:`.lease`) and ``stream-id``, ``script``, ``idmp``
(:mod:`.strategies`); ``open_store`` builds the one the ``strategy`` option names, through the
factory of :mod:`celery_anarchon.stores.redis` (no subclass registers itself here).

:class:`RedisStore` joins its parts, each given what it needs: the connection
(:mod:`.connection`: the client, the scripts, the round trips and their confirmation), history and
definitions (:mod:`.history`), the entry store (:mod:`.entries`) and the instance records
(:mod:`.instances`). The server's facts and the durability rules are in :mod:`.server`.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Sequence
from typing import ClassVar

import redis

from celery_anarchon import _util
from celery_anarchon.errors import ConfigError, StoreUnavailable
from celery_anarchon.stores.base import (
    DEFAULT_CLAIM_TIMEOUT_S, DEFAULT_HISTORY_SIZE, LATENESS_TOLERANCE_MS, ClaimRequest, ClaimResult,
    ClaimStore, HistoryRecord, Outcome, RunEvent,
)
from celery_anarchon.stores.redis import server
from celery_anarchon.stores.redis.connection import RedisConnection
from celery_anarchon.stores.redis.entries import RedisEntries, namespace_keys
from celery_anarchon.stores.redis.entry_scripts import SCRIPTS as ENTRY_SCRIPTS
from celery_anarchon.stores.redis.history import RedisHistory, _items
from celery_anarchon.stores.redis.instances import SCRIPTS as INSTANCE_SCRIPTS, RedisInstances
from celery_anarchon.stores.redis.options import (
    DEFAULT_KEY_PREFIX, _allow_eviction, _durability, _key_prefix, _strategy,
    check_options, entry_key_prefix, sentinel_setup,
)
from celery_anarchon.stores.redis.scripts import ENTRY_KEYS


class RedisStore(ClaimStore):
    """Redis: claims and history in Lua scripts on the server clock, and (every strategy) store
    entries, pauses, run-now requests (:mod:`.entries`; the pause is checked inside each claim
    script) and instance records (:mod:`.instances`); the ``lease`` strategy
    (:class:`~celery_anarchon.stores.redis.lease.RedisLeaseStore`) has a ``leases`` part too.

    Each strategy is a subclass; ``open_store`` builds the one the ``strategy`` option names
    (:func:`celery_anarchon.stores.redis.open_redis_store`).

    :param memory: seconds a claimed run is remembered (default 3600), shared by every instance
        and never derived from one instance's max_late (docs/design.md store memory table).
    :param history_size: runs of history kept per entry (default 100).
    :param claim_timeout: seconds one round trip may take (socket and connect timeouts).
    :param key_prefix: first part of every key (default ``"anarchon"``).
    :param master_name: Sentinel URLs only: the monitored master's name.
    :param sentinel_kwargs: Sentinel URLs only: connection arguments for the Sentinels themselves.
    :param durability: what a won claim is confirmed on before it is answered WON (one WAIT and/or
        WAITAOF per batch, pipelined with the claim script): ``"auto"`` (default: every replica
        the master has connected and acknowledging, read per batch, and the AOF fsync when the
        server uses AOF and has WAITAOF, Redis >= 7.2), ``"none"``, ``"replica"`` (at least
        ``min_replicas``), ``"aof"`` (the master's AOF fsync), ``"replica+aof"``. A won claim not
        confirmed within ``confirm_timeout`` is answered UNCONFIRMED: not sent, a possible miss.
    :param min_replicas: durability ``replica`` / ``replica+aof``: replicas that must acknowledge
        (default 1).
    :param confirm_timeout: seconds each confirmation may wait (default 2, or half of
        ``claim_timeout`` if that is lower); must be below ``claim_timeout``.
    :param replica_grace: durability ``auto`` only, seconds (default 60, Redis's own
        ``repl-timeout`` default): a master with no live replica whose replicas confirmed claims
        (store-wide note, server clock) within this long still needs one replica, so its claims
        answer UNCONFIRMED (an old master cut off by a failover, still taking writes, must not
        confirm alone); after it, the master goes on alone (a replica that is down pauses the
        schedule for at most this long). For a strict demand use ``durability="replica"``; against
        a longer partition set ``min-replicas-to-write`` on the server.
    :param allow_eviction: accept a ``maxmemory-policy`` that may evict the store's keys
        (``allkeys-*``), giving up the guarantee (default False: ConfigError at prepare).
    :raises ConfigError: an option with a bad value, or one of another strategy.
    """

    kind = "redis"
    #: how messages name the store
    title: ClassVar[str] = "Redis store"
    #: the value of the ``strategy`` option this class implements
    strategy: ClassVar[str] = ""
    #: Lua constants of the keys the claim script needs after ENTRY_KEYS in each block
    EXTRA_KEYS: dict[str, str] = {}

    def __init__(self, url: str, *, namespace: str, instance_id: str, **options) -> None:
        if _strategy(options.get("strategy", self.strategy)) != self.strategy:
            raise ConfigError(f"anarchon_store_options['strategy'] = {options['strategy']!r}: this "
                              f"is the {self.strategy!r} class; open the store with open_store")
        check_options(self.strategy, options)
        self._configure(options)
        history_size = _util.positive_int("history_size",
                                          options.get("history_size", DEFAULT_HISTORY_SIZE))
        claim_timeout = _util.seconds("claim_timeout",
                                      options.get("claim_timeout", DEFAULT_CLAIM_TIMEOUT_S))
        self.key_prefix = _key_prefix(options.get("key_prefix", DEFAULT_KEY_PREFIX))
        (self.durability, self.min_replicas, self.confirm_timeout,
         self.replica_grace) = _durability(options, claim_timeout)
        self.allow_eviction = _allow_eviction(options.get("allow_eviction", False))
        super().__init__(url, namespace=namespace, instance_id=instance_id,
                         history_size=history_size, claim_timeout=claim_timeout)
        self.namespace_keys = namespace_keys(self.key_prefix, self.namespace)
        #: the client, its scripts and their round trips (no I/O before the first operation)
        self.connection = self._connect(url, options)
        self._parts()

    # -- identity -----------------------------------------------------------------------------
    def _configure(self, options: dict) -> None:
        """Read the strategy's own options (validated; ConfigError naming option and value)."""
        raise NotImplementedError

    def memory_settings(self) -> tuple[str, int]:
        """(text, horizon ms): the settings that decide this store's memory, as recorded
        store-wide (spec point 5), and how long a claim made under them stays claimable (another
        instance may replace them once unused for longer than its own horizon + 20 s)."""
        raise NotImplementedError

    def _script_texts(self) -> dict[str, str]:
        """The Lua scripts this strategy runs, by name."""
        raise NotImplementedError

    @property
    def store_key(self) -> str:
        """The namespace's store-wide hash (epoch, memory start, memory settings)."""
        return self.namespace_keys["store"]

    def keys_of(self, entry: str) -> dict[str, str]:
        """Every key of ``entry``, by what it holds (all share one hash tag)."""
        start = entry_key_prefix(self.key_prefix, self.namespace, entry)
        return {what: f"{start}:{what}"
                for what in (*ENTRY_KEYS, *self.EXTRA_KEYS.values(), "definitions")}

    def _block(self, entry: str) -> list[str]:
        """The keys every shared script takes for ``entry`` (ENTRY_KEYS order)."""
        keys = self.keys_of(entry)
        return [keys[what] for what in ENTRY_KEYS]

    def _claim_block(self, entry: str) -> list[str]:
        """The keys the strategy's claim script takes: ENTRY_KEYS, then EXTRA_KEYS."""
        keys = self.keys_of(entry)
        return [keys[what] for what in (*ENTRY_KEYS, *self.EXTRA_KEYS.values())]

    # -- the parts ----------------------------------------------------------------------------
    #: the parts' classes (the Cluster store's run by hash slot)
    history_class: ClassVar[type[RedisHistory]] = RedisHistory
    entries_class: ClassVar[type[RedisEntries]] = RedisEntries

    def _connect(self, url: str, options: dict) -> RedisConnection:
        """The connection for ``url`` (checked without I/O; the Cluster store has its own).

        :raises ConfigError: the URL or the Sentinel options are wrong
            (:func:`.options.sentinel_setup`).
        """
        return RedisConnection(url, setup=sentinel_setup(url, options, self.safe_url),
                               **self._connection_options())

    def _connection_options(self) -> dict:
        """What the connection takes besides its URL and setup: this store's scripts, keys,
        ARGV header and options."""
        text, horizon = self.memory_settings()
        return dict(
            safe_url=self.safe_url, claim_timeout=self.claim_timeout,
            where=f"{self.title} {self.safe_url}, namespace {self.namespace!r}",
            scripts={**self._script_texts(), **ENTRY_SCRIPTS, **INSTANCE_SCRIPTS},
            head_keys=[self.namespace_keys["store"], self.namespace_keys["pauses"]],
            header=[self.instance_id, self._memory_ms, self.history_size, text, horizon],
            durability=self.durability, min_replicas=self.min_replicas,
            confirm_timeout=self.confirm_timeout, replica_grace=self.replica_grace,
            allow_eviction=self.allow_eviction)

    def _parts(self) -> None:
        """History, the entry store and the instance records, each given the connection."""
        self.history = self.history_class(
            self.connection, history_size=self.history_size, block=self._block,
            definitions_key=lambda entry: self.keys_of(entry)["definitions"])
        self.entries = self.entries_class(self.namespace_keys, self.connection, self._memory_ms)
        self.instances = RedisInstances(self.namespace_keys, self.connection)

    def _unconfirmed(self, results: list[ClaimResult], detail: str) -> list[ClaimResult]:
        """WON -> UNCONFIRMED (spec point 1), its history record 'unconfirmed' (best effort)."""
        if not detail:
            return results
        out = [dataclasses.replace(r, outcome=Outcome.UNCONFIRMED, detail=detail)
               if r.outcome is Outcome.WON else r for r in results]
        notes = [r for r in out if r.outcome is Outcome.UNCONFIRMED]
        with contextlib.suppress(StoreUnavailable):
            self.history.record_many([HistoryRecord(r.entry, r.slot_ms, RunEvent.UNCONFIRMED,
                                                  task_id=r.request.task_id, attempt=r.attempt,
                                                  detail=detail) for r in notes])
        return out

    def close(self) -> None:
        """Release connections; idempotent and safe in a signal handler (no lock taken). The
        next operation reconnects."""
        self.connection.close()

    # -- life cycle ---------------------------------------------------------------------------
    def prepare(self, entries: Iterable[str]) -> list[str]:
        """Ping, check the server's version, load the scripts, check the memory settings recorded
        store-wide, plan the claims' confirmation (``durability``), note the memory start of new
        entries ("Amnesia"), and warn about what the server may lose.

        :raises ConfigError: the server is older than the strategy needs (the message names its
            version and the strategies that work on it); the store records other memory settings
            still in use (spec point 5); ``maxmemory-policy`` may evict the store's keys (unless
            ``allow_eviction``); durability ``aof`` / ``replica+aof`` without WAITAOF or AOF.
        """
        entries = list(dict.fromkeys(entries))
        c = self.connection
        with c.unavailable("prepare"):
            client, scripts = c.client()
            client.ping()
            self._check_version(client)
            pipe = client.pipeline(transaction=False)
            for script in scripts.values():
                pipe.script_load(script.script)
            pipe.execute()
        online = self._judge_settings(c.call("settings", []))
        with c.unavailable("prepare"):
            facts = server.server_facts(client, online)
        c.confirm = c.plan_confirmation(facts)
        c.call("memory_start", [k for e in entries for k in self._block(e)], 0)
        warnings = self._prepare_strategy(entries)
        with c.unavailable("prepare"):
            return warnings + server.warnings(
                client, facts, c.confirm, safe_url=self.safe_url, durability=self.durability,
                allow_eviction=self.allow_eviction)

    def _check_version(self, client: redis.Redis) -> None:
        """:func:`.server.check_version` for this store's strategy."""
        server.check_version(client, self.strategy, self.safe_url)

    def _judge_settings(self, reply: dict) -> int:
        """:func:`judge_settings` for this store's memory settings."""
        ours, horizon = self.memory_settings()
        return judge_settings(reply, ours, horizon,
                              f"Redis store {self.safe_url}, namespace {self.namespace!r}")

    def _prepare_strategy(self, entries: list[str]) -> list[str]:
        """What the strategy sets up at start-up (after the memory start); its warnings."""
        return []

    def exists(self) -> bool:
        """Whether the namespace's store-wide hash (epoch, memory start) exists: one ``EXISTS``,
        no script (every script notes the memory start of a new store)."""
        with self.connection.unavailable("EXISTS"):
            return bool(self.connection.client()[0].exists(self.store_key))

    def now_ms(self) -> int:
        """The server's ``TIME``, UTC ms (the clock every claim and lease decision uses)."""
        with self.connection.unavailable("TIME"):
            seconds, micros = self.connection.client()[0].time()
        return int(seconds) * 1000 + int(micros) // 1000

def judge_settings(reply: dict, ours: str, horizon: int, where: str) -> int:
    """The replicas online now, as the claim scripts count them, from the settings script's
    ``reply``; ConfigError when the store records other memory settings than ``ours`` (text,
    with their ``horizon``, ms) that are still in use (spec point 5: a rolling change of
    ``memory`` must not shorten what the store remembers). ``where`` names the store.
    """
    theirs, used = reply["settings"], int(reply["used"] or 0)
    unused_ms = int(reply["now"]) - used
    wait_ms = horizon + 2 * LATENESS_TOLERANCE_MS
    if not theirs or theirs == ours or unused_ms > wait_ms:
        # (theirs unused for long enough: this instance's first claim replaces them)
        return int(reply["online"])
    raise ConfigError(
        f"{where}: the store's memory settings are \"{theirs}\" (last used by a claim "
        f"{unused_ms / 1000:.0f} s ago), this "
        f"instance has \"{ours}\". Use the same value on every instance; to change it, stop "
        f"every instance using the old value and wait {wait_ms / 1000:g} s (the new memory + "
        "20 s) before starting one with the new value, or use another namespace "
        "(anarchon_namespace).")


#: outcome value -> Outcome (a dict lookup: ``Outcome(value)`` costs more, 10,000 times a burst)
_OUTCOMES = {outcome.value: outcome for outcome in Outcome}


def claim_results(requests: Sequence[ClaimRequest], reply: dict) -> list[ClaimResult]:
    """The ClaimResults of a claim script's reply ``{now, results: [{o, w, f, k, a, d}]}``, whose
    results come in the order of ``requests``."""
    now = int(reply["now"])
    return [ClaimResult(request=request, outcome=_OUTCOMES.get(r["o"]) or Outcome(r["o"]),
                        winner=r.get("w"),
                        winner_fingerprint=r.get("f", ""), store_ms=now,
                        token=int(r["k"]) if r.get("k") else None, attempt=int(r.get("a", 1)),
                        detail=r.get("d", ""))
            for request, r in zip(requests, _items(reply.get("results")))]
