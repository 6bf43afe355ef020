"""The Redis Cluster store: ``redis+cluster://host:port[,host:port...]/`` (``rediss+cluster://``:
TLS), strategy ``lease`` only, through redis-py's ``RedisCluster``.

It is the lease store of :mod:`.lease` with the same scripts, keys of an entry and entry store,
on a layout where each script touches one hash slot (:mod:`.cluster_keys`), through a connection
that runs every call on its slot (:mod:`.cluster_connection`):

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
  :class:`~celery_anarchon.stores.entry_store.Entries`.
  Every entry-store write is confirmed on its master's replicas as a claim is (a ``once`` call in
  the round, followed by the ``confirm_write`` script on the same slot); one not confirmed raises
  StoreError.
* **Lease scans** (expired runs) run one script per slot, pipelined per master; every other lease
  operation touches one entry, one slot.
* **The clock.** Each decision uses the ``TIME`` of the master serving its entry; ``now_ms()`` reads
  the master of the namespace's slot. Keep the masters' clocks in step (NTP), as for any store
  whose servers decide lateness.

After a failover redis-py's slot map is stale: the connection reloads it (:mod:`.cluster_connection`).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

from celery_anarchon.errors import ConfigError
from celery_anarchon.stores.base import (
    SKIP_EVENTS, ClaimRequest, ClaimResult, HistoryRecord, LeasedRun, RunEvent,
)
from celery_anarchon.stores.redis import server
from celery_anarchon.stores.redis.cluster_connection import ClusterConnection
from celery_anarchon.stores.redis.cluster_entries import SCRIPTS as CLUSTER_SCRIPTS, ClusterEntries
from celery_anarchon.stores.redis.cluster_keys import SlotKeys, parse_cluster_url
from celery_anarchon.stores.redis.history import (
    HISTORY_BATCH, RedisHistory, _items, history_records,
)
from celery_anarchon.stores.redis.lease import RedisLeases, RedisLeaseStore, _run, claim_args
from celery_anarchon.stores.redis.store import claim_results


class ClusterHistory(RedisHistory):
    """History on a Redis Cluster: a batch of notes or reads pipelined per master."""

    def record_many(self, notes: Sequence[HistoryRecord]) -> None:
        """Several history events, pipelined per master."""
        c, calls = self.connection, []
        for n in notes:
            event = RunEvent(n.event)
            calls.append(c.slot_call(
                "record", c.slots.slot_of_entry(n.entry), self._block(n.entry),
                [int(n.slot_ms), event.value, n.task_id, int(n.attempt), n.detail,
                 "1" if event in SKIP_EVENTS else "0"]))
        if calls:
            c.rounds(calls)

    def read_many(self, entries: Iterable[str],
                  limit: int | None = None) -> dict[str, list[HistoryRecord]]:
        """:meth:`read` of each of ``entries``, pipelined per master (:data:`HISTORY_BATCH`
        reads a round).

        :raises StoreUnavailable: a master did not answer (nothing is returned).
        """
        names = list(dict.fromkeys(entries))
        limit = self.history_size if limit is None else int(limit)
        if limit < 1:
            return {name: [] for name in names}
        c, out = self.connection, {}
        for start in range(0, len(names), HISTORY_BATCH):
            chunk = names[start:start + HISTORY_BATCH]
            calls = [c.slot_call("history", c.slots.slot_of_entry(n), self._block(n), [limit])
                     for n in chunk]
            out.update((n, history_records(n, reply))
                       for n, (reply, _) in zip(chunk, c.rounds(calls)))
        return out


def by_slot(entries: Iterable[str], slot_of: Callable[[str], int]) -> dict[int, list[str]]:
    """``entries`` (each once, in order) grouped by their hash slot (``slot_of``)."""
    groups: dict[int, list[str]] = defaultdict(list)
    for entry in dict.fromkeys(entries):
        groups[slot_of(entry)].append(entry)
    return groups


class ClusterLeases(RedisLeases):
    """The leases part on a Redis Cluster: every operation on one run is one script in its
    entry's slot; the scan for expired runs is one script per slot, pipelined per master."""

    def expired_runs(self, entries: Iterable[str]) -> list[LeasedRun]:
        """Expired leased runs: one scan script per slot, pipelined per master."""
        c = self.connection
        groups = by_slot(entries, c.slots.slot_of_entry)
        calls = [c.slot_call("expired_runs", slot, [k for e in names for k in self._block(e)], [])
                 for slot, names in groups.items()]
        found = []
        for names, (reply, _) in zip(groups.values(), c.rounds(calls) if calls else []):
            found += [_run(names[int(f["b"]) - 1], int(f["s"]), {"now": reply["now"], "run": f["r"]})
                      for f in _items(reply.get("runs"))]
        return found


class RedisClusterStore(RedisLeaseStore):
    """Redis Cluster, strategy ``lease`` (see the module docstring); the options are
    :class:`~celery_anarchon.stores.redis.store.RedisStore`'s but ``strategy`` (only ``lease``),
    ``master_name`` and ``sentinel_kwargs``.

    :raises ConfigError: another strategy, a Sentinel option, or a bad URL (see
        :func:`~.cluster_keys.parse_cluster_url`).
    """

    kind = "redis-cluster"
    title = "Redis Cluster store"
    history_class = ClusterHistory
    entries_class = ClusterEntries
    leases_class = ClusterLeases

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

    def _connect(self, url: str, options: dict) -> ClusterConnection:
        """The connection of the Cluster (startup nodes from ``url``; no I/O).

        :raises ConfigError: a bad URL (:func:`~.cluster_keys.parse_cluster_url`).
        """
        #: the namespace's per-slot keys (store-wide hash, pauses)
        self.slots = SlotKeys(self.key_prefix, self.namespace)
        options = self._connection_options()
        options["scripts"].update(CLUSTER_SCRIPTS)
        return ClusterConnection(url, setup=parse_cluster_url(url), slots=self.slots, **options)

    def describe(self) -> str:
        return f"redis-cluster strategy=lease memory={self.memory_s:g}s"

    # -- the calls of the lease store, by slot -------------------------------------------------
    def _by_slot(self, entries: Iterable[str]) -> dict[int, list[str]]:
        return by_slot(entries, self.slots.slot_of_entry)

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
            calls.append(self.connection.slot_call(
                "claim", slot, [k for e in blocks for k in self._block(e)], args, True))
            order.append(indexes)
        results: list = [None] * len(requests)
        for indexes, (reply, missing) in zip(order, self.connection.rounds(calls, confirm=True)):
            unconfirmed = server.unconfirmed_detail(missing, confirm_timeout=self.confirm_timeout)
            got = self._unconfirmed(claim_results([requests[i] for i in indexes], reply), unconfirmed)
            for i, result in zip(indexes, got):
                results[i] = result
        return results

    def now_ms(self) -> int:
        """The ``TIME`` of the master serving the namespace's slot, UTC ms."""
        with self.connection.unavailable("TIME"):
            seconds, micros = self.connection.node_client(self.namespace_keys["store"]).time()
        return int(seconds) * 1000 + int(micros) // 1000

    def exists(self) -> None:
        """Cannot tell: the memory-start notes are per hash slot (:meth:`ClaimStore.exists`)."""
        return None

    # -- life cycle ---------------------------------------------------------------------------
    def prepare(self, entries: Iterable[str]) -> list[str]:
        """On every master: ping, the version, the scripts loaded, the confirmation plan and the
        warnings; per slot of ``entries``: the memory settings recorded there (spec point 5) and
        the memory start of new entries.

        :raises ConfigError: as :meth:`RedisStore.prepare` (on any master).
        """
        c, groups = self.connection, self._by_slot(entries)
        c.forget_plans()
        warnings: list[str] = []
        with c.unavailable("prepare"):
            cluster, scripts = c.client()
            for node in cluster.get_primaries():
                client = cluster.get_redis_connection(node)
                client.ping()
                self._check_version(client)
                pipe = client.pipeline(transaction=False)
                for script in scripts.values():
                    pipe.script_load(script.script)
                pipe.execute()
                plan = c.plan_of(node, client)
                for text in server.warnings(client, c.facts[node.name], plan,
                                            durability=self.durability,
                                            safe_url=f"{self.safe_url} (master {node.name})",
                                            allow_eviction=self.allow_eviction):
                    warnings.append(text)
        self._note_slots()
        calls = [c.slot_call("settings", slot, [], []) for slot in groups]
        for reply, _ in c.rounds(calls) if calls else []:
            self._judge_settings(reply)
        calls = [c.slot_call("memory_start", slot, [k for e in names for k in self._block(e)], [0])
                 for slot, names in groups.items()]
        if calls:
            c.rounds(calls)
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
        with self.connection.unavailable("prepare"):
            cluster = self.connection.client()[0]
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
