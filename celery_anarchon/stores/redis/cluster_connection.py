"""The connection layer of the Redis Cluster store (:mod:`.cluster`): ``RedisCluster``'s client,
and every script call run on the hash slot of its keys, the calls of one round pipelined per
master with that master's confirmation (``WAIT`` / ``WAITAOF`` on the same connection, the rules
of :mod:`.server`), the masters' rounds at once.

After a failover redis-py's slot map is stale: a ``MOVED``/``ASK``/``CLUSTERDOWN`` reply or a
connection error makes the connection reload the map; a redirected pipeline is sent again once
(its scripts did not run), anything else is StoreUnavailable (the engine's retry recognises its
own wins).
"""
from __future__ import annotations

import dataclasses
import os
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry

from celery_anarchon.stores.redis import server
from celery_anarchon.stores.redis.cluster_keys import SlotKeys
from celery_anarchon.stores.redis.connection import RedisConnection

#: threads that run the rounds of the masters past the first at once (a cluster has rarely more)
MASTER_THREADS = 8

#: replies after which the slot map is reloaded and the pipeline sent again (its scripts did not run)
_REDIRECTS = (redis.exceptions.MovedError, redis.exceptions.AskError,
              redis.exceptions.TryAgainError, redis.exceptions.ClusterDownError)


@dataclasses.dataclass
class _Call:
    """One script call of a round: its script, keys (head included) and arguments (header
    included); ``once``: never run again for the confirmation (an entry-store write; the other
    calls of its round count the replicas and write, so a WAIT after them covers it)."""

    script: str
    keys: list
    args: list
    once: bool = False


class ClusterConnection(RedisConnection):
    """The connection of a Redis Cluster store (module docstring): a :class:`RedisConnection`
    whose calls run on the hash slot of their keys, with the slot's store-wide hash and pauses
    as head keys (:class:`~.cluster_keys.SlotKeys`), confirmed per master.

    :param setup: the startup nodes and ``RedisCluster`` arguments
        (:func:`.cluster_keys.parse_cluster_url`).
    :param slots: the namespace's per-slot keys.
    The other parameters are :class:`RedisConnection`'s.
    """

    connection_errors = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException,
                         OSError)
    cluster_reply_is_misuse = False   # a redirect here is the slot map moving

    def __init__(self, url: str, *, slots: SlotKeys, **kwargs) -> None:
        super().__init__(url, **kwargs)
        self.slots = slots
        #: master name -> (replicas to wait for, None: as many as are live; wait for the AOF)
        self._plans: dict[str, tuple[int | None, bool]] = {}
        #: master name -> durability "auto": live replicas at its last batch
        self._hints: dict[str, int] = {}
        #: (pid, the threads that run the masters' rounds at once), made on first use
        self._pool: tuple[int, ThreadPoolExecutor] | None = None
        #: master name -> its facts (:func:`.server.server_facts`) when its plan was made
        self.facts: dict[str, dict] = {}

    # -- the client ---------------------------------------------------------------------------
    def _new_client(self) -> RedisCluster:
        nodes, kwargs = self.setup
        return RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in nodes],
            socket_timeout=self.claim_timeout, socket_connect_timeout=self.claim_timeout,
            decode_responses=True, encoding_errors="surrogateescape",
            require_full_coverage=True,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), retries=1), **kwargs)

    def node_client(self, key: str) -> redis.Redis:
        """The client of the master serving ``key``'s slot (redis-py's slot map)."""
        cluster = self.client()[0]
        return cluster.get_redis_connection(cluster.get_node_from_key(key))

    def reload_slot_map(self) -> None:
        """Ask the cluster for its slot map again (after a redirect or a failover)."""
        conn = self._conn
        if conn is not None:
            try:
                conn[0].nodes_manager.initialize()
            except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError):
                pass  # the next operation tries again

    def multi(self, doing: str, key: str, fill: Callable[[redis.client.Pipeline], None]) -> list:
        """One MULTI/EXEC on the master of ``key``'s slot (``TIME`` included)."""
        with self.unavailable(doing):
            pipe = self.node_client(key).pipeline(transaction=True)
            fill(pipe)
            return pipe.execute()

    def forget_plans(self) -> None:
        """Read each master's confirmation plan again at its next round (prepare)."""
        self._plans.clear()

    def close(self) -> None:
        super().close()
        self._plans.clear()
        # no shutdown(), which takes a lock (close may run in a signal handler): the pool's idle
        # threads end once it is collected
        self._pool = None

    # -- one call per slot, pipelined per master ----------------------------------------------
    def slot_call(self, script: str, slot: int, blocks: list[str], args: Sequence,
                  count_replicas: bool = False) -> _Call:
        """A call of ``script`` on ``slot`` for :meth:`rounds`: the slot's head keys, then the
        entries' ``blocks``; the header (counting the replicas: a claim's), then ``args``."""
        return _Call(script, [*self.slots.head(slot), *blocks],
                     [*self.header(count_replicas=count_replicas), *args])

    def rounds(self, calls: list[_Call], *, confirm: bool = False) -> list[tuple[dict, str]]:
        """Run ``calls``, each on one slot: per master one pipeline (then, with ``confirm``, its
        WAIT / WAITAOF). Returns, in order, each call's JSON reply and why its master did not
        confirm it ("" when it did, or without ``confirm``).

        :raises StoreUnavailable: a master did not answer (the outcome of its calls is unknown).
        """
        out: list = [None] * len(calls)
        for attempt in range(2):
            with self.unavailable(calls[0].script if calls else "round"):
                groups: dict[str, list[int]] = defaultdict(list)
                cluster = self.client()[0]
                nodes = {}
                try:
                    for i, call in enumerate(calls):
                        if out[i] is None:
                            node = cluster.get_node_from_key(call.keys[0])
                            nodes[node.name] = node
                            groups[node.name].append(i)
                    self._each_master(groups, nodes, calls, confirm, out)
                except _REDIRECTS:
                    self.reload_slot_map()
                    if attempt:
                        raise
                    continue
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                        redis.exceptions.RedisClusterException, OSError):
                    self.reload_slot_map()
                    raise
            return out
        raise AssertionError("unreachable")

    def _each_master(self, groups: dict[str, list[int]], nodes: dict, calls: list[_Call],
                     confirm: bool, out: list) -> None:
        """:meth:`_node_round` on every master of ``groups`` at once (one thread per master past
        the first: their round trips and WAITs overlap), each reply put in ``out``. Every master's
        round ends before this returns; then the first failure is raised (the replies of the
        masters that answered are in ``out``: a retry after a redirect runs only the others)."""
        def run(name: str) -> None:
            replies = self._node_round(nodes[name], [calls[i] for i in groups[name]], confirm)
            for i, reply in zip(groups[name], replies):
                out[i] = reply
        names = list(groups)
        if len(names) == 1:
            run(names[0])
            return
        pool = self._master_pool()
        futures = [pool.submit(run, name) for name in names[1:]]
        failures = []
        try:
            run(names[0])
        except Exception as exc:  # noqa: BLE001  (raised below, after the others ended)
            failures.append(exc)
        for future in futures:
            exc = future.exception()
            if exc is not None:
                failures.append(exc)
        if failures:
            raise failures[0]

    def _master_pool(self) -> ThreadPoolExecutor:
        """The threads of :meth:`_each_master`, made on first use and again in a forked child
        (a pool's threads do not survive a fork)."""
        pool = self._pool
        if pool is None or pool[0] != os.getpid():
            pool = self._pool = (os.getpid(), ThreadPoolExecutor(
                max_workers=MASTER_THREADS, thread_name_prefix="anarchon-cluster"))
        return pool[1]

    def _node_round(self, node, calls: list[_Call], confirm: bool) -> list[tuple[dict, str]]:
        """The calls of one master: one pipeline, its confirmation on the same connection (and,
        with durability "auto" when more replicas are live than were asked for and that many are
        connected, once more: the calls but those run ``once``; replicas required but not
        connected are never waited for, the batch is unconfirmed at once)."""
        client = self.client()[0].get_redis_connection(node)
        if not confirm:
            return [(r, "") for r in self._run(client, calls, 0, False).replies]
        replicas, aof = self.plan_of(node, client)
        auto = replicas is None
        asked = self._hints.get(node.name, 0) if auto else replicas
        replies, acked, fsynced = self._pipeline_confirmed(node, client, calls, asked, aof)
        counting = [r for c, r in zip(calls, replies) if not c.once]
        live = max([int(r.get("replicas", 0)) for r in counting] or [0]) if auto else replicas
        if auto:
            connected = min([int(r.get("connected", live)) for r in counting] or [live])
            # a replica that is not connected cannot acknowledge: waiting for it only stalls
            # beat (every master's round of a chunk waits for the slowest)
            self._hints[node.name] = min(live, connected)
            taken = any(r.get("outcome") in (None, "taken") for r in counting)
            if live > asked and connected >= live and taken:
                counted = [{k: r[k] for k in ("online", "seen", "held") if k in r} for r in counting]
                again = [c for c in calls if not c.once]
                counting, acked, fsynced = self._pipeline_confirmed(node, client, again, live, aof)
                for r, c in zip(counting, counted):
                    r.update(c)
                repeated = iter(counting)
                replies = [r if c.once else next(repeated) for c, r in zip(calls, replies)]
        worst = max(counting, key=lambda r: int(r.get("replicas", 0)))
        missing = server.missing_confirmation(
            worst, acked=acked, live=live, aof=aof, fsynced=fsynced, auto=auto,
            replica_grace=self.replica_grace)
        return [(r, missing) for r in replies]

    def _pipeline_confirmed(self, node, client, calls, asked: int, aof: bool):
        """:meth:`_run` with its confirmation on master ``node``: (replies, acked, fsynced)."""
        done = self._run(client, calls, asked, aof)
        if done.aof_refused:
            # 'auto' waits for the AOF only where it is used: read this master's setup again
            self._plans.pop(node.name, None)
        return done.replies, done.acked, done.fsynced

    def _run(self, client: redis.Redis, calls: list[_Call], asked: int, aof: bool):
        """EVALSHA of each call (then WAIT ``asked`` and WAITAOF when asked) in one round trip on
        one master (:func:`.server.run_scripts`: after NOSCRIPT, the calls run ``once`` that ran
        are not sent again)."""
        return server.run_scripts(client, self.client()[1],
                                  [(c.script, c.keys, c.args, c.once) for c in calls],
                                  replicas=asked, aof=aof, timeout_s=self.confirm_timeout,
                                  aof_optional=self.durability == "auto")

    def plan_of(self, node, client: redis.Redis) -> tuple[int | None, bool]:
        """The confirmation plan of master ``node`` (:func:`.server.plan_confirmation`), read from
        it once (and again for a master not seen before, e.g. after a failover)."""
        plan = self._plans.get(node.name)
        if plan is None:
            facts = server.server_facts(client, self._online(node, client))
            if self.durability == "auto":
                self._hints[node.name] = facts["replicas"]
            plan = server.plan_confirmation(facts, durability=self.durability,
                                            min_replicas=self.min_replicas, safe_url=self.safe_url)
            self._plans[node.name], self.facts[node.name] = plan, facts
        return plan

    def _online(self, node, client: redis.Redis) -> int:
        """The replicas online on master ``node``, as the scripts count them (the settings
        script, on one of its slots).

        :raises redis.exceptions.ConnectionError: the slot map gives it no slot (stale map).
        """
        cache = self.client()[0].nodes_manager.slots_cache
        slot = next((s for s, owners in cache.items() if owners and owners[0].name == node.name),
                    None)
        if slot is None:
            raise redis.exceptions.ConnectionError(f"{node.name} serves no slot in the slot map")
        call = self.slot_call("settings", slot, [], [])
        return int(self._run(client, [call], 0, False).replies[0]["online"])

    def call(self, script: str, keys: list[str], *args) -> dict:
        """Run ``script`` on the keys of one slot (``keys``: entry blocks of that slot)."""
        slot = self.client()[0].keyslot(keys[0])
        return self.rounds([self.slot_call(script, slot, keys, args)])[0][0]

    def claim_call(self, keys: list[str], args: list, script: str = "claim") -> tuple[dict, str]:
        """One script on one slot with its master's confirmation (the takeover)."""
        slot = self.client()[0].keyslot(keys[0])
        reply, missing = self.rounds([self.slot_call(script, slot, keys, args, True)],
                                     confirm=True)[0]
        return reply, server.unconfirmed_detail(missing, confirm_timeout=self.confirm_timeout)

    def confirmed_write(self, script: str, keys: list[str], args: list) -> tuple[object, str]:
        """An entry-store write on the slot of ``keys[0]``, then ``confirm_write`` on that slot's
        head, confirmed by the master serving the slot (:meth:`rounds`; the write runs once).

        :returns: the script's reply (JSON decoded) and what the confirmation lacked ("" if
            nothing).
        """
        slot = self.client()[0].keyslot(keys[0])
        (reply, _), (_, missing) = self.rounds(
            [_Call(script, keys, args, once=True),
             self.slot_call("confirm_write", slot, [], [], True)], confirm=True)
        return reply, missing
