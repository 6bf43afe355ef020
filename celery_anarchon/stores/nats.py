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
publishes, then the stream's info; 2. reading back the winners of duplicates (with the clock probe
and a young stream's memory start when due); 3. the history writes. Won: rounds 1 and 3; lost: 1, 2.

**Memory.** A message id is remembered for ``duplicate_window`` after its first publish; after it
the run can be won again (hence the start-up rule jitter + max_late < duplicate_window). The
window is set when the stream is created. A live stream with a longer window is kept, with a
warning naming both: lowering it would make the server forget message ids that instances with the
longer setting count on, so a late claim could win a run twice. A shorter live window is raised
(``max_age`` with it, never lowered) at start-up and whenever a claim finds it lowered: a longer
window forgets nothing sooner. To lower it, delete the stream (see Amnesia) or update it by hand
once every instance runs the new setting.

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

**Amnesia.** The memory began when the claims stream was created (its ``created`` time, on the
server's clock): a stream deleted and created again has forgotten every message id, so a slot
older than ``created + 10 s`` is FORGOTTEN. The stream's info is requested in the same round as
the publishes and after them on the same connection, so it describes the stream that took them (or
a newer one). The verdict depends only on the stored message and the stream, so every instance,
and a retry, reads a run the same way. JetStream file storage does not fsync every message by
default: a crash (not a clean restart) can lose the last claims while the stream survives; set
``jetstream { sync_interval: always }`` where that must not happen.

History and definitions: :mod:`celery_anarchon.stores.nats_history`. The event loop thread and the
names: :mod:`celery_anarchon.stores.nats_io`.

URLs: ``nats://[user:password@|token@]host[:port]`` or ``tls://...``, several separated by commas;
credentials go to nats-py with the URL. TLS uses nats-py's own options, as store options ``tls``
(an ``ssl.SSLContext``), ``tls_hostname`` and ``tls_handshake_first``; ``user_credentials`` and
``nkeys_seed`` are nats-py's too. A ``tls://`` URL refuses an unencrypted connection.
"""
from __future__ import annotations

import dataclasses
import json
import math
import ssl
import threading
import time
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta, timezone
from urllib.parse import urlsplit, urlunsplit

from celery_anarchon.errors import ConfigError, StoreUnavailable
from celery_anarchon.stores import mask_url, reject_unknown_options
from celery_anarchon.stores.base import (
    DEFAULT_CLAIM_TIMEOUT_S, DEFAULT_HISTORY_SIZE, LATENESS_TOLERANCE_MS, ClaimRequest, ClaimResult,
    Memory, Outcome, RunEvent, Store,
)
from celery_anarchon.stores.nats_history import HistoryOps
from celery_anarchon.stores.nats_io import (
    API, STREAM_NAME_IN_USE, STREAM_NOT_FOUND, ApiError, Missing, Session, Stored, discard, logger,
    reply_json, stored_message, time_ms, token, uses_tls,
)

#: Options of ``anarchon_store_options`` this store understands (besides the common ones).
OPTIONS = frozenset({"duplicate_window", "tls", "tls_hostname", "tls_handshake_first",
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


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")


@dataclasses.dataclass(frozen=True)
class _Skew:
    """This instance's clock minus the server's, ms, measured at ``wall_s`` / ``mono_s``."""

    offset_ms: float
    uncertainty_ms: float
    wall_s: float
    mono_s: float


class NATSStore(HistoryOps, Store):
    """NATS JetStream: the first publish of a run's message id wins (module docstring).

    :param duplicate_window: seconds a claimed run is remembered (default 300, at least 0.1).
    :param history_size: runs of history kept per entry (default 100).
    :param claim_timeout: seconds one operation may take, connecting included (default 5).
    :param tls: an ``ssl.SSLContext`` for ``tls://`` servers (nats-py's ``tls``).
    :param tls_hostname: the name to check the server's certificate against.
    :param tls_handshake_first: TLS before the server's INFO (servers configured for it).
    :param user_credentials: a NATS ``.creds`` file (nats-py's ``user_credentials``).
    :param nkeys_seed: an NKey seed file (nats-py's ``nkeys_seed``).
    """

    kind = "nats"
    checks_lateness = False
    holds_leases = False
    recognises_winner = True

    def __init__(self, url: str, *, namespace: str, instance_id: str, **options) -> None:
        reject_unknown_options(self.kind, options, OPTIONS)
        self.duplicate_window_s = _window(options.get("duplicate_window", DEFAULT_DUPLICATE_WINDOW_S))
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
        self._session_lock = threading.Lock()
        self._session: Session | None = None
        self._clock = time.time  # this instance's wall clock, seconds; tests skew it
        self._skew: _Skew | None = None
        self._created_ms: int | None = None  # the claims stream's creation, server ms
        self._ready: set[str] = set()        # streams known to exist (re-checked when missing)
        self._warned: set[str] = set()
        self._unpurged: dict[str, int] = {}  # entry -> history writes since this store trimmed it

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
        try:
            return session.run(work, self.claim_timeout)
        except (StoreUnavailable, ConfigError):
            raise
        except TimeoutError as exc:
            raise StoreUnavailable(f"NATS store {self.safe_url}: {doing}: no answer within "
                                   f"{self.claim_timeout:g} s") from exc
        except Missing as exc:
            raise StoreUnavailable(f"NATS store {self.safe_url}: {doing}: nobody answered on "
                                   f"{exc} (is JetStream enabled?)") from exc
        except Exception as exc:  # nats-py errors, OSError, API errors, bad replies
            raise StoreUnavailable(f"NATS store {self.safe_url}: {doing} failed: "
                                   f"{type(exc).__name__}: {exc}") from exc

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
        """The stream's info, creating it when absent (identical concurrent creations succeed)."""
        try:
            return await self._api(session, nc, f"{API}.STREAM.INFO.{name}")
        except ApiError as exc:
            if exc.err_code != STREAM_NOT_FOUND:
                raise
        try:
            await self._api(session, nc, f"{API}.STREAM.CREATE.{name}", config)
        except ApiError as exc:
            if exc.err_code != STREAM_NAME_IN_USE:
                raise
        return await self._api(session, nc, f"{API}.STREAM.INFO.{name}")

    def _claims_config(self) -> dict:
        return {"name": self.stream, "subjects": [f"{self._root}.>"], "retention": "limits",
                "storage": "file", "discard": "old", "max_msgs_per_subject": 1, "max_msgs": -1,
                "max_bytes": -1, "max_msg_size": -1, "max_consumers": -1, "num_replicas": 1,
                "duplicate_window": self._window_ms * 1_000_000,
                "max_age": MAX_AGE_WINDOWS * self._window_ms * 1_000_000}

    async def _claims_stream(self, session, nc) -> tuple[dict, list[str]]:
        info = await self._ensure(session, nc, self.stream, self._claims_config())
        warnings = await self._check_window(session, nc, info)
        self._ready.add(self.stream)
        return info, warnings

    async def _check_window(self, session, nc, info: dict) -> list[str]:
        """Keep a longer live window (warn), raise a shorter one (never lower it: that would let
        the server forget message ids that other instances count on)."""
        config = info["config"]
        live_ms = int(config.get("duplicate_window", 0)) // 1_000_000
        self._created_ms = time_ms(info["created"])
        warnings = []
        if config.get("storage") == "memory":
            warnings.append(f"NATS store {self.safe_url}: stream {self.stream} keeps its claims in "
                            "memory: a server restart forgets them (refused as 'store forgot', "
                            "never sent twice). Re-create it with file storage.")
        if live_ms > self._window_ms:
            warnings.append(f"NATS store {self.safe_url}: stream {self.stream} has duplicate_window "
                            f"{live_ms / 1000:g} s, longer than this instance's duplicate_window "
                            f"{self.duplicate_window_s:g} s; kept (lowering it could let a run be "
                            "claimed twice)")
        elif live_ms < self._window_ms:
            config = dict(config, duplicate_window=self._window_ms * 1_000_000)
            max_age = int(config.get("max_age", 0))
            if max_age:
                config["max_age"] = max(max_age, MAX_AGE_WINDOWS * self._window_ms * 1_000_000)
            await self._api(session, nc, f"{API}.STREAM.UPDATE.{self.stream}", config)
            warnings.append(f"NATS store {self.safe_url}: stream {self.stream} had duplicate_window "
                            f"{live_ms / 1000:g} s, shorter than this instance's duplicate_window "
                            f"{self.duplicate_window_s:g} s; raised to {self.duplicate_window_s:g} s")
        return warnings

    def _warn(self, warnings: list[str]) -> None:
        for text in warnings:
            if text not in self._warned:
                self._warned.add(text)
                logger.warning("%s", text)

    # -- life cycle ---------------------------------------------------------------------------
    def prepare(self, entries: Iterable[str]) -> list[str]:
        """Connect, create the claims stream (its creation time is when the memory began, for
        every entry) and the history bucket, and measure the skew.

        :returns: warnings (a live stream whose duplicate_window differs, memory storage).
        :raises ConfigError: JetStream is not enabled, or TLS was asked for and not offered.
        """
        async def step(session, nc):
            try:
                _, warnings = await self._claims_stream(session, nc)
            except Missing:
                raise ConfigError(f"NATS store {self.safe_url}: JetStream does not answer; enable "
                                  "it on the server (nats-server -js, or a jetstream block)") from None
            await self._bucket(session, nc)
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
        """Refuse before publishing: this instance's clock too far from the server's, or a slot
        older than the window on the server's clock (module docstring, "Clock skew")."""
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
        if local_ms - off - r.slot_ms >= self._window_ms:
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
        t0 = self._clock()
        replies = await session.pipeline(nc, round1)
        t1 = self._clock()
        info = reply_json(replies[-1], self.stream)   # Missing when the stream was deleted
        self._warn(await self._check_window(session, nc, info))
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
        young = sorted({r.entry for r in requests if r.slot_ms < created + LATENESS_TOLERANCE_MS})
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
            else:
                found[owner] = stored
        store_ms = round(t1 * 1000 - self._skew.offset_ms)
        results, writes = [], []
        for i, (r, refusal) in enumerate(zip(requests, refusals)):
            outcome, winner, fp, detail = self._judge(
                r, refusal, i in found, found.get(i), born.get(r.entry, created))
            results.append(ClaimResult(request=r, outcome=outcome, winner=winner,
                                       winner_fingerprint=fp, store_ms=store_ms, detail=detail))
            if outcome is Outcome.WON:
                # a fresh win writes its record; a recognised retry only fills a missing one
                writes.append((r.entry, r.slot_ms, RunEvent.CLAIMED, r.task_id, 1, "", i in found))
            elif outcome.is_skip:
                writes.append((r.entry, r.slot_ms, RunEvent.for_skip(outcome), r.task_id, 1, detail, True))
        if writes:
            await self._write_history(session, nc, writes)
        return results

    def _judge(self, r: ClaimRequest, refusal, looked: bool, stored: Stored | None,
               born: int) -> tuple[Outcome, str | None, str, str]:
        """The outcome of one run: (outcome, winner, winner's fingerprint, detail). The verdict
        depends only on the stored claim message and the stream, so every instance (and a
        retry) reads a run the same way.

        :param looked: the run's stored claim was read (a duplicate, or a refused claim's lookup);
            otherwise this instance's publish was the first.
        """
        if stored is not None and (stored.body.get("e"), stored.body.get("s")) != (r.entry, r.slot_ms):
            stored = None  # not this run's claim
        if looked and stored is None:
            if refusal is not None:  # not claimed: the refusal stands
                return refusal[0], None, "", refusal[1]
            return (Outcome.UNKNOWN, None, "",
                    "claimed before, but the claim message could not be read back")
        if r.slot_ms < born + LATENESS_TOLERANCE_MS:
            return (Outcome.FORGOTTEN, None, "",
                    f"store memory began at {_iso(born)} (when stream {self.stream} was created); "
                    f"slots before {_iso(born + LATENESS_TOLERANCE_MS)} are refused")
        if not looked:
            return Outcome.WON, self.instance_id, r.fingerprint, ""
        winner, fingerprint = str(stored.body.get("i")), str(stored.body.get("f", ""))
        return (Outcome.WON if winner == self.instance_id else Outcome.LOST), winner, fingerprint, ""

    # -- tests ----------------------------------------------------------------------------------
    def _forget_everything(self) -> None:
        """Tests only: delete every stream and bucket of this store kind, in every namespace."""
        async def step(session, nc):
            names, offset = [], 0
            while True:
                page = await self._api(session, nc, f"{API}.STREAM.NAMES", {"offset": offset})
                names += page.get("streams") or []
                offset += len(page.get("streams") or [])
                if not page.get("streams") or offset >= int(page.get("total", 0)):
                    break
            ours = [n for n in names if n.startswith(("ANARCHON_", "KV_ANARCHON_"))]
            for msg in await session.pipeline(nc, [(f"{API}.STREAM.DELETE.{n}", b"", None) for n in ours]):
                with_error = json.loads(msg.data or b"{}").get("error")
                if with_error and with_error.get("err_code") != STREAM_NOT_FOUND:
                    raise ApiError("STREAM.DELETE", with_error)
        self._call("forget everything", step)
        self._ready.clear()

    def _backdate_memory_start(self, entries: Iterable[str], by_ms: int) -> None:
        """Tests only: the memory of ``entries`` began ``by_ms`` earlier than the stream's
        creation (or than a previous backdating). Kept as a message in the claims stream, so it
        is lost with the stream."""
        entries = list(dict.fromkeys(entries))

        async def step(session, nc):
            info, _ = await self._claims_stream(session, nc)
            created = time_ms(info["created"])
            now = await self._get(session, nc, [{"last_by_subj": self._born_subject(e)} for e in entries])
            born = [int(s.body.get("born_ms", created)) if s else created for s in now]
            acks = await session.pipeline(nc, [
                (self._born_subject(e), json.dumps({"born_ms": b - int(by_ms)}).encode(), None)
                for e, b in zip(entries, born)])
            for ack in acks:
                reply_json(ack, self.stream)
        if entries:
            self._call("backdate memory start", step)
