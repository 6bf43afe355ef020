"""The streams of the NATS store: created with ``replicas`` copies, raised to them, waited for.

**Replicas.** The claims stream, the history bucket and the epoch stream (:mod:`.memory`) are
created with ``replicas`` copies (store option; default 3 when the server belongs to a cluster of
at least 3 servers, as its INFO ``cluster`` and ``connect_urls`` say, else 1). An R3 stream
acknowledges a publish once a quorum (2 of 3) stored it, so a won claim survives the loss of any
one server, its leader included, and a claim never wins twice across a leader election. At
start-up a live stream with fewer replicas than wanted is raised (``STREAM.UPDATE``; the server
copies it to the new peers), one with more is kept (never lowered), with a warning naming both.
Start-up warnings: an R1 stream on a cluster (its one server is a single point of failure and
loses acknowledged claims in a host crash), and a single server (JetStream syncs its files to disk
every 2 minutes by default: ``sync_interval``, 2.10+, ``always`` to sync every write; 2.9 has no
setting).
"""
from __future__ import annotations

import asyncio
import time

from celery_anarchon.errors import ConfigError
from celery_anarchon.stores.nats.connection import (
    API, STREAM_NAME_IN_USE, STREAM_NOT_FOUND, ApiError, Missing, Names, time_ms,
)

#: the default replica count on a cluster of at least this many servers
CLUSTER_REPLICAS = 3
#: JetStream err_codes of a replica count the servers cannot place
REPLICA_ERRORS = frozenset({10023, 10074, 10005})
#: claims are kept this many windows, so a duplicate can always read its winner back
MAX_AGE_WINDOWS = 2
_NS_PER_MS = 1_000_000


def topology(nc) -> tuple[str | None, int | None]:
    """(cluster name, servers known) from the server's INFO: ``cluster`` and ``connect_urls``
    (every server's client URL, this one included). nats-py keeps INFO as ``_server_info`` (no
    public accessor in 2.16). A server outside a cluster: (None, 1)."""
    info = getattr(nc, "_server_info", None) or {}
    cluster = info.get("cluster") or None
    if not cluster:
        return None, 1
    urls = info.get("connect_urls")
    return cluster, (len(set(urls)) if urls else None)


class Streams:
    """The streams of one NATS store (module docstring), a part of
    :class:`~celery_anarchon.stores.nats.NATSStore`.

    :param names: the store's streams and subjects.
    :param safe_url: the store's masked URL (for messages).
    :param replicas_option: the ``replicas`` option, ``None`` for the default.
    :param window_ms: this instance's ``duplicate_window``, ms (the claims stream's config).
    :param claim_timeout: seconds; a new replicated stream is waited for at most half of it.

    ``replicas`` is the count this store creates streams with (1 until resolved on the first
    connection); ``ready`` the streams known to exist (re-checked when one answers missing);
    ``created_ms`` the claims stream's creation, server ms, as last read.
    """

    def __init__(self, *, names: Names, safe_url: str, replicas_option: int | None,
                 window_ms: int, claim_timeout: float) -> None:
        self.names = names
        self.safe_url = safe_url
        self.replicas_option = replicas_option
        self.window_ms = window_ms
        self.claim_timeout = claim_timeout
        self.replicas = 1
        self.ready: set[str] = set()
        self.created_ms: int | None = None

    def resolve_replicas(self, nc) -> int:
        """The replica count of the streams this store creates (``replicas`` or the default)."""
        if self.replicas_option is not None:
            self.replicas = self.replicas_option
        else:
            cluster, size = topology(nc)
            self.replicas = CLUSTER_REPLICAS if cluster and (size or 0) >= CLUSTER_REPLICAS else 1
        return self.replicas

    # -- the configs ----------------------------------------------------------------------------
    def claims_config(self) -> dict:
        """The claims stream: one message per run subject, deduplicated for the window, kept
        ``MAX_AGE_WINDOWS`` windows."""
        return {"name": self.names.stream, "subjects": [f"{self.names.root}.>"],
                "retention": "limits", "storage": "file", "discard": "old",
                "max_msgs_per_subject": 1, "max_msgs": -1, "max_bytes": -1, "max_msg_size": -1,
                "max_consumers": -1, "num_replicas": self.replicas,
                "duplicate_window": self.window_ms * _NS_PER_MS,
                "max_age": MAX_AGE_WINDOWS * self.window_ms * _NS_PER_MS}

    def epoch_config(self) -> dict:
        """The epoch stream: one marker, kept in memory (lost when its servers restart)."""
        return {"name": self.names.epoch_stream, "subjects": [self.names.epoch_subject],
                "retention": "limits", "storage": "memory", "discard": "old",
                "max_msgs_per_subject": 1, "max_msgs": -1, "max_bytes": -1, "max_msg_size": -1,
                "max_consumers": -1, "max_age": 0, "num_replicas": self.replicas}

    async def claims(self, session, nc) -> dict:
        """The claims stream's info, creating it when absent (``created_here`` True then); notes
        its creation time in ``created_ms``."""
        if self.names.stream not in self.ready:
            self.resolve_replicas(nc)
        info = await self.ensure(session, nc, self.names.stream, self.claims_config())
        self.note_created(info)
        return info

    def note_created(self, info: dict) -> int:
        """Note the claims stream's creation time from its STREAM.INFO ``info``: server ms (the
        store's memory start; a stream created again forgot every claim)."""
        self.created_ms = time_ms(info["created"])
        return self.created_ms

    # -- creating, raising, waiting -------------------------------------------------------------
    async def ensure(self, session, nc, name: str, config: dict) -> dict:
        """The stream's info, creating it when absent (identical concurrent creations succeed);
        ``info["created_here"]`` is True when this call created it.

        :raises ConfigError: the servers cannot place the stream's replicas.
        :raises ApiError: another JetStream error. :raises Missing: JetStream does not answer.
        """
        try:
            return await session.api(nc, f"{API}.STREAM.INFO.{name}")
        except ApiError as exc:
            if exc.err_code != STREAM_NOT_FOUND:
                raise
        created_here = True
        try:
            await session.api(nc, f"{API}.STREAM.CREATE.{name}", config)
        except ApiError as exc:
            if exc.err_code in REPLICA_ERRORS or "replica" in exc.description.lower():
                raise self._replica_error(nc, name, config.get("num_replicas"), exc) from None
            if exc.err_code != STREAM_NAME_IN_USE:
                raise
            created_here = False
        info = await session.api(nc, f"{API}.STREAM.INFO.{name}")
        if created_here:
            info = await self.settled(session, nc, info)
        return dict(info, created_here=created_here)

    def _replica_error(self, nc, name: str, replicas, exc: ApiError) -> ConfigError:
        cluster, size = topology(nc)
        where = (f"cluster {cluster!r} of {size or 'an unknown number of'} servers" if cluster
                 else "a single server (not part of a cluster)")
        return ConfigError(f"NATS store {self.safe_url}: stream {name} with {replicas} replicas "
                           f"cannot be placed on {where}: {exc.description} (err_code "
                           f"{exc.err_code}). Set anarchon_store_options['replicas'] to at most "
                           "the number of JetStream servers, or leave it out (3 on a cluster of "
                           "at least 3 servers, else 1).")

    async def replicated(self, session, nc, info: dict) -> tuple[dict, list[str]]:
        """Raise a live stream's replica count to this store's (never lower it): its info, and
        a warning when raised or kept above an explicit ``replicas``.

        :raises ConfigError: the servers cannot place that many replicas.
        """
        config = info["config"]
        live = int(config.get("num_replicas") or 1)
        name = config["name"]
        if live >= self.replicas:
            if live > self.replicas and self.replicas_option is not None:
                return info, [f"NATS store {self.safe_url}: stream {name} has {live} replicas, more "
                              f"than this instance's replicas={self.replicas}; kept (fewer copies "
                              "would lose claims sooner)"]
            return info, []
        try:
            updated = await session.api(nc, f"{API}.STREAM.UPDATE.{name}",
                                        dict(config, num_replicas=self.replicas))
        except ApiError as exc:
            if exc.err_code in REPLICA_ERRORS or "replica" in exc.description.lower():
                raise self._replica_error(nc, name, self.replicas, exc) from None
            raise
        info = await self.settled(session, nc, dict(info, config=updated.get("config", config)))
        return info, [f"NATS store {self.safe_url}: stream {name} had {live} replica(s); raised "
                      f"to {self.replicas} (replicas={self.replicas})"]

    async def settled(self, session, nc, info: dict) -> dict:
        """Wait (at most claim_timeout / 2) until a replicated stream just created or raised has
        a leader and current peers: until then it answers no publish. Its latest info."""
        name, replicas = info["config"]["name"], int(info["config"].get("num_replicas") or 1)
        if replicas < 2:
            return info
        deadline = time.monotonic() + self.claim_timeout / 2
        while time.monotonic() < deadline:
            try:
                now = await session.api(nc, f"{API}.STREAM.INFO.{name}")
            except (ApiError, Missing):
                now = {}
            group = now.get("cluster") or {}
            peers = group.get("replicas") or []
            if group.get("leader") and len(peers) + 1 >= replicas \
                    and all(p.get("current") for p in peers):
                return now
            await asyncio.sleep(0.05)
        return info

    def topology_warnings(self, nc, info: dict) -> list[str]:
        """What the server setup promises, said at start-up (docs/design.md "Amnesia"): a single
        server, or an R1 claims stream on a cluster; ``info`` is the claims stream's."""
        cluster, size = topology(nc)
        live = int(info["config"].get("num_replicas") or 1)
        version = str((getattr(nc, "_server_info", None) or {}).get("version", "?"))
        sync = (f"this server ({version}) has no such setting before 2.10"
                if version.startswith(("2.0.", "2.1.", "2.2.", "2.3.", "2.4.", "2.5.", "2.6.",
                                       "2.7.", "2.8.", "2.9."))
                else "set jetstream { sync_interval: always } to sync every write")
        if cluster is None:
            return [f"NATS store {self.safe_url}: a single NATS server. JetStream syncs its files to "
                    f"disk every 2 minutes by default (sync_interval; {sync}), so a host crash "
                    "can lose claims it acknowledged. The store sees the server's restart (its "
                    f"epoch marker, kept in memory in stream {self.names.epoch_stream}, is gone) "
                    "and refuses the slots up to 10 s after it as 'forgotten': a possible miss, "
                    "never a duplicate. To keep every acknowledged claim through a crash, run a "
                    "cluster of 3 servers (the streams then get replicas=3)."]
        if live == 1:
            return [f"NATS store {self.safe_url}: stream {self.names.stream} has 1 replica on "
                    f"cluster {cluster!r} ({size or '?'} servers known): the one server that holds "
                    "it is a single point of failure (claims stop while it is down) and a host "
                    "crash can lose claims it acknowledged (JetStream syncs every 2 minutes by "
                    f"default). Set anarchon_store_options['replicas'] = 3 (or leave it out on a "
                    "cluster of at least 3 servers); a live stream is raised at start-up."]
        return []
