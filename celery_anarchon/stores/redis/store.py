"""The Redis store: what every strategy shares (connections, options, the scripts' header,
start-up checks, durability, the history and definitions of :mod:`.history` and the entry store
of :mod:`.entries`, composed in). The server's facts and the durability rules are in :mod:`.server`. The strategies are its
subclasses:
``lease`` (:mod:`.lease`) and ``stream-id``, ``script``, ``idmp`` (:mod:`.strategies`);
``RedisStore(url, strategy=...)`` builds the class of the strategy asked for, which registers
itself here when it is defined (no import of a strategy's module from here).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import ClassVar

import redis
import redis.sentinel
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from celery_anarchon import _util
from celery_anarchon.errors import ConfigError, StoreUnavailable
from celery_anarchon.stores._common import translated
from celery_anarchon.stores.base import (
    DEFAULT_CLAIM_TIMEOUT_S, DEFAULT_HISTORY_SIZE, LATENESS_TOLERANCE_MS, ClaimRequest, ClaimResult,
    HistoryRecord, Outcome, RunEvent,
)
from celery_anarchon.stores.entry_store import (
    EntryStore,
)
from celery_anarchon.stores.redis import server
from celery_anarchon.stores.redis.history import RedisHistory, _items
from celery_anarchon.stores.redis.entries import (
    SCRIPTS as ENTRY_SCRIPTS, RedisEntries, namespace_keys,
)
from celery_anarchon.stores.redis.options import (
    DEFAULT_KEY_PREFIX, _allow_eviction, _durability, _key_prefix, _strategy,
    check_options, entry_key_prefix, sentinel_setup,
)
from celery_anarchon.stores.redis.scripts import ENTRY_KEYS


class RedisStore(RedisHistory, EntryStore):
    """Redis: claims and history in Lua scripts on the server clock, and (every strategy) store
    entries, pauses, run-now requests and instance records (:mod:`.entries`; the pause is checked
    inside each claim script); the ``lease`` strategy
    (:class:`~celery_anarchon.stores.redis.lease.RedisLeaseStore`) holds leases too.

    ``RedisStore(url, strategy=...)`` returns an instance of the strategy's class (a subclass).

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
    #: the value of the ``strategy`` option this class implements
    strategy: ClassVar[str] = ""
    #: Lua constants of the keys the claim script needs after ENTRY_KEYS in each block
    EXTRA_KEYS: dict[str, str] = {}
    #: strategy name -> class: each subclass with a ``strategy`` registers itself when defined
    STRATEGY_CLASSES: ClassVar[dict[str, type[RedisStore]]] = {}
    #: the driver errors that mean "unreachable or no answer" (kombu's ``connection_errors``)
    connection_errors = (redis.exceptions.RedisError, OSError)

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("strategy"):
            RedisStore.STRATEGY_CLASSES[cls.strategy] = cls

    def __new__(cls, url: str = "", **kwargs):
        if cls is RedisStore:
            cls = RedisStore.STRATEGY_CLASSES[_strategy(kwargs.get("strategy", "lease"))]
        return super().__new__(cls)

    def __init__(self, url: str, *, namespace: str, instance_id: str, **options) -> None:
        if _strategy(options.get("strategy", self.strategy)) != self.strategy:
            raise ConfigError(f"anarchon_store_options['strategy'] = {options['strategy']!r}: this "
                              f"is the {self.strategy!r} class; open the store with RedisStore")
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
        #: (replicas to wait for (None: count per batch), wait for the AOF): set by the first
        #: prepare() or claim from what the server runs (durability "auto") or the options
        self._confirm: tuple[int | None, bool] | None = None
        #: durability "auto": live replicas at the last batch (what the next WAIT asks for)
        self._replica_hint = 0
        #: Sentinel URLs: (sentinels, master kwargs, master name, sentinel kwargs), else None
        self._sentinel = self._connection_setup(url, options)
        self._conn: tuple[redis.Redis, dict] | None = None  # (client, its registered scripts)
        self._lock = threading.Lock()
        self.namespace_keys = namespace_keys(self.key_prefix, self.namespace)
        self._entries = RedisEntries(
            self.namespace_keys, self._redis, self._unavailable, self._memory_ms,
            f"Redis store {self.safe_url}, namespace {self.namespace!r}", write=self._entry_write)

    # -- identity -----------------------------------------------------------------------------
    def _configure(self, options: dict) -> None:
        """Read the strategy's own options (validated; ConfigError naming option and value)."""
        raise NotImplementedError

    def _connection_setup(self, url: str, options: dict):
        """What :meth:`_redis` connects with, checked without I/O: for a ``sentinel://`` URL
        (sentinels, master kwargs, ``master_name``, ``sentinel_kwargs``), else None
        (:func:`.options.sentinel_setup`; the Cluster store has its own).

        :raises ConfigError: the URL or the Sentinel options are wrong.
        """
        return sentinel_setup(url, options, self.safe_url)

    def memory_settings(self) -> tuple[str, int]:
        """(text, horizon ms): the settings that decide this store's memory, as recorded
        store-wide (spec point 5), and how long a claim made under them stays claimable (another
        instance may replace them once unused for longer than its own horizon + 20 s)."""
        raise NotImplementedError

    @property
    def store_key(self) -> str:
        """The namespace's store-wide hash (epoch, memory start, memory settings)."""
        return self.namespace_keys["store"]

    @property
    def _head_keys(self) -> list[str]:
        """The keys every claim-side script takes first: the store-wide hash, the pauses."""
        return [self.namespace_keys["store"], self.namespace_keys["pauses"]]

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

    def _script_texts(self) -> dict[str, str]:
        """The Lua scripts this strategy runs, by name."""
        raise NotImplementedError

    # -- connections --------------------------------------------------------------------------
    def _redis(self) -> tuple[redis.Redis, dict]:
        """The client and its scripts, created on first use (no I/O before). redis-py's pool
        notices a fork and opens new connections in the child (never the parent's sockets)."""
        conn = self._conn
        if conn is not None:
            return conn
        with self._lock:
            if self._conn is None:
                # surrogateescape: bytes that are not UTF-8 (a hand edit, another program) are
                # read as lone surrogates, which the checks of a definition and a name refuse by
                # name, instead of failing the whole read (entries.load_entries)
                kwargs = dict(socket_timeout=self.claim_timeout,
                              socket_connect_timeout=self.claim_timeout, decode_responses=True,
                              encoding_errors="surrogateescape",
                              retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), retries=1,
                                          supported_errors=(redis.exceptions.ConnectionError,)))
                if self._sentinel is None:
                    client = redis.Redis.from_url(self.url, **kwargs)
                else:
                    sentinels, master, master_name, sentinel_kwargs = self._sentinel
                    own = {k: v for k, v in kwargs.items() if k != "decode_responses"}
                    sentinel = redis.sentinel.Sentinel(
                        sentinels, sentinel_kwargs={**own, **sentinel_kwargs}, **kwargs)
                    client = sentinel.master_for(master_name, **master)
                scripts = {name: client.register_script(text)
                           for name, text in {**self._script_texts(), **ENTRY_SCRIPTS}.items()}
                self._conn = (client, scripts)
            return self._conn

    #: a reply only a node of a Redis Cluster gives means this store was pointed at one (the
    #: Cluster store, whose redirects are the slot map moving, sets it False)
    _cluster_reply_is_misuse = True

    def _unavailable(self, doing: str):
        """Turn every redis-py error into StoreUnavailable naming the masked URL and the cause
        (a reply only a Cluster node gives: with the fix, :func:`_plain_cause`)."""
        return translated("Redis", self.safe_url, doing, self.connection_errors,
                          cause=_plain_cause if self._cluster_reply_is_misuse else _cause)

    def _header(self, count_replicas: bool = False) -> list:
        """ARGV[1..6] of every script (redis_scripts: "ARGV header")."""
        text, horizon = self.memory_settings()
        grace = int(self.replica_grace * 1000) if count_replicas else 0
        return [self.instance_id, self._memory_ms, self.history_size, text, horizon,
                f"{grace} {1 if self.allow_eviction else 0}"]

    def _call(self, script: str, keys: list[str], *args) -> dict:
        """Run one registered script (KEYS: the namespace keys, then ``keys``; ARGV: the header,
        then ``args``); its JSON reply."""
        with self._unavailable(script):
            reply = self._redis()[1][script](keys=[*self._head_keys, *keys],
                                             args=[*self._header(), *args])
        return json.loads(reply)

    # -- durable claims (:mod:`.server`) ---------------------------------------------------------
    def _plan_confirmation(self, facts: dict) -> tuple[int | None, bool]:
        """:func:`.server.plan_confirmation` for this store's options; with durability "auto",
        the first batch's WAIT asks for the replicas live now."""
        if self.durability == "auto":
            self._replica_hint = facts["replicas"]
        return server.plan_confirmation(facts, durability=self.durability,
                                        min_replicas=self.min_replicas, safe_url=self.safe_url)

    def _confirmation(self) -> tuple[int | None, bool]:
        """The plan of :meth:`_plan_confirmation`, read from the server once (prepare() sets it;
        a store used without prepare() reads it at its first claim)."""
        if self._confirm is None:
            online = int(self._call("settings", [])["online"])
            with self._unavailable("reading the server's setup"):
                facts = server.server_facts(self._redis()[0], online)
            self._confirm = self._plan_confirmation(facts)
        return self._confirm

    def _claim_call(self, keys: list[str], args: list, script: str = "claim") -> tuple[dict, str]:
        """Run the claim script (or ``take_over``) on ``keys`` / ``args`` (the store key and the
        header are added) and, in the same round trip, the batch's one confirmation
        (:meth:`_confirmed`).

        :returns: the script's reply and why its wins are not confirmed ("" when they are).
        :raises StoreUnavailable: the outcome is unknown (a retry recognises this instance's win
            and confirms it again).
        """
        # a takeover that took nothing has nothing to confirm, and running it again would answer
        # REFUSED for the record it just changed
        replies, missing = self._confirmed(
            [(script, keys, args, True)], again=1,
            rerun=lambda r: script != "take_over" or r.get("outcome") == "taken")
        return replies[-1], server.unconfirmed_detail(missing, confirm_timeout=self.confirm_timeout)

    def _confirmed(self, calls: list[tuple[str, list, list, bool]], *, again: int,
                   rerun: Callable[[dict], bool] = lambda reply: True) -> tuple[list, str]:
        """Run ``calls`` and their one confirmation (WAIT and/or WAITAOF on the same connection:
        they cover the scripts' writes, and so every earlier write of the master) in one round
        trip: the rule of a durable claim, for claims, takeovers and entry-store writes.

        :param calls: (script name, keys, args, header: the namespace keys and the ARGV header
            go first) each; the last one's reply counts the replicas (``with_replicas``).
        :param again: how many of the last calls run again, with durability "auto", when more
            replicas are live than were waited for (a replica joined since the last batch, or one
            is required within replica_grace) and that many are connected: each must be safe to
            repeat and write, so that the new WAIT covers the first calls' writes whatever
            connection it is sent on. Replicas required but not connected are never waited for
            (a WAIT could only time out): the batch is unconfirmed at once.
        :param rerun: ``rerun(reply)``: whether the last call's reply needs that run again.
        :returns: the calls' replies (JSON decoded; the repeated ones from their run again) and
            what their confirmation lacked (:func:`.server.missing_confirmation`; "" when
            confirmed).
        :raises StoreUnavailable: the server did not answer (the outcome is unknown).
        """
        replicas, aof = self._confirmation()
        auto = replicas is None
        replies, acked, fsynced, asked = self._confirm_round(calls, replicas, aof,
                                                             len(calls) - again)
        reply = replies[-1]
        live = int(reply.get("replicas", 0)) if auto else replicas
        if auto:
            connected = int(reply.get("connected", live))
            # a replica that is not connected cannot acknowledge: waiting for it only stalls beat
            self._replica_hint = min(live, connected)
            if live > asked and connected >= live and rerun(reply):
                counted = {k: reply[k] for k in ("online", "seen", "held") if k in reply}
                repeated, acked, fsynced, asked = self._confirm_round(calls[-again:], live, aof)
                replies = replies[:len(calls) - again] + repeated
                # the run again does not count: keep why `live` are needed
                replies[-1].update(counted)
                reply = replies[-1]
        return replies, server.missing_confirmation(
            reply, acked=acked, live=live, aof=aof, fsynced=fsynced, auto=auto,
            replica_grace=self.replica_grace)

    def _confirm_round(self, calls, replicas, aof, once: int = 0) -> tuple[list, int, bool, int]:
        """One pipelined round trip: the scripts of ``calls`` (as :meth:`_confirmed` takes them),
        then WAIT / WAITAOF. After NOSCRIPT the scripts are loaded and the pipeline sent once
        more, without the first ``once`` calls that ran (an entry-store write is never run twice).
        Returns (the replies, JSON decoded; replicas acknowledged; AOF fsynced; replicas asked)."""
        client, scripts = self._redis()
        asked = self._replica_hint if replicas is None else replicas
        header = self._header(count_replicas=replicas is None)
        full = [(name, [*self._head_keys, *keys], [*header, *args], i < once) if head
                else (name, keys, args, i < once)
                for i, (name, keys, args, head) in enumerate(calls)]
        with self._unavailable(calls[0][0]):
            done = server.run_scripts(client, scripts, full, replicas=asked, aof=aof,
                                      timeout_s=self.confirm_timeout,
                                      aof_optional=self.durability == "auto")
        if done.aof_refused:
            # 'auto' waits for the AOF only where it is used; read the setup again next batch
            self._confirm = None
        return done.replies, done.acked, done.fsynced, asked

    def _entry_write(self, doing: str, script: str, keys: list[str], args: list):
        """Run an entry-store write (a script of :mod:`.entries`, its own keys and args) confirmed
        as a durable claim is (:meth:`_confirmed_write`); with durability "none", the script
        alone, as it always was.

        :param doing: the write, for the error (``"pause 'e3'"``).
        :returns: the script's reply, JSON decoded.
        :raises StoreError: the master applied the write but did not confirm it within
            ``confirm_timeout`` (the change may be lost if it fails over now; repeat it once the
            replicas are back).
        :raises StoreUnavailable: the server did not answer (the outcome is unknown).
        """
        if self.durability == "none":
            with self._unavailable(script.replace("_", " ")):
                return json.loads(self._redis()[1][script](keys=keys, args=list(args)))
        reply, missing = self._confirmed_write(script, list(keys), list(args))
        if missing:
            raise server.unconfirmed_write(self._entries.where, doing, missing,
                                           confirm_timeout=self.confirm_timeout)
        return reply

    def _confirmed_write(self, script: str, keys: list[str], args: list) -> tuple[object, str]:
        """``script`` then the ``confirm_write`` script (the replicas, by the claims' rule) and the
        confirmation, in one round trip (:meth:`_confirmed`; only ``confirm_write`` runs again).

        :returns: the script's reply (JSON decoded) and what the confirmation lacked ("" if
            nothing).
        """
        replies, missing = self._confirmed(
            [(script, keys, args, False), ("confirm_write", [], [], True)], again=1)
        return replies[0], missing

    def _unconfirmed(self, results: list[ClaimResult], detail: str) -> list[ClaimResult]:
        """WON -> UNCONFIRMED (spec point 1), its history record 'unconfirmed' (best effort)."""
        if not detail:
            return results
        out = [dataclasses.replace(r, outcome=Outcome.UNCONFIRMED, detail=detail)
               if r.outcome is Outcome.WON else r for r in results]
        notes = [r for r in out if r.outcome is Outcome.UNCONFIRMED]
        with contextlib.suppress(StoreUnavailable):
            self.record_many([HistoryRecord(r.entry, r.slot_ms, RunEvent.UNCONFIRMED,
                                          task_id=r.request.task_id, attempt=r.attempt,
                                          detail=detail) for r in notes])
        return out

    def close(self) -> None:
        """Release connections; idempotent and safe in a signal handler (no lock taken). The
        next operation reconnects."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn[0].close()

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
        with self._unavailable("prepare"):
            client, scripts = self._redis()
            client.ping()
            self._check_version(client)
            pipe = client.pipeline(transaction=False)
            for script in scripts.values():
                pipe.script_load(script.script)
            pipe.execute()
        online = self._check_settings()
        with self._unavailable("prepare"):
            facts = server.server_facts(client, online)
        self._confirm = self._plan_confirmation(facts)
        self._call("memory_start", [k for e in entries for k in self._block(e)], 0)
        warnings = self._prepare_strategy(entries)
        with self._unavailable("prepare"):
            return warnings + server.warnings(
                client, facts, self._confirm, safe_url=self.safe_url, durability=self.durability,
                allow_eviction=self.allow_eviction)

    def _check_version(self, client: redis.Redis) -> None:
        """:func:`.server.check_version` for this store's strategy."""
        server.check_version(client, self.strategy, self.safe_url)

    def _check_settings(self) -> int:
        """ConfigError when the store records other memory settings that are still in use (spec
        point 5: a rolling change of ``memory`` must not shorten what the store remembers);
        else the replicas online now, as the claim scripts count them."""
        return self._judge_settings(self._call("settings", []))

    def _judge_settings(self, reply: dict) -> int:
        """:meth:`_check_settings` on the settings script's ``reply``."""
        ours, horizon = self.memory_settings()
        theirs, used = reply["settings"], int(reply["used"] or 0)
        unused_ms = int(reply["now"]) - used
        wait_ms = horizon + 2 * LATENESS_TOLERANCE_MS
        if not theirs or theirs == ours or unused_ms > wait_ms:
            # (theirs unused for long enough: this instance's first claim replaces them)
            return int(reply["online"])
        raise ConfigError(
            f"Redis store {self.safe_url}, namespace {self.namespace!r}: the store's memory "
            f"settings are \"{theirs}\" (last used by a claim {unused_ms / 1000:.0f} s ago), this "
            f"instance has \"{ours}\". Use the same value on every instance; to change it, stop "
            f"every instance using the old value and wait {wait_ms / 1000:g} s (the new memory + "
            "20 s) before starting one with the new value, or use another namespace "
            "(anarchon_namespace).")

    def _prepare_strategy(self, entries: list[str]) -> list[str]:
        """What the strategy sets up at start-up (after the memory start); its warnings."""
        return []

    def now_ms(self) -> int:
        """The server's ``TIME``, UTC ms (the clock every claim and lease decision uses)."""
        with self._unavailable("TIME"):
            seconds, micros = self._redis()[0].time()
        return int(seconds) * 1000 + int(micros) // 1000
    # -- entries, pauses, requests, instances (EntryStore, in :mod:`.entries`) -------------------
    @property
    def entry_ops(self):
        """The entry operations (EntryStore), a part in :mod:`.entries`."""
        return self._entries

    @property
    def instance_ops(self):
        """The instance record operations (InstanceStore), in the same part."""
        return self._entries


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


#: replies only a node of a Redis Cluster gives (a slot served elsewhere, keys of two slots)
_CLUSTER_REPLIES = (redis.exceptions.MovedError, redis.exceptions.AskError,
                    redis.exceptions.ClusterCrossSlotError)


def _cause(exc: BaseException) -> str:
    cause = str(exc)
    if isinstance(exc, redis.sentinel.MasterNotFoundError):  # drop the clients' reprs
        cause = cause.split(" : ")[0] + " (no Sentinel answered with it)"
    return f" failed: {type(exc).__name__}: {cause}"


def _plain_cause(exc: BaseException) -> str:
    """:func:`_cause`, and for a reply only a Cluster node gives, why and the fix."""
    if not isinstance(exc, _CLUSTER_REPLIES):
        return _cause(exc)
    return (_cause(exc) + "; this server is a node of a Redis Cluster, which a redis:// store "
            "cannot use (its scripts touch the keys of several hash slots); fix: set "
            "anarchon_store_url to redis+cluster://host:port[,host:port...]/ (docs/stores.md, "
            "Redis Cluster)")
