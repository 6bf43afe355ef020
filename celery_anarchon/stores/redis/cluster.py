"""The Redis Cluster store: ``redis+cluster://host:port[,host:port...]/`` (``rediss+cluster://``:
TLS), strategy ``lease`` only, through redis-py's ``RedisCluster``.

It is the lease store of :mod:`.lease` with the same scripts, keys of an entry and entry store,
on a layout where each script touches one hash slot (:mod:`.cluster_keys`):

* **Claims by slot.** A tick's batch is split by the hash slot of each entry; one claim script
  runs per slot, on that slot's store-wide hash and pauses; the scripts of the slots a master
  serves go to it in one pipeline, followed by that master's one ``WAIT`` (and ``WAITAOF``) on the
  same connection: ``durability`` is judged per master, on its own replicas, and the wins of a
  master that did not confirm are UNCONFIRMED (never sent) while the other masters' stand.
* **The epoch per slot**: the ``run_id`` of the master serving the slot. A failover (or a slot
  migrated to another master) restarts the memory of that slot's entries, 10 s refused, as a
  failover of one Redis does.
* **Pauses** are written into the entry's slot too (:mod:`.cluster_entries`), so the claim, the
  takeover and the adoption of a leased run check them in the same script (every lease script of
  an entry runs on its slot, whose head keys hold that slot's pauses): the store is an
  :class:`~celery_anarchon.stores.entry_store.EntryStore`.
  Every entry-store write is confirmed on its master's replicas as a claim is (a ``once`` call in
  the round, followed by the ``confirm_write`` script on the same slot); one not confirmed raises
  StoreError.
* **Lease scans** (expired runs) run one script per slot, pipelined per master; every other lease
  operation touches one entry, one slot.
* **The clock.** Each decision uses the ``TIME`` of the master serving its entry; ``now_ms()`` reads
  the master of the namespace's slot. Keep the masters' clocks in step (NTP), as for any store
  whose servers decide lateness.

After a failover redis-py's slot map is stale: a ``MOVED``/``ASK``/``CLUSTERDOWN`` reply or a
connection error makes the store reload the map; a redirected pipeline is sent again once (its
scripts did not run), anything else is StoreUnavailable (the engine's retry recognises its own
wins).
"""
from __future__ import annotations

import dataclasses
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry

from celery_anarchon.errors import ConfigError
from celery_anarchon.stores.base import ClaimRequest, ClaimResult, HistoryRecord, LeasedRun, RunEvent, SKIP_EVENTS
from celery_anarchon.stores.redis import server
from celery_anarchon.stores.redis.cluster_entries import SCRIPTS as CLUSTER_SCRIPTS, ClusterEntries
from celery_anarchon.stores.redis.cluster_keys import SlotKeys, parse_cluster_url
from celery_anarchon.stores.redis.entries import SCRIPTS as ENTRY_SCRIPTS
from celery_anarchon.stores.redis.history import HISTORY_BATCH, history_records
from celery_anarchon.stores.redis.lease import RedisLeaseStore, _run, claim_args
from celery_anarchon.stores.redis.store import _items, claim_results

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


class RedisClusterStore(RedisLeaseStore):
    """Redis Cluster, strategy ``lease`` (see the module docstring); the options are
    :class:`~celery_anarchon.stores.redis.store.RedisStore`'s but ``strategy`` (only ``lease``),
    ``master_name`` and ``sentinel_kwargs``.

    :raises ConfigError: another strategy, a Sentinel option, or a bad URL (see
        :func:`~.cluster_keys.parse_cluster_url`).
    """

    kind = "redis-cluster"
    connection_errors = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException,
                         OSError)

    def __init__(self, url: str, *, namespace: str, instance_id: str, **options) -> None:
        strategy = options.get("strategy", "lease")
        if strategy != "lease":
            raise ConfigError(
                f"anarchon_store_options['strategy'] = {strategy!r}: a Redis Cluster store "
                "(redis+cluster://) claims with the 'lease' strategy only (its keys fit one hash "
                "slot per entry; the others are not ported); remove the option, or use a single "
                "Redis (redis://) for that strategy.")
        for name in ("master_name", "sentinel_kwargs"):
            if name in options:
                raise ConfigError(f"anarchon_store_options[{name!r}] applies to sentinel:// URLs"
                                  " only; a Redis Cluster finds its masters itself")
        super().__init__(url, namespace=namespace, instance_id=instance_id, **options)
        self.slots = SlotKeys(self.key_prefix, self.namespace)
        #: master name -> (replicas to wait for, None: as many as are live; wait for the AOF)
        self._plans: dict[str, tuple[int | None, bool]] = {}
        #: master name -> durability "auto": live replicas at its last batch
        self._hints: dict[str, int] = {}
        #: (pid, the threads that run the masters' rounds at once), made on first use
        self._pool: tuple[int, ThreadPoolExecutor] | None = None
        #: master name -> its facts (:func:`.server.server_facts`) when its plan was made
        self._facts: dict[str, dict] = {}
        self._entries = ClusterEntries(
            self.namespace_keys, self._redis, self._unavailable, self._memory_ms,
            f"Redis Cluster store {self.safe_url}, namespace {self.namespace!r}",
            write=self._entry_write, slots=self.slots, node_client=self._node_client)

    def _connection_setup(self, url: str, options: dict):
        return parse_cluster_url(url)

    def describe(self) -> str:
        return f"redis-cluster strategy=lease memory={self.memory_s:g}s"

    _cluster_reply_is_misuse = False   # a redirect here is the slot map moving

    # -- connections --------------------------------------------------------------------------
    def _redis(self) -> tuple[RedisCluster, dict]:
        """The ``RedisCluster`` client and its scripts, created on first use (no I/O before)."""
        conn = self._conn
        if conn is not None:
            return conn
        with self._lock:
            if self._conn is None:
                nodes, kwargs = self._sentinel
                client = RedisCluster(
                    startup_nodes=[ClusterNode(host, port) for host, port in nodes],
                    socket_timeout=self.claim_timeout, socket_connect_timeout=self.claim_timeout,
                    decode_responses=True, encoding_errors="surrogateescape",
                    require_full_coverage=True,
                    retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), retries=1), **kwargs)
                texts = {**self._script_texts(), **ENTRY_SCRIPTS, **CLUSTER_SCRIPTS}
                self._conn = (client, {name: client.register_script(t) for name, t in texts.items()})
            return self._conn

    def _node_client(self, key: str) -> redis.Redis:
        """The client of the master serving ``key``'s slot (redis-py's slot map)."""
        cluster = self._redis()[0]
        return cluster.get_redis_connection(cluster.get_node_from_key(key))

    def _reload_slot_map(self) -> None:
        """Ask the cluster for its slot map again (after a redirect or a failover)."""
        conn = self._conn
        if conn is not None:
            try:
                conn[0].nodes_manager.initialize()
            except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError):
                pass  # the next operation tries again

    # -- one call per slot, pipelined per master ----------------------------------------------
    def _slot_call(self, script: str, slot: int, blocks: list[str], args: Sequence,
                   count_replicas: bool = False) -> _Call:
        return _Call(script, [*self.slots.head(slot), *blocks],
                     [*self._header(count_replicas=count_replicas), *args])

    def _rounds(self, calls: list[_Call], *, confirm: bool = False) -> list[tuple[dict, str]]:
        """Run ``calls``, each on one slot: per master one pipeline (then, with ``confirm``, its
        WAIT / WAITAOF). Returns, in order, each call's JSON reply and why its master did not
        confirm it ("" when it did, or without ``confirm``).

        :raises StoreUnavailable: a master did not answer (the outcome of its calls is unknown).
        """
        out: list = [None] * len(calls)
        for attempt in range(2):
            with self._unavailable(calls[0].script if calls else "round"):
                groups: dict[str, list[int]] = defaultdict(list)
                cluster = self._redis()[0]
                nodes = {}
                try:
                    for i, call in enumerate(calls):
                        if out[i] is None:
                            node = cluster.get_node_from_key(call.keys[0])
                            nodes[node.name] = node
                            groups[node.name].append(i)
                    self._each_master(groups, nodes, calls, confirm, out)
                except _REDIRECTS:
                    self._reload_slot_map()
                    if attempt:
                        raise
                    continue
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                        redis.exceptions.RedisClusterException, OSError):
                    self._reload_slot_map()
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
        client = self._redis()[0].get_redis_connection(node)
        if not confirm:
            return [(r, "") for r in self._pipeline(client, calls, 0, False)]
        replicas, aof = self._plan_of(node, client)
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

    def _pipeline(self, client: redis.Redis, calls: list[_Call], asked: int, aof: bool) -> list:
        """The replies of ``calls`` run on one master (:meth:`_run`)."""
        return self._run(client, calls, asked, aof).replies

    def _run(self, client: redis.Redis, calls: list[_Call], asked: int, aof: bool):
        """EVALSHA of each call (then WAIT ``asked`` and WAITAOF when asked) in one round trip on
        one master (:func:`.server.run_scripts`: after NOSCRIPT, the calls run ``once`` that ran
        are not sent again)."""
        return server.run_scripts(client, self._redis()[1],
                                  [(c.script, c.keys, c.args, c.once) for c in calls],
                                  replicas=asked, aof=aof, timeout_s=self.confirm_timeout,
                                  aof_optional=self.durability == "auto")

    def _plan_of(self, node, client: redis.Redis) -> tuple[int | None, bool]:
        """The confirmation plan of master ``node`` (:func:`.server.plan_confirmation`), read from
        it once (and again for a master not seen before, e.g. after a failover)."""
        plan = self._plans.get(node.name)
        if plan is None:
            facts = server.server_facts(client, self._online(node, client))
            if self.durability == "auto":
                self._hints[node.name] = facts["replicas"]
            plan = server.plan_confirmation(facts, durability=self.durability,
                                            min_replicas=self.min_replicas, safe_url=self.safe_url)
            self._plans[node.name], self._facts[node.name] = plan, facts
        return plan

    def _online(self, node, client: redis.Redis) -> int:
        """The replicas online on master ``node``, as the scripts count them (the settings
        script, on one of its slots).

        :raises redis.exceptions.ConnectionError: the slot map gives it no slot (stale map).
        """
        cache = self._redis()[0].nodes_manager.slots_cache
        slot = next((s for s, owners in cache.items() if owners and owners[0].name == node.name),
                    None)
        if slot is None:
            raise redis.exceptions.ConnectionError(f"{node.name} serves no slot in the slot map")
        call = self._slot_call("settings", slot, [], [])
        return int(self._pipeline(client, [call], 0, False)[0]["online"])

    # -- the calls of the base store, by slot --------------------------------------------------
    def _call(self, script: str, keys: list[str], *args) -> dict:
        """Run ``script`` on the keys of one slot (``keys``: entry blocks of that slot)."""
        slot = self._redis()[0].keyslot(keys[0])
        return self._rounds([self._slot_call(script, slot, keys, args)])[0][0]

    def _by_slot(self, entries: Iterable[str]) -> dict[int, list[str]]:
        groups: dict[int, list[str]] = defaultdict(list)
        for entry in dict.fromkeys(entries):
            groups[self.slots.slot_of_entry(entry)].append(entry)
        return groups

    def _claim_call(self, keys: list[str], args: list, script: str = "claim") -> tuple[dict, str]:
        """One script on one slot with its master's confirmation (the takeover)."""
        slot = self._redis()[0].keyslot(keys[0])
        reply, missing = self._rounds([self._slot_call(script, slot, keys, args, True)],
                                      confirm=True)[0]
        return reply, server.unconfirmed_detail(missing, confirm_timeout=self.confirm_timeout)

    def _confirmed_write(self, script: str, keys: list[str], args: list) -> tuple[object, str]:
        """An entry-store write on the slot of ``keys[0]``, then ``confirm_write`` on that slot's
        head, confirmed by the master serving the slot (:meth:`_rounds`; the write runs once).

        :returns: the script's reply (JSON decoded) and what the confirmation lacked ("" if
            nothing).
        """
        slot = self._redis()[0].keyslot(keys[0])
        (reply, _), (_, missing) = self._rounds(
            [_Call(script, keys, args, once=True),
             self._slot_call("confirm_write", slot, [], [], True)], confirm=True)
        return reply, missing

    def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimResult]:
        """Claim the batch: one claim script per hash slot, pipelined per master with its
        confirmation (the order of checks is the lease strategy's)."""
        if not requests:
            return []
        by_slot: dict[int, list[int]] = defaultdict(list)
        for i, r in enumerate(requests):
            by_slot[self.slots.slot_of_entry(r.entry)].append(i)
        calls, order = [], []
        for slot, indexes in by_slot.items():
            blocks: dict[str, int] = {}
            args = claim_args([requests[i] for i in indexes], blocks)
            calls.append(self._slot_call("claim", slot, [k for e in blocks for k in self._block(e)],
                                         args, True))
            order.append(indexes)
        results: list = [None] * len(requests)
        for indexes, (reply, missing) in zip(order, self._rounds(calls, confirm=True)):
            unconfirmed = server.unconfirmed_detail(missing, confirm_timeout=self.confirm_timeout)
            got = self._unconfirmed(claim_results([requests[i] for i in indexes], reply), unconfirmed)
            for i, result in zip(indexes, got):
                results[i] = result
        return results

    def expired_runs(self, entries: Iterable[str]) -> list[LeasedRun]:
        """Expired leased runs: one scan script per slot, pipelined per master."""
        groups = self._by_slot(entries)
        calls = [self._slot_call("expired_runs", slot, [k for e in names for k in self._block(e)], [])
                 for slot, names in groups.items()]
        found = []
        for names, (reply, _) in zip(groups.values(), self._rounds(calls) if calls else []):
            found += [_run(names[int(f["b"]) - 1], int(f["s"]), {"now": reply["now"], "run": f["r"]})
                      for f in _items(reply.get("runs"))]
        return found

    def record_many(self, notes: Sequence[HistoryRecord]) -> None:
        """Several history events, pipelined per master."""
        calls = []
        for n in notes:
            event = RunEvent(n.event)
            calls.append(self._slot_call(
                "record", self.slots.slot_of_entry(n.entry), self._block(n.entry),
                [int(n.slot_ms), event.value, n.task_id, int(n.attempt), n.detail,
                 "1" if event in SKIP_EVENTS else "0"]))
        if calls:
            self._rounds(calls)

    def history_many(self, entries: Iterable[str],
                     limit: int | None = None) -> dict[str, list[HistoryRecord]]:
        """:meth:`history` of each of ``entries``, pipelined per master (:data:`HISTORY_BATCH`
        reads a round).

        :raises StoreUnavailable: a master did not answer (nothing is returned).
        """
        names = list(dict.fromkeys(entries))
        limit = self.history_size if limit is None else int(limit)
        if limit < 1:
            return {name: [] for name in names}
        out: dict[str, list[HistoryRecord]] = {}
        for start in range(0, len(names), HISTORY_BATCH):
            chunk = names[start:start + HISTORY_BATCH]
            calls = [self._slot_call("history", self.slots.slot_of_entry(n), self._block(n), [limit])
                     for n in chunk]
            out.update((n, history_records(n, reply)) for n, (reply, _) in zip(chunk, self._rounds(calls)))
        return out

    def now_ms(self) -> int:
        """The ``TIME`` of the master serving the namespace's slot, UTC ms."""
        with self._unavailable("TIME"):
            seconds, micros = self._node_client(self.namespace_keys["store"]).time()
        return int(seconds) * 1000 + int(micros) // 1000

    # -- life cycle ---------------------------------------------------------------------------
    def prepare(self, entries: Iterable[str]) -> list[str]:
        """On every master: ping, the version, the scripts loaded, the confirmation plan and the
        warnings; per slot of ``entries``: the memory settings recorded there (spec point 5) and
        the memory start of new entries.

        :raises ConfigError: as :meth:`RedisStore.prepare` (on any master).
        """
        groups = self._by_slot(entries)
        self._plans.clear()
        warnings: list[str] = []
        with self._unavailable("prepare"):
            cluster, scripts = self._redis()
            for node in cluster.get_primaries():
                client = cluster.get_redis_connection(node)
                client.ping()
                self._check_version(client)
                pipe = client.pipeline(transaction=False)
                for script in scripts.values():
                    pipe.script_load(script.script)
                pipe.execute()
                plan = self._plan_of(node, client)
                for text in server.warnings(client, self._facts[node.name], plan,
                                            durability=self.durability,
                                            safe_url=f"{self.safe_url} (master {node.name})",
                                            allow_eviction=self.allow_eviction):
                    warnings.append(text)
        self._note_slots()
        calls = [self._slot_call("settings", slot, [], []) for slot in groups]
        for reply, _ in self._rounds(calls) if calls else []:
            self._judge_settings(reply)
        calls = [self._slot_call("memory_start", slot, [k for e in names for k in self._block(e)], [0])
                 for slot, names in groups.items()]
        if calls:
            self._rounds(calls)
        return warnings

    def _note_slots(self) -> None:
        """Give every hash slot its store-wide note (epoch: the ``run_id`` of its master, memory
        start: that master's clock now) once per namespace, then a marker in the namespace's
        slot says so: an entry of a slot no entry used yet is covered by the store's memory as
        on one Redis (its first run is not refused), while a slot whose note is missing later
        lost its data (a master wiped: its first 10 s are refused). Plain ``HSETNX`` pipelined
        per master (about 0.1 s the first time on loopback; one EXISTS after). A failover
        meanwhile leaves notes with the old master's epoch: the slots' memory restarts at their
        next script, a possible miss, never a second win."""
        marker = self.namespace_keys["store"] + ":slots"
        with self._unavailable("prepare"):
            cluster = self._redis()[0]
            if cluster.exists(marker):
                return
            by_node: dict[str, list[int]] = defaultdict(list)
            for slot, owners in cluster.nodes_manager.slots_cache.items():
                by_node[owners[0].name].append(slot)
            for name, slots in by_node.items():
                client = cluster.get_redis_connection(cluster.get_node(node_name=name))
                run_id = client.info("server")["run_id"]
                seconds, micros = client.time()
                born = str(int(seconds) * 1000 + int(micros) // 1000)
                pipe = client.pipeline(transaction=False)
                for slot in slots:
                    key = self.slots.head(slot)[0]
                    pipe.hsetnx(key, "epoch", run_id)
                    pipe.hsetnx(key, "born", born)
                pipe.execute()
            cluster.set(marker, "1")

    def close(self) -> None:
        super().close()
        self._plans.clear()
        # no shutdown(), which takes a lock (close may run in a signal handler): the pool's idle
        # threads end once it is collected
        self._pool = None

