"""The NATS JetStream store (DESIGN.md store memory table: NATS JetStream, memory ``duplicate_window``).

**The claim.** Each namespace has a claims stream ``ANARCHON_CLAIMS_<ns>`` over
``anarchon.claims.<ns>.>``, created with ``duplicate_window`` = the store option (default 300 s:
the memory) and ``max_age`` = twice that. A claim publishes a JSON body (instance id, fingerprint,
task id, entry, slot, max_late) to the run's own subject ``anarchon.claims.<ns>.run.<entry>.<slot>``
with ``Nats-Msg-Id: <entry>.<slot>``. JetStream stores the first publish of a message id and
answers every later one within the window ``duplicate: true`` with the original's sequence: the
server decides, the first publish wins. The stored body names the winner, so a duplicate reads it
back by sequence: the winner's own retry answers WON, others LOST with the winner and its
fingerprint (DESIGN.md "Who won"). Rounds per batch, each pipelined on one connection: 1. the
publishes, then the stream's info and the epoch marker (see "Amnesia and partial loss"); 2. reading back the winners of duplicates (with the clock probe
and a young stream's memory start when due); 3. the history writes. Won: rounds 1 and 3; lost: 1, 2.

**Memory.** A message id is remembered for ``duplicate_window`` after its first publish; after it
the run can be won again (hence the start-up rule jitter + max_late < duplicate_window). The
window is the stream's, recorded by the server, and it was last used when the stream last stored
a message (``state.last_ts``: claims and clock probes). An instance with another
``duplicate_window`` is refused at start-up (ConfigError naming both) while the stream was used
within the last ``duplicate_window + 2 x 10 s`` (this instance's value); after that, or on a
stream that never stored anything, the window is replaced (a warning). A window changed under a
running instance makes its claims ``FORGOTTEN`` (naming both values; nothing is published) until
the values agree again (DESIGN.md "Amnesia", loss-spec point 5).

**Clock skew.** The server's clock decides no lateness here (``checks_lateness`` is False), so the
instances' clocks must agree: a run's window opens at its first claim and must still be open at its
last, up to max_late after the slot on the slowest clock. The server's time is the timestamp of a
stored message: the store publishes to its own ``...clock.<instance>`` subject, reads the message
back and measures this instance's offset (again with a claim when older than 1 s; first when older
than 60 s or when the local clock jumped). A claim is refused before it is published when
``|offset| + uncertainty > (duplicate_window - max_late) / 2``: with every instance within that
bound, a run's first and last claim are at most max_late + 2 x bound = duplicate_window apart on
the server's clock. The refusal answers EARLY when this clock is ahead, LATE when it is behind,
with the offset and the bound in its detail; a slot older than the window on the server's clock is
FORGOTTEN. A refused instance publishes nothing, so it cannot block the run for the others, but it
reads whether the run was claimed (already claimed comes first).

**Replicas.** The claims stream, the history bucket and the epoch stream (below) are created with
``replicas`` copies (store option; default 3 when the server belongs to a cluster of at least 3
servers, as its INFO ``cluster`` and ``connect_urls`` say, else 1). An R3 stream acknowledges a
publish once a quorum (2 of 3) stored it, so a won claim survives the loss of any one server,
its leader included, and a claim never wins twice across a leader election. At start-up a live
stream with fewer replicas than wanted is raised (``STREAM.UPDATE``; the server copies it to the
new peers), one with more is kept (never lowered), with a warning naming both. Start-up warnings:
an R1 stream on a cluster (its one server is a single point of failure and loses acknowledged
claims in a host crash), and a single server (JetStream syncs its files to disk every 2 minutes by
default: ``sync_interval``, 2.10+, ``always`` to sync every write; 2.9 has no setting).

**Amnesia and partial loss.** The memory began when the claims stream was created (its
``created`` time, on the server's clock): a stream deleted and created again has forgotten every
message id, so a slot older than ``created + 10 s`` is FORGOTTEN. A server that crashed without
syncing keeps the stream but loses its newest claims, which a later claim would win again. The
**epoch** catches that: a one-message stream ``ANARCHON_EPOCH_<ns>`` kept in *memory* (same
replicas), whose message (the marker) is lost whenever the servers holding it restart. Every
claim reads the marker in the same pipeline as its publishes, after them, on one connection (so on
one server it describes the server process that took them, or a later one); a missing marker is
an epoch change: the claim writes a new one (``Nats-Expected-Last-Subject-Sequence: 0``, the first
writer wins) and the memory restarts at the new marker's time: slots before it + 10 s are
FORGOTTEN (a detail naming both epochs), for every instance, since each one reads the same
marker. Slots more than 10 s ahead of the server's clock are refused EARLY, so no claim taken
before the restart can be for a slot past that. What this cannot see: a restart of one member of
a cluster (the marker is copied from the others; an R3 stream lost nothing acknowledged); on a
cluster the marker and the claims have different leaders, so the check is not one step with the
publishes there: R3 is the promise, the epoch covers the whole cluster restarting. Every restart
of a single server, clean or not, costs the runs of its first 10 s (``forgotten``).

History and definitions: :mod:`celery_anarchon.stores.nats.history`. The event loop thread and the
names: :mod:`celery_anarchon.stores.nats.io`.

URLs: ``nats://[user:password@|token@]host[:port]`` or ``tls://...``, several separated by commas;
credentials go to nats-py with the URL. TLS uses nats-py's own options, as store options ``tls``
(an ``ssl.SSLContext``), ``tls_hostname`` and ``tls_handshake_first``; ``user_credentials`` and
``nkeys_seed`` are nats-py's too. A ``tls://`` URL refuses an unencrypted connection.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import ssl
import threading
import time
from collections.abc import Iterable, Sequence
from datetime import timedelta
from urllib.parse import urlsplit, urlunsplit

from celery_anarchon._util import iso, mask_url
from celery_anarchon.errors import ConfigError, StoreUnavailable
from celery_anarchon.stores._common import failed, reject_unknown_options, translated
from celery_anarchon.stores.base import (
    DEFAULT_CLAIM_TIMEOUT_S, DEFAULT_HISTORY_SIZE, LATENESS_TOLERANCE_MS, ClaimRequest, ClaimResult,
    ClaimStore, HistoryRecord, Memory, Outcome, RunEvent,
)
from celery_anarchon.stores.nats.history import NATSHistory
from celery_anarchon.stores.nats.io import (
    API, STREAM_NAME_IN_USE, STREAM_NOT_FOUND, WRONG_LAST_SEQUENCE, ApiError, Missing, Session,
    Stored, discard, logger,
    reply_json, stored_message, time_ms, token, uses_tls,
)

#: Options of ``anarchon_store_options`` this store understands (besides the common ones).
OPTIONS = frozenset({"duplicate_window", "replicas", "tls", "tls_hostname", "tls_handshake_first",
                     "user_credentials", "nkeys_seed"})
DEFAULT_DUPLICATE_WINDOW_S = 300.0
#: the server refuses a shorter window (measured: "duplicates window needs to be >= 100ms")
MIN_DUPLICATE_WINDOW_S = 0.1
#: claims are kept this many windows, so a duplicate can always read its winner back
MAX_AGE_WINDOWS = 2
#: the skew is measured again with a claim when older than this, seconds
SKEW_REFRESH_S = 1.0
#: ...and before a claim when older than this, or when the local clock jumped more than
#: CLOCK_JUMP_S against the monotonic clock since, seconds
SKEW_MAX_AGE_S = 60.0
CLOCK_JUMP_S = 0.5
#: JetStream's largest replica count
MAX_REPLICAS = 5
#: the default replica count on a cluster of at least this many servers
CLUSTER_REPLICAS = 3
#: JetStream err_codes of a replica count the servers cannot place
REPLICA_ERRORS = frozenset({10023, 10074, 10005})


def _replicas(value) -> int | None:
    """The ``replicas`` option: ``None`` (automatic) or an integer 1..5, else ConfigError."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_REPLICAS:
        raise ConfigError(f"anarchon_store_options['replicas'] = {value!r}: must be an integer "
                          f"from 1 to {MAX_REPLICAS} (JetStream's replica count; 3 on a cluster "
                          "keeps every acknowledged claim when one server is lost), or leave it "
                          "out: 3 on a cluster of at least 3 servers, else 1")
    return value


def _window(value) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
            or not math.isfinite(seconds) or seconds < MIN_DUPLICATE_WINDOW_S:
        raise ConfigError(f"anarchon_store_options['duplicate_window'] = {value!r}: must be a number "
                          f"of seconds >= {MIN_DUPLICATE_WINDOW_S} (int, float or timedelta); "
                          "NATS refuses shorter windows")
    return float(seconds)


def _number(name: str, value, *, integer: bool) -> float:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, timedelta) and not integer:
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) \
            or value <= 0 or (integer and value < 1):
        raise ConfigError(f"anarchon_store_options[{name!r}] = {value!r}: must be "
                          + ("an integer >= 1" if integer else "a number of seconds > 0"))
    return value


def _mask(part: str) -> str:
    """One server URL with its password, or its token (a lone user part), masked."""
    masked = mask_url(part)
    try:
        bits = urlsplit(masked)
    except ValueError:
        return "<unparsable URL>"
    if bits.username and bits.password is None:
        return urlunsplit(bits._replace(netloc="***@" + bits.netloc.rsplit("@", 1)[1]))
    return masked


@dataclasses.dataclass(frozen=True)
class _Skew:
    """This instance's clock minus the server's, ms, measured at ``wall_s`` / ``mono_s``."""

    offset_ms: float
    uncertainty_ms: float
    wall_s: float
    mono_s: float


class NATSStore(ClaimStore):
    """NATS JetStream: the first publish of a run's message id wins (module docstring).

    :param duplicate_window: seconds a claimed run is remembered (default 300, at least 0.1).
    :param replicas: copies of each stream (1 to 5; default 3 on a cluster of at least 3 servers,
        else 1); see the module docstring, "Replicas".
    :param history_size: runs of history kept per entry (default 100).
    :param claim_timeout: seconds one operation may take, connecting included (default 5).
    :param tls: an ``ssl.SSLContext`` for ``tls://`` servers (nats-py's ``tls``).
    :param tls_hostname: the name to check the server's certificate against.
    :param tls_handshake_first: TLS before the server's INFO (servers configured for it).
    :param user_credentials: a NATS ``.creds`` file (nats-py's ``user_credentials``).
    :param nkeys_seed: an NKey seed file (nats-py's ``nkeys_seed``).
    """

    kind = "nats"
    #: the driver errors that mean "unreachable or no answer": nats-py errors, OSError, API
    #: errors, bad replies, timeouts (kombu's ``connection_errors``)
    connection_errors = (Exception,)
    checks_lateness = False
    recognises_winner = True

    def __init__(self, url: str, *, namespace: str, instance_id: str, **options) -> None:
        reject_unknown_options(self.kind, options, OPTIONS)
        self.duplicate_window_s = _window(options.get("duplicate_window", DEFAULT_DUPLICATE_WINDOW_S))
        self.replicas_option = _replicas(options.get("replicas"))
        history_size = _number("history_size", options.get("history_size", DEFAULT_HISTORY_SIZE),
                               integer=True)
        claim_timeout = _number("claim_timeout", options.get("claim_timeout", DEFAULT_CLAIM_TIMEOUT_S),
                                integer=False)
        super().__init__(url, namespace=namespace, instance_id=instance_id,
                         history_size=history_size, claim_timeout=claim_timeout)
        self._servers = [part.strip() for part in url.split(",") if part.strip()]
        for part in self._servers or [url]:
            try:
                bits = urlsplit(part)
                bits.port  # noqa: B018  (raises ValueError for a bad port)
            except ValueError:
                bits = None
            if bits is None or bits.scheme.lower() not in ("nats", "tls") or not bits.hostname:
                raise ConfigError(f"anarchon_store_url {_mask(part)!r}: expected "
                                  "nats://[user:password@]host[:port] or tls://..., several "
                                  "separated by commas")
        self._tls_required = any(p.lower().startswith("tls://") for p in self._servers)
        self._connect_options = self._client_options(options)
        self._window_ms = round(self.duplicate_window_s * 1000)
        ns = token(namespace)
        self.stream = f"ANARCHON_CLAIMS_{ns}"
        self.bucket = f"ANARCHON_HISTORY_{ns}"
        self._root = f"anarchon.claims.{ns}"
        self._clock_subject = f"{self._root}.clock.{token(instance_id)}"
        self.epoch_stream = f"ANARCHON_EPOCH_{ns}"
        self._epoch_subject = f"anarchon.epoch.{ns}"
        self.replicas = 1                    # resolved when connected (_resolve_replicas)
        self._epoch: Stored | None = None    # the epoch marker this instance saw last
        self._seen_before: int | None = None  # the marker's time before it last changed
        self._window_conflict: int | None = None  # the stream's other duplicate_window, ms
        self._born_cache: dict[tuple[int, str], int] = {}  # (stream created, entry) -> born
        self._session_lock = threading.Lock()
        self._session: Session | None = None
        self._clock = time.time  # this instance's wall clock, seconds; tests skew it
        self._skew: _Skew | None = None
        self._created_ms: int | None = None  # the claims stream's creation, server ms
        self._ready: set[str] = set()        # streams known to exist (re-checked when missing)
        self._warned: set[str] = set()
        #: history and definitions, a part given what it needs of this store
        self._history = NATSHistory(
            bucket=self.bucket, stream=self.stream, history_size=self.history_size,
            instance_id=self.instance_id, claim_timeout=self.claim_timeout, call=self._call,
            api=self._api, ensure=self._ensure, ready=self._ready, replicas=lambda: self.replicas,
            resolve_replicas=self._resolve_replicas)

    def _client_options(self, options: dict) -> dict:
        kwargs = {"name": f"celery_anarchon {self.instance_id}", "connect_timeout": self.claim_timeout}
        if "tls" in options:
            if not isinstance(options["tls"], ssl.SSLContext):
                raise ConfigError(f"anarchon_store_options['tls'] = {options['tls']!r}: must be an "
                                  "ssl.SSLContext (e.g. ssl.create_default_context(cafile=...))")
            kwargs["tls"] = options["tls"]
        for name, kind in (("tls_hostname", str), ("tls_handshake_first", bool),
                           ("user_credentials", (str, tuple)), ("nkeys_seed", str)):
            if name in options:
                if not isinstance(options[name], kind):
                    raise ConfigError(f"anarchon_store_options[{name!r}] = {options[name]!r}: wrong "
                                      "type (see nats-py's connect())")
                kwargs[name] = options[name]
        return kwargs

    # -- identity -----------------------------------------------------------------------------
    @property
    def safe_url(self) -> str:
        """The URL with every password or token masked."""
        return ",".join(_mask(part) for part in self.url.split(","))

    @property
    def memory(self) -> Memory:
        return Memory(duration_s=self.duplicate_window_s, setting="duplicate_window")

    def describe(self) -> str:
        return f"nats duplicate_window={self.duplicate_window_s:g}s"

    def _run_subject(self, entry: str, slot_ms: int) -> str:
        return f"{self._root}.run.{token(entry)}.{int(slot_ms)}"

    def _born_subject(self, entry: str) -> str:
        return f"{self._root}.born.{token(entry)}"

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

    # -- streams ------------------------------------------------------------------------------
    async def _api(self, session, nc, subject: str, body=None) -> dict:
        payload = b"" if body is None else json.dumps(body).encode()
        [msg] = await session.pipeline(nc, [(subject, payload, None)])
        return reply_json(msg, subject)

    async def _ensure(self, session, nc, name: str, config: dict) -> dict:
        """The stream's info, creating it when absent (identical concurrent creations succeed);
        ``info["created_here"]`` is True when this call created it.

        :raises ConfigError: the servers cannot place the stream's replicas.
        """
        try:
            return await self._api(session, nc, f"{API}.STREAM.INFO.{name}")
        except ApiError as exc:
            if exc.err_code != STREAM_NOT_FOUND:
                raise
        created_here = True
        try:
            await self._api(session, nc, f"{API}.STREAM.CREATE.{name}", config)
        except ApiError as exc:
            if exc.err_code in REPLICA_ERRORS or "replica" in exc.description.lower():
                raise self._replica_error(nc, name, config.get("num_replicas"), exc) from None
            if exc.err_code != STREAM_NAME_IN_USE:
                raise
            created_here = False
        info = await self._api(session, nc, f"{API}.STREAM.INFO.{name}")
        if created_here:
            info = await self._settled(session, nc, info)
        return dict(info, created_here=created_here)

    def _replica_error(self, nc, name: str, replicas, exc: ApiError) -> ConfigError:
        cluster, size = self._topology(nc)
        where = (f"cluster {cluster!r} of {size or 'an unknown number of'} servers" if cluster
                 else "a single server (not part of a cluster)")
        return ConfigError(f"NATS store {self.safe_url}: stream {name} with {replicas} replicas "
                           f"cannot be placed on {where}: {exc.description} (err_code "
                           f"{exc.err_code}). Set anarchon_store_options['replicas'] to at most "
                           "the number of JetStream servers, or leave it out (3 on a cluster of "
                           "at least 3 servers, else 1).")

    # -- topology and replicas ----------------------------------------------------------------
    @staticmethod
    def _topology(nc) -> tuple[str | None, int | None]:
        """(cluster name, servers known) from the server's INFO: ``cluster`` and
        ``connect_urls`` (every server's client URL, this one included). nats-py keeps INFO as
        ``_server_info`` (no public accessor in 2.16). A server outside a cluster: (None, 1)."""
        info = getattr(nc, "_server_info", None) or {}
        cluster = info.get("cluster") or None
        if not cluster:
            return None, 1
        urls = info.get("connect_urls")
        return cluster, (len(set(urls)) if urls else None)

    def _resolve_replicas(self, nc) -> int:
        """The replica count of the streams this store creates (``replicas`` or the default)."""
        if self.replicas_option is not None:
            self.replicas = self.replicas_option
        else:
            cluster, size = self._topology(nc)
            self.replicas = CLUSTER_REPLICAS if cluster and (size or 0) >= CLUSTER_REPLICAS else 1
        return self.replicas

    async def _replicated(self, session, nc, info: dict) -> tuple[dict, list[str]]:
        """Raise a live stream's replica count to this store's (never lower it)."""
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
            updated = await self._api(session, nc, f"{API}.STREAM.UPDATE.{name}",
                                      dict(config, num_replicas=self.replicas))
        except ApiError as exc:
            if exc.err_code in REPLICA_ERRORS or "replica" in exc.description.lower():
                raise self._replica_error(nc, name, self.replicas, exc) from None
            raise
        info = await self._settled(session, nc, dict(info, config=updated.get("config", config)))
        return info, [f"NATS store {self.safe_url}: stream {name} had {live} replica(s); raised "
                      f"to {self.replicas} (replicas={self.replicas})"]

    async def _settled(self, session, nc, info: dict) -> dict:
        """Wait (at most claim_timeout / 2) until a replicated stream just created or raised has
        a leader and current peers: until then it answers no publish. Its latest info."""
        name, replicas = info["config"]["name"], int(info["config"].get("num_replicas") or 1)
        if replicas < 2:
            return info
        deadline = time.monotonic() + self.claim_timeout / 2
        while time.monotonic() < deadline:
            try:
                now = await self._api(session, nc, f"{API}.STREAM.INFO.{name}")
            except (ApiError, Missing):
                now = {}
            group = now.get("cluster") or {}
            peers = group.get("replicas") or []
            if group.get("leader") and len(peers) + 1 >= replicas \
                    and all(p.get("current") for p in peers):
                return now
            await asyncio.sleep(0.05)
        return info

    def _topology_warnings(self, nc, info: dict) -> list[str]:
        """What the server setup promises, said at start-up (loss-spec point 10)."""
        cluster, size = self._topology(nc)
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
                    f"epoch marker, kept in memory in stream {self.epoch_stream}, is gone) and "
                    "refuses the slots up to 10 s after it as 'forgotten': a possible miss, never "
                    "a duplicate. To keep every acknowledged claim through a crash, run a cluster "
                    "of 3 servers (the streams then get replicas=3)."]
        if live == 1:
            return [f"NATS store {self.safe_url}: stream {self.stream} has 1 replica on cluster "
                    f"{cluster!r} ({size or '?'} servers known): the one server that holds it is "
                    "a single point of failure (claims stop while it is down) and a host crash "
                    "can lose claims it acknowledged (JetStream syncs every 2 minutes by "
                    f"default). Set anarchon_store_options['replicas'] = 3 (or leave it out on a "
                    "cluster of at least 3 servers); a live stream is raised at start-up."]
        return []

    def _claims_config(self) -> dict:
        return {"name": self.stream, "subjects": [f"{self._root}.>"], "retention": "limits",
                "storage": "file", "discard": "old", "max_msgs_per_subject": 1, "max_msgs": -1,
                "max_bytes": -1, "max_msg_size": -1, "max_consumers": -1,
                "num_replicas": self.replicas,
                "duplicate_window": self._window_ms * 1_000_000,
                "max_age": MAX_AGE_WINDOWS * self._window_ms * 1_000_000}

    def _epoch_config(self) -> dict:
        return {"name": self.epoch_stream, "subjects": [self._epoch_subject], "retention": "limits",
                "storage": "memory", "discard": "old", "max_msgs_per_subject": 1, "max_msgs": -1,
                "max_bytes": -1, "max_msg_size": -1, "max_consumers": -1, "max_age": 0,
                "num_replicas": self.replicas}

    async def _claims_stream(self, session, nc) -> tuple[dict, list[str]]:
        if self.stream not in self._ready:
            self._resolve_replicas(nc)
        info = await self._ensure(session, nc, self.stream, self._claims_config())
        self._created_ms = time_ms(info["created"])
        warnings = self._check_window(info)
        if info.get("created_here") or self._epoch is None:
            await self._epoch_marker(session, nc, None if info.get("created_here") else "read",
                                     first=bool(info.get("created_here")))
        self._ready.add(self.stream)
        return info, warnings

    # -- the memory setting -------------------------------------------------------------------
    def _window_text(self, live_ms: int) -> str:
        return (f"anarchon_store_options['duplicate_window'] is {self.duplicate_window_s:g} s "
                f"here, but stream {self.stream} remembers claims for {live_ms / 1000:g} s (the "
                "value the other instances use)")

    def _check_window(self, info: dict) -> list[str]:
        """Note whether the live stream's window is this instance's (loss-spec point 5): a
        different one makes claims FORGOTTEN until they agree (see :meth:`_refusal`)."""
        config = info["config"]
        live_ms = int(config.get("duplicate_window", 0)) // 1_000_000
        warnings = []
        if config.get("storage") == "memory":
            warnings.append(f"NATS store {self.safe_url}: stream {self.stream} keeps its claims in "
                            "memory: a server restart forgets them (refused as 'store forgot', "
                            "never sent twice). Re-create it with file storage.")
        self._window_conflict = live_ms if live_ms != self._window_ms else None
        return warnings

    async def _settle_window(self, session, nc, info: dict) -> tuple[dict, list[str]]:
        """At start-up: replace another live window when the stream was not used within this
        instance's window + 2 x 10 s (or never), else ConfigError naming both values."""
        config = info["config"]
        live_ms = int(config.get("duplicate_window", 0)) // 1_000_000
        if live_ms == self._window_ms:
            return info, []
        state = info.get("state") or {}
        used_ms = time_ms(state["last_ts"]) if int(state.get("messages") or 0) else None
        now_ms = await self._bucket_time(session, nc)
        quiet_ms = self._window_ms + 2 * LATENESS_TOLERANCE_MS
        if used_ms is not None and now_ms - used_ms <= quiet_ms:
            raise ConfigError(
                f"NATS store {self.safe_url}: {self._window_text(live_ms)}, last used "
                f"{max(0, now_ms - used_ms) / 1000:.1f} s ago. Use the same duplicate_window on "
                "every instance; to change it, stop every instance using the old value and wait "
                f"{quiet_ms / 1000:g} s (the new duplicate_window + 20 s) before starting them "
                "with the new one.")
        config = dict(config, duplicate_window=self._window_ms * 1_000_000,
                      max_age=MAX_AGE_WINDOWS * self._window_ms * 1_000_000)
        updated = await self._api(session, nc, f"{API}.STREAM.UPDATE.{self.stream}", config)
        self._window_conflict = None
        return dict(info, config=updated.get("config", config)), [
            f"NATS store {self.safe_url}: stream {self.stream} had duplicate_window "
            f"{live_ms / 1000:g} s, unused for more than {quiet_ms / 1000:g} s; replaced by this "
            f"instance's {self.duplicate_window_s:g} s"]

    async def _bucket_time(self, session, nc) -> int:
        """The server's time, ms, from a write to the history bucket (not the claims stream, whose
        last write tells when it was last used)."""
        await self._history.ensure_bucket(session, nc)
        [ack] = await self._history.kv(session, nc, [(f"$KV.{self.bucket}.c.{token(self.instance_id)}",
                                              b"", None)])
        seq = reply_json(ack, self._history.kv_stream)["seq"]
        subject = f"{API}.STREAM.MSG.GET.{self._history.kv_stream}"
        [msg] = await session.pipeline(nc, [(subject, json.dumps({"seq": seq}).encode(), None)])
        stored = stored_message(msg, subject)
        return stored.time_ms if stored is not None else round(self._clock() * 1000)

    # -- the epoch ----------------------------------------------------------------------------
    async def _epoch_marker(self, session, nc, seen, *, first: bool = False) -> Stored:
        """The epoch marker. ``seen``: the marker a claim just read (``None``: missing), or
        ``"read"`` to read it here. A missing marker is written again (the first writer wins);
        ``first`` marks the marker of a stream this instance just created (no change: the
        stream's creation already restarts the memory)."""
        subject = f"{API}.STREAM.MSG.GET.{self.epoch_stream}"
        query = json.dumps({"last_by_subj": self._epoch_subject}).encode()
        if seen == "read":
            await self._ensure(session, nc, self.epoch_stream, self._epoch_config())
            [msg] = await session.pipeline(nc, [(subject, query, None)])
            seen = stored_message(msg, subject)
        if seen is None:
            await self._ensure(session, nc, self.epoch_stream, self._epoch_config())
            body = {"change": not first, "i": self.instance_id,
                    "prev": self._epoch.time_ms if self._epoch is not None else None}
            [ack] = await session.pipeline(nc, [
                (self._epoch_subject, json.dumps(body).encode(),
                 {"Nats-Expected-Last-Subject-Sequence": "0"})])
            try:
                reply_json(ack, self.epoch_stream)
            except ApiError as exc:
                if exc.err_code != WRONG_LAST_SEQUENCE:  # else another instance wrote it first
                    raise
            # read after the ack: on a cluster a pipelined read may overtake the publish
            [msg] = await session.pipeline(nc, [(subject, query, None)])
            seen = stored_message(msg, subject)
            if seen is None:
                raise StoreUnavailable(f"NATS store {self.safe_url}: the epoch marker in stream "
                                       f"{self.epoch_stream} vanished as it was written")
        self._note_epoch(seen)
        return seen

    def _note_epoch(self, marker: Stored) -> None:
        old = self._epoch
        changed = old is not None and (old.seq, old.time_ms) != (marker.seq, marker.time_ms)
        if changed:
            self._seen_before = old.time_ms
        self._epoch = marker
        if changed:
            logger.warning("NATS store %s: %s", self.safe_url, self._epoch_detail(marker))

    def _epoch_start(self) -> int | None:
        """The memory start of the current epoch, server ms; ``None`` when it is not a change."""
        marker = self._epoch
        return marker.time_ms if marker is not None and marker.body.get("change") else None

    def _epoch_detail(self, marker: Stored) -> str:
        prev = marker.body.get("prev")
        if not isinstance(prev, int):
            prev = self._seen_before  # the writer had seen none; this instance had
        was = f"epoch {iso(int(prev))}" if isinstance(prev, int) else "an epoch unknown here"
        return (f"epoch changed ({was} -> epoch {iso(marker.time_ms)}): the epoch marker, kept "
                f"in memory in stream {self.epoch_stream}, was lost, so the servers holding it "
                "restarted and may have lost their newest claims; the store memory restarted at "
                f"{iso(marker.time_ms)}, slots before "
                f"{iso(marker.time_ms + LATENESS_TOLERANCE_MS)} are refused")

    def _warn(self, warnings: list[str]) -> None:
        for text in warnings:
            if text not in self._warned:
                self._warned.add(text)
                logger.warning("%s", text)

    # -- life cycle ---------------------------------------------------------------------------
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
        async def step(session, nc):
            self._ready.discard(self.stream)
            self._ready.discard(self._history.kv_stream)
            try:
                info, warnings = await self._claims_stream(session, nc)
            except Missing:
                raise ConfigError(f"NATS store {self.safe_url}: JetStream does not answer; enable "
                                  "it on the server (nats-server -js, or a jetstream block)") from None
            info, more = await self._settle_window(session, nc, info)
            warnings += more
            info, more = await self._replicated(session, nc, info)
            warnings += more
            epoch = await self._ensure(session, nc, self.epoch_stream, self._epoch_config())
            warnings += (await self._replicated(session, nc, epoch))[1]
            await self._history.ensure_bucket(session, nc)
            kv = await self._api(session, nc, f"{API}.STREAM.INFO.{self._history.kv_stream}")
            warnings += (await self._replicated(session, nc, kv))[1]
            warnings += self._topology_warnings(nc, info)
            await self._probe(session, nc)
            return warnings
        warnings = self._call("prepare", step)
        self._warned.update(warnings)
        return warnings

    def now_ms(self) -> int:
        """The server's time, UTC ms: the timestamp of a message just stored (also measures this
        instance's skew)."""
        return self._call("read the server's clock", self._probe)

    async def _probe(self, session, nc) -> int:
        """Store a message on this instance's clock subject and read its server time back."""
        for attempt in (1, 2, 3):
            t0 = self._clock()
            [ack] = await session.pipeline(nc, [(self._clock_subject, b"", None)])
            t1 = self._clock()
            try:
                seq = reply_json(ack, self.stream)["seq"]
            except Missing:
                if attempt == 3:
                    raise
                await asyncio.sleep(0.1 * attempt)  # a stream between leaders answers nothing
                await self._claims_stream(session, nc)
                continue
            [stored] = await self._get(session, nc, [{"seq": seq}])
            if stored is not None:  # else replaced by a concurrent probe of this instance
                return self._measured(stored, t0, t1)
        raise StoreUnavailable(f"NATS store {self.safe_url}: the clock message vanished")

    def _measured(self, stored: Stored, t0: float, t1: float) -> int:
        """Record the skew from a clock message stored between local times t0 and t1 (s)."""
        offset = (t0 + t1) * 500 - stored.time_ms
        self._skew = _Skew(offset, (t1 - t0) * 500 + 1, self._clock(), time.monotonic())
        return stored.time_ms

    async def _get(self, session, nc, queries: list[dict]) -> list[Stored | None]:
        """Messages of the claims stream, each by ``{"seq": n}`` or ``{"last_by_subj": s}``."""
        subject = f"{API}.STREAM.MSG.GET.{self.stream}"
        replies = await session.pipeline(nc, [(subject, json.dumps(q).encode(), None) for q in queries])
        return [stored_message(msg, subject) for msg in replies]

    # -- claims -------------------------------------------------------------------------------
    def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimResult]:
        """Claim the batch (module docstring: publish, read winners back, record history).

        :raises StoreUnavailable: the outcome is unknown; a retry recognises this instance's wins.
        """
        if not requests:
            return []
        return self._call("claim", self._claim, list(requests))

    async def _claim(self, session, nc, requests: list[ClaimRequest]) -> list[ClaimResult]:
        if self.stream not in self._ready:
            self._warn((await self._claims_stream(session, nc))[1])
        try:
            return await self._claim_once(session, nc, requests)
        except Missing:  # the stream was deleted: create it again (its memory begins now)
            self._ready.discard(self.stream)
            self._warn((await self._claims_stream(session, nc))[1])
            return await self._claim_once(session, nc, requests)

    def _refusal(self, r: ClaimRequest, local_ms: float) -> tuple[Outcome, str] | None:
        """Refuse before publishing: another live duplicate_window, this instance's clock too far
        from the server's, a slot more than 10 s ahead of the server's clock, or one older than
        the window on the server's clock (module docstring, "Clock skew", "Memory")."""
        if self._window_conflict is not None:
            return (Outcome.FORGOTTEN, self._window_text(self._window_conflict)
                    + ": not claimed (a possible miss); use one duplicate_window on every instance")
        skew = self._skew
        bound = (self._window_ms - r.max_late_ms) / 2
        off = skew.offset_ms
        if abs(off) + skew.uncertainty_ms > bound:
            return (Outcome.EARLY if off > 0 else Outcome.LATE,
                    f"this instance's clock is {abs(off) / 1000:.3f} s "
                    f"{'ahead of' if off > 0 else 'behind'} the NATS server's (+/- "
                    f"{skew.uncertainty_ms / 1000:.3f} s), more than the {max(bound, 0) / 1000:g} s "
                    f"allowed = (duplicate_window {self._window_ms / 1000:g} s - max_late "
                    f"{r.max_late_ms / 1000:g} s) / 2: a claim this far off could come after the "
                    "window closed. Run NTP on every host.")
        server_ms = local_ms - off
        if r.slot_ms - server_ms > LATENESS_TOLERANCE_MS - skew.uncertainty_ms:
            return (Outcome.EARLY, f"the slot is {(r.slot_ms - server_ms) / 1000:.3f} s ahead of "
                                   "the NATS server's clock (more than the 10 s allowed: a claim "
                                   "taken before a server restart must be for a slot the epoch "
                                   "change refuses)")
        if server_ms - r.slot_ms >= self._window_ms:
            return (Outcome.FORGOTTEN, f"the slot is older than the stream's duplicate_window "
                                       f"({self._window_ms / 1000:g} s) on the server's clock")
        return None

    async def _fresh_skew(self, session, nc) -> bool:
        """Measure the skew first if unknown, stale or the local clock jumped; True when the
        claim should measure it again on the way (older than SKEW_REFRESH_S)."""
        skew, mono = self._skew, time.monotonic()
        if skew is None or mono - skew.mono_s > SKEW_MAX_AGE_S \
                or abs((self._clock() - skew.wall_s) - (mono - skew.mono_s)) > CLOCK_JUMP_S:
            await self._probe(session, nc)
            return False
        return mono - skew.mono_s > SKEW_REFRESH_S

    async def _claim_once(self, session, nc, requests: list[ClaimRequest]) -> list[ClaimResult]:
        reprobe = await self._fresh_skew(session, nc)
        local_ms = self._clock() * 1000
        refusals = [self._refusal(r, local_ms) for r in requests]
        get = f"{API}.STREAM.MSG.GET.{self.stream}"
        # round 1: publish every claim (a refused one only looks up its run), then the stream info
        round1 = []
        for r, refusal in zip(requests, refusals):
            subject = self._run_subject(r.entry, r.slot_ms)
            if refusal is None:
                body = {"i": self.instance_id, "f": r.fingerprint, "k": r.task_id, "e": r.entry,
                        "s": int(r.slot_ms), "l": int(r.max_late_ms)}
                round1.append((subject, json.dumps(body).encode(),
                               {"Nats-Msg-Id": f"{token(r.entry)}.{int(r.slot_ms)}"}))
            else:
                round1.append((get, json.dumps({"last_by_subj": subject}).encode(), None))
        if reprobe:
            round1.append((self._clock_subject, b"", None))
        round1.append((f"{API}.STREAM.INFO.{self.stream}", b"", None))
        epoch_get = f"{API}.STREAM.MSG.GET.{self.epoch_stream}"
        round1.append((epoch_get, json.dumps({"last_by_subj": self._epoch_subject}).encode(), None))
        t0 = self._clock()
        replies = await session.pipeline(nc, round1)
        t1 = self._clock()
        info = reply_json(replies[-2], self.stream)   # Missing when the stream was deleted
        self._created_ms = time_ms(info["created"])
        window_before = self._window_conflict
        self._warn(self._check_window(info))
        # the epoch, read after the publishes on this connection (module docstring)
        marker = stored_message(replies[-1], epoch_get)
        if marker is None:
            marker = await self._epoch_marker(session, nc, None)
        else:
            self._note_epoch(marker)
        epoch_ms = self._epoch_start()
        window_changed = window_before is None and self._window_conflict is not None
        if window_changed:
            logger.error("NATS store %s: %s; claims are refused as 'forgotten' until every "
                         "instance uses one duplicate_window", self.safe_url,
                         self._window_text(self._window_conflict))
        created = self._created_ms
        # round 2: who won the duplicates, the clock, the memory start of a young stream
        found: dict[int, Stored | None] = {}
        queries, owners = [], []
        for i, (r, refusal) in enumerate(zip(requests, refusals)):
            if refusal is not None:
                found[i] = stored_message(replies[i], get)
                continue
            ack = reply_json(replies[i], self.stream)
            if ack.get("duplicate"):
                queries.append({"seq": int(ack["seq"])})
                owners.append(i)
        if reprobe:
            queries.append({"seq": int(reply_json(replies[len(requests)], self.stream)["seq"])})
            owners.append("clock")
        young = sorted({r.entry for r in requests if r.slot_ms < created + LATENESS_TOLERANCE_MS
                        and (created, r.entry) not in self._born_cache})
        for entry in young:
            queries.append({"last_by_subj": self._born_subject(entry)})
            owners.append(("born", entry))
        born = {}
        for owner, stored in zip(owners, await self._get(session, nc, queries) if queries else []):
            if owner == "clock":
                if stored is not None:
                    self._measured(stored, t0, t1)
            elif isinstance(owner, tuple):
                born[owner[1]] = int(stored.body.get("born_ms", created)) if stored else created
                self._born_cache[(created, owner[1])] = born[owner[1]]
            else:
                found[owner] = stored
        store_ms = round(t1 * 1000 - self._skew.offset_ms)
        results, writes = [], []
        for i, (r, refusal) in enumerate(zip(requests, refusals)):
            if refusal is None and window_changed:
                refusal = (Outcome.FORGOTTEN, self._window_text(self._window_conflict)
                           + ": the window changed under this instance; not sent (a possible "
                           "miss)")
                if i not in found:
                    found[i] = None  # published, but the verdict is the refusal
            outcome, winner, fp, detail = self._judge(
                r, refusal, i in found, found.get(i),
                self._born_cache.get((created, r.entry), born.get(r.entry, created)), epoch_ms)
            results.append(ClaimResult(request=r, outcome=outcome, winner=winner,
                                       winner_fingerprint=fp, store_ms=store_ms, detail=detail))
            if outcome is Outcome.WON:
                # a fresh win writes its record; a recognised retry only fills a missing one
                writes.append((r.entry, r.slot_ms, RunEvent.CLAIMED, r.task_id, 1, "", i in found))
            elif outcome.is_skip:
                writes.append((r.entry, r.slot_ms, RunEvent.for_skip(outcome), r.task_id, 1, detail, True))
        if writes:
            await self._history.write(session, nc, writes)
        return results

    def _judge(self, r: ClaimRequest, refusal, looked: bool, stored: Stored | None,
               born: int, epoch_ms: int | None = None) -> tuple[Outcome, str | None, str, str]:
        """The outcome of one run: (outcome, winner, winner's fingerprint, detail). The verdict
        depends only on the stored claim message and the stream, so every instance (and a
        retry) reads a run the same way.

        :param looked: the run's stored claim was read (a duplicate, or a refused claim's lookup);
            otherwise this instance's publish was the first.
        :param born: the entry's memory start; ``epoch_ms``: the current epoch's, when it began
            with a change (server ms).
        """
        if stored is not None and (stored.body.get("e"), stored.body.get("s")) != (r.entry, r.slot_ms):
            stored = None  # not this run's claim
        if looked and stored is None:
            if refusal is not None:  # not claimed: the refusal stands
                return refusal[0], None, "", refusal[1]
            return (Outcome.UNKNOWN, None, "",
                    "claimed before, but the claim message could not be read back")
        if epoch_ms is not None and epoch_ms > born and r.slot_ms < epoch_ms + LATENESS_TOLERANCE_MS:
            return Outcome.FORGOTTEN, None, "", self._epoch_detail(self._epoch)
        if r.slot_ms < born + LATENESS_TOLERANCE_MS:
            return (Outcome.FORGOTTEN, None, "",
                    f"store memory began at {iso(born)} (when stream {self.stream} was created); "
                    f"slots before {iso(born + LATENESS_TOLERANCE_MS)} are refused")
        if not looked:
            return Outcome.WON, self.instance_id, r.fingerprint, ""
        winner, fingerprint = str(stored.body.get("i")), str(stored.body.get("f", ""))
        return (Outcome.WON if winner == self.instance_id else Outcome.OTHER_WON), winner, fingerprint, ""

    # -- history and definitions (:class:`~.history.NATSHistory`) ----------------------------
    def record(self, entry: str, slot_ms: int, event: RunEvent, *, task_id: str = "",
               attempt: int = 1, detail: str = "") -> None:
        self._history.record(entry, slot_ms, event, task_id=task_id, attempt=attempt, detail=detail)

    def record_many(self, notes: Sequence[HistoryRecord]) -> None:
        self._history.record_many(notes)

    def history(self, entry: str, limit: int | None = None) -> list[HistoryRecord]:
        return self._history.history(entry, limit)

    def save_definition(self, entry: str, fingerprint: str, text: str) -> None:
        self._history.save_definition(entry, fingerprint, text)

    def load_definition(self, entry: str, fingerprint: str) -> str | None:
        return self._history.load_definition(entry, fingerprint)
