"""The connection layer of the Redis store: the client (created on first use, Sentinel or not),
the scripts registered on it, the driver's errors turned into StoreUnavailable, and every round
trip that runs the scripts: one script (:meth:`RedisConnection.call`), a claim or a takeover with
the batch's confirmation (:meth:`RedisConnection.claim_call`), an entry-store write confirmed as a
durable claim is (:meth:`RedisConnection.write`).

The confirmation (``durability``: WAIT and/or WAITAOF pipelined after the scripts on the same
connection) follows the rules of :mod:`.server`; the Redis Cluster store runs the same calls by
hash slot, one round per master (:mod:`.cluster_connection`).
"""
from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Mapping, Sequence

import redis
import redis.sentinel
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from celery_anarchon.stores._common import translated
from celery_anarchon.stores.redis import server

#: replies only a node of a Redis Cluster gives (a slot served elsewhere, keys of two slots)
_CLUSTER_REPLIES = (redis.exceptions.MovedError, redis.exceptions.AskError,
                    redis.exceptions.ClusterCrossSlotError)


class RedisConnection:
    """The client of one Redis store and the round trips of its scripts.

    :param url: the store's URL (``redis://``, ``rediss://``, ``unix://``, ``sentinel://``).
    :param safe_url: the URL with its password masked, for messages.
    :param where: how errors name the store and namespace (``"Redis store <url>, namespace 'x'"``).
    :param claim_timeout: seconds one round trip may take (socket and connect timeouts).
    :param setup: what the client connects with (:func:`.options.sentinel_setup`: for a Sentinel
        URL (sentinels, master kwargs, master name, sentinel kwargs), else None; the Cluster
        store's: :func:`.cluster_keys.parse_cluster_url`).
    :param scripts: the Lua scripts to register, by name.
    :param head_keys: the keys every claim-side script takes first: the namespace's store-wide
        hash and its pauses (:mod:`.scripts`, "Namespace keys").
    :param header: ARGV[1..5] of every script (:mod:`.scripts`, "ARGV header"): the instance's
        id, the memory (ms), history_size, the memory settings' text and horizon (ms).
    :param durability: the store's ``durability``; ``min_replicas``, ``confirm_timeout`` (s),
        ``replica_grace`` (s) and ``allow_eviction`` as the store's options.
    """

    #: the driver errors that mean "unreachable or no answer" (kombu's ``connection_errors``)
    connection_errors: tuple[type[BaseException], ...] = (redis.exceptions.RedisError, OSError)
    #: a reply only a node of a Redis Cluster gives means this store was pointed at one (the
    #: Cluster store, whose redirects are the slot map moving, sets it False)
    cluster_reply_is_misuse = True

    def __init__(self, url: str, *, safe_url: str, where: str, claim_timeout: float, setup,
                 scripts: Mapping[str, str], head_keys: Sequence[str], header: Sequence,
                 durability: str, min_replicas: int, confirm_timeout: float,
                 replica_grace: float, allow_eviction: bool) -> None:
        self.url = url
        self.safe_url = safe_url
        self.where = where
        self.claim_timeout = claim_timeout
        self.setup = setup
        self.scripts = dict(scripts)
        self.head_keys = list(head_keys)
        self.header_fields = list(header)
        self.durability = durability
        self.min_replicas = min_replicas
        self.confirm_timeout = confirm_timeout
        self.replica_grace = replica_grace
        self.allow_eviction = allow_eviction
        #: (replicas to wait for (None: count per batch), wait for the AOF): set by the first
        #: prepare() or claim from what the server runs (durability "auto") or the options
        self.confirm: tuple[int | None, bool] | None = None
        #: durability "auto": live replicas at the last batch (what the next WAIT asks for)
        self._replica_hint = 0
        self._conn: tuple[redis.Redis, dict] | None = None  # (client, its registered scripts)
        self._lock = threading.Lock()

    # -- the client ---------------------------------------------------------------------------
    def client(self) -> tuple[redis.Redis, dict]:
        """The client and its scripts, created on first use (no I/O before). redis-py's pool
        notices a fork and opens new connections in the child (never the parent's sockets)."""
        conn = self._conn
        if conn is not None:
            return conn
        with self._lock:
            if self._conn is None:
                client = self._new_client()
                self._conn = (client, {name: client.register_script(text)
                                       for name, text in self.scripts.items()})
            return self._conn

    def _new_client(self) -> redis.Redis:
        # surrogateescape: bytes that are not UTF-8 (a hand edit, another program) are read as
        # lone surrogates, which the checks of a definition and a name refuse by name, instead
        # of failing the whole read (entries.load_entries)
        kwargs = dict(socket_timeout=self.claim_timeout,
                      socket_connect_timeout=self.claim_timeout, decode_responses=True,
                      encoding_errors="surrogateescape",
                      retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), retries=1,
                                  supported_errors=(redis.exceptions.ConnectionError,)))
        if self.setup is None:
            return redis.Redis.from_url(self.url, **kwargs)
        sentinels, master, master_name, sentinel_kwargs = self.setup
        own = {k: v for k, v in kwargs.items() if k != "decode_responses"}
        sentinel = redis.sentinel.Sentinel(
            sentinels, sentinel_kwargs={**own, **sentinel_kwargs}, **kwargs)
        return sentinel.master_for(master_name, **master)

    def unavailable(self, doing: str):
        """Turn every redis-py error into StoreUnavailable naming the masked URL and the cause
        (a reply only a Cluster node gives: with the fix, :func:`_plain_cause`)."""
        return translated("Redis", self.safe_url, doing, self.connection_errors,
                          cause=_plain_cause if self.cluster_reply_is_misuse else _cause)

    def close(self) -> None:
        """Release connections; idempotent and safe in a signal handler (no lock taken). The
        next operation reconnects."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn[0].close()

    def multi(self, doing: str, key: str, fill: Callable[[redis.client.Pipeline], None]) -> list:
        """One MULTI/EXEC (a consistent read, or a write of the keys of one hash tag) on the
        server that holds ``key``: ``fill(pipe)`` queues the commands; their replies.

        :raises StoreUnavailable: the server did not answer.
        """
        with self.unavailable(doing):
            pipe = self.client()[0].pipeline(transaction=True)
            fill(pipe)
            return pipe.execute()

    # -- one script ---------------------------------------------------------------------------
    def header(self, count_replicas: bool = False) -> list:
        """ARGV[1..6] of every script (:mod:`.scripts`: "ARGV header")."""
        grace = int(self.replica_grace * 1000) if count_replicas else 0
        return [*self.header_fields, f"{grace} {1 if self.allow_eviction else 0}"]

    def call(self, script: str, keys: list[str], *args) -> dict:
        """Run one registered script (KEYS: the namespace keys, then ``keys``; ARGV: the header,
        then ``args``); its JSON reply.

        :raises StoreUnavailable: the server did not answer.
        """
        with self.unavailable(script):
            reply = self.client()[1][script](keys=[*self.head_keys, *keys],
                                            args=[*self.header(), *args])
        return json.loads(reply)

    # -- durable claims (:mod:`.server`) ---------------------------------------------------------
    def plan_confirmation(self, facts: dict) -> tuple[int | None, bool]:
        """:func:`.server.plan_confirmation` for this store's options; with durability "auto",
        the first batch's WAIT asks for the replicas live now."""
        if self.durability == "auto":
            self._replica_hint = facts["replicas"]
        return server.plan_confirmation(facts, durability=self.durability,
                                        min_replicas=self.min_replicas, safe_url=self.safe_url)

    def confirmation(self) -> tuple[int | None, bool]:
        """The plan of :meth:`plan_confirmation`, read from the server once (prepare() sets it;
        a store used without prepare() reads it at its first claim)."""
        if self.confirm is None:
            online = int(self.call("settings", [])["online"])
            with self.unavailable("reading the server's setup"):
                facts = server.server_facts(self.client()[0], online)
            self.confirm = self.plan_confirmation(facts)
        return self.confirm

    def claim_call(self, keys: list[str], args: list, script: str = "claim") -> tuple[dict, str]:
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
        replicas, aof = self.confirmation()
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
        client, scripts = self.client()
        asked = self._replica_hint if replicas is None else replicas
        header = self.header(count_replicas=replicas is None)
        full = [(name, [*self.head_keys, *keys], [*header, *args], i < once) if head
                else (name, keys, args, i < once)
                for i, (name, keys, args, head) in enumerate(calls)]
        with self.unavailable(calls[0][0]):
            done = server.run_scripts(client, scripts, full, replicas=asked, aof=aof,
                                      timeout_s=self.confirm_timeout,
                                      aof_optional=self.durability == "auto")
        if done.aof_refused:
            # 'auto' waits for the AOF only where it is used; read the setup again next batch
            self.confirm = None
        return done.replies, done.acked, done.fsynced, asked

    def write(self, doing: str, script: str, keys: list[str], args: list):
        """Run an entry-store write (a script of :mod:`.entry_scripts`, its own keys and args)
        confirmed as a durable claim is (:meth:`confirmed_write`); with durability "none", the
        script alone, as it always was.

        :param doing: the write, for the error (``"pause 'e3'"``).
        :returns: the script's reply, JSON decoded.
        :raises StoreError: the master applied the write but did not confirm it within
            ``confirm_timeout`` (the change may be lost if it fails over now; repeat it once the
            replicas are back).
        :raises StoreUnavailable: the server did not answer (the outcome is unknown).
        """
        if self.durability == "none":
            with self.unavailable(script.replace("_", " ")):
                return json.loads(self.client()[1][script](keys=keys, args=list(args)))
        reply, missing = self.confirmed_write(script, list(keys), list(args))
        if missing:
            raise server.unconfirmed_write(self.where, doing, missing,
                                           confirm_timeout=self.confirm_timeout)
        return reply

    def confirmed_write(self, script: str, keys: list[str], args: list) -> tuple[object, str]:
        """``script`` then the ``confirm_write`` script (the replicas, by the claims' rule) and the
        confirmation, in one round trip (:meth:`_confirmed`; only ``confirm_write`` runs again).

        :returns: the script's reply (JSON decoded) and what the confirmation lacked ("" if
            nothing).
        """
        replies, missing = self._confirmed(
            [(script, keys, args, False), ("confirm_write", [], [], True)], again=1)
        return replies[0], missing


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
