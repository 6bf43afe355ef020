"""The connection layer of the NATS store: a private event loop thread, pipelined requests, names.

nats-py is asyncio-only; Celery's beat is not. Each :class:`~celery_anarchon.stores.nats.NATSStore`
object owns one :class:`Session` per process: an event loop on a daemon thread of its own, started
on first use, with one nats-py client on it. The store's synchronous methods hand coroutines to
that loop and wait for them at most ``claim_timeout`` seconds (:meth:`Session.run`); nothing async
leaves this module. After a fork the child never touches the parent's loop, thread or sockets: it
leaves them alone (closing them would act on kernel objects shared with the parent, e.g. the epoll
set) and starts a session of its own.

Requests are pipelined: :meth:`Session.pipeline` publishes every request of a round, in order, on
one connection, each with its own reply subject under one inbox subscription, then waits for all
the replies. The server reads a connection in order, so a request sent after a publish is handled
after that publish was routed to its stream (the claim relies on it: see :mod:`.claims`).
"""
from __future__ import annotations

import asyncio
import base64
import calendar
import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging
import os
import re
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import nats
import nats.aio.client

logger = logging.getLogger("celery_anarchon.stores.nats")

#: Sessions left behind by a fork: never closed in the child (that would disturb the parent's
#: connection and event loop, whose kernel objects the child shares), never garbage collected.
_ORPHANS: list[Session] = []

#: bytes kept as they are in a subject token, a KV key token or a stream name; the rest is
#: written ``_XX`` (hex of each UTF-8 byte), so the escape is injective and leaves no ``.``,
#: ``*``, ``>``, white space or non-ASCII in a name
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-")
#: longer escaped names are cut and completed with a hash (``_ZZ`` never comes out of the escape)
_MAX_TOKEN = 96

_TIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")


def token(name: str) -> str:
    """``name`` as one token of a NATS subject, KV key or stream name, injectively.

    ``[A-Za-z0-9-]`` stay; every other byte of the UTF-8 text becomes ``_XX``; the empty name is
    ``_``. Past 96 characters the token is cut and ends with ``_ZZ`` and 32 hex digits of its
    SHA-256, so subjects stay short; no plain token contains ``_Z``.
    """
    raw = name.encode("utf-8", "surrogatepass")
    out = "".join(chr(b) if b in _SAFE else f"_{b:02X}" for b in raw) or "_"
    if len(out) > _MAX_TOKEN:
        out = out[:_MAX_TOKEN - 35] + "_ZZ" + hashlib.sha256(raw).hexdigest()[:32]
    return out


@dataclasses.dataclass(frozen=True)
class Names:
    """The streams and subjects of one store (namespace and instance escaped by :func:`token`).

    :param stream: the claims stream ``ANARCHON_CLAIMS_<ns>``, over ``<root>.>``.
    :param bucket: the history bucket ``ANARCHON_HISTORY_<ns>``.
    :param root: ``anarchon.claims.<ns>``: runs, memory starts (``born``) and clock probes.
    :param clock_subject: this instance's clock probe subject ``<root>.clock.<instance>``.
    :param epoch_stream: the epoch stream ``ANARCHON_EPOCH_<ns>``, over ``epoch_subject``.
    :param instances_stream: the instance records ``ANARCHON_INSTANCES_<ns>``, over
        ``instances_root.>`` (:mod:`.instances`).
    :param fingerprints_stream: the fingerprint mappings ``ANARCHON_FINGERPRINTS_<ns>``, over
        ``fingerprints_root.>``.
    """

    stream: str
    bucket: str
    root: str
    clock_subject: str
    epoch_stream: str
    epoch_subject: str
    instances_stream: str = ""
    instances_root: str = ""
    fingerprints_stream: str = ""
    fingerprints_root: str = ""

    @classmethod
    def of(cls, namespace: str, instance_id: str) -> Names:
        """The names of ``namespace``'s streams and ``instance_id``'s clock subject."""
        ns = token(namespace)
        root = f"anarchon.claims.{ns}"
        return cls(stream=f"ANARCHON_CLAIMS_{ns}", bucket=f"ANARCHON_HISTORY_{ns}", root=root,
                   clock_subject=f"{root}.clock.{token(instance_id)}",
                   epoch_stream=f"ANARCHON_EPOCH_{ns}", epoch_subject=f"anarchon.epoch.{ns}",
                   instances_stream=f"ANARCHON_INSTANCES_{ns}",
                   instances_root=f"anarchon.instances.{ns}",
                   fingerprints_stream=f"ANARCHON_FINGERPRINTS_{ns}",
                   fingerprints_root=f"anarchon.fingerprints.{ns}")

    def run_subject(self, entry: str, slot_ms: int) -> str:
        """The subject a claim of (entry, slot) is published to."""
        return f"{self.root}.run.{token(entry)}.{int(slot_ms)}"

    def born_subject(self, entry: str) -> str:
        """The subject of an entry's memory start when it differs from the stream's creation."""
        return f"{self.root}.born.{token(entry)}"


def time_ms(text: str) -> int:
    """An RFC 3339 time of the server (``2026-01-02T03:04:05.123456789Z``) as UTC ms."""
    m = _TIME.match(text)
    if not m:
        raise ValueError(f"not a server time: {text!r}")
    seconds = calendar.timegm(tuple(int(g) for g in m.groups()[:6]) + (0, 0, 0))
    zone = m.group(8)
    if zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        seconds -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    return seconds * 1000 + int((m.group(7) or "0")[:3].ljust(3, "0"))


def status_of(msg) -> str:
    """The status of a reply (``"503"``: no responders), ``""`` for a plain message."""
    headers = msg.headers or {}
    return str(headers.get("Status", ""))


class Missing(Exception):
    """Nobody answered a request (NATS status 503): the stream, bucket or JetStream is absent."""


class ApiError(Exception):
    """A JetStream API error reply. ``code`` (HTTP-like), ``err_code`` (JetStream's own)."""

    def __init__(self, subject: str, error: dict) -> None:
        self.code = int(error.get("code", 0))
        self.err_code = int(error.get("err_code", 0))
        self.description = str(error.get("description", ""))
        super().__init__(f"{subject}: {self.description} (code {self.code}, err_code {self.err_code})")


#: the JetStream API's subject prefix
API = "$JS.API"
#: JetStream err_codes this store tells apart
STREAM_NOT_FOUND = 10059
STREAM_NAME_IN_USE = 10058
NO_MESSAGE_FOUND = 10037
WRONG_LAST_SEQUENCE = 10071


def reply_json(msg, subject: str) -> dict:
    """The JSON body of a JetStream reply.

    :raises Missing: nobody answered (no stream listens there, or JetStream is off).
    :raises ApiError: the reply is an API error.
    """
    if status_of(msg) == "503":
        raise Missing(subject)
    data = json.loads(msg.data or b"{}")
    if isinstance(data.get("error"), dict):
        raise ApiError(subject, data["error"])
    return data


@dataclasses.dataclass(frozen=True)
class Stored:
    """A message as the stream stored it: its JSON body, sequence and server time (UTC ms)."""

    body: dict
    seq: int
    time_ms: int


def stored_message(msg, subject: str) -> Stored | None:
    """The message of a ``STREAM.MSG.GET`` reply, ``None`` when there is none."""
    try:
        data = reply_json(msg, subject)["message"]
    except ApiError as exc:
        if exc.err_code == NO_MESSAGE_FOUND or exc.code == 404:
            return None
        raise
    try:
        body = json.loads(base64.b64decode(data.get("data") or b"") or b"{}")
    except ValueError:
        body = {}
    return Stored(body if isinstance(body, dict) else {}, int(data["seq"]), time_ms(data["time"]))


class _ConnectFailed(Exception):
    """Every server of the URL refused the first connection (raised out of nats-py's loop)."""


class Session:
    """One process's event loop thread and nats-py client for one store object."""

    def __init__(self, name: str) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()
        self.nc: nats.aio.client.Client | None = None
        self.inbox = ""
        self.waiting: dict[str, asyncio.Future] = {}
        self.counter = itertools.count(1)
        self._connecting: asyncio.Lock | None = None

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @property
    def forked(self) -> bool:
        """True in a child process: this session belongs to the parent."""
        return self.pid != os.getpid()

    def run(self, make: Callable[[], Awaitable[Any]], timeout: float) -> Any:
        """Run ``make()`` on the loop and wait for it at most ``timeout`` seconds.

        :raises TimeoutError: no result in time (the coroutine is cancelled).
        """
        async def bounded():
            return await asyncio.wait_for(make(), timeout)
        future = asyncio.run_coroutine_threadsafe(bounded(), self.loop)
        try:
            return future.result(timeout + 1.0)
        except TimeoutError:
            future.cancel()
            raise

    async def client(self, servers: list[str], options: dict) -> nats.aio.client.Client:
        """The connected client, connecting on first use (and after nats-py gave up on one).

        The first connection fails as soon as every server of ``servers`` refused it once; once
        connected, nats-py reconnects on its own (requests meanwhile time out).
        """
        if self.nc is not None and not self.nc.is_closed:
            return self.nc
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self.nc is not None and not self.nc.is_closed:
                return self.nc
            failures: list[BaseException] = []
            connected = False

            async def error_cb(exc):
                if connected:  # reconnecting: failed attempts are expected; the rest is news
                    level = logging.DEBUG if isinstance(exc, (OSError, asyncio.TimeoutError)) \
                        else logging.WARNING
                    logger.log(level, "NATS store: %s: %s", type(exc).__name__, exc)
                    return
                failures.append(exc)
                if len(failures) >= len(servers):
                    raise _ConnectFailed(f"{type(exc).__name__}: {exc}")

            async def disconnected_cb():
                logger.info("NATS store: disconnected; nats-py reconnects")

            nc = nats.aio.client.Client()
            try:
                await nc.connect(servers=servers, error_cb=error_cb, disconnected_cb=disconnected_cb,
                                 allow_reconnect=True, max_reconnect_attempts=-1,
                                 reconnect_time_wait=0.5, **options)
                connected = True
                self.inbox = nc.new_inbox()
                await nc.subscribe(self.inbox + ".*", cb=self._on_reply)
            except BaseException:
                discard(nc)
                raise
            self.nc = nc
            return nc

    async def _on_reply(self, msg) -> None:
        future = self.waiting.pop(msg.subject, None)
        if future is not None and not future.done():
            future.set_result(msg)

    async def pipeline(self, nc, requests: list[tuple[str, bytes, dict | None]]) -> list:
        """Publish ``(subject, payload, headers)`` requests in this order, then wait for every
        reply (nats-py ``Msg``), returned in the same order."""
        loop = asyncio.get_running_loop()
        pending: list[tuple[str, asyncio.Future]] = []
        try:
            for subject, payload, headers in requests:
                reply = f"{self.inbox}.{next(self.counter)}"
                future = loop.create_future()
                self.waiting[reply] = future
                pending.append((reply, future))
                await nc.publish(subject, payload, reply=reply, headers=headers)
            return list(await asyncio.gather(*(f for _, f in pending)))
        finally:
            for reply, _ in pending:
                self.waiting.pop(reply, None)

    async def api(self, nc, subject: str, body: dict | None = None) -> dict:
        """One JetStream API request (``body`` sent as JSON); its JSON reply.

        :raises Missing: nobody answered. :raises ApiError: the reply is an API error.
        """
        payload = b"" if body is None else json.dumps(body).encode()
        [msg] = await self.pipeline(nc, [(subject, payload, None)])
        return reply_json(msg, subject)

    async def get(self, nc, stream: str, queries: list[dict]) -> list[Stored | None]:
        """Messages of ``stream`` in one round, each by ``{"seq": n}`` or ``{"last_by_subj": s}``
        (``None`` where there is none)."""
        subject = f"{API}.STREAM.MSG.GET.{stream}"
        replies = await self.pipeline(nc, [(subject, json.dumps(q).encode(), None) for q in queries])
        return [stored_message(msg, subject) for msg in replies]

    def shutdown(self, timeout: float = 1.0) -> None:
        """Close the client and stop the loop thread (this process's session only)."""
        if self.forked:
            _ORPHANS.append(self)
            return
        if self.thread.is_alive():
            nc = self.nc
            if nc is not None:
                with contextlib.suppress(Exception):
                    asyncio.run_coroutine_threadsafe(nc.close(), self.loop).result(timeout)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout)
        if not self.thread.is_alive():
            with contextlib.suppress(Exception):
                self.loop.close()


#: closings in progress (kept referenced until done)
_CLOSING: set[asyncio.Task] = set()


def discard(nc) -> None:
    """Close a client in the background, at most 5 s: nats-py's close() can hang on a connection
    whose TLS handshake failed, and an error must not wait for it."""
    async def close():
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(nc.close(), 5)
    task = asyncio.ensure_future(close())
    _CLOSING.add(task)
    task.add_done_callback(_CLOSING.discard)


def uses_tls(nc) -> bool:
    """True when the client's connection is encrypted (checked for ``tls://`` URLs)."""
    writer = getattr(getattr(nc, "_transport", None), "_io_writer", None)
    if writer is not None:
        return writer.get_extra_info("ssl_object") is not None
    return bool(getattr(nc, "_server_info", {}).get("tls_required"))
