"""The NATS JetStream store (docs/design.md store memory table: NATS JetStream, memory
``duplicate_window``).

A claim is the first publish of a run's message id to the claims stream: JetStream keeps the
first and answers every later one within ``duplicate_window`` as a duplicate, naming the original.
:class:`NATSStore` is the host that holds the connection and joins its parts, each a module with
its own part of the promise:

* :mod:`.claims`: the claim, its three pipelined rounds and the order of the verdicts;
* :mod:`.memory`: the ``duplicate_window`` (refused at start-up while another one is in use) and
  the epoch (amnesia and partial loss after a server restart);
* :mod:`.clock`: the server's clock and the skew bound a claim must stay within;
* :mod:`.streams`: the streams and their replicas, start-up warnings about the server setup;
* :mod:`.history`: history and definitions in a key-value bucket;
* :mod:`.instances`: the instance records (heartbeats) and fingerprint mappings;
* :mod:`.options`: the options and URLs (``nats://``, ``tls://``, several servers);
* :mod:`.connection`: the event loop thread, pipelined requests, the names.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence

from celery_anarchon.errors import ConfigError
from celery_anarchon.stores._common import failed, translated
from celery_anarchon.stores.base import (
    ClaimRequest, ClaimResult, ClaimStore, Memory,
)
from celery_anarchon.stores.nats import options as nats_options
from celery_anarchon.stores.nats.claims import Claims
from celery_anarchon.stores.nats.clock import ServerClock
from celery_anarchon.stores.nats.connection import (
    API, Missing, Names, Session, discard, logger, uses_tls,
)
from celery_anarchon.stores.nats.history import NATSHistory
from celery_anarchon.stores.nats.instances import NATSInstances
from celery_anarchon.stores.nats.memory import Epoch, Window
from celery_anarchon.stores.nats.streams import Streams


class NATSStore(ClaimStore):
    """NATS JetStream: the first publish of a run's message id wins (:mod:`.claims`). It keeps
    instance records (:mod:`.instances`) but no entries or pauses: its claim cannot check a pause
    in the same step.

    :param duplicate_window: seconds a claimed run is remembered (default 300, at least 0.1).
    :param replicas: copies of each stream (1 to 5; default 3 on a cluster of at least 3 servers,
        else 1); see :mod:`.streams`, "Replicas".
    :param history_size: runs of history kept per entry (default 100).
    :param claim_timeout: seconds one operation may take, connecting included (default 5).
    :param tls: an ``ssl.SSLContext`` for ``tls://`` servers (nats-py's ``tls``).
    :param tls_hostname: the name to check the server's certificate against.
    :param tls_handshake_first: TLS before the server's INFO (servers configured for it).
    :param user_credentials: a NATS ``.creds`` file (nats-py's ``user_credentials``).
    :param nkeys_seed: an NKey seed file (nats-py's ``nkeys_seed``).
    :raises ConfigError: an unknown option, a bad value or URL (:mod:`.options`).
    """

    kind = "nats"
    #: the driver errors that mean "unreachable or no answer": nats-py errors, OSError, API
    #: errors, bad replies, timeouts (kombu's ``connection_errors``)
    connection_errors = (Exception,)
    checks_lateness = False
    recognises_winner = True

    def __init__(self, url: str, *, namespace: str, instance_id: str, **options) -> None:
        given = nats_options.parse(url, instance_id, options)
        super().__init__(url, namespace=namespace, instance_id=instance_id,
                         history_size=given.history_size, claim_timeout=given.claim_timeout)
        self.duplicate_window_s = given.duplicate_window_s
        self.replicas_option = given.replicas
        self._servers = given.servers
        self._tls_required = given.tls_required
        self._connect_options = given.client
        self._names = names = Names.of(namespace, instance_id)
        self.stream, self.bucket, self.epoch_stream = names.stream, names.bucket, names.epoch_stream
        self._session_lock = threading.Lock()
        self._session: Session | None = None
        self._clock = time.time  # this instance's wall clock, seconds; tests skew it
        self._warned: set[str] = set()
        # the parts, each given what it needs (the clock through this store: tests replace it)
        safe = self.safe_url
        self._streams = Streams(names=names, safe_url=safe, replicas_option=given.replicas,
                                window_ms=round(given.duplicate_window_s * 1000),
                                claim_timeout=self.claim_timeout)
        self.history = NATSHistory(streams=self._streams, history_size=self.history_size,
                                    instance_id=instance_id, claim_timeout=self.claim_timeout,
                                    call=self._call)
        self._window = Window(names=names, safe_url=safe, duplicate_window_s=self.duplicate_window_s,
                              server_time=self.history.server_time, clock=lambda: self._clock())
        self._epoch = Epoch(streams=self._streams, instance_id=instance_id, safe_url=safe)
        self._server_clock = ServerClock(names=names, safe_url=safe, clock=lambda: self._clock(),
                                         claims_stream=self._claims_stream)
        #: the instance records (the ``instances`` part)
        self.instances = NATSInstances(streams=self._streams, instance_id=instance_id,
                                        claim_timeout=self.claim_timeout, call=self._call)
        self._claims = Claims(instance_id=instance_id, safe_url=safe, streams=self._streams,
                              window=self._window, epoch=self._epoch,
                              server_clock=self._server_clock, history=self.history,
                              warn=self._warn)

    # -- identity -----------------------------------------------------------------------------
    @property
    def replicas(self) -> int:
        """The replica count of this store's streams (1 until resolved on first connection)."""
        return self._streams.replicas

    @property
    def memory(self) -> Memory:
        return Memory(duration_s=self.duplicate_window_s, setting="duplicate_window")

    def describe(self) -> str:
        return f"nats duplicate_window={self.duplicate_window_s:g}s"

    # -- the loop thread ----------------------------------------------------------------------
    def _get_session(self) -> Session:
        """This process's session, started on first use; a forked child starts its own."""
        with self._session_lock:
            session = self._session
            if session is not None and session.forked:
                session.shutdown()  # keeps it alive in the child, untouched
                session = None
            if session is None:
                session = self._session = Session(f"anarchon-nats-{self.instance_id}")
            return session

    def _call(self, doing: str, step, *args):
        """Run ``step(session, nc, *args)`` on the loop thread within ``claim_timeout``.

        :raises StoreUnavailable: unreachable, no answer in time, or a server error.
        :raises ConfigError: the URL asks for TLS and the server offers none.
        """
        session = self._get_session()

        async def work():
            nc = await session.client(self._servers, self._connect_options)
            if self._tls_required and not uses_tls(nc):
                session.nc = None
                discard(nc)
                raise ConfigError(f"NATS store {self.safe_url}: the URL asks for TLS but the server "
                                  "offers no TLS; configure TLS on it or use nats://")
            return await step(session, nc, *args)
        with translated("NATS", self.safe_url, doing, self.connection_errors, cause=self._cause):
            return session.run(work, self.claim_timeout)

    def _cause(self, exc: BaseException) -> str:
        if isinstance(exc, TimeoutError):
            return f": no answer within {self.claim_timeout:g} s"
        if isinstance(exc, Missing):
            return f": nobody answered on {exc} (is JetStream enabled?)"
        return failed(exc)

    def close(self) -> None:
        """Close the client and stop the loop thread; idempotent, takes no lock (signal-safe).
        The next operation starts them again."""
        session, self._session = self._session, None
        if session is not None:
            session.shutdown()

    def _warn(self, warnings: list[str]) -> None:
        for text in warnings:
            if text not in self._warned:
                self._warned.add(text)
                logger.warning("%s", text)

    # -- life cycle ---------------------------------------------------------------------------
    async def _claims_stream(self, session, nc) -> tuple[dict, list[str]]:
        """The claims stream's info (created when absent, its window checked, the epoch marker
        read or, on a new stream, written) and its warnings."""
        info = await self._streams.claims(session, nc)
        warnings = self._window.check(info)
        if info.get("created_here") or self._epoch.marker is None:
            await self._epoch.read(session, nc, None if info.get("created_here") else "read",
                                   first=bool(info.get("created_here")))
        self._streams.ready.add(self.stream)
        return info, warnings

    def prepare(self, entries: Iterable[str]) -> list[str]:
        """Connect, create the claims stream (its creation time is when the memory began, for
        every entry), the epoch stream and the history bucket with ``replicas`` copies, settle
        the window, and measure the skew.

        :returns: warnings (a single server, an R1 stream on a cluster, replicas raised or kept,
            a window replaced, memory storage).
        :raises ConfigError: JetStream is not enabled, TLS was asked for and not offered, the
            replicas cannot be placed, or the stream's duplicate_window is another instance's
            and still in use.
        """
        streams = self._streams

        async def step(session, nc):
            streams.ready.discard(self.stream)
            streams.ready.discard(self.history.kv_stream)
            try:
                info, warnings = await self._claims_stream(session, nc)
            except Missing:
                raise ConfigError(f"NATS store {self.safe_url}: JetStream does not answer; enable "
                                  "it on the server (nats-server -js, or a jetstream block)") from None
            info, more = await self._window.settle(session, nc, info)
            warnings += more
            info, more = await streams.replicated(session, nc, info)
            warnings += more
            epoch = await streams.ensure(session, nc, self.epoch_stream, streams.epoch_config())
            warnings += (await streams.replicated(session, nc, epoch))[1]
            await self.history.ensure_bucket(session, nc)
            kv = await session.api(nc, f"{API}.STREAM.INFO.{self.history.kv_stream}")
            warnings += (await streams.replicated(session, nc, kv))[1]
            warnings += streams.topology_warnings(nc, info)
            await self._server_clock.probe(session, nc)
            return warnings
        warnings = self._call("prepare", step)
        self._warned.update(warnings)
        return warnings

    def now_ms(self) -> int:
        """The server's time, UTC ms: the timestamp of a message just stored (also measures this
        instance's skew, :mod:`.clock`).

        :raises StoreUnavailable: unreachable, or the clock message could not be read back.
        """
        return self._call("read the server's clock", self._server_clock.probe)

    # -- claims (:class:`~.claims.Claims`) ----------------------------------------------------
    def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimResult]:
        """Claim the batch (:mod:`.claims`: publish, read winners back, record history).

        :raises StoreUnavailable: the outcome is unknown; a retry recognises this instance's wins.
        """
        if not requests:
            return []
        return self._call("claim", self._claim, list(requests))

    async def _claim(self, session, nc, requests: list[ClaimRequest]) -> list[ClaimResult]:
        if self.stream not in self._streams.ready:
            self._warn((await self._claims_stream(session, nc))[1])
        try:
            return await self._claims.claim(session, nc, requests)
        except Missing:  # the stream was deleted: create it again (its memory begins now)
            self._streams.ready.discard(self.stream)
            self._warn((await self._claims_stream(session, nc))[1])
            return await self._claims.claim(session, nc, requests)
