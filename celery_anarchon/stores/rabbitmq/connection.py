"""The connection layer of the RabbitMQ store: queue names and arguments, message bodies, a
confirm-mode channel that tracks the broker's answer to every publish, the connection session,
and the broker's error texts.

Kept apart from :mod:`celery_anarchon.stores.rabbitmq` (the store's decisions) so each stays
readable; nothing here decides a claim.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
from urllib.parse import quote

import amqp
import kombu

#: AMQP 0-9-1 queue names are short strings: at most 255 bytes
QUEUE_NAME_MAX_BYTES = 255
#: the longest slot text a claim queue name may end with (``-9223372036854775808``)
_SLOT_TEXT_MAX = 20
#: the kinds of queue the store declares (the part of a name after the prefix)
KINDS = ("claim", "born", "history", "settings", "lock", "instances", "fingerprints")

_PREFIX = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def valid_prefix(prefix: object) -> bool:
    """True for a queue prefix the names can start with (letters, digits, ``_``, ``-``; no dots)."""
    return isinstance(prefix, str) and bool(_PREFIX.match(prefix))


def escape(name: str) -> str:
    """``name`` as one dot-free, ASCII part of a queue name: percent-escaped (``%`` included) and
    ``.`` as ``%2E``. Injective, so two names never map to the same part, and the dots that
    separate the parts of a queue name can only come from the store."""
    return quote(name, safe="").replace(".", "%2E")


def _hashed(*parts: str) -> str:
    """A fixed-length stand-in for parts too long for a queue name. ``!`` never appears in an
    escaped name, so a hashed part can never equal a plain one."""
    return "!" + hashlib.sha256(json.dumps(parts).encode()).hexdigest()


class QueueNames:
    """The queues of one namespace (``<prefix>.<kind>.<namespace>.<entry>[.<slot_ms>]``).

    Namespace and entry are escaped with :func:`escape`; when the longest name of an entry would
    pass 255 bytes, the pair is replaced by a SHA-256 of both (``!`` + 64 hex digits).
    """

    def __init__(self, prefix: str, namespace: str) -> None:
        self.prefix = prefix
        self.namespace = namespace
        self._tags: dict[str, str] = {}
        ns = escape(namespace)
        self._ns = ns if len(f"{prefix}.settings.{ns}") <= QUEUE_NAME_MAX_BYTES else _hashed(namespace)

    def tag(self, entry: str) -> str:
        """The part of every name of ``entry`` that says which entry it is."""
        tag = self._tags.get(entry)
        if tag is None:
            tag = f"{escape(self.namespace)}.{escape(entry)}"
            longest = max(len(f"{self.prefix}.history.{tag}"),
                          len(f"{self.prefix}.claim.{tag}.") + _SLOT_TEXT_MAX)
            if longest > QUEUE_NAME_MAX_BYTES:
                tag = _hashed(self.namespace, entry)
            self._tags[entry] = tag
        return tag

    def claim(self, entry: str, slot_ms: int) -> str:
        """The queue that decides the run (entry, slot): its first message is the winner's."""
        return f"{self.prefix}.claim.{self.tag(entry)}.{int(slot_ms)}"

    def born(self, entry: str) -> str:
        """The queue whose one message says when the store's memory of ``entry`` began."""
        return f"{self.prefix}.born.{self.tag(entry)}"

    def history(self, entry: str) -> str:
        """The queue of ``entry``'s history events (one message per event, oldest first)."""
        return f"{self.prefix}.history.{self.tag(entry)}"

    def lock(self, entry: str) -> str:
        """The exclusive queue whose holder may read ``entry``'s memory start or history."""
        return f"{self.prefix}.lock.{self.tag(entry)}"

    def settings(self) -> str:
        """The namespace's marker queue: its arguments carry the slot_ttl every instance uses."""
        return f"{self.prefix}.settings.{self._ns}"

    def instances(self) -> str:
        """The namespace's instance records queue (one message per heartbeat, :mod:`.instances`)."""
        return f"{self.prefix}.instances.{self._ns}"

    def instances_lock(self) -> str:
        """The exclusive queue whose holder may read the instance records and fingerprints
        (``!`` never appears in an escaped entry name, so no entry's lock is named so)."""
        return f"{self.prefix}.lock.{self._ns}.!instances"

    def fingerprints(self, digest: str) -> str:
        """The queue holding the fingerprint mapping saved under ``digest``."""
        name = f"{self.prefix}.fingerprints.{self._ns}.{escape(digest)}"
        return name if len(name) <= QUEUE_NAME_MAX_BYTES else \
            f"{self.prefix}.fingerprints.{_hashed(self.namespace, digest)}"

    def probe(self, suffix: str) -> str:
        """A claim queue no entry can have (``!probe`` is not an escaped or hashed name), for the
        start-up check of the broker's behaviour; it matches the policies of the claim queues."""
        return f"{self.prefix}.claim.!probe.{suffix}.0"

    def is_ours(self, queue: str) -> bool:
        """True for a queue of any namespace that a store with this prefix declares durably."""
        prefix, _, rest = queue.partition(".")
        return prefix == self.prefix and rest.split(".", 1)[0] in KINDS and not rest.startswith("lock.")


# -- queue arguments (every declarer must give the same, or the broker answers 406) ------------

CLASSIC = {"x-queue-type": "classic"}
#: first writer wins: the broker refuses (nacks) a publish to a queue that holds a message
ONE_MESSAGE = {**CLASSIC, "x-max-length": 1, "x-overflow": "reject-publish"}


def claim_arguments(slot_ttl_ms: int) -> dict:
    """A run's claim queue: one message, refused when full, deleted ``slot_ttl_ms`` after its last
    use (a synchronous declare or a read; a publish or a ``nowait`` declare does not count)."""
    return {**ONE_MESSAGE, "x-expires": int(slot_ttl_ms)}


def history_arguments(max_events: int) -> dict:
    """An entry's history: the newest ``max_events`` events (the oldest dropped first)."""
    return {**CLASSIC, "x-max-length": int(max_events), "x-overflow": "drop-head"}


def settings_arguments(slot_ttl_ms: int) -> dict:
    """The namespace's marker: holds nothing; ``x-message-ttl`` carries the slot_ttl, so a
    declare with another one is refused (406) and names both values."""
    return {**CLASSIC, "x-max-length": 0, "x-message-ttl": int(slot_ttl_ms)}


# -- the broker's error texts ------------------------------------------------------------------

_INEQUIVALENT = re.compile(r"inequivalent arg '(?P<arg>[^']+)' for queue '(?P<queue>[^']*)'.*?"
                           r"received (?P<received>.+?) but current is (?P<current>.+)$")
_VALUE = re.compile(r"^(?:the value )?'(?P<value>[^']*)'")


def inequivalent(exc: BaseException) -> tuple[str, str, str] | None:
    """``(argument, received, current)`` of a 406 PRECONDITION_FAILED that says a queue exists
    with other arguments, else ``None``."""
    match = _INEQUIVALENT.search(str(getattr(exc, "reply_text", "") or exc))
    if not match:
        return None

    def value(text: str) -> str:
        found = _VALUE.match(text.strip())
        return found.group("value") if found else text.strip()
    return match.group("arg"), value(match.group("received")), value(match.group("current"))


# -- publishing with confirms ------------------------------------------------------------------

def encode(body: dict, expiration_ms: int | None = None) -> amqp.Message:
    """A persistent JSON message (nothing read back is ever unpickled or evaluated); with
    ``expiration_ms``, the broker drops it that long after it was queued (per-message TTL, on the
    broker's clock)."""
    extra = {} if expiration_ms is None else {"expiration": str(int(expiration_ms))}
    return amqp.Message(json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode(),
                        content_type="application/json", delivery_mode=2, **extra)


def decode(message) -> dict | None:
    """The JSON object in ``message``, or ``None`` when it holds something else."""
    body = message.body
    try:
        value = json.loads(body.decode() if isinstance(body, (bytes, bytearray)) else body)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


class Confirms:
    """A channel in confirm mode that records the broker's answer to each publish.

    Every publish is mandatory and gets a delivery tag (1, 2, ... in publish order): ``ack``
    (stored), ``nack`` (refused: a full claim queue) or, for a queue that does not exist, a
    ``basic.return`` followed by an ack. The returned routing keys are kept in :attr:`returned`;
    a channel that saw one is retired (:attr:`tainted`) so a late frame of an unroutable publish
    can never be read as the answer to a later one (the trap of store-primitives.md §7).
    """

    def __init__(self, channel) -> None:
        self.channel = channel
        channel.confirm_select()
        self._next_tag = 1
        self._pending: set[int] = set()
        self.answers: dict[int, bool] = {}
        self.returned: set[str] = set()
        channel.events["basic_ack"].add(functools.partial(self._on_confirm, True))
        channel.events["basic_nack"].add(functools.partial(self._on_confirm, False))
        channel.events["basic_return"].add(self._on_return)

    @property
    def tainted(self) -> bool:
        return bool(self.returned)

    def publish(self, queue: str, body: dict, *, expiration_ms: int | None = None) -> int:
        """Publish ``body`` to ``queue`` through the default exchange (expiring ``expiration_ms``
        after it was queued, when given); returns its delivery tag."""
        self.channel.basic_publish(encode(body, expiration_ms), exchange="", routing_key=queue,
                                   mandatory=True)
        tag, self._next_tag = self._next_tag, self._next_tag + 1
        self._pending.add(tag)
        return tag

    def wait(self, frame_timeout: float) -> None:
        """Until the broker answered every publish; each frame must come within ``frame_timeout``
        seconds, else ``socket.timeout`` (the caller cannot know the missing answers)."""
        connection = self.channel.connection
        while self._pending:
            connection.drain_events(timeout=frame_timeout)

    def acked(self, tag: int) -> bool | None:
        """True (ack), False (nack), or None (no answer yet)."""
        return self.answers.get(tag)

    def _on_confirm(self, acked: bool, tag: int, multiple: bool) -> None:
        tags = [t for t in self._pending if t <= tag] if multiple else [tag]
        for t in tags:
            self._pending.discard(t)
            self.answers[t] = acked

    def _on_return(self, exc, exchange, routing_key, message) -> None:
        self.returned.add(routing_key)


# -- connections ---------------------------------------------------------------------------------

class Session:
    """One kombu Connection and what the store learnt on it. A new session after a connection
    error or a fork; the memory starts read on a connection are trusted only on it (a broker
    restart closes every connection)."""

    def __init__(self, url: str, ssl, timeout: float) -> None:
        """No I/O: kombu connects on first use. ``timeout`` (seconds) bounds the connect and each
        frame awaited; heartbeats are off (beat may sleep 60 s between two uses)."""
        self.timeout = timeout
        self.pid = os.getpid()
        self.conn = kombu.Connection(
            url, ssl=ssl, connect_timeout=timeout, heartbeat=0,
            transport_options={"read_timeout": timeout, "write_timeout": timeout})
        self.reset()

    def reset(self) -> None:
        self.confirms_channel: Confirms | None = None
        self.declarers: list = []
        self.born: dict[str, int] = {}
        self.histories: set[str] = set()

    def revive(self, channel) -> None:
        """kombu's ``ensure`` reconnected: forget everything learnt on the old connection."""
        self.reset()

    def connect(self) -> None:
        self.conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0.1,
                                    timeout=self.timeout)

    def channel(self):
        self.connect()
        return self.conn.connection.channel()

    def confirms(self) -> Confirms:
        """The confirm-mode channel (a new one after a publish was returned)."""
        current = self.confirms_channel
        if current is None or current.tainted or not current.channel.is_open:
            self.retire_confirms()
            current = self.confirms_channel = Confirms(self.channel())
        return current

    def retire_confirms(self) -> None:
        current, self.confirms_channel = self.confirms_channel, None
        if current is not None and current.channel.is_open:
            with contextlib.suppress(Exception):
                current.channel.close()

    def declare_channels(self, count: int) -> list:
        self.declarers = [ch for ch in self.declarers if ch.is_open]
        while len(self.declarers) < count:
            self.declarers.append(self.channel())
        return self.declarers[:count]

    def drop_declarers(self) -> None:
        for ch in self.declarers:
            if ch.is_open:
                with contextlib.suppress(Exception):
                    ch.close()
        self.declarers = []

    def ensure(self, fun):
        """``fun()`` once more on a new connection if the first one failed (idempotent work only)."""
        return self.conn.ensure(self, fun, max_retries=1, interval_start=0, interval_step=0.1,
                                interval_max=0.5)()
